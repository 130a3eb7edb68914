//! What a training step asks of its device, recorded while a trace is on (`ostinato
//! bench --trace` and its tests): every matrix product with its dtype, shape, FLOPs
//! and bytes, and every value read back to the host, which on a GPU is a
//! synchronisation. Off, recording costs one relaxed load.
//!
//! Every product the model, its adapters and its backward run goes through
//! [`product`], and every value the step reads back through [`read_back`]
//! (`engine/tests/step_trace.rs` checks the sources for others).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

use candle_core::{DType, Tensor};

static ON: AtomicBool = AtomicBool::new(false);
static LOG: Mutex<Log> = Mutex::new(Log { products: Vec::new(), reads: Vec::new() });

/// One matrix product: `batch` products of `[m, k] x [k, n]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Product {
    pub dtype: DType,
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl Product {
    pub fn flops(&self) -> f64 {
        2.0 * (self.batch * self.m * self.n) as f64 * self.k as f64
    }

    /// Both inputs read and the output written once, in the product's dtype.
    pub fn bytes(&self) -> f64 {
        (self.batch * (self.m * self.k + self.k * self.n + self.m * self.n) * self.dtype.size_in_bytes()) as f64
    }

    /// A product of at least [`LARGE_FLOPS`].
    pub fn is_large(&self) -> bool {
        self.flops() >= LARGE_FLOPS
    }
}

/// A large product's FLOPs: a 512-wide linear over 64 rows. At a 30 s song's shapes
/// (375 patches) every linear of the DiT and attention's products over its blocks are
/// above; an adapter's rank-16 products and DoRA's rank-16 weight change are below.
pub const LARGE_FLOPS: f64 = (1u64 << 25) as f64;

/// One read-back: what it was and how many values came back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Read {
    pub what: &'static str,
    pub values: usize,
}

/// What was recorded between [`start`] and [`finish`].
#[derive(Debug, Default)]
pub struct Log {
    pub products: Vec<Product>,
    pub reads: Vec<Read>,
}

fn log() -> std::sync::MutexGuard<'static, Log> {
    LOG.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Starts recording (process-wide: one trace at a time), dropping anything recorded before.
pub fn start() {
    *log() = Log::default();
    ON.store(true, Relaxed);
}

/// Stops recording and returns what was recorded.
pub fn finish() -> Log {
    ON.store(false, Relaxed);
    std::mem::take(&mut *log())
}

/// Records one product of `dtype`, `(batch, m, n, k)`, while a trace is on.
pub fn product(dtype: DType, (batch, m, n, k): (usize, usize, usize, usize)) {
    if ON.load(Relaxed) {
        log().products.push(Product { dtype, batch, m, n, k });
    }
}

/// Candle's `a.matmul(b)` (equal batch dimensions), recorded.
pub fn matmul(a: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    if ON.load(Relaxed) {
        let (m, k, n) =
            (a.dim(candle_core::D::Minus2)?, a.dim(candle_core::D::Minus1)?, b.dim(candle_core::D::Minus1)?);
        product(a.dtype(), (a.elem_count() / (m * k).max(1), m, n, k));
    }
    a.matmul(b)
}

/// Reads `t`'s values back to the host as f32, recorded as `what`.
pub fn read_back(what: &'static str, t: &Tensor) -> candle_core::Result<Vec<f32>> {
    let values = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
    if ON.load(Relaxed) {
        log().reads.push(Read { what, values: values.len() });
    }
    Ok(values)
}

/// How many tensors candle has made in this process so far, kernels' outputs and views
/// alike. Candle keeps its counter private; a new tensor's id is the counter's value,
/// and its `Debug` form the only way to read it.
pub fn tensors_made() -> candle_core::Result<usize> {
    let probe = Tensor::zeros((), DType::F32, &candle_core::Device::Cpu)?;
    let id = format!("{:?}", probe.id());
    id.trim_start_matches("TensorId(")
        .trim_end_matches(')')
        .parse()
        .map_err(|_| candle_core::Error::Msg(format!("candle's tensor id reads `{id}`, not `TensorId(N)`")))
}

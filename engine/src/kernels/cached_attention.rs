//! Attention of one new query row per head over a KV cache (decoding on the CPU: f32
//! queries, the cache in f32 or bf16, widened as it is read).
//! Each KV head's keys and values are read once for all the query heads that share
//! them (GQA), straight from the cache's strided view: no copy, no score matrix for a
//! general GEMM to be called on with two rows.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, Layout, Shape};
use rayon::prelude::*;

use super::matvec::MatvecWeight;
use super::simd;

/// `q (1, heads, 1, D)` contiguous, `k`, `v (1, KV, len, D)` views with a contiguous
/// last dimension -> `softmax(q k^T * scale) v`, `(1, heads, 1, D)`.
pub(crate) struct SingleQueryAttention {
    pub scale: f32,
}

/// A cache view's layout: its start and the distance between KV heads.
fn view(l: &Layout, what: &str) -> candle_core::Result<(usize, usize)> {
    let (stride, dims) = (l.stride(), l.dims());
    if dims.len() != 4 || dims[0] != 1 || stride[3] != 1 || stride[2] != dims[3] {
        candle_core::bail!(
            "cached attention: {what} {dims:?} (strides {stride:?}) is not a (1, KV, len, D) cache view"
        );
    }
    Ok((l.start_offset(), stride[1]))
}

impl CustomOp3 for SingleQueryAttention {
    fn name(&self) -> &'static str {
        "single-query-attention"
    }

    fn cpu_fwd(
        &self,
        qs: &CpuStorage,
        ql: &Layout,
        ks: &CpuStorage,
        kl: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (Some((q0, q1)), CpuStorage::F32(q)) = (ql.contiguous_offsets(), qs) else {
            candle_core::bail!("cached attention: the queries must be contiguous f32");
        };
        let (heads, d) = (ql.dims()[1], ql.dims()[3]);
        let (kv_heads, len) = (kl.dims()[1], kl.dims()[2]);
        if ql.dims() != [1, heads, 1, d]
            || kl.dims()[3] != d
            || vl.dims() != kl.dims()
            || !heads.is_multiple_of(kv_heads)
        {
            candle_core::bail!(
                "cached attention: queries {:?}, keys {:?}, values {:?} do not fit",
                ql.dims(),
                kl.dims(),
                vl.dims()
            );
        }
        let (k, v) = (Cache { layout: view(kl, "keys")?, len }, Cache { layout: view(vl, "values")?, len });
        let q = &q[q0..q1];
        let out = match (ks, vs) {
            (CpuStorage::F32(ks), CpuStorage::F32(vs)) => self.attend(q, d, kv_heads, (ks, k), (vs, v)),
            (CpuStorage::BF16(ks), CpuStorage::BF16(vs)) => self.attend(q, d, kv_heads, (ks, k), (vs, v)),
            _ => candle_core::bail!(
                "cached attention: the cache must be f32 or bf16, keys and values alike (keys {:?}, values {:?})",
                ks.dtype(),
                vs.dtype()
            ),
        };
        Ok((CpuStorage::F32(out), Shape::from((1, heads, 1, d))))
    }
}

/// Where a cache view's rows are.
#[derive(Clone, Copy)]
struct Cache {
    /// Start and distance between KV heads.
    layout: (usize, usize),
    len: usize,
}

impl SingleQueryAttention {
    /// The attention of `q` (every head's row of `d`) over the keys and values.
    fn attend<W: MatvecWeight>(
        &self,
        q: &[f32],
        d: usize,
        kv_heads: usize,
        (k, kc): (&[W], Cache),
        (v, vc): (&[W], Cache),
    ) -> Vec<f32> {
        let (rep, len) = (q.len() / d / kv_heads, kc.len);
        let mut out = vec![0f32; q.len()];
        out.par_chunks_mut(rep * d).enumerate().for_each(|(g, out)| {
            let keys = &k[kc.layout.0 + g * kc.layout.1..];
            let values = &v[vc.layout.0 + g * vc.layout.1..];
            let queries = &q[g * rep * d..(g + 1) * rep * d];
            // scores[r][j] for this KV head's query heads r, one pass over the keys.
            let mut scores = vec![0f32; rep * len];
            for (j, key) in keys.chunks_exact(d).take(len).enumerate() {
                for (r, query) in queries.chunks_exact(d).enumerate() {
                    scores[r * len + j] = W::dot(key, query) * self.scale;
                }
            }
            let mut probs = vec![0f32; rep * len];
            for (s, p) in scores.chunks_exact(len).zip(probs.chunks_exact_mut(len)) {
                simd::softmax_row(s, p);
            }
            for (j, value) in values.chunks_exact(d).take(len).enumerate() {
                for (r, o) in out.chunks_exact_mut(d).enumerate() {
                    W::axpy(probs[r * len + j], value, o);
                }
            }
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Tensor};

    #[test]
    fn matches_the_composed_product_on_an_f32_or_bf16_cache_view() {
        let dev = Device::Cpu;
        let (kv, rep, cap, len, d) = (2, 3, 11, 7, 20);
        let q = Tensor::randn(0f32, 1.0, (1, kv * rep, 1, d), &dev).unwrap();
        for dtype in [DType::F32, DType::BF16] {
            let cache = || Tensor::randn(0f32, 1.0, (1, kv, cap, d), &dev).unwrap().to_dtype(dtype).unwrap();
            let (k, v) = (cache().narrow(2, 0, len).unwrap(), cache().narrow(2, 0, len).unwrap());
            let scale = 0.3;
            let got = q.apply_op3_no_bwd(&k, &v, &SingleQueryAttention { scale }).unwrap();
            // Composed in f32 on the cache's values: each query head against its KV head.
            let q3 = q.reshape((kv, rep, d)).unwrap();
            let f32_of = |t: &Tensor| t.squeeze(0).unwrap().to_dtype(DType::F32).unwrap().contiguous().unwrap();
            let (k3, v3) = (f32_of(&k), f32_of(&v));
            let scores = (q3.matmul(&k3.t().unwrap()).unwrap() * scale as f64).unwrap();
            let want = candle_core::Tensor::exp(&scores).unwrap();
            let want = want.broadcast_div(&want.sum_keepdim(2).unwrap()).unwrap().matmul(&v3).unwrap();
            let err = (got.flatten_all().unwrap() - want.flatten_all().unwrap())
                .unwrap()
                .abs()
                .unwrap()
                .max(0)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            println!("cached attention ({dtype:?} cache) vs composed: max abs error {err:.2e} (tolerance 1e-5)");
            assert!(err < 1e-5, "{dtype:?}: {err}");
        }
    }
}

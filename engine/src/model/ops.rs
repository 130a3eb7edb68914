//! Differentiable ops for the training path, written so that backward computes
//! gradients only for inputs that lead to a trainable parameter: the products and
//! arithmetic (`pruned`), and here the norms, softmax, SwiGLU and RoPE, fused into one
//! pass each way on the CPU kernels and composed elsewhere.
//!
//! Everything else the model uses (exp, sum, sqrt, narrow, cat, reshape, transpose,
//! `silu`) is candle's own and records a backward.

mod device;
mod pruned;

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor, D};

use super::policy::KernelPolicy;
use crate::kernels::simd;
use crate::trace;

pub use pruned::{add, linear, matmul, mul, sub};

/// RMSNorm over the last dimension, `x / sqrt(mean(x^2) + eps) * weight`, computed in
/// f32 as the reference does. For a frozen weight a fused op each way (the input
/// gradient only): the CPU kernels' or, without them, candle-nn's forward with the
/// backward in candle ops (`device`); otherwise built from ops that all record a
/// backward.
pub fn rms_norm(k: KernelPolicy, x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let frozen = !weight.track_op();
    if k.on_host(x) && weight.dtype() == DType::F32 && frozen {
        return x.contiguous()?.apply_op2(weight, RmsNorm { eps: eps as f32, shift: None, k });
    }
    if frozen && weight.dtype() == x.dtype() && weight.dims() == [x.dim(D::Minus1)?] {
        return device::rms_norm(x, weight, eps);
    }
    rms_norm_composed(x, weight, eps)
}

/// AdaLN's modulated norm, `rms_norm(x, weight) * scale + shift` for `x [B, P, H]` and
/// per-item `scale`, `shift` `[B, 1, H]`. Fused on the CPU (one node, one pass each way)
/// when the modulation is a constant, as it is unless a LoRA adapts the timestep
/// embedding; composed otherwise.
pub fn modulated_rms_norm(
    k: KernelPolicy,
    x: &Tensor,
    weight: &Tensor,
    scale: &Tensor,
    shift: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    let constant = [weight, scale, shift].iter().all(|t| t.dtype() == DType::F32 && !t.track_op());
    if k.on_host(x) && constant {
        let weight = scale.broadcast_mul(weight)?.contiguous()?;
        let shift = Some(shift.contiguous()?);
        return x.contiguous()?.apply_op2(&weight, RmsNorm { eps: eps as f32, shift, k });
    }
    add(&mul(&rms_norm(k, x, weight, eps)?, scale)?, shift)
}

/// The residual `x + f * gate` for `x, f [B, P, H]` and `gate [B, 1, H]`. Fused on the CPU
/// (one node; `x`'s gradient is the output's, `f`'s is one multiply) when the gate is a
/// constant; composed otherwise.
pub fn gated_add(k: KernelPolicy, x: &Tensor, f: &Tensor, gate: &Tensor) -> Result<Tensor> {
    if k.on_host(x)
        && f.dtype() == DType::F32
        && gate.dtype() == DType::F32
        && !gate.track_op()
        && x.shape() == f.shape()
    {
        let op = GatedAdd { gate: gate.contiguous()?, k };
        return x.contiguous()?.apply_op2(&f.contiguous()?, op);
    }
    add(x, &mul(f, gate)?)
}

fn rms_norm_composed(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let dtype = x.dtype();
    let x = x.to_dtype(DType::F32)?;
    let inv = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
    let normed = x.broadcast_mul(&inv)?.to_dtype(dtype)?;
    mul(&normed, weight)
}

/// Softmax over the last dimension: a fused op each way, the CPU kernels' or, without
/// them, candle-nn's forward with the backward in candle ops (`device`).
pub fn softmax_last_dim(k: KernelPolicy, x: &Tensor) -> Result<Tensor> {
    if k.on_host(x) {
        return x.contiguous()?.apply_op1(Softmax(k));
    }
    device::softmax_last_dim(k, x)
}

/// Rows of a contiguous f32 tensor: (slice, row length).
pub(super) fn rows<'a>(s: &'a CpuStorage, l: &Layout) -> Result<(&'a [f32], usize)> {
    let (start, end) =
        l.contiguous_offsets().ok_or_else(|| candle_core::Error::Msg("fused op: input must be contiguous".into()))?;
    let n = *l.dims().last().unwrap_or(&1);
    Ok((&s.as_slice::<f32>()?[start..end], n.max(1)))
}

/// An output buffer every element of which the caller writes before reading: no
/// zero-fill pass (a memset of the whole tensor) as `vec![0.0; n]` would make.
pub(super) fn output(n: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(n);
    // SAFETY: f32 has no invalid bit patterns and each fused op writes every element
    // (par_rows visits every row) before the buffer is read.
    #[allow(clippy::uninit_vec)]
    unsafe {
        v.set_len(n)
    };
    v
}

/// Runs `f(row_index, out_row)` over rows, in parallel chunks of about 64K elements.
pub(super) fn par_rows(out: &mut [f32], n: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    use rayon::prelude::*;
    let rows_per_chunk = (65536 / n).max(1);
    out.par_chunks_mut(rows_per_chunk * n).enumerate().for_each(|(c, chunk)| {
        for (i, row) in chunk.chunks_mut(n).enumerate() {
            f(c * rows_per_chunk + i, row);
        }
    });
}

struct Softmax(KernelPolicy);

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "fused-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        self.0.cpu_only(self.name())?;
        let (x, n) = rows(s, l)?;
        let mut out = output(x.len());
        par_rows(&mut out, n, |r, y| simd::softmax_row(&x[r * n..(r + 1) * n], y));
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(softmax_backward(self.0, y, grad)?))
    }
}

/// The softmax input gradient from its output `y` and output gradient `g`:
/// `y * (g - sum(g * y))` over the last dimension (no graph).
pub fn softmax_backward(k: KernelPolicy, y: &Tensor, g: &Tensor) -> Result<Tensor> {
    let g = g.contiguous()?;
    if k.on_host(y) && g.dtype() == DType::F32 {
        return y.contiguous()?.apply_op2_no_bwd(&g, &SoftmaxBwd(k));
    }
    let dot = (&g * y)?.sum_keepdim(D::Minus1)?;
    y.mul(&g.broadcast_sub(&dot)?)
}

struct SoftmaxBwd(KernelPolicy);

impl CustomOp2 for SoftmaxBwd {
    fn name(&self) -> &'static str {
        "fused-softmax-bwd"
    }

    fn cpu_fwd(&self, ys: &CpuStorage, yl: &Layout, gs: &CpuStorage, gl: &Layout) -> Result<(CpuStorage, Shape)> {
        self.0.cpu_only(self.name())?;
        let (y, n) = rows(ys, yl)?;
        let (g, _) = rows(gs, gl)?;
        let mut out = output(y.len());
        par_rows(&mut out, n, |r, dx| {
            let range = r * n..(r + 1) * n;
            simd::softmax_bwd_row(&y[range.clone()], &g[range], dx)
        });
        Ok((CpuStorage::F32(out), yl.shape().clone()))
    }
}

/// Rotate-half RoPE, `scale * (x * cos + rotate_half(x) * sin)`, for `x [B, P, H, D]`
/// with tables `[P, 1, D]` laid out `cat([f, f])`: candle-nn's kernel each way
/// (`device`). (On the CPU kernels the attention path applies it inside `heads::split`.)
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, scale: f64) -> Result<Tensor> {
    let y = device::rope(x, cos, sin)?;
    if scale == 1.0 {
        Ok(y)
    } else {
        y * scale
    }
}

/// SwiGLU, `silu(gate) * up`. On the CPU kernels a fused op: the graph keeps only
/// `gate` and `up` (not `silu(gate)` too) and the backward writes the two input
/// gradients directly, instead of candle's silu backward with its four full-size
/// temporaries. Elsewhere composed.
pub fn swiglu(k: KernelPolicy, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if k.on_host(gate) && up.dtype() == DType::F32 && gate.shape() == up.shape() {
        return gate.contiguous()?.apply_op2(&up.contiguous()?, Swiglu(k));
    }
    mul(&gate.silu()?, up)
}

struct Swiglu(KernelPolicy);

impl CustomOp2 for Swiglu {
    fn name(&self) -> &'static str {
        "fused-swiglu"
    }

    fn cpu_fwd(&self, gs: &CpuStorage, gl: &Layout, us: &CpuStorage, ul: &Layout) -> Result<(CpuStorage, Shape)> {
        self.0.cpu_only(self.name())?;
        let (g, n) = rows(gs, gl)?;
        let (u, _) = rows(us, ul)?;
        let mut out = output(g.len());
        par_rows(&mut out, n, |r, y| {
            let range = r * n..(r + 1) * n;
            simd::swiglu_row(&g[range.clone()], &u[range], y)
        });
        Ok((CpuStorage::F32(out), gl.shape().clone()))
    }

    fn bwd(&self, gate: &Tensor, up: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // Gradients only for inputs on the graph, as the pruned ops.
        let grad = grad.contiguous()?;
        let d = |input: &Tensor, wrt_gate| -> Result<Option<Tensor>> {
            match input.track_op() {
                true => Ok(Some(swiglu_grad(self.0, gate, up, &grad, wrt_gate)?)),
                false => Ok(None),
            }
        };
        Ok((d(gate, true)?, d(up, false)?))
    }
}

/// The gradient of `silu(gate) * up` for `gate` (`wrt_gate`) or `up` from the output
/// gradient `d`, without a graph (contiguous f32 CPU tensors).
pub(super) fn swiglu_grad(k: KernelPolicy, gate: &Tensor, up: &Tensor, d: &Tensor, wrt_gate: bool) -> Result<Tensor> {
    gate.apply_op3_no_bwd(up, d, &SwigluBwd { wrt_gate, k })
}

/// One input gradient of [`Swiglu`] from (gate, up, output gradient `d`):
/// d_gate = d * up * s * (1 + gate * (1 - s)) with s = sigmoid(gate); d_up = d * silu(gate).
struct SwigluBwd {
    wrt_gate: bool,
    k: KernelPolicy,
}

impl candle_core::CustomOp3 for SwigluBwd {
    fn name(&self) -> &'static str {
        "fused-swiglu-bwd"
    }

    fn cpu_fwd(
        &self,
        gs: &CpuStorage,
        gl: &Layout,
        us: &CpuStorage,
        ul: &Layout,
        ds: &CpuStorage,
        dl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.k.cpu_only(self.name())?;
        let (g, n) = rows(gs, gl)?;
        let (u, _) = rows(us, ul)?;
        let (d, _) = rows(ds, dl)?;
        let mut out = output(g.len());
        let wrt_gate = self.wrt_gate;
        par_rows(&mut out, n, |r, dx| {
            let range = r * n..(r + 1) * n;
            simd::swiglu_bwd_row(&g[range.clone()], &u[range.clone()], &d[range], dx, wrt_gate)
        });
        Ok((CpuStorage::F32(out), gl.shape().clone()))
    }
}

/// Row `r` of `rows` of a per-group table `v` (`[G, n]`, consecutive row groups: G = 1
/// for a plain weight, B for per-item AdaLN modulations).
fn group_row(v: &[f32], n: usize, rows: usize, r: usize) -> &[f32] {
    let groups = v.len() / n;
    let g = r / (rows / groups);
    &v[g * n..(g + 1) * n]
}

/// That a per-group table of `len` values fits `rows` rows of `n`: [`group_row`]'s
/// precondition.
fn check_groups(what: &str, len: usize, n: usize, rows: usize) -> Result<()> {
    if len == 0 || !len.is_multiple_of(n) || !rows.is_multiple_of(len / n) {
        return Err(candle_core::Error::Msg(format!("{what}: {len} values for {rows} rows of {n}")));
    }
    Ok(())
}

/// A constant tensor's contiguous f32 values on the CPU (the CPU kernels' only).
pub(super) fn cpu_values(t: &Tensor) -> Result<Vec<f32>> {
    trace::read_back("a CPU kernel's constant", t)
}

/// `x * inv * weight (+ shift)`: a weight `[H]` or per item `[B, 1, H]`, an optional
/// per-item shift; the input gradient only (weight and shift are constants).
struct RmsNorm {
    eps: f32,
    shift: Option<Tensor>,
    k: KernelPolicy,
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "fused-rms-norm"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, ws: &CpuStorage, wl: &Layout) -> Result<(CpuStorage, Shape)> {
        self.k.cpu_only(self.name())?;
        let (x, n) = rows(xs, xl)?;
        let (w, wn) = rows(ws, wl)?;
        let total = x.len() / n;
        if wn != n {
            return Err(candle_core::Error::Msg(format!("rms_norm: weight rows of {wn} for rows of {n}")));
        }
        check_groups("rms_norm weight", w.len(), n, total)?;
        let shift = self.shift.as_ref().map(cpu_values).transpose()?;
        if let Some(b) = &shift {
            check_groups("rms_norm shift", b.len(), n, total)?;
        }
        let mut out = output(x.len());
        let eps = self.eps;
        par_rows(&mut out, n, |r, y| {
            let x = &x[r * n..(r + 1) * n];
            simd::rms_norm_row(x, group_row(w, n, total, r), eps, y);
            if let Some(b) = &shift {
                y.iter_mut().zip(group_row(b, n, total, r)).for_each(|(y, b)| *y += b);
            }
        });
        Ok((CpuStorage::F32(out), xl.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, w: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let dx = if self.k.on_host(&grad) {
            x.apply_op3_no_bwd(w, &grad, &RmsNormBwd { eps: self.eps, k: self.k })?
        } else {
            // The composed form's input gradient, without a graph.
            let xv = candle_core::Var::from_tensor(&x.detach())?;
            let y = rms_norm_composed(xv.as_tensor(), &w.detach(), self.eps as f64)?;
            let store = (y * &grad)?.sum_all()?.backward()?;
            store.get(&xv).expect("input on the graph").detach()
        };
        Ok((Some(dx), None))
    }
}

struct RmsNormBwd {
    eps: f32,
    k: KernelPolicy,
}

impl candle_core::CustomOp3 for RmsNormBwd {
    fn name(&self) -> &'static str {
        "fused-rms-norm-bwd"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.k.cpu_only(self.name())?;
        // y = x * inv * w, inv = (mean(x^2) + eps)^-1/2:
        let (x, n) = rows(xs, xl)?;
        let (w, _) = rows(ws, wl)?;
        let (g, _) = rows(gs, gl)?;
        let mut out = output(x.len());
        let (eps, total) = (self.eps, x.len() / n);
        par_rows(&mut out, n, |r, dx| {
            dx.copy_from_slice(&g[r * n..(r + 1) * n]);
            simd::rms_norm_bwd_row(&x[r * n..(r + 1) * n], group_row(w, n, total, r), eps, dx);
        });
        Ok((CpuStorage::F32(out), xl.shape().clone()))
    }
}

/// `x + f * gate` with a constant per-item gate `[B, 1, H]`.
struct GatedAdd {
    gate: Tensor,
    k: KernelPolicy,
}

impl CustomOp2 for GatedAdd {
    fn name(&self) -> &'static str {
        "fused-gated-add"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, fs: &CpuStorage, fl: &Layout) -> Result<(CpuStorage, Shape)> {
        self.k.cpu_only(self.name())?;
        let (x, n) = rows(xs, xl)?;
        let (f, _) = rows(fs, fl)?;
        let gate = cpu_values(&self.gate)?;
        let total = x.len() / n;
        check_groups("gated_add gate", gate.len(), n, total)?;
        let mut out = output(x.len());
        par_rows(&mut out, n, |r, y| {
            let range = r * n..(r + 1) * n;
            let (x, f, g) = (&x[range.clone()], &f[range], group_row(&gate, n, total, r));
            for (((y, &x), &f), &g) in y.iter_mut().zip(x).zip(f).zip(g) {
                *y = x + f * g;
            }
        });
        Ok((CpuStorage::F32(out), xl.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, f: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dx = x.track_op().then(|| grad.clone());
        let df = match f.track_op() {
            true => Some(grad.broadcast_mul(&self.gate)?),
            false => None,
        };
        Ok((dx, df))
    }
}

/// max |t| (tests).
#[cfg(test)]
pub(super) fn max_abs(t: &Tensor) -> f32 {
    t.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

/// max |a - b| over the larger of 1 and max |b| (tests: fused ops against composed forms).
#[cfg(test)]
pub(super) fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    max_abs(&(a - b).unwrap()) / max_abs(b).max(1.0)
}

#[cfg(test)]
mod tests;

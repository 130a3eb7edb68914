//! Differentiable ops for the training path, written so that backward computes
//! gradients only for inputs that lead to a trainable parameter.
//!
//! candle's own `matmul`, `mul`, `add`, `sub` always compute both input gradients.
//! For a frozen base weight (or a constant such as a RoPE table, a mask or an AdaLN
//! modulation that does not depend on a LoRA tensor) that gradient is wasted work and,
//! worse, stays in the `GradStore` until backward ends. `Pruned` ops run the same
//! kernels forward and return a gradient only for tracked inputs.
//!
//! Everything else the model uses (exp, sum, sqrt, narrow, cat, reshape, transpose,
//! `silu`) is candle's own and records a backward.

use candle_core::backend::BackendStorage;
use candle_core::op::{Add, Mul, Sub};
use candle_core::{
    CpuStorage, CudaStorage, CustomOp1, CustomOp2, DType, Layout, MetalStorage, Result, Shape, Tensor, D,
};

use super::policy::KernelPolicy;
use crate::kernels::linear::{backend_product, host_linear_product, Product};
use crate::kernels::simd;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Add,
    Sub,
    Mul,
    /// `[.., M, K] x [.., K, N]` with equal batch dimensions.
    Matmul,
    /// `x [.., K]` (contiguous) times `w [N, K]` transposed: `[.., N]`. One node where
    /// reshapes around a matmul would add two, each a full-size gradient accumulation.
    Linear,
}

struct Pruned(Kind);

impl Pruned {
    /// `linear`: the backend's product for a linear (the host kernel on the CPU).
    fn fwd<S: BackendStorage>(
        &self,
        linear: Product<S>,
        s1: &S,
        l1: &Layout,
        s2: &S,
        l2: &Layout,
    ) -> Result<(S, Shape)> {
        match self.0 {
            Kind::Add => Ok((s1.binary_impl::<Add>(s2, l1, l2)?, l1.shape().clone())),
            Kind::Sub => Ok((s1.binary_impl::<Sub>(s2, l1, l2)?, l1.shape().clone())),
            Kind::Mul => Ok((s1.binary_impl::<Mul>(s2, l1, l2)?, l1.shape().clone())),
            Kind::Matmul => {
                let (a, b) = (l1.dims(), l2.dims());
                let rank = a.len();
                let (m, k, n) = (a[rank - 2], a[rank - 1], b[rank - 1]);
                let batch: usize = a[..rank - 2].iter().product();
                let mut out = a[..rank - 2].to_vec();
                out.extend([m, n]);
                Ok((s1.matmul(s2, (batch, m, n, k), l1, l2)?, Shape::from(out)))
            }
            Kind::Linear => {
                let (n, k) = l2.shape().dims2()?;
                let rows = l1.shape().elem_count() / k;
                let x = Layout::contiguous_with_offset((rows, k), l1.start_offset());
                let mut out = l1.dims().to_vec();
                *out.last_mut().expect("x has a feature dimension") = n;
                Ok((linear(s1, s2, (1, rows, n, k), &x, &l2.transpose(0, 1)?)?, Shape::from(out)))
            }
        }
    }
}

impl CustomOp2 for Pruned {
    fn name(&self) -> &'static str {
        match self.0 {
            Kind::Add => "pruned-add",
            Kind::Sub => "pruned-sub",
            Kind::Mul => "pruned-mul",
            Kind::Matmul => "pruned-matmul",
            Kind::Linear => "pruned-linear",
        }
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        self.fwd(host_linear_product, s1, l1, s2, l2)
    }

    fn cuda_fwd(&self, s1: &CudaStorage, l1: &Layout, s2: &CudaStorage, l2: &Layout) -> Result<(CudaStorage, Shape)> {
        self.fwd(backend_product, s1, l1, s2, l2)
    }

    fn metal_fwd(
        &self,
        s1: &MetalStorage,
        l1: &Layout,
        s2: &MetalStorage,
        l2: &Layout,
    ) -> Result<(MetalStorage, Shape)> {
        self.fwd(backend_product, s1, l1, s2, l2)
    }

    fn bwd(&self, a: &Tensor, b: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let wanted = |t: &Tensor, f: &dyn Fn() -> Result<Tensor>| -> Result<Option<Tensor>> {
            if t.track_op() {
                f().map(Some)
            } else {
                Ok(None)
            }
        };
        match self.0 {
            Kind::Add => Ok((wanted(a, &|| Ok(grad.clone()))?, wanted(b, &|| Ok(grad.clone()))?)),
            Kind::Sub => Ok((wanted(a, &|| Ok(grad.clone()))?, wanted(b, &|| grad.neg())?)),
            Kind::Mul => Ok((wanted(a, &|| grad.mul(b))?, wanted(b, &|| grad.mul(a))?)),
            Kind::Matmul => Ok((wanted(a, &|| grad.matmul(&b.t()?))?, wanted(b, &|| a.t()?.matmul(grad))?)),
            Kind::Linear => {
                let (n, k) = b.dims2()?;
                let g = grad.reshape((grad.elem_count() / n, n))?;
                Ok((
                    wanted(a, &|| g.matmul(b)?.reshape(a.shape()))?,
                    wanted(b, &|| g.t()?.matmul(&a.reshape((a.elem_count() / k, k))?))?,
                ))
            }
        }
    }
}

fn binary(kind: Kind, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let shape = a.shape().broadcast_shape_binary_op(b.shape(), "pruned")?;
    // A same-shape `broadcast_as` still records a node whose backward is a full-size
    // `sum_keepdim` over no dimensions (a copy) plus a gradient accumulation: 7% of a
    // small-30s step when every residual went through one.
    let widen = |t: &Tensor| if t.shape() == &shape { Ok(t.clone()) } else { t.broadcast_as(&shape) };
    let (a, b) = (widen(a)?, widen(b)?);
    if !a.track_op() && !b.track_op() {
        // No graph to record: plain candle ops are the same kernels.
        return match kind {
            Kind::Add => a.add(&b),
            Kind::Sub => a.sub(&b),
            Kind::Mul => a.mul(&b),
            Kind::Matmul | Kind::Linear => unreachable!("matmuls go through `matmul` / `linear`"),
        };
    }
    a.apply_op2(&b, Pruned(kind))
}

/// `a + b` with broadcasting; gradients only for tracked inputs.
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(Kind::Add, a, b)
}

/// `a - b` with broadcasting; gradients only for tracked inputs.
pub fn sub(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(Kind::Sub, a, b)
}

/// `a * b` with broadcasting; gradients only for tracked inputs.
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(Kind::Mul, a, b)
}

/// `a @ b` over matching batch dimensions; gradients only for tracked inputs.
/// Transposed or row-narrowed operands are read in place (no copy), the same way with
/// and without a graph, so a recomputed block gives bit-identical results.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if !a.track_op() && !b.track_op() {
        return a.matmul(b);
    }
    a.apply_op2(b, Pruned(Kind::Matmul))
}

/// `x @ w^T (+ bias)` for `x [.., in]` and `w [out, in]`: one GEMM over all leading
/// dimensions. A frozen `w` gets no gradient; a tracked one (LoRA) does.
pub fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    // The transposed weight is a strided view: GEMM reads it in place. Same layouts
    // with and without a graph (see `matmul`).
    let x = x.contiguous()?;
    let y = if !x.track_op() && !w.track_op() {
        x.apply_op2_no_bwd(w, &Pruned(Kind::Linear))?
    } else {
        x.apply_op2(w, Pruned(Kind::Linear))?
    };
    match bias {
        Some(b) => add(&y, b),
        None => Ok(y),
    }
}

/// RMSNorm over the last dimension, `x / sqrt(mean(x^2) + eps) * weight`, computed in
/// f32 as the reference does. On the CPU kernels a fused op (one pass forward, one
/// backward, input gradient only: the weight is frozen); elsewhere built from ops that
/// all record a backward.
pub fn rms_norm(k: KernelPolicy, x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    if k.on_host(x) && weight.dtype() == DType::F32 && !weight.track_op() {
        return x.contiguous()?.apply_op2(weight, RmsNorm { eps: eps as f32, shift: None, k });
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

/// Softmax over the last dimension. On the CPU kernels a fused op (forward and
/// backward one pass per row each); elsewhere composed, with the row maximum taken
/// without a graph (a constant shift: the result and its gradient do not depend on it).
pub fn softmax_last_dim(k: KernelPolicy, x: &Tensor) -> Result<Tensor> {
    if k.on_host(x) {
        return x.contiguous()?.apply_op1(Softmax(k));
    }
    softmax_composed(x)
}

fn softmax_composed(x: &Tensor) -> Result<Tensor> {
    let max = x.detach().max_keepdim(D::Minus1)?;
    let e = sub(x, &max)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    e.broadcast_div(&sum)
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

/// Rotate-half RoPE, `scale * (x * cos + rotate_half(x) * sin)`, for `x [.., P, H, D]`
/// with tables `[P, 1, D]` laid out `cat([f, f])`, composed from ops that record a
/// backward. (On the CPU kernels the attention path applies it inside
/// `heads::split`.)
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, scale: f64) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    let y = add(&mul(x, cos)?, &mul(&rotated, sin)?)?;
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

/// A constant tensor's contiguous f32 values on the CPU.
pub(super) fn cpu_values(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
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
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    const CPU: KernelPolicy = KernelPolicy::cpu();

    fn close(a: &Tensor, b: &Tensor) -> f32 {
        max_abs(&(a - b).unwrap())
    }

    #[test]
    fn pruned_ops_match_candle_and_prune_constant_gradients() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::randn(0f32, 1., (2, 3, 4), &dev)?;
        let w = Tensor::randn(0f32, 1., (5, 4), &dev)?; // frozen
        let c = Tensor::randn(0f32, 1., (1, 1, 5), &dev)?; // constant
        let ours = mul(&linear(x.as_tensor(), &w, Some(&c.squeeze(0)?.squeeze(0)?))?, &c)?;
        let theirs = x.as_tensor().broadcast_matmul(&w.t()?)?.broadcast_add(&c)?.broadcast_mul(&c)?;
        assert!(close(&ours, &theirs) < 1e-6);

        let g_ours = softmax_last_dim(CPU, &ours)?.sqr()?.sum_all()?.backward()?;
        let g_theirs =
            (theirs.exp()?.broadcast_div(&theirs.exp()?.sum_keepdim(D::Minus1)?)?).sqr()?.sum_all()?.backward()?;
        assert!(close(g_ours.get(&x).unwrap(), g_theirs.get(&x).unwrap()) < 1e-5);
        // Only the variable has a gradient left: nothing was computed for w or c.
        let ids: Vec<_> = g_ours.get_ids().collect();
        assert_eq!(ids, vec![&x.id()]);
        Ok(())
    }

    /// The fused CPU softmax, RMSNorm and SwiGLU give the composed forms' values and
    /// input gradients.
    #[test]
    fn fused_ops_match_composed_forms() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::randn(0f32, 3., (3, 5, 37), &dev)?;
        let g = Tensor::randn(0f32, 1., (3, 5, 37), &dev)?;
        let w = Tensor::randn(1f32, 0.2, 37, &dev)?;
        let g2 = Tensor::randn(0f32, 1., (3, 5, 37), &dev)?; // SwiGLU's `up` (frozen here)
                                                             // AdaLN modulation per batch item.
        let scale = Tensor::randn(1f32, 0.3, (3, 1, 37), &dev)?;
        let shift = Tensor::randn(0f32, 0.3, (3, 1, 37), &dev)?;
        for (name, fused, composed) in [
            ("softmax", softmax_last_dim(CPU, x.as_tensor())?, softmax_composed(x.as_tensor())?),
            ("rms_norm", rms_norm(CPU, x.as_tensor(), &w, 1e-6)?, rms_norm_composed(x.as_tensor(), &w, 1e-6)?),
            ("swiglu", swiglu(CPU, x.as_tensor(), &g2)?, mul(&x.as_tensor().silu()?, &g2)?),
            (
                "modulated_rms_norm",
                modulated_rms_norm(CPU, x.as_tensor(), &w, &scale, &shift, 1e-6)?,
                add(&mul(&rms_norm_composed(x.as_tensor(), &w, 1e-6)?, &scale)?, &shift)?,
            ),
        ] {
            // The inputs are random (candle's randn is unseeded) and SwiGLU's outputs
            // reach ~30, where one f32 ulp is ~2e-6: errors are relative.
            let err = rel_err(&fused, &composed);
            eprintln!("{name}: forward error {err:e}");
            assert!(err < 1e-6, "{name} forward differs by {err:e}");
            let gf = mul(&fused, &g)?.sum_all()?.backward()?;
            let gc = mul(&composed, &g)?.sum_all()?.backward()?;
            let err = rel_err(gf.get(&x).unwrap(), gc.get(&x).unwrap());
            eprintln!("{name}: gradient error {err:e}");
            assert!(err < 1e-5, "{name} gradient differs by {err:e}");
            assert_eq!(gf.get_ids().count(), 1, "{name}: only the input gets a gradient");
        }
        Ok(())
    }

    #[test]
    fn gated_add_matches_composed_for_both_inputs() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::randn(0f32, 1., (2, 5, 19), &dev)?;
        let f = Var::randn(0f32, 1., (2, 5, 19), &dev)?;
        let gate = Tensor::randn(0f32, 1., (2, 1, 19), &dev)?;
        let g = Tensor::randn(0f32, 1., (2, 5, 19), &dev)?;
        let fused = gated_add(CPU, x.as_tensor(), f.as_tensor(), &gate)?;
        let composed = (x.as_tensor() + f.as_tensor().broadcast_mul(&gate)?)?;
        let err = rel_err(&fused, &composed);
        let gf = mul(&fused, &g)?.sum_all()?.backward()?;
        let gc = mul(&composed, &g)?.sum_all()?.backward()?;
        let (ex, ef) =
            (rel_err(gf.get(&x).unwrap(), gc.get(&x).unwrap()), rel_err(gf.get(&f).unwrap(), gc.get(&f).unwrap()));
        eprintln!("gated_add: forward error {err:e}, dx {ex:e}, df {ef:e}");
        assert!(err < 1e-6 && ex < 1e-6 && ef < 1e-6);
        Ok(())
    }

    /// Built under the GPU policy, each CPU-only op of this module errs in its forward,
    /// naming itself, as on a device without a forward for it; under the CPU policy it runs.
    #[test]
    fn cpu_only_ops_err_under_the_gpu_policy() -> Result<()> {
        let gpu = KernelPolicy::gpu();
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1., (2, 3, 8), &dev)?;
        let w = Tensor::ones(8, DType::F32, &dev)?;
        let gate = Tensor::ones((2, 1, 8), DType::F32, &dev)?;
        let runs = [
            ("fused-softmax", x.apply_op1_no_bwd(&Softmax(gpu))),
            ("fused-softmax-bwd", x.apply_op2_no_bwd(&x, &SoftmaxBwd(gpu))),
            ("fused-swiglu", x.apply_op2_no_bwd(&x, &Swiglu(gpu))),
            ("fused-swiglu-bwd", x.apply_op3_no_bwd(&x, &x, &SwigluBwd { wrt_gate: true, k: gpu })),
            ("fused-rms-norm", x.apply_op2_no_bwd(&w, &RmsNorm { eps: 1e-6, shift: None, k: gpu })),
            ("fused-rms-norm-bwd", x.apply_op3_no_bwd(&w, &x, &RmsNormBwd { eps: 1e-6, k: gpu })),
            ("fused-gated-add", x.apply_op2_no_bwd(&x, &GatedAdd { gate, k: gpu })),
        ];
        for (name, run) in runs {
            let err = run.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(name) && err.contains("no Metal or CUDA forward"), "{name}: {err:?}");
        }
        x.apply_op1_no_bwd(&Softmax(CPU))?;
        Ok(())
    }

    #[test]
    fn rms_norm_matches_formula_in_bf16_and_f32() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 2., (3, 8), &dev)?;
        let w = Tensor::randn(1f32, 0.1, 8, &dev)?;
        let expect = x.broadcast_div(&(x.sqr()?.mean_keepdim(1)? + 1e-6)?.sqrt()?)?.broadcast_mul(&w)?;
        assert!(close(&rms_norm(CPU, &x, &w, 1e-6)?, &expect) < 1e-5);
        let half = rms_norm(CPU, &x.to_dtype(DType::BF16)?, &w.to_dtype(DType::BF16)?, 1e-6)?;
        assert_eq!(half.dtype(), DType::BF16);
        assert!(close(&half.to_dtype(DType::F32)?, &expect) < 0.05);
        Ok(())
    }
}

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
    CpuStorage, CudaStorage, CustomOp2, Layout, MetalStorage, Result, Shape, Tensor, D,
};

#[derive(Debug, Clone, Copy)]
enum Kind {
    Add,
    Sub,
    Mul,
    /// `[.., M, K] x [.., K, N]` with equal batch dimensions.
    Matmul,
}

struct Pruned(Kind);

impl Pruned {
    fn fwd<S: BackendStorage>(&self, s1: &S, l1: &Layout, s2: &S, l2: &Layout) -> Result<(S, Shape)> {
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
        }
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        self.fwd(s1, l1, s2, l2)
    }

    fn cuda_fwd(&self, s1: &CudaStorage, l1: &Layout, s2: &CudaStorage, l2: &Layout) -> Result<(CudaStorage, Shape)> {
        self.fwd(s1, l1, s2, l2)
    }

    fn metal_fwd(&self, s1: &MetalStorage, l1: &Layout, s2: &MetalStorage, l2: &Layout) -> Result<(MetalStorage, Shape)> {
        self.fwd(s1, l1, s2, l2)
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
            Kind::Matmul => Ok((
                wanted(a, &|| grad.matmul(&b.t()?))?,
                wanted(b, &|| a.t()?.matmul(grad))?,
            )),
        }
    }
}

fn binary(kind: Kind, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let shape = a.shape().broadcast_shape_binary_op(b.shape(), "pruned")?;
    let (a, b) = (a.broadcast_as(&shape)?, b.broadcast_as(&shape)?);
    if !a.track_op() && !b.track_op() {
        // No graph to record: plain candle ops are the same kernels.
        return match kind {
            Kind::Add => a.add(&b),
            Kind::Sub => a.sub(&b),
            Kind::Mul => a.mul(&b),
            Kind::Matmul => unreachable!("matmul goes through `matmul`"),
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
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    // Both paths hand GEMM the same operand layouts, so a block recomputed with a graph
    // (gradient checkpointing) gives bit-identical results to its no-graph forward.
    let (a, b) = (a.contiguous()?, b.contiguous()?);
    if !a.track_op() && !b.track_op() {
        return a.matmul(&b);
    }
    a.apply_op2(&b, Pruned(Kind::Matmul))
}

/// `x @ w^T (+ bias)` for `x [.., in]` and `w [out, in]`: one GEMM over all leading
/// dimensions. A frozen `w` gets no gradient; a tracked one (LoRA) does.
pub fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let rows: usize = dims[..dims.len() - 1].iter().product();
    let x2 = x.reshape((rows, dims[dims.len() - 1]))?;
    // The transposed weight is a strided view: GEMM reads it in place. Same layouts
    // with and without a graph (see `matmul`).
    let x2 = x2.contiguous()?;
    let y = if !x2.track_op() && !w.track_op() {
        x2.matmul(&w.t()?)?
    } else {
        x2.apply_op2(&w.t()?, Pruned(Kind::Matmul))?
    };
    let mut out_dims = dims;
    *out_dims.last_mut().expect("x has a feature dimension") = w.dim(0)?;
    let y = y.reshape(out_dims)?;
    match bias {
        Some(b) => add(&y, b),
        None => Ok(y),
    }
}

/// RMSNorm over the last dimension, `x / sqrt(mean(x^2) + eps) * weight`, computed in
/// f32 as the reference does, built from ops that all record a backward.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let dtype = x.dtype();
    let x = x.to_dtype(candle_core::DType::F32)?;
    let inv = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
    let normed = x.broadcast_mul(&inv)?.to_dtype(dtype)?;
    mul(&normed, weight)
}

/// Softmax over the last dimension. The row maximum is a constant shift, so it is
/// taken without a graph (the result and its gradient do not depend on it).
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    let max = x.detach().max_keepdim(D::Minus1)?;
    let e = sub(x, &max)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    e.broadcast_div(&sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    fn close(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
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

        let g_ours = softmax_last_dim(&ours)?.sqr()?.sum_all()?.backward()?;
        let g_theirs = (theirs.exp()?.broadcast_div(&theirs.exp()?.sum_keepdim(D::Minus1)?)?)
            .sqr()?
            .sum_all()?
            .backward()?;
        assert!(close(g_ours.get(&x).unwrap(), g_theirs.get(&x).unwrap()) < 1e-5);
        // Only the variable has a gradient left: nothing was computed for w or c.
        let ids: Vec<_> = g_ours.get_ids().collect();
        assert_eq!(ids, vec![&x.id()]);
        Ok(())
    }

    #[test]
    fn rms_norm_matches_formula_in_bf16_and_f32() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 2., (3, 8), &dev)?;
        let w = Tensor::randn(1f32, 0.1, 8, &dev)?;
        let expect = x
            .broadcast_div(&(x.sqr()?.mean_keepdim(1)? + 1e-6)?.sqrt()?)?
            .broadcast_mul(&w)?;
        assert!(close(&rms_norm(&x, &w, 1e-6)?, &expect) < 1e-5);
        let half = rms_norm(&x.to_dtype(DType::BF16)?, &w.to_dtype(DType::BF16)?, 1e-6)?;
        assert_eq!(half.dtype(), DType::BF16);
        assert!(close(&half.to_dtype(DType::F32)?, &expect) < 0.05);
        Ok(())
    }
}

//! The products and arithmetic with pruned backward: candle's own `matmul`, `mul`,
//! `add`, `sub` always compute both input gradients. For a frozen base weight (or a
//! constant such as a RoPE table, a mask or an AdaLN modulation that does not depend on
//! a LoRA tensor) that gradient is wasted work and, worse, stays in the `GradStore`
//! until backward ends. `Pruned` ops run the same kernels forward and return a gradient
//! only for tracked inputs.

use candle_core::backend::BackendStorage;
use candle_core::op::{Add, Mul, Sub};
use candle_core::{CpuStorage, CudaStorage, CustomOp2, Layout, MetalStorage, Result, Shape, Tensor};

use crate::kernels::linear::{backend_product, host_linear_product, Product};
use crate::trace;

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
                trace::product(s1.dtype(), (batch, m, n, k));
                Ok((s1.matmul(s2, (batch, m, n, k), l1, l2)?, Shape::from(out)))
            }
            Kind::Linear => {
                let (n, k) = l2.shape().dims2()?;
                let rows = l1.shape().elem_count() / k;
                let x = Layout::contiguous_with_offset((rows, k), l1.start_offset());
                let mut out = l1.dims().to_vec();
                *out.last_mut().expect("x has a feature dimension") = n;
                trace::product(s1.dtype(), (1, rows, n, k));
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
            Kind::Matmul => {
                Ok((wanted(a, &|| trace::matmul(grad, &b.t()?))?, wanted(b, &|| trace::matmul(&a.t()?, grad))?))
            }
            Kind::Linear => {
                let (n, k) = b.dims2()?;
                let g = grad.reshape((grad.elem_count() / n, n))?;
                Ok((
                    wanted(a, &|| trace::matmul(&g, b)?.reshape(a.shape()))?,
                    wanted(b, &|| trace::matmul(&g.t()?, &a.reshape((a.elem_count() / k, k))?))?,
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
        return trace::matmul(a, b);
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

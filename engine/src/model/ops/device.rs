//! RMSNorm, softmax and RoPE without the CPU kernels (Metal, CUDA, the CPU under the GPU
//! policy): candle-nn's one-kernel forwards, which every backend has, and on the graph
//! one node each whose backward is written out in candle ops. The composed forms took
//! about ten ops each way and kept f32 copies of their input for the backward; these
//! take one kernel forward (and a copy into the node) and keep only what the gradient needs.

use candle_core::{CustomOp1, DType, Result, Tensor, D};

use super::softmax_backward;
use crate::kernels::handover::{handed_over_forwards, Handover};
use crate::model::policy::KernelPolicy;

/// `x / sqrt(mean(x^2) + eps) * weight` over the last dimension, for a frozen 1-D
/// `weight` in `x`'s dtype (the caller checks); the input gradient only.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let y = candle_nn::ops::rms_norm(&x.detach().contiguous()?, weight, eps as f32)?;
    match x.track_op() {
        false => Ok(y),
        true => x.apply_op1(RmsNormNode { result: Handover::new(y, "rms-norm-node"), weight: weight.clone(), eps }),
    }
}

/// Softmax over the last dimension.
pub fn softmax_last_dim(k: KernelPolicy, x: &Tensor) -> Result<Tensor> {
    let y = candle_nn::ops::softmax_last_dim(&x.detach().contiguous()?)?;
    match x.track_op() {
        false => Ok(y),
        true => x.apply_op1(SoftmaxNode { result: Handover::new(y, "softmax-node"), k }),
    }
}

/// Rotate-half RoPE on `x [B, P, H, D]` with tables `[P, 1, D]` laid out `cat([f, f])`:
/// candle-nn's kernel each way, the backward being the same rotation by `-sin`.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = |t: &Tensor| -> Result<Tensor> {
        let d = t.dim(D::Minus1)?;
        t.narrow(D::Minus1, 0, d / 2)?.squeeze(1)?.contiguous()
    };
    let (cos, sin) = (half(cos)?, half(sin)?);
    let y = candle_nn::rotary_emb::rope_thd(&x.detach().contiguous()?, &cos, &sin)?;
    match x.track_op() {
        false => Ok(y),
        true => x.apply_op1(RopeNode { result: Handover::new(y, "rope-node"), cos, neg_sin: sin.neg()? }),
    }
}

struct RmsNormNode {
    result: Handover,
    weight: Tensor,
    eps: f64,
}

impl CustomOp1 for RmsNormNode {
    fn name(&self) -> &'static str {
        "rms-norm-node"
    }

    handed_over_forwards!(result);

    /// With `inv = 1 / sqrt(mean(x^2) + eps)` and `gw = g * weight`:
    /// `dx = inv * (gw - x * inv^2 * mean(gw * x))`, in f32.
    fn bwd(&self, x: &Tensor, _y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let x32 = x.detach().to_dtype(DType::F32)?;
        let gw = g.to_dtype(DType::F32)?.broadcast_mul(&self.weight.to_dtype(DType::F32)?)?;
        let inv = (x32.sqr()?.mean_keepdim(D::Minus1)? + self.eps)?.sqrt()?.recip()?;
        let dot = (&gw * &x32)?.mean_keepdim(D::Minus1)?;
        let dx = (gw - x32.broadcast_mul(&(inv.sqr()? * dot)?)?)?.broadcast_mul(&inv)?;
        Ok(Some(dx.to_dtype(x.dtype())?))
    }
}

struct SoftmaxNode {
    result: Handover,
    k: KernelPolicy,
}

impl CustomOp1 for SoftmaxNode {
    fn name(&self) -> &'static str {
        "softmax-node"
    }

    handed_over_forwards!(result);

    fn bwd(&self, _x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(softmax_backward(self.k, y, g)?))
    }
}

struct RopeNode {
    result: Handover,
    cos: Tensor,
    neg_sin: Tensor,
}

impl CustomOp1 for RopeNode {
    fn name(&self) -> &'static str {
        "rope-node"
    }

    handed_over_forwards!(result);

    /// Per pair `(x1, x2)`: `y = (x1 c - x2 s, x2 c + x1 s)`, whose transpose is
    /// `(g1 c + g2 s, g2 c - g1 s)`: the rotation by `-s`.
    fn bwd(&self, _x: &Tensor, _y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(candle_nn::rotary_emb::rope_thd(&g.contiguous()?, &self.cos, &self.neg_sin)?))
    }
}

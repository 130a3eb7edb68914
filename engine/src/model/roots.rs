//! Backward roots, for gradient checkpointing's recompute: one-element zero tensors
//! whose backward hands chosen tensors given gradients. Unlike the surrogate
//! `sum(out * grad_out)`, a root keeps no product and leaves no gradient for
//! `grad_out` in candle's store. (Not empty: CUDA refuses a zero-byte allocation.)

use candle_core::{CustomOp1, DType, Result, Tensor};

use crate::kernels::handover::{handed_over_forwards, Handover};

/// A root whose backward hands `out` the gradient `grad_out` (same shape).
pub fn seeded(out: &Tensor, grad_out: &Tensor) -> Result<Tensor> {
    let zero = Tensor::zeros(1, DType::F32, out.device())?;
    out.apply_op1(Seed { zero: Handover::new(zero, "seeded-backward"), grad_out: grad_out.clone() })
}

struct Seed {
    zero: Handover,
    grad_out: Tensor,
}

impl CustomOp1 for Seed {
    fn name(&self) -> &'static str {
        "seeded-backward"
    }

    handed_over_forwards!(zero);

    fn bwd(&self, _: &Tensor, _: &Tensor, _: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(self.grad_out.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ops::max_abs;
    use candle_core::{Device, Var};

    #[test]
    fn hands_the_seed_to_its_tensor() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::randn(0f32, 1., (3, 4), &dev)?;
        let y = (x.as_tensor().sqr()? * 0.5)?; // dy/dx = x
        let seed = Tensor::randn(0f32, 1., (3, 4), &dev)?;
        let root = seeded(&y, &seed)?;
        assert_eq!(root.to_vec1::<f32>()?, [0.0], "a root's value is one zero");
        let store = root.backward()?;
        let want = (x.as_tensor() * &seed)?;
        let err = max_abs(&(store.get(&x).expect("x is on the graph") - want)?);
        println!("seeded root: gradient error {err:.1e}");
        assert_eq!(err, 0.0);
        Ok(())
    }
}

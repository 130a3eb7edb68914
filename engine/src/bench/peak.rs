//! The device's bf16 product rate, measured by one large bf16 matrix product in the
//! bench's own call: what a step's achieved TFLOP/s is a fraction of.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::Result;

/// The size of the product a GPU is measured by: 8192^3, 1.1 TFLOP, long enough that
/// a launch's cost is noise and the card's tensor cores set the rate.
pub const GPU_PRODUCT: usize = 8192;

/// One product's measured rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ProductRate {
    /// `n`: the product is `[n, n] x [n, n]` in bf16.
    pub n: usize,
    /// The best of the timed runs, after one untimed.
    pub tflops_per_s: f64,
}

/// Times `[n, n] x [n, n]` in bf16 on `device` `runs` times after one untimed run, and
/// keeps the best: the rate the device reaches, not its average under other load.
pub fn bf16_product_rate(device: &Device, n: usize, runs: usize) -> Result<ProductRate> {
    let a = Tensor::randn(0f32, 1., (n, n), device)?.to_dtype(DType::BF16)?;
    let b = Tensor::randn(0f32, 1., (n, n), device)?.to_dtype(DType::BF16)?;
    a.matmul(&b)?;
    device.synchronize()?;
    let mut best = f64::INFINITY;
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        let product = a.matmul(&b)?;
        device.synchronize()?;
        best = best.min(start.elapsed().as_secs_f64());
        drop(product);
    }
    Ok(ProductRate { n, tflops_per_s: 2.0 * (n as f64).powi(3) / best / 1e12 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_products_rate_is_its_flops_over_its_best_time() {
        let rate = bf16_product_rate(&Device::Cpu, 64, 2).unwrap();
        println!("bf16 64^3 on the CPU: {:.4} TFLOP/s", rate.tflops_per_s);
        assert_eq!(rate.n, 64);
        assert!(rate.tflops_per_s.is_finite() && rate.tflops_per_s > 0.0);
    }
}

//! `ostinato bench --trace`: a preset's training step run as a GPU runs it (bf16
//! compute and weights, no CPU kernels), on the CPU, and what it asks of a device:
//! every product with its dtype and size, every value read back to the host, and how
//! many candle ops it makes per layer.
//!
//! Candle has no hook on its kernels, so the ops are counted as the tensors candle
//! makes (`trace::tensors_made`): kernels' outputs and views alike, an upper bound on
//! a GPU's launches. A layer's count is the difference between the step at the
//! preset's layers and at two more (one sliding, one full-attention layer), halved.

use std::ops::Add;

use candle_core::{DType, Device};
use serde::Serialize;

use super::{random_batch, train_step, trainer, BenchSpec};
use crate::device::Precision;
use crate::model::{DecoderWeights, DitModel, KernelPolicy};
use crate::trace::{self, Product, Read};
use crate::train::optim::{Optimizer, OptimizerConfig};
use crate::Result;

/// One step's trace.
#[derive(Debug, Clone, Serialize)]
pub struct StepTrace {
    pub preset: String,
    pub gradient_checkpointing: bool,
    pub optimizer: String,
    pub layers: usize,
    /// Candle ops (tensors made) in the whole step.
    pub ops_per_step: usize,
    /// Candle ops one layer adds to a step (forward, backward and, with checkpointing,
    /// the recompute).
    pub ops_per_layer: f64,
    pub products: usize,
    pub bf16_product_flops: f64,
    pub f32_product_flops: f64,
    /// Large products (`trace::Product::is_large`) run in f32.
    pub large_f32_products: Vec<String>,
    pub product_bytes: f64,
    /// Every read-back, in order.
    pub reads: Vec<Read>,
}

/// Traces one step of `spec` (after one untraced step, so the optimizer's state exists).
pub fn trace_step(name: &str, spec: &BenchSpec, checkpointing: bool, optimizer: &OptimizerConfig) -> Result<StepTrace> {
    let (ops_per_step, log) = traced(spec, checkpointing, optimizer)?;
    let layers = spec.config.num_hidden_layers;
    let (ops_two_more, _) = traced(&spec.clone().with_layers(layers + 2), checkpointing, optimizer)?;
    let flops_in =
        |dtype: DType| log.products.iter().filter(|p| p.dtype == dtype).map(Product::flops).fold(0.0, f64::add);
    Ok(StepTrace {
        preset: name.to_string(),
        gradient_checkpointing: checkpointing,
        optimizer: optimizer.kind().to_string(),
        layers,
        ops_per_step,
        ops_per_layer: (ops_two_more as f64 - ops_per_step as f64) / 2.0,
        products: log.products.len(),
        bf16_product_flops: flops_in(DType::BF16),
        f32_product_flops: flops_in(DType::F32),
        large_f32_products: log
            .products
            .iter()
            .filter(|p| p.dtype == DType::F32 && p.is_large())
            .map(|p| format!("{} x [{}, {}] x [{}, {}]", p.batch, p.m, p.k, p.k, p.n))
            .collect(),
        product_bytes: log.products.iter().map(Product::bytes).fold(0.0, f64::add),
        reads: log.reads,
    })
}

/// The candle ops one traced step makes, and its log.
fn traced(spec: &BenchSpec, checkpointing: bool, optimizer: &OptimizerConfig) -> Result<(usize, trace::Log)> {
    let (device, precision) = (Device::Cpu, Precision::Bf16);
    let weights = DecoderWeights::random(&spec.config, 0xBE_0C4, 0.02, precision.weights_dtype(&device), &device)?;
    let model = DitModel::new(&spec.config, &weights)?
        .computing_in(precision.dtype(&device))?
        .with_kernels(KernelPolicy::gpu());
    let mut trainer = trainer(spec, model, checkpointing)?;
    trainer.optimizer = Optimizer::new(trainer.adapter.vars(), optimizer)?;
    let batch = random_batch(spec, &device)?;
    train_step(&mut trainer, &batch)?;
    trace::start();
    let before = trace::tensors_made()?;
    let stepped = train_step(&mut trainer, &batch);
    let made = trace::tensors_made()? - before;
    let log = trace::finish();
    stepped?;
    Ok((made, log))
}

impl StepTrace {
    /// The trace as `ostinato bench --trace` prints it.
    pub fn table(&self) -> String {
        let ckpt = if self.gradient_checkpointing { "on" } else { "off" };
        let tflop = |f: f64| f / 1e12;
        let mut out = format!(
            "{} (checkpointing {ckpt}, {}), as a GPU runs it: bf16, no CPU kernels\n\
             candle ops: {} a step over {} layers, {:.1} a layer\n\
             products: {}, {:.3} TFLOP in bf16, {:.3} TFLOP in f32, {:.2} GB read and written\n",
            self.preset,
            self.optimizer,
            self.ops_per_step,
            self.layers,
            self.ops_per_layer,
            self.products,
            tflop(self.bf16_product_flops),
            tflop(self.f32_product_flops),
            self.product_bytes / 1e9,
        );
        match self.large_f32_products.is_empty() {
            true => out.push_str("large products in f32: none\n"),
            false => out.push_str(&format!("large products in f32: {}\n", self.large_f32_products.join(", "))),
        }
        let reads: Vec<String> = self.reads.iter().map(|r| format!("{} ({} values)", r.what, r.values)).collect();
        out.push_str(&format!("read back to the host: {}\n", reads.join(", ")));
        out
    }
}

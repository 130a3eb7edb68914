//! The training step, readable in one place: sample noise and timesteps -> forward ->
//! loss -> backward (per accumulated batch) -> guard -> unscale -> clip -> update.
//! The mechanisms live in their own modules and are called from here.

use candle_core::{DType, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::flow::{Batch, FlowBatch};
use super::grads;
use super::loss_scale::{LossScaler, SkipCounter, SkipVerdict};
use super::optim::{self, AdamW};
use super::schedule::{LrScheduler, TimestepSampling};
use crate::lora::{LoraAdapter, LoraMode};
use crate::model::DitModel;
use crate::Result;

/// What one call of `Trainer::step` did.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutcome {
    /// The update was applied.
    Applied { loss: f64, lr: f64, grad_norm: f64 },
    /// Loss or gradients were not finite: nothing was applied.
    Skipped {
        reason: String,
        consecutive: u32,
        loss_scale: f64,
        /// Too many skips in a row: the run must stop.
        give_up: bool,
    },
}

/// The per-step settings that do not change during a run.
#[derive(Debug, Clone)]
pub struct StepSettings {
    pub checkpointing: bool,
    pub max_grad_norm: f64,
    pub timesteps: TimestepSampling,
    pub seed: u64,
}

/// Everything that changes from step to step, and the model it trains.
pub struct Trainer {
    pub model: DitModel,
    pub adapter: LoraAdapter,
    pub optimizer: AdamW,
    pub lr: LrScheduler,
    pub scaler: LossScaler,
    pub skips: SkipCounter,
    pub settings: StepSettings,
    /// Steps attempted, applied or skipped: seeds each attempt's noise and dropout, so
    /// a step depends only on the saved state, never on what ran before in the process.
    pub attempts: u64,
}

impl Trainer {
    /// Updates applied so far.
    pub fn applied_steps(&self) -> u64 {
        self.optimizer.step_count()
    }

    /// One optimizer step over `batches` (the accumulated micro-batches).
    pub fn step(&mut self, batches: &[Batch]) -> Result<StepOutcome> {
        let attempt = self.attempts;
        self.attempts += 1;
        let lr = self.lr.lr_at(self.applied_steps());
        let n = batches.len() as f64;

        // 1-3. Noise and timesteps -> forward -> loss -> backward, summed over batches.
        let mut loss = 0.0;
        let mut sum: Option<Vec<Tensor>> = None;
        for (micro, batch) in batches.iter().enumerate() {
            let mut rng = ChaCha8Rng::seed_from_u64(mix(self.settings.seed, attempt, micro as u64));
            let t: Vec<f32> = (0..batch.len())
                .map(|_| self.settings.timesteps.sample(&mut rng) as f32)
                .collect();
            let flow = FlowBatch::new(batch, &t, &mut rng)?;
            let mode = LoraMode::Train {
                dropout_seed: mix(self.settings.seed ^ 0xD20F, attempt, micro as u64),
            };
            let g = grads::compute(
                &self.model,
                &self.adapter,
                &flow,
                mode,
                self.settings.checkpointing,
                self.scaler.scale(),
            )?;
            loss += g.loss as f64 / n;
            sum = Some(match sum {
                None => g.grads,
                Some(acc) => acc.iter().zip(&g.grads).map(|(a, b)| a + b).collect::<candle_core::Result<_>>()?,
            });
        }
        let mut grads: Vec<Tensor> = sum
            .unwrap_or_default()
            .iter()
            .map(|g| g.to_dtype(DType::F32)? / n)
            .collect::<candle_core::Result<_>>()?;

        // 4. Guard: a non-finite loss or gradient is skipped, never applied.
        if !loss.is_finite() || !optim::all_finite(&grads)? {
            self.scaler.update(false);
            let give_up = self.skips.skipped() == SkipVerdict::Fail;
            return Ok(StepOutcome::Skipped {
                reason: if loss.is_finite() { "non-finite gradients" } else { "non-finite loss" }.into(),
                consecutive: self.skips.consecutive(),
                loss_scale: self.scaler.scale(),
                give_up,
            });
        }

        // 5-6. Unscale, clip (reporting the pre-clip norm), update.
        self.scaler.unscale(&mut grads)?;
        let grad_norm = optim::clip_grad_norm(&mut grads, self.settings.max_grad_norm)?;
        self.optimizer.step(&grads, lr)?;
        self.scaler.update(true);
        self.skips.applied();
        Ok(StepOutcome::Applied { loss, lr, grad_norm })
    }
}

/// A well-mixed seed from (seed, attempt, micro-batch).
fn mix(seed: u64, attempt: u64, micro: u64) -> u64 {
    let mut h = seed ^ 0x243F_6A88_85A3_08D3;
    for v in [attempt, micro] {
        h = (h ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 31;
    }
    h
}

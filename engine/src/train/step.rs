//! The training step, readable in one place: sample noise and timesteps -> forward ->
//! loss -> backward (per accumulated batch) -> guard -> unscale -> clip -> update.
//! The mechanisms live in their own modules and are called from here.

use candle_core::{DType, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::cfg_dropout::CfgDropout;
use super::flow::{Batch, FlowBatch, LossReadout};
use super::grads;
use super::loss_scale::{LossScaler, SkipCounter, SkipVerdict};
use super::optim::{self, Optimizer};
use super::schedule::LrScheduler;
use crate::events::SampleLoss;
use crate::lora::{LoraAdapter, LoraMode};
use crate::model::timesteps::TimestepSampling;
use crate::model::DitModel;
use crate::trace;
use crate::Result;

/// What one call of `Trainer::step` did.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutcome {
    /// The update was applied, with step size `lr` (Prodigy's: its `d` times the
    /// schedule's). `samples`: each sample's timestep and loss, in the
    /// order the batches were trained.
    Applied { loss: f64, lr: f64, grad_norm: f64, samples: Vec<SampleLoss> },
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
    /// `None` when the ratio is 0: no draws at all, so such runs are unchanged.
    pub cfg_dropout: Option<CfgDropout>,
}

/// Everything that changes from step to step, and the model it trains.
pub struct Trainer {
    pub model: DitModel,
    pub adapter: LoraAdapter,
    pub optimizer: Optimizer,
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

        // 1-3. Noise, timesteps and CFG dropout -> forward -> loss -> backward, summed over batches.
        let mut readouts = Vec::with_capacity(batches.len());
        let mut timesteps = Vec::with_capacity(batches.len());
        let mut sum: Option<Vec<Tensor>> = None;
        for (micro, batch) in batches.iter().enumerate() {
            let mut rng = ChaCha8Rng::seed_from_u64(mix(self.settings.seed, attempt, micro as u64));
            let t: Vec<f32> = (0..batch.len()).map(|_| self.settings.timesteps.sample(&mut rng) as f32).collect();
            let mut flow = FlowBatch::new(batch, &t, &mut rng)?;
            if let Some(cfg) = &self.settings.cfg_dropout {
                let dropped = cfg.draw(batch.len(), mix(self.settings.seed ^ 0xCF6D, attempt, micro as u64));
                flow.inputs.encoder_hidden_states = cfg.apply(&flow.inputs.encoder_hidden_states, &dropped)?;
            }
            let mode = LoraMode::Train { dropout_seed: mix(self.settings.seed ^ 0xD20F, attempt, micro as u64) };
            let g = grads::compute(
                &self.model,
                &self.adapter,
                &flow,
                mode,
                self.settings.checkpointing,
                self.scaler.scale(),
            )?;
            readouts.push(g.loss);
            timesteps.push(t);
            sum = Some(match sum {
                None => g.grads,
                Some(acc) => acc.iter().zip(&g.grads).map(|(a, b)| a + b).collect::<candle_core::Result<_>>()?,
            });
        }
        let mut grads: Vec<Tensor> =
            sum.unwrap_or_default().iter().map(|g| g.to_dtype(DType::F32)? / n).collect::<candle_core::Result<_>>()?;

        // 4. The losses, every batch's read back at once.
        let (loss, samples) = read_losses(&readouts, &timesteps)?;

        // 5. Unscale; guard: a non-finite loss or gradient is skipped, never applied.
        self.scaler.unscale(&mut grads)?;
        let checked = optim::check(&grads)?;
        if !loss.is_finite() || !checked.finite {
            self.scaler.update(false);
            let give_up = self.skips.skipped() == SkipVerdict::Fail;
            return Ok(StepOutcome::Skipped {
                reason: if loss.is_finite() { "non-finite gradients" } else { "non-finite loss" }.into(),
                consecutive: self.skips.consecutive(),
                loss_scale: self.scaler.scale(),
                give_up,
            });
        }

        // 6. Clip (reporting the pre-clip norm), update.
        let grad_norm = checked.norm;
        optim::clip(&mut grads, grad_norm, self.settings.max_grad_norm)?;
        let lr = self.optimizer.step(&grads, lr)?;
        self.scaler.update(true);
        self.skips.applied();
        Ok(StepOutcome::Applied { loss, lr, grad_norm, samples })
    }
}

/// A well-mixed seed from (seed, attempt, micro-batch).
/// The loss (the batches' mean) and each sample's loss with its timestep, from
/// one read-back of every batch's [`LossReadout`].
fn read_losses(readouts: &[LossReadout], timesteps: &[Vec<f32>]) -> Result<(f64, Vec<SampleLoss>)> {
    let all = Tensor::cat(&readouts.iter().map(LossReadout::tensor).collect::<Vec<_>>(), 0)?;
    let read = trace::read_back("loss", &all)?;
    let (mut loss, mut samples, mut at) = (0.0, Vec::new(), 0);
    for (readout, t) in readouts.iter().zip(timesteps) {
        let (mean, per_sample) = readout.values(&read[at..at + readout.count()]);
        at += readout.count();
        loss += mean as f64 / readouts.len() as f64;
        samples.extend(t.iter().zip(per_sample).map(|(&t, loss)| SampleLoss { t, loss }));
    }
    Ok((loss, samples))
}

pub(super) fn mix(seed: u64, attempt: u64, micro: u64) -> u64 {
    let mut h = seed ^ 0x243F_6A88_85A3_08D3;
    for v in [attempt, micro] {
        h = (h ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 31;
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lora::LoraConfig;
    use crate::model::{DecoderWeights, DitConfig};
    use crate::train::loss_scale::{LossScaleConfig, LossScaler, SkipCounter};
    use crate::train::optim::{Optimizer, OptimizerConfig};
    use crate::train::schedule::LrSchedule;
    use candle_core::Device;

    fn tiny(dtype: DType, layers: usize) -> DitModel {
        let cfg = DitConfig::from_value(&serde_json::json!({
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": layers,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "in_channels": 192, "audio_acoustic_hidden_dim": 64, "patch_size": 2, "sliding_window": 4
        }))
        .unwrap();
        let w = DecoderWeights::random(&cfg, 1, 0.15, dtype, &Device::Cpu).unwrap();
        DitModel::new(&cfg, &w).unwrap()
    }

    fn trainer(model: DitModel, lr: f64, scaler: LossScaler) -> Trainer {
        let lora = LoraConfig { r: 8, alpha: 16.0, dropout: 0.0, ..Default::default() };
        let adapter = LoraAdapter::new(lora, &model, 3).unwrap();
        Trainer {
            optimizer: Optimizer::new(adapter.vars(), &OptimizerConfig::default()).unwrap(),
            lr: LrScheduler::new(LrSchedule::Constant, lr, 1000),
            scaler,
            skips: SkipCounter::new(3),
            settings: StepSettings {
                checkpointing: true,
                max_grad_norm: 1.0,
                timesteps: TimestepSampling::Turbo { shift: 3.0 },
                seed: 5,
                cfg_dropout: None,
            },
            attempts: 0,
            adapter,
            model,
        }
    }

    /// Fixed latents with structure the model can learn (a per-channel offset).
    fn batch(dtype: DType) -> Batch {
        let dev = Device::Cpu;
        let offsets = Tensor::arange(0f32, 64., &dev).unwrap().affine(1.0 / 32.0, -1.0).unwrap();
        Batch::new(
            Tensor::randn(0f32, 0.3, (2, 24, 64), &dev).unwrap().broadcast_add(&offsets).unwrap(),
            Tensor::ones((2, 24), DType::F32, &dev).unwrap(),
            Tensor::randn(0f32, 1., (2, 5, 64), &dev).unwrap().to_dtype(dtype).unwrap(),
            Tensor::zeros((2, 24, 128), dtype, &dev).unwrap(),
        )
        .unwrap()
    }

    fn snapshot(t: &Trainer) -> Vec<Vec<f32>> {
        t.adapter.vars().iter().map(|v| v.as_tensor().flatten_all().unwrap().to_vec1().unwrap()).collect()
    }

    #[test]
    fn a_few_hundred_steps_reduce_the_loss_clearly() {
        let mut t = trainer(tiny(DType::F32, 2), 1e-2, LossScaler::disabled());
        let b = batch(DType::F32);
        let losses: Vec<f64> = (0..300)
            .map(|_| match t.step(std::slice::from_ref(&b)).unwrap() {
                StepOutcome::Applied { loss, .. } => loss,
                other => panic!("{other:?}"),
            })
            .collect();
        let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
        let (first, last) = (mean(&losses[..30]), mean(&losses[270..]));
        println!("mean loss of the first 30 steps {first:.4}, of the last 30 {last:.4}");
        assert!(last < 0.6 * first, "loss fell from {first} to {last}");
    }

    fn applied_loss(t: &mut Trainer, b: &Batch) -> f64 {
        match t.step(std::slice::from_ref(b)).unwrap() {
            StepOutcome::Applied { loss, .. } => loss,
            other => panic!("{other:?}"),
        }
    }

    fn null_condition() -> Tensor {
        Tensor::randn(0f32, 1., (1, 1, 64), &Device::Cpu).unwrap()
    }

    #[test]
    fn cfg_dropout_at_ratio_one_is_exactly_the_step_on_a_batch_whose_condition_was_replaced_by_hand() {
        let null = null_condition();
        let b = batch(DType::F32);
        let mut replaced = batch(DType::F32);
        replaced.target_latents = b.target_latents.clone();
        replaced.encoder_hidden_states =
            null.broadcast_as(b.encoder_hidden_states.shape()).unwrap().contiguous().unwrap();
        let mut dropping = trainer(tiny(DType::F32, 2), 1e-3, LossScaler::disabled());
        dropping.settings.cfg_dropout = Some(CfgDropout::new(1.0, null));
        let mut by_hand = trainer(tiny(DType::F32, 2), 1e-3, LossScaler::disabled());
        for step in 0..3 {
            assert_eq!(applied_loss(&mut dropping, &b), applied_loss(&mut by_hand, &replaced), "step {step}");
        }
        assert_eq!(snapshot(&dropping), snapshot(&by_hand));
    }

    #[test]
    fn cfg_dropout_at_ratio_zero_changes_nothing_bit_for_bit() {
        let b = batch(DType::F32);
        let mut zero = trainer(tiny(DType::F32, 2), 1e-3, LossScaler::disabled());
        zero.settings.cfg_dropout = Some(CfgDropout::new(0.0, null_condition()));
        let mut without = trainer(tiny(DType::F32, 2), 1e-3, LossScaler::disabled());
        for step in 0..3 {
            assert_eq!(applied_loss(&mut zero, &b), applied_loss(&mut without, &b), "step {step}");
        }
        assert_eq!(snapshot(&zero), snapshot(&without));
    }

    /// The step reports the t each sample was trained at and that sample's own loss:
    /// replaying the step's stream gives the same t, and the same forward at those t
    /// gives the same per-sample losses (at other t, others); weighted by frames (equal
    /// here) they average to the step's loss, over accumulated batches too.
    #[test]
    fn the_reported_samples_are_the_timesteps_trained_and_their_losses_average_to_the_step_loss() {
        let (b, other) = (batch(DType::F32), batch(DType::F32));
        let mut t = trainer(tiny(DType::F32, 2), 1e-3, LossScaler::disabled());
        let StepOutcome::Applied { loss, samples, .. } = t.step(&[b, other]).unwrap() else { panic!("applied") };
        assert_eq!(samples.len(), 4, "two samples in each of two batches");
        let mean = samples.iter().map(|s| s.loss as f64).sum::<f64>() / 4.0;
        println!("step loss {loss:.7}, mean of the per-sample losses {mean:.7}");
        assert!((mean - loss).abs() <= 1e-6 * loss, "{mean} vs {loss}");

        let fresh = trainer(tiny(DType::F32, 2), 1e-3, LossScaler::disabled());
        let b = batch(DType::F32);
        let mut t = trainer(tiny(DType::F32, 2), 1e-3, LossScaler::disabled());
        let StepOutcome::Applied { samples, .. } = t.step(std::slice::from_ref(&b)).unwrap() else { panic!("applied") };
        let mut rng = ChaCha8Rng::seed_from_u64(mix(t.settings.seed, 0, 0));
        let drawn: Vec<f32> = (0..2).map(|_| t.settings.timesteps.sample(&mut rng) as f32).collect();
        assert_eq!(samples.iter().map(|s| s.t).collect::<Vec<_>>(), drawn);
        let losses_at = |t_used: &[f32]| {
            let mut rng = rng.clone();
            let flow = FlowBatch::new(&b, t_used, &mut rng).unwrap();
            let mode = LoraMode::Train { dropout_seed: mix(fresh.settings.seed ^ 0xD20F, 0, 0) };
            let loss = grads::compute(&fresh.model, &fresh.adapter, &flow, mode, true, 1.0).unwrap().loss;
            loss.values(&loss.tensor().to_vec1().unwrap()).1
        };
        assert_eq!(losses_at(&drawn), samples.iter().map(|s| s.loss).collect::<Vec<_>>());
        let elsewhere: Vec<f32> = drawn.iter().map(|&t| if t > 0.6 { 0.3 } else { 1.0 }).collect();
        assert_ne!(losses_at(&elsewhere), losses_at(&drawn), "the losses depend on t");
    }

    #[test]
    fn non_finite_batch_is_skipped_leaving_weights_exactly_and_the_run_continues() {
        let mut t = trainer(tiny(DType::F32, 2), 1e-3, LossScaler::disabled());
        let good = batch(DType::F32);
        t.step(std::slice::from_ref(&good)).unwrap();
        let before = snapshot(&t);
        let moments_before = t.optimizer.state_tensors().unwrap();
        let mut bad = batch(DType::F32);
        bad.target_latents = (bad.target_latents * f64::NAN).unwrap();
        let outcome = t.step(std::slice::from_ref(&bad)).unwrap();
        assert!(matches!(outcome, StepOutcome::Skipped { consecutive: 1, give_up: false, .. }), "{outcome:?}");
        assert_eq!(snapshot(&t), before, "weights untouched");
        assert_eq!(t.applied_steps(), 1);
        for ((k, a), (_, b)) in moments_before.iter().zip(t.optimizer.state_tensors().unwrap().iter()) {
            let diff = (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>();
            assert_eq!(diff.unwrap_or(0.0), 0.0, "{k} untouched");
        }
        assert!(matches!(t.step(std::slice::from_ref(&good)).unwrap(), StepOutcome::Applied { .. }));
        assert_eq!(t.skips.consecutive(), 0);
        // Three bad steps in a row (the limit here) give up.
        for i in 1..=3 {
            let outcome = t.step(std::slice::from_ref(&bad)).unwrap();
            assert!(matches!(outcome, StepOutcome::Skipped { give_up, .. } if give_up == (i == 3)));
        }
    }

    #[test]
    fn f16_overflow_halves_the_loss_scale_and_skips() {
        let model = tiny(DType::F16, 1);
        let mut t =
            trainer(model, 1e-3, LossScaler::dynamic(LossScaleConfig { init_scale: 1e30, growth_interval: 2000 }));
        let outcome = t.step(std::slice::from_ref(&batch(DType::F16))).unwrap();
        match outcome {
            StepOutcome::Skipped { loss_scale, .. } => assert_eq!(loss_scale, 5e29),
            other => panic!("an absurd loss scale must overflow f16 gradients: {other:?}"),
        }
    }

    #[test]
    fn bf16_compute_keeps_f32_state_and_gradients_agree_with_f32() {
        let b32 = batch(DType::F32);
        let mut t32 = trainer(tiny(DType::F32, 2), 1e-3, LossScaler::disabled());
        let mut t16 = trainer(tiny(DType::BF16, 2), 1e-3, LossScaler::disabled());
        // Non-zero B so the first step's gradients involve every LoRA tensor.
        for t in [&mut t32, &mut t16] {
            t.step(std::slice::from_ref(&b32)).unwrap();
        }
        let mut b16 = batch(DType::BF16);
        b16.target_latents = b32.target_latents.clone();
        b16.encoder_hidden_states = b32.encoder_hidden_states.to_dtype(DType::BF16).unwrap();
        let flow32 = FlowBatch::new(&b32, &[0.5, 0.75], &mut ChaCha8Rng::seed_from_u64(1)).unwrap();
        let flow16 = FlowBatch::new(&b16, &[0.5, 0.75], &mut ChaCha8Rng::seed_from_u64(1)).unwrap();
        let g32 = grads::compute(&t32.model, &t32.adapter, &flow32, LoraMode::Eval, true, 1.0).unwrap();
        let g16 = grads::compute(&t16.model, &t16.adapter, &flow16, LoraMode::Eval, true, 1.0).unwrap();
        let (l32, l16) = (g32.loss.mean().unwrap(), g16.loss.mean().unwrap());
        assert!(((l32 - l16) / l32).abs() < 0.02, "loss {l32} vs {l16}");
        let (mut num, mut den) = (0f64, 0f64);
        for (a, b) in g32.grads.iter().zip(&g16.grads) {
            assert_eq!(b.dtype(), DType::F32, "gradients reach the f32 LoRA tensors as f32");
            num += (a - b).unwrap().sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap() as f64;
            den += a.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap() as f64;
        }
        let rel = (num / den).sqrt();
        println!("bf16 vs f32 LoRA gradients: relative L2 difference {rel:.3e}");
        assert!(rel < 0.05, "bf16 gradients within bf16 tolerance: {rel}");
        for _ in 0..3 {
            t16.step(std::slice::from_ref(&b16)).unwrap();
        }
        assert!(t16.adapter.vars().iter().all(|v| v.dtype() == DType::F32));
        assert!(t16
            .optimizer
            .state_tensors()
            .unwrap()
            .iter()
            .filter(|(k, _)| k != "adamw.step")
            .all(|(_, t)| t.dtype() == DType::F32));
    }
}

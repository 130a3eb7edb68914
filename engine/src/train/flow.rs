//! Flow matching as ACE-Step trains: x1 ~ N(0, 1), x_t = t x1 + (1 - t) x0, r = t,
//! target x1 - x0, MSE in f32 over valid frames.

use candle_core::{DType, Device, Tensor};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::data::TrainingSample;
use crate::model::{ops, DitInputs};
use crate::trace;
use crate::Result;

/// A collated batch of preprocessed samples, padded to the longest in time.
pub struct Batch {
    /// `[B, T, 64]`: clean target latents x0 (zero in padded frames).
    pub target_latents: Tensor,
    /// `[B, T]` f32: 1 for real frames, 0 for padding.
    pub frame_mask: Tensor,
    /// `[B, L, E]`.
    pub encoder_hidden_states: Tensor,
    /// `[B, T, 128]`.
    pub context_latents: Tensor,
    /// Each sample's valid frames (the mask's sum), known on the host so the loss
    /// needs no read-back.
    pub frames: Vec<f32>,
}

impl Batch {
    /// A batch of tensors already collated; the mask is read once for its frames.
    pub fn new(
        target_latents: Tensor,
        frame_mask: Tensor,
        encoder_hidden_states: Tensor,
        context_latents: Tensor,
    ) -> Result<Self> {
        let frames = trace::read_back("valid frames", &frame_mask.to_dtype(DType::F32)?.sum(1)?)?;
        Ok(Self { target_latents, frame_mask, encoder_hidden_states, context_latents, frames })
    }

    /// Stacks samples into a batch, zero-padding time to the longest sample and the
    /// condition to the longest sequence; padded frames get mask 0. (The DiT itself
    /// ignores masks, as ACE-Step's does: padded condition rows take part.)
    pub fn collate(samples: &[&TrainingSample], dtype: DType, device: &Device) -> Result<Self> {
        let frames = samples.iter().map(|s| s.target_latents.dim(0)).collect::<candle_core::Result<Vec<_>>>()?;
        let rows = samples.iter().map(|s| s.encoder_hidden_states.dim(0)).collect::<candle_core::Result<Vec<_>>>()?;
        let (t_max, l_max) = (*frames.iter().max().unwrap_or(&0), *rows.iter().max().unwrap_or(&0));
        let stack = |get: &dyn Fn(&TrainingSample) -> &Tensor, len: usize| -> Result<Tensor> {
            let padded = samples
                .iter()
                .map(|s| {
                    let t = get(s).to_dtype(DType::F32)?;
                    let missing = len - t.dim(0)?;
                    if missing > 0 {
                        t.pad_with_zeros(0, 0, missing)
                    } else {
                        Ok(t)
                    }
                })
                .collect::<candle_core::Result<Vec<_>>>()?;
            Ok(Tensor::stack(&padded, 0)?.to_device(device)?)
        };
        // The samples are on the host: their masks are summed there.
        let frames = samples
            .iter()
            .map(|s| Ok(trace::read_back("valid frames", &s.attention_mask.to_dtype(DType::F32)?.sum_all()?)?[0]))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            target_latents: stack(&|s| &s.target_latents, t_max)?,
            frame_mask: stack(&|s| &s.attention_mask, t_max)?,
            encoder_hidden_states: stack(&|s| &s.encoder_hidden_states, l_max)?.to_dtype(dtype)?,
            context_latents: stack(&|s| &s.context_latents, t_max)?.to_dtype(dtype)?,
            frames,
        })
    }

    pub fn len(&self) -> usize {
        self.target_latents.dim(0).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One noised batch: what the DiT sees and what it must predict.
pub struct FlowBatch {
    pub inputs: DitInputs,
    /// `[B, T, 64]` f32: x1 - x0.
    pub target: Tensor,
    /// `[B, T]` f32.
    pub frame_mask: Tensor,
    /// Each sample's valid frames.
    pub frames: Vec<f32>,
}

impl FlowBatch {
    /// Draws x1 from `rng` (seeded, so a step is reproducible) and noises the batch at `t`.
    pub fn new(batch: &Batch, t: &[f32], rng: &mut ChaCha8Rng) -> Result<Self> {
        let x0 = batch.target_latents.to_dtype(DType::F32)?;
        let device = x0.device();
        let noise: Vec<f32> = (0..x0.elem_count()).map(|_| StandardNormal.sample(rng)).collect();
        let x1 = Tensor::from_vec(noise, x0.shape(), device)?;
        let b = x0.dim(0)?;
        let t_col = Tensor::from_slice(t, (b, 1, 1), device)?;
        let x_t = (x1.broadcast_mul(&t_col)? + x0.broadcast_mul(&(1.0 - &t_col)?)?)?;
        let timestep = Tensor::from_slice(t, b, device)?;
        Ok(Self {
            inputs: DitInputs {
                hidden_states: x_t,
                context_latents: batch.context_latents.clone(),
                encoder_hidden_states: batch.encoder_hidden_states.clone(),
                timestep: timestep.clone(),
                timestep_r: timestep,
            },
            target: (x1 - x0)?,
            frame_mask: batch.frame_mask.to_dtype(DType::F32)?,
            frames: batch.frames.clone(),
        })
    }

    /// Mean squared error in f32 over valid frames (equal to the plain mean when no
    /// frame is padding), keeping the graph of `prediction`, and each sample's own MSE
    /// over its valid frames.
    pub fn loss(&self, prediction: &Tensor) -> Result<Loss> {
        let diff = ops::sub(&prediction.to_dtype(DType::F32)?, &self.target)?;
        let mask = self.frame_mask.unsqueeze(2)?;
        let squared = ops::mul(&diff.sqr()?, &mask)?;
        let channels = self.target.dim(2)? as f64;
        let sums = squared.sum((1, 2))?; // (B)
        let all_valid: f64 = self.frames.iter().map(|&v| v as f64).sum();
        let mean = (sums.sum_all()? / (all_valid.max(1.0) * channels))?;
        let readout = Tensor::cat(&[mean.detach().reshape(1)?, sums.detach()], 0)?;
        let readout = LossReadout { readout, frames: self.frames.clone(), channels };
        Ok(Loss { mean, readout })
    }
}

/// A batch's flow-matching loss.
pub struct Loss {
    /// The scalar the gradients come from: MSE over every valid frame of the batch.
    pub mean: Tensor,
    /// The values a step reports, off the graph and still on the device.
    pub readout: LossReadout,
}

/// A batch's loss and each sample's, read back with the step's other batches' at once
/// (on a GPU each read-back is a synchronisation).
pub struct LossReadout {
    /// `[1 + B]`: the mean, then each sample's squared-error sum.
    readout: Tensor,
    frames: Vec<f32>,
    channels: f64,
}

impl LossReadout {
    /// What is read back: the mean, then each sample's sum.
    pub fn tensor(&self) -> &Tensor {
        &self.readout
    }

    /// How many values [`tensor`](Self::tensor) holds.
    pub fn count(&self) -> usize {
        1 + self.frames.len()
    }

    /// The mean alone, read back now.
    pub fn mean(&self) -> Result<f32> {
        Ok(trace::read_back("loss", &self.readout.narrow(0, 0, 1)?)?[0])
    }

    /// The mean, and each sample's MSE over its own valid frames (weighted by those
    /// frames, their mean is the mean), from the values read back.
    pub fn values(&self, read: &[f32]) -> (f32, Vec<f32>) {
        let per_sample = (read[1..].iter().zip(&self.frames))
            .map(|(&sum, &frames)| (sum as f64 / (frames.max(1.0) as f64 * self.channels)) as f32)
            .collect();
        (read[0], per_sample)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn batch(mask: &[f32]) -> Batch {
        let dev = Device::Cpu;
        let t = mask.len();
        Batch::new(
            Tensor::randn(0f32, 1., (1, t, 4), &dev).unwrap(),
            Tensor::from_slice(mask, (1, t), &dev).unwrap(),
            Tensor::zeros((1, 2, 4), DType::F32, &dev).unwrap(),
            Tensor::zeros((1, t, 8), DType::F32, &dev).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn interpolates_and_targets_velocity() -> Result<()> {
        let b = batch(&[1.0; 5]);
        let fb = FlowBatch::new(&b, &[0.3], &mut ChaCha8Rng::seed_from_u64(1))?;
        let x1 = (&fb.target + &b.target_latents)?;
        let expect = ((&x1 * 0.3)? + (&b.target_latents * 0.7)?)?;
        let err = (&fb.inputs.hidden_states - expect)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(err < 1e-6);
        // Same seed, same noise.
        let again = FlowBatch::new(&b, &[0.3], &mut ChaCha8Rng::seed_from_u64(1))?;
        assert_eq!((&fb.target - &again.target)?.abs()?.max_all()?.to_scalar::<f32>()?, 0.0);
        Ok(())
    }

    #[test]
    fn loss_is_plain_mean_without_padding_and_ignores_padded_frames() -> Result<()> {
        let full = FlowBatch::new(&batch(&[1.0; 4]), &[0.5], &mut ChaCha8Rng::seed_from_u64(2))?;
        let pred = Tensor::randn(0f32, 1., (1, 4, 4), &Device::Cpu)?;
        let plain = (&pred - &full.target)?.sqr()?.mean_all()?.to_scalar::<f32>()?;
        assert!((full.loss(&pred)?.mean.to_scalar::<f32>()? - plain).abs() < 1e-6);

        let mut padded = FlowBatch::new(&batch(&[1.0, 1.0, 0.0, 0.0]), &[0.5], &mut ChaCha8Rng::seed_from_u64(2))?;
        padded.target = full.target.clone();
        let first_two =
            (pred.narrow(1, 0, 2)? - full.target.narrow(1, 0, 2)?)?.sqr()?.mean_all()?.to_scalar::<f32>()?;
        let pred_bad_tail = Tensor::cat(&[pred.narrow(1, 0, 2)?, (pred.narrow(1, 2, 2)? * 1e6)?], 1)?;
        assert!((padded.loss(&pred_bad_tail)?.mean.to_scalar::<f32>()? - first_two).abs() < 1e-5);
        Ok(())
    }

    #[test]
    fn each_samples_loss_is_over_its_own_valid_frames_and_they_weight_to_the_mean() -> Result<()> {
        let dev = Device::Cpu;
        let batch = Batch::new(
            Tensor::randn(0f32, 1., (2, 4, 3), &dev)?,
            Tensor::from_slice(&[1f32, 1., 1., 1., 1., 0., 0., 0.], (2, 4), &dev)?,
            Tensor::zeros((2, 2, 4), DType::F32, &dev)?,
            Tensor::zeros((2, 4, 8), DType::F32, &dev)?,
        )?;
        let flow = FlowBatch::new(&batch, &[0.3, 0.9], &mut ChaCha8Rng::seed_from_u64(3))?;
        let pred = Tensor::randn(0f32, 1., (2, 4, 3), &dev)?;
        let loss = flow.loss(&pred)?;
        let own = |i: usize, frames: usize| -> Result<f32> {
            let d =
                (pred.narrow(0, i, 1)?.narrow(1, 0, frames)? - flow.target.narrow(0, i, 1)?.narrow(1, 0, frames)?)?;
            Ok(d.sqr()?.mean_all()?.to_scalar::<f32>()?)
        };
        let (mean, per_sample) = loss.readout.values(&loss.readout.tensor().to_vec1()?);
        assert_eq!(mean, loss.mean.to_scalar::<f32>()?);
        for (i, frames) in [(0, 4), (1, 1)] {
            assert!((per_sample[i] - own(i, frames)?).abs() < 1e-6, "sample {i}");
        }
        let weighted = (4.0 * per_sample[0] + per_sample[1]) / 5.0;
        assert!((mean - weighted).abs() < 1e-6);
        Ok(())
    }
}

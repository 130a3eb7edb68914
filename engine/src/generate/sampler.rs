//! The flow-matching ODE sampler of ACE-Step 1.5's text-to-music generation.
//!
//! x starts as seeded Gaussian noise at t = 1; each step asks the DiT for v at
//! (x_t, t, r = t) and takes an Euler step to the next t, the last one to t = 0:
//! `x_{k+1} = x_k - v_k (t_k - t_{k+1})` with the f32 difference, `x0 = x_N - v_N t_N`.
//! Turbo models take 8 steps without guidance; base/SFT models guide each step with
//! APG (see [`Guidance`]) between a conditional and an unconditional prediction.

use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

use crate::model::{DitInputs, DitModel, LinearAdapter};
use crate::{Error, Result};

/// The t fed to the DiT at each step: `shift t / (1 + (shift - 1) t)` over
/// `linspace(1, 0, steps + 1)` without its final 0, computed in f32 as diffusers'
/// `AceStepPipeline` does. At 8 steps and shift 1, 2 or 3 these are the fixed tables of
/// ACE-Step's turbo `generate_audio`, value for value.
pub fn timesteps(steps: usize, shift: f64) -> Result<Vec<f32>> {
    if steps == 0 {
        return Err(Error::BadRequest("the number of steps must be at least 1".into()));
    }
    if !(shift.is_finite() && shift > 0.0) {
        return Err(Error::BadRequest(format!("shift must be a positive number, not {shift}")));
    }
    let s = shift as f32;
    Ok(linspace_1_to_0(steps + 1)
        .into_iter()
        .take(steps)
        .map(|t| if shift == 1.0 { t } else { s * t / (1.0 + (s - 1.0) * t) })
        .collect())
}

/// torch's f32 `linspace(1, 0, n)`: the first half counted from the start, the second
/// from the end, so both ends are exact.
fn linspace_1_to_0(n: usize) -> Vec<f32> {
    let step = -1.0f32 / (n - 1) as f32;
    (0..n).map(|i| if i < n / 2 { 1.0 + step * i as f32 } else { 0.0 - step * (n - 1 - i) as f32 }).collect()
}

/// Seeded N(0, 1) noise `[1, frames, channels]` (a ChaCha8 stream: the same seed gives
/// the same noise on every machine).
pub fn noise(seed: u64, frames: usize, channels: usize, device: &Device) -> Result<Tensor> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let values: Vec<f32> = (0..frames * channels)
        .map(|_| <StandardNormal as Distribution<f32>>::sample(&StandardNormal, &mut rng))
        .collect();
    Ok(Tensor::from_vec(values, (1, frames, channels), device)?)
}

/// What every step is conditioned on.
pub struct Conditions {
    /// `[1, T, 2C]`: silence latent ++ chunk mask.
    pub context_latents: Tensor,
    /// `[1, L, D]`: the condition encoder's output.
    pub encoder_hidden_states: Tensor,
}

/// APG momentum (diffusers' `MomentumBuffer(-0.75)`): the running average of the
/// guidance difference is `diff + momentum * previous`.
const APG_MOMENTUM: f64 = -0.75;
/// The time-axis norm the guidance difference is clipped to.
const APG_NORM_THRESHOLD: f64 = 2.5;

/// Classifier-free guidance as ACE-Step's base/SFT models do it: APG (adaptive
/// projected guidance) between the conditional prediction and the prediction for
/// `null_condition_emb`, on steps whose `1 - t` lies in `interval`.
pub struct Guidance {
    /// The guidance scale (> 1; 1 would be the conditional prediction alone).
    pub scale: f64,
    /// `[1, 1, D]`: the checkpoint's `null_condition_emb`, broadcast over the sequence.
    pub null_condition: Tensor,
    /// `(start, end)` in `[0, 1]` of `1 - t` where guidance applies; (0, 1) is every step.
    pub interval: (f64, f64),
}

impl Guidance {
    fn applies(&self, t: f32) -> bool {
        let ratio = 1.0 - t as f64;
        self.interval.0 <= ratio && ratio <= self.interval.1
    }
}

/// Runs the sampler from `x` (the noise at t = `schedule[0]`) and returns the clean
/// latent `[1, T, C]` (f32). `lora` is the adapter with its strength (None: the base
/// model). `on_step(k, x_k)` sees x entering step k, before the DiT runs; an error
/// from it (a stop request) ends the sampling there.
pub fn sample(
    model: &DitModel,
    lora: Option<&dyn LinearAdapter>,
    x: &Tensor,
    cond: &Conditions,
    schedule: &[f32],
    guidance: Option<&Guidance>,
    mut on_step: impl FnMut(usize, &Tensor) -> Result<()>,
) -> Result<Tensor> {
    let mut x = x.to_dtype(DType::F32)?;
    let mut momentum: Option<Tensor> = None;
    for (k, &t) in schedule.iter().enumerate() {
        on_step(k, &x)?;
        let v = match guidance {
            Some(g) if g.applies(t) => {
                let (v_cond, v_uncond) = velocity_pair(model, lora, &x, cond, &g.null_condition, t)?;
                apg(&v_cond, &v_uncond, g.scale - 1.0, &mut momentum)?
            }
            _ => velocity(model, lora, &x, &cond.encoder_hidden_states, &cond.context_latents, t)?,
        };
        let t_next = schedule.get(k + 1).copied().unwrap_or(0.0);
        x = (&x - (v * (t - t_next) as f64)?)?;
        // Caught at the step that made it: NaN would otherwise run on to the end and
        // be decoded into a song of NaN.
        crate::finite::ensure_tensor(&x, || {
            format!("sampling step {} of {}: the latents after the DiT's prediction", k + 1, schedule.len())
        })?;
    }
    Ok(x)
}

/// The DiT's prediction (f32) at time t for a batch of x.
fn velocity(
    model: &DitModel,
    lora: Option<&dyn LinearAdapter>,
    x: &Tensor,
    states: &Tensor,
    context: &Tensor,
    t: f32,
) -> Result<Tensor> {
    let b = x.dim(0)?;
    let t = Tensor::full(t, b, x.device())?;
    // The model's compute dtype (a training run's model may be bf16); f32 stays as it is.
    let dtype = model.dtype();
    let inputs = DitInputs {
        hidden_states: x.to_dtype(dtype)?,
        context_latents: context.to_dtype(dtype)?,
        encoder_hidden_states: states.to_dtype(dtype)?,
        timestep: t.clone(),
        timestep_r: t,
    };
    Ok(model.forward(&inputs, lora)?.to_dtype(DType::F32)?)
}

/// Conditional and unconditional predictions in one batch of two, as diffusers runs them.
fn velocity_pair(
    model: &DitModel,
    lora: Option<&dyn LinearAdapter>,
    x: &Tensor,
    cond: &Conditions,
    null: &Tensor,
    t: f32,
) -> Result<(Tensor, Tensor)> {
    let states = &cond.encoder_hidden_states;
    let null = null.to_dtype(states.dtype())?.broadcast_as(states.shape())?;
    let v = velocity(
        model,
        lora,
        &Tensor::cat(&[x, x], 0)?,
        &Tensor::cat(&[states, &null], 0)?,
        &Tensor::cat(&[&cond.context_latents, &cond.context_latents], 0)?,
        t,
    )?;
    Ok((v.narrow(0, 0, 1)?, v.narrow(0, 1, 1)?))
}

/// APG with ACE-Step's settings (diffusers' `normalized_guidance` with momentum -0.75,
/// eta 0, norm threshold 2.5, norms over the time axis, the original formulation):
/// the momentum-averaged difference cond - uncond, clipped to norm 2.5 per channel,
/// keeps only its part orthogonal to the conditional prediction (in f64), and
/// `cond + scale_minus_one * that` is the guided prediction. `[1, T, C]` each.
fn apg(cond: &Tensor, uncond: &Tensor, scale_minus_one: f64, momentum: &mut Option<Tensor>) -> Result<Tensor> {
    let diff = (cond - uncond)?;
    let diff = match momentum.take() {
        Some(previous) => (diff + (previous * APG_MOMENTUM)?)?,
        None => diff,
    };
    *momentum = Some(diff.clone());
    let norm = diff.sqr()?.sum_keepdim(1)?.sqrt()?; // (1, 1, C)
    let factor = norm.recip()?.affine(APG_NORM_THRESHOLD, 0.0)?.minimum(1f32)?;
    let diff = diff.broadcast_mul(&factor)?.to_dtype(DType::F64)?;
    let c = cond.to_dtype(DType::F64)?;
    let unit = c.broadcast_div(&c.sqr()?.sum_keepdim(1)?.sqrt()?.maximum(1e-12f64)?)?;
    let parallel = (&diff * &unit)?.sum_keepdim(1)?.broadcast_mul(&unit)?;
    let orthogonal = (diff - parallel)?.to_dtype(DType::F32)?;
    Ok((cond + (orthogonal * scale_minus_one)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_step_schedules_are_the_turbo_tables() {
        // ACE-Step's turbo `generate_audio` tables (as f32).
        let tables: [(f64, [f64; 8]); 3] = [
            (1.0, [1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125]),
            (
                2.0,
                [
                    1.0,
                    0.9333333333333333,
                    0.8571428571428571,
                    0.7692307692307693,
                    0.6666666666666666,
                    0.5454545454545454,
                    0.4,
                    0.2222222222222222,
                ],
            ),
            (3.0, [1.0, 0.9545454545454546, 0.9, 0.8333333333333334, 0.75, 0.6428571428571429, 0.5, 0.3]),
        ];
        for (shift, table) in tables {
            let got = timesteps(8, shift).unwrap();
            let want: Vec<f32> = table.iter().map(|&t| t as f32).collect();
            println!("shift {shift}: {got:?}");
            assert_eq!(got, want, "shift {shift}");
        }
    }

    #[test]
    fn other_step_counts_follow_the_shift_formula() {
        let t = timesteps(32, 3.0).unwrap();
        assert_eq!(t.len(), 32);
        assert_eq!(t[0], 1.0);
        assert!(t.windows(2).all(|w| w[1] < w[0]));
        let u = 1.0 - 31.0 / 32.0;
        assert!((t[31] as f64 - 3.0 * u / (1.0 + 2.0 * u)).abs() < 1e-7);
        assert!(timesteps(0, 3.0).is_err());
        assert!(timesteps(8, 0.0).is_err() && timesteps(8, f64::NAN).is_err());
    }

    #[test]
    fn noise_is_seeded() {
        let a = noise(7, 5, 4, &Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let b = noise(7, 5, 4, &Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let c = noise(8, 5, 4, &Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn apg_keeps_the_part_orthogonal_to_the_conditional_prediction() {
        let dev = Device::Cpu;
        let cond = Tensor::new(&[[[1f32], [0.0]]], &dev).unwrap(); // (1, T=2, C=1)
        let uncond = Tensor::new(&[[[0f32], [-1.0]]], &dev).unwrap();
        // diff (1, 1): norm sqrt(2) < 2.5, kept; its part along cond (1, 0) is (1, 0),
        // orthogonal (0, 1); guided = cond + 2 * (0, 1).
        let mut m = None;
        let g = apg(&cond, &uncond, 2.0, &mut m).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(g, [1.0, 2.0]);
        // Second call: momentum diff + (-0.75) diff = 0.25 diff -> orthogonal (0, 0.25).
        let g = apg(&cond, &uncond, 2.0, &mut m).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(g, [1.0, 0.5]);
        // A long difference is clipped to norm 2.5 first.
        let far = Tensor::new(&[[[0f32], [-10.0]]], &dev).unwrap();
        let g = apg(&cond, &far, 1.0, &mut None).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!((g[1] - 2.5 * 10.0 / 101f32.sqrt()).abs() < 1e-6, "{g:?}");
    }
}

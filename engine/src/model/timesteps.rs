//! How the flow-matching timestep t in (0, 1] is drawn: the model's own training
//! distribution (turbo's 8-step schedule, base/SFT's shifted logit-normal), which
//! training samples from and generation's schedule shares.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};

/// How the flow-matching timestep t in (0, 1] is drawn for each sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TimestepSampling {
    /// Uniform over the 8-step turbo schedule of this shift (ACE-Step's turbo
    /// training: shift 3).
    Turbo { shift: f64 },
    /// sigmoid(N(mu, sigma)), then shifted (ACE-Step's base/SFT: mu -0.4, sigma 1).
    LogitNormal { mu: f64, sigma: f64, shift: f64 },
}

impl Default for TimestepSampling {
    fn default() -> Self {
        TimestepSampling::Turbo { shift: 3.0 }
    }
}

/// The timestep shift: t -> s*t / (1 + (s-1)*t). Shift 1 is the identity; larger
/// shifts push t toward 1 (more noise).
pub fn shift_timestep(t: f64, shift: f64) -> f64 {
    shift * t / (1.0 + (shift - 1.0) * t)
}

/// The turbo model's 8 timesteps: u = 1, 7/8, ..., 1/8, shifted.
pub fn turbo_timesteps(shift: f64) -> [f64; 8] {
    std::array::from_fn(|i| shift_timestep((8 - i) as f64 / 8.0, shift))
}

impl TimestepSampling {
    /// The fixed set of timesteps drawn from, when there is one (turbo).
    pub fn levels(&self) -> Option<[f64; 8]> {
        match *self {
            TimestepSampling::Turbo { shift } => Some(turbo_timesteps(shift)),
            TimestepSampling::LogitNormal { .. } => None,
        }
    }

    /// Draws one timestep.
    pub fn sample(&self, rng: &mut ChaCha8Rng) -> f64 {
        match *self {
            TimestepSampling::Turbo { shift } => turbo_timesteps(shift)[rng.random_range(0..8)],
            TimestepSampling::LogitNormal { mu, sigma, shift } => {
                let z: f64 = rng.sample(StandardNormal);
                let t = 1.0 / (1.0 + (-(mu + sigma * z)).exp());
                shift_timestep(t, shift)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn turbo_shift_3_is_ace_steps_schedule() {
        let expected = [1.0, 21.0 / 22.0, 0.9, 5.0 / 6.0, 0.75, 9.0 / 14.0, 0.5, 0.3];
        let got = turbo_timesteps(3.0);
        for (g, e) in got.iter().zip(expected) {
            assert!(close(*g, e), "{got:?}");
        }
        assert!((got[1] - 0.9545).abs() < 1e-4 && (got[5] - 0.6428).abs() < 1e-4);
    }

    #[test]
    fn turbo_samples_cover_the_schedule() {
        let sampler = TimestepSampling::Turbo { shift: 3.0 };
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let schedule = turbo_timesteps(3.0);
        let mut seen = [0usize; 8];
        for _ in 0..800 {
            let t = sampler.sample(&mut rng);
            let i = schedule.iter().position(|&s| s == t).expect("a schedule value");
            seen[i] += 1;
        }
        assert!(seen.iter().all(|&n| n > 60), "roughly uniform: {seen:?}");
    }

    #[test]
    fn shift_changes_what_is_sampled() {
        // ACE-Step's UI ignores the shift setting; here it must matter.
        for (a, b) in [
            (TimestepSampling::Turbo { shift: 3.0 }, TimestepSampling::Turbo { shift: 1.0 }),
            (
                TimestepSampling::LogitNormal { mu: -0.4, sigma: 1.0, shift: 3.0 },
                TimestepSampling::LogitNormal { mu: -0.4, sigma: 1.0, shift: 1.0 },
            ),
        ] {
            let draw = |s: &TimestepSampling| {
                let mut rng = ChaCha8Rng::seed_from_u64(7);
                (0..64).map(|_| s.sample(&mut rng)).collect::<Vec<_>>()
            };
            let (x, y) = (draw(&a), draw(&b));
            assert_ne!(x, y);
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
            assert!(mean(&x) > mean(&y), "a larger shift means more noise");
        }
        assert_eq!(turbo_timesteps(1.0)[7], 0.125);
    }

    #[test]
    fn logit_normal_statistics() {
        let (mu, sigma) = (-0.4, 1.0);
        let sampler = TimestepSampling::LogitNormal { mu, sigma, shift: 1.0 };
        let mut rng = ChaCha8Rng::seed_from_u64(42);
        let n = 20_000;
        let mut logits: Vec<f64> = (0..n)
            .map(|_| {
                let t = sampler.sample(&mut rng);
                assert!(t > 0.0 && t < 1.0);
                (t / (1.0 - t)).ln()
            })
            .collect();
        let mean = logits.iter().sum::<f64>() / n as f64;
        let var = logits.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!((mean - mu).abs() < 0.03, "mean {mean}");
        assert!((var.sqrt() - sigma).abs() < 0.03, "std {}", var.sqrt());
        logits.sort_by(f64::total_cmp);
        // Median of t is sigmoid(mu); the 84th percentile is sigmoid(mu + sigma).
        let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
        let q = |p: f64| sigmoid(logits[(p * n as f64) as usize]);
        assert!((q(0.5) - sigmoid(mu)).abs() < 0.01);
        assert!((q(0.8413) - sigmoid(mu + sigma)).abs() < 0.01);
    }

    #[test]
    fn rng_state_serializes_and_continues() {
        let sampler = TimestepSampling::LogitNormal { mu: -0.4, sigma: 1.0, shift: 3.0 };
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        sampler.sample(&mut rng);
        let saved = serde_json::to_string(&rng).unwrap();
        let mut restored: ChaCha8Rng = serde_json::from_str(&saved).unwrap();
        for _ in 0..10 {
            assert_eq!(sampler.sample(&mut rng), sampler.sample(&mut restored));
        }
    }
}

//! Learning-rate schedules and timestep sampling: the two per-step schedules a run
//! configures. Both are serde enums tagged by `kind`, so they sit in run.toml as e.g.
//! `lr_schedule = { kind = "warmup_cosine", warmup_steps = 100 }`.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};

/// The shape of the learning rate over a run. `step` counts optimizer updates made
/// so far: `lr_at(0)` is the rate of the first update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LrSchedule {
    /// ACE-Step's: linear warmup from 0.1 * lr to lr over
    /// `min(warmup_steps, max(1, total / 10))` steps (PyTorch `LinearLR`), then cosine
    /// to 1% of lr at the last step (`CosineAnnealingLR`), held there after.
    WarmupCosine { warmup_steps: u64 },
    /// The base rate throughout.
    Constant,
    /// Straight line from lr at step 0 to `floor * lr` at the last step, held after;
    /// `floor` is a fraction of lr (0 decays to zero).
    Linear {
        #[serde(default)]
        floor: f64,
    },
}

impl Default for LrSchedule {
    fn default() -> Self {
        LrSchedule::WarmupCosine { warmup_steps: 100 }
    }
}

/// A schedule bound to a run's base rate and length.
#[derive(Debug, Clone, PartialEq)]
pub struct LrScheduler {
    pub schedule: LrSchedule,
    pub base_lr: f64,
    /// Optimizer updates in the whole run.
    pub total_steps: u64,
}

impl LrScheduler {
    pub fn new(schedule: LrSchedule, base_lr: f64, total_steps: u64) -> Self {
        Self { schedule, base_lr, total_steps }
    }

    /// The learning rate of update number `step` (0-based); a pure function of step.
    pub fn lr_at(&self, step: u64) -> f64 {
        let lr = self.base_lr;
        let total = self.total_steps.max(1);
        match self.schedule {
            LrSchedule::Constant => lr,
            LrSchedule::Linear { floor } => {
                let progress = step.min(total) as f64 / total as f64;
                lr * (1.0 - (1.0 - floor) * progress)
            }
            LrSchedule::WarmupCosine { warmup_steps } => {
                let warmup = warmup_steps.min((total / 10).max(1));
                if step < warmup {
                    return lr * (0.1 + 0.9 * step as f64 / warmup as f64);
                }
                let min_lr = 0.01 * lr;
                let span = total.saturating_sub(warmup).max(1);
                let progress = (step - warmup).min(span) as f64 / span as f64;
                min_lr + (lr - min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        }
    }
}

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
    fn warmup_cosine_boundaries() {
        // total 1000: warmup min(50, 100) = 50.
        let s = LrScheduler::new(LrSchedule::WarmupCosine { warmup_steps: 50 }, 1e-3, 1000);
        assert!(close(s.lr_at(0), 1e-4), "starts at 0.1 * lr");
        assert!(close(s.lr_at(25), 1e-4 + 0.9e-3 * 0.5));
        assert!(close(s.lr_at(50), 1e-3), "end of warmup: full lr");
        assert!(close(s.lr_at(525), 1e-5 + (1e-3 - 1e-5) * 0.5), "mid cosine");
        assert!(close(s.lr_at(1000), 1e-5), "last: 1% of lr");
        assert!(close(s.lr_at(5000), 1e-5), "held after the end");
        assert!(s.lr_at(999) > s.lr_at(1000));
    }

    #[test]
    fn warmup_is_capped_at_a_tenth_of_the_run() {
        let s = LrScheduler::new(LrSchedule::WarmupCosine { warmup_steps: 100 }, 1.0, 200);
        assert!(close(s.lr_at(20), 1.0), "warmup min(100, 20) = 20");
        assert!(close(s.lr_at(10), 0.55));
        // Tiny run: warmup at least 1 step.
        let s = LrScheduler::new(LrSchedule::WarmupCosine { warmup_steps: 100 }, 1.0, 5);
        assert!(close(s.lr_at(0), 0.1));
        assert!(close(s.lr_at(1), 1.0));
        assert!(close(s.lr_at(5), 0.01));
    }

    #[test]
    fn constant_and_linear() {
        let c = LrScheduler::new(LrSchedule::Constant, 2e-4, 10);
        assert_eq!([c.lr_at(0), c.lr_at(10), c.lr_at(99)], [2e-4; 3]);
        let l = LrScheduler::new(LrSchedule::Linear { floor: 0.0 }, 1.0, 10);
        assert!(close(l.lr_at(0), 1.0));
        assert!(close(l.lr_at(5), 0.5));
        assert!(close(l.lr_at(10), 0.0));
        assert!(close(l.lr_at(20), 0.0));
        let l = LrScheduler::new(LrSchedule::Linear { floor: 0.1 }, 1.0, 10);
        assert!(close(l.lr_at(10), 0.1));
        assert!(close(l.lr_at(5), 0.55));
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

    #[test]
    fn configs_sit_in_toml() {
        #[derive(Deserialize, Serialize, PartialEq, Debug)]
        struct RunToml {
            lr_schedule: LrSchedule,
            timesteps: TimestepSampling,
        }
        let run: RunToml = toml::from_str(
            r#"
            lr_schedule = { kind = "linear", floor = 0.05 }
            [timesteps]
            kind = "logit_normal"
            mu = -0.4
            sigma = 1.0
            shift = 3.0
            "#,
        )
        .unwrap();
        assert_eq!(run.lr_schedule, LrSchedule::Linear { floor: 0.05 });
        assert_eq!(run.timesteps, TimestepSampling::LogitNormal { mu: -0.4, sigma: 1.0, shift: 3.0 });
        let back: RunToml = toml::from_str(&toml::to_string(&run).unwrap()).unwrap();
        assert_eq!(back, run);
    }

    #[test]
    fn configs_are_kind_tagged() {
        let json = serde_json::to_value(TimestepSampling::LogitNormal { mu: -0.4, sigma: 1.0, shift: 1.0 }).unwrap();
        assert_eq!(json["kind"], "logit_normal");
        let s: LrSchedule = serde_json::from_str(r#"{"kind": "warmup_cosine", "warmup_steps": 10}"#).unwrap();
        assert_eq!(s, LrSchedule::WarmupCosine { warmup_steps: 10 });
        let s: LrSchedule = serde_json::from_str(r#"{"kind": "linear"}"#).unwrap();
        assert_eq!(s, LrSchedule::Linear { floor: 0.0 });
    }
}

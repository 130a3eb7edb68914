//! Learning-rate schedules: the shape of the learning rate over a run. A serde enum
//! tagged by `kind`, so it sits in run.toml as e.g.
//! `lr_schedule = { kind = "warmup_cosine", warmup_steps = 100 }` (beside the model's
//! timestep sampling, `model::timesteps`).

use serde::{Deserialize, Serialize};

/// The shape of the learning rate over a run. `step` counts optimizer updates made
/// so far: `lr_at(0)` is the rate of the first update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LrSchedule {
    /// ACE-Step's: linear warmup from 0.1 * lr to lr over
    /// `min(warmup_steps, max(1, total / 10))` steps (PyTorch `LinearLR`), then cosine
    /// to 1% of lr at the last step (`CosineAnnealingLR`), held there after.
    WarmupCosine {
        #[serde(default = "default_warmup")]
        warmup_steps: u64,
    },
    /// The base rate throughout.
    Constant,
    /// Straight line from lr at step 0 to `floor * lr` at the last step, held after;
    /// `floor` is a fraction of lr (0 decays to zero).
    Linear {
        #[serde(default)]
        floor: f64,
    },
    /// transformers' `get_cosine_with_hard_restarts_schedule_with_warmup`: linear
    /// warmup from 0 to lr over `warmup_steps`, then `cycles` cosine decays from lr to
    /// 0, each restarting at lr; 0 from the last step on.
    CosineRestarts {
        #[serde(default = "default_warmup")]
        warmup_steps: u64,
        #[serde(default = "one_cycle")]
        cycles: u64,
    },
}

/// Warmup updates when none are given (a choice of schedule alone, e.g. from the window).
fn default_warmup() -> u64 {
    100
}

fn one_cycle() -> u64 {
    1
}

impl Default for LrSchedule {
    fn default() -> Self {
        LrSchedule::WarmupCosine { warmup_steps: default_warmup() }
    }
}

/// The schedules by name, as run.toml's `kind` writes them (dashes also taken).
pub const SCHEDULES: [&str; 4] = ["warmup_cosine", "constant", "linear", "cosine_restarts"];

impl LrSchedule {
    /// The schedule called `name` with its defaults (100 warmup steps, one cycle, no floor).
    pub fn named(name: &str) -> Result<Self, String> {
        match name.replace('-', "_").as_str() {
            "warmup_cosine" => Ok(Self::default()),
            "constant" => Ok(Self::Constant),
            "linear" => Ok(Self::Linear { floor: 0.0 }),
            "cosine_restarts" => Ok(Self::CosineRestarts { warmup_steps: default_warmup(), cycles: one_cycle() }),
            _ => Err(format!("unknown schedule `{name}` (expected {})", SCHEDULES.join(", "))),
        }
    }

    /// Sets the warmup of a schedule that has one; an error naming the schedule else.
    pub fn set_warmup(&mut self, steps: u64) -> Result<(), String> {
        match self {
            Self::WarmupCosine { warmup_steps } | Self::CosineRestarts { warmup_steps, .. } => {
                *warmup_steps = steps;
                Ok(())
            }
            other => Err(format!("the {} schedule has no warmup", other.kind())),
        }
    }

    /// Sets the number of cosine cycles of `cosine_restarts`; an error for the others.
    pub fn set_cycles(&mut self, n: u64) -> Result<(), String> {
        match self {
            Self::CosineRestarts { cycles, .. } => {
                *cycles = n;
                Ok(())
            }
            other => Err(format!("the {} schedule has no cycles (cosine_restarts has)", other.kind())),
        }
    }

    /// Its name, as run.toml's `kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::WarmupCosine { .. } => "warmup_cosine",
            Self::Constant => "constant",
            Self::Linear { .. } => "linear",
            Self::CosineRestarts { .. } => "cosine_restarts",
        }
    }

    /// What makes no sense in it: (field under `lr_schedule`, why).
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        match *self {
            Self::Linear { floor } if !(0.0..=1.0).contains(&floor) => {
                Err(("floor", format!("{floor} must be between 0 and 1 (a fraction of lr)")))
            }
            Self::CosineRestarts { cycles: 0, .. } => Err(("cycles", "must be at least 1".into())),
            _ => Ok(()),
        }
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
            LrSchedule::CosineRestarts { warmup_steps, cycles } => {
                if step < warmup_steps {
                    return lr * step as f64 / warmup_steps.max(1) as f64;
                }
                let progress = (step - warmup_steps) as f64 / total.saturating_sub(warmup_steps).max(1) as f64;
                if progress >= 1.0 {
                    return 0.0;
                }
                let phase = (cycles as f64 * progress).fract();
                lr * (0.5 * (1.0 + (std::f64::consts::PI * phase).cos())).max(0.0)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::timesteps::TimestepSampling;

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

    /// Values of transformers' `get_cosine_with_hard_restarts_schedule_with_warmup`
    /// (its lambda, times lr) for warmup 10, 110 steps, 2 cycles.
    #[test]
    fn cosine_restarts_is_transformers_hard_restarts() {
        let s = LrScheduler::new(LrSchedule::CosineRestarts { warmup_steps: 10, cycles: 2 }, 1.0, 110);
        let cases = [
            (0, 0.0),
            (5, 0.5),
            (10, 1.0),
            (35, 0.5),               // a quarter through: half way down the first cycle
            (59, 0.000_986_635_785), // 0.5 * (1 + cos(pi * 0.98))
            (60, 1.0),               // restart
            (85, 0.5),
            (110, 0.0),
            (500, 0.0),
        ];
        for (step, want) in cases {
            assert!((s.lr_at(step) - want).abs() < 1e-9, "step {step}: {} against {want}", s.lr_at(step));
        }
    }

    #[test]
    fn schedules_by_name_with_their_options() {
        let mut s = LrSchedule::named("cosine-restarts").unwrap();
        s.set_warmup(20).unwrap();
        s.set_cycles(3).unwrap();
        assert_eq!(s, LrSchedule::CosineRestarts { warmup_steps: 20, cycles: 3 });
        assert_eq!(
            LrSchedule::named("constant").unwrap().set_warmup(5).unwrap_err(),
            "the constant schedule has no warmup"
        );
        assert!(LrSchedule::named("linear").unwrap().set_cycles(2).is_err());
        assert!(LrSchedule::named("step").unwrap_err().contains("warmup_cosine, constant, linear, cosine_restarts"));
        assert_eq!(LrSchedule::CosineRestarts { warmup_steps: 0, cycles: 0 }.check().unwrap_err().0, "cycles");
        assert_eq!(LrSchedule::Linear { floor: 2.0 }.check().unwrap_err().0, "floor");
        for name in SCHEDULES {
            assert_eq!(LrSchedule::named(name).unwrap().kind(), name);
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
        // A choice by kind alone (the window's) is that schedule as `named` gives it.
        for name in SCHEDULES {
            let s: LrSchedule = serde_json::from_value(serde_json::json!({ "kind": name })).unwrap();
            assert_eq!(s, LrSchedule::named(name).unwrap(), "{name}");
        }
    }
}

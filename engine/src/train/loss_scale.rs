//! Dynamic loss scaling for f16 compute, and the count of consecutive skipped steps.
//!
//! f16 gradients underflow to zero when small; scaling the loss up before backward
//! keeps them representable. Too large a scale overflows instead, which shows up as
//! non-finite gradients: that step is skipped and the scale halved.

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use crate::Result;

/// Loss scaling settings (PyTorch GradScaler's defaults, growth factor 2).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LossScaleConfig {
    /// The scale of the first step.
    pub init_scale: f64,
    /// Clean steps in a row after which the scale doubles.
    pub growth_interval: u32,
}

impl Default for LossScaleConfig {
    fn default() -> Self {
        Self { init_scale: 65536.0, growth_interval: 2000 }
    }
}

/// The loss scale and its progress; serialize it into the training state as is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    /// Current scale (1 and fixed when disabled).
    scale: f64,
    /// Clean steps since the last change of scale.
    clean_steps: u32,
    /// Doubling interval; `None` when scaling is off (f32/bf16 compute).
    growth_interval: Option<u32>,
}

impl LossScaler {
    /// Dynamic scaling, for f16 compute.
    pub fn dynamic(config: LossScaleConfig) -> Self {
        Self { scale: config.init_scale.max(1.0), clean_steps: 0, growth_interval: Some(config.growth_interval.max(1)) }
    }

    /// A constant scale of 1, for compute dtypes with f32's exponent range.
    pub fn disabled() -> Self {
        Self { scale: 1.0, clean_steps: 0, growth_interval: None }
    }

    /// The factor to multiply the loss by before backward.
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Divides the gradients of a scaled loss by the scale.
    pub fn unscale(&self, grads: &mut [Tensor]) -> Result<()> {
        if self.scale != 1.0 {
            for g in grads.iter_mut() {
                *g = g.affine(1.0 / self.scale, 0.0)?;
            }
        }
        Ok(())
    }

    /// Records the outcome of a step: halve on overflow (never below 1), double after
    /// `growth_interval` clean steps in a row.
    pub fn update(&mut self, grads_finite: bool) {
        let Some(interval) = self.growth_interval else {
            return;
        };
        if grads_finite {
            self.clean_steps += 1;
            if self.clean_steps >= interval {
                self.scale *= 2.0;
                self.clean_steps = 0;
            }
        } else {
            self.scale = (self.scale / 2.0).max(1.0);
            self.clean_steps = 0;
        }
    }
}

/// What the caller must do after a skipped step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipVerdict {
    /// Carry on with the next batch.
    Continue,
    /// The limit of consecutive skips is reached: fail the run, keeping the last good state.
    Fail,
}

/// Counts skipped steps (non-finite loss or gradients); serialize it with the state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkipCounter {
    /// Skips since the last applied step.
    consecutive: u32,
    /// Skips over the whole run.
    total: u64,
    /// Consecutive skips that fail the run.
    limit: u32,
}

impl SkipCounter {
    /// Skips in a row that fail a run unless configured otherwise.
    pub const DEFAULT_LIMIT: u32 = 20;

    pub fn new(limit: u32) -> Self {
        Self { consecutive: 0, total: 0, limit: limit.max(1) }
    }

    /// Records a skipped step.
    pub fn skipped(&mut self) -> SkipVerdict {
        self.consecutive += 1;
        self.total += 1;
        if self.consecutive >= self.limit {
            SkipVerdict::Fail
        } else {
            SkipVerdict::Continue
        }
    }

    /// Records an applied step.
    pub fn applied(&mut self) {
        self.consecutive = 0;
    }

    pub fn consecutive(&self) -> u32 {
        self.consecutive
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }
}

impl Default for SkipCounter {
    fn default() -> Self {
        Self::new(Self::DEFAULT_LIMIT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn halves_on_overflow_and_doubles_after_clean_run() {
        let mut s = LossScaler::dynamic(LossScaleConfig { init_scale: 8.0, growth_interval: 3 });
        s.update(false);
        assert_eq!(s.scale(), 4.0);
        s.update(true);
        s.update(true);
        assert_eq!(s.scale(), 4.0);
        s.update(false); // an overflow resets the clean run
        s.update(true);
        s.update(true);
        assert_eq!(s.scale(), 2.0);
        s.update(true);
        assert_eq!(s.scale(), 4.0);
    }

    #[test]
    fn defaults_and_floor() {
        let mut s = LossScaler::dynamic(LossScaleConfig::default());
        assert_eq!(s.scale(), 65536.0);
        for _ in 0..1999 {
            s.update(true);
        }
        assert_eq!(s.scale(), 65536.0);
        s.update(true);
        assert_eq!(s.scale(), 131072.0);
        for _ in 0..40 {
            s.update(false);
        }
        assert_eq!(s.scale(), 1.0, "never below 1");
    }

    #[test]
    fn disabled_stays_at_one() {
        let mut s = LossScaler::disabled();
        s.update(false);
        s.update(true);
        assert_eq!(s.scale(), 1.0);
    }

    #[test]
    fn unscale_divides() {
        let s = LossScaler::dynamic(LossScaleConfig { init_scale: 4.0, growth_interval: 10 });
        let mut grads = vec![Tensor::new(&[8.0f32, -2.0], &Device::Cpu).unwrap()];
        s.unscale(&mut grads).unwrap();
        assert_eq!(grads[0].to_vec1::<f32>().unwrap(), [2.0, -0.5]);
    }

    #[test]
    fn state_round_trips_through_json() {
        let mut s = LossScaler::dynamic(LossScaleConfig::default());
        s.update(false);
        s.update(true);
        let mut c = SkipCounter::new(5);
        c.skipped();
        let back: LossScaler = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        let back_c: SkipCounter = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, s);
        assert_eq!(back_c, c);
    }

    #[test]
    fn fails_after_limit_consecutive_skips() {
        let mut c = SkipCounter::default();
        for _ in 0..19 {
            assert_eq!(c.skipped(), SkipVerdict::Continue);
        }
        c.applied();
        assert_eq!(c.consecutive(), 0);
        for _ in 0..19 {
            assert_eq!(c.skipped(), SkipVerdict::Continue);
        }
        assert_eq!(c.skipped(), SkipVerdict::Fail);
        assert_eq!(c.total(), 39);
    }
}

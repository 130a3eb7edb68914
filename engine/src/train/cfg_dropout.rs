//! Classifier-free-guidance dropout as ACE-Step's corrected trainer does it: each
//! sample, with probability `ratio`, sees the model's null condition embedding in
//! place of its condition-encoder output (`encoder_hidden_states`), broadcast over
//! the sequence. The encoder attention mask is left as it is (the DiT ignores it).
//! Without this a LoRA on base/SFT forgets the unconditional branch guidance needs.

use candle_core::Tensor;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{Error, Result};

/// The dropout ratio and the embedding dropped samples see.
#[derive(Debug, Clone)]
pub struct CfgDropout {
    ratio: f64,
    /// `[1, 1, E]`
    null_condition: Tensor,
}

impl CfgDropout {
    pub fn new(ratio: f64, null_condition: Tensor) -> Self {
        Self { ratio, null_condition }
    }

    /// The dropout a run trains with: none at ratio 0 (not one draw, so such runs
    /// are unchanged), else an error naming the setting when the model has no null
    /// condition (`null_condition` says why).
    pub fn for_ratio(ratio: f64, null_condition: &std::result::Result<Tensor, String>) -> Result<Option<Self>> {
        if ratio == 0.0 {
            return Ok(None);
        }
        match null_condition {
            Ok(null) => Ok(Some(Self::new(ratio, null.clone()))),
            Err(why) => Err(Error::setting(
                "cfg_dropout",
                format!("{ratio} needs the model's null condition embedding, but {why}; set it to 0"),
            )),
        }
    }

    /// Which of `batch` samples lose their condition, drawn from a stream of their
    /// own (`seed`), so the noise and timestep streams stay as they are.
    pub fn draw(&self, batch: usize, seed: u64) -> Vec<bool> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..batch).map(|_| rng.random::<f64>() < self.ratio).collect()
    }

    /// `states` `[B, L, E]` with the rows of dropped samples replaced by the null
    /// embedding; the input itself when none is dropped.
    pub fn apply(&self, states: &Tensor, dropped: &[bool]) -> Result<Tensor> {
        if !dropped.contains(&true) {
            return Ok(states.clone());
        }
        let null =
            self.null_condition.to_dtype(states.dtype())?.to_device(states.device())?.broadcast_as(states.shape())?;
        let keep: Vec<u8> = dropped.iter().map(|&d| u8::from(!d)).collect();
        let keep = Tensor::from_vec(keep, (dropped.len(), 1, 1), states.device())?.broadcast_as(states.shape())?;
        Ok(keep.where_cond(states, &null)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn dropout(ratio: f64) -> CfgDropout {
        let null = Tensor::from_slice(&[7f32, -7., 0.5], (1, 1, 3), &Device::Cpu).unwrap();
        CfgDropout::new(ratio, null)
    }

    #[test]
    fn dropped_samples_see_the_null_embedding_on_every_row_and_kept_ones_are_untouched() -> Result<()> {
        let states = Tensor::randn(0f32, 1., (3, 4, 3), &Device::Cpu)?;
        let out = dropout(0.5).apply(&states, &[false, true, false])?;
        let null = dropout(0.5).null_condition.broadcast_as((1, 4, 3))?;
        for (i, expect) in [states.narrow(0, 0, 1)?, null, states.narrow(0, 2, 1)?].iter().enumerate() {
            let diff = (out.narrow(0, i, 1)? - expect)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert_eq!(diff, 0.0, "sample {i}");
        }
        Ok(())
    }

    #[test]
    fn ratio_zero_needs_no_null_condition_and_a_missing_one_is_named() {
        let missing = Err("model.safetensors has no `null_condition_emb`".to_string());
        assert!(CfgDropout::for_ratio(0.0, &missing).unwrap().is_none());
        let message = CfgDropout::for_ratio(0.15, &missing).unwrap_err().to_string();
        assert!(message.contains("cfg_dropout") && message.contains("model.safetensors"), "{message}");
    }

    #[test]
    fn ratio_one_drops_all_and_ratio_zero_none() {
        assert!(dropout(1.0).draw(50, 3).iter().all(|&d| d));
        assert!(!dropout(0.0).draw(50, 3).contains(&true));
    }

    #[test]
    fn the_drop_rate_is_within_four_sigma_of_the_ratio_and_the_draw_is_seeded() {
        let (ratio, n) = (0.15, 2000);
        // Twenty batches of 100, each from its own seed, as the steps draw them.
        let dropped: usize = (0..20).map(|s| dropout(ratio).draw(n / 20, s).iter().filter(|&&d| d).count()).sum();
        let sigma = (n as f64 * ratio * (1.0 - ratio)).sqrt();
        let off = (dropped as f64 - n as f64 * ratio).abs();
        assert!(off < 4.0 * sigma, "{dropped} of {n} dropped, {off:.1} from the mean (sigma {sigma:.1})");
        assert_eq!(dropout(ratio).draw(100, 9), dropout(ratio).draw(100, 9));
    }
}

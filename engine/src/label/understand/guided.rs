//! Classifier-free guidance of the LM, as upstream's `_generate_with_cfg_custom` runs
//! it: the prompt and an unconditional prompt decoded side by side, each step's scores
//! `uncond + scale * (cond - uncond)`, the token chosen from them fed to both.
//!
//! Upstream batches the two prompts left-padded; RoPE scores depend only on the
//! distance between positions, so two caches of their own lengths give the same
//! scores.

use super::decode::{NextLogits, Rows};
use crate::{Error, Result};

/// Two sequences of one model: the conditional one the loop prompts, the unconditional
/// one prompted with `uncond_prompt`.
pub struct Guided<M> {
    pub cond: M,
    pub uncond: M,
    pub uncond_prompt: Vec<u32>,
    pub scale: f32,
}

impl<M: NextLogits> Guided<M> {
    /// Checks the scale: above 1 (upstream guides only then).
    pub fn new(cond: M, uncond: M, uncond_prompt: Vec<u32>, scale: f32) -> Result<Self> {
        if !(scale.is_finite() && scale > 1.0) {
            return Err(Error::setting("lm_cfg_scale", format!("{scale}: guidance needs a scale above 1")));
        }
        Ok(Self { cond, uncond, uncond_prompt, scale })
    }

    /// The guided scores, in f32 as upstream upcasts; a row neither side computed
    /// stays -inf.
    fn mix(&self, cond: Vec<f32>, uncond: &[f32]) -> Vec<f32> {
        let scale = self.scale;
        let mut out = cond;
        for (c, &u) in out.iter_mut().zip(uncond) {
            *c = match (*c == f32::NEG_INFINITY, u == f32::NEG_INFINITY) {
                (false, false) => u + scale * (*c - u),
                _ => f32::NEG_INFINITY,
            };
        }
        out
    }
}

impl<M: NextLogits> NextLogits for Guided<M> {
    fn prefill(&mut self, prompt: &[u32], rows: &Rows) -> Result<Vec<f32>> {
        let cond = self.cond.prefill(prompt, rows)?;
        let uncond = self.uncond.prefill(&self.uncond_prompt, rows)?;
        Ok(self.mix(cond, &uncond))
    }

    fn step(&mut self, token: u32, rows: &Rows) -> Result<Vec<f32>> {
        let cond = self.cond.step(token, rows)?;
        let uncond = self.uncond.step(token, rows)?;
        Ok(self.mix(cond, &uncond))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scores that are the last token fed, times a per-model factor, at every row.
    struct Echo {
        factor: f32,
        prompts: Vec<Vec<u32>>,
        fed: Vec<u32>,
    }

    impl Echo {
        fn new(factor: f32) -> Self {
            Self { factor, prompts: vec![], fed: vec![] }
        }
    }

    impl NextLogits for Echo {
        fn prefill(&mut self, prompt: &[u32], _: &Rows) -> Result<Vec<f32>> {
            self.prompts.push(prompt.to_vec());
            Ok(vec![self.factor, f32::NEG_INFINITY])
        }
        fn step(&mut self, token: u32, _: &Rows) -> Result<Vec<f32>> {
            self.fed.push(token);
            Ok(vec![self.factor * token as f32, f32::NEG_INFINITY])
        }
    }

    #[test]
    fn guided_scores_push_away_from_the_unconditional_and_both_hear_each_token() {
        let mut g = Guided::new(Echo::new(3.0), Echo::new(1.0), vec![9, 9], 2.0).unwrap();
        // 1 + 2 * (3 - 1) = 5; an uncomputed row stays -inf.
        assert_eq!(g.prefill(&[1, 2, 3], &Rows::All).unwrap(), [5.0, f32::NEG_INFINITY]);
        assert_eq!(g.step(2, &Rows::All).unwrap()[0], 10.0);
        assert_eq!((g.cond.prompts.clone(), g.uncond.prompts.clone()), (vec![vec![1, 2, 3]], vec![vec![9, 9]]));
        assert_eq!((g.cond.fed.clone(), g.uncond.fed.clone()), (vec![2], vec![2]));
    }

    #[test]
    fn a_scale_of_one_or_less_is_refused() {
        for scale in [1.0, 0.5, f32::NAN] {
            let err = Guided::new(Echo::new(1.0), Echo::new(1.0), vec![], scale).err().expect("refused");
            assert!(matches!(&err, Error::Setting { field, .. } if field == "lm_cfg_scale"), "{err}");
        }
    }
}

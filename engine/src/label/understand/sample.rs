//! Sampling the next token as upstream does: repetition penalty, top-k, top-p, then a
//! draw from softmax(logits / temperature), or the argmax at temperature 0.
//!
//! Each step works on one row of scores in place. The filters keep upstream's edges:
//! top-k keeps every token tied with the k-th best; top-p keeps the best tokens up to
//! and including the one whose cumulative probability first passes p (and always the
//! best one). Randomness is a seeded ChaCha8 stream, so a seed repeats a caption.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{Error, Result};

/// How the next token is picked. The defaults are the ones upstream's dataset labeller
/// asks for (temperature 0.7, no top-k, no top-p, no repetition penalty).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0 picks the most likely token; above 0 flattens (> 1) or sharpens (< 1) the draw.
    pub temperature: f32,
    /// Keep only the k best tokens (and those tied with the k-th); None keeps all.
    pub top_k: Option<usize>,
    /// Keep the smallest set of best tokens whose probability passes p; None (or 1) keeps all.
    pub top_p: Option<f32>,
    /// transformers' repetition penalty over every token in the context; 1 is none.
    pub repetition_penalty: f32,
}

impl Default for Sampling {
    fn default() -> Self {
        Self { temperature: 0.7, top_k: None, top_p: None, repetition_penalty: 1.0 }
    }
}

impl Sampling {
    /// Every setting within its range, or an error naming the first one that is not.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::setting("temperature", format!("{} is not a number >= 0", self.temperature)));
        }
        if self.top_k == Some(0) {
            return Err(Error::setting("top_k", "0 keeps no token: give at least 1, or leave it unset"));
        }
        if let Some(p) = self.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return Err(Error::setting("top_p", format!("{p} is outside (0, 1]")));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(Error::setting(
                "repetition_penalty",
                format!("{} is not a number > 0", self.repetition_penalty),
            ));
        }
        Ok(())
    }
}

/// Picks tokens with a `Sampling` and its own random stream.
pub struct Sampler {
    sampling: Sampling,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// Checks `sampling`; `seed` starts the random stream.
    pub fn new(sampling: Sampling, seed: u64) -> Result<Self> {
        sampling.validate()?;
        Ok(Self { sampling, rng: ChaCha8Rng::seed_from_u64(seed) })
    }

    /// The next token from `scores` (changed in place by the filters), with `context`
    /// (the prompt and the tokens generated so far) for the repetition penalty.
    pub fn next_token(&mut self, scores: &mut [f32], context: &[u32]) -> Result<u32> {
        if scores.iter().any(|s| s.is_nan()) {
            return Err(Error::NonFinite { what: "the LM's next-token scores".into(), problem: "NaN".into() });
        }
        let Sampling { temperature, top_k, top_p, repetition_penalty } = self.sampling;
        if repetition_penalty != 1.0 {
            apply_repetition_penalty(scores, context, repetition_penalty);
        }
        apply_top_k(scores, top_k);
        apply_top_p(scores, top_p);
        let token = if temperature > 0.0 { self.draw(scores, temperature) } else { argmax(scores) };
        token.ok_or_else(|| Error::NonFinite {
            what: "the LM's next-token scores".into(),
            problem: "every token was ruled out (all scores -inf)".into(),
        })
    }

    /// A categorical draw from softmax(scores / temperature); None when no token is left.
    fn draw(&mut self, scores: &[f32], temperature: f32) -> Option<u32> {
        let weights = softmax_weights(scores, temperature)?;
        let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
        let mut target = self.rng.random::<f64>() * total;
        let mut last_possible = None;
        for (i, &w) in weights.iter().enumerate() {
            if w > 0.0 {
                last_possible = Some(i as u32);
                target -= f64::from(w);
                if target < 0.0 {
                    return last_possible;
                }
            }
        }
        // Rounding left a sliver past the last weight: it belongs to the last token.
        last_possible
    }
}

/// transformers' RepetitionPenaltyLogitsProcessor: each distinct token of `context` has
/// its score divided by `penalty` when positive, multiplied when negative.
pub fn apply_repetition_penalty(scores: &mut [f32], context: &[u32], penalty: f32) {
    let mut seen = vec![false; scores.len()];
    for &token in context {
        // Context ids come from the same vocabulary as the scores' row.
        let Some(done) = seen.get_mut(token as usize) else { continue };
        if !*done {
            *done = true;
            let s = &mut scores[token as usize];
            *s = if *s < 0.0 { *s * penalty } else { *s / penalty };
        }
    }
}

/// Rules out (sets to -inf) every token scored below the k-th best.
pub fn apply_top_k(scores: &mut [f32], top_k: Option<usize>) {
    let Some(k) = top_k.filter(|&k| k > 0 && k < scores.len()) else { return };
    let mut sorted = scores.to_vec();
    let (_, kth, _) = sorted.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    let threshold = *kth;
    for s in scores.iter_mut().filter(|s| **s < threshold) {
        *s = f32::NEG_INFINITY;
    }
}

/// Rules out the tokens past the nucleus: walking from the best (ties in index order),
/// those after the first whose cumulative probability exceeds `top_p`.
pub fn apply_top_p(scores: &mut [f32], top_p: Option<f32>) {
    let Some(p) = top_p.filter(|&p| p > 0.0 && p < 1.0) else { return };
    let Some(probs) = softmax_weights(scores, 1.0) else { return };
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    let mut cumulative = 0.0f32;
    let mut passed = false;
    for &i in &order {
        if passed {
            scores[i] = f32::NEG_INFINITY;
        }
        cumulative += probs[i];
        passed = cumulative > p;
    }
}

/// The first index of the highest score (torch.argmax); None when every score is -inf.
pub fn argmax(scores: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &s) in scores.iter().enumerate() {
        if s > f32::NEG_INFINITY && best.is_none_or(|(_, b)| s > b) {
            best = Some((i, s));
        }
    }
    best.map(|(i, _)| i as u32)
}

/// softmax(scores / temperature) in f32, as upstream upcasts before it; None when every
/// score is -inf.
fn softmax_weights(scores: &[f32], temperature: f32) -> Option<Vec<f32>> {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return None;
    }
    let max = max / temperature;
    let mut weights: Vec<f32> = scores.iter().map(|&s| (s / temperature - max).exp()).collect();
    let total: f32 = weights.iter().sum();
    weights.iter_mut().for_each(|w| *w /= total);
    Some(weights)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEG: f32 = f32::NEG_INFINITY;

    fn ln(probs: &[f32]) -> Vec<f32> {
        probs.iter().map(|p| p.ln()).collect()
    }

    #[test]
    fn top_k_keeps_ties_with_the_kth() {
        let mut scores = vec![1.0, 3.0, 3.0, 2.0];
        apply_top_k(&mut scores, Some(2));
        assert_eq!(scores, [NEG, 3.0, 3.0, NEG]);
        let mut scores = vec![1.0, 3.0, 3.0, 2.0];
        apply_top_k(&mut scores, Some(1));
        assert_eq!(scores, [NEG, 3.0, 3.0, NEG], "the best is tied: both stay");
        let mut scores = vec![1.0, 3.0, 3.0, 2.0];
        apply_top_k(&mut scores, Some(3));
        assert_eq!(scores, [NEG, 3.0, 3.0, 2.0]);
        let mut scores = vec![1.0, 2.0];
        apply_top_k(&mut scores, Some(5));
        assert_eq!(scores, [1.0, 2.0], "k beyond the row keeps all");
    }

    #[test]
    fn top_p_keeps_the_first_token_over_the_threshold() {
        // Probabilities 0.2, 0.5, 0.3: by rank 0.5 (cum 0.5), 0.3 (cum 0.8), 0.2 (cum 1.0).
        let mut scores = ln(&[0.2, 0.5, 0.3]);
        apply_top_p(&mut scores, Some(0.6));
        assert_eq!(scores[0], NEG);
        assert!(scores[1].is_finite() && scores[2].is_finite(), "0.3 passes 0.6 and is kept: {scores:?}");
        let mut scores = ln(&[0.2, 0.5, 0.3]);
        apply_top_p(&mut scores, Some(0.45));
        assert_eq!((scores[0], scores[2]), (NEG, NEG), "the best alone passes 0.45");
        let mut scores = ln(&[0.2, 0.5, 0.3]);
        apply_top_p(&mut scores, Some(0.9));
        assert!(scores.iter().all(|s| s.is_finite()), "0.9 needs all three: {scores:?}");
        let mut scores = ln(&[0.2, 0.5, 0.3]);
        apply_top_p(&mut scores, Some(1.0));
        assert!(scores.iter().all(|s| s.is_finite()), "1 is no filtering, as upstream");
    }

    #[test]
    fn repetition_penalty_once_per_distinct_token() {
        let mut scores = vec![2.0, -2.0, 1.0, 0.0];
        apply_repetition_penalty(&mut scores, &[0, 1, 1, 1, 3, 9], 2.0);
        assert_eq!(scores, [1.0, -4.0, 1.0, 0.0]);
    }

    #[test]
    fn argmax_takes_the_first_of_ties() {
        assert_eq!(argmax(&[0.5, 2.0, 2.0, NEG]), Some(1));
        assert_eq!(argmax(&[NEG, NEG]), None);
    }

    #[test]
    fn draws_follow_the_tempered_softmax() {
        // At temperature 0.5, probabilities 0.5/0.3/0.2 become p^2 normalised.
        let draws = 40_000;
        let mut sampler = Sampler::new(Sampling { temperature: 0.5, ..Sampling::default() }, 7).unwrap();
        let mut counts = [0usize; 3];
        for _ in 0..draws {
            counts[sampler.next_token(&mut ln(&[0.5, 0.3, 0.2]), &[]).unwrap() as usize] += 1;
        }
        let expected = [0.25 / 0.38, 0.09 / 0.38, 0.04 / 0.38];
        let worst = counts.iter().zip(expected).map(|(&c, e)| (c as f64 / draws as f64 - e).abs()).fold(0.0, f64::max);
        println!("frequencies {counts:?} of {draws}, expected {expected:?}: max |diff| {worst:.4} (tolerance 0.01)");
        assert!(worst < 0.01);
    }

    #[test]
    fn a_seed_repeats_its_draws() {
        let run = |seed| {
            let mut sampler = Sampler::new(Sampling::default(), seed).unwrap();
            (0..50).map(|_| sampler.next_token(&mut [0.0; 8], &[]).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
    }

    #[test]
    fn temperature_zero_is_argmax_and_no_token_left_is_an_error() {
        let mut sampler = Sampler::new(Sampling { temperature: 0.0, ..Sampling::default() }, 0).unwrap();
        assert_eq!(sampler.next_token(&mut [0.1, 0.9, 0.9], &[]).unwrap(), 1);
        assert!(matches!(sampler.next_token(&mut [NEG, NEG], &[]), Err(Error::NonFinite { .. })));
        assert!(matches!(sampler.next_token(&mut [0.0, f32::NAN], &[]), Err(Error::NonFinite { .. })));
        let mut sampler = Sampler::new(Sampling::default(), 0).unwrap();
        assert_eq!(sampler.next_token(&mut [NEG, 0.0, NEG], &[]).unwrap(), 1);
        assert!(sampler.next_token(&mut [NEG, NEG], &[]).is_err());
    }

    #[test]
    fn settings_out_of_range_are_named() {
        let bad = [
            (Sampling { temperature: -0.1, ..Sampling::default() }, "temperature"),
            (Sampling { temperature: f32::NAN, ..Sampling::default() }, "temperature"),
            (Sampling { top_k: Some(0), ..Sampling::default() }, "top_k"),
            (Sampling { top_p: Some(0.0), ..Sampling::default() }, "top_p"),
            (Sampling { top_p: Some(1.5), ..Sampling::default() }, "top_p"),
            (Sampling { repetition_penalty: 0.0, ..Sampling::default() }, "repetition_penalty"),
        ];
        for (sampling, field) in bad {
            let err = Sampler::new(sampling, 0).err().expect("refused");
            assert!(matches!(&err, Error::Setting { field: f, .. } if f == field), "{field}: {err}");
        }
        let ok = Sampling { temperature: 0.0, top_k: Some(1), top_p: Some(1.0), repetition_penalty: 1.3 };
        assert!(ok.validate().is_ok());
    }
}

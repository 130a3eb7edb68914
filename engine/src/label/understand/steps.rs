//! The language model as the decoding loop sees it: one sequence's KV cache, the LM
//! head computed only for the rows the step's constraint will read; and the metadata
//! constraint as the loop's processor.

use std::ops::Range;

use super::constrained::MetadataConstraint;
use super::decode::{id_runs, LogitsProcessor, NextLogits, Rows};
use crate::codec::causal_lm::{CausalLm, KvCache};
use crate::{Error, Result};

/// The LM for one sequence: its cache made at the prefill, room for the whole output.
pub struct LmSteps<'a> {
    lm: &'a CausalLm,
    cache: Option<KvCache>,
    budget: usize,
}

impl<'a> LmSteps<'a> {
    /// `lm` decoding at most `budget` tokens after each prompt.
    pub fn new(lm: &'a CausalLm, budget: usize) -> Self {
        Self { lm, cache: None, budget }
    }

    fn logits(&self, hidden: &candle_core::Tensor, rows: &Rows) -> Result<Vec<f32>> {
        let vocab = self.lm.config().vocab_size as u32;
        let keep = match rows {
            Rows::All => return self.lm.logits(hidden, None),
            Rows::AllBut(masked) => complement(masked, vocab),
            Rows::Only(ids) => runs(ids, vocab),
            Rows::Runs(kept) => return self.lm.logits(hidden, Some(kept)),
        };
        self.lm.logits(hidden, Some(&keep))
    }
}

impl NextLogits for LmSteps<'_> {
    fn prefill(&mut self, prompt: &[u32], rows: &Rows) -> Result<Vec<f32>> {
        let mut cache = self.lm.new_cache()?;
        cache.reserve(prompt.len() + self.budget)?;
        let hidden = self.lm.prefill(prompt, &mut cache)?;
        self.cache = Some(cache);
        self.logits(&hidden, rows)
    }

    fn step(&mut self, token: u32, rows: &Rows) -> Result<Vec<f32>> {
        let cache = self.cache.as_mut().ok_or_else(|| Error::BadRequest("an LM step before its prefill".into()))?;
        let hidden = self.lm.step(token, cache)?;
        self.logits(&hidden, rows)
    }
}

/// `0..vocab` less the ascending, disjoint `masked` ranges.
fn complement(masked: &[Range<u32>], vocab: u32) -> Vec<Range<u32>> {
    let mut kept = Vec::with_capacity(masked.len() + 1);
    let mut start = 0;
    for r in masked {
        let end = r.start.min(vocab);
        if start < end {
            kept.push(start..end);
        }
        start = start.max(r.end);
    }
    if start < vocab {
        kept.push(start..vocab);
    }
    kept
}

/// The ids below `vocab` as ascending runs of consecutive ids.
fn runs(ids: &[u32], vocab: u32) -> Vec<Range<u32>> {
    let mut ids: Vec<u32> = ids.iter().copied().filter(|&id| id < vocab).collect();
    ids.sort_unstable();
    ids.dedup();
    id_runs(&ids)
}

/// The metadata constraint as the decoding loop's processor (its own methods).
impl LogitsProcessor for MetadataConstraint<'_> {
    fn process(&mut self, scores: &mut [f32]) {
        MetadataConstraint::process(self, scores);
    }

    fn update(&mut self, token: u32) {
        MetadataConstraint::update(self, token);
    }

    fn rows(&self) -> Rows<'_> {
        MetadataConstraint::rows(self)
    }
}

#[cfg(test)]
mod tests {
    use super::{complement, runs};

    #[test]
    fn complement_keeps_what_is_not_masked() {
        let whole = 0..10;
        assert_eq!(complement(&[], 10), vec![whole.clone()]);
        assert_eq!(complement(&[2..4, 6..7], 10), [0..2, 4..6, 7..10]);
        assert_eq!(complement(&[0..3, 8..12], 10), vec![3..8]);
        assert_eq!(complement(&[whole], 10), Vec::<std::ops::Range<u32>>::new());
    }

    #[test]
    fn runs_of_ids_are_sorted_deduplicated_and_within_the_vocabulary() {
        assert_eq!(runs(&[7, 3, 4, 4, 9, 12], 10), [3..5, 7..8, 9..10]);
    }
}

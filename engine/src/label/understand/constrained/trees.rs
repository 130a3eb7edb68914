//! Token prefix trees of a field's valid values (bpm, duration, time signature, key,
//! language), built as upstream builds them: each value tokenized after "field: " (the
//! space can merge into the value's first token), the tokens of "field:" cut off the
//! front, and every token prefix mapped to the tokens that may follow it, a complete
//! value allowing the newline.

use std::collections::{BTreeSet, HashMap};

use tokenizers::Tokenizer;

use super::vocab::encode;
use crate::Result;

/// Which tokenizations become values: upstream drops some per field.
#[derive(Clone, Copy)]
pub(crate) enum Keep {
    /// Numbers: every value whose tokenization starts with the context's.
    All,
    /// Languages: those with at least one value token.
    NonEmpty,
    /// Keys: those whose first value token, stripped and uppercased, is a note letter
    /// or nothing at all (upstream's `first_char not in "ABCDEFG"` lets "" through).
    NoteFirst,
}

/// Token prefix -> the tokens allowed next (sorted).
#[derive(Debug)]
pub struct PrefixTree {
    next: HashMap<Vec<u32>, Vec<u32>>,
    /// The first tokens in the order upstream adds them to its set.
    first_tokens_added: Vec<u32>,
}

impl PrefixTree {
    /// The tokens allowed after `prefix`; None where the prefix is not in the tree.
    pub fn next_tokens(&self, prefix: &[u32]) -> Option<&[u32]> {
        self.next.get(prefix).map(Vec::as_slice)
    }

    /// How many prefixes the tree holds.
    pub fn len(&self) -> usize {
        self.next.len()
    }

    pub fn is_empty(&self) -> bool {
        self.next.is_empty()
    }

    /// The tokens a value may start with, in the order upstream's set lists them.
    pub(crate) fn first_tokens_in_set_order(&self) -> Vec<u32> {
        super::pystr::set_order(&self.first_tokens_added)
    }

    /// Whether `prefix` is a complete value (the newline may follow it).
    pub(crate) fn is_complete(&self, prefix: &[u32], newline: u32) -> bool {
        self.next_tokens(prefix).is_some_and(|t| t.contains(&newline))
    }

    /// The tree of `values` written after `field: `.
    pub(crate) fn build<'v>(
        tok: &Tokenizer,
        vocab_text: impl Fn(u32) -> &'v str,
        field: &str,
        values: impl IntoIterator<Item = String>,
        keep: Keep,
        newline: u32,
    ) -> Result<Self> {
        let context = encode(tok, &format!("{field}:"))?;
        let mut next: HashMap<Vec<u32>, BTreeSet<u32>> = HashMap::new();
        let mut first_tokens_added = Vec::new();
        for value in values {
            let full = encode(tok, &format!("{field}: {value}"))?;
            let Some(value_ids) = full.strip_prefix(context.as_slice()) else { continue };
            if !keeps(keep, value_ids, &vocab_text) {
                continue;
            }
            first_tokens_added.push(value_ids.first().copied().unwrap_or(newline));
            for end in 0..=value_ids.len() {
                let follower = value_ids.get(end).copied().unwrap_or(newline);
                next.entry(value_ids[..end].to_vec()).or_default().insert(follower);
            }
        }
        let next = next.into_iter().map(|(k, v)| (k, v.into_iter().collect())).collect();
        Ok(Self { next, first_tokens_added })
    }
}

fn keeps<'v>(keep: Keep, value_ids: &[u32], vocab_text: &impl Fn(u32) -> &'v str) -> bool {
    match (keep, value_ids.first()) {
        (Keep::All, _) => true,
        (_, None) => false,
        (Keep::NonEmpty, Some(_)) => true,
        (Keep::NoteFirst, Some(&first)) => {
            let text = super::pystr::lstrip(vocab_text(first));
            text.chars().next().is_none_or(|c| {
                let upper: String = c.to_uppercase().collect();
                "ABCDEFG".contains(upper.as_str())
            })
        }
    }
}

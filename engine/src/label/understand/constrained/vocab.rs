//! The LM tokenizer as upstream's processor uses it: `encode(text,
//! add_special_tokens=False)` and `decode([id])` of every token, the latter done once
//! for the whole vocabulary.

use rayon::prelude::*;
use tokenizers::Tokenizer;

use crate::{Error, Result};

/// What the errors name: the tokenizer is the 5 Hz LM's.
const WHAT: &str = "5 Hz LM tokenizer";

/// `tokenizer.encode(text, add_special_tokens=False)`.
pub(crate) fn encode(tok: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    tok.encode(text, false)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| Error::BadConfig { what: WHAT, reason: format!("cannot encode {text:?}: {e}") })
}

/// The last token of `encode(text)`, as upstream picks its newline, backtick ... tokens.
pub(crate) fn last_token(tok: &Tokenizer, text: &str) -> Result<Option<u32>> {
    Ok(encode(tok, text)?.last().copied())
}

/// Every token's text, `decode([id])` with special tokens kept.
pub(crate) struct Vocab {
    texts: Vec<String>,
}

impl Vocab {
    /// Decodes all `len(tokenizer)` tokens (in parallel: real vocabularies hold ~217k).
    /// A token that does not decode reads as empty, as upstream skips it.
    pub(crate) fn new(tok: &Tokenizer) -> Self {
        let size = tok.get_vocab_size(true) as u32;
        let texts = (0..size).into_par_iter().map(|id| tok.decode(&[id], false).unwrap_or_default()).collect();
        Self { texts }
    }

    pub(crate) fn len(&self) -> usize {
        self.texts.len()
    }

    /// `decode([id])`; empty for an id past the tokenizer (a model may pad its logits).
    pub(crate) fn text(&self, id: u32) -> &str {
        self.texts.get(id as usize).map_or("", String::as_str)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &str)> {
        self.texts.iter().enumerate().map(|(id, t)| (id as u32, t.as_str()))
    }
}

//! What one decoding writes, as upstream sets its processor up for it: understand mode
//! (every field, then the lyrics), text2music's metadata phase ("cot" with
//! `stop_at_reasoning`, genres skipped, the values the user gave written as given) or
//! its codes phase (the prompt already holds the think block: audio codes only, the
//! output ended once the duration's codes are written).

use std::ops::Range;

use tokenizers::Tokenizer;

use super::tables::{MetadataTables, TreeField};
use super::vocab::encode;
use crate::label::understand::decode::id_runs;
use crate::Result;

/// Which decoding the constraint runs.
#[derive(Debug, Clone)]
pub enum Phase {
    /// `understand_audio_from_codes`: every field, then free text without audio codes.
    Understand,
    /// text2music's first phase: no genres line, the given values forced, and the end
    /// token where "</think>" would begin (upstream's `stop_at_reasoning`).
    Metadata { given: GivenValues, eos: u32 },
    /// text2music's second phase, after a prompt that closes the think block: audio
    /// codes and the end token only; the end token is ruled out until `target` codes are
    /// written and is then the only choice (no target: the LM ends when it will).
    Codes { target: Option<usize>, eos: u32, rows: Vec<Range<u32>> },
}

impl Phase {
    /// The codes phase over `tables`' audio-code tokens.
    pub fn codes(tables: &MetadataTables, target: Option<usize>, eos: u32) -> Self {
        let mut ids = tables.audio_codes.clone();
        if let Err(at) = ids.binary_search(&eos) {
            ids.insert(at, eos);
        }
        Phase::Codes { target, eos, rows: id_runs(&ids) }
    }

    /// Upstream's `skip_genres`: text2music asks for no genres line.
    pub(crate) fn skips_genres(&self) -> bool {
        matches!(self, Phase::Metadata { .. })
    }

    /// The tokens forced for `field`'s value, where the user gave it.
    pub(crate) fn given(&self, field: TreeField) -> Option<&[u32]> {
        match self {
            Phase::Metadata { given, .. } => given.tokens(field),
            _ => None,
        }
    }
}

/// The metadata values the user gave, each as the tokens upstream forces in its place:
/// `" {value}\n"` encoded (text2music passes bpm, duration, key and time signature).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GivenValues {
    bpm: Option<Vec<u32>>,
    duration: Option<Vec<u32>>,
    keyscale: Option<Vec<u32>>,
    timesignature: Option<Vec<u32>>,
}

/// The values as text, as upstream's `user_metadata` holds them (`int(bpm)`,
/// `int(duration)`, the key and time signature as the user wrote them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GivenText {
    pub bpm: Option<String>,
    pub duration: Option<String>,
    pub keyscale: Option<String>,
    pub timesignature: Option<String>,
}

impl GivenText {
    /// Upstream's `has_all_metas`: with all four given it writes no metadata at all.
    pub fn is_complete(&self) -> bool {
        self.bpm.is_some() && self.duration.is_some() && self.keyscale.is_some() && self.timesignature.is_some()
    }
}

impl GivenValues {
    pub fn new(tok: &Tokenizer, text: &GivenText) -> Result<Self> {
        let tokens = |value: &Option<String>| value.as_ref().map(|v| encode(tok, &format!(" {v}\n"))).transpose();
        Ok(Self {
            bpm: tokens(&text.bpm)?,
            duration: tokens(&text.duration)?,
            keyscale: tokens(&text.keyscale)?,
            timesignature: tokens(&text.timesignature)?,
        })
    }

    fn tokens(&self, field: TreeField) -> Option<&[u32]> {
        let value = match field {
            TreeField::Bpm => &self.bpm,
            TreeField::Duration => &self.duration,
            TreeField::Keyscale => &self.keyscale,
            TreeField::Timesignature => &self.timesignature,
            TreeField::Language => return None,
        };
        value.as_deref().filter(|t| !t.is_empty())
    }
}

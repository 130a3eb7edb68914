//! What upstream's processor precomputes over the LM's vocabulary, once per LM: the
//! tokens it names, the audio-code tokens, the tokens that continue each fixed string
//! from each position, the value trees and the genres trie.

use std::ops::Range;

use tokenizers::Tokenizer;

use super::genres::Genres;
use super::pystr;
use super::trees::{Keep, PrefixTree};
use super::vocab::{encode, last_token, Vocab};
use crate::data::labels::{BPM_RANGE, LANGUAGES, TIME_SIGNATURES};
use crate::label::understand::decode::id_runs;
use crate::label::understand::prompt::AUDIO_CODES;
use crate::{Error, Result};

/// Upstream's constants the labels do not hold: the shortest duration, the keys' parts.
const MIN_DURATION: u32 = 10;
const NOTES: [char; 7] = ['A', 'B', 'C', 'D', 'E', 'F', 'G'];
const ACCIDENTALS: [&str; 5] = ["", "#", "b", "♯", "♭"];
const MODES: [&str; 2] = ["major", "minor"];

/// The fixed strings the state machine writes token by token.
pub(crate) const FIXED_STRINGS: [&str; 10] = [
    "<think>",
    "\n",
    "bpm:",
    "caption:",
    "duration:",
    "genres:",
    "keyscale:",
    "language:",
    "timesignature:",
    "</think>",
];

/// The fields whose values come from a prefix tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeField {
    Bpm,
    Duration,
    Keyscale,
    Language,
    Timesignature,
}

/// Everything the constraint reads, built once per LM (and shared by its songs).
pub struct MetadataTables {
    pub(crate) vocab: Vocab,
    pub(crate) newline: u32,
    pub(crate) backtick: Option<u32>,
    /// Tokens that decode to exactly `<|audio_code_N|>` with N <= 63999, sorted.
    pub(crate) audio_codes: Vec<u32>,
    /// The same tokens as ascending runs of ids.
    pub(crate) audio_code_rows: Vec<Range<u32>>,
    /// `fixed[s][p]`: the tokens allowed at code point `p` of `FIXED_STRINGS[s]`.
    fixed: Vec<Vec<Vec<u32>>>,
    bpm: PrefixTree,
    duration: PrefixTree,
    keyscale: PrefixTree,
    language: PrefixTree,
    timesignature: PrefixTree,
    pub(crate) genres: Option<Genres>,
    /// The languages' first tokens in upstream's set order (its argmax takes the first
    /// of equal scores).
    pub(crate) language_firsts: Vec<u32>,
}

impl MetadataTables {
    /// Tables over `tok`'s vocabulary. `max_duration` caps the duration (upstream
    /// derives it from the GPU: 600 at most); `genres` is the genres vocabulary, None
    /// where there is none (the genres value is then free text ended by the LM).
    pub fn new(tok: &Tokenizer, max_duration: u32, genres: Option<&[String]>) -> Result<Self> {
        if max_duration < MIN_DURATION {
            return Err(Error::setting(
                "max_duration",
                format!("{max_duration} s is below the {MIN_DURATION} s minimum"),
            ));
        }
        let vocab = Vocab::new(tok);
        let newline = last_token(tok, "\n")?.ok_or_else(|| Error::BadConfig {
            what: "5 Hz LM tokenizer",
            reason: "\"\\n\" encodes to no token".into(),
        })?;
        let text = |id: u32| vocab.text(id);
        let tree = |field: &str, values: Vec<String>, keep| PrefixTree::build(tok, text, field, values, keep, newline);
        let keys =
            NOTES.iter().flat_map(|n| ACCIDENTALS.iter().flat_map(move |a| MODES.map(|m| format!("{n}{a} {m}"))));
        let language = tree("language", LANGUAGES.map(String::from).to_vec(), Keep::NonEmpty)?;
        let audio_codes = audio_codes(&vocab);
        Ok(Self {
            audio_code_rows: id_runs(&audio_codes),
            audio_codes,
            newline,
            backtick: last_token(tok, "`")?,
            fixed: FIXED_STRINGS.iter().map(|s| fixed_string_steps(tok, &vocab, s)).collect::<Result<_>>()?,
            bpm: tree("bpm", numbers(BPM_RANGE), Keep::All)?,
            duration: tree("duration", numbers(MIN_DURATION..=max_duration), Keep::All)?,
            keyscale: tree("keyscale", keys.collect(), Keep::NoteFirst)?,
            language_firsts: language.first_tokens_in_set_order(),
            language,
            timesignature: tree("timesignature", numbers(TIME_SIGNATURES), Keep::All)?,
            genres: genres.map(|g| Genres::new(g, &vocab)),
            vocab,
        })
    }

    /// The prefix tree of a field's values.
    pub fn tree(&self, field: TreeField) -> &PrefixTree {
        match field {
            TreeField::Bpm => &self.bpm,
            TreeField::Duration => &self.duration,
            TreeField::Keyscale => &self.keyscale,
            TreeField::Language => &self.language,
            TreeField::Timesignature => &self.timesignature,
        }
    }

    /// `len(tokenizer)`: the ids the tables know.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// The newline token (the last token of "\n").
    pub fn newline(&self) -> u32 {
        self.newline
    }

    /// `decode([id])` as the tables read it.
    pub fn text(&self, id: u32) -> &str {
        self.vocab.text(id)
    }

    /// The tokens allowed at code point `position` of fixed string `string`; empty
    /// past its end.
    pub(crate) fn fixed_allowed(&self, string: usize, position: usize) -> &[u32] {
        self.fixed[string].get(position).map_or(&[], Vec::as_slice)
    }
}

fn numbers(values: impl IntoIterator<Item = u32>) -> Vec<String> {
    values.into_iter().map(|v| v.to_string()).collect()
}

/// Token ids whose text is `<|audio_code_N|>` (Python's `$` also takes one trailing
/// newline) with N a valid code.
fn audio_codes(vocab: &Vocab) -> Vec<u32> {
    let code = |text: &str| -> Option<u64> {
        let text = text.strip_suffix('\n').unwrap_or(text);
        let digits = text.strip_prefix("<|audio_code_")?.strip_suffix("|>")?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        // A number too long for u64 is past the range anyway.
        Some(digits.parse().unwrap_or(u64::MAX))
    };
    vocab.iter().filter(|(_, t)| code(t).is_some_and(|n| n < u64::from(AUDIO_CODES))).map(|(id, _)| id).collect()
}

/// For each code point position in `fixed`, the tokens that continue it: the single
/// token of the longest remaining prefix that encodes to one token; failing that,
/// the first tokens of the prefixes (up to 19 code points) whose text agrees with
/// the prefix, longest prefix first.
fn fixed_string_steps(tok: &Tokenizer, vocab: &Vocab, fixed: &str) -> Result<Vec<Vec<u32>>> {
    (0..pystr::len(fixed)).map(|position| fixed_string_step(tok, vocab, pystr::tail(fixed, position))).collect()
}

fn fixed_string_step(tok: &Tokenizer, vocab: &Vocab, remaining: &str) -> Result<Vec<u32>> {
    let n = pystr::len(remaining);
    for end in (1..=n).rev() {
        if let [single] = encode(tok, pystr::head(remaining, end))?.as_slice() {
            return Ok(vec![*single]);
        }
    }
    // (token, longest prefix it starts), in first-seen order.
    let mut firsts: Vec<(u32, usize)> = Vec::new();
    for end in 1..=n.min(19) {
        let prefix = pystr::head(remaining, end);
        let Some(&first) = encode(tok, prefix)?.first() else { continue };
        let wanted = pystr::lstrip(prefix).to_lowercase();
        let got = pystr::lstrip(vocab.text(first)).to_lowercase();
        if !(got.starts_with(&wanted) || wanted.starts_with(&got)) {
            continue;
        }
        match firsts.iter_mut().find(|(t, _)| *t == first) {
            Some(entry) => entry.1 = entry.1.max(end),
            None => firsts.push((first, end)),
        }
    }
    firsts.sort_by_key(|&(_, end)| std::cmp::Reverse(end));
    Ok(firsts.into_iter().map(|(t, _)| t).collect())
}

//! The state machine of upstream's MetadataConstrainedLogitsProcessor as
//! `understand_audio_from_codes` sets it up: "<think>", "\n", then bpm, caption,
//! duration, genres, keyscale, language and timesignature (each "name:" forced, its
//! value constrained), "</think>", then free text with the audio codes blocked.
//!
//! Left out, as understand mode never reaches them: user-provided field values,
//! a target duration, the codes phase, stop_at_reasoning, skipped fields, per-phase
//! temperatures, the caption-matched genres trie and the vocabulary file's hot reload.

use std::borrow::Cow;

use super::pystr;
use super::tables::{MetadataTables, TreeField, FIXED_STRINGS};
use crate::label::understand::decode::Rows;

/// Where the decoding is, in upstream's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    ThinkTag,
    NewlineAfterThink,
    BpmName,
    BpmValue,
    CaptionName,
    CaptionValue,
    DurationName,
    DurationValue,
    GenresName,
    GenresValue,
    KeyscaleName,
    KeyscaleValue,
    LanguageName,
    LanguageValue,
    TimesigName,
    TimesigValue,
    ThinkEndTag,
    /// Past "</think>": the lyrics, free but for the audio codes.
    Completed,
}

impl State {
    fn next(self) -> Self {
        use State::*;
        match self {
            ThinkTag => NewlineAfterThink,
            NewlineAfterThink => BpmName,
            BpmName => BpmValue,
            BpmValue => CaptionName,
            CaptionName => CaptionValue,
            CaptionValue => DurationName,
            DurationName => DurationValue,
            DurationValue => GenresName,
            GenresName => GenresValue,
            GenresValue => KeyscaleName,
            KeyscaleName => KeyscaleValue,
            KeyscaleValue => LanguageName,
            LanguageName => LanguageValue,
            LanguageValue => TimesigName,
            TimesigName => TimesigValue,
            TimesigValue => ThinkEndTag,
            ThinkEndTag | Completed => Completed,
        }
    }

    /// The index in FIXED_STRINGS of the string this state writes.
    fn fixed_string(self) -> Option<usize> {
        use State::*;
        let index = match self {
            ThinkTag => 0,
            NewlineAfterThink => 1,
            BpmName => 2,
            CaptionName => 3,
            DurationName => 4,
            GenresName => 5,
            KeyscaleName => 6,
            LanguageName => 7,
            TimesigName => 8,
            ThinkEndTag => 9,
            _ => return None,
        };
        Some(index)
    }

    /// The value state a field name written at the end of a caption leads to.
    fn after_field_name(name: &str) -> Option<Self> {
        Some(match name {
            "duration" => State::DurationValue,
            "genres" => State::GenresValue,
            "keyscale" => State::KeyscaleValue,
            "language" => State::LanguageValue,
            "timesignature" => State::TimesigValue,
            _ => return None,
        })
    }
}

/// Upstream's cap on a caption's tokens: past it only the newline is allowed.
const CAPTION_TOKEN_CAP: usize = 512;

/// One song's constrained decoding: `process` masks a step's logits, `update` takes
/// the token chosen.
#[derive(Clone)]
pub struct MetadataConstraint<'t> {
    tables: &'t MetadataTables,
    state: State,
    /// Code points of the current fixed string written so far.
    position: usize,
    /// The value's tokens (tree fields).
    value_ids: Vec<u32>,
    /// The value's text (genres).
    value_text: String,
    caption_tokens: usize,
    /// The last caption token held a newline: the next step checks for a new field.
    caption_after_newline: bool,
    /// The LM has started a line that is not indented: the caption is over and the
    /// LM writes a field name, freely, up to its colon.
    caption_ending: bool,
    pending_field_name: String,
}

impl<'t> MetadataConstraint<'t> {
    pub fn new(tables: &'t MetadataTables) -> Self {
        Self {
            tables,
            state: State::ThinkTag,
            position: 0,
            value_ids: Vec::new(),
            value_text: String::new(),
            caption_tokens: 0,
            caption_after_newline: false,
            caption_ending: false,
            pending_field_name: String::new(),
        }
    }

    pub fn tables(&self) -> &'t MetadataTables {
        self.tables
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// Past "</think>": what follows is the lyrics.
    pub fn is_free_text(&self) -> bool {
        self.state == State::Completed
    }

    /// The LM-head rows the next `process` reads; the others it masks whatever they
    /// are, so the LM may leave them uncomputed.
    pub fn rows(&self) -> Rows<'t> {
        if let Some(allowed) = self.plain_choice() {
            return Rows::Only(allowed);
        }
        let caption_line = self.state == State::CaptionValue && !self.caption_after_newline && !self.caption_ending;
        if self.state == State::Completed || caption_line {
            return Rows::AllBut(&self.tables.audio_code_rows);
        }
        if self.state == State::LanguageValue {
            // The first token: the best of the languages' first tokens (the newline
            // where there are none).
            let mut ids = self.tables.language_firsts.clone();
            ids.push(self.tables.newline);
            return Rows::Only(ids.into());
        }
        Rows::All
    }

    /// Masks (-inf) what may not come next in `scores`, one step's logits over the
    /// vocabulary. Some states decide on the logits themselves (the language's first
    /// token, the end of a caption, the end of free genres) and change state here.
    pub fn process(&mut self, scores: &mut [f32]) {
        if self.state == State::Completed {
            block(scores, &self.tables.audio_codes);
        } else {
            self.constrain(scores);
        }
    }

    /// Takes the token chosen at this step.
    pub fn update(&mut self, token: u32) {
        let text = self.tables.text(token);
        let newline = token == self.tables.newline;
        if let Some(string) = self.state.fixed_string() {
            // The token's text counts in full, even where it runs past the string.
            self.position += pystr::len(text);
            if self.position >= pystr::len(FIXED_STRINGS[string]) {
                self.advance();
            }
            return;
        }
        match self.state {
            State::BpmValue
            | State::DurationValue
            | State::TimesigValue
            | State::KeyscaleValue
            | State::LanguageValue => {
                if newline {
                    self.advance();
                } else {
                    self.value_ids.push(token);
                }
            }
            State::GenresValue => {
                if newline {
                    self.advance();
                } else {
                    self.value_text.push_str(text);
                }
            }
            State::CaptionValue => self.update_caption(text),
            // Completed takes anything; the fixed strings were handled above.
            _ => {}
        }
    }

    /// Upstream's per-sequence step: every state but Completed.
    fn constrain(&mut self, scores: &mut [f32]) {
        if let Some(allowed) = self.plain_choice() {
            return keep_only(scores, &allowed);
        }
        if let Some(string) = self.state.fixed_string() {
            return self.constrain_fixed_string(scores, string);
        }
        match self.state {
            State::LanguageValue => self.constrain_language(scores),
            State::CaptionValue => self.constrain_caption(scores),
            State::GenresValue => self.constrain_genres(scores),
            // Completed is not constrained here (see `process`); the other states
            // made their plain choice above.
            _ => {}
        }
    }

    /// The tokens allowed next where that is all the step does (it reads no score):
    /// a fixed string's next characters, a value's continuations in its tree, the
    /// newline after a complete value.
    fn plain_choice(&self) -> Option<Cow<'t, [u32]>> {
        let newline = || Cow::Owned(vec![self.tables.newline]);
        let tree = |field| Cow::Borrowed(self.tree_next(field));
        Some(match self.state {
            s if s.fixed_string().is_some() => {
                let allowed = self.tables.fixed_allowed(s.fixed_string()?, self.position);
                (!allowed.is_empty()).then_some(Cow::Borrowed(allowed))?
            }
            State::BpmValue => tree(TreeField::Bpm),
            State::DurationValue => tree(TreeField::Duration),
            State::TimesigValue if self.value_complete(TreeField::Timesignature) => newline(),
            State::TimesigValue => tree(TreeField::Timesignature),
            State::KeyscaleValue => self.closed_value(TreeField::Keyscale),
            State::LanguageValue if !self.value_ids.is_empty() => self.closed_value(TreeField::Language),
            _ => return None,
        })
    }

    /// Nothing continues the string (a tokenizer with no token for its next
    /// characters): upstream moves on and constrains the next state's step on zeroed
    /// logits, or leaves them be where that state is another fixed string.
    fn constrain_fixed_string(&mut self, scores: &mut [f32], string: usize) {
        debug_assert!(self.tables.fixed_allowed(string, self.position).is_empty());
        self.advance();
        if self.state.fixed_string().is_none() {
            scores.fill(0.0);
            self.constrain(scores);
        }
    }

    /// The tokens the field's tree allows after the value so far (none where the value
    /// left the tree).
    fn tree_next(&self, field: TreeField) -> &'t [u32] {
        self.tables.tree(field).next_tokens(&self.value_ids).unwrap_or(&[])
    }

    fn value_complete(&self, field: TreeField) -> bool {
        self.tables.tree(field).is_complete(&self.value_ids, self.tables.newline)
    }

    /// Key and language after their first token: a complete value ends the line,
    /// otherwise the tree's continuations, otherwise the newline.
    fn closed_value(&self, field: TreeField) -> Cow<'t, [u32]> {
        let next = self.tree_next(field);
        match self.value_complete(field) || next.is_empty() {
            true => Cow::Owned(vec![self.tables.newline]),
            false => Cow::Borrowed(next),
        }
    }

    /// The language's first token is the best-scored of all languages' first tokens,
    /// alone; the rest follows the tree.
    fn constrain_language(&self, scores: &mut [f32]) {
        let best = self.tables.language_firsts.iter().copied().reduce(|best, id| {
            if score(scores, id) > score(scores, best) {
                id
            } else {
                best
            }
        });
        keep_only(scores, &[best.unwrap_or(self.tables.newline)]);
    }

    fn constrain_caption(&mut self, scores: &mut [f32]) {
        if self.caption_after_newline {
            self.caption_after_newline = false;
            // The raw argmax, before this state's own masks, decides.
            let top = argmax(scores);
            if top.is_some_and(|t| self.tables.text(t).chars().next().is_some_and(|c| c != ' ' && c != '\t')) {
                self.caption_ending = true;
                self.pending_field_name.clear();
            }
        }
        if self.caption_ending {
            return;
        }
        if let Some(backtick) = self.tables.backtick {
            if let Some(s) = scores.get_mut(backtick as usize) {
                *s = f32::NEG_INFINITY;
            }
        }
        block(scores, &self.tables.audio_codes);
        if self.caption_tokens >= CAPTION_TOKEN_CAP {
            keep_only(scores, &[self.tables.newline]);
        }
    }

    fn constrain_genres(&mut self, scores: &mut [f32]) {
        let newline = self.tables.newline;
        if let Some(genres) = &self.tables.genres {
            let mut allowed = genres.allowed(&self.value_text, newline);
            if allowed.is_empty() {
                allowed.push(newline);
            }
            keep_only(scores, &allowed);
        } else if self.free_genres_end(scores) {
            // Upstream moves on here, before the newline is taken: `update` then counts
            // the newline as the first character of "keyscale:" (the LM writes
            // "eyscale:").
            keep_only(scores, &[newline]);
            self.advance();
        } else if pystr::strip(&self.value_text).is_empty() {
            block(scores, &[newline]);
        }
    }

    /// Free genres end where there is some text and the newline outscores every other
    /// token (upstream compares softmax probabilities; the logits order them alike
    /// but for ties the rounding of the probabilities makes).
    fn free_genres_end(&self, scores: &[f32]) -> bool {
        let newline = self.tables.newline as usize;
        if pystr::strip(&self.value_text).is_empty() || newline >= scores.len() {
            return false;
        }
        let others = scores.iter().enumerate().filter(|&(i, _)| i != newline).map(|(_, &s)| s);
        scores[newline] > others.fold(f32::NEG_INFINITY, f32::max)
    }

    fn update_caption(&mut self, text: &str) {
        self.caption_tokens += 1;
        self.caption_after_newline = text.contains('\n');
        if !self.caption_ending {
            return;
        }
        self.pending_field_name.push_str(text);
        if !text.contains(':') {
            return;
        }
        let name = pystr::strip(pystr::strip(&self.pending_field_name).trim_end_matches(':')).to_lowercase();
        match State::after_field_name(&name) {
            Some(value_state) => self.enter(value_state),
            None => self.advance(),
        }
    }

    /// Upstream's `_transition_to_next_state`.
    fn advance(&mut self) {
        self.enter(self.state.next());
    }

    fn enter(&mut self, state: State) {
        *self = Self { state, ..Self::new(self.tables) };
    }
}

fn score(scores: &[f32], id: u32) -> f32 {
    scores.get(id as usize).copied().unwrap_or(f32::NEG_INFINITY)
}

/// The first index of the largest score (torch.argmax).
fn argmax(scores: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &s) in scores.iter().enumerate() {
        if best.is_none_or(|(_, b)| s > b) {
            best = Some((i, s));
        }
    }
    best.map(|(i, _)| i as u32)
}

/// Sets every score but `allowed`'s to -inf (all of them where `allowed` is empty).
fn keep_only(scores: &mut [f32], allowed: &[u32]) {
    let kept: Vec<(usize, f32)> =
        allowed.iter().filter_map(|&id| scores.get(id as usize).map(|&s| (id as usize, s))).collect();
    scores.fill(f32::NEG_INFINITY);
    for (i, s) in kept {
        scores[i] = s;
    }
}

fn block(scores: &mut [f32], ids: &[u32]) {
    for &id in ids {
        if let Some(s) = scores.get_mut(id as usize) {
            *s = f32::NEG_INFINITY;
        }
    }
}

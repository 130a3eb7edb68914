//! The state machine of upstream's MetadataConstrainedLogitsProcessor: "<think>",
//! "\n", then bpm, caption, duration, genres, keyscale, language and timesignature
//! (each "name:" forced, its value constrained), "</think>", then what the [`Phase`]
//! says follows: free text with the audio codes blocked (understand), the end token
//! where "</think>" would begin (text2music's metadata, genres skipped, the values the
//! user gave forced), or audio codes only up to a target count (text2music's codes).
//!
//! Left out, as neither mode reaches them: skipping caption or language, per-phase
//! temperatures, the caption-matched genres trie and the vocabulary file's hot reload.

use std::borrow::Cow;

use super::phase::Phase;
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
    /// Past "</think>": the lyrics, free but for the audio codes (understand), or the
    /// end (text2music's metadata).
    Completed,
    /// Audio codes (text2music's codes phase).
    Codes,
}

impl State {
    /// The state after this one; None where upstream's table has none (the genres
    /// states when genres are skipped: the state machine stays).
    fn next(self, skip_genres: bool) -> Option<Self> {
        use State::*;
        Some(match self {
            DurationValue if skip_genres => KeyscaleName,
            GenresName | GenresValue if skip_genres => return None,
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
            Codes => Codes,
        })
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

    /// The field whose value this state writes, among those a user may give.
    fn given_field(self) -> Option<TreeField> {
        Some(match self {
            State::BpmValue => TreeField::Bpm,
            State::DurationValue => TreeField::Duration,
            State::KeyscaleValue => TreeField::Keyscale,
            State::TimesigValue => TreeField::Timesignature,
            _ => return None,
        })
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

/// Understand mode's phase, for [`MetadataConstraint::new`].
static UNDERSTAND: Phase = Phase::Understand;

/// One song's constrained decoding: `process` masks a step's logits, `update` takes
/// the token chosen.
#[derive(Clone)]
pub struct MetadataConstraint<'t> {
    tables: &'t MetadataTables,
    phase: &'t Phase,
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
    /// The rest of a given value's tokens, forced one a step.
    given: Vec<u32>,
    /// Audio codes written (the codes phase).
    codes: usize,
}

impl<'t> MetadataConstraint<'t> {
    /// Understand mode's constraint.
    pub fn new(tables: &'t MetadataTables) -> Self {
        Self::for_phase(tables, &UNDERSTAND)
    }

    /// The constraint of `phase`: the codes phase starts at the codes (its prompt holds
    /// the think block), the others at "<think>".
    pub fn for_phase(tables: &'t MetadataTables, phase: &'t Phase) -> Self {
        let state = match phase {
            Phase::Codes { .. } => State::Codes,
            _ => State::ThinkTag,
        };
        Self::at(tables, phase, state)
    }

    fn at(tables: &'t MetadataTables, phase: &'t Phase, state: State) -> Self {
        Self {
            tables,
            phase,
            state,
            position: 0,
            value_ids: Vec::new(),
            value_text: String::new(),
            caption_tokens: 0,
            caption_after_newline: false,
            caption_ending: false,
            pending_field_name: String::new(),
            given: state.given_field().and_then(|f| phase.given(f)).map(<[u32]>::to_vec).unwrap_or_default(),
            codes: 0,
        }
    }

    /// Audio codes written so far (the codes phase).
    pub fn codes_written(&self) -> usize {
        self.codes
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
        if let Phase::Codes { rows, eos, .. } = self.phase {
            return match self.codes_target_reached() {
                true => Rows::Only(vec![*eos].into()),
                false => Rows::Runs(rows),
            };
        }
        if let Some(allowed) = self.plain_choice() {
            return Rows::Only(allowed);
        }
        let caption_line = self.state == State::CaptionValue && !self.caption_after_newline && !self.caption_ending;
        let understood = self.state == State::Completed && matches!(self.phase, Phase::Understand);
        if understood || caption_line {
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
        match self.state {
            State::Completed if matches!(self.phase, Phase::Understand) => block(scores, &self.tables.audio_codes),
            State::Completed => {}
            State::Codes => self.constrain_codes(scores),
            _ => self.constrain(scores),
        }
    }

    /// Audio codes and the end token only; the end token ruled out before the target
    /// and the only choice from it on.
    fn constrain_codes(&self, scores: &mut [f32]) {
        let Phase::Codes { eos, .. } = self.phase else { return };
        if self.codes_target_reached() {
            return keep_only(scores, &[*eos]);
        }
        let mut allowed = self.tables.audio_codes.clone();
        if self.codes_target().is_none() {
            allowed.push(*eos);
        }
        keep_only(scores, &allowed);
    }

    fn codes_target(&self) -> Option<usize> {
        match self.phase {
            Phase::Codes { target, .. } => *target,
            _ => None,
        }
    }

    fn codes_target_reached(&self) -> bool {
        self.codes_target().is_some_and(|target| self.codes >= target)
    }

    /// Takes the token chosen at this step.
    pub fn update(&mut self, token: u32) {
        if self.state == State::Codes {
            self.codes += 1;
            return;
        }
        if !self.given.is_empty() {
            // Upstream takes the forced token whatever was drawn, and moves on after
            // the value's last one.
            self.given.remove(0);
            if self.given.is_empty() {
                self.advance();
            }
            return;
        }
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
        if let Some(&forced) = self.given.first() {
            return Some(Cow::Owned(vec![forced]));
        }
        if let (State::ThinkEndTag, Phase::Metadata { eos, .. }) = (self.state, self.phase) {
            // stop_at_reasoning: the end token in place of the tag.
            return Some(Cow::Owned(vec![*eos]));
        }
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
        if let Some(next) = self.state.next(self.phase.skips_genres()) {
            self.enter(next);
        }
    }

    fn enter(&mut self, state: State) {
        *self = Self::at(self.tables, self.phase, state);
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

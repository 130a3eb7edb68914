//! The decoding loop: constrained logits, sampling, stopping.
//!
//! One sequence, as upstream's `_generate_with_constrained_decoding` runs it: each step
//! the model's scores for the next token go through the constraint, then the sampler
//! (repetition penalty, top-k, top-p, temperature); the constraint is told the token;
//! the loop ends after an end token (eos or pad, kept in the output as upstream keeps
//! it) or after the token budget.

use std::borrow::Cow;
use std::ops::Range;
use std::path::Path;

use tokenizers::Tokenizer;

use super::parse::closes_think;
use super::sample::Sampler;
use crate::cancel::Cancel;
use crate::{Error, Result};

/// Upstream's budget for one understand run with the PyTorch backend: the model config's
/// `max_new_tokens` (absent: 4096) capped at its `max_model_len` (4096) less 64.
pub const MAX_NEW_TOKENS: usize = 4096 - 64;

/// The scores a step's processing reads: the model may leave the others uncomputed
/// (-inf), as the processor masks them whatever they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rows<'a> {
    All,
    /// Every token but these ascending, disjoint ranges.
    AllBut(&'a [Range<u32>]),
    /// Only these tokens.
    Only(Cow<'a, [u32]>),
    /// Only these ascending, disjoint ranges of tokens.
    Runs(&'a [Range<u32>]),
}

/// Ascending, distinct ids as runs of consecutive ids.
pub fn id_runs(sorted: &[u32]) -> Vec<Range<u32>> {
    let mut runs: Vec<Range<u32>> = Vec::new();
    for &id in sorted {
        match runs.last_mut() {
            Some(run) if run.end == id => run.end += 1,
            _ => runs.push(id..id + 1),
        }
    }
    runs
}

/// The language model, one sequence at a time, keeping its own cache. `rows` says
/// which scores will be read.
pub trait NextLogits {
    /// Reads the prompt afresh; the scores for the token after it (one per vocabulary entry).
    fn prefill(&mut self, prompt: &[u32], rows: &Rows) -> Result<Vec<f32>>;
    /// Appends `token`; the scores for the token after it.
    fn step(&mut self, token: u32, rows: &Rows) -> Result<Vec<f32>>;
}

/// What shapes the scores before sampling (the metadata constraint) and follows the
/// tokens chosen.
pub trait LogitsProcessor {
    fn process(&mut self, scores: &mut [f32]);
    fn update(&mut self, token: u32);
    /// The scores the next `process` reads.
    fn rows(&self) -> Rows<'_> {
        Rows::All
    }
}

/// The tokens that end the output; upstream stops on either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopTokens {
    pub eos: u32,
    pub pad: u32,
}

/// Why the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The LM wrote eos or pad (the last generated id).
    EndToken,
    /// The token budget ran out first.
    Budget,
}

/// One run's output.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The generated ids, the end token included.
    pub ids: Vec<u32>,
    /// Their text with special tokens kept (what upstream's parser reads).
    pub text: String,
    pub stop: Stop,
}

impl Decoded {
    /// Whether the LM closed its think block (`</think>`): without it there are no lyrics
    /// and the metadata may be cut short, which upstream passes on silently.
    pub fn closed_think(&self) -> bool {
        closes_think(&self.text)
    }

    /// Why the output cannot be used as a caption, for the caller to put in its error:
    /// None when the think block was closed.
    pub fn unfinished(&self) -> Option<String> {
        if self.closed_think() {
            return None;
        }
        let count = self.ids.len();
        Some(match self.stop {
            Stop::Budget => format!("the LM wrote {count} tokens (its whole budget) without closing </think>"),
            Stop::EndToken => format!("the LM ended its output after {count} tokens without closing </think>"),
        })
    }
}

/// How one run decodes: the end tokens, the budget, and the tokenizer that makes text.
pub struct Decoder<'a> {
    pub tokenizer: &'a Tokenizer,
    /// Where the tokenizer came from, for errors.
    pub tokenizer_file: &'a Path,
    pub stop: StopTokens,
    pub max_new_tokens: usize,
}

impl Decoder<'_> {
    /// Generates after `prompt` until an end token or the budget. `cancel` is checked
    /// before every model call; `progress` hears the number of tokens generated so far
    /// after each one.
    pub fn run<M: NextLogits, P: LogitsProcessor>(
        &self,
        model: &mut M,
        processor: &mut P,
        sampler: &mut Sampler,
        prompt: &[u32],
        cancel: &Cancel,
        mut progress: impl FnMut(usize),
    ) -> Result<Decoded> {
        if self.max_new_tokens == 0 {
            return Err(Error::setting("max_new_tokens", "0 leaves the LM no token to write"));
        }
        cancel.check()?;
        let mut scores = model.prefill(prompt, &processor.rows())?;
        let mut context = prompt.to_vec();
        let mut ids = Vec::new();
        let stop = loop {
            processor.process(&mut scores);
            let token = sampler.next_token(&mut scores, &context)?;
            processor.update(token);
            context.push(token);
            ids.push(token);
            progress(ids.len());
            if token == self.stop.eos || token == self.stop.pad {
                break Stop::EndToken;
            }
            if ids.len() == self.max_new_tokens {
                break Stop::Budget;
            }
            cancel.check()?;
            scores = model.step(token, &processor.rows())?;
        };
        let text = self.tokenizer.decode(&ids, false).map_err(|e| Error::BadFile {
            path: self.tokenizer_file.to_path_buf(),
            reason: format!("the LM's tokens cannot be decoded to text: {e}"),
        })?;
        Ok(Decoded { ids, text, stop })
    }
}

#[cfg(test)]
mod tests {
    use tokenizers::models::wordlevel::WordLevel;

    use super::*;
    use crate::label::understand::sample::Sampling;

    const VOCAB: [&str; 5] = ["<think>", "</think>", "la", "<eos>", "<pad>"];
    const EOS: u32 = 3;
    const PAD: u32 = 4;

    fn tokenizer() -> Tokenizer {
        let vocab = VOCAB.iter().enumerate().map(|(i, t)| (t.to_string(), i as u32)).collect();
        Tokenizer::new(WordLevel::builder().vocab(vocab).unk_token("<eos>".into()).build().unwrap())
    }

    /// Scores that make `script[n]` the best token after `n` generated ones (then "la"
    /// forever); records what it was fed.
    struct Scripted {
        script: Vec<u32>,
        fed: Vec<u32>,
        prompt: Vec<u32>,
    }

    impl Scripted {
        fn new(script: &[u32]) -> Self {
            Self { script: script.to_vec(), fed: vec![], prompt: vec![] }
        }

        fn scores(&self) -> Vec<f32> {
            let best = self.script.get(self.fed.len()).copied().unwrap_or(2);
            (0..VOCAB.len() as u32).map(|t| if t == best { 1.0 } else { 0.0 }).collect()
        }
    }

    impl NextLogits for Scripted {
        fn prefill(&mut self, prompt: &[u32], _: &Rows) -> Result<Vec<f32>> {
            self.prompt = prompt.to_vec();
            Ok(self.scores())
        }
        fn step(&mut self, token: u32, _: &Rows) -> Result<Vec<f32>> {
            self.fed.push(token);
            Ok(self.scores())
        }
    }

    /// Forbids one token and records the tokens it is told.
    #[derive(Default)]
    struct Forbid {
        token: Option<u32>,
        told: Vec<u32>,
    }

    impl LogitsProcessor for Forbid {
        fn process(&mut self, scores: &mut [f32]) {
            if let Some(t) = self.token {
                scores[t as usize] = f32::NEG_INFINITY;
            }
        }
        fn update(&mut self, token: u32) {
            self.told.push(token);
        }
    }

    fn greedy() -> Sampler {
        Sampler::new(Sampling { temperature: 0.0, ..Sampling::default() }, 0).unwrap()
    }

    fn decode(tok: &Tokenizer, budget: usize, model: &mut Scripted, processor: &mut Forbid) -> Result<Decoded> {
        let decoder = Decoder {
            tokenizer: tok,
            tokenizer_file: Path::new("scripted/tokenizer.json"),
            stop: StopTokens { eos: EOS, pad: PAD },
            max_new_tokens: budget,
        };
        decoder.run(model, processor, &mut greedy(), &[2, 2], &Cancel::never(), |_| {})
    }

    #[test]
    fn stops_at_eos_keeping_it() {
        let tok = tokenizer();
        let (mut model, mut processor) = (Scripted::new(&[0, 2, 1, 2, EOS, 2]), Forbid::default());
        let out = decode(&tok, 100, &mut model, &mut processor).unwrap();
        assert_eq!(out.ids, [0, 2, 1, 2, EOS]);
        assert_eq!(out.stop, Stop::EndToken);
        assert_eq!(out.text, "<think> la </think> la <eos>");
        assert!(out.closed_think() && out.unfinished().is_none());
        assert_eq!(model.prompt, [2, 2]);
        assert_eq!(model.fed, [0, 2, 1, 2], "no model call after the end token");
        assert_eq!(processor.told, out.ids, "the constraint hears every token, the last too");
    }

    #[test]
    fn pad_ends_the_output_too() {
        let tok = tokenizer();
        let out = decode(&tok, 100, &mut Scripted::new(&[2, PAD]), &mut Forbid::default()).unwrap();
        assert_eq!((out.ids, out.stop), (vec![2, PAD], Stop::EndToken));
    }

    #[test]
    fn stops_at_the_budget_and_says_the_think_block_is_open() {
        let tok = tokenizer();
        let mut model = Scripted::new(&[0]);
        let out = decode(&tok, 4, &mut model, &mut Forbid::default()).unwrap();
        assert_eq!((out.ids.as_slice(), out.stop), ([0, 2, 2, 2].as_slice(), Stop::Budget));
        assert_eq!(model.fed.len(), 3, "no model call past the budget");
        let why = out.unfinished().expect("no </think>");
        assert!(why.contains("4 tokens") && why.contains("</think>"), "{why}");
    }

    #[test]
    fn the_constraint_shapes_the_choice() {
        let tok = tokenizer();
        let mut processor = Forbid { token: Some(EOS), told: vec![] };
        let out = decode(&tok, 3, &mut Scripted::new(&[EOS, EOS, EOS]), &mut processor).unwrap();
        assert_eq!(out.ids, [0, 0, 0], "eos forbidden: the first of the tied rest");
        assert_eq!(out.stop, Stop::Budget);
    }

    #[test]
    fn cancel_stops_between_steps_and_progress_counts_tokens() {
        let tok = tokenizer();
        let cancel = Cancel::never();
        let decoder = Decoder {
            tokenizer: &tok,
            tokenizer_file: Path::new("scripted/tokenizer.json"),
            stop: StopTokens { eos: EOS, pad: PAD },
            max_new_tokens: 100,
        };
        let mut seen = vec![];
        let result = decoder.run(&mut Scripted::new(&[]), &mut Forbid::default(), &mut greedy(), &[2], &cancel, |n| {
            seen.push(n);
            if n == 3 {
                cancel.cancel();
            }
        });
        assert!(matches!(result, Err(Error::Cancelled)));
        assert_eq!(seen, [1, 2, 3]);
        let result = decoder.run(&mut Scripted::new(&[]), &mut Forbid::default(), &mut greedy(), &[2], &cancel, |_| {});
        assert!(matches!(result, Err(Error::Cancelled)), "a cancelled token stops before the prefill");
    }

    #[test]
    fn a_zero_budget_is_refused() {
        let tok = tokenizer();
        let err = decode(&tok, 0, &mut Scripted::new(&[]), &mut Forbid::default()).unwrap_err();
        assert!(matches!(&err, Error::Setting { field, .. } if field == "max_new_tokens"), "{err}");
    }
}

//! The song's plan by ACE-Step's 5 Hz LM, as upstream's text2music "thinking" makes it
//! (`LLMHandler.generate_with_stop_condition`, infer_type `llm_dit`, single song):
//!
//! 1. metadata: the caption and lyrics prompt; the LM writes its think block under the
//!    metadata constraint (no genres line, the user's bpm, duration, key and time
//!    signature forced), ending where "</think>" would begin; skipped when the user
//!    gave all four;
//! 2. codes: the prompt again with the metadata as the assistant's think block
//!    (`cot`); the LM writes audio codes only, int(duration * 5) of them, then the end.
//!
//! Both phases decode with classifier-free guidance above a scale of 1 (the
//! unconditional prompts upstream builds: the lyrics alone, then an empty think block),
//! and sample with upstream's text2music defaults.

mod cot;

use std::path::{Path, PathBuf};

use candle_core::Device;
use serde::{Deserialize, Serialize};

use self::cot::format_cot;
use crate::cancel::Cancel;
use crate::codec::causal_lm::CausalLm;
use crate::device::Precision;
use crate::label::understand::constrained::{
    read_genres_vocab, GivenText, GivenValues, MetadataConstraint, MetadataTables, Phase,
};
use crate::label::understand::decode::{Decoded, Stop};
use crate::label::understand::guided::Guided;
use crate::label::understand::labeller::{GENRES_VOCAB, MAX_DURATION};
use crate::label::understand::parse::{parse_metadata, IntOrText};
use crate::label::understand::prompt::{UnderstandPrompt, AUDIO_CODES};
use crate::label::understand::sample::{Sampler, Sampling};
use crate::label::understand::steps::LmSteps;
use crate::{Error, Result};

/// The system message's instruction for generation, as upstream words it.
pub const GENERATE_INSTRUCTION: &str = "Generate audio semantic tokens based on the given conditions:";
/// Upstream's pt backend: `max_model_len` 4096, its budgets capped 64 below.
const MAX_MODEL_LEN: usize = 4096;
/// The metadata phase's budget (no duration: the model's default, capped).
const METADATA_TOKENS: usize = MAX_MODEL_LEN - 64;

/// How the LM writes a plan; the defaults are upstream's text2music defaults
/// (`lm_temperature` 0.85, `lm_cfg_scale` 2, `lm_top_k` 0, `lm_top_p` 0.9).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlanSettings {
    /// The 5 Hz LM folder; None: the one found where models are looked for.
    pub lm: Option<PathBuf>,
    pub temperature: f32,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    /// The LM's classifier-free guidance; 1 turns it off.
    pub cfg_scale: f32,
}

impl Default for PlanSettings {
    fn default() -> Self {
        Self { lm: None, temperature: 0.85, top_k: None, top_p: Some(0.9), cfg_scale: 2.0 }
    }
}

impl PlanSettings {
    pub fn sampling(&self) -> Sampling {
        Sampling { temperature: self.temperature, top_k: self.top_k, top_p: self.top_p, repetition_penalty: 1.0 }
    }

    /// Every setting in range, each error named by its field.
    pub fn validate(&self) -> Result<()> {
        self.sampling().validate()?;
        if !(self.cfg_scale.is_finite() && self.cfg_scale >= 1.0) {
            return Err(Error::setting("lm_cfg_scale", format!("{} must be at least 1", self.cfg_scale)));
        }
        Ok(())
    }
}

/// What the plan is asked: the song as the user described it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlanRequest {
    pub caption: String,
    pub lyrics: String,
    pub duration_seconds: f64,
    pub bpm: Option<u32>,
    pub keyscale: Option<String>,
    pub timesignature: Option<String>,
    pub seed: u64,
}

/// The LM's plan of a song.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The metadata the codes were written under (the user's values where given).
    pub bpm: Option<String>,
    pub caption: Option<String>,
    pub duration: Option<String>,
    pub keyscale: Option<String>,
    pub language: Option<String>,
    pub timesignature: Option<String>,
    /// The 5 Hz audio codes (0..64000).
    pub codes: Vec<u32>,
    /// The metadata phase's output (None when the user gave every value).
    pub metadata_text: Option<String>,
    /// The token ids each phase wrote (none for the metadata when it was all given).
    pub metadata_ids: Vec<u32>,
    pub codes_ids: Vec<u32>,
}

/// Where a plan is: the phase and its tokens so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanProgress {
    Metadata { tokens: usize },
    Codes { tokens: usize, of: usize },
}

/// The 5 Hz LM loaded to plan songs.
pub struct Planner {
    settings: PlanSettings,
    lm: CausalLm,
    prompt: UnderstandPrompt,
    tables: MetadataTables,
    /// The tokens of "</think>", which the codes prompt must hold.
    think_end: Vec<u32>,
}

impl Planner {
    /// The LM at `lm_dir` (a genres vocabulary beside it constrains genres, as in
    /// labelling).
    pub fn load(lm_dir: &Path, settings: PlanSettings, device: &Device, precision: Precision) -> Result<Self> {
        settings.validate()?;
        let prompt = UnderstandPrompt::new(lm_dir)?;
        let genres_file = lm_dir.join(GENRES_VOCAB);
        let genres = match genres_file.is_file() {
            true => Some(read_genres_vocab(&genres_file)?),
            false => None,
        };
        let tables = MetadataTables::new(prompt.tokenizer(), MAX_DURATION, genres.as_deref())?;
        let think_end = prompt.encode("</think>")?;
        let lm = CausalLm::load(lm_dir, device, precision)?;
        Ok(Self { settings, lm, prompt, tables, think_end })
    }

    pub fn settings(&self) -> &PlanSettings {
        &self.settings
    }

    /// The plan of `request`: metadata, then codes. `progress` hears each token.
    pub fn plan(&self, request: &PlanRequest, cancel: &Cancel, progress: &mut dyn FnMut(PlanProgress)) -> Result<Plan> {
        let seconds = request.duration_seconds;
        if !(seconds.is_finite() && seconds > 0.0) {
            return Err(Error::setting("duration_seconds", format!("{seconds} s: a plan needs a duration above 0")));
        }
        let given = GivenText {
            bpm: request.bpm.map(|b| b.to_string()),
            duration: Some((seconds.trunc() as u64).to_string()),
            keyscale: request.keyscale.clone(),
            timesignature: request.timesignature.clone(),
        };
        let mut sampler = Sampler::new(self.settings.sampling(), request.seed)?;
        let (metadata, metadata_text, metadata_ids) = match given.is_complete() {
            true => (given_metadata(&given), None, Vec::new()),
            false => {
                let decoded = self.metadata(request, &given, &mut sampler, cancel, progress)?;
                let read = parse_metadata(&decoded.text);
                let int = |v: Option<IntOrText>| {
                    v.map(|v| match v {
                        IntOrText::Int(n) => n.to_string(),
                        IntOrText::Text(t) => t,
                    })
                };
                let metadata = Metadata {
                    bpm: int(read.bpm),
                    caption: read.caption,
                    duration: int(read.duration),
                    keyscale: read.keyscale,
                    language: read.language,
                    timesignature: read.timesignature,
                };
                (metadata, Some(decoded.text), decoded.ids)
            }
        };
        let target = (seconds * 5.0) as usize;
        let decoded = self.codes(request, &metadata.cot(), target, &mut sampler, cancel, progress)?;
        let codes: Vec<u32> = decoded.ids.iter().filter_map(|&id| self.code_of(id)).collect();
        if decoded.stop != Stop::EndToken || codes.len() != target {
            return Err(Error::BadRequest(format!(
                "the 5 Hz LM wrote {} audio codes of the {target} a {seconds} s song needs",
                codes.len()
            )));
        }
        Ok(Plan {
            bpm: metadata.bpm,
            caption: metadata.caption,
            duration: metadata.duration,
            keyscale: metadata.keyscale,
            language: metadata.language,
            timesignature: metadata.timesignature,
            codes,
            metadata_text,
            metadata_ids,
            codes_ids: decoded.ids,
        })
    }

    /// Phase 1: the think block, stopped where "</think>" would begin.
    fn metadata(
        &self,
        request: &PlanRequest,
        given: &GivenText,
        sampler: &mut Sampler,
        cancel: &Cancel,
        progress: &mut dyn FnMut(PlanProgress),
    ) -> Result<Decoded> {
        let user = format!("# Caption\n{}\n\n# Lyric\n{}\n", request.caption, request.lyrics);
        let prompt = self.prompt.encode(&self.prompt.chat(&self.messages(&user), true)?)?;
        let uncond_user = format!("# Lyric\n{}\n", request.lyrics);
        let uncond = self.prompt.encode(&self.prompt.chat(&self.messages(&uncond_user), true)?)?;
        let phase =
            Phase::Metadata { given: GivenValues::new(self.prompt.tokenizer(), given)?, eos: self.prompt.eos() };
        let mut constraint = MetadataConstraint::for_phase(&self.tables, &phase);
        self.decode(&prompt, uncond, METADATA_TOKENS, &mut constraint, sampler, cancel, &mut |tokens| {
            progress(PlanProgress::Metadata { tokens })
        })
    }

    /// Phase 2: the codes after the metadata written as the assistant's think block.
    fn codes(
        &self,
        request: &PlanRequest,
        cot: &str,
        target: usize,
        sampler: &mut Sampler,
        cancel: &Cancel,
        progress: &mut dyn FnMut(PlanProgress),
    ) -> Result<Decoded> {
        let prompt = self.codes_prompt(&request.caption, &request.lyrics, cot)?;
        if !prompt.windows(self.think_end.len()).any(|w| w == self.think_end.as_slice()) {
            return Err(Error::BadConfig {
                what: "5 Hz LM chat template",
                reason: "the codes prompt lost its </think>: the template drops the assistant's think block".into(),
            });
        }
        let uncond = self.codes_prompt(&request.caption, &request.lyrics, "<think>\n</think>")?;
        // Upstream: 5 codes a second plus 500, the duration clamped to 10..600 s.
        let budget = ((request.duration_seconds.clamp(10.0, 600.0) * 5.0) as usize + 500).min(METADATA_TOKENS);
        let phase = Phase::codes(&self.tables, Some(target), self.prompt.eos());
        let mut constraint = MetadataConstraint::for_phase(&self.tables, &phase);
        self.decode(&prompt, uncond, budget, &mut constraint, sampler, cancel, &mut |tokens| {
            progress(PlanProgress::Codes { tokens, of: target })
        })
    }

    fn messages<'a>(&self, user: &'a str) -> [(&'static str, &'a str); 2] {
        static SYSTEM: std::sync::LazyLock<String> =
            std::sync::LazyLock::new(|| format!("# Instruction\n{GENERATE_INSTRUCTION}\n\n"));
        [("system", SYSTEM.as_str()), ("user", user)]
    }

    /// `build_formatted_prompt_with_cot`: the think block as the assistant's message, no
    /// generation prompt, a newline at the end.
    fn codes_prompt(&self, caption: &str, lyrics: &str, cot: &str) -> Result<Vec<u32>> {
        let user = format!("# Caption\n{caption}\n\n# Lyric\n{lyrics}\n");
        let [system, user] = self.messages(&user);
        let mut text = self.prompt.chat(&[system, user, ("assistant", cot)], false)?;
        if !text.ends_with('\n') {
            text.push('\n');
        }
        self.prompt.encode(&text)
    }

    /// One phase's decoding, guided where the scale is above 1.
    #[allow(clippy::too_many_arguments)]
    fn decode(
        &self,
        prompt: &[u32],
        uncond: Vec<u32>,
        budget: usize,
        constraint: &mut MetadataConstraint,
        sampler: &mut Sampler,
        cancel: &Cancel,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Decoded> {
        let decoder = self.prompt.decoder(budget);
        let steps = || LmSteps::new(&self.lm, budget);
        let scale = self.settings.cfg_scale;
        match scale > 1.0 {
            true => {
                let mut guided = Guided::new(steps(), steps(), uncond, scale)?;
                decoder.run(&mut guided, constraint, sampler, prompt, cancel, progress)
            }
            false => decoder.run(&mut steps(), constraint, sampler, prompt, cancel, progress),
        }
    }

    /// The code a token stands for (`<|audio_code_N|>`), as upstream's parser reads it.
    fn code_of(&self, id: u32) -> Option<u32> {
        let digits = self.tables.text(id).strip_prefix("<|audio_code_")?.strip_suffix("|>")?;
        digits.parse().ok().filter(|&c| c < AUDIO_CODES)
    }
}

/// The metadata phase's fields, as `parse_lm_output` reads them (genres never written).
#[derive(Debug, Clone, Default, PartialEq)]
struct Metadata {
    bpm: Option<String>,
    caption: Option<String>,
    duration: Option<String>,
    keyscale: Option<String>,
    language: Option<String>,
    timesignature: Option<String>,
}

impl Metadata {
    /// `_format_metadata_as_cot`: a time signature "N/4" as "N", digit-only values as
    /// integers.
    fn cot(&self) -> String {
        let mut items = Vec::new();
        let fields = [
            ("bpm", &self.bpm),
            ("caption", &self.caption),
            ("duration", &self.duration),
            ("keyscale", &self.keyscale),
            ("language", &self.language),
            ("timesignature", &self.timesignature),
        ];
        for (name, value) in fields {
            let Some(value) = value else { continue };
            let value = match name == "timesignature" && value.ends_with("/4") {
                true => value.split('/').next().unwrap_or(value),
                false => value.as_str(),
            };
            items.push((name, value));
        }
        format_cot(&items)
    }
}

/// The user's values as upstream's phase 2 takes them when it skips phase 1.
fn given_metadata(given: &GivenText) -> Metadata {
    Metadata {
        bpm: given.bpm.clone(),
        duration: given.duration.clone(),
        keyscale: given.keyscale.clone(),
        timesignature: given.timesignature.clone(),
        ..Metadata::default()
    }
}

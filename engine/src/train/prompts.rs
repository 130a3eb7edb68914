//! The prompts a run's previews are made from, the user's own: caption, lyrics, tempo,
//! key, time signature, length, seed, steps and guidance, other runs' adapters mixed in
//! over the one training (each at its strength), `[trigger]` in a caption or
//! lyrics standing for the run's trigger word. What a prompt leaves out is the run's
//! preview default (its preview caption or first song's, `preview_seconds`, its preview
//! seed) or the model's (steps, guidance).

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::data::TriggerTag;
use crate::error::SettingErrors;
use crate::generate::song::MAX_SECONDS;
use crate::generate::{GenerateSpec, MixedAdapter};
use crate::Error;

/// What a prompt writes for the run's trigger word.
pub const TRIGGER_PLACEHOLDER: &str = "[trigger]";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PreviewPrompt {
    /// Empty: the run's preview caption (or its first song's).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub caption: String,
    /// Empty: instrumental.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub lyrics: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bpm: Option<u32>,
    /// "F# minor".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keyscale: Option<String>,
    /// "3/4", "6/8", or ACE-Step's numerator ("3").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timesignature: Option<String>,
    /// None: the run's `preview_seconds`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// None: the run's preview seed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// None: the model's (8 turbo, 32 base/SFT).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<usize>,
    /// None: the model's (7 on base/SFT; turbo takes none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guidance: Option<f64>,
    /// Other adapter folders (another run's) mixed in over the run's own, each at its strength.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub more_adapters: Vec<MixedAdapter>,
}

/// What a prompt falls back on: the run's.
#[derive(Debug, Clone)]
pub struct PromptDefaults<'a> {
    pub caption: &'a str,
    pub seconds: f64,
    pub seed: u64,
    pub trigger: Option<&'a TriggerTag>,
}

impl PreviewPrompt {
    /// The song this prompt asks for, with the run's defaults and trigger word in place.
    /// `Err((field, why))` names the prompt's field that is wrong.
    pub fn spec(&self, run: &PromptDefaults) -> std::result::Result<GenerateSpec, (String, String)> {
        fn named(field: &'static str) -> impl Fn(String) -> (String, String) {
            move |why| (field.to_string(), why)
        }
        let caption = if self.caption.trim().is_empty() { run.caption } else { self.caption.as_str() };
        let spec = GenerateSpec {
            caption: with_trigger(caption, run.trigger).map_err(named("caption"))?,
            lyrics: with_trigger(&self.lyrics, run.trigger).map_err(named("lyrics"))?,
            bpm: self.bpm,
            keyscale: self.keyscale.clone(),
            timesignature: self.timesignature.clone(),
            duration_seconds: self.seconds.unwrap_or(run.seconds),
            seed: self.seed.unwrap_or(run.seed),
            steps: self.steps,
            guidance: self.guidance,
            more_adapters: self.more_adapters.clone(),
            ..GenerateSpec::default()
        };
        if let Some((i, m)) = self.more_adapters.iter().enumerate().find(|(_, m)| !m.path.is_dir()) {
            let why = format!("{} is not a folder (an adapter folder to mix in)", m.path.display());
            return Err((format!("more_adapters[{i}].path"), why));
        }
        if !(spec.duration_seconds > 0.0 && spec.duration_seconds <= MAX_SECONDS) {
            let why = format!("{} must be more than 0 and at most {MAX_SECONDS}", spec.duration_seconds);
            return Err(named("seconds")(why));
        }
        if let Some(g) = self.guidance.filter(|g| !(g.is_finite() && *g >= 1.0)) {
            return Err(named("guidance")(format!("{g} must be at least 1 (1 is no guidance)")));
        }
        match spec.validate() {
            Ok(()) => Ok(spec),
            // Its fields are named as the prompt's are (steps, bpm, keyscale, ...).
            Err(Error::Setting { field, reason }) => Err((field, reason)),
            Err(other) => Err(("prompt".into(), other.to_string())),
        }
    }
}

/// Checks every prompt of `prompts[i]` against the run, each error named
/// `preview_prompts[i].<field>`.
pub fn check_prompts(prompts: &[PreviewPrompt], run: &PromptDefaults, e: &mut SettingErrors) {
    for (i, prompt) in prompts.iter().enumerate() {
        if let Err((field, why)) = prompt.spec(run) {
            e.check(false, &format!("preview_prompts[{i}].{field}"), || why);
        }
    }
}

/// `text` with `[trigger]` replaced by the run's trigger word; an error when it asks
/// for one and the run has none.
fn with_trigger(text: &str, trigger: Option<&TriggerTag>) -> std::result::Result<String, String> {
    if !text.contains(TRIGGER_PLACEHOLDER) {
        return Ok(text.to_string());
    }
    match trigger.map(|t| t.tag.trim()).filter(|t| !t.is_empty()) {
        Some(tag) => Ok(text.replace(TRIGGER_PLACEHOLDER, tag)),
        None => {
            Err(format!("uses {TRIGGER_PLACEHOLDER}, but the run has no trigger word (set one, or write the words)"))
        }
    }
}

/// `caption=lofi [trigger]; bpm=90; keyscale=A minor; seconds=20; adapter=../calm/final/adapter@0.5`:
/// the fields named as in run.toml, `;` between them, `\n` in lyrics a new line, `adapter`
/// (a folder, `@strength` or 1) once for each adapter mixed in. What the CLI takes.
impl FromStr for PreviewPrompt {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let mut p = PreviewPrompt::default();
        for item in text.split(';').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) =
                item.split_once('=').ok_or_else(|| format!("`{item}` is not field=value (e.g. bpm=90)"))?;
            let (key, value) = (key.trim(), value.trim());
            let number = |what: &str| format!("{key}: `{value}` is not {what}");
            match key {
                "caption" => p.caption = value.to_string(),
                "lyrics" => p.lyrics = value.replace("\\n", "\n"),
                "bpm" => p.bpm = Some(value.parse().map_err(|_| number("a whole number of beats per minute"))?),
                "keyscale" | "key" => p.keyscale = Some(value.to_string()),
                "timesignature" | "time_signature" => p.timesignature = Some(value.to_string()),
                "seconds" => p.seconds = Some(value.parse().map_err(|_| number("a number of seconds"))?),
                "seed" => p.seed = Some(value.parse().map_err(|_| number("a whole number"))?),
                "steps" => p.steps = Some(value.parse().map_err(|_| number("a whole number"))?),
                "guidance" => p.guidance = Some(value.parse().map_err(|_| number("a number"))?),
                "adapter" => {
                    let (path, scale) = match value.rsplit_once('@') {
                        Some((path, scale)) => (path, scale.parse().map_err(|_| number("folder@strength"))?),
                        None => (value, 1.0),
                    };
                    p.more_adapters.push(MixedAdapter { path: path.into(), scale });
                }
                other => {
                    return Err(format!(
                        "`{other}` is not a prompt field (caption, lyrics, bpm, keyscale, timesignature, seconds, seed, steps, guidance, adapter)"
                    ))
                }
            }
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests;

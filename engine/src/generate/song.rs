//! Text to music with a model source: the caption and lyrics go through the model's
//! conditioner as ACE-Step conditions a song to generate (Qwen3 + condition encoder for
//! a model folder, the hashed embeddings of the demo), the sampler makes latents, the
//! source's decoder makes audio.

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::plan::PlanSettings;
use super::sampler::{self, Conditions, Guidance};
use crate::cancel::Cancel;
use crate::codec::audio_hints::AudioDetokenizer;
use crate::codec::condition::{hinted_context_latents, Task};
use crate::codec::{Conditioner, Conditioning, LatentDecoder, SongMeta, StereoAudio, INSTRUMENTAL};
use crate::data::labels::Field;
use crate::device::Precision;
use crate::load::source::ModelSource;
use crate::lora::{AdapterMix, LoraAdapter, LoraMode, PartStrengths};
use crate::model::timesteps::TimestepSampling;
use crate::model::{DitModel, LinearAdapter};
use crate::{Error, Result};

/// ACE-Step's longest song (its `DURATION_MAX`), seconds.
pub const MAX_SECONDS: f64 = 600.0;
/// ACE-Step's defaults: turbo 8 steps, base/SFT 32 steps with guidance 7; shift 3.
pub const TURBO_STEPS: usize = 8;
pub const BASE_STEPS: usize = 32;
pub const BASE_GUIDANCE: f64 = 7.0;
pub const DEFAULT_SHIFT: f64 = 3.0;
/// The most sampling steps a song may ask for: ACE-Step 1.5's own ceiling (its UI: "Turbo:
/// max 8, Base: max 200"). Past it a song takes hours on a CPU and sounds no better.
pub const MAX_STEPS: usize = 200;
/// The strongest adapter scale: 0 is the base model, 1 the adapter as trained, up to 4
/// exaggerates it. Negative scales (the adapter subtracted) are not offered, and far
/// past 4 the DiT's activations overflow into NaN.
pub const MAX_ADAPTER_SCALE: f64 = 4.0;

/// One song to make.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateSpec {
    pub caption: String,
    /// Empty: instrumental.
    pub lyrics: String,
    /// The vocal language of the lyrics (e.g. `en`); None: ACE-Step's `unknown`.
    #[serde(default)]
    pub language: Option<String>,
    /// Tempo, key ("F# minor") and time signature ("3" is 3/4, "6" is 6/8) for the DiT's
    /// prompt, as ACE-Step's metadata takes them; None: N/A there, as ACE-Step leaves
    /// a field the user did not give.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpm: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyscale: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timesignature: Option<String>,
    pub duration_seconds: f64,
    pub seed: u64,
    /// Default: 8 (turbo) or 32 (base/SFT).
    pub steps: Option<usize>,
    /// Default: 3.
    pub shift: Option<f64>,
    /// Classifier-free guidance scale; base/SFT only (default 7 there); 1 turns it off.
    pub guidance: Option<f64>,
    /// A PEFT adapter directory.
    pub adapter: Option<PathBuf>,
    /// The adapter's strength: 0 is the base model exactly, 1 the adapter as trained.
    pub adapter_scale: f64,
    /// More adapter folders, each at its own strength: their changes are added to
    /// `adapter`'s (or to a run's own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_adapters: Vec<MixedAdapter>,
    /// A strength per part of each layer, on top of every adapter's own.
    #[serde(default, skip_serializing_if = "PartStrengths::is_whole")]
    pub parts: PartStrengths,
    /// Plan the song with ACE-Step's 5 Hz LM first (its metadata and audio codes, as
    /// text2music's "thinking"); None: the DiT hears the caption alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lm: Option<PlanSettings>,
    /// 5 Hz audio codes to condition on (upstream's audio code string, a 5 Hz LM's
    /// plan), each below the model's codebook size: the DiT gets their 25 Hz hints
    /// instead of the silence latent, as upstream's cover of a plan. Empty: the silence
    /// context, as text2music.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audio_codes: Vec<u32>,
}

/// An adapter folder mixed into a song at its own strength.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixedAdapter {
    pub path: PathBuf,
    pub scale: f64,
}

impl Default for GenerateSpec {
    fn default() -> Self {
        Self {
            caption: String::new(),
            lyrics: String::new(),
            language: None,
            bpm: None,
            keyscale: None,
            timesignature: None,
            duration_seconds: 30.0,
            seed: 0,
            steps: None,
            shift: None,
            guidance: None,
            adapter: None,
            adapter_scale: 1.0,
            more_adapters: Vec::new(),
            parts: PartStrengths::default(),
            lm: None,
            audio_codes: Vec::new(),
        }
    }
}

impl GenerateSpec {
    /// The settings' ranges that need no model (duration, guidance and shift are
    /// judged with it), each error named by its field.
    pub fn validate(&self) -> Result<()> {
        if let Some(steps) = self.steps.filter(|s| !(1..=MAX_STEPS).contains(s)) {
            return Err(Error::setting("steps", format!("{steps} is out of range: it must be 1 to {MAX_STEPS}")));
        }
        self.song_meta()?;
        check_scale("adapter_scale", self.adapter_scale)?;
        for (i, mixed) in self.more_adapters.iter().enumerate() {
            check_scale(&format!("more_adapters[{i}].scale"), mixed.scale)?;
        }
        self.parts.check().map_err(|why| Error::setting("parts", why))?;
        self.lm.as_ref().map_or(Ok(()), PlanSettings::validate)
    }

    /// The spec with adapter folders `paths` at `scales`: one scale for each, in the
    /// same order, or a single one for all, or none (all at 1). The first is `adapter`,
    /// the rest `more_adapters`.
    pub fn with_adapters(self, paths: Vec<PathBuf>, scales: &[f64]) -> Result<Self> {
        let count = paths.len();
        let scale_of = |i: usize| match scales {
            [] => Ok(1.0),
            [all] => Ok(*all),
            each if each.len() == count => Ok(each[i]),
            each => Err(Error::setting(
                "adapter_scale",
                format!(
                    "{} scales for {} adapters: give one for each, in the same order, or one for all",
                    each.len(),
                    count
                ),
            )),
        };
        let mixed: Vec<MixedAdapter> = paths
            .into_iter()
            .enumerate()
            .map(|(i, path)| Ok(MixedAdapter { path, scale: scale_of(i)? }))
            .collect::<Result<_>>()?;
        let mut mixed = mixed.into_iter();
        Ok(match mixed.next() {
            Some(first) => {
                Self { adapter: Some(first.path), adapter_scale: first.scale, more_adapters: mixed.collect(), ..self }
            }
            None => self,
        })
    }

    /// ACE-Step's text2music request: the caption, the lyrics ("[Instrumental]" when
    /// there are none, as its UI fills in), the duration, and the metadata given, in
    /// the form ACE-Step writes it (each checked, an error named by its field).
    pub fn song_meta(&self) -> Result<SongMeta> {
        let label = |field: Field, value: Option<String>| {
            value.map_or(Ok(None), |v| field.parse(&v).map_err(|why| Error::setting(field.name(), why)))
        };
        label(Field::Bpm, self.bpm.map(|b| b.to_string()))?;
        Ok(SongMeta {
            caption: self.caption.clone(),
            lyrics: if self.lyrics.trim().is_empty() { INSTRUMENTAL.into() } else { self.lyrics.clone() },
            language: self.language.clone(),
            bpm: self.bpm,
            keyscale: label(Field::Keyscale, self.keyscale.clone())?,
            timesignature: label(Field::Timesignature, self.timesignature.clone())?,
            genre: None,
            duration_seconds: self.duration_seconds,
        })
    }

    /// The adapters' strengths as a message shows them.
    fn scales(&self) -> String {
        let parts = if self.parts.is_whole() { String::new() } else { format!(", parts {}", self.parts) };
        if self.more_adapters.is_empty() {
            return format!("the adapter at scale {}{parts}", self.adapter_scale);
        }
        let more = self.more_adapters.iter().map(|m| format!(", {}", m.scale)).collect::<String>();
        format!("the adapters at scales {}{more}{parts}", self.adapter_scale)
    }
}

/// An adapter strength in range, or an error naming `field`.
fn check_scale(field: &str, scale: f64) -> Result<()> {
    if !(0.0..=MAX_ADAPTER_SCALE).contains(&scale) {
        let range = format!("0 (the base model) to {MAX_ADAPTER_SCALE} (1 is the adapter as trained)");
        return Err(Error::setting(field, format!("{scale} is out of range: it must be {range}")));
    }
    Ok(())
}

/// The adapter folder at `dir` (PEFT's, or upstream's LoKr file), checked against
/// `dit` (shapes and targets).
fn load_adapter_folder(dir: &Path, dit: &DitModel) -> Result<LoraAdapter> {
    if !LoraAdapter::is_adapter_dir(dir) {
        return Err(Error::Adapter {
            path: dir.to_path_buf(),
            reason: "not an adapter folder: neither adapter_config.json nor lokr_weights.safetensors is there".into(),
        });
    }
    LoraAdapter::load(dir, dit)
}

/// What a front end shows of a generation (`{"type": "...", ...}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum GenerateEvent {
    /// The song is not planned by the 5 Hz LM, and why.
    Unplanned {
        reason: String,
    },
    /// The 5 Hz LM is writing its plan: the phase (`metadata`, `codes`) and its tokens so far.
    Planning {
        phase: String,
        tokens: usize,
    },
    /// The plan: the metadata the DiT will hear and the audio codes written.
    Planned {
        caption: String,
        bpm: Option<u32>,
        keyscale: Option<String>,
        timesignature: Option<String>,
        language: Option<String>,
        codes: usize,
    },
    Started {
        frames: usize,
        steps: usize,
        shift: f64,
        guidance: Option<f64>,
        seed: u64,
    },
    Step {
        step: usize,
        steps: usize,
    },
    Decoding {
        frames: usize,
    },
    Written {
        path: PathBuf,
        seconds: f64,
        sample_rate: u32,
    },
}

/// A loaded model ready to make songs: the DiT (one copy of its weights), the
/// conditioner, the decoder and the unconditional embedding.
pub struct Generator {
    dit: DitModel,
    conditioner: Box<dyn Conditioner>,
    decoder: Box<dyn LatentDecoder>,
    turbo: bool,
    /// `[1, 1, E]`: the checkpoint's `null_condition_emb`, or why the model has none.
    null_condition: std::result::Result<Tensor, String>,
    /// The checkpoint's detokenizer (audio codes to hints), or why the model has none.
    detokenizer: std::result::Result<AudioDetokenizer, String>,
}

impl Generator {
    /// Loads the DiT, conditioner and decoder of `source` on the CPU in f32.
    pub fn load(source: &ModelSource) -> Result<Self> {
        let device = Device::Cpu;
        let loaded = source.load(Precision::F32, &device)?;
        Ok(Self {
            dit: loaded.dit,
            conditioner: loaded.conditioner,
            decoder: source.latent_decoder(&device)?,
            turbo: matches!(loaded.default_timesteps, TimestepSampling::Turbo { .. }),
            null_condition: loaded.null_condition,
            detokenizer: source.detokenizer(&device)?,
        })
    }

    /// Its parts, borrowed for sampling and decoding.
    fn parts(&self) -> SongModel<'_> {
        SongModel {
            dit: &self.dit,
            conditioner: self.conditioner.as_ref(),
            decoder: self.decoder.as_ref(),
            turbo: self.turbo,
            null_condition: &self.null_condition,
            detokenizer: &self.detokenizer,
        }
    }

    /// Latent frames for a duration: ceil(seconds * frames per second), as diffusers.
    pub fn frames_for(&self, seconds: f64) -> Result<usize> {
        self.parts().frames_for(seconds)
    }

    /// What the DiT is conditioned on for `spec`: text2music, or over its audio codes'
    /// hints.
    pub fn condition(&self, spec: &GenerateSpec) -> Result<Conditioning> {
        spec.validate()?;
        let parts = self.parts();
        parts.condition(spec, parts.frames_for(spec.duration_seconds)?)
    }

    /// Makes the clean latents `[T, C]` for `spec` (with its adapter folder, if any),
    /// reporting progress through `on_event`.
    pub fn latents(&self, spec: &GenerateSpec, on_event: &mut dyn FnMut(GenerateEvent)) -> Result<Tensor> {
        let adapter = spec.adapter.as_deref().map(|dir| load_adapter_folder(dir, &self.dit)).transpose()?;
        self.parts().latents(spec, adapter.as_ref(), &Cancel::never(), on_event)
    }

    /// Decodes latents `[T, C]` to audio.
    pub fn decode(&self, latents: &Tensor, on_event: &mut dyn FnMut(GenerateEvent)) -> Result<StereoAudio> {
        self.parts().decode(latents, on_event)
    }
}

/// What sampling and decoding need, borrowed: a `Generator`'s own parts, or a
/// training run's already-loaded model and adapter (its previews load no second copy
/// of the DiT).
pub struct SongModel<'a> {
    pub dit: &'a DitModel,
    pub conditioner: &'a dyn Conditioner,
    pub decoder: &'a dyn LatentDecoder,
    /// Turbo models sample 8 steps without guidance.
    pub turbo: bool,
    /// `[1, 1, E]`: the checkpoint's `null_condition_emb`, or why the model has none.
    pub null_condition: &'a std::result::Result<Tensor, String>,
    /// What turns `GenerateSpec::audio_codes` into hints, or why the model has none.
    pub detokenizer: &'a std::result::Result<AudioDetokenizer, String>,
}

impl SongModel<'_> {
    /// Latent frames for a duration: ceil(seconds * frames per second), as diffusers.
    pub fn frames_for(&self, seconds: f64) -> Result<usize> {
        if !(seconds > 0.0 && seconds <= MAX_SECONDS) {
            return Err(Error::BadRequest(format!(
                "duration {seconds} s is out of range: it must be more than 0 and at most {MAX_SECONDS} s"
            )));
        }
        Ok((seconds * self.decoder.frames_per_second()).ceil() as usize)
    }

    /// Guidance for `spec`, or None (turbo, or a scale of 1).
    fn guidance(&self, spec: &GenerateSpec) -> Result<Option<Guidance>> {
        let scale = match (self.turbo, spec.guidance) {
            (true, Some(g)) if g != 1.0 => {
                let why = "this is a turbo model, which has guidance distilled into it (use a base or SFT model)";
                return Err(Error::BadRequest(format!("guidance {g}: {why}")));
            }
            (true, _) => return Ok(None),
            (false, g) => g.unwrap_or(BASE_GUIDANCE),
        };
        if !(scale.is_finite() && scale >= 1.0) {
            return Err(Error::BadRequest(format!("guidance {scale} must be at least 1")));
        }
        if scale == 1.0 {
            return Ok(None);
        }
        let null_condition = self.null_condition.clone().map_err(|why| {
            Error::BadRequest(format!(
                "guidance needs the model's unconditional embedding (base and SFT checkpoints carry it): {why}"
            ))
        })?;
        Ok(Some(Guidance { scale, null_condition, interval: (0.0, 1.0) }))
    }

    /// `spec`'s condition over `frames`: text2music, or with audio codes upstream's
    /// cover of them (the cover instruction, their hints as the context's source).
    fn condition(&self, spec: &GenerateSpec, frames: usize) -> Result<Conditioning> {
        let meta = spec.song_meta()?;
        if spec.audio_codes.is_empty() {
            return self.conditioner.generation_condition(&meta, Task::Text2Music, frames);
        }
        let detokenizer = self.detokenizer.as_ref().map_err(|why| {
            Error::BadRequest(format!("audio_codes: this model cannot turn a plan into hints: {why}"))
        })?;
        let hints = detokenizer.hints(&spec.audio_codes)?;
        let c = self.conditioner.generation_condition(&meta, Task::Cover, frames)?;
        let context_latents = hinted_context_latents(&hints, &c.context_latents)?;
        Ok(Conditioning { context_latents, ..c })
    }

    /// Makes the clean latents `[T, C]` (f32) for `spec` with `adapter` at
    /// `spec.adapter_scale` (`spec.adapter`, a folder, is the `Generator`'s to load) and
    /// `spec.more_adapters` (loaded here). A cancel between sampling steps ends it with
    /// `Error::Cancelled`.
    pub fn latents(
        &self,
        spec: &GenerateSpec,
        adapter: Option<&LoraAdapter>,
        cancel: &Cancel,
        on_event: &mut dyn FnMut(GenerateEvent),
    ) -> Result<Tensor> {
        spec.validate()?;
        if spec.lm.is_some() {
            return Err(Error::BadRequest(
                "the song asks for a 5 Hz LM plan: plan it first (generate::planned::plan_song)".into(),
            ));
        }
        let frames = self.frames_for(spec.duration_seconds)?;
        let steps = spec.steps.unwrap_or(if self.turbo { TURBO_STEPS } else { BASE_STEPS });
        let shift = spec.shift.unwrap_or(DEFAULT_SHIFT);
        let schedule = sampler::timesteps(steps, shift)?;
        let guidance = self.guidance(spec)?;

        let c = self.condition(spec, frames)?;
        let cond = Conditions {
            context_latents: c.context_latents.unsqueeze(0)?,
            encoder_hidden_states: c.encoder_hidden_states.unsqueeze(0)?,
        };
        on_event(GenerateEvent::Started {
            frames,
            steps,
            shift,
            guidance: guidance.as_ref().map(|g| g.scale),
            seed: spec.seed,
        });
        let noise = sampler::noise(spec.seed, frames, self.dit.config().audio_acoustic_hidden_dim, self.dit.device())?;
        // Strength 0 leaves an adapter out: with none left, the base model exactly.
        let more: Vec<(LoraAdapter, f64)> = spec
            .more_adapters
            .iter()
            .filter(|m| m.scale != 0.0)
            .map(|m| Ok((load_adapter_folder(&m.path, self.dit)?, m.scale)))
            .collect::<Result<_>>()?;
        let scaled = adapter.map(|a| (a, spec.adapter_scale)).into_iter().chain(more.iter().map(|(a, s)| (a, *s)));
        let mix = AdapterMix::new(
            scaled
                .filter(|(_, scale)| *scale != 0.0)
                .map(|(a, scale)| a.ctx(LoraMode::Eval, false).with_strength(scale).with_parts(spec.parts))
                .collect(),
        );
        let x0 = sampler::sample(
            self.dit,
            mix.as_ref().map(|m| m as &dyn LinearAdapter),
            &noise,
            &cond,
            &schedule,
            guidance.as_ref(),
            |k, _| {
                cancel.check()?;
                on_event(GenerateEvent::Step { step: k + 1, steps });
                Ok(())
            },
        )
        .map_err(|e| match e {
            Error::NonFinite { what, problem } if mix.is_some() => {
                Error::NonFinite { what: format!("{what} ({})", spec.scales()), problem }
            }
            e => e,
        })?;
        Ok(x0.squeeze(0)?)
    }

    /// Decodes latents `[T, C]` to audio.
    pub fn decode(&self, latents: &Tensor, on_event: &mut dyn FnMut(GenerateEvent)) -> Result<StereoAudio> {
        on_event(GenerateEvent::Decoding { frames: latents.dim(0)? });
        decode_latents(self.decoder, latents)
    }
}

/// `latents` `[T, C]` decoded to audio, both sides checked: NaN or infinity in the
/// latents or in the decoder's output is an error saying which, never a song of NaN.
pub fn decode_latents(decoder: &dyn LatentDecoder, latents: &Tensor) -> Result<StereoAudio> {
    crate::finite::ensure_tensor(latents, || "the latents to decode".into())?;
    let audio = decoder.decode(latents)?;
    crate::finite::ensure_audio(&audio.left, &audio.right, || "the decoder's audio".into())?;
    Ok(audio)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(spec: &GenerateSpec) -> Option<String> {
        match spec.validate() {
            Ok(()) => None,
            Err(Error::Setting { field, .. }) => Some(field),
            Err(e) => panic!("not a setting error: {e}"),
        }
    }

    #[test]
    fn steps_and_adapter_scale_have_ranges_named_by_their_fields() {
        let spec =
            |steps: Option<usize>, adapter_scale: f64| GenerateSpec { steps, adapter_scale, ..Default::default() };
        for ok in [spec(None, 1.0), spec(Some(1), 0.0), spec(Some(MAX_STEPS), MAX_ADAPTER_SCALE)] {
            assert_eq!(field_of(&ok), None, "{ok:?}");
        }
        for steps in [0, MAX_STEPS + 1, 100_000] {
            assert_eq!(field_of(&spec(Some(steps), 1.0)).as_deref(), Some("steps"), "{steps}");
        }
        for scale in [-0.5, MAX_ADAPTER_SCALE + 0.01, 1e30, f64::NAN, f64::INFINITY] {
            assert_eq!(field_of(&spec(None, scale)).as_deref(), Some("adapter_scale"), "{scale}");
        }
        let err = spec(Some(100_000), 1.0).validate().unwrap_err().to_string();
        assert_eq!(err, "setting `steps`: 100000 is out of range: it must be 1 to 200");
    }

    #[test]
    fn metadata_reaches_the_prompt_as_acestep_writes_it_and_bad_values_name_their_field() {
        let spec = GenerateSpec {
            bpm: Some(120),
            keyscale: Some("f# Minor".into()),
            timesignature: Some("6/8".into()),
            ..Default::default()
        };
        let meta = spec.song_meta().unwrap();
        assert_eq!(
            (meta.bpm, meta.keyscale.as_deref(), meta.timesignature.as_deref()),
            (Some(120), Some("F# minor"), Some("6"))
        );
        assert_eq!(meta.lyrics, INSTRUMENTAL);
        for (bad, field) in [
            (GenerateSpec { bpm: Some(301), ..Default::default() }, "bpm"),
            (GenerateSpec { keyscale: Some("H major".into()), ..Default::default() }, "keyscale"),
            (GenerateSpec { timesignature: Some("5/4".into()), ..Default::default() }, "timesignature"),
        ] {
            assert_eq!(field_of(&bad).as_deref(), Some(field), "{bad:?}");
        }
    }
}

//! An ACE-Step 1.5 checkpoint folder as downloaded:
//!
//! ```text
//! <root>/acestep-v15-turbo/{config.json, model.safetensors, silence_latent.pt}   (or -base, -sft, ...)
//! <root>/acestep-v15-xl-turbo/{..., model.safetensors.index.json, model-0000N-of-0000M.safetensors}
//! <root>/vae/{config.json, diffusion_pytorch_model.safetensors}
//! <root>/Qwen3-Embedding-0.6B/{config.json, model.safetensors, tokenizer.json, tokenizer_config.json}
//! ```
//!
//! given by path (the root, or its DiT folder), or found in the Hugging Face cache
//! (`models--<org>--<name>/snapshots/<rev>/`). `open` validates every file and names
//! each one missing or malformed. The variant (turbo vs base/sft) sets the default
//! timestep sampling.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use super::kind::{Flavor, ModelKind};
use super::layout::{dit_dirs, not_a_model_reason, resolve_root};
use crate::codec::audio_codes::{AudioCodesConfig, AudioTokenizer};
use crate::codec::audio_hints::{AudioDetokenizer, DETOKENIZER_PREFIX};
use crate::codec::condition::{
    context_latents, lyrics_prompt, task_prompt, text_prompt, Conditioner, Conditioning, Task,
};
use crate::codec::condition_encoder::{ConditionEncoder, ConditionEncoderConfig};
use crate::codec::qwen3::{Qwen3Config, Qwen3Encoder};
use crate::codec::tokenizer::{Padding, TextTokenizer};
use crate::codec::vae::{file_identity, OobleckEncoder, VaeConfig, VaeLatentEncoder, VAE_WEIGHTS};
use crate::codec::{SongMeta, INSTRUMENTAL};
use crate::model::timesteps::TimestepSampling;
use crate::model::weights::{expected_shapes, match_header, DecoderWeights};
use crate::model::DitConfig;
use crate::tensor_io::shards::weights_in;
use crate::tensor_io::torch_pt::read_pt;
use crate::tensor_io::TensorFile;
use crate::{Error, Result};

pub use super::layout::{hf_cache_dir, hf_snapshot, models_in, DIT_PREFIX, TEXT_DIR, VAE_DIR};

pub const DEFAULT_DIT: &str = "acestep-v15-turbo";
/// The unconditional embedding of guidance and CFG dropout, top-level in model.safetensors.
pub const NULL_CONDITION_KEY: &str = "null_condition_emb";
/// The DiT folder's weights file (or, sharded, its index's name less `.index.json`).
pub const DIT_WEIGHTS: &str = "model.safetensors";
/// ACE-Step's text and lyric token lengths: training pads to them, generation cuts
/// at them (lyrics at the longer `GENERATION_LYRIC_TOKENS`).
pub const TEXT_TOKENS: usize = 256;
pub const LYRIC_TOKENS: usize = 512;
pub const GENERATION_LYRIC_TOKENS: usize = 2048;
/// Generation's timbre reference without reference audio: the silence latent's first
/// 30 s (ACE-Step's `silence_latent[:, :750, :]`).
pub const TIMBRE_REFERENCE_FRAMES: usize = 750;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Turbo,
    /// base or sft: trained with logit-normal timesteps.
    Base,
}

impl Variant {
    pub fn default_timestep_sampling(self) -> TimestepSampling {
        match self {
            Variant::Turbo => TimestepSampling::Turbo { shift: 3.0 },
            Variant::Base => TimestepSampling::LogitNormal { mu: -0.4, sigma: 1.0, shift: 1.0 },
        }
    }

    /// Base and SFT were trained with CFG dropout 0.15 (ACE-Step's corrected trainer
    /// keeps it); turbo is distilled without guidance.
    pub fn default_cfg_dropout(self) -> f64 {
        match self {
            Variant::Turbo => 0.0,
            Variant::Base => 0.15,
        }
    }

    /// Turbo's defaults for turbo, base's for the rest.
    fn of(flavor: Flavor) -> Self {
        match flavor {
            Flavor::Turbo => Variant::Turbo,
            Flavor::Base | Flavor::Sft | Flavor::Unknown => Variant::Base,
        }
    }
}

pub struct ModelFolder {
    pub root: PathBuf,
    pub dit_dir: PathBuf,
    /// 2B or XL, turbo, base or SFT, as config.json says.
    pub kind: ModelKind,
    pub dit: DitConfig,
    pub encoder: ConditionEncoderConfig,
    /// The audio tokenizer (`tokenizer.*`: latents to 5 Hz codes), at the encoder's sizes.
    pub audio_codes: AudioCodesConfig,
    pub vae: VaeConfig,
    pub text: Qwen3Config,
}

fn read_json(path: &Path, problems: &mut Vec<String>) -> Option<Value> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            problems.push(format!("{}: {e}", path.display()));
            return None;
        }
    };
    match serde_json::from_str(&text) {
        Ok(v) => Some(v),
        Err(e) => {
            problems.push(format!("{}: invalid JSON: {e}", path.display()));
            None
        }
    }
}

/// Records the file's problem; `Some` when it opened.
fn check_safetensors(path: &Path, required: &[&str], problems: &mut Vec<String>) -> Option<TensorFile> {
    match TensorFile::open(path, &Device::Cpu) {
        Ok(f) => {
            let missing: Vec<&str> = required.iter().copied().filter(|k| !f.contains(k)).collect();
            if !missing.is_empty() {
                problems.push(format!("{}: missing tensors {}", path.display(), missing.join(", ")));
            }
            Some(f)
        }
        Err(e) => {
            problems.push(e.to_string());
            None
        }
    }
}

impl ModelFolder {
    /// Opens and validates the folder at `path` (see `resolve_root`); `dit` picks a DiT
    /// folder by name (default: acestep-v15-turbo, else the only `acestep-v15-*`).
    pub fn open(path: &Path, dit: Option<&str>) -> Result<Self> {
        let fail = |problems: Vec<String>| Error::ModelFolder { path: path.to_path_buf(), problems };
        let (root, given_dit) = resolve_root(path).ok_or_else(|| fail(vec![not_a_model_reason(path)]))?;
        let dit_dir = choose_dit_dir(&root, dit, given_dit);
        let mut problems = Vec::new();
        let (vae_dir, text_dir) = (root.join(VAE_DIR), root.join(TEXT_DIR));
        for d in [&dit_dir, &vae_dir, &text_dir] {
            if !d.is_dir() {
                problems.push(format!("{}: folder missing", d.display()));
            }
        }
        let dit_part = read_dit_part(&dit_dir, &mut problems);
        let vae_cfg = VaeConfig::from_file(&vae_dir.join("config.json")).map_err(|e| problems.push(e.to_string())).ok();
        check_safetensors(&vae_dir.join(VAE_WEIGHTS), &["encoder.conv1.bias"], &mut problems);
        let text_cfg = read_text_part(&text_dir, &mut problems);
        dit_part.cross_check(vae_cfg.as_ref(), text_cfg.as_ref(), &mut problems);

        let DitPart { json, dit, encoder, audio_codes, .. } = dit_part;
        match (problems.is_empty(), json, dit, encoder.zip(audio_codes), vae_cfg, text_cfg) {
            (true, Some(json), Some(dit), Some((encoder, audio_codes)), Some(vae), Some(text)) => {
                let kind = ModelKind::of_config(&json, &dit_dir);
                Ok(Self { kind, root, dit_dir, dit, encoder, audio_codes, vae, text })
            }
            _ => Err(fail(problems)),
        }
    }

    /// Finds the model in the Hugging Face cache (`hf_cache_dir()` unless given).
    pub fn find_in_hf_cache(cache: Option<&Path>) -> Result<Self> {
        let cache = cache.map(Path::to_path_buf).or_else(hf_cache_dir).unwrap_or_default();
        Self::open(&cache, None)
    }

    /// `model.safetensors`, or the index of its shards (XL's repositories ship four).
    pub fn dit_weights(&self) -> PathBuf {
        weights_in(&self.dit_dir, DIT_WEIGHTS)
    }

    pub fn dit_config_path(&self) -> PathBuf {
        self.dit_dir.join("config.json")
    }

    /// The DiT's weights in `dtype`; a tensor that does not fit names config.json too.
    pub fn load_decoder(&self, dtype: DType, device: &Device) -> Result<DecoderWeights> {
        DecoderWeights::load(&[&self.dit_weights()], &self.dit, dtype, device).map_err(|e| match e {
            Error::Weights { path, problems, .. } => {
                Error::Weights { path, config: Some(self.dit_config_path()), problems }
            }
            e => e,
        })
    }

    /// Reads every weight file's header and checks each tensor the DiT, the condition
    /// encoder, the VAE encoder and Qwen3 use against their config.json, loading none:
    /// the number of tensors checked, or every problem found, by file.
    pub fn check_weights(&self) -> Result<usize> {
        let mut checked = 0;
        let mut problems = Vec::new();
        let mut report = |path: &Path, config: &Path, found: Vec<String>| {
            problems.extend(found.into_iter().map(|p| format!("{}: {p} (per {})", path.display(), config.display())));
        };
        // DiT: the header against the shapes its config implies.
        let dit = TensorFile::open_for_check(&self.dit_weights())?;
        let header: Vec<(String, Vec<usize>)> =
            dit.keys().into_iter().filter_map(|k| Some((k.clone(), dit.shape(&k)?))).collect();
        report(&self.dit_weights(), &self.dit_config_path(), match_header(&header, &self.dit).1);
        checked += expected_shapes(&self.dit).len();
        // The other modules: their own loaders over header-only files.
        ConditionEncoder::load(&self.encoder, &dit, "encoder")?;
        let vae = TensorFile::open_for_check(&self.vae_dir().join(VAE_WEIGHTS))?;
        OobleckEncoder::load(&self.vae, &vae)?;
        let text = TensorFile::open_for_check(&self.text_dir().join("model.safetensors"))?;
        Qwen3Encoder::load(&self.text, &text)?;
        let configs = [self.dit_config_path(), self.vae_dir().join("config.json"), self.text_dir().join("config.json")];
        for (file, config) in [(&dit, &configs[0]), (&vae, &configs[1]), (&text, &configs[2])] {
            let (lookups, found) = file.checked();
            checked += lookups;
            report(file.path(), config, found);
        }
        if problems.is_empty() {
            Ok(checked)
        } else {
            Err(Error::ModelFolder { path: self.root.clone(), problems })
        }
    }

    pub fn vae_dir(&self) -> PathBuf {
        self.root.join(VAE_DIR)
    }

    pub fn text_dir(&self) -> PathBuf {
        self.root.join(TEXT_DIR)
    }

    /// Turbo's training defaults, or base's (base, SFT and the unknown).
    pub fn variant(&self) -> Variant {
        Variant::of(self.kind.flavor)
    }

    pub fn default_timestep_sampling(&self) -> TimestepSampling {
        self.variant().default_timestep_sampling()
    }

    /// The checkpoint's top-level `null_condition_emb` `[1, 1, E]` (f32), or why there
    /// is none, naming the file.
    pub fn null_condition(&self, device: &Device) -> Result<std::result::Result<Tensor, String>> {
        let path = self.dit_weights();
        let file = TensorFile::open(&path, device)?;
        if !file.contains(NULL_CONDITION_KEY) {
            return Ok(Err(format!("{} has no `{NULL_CONDITION_KEY}`", path.display())));
        }
        Ok(Ok(file.get(NULL_CONDITION_KEY, &[1, 1, self.dit.encoder_hidden_size])?))
    }

    /// `[frames, C]`, transposed from the file's `[1, C, frames]` as ACE-Step does.
    pub fn silence_latent(&self) -> Result<Tensor> {
        read_silence(&self.dit_dir.join("silence_latent.pt"))
    }

    /// The audio tokenizer of the DiT's checkpoint (latents to 5 Hz codes).
    pub fn audio_tokenizer(&self, device: &Device) -> Result<AudioTokenizer> {
        let file = TensorFile::open(&self.dit_weights(), device)?;
        AudioTokenizer::load(&self.audio_codes, &self.encoder, &file, "tokenizer")
    }

    /// The detokenizer of the DiT's checkpoint (5 Hz codes to 25 Hz hints), or why the
    /// checkpoint has none, naming the file; misshaped weights are an error.
    pub fn audio_detokenizer(&self, device: &Device) -> Result<std::result::Result<AudioDetokenizer, String>> {
        let path = self.dit_weights();
        let file = TensorFile::open(&path, device)?;
        if !file.keys().iter().any(|k| k.starts_with(&format!("{DETOKENIZER_PREFIX}."))) {
            return Ok(Err(format!("{} has no `{DETOKENIZER_PREFIX}.*` weights", path.display())));
        }
        Ok(Ok(AudioDetokenizer::load(&self.audio_codes, &self.encoder, &file)?))
    }

    pub fn latent_encoder(&self, device: &Device) -> Result<VaeLatentEncoder> {
        VaeLatentEncoder::from_dir(&self.vae_dir(), device)
    }

    pub fn conditioner(&self, device: &Device) -> Result<RealConditioner> {
        RealConditioner::load(self, device)
    }
}

/// The DiT folder to use: the one asked for, the one `open` was given, else the
/// default variant's when present, else the first.
fn choose_dit_dir(root: &Path, asked: Option<&str>, given: Option<PathBuf>) -> PathBuf {
    match (asked, given) {
        (Some(name), _) => root.join(name),
        (None, Some(d)) => d,
        (None, None) => {
            let all: Vec<PathBuf> = dit_dirs(root).collect();
            all.iter()
                .find(|d| d.ends_with(DEFAULT_DIT))
                .or(all.first())
                .cloned()
                .unwrap_or_else(|| root.join(DEFAULT_DIT))
        }
    }
}

/// What the DiT folder holds, each part `None` where it could not be read (the reason
/// is in the problems).
struct DitPart {
    json: Option<Value>,
    dit: Option<DitConfig>,
    encoder: Option<ConditionEncoderConfig>,
    audio_codes: Option<AudioCodesConfig>,
    silence: Option<Tensor>,
}

/// The DiT folder: its config (the DiT's and the condition encoder's), its weights'
/// header and the silence latent.
fn read_dit_part(dit_dir: &Path, problems: &mut Vec<String>) -> DitPart {
    let config_path = dit_dir.join("config.json");
    let json = read_json(&config_path, problems);
    let dit = json.as_ref().and_then(|v| {
        DitConfig::from_value(v).map_err(|e| problems.push(format!("{}: {e}", config_path.display()))).ok()
    });
    let encoder = match (&json, &dit) {
        (Some(v), Some(d)) => ConditionEncoderConfig::from_value(v, d)
            .map_err(|e| problems.push(format!("{}: {e}", config_path.display())))
            .ok(),
        _ => None,
    };
    let audio_codes = match (&json, &dit, &encoder) {
        (Some(v), Some(d), Some(e)) => AudioCodesConfig::from_value(v, d, e)
            .map_err(|err| problems.push(format!("{}: {err}", config_path.display())))
            .ok(),
        _ => None,
    };
    check_safetensors(
        &weights_in(dit_dir, DIT_WEIGHTS),
        &["decoder.proj_in.1.weight", "encoder.text_projector.weight"],
        problems,
    );
    let silence = read_silence(&dit_dir.join("silence_latent.pt")).map_err(|e| problems.push(e.to_string())).ok();
    DitPart { json, dit, encoder, audio_codes, silence }
}

/// The text encoder's config, after checking its weights and tokenizer.
fn read_text_part(text_dir: &Path, problems: &mut Vec<String>) -> Option<Qwen3Config> {
    let config = Qwen3Config::from_file(&text_dir.join("config.json")).map_err(|e| problems.push(e.to_string())).ok();
    if let Some(f) = check_safetensors(&text_dir.join("model.safetensors"), &[], problems) {
        if !f.contains("embed_tokens.weight") && !f.contains("model.embed_tokens.weight") {
            problems.push(format!("{}: missing tensors embed_tokens.weight", f.path().display()));
        }
    }
    if let Err(e) = TextTokenizer::from_dir(text_dir, TEXT_TOKENS, Padding::ToLimit) {
        problems.push(e.to_string());
    }
    config
}

impl DitPart {
    /// The parts must fit each other: latent channels, text width, silence latent.
    fn cross_check(&self, vae: Option<&VaeConfig>, text: Option<&Qwen3Config>, problems: &mut Vec<String>) {
        if let (Some(d), Some(v)) = (&self.dit, vae) {
            if v.latent_channels() != d.audio_acoustic_hidden_dim {
                problems.push(format!(
                    "the VAE gives {} latent channels, the DiT takes {}",
                    v.latent_channels(),
                    d.audio_acoustic_hidden_dim
                ));
            }
        }
        if let (Some(e), Some(t)) = (&self.encoder, text) {
            if e.text_hidden_dim != t.hidden_size {
                problems.push(format!(
                    "text_hidden_dim {} but the text encoder's hidden_size is {}",
                    e.text_hidden_dim, t.hidden_size
                ));
            }
        }
        if let (Some(d), Some(s)) = (&self.dit, &self.silence) {
            if s.dim(1).ok() != Some(d.audio_acoustic_hidden_dim) {
                problems.push(format!(
                    "silence_latent.pt has shape {:?}, expected [frames, {}]",
                    s.dims(),
                    d.audio_acoustic_hidden_dim
                ));
            }
        }
    }
}

/// `silence_latent.pt`: a tensor `[1, C, F]` -> `[F, C]`.
pub fn read_silence(path: &Path) -> Result<Tensor> {
    let v = read_pt(path)?;
    let t = v
        .as_tensor()
        .ok_or_else(|| Error::BadFile { path: path.to_path_buf(), reason: "expected a single tensor".into() })?;
    match t.dims() {
        [1, _, _] => Ok(t.squeeze(0)?.t()?.contiguous()?),
        d => Err(Error::BadFile {
            path: path.to_path_buf(),
            reason: format!("silence latent has shape {d:?}, expected [1, channels, frames]"),
        }),
    }
}

/// ACE-Step's conditioning: Qwen3 text states + lyric token embeddings through the
/// condition encoder, and context latents from the silence latent.
pub struct RealConditioner {
    qwen: Qwen3Encoder,
    /// Training: padded to 256 / 512 tokens.
    text_tokens: TextTokenizer,
    lyric_tokens: TextTokenizer,
    /// Generation: cut at 256 / 2048 tokens, not padded.
    generation_text_tokens: TextTokenizer,
    generation_lyric_tokens: TextTokenizer,
    encoder: ConditionEncoder,
    /// `[F, C]`
    silence: Tensor,
    id: String,
}

impl RealConditioner {
    pub fn load(folder: &ModelFolder, device: &Device) -> Result<Self> {
        let text_dir = folder.text_dir();
        let qwen_file = TensorFile::open(&text_dir.join("model.safetensors"), device)?;
        let dit_file = TensorFile::open(&folder.dit_weights(), device)?;
        let config = folder.dit_dir.join("config.json");
        let silence = folder.dit_dir.join("silence_latent.pt");
        let text_files = ["model.safetensors", "tokenizer.json", "tokenizer_config.json"].map(|f| text_dir.join(f));
        let identified: Vec<&Path> = std::iter::once(config.as_path())
            .chain(dit_file.file_paths().iter().map(PathBuf::as_path))
            .chain([silence.as_path()])
            .chain(text_files.iter().map(PathBuf::as_path))
            .collect();
        let id = file_identity(&identified)?;
        let tokenizer = |max_len, padding| TextTokenizer::from_dir(&text_dir, max_len, padding);
        Ok(Self {
            qwen: Qwen3Encoder::load(&folder.text, &qwen_file)?,
            text_tokens: tokenizer(TEXT_TOKENS, Padding::ToLimit)?,
            lyric_tokens: tokenizer(LYRIC_TOKENS, Padding::ToLimit)?,
            generation_text_tokens: tokenizer(TEXT_TOKENS, Padding::None)?,
            generation_lyric_tokens: tokenizer(GENERATION_LYRIC_TOKENS, Padding::None)?,
            encoder: ConditionEncoder::load(&folder.encoder, &dit_file, "encoder")?,
            silence: folder.silence_latent()?.to_dtype(DType::F32)?.to_device(device)?,
            id: format!("acestep-cond:{id}:text{TEXT_TOKENS}:lyrics{LYRIC_TOKENS}"),
        })
    }

    /// Text and lyrics through Qwen3 and the condition encoder with `timbre_reference`,
    /// then context latents of `num_frames`.
    fn encode(
        &self,
        (text_tokens, text): (&TextTokenizer, &str),
        (lyric_tokens, lyrics): (&TextTokenizer, &str),
        timbre_reference: &Tensor,
        num_frames: usize,
    ) -> Result<Conditioning> {
        // 1. Text: the prompt through the whole Qwen3 stack, no attention mask.
        let text = text_tokens.encode(text)?;
        let text_states = self.qwen.forward(&text.ids)?;
        // 2. Lyrics: token embeddings only.
        let lyric = lyric_tokens.encode(lyrics)?;
        let lyric_embeds = self.qwen.embed(&lyric.ids)?;
        // 3. Condition encoder and packing.
        let packed = self.encoder.forward(&text_states, &text.mask, &lyric_embeds, &lyric.mask, timbre_reference)?;
        let mask: Vec<f32> = packed.mask.iter().map(|&m| if m { 1.0 } else { 0.0 }).collect();
        let cpu = Device::Cpu;
        Ok(Conditioning {
            encoder_hidden_states: packed.states.to_device(&cpu)?,
            encoder_attention_mask: Tensor::from_vec(mask, packed.mask.len(), &cpu)?,
            context_latents: context_latents(&self.silence.to_device(&cpu)?, num_frames)?,
        })
    }
}

impl Conditioner for RealConditioner {
    fn id(&self) -> String {
        self.id.clone()
    }

    /// ACE-Step's preprocessing: text padded to 256 tokens, the bare lyrics padded to
    /// 512, a zero timbre reference of one frame.
    fn condition(&self, meta: &SongMeta, num_frames: usize) -> Result<Conditioning> {
        let lyrics = if meta.lyrics.trim().is_empty() { INSTRUMENTAL } else { meta.lyrics.as_str() };
        let zero_reference = Tensor::zeros((1, self.silence.dim(1)?), DType::F32, self.silence.device())?;
        self.encode((&self.text_tokens, &text_prompt(meta)), (&self.lyric_tokens, lyrics), &zero_reference, num_frames)
    }

    /// ACE-Step's text2music inference (its handler and diffusers' `AceStepPipeline`):
    /// text cut at 256 tokens, the lyrics in their `# Languages / # Lyric` prompt cut
    /// at 2048, neither padded; the timbre reference is the silence latent's first
    /// 750 frames.
    fn generation_condition(&self, meta: &SongMeta, task: Task, num_frames: usize) -> Result<Conditioning> {
        let frames = self.silence.dim(0)?.min(TIMBRE_REFERENCE_FRAMES);
        let reference = self.silence.narrow(0, 0, frames)?;
        self.encode(
            (&self.generation_text_tokens, &task_prompt(meta, task)),
            (&self.generation_lyric_tokens, &lyrics_prompt(meta)),
            &reference,
            num_frames,
        )
    }
}

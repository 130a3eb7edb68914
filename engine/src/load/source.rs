//! Where a run's model comes from, and everything that comes with it: the DiT, the
//! latent encoder and conditioner that turn songs into samples, the model's default
//! timestep sampling, its null condition with the default CFG dropout, and what turns a
//! song into the 5 Hz codes ACE-Step's LM reads.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::demo;
use super::folder::{ModelFolder, LYRIC_TOKENS, TEXT_TOKENS};
use super::kind::ModelKind;
use crate::codec::audio_codes::{AudioCodesConfig, AudioTokenizer};
use crate::codec::audio_hints::AudioDetokenizer;
use crate::codec::condition_encoder::ConditionEncoderConfig;
use crate::codec::encode::silence_latent;
use crate::codec::vae::VAE_WEIGHTS;
use crate::codec::{Conditioner, HashConditioner, LatentEncoder, MelEncoder};
use crate::codec::{LatentDecoder, MelDecoder, VaeDecoder};
use crate::device::Precision;
use crate::model::timesteps::TimestepSampling;
use crate::model::{DecoderWeights, DitConfig, DitModel};
use crate::tensor_io::{RandomTensors, TensorFile};
use crate::Result;

/// Why the demo model takes no audio codes.
pub const NO_DEMO_PLAN: &str =
    "the built-in demo model cannot take a plan (5 Hz audio codes): it has no audio detokenizer; use an ACE-Step model folder";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelSource {
    /// The built-in demo model (no download).
    #[default]
    Demo,
    /// An ACE-Step 1.5 checkpoint folder.
    Folder { path: PathBuf },
}

pub struct LoadedModel {
    pub dit: DitModel,
    pub encoder: Box<dyn LatentEncoder>,
    pub conditioner: Box<dyn Conditioner>,
    pub default_timesteps: TimestepSampling,
    /// `[1, 1, E]` f32, the unconditional embedding, or why the model has none.
    pub null_condition: std::result::Result<Tensor, String>,
    /// The share of samples trained on the null condition when the config names none.
    pub default_cfg_dropout: f64,
    /// Parameters of the base model (DiT only).
    pub parameters: u64,
}

/// What a run's memory depends on, read from the model's configs and weight headers
/// without loading any weights.
#[derive(Debug, Clone)]
pub struct ModelShape {
    pub dit: DitConfig,
    /// Latent frames a second of audio becomes.
    pub frames_per_second: f64,
    /// Rows of the condition sequence at most (text + lyrics + the timbre reference).
    pub encoder_len: usize,
    /// What the run holds besides the DiT to encode songs and captions (VAE encoder,
    /// text encoder, condition encoder), in f32 as they are loaded.
    pub encoders_bytes: u64,
}

/// What turns a song into 5 Hz codes: its latent encoder, the DiT checkpoint's audio
/// tokenizer, and the silence latent that completes a last part window.
pub struct SongTokenizer {
    pub encoder: Box<dyn LatentEncoder>,
    pub tokenizer: AudioTokenizer,
    /// `[frames, C]`
    pub silence: Tensor,
}

/// The latent encoder, the conditioner and the model's default timestep sampling.
pub type SongEncoders = (Box<dyn LatentEncoder>, Box<dyn Conditioner>, TimestepSampling);

/// Text and lyric token budgets of the demo conditioner: short, so the small DiT is quick.
const DEMO_TEXT_TOKENS: usize = 32;
const DEMO_LYRIC_TOKENS: usize = 32;

impl ModelSource {
    /// The decoder that turns this model's latents into audio: a model folder's VAE,
    /// or the demo model's weight-free mel decoder.
    pub fn latent_decoder(&self, device: &Device) -> Result<Box<dyn LatentDecoder>> {
        Ok(match self {
            ModelSource::Demo => Box::new(MelDecoder::new()),
            ModelSource::Folder { path } => {
                Box::new(VaeDecoder::from_dir(&ModelFolder::open(path, None)?.vae_dir(), device)?)
            }
        })
    }

    /// The DiT's config and weights only (export, merge).
    pub fn load_decoder(&self, dtype: DType, device: &Device) -> Result<(DitConfig, DecoderWeights)> {
        match self {
            ModelSource::Demo => Ok((demo::demo_config(), demo::demo_weights(dtype, device)?)),
            ModelSource::Folder { path } => {
                let folder = ModelFolder::open(path, None)?;
                let weights = folder.load_decoder(dtype, device)?;
                Ok((folder.dit, weights))
            }
        }
    }

    /// 2B or XL, turbo, base or SFT, as a folder's config.json says; none for the demo
    /// model, which is none of ACE-Step's.
    pub fn kind(&self) -> Result<Option<ModelKind>> {
        Ok(match self {
            ModelSource::Demo => None,
            ModelSource::Folder { path } => Some(ModelFolder::open(path, None)?.kind),
        })
    }

    /// The model's shape for the memory estimate (see [`ModelShape`]).
    pub fn shape(&self) -> Result<ModelShape> {
        Ok(match self {
            ModelSource::Demo => ModelShape {
                dit: demo::demo_config(),
                frames_per_second: MelEncoder::new().frames_per_second(),
                encoder_len: DEMO_TEXT_TOKENS + DEMO_LYRIC_TOKENS + 1,
                encoders_bytes: 0,
            },
            ModelSource::Folder { path } => {
                let folder = ModelFolder::open(path, None)?;
                let elements = |file: &std::path::Path, keep: &dyn Fn(&str) -> bool| -> Result<u64> {
                    let f = TensorFile::open(file, &Device::Cpu)?;
                    Ok(f.keys()
                        .iter()
                        .filter(|k| keep(k))
                        .filter_map(|k| f.shape(k))
                        .map(|s| s.iter().product::<usize>() as u64)
                        .sum())
                };
                let encoders = elements(&folder.vae_dir().join(VAE_WEIGHTS), &|_| true)?
                    + elements(&folder.text_dir().join("model.safetensors"), &|_| true)?
                    + elements(&folder.dit_weights(), &|k| !k.starts_with("decoder."))?;
                ModelShape {
                    frames_per_second: folder.vae.sampling_rate as f64 / folder.vae.hop() as f64,
                    encoder_len: TEXT_TOKENS + LYRIC_TOKENS + 1,
                    encoders_bytes: encoders * 4,
                    dit: folder.dit,
                }
            }
        })
    }

    /// What turns songs into samples: the latent encoder, the conditioner, and the
    /// model's default timestep sampling.
    pub fn encoders(&self, device: &Device) -> Result<SongEncoders> {
        Ok(match self {
            ModelSource::Demo => {
                let encoder = MelEncoder::new();
                let conditioner = HashConditioner::for_encoder(demo::demo_config().encoder_hidden_size, &encoder)?
                    .with_max_tokens(DEMO_TEXT_TOKENS, DEMO_LYRIC_TOKENS);
                (Box::new(encoder), Box::new(conditioner), TimestepSampling::Turbo { shift: 3.0 })
            }
            ModelSource::Folder { path } => {
                let folder = ModelFolder::open(path, None)?;
                (
                    Box::new(folder.latent_encoder(device)?),
                    Box::new(folder.conditioner(device)?),
                    folder.default_timestep_sampling(),
                )
            }
        })
    }

    /// What turns a song into the 5 Hz codes ACE-Step's LM reads: a folder's VAE and
    /// audio tokenizer; for the demo model its mel encoder and a seeded random
    /// tokenizer at its encoder's width (upstream's shape, two pooler layers).
    pub fn song_tokenizer(&self, device: &Device) -> Result<SongTokenizer> {
        Ok(match self {
            ModelSource::Demo => {
                let dit = demo::demo_config();
                let sizes = serde_json::json!({
                    "num_lyric_encoder_hidden_layers": 2,
                    "num_timbre_encoder_hidden_layers": 2,
                    "num_attention_pooler_hidden_layers": 2,
                });
                let encoder_cfg = ConditionEncoderConfig::from_value(&sizes, &dit)?;
                let codes_cfg = AudioCodesConfig::from_value(&sizes, &dit, &encoder_cfg)?;
                let weights = RandomTensors { seed: demo::DEMO_SEED, device: device.clone() };
                let tokenizer = AudioTokenizer::load(&codes_cfg, &encoder_cfg, &weights, "tokenizer")?;
                let encoder = MelEncoder::new();
                let silence = silence_latent(&encoder, codes_cfg.pool_window)?;
                SongTokenizer { encoder: Box::new(encoder), tokenizer, silence }
            }
            ModelSource::Folder { path } => {
                let folder = ModelFolder::open(path, None)?;
                SongTokenizer {
                    encoder: Box::new(folder.latent_encoder(device)?),
                    tokenizer: folder.audio_tokenizer(device)?,
                    silence: folder.silence_latent()?,
                }
            }
        })
    }

    /// What turns a 5 Hz plan (audio codes) into the hints a song is conditioned on:
    /// a folder's detokenizer, or why there is none (the demo model has none).
    pub fn detokenizer(&self, device: &Device) -> Result<std::result::Result<AudioDetokenizer, String>> {
        match self {
            ModelSource::Demo => Ok(Err(NO_DEMO_PLAN.into())),
            ModelSource::Folder { path } => ModelFolder::open(path, None)?.audio_detokenizer(device),
        }
    }

    /// The null condition embedding (or why there is none) and the default CFG
    /// dropout: the variant's for a folder, 0 for the turbo-like demo.
    pub fn guidance(&self, device: &Device) -> Result<(std::result::Result<Tensor, String>, f64)> {
        Ok(match self {
            ModelSource::Demo => (Ok(demo::demo_null_condition(device)?), 0.0),
            ModelSource::Folder { path } => {
                let folder = ModelFolder::open(path, None)?;
                (folder.null_condition(device)?, folder.variant().default_cfg_dropout())
            }
        })
    }

    /// Everything a run needs, the DiT's weights held and computed as `precision` says.
    pub fn load(&self, precision: Precision, device: &Device) -> Result<LoadedModel> {
        let (cfg, weights) = self.load_decoder(precision.weights_dtype(device), device)?;
        let parameters = weights.iter().map(|(_, t)| t.elem_count() as u64).sum();
        let dit = DitModel::new(&cfg, &weights)?.computing_in(precision.dtype(device))?;
        let (encoder, conditioner, default_timesteps) = self.encoders(device)?;
        let (null_condition, default_cfg_dropout) = self.guidance(device)?;
        Ok(LoadedModel {
            dit,
            encoder,
            conditioner,
            default_timesteps,
            null_condition,
            default_cfg_dropout,
            parameters,
        })
    }
}

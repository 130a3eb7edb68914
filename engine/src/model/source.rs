//! Where a run's model comes from, and everything that comes with it: the DiT, the
//! latent encoder and conditioner that turn songs into samples, and the model's
//! default timestep sampling.

use std::path::PathBuf;

use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};

use super::demo;
use super::DitModel;
use crate::data::{Conditioner, HashConditioner, LatentEncoder, MelEncoder};
use crate::train::schedule::TimestepSampling;
use crate::{Error, Result};

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
    /// Parameters of the base model (DiT only).
    pub parameters: u64,
}

/// Text and lyric token budgets of the demo conditioner: short, so the small DiT is quick.
const DEMO_TEXT_TOKENS: usize = 32;
const DEMO_LYRIC_TOKENS: usize = 32;

impl ModelSource {
    pub fn load(&self, dtype: DType, device: &Device) -> Result<LoadedModel> {
        match self {
            ModelSource::Demo => {
                let cfg = demo::demo_config();
                let weights = demo::demo_weights(dtype, device)?;
                let parameters = weights.iter().map(|(_, t)| t.elem_count() as u64).sum();
                let encoder = MelEncoder::new();
                let conditioner = HashConditioner::for_encoder(cfg.encoder_hidden_size, &encoder)?
                    .with_max_tokens(DEMO_TEXT_TOKENS, DEMO_LYRIC_TOKENS);
                Ok(LoadedModel {
                    dit: DitModel::new(&cfg, &weights)?,
                    encoder: Box::new(encoder),
                    conditioner: Box::new(conditioner),
                    default_timesteps: TimestepSampling::Turbo { shift: 3.0 },
                    parameters,
                })
            }
            ModelSource::Folder { path } => Err(Error::BadFile {
                path: path.clone(),
                reason: "ACE-Step model folders are not supported by this build yet".into(),
            }),
        }
    }
}

//! Latents back to audio. A model folder decodes with its VAE (`vae/`), the built-in
//! demo model with the weight-free mel decoder; both sit behind [`LatentDecoder`].

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::mel::MelDecoder;
use crate::data::StereoAudio;
use crate::model::folder::ModelFolder;
use crate::model::source::ModelSource;
use crate::model::tensors::TensorFile;
use crate::model::vae::{OobleckDecoder, VaeConfig, TILE_FRAMES};
use crate::{Error, Result};

pub trait LatentDecoder: Send + Sync {
    /// The audio rate it writes (48 kHz for ACE-Step).
    fn sample_rate(&self) -> u32;
    /// Latent frames per second (25 for ACE-Step).
    fn frames_per_second(&self) -> f64;
    /// Latent channels (64 for ACE-Step).
    fn latent_channels(&self) -> usize;
    /// `latents [T, C]` -> stereo audio of T * hop samples per channel, unclipped.
    fn decode(&self, latents: &Tensor) -> Result<StereoAudio>;
}

/// The VAE decoder of a model folder, decoding long songs in chunks.
pub struct VaeDecoder {
    decoder: OobleckDecoder,
    chunk_frames: usize,
}

impl VaeDecoder {
    /// Loads `dir/config.json` and `dir/diffusion_pytorch_model.safetensors`.
    pub fn from_dir(dir: &Path, device: &Device) -> Result<Self> {
        let cfg = VaeConfig::from_file(&dir.join("config.json"))?;
        let f = TensorFile::open(&dir.join("diffusion_pytorch_model.safetensors"), device)?;
        Ok(Self { decoder: OobleckDecoder::load(&cfg, &f)?, chunk_frames: TILE_FRAMES })
    }

    pub fn decoder(&self) -> &OobleckDecoder {
        &self.decoder
    }
}

impl LatentDecoder for VaeDecoder {
    fn sample_rate(&self) -> u32 {
        self.decoder.config().sampling_rate
    }

    fn frames_per_second(&self) -> f64 {
        self.sample_rate() as f64 / self.decoder.config().hop() as f64
    }

    fn latent_channels(&self) -> usize {
        self.decoder.config().latent_channels()
    }

    fn decode(&self, latents: &Tensor) -> Result<StereoAudio> {
        let audio = self.decoder.decode(latents, self.chunk_frames)?.to_device(&Device::Cpu)?;
        Ok(StereoAudio {
            sample_rate: self.sample_rate(),
            left: audio.get(0)?.to_vec1()?,
            right: audio.get(1)?.to_vec1()?,
        })
    }
}

/// The decoder that belongs to a model source.
pub fn decoder_for(source: &ModelSource, device: &Device) -> Result<Box<dyn LatentDecoder>> {
    Ok(match source {
        ModelSource::Demo => Box::new(MelDecoder::new()),
        ModelSource::Folder { path } => {
            Box::new(VaeDecoder::from_dir(&ModelFolder::open(path, None)?.vae_dir(), device)?)
        }
    })
}

/// The latents `[T, C]` in a safetensors file: its `latents` tensor (what `generate
/// --latents-out` writes) or `target_latents` (a preprocessed sample).
pub fn read_latents(path: &Path, channels: usize) -> Result<Tensor> {
    let bad = |reason: String| Error::BadFile { path: path.to_path_buf(), reason };
    let tensors =
        candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| bad(format!("cannot read safetensors: {e}")))?;
    let (key, t) = ["latents", "target_latents"]
        .iter()
        .find_map(|k| tensors.get(*k).map(|t| (*k, t)))
        .ok_or_else(|| bad("no `latents` or `target_latents` tensor".into()))?;
    match t.dims() {
        &[frames, c] if c == channels && frames > 0 => Ok(t.to_dtype(DType::F32)?),
        d => Err(bad(format!("`{key}` has shape {d:?}, expected [frames, {channels}]"))),
    }
}

/// Writes latents `[T, C]` as a safetensors file with one `latents` tensor, atomically.
pub fn write_latents(path: &Path, latents: &Tensor) -> Result<()> {
    let t = latents.to_dtype(DType::F32)?.to_device(&Device::Cpu)?.contiguous()?;
    let bytes = safetensors::serialize([("latents", &t)], None).map_err(|e| Error::BadFile {
        path: path.to_path_buf(),
        reason: format!("cannot serialise the latents: {e}"),
    })?;
    super::wav::write_atomically(path, &bytes)
}

//! Latents back to audio. A model folder decodes with its VAE (`vae/`), the built-in
//! demo model with the weight-free mel decoder; both sit behind [`LatentDecoder`].

use std::path::Path;

use candle_core::{Device, Tensor};

use super::vae::{OobleckDecoder, VaeConfig, TILE_FRAMES};
use super::StereoAudio;
use crate::tensor_io::TensorFile;
use crate::Result;

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

//! diffusers' `AutoencoderOobleck` (ACE-Step's VAE), inference only.
//!
//! Encoder: 48 kHz stereo `[2, N]` -> posterior mean and scale `[T, C]` each, T = N / hop.
//! conv1 (k7) -> blocks [3 residual units (dilation 1, 3, 9) -> Snake -> strided
//! conv (k = 2s, stride s, pad ceil(s/2))] -> Snake -> conv2 (k3) -> split into
//! mean and scale.
//!
//! Decoder: latents `[T, C]` -> stereo `[2, T * hop]`, not bounded to [-1, 1].
//! conv1 (k7) -> blocks [Snake -> transposed conv (k = 2s, stride s, pad ceil(s/2)) ->
//! 3 residual units] over the ratios reversed -> Snake -> conv2 (k7, no bias).
//!
//! Convolutions are weight-normalised in the checkpoint (`weight_g`, `weight_v`); the
//! weight g * v / |v| is folded once at load.
//!
//! Where the kernel policy runs the CPU kernels (f32 on the CPU) the convolutions, with
//! the Snake before each fused in, run on the direct kernels of
//! [`crate::kernels::conv1d`] (no im2col copies); on Metal and CUDA they stay candle's
//! `conv1d` / `conv_transpose1d` (im2col / col2im) after a separate Snake.
//!
//! Long songs go through either half in chunks of latent frames with enough overlap to
//! cover its receptive field, so a chunked pass equals the whole-song pass up to float
//! rounding while memory stays bounded by the chunk length.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use serde::Deserialize;

use crate::cancel::Cancel;
use crate::codec::encode::LatentEncoder;
use crate::codec::StereoAudio;
use crate::model::KernelPolicy;
use crate::tensor_io::{TensorFile, TensorSource};
use crate::{Error, Result};

mod decoder;
mod layers;

pub use decoder::OobleckDecoder;
use layers::{Conv, Geometry, ResidualUnit, Snake};

/// diffusers' `vae/config.json`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct VaeConfig {
    #[serde(default = "d_hidden")]
    pub encoder_hidden_size: usize,
    #[serde(default = "d_ratios")]
    pub downsampling_ratios: Vec<usize>,
    #[serde(default = "d_multiples")]
    pub channel_multiples: Vec<usize>,
    /// The decoder's base width (times the channel multiples).
    #[serde(default = "d_decoder")]
    pub decoder_channels: usize,
    /// The latent channels (the decoder's input).
    #[serde(default = "d_latent")]
    pub decoder_input_channels: usize,
    #[serde(default = "d_audio")]
    pub audio_channels: usize,
    #[serde(default = "d_rate")]
    pub sampling_rate: u32,
}

fn d_hidden() -> usize {
    128
}
fn d_ratios() -> Vec<usize> {
    vec![2, 4, 4, 8, 8]
}
fn d_multiples() -> Vec<usize> {
    vec![1, 2, 4, 8, 16]
}
fn d_decoder() -> usize {
    128
}
fn d_latent() -> usize {
    64
}
fn d_audio() -> usize {
    2
}
fn d_rate() -> u32 {
    44_100
}

impl VaeConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let cfg: Self = crate::error::read_json(path)?;
        let bad = |reason: String| Err(Error::BadFile { path: path.to_path_buf(), reason });
        if cfg.encoder_hidden_size != 2 * cfg.decoder_input_channels {
            return bad(format!(
                "encoder_hidden_size {} must be twice decoder_input_channels {} (mean and scale)",
                cfg.encoder_hidden_size, cfg.decoder_input_channels
            ));
        }
        if cfg.channel_multiples.len() != cfg.downsampling_ratios.len() || cfg.downsampling_ratios.contains(&0) {
            return bad("channel_multiples and downsampling_ratios must have equal lengths, ratios > 0".into());
        }
        if cfg.audio_channels != 2 {
            return bad(format!("audio_channels is {}, ACE-Step's VAE is stereo", cfg.audio_channels));
        }
        Ok(cfg)
    }

    /// Audio samples per latent frame (1920 for ACE-Step).
    pub fn hop(&self) -> usize {
        self.downsampling_ratios.iter().product()
    }

    pub fn latent_channels(&self) -> usize {
        self.decoder_input_channels
    }

    /// Half-width in samples of the encoder's receptive field (conservative: each conv
    /// adds its whole extent).
    pub fn receptive_field(&self) -> usize {
        let mut j = 1; // samples per step at the current resolution
        let mut r = 6; // conv1, k7
        for &s in &self.downsampling_ratios {
            r += 6 * (1 + 3 + 9) * j; // residual units, k7
            r += (2 * s - 1) * j; // downsampling conv
            j *= s;
        }
        r + 2 * j // conv2, k3
    }

    /// Half-width in latent frames of the decoder's receptive field (conservative, as
    /// the encoder's): how many frames either side of a chunk change its audio.
    pub fn decoder_receptive_field(&self) -> usize {
        let mut frames = 3.0; // conv1, k7 at the latent rate
        let mut rate = 1.0; // samples per latent frame at the current stage
        for &s in self.downsampling_ratios.iter().rev() {
            frames += 2.0 / rate; // transposed conv: two input samples either side
            rate *= s as f64;
            frames += 3.0 * (1 + 3 + 9) as f64 / rate; // residual units, k7 dilated
        }
        (frames + 3.0 / rate).ceil() as usize // conv2, k7
    }
}

struct Block {
    units: [ResidualUnit; 3],
    snake: Snake,
    conv: Conv,
}

impl Block {
    fn forward(&self, k: KernelPolicy, x: &Tensor) -> Result<Tensor> {
        let mut x = x.clone();
        for u in &self.units {
            x = u.forward(k, &x)?;
        }
        self.conv.forward(k, &x, Some(&self.snake))
    }
}

pub struct OobleckEncoder {
    cfg: VaeConfig,
    conv1: Conv,
    blocks: Vec<Block>,
    snake: Snake,
    conv2: Conv,
    kernels: KernelPolicy,
}

/// The posterior's parameters for T frames: `mean`, `scale` `[T, C]`.
pub struct Posterior {
    pub mean: Tensor,
    pub scale: Tensor,
}

impl Posterior {
    /// std = softplus(scale) + 1e-4, as diffusers' `OobleckDiagonalGaussianDistribution`.
    pub fn std(&self) -> Result<Tensor> {
        // softplus(x) = max(x, 0) + ln(1 + e^-|x|), stable for large |x|.
        let s = &self.scale;
        let sp = (s.relu()? + (s.abs()?.neg()?.exp()? + 1.0)?.log()?)?;
        Ok((sp + 1e-4)?)
    }

    /// mean + std * eps with eps ~ N(0, 1) from a ChaCha8 stream of `seed`.
    pub fn sample(&self, seed: u64) -> Result<Tensor> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let eps: Vec<f32> = (0..self.mean.elem_count())
            .map(|_| <StandardNormal as Distribution<f32>>::sample(&StandardNormal, &mut rng))
            .collect();
        let eps = Tensor::from_vec(eps, self.mean.shape(), self.mean.device())?;
        Ok((&self.mean + self.std()?.mul(&eps)?)?)
    }
}

impl OobleckEncoder {
    /// Loads the `encoder.*` tensors of `diffusion_pytorch_model.safetensors`.
    pub fn load(cfg: &VaeConfig, f: &dyn TensorSource) -> Result<Self> {
        let h = cfg.encoder_hidden_size;
        let mut mult = vec![1];
        mult.extend(&cfg.channel_multiples);
        let blocks = cfg
            .downsampling_ratios
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let (cin, cout) = (h * mult[i], h * mult[i + 1]);
                let name = format!("encoder.block.{i}");
                let unit = |j: usize, d: usize| ResidualUnit::load(f, &format!("{name}.res_unit{j}"), cin, d);
                Ok(Block {
                    units: [unit(1, 1)?, unit(2, 3)?, unit(3, 9)?],
                    snake: Snake::load(f, &format!("{name}.snake1"), cin)?,
                    conv: Conv::load(
                        f,
                        &format!("{name}.conv1"),
                        (cin, cout, 2 * s),
                        Geometry { stride: s, dilation: 1, padding: s.div_ceil(2) },
                        true,
                    )?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let d_model = h * mult[mult.len() - 1];
        let conv1 = Conv::load(f, "encoder.conv1", (cfg.audio_channels, h, 7), Geometry::same(7, 1), true)?;
        Ok(Self {
            cfg: cfg.clone(),
            kernels: KernelPolicy::for_device(conv1.w.device()),
            conv1,
            blocks,
            snake: Snake::load(f, "encoder.snake1", d_model)?,
            conv2: Conv::load(f, "encoder.conv2", (d_model, h, 3), Geometry::same(3, 1), true)?,
        })
    }

    pub fn config(&self) -> &VaeConfig {
        &self.cfg
    }

    /// `audio [2, N]` -> `[2C, N / hop]` (mean rows, then scale rows).
    fn forward(&self, audio: &Tensor) -> Result<Tensor> {
        let k = self.kernels;
        let mut x = self.conv1.forward(k, &audio.unsqueeze(0)?, None)?;
        for b in &self.blocks {
            x = b.forward(k, &x)?;
        }
        Ok(self.conv2.forward(k, &x, Some(&self.snake))?.squeeze(0)?)
    }

    /// The posterior of `audio [2, N]`, encoded in chunks of at most `chunk_frames`
    /// latent frames (plus overlap on each side). T = floor(N / hop). `cancel` is
    /// looked at before each chunk; `progress(frames done, T)` after each.
    pub fn encode(
        &self,
        audio: &Tensor,
        chunk_frames: usize,
        cancel: &Cancel,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Posterior> {
        let hop = self.cfg.hop();
        let n = audio.dim(1)?;
        let frames = n / hop;
        let overlap = self.cfg.receptive_field().div_ceil(hop) + 1;
        let c = self.cfg.latent_channels();
        if frames == 0 {
            let empty = Tensor::zeros((0, c), DType::F32, audio.device())?;
            return Ok(Posterior { mean: empty.clone(), scale: empty });
        }
        // Chunk [start, end) is encoded from [lo, hi) frames of audio, aligned to the hop
        // so the strided grid matches the whole song; the last one takes the remainder.
        let mut parts = Vec::new();
        for w in chunk_windows(frames, chunk_frames, overlap) {
            cancel.check()?;
            let hi = if w.hi == frames { n } else { w.hi * hop };
            let z = self.forward(&audio.narrow(1, w.lo * hop, hi - w.lo * hop)?)?;
            parts.push(z.narrow(1, w.start - w.lo, w.end - w.start)?);
            progress(w.end, frames);
        }
        let z = Tensor::cat(&parts, 1)?.t()?.contiguous()?; // (T, 2C)
        Ok(Posterior { mean: z.narrow(1, 0, c)?.contiguous()?, scale: z.narrow(1, c, c)?.contiguous()? })
    }
}

/// Latent frames encoded or decoded in one tile (10 s at 25 Hz), plus the receptive
/// field's overlap on each side; longer songs go tile by tile. At ACE-Step's config
/// the largest activation (128 channels at 48 kHz) is about 1 MB per frame; the CPU
/// kernels keep at most two of them alive (a residual unit's input and its output):
/// (250 + 2 * 15) frames * 2 MB ~ 0.55 GB above the weights, whatever the song's length.
pub const TILE_FRAMES: usize = 250;

/// A chunk `[start, end)` of frames and the window `[lo, hi)` it is computed from:
/// `overlap` frames more on each side, clamped to the song.
struct Window {
    start: usize,
    end: usize,
    lo: usize,
    hi: usize,
}

fn chunk_windows(frames: usize, chunk: usize, overlap: usize) -> Vec<Window> {
    (0..frames)
        .step_by(chunk.max(1))
        .map(|start| {
            let end = (start + chunk.max(1)).min(frames);
            Window { start, end, lo: start.saturating_sub(overlap), hi: (end + overlap).min(frames) }
        })
        .collect()
}

/// Which latent the VAE gives for training.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatentChoice {
    /// The posterior mean: deterministic.
    Mean,
    /// A sample of the posterior from this seed (ACE-Step samples; our stream differs
    /// from torch's, so the draw does too).
    Sample { seed: u64 },
}

/// The VAE encoder as a `LatentEncoder`.
pub struct VaeLatentEncoder {
    encoder: OobleckEncoder,
    choice: LatentChoice,
    chunk_frames: usize,
    /// Hash of the config and weights' identity: enters the cache key.
    weights_id: String,
}

/// The VAE's weights file in its folder (diffusers' name).
pub const VAE_WEIGHTS: &str = "diffusion_pytorch_model.safetensors";

impl VaeLatentEncoder {
    /// Loads `dir/config.json` and `dir/diffusion_pytorch_model.safetensors`.
    pub fn from_dir(dir: &Path, device: &Device) -> Result<Self> {
        let cfg_path = dir.join("config.json");
        let weights = dir.join(VAE_WEIGHTS);
        let cfg = VaeConfig::from_file(&cfg_path)?;
        let f = TensorFile::open(&weights, device)?;
        let encoder = OobleckEncoder::load(&cfg, &f)?;
        let weights_id = file_identity(&[&cfg_path, &weights])?;
        Ok(Self { encoder, choice: LatentChoice::Mean, chunk_frames: TILE_FRAMES, weights_id })
    }

    pub fn with_choice(mut self, choice: LatentChoice) -> Self {
        self.choice = choice;
        self
    }

    /// The encoder running `kernels` instead of its device's.
    pub fn with_kernels(mut self, kernels: KernelPolicy) -> Self {
        self.encoder.kernels = kernels;
        self
    }

    pub fn with_chunk_frames(mut self, frames: usize) -> Self {
        self.chunk_frames = frames.max(1);
        self
    }

    pub fn encoder(&self) -> &OobleckEncoder {
        &self.encoder
    }
}

/// A short hash of the files' sizes and first megabyte (their headers and config):
/// cheap, and different whenever the model is.
pub fn file_identity(paths: &[&Path]) -> Result<String> {
    use std::io::Read;
    let mut h = blake3::Hasher::new();
    for p in paths {
        let mut file = std::fs::File::open(p).map_err(|e| Error::io(*p, e))?;
        let len = file.metadata().map_err(|e| Error::io(*p, e))?.len();
        h.update(&len.to_le_bytes());
        let mut head = Vec::new();
        file.by_ref().take(1 << 20).read_to_end(&mut head).map_err(|e| Error::io(*p, e))?;
        h.update(&head);
    }
    Ok(h.finalize().to_hex()[..16].to_string())
}

impl LatentEncoder for VaeLatentEncoder {
    fn id(&self) -> String {
        let choice = match self.choice {
            LatentChoice::Mean => "mean".to_string(),
            LatentChoice::Sample { seed } => format!("sample{seed}"),
        };
        format!("oobleck-vae:{}:{choice}", self.weights_id)
    }

    fn sample_rate(&self) -> u32 {
        self.encoder.cfg.sampling_rate
    }

    fn frames_per_second(&self) -> f64 {
        self.encoder.cfg.sampling_rate as f64 / self.encoder.cfg.hop() as f64
    }

    fn latent_channels(&self) -> usize {
        self.encoder.cfg.latent_channels()
    }

    fn encode_cancellable(
        &self,
        audio: &StereoAudio,
        cancel: &Cancel,
        progress: &mut dyn FnMut(f64, f64),
    ) -> Result<Tensor> {
        if audio.sample_rate != self.sample_rate() {
            return Err(Error::Encoder(format!(
                "the VAE takes {} Hz audio, got {} Hz",
                self.sample_rate(),
                audio.sample_rate
            )));
        }
        let n = audio.left.len().min(audio.right.len());
        let samples: Vec<f32> = audio.left[..n].iter().chain(&audio.right[..n]).copied().collect();
        let device = self.encoder.conv1.w.device();
        let x = Tensor::from_vec(samples, (2, n), device)?;
        let fps = self.frames_per_second();
        let post = self.encoder.encode(&x, self.chunk_frames, cancel, &mut |done, frames| {
            progress(done as f64 / fps, frames as f64 / fps)
        })?;
        let z = match self.choice {
            LatentChoice::Mean => post.mean,
            LatentChoice::Sample { seed } => post.sample(seed)?,
        };
        Ok(z.to_dtype(DType::F32)?.to_device(&Device::Cpu)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ace_step_vae_hop_and_overlap() {
        let cfg: VaeConfig = serde_json::from_str(
            r#"{"encoder_hidden_size": 128, "downsampling_ratios": [2, 4, 4, 6, 10],
                "channel_multiples": [1, 2, 4, 8, 16], "decoder_input_channels": 64,
                "audio_channels": 2, "sampling_rate": 48000}"#,
        )
        .unwrap();
        assert_eq!(cfg.hop(), 1920);
        // About 14 frames (0.55 s) of context on each side of a chunk.
        let overlap = cfg.receptive_field().div_ceil(cfg.hop()) + 1;
        assert_eq!(overlap, 15);
        // About 11 frames (0.44 s) either side for the decoder.
        assert_eq!(cfg.decoder_receptive_field(), 11);
    }
}

//! The VAE's decoder half: latents `[T, C]` -> stereo `[2, T * hop]` (see the
//! module above for its layout), chunked over long songs.

use candle_core::{DType, Tensor};

use super::layers::{Conv, ConvTranspose, Geometry, ResidualUnit, Snake};
use super::{chunk_windows, VaeConfig};
use crate::model::KernelPolicy;
use crate::tensor_io::TensorSource;
use crate::{Error, Result};

/// One upsampling stage: Snake -> transposed conv -> residual units (dilation 1, 3, 9).
struct UpBlock {
    snake: Snake,
    conv_t: ConvTranspose,
    units: [ResidualUnit; 3],
}

impl UpBlock {
    fn forward(&self, k: KernelPolicy, x: &Tensor) -> Result<Tensor> {
        let mut x = self.conv_t.forward(k, x, &self.snake)?;
        for u in &self.units {
            x = u.forward(k, &x)?;
        }
        Ok(x)
    }
}

pub struct OobleckDecoder {
    cfg: VaeConfig,
    conv1: Conv,
    blocks: Vec<UpBlock>,
    snake: Snake,
    conv2: Conv,
    kernels: KernelPolicy,
}

impl OobleckDecoder {
    /// Loads the `decoder.*` tensors of `diffusion_pytorch_model.safetensors`.
    pub fn load(cfg: &VaeConfig, f: &dyn TensorSource) -> Result<Self> {
        let h = cfg.decoder_channels;
        let mut mult = vec![1];
        mult.extend(&cfg.channel_multiples);
        let n = cfg.downsampling_ratios.len();
        let blocks = cfg
            .downsampling_ratios
            .iter()
            .rev()
            .enumerate()
            .map(|(i, &s)| {
                let (cin, cout) = (h * mult[n - i], h * mult[n - i - 1]);
                let name = format!("decoder.block.{i}");
                let unit = |j: usize, d: usize| ResidualUnit::load(f, &format!("{name}.res_unit{j}"), cout, d);
                Ok(UpBlock {
                    snake: Snake::load(f, &format!("{name}.snake1"), cin)?,
                    conv_t: ConvTranspose::load(f, &format!("{name}.conv_t1"), cin, cout, s)?,
                    units: [unit(1, 1)?, unit(2, 3)?, unit(3, 9)?],
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if let Some(odd) = cfg.downsampling_ratios.iter().find(|s| *s % 2 == 1) {
            return Err(Error::BadConfig {
                what: "VAE",
                reason: format!("ratio {odd} is odd: the decoder's upsampling needs even ratios"),
            });
        }
        let conv1 =
            Conv::load(f, "decoder.conv1", (cfg.latent_channels(), h * mult[n], 7), Geometry::same(7, 1), true)?;
        Ok(Self {
            cfg: cfg.clone(),
            kernels: KernelPolicy::for_device(conv1.w.device()),
            conv1,
            blocks,
            snake: Snake::load(f, "decoder.snake1", h)?,
            conv2: Conv::load(f, "decoder.conv2", (h, cfg.audio_channels, 7), Geometry::same(7, 1), false)?,
        })
    }

    pub fn config(&self) -> &VaeConfig {
        &self.cfg
    }

    /// `z [1, C, T] -> [1, 2, T * hop]`
    fn forward(&self, z: &Tensor) -> Result<Tensor> {
        let k = self.kernels;
        let mut x = self.conv1.forward(k, z, None)?;
        for b in &self.blocks {
            x = b.forward(k, &x)?;
        }
        self.conv2.forward(k, &x, Some(&self.snake))
    }

    /// `latents [T, C]` -> audio `[2, T * hop]` (f32, unclipped), decoded in chunks of at
    /// most `chunk_frames` frames plus the receptive field's overlap on each side.
    pub fn decode(&self, latents: &Tensor, chunk_frames: usize) -> Result<Tensor> {
        let (frames, c) = latents.dims2()?;
        if c != self.cfg.latent_channels() {
            return Err(Error::ShapeMismatch {
                key: "latents".into(),
                expected: vec![frames, self.cfg.latent_channels()],
                found: vec![frames, c],
            });
        }
        let hop = self.cfg.hop();
        let z = latents.to_dtype(self.conv1.w.dtype())?.to_device(self.conv1.w.device())?.t()?;
        let overlap = self.cfg.decoder_receptive_field();
        let mut parts = Vec::new();
        for w in chunk_windows(frames, chunk_frames, overlap) {
            let audio = self.forward(&z.narrow(1, w.lo, w.hi - w.lo)?.contiguous()?.unsqueeze(0)?)?;
            parts.push(audio.squeeze(0)?.narrow(1, (w.start - w.lo) * hop, (w.end - w.start) * hop)?);
        }
        if parts.is_empty() {
            return Ok(Tensor::zeros((self.cfg.audio_channels, 0), DType::F32, latents.device())?);
        }
        Ok(Tensor::cat(&parts, 1)?.to_dtype(DType::F32)?)
    }
}

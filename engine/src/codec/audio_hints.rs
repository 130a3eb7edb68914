//! ACE-Step's audio detokenizer: 5 Hz codes (what the 5 Hz LM writes) -> 25 Hz latent
//! hints the DiT is conditioned on, as upstream's handler makes them
//! (`_decode_audio_codes_to_latents`): the checkpoint's own quantizer turns each code
//! into its vector (`tokenizer.quantizer.get_output_from_indices`), then `detokenizer.*`
//! projects it, expands it to a window of `pool_window` rows (its learned
//! `special_tokens` added, one per row), runs its encoder layers within each window,
//! RMSNorm, and projects each row to a latent frame.
//!
//! Built at the condition encoder's sizes, as the audio tokenizer it inverts; f32.

use candle_core::Tensor;

use super::audio_codes::{AudioCodesConfig, ResidualFsq};
use super::condition_encoder::{ConditionEncoderConfig, SpecialKind, Stack};
use super::transformer::linear;
use crate::model::KernelPolicy;
use crate::tensor_io::TensorSource;
use crate::{Error, Result};

/// The detokenizer's weights in ACE-Step's `model.safetensors`.
pub const DETOKENIZER_PREFIX: &str = "detokenizer";
/// The quantizer whose codes it reads (the audio tokenizer's).
const QUANTIZER_PREFIX: &str = "tokenizer.quantizer";

pub struct AudioDetokenizer {
    cfg: AudioCodesConfig,
    encoder: ConditionEncoderConfig,
    fsq: ResidualFsq,
    stack: Stack,
    proj_w: Tensor,
    proj_b: Tensor,
    kernels: KernelPolicy,
}

impl AudioDetokenizer {
    /// From `f`, ACE-Step's checkpoint (`tokenizer.quantizer.*` and `detokenizer.*`).
    pub fn load(cfg: &AudioCodesConfig, encoder: &ConditionEncoderConfig, f: &dyn TensorSource) -> Result<Self> {
        if cfg.quantizers != 1 {
            // A code string holds one code per window: upstream reads it as the first
            // quantizer's, which needs quantizer dropout that ACE-Step does not train.
            return Err(Error::BadConfig {
                what: "audio detokenizer",
                reason: format!("fsq_input_num_quantizers is {}: 5 Hz codes name one quantizer's code", cfg.quantizers),
            });
        }
        let h = encoder.dims.hidden;
        let p = |k: &str| format!("{DETOKENIZER_PREFIX}.{k}");
        let window = SpecialKind::Added(cfg.pool_window);
        Ok(Self {
            fsq: ResidualFsq::load(cfg, f, QUANTIZER_PREFIX)?,
            stack: Stack::load(f, DETOKENIZER_PREFIX, h, cfg.pooler_layers, window, encoder)?,
            proj_w: f.get(&p("proj_out.weight"), &[cfg.acoustic_dim, h])?,
            proj_b: f.get(&p("proj_out.bias"), &[cfg.acoustic_dim])?,
            cfg: cfg.clone(),
            encoder: encoder.clone(),
            kernels: KernelPolicy::for_device(f.device()),
        })
    }

    /// Latent frames per code.
    pub fn pool_window(&self) -> usize {
        self.cfg.pool_window
    }

    /// `codes` (5 Hz, each below the codebook size) -> hints `[pool_window * N, acoustic_dim]`
    /// (f32, 25 Hz).
    pub fn hints(&self, codes: &[u32]) -> Result<Tensor> {
        if codes.is_empty() {
            return Err(Error::BadRequest("no audio codes to turn into hints".into()));
        }
        let (n, w) = (codes.len(), self.cfg.pool_window);
        let quantized = self.quantized(codes)?; // (N, H)
        let h = quantized.dim(1)?;
        // Every window at once, each code's vector on its window's rows.
        let rows = quantized.unsqueeze(1)?.broadcast_as((n, w, h))?.reshape((n * w, h))?;
        let x = self.stack.forward_groups(self.kernels, &rows, n, None, &self.encoder)?;
        linear(&x, &self.proj_w, Some(&self.proj_b))
    }

    /// The quantizer's vectors for `codes` `[N, fsq_dim]`, what the detokenizer reads.
    pub fn quantized(&self, codes: &[u32]) -> Result<Tensor> {
        self.fsq.output_from_indices(codes, self.proj_w.device())
    }
}

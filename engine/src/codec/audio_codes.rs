//! ACE-Step's audio tokenizer (`tokenizer.*` in `model.safetensors`): 25 Hz latents ->
//! 5 Hz codes, what the 5 Hz language model reads. Each window of `pool_window_size`
//! latent frames is projected to the encoder width, pooled by an attention pooler (a
//! special token prepended, encoder layers, RMSNorm, the token's row; all windows in one
//! pass, each attending within itself), then quantized by
//! a residual FSQ (`vector_quantize_pytorch.ResidualFSQ`: project in, a bounded tanh,
//! each quantizer rounding the residual to its levels, project out). A last part window
//! is completed with the silence latent's first frames, as upstream's `tokenize` does.
//!
//! The tokenizer is built at the condition encoder's sizes (XL's `encoder_*`), and the
//! quantizer runs in f32 whatever the model computes in, as upstream casts it.

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use super::condition_encoder::{ConditionEncoderConfig, SpecialKind, Stack};
use super::transformer::linear;
use crate::model::{DitConfig, KernelPolicy};
use crate::tensor_io::TensorSource;
use crate::{Error, Result};

#[derive(Debug, Clone, PartialEq)]
pub struct AudioCodesConfig {
    /// Latent frames per code (5: 25 Hz -> 5 Hz).
    pub pool_window: usize,
    /// Channels of a latent frame.
    pub acoustic_dim: usize,
    /// The width the quantizer projects from and to (the encoder width).
    pub fsq_dim: usize,
    /// Levels of each FSQ dimension; a code is one of their product.
    pub levels: Vec<usize>,
    pub quantizers: usize,
    pub pooler_layers: usize,
}

impl AudioCodesConfig {
    /// From ACE-Step's `config.json`, with upstream's defaults.
    pub fn from_value(value: &Value, dit: &DitConfig, encoder: &ConditionEncoderConfig) -> Result<Self> {
        let bad = |reason: String| Error::BadConfig { what: "audio tokenizer", reason };
        let count = |name: &str, default: usize| -> Result<usize> {
            match value.get(name) {
                None => Ok(default),
                Some(v) => v
                    .as_u64()
                    .filter(|&n| n > 0)
                    .map(|n| n as usize)
                    .ok_or_else(|| bad(format!("`{name}` must be a positive integer"))),
            }
        };
        let levels = match value.get("fsq_input_levels") {
            None => vec![8, 8, 8, 5, 5, 5],
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(|l| l.as_u64().filter(|&n| n >= 2).map(|n| n as usize)).collect())
                .ok_or_else(|| bad("`fsq_input_levels` must be a list of integers of at least 2".into()))?,
        };
        if levels.is_empty()
            || levels.iter().try_fold(1u64, |p, &l| p.checked_mul(l as u64)).is_none_or(|p| p > 1 << 24)
        {
            return Err(bad(format!("`fsq_input_levels` {levels:?} do not make a codebook of 1 to 2^24 codes")));
        }
        let cfg = Self {
            pool_window: count("pool_window_size", 5)?,
            acoustic_dim: dit.audio_acoustic_hidden_dim,
            fsq_dim: count("fsq_dim", encoder.dims.hidden)?,
            levels,
            quantizers: count("fsq_input_num_quantizers", 1)?,
            pooler_layers: count("num_attention_pooler_hidden_layers", 2)?,
        };
        if cfg.fsq_dim != encoder.dims.hidden {
            return Err(bad(format!(
                "fsq_dim {} is not the encoder width {} the pooler gives it",
                cfg.fsq_dim, encoder.dims.hidden
            )));
        }
        if cfg.pooler_layers > encoder.layer_types.len() {
            return Err(bad(format!(
                "the attention pooler has {} layers but layer_types lists {}",
                cfg.pooler_layers,
                encoder.layer_types.len()
            )));
        }
        Ok(cfg)
    }

    /// Codes one quantizer tells apart.
    pub fn codebook_size(&self) -> usize {
        self.levels.iter().product()
    }
}

/// A song's codes: `codes[q][i]`, quantizer q's code of window i, and the quantized
/// states `[windows, fsq_dim]`.
pub struct AudioCodes {
    pub codes: Vec<Vec<u32>>,
    pub quantized: Tensor,
}

pub struct AudioTokenizer {
    cfg: AudioCodesConfig,
    encoder: ConditionEncoderConfig,
    proj_w: Tensor,
    proj_b: Tensor,
    pooler: Stack,
    fsq: ResidualFsq,
    kernels: KernelPolicy,
}

impl AudioTokenizer {
    /// `prefix`: `tokenizer` in ACE-Step's `model.safetensors`.
    pub fn load(
        cfg: &AudioCodesConfig,
        encoder: &ConditionEncoderConfig,
        f: &dyn TensorSource,
        prefix: &str,
    ) -> Result<Self> {
        let h = encoder.dims.hidden;
        let p = |k: &str| format!("{prefix}.{k}");
        Ok(Self {
            proj_w: f.get(&p("audio_acoustic_proj.weight"), &[h, cfg.acoustic_dim])?,
            proj_b: f.get(&p("audio_acoustic_proj.bias"), &[h])?,
            pooler: Stack::load(f, &p("attention_pooler"), h, cfg.pooler_layers, SpecialKind::Prepended, encoder)?,
            fsq: ResidualFsq::load(cfg, f, &p("quantizer"))?,
            cfg: cfg.clone(),
            encoder: encoder.clone(),
            kernels: KernelPolicy::for_device(f.device()),
        })
    }

    /// The tokenizer running `kernels` instead of its device's.
    pub fn with_kernels(mut self, kernels: KernelPolicy) -> Self {
        self.kernels = kernels;
        self
    }

    /// Latent frames per code.
    pub fn pool_window(&self) -> usize {
        self.cfg.pool_window
    }

    /// `latents [T, C]` -> one code per `pool_window` frames (a part window completed
    /// with `silence [F, C]`'s first frames).
    pub fn tokenize(&self, latents: &Tensor, silence: &Tensor) -> Result<AudioCodes> {
        let (t, c) = latents.dims2()?;
        let w = self.cfg.pool_window;
        if c != self.cfg.acoustic_dim || t == 0 {
            return Err(Error::BadConfig {
                what: "audio tokenizer",
                reason: format!("latents [{t}, {c}] are not [frames, {}] with frames > 0", self.cfg.acoustic_dim),
            });
        }
        let pad = (w - t % w) % w;
        let latents = match pad {
            0 => latents.to_dtype(DType::F32)?,
            _ => {
                if silence.dim(0)? < pad {
                    return Err(Error::BadConfig {
                        what: "audio tokenizer",
                        reason: format!("the silence latent has fewer than the {pad} frames a part window needs"),
                    });
                }
                let fill = silence.narrow(0, 0, pad)?.to_dtype(DType::F32)?.to_device(latents.device())?;
                Tensor::cat(&[&latents.to_dtype(DType::F32)?, &fill], 0)?
            }
        };
        let windows = (t + pad) / w;
        let x = linear(&latents, &self.proj_w, Some(&self.proj_b))?; // (windows * w, H)
                                                                     // Every window at once, each behind its special token: (windows * (1 + w), H).
        let pooled = self.pooler.forward_groups(self.kernels, &x, windows, None, &self.encoder)?;
        let h = pooled.dim(1)?;
        self.fsq.quantize(&pooled.reshape((windows, w + 1, h))?.narrow(1, 0, 1)?.reshape((windows, h))?)
    }
}

/// `vector_quantize_pytorch.ResidualFSQ` as ACE-Step's checkpoints hold it, in f32.
pub(super) struct ResidualFsq {
    in_w: Tensor,
    in_b: Tensor,
    out_w: Tensor,
    out_b: Tensor,
    levels: Vec<usize>,
    quantizers: usize,
}

/// Level `level` of an FSQ dimension with `levels` levels, as a value in [-1, 1].
fn level_value(level: f32, levels: f32) -> f32 {
    2.0 / (levels - 1.0) * level - 1.0
}

/// Each dimension's place in a code (mixed radix, the first dimension lowest).
fn code_basis(levels: &[usize]) -> Vec<usize> {
    levels.iter().scan(1, |b, &l| Some(std::mem::replace(b, *b * l))).collect()
}

impl ResidualFsq {
    /// `prefix`: `tokenizer.quantizer` in ACE-Step's `model.safetensors`.
    pub(super) fn load(cfg: &AudioCodesConfig, f: &dyn TensorSource, prefix: &str) -> Result<Self> {
        let p = |k: &str| format!("{prefix}.{k}");
        let width = cfg.levels.len();
        Ok(Self {
            in_w: f.get(&p("project_in.weight"), &[width, cfg.fsq_dim])?,
            in_b: f.get(&p("project_in.bias"), &[width])?,
            out_w: f.get(&p("project_out.weight"), &[cfg.fsq_dim, width])?,
            out_b: f.get(&p("project_out.bias"), &[cfg.fsq_dim])?,
            levels: cfg.levels.clone(),
            quantizers: cfg.quantizers,
        })
    }

    /// The first quantizer's `codes` -> the quantized `[N, dim]`, as
    /// `ResidualFSQ.get_output_from_indices` makes it from indices `[1, N, 1]`: each
    /// code's levels as values, projected out (the finer quantizers, given no codes,
    /// add nothing). A code outside the codebook is an error naming its position.
    pub(super) fn output_from_indices(&self, codes: &[u32], device: &Device) -> Result<Tensor> {
        let size: usize = self.levels.iter().product();
        let basis = code_basis(&self.levels);
        let mut values = Vec::with_capacity(codes.len() * self.levels.len());
        for (i, &code) in codes.iter().enumerate() {
            if code as usize >= size {
                return Err(Error::BadRequest(format!(
                    "audio code {code} at position {i} is out of the codebook's range 0 to {}",
                    size - 1
                )));
            }
            for (&l, &b) in self.levels.iter().zip(&basis) {
                values.push(level_value(((code as usize / b) % l) as f32, l as f32));
            }
        }
        let values = Tensor::from_vec(values, (codes.len(), self.levels.len()), device)?;
        linear(&values, &self.out_w, Some(&self.out_b))
    }

    /// `x [N, dim]` -> codes per quantizer and the quantized `[N, dim]`.
    fn quantize(&self, x: &Tensor) -> Result<AudioCodes> {
        let z = linear(&x.to_dtype(DType::F32)?, &self.in_w, Some(&self.in_b))?; // (N, D)
        let (n, d) = z.dims2()?;
        let levels: Vec<f32> = self.levels.iter().map(|&l| l as f32).collect();
        let basis: Vec<f32> = code_basis(&self.levels).into_iter().map(|b| b as f32).collect();
        let mut residual = z.to_vec2::<f32>()?;
        for row in residual.iter_mut() {
            for (v, &l) in row.iter_mut().zip(&levels) {
                // Bounded into the levels' range before the first quantizer.
                let soft = 1.0 + 1.0 / (l - 1.0);
                *v = (*v / soft).tanh() * soft;
            }
        }
        let mut total = vec![vec![0f32; d]; n];
        let mut codes = Vec::with_capacity(self.quantizers);
        for q in 0..self.quantizers {
            let mut these = Vec::with_capacity(n);
            for (row, sum) in residual.iter_mut().zip(total.iter_mut()) {
                let mut code = 0f32;
                for j in 0..d {
                    let (l, scale) = (levels[j], levels[j].powi(-(q as i32)));
                    let level = ((l - 1.0) * ((row[j] / scale).clamp(-1.0, 1.0) + 1.0) / 2.0 + 0.5).floor();
                    let value = level_value(level, l) * scale;
                    row[j] -= value;
                    sum[j] += value;
                    code += level * basis[j];
                }
                these.push(code.round() as u32);
            }
            codes.push(these);
        }
        let total = Tensor::from_vec(total.concat(), (n, d), x.device())?;
        Ok(AudioCodes { codes, quantized: linear(&total, &self.out_w, Some(&self.out_b))? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: serde_json::Value) -> Result<AudioCodesConfig> {
        let mut value = serde_json::json!({
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "in_channels": 24, "audio_acoustic_hidden_dim": 8,
            "patch_size": 2, "encoder_hidden_size": 32, "num_lyric_encoder_hidden_layers": 2,
            "num_timbre_encoder_hidden_layers": 2,
        });
        value.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let dit = DitConfig::from_value(&value).unwrap();
        AudioCodesConfig::from_value(&value, &dit, &ConditionEncoderConfig::from_value(&value, &dit).unwrap())
    }

    #[test]
    fn upstreams_defaults_at_the_encoder_width_and_bad_fields_named() {
        let cfg = parse(serde_json::json!({})).unwrap();
        assert_eq!((cfg.pool_window, cfg.fsq_dim, cfg.codebook_size(), cfg.quantizers), (5, 32, 64000, 1));
        for (extra, named) in [
            (serde_json::json!({"fsq_dim": 64}), "fsq_dim 64 is not the encoder width 32"),
            (serde_json::json!({"fsq_input_levels": [8, 1]}), "fsq_input_levels"),
            (serde_json::json!({"fsq_input_levels": [4096, 4096, 4096]}), "2^24"),
            (serde_json::json!({"pool_window_size": 0}), "pool_window_size"),
            (serde_json::json!({"num_attention_pooler_hidden_layers": 9}), "9 layers but layer_types lists 4"),
        ] {
            let err = parse(extra).unwrap_err().to_string();
            assert!(err.contains(named), "{err}");
        }
    }
}

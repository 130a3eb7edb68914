//! ACE-Step's condition encoder (`encoder.*` in `model.safetensors`): text projector,
//! lyric encoder, timbre encoder, and the packing of the three sequences into the
//! DiT's cross-attention input. Inference only, one sample at a time.
//!
//! Packing (ACE-Step's `pack_sequences`, twice): valid rows first, in order, then the
//! padded rows, in order; the new mask is 1 for the first `valid` rows. With lyrics,
//! one timbre row and text this gives: valid lyric rows, the timbre row, valid text
//! rows, padded lyric rows, padded text rows.

use candle_core::Tensor;
use serde_json::Value;

use super::transformer::{additive_mask, linear, Layer, LayerDims, Rope};
use crate::model::config::{DitConfig, LayerType};
use crate::model::ops::rms_norm;
use crate::model::weights::{diffusers_name, uses_diffusers_names};
use crate::model::KernelPolicy;
use crate::tensor_io::TensorSource;
use crate::{Error, Result};

#[derive(Debug, Clone, PartialEq)]
pub struct ConditionEncoderConfig {
    pub dims: LayerDims,
    pub text_hidden_dim: usize,
    pub timbre_hidden_dim: usize,
    pub lyric_layers: usize,
    pub timbre_layers: usize,
    pub rope_theta: f64,
    /// `None` when the model does not use sliding windows (then sliding layers get no mask).
    pub sliding_window: Option<usize>,
    /// The DiT's layer types; encoder layer i takes entry i.
    pub layer_types: Vec<LayerType>,
}

impl ConditionEncoderConfig {
    /// From ACE-Step's `config.json` (the fields beside the DiT's).
    pub fn from_value(value: &Value, dit: &DitConfig) -> Result<Self> {
        let bad = |reason| Error::BadConfig { what: "condition encoder", reason };
        let field = |name: &str, default: usize| -> Result<usize> {
            match value.get(name) {
                None => Ok(default),
                Some(v) => v
                    .as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| bad(format!("`{name}` must be a non-negative integer"))),
            }
        };
        let cfg = Self {
            dims: LayerDims {
                hidden: dit.encoder_hidden_size,
                intermediate: dit.intermediate_size,
                heads: dit.num_attention_heads,
                kv_heads: dit.num_key_value_heads,
                head_dim: dit.head_dim,
                eps: dit.rms_norm_eps,
            },
            text_hidden_dim: field("text_hidden_dim", 1024)?,
            timbre_hidden_dim: field("timbre_hidden_dim", 64)?,
            lyric_layers: field("num_lyric_encoder_hidden_layers", 8)?,
            timbre_layers: field("num_timbre_encoder_hidden_layers", 4)?,
            rope_theta: dit.rope_theta,
            sliding_window: dit.use_sliding_window.then_some(dit.sliding_window),
            layer_types: dit.layer_types.clone(),
        };
        let most = cfg.lyric_layers.max(cfg.timbre_layers);
        if most > cfg.layer_types.len() {
            return Err(bad(format!(
                "the condition encoder has {most} layers but layer_types lists {}",
                cfg.layer_types.len()
            )));
        }
        Ok(cfg)
    }
}

/// A stack of encoder layers over projected inputs, then RMSNorm.
struct Stack {
    embed_w: Tensor,
    embed_b: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
}

impl Stack {
    fn load(
        f: &dyn TensorSource,
        prefix: &str,
        input_dim: usize,
        n: usize,
        cfg: &ConditionEncoderConfig,
    ) -> Result<Self> {
        let diffusers = uses_diffusers_names(&f.keys());
        let name = move |k: &str| {
            if diffusers {
                vec![diffusers_name(k), k.to_string()]
            } else {
                vec![k.to_string()]
            }
        };
        let h = cfg.dims.hidden;
        Ok(Self {
            embed_w: f.get(&format!("{prefix}.embed_tokens.weight"), &[h, input_dim])?,
            embed_b: f.get(&format!("{prefix}.embed_tokens.bias"), &[h])?,
            layers: (0..n)
                .map(|i| Layer::load(f, &format!("{prefix}.layers.{i}"), cfg.dims, &name))
                .collect::<Result<_>>()?,
            norm: f.get(&format!("{prefix}.norm.weight"), &[h])?,
        })
    }

    /// `x [L, in]`, `valid [L]` -> `[L, H]`. Full layers mask padded keys; sliding
    /// layers also the band |i - j| <= window.
    fn forward(
        &self,
        k: KernelPolicy,
        x: &Tensor,
        valid: Option<&[bool]>,
        cfg: &ConditionEncoderConfig,
    ) -> Result<Tensor> {
        let dev = x.device();
        let l = x.dim(0)?;
        let rope = Rope::new(cfg.dims.head_dim, cfg.rope_theta, l, dev)?;
        let full = additive_mask(l, false, None, valid, dev)?;
        let sliding = match cfg.sliding_window {
            Some(w) => additive_mask(l, false, Some(w), valid, dev)?,
            None => None,
        };
        let mut h = linear(x, &self.embed_w, Some(&self.embed_b))?;
        for (layer, kind) in self.layers.iter().zip(&cfg.layer_types) {
            let mask = match kind {
                LayerType::SlidingAttention => sliding.as_ref(),
                LayerType::FullAttention => full.as_ref(),
            };
            h = layer.forward(k, &h, &rope, mask)?;
        }
        Ok(rms_norm(k, &h, &self.norm, cfg.dims.eps)?)
    }
}

pub struct ConditionEncoder {
    cfg: ConditionEncoderConfig,
    /// `[H, text_hidden_dim]`
    text_projector: Tensor,
    lyric: Stack,
    timbre: Stack,
    kernels: KernelPolicy,
}

/// The packed condition: `states [L, H]`, `mask [L]` (true = valid row).
pub struct Packed {
    pub states: Tensor,
    pub mask: Vec<bool>,
}

/// Valid rows first (stable), then padded rows; the mask marks the first `valid` rows.
pub fn pack(a: &Tensor, a_mask: &[bool], b: &Tensor, b_mask: &[bool]) -> Result<Packed> {
    let states = Tensor::cat(&[a, b], 0)?;
    let mask: Vec<bool> = a_mask.iter().chain(b_mask).copied().collect();
    let order: Vec<u32> = (0..mask.len() as u32)
        .filter(|&i| mask[i as usize])
        .chain((0..mask.len() as u32).filter(|&i| !mask[i as usize]))
        .collect();
    let valid = mask.iter().filter(|&&m| m).count();
    let order = Tensor::from_vec(order, mask.len(), states.device())?;
    Ok(Packed { states: states.index_select(&order, 0)?, mask: (0..mask.len()).map(|i| i < valid).collect() })
}

impl ConditionEncoder {
    /// `prefix`: `encoder` in ACE-Step's `model.safetensors`, `""` for a bare export.
    pub fn load(cfg: &ConditionEncoderConfig, f: &dyn TensorSource, prefix: &str) -> Result<Self> {
        let p = |k: &str| if prefix.is_empty() { k.to_string() } else { format!("{prefix}.{k}") };
        Ok(Self {
            cfg: cfg.clone(),
            text_projector: f.get(&p("text_projector.weight"), &[cfg.dims.hidden, cfg.text_hidden_dim])?,
            lyric: Stack::load(f, &p("lyric_encoder"), cfg.text_hidden_dim, cfg.lyric_layers, cfg)?,
            timbre: Stack::load(f, &p("timbre_encoder"), cfg.timbre_hidden_dim, cfg.timbre_layers, cfg)?,
            kernels: KernelPolicy::for_device(f.device()),
        })
    }

    /// The encoder running `kernels` instead of its device's.
    pub fn with_kernels(mut self, kernels: KernelPolicy) -> Self {
        self.kernels = kernels;
        self
    }

    pub fn config(&self) -> &ConditionEncoderConfig {
        &self.cfg
    }

    /// The timbre embedding `[1, H]` of a reference `[R, timbre_dim]`: the first row of
    /// the encoded sequence.
    pub fn timbre(&self, reference: &Tensor) -> Result<Tensor> {
        Ok(self.timbre.forward(self.kernels, reference, None, &self.cfg)?.narrow(0, 0, 1)?)
    }

    /// `text [Lt, text_dim]` (Qwen3 last hidden state), `lyrics [Ll, text_dim]` (token
    /// embeddings), with their masks, and the timbre reference `[R, timbre_dim]`
    /// (training: one zero frame; generation: the silence latent's first 30 s) -> the
    /// packed condition `[Ll + 1 + Lt, H]`.
    pub fn forward(
        &self,
        text: &Tensor,
        text_mask: &[bool],
        lyrics: &Tensor,
        lyric_mask: &[bool],
        timbre_reference: &Tensor,
    ) -> Result<Packed> {
        let text = linear(text, &self.text_projector, None)?;
        let lyrics = self.lyric.forward(self.kernels, lyrics, Some(lyric_mask), &self.cfg)?;
        let timbre = self.timbre(timbre_reference)?;
        let first = pack(&lyrics, lyric_mask, &timbre, &[true])?;
        pack(&first.states, &first.mask, &text, text_mask)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn packing_puts_valid_rows_first_in_order() {
        let dev = Device::Cpu;
        let a = Tensor::arange(0f32, 4.0, &dev).unwrap().reshape((4, 1)).unwrap();
        let b = Tensor::arange(10f32, 13.0, &dev).unwrap().reshape((3, 1)).unwrap();
        // Left-padded lyrics (rows 0, 1 padding), then one timbre row, then text.
        let p1 = pack(&a, &[false, false, true, true], &Tensor::new(&[[99f32]], &dev).unwrap(), &[true]).unwrap();
        let p = pack(&p1.states, &p1.mask, &b, &[false, true, true]).unwrap();
        let rows: Vec<f32> = p.states.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(rows, [2., 3., 99., 11., 12., 0., 1., 10.]);
        assert_eq!(p.mask, [true, true, true, true, true, false, false, false]);
    }
}

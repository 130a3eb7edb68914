//! ACE-Step's condition encoder (`encoder.*` in `model.safetensors`): text projector,
//! lyric encoder, timbre encoder, and the packing of the three sequences into the
//! DiT's cross-attention input. Inference only, one sample at a time.
//!
//! Packing (ACE-Step's `pack_sequences`, twice): valid rows first, in order, then the
//! padded rows, in order; the new mask is 1 for the first `valid` rows. With lyrics,
//! one timbre row and text this gives: valid lyric rows, the timbre row, valid text
//! rows, padded lyric rows, padded text rows.
//!
//! ACE-Step 1.5 XL's code (`acestep/models/xl_*`) builds these encoders from the
//! config's `encoder_*` sizes, narrower than its DiT, and its timbre encoder prepends a
//! learned `special_token` whose output is the timbre embedding; the 2B code reads no
//! `encoder_*` size and pools the first audio frame (its prepend is commented out).

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
    /// The timbre encoder prepends its `special_token` (XL's code).
    pub timbre_special_token: bool,
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
        let xl = uses_xl_code(value, dit);
        // XL's encoder sizes, each the DiT's where its config leaves it out (as upstream's
        // `getattr(config, "encoder_...", None) or config....`).
        let encoder_size = |name: &str, dit_value: usize| if xl { field(name, dit_value) } else { Ok(dit_value) };
        let cfg = Self {
            dims: LayerDims {
                hidden: dit.encoder_hidden_size,
                intermediate: encoder_size("encoder_intermediate_size", dit.intermediate_size)?,
                heads: encoder_size("encoder_num_attention_heads", dit.num_attention_heads)?,
                kv_heads: encoder_size("encoder_num_key_value_heads", dit.num_key_value_heads)?,
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
            timbre_special_token: xl,
        };
        let most = cfg.lyric_layers.max(cfg.timbre_layers);
        if most > cfg.layer_types.len() {
            return Err(bad(format!(
                "the condition encoder has {most} layers but layer_types lists {}",
                cfg.layer_types.len()
            )));
        }
        if cfg.dims.heads == 0 || !cfg.dims.heads.is_multiple_of(cfg.dims.kv_heads) {
            return Err(bad(format!(
                "{} attention heads cannot share {} key/value heads",
                cfg.dims.heads, cfg.dims.kv_heads
            )));
        }
        Ok(cfg)
    }
}

/// Whether `config.json` is one of upstream's XL code: its `auto_map` names an XL
/// module, or its encoders are narrower than its DiT, which only that code builds.
fn uses_xl_code(value: &Value, dit: &DitConfig) -> bool {
    let names_xl = value
        .get("auto_map")
        .and_then(Value::as_object)
        .is_some_and(|map| map.values().filter_map(Value::as_str).any(|m| m.contains("modeling_acestep_v15_xl")));
    names_xl || dit.encoder_hidden_size != dit.hidden_size
}

/// A stack of encoder layers over projected inputs, then RMSNorm (the lyric and timbre
/// encoders, the audio tokenizer's attention pooler and its detokenizer).
pub(super) struct Stack {
    embed_w: Tensor,
    embed_b: Tensor,
    special: Special,
    layers: Vec<Layer>,
    norm: Tensor,
}

/// Learned rows a stack puts into each group after projecting it.
pub(super) enum Special {
    None,
    /// `special_token [1, 1, H]`, put before each group (XL's timbre encoder, the pooler).
    Prepended(Tensor),
    /// `special_tokens [1, W, H]`, added to each group's W rows (the detokenizer).
    Added(Tensor),
}

/// Which [`Special`] a stack's checkpoint holds.
#[derive(Clone, Copy)]
pub(super) enum SpecialKind {
    None,
    Prepended,
    /// Over groups of this many rows.
    Added(usize),
}

impl Stack {
    pub(super) fn load(
        f: &dyn TensorSource,
        prefix: &str,
        input_dim: usize,
        n: usize,
        special: SpecialKind,
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
            special: match special {
                SpecialKind::None => Special::None,
                SpecialKind::Prepended => {
                    Special::Prepended(f.get(&format!("{prefix}.special_token"), &[1, 1, h])?.reshape((1, h))?)
                }
                SpecialKind::Added(w) => {
                    Special::Added(f.get(&format!("{prefix}.special_tokens"), &[1, w, h])?.reshape((w, h))?)
                }
            },
            layers: (0..n)
                .map(|i| Layer::load(f, &format!("{prefix}.layers.{i}"), cfg.dims, &name))
                .collect::<Result<_>>()?,
            norm: f.get(&format!("{prefix}.norm.weight"), &[h])?,
        })
    }

    /// `x [L, in]`, `valid [L]` -> `[L, H]` (`[1 + L, H]` after a special token, which
    /// is always valid). Full layers mask padded keys; sliding layers also the band
    /// |i - j| <= window.
    pub(super) fn forward(
        &self,
        k: KernelPolicy,
        x: &Tensor,
        valid: Option<&[bool]>,
        cfg: &ConditionEncoderConfig,
    ) -> Result<Tensor> {
        self.forward_groups(k, x, 1, valid, cfg)
    }

    /// [`Self::forward`] over `groups` sequences of equal length at once, `x [G * L,
    /// in]` -> `[G * L', H]` (each group with its own special token or tokens; `valid`
    /// holds for every group).
    pub(super) fn forward_groups(
        &self,
        k: KernelPolicy,
        x: &Tensor,
        groups: usize,
        valid: Option<&[bool]>,
        cfg: &ConditionEncoderConfig,
    ) -> Result<Tensor> {
        let dev = x.device();
        let mut h = linear(x, &self.embed_w, Some(&self.embed_b))?;
        let mut valid = valid.map(<[bool]>::to_vec);
        let (rows, width) = h.dims2()?;
        match &self.special {
            Special::None => {}
            Special::Prepended(token) => {
                let tokens = token.unsqueeze(0)?.broadcast_as((groups, 1, width))?;
                h = Tensor::cat(&[&tokens, &h.reshape((groups, rows / groups, width))?], 1)?.reshape(((), width))?;
                valid = valid.map(|v| std::iter::once(true).chain(v).collect());
            }
            Special::Added(tokens) => {
                let grouped = h.reshape((groups, rows / groups, width))?;
                h = grouped.broadcast_add(&tokens.unsqueeze(0)?)?.reshape(((), width))?;
            }
        }
        let valid = valid.as_deref();
        let l = h.dim(0)? / groups;
        let rope = Rope::new(cfg.dims.head_dim, cfg.rope_theta, l, dev)?;
        let full = additive_mask(l, false, None, valid, dev)?;
        let sliding = match cfg.sliding_window {
            Some(w) => additive_mask(l, false, Some(w), valid, dev)?,
            None => None,
        };
        for (layer, kind) in self.layers.iter().zip(&cfg.layer_types) {
            let mask = match kind {
                LayerType::SlidingAttention => sliding.as_ref(),
                LayerType::FullAttention => full.as_ref(),
            };
            h = layer.forward_groups(k, &h, groups, &rope, mask)?;
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
            lyric: Stack::load(f, &p("lyric_encoder"), cfg.text_hidden_dim, cfg.lyric_layers, SpecialKind::None, cfg)?,
            timbre: Stack::load(
                f,
                &p("timbre_encoder"),
                cfg.timbre_hidden_dim,
                cfg.timbre_layers,
                if cfg.timbre_special_token { SpecialKind::Prepended } else { SpecialKind::None },
                cfg,
            )?,
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
    /// the encoded sequence (the special token's, where there is one).
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

    /// A DiT config of width 64 (4 heads of 16, 2 KV heads, MLP 128) with `extra` fields.
    fn config(extra: serde_json::Value) -> ConditionEncoderConfig {
        let mut value = serde_json::json!({
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 8, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "in_channels": 24, "audio_acoustic_hidden_dim": 8,
            "patch_size": 2, "sliding_window": 8, "use_sliding_window": true, "rope_theta": 1e6,
            "rms_norm_eps": 1e-6,
        });
        value.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        ConditionEncoderConfig::from_value(&value, &DitConfig::from_value(&value).unwrap()).unwrap()
    }

    #[test]
    fn xl_code_sizes_the_encoders_from_their_own_fields_and_prepends_the_timbre_token() {
        let sizes = serde_json::json!({"encoder_intermediate_size": 96, "encoder_num_attention_heads": 2,
            "encoder_num_key_value_heads": 1});
        let dims = |c: &ConditionEncoderConfig| (c.dims.hidden, c.dims.intermediate, c.dims.heads, c.dims.kv_heads);
        // 2B code: its DiT's sizes, whatever else the file holds.
        let two_b = config(sizes.clone());
        assert_eq!((dims(&two_b), two_b.timbre_special_token), ((64, 128, 4, 2), false));
        // XL code named by auto_map, at the DiT's width.
        let mut named = sizes.clone();
        named["auto_map"] =
            serde_json::json!({"AutoModel": "modeling_acestep_v15_xl_sft.AceStepConditionGenerationModel"});
        let named = config(named);
        assert_eq!((dims(&named), named.timbre_special_token), ((64, 96, 2, 1), true));
        // XL code known by its narrower encoders; sizes it leaves out are the DiT's.
        let narrower = config(serde_json::json!({"encoder_hidden_size": 32}));
        assert_eq!((dims(&narrower), narrower.timbre_special_token), ((32, 128, 4, 2), true));
        let value = serde_json::json!({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 8,
            "num_attention_heads": 4, "num_key_value_heads": 2, "in_channels": 24, "audio_acoustic_hidden_dim": 8,
            "patch_size": 2, "encoder_hidden_size": 32, "encoder_num_attention_heads": 3});
        let err = ConditionEncoderConfig::from_value(&value, &DitConfig::from_value(&value).unwrap()).unwrap_err();
        assert!(err.to_string().contains("3 attention heads cannot share 2 key/value heads"), "{err}");
    }

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

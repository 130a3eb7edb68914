//! The Qwen3 text encoder (Qwen3-Embedding-0.6B) as ACE-Step uses it: the last
//! hidden state of the causal decoder stack (final RMSNorm applied), and the bare
//! token embedding for lyrics. Inference only.

use std::path::Path;

use candle_core::{Device, Tensor};
use serde::Deserialize;

use super::transformer::{additive_mask, Layer, LayerDims, Rope};
use crate::model::ops::rms_norm;
use crate::model::KernelPolicy;
use crate::tensor_io::TensorSource;
use crate::{Error, Result};

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Qwen3Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub attention_bias: bool,
    /// The LM head is the token embedding, `lm_head.weight` absent (the 5 Hz LMs set
    /// it; transformers' default is false).
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_eps() -> f64 {
    1e-6
}

fn default_theta() -> f64 {
    1_000_000.0
}

impl Qwen3Config {
    pub fn from_file(path: &Path) -> Result<Self> {
        let cfg: Self = crate::error::read_json(path)?;
        let bad = |reason: String| Error::BadFile { path: path.to_path_buf(), reason };
        if cfg.attention_bias {
            return Err(bad("attention_bias = true is not Qwen3".into()));
        }
        if cfg.num_key_value_heads == 0 || !cfg.num_attention_heads.is_multiple_of(cfg.num_key_value_heads) {
            return Err(bad(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                cfg.num_attention_heads, cfg.num_key_value_heads
            )));
        }
        Ok(cfg)
    }

    pub fn dims(&self) -> LayerDims {
        LayerDims {
            hidden: self.hidden_size,
            intermediate: self.intermediate_size,
            heads: self.num_attention_heads,
            kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads),
            eps: self.rms_norm_eps,
        }
    }
}

pub struct Qwen3Encoder {
    cfg: Qwen3Config,
    /// `[V, H]`
    embed_tokens: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    device: Device,
    kernels: KernelPolicy,
}

impl Qwen3Encoder {
    /// Loads from a safetensors file whose keys have no prefix (Qwen3-Embedding) or
    /// `model.` (a causal-LM export).
    pub fn load(cfg: &Qwen3Config, f: &dyn TensorSource) -> Result<Self> {
        let prefix = if f.contains("model.embed_tokens.weight") { "model." } else { "" };
        let dims = cfg.dims();
        let h = cfg.hidden_size;
        let plain = |k: &str| vec![k.to_string()];
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| Layer::load(f, &format!("{prefix}layers.{i}"), dims, &plain))
            .collect::<Result<_>>()?;
        Ok(Self {
            cfg: cfg.clone(),
            embed_tokens: f.get(&format!("{prefix}embed_tokens.weight"), &[cfg.vocab_size, h])?,
            layers,
            norm: f.get(&format!("{prefix}norm.weight"), &[h])?,
            device: f.device().clone(),
            kernels: KernelPolicy::for_device(f.device()),
        })
    }

    /// The encoder running `kernels` instead of its device's.
    pub fn with_kernels(mut self, kernels: KernelPolicy) -> Self {
        self.kernels = kernels;
        self
    }

    pub fn config(&self) -> &Qwen3Config {
        &self.cfg
    }

    /// Token embeddings `[L, H]` (ACE-Step's lyric path: no layers).
    pub fn embed(&self, ids: &[u32]) -> Result<Tensor> {
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.cfg.vocab_size) {
            return Err(Error::Encoder(format!(
                "token id {bad} is outside the Qwen3 vocabulary of {}",
                self.cfg.vocab_size
            )));
        }
        let ids = Tensor::from_vec(ids.to_vec(), ids.len(), &self.device)?;
        Ok(self.embed_tokens.index_select(&ids, 0)?)
    }

    /// The last hidden state `[L, H]` with only the causal mask (ACE-Step runs the
    /// text encoder without an attention mask; padding tokens are attended).
    pub fn forward(&self, ids: &[u32]) -> Result<Tensor> {
        let l = ids.len();
        let dims = self.cfg.dims();
        let rope = Rope::new(dims.head_dim, self.cfg.rope_theta, l, &self.device)?;
        let mask = additive_mask(l, true, None, None, &self.device)?;
        let mut x = self.embed(ids)?;
        for layer in &self.layers {
            x = layer.forward(self.kernels, &x, &rope, mask.as_ref())?;
        }
        Ok(rms_norm(self.kernels, &x, &self.norm, dims.eps)?)
    }
}

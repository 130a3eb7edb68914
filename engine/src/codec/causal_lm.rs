//! ACE-Step's 5 Hz LM (`acestep-5Hz-lm-*`, a Qwen3ForCausalLM) for inference: prefill a
//! prompt, then one token at a time against a KV cache, logits at the last position
//! only. The layers are the text encoder's ([`Layer`]), run through their cached path.
//!
//! Decoding reads every weight once per token, so it is bound by memory: on the CPU the
//! weights are held in bf16 (half the bytes) by default and multiplied by the matvec
//! kernel in f32 arithmetic; prefill widens each weight for its own product. The LM head
//! can be limited to the rows a constrained decoder may pick.

use std::ops::Range;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::qwen3::Qwen3Config;
use super::transformer::{causal_mask_after, Layer, LayerCache, Rope};
use crate::device::Precision;
use crate::kernels::matvec::Matvec;
use crate::model::ops::rms_norm;
use crate::model::KernelPolicy;
use crate::tensor_io::{shards, TensorFile, TensorSource};
use crate::{Error, Result};

pub struct CausalLm {
    cfg: Qwen3Config,
    /// `[V, H]`, held dtype; the LM head too when tied.
    embed_tokens: Tensor,
    /// `[V, H]`, held dtype; `None` when tied to the embedding.
    lm_head: Option<Tensor>,
    layers: Vec<Layer>,
    /// `[H]`, compute dtype.
    norm: Tensor,
    held: DType,
    compute: DType,
    device: Device,
    kernels: KernelPolicy,
}

/// The keys and values of every position run so far, per layer, and the RoPE tables
/// that cover them.
pub struct KvCache {
    layers: Vec<LayerCache>,
    rope: Rope,
    theta: f64,
    head_dim: usize,
    dtype: DType,
    device: Device,
}

impl KvCache {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Room for `total` positions in one allocation (a prompt plus the most tokens to
    /// generate), so decoding never copies the cache to grow it.
    pub fn reserve(&mut self, total: usize) -> Result<()> {
        for layer in &mut self.layers {
            layer.reserve(total)?;
        }
        if self.rope.positions() < total {
            self.rope = Rope::new(self.head_dim, self.theta, total, &self.device)?.to_dtype(self.dtype)?;
        }
        Ok(())
    }

    /// Room for `total` positions, doubling when outgrown (few copies without a reserve).
    fn make_room(&mut self, total: usize) -> Result<()> {
        let capacity = self.layers.first().map_or(0, |l| l.capacity());
        match total > capacity {
            true => self.reserve(total.max(2 * capacity)),
            false => Ok(()),
        }
    }
}

/// The dtypes the weights are held in and computed in: `auto` holds bf16 everywhere,
/// computing in f32 on the CPU (the matvec kernel) and in bf16 on a GPU.
fn dtypes(precision: Precision, device: &Device) -> (DType, DType) {
    match precision {
        Precision::Auto if device.is_cpu() => (DType::BF16, DType::F32),
        p => (p.weights_dtype(device), p.dtype(device)),
    }
}

impl CausalLm {
    /// Loads `dir/config.json` and `dir/model.safetensors` (or its shards' index).
    pub fn load(dir: &Path, device: &Device, precision: Precision) -> Result<Self> {
        let config = dir.join("config.json");
        if !config.is_file() {
            let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "the LM's config.json is missing");
            return Err(Error::io(&config, missing));
        }
        let cfg = Qwen3Config::from_file(&config)?;
        let weights = TensorFile::open(&shards::weights_in(dir, "model.safetensors"), device)?;
        Self::from_source(&cfg, &weights, precision)
    }

    /// Builds from `f`'s `model.*` tensors (and `lm_head.weight` unless tied).
    pub fn from_source(cfg: &Qwen3Config, f: &dyn TensorSource, precision: Precision) -> Result<Self> {
        let device = f.device().clone();
        let (held, compute) = dtypes(precision, &device);
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        let dims = cfg.dims();
        let plain = |k: &str| vec![k.to_string()];
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| Layer::load(f, &format!("model.layers.{i}"), dims, &plain)?.held_in(held, compute))
            .collect::<Result<_>>()?;
        let lm_head = match cfg.tie_word_embeddings {
            true => None,
            false => Some(f.get_in("lm_head.weight", &[v, h], held)?),
        };
        Ok(Self {
            cfg: cfg.clone(),
            embed_tokens: f.get_in("model.embed_tokens.weight", &[v, h], held)?,
            lm_head,
            layers,
            norm: f.get("model.norm.weight", &[h])?.to_dtype(compute)?,
            held,
            compute,
            kernels: KernelPolicy::for_device(&device),
            device,
        })
    }

    pub fn config(&self) -> &Qwen3Config {
        &self.cfg
    }

    /// The dtype the weights are held in.
    pub fn held_dtype(&self) -> DType {
        self.held
    }

    /// The dtype the activations and the cache are in.
    pub fn compute_dtype(&self) -> DType {
        self.compute
    }

    /// An empty cache (reserve the positions a run will need with [`KvCache::reserve`]).
    pub fn new_cache(&self) -> Result<KvCache> {
        let dims = self.cfg.dims();
        let layers = (0..self.cfg.num_hidden_layers)
            // Held like the weights: bf16 beside bf16 weights halves what each step reads.
            .map(|_| LayerCache::new(dims.kv_heads, dims.head_dim, 0, self.held, &self.device))
            .collect::<Result<_>>()?;
        let rope = Rope::new(dims.head_dim, self.cfg.rope_theta, 0, &self.device)?.to_dtype(self.compute)?;
        Ok(KvCache {
            layers,
            rope,
            theta: self.cfg.rope_theta,
            head_dim: dims.head_dim,
            dtype: self.compute,
            device: self.device.clone(),
        })
    }

    /// Runs `ids` after whatever `cache` holds (a whole prompt into an empty one) and
    /// returns the last position's hidden state `[H]`, after the final norm.
    pub fn prefill(&self, ids: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        self.forward(ids, cache)
    }

    /// One token after those in `cache`: its hidden state `[H]`.
    pub fn step(&self, id: u32, cache: &mut KvCache) -> Result<Tensor> {
        self.forward(&[id], cache)
    }

    fn forward(&self, ids: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        let n = ids.len();
        if n == 0 {
            return Err(Error::BadRequest("the LM was given no tokens to run".into()));
        }
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.cfg.vocab_size) {
            return Err(Error::BadRequest(format!(
                "token id {bad} is outside the LM's vocabulary of {}",
                self.cfg.vocab_size
            )));
        }
        let offset = cache.len();
        cache.make_room(offset + n)?;
        let mask = match causal_mask_after(offset, n, &self.device)? {
            Some(m) => Some(m.to_dtype(self.compute)?),
            None => None,
        };
        let ids = Tensor::from_vec(ids.to_vec(), n, &self.device)?;
        let mut x = self.embed_tokens.index_select(&ids, 0)?.to_dtype(self.compute)?; // (n, H)
        for (layer, layer_cache) in self.layers.iter().zip(&mut cache.layers) {
            x = layer.forward_cached(self.kernels, &x, &cache.rope, layer_cache, mask.as_ref())?;
        }
        let last = x.narrow(0, n - 1, 1)?;
        Ok(rms_norm(self.kernels, &last, &self.norm, self.cfg.rms_norm_eps)?.squeeze(0)?)
    }

    /// The logits `[V]` (f32) of a hidden state `[H]`. With `keep`, only those token
    /// ranges of the LM head are computed, every other logit is `f32::NEG_INFINITY`
    /// (what a constrained decoder masks anyway).
    pub fn logits(&self, hidden: &Tensor, keep: Option<&[Range<u32>]>) -> Result<Vec<f32>> {
        let (v, h) = (self.cfg.vocab_size, self.cfg.hidden_size);
        let x = hidden.reshape((1, h))?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        let keep = match keep {
            Some(ranges) => kept_rows(ranges, v)?,
            None => std::iter::once(0..v).collect(),
        };
        if self.device.is_cpu() && x.dtype() == DType::F32 {
            let logits = x.contiguous()?.apply_op2_no_bwd(head, &Matvec::keeping(keep))?;
            return Ok(logits.flatten_all()?.to_vec1()?);
        }
        // Elsewhere candle's product over every row, then the mask.
        let all: Vec<f32> = x.matmul(&head.t()?)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let mut out = vec![f32::NEG_INFINITY; v];
        for r in keep {
            out[r.clone()].copy_from_slice(&all[r]);
        }
        Ok(out)
    }
}

/// `ranges` as ascending, disjoint row ranges within `0..vocab`; an error names the
/// first one out of bounds or overlapping another.
fn kept_rows(ranges: &[Range<u32>], vocab: usize) -> Result<Vec<Range<usize>>> {
    let mut rows: Vec<Range<usize>> =
        ranges.iter().filter(|r| !r.is_empty()).map(|r| r.start as usize..r.end as usize).collect();
    rows.sort_by_key(|r| r.start);
    if let Some(r) = rows.iter().find(|r| r.end > vocab) {
        return Err(Error::BadRequest(format!("kept tokens {r:?} reach past the LM's vocabulary of {vocab}")));
    }
    if let Some(p) = rows.windows(2).find(|p| p[0].end > p[1].start) {
        return Err(Error::BadRequest(format!("kept tokens {:?} and {:?} overlap", p[0], p[1])));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_rows_are_sorted_and_checked() {
        assert_eq!(kept_rows(&[10..12, 0..3, 5..5], 20).unwrap(), vec![0..3, 10..12]);
        let past = kept_rows(std::slice::from_ref(&(15..21)), 20).unwrap_err().to_string();
        assert!(past.contains("15..21") && past.contains("20"), "{past}");
        let overlap = kept_rows(&[0..5, 4..6], 20).unwrap_err().to_string();
        assert!(overlap.contains("overlap"), "{overlap}");
    }
}

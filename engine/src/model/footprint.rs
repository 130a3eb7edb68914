//! Parameter counts and an analytic estimate of training memory, for `inspect` and
//! the app: what a model folder will cost before anything is loaded.

use serde::Serialize;

use super::weights::expected_shapes;
use super::DitConfig;

#[derive(Debug, Clone, Serialize)]
pub struct Footprint {
    pub dit_parameters: u64,
    /// LoRA elements for the given rank on q/k/v/o of self- and cross-attention.
    pub lora_parameters: u64,
    pub weights_bytes: u64,
    /// LoRA tensors, their gradients and AdamW's two moments, all f32.
    pub trainable_state_bytes: u64,
    pub activations_bytes: u64,
    pub activations_checkpointed_bytes: u64,
}

impl Footprint {
    pub fn total(&self, checkpointing: bool) -> u64 {
        let act = if checkpointing { self.activations_checkpointed_bytes } else { self.activations_bytes };
        self.weights_bytes + self.trainable_state_bytes + act
    }
}

/// Estimate for one sample of `frames` latent frames (25 per second), weights stored
/// in `weight_bytes` per element, activations in `act_bytes`, attention scores in f32.
///
/// Per layer and patch the backward keeps about 16 hidden-sized and 3 MLP-sized
/// vectors (norms, modulations, projections, residuals) plus the attention scores
/// and probabilities; checkpointing keeps one hidden vector per layer, full
/// self-attention's output on its layers, and one layer's activations during its
/// recompute.
pub fn estimate(cfg: &DitConfig, frames: usize, rank: usize, weight_bytes: u64, act_bytes: u64) -> Footprint {
    let dit_parameters: u64 = expected_shapes(cfg).values().map(|s| s.iter().product::<usize>() as u64).sum();
    let (h, q, kv) = (
        cfg.hidden_size as u64,
        (cfg.num_attention_heads * cfg.head_dim) as u64,
        (cfg.num_key_value_heads * cfg.head_dim) as u64,
    );
    // q, k, v, o for self and cross attention: r * (in + out) each.
    let per_layer_lora = 2 * rank as u64 * ((h + q) + 2 * (h + kv) + (q + h));
    let lora_parameters = per_layer_lora * cfg.num_hidden_layers as u64;
    let p = frames.div_ceil(cfg.patch_size) as u64;
    let heads = cfg.num_attention_heads as u64;
    let vectors = p * (16 * h + 3 * cfg.intermediate_size as u64) * act_bytes;
    let scores = |keys: u64| 2 * heads * p * keys * 4;
    let layer = |i: usize| {
        let keys = if cfg.is_sliding(i) { p.min(2 * cfg.sliding_window as u64 + 1) } else { p };
        vectors + scores(keys)
    };
    let layers = cfg.num_hidden_layers;
    let activations_bytes: u64 = (0..layers).map(layer).sum();
    let largest = (0..layers).map(layer).max().unwrap_or(0);
    let full_layers = (0..layers).filter(|&i| !cfg.is_sliding(i)).count() as u64;
    let kept = layers as u64 * p * h * act_bytes + full_layers * p * q * act_bytes;
    Footprint {
        dit_parameters,
        lora_parameters,
        weights_bytes: dit_parameters * weight_bytes,
        trainable_state_bytes: lora_parameters * 4 * 4,
        activations_bytes,
        activations_checkpointed_bytes: kept + largest,
    }
}

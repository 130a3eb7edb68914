//! Parameter counts and an estimate of a training run's peak memory, before anything
//! is loaded: `train::fit` turns it into a plan for the machine, `inspect` prints it.
//!
//! The peak is the base weights, the LoRA state (parameters, gradients, the
//! optimizer's state, all f32), one batch, and the activations a step keeps for its backward.
//! The activation terms follow what the training path keeps (see each term) and are
//! calibrated against the live-heap peaks of the bench presets: `tests/footprint.rs`
//! measures the small ones, bench/NOTES.md records the bigger ones.

use serde::Serialize;

use crate::model::weights::expected_shapes;
use crate::model::DitConfig;

/// What one run trains on, as far as memory goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Latent frames of the longest sample.
    pub frames: usize,
    pub batch: usize,
    /// Rows of the condition sequence.
    pub encoder_len: usize,
    /// Adapter elements (LoRA's `r * (in + out)` summed over the adapted modules).
    pub lora_parameters: u64,
    /// Bytes of the weights one layer's adapter builds whole and keeps for backward
    /// (LoKr's; `train::fit::rebuilt_weight_bytes`).
    pub rebuilt_weight_bytes: u64,
    /// f32 values of optimizer state per LoRA element
    /// (`OptimizerConfig::state_per_parameter`: AdamW's 2).
    pub optimizer_state_per_parameter: u64,
    /// Bytes of an element of the activations and of the weights around the layers (the
    /// compute dtype).
    pub dtype_bytes: u64,
    /// Bytes of an element of the layers' weights as held: `dtype_bytes`, or 2 where
    /// bf16 weights are widened to the compute dtype while their layer runs.
    pub layer_weights_dtype_bytes: u64,
    /// Attention through the CPU kernels, which keep no `P x S` scores; candle's ops
    /// (GPUs) keep them for blocks of up to 2M scores.
    pub cpu_kernels: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Footprint {
    pub dit_parameters: u64,
    pub lora_parameters: u64,
    pub weights_bytes: u64,
    /// LoRA tensors and the optimizer's state, all f32 (the gradients are counted with
    /// the step's activations).
    pub trainable_state_bytes: u64,
    /// One batch of latents, context and condition, and the step's noise and target.
    pub batch_bytes: u64,
    /// What the step keeps at its peak without gradient checkpointing.
    pub activations_bytes: u64,
    /// The same with gradient checkpointing.
    pub activations_checkpointed_bytes: u64,
}

impl Footprint {
    /// The predicted peak of a training step.
    pub fn total(&self, checkpointing: bool) -> u64 {
        let act = if checkpointing { self.activations_checkpointed_bytes } else { self.activations_bytes };
        self.weights_bytes + self.trainable_state_bytes + self.batch_bytes + act
    }
}

/// Elements of the DiT `cfg` describes.
pub fn dit_parameters(cfg: &DitConfig) -> u64 {
    expected_shapes(cfg).values().map(|s| s.iter().product::<usize>() as u64).sum()
}

/// Elements of the DiT's layers (all but the embeddings and the head around them).
fn layer_parameters(cfg: &DitConfig) -> u64 {
    expected_shapes(cfg)
        .iter()
        .filter(|(name, _)| name.starts_with("layers."))
        .map(|(_, s)| s.iter().product::<usize>() as u64)
        .sum()
}

/// Per patch and layer, what a layer holds for its backward at the step's peak, in
/// halves of a hidden-sized vector (norm inputs, the projections' inputs, attention's
/// inputs and output, residual branches, and the backward's gradients on top of what
/// it has freed) and in MLP-sized vectors (`gate(x)` and `up(x)`, kept by the MLP
/// node). Fitted to the live-heap peaks of small-30s and small-240s, both modes (the
/// four lie within 2.2%; a plain layer and a recomputed one plus its backward hold
/// about the same).
const KEPT_HALF_HIDDEN: u64 = 41;
const KEPT_MLP: u64 = 2;
/// candle's attention ops keep scores and probabilities for blocks up to this many.
const SCORE_BLOCK: u64 = 2 << 20;

/// The estimate for `cfg` training on `w`.
pub fn estimate(cfg: &DitConfig, w: &Workload) -> Footprint {
    let dit_parameters = dit_parameters(cfg);
    let (h, q, mlp) =
        (cfg.hidden_size as u64, (cfg.num_attention_heads * cfg.head_dim) as u64, cfg.intermediate_size as u64);
    let (b, e) = (w.batch as u64, w.dtype_bytes);
    // Rows of the layers' sequences: patches of the longest sample, times the batch.
    let rows = b * w.frames.div_ceil(cfg.patch_size) as u64;
    let layers = cfg.num_hidden_layers as u64;
    let full_layers = (0..cfg.num_hidden_layers).filter(|&i| !cfg.is_sliding(i)).count() as u64;

    // candle's ops keep f32 scores and probabilities of self-attention over the
    // sample's patches, up to a block (unmeasured: no GPU on the calibration machine).
    let scores = match w.cpu_kernels {
        true => 0,
        false => {
            let patches = rows / b.max(1);
            2 * 4 * (rows * cfg.num_attention_heads as u64 * patches).min(SCORE_BLOCK)
        }
    };
    // Weights held narrower than the compute dtype: one layer's widened while it runs
    // (and, without checkpointing, kept by every layer's graph).
    let in_layers = layer_parameters(cfg);
    let widened = match w.layer_weights_dtype_bytes == e {
        true => 0,
        false => in_layers / layers.max(1) * e,
    };
    let layer = rows * (KEPT_HALF_HIDDEN * h / 2 + KEPT_MLP * mlp) * e + scores + w.rebuilt_weight_bytes + widened;
    let lora_grads = w.lora_parameters * 4;
    // Plain: every layer's graph at once.
    let activations_bytes = layers * layer + lora_grads;
    // Checkpointed: each layer's input and each full-attention layer's output kept,
    // then one layer recomputed and its backward.
    let kept = layers * rows * h * e + full_layers * rows * q * e;
    let activations_checkpointed_bytes = kept + layer + lora_grads;

    let frames = b * w.frames as u64;
    let latent = cfg.audio_acoustic_hidden_dim as u64;
    // Target, noise, x_t and velocity (latent-sized), context latents, the condition.
    let batch_bytes = (frames * (4 * latent + cfg.context_channels() as u64)
        + b * w.encoder_len as u64 * cfg.encoder_hidden_size as u64)
        * 4;
    Footprint {
        dit_parameters,
        lora_parameters: w.lora_parameters,
        weights_bytes: in_layers * w.layer_weights_dtype_bytes + (dit_parameters - in_layers) * e,
        trainable_state_bytes: w.lora_parameters * 4 * (1 + w.optimizer_state_per_parameter),
        batch_bytes,
        activations_bytes,
        activations_checkpointed_bytes,
    }
}

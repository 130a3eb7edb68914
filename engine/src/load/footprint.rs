//! Parameter counts and an estimate of a training run's peak memory, before anything
//! is loaded: `train::fit` turns it into a plan for the machine, `inspect` prints it.
//!
//! The peak is the base weights, the LoRA state (parameters, gradients, the
//! optimizer's state, all f32), one batch, and the activations a step keeps for its backward.
//! The activation terms follow what the training path keeps (see each term) and are
//! calibrated against the live-heap peaks of the bench presets: `tests/footprint.rs`
//! measures the small ones, bench/NOTES.md records the bigger ones.

use serde::Serialize;

use crate::model::attention::{use_banded, RECOMPUTE_ELEMENTS};
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
    /// The engine's CPU kernels run the step; without them (Metal, CUDA) candle's
    /// composed ops keep more, attention's scores among it.
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

/// The same without the CPU kernels (Metal, CUDA): candle's composed ops keep more of
/// their intermediates (the MLP's, the projections' and heads' copies, some in f32), so
/// a layer holds about 1.7 times as much per patch, and attention keeps its scores
/// wherever it does not recompute them ([`kept_scores`]), at this many bytes a score
/// (the f32 scores and probabilities, and the bf16 probabilities). Around the layers,
/// the embeddings, head and loss keep `OUTSIDE_HALF_HIDDEN_GPU` per patch, plus a
/// constant. Fitted by least squares to the heap peaks of small-30s (2, 4 and 8 layers)
/// and small-240s (4 and 8) in both modes, run as a GPU runs them on the CPU (bf16, no
/// CPU kernels; all ten within 1.1%), and checked on full-layer and full-pair-240s
/// (0.91-0.95; bench/NOTES.md).
const KEPT_HALF_HIDDEN_GPU: u64 = 65;
const KEPT_MLP_GPU: u64 = 4;
const KEPT_SCORE_BYTES_GPU: u64 = 14;
const OUTSIDE_HALF_HIDDEN_GPU: u64 = 77;
const OUTSIDE_GPU_BYTES: u64 = 24 << 20;

/// Scores a layer's attention keeps for its backward off the CPU kernels, over a batch
/// of `batch`, as `model::attention` decides: a sliding layer's whole square where it
/// is not banded, a full layer's square and cross-attention's `heads x P x S` where
/// they stay under the recompute size; banded and recomputed blocks keep none.
fn kept_scores(cfg: &DitConfig, layer: usize, batch: u64, patches: u64, encoder_len: u64) -> u64 {
    let heads = cfg.num_attention_heads as u64;
    let under = |scores: u64| if scores <= RECOMPUTE_ELEMENTS as u64 { scores } else { 0 };
    let square = batch * heads * patches * patches;
    let self_attention = match cfg.is_sliding(layer) {
        true if use_banded(patches as usize, cfg.sliding_window, false) => 0,
        true => square,
        false => under(square),
    };
    self_attention + under(batch * heads * patches * encoder_len)
}

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

    // Weights held narrower than the compute dtype: one layer's widened while it runs
    // (and, without checkpointing, kept by every layer's graph).
    let in_layers = layer_parameters(cfg);
    let widened = match w.layer_weights_dtype_bytes == e {
        true => 0,
        false => in_layers / layers.max(1) * e,
    };
    let per_layer = |layer: usize| match w.cpu_kernels {
        true => rows * (KEPT_HALF_HIDDEN * h / 2 + KEPT_MLP * mlp) * e,
        false => {
            let patches = rows / b.max(1);
            rows * (KEPT_HALF_HIDDEN_GPU * h / 2 + KEPT_MLP_GPU * mlp) * e
                + KEPT_SCORE_BYTES_GPU * kept_scores(cfg, layer, b, patches, w.encoder_len as u64)
        }
    } + w.rebuilt_weight_bytes
        + widened;
    // Without the CPU kernels, what the embeddings, the head and the loss keep.
    let around = match w.cpu_kernels {
        true => 0,
        false => rows * OUTSIDE_HALF_HIDDEN_GPU * h / 2 * e + OUTSIDE_GPU_BYTES,
    };
    let lora_grads = w.lora_parameters * 4;
    // Plain: every layer's graph at once.
    let activations_bytes = (0..cfg.num_hidden_layers).map(per_layer).sum::<u64>() + around + lora_grads;
    // Checkpointed: each layer's input and each full-attention layer's output kept,
    // then one layer (the largest) recomputed and its backward.
    let kept = layers * rows * h * e + full_layers * rows * q * e;
    let largest = (0..cfg.num_hidden_layers).map(per_layer).max().unwrap_or(0);
    let activations_checkpointed_bytes = kept + largest + around + lora_grads;

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

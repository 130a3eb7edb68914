//! Which kernels the model's ops run: chosen once per model (from its device unless
//! set) and carried by the model, its layers' context and the codec encoders, so no
//! switch is read while ops run.
//!
//! The engine's custom ops (candle `CustomOp1/2/3`), 19 of them. Seven have Metal and
//! CUDA forwards and run on every device:
//! `pruned-{add,sub,mul,matmul,linear}` (one op, `ops`), `lora-linear` and its
//! backward's `thin-matmul` (`lora_linear`), `recompute-attention` (`attention`),
//! `seeded-backward` (`roots`), `rms-norm-node` and `softmax-node` (`ops::device`:
//! candle-nn's forwards, backwards in candle ops). The other twelve have a CPU forward
//! only; without CPU kernels (Metal, CUDA, and the CPU under [`KernelPolicy::gpu`]) each
//! is replaced by:
//!
//! | CPU-only op | path without CPU kernels |
//! | --- | --- |
//! | `fused-softmax`, `fused-softmax-bwd` | `softmax-node` |
//! | `fused-rms-norm`, `fused-rms-norm-bwd` | `rms-norm-node` (a tracked weight: sqr / mean / sqrt / recip, times the weight) |
//! | `fused-gated-add` | pruned add of a pruned mul |
//! | `fused-swiglu`, `fused-swiglu-bwd` | candle's silu, pruned mul |
//! | `split-heads`, `split-heads-bwd` | reshape, the composed RMSNorm and rotate-half RoPE, transpose |
//! | `merge-heads` | transpose, reshape |
//! | `swiglu-mlp` | three pruned linears around the composed SwiGLU |
//! | `gated-residual-root` | the recompute runs the whole MLP and ends at `seeded-backward` |
//!
//! Attention's CPU kernels (`attention_host`, not ops of their own) give way to candle
//! ops inside `recompute-attention`, and the VAE's direct convolutions to candle's
//! `conv1d` / `conv_transpose1d`.
//!
//! A CPU-only op errs in its forward under a policy without CPU kernels, as candle's
//! default Metal and CUDA forwards do: run on the CPU under [`KernelPolicy::gpu`], the
//! training step and the encoders fail wherever a GPU would meet such an op
//! (`engine/tests/gpu_policy.rs`).

use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

/// The kernels a model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct KernelPolicy {
    /// The engine's CPU kernels for f32 tensors on the CPU: the fused row ops, head
    /// split and merge, the one-node MLP, attention's host kernels, the VAE's direct
    /// convolutions. Off, only candle ops and ops with Metal and CUDA forwards run.
    pub cpu_kernels: bool,
    pub sliding: SlidingAttention,
    pub scores: AttentionScores,
}

/// How sliding-window layers attend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SlidingAttention {
    /// Banded query blocks where they pay off (`attention::use_banded`), else the
    /// masked square.
    Banded,
    /// Always the masked full square.
    Square,
}

/// What attention keeps for its backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttentionScores {
    /// Nothing past a size (always on the CPU kernels): the backward recomputes the
    /// scores block by block.
    Recompute,
    /// The scores and probabilities, on the graph.
    Keep,
}

impl KernelPolicy {
    /// The CPU's: the engine's CPU kernels, banded sliding attention, recompute.
    pub const fn cpu() -> Self {
        Self { cpu_kernels: true, sliding: SlidingAttention::Banded, scores: AttentionScores::Recompute }
    }

    /// Metal's and CUDA's: no CPU kernels; CPU-only ops err if reached.
    pub const fn gpu() -> Self {
        Self { cpu_kernels: false, ..Self::cpu() }
    }

    /// The policy for tensors on `device`.
    pub fn for_device(device: &Device) -> Self {
        match device.is_cpu() {
            true => Self::cpu(),
            false => Self::gpu(),
        }
    }

    /// Whether the CPU kernels run tensors of `dtype` on `device`.
    pub fn host(&self, device: &Device, dtype: DType) -> bool {
        self.cpu_kernels && device.is_cpu() && dtype == DType::F32
    }

    /// Whether the CPU kernels run `x`.
    pub fn on_host(&self, x: &Tensor) -> bool {
        self.host(x.device(), x.dtype())
    }

    /// The guard at the top of every CPU-only op's forward: an error naming `op` where
    /// the policy has no CPU kernels (a GPU has no forward for it).
    pub(crate) fn cpu_only(&self, op: &str) -> candle_core::Result<()> {
        match self.cpu_kernels {
            true => Ok(()),
            false => Err(candle_core::Error::Msg(format!(
                "`{op}` has no Metal or CUDA forward, and this kernel policy runs none of the CPU kernels"
            ))),
        }
    }
}

/// As the bench's flags set it: `cpu-kernels on, sliding banded, attention-scores recompute`.
impl fmt::Display for KernelPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on_off = if self.cpu_kernels { "on" } else { "off" };
        write!(f, "cpu-kernels {on_off}, sliding {}, attention-scores {}", self.sliding.name(), self.scores.name())
    }
}

impl SlidingAttention {
    pub fn name(self) -> &'static str {
        match self {
            Self::Banded => "banded",
            Self::Square => "square",
        }
    }
}

impl AttentionScores {
    pub fn name(self) -> &'static str {
        match self {
            Self::Recompute => "recompute",
            Self::Keep => "keep",
        }
    }
}

impl FromStr for SlidingAttention {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [Self::Banded, Self::Square]
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| format!("unknown sliding attention `{s}` (expected banded or square)"))
    }
}

impl FromStr for AttentionScores {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [Self::Recompute, Self::Keep]
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| format!("unknown attention scores `{s}` (expected recompute or keep)"))
    }
}

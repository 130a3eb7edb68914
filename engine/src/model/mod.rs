//! The ACE-Step 1.5 DiT ("decoder" in the checkpoint).
//!
//! `forward` is `prepare` (patchify, time and condition embeddings: no trainable
//! tensor takes part, so no graph), then every layer, then `head` (AdaLN output norm,
//! unpatchify, crop). Gradient checkpointing drives the same three pieces itself.

pub mod attention;
pub mod block;
pub mod config;
pub mod heads;
pub mod lora_linear;
pub mod mlp;
pub mod ops;
pub mod policy;
pub mod roots;
pub mod timesteps;
pub mod weights;

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, D};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

pub use block::{DitLayer, LayerContext};
pub use config::{DitConfig, LayerType};
pub use lora_linear::LinearAdapter;
pub use policy::{AttentionScores, KernelPolicy, SlidingAttention};
pub use weights::DecoderWeights;

use crate::Result;
use block::{Linear, Rope};

/// Channels of the sinusoidal timestep features.
pub const TIMESTEP_CHANNELS: usize = 256;

/// One batch as the DiT takes it.
pub struct DitInputs {
    /// `[B, T, 64]`: the noisy latent x_t.
    pub hidden_states: Tensor,
    /// `[B, T, 128]`: silence latent + chunk mask.
    pub context_latents: Tensor,
    /// `[B, L, E]`: the condition encoder's output.
    pub encoder_hidden_states: Tensor,
    /// `[B]`: t.
    pub timestep: Tensor,
    /// `[B]`: r (= t in ACE-Step's training).
    pub timestep_r: Tensor,
}

/// sinusoid(t * 1000) -> linear_1 -> SiLU -> linear_2 (= temb) -> SiLU -> time_proj.
struct TimestepEmbedding {
    linear_1: Linear,
    linear_2: Linear,
    time_proj: Linear,
}

impl TimestepEmbedding {
    fn load(w: &DecoderWeights, name: &str) -> Result<Self> {
        Ok(Self {
            linear_1: Linear::load(w, &format!("{name}.linear_1"), true)?,
            linear_2: Linear::load(w, &format!("{name}.linear_2"), true)?,
            time_proj: Linear::load(w, &format!("{name}.time_proj"), true)?,
        })
    }

    fn to_dtype(&self, dtype: DType) -> Result<Self> {
        Ok(Self {
            linear_1: self.linear_1.to_dtype(dtype)?,
            linear_2: self.linear_2.to_dtype(dtype)?,
            time_proj: self.time_proj.to_dtype(dtype)?,
        })
    }

    /// `t [B]` -> (`temb [B, H]`, `timestep_proj [B, 6, H]`).
    fn forward(&self, t: &Tensor, dtype: DType) -> Result<(Tensor, Tensor)> {
        let half = TIMESTEP_CHANNELS / 2;
        let freqs: Vec<f32> = (0..half).map(|k| (-(10000f64.ln()) * k as f64 / half as f64).exp() as f32).collect();
        let freqs = Tensor::from_vec(freqs, (1, half), t.device())?;
        let args = (t.to_dtype(DType::F32)?.unsqueeze(1)? * 1000.0)?.broadcast_mul(&freqs)?;
        let features = Tensor::cat(&[args.cos()?, args.sin()?], D::Minus1)?.to_dtype(dtype)?;
        let temb = self.linear_1.forward(&features, None)?.silu()?;
        let temb = self.linear_2.forward(&temb, None)?;
        let proj = self.time_proj.forward(&temb.silu()?, None)?;
        let (b, h) = temb.dims2()?;
        Ok((temb, proj.reshape((b, 6, h))?))
    }
}

/// The per-batch state `prepare` hands to the layers and the head.
pub struct Prepared {
    /// `[B, P, H]`: patch embeddings entering layer 0.
    pub hidden: Tensor,
    /// `[B, H]`: summed time embedding (t and t - r), for the output AdaLN.
    pub temb: Tensor,
    pub layer_ctx: LayerContext,
    /// Latent frames before patch padding, to crop the output to.
    pub frames: usize,
}

pub struct DitModel {
    cfg: DitConfig,
    /// The compute dtype; the layers' weights may be held narrower (`Self::computing_in`).
    dtype: DType,
    device: Device,
    kernels: KernelPolicy,
    proj_in: Linear,
    time_embed: TimestepEmbedding,
    time_embed_r: TimestepEmbedding,
    condition_embedder: Linear,
    layers: Vec<DitLayer>,
    norm_out: Tensor,
    /// `[1, 2, H]`: output AdaLN shift and scale.
    scale_shift_table: Tensor,
    proj_out: Linear,
}

impl DitModel {
    pub fn new(cfg: &DitConfig, w: &DecoderWeights) -> Result<Self> {
        let (h, p) = (cfg.hidden_size, cfg.patch_size);
        let proj_in_w = w.get("proj_in.1.weight")?;
        let (dtype, device) = (proj_in_w.dtype(), proj_in_w.device().clone());
        // Conv1d with kernel = stride = patch is a linear map of each flattened patch
        // (laid out [k, c]): weight [H, C, k] -> [H, k * C].
        let proj_in_w = proj_in_w.permute((0, 2, 1))?.contiguous()?.reshape((h, p * cfg.in_channels))?;
        // ConvTranspose1d likewise, candle has no backward for it: weight [H, out, k]
        // -> [k * out, H], output laid out [k, out] per patch; the bias repeats per k.
        let out_c = cfg.audio_acoustic_hidden_dim;
        let proj_out_w = w.get("proj_out.1.weight")?.permute((2, 1, 0))?.contiguous()?.reshape((p * out_c, h))?;
        let proj_out_b = w.get("proj_out.1.bias")?.unsqueeze(0)?.repeat((p, 1))?.flatten_all()?;
        Ok(Self {
            cfg: cfg.clone(),
            dtype,
            kernels: KernelPolicy::for_device(&device),
            device,
            proj_in: Linear::from_weight("proj_in.1", proj_in_w, Some(w.get("proj_in.1.bias")?)),
            time_embed: TimestepEmbedding::load(w, "time_embed")?,
            time_embed_r: TimestepEmbedding::load(w, "time_embed_r")?,
            condition_embedder: Linear::load(w, "condition_embedder", true)?,
            layers: (0..cfg.num_hidden_layers).map(|i| DitLayer::load(cfg, w, i)).collect::<Result<_>>()?,
            norm_out: w.get("norm_out.weight")?,
            scale_shift_table: w.get("scale_shift_table")?,
            proj_out: Linear::from_weight("proj_out.1", proj_out_w, Some(proj_out_b)),
        })
    }

    /// The model computing in `dtype` while its layers' weights stay in the dtype they
    /// were loaded in, each layer widened while it runs (`Precision::Bf16Weights`). The
    /// small tensors around the layers are converted once.
    pub fn computing_in(self, dtype: DType) -> Result<Self> {
        if dtype == self.dtype {
            return Ok(self);
        }
        Ok(Self {
            dtype,
            proj_in: self.proj_in.to_dtype(dtype)?,
            time_embed: self.time_embed.to_dtype(dtype)?,
            time_embed_r: self.time_embed_r.to_dtype(dtype)?,
            condition_embedder: self.condition_embedder.to_dtype(dtype)?,
            norm_out: self.norm_out.to_dtype(dtype)?,
            scale_shift_table: self.scale_shift_table.to_dtype(dtype)?,
            proj_out: self.proj_out.to_dtype(dtype)?,
            ..self
        })
    }

    pub fn config(&self) -> &DitConfig {
        &self.cfg
    }

    /// The compute dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The kernels the model's ops run (its device's unless set by [`Self::with_kernels`]).
    pub fn kernels(&self) -> KernelPolicy {
        self.kernels
    }

    /// The model running `kernels` instead of its device's: the GPU policy on the CPU
    /// (tests of the Metal and CUDA path), A/B runs of the bench.
    pub fn with_kernels(mut self, kernels: KernelPolicy) -> Self {
        self.kernels = kernels;
        self
    }

    /// The layers as held (their weights possibly narrower than the compute dtype).
    pub fn layers(&self) -> &[DitLayer] {
        &self.layers
    }

    /// Layer `i` ready to run in the compute dtype.
    pub fn layer(&self, i: usize) -> Result<std::borrow::Cow<'_, DitLayer>> {
        self.layers[i].in_dtype(self.dtype)
    }

    /// Linear modules inside the layers with their `[out, in]` weights: what an adapter may target.
    pub fn adaptable_linears(&self) -> Vec<(String, &Tensor)> {
        self.layers.iter().flat_map(|l| l.linears()).map(|lin| (lin.name.clone(), lin.weight())).collect()
    }

    /// Patchify, embed time and condition: everything before layer 0.
    pub fn prepare(&self, inputs: &DitInputs) -> Result<Prepared> {
        let cfg = &self.cfg;
        let (b, frames, _) = inputs.hidden_states.dims3()?;

        // 1. Time: t and t - r embedded separately, then summed.
        let (temb_t, proj_t) = self.time_embed.forward(&inputs.timestep, self.dtype)?;
        let t_minus_r = (&inputs.timestep - &inputs.timestep_r)?;
        let (temb_r, proj_r) = self.time_embed_r.forward(&t_minus_r, self.dtype)?;

        // 2. concat(context, x_t) -> zero-pad T to a multiple of the patch -> proj_in.
        let x = Tensor::cat(
            &[&inputs.context_latents.to_dtype(self.dtype)?, &inputs.hidden_states.to_dtype(self.dtype)?],
            D::Minus1,
        )?;
        let patches = frames.div_ceil(cfg.patch_size);
        let pad = patches * cfg.patch_size - frames;
        let x = if pad > 0 { x.pad_with_zeros(1, 0, pad)? } else { x };
        let x = x.reshape((b, patches, cfg.patch_size * cfg.in_channels))?;
        let hidden = self.proj_in.forward(&x, None)?; // (B, P, H)

        // 3. Condition, RoPE tables, sliding-window plan.
        let encoder_states =
            self.condition_embedder.forward(&inputs.encoder_hidden_states.to_dtype(self.dtype)?, None)?;
        let sliding = if (0..cfg.num_hidden_layers).any(|i| cfg.is_sliding(i)) {
            attention::SlidingPlan::new(self.kernels, patches, cfg.sliding_window, self.dtype, &self.device)?
        } else {
            attention::SlidingPlan::Unmasked
        };
        Ok(Prepared {
            hidden,
            temb: (temb_t + temb_r)?,
            layer_ctx: LayerContext {
                timestep_proj: (proj_t + proj_r)?,
                encoder_states,
                rope: Rope::new(cfg, patches, self.dtype, &self.device)?,
                sliding,
                kernels: self.kernels,
            },
            frames,
        })
    }

    /// Output AdaLN norm, unpatchify (ConvTranspose1d as a matmul), crop to T:
    /// `[B, P, H] -> [B, T, 64]` in the compute dtype.
    pub fn head(&self, x: &Tensor, prep: &Prepared) -> Result<Tensor> {
        let (b, p, _) = x.dims3()?;
        let m = ops::add(&self.scale_shift_table, &prep.temb.unsqueeze(1)?)?; // (B, 2, H)
        let (shift, scale) = (m.narrow(1, 0, 1)?, (m.narrow(1, 1, 1)? + 1.0)?);
        let h = ops::modulated_rms_norm(self.kernels, x, &self.norm_out, &scale, &shift, self.cfg.rms_norm_eps)?;
        let y = self.proj_out.forward(&h, None)?; // (B, P, k * 64)
        let y = y.reshape((b, p * self.cfg.patch_size, self.cfg.audio_acoustic_hidden_dim))?;
        Ok(y.narrow(1, 0, prep.frames)?)
    }

    /// The whole DiT: `[B, T, 64]` prediction of x1 - x0.
    pub fn forward(&self, inputs: &DitInputs, lora: Option<&dyn LinearAdapter>) -> Result<Tensor> {
        let prep = self.prepare(inputs)?;
        let mut x = prep.hidden.clone();
        for i in 0..self.layers.len() {
            x = self.layer(i)?.forward(&x, &prep.layer_ctx, lora)?;
        }
        self.head(&x, &prep)
    }

    /// Named intermediates of the base forward, in the reference fixtures' naming
    /// (`dbg.*`), for locating a mismatch.
    pub fn trace(&self, inputs: &DitInputs) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::new();
        let (temb, proj) = self.time_embed.forward(&inputs.timestep, self.dtype)?;
        out.push(("dbg.time_embed.temb".into(), temb));
        out.push(("dbg.time_embed.timestep_proj".into(), proj));
        let t_minus_r = (&inputs.timestep - &inputs.timestep_r)?;
        let (temb, proj) = self.time_embed_r.forward(&t_minus_r, self.dtype)?;
        out.push(("dbg.time_embed_r.temb".into(), temb));
        out.push(("dbg.time_embed_r.timestep_proj".into(), proj));
        let prep = self.prepare(inputs)?;
        out.push(("dbg.proj_in".into(), prep.hidden.clone()));
        out.push(("dbg.condition_embedder".into(), prep.layer_ctx.encoder_states.clone()));
        let mut x = prep.hidden.clone();
        for i in 0..self.layers.len() {
            x = self.layer(i)?.forward(&x, &prep.layer_ctx, None)?;
            out.push((format!("dbg.layers.{i}.out"), x.clone()));
        }
        out.push(("dbg.norm_out".into(), ops::rms_norm(self.kernels, &x, &self.norm_out, self.cfg.rms_norm_eps)?));
        Ok(out)
    }
}

impl DecoderWeights {
    /// Seeded random weights for a config: linear weights ~ N(0, std), norms 1,
    /// biases 0, AdaLN tables ~ N(0, 1/sqrt(H)) as diffusers initialises them.
    pub fn random(cfg: &DitConfig, seed: u64, std: f64, dtype: DType, device: &Device) -> Result<Self> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut tensors = HashMap::new();
        for (name, shape) in weights::expected_shapes(cfg) {
            let n: usize = shape.iter().product();
            let values: Vec<f32> = if name.ends_with("norm.weight") || name.ends_with("norm_out.weight") {
                vec![1.0; n]
            } else if name.ends_with(".bias") {
                vec![0.0; n]
            } else {
                let sd = if name.ends_with("scale_shift_table") { 1.0 / (cfg.hidden_size as f64).sqrt() } else { std };
                let normal = Normal::new(0.0, sd).expect("valid std");
                (0..n).map(|_| normal.sample(&mut rng) as f32).collect()
            };
            let t = Tensor::from_vec(values, shape, device)?.to_dtype(dtype)?;
            tensors.insert(name, t);
        }
        Self::from_tensors(tensors, cfg)
    }
}

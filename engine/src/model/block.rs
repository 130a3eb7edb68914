//! One DiT layer: AdaLN self-attention (GQA, q/k RMSNorm, RoPE, sliding band) ->
//! cross-attention -> AdaLN SwiGLU MLP. Plus the shared pieces: `Linear`, RoPE.

use std::borrow::Cow;

use candle_core::{DType, Device, Tensor, D};

use super::attention::{self, KeptOutput, SlidingPlan};
use super::heads;
use super::mlp;
use super::ops;
use super::policy::KernelPolicy;
use super::roots;
use super::weights::DecoderWeights;
use super::{DitConfig, LinearAdapter};
use crate::Result;

/// A frozen linear layer that a LoRA adapter may extend, known by its module name.
#[derive(Clone)]
pub struct Linear {
    pub name: String,
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    pub fn load(w: &DecoderWeights, name: &str, bias: bool) -> Result<Self> {
        Ok(Self {
            name: name.to_string(),
            weight: w.get(&format!("{name}.weight"))?,
            bias: if bias { Some(w.get(&format!("{name}.bias"))?) } else { None },
        })
    }

    /// A linear layer from an already reshaped `[out, in]` weight (the patch convolutions).
    pub fn from_weight(name: &str, weight: Tensor, bias: Option<Tensor>) -> Self {
        Self { name: name.to_string(), weight, bias }
    }

    /// `[.., in] -> [.., out]`.
    pub fn forward(&self, x: &Tensor, lora: Option<&dyn LinearAdapter>) -> Result<Tensor> {
        let adapted = match lora {
            Some(l) => l.linear(&self.name, x, &self.weight)?,
            None => None,
        };
        match (adapted, &self.bias) {
            (Some(y), Some(bias)) => Ok(ops::add(&y, bias)?),
            (Some(y), None) => Ok(y),
            (None, bias) => Ok(ops::linear(x, &self.weight, bias.as_ref())?),
        }
    }

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The same layer with its tensors in `dtype`.
    pub fn to_dtype(&self, dtype: DType) -> Result<Self> {
        Ok(Self {
            name: self.name.clone(),
            weight: self.weight.to_dtype(dtype)?,
            bias: self.bias.as_ref().map(|b| b.to_dtype(dtype)).transpose()?,
        })
    }

    /// `(in, out)` features.
    pub fn features(&self) -> (usize, usize) {
        let (out, inp) = self.weight.dims2().expect("linear weights are 2-D");
        (inp, out)
    }
}

/// Rotate-half RoPE tables over patch positions: `cos`, `sin` of shape `[P, 1, head_dim]`
/// with the frequencies repeated (`cat([f, f])`), as Qwen3 and ACE-Step lay them out.
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    pub fn new(cfg: &DitConfig, positions: usize, dtype: DType, device: &Device) -> Result<Self> {
        let half = cfg.head_dim / 2;
        let inv_freq: Vec<f32> =
            (0..half).map(|i| 1.0 / cfg.rope_theta.powf(2.0 * i as f64 / cfg.head_dim as f64) as f32).collect();
        let inv_freq = Tensor::from_vec(inv_freq, (1, half), device)?;
        let pos = Tensor::arange(0u32, positions as u32, device)?.to_dtype(DType::F32)?.reshape((positions, 1))?;
        let freqs = pos.broadcast_mul(&inv_freq)?;
        let emb = Tensor::cat(&[&freqs, &freqs], D::Minus1)?; // (P, head_dim)
        Ok(Self {
            cos: emb.cos()?.to_dtype(dtype)?.unsqueeze(1)?, // (P, 1, head_dim)
            sin: emb.sin()?.to_dtype(dtype)?.unsqueeze(1)?,
        })
    }
}

#[derive(Clone)]
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Tensor,
    k_norm: Tensor,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    eps: f64,
}

impl Attention {
    fn load(cfg: &DitConfig, w: &DecoderWeights, prefix: &str) -> Result<Self> {
        Ok(Self {
            q_proj: Linear::load(w, &format!("{prefix}.q_proj"), false)?,
            k_proj: Linear::load(w, &format!("{prefix}.k_proj"), false)?,
            v_proj: Linear::load(w, &format!("{prefix}.v_proj"), false)?,
            o_proj: Linear::load(w, &format!("{prefix}.o_proj"), false)?,
            q_norm: w.get(&format!("{prefix}.q_norm.weight"))?,
            k_norm: w.get(&format!("{prefix}.k_norm.weight"))?,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            eps: cfg.rms_norm_eps,
        })
    }

    /// `x [B, P, H]` attends to `kv_input [B, S, H]` (itself for self-attention), with
    /// RoPE and the sliding-window plan for self-attention; `kept` is full attention's
    /// (see `attention::KeptOutput`).
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        kernels: KernelPolicy,
        x: &Tensor,
        kv_input: &Tensor,
        rope: Option<&Rope>,
        sliding: Option<&SlidingPlan>,
        lora: Option<&dyn LinearAdapter>,
        kept: Option<&KeptOutput>,
    ) -> Result<Tensor> {
        let (b, p, _) = x.dims3()?;
        let s = kv_input.dim(1)?;
        let (hd, kv, rep) = (self.head_dim, self.kv_heads, self.heads / self.kv_heads);

        // 1. Project; split heads into attention's grouped layout (see attention.rs),
        //    RMSNorm q and k over head_dim, RoPE (self-attention only). The 1/sqrt(D)
        //    score scale goes on q (P * heads * D values, in the same pass) rather than
        //    on the scores.
        let q_geo = heads::Geometry { batch: b, positions: p, kv_heads: kv, rep, head_dim: hd };
        let kv_geo = heads::Geometry { positions: s, rep: 1, ..q_geo };
        let rope = rope.map(|r| (&r.cos, &r.sin));
        let scale = (hd as f64).powf(-0.5);
        let q_norm = Some((&self.q_norm, self.eps));
        let q = heads::split(kernels, &self.q_proj.forward(x, lora)?, q_geo, q_norm, rope, scale)?;
        let k_norm = Some((&self.k_norm, self.eps));
        let k = heads::split(kernels, &self.k_proj.forward(kv_input, lora)?, kv_geo, k_norm, rope, 1.0)?;
        let v = heads::split(kernels, &self.v_proj.forward(kv_input, lora)?, kv_geo, None, None, 1.0)?;

        // 2. softmax(q k^T [+ band]) v, banded on long sliding-window layers:
        //    (B, KV, P * rep, D).
        let out = match sliding {
            Some(plan) => attention::sliding(kernels, &q, &k, &v, rep, plan)?,
            None => attention::full(kernels, &q, &k, &v, rep, None, kept)?,
        };

        // 3. Merge heads, output projection.
        self.o_proj.forward(&heads::merge(kernels, &out, q_geo)?, lora)
    }

    fn linears(&self) -> [&Linear; 4] {
        [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj]
    }

    fn to_dtype(&self, dtype: DType) -> Result<Self> {
        Ok(Self {
            q_proj: self.q_proj.to_dtype(dtype)?,
            k_proj: self.k_proj.to_dtype(dtype)?,
            v_proj: self.v_proj.to_dtype(dtype)?,
            o_proj: self.o_proj.to_dtype(dtype)?,
            q_norm: self.q_norm.to_dtype(dtype)?,
            k_norm: self.k_norm.to_dtype(dtype)?,
            ..*self
        })
    }
}

#[derive(Clone)]
struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    fn forward(&self, kernels: KernelPolicy, x: &Tensor, lora: Option<&dyn LinearAdapter>) -> Result<Tensor> {
        if let Some(weights) = self.fusable(lora) {
            return Ok(mlp::swiglu_mlp(kernels, x, weights[0], weights[1], weights[2])?);
        }
        let gate = self.gate_proj.forward(x, lora)?;
        let up = self.up_proj.forward(x, lora)?;
        self.down_proj.forward(&ops::swiglu(kernels, &gate, &up)?, lora)
    }

    /// The backward root of `x + self(h) * gate` from `grad_out` (see
    /// `mlp::gated_residual_root`), where the MLP runs as one node.
    #[allow(clippy::too_many_arguments)]
    fn gated_residual_root(
        &self,
        kernels: KernelPolicy,
        x: &Tensor,
        h: &Tensor,
        gate: &Tensor,
        grad_out: &Tensor,
        lora: Option<&dyn LinearAdapter>,
    ) -> Result<Option<Tensor>> {
        match self.fusable(lora) {
            Some(weights) => Ok(mlp::gated_residual_root(kernels, x, h, gate, weights, grad_out)?),
            None => Ok(None),
        }
    }

    /// The weights gate, up, down, when no LoRA adapts them and none has a bias.
    fn fusable(&self, lora: Option<&dyn LinearAdapter>) -> Option<[&Tensor; 3]> {
        let linears = [&self.gate_proj, &self.up_proj, &self.down_proj];
        let adapted = lora.is_some_and(|l| linears.iter().any(|m| l.adapts(&m.name)));
        let biased = linears.iter().any(|m| m.bias.is_some());
        (!adapted && !biased).then(|| linears.map(Linear::weight))
    }

    fn to_dtype(&self, dtype: DType) -> Result<Self> {
        Ok(Self {
            gate_proj: self.gate_proj.to_dtype(dtype)?,
            up_proj: self.up_proj.to_dtype(dtype)?,
            down_proj: self.down_proj.to_dtype(dtype)?,
        })
    }
}

/// A layer's state before its MLP: the residual stream `x`, the MLP's input `normed`,
/// and the MLP's residual gate.
struct BeforeMlp {
    x: Tensor,
    normed: Tensor,
    gate: Tensor,
}

/// What every layer reads besides its input: per-batch conditioning, built once per forward.
pub struct LayerContext {
    /// `[B, 6, H]`: the summed AdaLN projections of t and t - r.
    pub timestep_proj: Tensor,
    /// `[B, L, H]`: `condition_embedder(encoder_hidden_states)`.
    pub encoder_states: Tensor,
    pub rope: Rope,
    /// How sliding-window layers attend (masked square or banded blocks).
    pub sliding: SlidingPlan,
    /// The model's kernel policy.
    pub kernels: KernelPolicy,
}

#[derive(Clone)]
pub struct DitLayer {
    sliding: bool,
    eps: f64,
    self_attn_norm: Tensor,
    self_attn: Attention,
    cross_attn_norm: Tensor,
    cross_attn: Attention,
    mlp_norm: Tensor,
    mlp: Mlp,
    /// `[1, 6, H]`.
    scale_shift_table: Tensor,
}

impl DitLayer {
    pub fn load(cfg: &DitConfig, w: &DecoderWeights, i: usize) -> Result<Self> {
        let l = format!("layers.{i}");
        Ok(Self {
            sliding: cfg.is_sliding(i),
            eps: cfg.rms_norm_eps,
            self_attn_norm: w.get(&format!("{l}.self_attn_norm.weight"))?,
            self_attn: Attention::load(cfg, w, &format!("{l}.self_attn"))?,
            cross_attn_norm: w.get(&format!("{l}.cross_attn_norm.weight"))?,
            cross_attn: Attention::load(cfg, w, &format!("{l}.cross_attn"))?,
            mlp_norm: w.get(&format!("{l}.mlp_norm.weight"))?,
            mlp: Mlp {
                gate_proj: Linear::load(w, &format!("{l}.mlp.gate_proj"), false)?,
                up_proj: Linear::load(w, &format!("{l}.mlp.up_proj"), false)?,
                down_proj: Linear::load(w, &format!("{l}.mlp.down_proj"), false)?,
            },
            scale_shift_table: w.get(&format!("{l}.scale_shift_table"))?,
        })
    }

    /// The layer computing in `dtype`: itself, or a copy of its weights widened from the
    /// dtype they are held in (bf16-weights), which lives while the layer runs.
    pub fn in_dtype(&self, dtype: DType) -> Result<Cow<'_, Self>> {
        if self.scale_shift_table.dtype() == dtype {
            return Ok(Cow::Borrowed(self));
        }
        Ok(Cow::Owned(Self {
            self_attn_norm: self.self_attn_norm.to_dtype(dtype)?,
            self_attn: self.self_attn.to_dtype(dtype)?,
            cross_attn_norm: self.cross_attn_norm.to_dtype(dtype)?,
            cross_attn: self.cross_attn.to_dtype(dtype)?,
            mlp_norm: self.mlp_norm.to_dtype(dtype)?,
            mlp: self.mlp.to_dtype(dtype)?,
            scale_shift_table: self.scale_shift_table.to_dtype(dtype)?,
            ..*self
        }))
    }

    /// `x [B, P, H] -> [B, P, H]`.
    pub fn forward(&self, x: &Tensor, ctx: &LayerContext, lora: Option<&dyn LinearAdapter>) -> Result<Tensor> {
        self.forward_keeping(x, ctx, lora, None)
    }

    /// [`Self::forward`] for gradient checkpointing's first pass (without a graph):
    /// full self-attention keeps its output in `kept` for [`Self::backward_root`].
    pub fn forward_keeping(
        &self,
        x: &Tensor,
        ctx: &LayerContext,
        lora: Option<&dyn LinearAdapter>,
        kept: Option<&KeptOutput>,
    ) -> Result<Tensor> {
        let mid = self.until_mlp(x, ctx, lora, kept)?;
        let ff = self.mlp.forward(ctx.kernels, &mid.normed, lora)?;
        Ok(ops::gated_add(ctx.kernels, &mid.x, &ff, &mid.gate)?)
    }

    /// Gradient checkpointing's recompute: the layer from `x` as a backward root that
    /// hands its output the gradient `grad_out` (see `roots`), taking full
    /// self-attention's output from `kept` where the first pass left it. Where the MLP
    /// runs as one node, the root is the gated residual's own and the down projection
    /// never runs forward.
    pub fn backward_root(
        &self,
        x: &Tensor,
        ctx: &LayerContext,
        lora: Option<&dyn LinearAdapter>,
        grad_out: &Tensor,
        kept: &KeptOutput,
    ) -> Result<Tensor> {
        let k = ctx.kernels;
        let mid = self.until_mlp(x, ctx, lora, Some(kept))?;
        if let Some(root) = self.mlp.gated_residual_root(k, &mid.x, &mid.normed, &mid.gate, grad_out, lora)? {
            return Ok(root);
        }
        let ff = self.mlp.forward(k, &mid.normed, lora)?;
        Ok(roots::seeded(&ops::gated_add(k, &mid.x, &ff, &mid.gate)?, grad_out)?)
    }

    /// Everything before the MLP: AdaLN, both attentions with their residuals, the MLP's
    /// modulated norm.
    fn until_mlp(
        &self,
        x: &Tensor,
        ctx: &LayerContext,
        lora: Option<&dyn LinearAdapter>,
        kept: Option<&KeptOutput>,
    ) -> Result<BeforeMlp> {
        // 1. AdaLN parameters: shift, scale, gate for attention, then for the MLP.
        let m = ops::add(&self.scale_shift_table, &ctx.timestep_proj)?; // (B, 6, H)
        let chunk = |i: usize| m.narrow(1, i, 1); // (B, 1, H)
        let (shift, scale, gate) = (chunk(0)?, (chunk(1)? + 1.0)?, chunk(2)?);
        let (c_shift, c_scale, c_gate) = (chunk(3)?, (chunk(4)? + 1.0)?, chunk(5)?);

        // 2. Modulated self-attention, gated residual.
        let k = ctx.kernels;
        let h = ops::modulated_rms_norm(k, x, &self.self_attn_norm, &scale, &shift, self.eps)?;
        let plan = if self.sliding { Some(&ctx.sliding) } else { None };
        let attn = self.self_attn.forward(k, &h, &h, Some(&ctx.rope), plan, lora, kept)?;
        let x = ops::gated_add(k, x, &attn, &gate)?;

        // 3. Cross-attention to the condition, plain residual.
        let h = ops::rms_norm(k, &x, &self.cross_attn_norm, self.eps)?;
        let cross = self.cross_attn.forward(k, &h, &ctx.encoder_states, None, None, lora, None)?;
        let x = ops::add(&x, &cross)?;

        // 4. The MLP's modulated norm; the MLP and its gated residual follow.
        let normed = ops::modulated_rms_norm(k, &x, &self.mlp_norm, &c_scale, &c_shift, self.eps)?;
        Ok(BeforeMlp { x, normed, gate: c_gate })
    }

    /// The layer's linear modules, named as in the checkpoint.
    pub fn linears(&self) -> Vec<&Linear> {
        let mut all: Vec<&Linear> = self.self_attn.linears().into();
        all.extend(self.cross_attn.linears());
        all.extend([&self.mlp.gate_proj, &self.mlp.up_proj, &self.mlp.down_proj]);
        all
    }
}

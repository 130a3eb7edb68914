//! The pre-norm transformer layer shared by Qwen3 and ACE-Step's lyric and timbre
//! encoders (inference only): RMSNorm -> GQA self-attention (q/k RMSNorm over
//! head_dim, rotate-half RoPE, additive mask) -> residual -> RMSNorm -> SwiGLU MLP
//! -> residual. One unbatched sequence `[L, H]` at a time.

use candle_core::{Device, Tensor, D};

use crate::model::ops::{self, rms_norm, softmax_last_dim};
use crate::model::KernelPolicy;
use crate::tensor_io::TensorSource;
use crate::Result;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerDims {
    pub hidden: usize,
    pub intermediate: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub eps: f64,
}

/// Rotate-half RoPE tables `[L, head_dim]`, frequencies repeated (`cat([f, f])`).
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    pub fn new(head_dim: usize, theta: f64, len: usize, device: &Device) -> Result<Self> {
        let half = head_dim / 2;
        let inv: Vec<f32> = (0..half).map(|i| (1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)) as f32).collect();
        let inv = Tensor::from_vec(inv, (1, half), device)?;
        let pos = Tensor::arange(0u32, len as u32, device)?.to_dtype(candle_core::DType::F32)?.reshape((len, 1))?;
        let f = pos.broadcast_mul(&inv)?;
        let f = Tensor::cat(&[&f, &f], 1)?;
        Ok(Self { cos: f.cos()?, sin: f.sin()? })
    }

    /// `x [heads, L, D]`.
    fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let d = x.dim(D::Minus1)?;
        let x1 = x.narrow(D::Minus1, 0, d / 2)?;
        let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
        let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
        Ok((x.broadcast_mul(&self.cos)? + rotated.broadcast_mul(&self.sin)?)?)
    }
}

/// An additive mask `[L, L]`: 0 where query i may see key j, else the f32 minimum
/// (never -inf: a row with no visible key attends uniformly and stays finite, as
/// the reference's `finfo.min` masks do). `None` when every pair is visible.
pub fn additive_mask(
    len: usize,
    causal: bool,
    window: Option<usize>,
    key_valid: Option<&[bool]>,
    device: &Device,
) -> Result<Option<Tensor>> {
    let visible = |i: usize, j: usize| {
        (!causal || j <= i) && window.is_none_or(|w| i.abs_diff(j) <= w) && key_valid.is_none_or(|v| v[j])
    };
    let values: Vec<f32> = (0..len)
        .flat_map(|i| (0..len).map(move |j| (i, j)))
        .map(|(i, j)| if visible(i, j) { 0.0 } else { f32::MIN })
        .collect();
    if values.iter().all(|&v| v == 0.0) {
        return Ok(None);
    }
    Ok(Some(Tensor::from_vec(values, (len, len), device)?))
}

/// `x [.., in] @ w^T [in, out] (+ b)`, on the model's linear (the host kernel on the CPU).
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let y = ops::linear(x, w, None)?;
    Ok(match b {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    })
}

pub struct Layer {
    input_norm: Tensor,
    post_attention_norm: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    q_norm: Tensor,
    k_norm: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
    dims: LayerDims,
}

impl Layer {
    /// Loads `{prefix}.input_layernorm`, `.self_attn.{q,k,v,o}_proj`, `.self_attn.{q,k}_norm`,
    /// `.post_attention_layernorm`, `.mlp.{gate,up,down}_proj`; `name` maps an original
    /// key to the candidates to look for (diffusers names, say).
    pub fn load(
        f: &dyn TensorSource,
        prefix: &str,
        dims: LayerDims,
        name: &dyn Fn(&str) -> Vec<String>,
    ) -> Result<Self> {
        let get = |k: &str, shape: &[usize]| {
            let candidates = name(&format!("{prefix}.{k}"));
            let refs: Vec<&str> = candidates.iter().map(|s| s.as_str()).collect();
            f.get_any(&refs, shape)
        };
        let (h, hd) = (dims.hidden, dims.head_dim);
        let (qo, kvo) = (dims.heads * hd, dims.kv_heads * hd);
        Ok(Self {
            input_norm: get("input_layernorm.weight", &[h])?,
            post_attention_norm: get("post_attention_layernorm.weight", &[h])?,
            q: get("self_attn.q_proj.weight", &[qo, h])?,
            k: get("self_attn.k_proj.weight", &[kvo, h])?,
            v: get("self_attn.v_proj.weight", &[kvo, h])?,
            o: get("self_attn.o_proj.weight", &[h, qo])?,
            q_norm: get("self_attn.q_norm.weight", &[hd])?,
            k_norm: get("self_attn.k_norm.weight", &[hd])?,
            gate: get("mlp.gate_proj.weight", &[dims.intermediate, h])?,
            up: get("mlp.up_proj.weight", &[dims.intermediate, h])?,
            down: get("mlp.down_proj.weight", &[h, dims.intermediate])?,
            dims,
        })
    }

    /// `x [L, H]` -> `[L, H]`; `mask [L, L]` additive.
    pub fn forward(&self, k: KernelPolicy, x: &Tensor, rope: &Rope, mask: Option<&Tensor>) -> Result<Tensor> {
        self.forward_groups(k, x, 1, rope, mask)
    }

    /// `x [G * L, H]`: `groups` sequences of L rows one after another, each attending
    /// only within itself (`mask [L, L]` for each), the projections run over all rows at
    /// once -> `[G * L, H]`.
    pub fn forward_groups(
        &self,
        k: KernelPolicy,
        x: &Tensor,
        groups: usize,
        rope: &Rope,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let h = rms_norm(k, x, &self.input_norm, self.dims.eps)?;
        let x = (x + self.attention(k, &h, groups, rope, mask)?)?;
        let h = rms_norm(k, &x, &self.post_attention_norm, self.dims.eps)?;
        let mlp = (linear(&h, &self.gate, None)?.silu()? * linear(&h, &self.up, None)?)?;
        Ok((x + linear(&mlp, &self.down, None)?)?)
    }

    fn attention(
        &self,
        kernels: KernelPolicy,
        x: &Tensor,
        groups: usize,
        rope: &Rope,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let LayerDims { heads, kv_heads, head_dim: hd, eps, .. } = self.dims;
        let l = x.dim(0)? / groups;
        let rep = heads / kv_heads;
        // 1. Project, split heads, RMSNorm q/k over head_dim, RoPE: (G, heads, L, D).
        let split = |w: &Tensor, n: usize| -> Result<Tensor> {
            Ok(linear(x, w, None)?.reshape((groups, l, n, hd))?.transpose(1, 2)?)
        };
        let q = rope.apply(&rms_norm(kernels, &split(&self.q, heads)?, &self.q_norm, eps)?)?;
        let k = rope.apply(&rms_norm(kernels, &split(&self.k, kv_heads)?, &self.k_norm, eps)?)?;
        let v = split(&self.v, kv_heads)?.contiguous()?;
        // 2. GQA: the `rep` query heads of one KV head stacked on rows, (G, KV, rep * L, D).
        let q = q.contiguous()?.reshape((groups, kv_heads, rep * l, hd))?;
        let scores = (q.matmul(&k.contiguous()?.t()?)? * (hd as f64).powf(-0.5))?;
        // 3. Mask (after scaling, as SDPA adds it) and softmax.
        let scores = match mask {
            Some(m) => scores.reshape((groups, kv_heads, rep, l, l))?.broadcast_add(m)?.reshape((
                groups,
                kv_heads,
                rep * l,
                l,
            ))?,
            None => scores,
        };
        let out = softmax_last_dim(kernels, &scores)?.matmul(&v)?; // (G, KV, rep * L, D)
        let out = out.reshape((groups, heads, l, hd))?.transpose(1, 2)?.reshape((groups * l, heads * hd))?;
        linear(&out, &self.o, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_use_the_f32_minimum() {
        let dev = Device::Cpu;
        let m = additive_mask(4, false, Some(1), Some(&[false, true, true, true]), &dev).unwrap().unwrap();
        let v: Vec<Vec<f32>> = m.to_vec2().unwrap();
        // Row 0 sees keys 0..=1, key 0 is padding.
        assert_eq!(v[0], [f32::MIN, 0.0, f32::MIN, f32::MIN]);
        assert_eq!(v[3], [f32::MIN, f32::MIN, 0.0, 0.0]);
        assert!(additive_mask(3, false, Some(5), None, &dev).unwrap().is_none());
        let c: Vec<Vec<f32>> = additive_mask(2, true, None, None, &dev).unwrap().unwrap().to_vec2().unwrap();
        assert_eq!(c, [[0.0, f32::MIN], [0.0, 0.0]]);
    }
}

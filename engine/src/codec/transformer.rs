//! The pre-norm transformer layer shared by Qwen3 and ACE-Step's lyric and timbre
//! encoders (inference only): RMSNorm -> GQA self-attention (q/k RMSNorm over
//! head_dim, rotate-half RoPE, additive mask) -> residual -> RMSNorm -> SwiGLU MLP
//! -> residual. One unbatched sequence `[L, H]` at a time; a causal decoder's layer
//! also runs a few new rows against its [`LayerCache`] of earlier keys and values.

use candle_core::{DType, Device, Tensor, D};

use crate::kernels::cached_attention::SingleQueryAttention;
use crate::kernels::matvec::Matvec;
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
#[derive(Clone)]
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

    /// The tables in `dtype` (the activations' on a GPU computing in bf16).
    pub fn to_dtype(&self, dtype: DType) -> Result<Self> {
        Ok(Self { cos: self.cos.to_dtype(dtype)?, sin: self.sin.to_dtype(dtype)? })
    }

    /// How many positions the tables cover.
    pub fn positions(&self) -> usize {
        self.cos.dim(0).unwrap_or(0)
    }

    /// `x [.., L, D]` at positions `offset..offset + L`.
    fn apply(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        let (l, d) = (x.dim(D::Minus2)?, x.dim(D::Minus1)?);
        let (cos, sin) = (self.cos.narrow(0, offset, l)?, self.sin.narrow(0, offset, l)?);
        let x1 = x.narrow(D::Minus1, 0, d / 2)?;
        let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
        let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
        Ok((x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?)?)
    }
}

/// The causal mask `[rows, offset + rows]` of `rows` new positions after `offset`
/// cached ones: new row i sees keys up to `offset + i`. `None` for a single row (it
/// sees everything).
pub fn causal_mask_after(offset: usize, rows: usize, device: &Device) -> Result<Option<Tensor>> {
    if rows <= 1 {
        return Ok(None);
    }
    let keys = offset + rows;
    let values: Vec<f32> =
        (0..rows).flat_map(|i| (0..keys).map(move |j| if j <= offset + i { 0.0 } else { f32::MIN })).collect();
    Ok(Some(Tensor::from_vec(values, (rows, keys), device)?))
}

/// One layer's keys and values so far, `[1, kv_heads, capacity, head_dim]` each, filled
/// up to `len`: written in place as rows arrive and read as views, never re-concatenated
/// (grown, copying, only when a row would not fit).
pub struct LayerCache {
    k: Tensor,
    v: Tensor,
    len: usize,
}

impl LayerCache {
    pub fn new(kv_heads: usize, head_dim: usize, capacity: usize, dtype: DType, device: &Device) -> Result<Self> {
        let zeros = || Tensor::zeros((1, kv_heads, capacity, head_dim), dtype, device);
        Ok(Self { k: zeros()?, v: zeros()?, len: 0 })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.k.dim(2).unwrap_or(0)
    }

    /// Room for `total` positions, the filled ones kept.
    pub fn reserve(&mut self, total: usize) -> Result<()> {
        if total <= self.capacity() {
            return Ok(());
        }
        let (_, kv_heads, _, head_dim) = self.k.dims4()?;
        let mut grown = Self::new(kv_heads, head_dim, total, self.k.dtype(), self.k.device())?;
        if self.len > 0 {
            grown.k.slice_set(&self.k.narrow(2, 0, self.len)?, 2, 0)?;
            grown.v.slice_set(&self.v.narrow(2, 0, self.len)?, 2, 0)?;
        }
        grown.len = self.len;
        *self = grown;
        Ok(())
    }

    /// Appends `k`, `v` `[1, kv_heads, n, head_dim]` (stored in the cache's dtype); the
    /// keys and values of every position so far, `[1, kv_heads, len, head_dim]` views.
    fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        self.reserve(self.len + k.dim(2)?)?;
        let dtype = self.k.dtype();
        self.k.slice_set(&k.to_dtype(dtype)?.contiguous()?, 2, self.len)?;
        self.v.slice_set(&v.to_dtype(dtype)?.contiguous()?, 2, self.len)?;
        self.len += k.dim(2)?;
        Ok((self.k.narrow(2, 0, self.len)?, self.v.narrow(2, 0, self.len)?))
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

/// Query rows per attention block of a prompt: the scores of one block over 1240 keys
/// are 20 MB at the 5 Hz LM's 16 heads.
const QUERY_BLOCK: usize = 256;

/// Inputs of at most this many rows go through the matvec kernel on the CPU: each
/// weight is read once for all of them, which is what bounds their speed.
const MATVEC_ROWS: usize = 4;

/// `x [.., in] @ w^T [in, out] (+ b)`, on the model's linear (the host kernel on the CPU).
/// A weight held narrower than `x` (bf16 under f32) is read as it is by the matvec
/// kernel for a few rows (decoding), else widened for this product only.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let rows = x.elem_count() / x.dim(D::Minus1)?;
    let matvec = x.device().is_cpu() && x.dtype() == DType::F32 && x.rank() == 2 && rows <= MATVEC_ROWS;
    let y = if matvec && matches!(w.dtype(), DType::F32 | DType::BF16) && !w.track_op() {
        x.contiguous()?.apply_op2_no_bwd(&w.contiguous()?, &Matvec::all())?
    } else if w.dtype() != x.dtype() {
        ops::linear(x, &w.to_dtype(x.dtype())?, None)?
    } else {
        ops::linear(x, w, None)?
    };
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

    /// The layer with its projection weights held in `weights` and its norm gains in
    /// `norms` (the compute dtype).
    pub fn held_in(self, weights: DType, norms: DType) -> Result<Self> {
        let (w, n) = (|t: Tensor| t.to_dtype(weights), |t: Tensor| t.to_dtype(norms));
        Ok(Self {
            input_norm: n(self.input_norm)?,
            post_attention_norm: n(self.post_attention_norm)?,
            q: w(self.q)?,
            k: w(self.k)?,
            v: w(self.v)?,
            o: w(self.o)?,
            q_norm: n(self.q_norm)?,
            k_norm: n(self.k_norm)?,
            gate: w(self.gate)?,
            up: w(self.up)?,
            down: w(self.down)?,
            dims: self.dims,
        })
    }

    /// `x [n, H]`: n new positions after those in `cache`, whose keys and values they
    /// see and join -> `[n, H]`. `rope` covers every position; `mask [n, len + n]`
    /// ([`causal_mask_after`]).
    pub fn forward_cached(
        &self,
        k: KernelPolicy,
        x: &Tensor,
        rope: &Rope,
        cache: &mut LayerCache,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let h = rms_norm(k, x, &self.input_norm, self.dims.eps)?;
        let offset = cache.len();
        let (q, new_k, new_v) = self.project(k, &h, 1, rope, offset)?;
        let (keys, values) = cache.append(&new_k, &new_v)?;
        let rows = q.dim(2)?;
        let heads = if rows == 1 && k.on_host(&q) && mask.is_none() {
            let scale = (self.dims.head_dim as f32).powf(-0.5);
            q.contiguous()?.apply_op3_no_bwd(&keys, &values, &SingleQueryAttention { scale })?
        } else {
            // A prompt in blocks of query rows, each against the keys it can see: half
            // the products of the full square, and a score block instead of the square.
            let (keys, values) = (keys.to_dtype(q.dtype())?, values.to_dtype(q.dtype())?);
            let blocks = (0..rows)
                .step_by(QUERY_BLOCK)
                .map(|start| {
                    let (len, visible) =
                        (QUERY_BLOCK.min(rows - start), offset + start + QUERY_BLOCK.min(rows - start));
                    let mask = match mask {
                        Some(m) => Some(m.narrow(0, start, len)?.narrow(1, 0, visible)?),
                        None => None,
                    };
                    let (keys, values) = (keys.narrow(2, 0, visible)?, values.narrow(2, 0, visible)?);
                    self.attention_heads(k, &q.narrow(2, start, len)?, &keys, &values, mask.as_ref())
                })
                .collect::<Result<Vec<_>>>()?;
            Tensor::cat(&blocks, 2)?
        };
        let x = (x + self.merge_heads(&heads)?)?;
        self.mlp_block(k, &x)
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
        let (q, keys, values) = self.project(k, &h, groups, rope, 0)?;
        let heads = self.attention_heads(k, &q, &keys.contiguous()?, &values, mask)?;
        let x = (x + self.merge_heads(&heads)?)?;
        self.mlp_block(k, &x)
    }

    /// The MLP half with its residual: `x [L, H]` -> `[L, H]`.
    fn mlp_block(&self, k: KernelPolicy, x: &Tensor) -> Result<Tensor> {
        let h = rms_norm(k, x, &self.post_attention_norm, self.dims.eps)?;
        let mlp = ops::swiglu(k, &linear(&h, &self.gate, None)?, &linear(&h, &self.up, None)?)?;
        Ok((x + linear(&mlp, &self.down, None)?)?)
    }

    /// Projects the normed `x [G * L, H]` of positions `offset..offset + L`, splits heads,
    /// RMSNorms q/k over head_dim and applies RoPE: q `(G, heads, L, D)`, k and v
    /// `(G, KV, L, D)`.
    fn project(
        &self,
        kernels: KernelPolicy,
        x: &Tensor,
        groups: usize,
        rope: &Rope,
        offset: usize,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let LayerDims { heads, kv_heads, head_dim: hd, eps, .. } = self.dims;
        let l = x.dim(0)? / groups;
        let split = |w: &Tensor, n: usize| -> Result<Tensor> {
            Ok(linear(x, w, None)?.reshape((groups, l, n, hd))?.transpose(1, 2)?)
        };
        let q = rope.apply(&rms_norm(kernels, &split(&self.q, heads)?, &self.q_norm, eps)?, offset)?;
        let k = rope.apply(&rms_norm(kernels, &split(&self.k, kv_heads)?, &self.k_norm, eps)?, offset)?;
        let v = split(&self.v, kv_heads)?.contiguous()?;
        Ok((q, k, v))
    }

    /// GQA attention of `q (G, heads, Lq, D)` over `k`, `v (G, KV, Lk, D)` (each with a
    /// contiguous last dimension), `mask [Lq, Lk]` additive -> `(G, heads, Lq, D)`.
    fn attention_heads(
        &self,
        kernels: KernelPolicy,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let LayerDims { heads, kv_heads, head_dim: hd, .. } = self.dims;
        let (groups, _, lq, _) = q.dims4()?;
        let lk = k.dim(2)?;
        let rep = heads / kv_heads;
        // 1. The `rep` query heads of one KV head stacked on rows, (G, KV, rep * Lq, D).
        let q = q.contiguous()?.reshape((groups, kv_heads, rep * lq, hd))?;
        let scores = (q.matmul(&k.t()?)? * (hd as f64).powf(-0.5))?;
        // 2. Mask (after scaling, as SDPA adds it) and softmax.
        let scores = match mask {
            Some(m) => scores.reshape((groups, kv_heads, rep, lq, lk))?.broadcast_add(m)?.reshape((
                groups,
                kv_heads,
                rep * lq,
                lk,
            ))?,
            None => scores,
        };
        let out = softmax_last_dim(kernels, &scores)?.matmul(v)?; // (G, KV, rep * Lq, D)
        Ok(out.reshape((groups, heads, lq, hd))?)
    }

    /// The heads `(G, heads, L, D)` side by side, through the output projection ->
    /// `[G * L, H]`.
    fn merge_heads(&self, heads: &Tensor) -> Result<Tensor> {
        let (groups, n, l, hd) = heads.dims4()?;
        linear(&heads.transpose(1, 2)?.reshape((groups * l, n * hd))?, &self.o, None)
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

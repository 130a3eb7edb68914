//! Scaled dot-product attention for the training path, with GQA rows grouped per KV
//! head and a banded form for sliding-window layers.
//!
//! Layout: queries are `(B, KV, P * rep, D)` with rows ordered (position, query head
//! within the group): the `rep` query heads that share a KV head sit next to each
//! other, so a block of query positions is one contiguous row range (no copy to cut it
//! out), and K/V are never repeated. Keys and values are `(B, KV, S, D)`.
//!
//! A sliding-window layer lets position i see keys j with |i - j| <= window. The masked
//! full square computes P x P scores and throws most away at long P; [`banded`] cuts
//! the queries into blocks and scores each block only against the keys its rows can
//! see, `[start - window, end + window)`, masking the corners of that rectangle. A key
//! outside the band gets `f32::MIN` in the full square, so its probability is exactly 0:
//! both forms give the same softmax up to summation order. Past a size, attention runs
//! in query blocks through [`Recompute`], which keeps no scores and recomputes them in
//! its backward (on the CPU in f32 with the kernels of `attention_host`); gradients
//! flow to q, k, v (and the LoRA tensors behind them) either way.

use candle_core::{CpuStorage, CudaStorage, DType, Device, Layout, MetalStorage, Shape, Tensor};

use super::ops;
use super::policy::{AttentionScores, KernelPolicy, SlidingAttention};
use crate::kernels::attention_host::{self, BandBlock};
use crate::kernels::handover::{on_cpu, on_cuda, on_metal, Handover};
use crate::trace;
use crate::Result;

/// Query positions per block of [`banded`]. With window W, a block of `b` queries reads
/// `b + 2W` keys: b = W/2 wastes 1/5 of the rectangle at W = 128 while keeping the
/// number of small matmuls low.
pub fn block_size(window: usize) -> usize {
    (window / 2).max(16)
}

/// Whether the banded form pays off at `positions`: it scores about
/// `P * (block + 2W)` pairs instead of `P * P`. The CPU kernels (`host`) run it as fast
/// as the square wherever its blocks skip any keys (P > 2W); elsewhere it runs as many
/// small candle ops, worth it only at longer P.
pub fn use_banded(positions: usize, window: usize, host: bool) -> bool {
    positions > if host { 2 } else { 4 } * window
}

/// The additive mask for query rows `[q_start, q_start + q_len)` against keys
/// `[k_start, k_start + k_len)`: 0 where `|i - j| <= window`, else the f32 minimum (not
/// -inf, as ACE-Step: a row with no valid key stays finite). `(q_len, 1, k_len)`, to
/// broadcast over the `rep` query heads of a row. `None` when every pair is in the band.
pub fn band_mask(
    q_start: usize,
    q_len: usize,
    k_start: usize,
    k_len: usize,
    window: usize,
    device: &Device,
) -> Result<Option<Tensor>> {
    let inside = |i: usize, j: usize| (q_start + i).abs_diff(k_start + j) <= window;
    let corners = [(0, k_len - 1), (q_len - 1, 0)];
    if corners.iter().all(|&(i, j)| inside(i, j)) {
        return Ok(None);
    }
    let values: Vec<f32> =
        (0..q_len).flat_map(|i| (0..k_len).map(move |j| if inside(i, j) { 0.0 } else { f32::MIN })).collect();
    Ok(Some(Tensor::from_vec(values, (q_len, 1, k_len), device)?))
}

/// Whether attention's CPU kernels (`kernels::attention_host`) run the op.
fn host_kernels_apply(kernels: KernelPolicy, q: &Tensor, grad: Option<&Tensor>) -> bool {
    kernels.on_host(q) && grad.is_none_or(|g| g.dtype() == q.dtype())
}

/// The sliding-window attention plan for `positions` query and key positions: the
/// whole-square mask at short lengths, blocks at long ones (unless `kernels` asks for
/// the square). Built once per forward, for tensors of `dtype` on `device`.
#[derive(Clone)]
pub enum SlidingPlan {
    /// Every pair is inside the band: plain attention.
    Unmasked,
    /// `(P, 1, P)` additive mask over the full square.
    Masked(Tensor),
    Banded(Vec<BandBlock>),
}

impl SlidingPlan {
    pub fn new(kernels: KernelPolicy, positions: usize, window: usize, dtype: DType, device: &Device) -> Result<Self> {
        if positions <= window + 1 {
            return Ok(Self::Unmasked);
        }
        if !use_banded(positions, window, kernels.host(device, dtype)) || kernels.sliding == SlidingAttention::Square {
            let mask = band_mask(0, positions, 0, positions, window, device)?;
            return Ok(mask.map_or(Self::Unmasked, Self::Masked));
        }
        Self::banded(positions, window, block_size(window), device)
    }

    /// The banded plan with an explicit block size (tests compare it to the square).
    pub fn banded(positions: usize, window: usize, block: usize, device: &Device) -> Result<Self> {
        let mut blocks = Vec::new();
        // Interior blocks have the same geometry, hence the same mask: share it.
        let mut shared: Vec<((usize, usize, usize), Option<Tensor>)> = Vec::new();
        for q_start in (0..positions).step_by(block) {
            let q_len = block.min(positions - q_start);
            let k_start = q_start.saturating_sub(window);
            let k_len = (q_start + q_len + window).min(positions) - k_start;
            let key = (q_start - k_start, q_len, k_len);
            let mask = match shared.iter().find(|(k, _)| *k == key) {
                Some((_, m)) => m.clone(),
                None => {
                    let m = band_mask(q_start, q_len, k_start, k_len, window, device)?;
                    shared.push((key, m.clone()));
                    m
                }
            };
            blocks.push(BandBlock { q_start, q_len, k_start, k_len, mask });
        }
        Ok(Self::Banded(blocks))
    }
}

/// softmax(q k^T + mask) v for one row range. `q (B, KV, n * rep, D)` already scaled by
/// 1/sqrt(D), `k, v (B, KV, s, D)`, `mask (n, 1, s)`; returns `(B, KV, n * rep, D)`.
fn attend(
    kernels: KernelPolicy,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    rep: usize,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    let (b, kv, rows, _) = q.dims4()?;
    let s = k.dim(2)?;
    // Mask and softmax in f32 whatever the compute dtype, as the reference does.
    let scores = ops::matmul(q, &k.t()?)?.to_dtype(DType::F32)?; // (B, KV, n * rep, s)
    let scores = match mask {
        Some(mask) => {
            let grouped = scores.reshape((b, kv, rows / rep, rep, s))?;
            ops::add(&grouped, mask)?.reshape((b, kv, rows, s))?
        }
        None => scores,
    };
    let probs = ops::softmax_last_dim(kernels, &scores)?.to_dtype(v.dtype())?;
    Ok(ops::matmul(&probs, v)?)
}

/// Attention over all keys with an optional `(P, 1, S)` additive mask. Without a mask,
/// on the CPU kernels or past [`RECOMPUTE_ELEMENTS`] scores, it runs in query blocks
/// through [`Recompute`], which keeps no scores for the backward; there `kept` carries
/// its output from checkpointing's first forward to the layer's recompute.
pub fn full(
    kernels: KernelPolicy,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    rep: usize,
    mask: Option<&Tensor>,
    kept: Option<&KeptOutput>,
) -> Result<Tensor> {
    let (b, kv, rows, _) = q.dims4()?;
    let s = k.dim(2)?;
    let host = host_kernels_apply(kernels, q, None);
    let recomputes = kernels.scores == AttentionScores::Recompute;
    if mask.is_none() && (host || b * kv * rows * s > RECOMPUTE_ELEMENTS) && recomputes {
        let p = rows / rep;
        let block = match host {
            true => HOST_HEAD_BLOCK_ELEMENTS / (rep * s),
            false => RECOMPUTE_BLOCK_ELEMENTS / (b * kv * rep * s),
        }
        .max(16)
        .min(p);
        let blocks = (0..p)
            .step_by(block)
            .map(|q_start| BandBlock { q_start, q_len: block.min(p - q_start), k_start: 0, k_len: s, mask: None })
            .collect::<Vec<_>>();
        return recompute(kernels, q, k, v, rep, &blocks, kept);
    }
    attend(kernels, q, k, v, rep, mask)
}

/// A layer's full self-attention output, kept by gradient checkpointing's first
/// forward (without a graph) and taken by the layer's recompute, which then attaches
/// the backward to it instead of computing it again: the most expensive part of a long
/// layer's forward, for `P * heads * (D + 1)` values per full-attention layer (6 MiB at
/// small-240s: the output and each row's log-sum-exp). The values are the ones the
/// recompute would compute: same inputs, same kernels.
#[derive(Default)]
pub struct KeptOutput(std::cell::Cell<Option<Attended>>);

impl KeptOutput {
    fn keep(&self, attended: Attended) {
        self.0.set(Some(attended));
    }

    fn take(&self) -> Option<Attended> {
        self.0.take()
    }
}

/// The recompute path's forward result: the output and, from the CPU kernels, each
/// query row's log-sum-exp, which their backward needs.
struct Attended {
    out: Tensor,
    lse: Option<Vec<f32>>,
}

/// Score count above which attention off the CPU kernels no longer keeps its scores
/// (and probabilities) for the backward. 2M: small-240s's cross-attention (3M scores)
/// then keeps neither, 24 MiB of a checkpointed layer's graph. The CPU kernels
/// recompute at every size: at small-30s that is 0.87x the step time of keeping
/// the scores, and less memory (bench/NOTES.md, 24).
pub const RECOMPUTE_ELEMENTS: usize = 1 << 21;
/// About how many scores one query block of the recompute path holds at a time. Its
/// candle-op backward keeps three such buffers (probabilities, their gradient, the
/// scores' gradient) at once: 2M scores = 24 MiB in f32 (96 MiB at 8M, which set the
/// checkpointed step's peak).
const RECOMPUTE_BLOCK_ELEMENTS: usize = 1 << 21;
/// The same per head for the CPU kernels (`attention_host`), which run a head per
/// thread: two threads then hold as much scratch as one head's 2M-score blocks did
/// when heads ran one after another. Twice this was no faster and held 20 MiB more;
/// an eighth was 1.15x slower, as each GEMM packs its operands anew (bench/NOTES.md, 23).
const HOST_HEAD_BLOCK_ELEMENTS: usize = 1 << 20;

/// Blockwise attention whose backward recomputes each block's probabilities instead of
/// keeping them: memory O(block) rather than O(P * S) per layer, for one more
/// `q k^T` + softmax per block in the backward. The forward runs without a graph; the
/// op only attaches the backward to q, k and v.
///
/// With `kept`, a forward without a graph keeps its output there and a tracked one
/// takes it from there.
fn recompute(
    kernels: KernelPolicy,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    rep: usize,
    blocks: &[BandBlock],
    kept: Option<&KeptOutput>,
) -> Result<Tensor> {
    let tracked = q.track_op() || k.track_op() || v.track_op();
    let attended = match kept.filter(|_| tracked).and_then(KeptOutput::take) {
        Some(attended) => attended,
        None => match host_kernels_apply(kernels, q, None) {
            true => {
                let (out, lse) = attention_host::forward(q, k, v, rep, blocks)?;
                Attended { out, lse: Some(lse) }
            }
            false => {
                let out = blocked_forward(kernels, &q.detach(), &k.detach(), &v.detach(), rep, blocks)?;
                Attended { out, lse: None }
            }
        },
    };
    if !tracked {
        let out = attended.out.clone();
        if let Some(slot) = kept {
            slot.keep(attended);
        }
        return Ok(out);
    }
    let op = Recompute {
        kernels,
        out: Handover::new(attended.out, "recompute-attention"),
        lse: attended.lse,
        rep,
        blocks: blocks.to_vec(),
    };
    Ok(q.apply_op3(k, v, op)?)
}

/// Attention block by block, concatenated; with tracked inputs the graph keeps every
/// block's scores (the reference the recompute path is tested against).
fn blocked_forward(
    kernels: KernelPolicy,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    rep: usize,
    blocks: &[BandBlock],
) -> Result<Tensor> {
    let outs = blocks
        .iter()
        .map(|blk| {
            let q = q.narrow(2, blk.q_start * rep, blk.q_len * rep)?;
            let k = k.narrow(2, blk.k_start, blk.k_len)?;
            let v = v.narrow(2, blk.k_start, blk.k_len)?;
            attend(kernels, &q, &k, &v, rep, blk.mask.as_ref())
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat(&outs, 2)?)
}

struct Recompute {
    kernels: KernelPolicy,
    /// The forward's result, computed without a graph.
    out: Handover,
    /// The CPU kernels' log-sum-exps, for their backward.
    lse: Option<Vec<f32>>,
    rep: usize,
    blocks: Vec<BandBlock>,
}

impl candle_core::CustomOp3 for Recompute {
    fn name(&self) -> &'static str {
        "recompute-attention"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        self.out.take(on_cpu)
    }

    fn cuda_fwd(
        &self,
        _: &CudaStorage,
        _: &Layout,
        _: &CudaStorage,
        _: &Layout,
        _: &CudaStorage,
        _: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        self.out.take(on_cuda)
    }

    fn metal_fwd(
        &self,
        _: &MetalStorage,
        _: &Layout,
        _: &MetalStorage,
        _: &Layout,
        _: &MetalStorage,
        _: &Layout,
    ) -> candle_core::Result<(MetalStorage, Shape)> {
        self.out.take(on_metal)
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (q, k, v) = (q.detach(), k.detach(), v.detach());
        let (dq, dk, dv) = match &self.lse {
            Some(lse) if host_kernels_apply(self.kernels, &q, Some(grad)) => {
                attention_host::backward(&q, &k, &v, out, lse, grad, self.rep, &self.blocks)?
            }
            _ => composed_backward(self.kernels, &q, &k, &v, grad, self.rep, &self.blocks)?,
        };
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

/// [`Recompute`]'s backward in candle ops (other devices and dtypes). Per block:
/// p = softmax(q k^T + mask) recomputed; dv += p^T g; dp = g v^T;
/// ds = p (dp - rowsum(dp p)); dq = ds k; dk += ds^T q.
fn composed_backward(
    kernels: KernelPolicy,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    grad: &Tensor,
    rep: usize,
    blocks: &[BandBlock],
) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    let (b, kv, _, d) = q.dims4()?;
    let s = k.dim(2)?;
    let grad = grad.contiguous()?;
    let (mut dk, mut dv) = (k.zeros_like()?, v.zeros_like()?);
    let mut dq = Vec::with_capacity(blocks.len());
    for blk in blocks {
        let (r0, rn) = (blk.q_start * rep, blk.q_len * rep);
        let qb = q.narrow(2, r0, rn)?;
        let gb = grad.narrow(2, r0, rn)?;
        let kb = k.narrow(2, blk.k_start, blk.k_len)?;
        let vb = v.narrow(2, blk.k_start, blk.k_len)?;
        let scores = trace::matmul(&qb, &kb.t()?)?.to_dtype(DType::F32)?;
        let scores = match &blk.mask {
            Some(mask) => scores
                .reshape((b, kv, blk.q_len, rep, blk.k_len))?
                .broadcast_add(mask)?
                .reshape((b, kv, rn, blk.k_len))?,
            None => scores,
        };
        let probs = ops::softmax_last_dim(kernels, &scores)?;
        drop(scores);
        // In the compute dtype, as the other products (f32 accumulation inside the GEMM).
        let dp = trace::matmul(&gb, &vb.t()?)?.to_dtype(DType::F32)?;
        let ds = ops::softmax_backward(kernels, &probs, &dp)?.to_dtype(q.dtype())?;
        drop(dp);
        let probs = probs.to_dtype(v.dtype())?;
        dq.push(trace::matmul(&ds, &kb)?);
        let range = |t: &Tensor, add: &Tensor| -> candle_core::Result<Tensor> {
            if blk.k_start == 0 && blk.k_len == s {
                return t + add;
            }
            let sum = (t.narrow(2, blk.k_start, blk.k_len)? + add)?;
            t.slice_assign(&[0..b, 0..kv, blk.k_start..blk.k_start + blk.k_len, 0..d], &sum)
        };
        dv = range(&dv, &trace::matmul(&probs.t()?, &gb)?)?;
        dk = range(&dk, &trace::matmul(&ds.t()?, &qb)?)?;
    }
    Ok((Tensor::cat(&dq, 2)?, dk, dv))
}

/// Sliding-window attention by the plan's blocks; same result as [`full`] with the
/// band mask.
pub fn sliding(
    kernels: KernelPolicy,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    rep: usize,
    plan: &SlidingPlan,
) -> Result<Tensor> {
    match plan {
        SlidingPlan::Unmasked => attend(kernels, q, k, v, rep, None),
        SlidingPlan::Masked(mask) => attend(kernels, q, k, v, rep, Some(mask)),
        // Plain differentiable blocks: the graph keeps every block's scores.
        SlidingPlan::Banded(blocks) if kernels.scores == AttentionScores::Keep => {
            blocked_forward(kernels, q, k, v, rep, blocks)
        }
        SlidingPlan::Banded(blocks) => recompute(kernels, q, k, v, rep, blocks, None),
    }
}

#[cfg(test)]
mod tests;

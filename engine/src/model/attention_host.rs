//! The CPU f32 kernels of attention's recompute path ([`super::attention`]): head by
//! head in parallel, each head's blocks in turn on one thread, with its scores,
//! probabilities and their gradients in buffers reused throughout, and every product
//! written straight into its destination (`cpu_gemm`). A head's dk and dv sum over its
//! own blocks only, so no two threads write one value, and nothing waits on another
//! thread inside a head. The candle-op form allocates and zeroes each of those per
//! block, concatenates the blocks' outputs and adds each block's dk/dv into copies of
//! the running sums.

use candle_core::{Result, Tensor};
use rayon::prelude::*;

use super::attention::BandBlock;
use super::cpu_gemm::{host_f32, matmul_into, Mat, Threads};
use super::ops;
use super::simd;

const OP: &str = "recompute-attention";

/// Whether these kernels run the op: f32 on the CPU, the fused ops not switched off.
pub fn applies(q: &Tensor, grad: Option<&Tensor>) -> bool {
    ops::fused_cpu_f32(q) && grad.is_none_or(|g| g.dtype() == q.dtype())
}

/// One block's rows and keys for head `head`.
struct HeadBlock<'a> {
    q: Mat<'a>,
    k: Mat<'a>,
    v: Mat<'a>,
    /// `(q_len, k_len)`: row `r` of the block reads mask row `r / rep`.
    mask: Option<&'a [f32]>,
    rep: usize,
}

impl<'a> HeadBlock<'a> {
    fn new(q: Mat<'a>, k: Mat<'a>, v: Mat<'a>, blk: &BandBlock, mask: Option<&'a [f32]>, rep: usize) -> Self {
        Self {
            q: q.row_range(blk.q_start * rep, blk.q_len * rep),
            k: k.row_range(blk.k_start, blk.k_len),
            v: v.row_range(blk.k_start, blk.k_len),
            mask,
            rep,
        }
    }

    /// `probs = softmax(q k^T + mask)`, through `scores`.
    fn probabilities(&self, scores: &mut [f32], probs: &mut [f32]) {
        let keys = self.k.rows;
        let (scores, probs) = (&mut scores[..self.q.rows * keys], &mut probs[..self.q.rows * keys]);
        matmul_into(scores, 0, keys, self.q, self.k.t(), false, Threads::Calling);
        if let Some(mask) = self.mask {
            for (r, row) in scores.chunks_mut(keys).enumerate() {
                let m = &mask[r / self.rep * keys..][..keys];
                row.iter_mut().zip(m).for_each(|(s, m)| *s += m);
            }
        }
        for (x, y) in scores.chunks(keys).zip(probs.chunks_mut(keys)) {
            simd::softmax_row(x, y);
        }
    }
}

/// The tensors' values and a block's per-head views of them.
struct Inputs<'a> {
    q: (&'a [f32], &'a candle_core::Layout),
    k: (&'a [f32], &'a candle_core::Layout),
    v: (&'a [f32], &'a candle_core::Layout),
}

impl<'a> Inputs<'a> {
    fn head(&self, head: usize, blk: &BandBlock, mask: Option<&'a [f32]>, rep: usize) -> HeadBlock<'a> {
        let view = |(data, layout): (&'a [f32], &'a candle_core::Layout)| Mat::of(data, layout, head);
        HeadBlock::new(view(self.q), view(self.k), view(self.v), blk, mask, rep)
    }
}

/// Scratch for the largest block: `rows x keys` f32.
fn scratch(blocks: &[BandBlock], rep: usize) -> Vec<f32> {
    vec![0.0; blocks.iter().map(|b| b.q_len * rep * b.k_len).max().unwrap_or(0)]
}

/// Runs `f` with the storages of `ts` as f32 slices and their layouts.
fn with_host<R>(ts: [&Tensor; 3], f: impl FnOnce(Inputs) -> Result<R>) -> Result<R> {
    let [(q, ql), (k, kl), (v, vl)] = ts.map(|t| t.storage_and_layout());
    f(Inputs { q: (host_f32(&q, OP)?, ql), k: (host_f32(&k, OP)?, kl), v: (host_f32(&v, OP)?, vl) })
}

/// The blocks' masks as slices.
fn masks(blocks: &[BandBlock]) -> Result<Vec<Option<Vec<f32>>>> {
    blocks.iter().map(|b| b.mask.as_ref().map(|m| m.flatten_all()?.to_vec1::<f32>()).transpose()).collect()
}

/// `softmax(q k^T + mask) v` over the blocks: q `(B, KV, rows, D)` already scaled,
/// k, v `(B, KV, S, D)`.
pub fn forward(q: &Tensor, k: &Tensor, v: &Tensor, rep: usize, blocks: &[BandBlock]) -> Result<Tensor> {
    let (_, _, rows, d) = q.dims4()?;
    let masks = masks(blocks)?;
    let mut out = vec![0f32; q.elem_count()];
    with_host([q, k, v], |x| {
        out.par_chunks_mut(rows * d).enumerate().for_each(|(head, out)| {
            let (mut scores, mut probs) = (scratch(blocks, rep), scratch(blocks, rep));
            for (blk, mask) in blocks.iter().zip(&masks) {
                let hb = x.head(head, blk, mask.as_deref(), rep);
                hb.probabilities(&mut scores, &mut probs);
                let p = Mat::rows(&probs, 0, hb.q.rows, hb.k.rows, hb.k.rows);
                matmul_into(out, blk.q_start * rep * d, d, p, hb.v, false, Threads::Calling);
            }
        });
        Ok(())
    })?;
    Ok(Tensor::from_vec(out, q.shape(), q.device())?)
}

/// dq, dk, dv of [`forward`] for the output gradient `grad` `(B, KV, rows, D)`. Per
/// block and head: p recomputed; dp = g v^T; ds = p (dp - rowsum(dp p)); dq = ds k
/// (the block's rows, written once); dv += p^T g and dk += ds^T q (its key range).
pub fn backward(q: &Tensor, k: &Tensor, v: &Tensor, grad: &Tensor, rep: usize, blocks: &[BandBlock]) -> Result<(Tensor, Tensor, Tensor)> {
    let (_, _, rows, d) = q.dims4()?;
    let s = k.dim(2)?;
    let masks = masks(blocks)?;
    let (mut dq, mut dk, mut dv) = (vec![0f32; q.elem_count()], vec![0f32; k.elem_count()], vec![0f32; k.elem_count()]);
    let (g, g_layout) = grad.storage_and_layout();
    let g = host_f32(&g, OP)?;
    with_host([q, k, v], |x| {
        let heads = dq.par_chunks_mut(rows * d).zip(dk.par_chunks_mut(s * d)).zip(dv.par_chunks_mut(s * d));
        heads.enumerate().for_each(|(head, ((dq, dk), dv))| {
            let (mut scores, mut probs, mut dp) = (scratch(blocks, rep), scratch(blocks, rep), scratch(blocks, rep));
            for (blk, mask) in blocks.iter().zip(&masks) {
                let hb = x.head(head, blk, mask.as_deref(), rep);
                let (n, keys) = (hb.q.rows, hb.k.rows);
                let gh = Mat::of(g, g_layout, head).row_range(blk.q_start * rep, n);
                hb.probabilities(&mut scores, &mut probs);
                matmul_into(&mut dp, 0, keys, gh, hb.v.t(), false, Threads::Calling);
                // ds goes where the scores were.
                let (p, dpv) = (probs[..n * keys].chunks(keys), dp[..n * keys].chunks(keys));
                for ((p, dp), ds) in p.zip(dpv).zip(scores[..n * keys].chunks_mut(keys)) {
                    simd::softmax_bwd_row(p, dp, ds);
                }
                let ds = Mat::rows(&scores, 0, n, keys, keys);
                let p = Mat::rows(&probs, 0, n, keys, keys);
                matmul_into(dq, blk.q_start * rep * d, d, ds, hb.k, false, Threads::Calling);
                let at = blk.k_start * d;
                matmul_into(dv, at, d, p.t(), gh, true, Threads::Calling);
                matmul_into(dk, at, d, ds.t(), hb.q, true, Threads::Calling);
            }
        });
        Ok(())
    })?;
    let dev = q.device();
    Ok((Tensor::from_vec(dq, q.shape(), dev)?, Tensor::from_vec(dk, k.shape(), dev)?, Tensor::from_vec(dv, v.shape(), dev)?))
}

//! The CPU f32 kernels of attention's recompute path (`model::attention`): head by
//! head in parallel, each head's blocks in turn on one thread, with its scores,
//! probabilities and their gradients in buffers reused throughout, and every product
//! written straight into its destination (`cpu_gemm`). A head's dk and dv sum over its
//! own blocks only, so no two threads write one value, and nothing waits on another
//! thread inside a head. The candle-op form allocates and zeroes each of those per
//! block, concatenates the blocks' outputs and adds each block's dk/dv into copies of
//! the running sums.

use candle_core::{Result, Tensor};
use rayon::prelude::*;

use super::cpu_gemm::{host_f32, matmul_into, Mat, Threads};
use super::simd;

const OP: &str = "recompute-attention";

/// One query block of the banded form: which keys it reads and their mask.
#[derive(Clone)]
pub struct BandBlock {
    pub q_start: usize,
    pub q_len: usize,
    pub k_start: usize,
    pub k_len: usize,
    /// `(q_len, 1, k_len)` additive mask, `None` when the whole rectangle is in the band.
    pub mask: Option<Tensor>,
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

    /// `scores = q k^T` for the block's rows, `rows x keys` at the front of `buf`.
    fn scores<'b>(&self, buf: &'b mut [f32]) -> &'b mut [f32] {
        let keys = self.k.rows;
        let scores = &mut buf[..self.q.rows * keys];
        matmul_into(scores, 0, keys, self.q, self.k.t(), false, Threads::Calling);
        scores
    }

    /// Mask row `r` of the block, if it has a mask.
    fn mask_row(&self, r: usize) -> Option<&'a [f32]> {
        let keys = self.k.rows;
        self.mask.map(|m| &m[r / self.rep * keys..][..keys])
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
/// k, v `(B, KV, S, D)`. Also returns each query row's log-sum-exp of its masked scores
/// (`(B, KV, rows)` flattened), from which [`backward`] recomputes a row's
/// probabilities in one pass. The exponentials stay unnormalised through `e v`; the
/// output rows are divided by their sums after it, D values a row instead of S.
pub fn forward(q: &Tensor, k: &Tensor, v: &Tensor, rep: usize, blocks: &[BandBlock]) -> Result<(Tensor, Vec<f32>)> {
    let (_, _, rows, d) = q.dims4()?;
    let masks = masks(blocks)?;
    let mut out = vec![0f32; q.elem_count()];
    let mut lse = vec![0f32; q.elem_count() / d];
    with_host([q, k, v], |x| {
        let heads = out.par_chunks_mut(rows * d).zip(lse.par_chunks_mut(rows));
        heads.enumerate().for_each(|(head, (out, lse))| {
            let mut buf = scratch(blocks, rep);
            for (blk, mask) in blocks.iter().zip(&masks) {
                let hb = x.head(head, blk, mask.as_deref(), rep);
                let (r0, n, keys) = (blk.q_start * rep, hb.q.rows, hb.k.rows);
                let scores = hb.scores(&mut buf);
                let mut sums = Vec::with_capacity(n);
                for (r, (row, lse)) in scores.chunks_mut(keys).zip(&mut lse[r0..r0 + n]).enumerate() {
                    let (max, sum) = simd::exp_row(row, hb.mask_row(r));
                    *lse = max + sum.ln();
                    sums.push(sum);
                }
                let e = Mat::rows(&buf, 0, n, keys, keys);
                matmul_into(out, r0 * d, d, e, hb.v, false, Threads::Calling);
                for (row, sum) in out[r0 * d..(r0 + n) * d].chunks_mut(d).zip(sums) {
                    let inv = 1.0 / sum;
                    row.iter_mut().for_each(|o| *o *= inv);
                }
            }
        });
        Ok(())
    })?;
    Ok((Tensor::from_vec(out, q.shape(), q.device())?, lse))
}

/// dq, dk, dv of [`forward`] for the output gradient `grad` `(B, KV, rows, D)`, from
/// the forward's output `out` and log-sum-exps `lse`. Per block and head: p = exp(s -
/// lse) from the recomputed scores s; dp = g v^T; ds = p (dp - delta) with delta =
/// rowsum(g out) (= rowsum(dp p)), one pass over the row for both; dq = ds k (the
/// block's rows, written once); dv += p^T g and dk += ds^T q (its key range).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    lse: &[f32],
    grad: &Tensor,
    rep: usize,
    blocks: &[BandBlock],
) -> Result<(Tensor, Tensor, Tensor)> {
    let (_, _, rows, d) = q.dims4()?;
    let s = k.dim(2)?;
    if lse.len() * d != q.elem_count() || out.shape() != q.shape() || grad.shape() != q.shape() {
        candle_core::bail!("{OP}: the forward's output, log-sum-exps or gradient do not match q {:?}", q.shape());
    }
    let masks = masks(blocks)?;
    let (mut dq, mut dk, mut dv) = (vec![0f32; q.elem_count()], vec![0f32; k.elem_count()], vec![0f32; k.elem_count()]);
    let (g, g_layout) = grad.storage_and_layout();
    let (o, o_layout) = out.storage_and_layout();
    let (g, o) = (host_f32(&g, OP)?, host_f32(&o, OP)?);
    with_host([q, k, v], |x| {
        let heads = dq.par_chunks_mut(rows * d).zip(dk.par_chunks_mut(s * d)).zip(dv.par_chunks_mut(s * d));
        heads.enumerate().for_each(|(head, ((dq, dk), dv))| {
            let (gh, oh) = (Mat::of(g, g_layout, head), Mat::of(o, o_layout, head));
            let delta: Vec<f32> = (0..rows).map(|r| gh.row_dot(oh, r)).collect();
            let lse = &lse[head * rows..][..rows];
            let (mut probs, mut grads) = (scratch(blocks, rep), scratch(blocks, rep));
            for (blk, mask) in blocks.iter().zip(&masks) {
                let hb = x.head(head, blk, mask.as_deref(), rep);
                let (r0, n, keys) = (blk.q_start * rep, hb.q.rows, hb.k.rows);
                let gb = gh.row_range(r0, n);
                let scores = hb.scores(&mut probs);
                matmul_into(&mut grads, 0, keys, gb, hb.v.t(), false, Threads::Calling);
                // p goes where the scores were, ds where dp was.
                for (r, (s, dp)) in scores.chunks_mut(keys).zip(grads.chunks_mut(keys)).enumerate() {
                    simd::attention_grad_row(s, dp, hb.mask_row(r), lse[r0 + r], delta[r0 + r]);
                }
                let ds = Mat::rows(&grads, 0, n, keys, keys);
                let p = Mat::rows(&probs, 0, n, keys, keys);
                matmul_into(dq, r0 * d, d, ds, hb.k, false, Threads::Calling);
                let at = blk.k_start * d;
                matmul_into(dv, at, d, p.t(), gb, true, Threads::Calling);
                matmul_into(dk, at, d, ds.t(), hb.q, true, Threads::Calling);
            }
        });
        Ok(())
    })?;
    let dev = q.device();
    Ok((
        Tensor::from_vec(dq, q.shape(), dev)?,
        Tensor::from_vec(dk, k.shape(), dev)?,
        Tensor::from_vec(dv, v.shape(), dev)?,
    ))
}

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
//! both forms give the same softmax up to summation order. Everything is built from
//! differentiable ops, so gradients flow to q, k, v (and the LoRA tensors behind them).

use candle_core::{DType, Device, Tensor};

use super::ops;
use crate::Result;

/// Query positions per block of [`banded`]. With window W, a block of `b` queries reads
/// `b + 2W` keys: b = W/2 wastes 1/5 of the rectangle at W = 128 while keeping the
/// number of small matmuls low.
pub fn block_size(window: usize) -> usize {
    (window / 2).max(16)
}

/// Whether the banded form pays off at `positions`: it scores about
/// `P * (block + 2W)` pairs instead of `P * P`.
pub fn use_banded(positions: usize, window: usize) -> bool {
    positions > 4 * window
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
    let values: Vec<f32> = (0..q_len)
        .flat_map(|i| (0..k_len).map(move |j| if inside(i, j) { 0.0 } else { f32::MIN }))
        .collect();
    Ok(Some(Tensor::from_vec(values, (q_len, 1, k_len), device)?))
}

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

/// The sliding-window attention plan for `positions` query and key positions: the
/// whole-square mask at short lengths, blocks at long ones. Built once per forward.
#[derive(Clone)]
pub enum SlidingPlan {
    /// Every pair is inside the band: plain attention.
    Unmasked,
    /// `(P, 1, P)` additive mask over the full square.
    Masked(Tensor),
    Banded(Vec<BandBlock>),
}

impl SlidingPlan {
    pub fn new(positions: usize, window: usize, device: &Device) -> Result<Self> {
        if positions <= window + 1 {
            return Ok(Self::Unmasked);
        }
        if !use_banded(positions, window) || ops::bench_switch("OSTINATO_SQUARE_ATTENTION") {
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
fn attend(q: &Tensor, k: &Tensor, v: &Tensor, rep: usize, mask: Option<&Tensor>) -> Result<Tensor> {
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
    let probs = ops::softmax_last_dim(&scores)?.to_dtype(v.dtype())?;
    Ok(ops::matmul(&probs, v)?)
}

/// Attention over all keys with an optional `(P, 1, S)` additive mask.
pub fn full(q: &Tensor, k: &Tensor, v: &Tensor, rep: usize, mask: Option<&Tensor>) -> Result<Tensor> {
    attend(q, k, v, rep, mask)
}

/// Sliding-window attention by the plan's blocks; same result as [`full`] with the
/// band mask.
pub fn sliding(q: &Tensor, k: &Tensor, v: &Tensor, rep: usize, plan: &SlidingPlan) -> Result<Tensor> {
    match plan {
        SlidingPlan::Unmasked => attend(q, k, v, rep, None),
        SlidingPlan::Masked(mask) => attend(q, k, v, rep, Some(mask)),
        SlidingPlan::Banded(blocks) => {
            let outs = blocks
                .iter()
                .map(|blk| {
                    let q = q.narrow(2, blk.q_start * rep, blk.q_len * rep)?;
                    let k = k.narrow(2, blk.k_start, blk.k_len)?;
                    let v = v.narrow(2, blk.k_start, blk.k_len)?;
                    attend(&q, &k, &v, rep, blk.mask.as_ref())
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Tensor::cat(&outs, 2)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    fn max_abs(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
    }

    /// Banded blocks give the masked full square's output within 1e-5 and its q/k/v
    /// gradients within 1e-5 relative, for block sizes that do and do not divide P and windows near P.
    #[test]
    fn banded_equals_masked_full_square() -> Result<()> {
        let dev = Device::Cpu;
        let (b, kv, rep, d) = (2, 2, 3, 16);
        for (p, window, block) in [(97, 8, 4), (97, 8, 13), (64, 16, 8), (40, 30, 7), (200, 32, 16)] {
            let q = Var::randn(0f32, 1.0, (b, kv, p * rep, d), &dev)?;
            let k = Var::randn(0f32, 1.0, (b, kv, p, d), &dev)?;
            let v = Var::randn(0f32, 1.0, (b, kv, p, d), &dev)?;
            let g = Tensor::randn(0f32, 1.0, (b, kv, p * rep, d), &dev)?;
            let mask = band_mask(0, p, 0, p, window, &dev)?;
            let square = full(&q, &k, &v, rep, mask.as_ref())?;
            let plan = SlidingPlan::banded(p, window, block, &dev)?;
            let banded = sliding(&q, &k, &v, rep, &plan)?;
            let err = max_abs(&square, &banded);
            assert!(err <= 1e-5, "P {p} W {window} block {block}: output differs by {err:e}");

            let gs = (square * &g)?.sum_all()?.backward()?;
            let gb = (banded * &g)?.sum_all()?.backward()?;
            // Gradients sum over up to P rows: compare relative to their largest entry.
            for (name, var) in [("q", &q), ("k", &k), ("v", &v)] {
                let (a, b) = (gs.get(var).unwrap(), gb.get(var).unwrap());
                let scale = a.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
                let err = max_abs(a, b) / scale;
                assert!(err <= 1e-5, "P {p} W {window} block {block}: d{name} differs by {err:e} (relative)");
            }
        }
        Ok(())
    }

    #[test]
    fn plan_picks_square_at_short_lengths() -> Result<()> {
        let dev = Device::Cpu;
        assert!(matches!(SlidingPlan::new(100, 128, &dev)?, SlidingPlan::Unmasked));
        assert!(matches!(SlidingPlan::new(375, 128, &dev)?, SlidingPlan::Masked(_)));
        match SlidingPlan::new(3000, 128, &dev)? {
            SlidingPlan::Banded(blocks) => {
                assert_eq!(blocks.iter().map(|b| b.q_len).sum::<usize>(), 3000);
                assert_eq!(blocks[0].k_start, 0);
                assert_eq!(blocks.last().unwrap().k_start + blocks.last().unwrap().k_len, 3000);
            }
            _ => panic!("3000 positions with window 128 should be banded"),
        }
        let m = band_mask(10, 4, 0, 30, 5, &dev)?.unwrap().to_dtype(DType::F32)?;
        let row0 = m.get(0)?.squeeze(0)?.to_vec1::<f32>()?;
        assert_eq!(row0[5], 0.0);
        assert_eq!(row0[4], f32::MIN);
        assert_eq!(row0[15], 0.0);
        assert_eq!(row0[16], f32::MIN);
        Ok(())
    }
}

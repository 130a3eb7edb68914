//! `y = x W^T` on the CPU (f32) on the register tile of [`super::conv_tile`], for the
//! frozen linears of the DiT, Qwen3 and the condition encoder.
//!
//! Why not the `gemm` crate candle calls: on the Intel Xeon hosts of bench/NOTES.md run
//! 33 it reached 35-55 GFLOP/s on these shapes with one thread or two (a core's peak
//! is ~175), which made a full-size sampling step 4x slower than PyTorch's.
//!
//! The product is the tile's folded reduction with one tap: its A operand is `mr`
//! rows of W packed `[kc][mr]`, its B operand the transposed input in panels of `nr`
//! columns (`[k][nr]` each, so a tile reads one contiguous run), made once per call.
//! A work item is a group of output columns: for each `KC` slice of the reduction it
//! packs the group's rows of W (16 KiB) and runs every block of them past each panel
//! slice (24 KiB), both in L1, summing its outputs in a buffer of its own that it writes
//! once, so each thread writes only its own columns. Each output is the same sum in the
//! same order whatever the thread count: results are reproducible run to run.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, Layout, Result};
use rayon::prelude::*;

use super::conv_tile::Micro;
use super::shared_out::Shared;

/// A 2-D product on a backend's storage: `(a, b, (batch, m, n, k), a's layout, b's
/// layout)`, as `BackendStorage::matmul` takes it.
pub(crate) type Product<S> = fn(&S, &S, (usize, usize, usize, usize), &Layout, &Layout) -> Result<S>;

/// candle's matmul: the products on Metal and CUDA.
pub(crate) fn backend_product<S: BackendStorage>(
    a: &S,
    b: &S,
    bmnk: (usize, usize, usize, usize),
    al: &Layout,
    bl: &Layout,
) -> Result<S> {
    a.matmul(b, bmnk, al, bl)
}

/// A linear's product on the CPU: `x [m, k]` (contiguous) times a contiguous weight
/// `[n, k]` read transposed goes through [`linear`] (f32, at least [`MIN_ROWS`] rows);
/// anything else through candle's matmul.
pub(crate) fn host_linear_product(
    a: &CpuStorage,
    b: &CpuStorage,
    bmnk: (usize, usize, usize, usize),
    al: &Layout,
    bl: &Layout,
) -> Result<CpuStorage> {
    let (batch, m, n, k) = bmnk;
    if let (CpuStorage::F32(x), CpuStorage::F32(w)) = (a, b) {
        let transposed_weight = bl.dims() == [k, n] && bl.stride() == [1, k];
        if batch == 1 && m >= MIN_ROWS && al.is_contiguous() && transposed_weight {
            let x = &x[al.start_offset()..al.start_offset() + m * k];
            let w = &w[bl.start_offset()..bl.start_offset() + n * k];
            return Ok(CpuStorage::F32(linear(x, m, k, w, n)));
        }
    }
    a.matmul(b, bmnk, al, bl)
}

/// Reduction rows per pass: a tile's `KC x nr` operand of `x^T` is 24 KiB on AVX-512.
const KC: usize = 128;
/// Output columns (features) per work item: four tiles of rows on AVX-512, whose packed
/// W (16 KiB at `KC`) shares L1 with a tile's x panel (24 KiB). The kernel alone ran the
/// DiT's shapes 15-50% faster than with 64 (bench/NOTES.md run 33).
const GROUP: usize = 32;
/// Input rows per pass over a group: a `KC x SPAN` slice of `x^T` (384 KiB) stays in L2.
const SPAN: usize = 384;
/// Fewer input rows than this leave most of a tile's columns empty: those products stay
/// candle's (the timestep embeddings' single rows).
const MIN_ROWS: usize = 32;

/// `x [rows, k]` times `w [n, k]` transposed: `[rows, n]`, row-major.
pub(crate) fn linear(x: &[f32], rows: usize, k: usize, w: &[f32], n: usize) -> Vec<f32> {
    assert_eq!(x.len(), rows * k, "linear: input is not [rows, k]");
    assert_eq!(w.len(), n * k, "linear: weight is not [n, k]");
    let m = Micro::best();
    let cols = rows.div_ceil(m.nr) * m.nr;
    let xt = transposed(x, k, cols, m.nr);
    let mut y = vec![0f32; rows * n];
    let out = Shared::new(&mut y);
    let group = GROUP.div_ceil(m.mr) * m.mr;
    let span = SPAN.div_ceil(m.nr) * m.nr;
    (0..n.div_ceil(group)).into_par_iter().for_each_init(
        || (vec![0f32; group * KC], vec![0f32; m.mr * m.nr], vec![0f32; group * span]),
        |(a, acc, sums), g| {
            let features = g * group..((g + 1) * group).min(n);
            for c0 in (0..rows).step_by(span) {
                let width = span.min(cols - c0);
                // sums[f - features.start][c - c0]: this group's outputs for columns
                // c0.., summed over the reduction in KC slices.
                sums.fill(0.0);
                for k0 in (0..k).step_by(KC) {
                    let kc = KC.min(k - k0);
                    // The group's rows of W for this slice, one `[kc][mr]` block each.
                    for (b, f0) in features.clone().step_by(m.mr).enumerate() {
                        pack(&mut a[b * KC * m.mr..], w, k, (k0, kc), f0..(f0 + m.mr).min(n), m.mr);
                    }
                    // A tile's B operand (`kc x nr`) stays in L1 while the group's
                    // blocks of W pass over it.
                    for t0 in (c0..c0 + width).step_by(m.nr) {
                        let b = &xt[(t0 / m.nr * k + k0) * m.nr..];
                        for (blk, f0) in features.clone().step_by(m.mr).enumerate() {
                            m.tile(&a[blk * KC * m.mr..], b, m.nr, kc, (1, 1), acc);
                            let fs = m.mr.min(n - f0);
                            for (i, acc) in acc.chunks_exact(m.nr).take(fs).enumerate() {
                                let row = (f0 - features.start + i) * span + t0 - c0;
                                for (s, v) in sums[row..row + m.nr].iter_mut().zip(acc) {
                                    *s += v;
                                }
                            }
                        }
                    }
                }
                for t in c0..(c0 + width).min(rows) {
                    // SAFETY: row t's columns `features` belong to this work item's
                    // group, which no other thread writes.
                    let y = unsafe { out.part(t * n + features.start, features.len()) };
                    for (j, y) in y.iter_mut().enumerate() {
                        *y = sums[j * span + t - c0];
                    }
                }
            }
        },
    );
    y
}

/// `x [rows, k]` transposed into panels of `nr` columns: panel `c / nr` is `[k][nr]`,
/// so a tile reads its B operand as one contiguous run. Zero past `rows`.
fn transposed(x: &[f32], k: usize, cols: usize, nr: usize) -> Vec<f32> {
    let mut xt = vec![0f32; k * cols];
    xt.par_chunks_mut(k * nr).enumerate().for_each(|(panel, block)| {
        for (c, row) in x.chunks_exact(k).skip(panel * nr).take(nr).enumerate() {
            for (p, &v) in row.iter().enumerate() {
                block[p * nr + c] = v;
            }
        }
    });
    xt
}

/// Rows `features` of `w [_, k]`, reduction slice `k0..k0 + kc`, as `a [kc][mr]`
/// (rows past the end zero).
fn pack(a: &mut [f32], w: &[f32], k: usize, (k0, kc): (usize, usize), features: std::ops::Range<usize>, mr: usize) {
    let a = &mut a[..kc * mr];
    if features.len() < mr {
        a.fill(0.0);
    }
    for (i, f) in features.enumerate() {
        for (p, &v) in w[f * k + k0..f * k + k0 + kc].iter().enumerate() {
            a[p * mr + i] = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(x: &[f32], rows: usize, k: usize, w: &[f32], n: usize) -> Vec<f32> {
        let mut y = vec![0f32; rows * n];
        for t in 0..rows {
            for f in 0..n {
                y[t * n + f] = (0..k).map(|p| x[t * k + p] as f64 * w[f * k + p] as f64).sum::<f64>() as f32;
            }
        }
        y
    }

    #[test]
    fn matches_the_plain_product_on_ragged_shapes() {
        // Rows, reduction and features off every block size (tile rows and columns,
        // KC, GROUP, the transpose's 64-row blocks).
        for &(rows, k, n) in &[(33, 300, 70), (48, 256, 64), (97, 513, 9), (375, 64, 130), (800, 40, 20)] {
            let x: Vec<f32> = (0..rows * k).map(|i| ((i * 7 % 23) as f32 - 11.0) / 8.0).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 19) as f32 - 9.0) / 16.0).collect();
            let (got, want) = (linear(&x, rows, k, &w, n), naive(&x, rows, k, &w, n));
            let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs() / b.abs().max(1.0)).fold(0f32, f32::max);
            println!("linear [{rows}, {k}] x [{n}, {k}]^T: max rel err {err:.2e}");
            assert!(err < 1e-5, "[{rows}, {k}] x [{n}, {k}]^T: {err}");
        }
    }

    #[test]
    fn the_same_input_gives_the_same_bits_on_any_thread_count() {
        let (rows, k, n) = (120, 700, 200);
        let x: Vec<f32> = (0..rows * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let two = linear(&x, rows, k, &w, n);
        let one =
            rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(|| linear(&x, rows, k, &w, n));
        assert!(one == two, "one thread and two differ");
    }
}

//! `y = x W^T` on the CPU (f32) on the tall register tile of [`super::conv_tile`], for
//! the frozen linears of the DiT, Qwen3 and the condition encoder.
//!
//! Why not the `gemm` crate candle calls: on the Intel Xeon hosts of bench/NOTES.md run
//! 33 it reached 35-55 GFLOP/s on these shapes with one thread or two (a core's peak
//! is ~175), which made a full-size sampling step 4x slower than PyTorch's.
//!
//! The blocking is BLIS's: the input is packed once per call into blocks of `mr` rows
//! (`[kc][mr]`, broadcast by the tile) for each `KC` slice of the reduction; a work item
//! is a panel of `nr` output features, which packs its rows of W for one slice (`[kc][nr]`,
//! 32 KiB on AVX-512: it stays in L1) and runs every block of input rows past it, the
//! tile adding each slice onto the panel's outputs in a strip of its own (held in L2),
//! written into y once at the end: each thread writes only its own columns. Each output
//! is the same sum in the same order whatever the thread count: results are
//! reproducible run to run.

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

/// Reduction rows per slice: a work item's packed W (`KC x nr`) is 32 KiB on AVX-512,
/// inside L1 with room for the input block streaming past it (128 and 384 were no
/// faster in a probe at the DiT's shapes, bench/NOTES.md run 34).
const KC: usize = 256;
/// Fewer input rows than this leave most of a tile's rows empty: those products stay
/// candle's (the timestep embeddings' single rows).
const MIN_ROWS: usize = 32;

/// `x [rows, k]` times `w [n, k]` transposed: `[rows, n]`, row-major.
pub(crate) fn linear(x: &[f32], rows: usize, k: usize, w: &[f32], n: usize) -> Vec<f32> {
    linear_on(&Micro::tall(), x, rows, k, w, n)
}

fn linear_on(m: &Micro, x: &[f32], rows: usize, k: usize, w: &[f32], n: usize) -> Vec<f32> {
    assert_eq!(x.len(), rows * k, "linear: input is not [rows, k]");
    assert_eq!(w.len(), n * k, "linear: weight is not [n, k]");
    let blocks = rows.div_ceil(m.mr);
    let xp = packed_input(x, k, blocks, m.mr);
    let mut y = vec![0f32; rows * n];
    let out = Shared::new(&mut y);
    (0..n.div_ceil(m.nr)).into_par_iter().for_each_init(
        || (vec![0f32; KC * m.nr], vec![0f32; blocks * m.mr * m.nr]),
        |(wp, strip), panel| {
            let features = panel * m.nr..((panel + 1) * m.nr).min(n);
            // strip[t][j]: outputs of input row t, feature features.start + j, summed
            // over the slices so far; one tile's rows are one contiguous `[mr][nr]` run.
            for (slice, k0) in (0..k).step_by(KC).enumerate() {
                let kc = KC.min(k - k0);
                pack_weight(wp, w, k, (k0, kc), features.clone(), m.nr);
                let slab = &xp[slice * blocks * KC * m.mr..];
                for (b, acc) in strip.chunks_exact_mut(m.mr * m.nr).enumerate() {
                    let a = &slab[b * KC * m.mr..];
                    match slice {
                        0 => m.tile(a, wp, m.nr, kc, (1, 1), acc),
                        _ => m.tile_onto(a, wp, m.nr, kc, (1, 1), acc),
                    }
                }
            }
            for (t, sums) in strip.chunks_exact(m.nr).take(rows).enumerate() {
                // SAFETY: row t's columns `features` belong to this work item's panel,
                // which no other thread writes.
                let y = unsafe { out.part(t * n + features.start, features.len()) };
                y.copy_from_slice(&sums[..features.len()]);
            }
        },
    );
    y
}

/// `x [rows, k]` as the tile's broadcast operand: for each `KC` slice of the
/// reduction, for each block of `mr` rows, `[KC][mr]` (rows past the end and the last
/// slice's tail zero).
fn packed_input(x: &[f32], k: usize, blocks: usize, mr: usize) -> Vec<f32> {
    let mut xp = vec![0f32; k.div_ceil(KC) * blocks * KC * mr];
    xp.par_chunks_mut(blocks * KC * mr).enumerate().for_each(|(slice, slab)| {
        let (k0, kc) = (slice * KC, KC.min(k - slice * KC));
        for (t, row) in x.chunks_exact(k).enumerate() {
            let block = &mut slab[t / mr * KC * mr..];
            for (p, &v) in row[k0..k0 + kc].iter().enumerate() {
                block[p * mr + t % mr] = v;
            }
        }
    });
    xp
}

/// Rows `features` of `w [_, k]`, reduction slice `k0..k0 + kc`, as `wp [kc][nr]`
/// (features past the end zero).
fn pack_weight(
    wp: &mut [f32],
    w: &[f32],
    k: usize,
    (k0, kc): (usize, usize),
    features: std::ops::Range<usize>,
    nr: usize,
) {
    let wp = &mut wp[..kc * nr];
    if features.len() < nr {
        wp.fill(0.0);
    }
    for (j, f) in features.enumerate() {
        for (p, &v) in w[f * k + k0..f * k + k0 + kc].iter().enumerate() {
            wp[p * nr + j] = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::conv_tile::Shape;

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
        // KC) and on them.
        for &(rows, k, n) in &[(33, 300, 70), (48, 256, 64), (97, 513, 9), (375, 64, 130), (800, 40, 20), (24, 768, 96)]
        {
            let x: Vec<f32> = (0..rows * k).map(|i| ((i * 7 % 23) as f32 - 11.0) / 8.0).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 19) as f32 - 9.0) / 16.0).collect();
            let want = naive(&x, rows, k, &w, n);
            for m in Micro::of_shape(Shape::Tall) {
                let got = linear_on(&m, &x, rows, k, &w, n);
                let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs() / b.abs().max(1.0)).fold(0f32, f32::max);
                println!("linear on {} [{rows}, {k}] x [{n}, {k}]^T: max rel err {err:.2e}", m.name());
                assert!(err < 1e-5, "{} [{rows}, {k}] x [{n}, {k}]^T: {err}", m.name());
            }
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

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
                // What the next pack reads (this panel's next slice, else the next
                // panel's first), asked for from memory a share per block meanwhile.
                let next = match k0 + KC < k {
                    true => Some((features.clone(), k0 + KC)),
                    false => Some(features.end..(features.end + m.nr).min(n)).filter(|f| !f.is_empty()).map(|f| (f, 0)),
                };
                let slab = &xp[slice * blocks * KC * m.mr..];
                for (b, acc) in strip.chunks_exact_mut(m.mr * m.nr).enumerate() {
                    if let Some((features, k0)) = &next {
                        prefetch_share(w, k, features.clone(), (*k0, KC.min(k - k0)), (b, blocks));
                    }
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
/// (features past the end zero). Whole 8 x 8 blocks go through the AVX transpose
/// where the CPU has it (the scalar scatter was ~10% of a sampling step).
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
    let (whole_f, whole_k) = transposed_blocks(wp, w, k, (k0, kc), features.clone(), nr);
    // What the blocks left: the features past the last whole block, and every
    // feature's reduction rows past the last whole block.
    for (j, f) in features.enumerate() {
        let from = if j < whole_f { whole_k } else { 0 };
        for (p, &v) in w[f * k + k0 + from..f * k + k0 + kc].iter().enumerate() {
            wp[(from + p) * nr + j] = v;
        }
    }
}

/// Asks for share `part` of `parts` of the cache lines of rows `features` of `w [_, k]`,
/// reduction slice `k0..k0 + kc`, to be brought into L2 (a hint: never faults).
fn prefetch_share(
    w: &[f32],
    k: usize,
    features: std::ops::Range<usize>,
    (k0, kc): (usize, usize),
    (part, parts): (usize, usize),
) {
    const LINE: usize = 16;
    let lines = kc.div_ceil(LINE);
    let total = features.len() * lines;
    let share = total.div_ceil(parts);
    for q in part * share..((part + 1) * share).min(total) {
        let at = (features.start + q / lines) * k + k0 + q % lines * LINE;
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is a hint that never faults; `at` is inside `w`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(w[at..].as_ptr().cast())
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (w, at);
    }
}

/// Packs the whole 8 x 8 blocks of [`pack_weight`]'s copy with the AVX transpose, if
/// the CPU has it; returns how many features and reduction rows they covered.
#[cfg(target_arch = "x86_64")]
fn transposed_blocks(
    wp: &mut [f32],
    w: &[f32],
    k: usize,
    (k0, kc): (usize, usize),
    features: std::ops::Range<usize>,
    nr: usize,
) -> (usize, usize) {
    if !std::arch::is_x86_feature_detected!("avx") {
        return (0, 0);
    }
    let (whole_f, whole_k) = (features.len() / 8 * 8, kc / 8 * 8);
    for j0 in (0..whole_f).step_by(8) {
        for p0 in (0..whole_k).step_by(8) {
            let (src, dst) = ((features.start + j0) * k + k0 + p0, p0 * nr + j0);
            assert!(src + 7 * k + 8 <= w.len() && dst + 7 * nr + 8 <= wp.len());
            // SAFETY: the CPU has AVX (checked above); the assert keeps the 8 rows of 8
            // read and written in bounds.
            unsafe { x86::transpose8(w.as_ptr().add(src), k, wp.as_mut_ptr().add(dst), nr) };
        }
    }
    (whole_f, whole_k)
}

#[cfg(not(target_arch = "x86_64"))]
fn transposed_blocks(
    _: &mut [f32],
    _: &[f32],
    _: usize,
    _: (usize, usize),
    _: std::ops::Range<usize>,
    _: usize,
) -> (usize, usize) {
    (0, 0)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// `dst[c * dst_rs + r] = src[r * src_rs + c]` for r, c < 8.
    ///
    /// # Safety
    /// The CPU has AVX; the 8 rows of 8 at `src` are readable and at `dst` writable.
    #[target_feature(enable = "avx")]
    pub unsafe fn transpose8(src: *const f32, src_rs: usize, dst: *mut f32, dst_rs: usize) {
        let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * src_rs)));
        // Pairs of rows interleaved, then pairs of pairs: each 128-bit half holds a 4 x 4
        // block's columns; the last step joins the halves.
        let t = [
            _mm256_unpacklo_ps(r[0], r[1]),
            _mm256_unpackhi_ps(r[0], r[1]),
            _mm256_unpacklo_ps(r[2], r[3]),
            _mm256_unpackhi_ps(r[2], r[3]),
            _mm256_unpacklo_ps(r[4], r[5]),
            _mm256_unpackhi_ps(r[4], r[5]),
            _mm256_unpacklo_ps(r[6], r[7]),
            _mm256_unpackhi_ps(r[6], r[7]),
        ];
        let u = [
            _mm256_shuffle_ps::<0x44>(t[0], t[2]),
            _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
            _mm256_shuffle_ps::<0x44>(t[1], t[3]),
            _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
            _mm256_shuffle_ps::<0x44>(t[4], t[6]),
            _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
            _mm256_shuffle_ps::<0x44>(t[5], t[7]),
            _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
        ];
        for c in 0..4 {
            _mm256_storeu_ps(dst.add(c * dst_rs), _mm256_permute2f128_ps::<0x20>(u[c], u[c + 4]));
            _mm256_storeu_ps(dst.add((c + 4) * dst_rs), _mm256_permute2f128_ps::<0x31>(u[c], u[c + 4]));
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

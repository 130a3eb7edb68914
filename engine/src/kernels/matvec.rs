//! `y = x W^T` for a few input rows against weights held in f32 or bf16 on the CPU: the
//! causal LM's decoding, one token at a time. That product is bound by memory (every
//! weight is read once per token and used once), so bf16 weights read half the bytes;
//! each is widened to f32 in registers (a bf16 is the top half of an f32) and the
//! arithmetic stays f32. Output features are split over rayon's threads; a caller may
//! ask for some features only (`keep`: the rows of an LM head a constrained decoder can
//! pick), the rest come back `f32::NEG_INFINITY`.

use std::ops::Range;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Shape};
use half::bf16;
use rayon::prelude::*;

/// Output features per work item: 64 rows of a 1024-wide bf16 weight are 128 KiB,
/// enough work to amortize a rayon task, small enough to balance two or more threads.
const FEATURES_PER_TASK: usize = 64;

/// A weight element the kernel widens to f32.
pub(crate) trait MatvecWeight: Copy + Send + Sync {
    /// `sum_i w[i] * x[i]`, `w.len() == x.len()`.
    fn dot(w: &[Self], x: &[f32]) -> f32;
    /// `y[i] += a * w[i]`, `w.len() == y.len()`.
    fn axpy(a: f32, w: &[Self], y: &mut [f32]);
}

impl MatvecWeight for f32 {
    fn dot(w: &[f32], x: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F; both slices have the same length.
                return unsafe { x86::dot_f32_avx512(w, x) };
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: the CPU has AVX2 and FMA; both slices have the same length.
                return unsafe { x86::dot_f32_avx2(w, x) };
            }
        }
        w.iter().zip(x).map(|(w, x)| w * x).sum()
    }

    fn axpy(a: f32, w: &[f32], y: &mut [f32]) {
        super::simd::axpy_row(a, w, y);
    }
}

impl MatvecWeight for bf16 {
    fn dot(w: &[bf16], x: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        {
            // bf16 and u16 share size and alignment; the kernels read the bits.
            let bits: &[u16] = bytemuck_u16(w);
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F; both slices have the same length.
                return unsafe { x86::dot_bf16_avx512(bits, x) };
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: the CPU has AVX2 and FMA; both slices have the same length.
                return unsafe { x86::dot_bf16_avx2(bits, x) };
            }
        }
        w.iter().zip(x).map(|(w, x)| w.to_f32() * x).sum()
    }

    fn axpy(a: f32, w: &[bf16], y: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            let bits: &[u16] = bytemuck_u16(w);
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F; both slices have the same length.
                return unsafe { x86::axpy_bf16_avx512(a, bits, y) };
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: the CPU has AVX2 and FMA; both slices have the same length.
                return unsafe { x86::axpy_bf16_avx2(a, bits, y) };
            }
        }
        y.iter_mut().zip(w).for_each(|(y, w)| *y += a * w.to_f32());
    }
}

#[cfg(target_arch = "x86_64")]
fn bytemuck_u16(w: &[bf16]) -> &[u16] {
    // SAFETY: bf16 is a `#[repr(transparent)]` u16.
    unsafe { std::slice::from_raw_parts(w.as_ptr().cast::<u16>(), w.len()) }
}

/// `x [rows, k]` times the features `keep` of `w [n, k]` transposed: `[rows, n]`
/// row-major, `f32::NEG_INFINITY` outside `keep` (ranges within `0..n`).
pub(crate) fn matvec<W: MatvecWeight>(w: &[W], n: usize, k: usize, x: &[f32], keep: &[Range<usize>]) -> Vec<f32> {
    assert_eq!(w.len(), n * k, "matvec: weight is not [n, k]");
    assert!(k > 0 && x.len().is_multiple_of(k), "matvec: input is not [rows, k]");
    let rows = x.len() / k;
    // Features first (`[n][rows]`): each task owns one contiguous run of the output.
    let mut by_feature = vec![f32::NEG_INFINITY; n * rows];
    let tasks: Vec<(usize, &mut [f32])> = keep
        .iter()
        .flat_map(|r| {
            assert!(r.end <= n, "matvec: kept features {r:?} past {n}");
            (r.start..r.end).step_by(FEATURES_PER_TASK)
        })
        .zip(split_keep(&mut by_feature, keep, rows))
        .collect();
    tasks.into_par_iter().for_each(|(first, out)| {
        for (j, per_row) in out.chunks_exact_mut(rows).enumerate() {
            let wr = &w[(first + j) * k..(first + j + 1) * k];
            for (y, xr) in per_row.iter_mut().zip(x.chunks_exact(k)) {
                *y = W::dot(wr, xr);
            }
        }
    });
    match rows {
        1 => by_feature,
        _ => (0..rows).flat_map(|r| by_feature.iter().skip(r).step_by(rows).copied().collect::<Vec<_>>()).collect(),
    }
}

/// The parts of `out` (`[n][rows]`) each task writes: the `keep` ranges cut into runs of
/// [`FEATURES_PER_TASK`] features, in order.
fn split_keep<'a>(out: &'a mut [f32], keep: &[Range<usize>], rows: usize) -> Vec<&'a mut [f32]> {
    assert!(keep.windows(2).all(|p| p[0].end <= p[1].start), "matvec: kept features overlap or are out of order");
    let mut parts = Vec::new();
    let mut rest = out;
    let mut at = 0;
    for r in keep {
        let (_, tail) = rest.split_at_mut((r.start - at) * rows);
        let (mut inside, tail) = tail.split_at_mut(r.len() * rows);
        rest = tail;
        at = r.end;
        while !inside.is_empty() {
            let (part, more) = inside.split_at_mut((FEATURES_PER_TASK * rows).min(inside.len()));
            parts.push(part);
            inside = more;
        }
    }
    parts
}

/// The matvec as a candle op on the CPU: `x [rows, k]` (f32) and `w [n, k]` (f32 or
/// bf16), both contiguous, to `[rows, n]` (f32), every feature or the kept ones.
pub(crate) struct Matvec {
    keep: Option<Vec<Range<usize>>>,
}

impl Matvec {
    pub(crate) fn all() -> Self {
        Self { keep: None }
    }

    /// Only the features in `keep` (ascending, disjoint), `f32::NEG_INFINITY` elsewhere.
    pub(crate) fn keeping(keep: Vec<Range<usize>>) -> Self {
        Self { keep: Some(keep) }
    }
}

impl CustomOp2 for Matvec {
    fn name(&self) -> &'static str {
        "matvec"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (Some((x0, x1)), Some((w0, w1))) = (xl.contiguous_offsets(), wl.contiguous_offsets()) else {
            candle_core::bail!("matvec: input and weight must be contiguous");
        };
        let (&[rows, k], &[n, wk]) = (xl.dims(), wl.dims()) else {
            candle_core::bail!("matvec: input {:?} and weight {:?} must be matrices", xl.dims(), wl.dims());
        };
        if k != wk {
            candle_core::bail!("matvec: input [{rows}, {k}] does not match weight [{n}, {wk}]");
        }
        let CpuStorage::F32(x) = xs else { candle_core::bail!("matvec: input must be f32, is {:?}", xs.dtype()) };
        let keep = self.keep.clone().unwrap_or_else(|| std::iter::once(0..n).collect());
        let ordered = keep.windows(2).all(|p| p[0].end <= p[1].start);
        if !ordered || keep.iter().any(|r| r.start > r.end || r.end > n) {
            candle_core::bail!("matvec: kept features {keep:?} are not ascending disjoint ranges within 0..{n}");
        }
        let y = match ws {
            CpuStorage::F32(w) => matvec(&w[w0..w1], n, k, &x[x0..x1], &keep),
            CpuStorage::BF16(w) => matvec(&w[w0..w1], n, k, &x[x0..x1], &keep),
            other => candle_core::bail!("matvec: weights must be f32 or bf16, are {:?}", other.dtype()),
        };
        Ok((CpuStorage::F32(y), Shape::from((rows, n))))
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Four independent accumulators hide the FMA latency.
    const UNROLL: usize = 4;
    /// How far ahead (in weights) the bf16 kernels ask for the weights' cache lines: the
    /// hardware's own prefetch leaves two cores streaming from DRAM at about 20 GB/s
    /// on this Xeon, 4 KB ahead lifts it to about 27 (bench/NOTES.md, section 37).
    const PREFETCH: usize = 2048;

    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot_bf16_avx512(w: &[u16], x: &[f32]) -> f32 {
        let widen = |p: *const u16| {
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()))))
        };
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let mut acc = [_mm512_setzero_ps(); UNROLL];
        let mut i = 0;
        while i + 16 * UNROLL <= w.len() {
            let ahead = wp.wrapping_add(i + PREFETCH).cast::<i8>();
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
            for (u, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(widen(wp.add(i + 16 * u)), _mm512_loadu_ps(xp.add(i + 16 * u)), *a);
            }
            i += 16 * UNROLL;
        }
        while i + 16 <= w.len() {
            acc[0] = _mm512_fmadd_ps(widen(wp.add(i)), _mm512_loadu_ps(xp.add(i)), acc[0]);
            i += 16;
        }
        let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        _mm512_reduce_add_ps(sum) + tail_bf16(&w[i..], &x[i..])
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_bf16_avx2(w: &[u16], x: &[f32]) -> f32 {
        let widen = |p: *const u16| {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()))))
        };
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let mut acc = [_mm256_setzero_ps(); UNROLL];
        let mut i = 0;
        while i + 8 * UNROLL <= w.len() {
            _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(i + PREFETCH).cast::<i8>());
            for (u, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(widen(wp.add(i + 8 * u)), _mm256_loadu_ps(xp.add(i + 8 * u)), *a);
            }
            i += 8 * UNROLL;
        }
        while i + 8 <= w.len() {
            acc[0] = _mm256_fmadd_ps(widen(wp.add(i)), _mm256_loadu_ps(xp.add(i)), acc[0]);
            i += 8;
        }
        let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        horizontal_sum_256(sum) + tail_bf16(&w[i..], &x[i..])
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn axpy_bf16_avx512(a: f32, w: &[u16], y: &mut [f32]) {
        let (wp, yp, av) = (w.as_ptr(), y.as_mut_ptr(), _mm512_set1_ps(a));
        let mut i = 0;
        while i + 16 <= w.len() {
            let wide = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                wp.add(i).cast(),
            ))));
            _mm512_storeu_ps(yp.add(i), _mm512_fmadd_ps(av, wide, _mm512_loadu_ps(yp.add(i))));
            i += 16;
        }
        axpy_tail_bf16(a, &w[i..], &mut y[i..]);
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy_bf16_avx2(a: f32, w: &[u16], y: &mut [f32]) {
        let (wp, yp, av) = (w.as_ptr(), y.as_mut_ptr(), _mm256_set1_ps(a));
        let mut i = 0;
        while i + 8 <= w.len() {
            let wide =
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(wp.add(i).cast()))));
            _mm256_storeu_ps(yp.add(i), _mm256_fmadd_ps(av, wide, _mm256_loadu_ps(yp.add(i))));
            i += 8;
        }
        axpy_tail_bf16(a, &w[i..], &mut y[i..]);
    }

    fn axpy_tail_bf16(a: f32, w: &[u16], y: &mut [f32]) {
        y.iter_mut().zip(w).for_each(|(y, &w)| *y += a * f32::from_bits(u32::from(w) << 16));
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot_f32_avx512(w: &[f32], x: &[f32]) -> f32 {
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let mut acc = [_mm512_setzero_ps(); UNROLL];
        let mut i = 0;
        while i + 16 * UNROLL <= w.len() {
            for (u, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_loadu_ps(wp.add(i + 16 * u)), _mm512_loadu_ps(xp.add(i + 16 * u)), *a);
            }
            i += 16 * UNROLL;
        }
        while i + 16 <= w.len() {
            acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(wp.add(i)), _mm512_loadu_ps(xp.add(i)), acc[0]);
            i += 16;
        }
        let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        _mm512_reduce_add_ps(sum) + w[i..].iter().zip(&x[i..]).map(|(w, x)| w * x).sum::<f32>()
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_f32_avx2(w: &[f32], x: &[f32]) -> f32 {
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let mut acc = [_mm256_setzero_ps(); UNROLL];
        let mut i = 0;
        while i + 8 * UNROLL <= w.len() {
            for (u, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(i + 8 * u)), _mm256_loadu_ps(xp.add(i + 8 * u)), *a);
            }
            i += 8 * UNROLL;
        }
        while i + 8 <= w.len() {
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(i)), _mm256_loadu_ps(xp.add(i)), acc[0]);
            i += 8;
        }
        let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        horizontal_sum_256(sum) + w[i..].iter().zip(&x[i..]).map(|(w, x)| w * x).sum::<f32>()
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn horizontal_sum_256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
    }

    fn tail_bf16(w: &[u16], x: &[f32]) -> f32 {
        w.iter().zip(x).map(|(&w, x)| f32::from_bits((w as u32) << 16) * x).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The product in f64, one row and feature at a time.
    fn reference(w: &[f32], n: usize, k: usize, x: &[f32]) -> Vec<f64> {
        let rows = x.len() / k;
        (0..rows)
            .flat_map(|r| (0..n).map(move |j| (0..k).map(|i| w[j * k + i] as f64 * x[r * k + i] as f64).sum::<f64>()))
            .collect()
    }

    #[test]
    fn bf16_and_f32_weights_match_a_plain_product() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        // k not a multiple of any vector width, n not a multiple of the task size.
        let (n, k) = (200, 1031);
        let w32: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0..1.0)).collect();
        // The bf16 weights and the f32 copy of exactly those values.
        let w16: Vec<bf16> = w32.iter().map(|&v| bf16::from_f32(v)).collect();
        let widened: Vec<f32> = w16.iter().map(|v| v.to_f32()).collect();
        for rows in [1, 3] {
            let x: Vec<f32> = (0..rows * k).map(|_| rng.random_range(-1.0..1.0)).collect();
            for (name, got, want) in [
                ("f32", matvec(&w32, n, k, &x, std::slice::from_ref(&(0..n))), reference(&w32, n, k, &x)),
                ("bf16", matvec(&w16, n, k, &x, std::slice::from_ref(&(0..n))), reference(&widened, n, k, &x)),
            ] {
                let err = got.iter().zip(&want).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max);
                println!("{name} rows {rows}: max abs error {err:.2e} (tolerance 1e-4, sums of {k} terms of |x| < 1)");
                assert!(err < 1e-4, "{name} rows {rows}: {err}");
            }
        }
    }

    #[test]
    fn kept_features_only_are_computed() {
        let (n, k) = (300, 40);
        let w: Vec<f32> = (0..n * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let x: Vec<f32> = (0..2 * k).map(|i| (i % 5) as f32 * 0.5).collect();
        let full = matvec(&w, n, k, &x, std::slice::from_ref(&(0..n)));
        let keep = [3..5, 90..250, 299..300];
        let part = matvec(&w, n, k, &x, &keep);
        for (i, (p, f)) in part.iter().zip(&full).enumerate() {
            let j = i % n;
            match keep.iter().any(|r| r.contains(&j)) {
                true => assert_eq!(p, f, "feature {j}"),
                false => assert_eq!(*p, f32::NEG_INFINITY, "feature {j}"),
            }
        }
    }
}

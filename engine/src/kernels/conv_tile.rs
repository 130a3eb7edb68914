//! The register tile under the CPU convolutions of [`super::conv1d`]: `MR` output rows
//! by `NR` output columns of `sum over (p, j) of a[p, j, row] * b[p, col + j * d]`,
//! where `a` is a packed weight panel and `b` a panel of input rows. The B operand is
//! read straight from the rows (columns are consecutive samples), so the taps of a
//! conv fold into one reduction of length rows * k with no im2col copy.
//!
//! The accumulators live in registers: 8 x 3 vectors of 16 lanes on AVX-512, 4 x 3 of 8
//! lanes on AVX2 + FMA, 8 x 3 of 4 lanes elsewhere (NEON has 32 registers). The
//! linears' product ([`super::linear`]) runs a taller tile of two vectors a row (12 x 2 on
//! AVX-512, 6 x 2 on AVX2): more broadcast rows per loaded vector, and its B operand
//! (`kc x nr` of packed W) fits L1 at a deeper reduction.

/// One SIMD register of f32 lanes.
trait Vector: Copy {
    const LANES: usize;
    /// # Safety
    /// The CPU has the instruction set the type needs.
    unsafe fn zero() -> Self;
    /// # Safety
    /// `p..p + LANES` is readable; the CPU has the instruction set.
    unsafe fn load(p: *const f32) -> Self;
    /// # Safety
    /// `p` is readable; the CPU has the instruction set.
    unsafe fn splat(p: *const f32) -> Self;
    /// `a * b + c`.
    /// # Safety
    /// The CPU has the instruction set.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    /// # Safety
    /// The CPU has the instruction set.
    unsafe fn add(a: Self, b: Self) -> Self;
    /// Asks for the cache line at `p` ahead of its use (a hint: never faults).
    /// # Safety
    /// The CPU has the instruction set.
    unsafe fn prefetch(_p: *const f32) {}
    /// # Safety
    /// `p..p + LANES` is writable; the CPU has the instruction set.
    unsafe fn store(self, p: *mut f32);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Vector;
    use std::arch::x86_64::*;

    #[derive(Clone, Copy)]
    pub struct Avx512(__m512);

    impl Vector for Avx512 {
        const LANES: usize = 16;
        #[inline(always)]
        unsafe fn zero() -> Self {
            Self(_mm512_setzero_ps())
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            Self(_mm512_loadu_ps(p))
        }
        #[inline(always)]
        unsafe fn splat(p: *const f32) -> Self {
            Self(_mm512_set1_ps(*p))
        }
        #[inline(always)]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            Self(_mm512_fmadd_ps(a.0, b.0, c.0))
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            Self(_mm512_add_ps(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn prefetch(p: *const f32) {
            _mm_prefetch::<_MM_HINT_T0>(p.cast())
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            _mm512_storeu_ps(p, self.0)
        }
    }

    #[derive(Clone, Copy)]
    pub struct Avx2(__m256);

    impl Vector for Avx2 {
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> Self {
            Self(_mm256_setzero_ps())
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            Self(_mm256_loadu_ps(p))
        }
        #[inline(always)]
        unsafe fn splat(p: *const f32) -> Self {
            Self(_mm256_set1_ps(*p))
        }
        #[inline(always)]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            Self(_mm256_fmadd_ps(a.0, b.0, c.0))
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            Self(_mm256_add_ps(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn prefetch(p: *const f32) {
            _mm_prefetch::<_MM_HINT_T0>(p.cast())
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            _mm256_storeu_ps(p, self.0)
        }
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile_avx512(g: &super::TileArgs) {
        super::tile::<Avx512, 8, 3>(g)
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn tall_tile_avx512(g: &super::TileArgs) {
        super::tile::<Avx512, 12, 2>(g)
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn fma_loop_avx512(rounds: usize) -> f32 {
        super::fma_loop::<Avx512>(rounds)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile_avx2(g: &super::TileArgs) {
        super::tile::<Avx2, 4, 3>(g)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tall_tile_avx2(g: &super::TileArgs) {
        super::tile::<Avx2, 6, 2>(g)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn fma_loop_avx2(rounds: usize) -> f32 {
        super::fma_loop::<Avx2>(rounds)
    }
}

/// Four lanes in plain Rust, which LLVM keeps in one 128-bit register (a fused
/// multiply-add where the target has it: always on aarch64).
#[derive(Clone, Copy)]
struct Lanes4([f32; 4]);

impl Vector for Lanes4 {
    const LANES: usize = 4;
    #[inline(always)]
    unsafe fn zero() -> Self {
        Self([0.0; 4])
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Self(p.cast::<[f32; 4]>().read_unaligned())
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> Self {
        Self([*p; 4])
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        #[cfg(any(target_arch = "aarch64", target_feature = "fma"))]
        let f = |i: usize| a.0[i].mul_add(b.0[i], c.0[i]);
        #[cfg(not(any(target_arch = "aarch64", target_feature = "fma")))]
        let f = |i: usize| a.0[i] * b.0[i] + c.0[i];
        Self([f(0), f(1), f(2), f(3)])
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        Self([a.0[0] + b.0[0], a.0[1] + b.0[1], a.0[2] + b.0[2], a.0[3] + b.0[3]])
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        p.cast::<[f32; 4]>().write_unaligned(self.0)
    }
}

unsafe fn tile_portable(g: &TileArgs) {
    tile::<Lanes4, 8, 3>(g)
}

unsafe fn fma_loop_portable(rounds: usize) -> f32 {
    fma_loop::<Lanes4>(rounds)
}

/// Independent multiply-add chains, more than the FMA units' latency x ports (12, so
/// that AVX2's 16 registers hold them): `rounds` x 12 vector FMAs and nothing else.
#[inline(always)]
unsafe fn fma_loop<V: Vector>(rounds: usize) -> f32 {
    let (scale, add) = ([0.999_999f32; 16], [1e-7f32; 16]);
    let (scale, add) = (V::load(scale.as_ptr()), V::load(add.as_ptr()));
    let mut s = [add; 12];
    for _ in 0..rounds {
        for s in s.iter_mut() {
            *s = V::fma(*s, scale, add);
        }
    }
    let mut out = [0f32; 16];
    let sum = s.iter().fold(V::zero(), |acc, &s| V::fma(s, scale, acc));
    sum.store(out.as_mut_ptr());
    out[0]
}

/// The operands of one tile call (pointers checked by [`Micro::tile`]).
struct TileArgs {
    a: *const f32,
    b: *const f32,
    b_rs: usize,
    rows: usize,
    k: usize,
    d: usize,
    acc: *mut f32,
    /// Add the tile onto `acc` rather than overwrite it.
    onto: bool,
}

/// `acc [MR, NV * LANES] (+)= sum over p < rows, j < k of a[(p k + j) MR + i] * b[p b_rs + j d + col]`.
/// The A operand's lines are asked for 16 steps ahead: it streams from L2 (the linears'
/// blocks of x, the convs' packed weights); 1-3% on the DiT step and the VAE passes
/// (bench/NOTES.md run 34).
#[inline(always)]
unsafe fn tile<V: Vector, const MR: usize, const NV: usize>(g: &TileArgs) {
    let mut s = [[V::zero(); NV]; MR];
    let mut a = g.a;
    for p in 0..g.rows {
        let row = g.b.add(p * g.b_rs);
        for j in 0..g.k {
            let at = row.add(j * g.d);
            V::prefetch(a.wrapping_add(16 * MR));
            let mut b = [V::zero(); NV];
            for (v, b) in b.iter_mut().enumerate() {
                *b = V::load(at.add(v * V::LANES));
            }
            for (i, s) in s.iter_mut().enumerate() {
                let w = V::splat(a.add(i));
                for (s, &b) in s.iter_mut().zip(&b) {
                    *s = V::fma(w, b, *s);
                }
            }
            a = a.add(MR);
        }
    }
    for (i, s) in s.iter().enumerate() {
        for (v, &s) in s.iter().enumerate() {
            let p = g.acc.add((i * NV + v) * V::LANES);
            match g.onto {
                true => V::add(V::load(p), s).store(p),
                false => s.store(p),
            }
        }
    }
}

/// A register tile for this CPU: its shape and its code.
#[derive(Clone, Copy)]
pub(crate) struct Micro {
    /// Output rows per tile (the packed weight's panel width).
    pub mr: usize,
    /// Output columns per tile.
    pub nr: usize,
    name: &'static str,
    run: unsafe fn(&TileArgs),
    fma_loop: unsafe fn(usize) -> f32,
    lanes: usize,
}

/// The two tile shapes: the convolutions' (wide) and the linears' (tall).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Shape {
    Wide,
    Tall,
}

impl Micro {
    /// The fastest convolution tile the CPU runs.
    pub fn best() -> Self {
        Self::available()[0]
    }

    /// The fastest tile for the linears' product.
    pub fn tall() -> Self {
        Self::of_shape(Shape::Tall)[0]
    }

    /// Every convolution tile this CPU can run, fastest first (the portable one last).
    pub fn available() -> Vec<Self> {
        Self::of_shape(Shape::Wide)
    }

    /// Every tile of `shape` this CPU can run, fastest first. The portable tile serves
    /// both shapes.
    pub fn of_shape(shape: Shape) -> Vec<Self> {
        let mut all = Self::simd_tiles(shape);
        all.push(Self { mr: 8, nr: 12, name: "portable", run: tile_portable, fma_loop: fma_loop_portable, lanes: 4 });
        all
    }

    /// The x86 SIMD tiles of `shape` this CPU runs, fastest first.
    #[cfg(target_arch = "x86_64")]
    fn simd_tiles(shape: Shape) -> Vec<Self> {
        let tall = shape == Shape::Tall;
        let mut all = Vec::new();
        if std::arch::is_x86_feature_detected!("avx512f") {
            all.push(Self {
                mr: if tall { 12 } else { 8 },
                nr: if tall { 32 } else { 48 },
                name: if tall { "avx512-tall" } else { "avx512" },
                run: if tall { x86::tall_tile_avx512 } else { x86::tile_avx512 },
                fma_loop: x86::fma_loop_avx512,
                lanes: 16,
            });
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            all.push(Self {
                mr: if tall { 6 } else { 4 },
                nr: if tall { 16 } else { 24 },
                name: if tall { "avx2-tall" } else { "avx2" },
                run: if tall { x86::tall_tile_avx2 } else { x86::tile_avx2 },
                fma_loop: x86::fma_loop_avx2,
                lanes: 8,
            });
        }
        all
    }

    /// None off x86: the portable tile is the one for NEON-width registers too.
    #[cfg(not(target_arch = "x86_64"))]
    fn simd_tiles(_shape: Shape) -> Vec<Self> {
        Vec::new()
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// One core's peak f32 rate in GFLOP/s, measured: the best of 20 runs of a loop of
    /// independent FMAs on this tile's vectors (the best, so that another process
    /// taking the core for a while does not lower it). About 0.1 s.
    pub fn peak_gflop_per_s(&self) -> f64 {
        let rounds = 1_000_000;
        (0..20)
            .map(|_| {
                let start = std::time::Instant::now();
                // SAFETY: `of_shape` offers a tile only where the CPU has its
                // instruction set; the loop touches only its own locals.
                std::hint::black_box(unsafe { (self.fma_loop)(rounds) });
                (rounds * 12 * self.lanes * 2) as f64 / start.elapsed().as_secs_f64() / 1e9
            })
            .fold(0.0, f64::max)
    }

    /// `acc [mr, nr] = sum over p < rows, j < k of a[(p k + j) mr + i] * b[p b_rs + j d + col]`
    /// (`taps` = (k, d)): the panel `b` holds at least `(k - 1) d + nr` readable columns
    /// in each of its `rows` rows.
    pub fn tile(&self, a: &[f32], b: &[f32], b_rs: usize, rows: usize, taps: (usize, usize), acc: &mut [f32]) {
        self.apply(a, b, b_rs, rows, taps, acc, false)
    }

    /// [`Self::tile`] added onto `acc`.
    pub fn tile_onto(&self, a: &[f32], b: &[f32], b_rs: usize, rows: usize, taps: (usize, usize), acc: &mut [f32]) {
        self.apply(a, b, b_rs, rows, taps, acc, true)
    }

    #[allow(clippy::too_many_arguments)]
    fn apply(
        &self,
        a: &[f32],
        b: &[f32],
        b_rs: usize,
        rows: usize,
        (k, d): (usize, usize),
        acc: &mut [f32],
        onto: bool,
    ) {
        assert!(a.len() >= rows * k * self.mr, "conv tile: weight panel too short");
        assert!(rows == 0 || (rows - 1) * b_rs + (k - 1) * d + self.nr <= b.len(), "conv tile: input panel too short");
        assert!(acc.len() >= self.mr * self.nr, "conv tile: accumulator too short");
        let args = TileArgs { a: a.as_ptr(), b: b.as_ptr(), b_rs, rows, k, d, acc: acc.as_mut_ptr(), onto };
        // SAFETY: the asserts keep every read and write in bounds; `of_shape` offers a
        // tile only where the CPU has its instruction set.
        unsafe { (self.run)(&args) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tile_computes_the_folded_product() {
        let (rows, k, d) = (5, 3, 2);
        for m in [Shape::Wide, Shape::Tall].into_iter().flat_map(Micro::of_shape) {
            let b_rs = (k - 1) * d + m.nr + 3;
            let a: Vec<f32> = (0..rows * k * m.mr).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
            let b: Vec<f32> = (0..rows * b_rs).map(|i| ((i * 5) % 13) as f32 - 6.0).collect();
            let mut acc = vec![0f32; m.mr * m.nr];
            m.tile(&a, &b, b_rs, rows, (k, d), &mut acc);
            let mut twice = acc.clone();
            m.tile_onto(&a, &b, b_rs, rows, (k, d), &mut twice);
            for i in 0..m.mr {
                for col in 0..m.nr {
                    let want: f32 = (0..rows)
                        .flat_map(|p| (0..k).map(move |j| (p, j)))
                        .map(|(p, j)| a[(p * k + j) * m.mr + i] * b[p * b_rs + j * d + col])
                        .sum();
                    assert_eq!(acc[i * m.nr + col], want, "{} ({i}, {col})", m.name());
                    assert_eq!(twice[i * m.nr + col], 2.0 * want, "{} onto ({i}, {col})", m.name());
                }
            }
        }
    }
}

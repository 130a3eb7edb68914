//! Row kernels of the fused CPU ops, written as 16-lane loops that LLVM vectorises,
//! compiled for AVX-512 and for AVX2 + FMA besides the baseline and picked at run time
//! (the crate itself targets baseline x86-64, i.e. SSE2).
//!
//! Plain iterator sums, `f32::max` folds and libm's `expf` stay scalar: a sum in strict
//! floating point is one dependency chain. Here every reduction keeps 16 partial
//! results, and `exp` is a branch-free polynomial.

const LANES: usize = 16;

/// Defines `pub fn $name` that runs `$body` compiled for the best instruction set the
/// CPU has. The body is one inlined function, so all three copies compute the same
/// operations in the same order.
macro_rules! kernel {
    ($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU has AVX2 and FMA.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

/// `e^x` to within 2 ulp, branch-free; exactly 0 below -87.3 (where `e^x` leaves the
/// normal range: masked attention scores, `f32::MIN` minus the row maximum, must get a
/// probability of exactly 0), and finite up to 88.3 (the largest power of two it
/// builds is 2^127).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n * LN2_HI is exact for |n| <= 128 (Cody-Waite).
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding 1.5 * 2^23 rounds to the nearest integer, which then sits in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let underflow = x < -87.3;
    let x = x.clamp(-87.3, 88.3);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO; // |r| <= ln2 / 2
                                         // e^r by its Taylor series to r^7 (truncation < 1e-8 relative at |r| = 0.35).
    let p = 1.0 / 5040.0;
    let p = p * r + 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    let n_int = t.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let scale = f32::from_bits(((n_int + 127) as u32) << 23);
    if underflow {
        0.0
    } else {
        p * scale
    }
}

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// Sum of `f([a[i], b[i], ..])` over the rows `[a, b, ..]` (up to the shortest one's
/// length), in 16 interleaved partial sums. Whole 16-lane chunks are cut out before the
/// lanes are read, so the loop has no bounds checks and vectorises.
#[inline(always)]
fn lane_sum<const K: usize>(rows: [&[f32]; K], f: impl Fn([f32; K]) -> f32) -> f32 {
    let n = rows.iter().map(|r| r.len()).min().unwrap_or(0);
    let full = n - n % LANES;
    let mut acc = [0f32; LANES];
    for start in (0..full).step_by(LANES) {
        let chunks = rows.map(|r| <&[f32; LANES]>::try_from(&r[start..start + LANES]).expect("a whole chunk"));
        for (l, a) in acc.iter_mut().enumerate() {
            *a += f(chunks.map(|c| c[l]));
        }
    }
    let tail: f32 = (full..n).map(|i| f(rows.map(|r| r[i]))).sum();
    acc.iter().sum::<f32>() + tail
}

/// The largest element, in 16 interleaved partial maxima (see [`lane_sum`]).
#[inline(always)]
fn lane_max(x: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; LANES];
    let full = x.len() - x.len() % LANES;
    for c in x[..full].chunks_exact(LANES) {
        for (m, &v) in m.iter_mut().zip(c) {
            *m = m.max(v);
        }
    }
    x[full..].iter().chain(&m).copied().fold(f32::NEG_INFINITY, f32::max)
}

kernel! {
    /// RMSNorm over one row: `y = x * inv * w` with `inv = 1 / sqrt(mean(x^2) + eps)`.
    pub fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
        let inv = 1.0 / (lane_sum([x], |[x]| x * x) / x.len() as f32 + eps).sqrt();
        for ((y, &x), &w) in y.iter_mut().zip(x).zip(w) {
            *y = x * inv * w;
        }
    }
}

kernel! {
    /// RMSNorm's input gradient over one row, in place: `g` holds the output gradient
    /// and becomes `inv * g * w - x * inv^3 * mean(g * w * x)`.
    pub fn rms_norm_bwd_row(x: &[f32], w: &[f32], eps: f32, g: &mut [f32]) {
        let n = x.len().min(w.len()).min(g.len());
        let inv = 1.0 / (lane_sum([&x[..n]], |[x]| x * x) / n as f32 + eps).sqrt();
        let c = inv * inv * inv * lane_sum([g, w, x], |[g, w, x]| g * w * x) / n as f32;
        for ((g, &x), &w) in g.iter_mut().zip(x).zip(w) {
            *g = inv * *g * w - x * c;
        }
    }
}

kernel! {
    /// `y += a * x` over one row.
    pub fn axpy_row(a: f32, x: &[f32], y: &mut [f32]) {
        for (y, &x) in y.iter_mut().zip(x) {
            *y += a * x;
        }
    }
}

kernel! {
    /// `y = softmax(x)` over one row.
    pub fn softmax_row(x: &[f32], y: &mut [f32]) {
        y.copy_from_slice(x);
        let (_, sum) = exp_row(y, None);
        let inv = 1.0 / sum;
        y.iter_mut().for_each(|y| *y *= inv);
    }
}

kernel! {
    /// The softmax input gradient over one row: `dx = y * (g - sum(g * y))`.
    pub fn softmax_bwd_row(y: &[f32], g: &[f32], dx: &mut [f32]) {
        let dot = lane_sum([y, g], |[y, g]| y * g);
        for ((dx, &y), &g) in dx.iter_mut().zip(y).zip(g) {
            *dx = y * (g - dot);
        }
    }
}

kernel! {
    /// Attention scores to unnormalised probabilities, in place: `x = exp(x + mask -
    /// max)` with `max` the row's largest `x + mask`. Returns `(max, sum of the new x)`,
    /// the sum in `lane_sum`'s order.
    pub fn exp_row(x: &mut [f32], mask: Option<&[f32]>) -> (f32, f32) {
        if let Some(mask) = mask {
            x.iter_mut().zip(mask).for_each(|(x, m)| *x += m);
        }
        let max = lane_max(x);
        let full = x.len() - x.len() % LANES;
        let mut acc = [0f32; LANES];
        for c in x[..full].chunks_exact_mut(LANES) {
            for (x, a) in c.iter_mut().zip(&mut acc) {
                *x = exp(*x - max);
                *a += *x;
            }
        }
        x[full..].iter_mut().for_each(|x| *x = exp(*x - max));
        (max, acc.iter().sum::<f32>() + x[full..].iter().sum::<f32>())
    }
}

kernel! {
    /// One row of attention's backward from the row's log-sum-exp `lse` and `delta`
    /// (the row's `sum(dp * p)`): the probabilities `p = exp(s + mask - lse)` replace
    /// the scores `s`, and the scores' gradient `p (dp - delta)` replaces `dp`.
    pub fn attention_grad_row(s: &mut [f32], dp: &mut [f32], mask: Option<&[f32]>, lse: f32, delta: f32) {
        let rows = s.iter_mut().zip(dp.iter_mut());
        match mask {
            Some(mask) => rows.zip(mask).for_each(|((s, dp), m)| {
                let p = exp(*s + m - lse);
                *s = p;
                *dp = p * (*dp - delta);
            }),
            None => rows.for_each(|(s, dp)| {
                let p = exp(*s - lse);
                *s = p;
                *dp = p * (*dp - delta);
            }),
        }
    }
}

kernel! {
    /// `y = silu(gate) * up`.
    pub fn swiglu_row(gate: &[f32], up: &[f32], y: &mut [f32]) {
        for ((y, &g), &u) in y.iter_mut().zip(gate).zip(up) {
            *y = g * sigmoid(g) * u;
        }
    }
}

kernel! {
    /// One input gradient of SwiGLU from the output gradient `d`:
    /// `d_gate = d * up * s * (1 + gate * (1 - s))` with `s = sigmoid(gate)`, or
    /// `d_up = d * silu(gate)`.
    pub fn swiglu_bwd_row(gate: &[f32], up: &[f32], d: &[f32], dx: &mut [f32], wrt_gate: bool) {
        for (((dx, &g), &u), &d) in dx.iter_mut().zip(gate).zip(up).zip(d) {
            let s = sigmoid(g);
            *dx = if wrt_gate { d * u * s * (1.0 + g * (1.0 - s)) } else { d * g * s };
        }
    }
}

/// `sin(x)^2`, branch-free: sin^2 has period pi, so x is reduced to `r` in
/// [-pi/2, pi/2] (pi split in three so `k * PI_A` and `k * PI_B` are exact for |k| <
/// 2^12) and sin r is its Taylor series to r^11 (truncation < 6e-8 at pi/2).
#[inline(always)]
pub fn sin_sq(x: f32) -> f32 {
    const PI_A: f32 = 3.140625;
    const PI_B: f32 = 9.675_026e-4;
    const PI_C: f32 = 1.509_958e-7;
    const ROUND: f32 = 12_582_912.0;
    let k = (x * std::f32::consts::FRAC_1_PI + ROUND) - ROUND;
    let r = ((x - k * PI_A) - k * PI_B) - k * PI_C;
    let r2 = r * r;
    let p = -1.0 / 39_916_800.0;
    let p = p * r2 + 1.0 / 362_880.0;
    let p = p * r2 - 1.0 / 5040.0;
    let p = p * r2 + 1.0 / 120.0;
    let p = p * r2 - 1.0 / 6.0;
    let s = r + r * r2 * p;
    s * s
}

kernel! {
    /// Snake over one channel's row, in place: `x + inv_beta * sin(alpha * x)^2`.
    pub fn snake_row(x: &mut [f32], alpha: f32, inv_beta: f32) {
        for x in x.iter_mut() {
            *x += inv_beta * sin_sq(alpha * *x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate_and_exactly_zero_below_the_normal_range() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let exact = (x as f64).exp();
            worst = worst.max(((exp(x) as f64) - exact).abs() / exact);
            x += 0.0137;
        }
        println!("exp: worst relative error {worst:.2e} over [-87, 88]");
        assert!(worst < 3e-7, "relative error {worst}");
        assert_eq!(exp(f32::MIN), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(88.3).is_finite());
    }

    #[test]
    fn sin_sq_is_accurate_over_the_range_snake_sees() {
        let worst = (-400_000..=400_000)
            .map(|i| i as f32 * 2.5e-4)
            .map(|x| (sin_sq(x) as f64 - (x as f64).sin().powi(2)).abs())
            .fold(0f64, f64::max);
        println!("sin^2 on [-100, 100]: max abs err {worst:.2e}");
        assert!(worst < 5e-7, "sin_sq err {worst}");
        let mut row = vec![0.5f32, -2.0, 7.0];
        snake_row(&mut row, 1.5, 0.25);
        for (got, x) in row.iter().zip([0.5f32, -2.0, 7.0]) {
            assert!((got - (x + 0.25 * (1.5 * x).sin().powi(2))).abs() < 1e-6);
        }
    }

    #[test]
    fn row_kernels_match_plain_loops() {
        // 37: two full lane groups and a tail.
        let x: Vec<f32> = (0..37).map(|i| ((i * 7919) % 113) as f32 / 10.0 - 5.0).collect();
        let g: Vec<f32> = (0..37).map(|i| ((i * 104_729) % 97) as f32 / 30.0 - 1.5).collect();
        let rel = |a: f32, b: f32| (a - b).abs() / b.abs().max(1.0);

        // RMSNorm with weight w = g + 2, forward and input gradient (output gradient g).
        let w: Vec<f32> = g.iter().map(|v| v + 2.0).collect();
        let (n, eps) = (37.0, 1e-6);
        let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() / n + eps).sqrt();
        let mut y = vec![0f32; 37];
        rms_norm_row(&x, &w, eps, &mut y);
        let e_rms = y.iter().zip(&x).zip(&w).map(|((&y, &x), &w)| rel(y, x * inv * w)).fold(0f32, f32::max);
        let gwx: f32 = g.iter().zip(&w).zip(&x).map(|((g, w), x)| g * w * x).sum();
        let mut dx = g.clone();
        rms_norm_bwd_row(&x, &w, eps, &mut dx);
        let e_rms_bwd = dx
            .iter()
            .zip(&x)
            .zip(&g)
            .zip(&w)
            .map(|(((&d, &x), &g), &w)| rel(d, inv * g * w - x * inv * inv * inv * gwx / n))
            .fold(0f32, f32::max);

        let max = x.iter().copied().fold(f32::MIN, f32::max);
        let sum: f32 = x.iter().map(|v| (v - max).exp()).sum();
        let mut y = vec![0f32; 37];
        softmax_row(&x, &mut y);
        let e_soft = y.iter().zip(&x).map(|(&y, &x)| rel(y, (x - max).exp() / sum)).fold(0f32, f32::max);

        let dot_yg: f32 = y.iter().zip(&g).map(|(a, b)| a * b).sum();
        let mut dx = vec![0f32; 37];
        softmax_bwd_row(&y, &g, &mut dx);
        let e_soft_bwd = dx.iter().zip(&y).zip(&g).map(|((&d, &y), &g)| rel(d, y * (g - dot_yg))).fold(0f32, f32::max);

        let sig = |v: f32| 1.0 / (1.0 + (-v).exp());
        let mut s = vec![0f32; 37];
        swiglu_row(&x, &g, &mut s);
        let e_swiglu = s.iter().zip(&x).zip(&g).map(|((&s, &x), &u)| rel(s, x * sig(x) * u)).fold(0f32, f32::max);
        let mut dg = vec![0f32; 37];
        swiglu_bwd_row(&x, &g, &g, &mut dg, true);
        let e_dgate = dg
            .iter()
            .zip(&x)
            .zip(&g)
            .map(|((&d, &x), &u)| rel(d, u * u * sig(x) * (1.0 + x * (1.0 - sig(x)))))
            .fold(0f32, f32::max);

        println!(
            "relative errors: rms_norm {e_rms:.1e}, rms_norm bwd {e_rms_bwd:.1e}, softmax {e_soft:.1e}, softmax bwd {e_soft_bwd:.1e}, swiglu {e_swiglu:.1e}, d gate {e_dgate:.1e}"
        );
        for err in [e_rms, e_rms_bwd, e_soft, e_soft_bwd, e_swiglu, e_dgate] {
            assert!(err < 1e-6, "{err}");
        }
    }

    #[test]
    fn a_masked_softmax_entry_is_exactly_zero() {
        let x = [0.5, f32::MIN, 1.0, f32::MIN];
        let mut y = [1f32; 4];
        softmax_row(&x, &mut y);
        assert_eq!((y[1], y[3]), (0.0, 0.0));
        assert!((y[0] + y[2] - 1.0).abs() < 1e-7);
    }

    /// The attention kernels against plain loops on a masked row: `exp_row`'s
    /// exponentials, maximum and sum, and `attention_grad_row`'s probabilities and
    /// score gradient from the log-sum-exp. Masked entries come out exactly 0.
    #[test]
    fn attention_row_kernels_match_plain_loops() {
        let x: Vec<f32> = (0..37).map(|i| ((i * 7919) % 113) as f32 / 10.0 - 5.0).collect();
        let dp: Vec<f32> = (0..37).map(|i| ((i * 104_729) % 97) as f32 / 30.0 - 1.5).collect();
        let mask: Vec<f32> = (0..37).map(|i| if i % 5 == 3 { f32::MIN } else { 0.0 }).collect();
        let rel = |a: f32, b: f32| (a - b).abs() / b.abs().max(1.0);
        let masked: Vec<f32> = x.iter().zip(&mask).map(|(x, m)| x + m).collect();
        let max = masked.iter().copied().fold(f32::MIN, f32::max);
        let sum: f32 = masked.iter().map(|v| (v - max).exp()).sum();

        let mut e = x.clone();
        let (m, s) = exp_row(&mut e, Some(&mask));
        let e_exp = e.iter().zip(&masked).map(|(&e, &x)| rel(e, (x - max).exp())).fold(0f32, f32::max);
        assert_eq!(m, max);
        let e_sum = rel(s, sum);

        let lse = max + sum.ln();
        let p: Vec<f32> = masked.iter().map(|v| (v - max).exp() / sum).collect();
        let delta: f32 = p.iter().zip(&dp).map(|(p, g)| p * g).sum();
        let (mut probs, mut ds) = (x.clone(), dp.clone());
        attention_grad_row(&mut probs, &mut ds, Some(&mask), lse, delta);
        let e_p = probs.iter().zip(&p).map(|(&a, &b)| rel(a, b)).fold(0f32, f32::max);
        let e_ds = ds.iter().zip(&p).zip(&dp).map(|((&d, &p), &g)| rel(d, p * (g - delta))).fold(0f32, f32::max);
        println!("relative errors: exp_row {e_exp:.1e} (sum {e_sum:.1e}), probabilities {e_p:.1e}, score gradient {e_ds:.1e}");
        for err in [e_exp, e_sum, e_p, e_ds] {
            assert!(err < 2e-6, "{err}");
        }
        for i in (3..37).step_by(5) {
            assert_eq!((e[i], probs[i], ds[i]), (0.0, 0.0, 0.0), "masked entry {i}");
        }
    }
}

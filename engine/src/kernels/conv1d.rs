//! Direct 1-D convolutions on the CPU (f32), for the Oobleck VAE.
//!
//! A convolution with k taps is k accumulating GEMMs, `out += W_j X_j`, where `W_j` is
//! tap j of the weight `[out, in, k]` (a strided view, nothing copied) and `X_j` is a
//! time-shifted view of the padded input (shift j * dilation, columns `stride` apart: a
//! strided conv reads its polyphase component in place). im2col's k-fold copy of the
//! input never exists; the copies are the padded input (Snake, which always comes
//! right before a convolution in this model, is applied while it is written) and, per
//! thread, one L2-sized block of it at a time (see [`accumulate`]).
//!
//! A transposed conv with k = 2s and stride s writes each output phase r (samples
//! `t ≡ r - p mod s`) from two taps: `W_r^T x[q] + W_{r+s}^T x[q-1]`, two GEMMs into a
//! view whose columns are s apart.
//!
//! Signals are row-major `[channels, len]`. Other devices keep candle's conv path.

use rayon::prelude::*;

use crate::kernels::cpu_gemm::{matmul_into_strided, Mat, Threads};
use crate::kernels::simd;

/// Snake's per-channel parameters as the model folds them: `e^alpha` and
/// `1 / (e^beta + 1e-9)`.
#[derive(Clone, Copy)]
pub(crate) struct Snake<'a> {
    pub alpha: &'a [f32],
    pub inv_beta: &'a [f32],
}

/// A convolution: folded weight `[cout, cin, k]`, optional bias `[cout]`, geometry.
#[derive(Clone, Copy)]
pub(crate) struct Conv<'a> {
    pub weight: &'a [f32],
    pub bias: Option<&'a [f32]>,
    pub cin: usize,
    pub cout: usize,
    pub k: usize,
    pub stride: usize,
    pub dilation: usize,
    pub padding: usize,
}

impl Conv<'_> {
    /// Output length for `len` input samples (torch's formula).
    pub fn out_len(&self, len: usize) -> usize {
        (len + 2 * self.padding).saturating_sub(self.dilation * (self.k - 1) + 1) / self.stride + 1
    }
}

/// Applies Snake to each channel row of `x` (rows of `len`) in place.
pub(crate) fn snake_in_place(x: &mut [f32], len: usize, snake: Snake) {
    x.par_chunks_mut(len.max(1))
        .enumerate()
        .for_each(|(c, row)| simd::snake_row(row, snake.alpha[c], snake.inv_beta[c]));
}

/// `snake(x)` (or `x`) `[channels, len]` with `left` and `right` zeros around each row.
fn padded(x: &[f32], len: usize, left: usize, right: usize, snake: Option<Snake>) -> Vec<f32> {
    let width = left + len + right;
    let channels = x.len() / len.max(1);
    let mut out = vec![0f32; channels * width];
    out.par_chunks_mut(width.max(1)).enumerate().for_each(|(c, row)| {
        let body = &mut row[left..left + len];
        body.copy_from_slice(&x[c * len..(c + 1) * len]);
        if let Some(s) = snake {
            simd::snake_row(body, s.alpha[c], s.inv_beta[c]);
        }
    });
    out
}

/// `[rows, len]` filled with `bias[row]` (zeros without a bias).
fn bias_rows(bias: Option<&[f32]>, rows: usize, len: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * len];
    if let Some(b) = bias {
        out.par_chunks_mut(len.max(1)).zip(b).for_each(|(row, &b)| row.fill(b));
    }
    out
}

/// One tap of a convolution: its weight `[cout, cin]` (a view) and where it reads the
/// input, `x[:, shift + t * stride]` for output column t.
struct Tap<'a> {
    weight: Mat<'a>,
    shift: usize,
}

/// Where the output columns go: `cols` columns of `out` (rows `rs` apart), column t
/// at `offset + t * cs`.
#[derive(Clone, Copy)]
struct Columns {
    offset: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

/// `out += sum over taps of W_tap X_tap`, X_tap the strided, shifted view of `x [cin,
/// width]`. The output's rows are split between the threads; each goes along time in
/// blocks of `BLOCK_COLS` columns and first copies the input block all taps read into a
/// compact buffer: the GEMM reads that operand in place (it packs only the weight),
/// and straight from a long signal its rows would lie a whole signal apart.
fn accumulate(out: &mut [f32], dst: Columns, x: &[f32], width: usize, stride: usize, taps: &[Tap]) {
    let (cout, cin) = (taps[0].weight.rows, taps[0].weight.cols);
    let reach = taps.iter().map(|t| t.shift).max().unwrap_or(0);
    let span = (BLOCK_COLS - 1) * stride + reach + 1;
    let rows_per = cout.div_ceil(rayon::current_num_threads().max(1));
    out.par_chunks_mut((rows_per * dst.rs).max(1)).enumerate().for_each(|(part, out)| {
        let rows = out.len() / dst.rs.max(1);
        let mut block = vec![0f32; cin * span];
        for t0 in (0..dst.cols).step_by(BLOCK_COLS) {
            let cols = BLOCK_COLS.min(dst.cols - t0);
            let used = (cols - 1) * stride + reach + 1;
            for (c, row) in block.chunks_exact_mut(span).enumerate() {
                row[..used].copy_from_slice(&x[c * width + t0 * stride..][..used]);
            }
            for tap in taps {
                let w = tap.weight.row_range(part * rows_per, rows);
                let xb = Mat { data: &block, offset: tap.shift, rows: cin, cols, rs: span, cs: stride };
                matmul_into_strided(out, dst.offset + t0 * dst.cs, (dst.rs, dst.cs), w, xb, true, Threads::Calling);
            }
        }
    });
}

/// Output columns per block: the block of the output and the input it reads stay in
/// L2 while all taps accumulate into it.
const BLOCK_COLS: usize = 512;

/// `out [cout, n_out] += conv(xp)` over the already padded input `xp [cin, width]`.
fn accumulate_taps(out: &mut [f32], n_out: usize, xp: &[f32], width: usize, conv: &Conv) {
    let taps: Vec<Tap> = (0..conv.k)
        .map(|j| Tap {
            weight: Mat {
                data: conv.weight,
                offset: j,
                rows: conv.cout,
                cols: conv.cin,
                rs: conv.cin * conv.k,
                cs: conv.k,
            },
            shift: j * conv.dilation,
        })
        .collect();
    accumulate(out, Columns { offset: 0, cols: n_out, rs: n_out, cs: 1 }, xp, width, conv.stride, &taps);
}

/// `conv(snake(x))` (or `conv(x)`) of `x [cin, len]`: `([cout, n_out], n_out)`.
pub(crate) fn conv1d(x: &[f32], len: usize, conv: &Conv, snake: Option<Snake>) -> (Vec<f32>, usize) {
    let n_out = conv.out_len(len);
    let mut out = bias_rows(conv.bias, conv.cout, n_out);
    if conv.k == 1 && conv.padding == 0 && conv.stride == 1 && snake.is_none() {
        accumulate_taps(&mut out, n_out, x, len, conv);
    } else {
        let xp = padded(x, len, conv.padding, conv.padding, snake);
        accumulate_taps(&mut out, n_out, &xp, len + 2 * conv.padding, conv);
    }
    (out, n_out)
}

/// Oobleck's residual unit `x + conv2(snake2(conv1(snake1(x))))` of `x [c, len]`,
/// both convs length-preserving, conv2 1x1. At most three signals of x's size are
/// alive at once: x, the padded snake1(x) and conv1's output (which snake2 then
/// overwrites); conv2 accumulates straight into a copy of x.
pub(crate) fn residual_unit(
    x: &[f32],
    len: usize,
    snake1: Snake,
    conv1: &Conv,
    snake2: Snake,
    conv2: &Conv,
) -> Vec<f32> {
    let (mut h, _) = conv1d(x, len, conv1, Some(snake1));
    snake_in_place(&mut h, len, snake2);
    let mut out = x.to_vec();
    if let Some(b) = conv2.bias {
        out.par_chunks_mut(len.max(1)).zip(b).for_each(|(row, &b)| row.iter_mut().for_each(|v| *v += b));
    }
    accumulate_taps(&mut out, len, &h, len, conv2);
    out
}

/// `ConvTranspose1d(snake(x))` with weight `[cin, cout, 2s]`, stride s, padding
/// ceil(s/2), bias `[cout]`: `x [cin, len] -> [cout, len * s]` (even s).
pub(crate) fn conv_transpose1d(
    x: &[f32],
    len: usize,
    weight: &[f32],
    bias: &[f32],
    (cin, cout, s): (usize, usize, usize),
    snake: Option<Snake>,
) -> Vec<f32> {
    let (k, p, n_out) = (2 * s, s.div_ceil(2), len * s);
    // One zero column either side: x[q] sits at column q + 1, x[-1] and x[len] are 0.
    let width = len + 2;
    let xp = padded(x, len, 1, 1, snake);
    let mut out = bias_rows(Some(bias), cout, n_out);
    if n_out == 0 {
        return out;
    }
    for r in 0..s {
        // Output t = q s + r - p for q in first..=last, inside [0, n_out).
        let first = usize::from(r < p);
        let last = (n_out - 1 + p - r) / s;
        if last < first {
            continue;
        }
        // W_tap^T [cout, cin]: element (o, c) of the weight at c cout k + o k + tap.
        let w = |tap: usize| Mat { data: weight, offset: tap, rows: cout, cols: cin, rs: k, cs: cout * k };
        let taps = [Tap { weight: w(r), shift: first + 1 }, Tap { weight: w(r + s), shift: first }];
        let dst = Columns { offset: first * s + r - p, cols: last - first + 1, rs: n_out, cs: s };
        accumulate(&mut out, dst, &xp, width, 1, &taps);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    fn random(n: usize, seed: u64) -> Vec<f32> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
    }

    fn tensor(v: &[f32], shape: &[usize]) -> Tensor {
        Tensor::from_vec(v.to_vec(), shape, &Device::Cpu).unwrap()
    }

    /// candle's Snake, as the model computed it before these kernels.
    fn candle_snake(x: &Tensor, s: Snake) -> Tensor {
        let c = s.alpha.len();
        let (a, b) = (tensor(s.alpha, &[1, c, 1]), tensor(s.inv_beta, &[1, c, 1]));
        (x + x.broadcast_mul(&a).unwrap().sin().unwrap().sqr().unwrap().broadcast_mul(&b).unwrap()).unwrap()
    }

    fn max_diff(a: &[f32], b: &Tensor) -> f32 {
        let b: Vec<f32> = b.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(a.len(), b.len(), "lengths differ");
        a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    fn snake_params(c: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
        let alpha = random(c, seed).iter().map(|a| (a * 0.5).exp()).collect();
        let inv_beta = random(c, seed + 1).iter().map(|b| 1.0 / ((b * 0.5).exp() + 1e-9)).collect();
        (alpha, inv_beta)
    }

    #[test]
    fn convs_match_candles_im2col_path() {
        let (cin, cout, len) = (5, 7, 181);
        let x = random(cin * len, 1);
        let (alpha, inv_beta) = snake_params(cin, 2);
        let snake = Snake { alpha: &alpha, inv_beta: &inv_beta };
        // (k, stride, dilation, padding): the VAE's k7 dilated units, k1, k3, strided k = 2s.
        for (k, stride, dilation, padding) in [
            (7, 1, 1, 3),
            (7, 1, 3, 9),
            (7, 1, 9, 27),
            (1, 1, 1, 0),
            (3, 1, 1, 1),
            (4, 2, 1, 1),
            (12, 6, 1, 3),
            (20, 10, 1, 5),
        ] {
            let w = random(cout * cin * k, 3 + k as u64);
            let b = random(cout, 4);
            let conv = Conv { weight: &w, bias: Some(&b), cin, cout, k, stride, dilation, padding };
            let xt = tensor(&x, &[1, cin, len]);
            for fused in [false, true] {
                let input = if fused { candle_snake(&xt, snake) } else { xt.clone() };
                let want = input
                    .conv1d(&tensor(&w, &[cout, cin, k]), padding, stride, dilation, 1)
                    .unwrap()
                    .broadcast_add(&tensor(&b, &[1, cout, 1]))
                    .unwrap();
                let (got, n_out) = conv1d(&x, len, &conv, fused.then_some(snake));
                assert_eq!(n_out, want.dim(2).unwrap());
                let err = max_diff(&got, &want);
                assert!(err < 1e-5, "k {k} stride {stride} dilation {dilation} snake {fused}: err {err}");
            }
        }
    }

    #[test]
    fn residual_unit_matches_its_definition() {
        let (c, len) = (6, 97);
        let x = random(c * len, 5);
        let (a1, b1) = snake_params(c, 6);
        let (a2, b2) = snake_params(c, 8);
        let (w1, bias1, w2, bias2) = (random(c * c * 7, 10), random(c, 11), random(c * c, 12), random(c, 13));
        let conv1 = Conv { weight: &w1, bias: Some(&bias1), cin: c, cout: c, k: 7, stride: 1, dilation: 3, padding: 9 };
        let conv2 = Conv { weight: &w2, bias: Some(&bias2), cin: c, cout: c, k: 1, stride: 1, dilation: 1, padding: 0 };
        let (s1, s2) = (Snake { alpha: &a1, inv_beta: &b1 }, Snake { alpha: &a2, inv_beta: &b2 });
        let got = residual_unit(&x, len, s1, &conv1, s2, &conv2);
        let xt = tensor(&x, &[1, c, len]);
        let h = candle_snake(&xt, s1)
            .conv1d(&tensor(&w1, &[c, c, 7]), 9, 1, 3, 1)
            .unwrap()
            .broadcast_add(&tensor(&bias1, &[1, c, 1]))
            .unwrap();
        let y = candle_snake(&h, s2)
            .conv1d(&tensor(&w2, &[c, c, 1]), 0, 1, 1, 1)
            .unwrap()
            .broadcast_add(&tensor(&bias2, &[1, c, 1]))
            .unwrap();
        let err = max_diff(&got, &(xt + y).unwrap());
        assert!(err < 1e-5, "residual unit err {err}");
    }

    #[test]
    fn transposed_conv_matches_candles_col2im_path() {
        let (cin, cout, len) = (6, 4, 53);
        let x = random(cin * len, 20);
        let (alpha, inv_beta) = snake_params(cin, 21);
        let snake = Snake { alpha: &alpha, inv_beta: &inv_beta };
        for s in [2, 4, 6, 10] {
            let w = random(cin * cout * 2 * s, 22 + s as u64);
            let b = random(cout, 23);
            let got = conv_transpose1d(&x, len, &w, &b, (cin, cout, s), Some(snake));
            let xt = candle_snake(&tensor(&x, &[1, cin, len]), snake);
            let full = xt.conv_transpose1d(&tensor(&w, &[cin, cout, 2 * s]), 0, 0, s, 1, 1).unwrap();
            let want =
                full.narrow(2, s.div_ceil(2), len * s).unwrap().broadcast_add(&tensor(&b, &[1, cout, 1])).unwrap();
            let err = max_diff(&got, &want);
            assert!(err < 1e-5, "stride {s}: err {err}");
        }
    }
}

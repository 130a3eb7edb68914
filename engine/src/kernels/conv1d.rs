//! Direct 1-D convolutions on the CPU (f32), for the Oobleck VAE.
//!
//! Every convolution here is one reduction of length (input rows) x (taps) per output
//! element, computed by the register tile of [`super::conv_tile`]: the packed weight
//! is its A operand, and a panel of input rows its B operand, read in place with each
//! tap j a shift of j * dilation along the row. No im2col copy exists; the only copies
//! are the panels, one per thread at a time (a chunk of columns plus the taps' reach,
//! with the padding's zeros and the Snake that always precedes a conv in this model
//! written in as it is filled), and the packed weight.
//!
//! - A strided conv (k = 2s, stride s) is a stride-1 conv over the input's s polyphase
//!   rows (`x[c, q s + r]` as row (c, r)) with ceil(k / s) taps: the panel is filled
//!   from the phases, the weight packed to match.
//! - A transposed conv (k = 2s, stride s) is a stride-1 conv with two taps whose s * cout
//!   output rows are the output's phases: row (o, r), column q lands at `q s + r - p`.
//! - The residual unit runs both of its convs chunk by chunk: conv1's output for one
//!   chunk of columns (and snake2 on it) stays in the thread's cache for the 1x1 conv2,
//!   which writes `x + conv2(...)` straight into the result; no full-length
//!   intermediate exists.
//!
//! Threads take chunks of output columns (time), so each owns its panel and writes
//! columns no other thread writes. Signals are row-major `[channels, len]`. Other
//! devices keep candle's conv path.

use rayon::prelude::*;

use super::conv_profile;
use super::conv_tile::Micro;
use super::shared_out::Shared;
use super::simd;

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

    fn bias_at(&self, row: usize) -> f32 {
        self.bias.map_or(0.0, |b| b[row])
    }

    /// Panel rows per input channel: the stride's polyphase components.
    fn phases(&self) -> usize {
        assert!(self.stride == 1 || self.dilation == 1, "conv1d: a strided conv must not be dilated");
        self.stride
    }

    /// The weight packed for `m`: panel row (c, r) (phase r of channel c), tap j is the
    /// conv's tap `j * stride + r` (zero past k).
    fn packed(&self, m: &Micro) -> Packed {
        let s = self.phases();
        let (cin, k) = (self.cin, self.k);
        let taps = (k.div_ceil(s), if s == 1 { self.dilation } else { 1 });
        Packed::new(m, self.cout, cin * s, taps, |row, out| {
            let w = &self.weight[row * cin * k..(row + 1) * cin * k];
            if s == 1 {
                return out.copy_from_slice(w);
            }
            for (p, out) in out.chunks_exact_mut(taps.0).enumerate() {
                let (c, r) = (p / s, p % s);
                for (j, out) in out.iter_mut().enumerate() {
                    *out = w[c * k..(c + 1) * k].get(j * s + r).copied().unwrap_or(0.0);
                }
            }
        })
    }

    /// The panel source of input `x [cin, len]`.
    fn source<'a>(&self, x: &'a [f32], len: usize, snake: Option<Snake<'a>>) -> Source<'a> {
        Source { x, len, phases: self.phases(), pad: self.padding, snake }
    }
}

/// A weight as [`Micro::tile`] reads it: for each block of `mr` output rows, `[rows *
/// k][mr]` (panel row, tap, row in the block; rows past the end are zero).
struct Packed {
    data: Vec<f32>,
    panel_rows: usize,
    /// (taps, dilation)
    taps: (usize, usize),
}

impl Packed {
    /// `row(r, k)` writes output row r's weights in the order the panel is read:
    /// `k[p * taps + j]` for panel row p, tap j.
    fn new(
        m: &Micro,
        out_rows: usize,
        panel_rows: usize,
        taps: (usize, usize),
        row: impl Fn(usize, &mut [f32]) + Sync,
    ) -> Self {
        let depth = panel_rows * taps.0;
        let mut data = vec![0f32; out_rows.div_ceil(m.mr) * depth * m.mr];
        data.par_chunks_mut((depth * m.mr).max(1)).enumerate().for_each_init(
            || vec![0f32; depth],
            |k, (b, a)| {
                for (i, r) in (b * m.mr..out_rows.min((b + 1) * m.mr)).enumerate() {
                    row(r, k);
                    for (a, &w) in a[i..].iter_mut().step_by(m.mr).zip(k.iter()) {
                        *a = w;
                    }
                }
            },
        );
        Self { data, panel_rows, taps }
    }

    /// Columns of the input past a chunk's last column that its taps read.
    fn reach(&self) -> usize {
        (self.taps.0 - 1) * self.taps.1
    }

    /// `emit(first row, first column, tile)` for each `mr x nr` tile of the product
    /// over `cols` columns of `panel` (rows `width` apart, `reach` more columns readable).
    fn tiles(
        &self,
        m: &Micro,
        panel: &[f32],
        width: usize,
        cols: usize,
        acc: &mut [f32],
        mut emit: impl FnMut(usize, usize, &[f32]),
    ) {
        let block = self.panel_rows * self.taps.0 * m.mr;
        for c0 in (0..cols).step_by(m.nr) {
            for (b, a) in self.data.chunks_exact(block).enumerate() {
                m.tile(a, &panel[c0..], width, self.panel_rows, self.taps, acc);
                emit(b * m.mr, c0, acc);
            }
        }
    }
}

/// Where a panel's rows come from: row p is phase `p % phases` of channel `p / phases`
/// of `x [c, len]`, i.e. its column u of a chunk starting at output column t0 is
/// sample `(t0 + u) phases + p % phases - pad` (zero outside the signal), Snake applied.
struct Source<'a> {
    x: &'a [f32],
    len: usize,
    phases: usize,
    pad: usize,
    snake: Option<Snake<'a>>,
}

impl Source<'_> {
    fn rows(&self) -> usize {
        self.x.len() / self.len.max(1) * self.phases
    }

    fn fill(&self, panel: &mut [f32], width: usize, t0: usize) {
        for (p, row) in panel.chunks_exact_mut(width).enumerate() {
            let (c, r) = (p / self.phases, p % self.phases);
            let x = &self.x[c * self.len..(c + 1) * self.len];
            // Column u reads sample i0 + u phases - pad.
            let i0 = t0 * self.phases + r;
            let lo = self.pad.saturating_sub(i0).div_ceil(self.phases).min(width);
            let hi = (self.len + self.pad).saturating_sub(i0).div_ceil(self.phases).clamp(lo, width);
            row[..lo].fill(0.0);
            if hi > lo {
                let from = &x[i0 + lo * self.phases - self.pad..];
                if self.phases == 1 {
                    row[lo..hi].copy_from_slice(&from[..hi - lo]);
                } else {
                    for (v, x) in row[lo..hi].iter_mut().zip(from.iter().step_by(self.phases)) {
                        *v = *x;
                    }
                }
            }
            row[hi..].fill(0.0);
            // Snake(0) = 0: the padding may go through it.
            if let Some(s) = self.snake {
                simd::snake_row(row, s.alpha[c], s.inv_beta[c]);
            }
        }
    }
}

/// Output columns per chunk for a panel of `rows` rows: a multiple of `nr`, the panel
/// about 256 KiB (in L2 with the packed weight's stream).
fn chunk_cols(m: &Micro, rows: usize) -> usize {
    m.nr * (65_536 / rows.max(1) / m.nr).clamp(1, 8)
}

/// Runs `src` through `w` chunk by chunk over output columns `0..cols` on the thread
/// pool; `emit(out, chunk start, tile row, tile column in the chunk, valid columns,
/// tile)` stores each tile.
fn convolve(
    m: &Micro,
    src: &Source,
    w: &Packed,
    cols: usize,
    emit: impl Fn(usize, usize, usize, usize, &[f32]) + Sync,
) {
    if cols == 0 {
        return;
    }
    assert_eq!(src.rows(), w.panel_rows, "conv1d: input rows and weight differ");
    let chunk = chunk_cols(m, w.panel_rows);
    let width = chunk + w.reach();
    (0..cols.div_ceil(chunk)).into_par_iter().for_each_init(
        || (vec![0f32; w.panel_rows * width], vec![0f32; m.mr * m.nr]),
        |(panel, acc), ci| {
            let t0 = ci * chunk;
            let n = chunk.min(cols - t0);
            src.fill(panel, width, t0);
            w.tiles(m, panel, width, n, acc, |row0, c0, tile| emit(t0, row0, c0, m.nr.min(n - c0), tile));
        },
    );
}

/// `conv(snake(x))` (or `conv(x)`) of `x [cin, len]`: `([cout, n_out], n_out)`.
pub(crate) fn conv1d(x: &[f32], len: usize, conv: &Conv, snake: Option<Snake>) -> (Vec<f32>, usize) {
    let since = conv_profile::clock();
    let (out, n_out) = conv1d_on(&Micro::best(), x, len, conv, snake);
    let geometry = (conv.cin, conv.cout, conv.k, conv.stride, conv.dilation);
    conv_profile::record(since, "conv", geometry, n_out, conv.cin * conv.cout * conv.k);
    (out, n_out)
}

fn conv1d_on(m: &Micro, x: &[f32], len: usize, conv: &Conv, snake: Option<Snake>) -> (Vec<f32>, usize) {
    let n_out = conv.out_len(len);
    let mut out = vec![0f32; conv.cout * n_out];
    let w = conv.packed(m);
    let shared = Shared::new(&mut out);
    convolve(m, &conv.source(x, len, snake), &w, n_out, |t0, row0, c0, cols, tile| {
        for (i, row) in (row0..conv.cout.min(row0 + m.mr)).enumerate() {
            let b = conv.bias_at(row);
            // SAFETY: columns t0 + c0.. of this chunk belong to this thread.
            let out = unsafe { shared.part(row * n_out + t0 + c0, cols) };
            for (o, v) in out.iter_mut().zip(&tile[i * m.nr..]) {
                *o = v + b;
            }
        }
    });
    (out, n_out)
}

/// Oobleck's residual unit `x + conv2(snake2(conv1(snake1(x))))` of `x [c, len]`,
/// both convs length-preserving, conv2 1x1. Chunk by chunk: conv1's output for the
/// chunk's columns goes through snake2 and conv2 while in cache; only x and the
/// result exist at full length.
pub(crate) fn residual_unit(
    x: &[f32],
    len: usize,
    snake1: Snake,
    conv1: &Conv,
    snake2: Snake,
    conv2: &Conv,
) -> Vec<f32> {
    let since = conv_profile::clock();
    let out = residual_unit_on(&Micro::best(), x, len, (snake1, conv1), (snake2, conv2));
    let (c, k) = (conv1.cout, conv1.k);
    conv_profile::record(since, "residual unit", (c, c, k, 1, conv1.dilation), len, c * c * (k + 1));
    out
}

fn residual_unit_on(
    m: &Micro,
    x: &[f32],
    len: usize,
    (snake1, conv1): (Snake, &Conv),
    (snake2, conv2): (Snake, &Conv),
) -> Vec<f32> {
    let c = conv1.cout;
    assert!(conv1.out_len(len) == len && conv2.k == 1 && conv1.cin == c && conv2.cin == c && conv2.cout == c);
    let (w1, w2) = (conv1.packed(m), conv2.packed(m));
    let src = conv1.source(x, len, Some(snake1));
    let chunk = chunk_cols(m, c);
    let width = chunk + w1.reach();
    let mut out = vec![0f32; c * len];
    let shared = Shared::new(&mut out);
    (0..len.div_ceil(chunk)).into_par_iter().for_each_init(
        || (vec![0f32; c * width], vec![0f32; c * chunk], vec![0f32; m.mr * m.nr]),
        |(panel, h, acc), ci| {
            let t0 = ci * chunk;
            let n = chunk.min(len - t0);
            src.fill(panel, width, t0);
            w1.tiles(m, panel, width, n, acc, |row0, c0, tile| {
                let cols = m.nr.min(n - c0);
                for (i, row) in (row0..c.min(row0 + m.mr)).enumerate() {
                    let b = conv1.bias_at(row);
                    for (h, v) in h[row * chunk + c0..][..cols].iter_mut().zip(&tile[i * m.nr..]) {
                        *h = v + b;
                    }
                }
            });
            for (row, h) in h.chunks_exact_mut(chunk).enumerate() {
                simd::snake_row(&mut h[..n], snake2.alpha[row], snake2.inv_beta[row]);
            }
            w2.tiles(m, h, chunk, n, acc, |row0, c0, tile| {
                let cols = m.nr.min(n - c0);
                for (i, row) in (row0..c.min(row0 + m.mr)).enumerate() {
                    let (b, at) = (conv2.bias_at(row), row * len + t0 + c0);
                    // SAFETY: columns t0 + c0.. of this chunk belong to this thread.
                    let out = unsafe { shared.part(at, cols) };
                    for ((o, x), v) in out.iter_mut().zip(&x[at..]).zip(&tile[i * m.nr..]) {
                        *o = x + (v + b);
                    }
                }
            });
        },
    );
    out
}

/// `ConvTranspose1d(snake(x))` with weight `[cin, cout, 2s]`, stride s, padding
/// ceil(s/2), bias `[cout]`: `x [cin, len] -> [cout, len * s]` (even s).
pub(crate) fn conv_transpose1d(
    x: &[f32],
    len: usize,
    weight: &[f32],
    bias: &[f32],
    shape: (usize, usize, usize),
    snake: Option<Snake>,
) -> Vec<f32> {
    let since = conv_profile::clock();
    let out = conv_transpose1d_on(&Micro::best(), x, len, (weight, bias), shape, snake);
    let (cin, cout, s) = shape;
    conv_profile::record(since, "transposed", (cin, cout, 2 * s, s, 1), len * s, cin * cout * 2);
    out
}

fn conv_transpose1d_on(
    m: &Micro,
    x: &[f32],
    len: usize,
    (weight, bias): (&[f32], &[f32]),
    (cin, cout, s): (usize, usize, usize),
    snake: Option<Snake>,
) -> Vec<f32> {
    let (k, p, n_out) = (2 * s, s.div_ceil(2), len * s);
    if n_out == 0 {
        return Vec::new();
    }
    // Output row (o, r) at input column q is `W_r^T x[q] + W_{r+s}^T x[q-1]` for
    // output sample `q s + r - p`: the panel holds x one column late (x[-1] = 0), tap
    // 0 reads x[q-1], tap 1 x[q]; q runs to len, where x[len] = 0.
    let w = Packed::new(m, s * cout, cin, (2, 1), |row, out| {
        let (o, r) = (row / s, row % s);
        for (c, out) in out.chunks_exact_mut(2).enumerate() {
            let w = &weight[(c * cout + o) * k..][..k];
            out.copy_from_slice(&[w[r + s], w[r]]);
        }
    });
    let src = Source { x, len, phases: 1, pad: 1, snake };
    let mut out = vec![0f32; cout * n_out];
    let shared = Shared::new(&mut out);
    convolve(m, &src, &w, len + 1, |t0, row0, c0, cols, tile| {
        for (i, row) in (row0..(s * cout).min(row0 + m.mr)).enumerate() {
            let (o, r) = (row / s, row % s);
            // Input column q lands at q s + r - p: the tile's columns inside [0, n_out).
            let q0 = t0 + c0;
            let first = (p.saturating_sub(r)).div_ceil(s).saturating_sub(q0).min(cols);
            let end = (n_out + p - r).div_ceil(s).saturating_sub(q0).clamp(first, cols);
            if first == end {
                continue;
            }
            let b = bias[o];
            let start = (q0 + first) * s + r - p;
            // SAFETY: input columns t0 + c0.. of this chunk belong to this thread, and
            // with them the output samples `q s + r - p`.
            let out = unsafe { shared.part(o * n_out + start, (end - first - 1) * s + 1) };
            for (dst, y) in out.iter_mut().step_by(s).zip(&tile[i * m.nr + first..i * m.nr + end]) {
                *dst = y + b;
            }
        }
    });
    out
}

#[cfg(test)]
mod tests;

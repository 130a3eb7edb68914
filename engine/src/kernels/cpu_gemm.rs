//! f32 GEMM on the CPU over strided views into slices, for ops that write into a
//! buffer they own: accumulating (`dst += a b`) saves the temporary and the add that
//! candle's matmul-then-add needs, and a small product can stay on the calling thread.

use candle_core::{CpuStorage, Layout, Result, Storage};

/// Matrix `(rows, cols)` inside `data`: element `(i, j)` at `offset + i * rs + j * cs`.
#[derive(Clone, Copy)]
pub struct Mat<'a> {
    pub data: &'a [f32],
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// A row-major `(rows, cols)` block starting at `offset`, rows `rs` apart.
    pub fn rows(data: &'a [f32], offset: usize, rows: usize, cols: usize, rs: usize) -> Self {
        Self { data, offset, rows, cols, rs, cs: 1 }
    }

    /// Matrix `index` of a tensor's layout: its last two dimensions, at position `index`
    /// of the leading ones taken row-major (head `(i, h)` of `(B, KV, rows, cols)` is
    /// `i * KV + h`).
    pub fn of(data: &'a [f32], layout: &Layout, index: usize) -> Self {
        let (dims, st) = (layout.dims(), layout.stride());
        let r = dims.len();
        let (mut offset, mut rest) = (layout.start_offset(), index);
        for ax in (0..r - 2).rev() {
            offset += rest % dims[ax] * st[ax];
            rest /= dims[ax];
        }
        Self { data, offset, rows: dims[r - 2], cols: dims[r - 1], rs: st[r - 2], cs: st[r - 1] }
    }

    /// Rows `start..start + n` (a view).
    pub fn row_range(self, start: usize, n: usize) -> Self {
        Self { offset: self.offset + start * self.rs, rows: n, ..self }
    }

    /// The transpose (a view, nothing moves).
    pub fn t(self) -> Self {
        Self { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs, ..self }
    }

    /// The dot product of row `r` here with row `r` of `other` (same width).
    pub fn row_dot(&self, other: Mat, r: usize) -> f32 {
        let at = |m: &Mat, j: usize| m.data[m.offset + r * m.rs + j * m.cs];
        (0..self.cols.min(other.cols)).map(|j| at(self, j) * at(&other, j)).sum()
    }

    /// Panics unless every element lies inside `data`.
    fn check(&self, what: &str) {
        let last = self.offset + self.rows.saturating_sub(1) * self.rs + self.cols.saturating_sub(1) * self.cs;
        assert!(self.rows == 0 || self.cols == 0 || last < self.data.len(), "cpu_gemm: {what} out of bounds");
    }
}

/// The f32 values of a CPU storage, or an error naming `op`.
pub fn host_f32<'a>(s: &'a Storage, op: &str) -> Result<&'a [f32]> {
    match s {
        Storage::Cpu(CpuStorage::F32(v)) => Ok(v),
        _ => candle_core::bail!("{op}: expected f32 on the CPU"),
    }
}

/// Whether the product runs on the calling thread or on candle's GEMM threads.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    Calling,
    Pool,
}

/// `dst (m, n) = a (m, k) b (k, n)`, or `dst += a b` with `accumulate`; `dst` is
/// row-major at `dst_offset` with rows `dst_rs` apart.
pub fn matmul_into(
    dst: &mut [f32],
    dst_offset: usize,
    dst_rs: usize,
    a: Mat,
    b: Mat,
    accumulate: bool,
    threads: Threads,
) {
    matmul_into_strided(dst, dst_offset, (dst_rs, 1), a, b, accumulate, threads)
}

/// [`matmul_into`] with `dst`'s columns `dst_cs` apart (`(dst_rs, dst_cs)`): one phase
/// of an interleaved output.
pub fn matmul_into_strided(
    dst: &mut [f32],
    dst_offset: usize,
    (dst_rs, dst_cs): (usize, usize),
    a: Mat,
    b: Mat,
    accumulate: bool,
    threads: Threads,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "cpu_gemm: inner dimensions differ");
    a.check("lhs");
    b.check("rhs");
    let out = Mat { data: dst, offset: dst_offset, rows: m, cols: n, rs: dst_rs, cs: dst_cs };
    out.check("dst");
    if m == 0 || n == 0 {
        return;
    }
    let parallelism = match candle_core::utils::get_num_threads() {
        n if n > 1 && threads == Threads::Pool => gemm::Parallelism::Rayon(n),
        _ => gemm::Parallelism::None,
    };
    // SAFETY: `check` proved every element of the three views in bounds; `dst` is
    // borrowed mutably, so it does not overlap `a` or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr().add(dst_offset),
            dst_cs as isize,
            dst_rs as isize,
            accumulate,
            a.data.as_ptr().add(a.offset),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr().add(b.offset),
            b.cs as isize,
            b.rs as isize,
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &Mat, b: &Mat) -> Vec<f32> {
        let at = |m: &Mat, i: usize, j: usize| m.data[m.offset + i * m.rs + j * m.cs];
        (0..a.rows)
            .flat_map(|i| (0..b.cols).map(move |j| (0..a.cols).map(|p| at(a, i, p) * at(b, p, j)).sum()))
            .collect()
    }

    #[test]
    fn strided_transposed_and_accumulated_products() {
        let data: Vec<f32> = (0..200).map(|i| ((i * 37) % 23) as f32 - 11.0).collect();
        // a: 5 x 3 at offset 7, rows 4 apart; b: the transpose of a 4 x 3 block.
        let a = Mat::rows(&data, 7, 5, 3, 4);
        let b = Mat::rows(&data, 40, 4, 3, 3).t();
        let want = naive(&a, &b);
        for threads in [Threads::Calling, Threads::Pool] {
            // dst rows 6 apart at offset 2, the gaps must stay untouched.
            let mut dst = vec![9.0f32; 2 + 5 * 6];
            matmul_into(&mut dst, 2, 6, a, b, false, threads);
            matmul_into(&mut dst, 2, 6, a, b, true, threads);
            for i in 0..5 {
                for j in 0..6 {
                    let got = dst[2 + i * 6 + j];
                    let expect = if j < 4 { 2.0 * want[i * 4 + j] } else { 9.0 };
                    assert_eq!(got, expect, "({i}, {j})");
                }
            }
            assert_eq!(&dst[..2], &[9.0, 9.0]);
        }
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn a_view_past_its_slice_is_refused() {
        let data = vec![0f32; 10];
        let mut dst = vec![0f32; 4];
        matmul_into(
            &mut dst,
            0,
            2,
            Mat::rows(&data, 4, 2, 4, 4),
            Mat::rows(&data, 0, 4, 2, 2),
            false,
            Threads::Calling,
        );
    }
}

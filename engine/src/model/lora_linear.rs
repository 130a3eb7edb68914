//! A frozen linear layer and its LoRA delta as one graph node:
//! `y = x @ w^T + scaling * (dropout(x) @ a^T) @ b^T`.
//!
//! Composed from candle ops the same thing records six nodes (base GEMM, dropout, two
//! adapter GEMMs, the scaled B, the sum), and candle's backward seeds every node's
//! input gradient with a zeros tensor and adds to it: full-size passes the fused op
//! does not need. The forward runs the same operations in the same order with or
//! without a graph (so a recomputed block is bit-identical); on the CPU its rank-r
//! GEMMs run on the calling thread, or in halves on two for a long song's rows
//! ([`thin_product`]). The backward recomputes the rank-r projection instead of
//! keeping it.

use candle_core::backend::BackendStorage;
use candle_core::op::{Add, Mul};
use candle_core::{CpuStorage, CudaStorage, CustomOp3, Layout, MetalStorage, Result, Shape, Tensor};

use crate::kernels::cpu_gemm::{matmul_into, Mat, Threads};
use crate::kernels::handover::{on_cpu, on_cuda, on_metal, storage_on, Pick};
use crate::kernels::linear::{backend_product, host_linear_product, Product};
use crate::trace;

/// An adapter as the model's linear layers see it during one forward pass. The model
/// knows adapters only through this; `crate::lora` implements it for a LoRA adapter.
pub trait LinearAdapter {
    /// Whether module `name` carries an adapter.
    fn adapts(&self, name: &str) -> bool;
    /// Module `name` with weight `w` applied to `x`, its delta included, or `None` when
    /// the module is not adapted.
    fn linear(&self, name: &str, x: &Tensor, w: &Tensor) -> crate::Result<Option<Tensor>>;
}

/// `x [.., in]`, frozen `w [out, in]`, `a [r, in]`, `b [out, r]`; `mask` (shaped like
/// `x`, 0 or 1/(1-p)) is the adapter input's dropout. Gradients for `x`, `a` and `b`
/// where they are on the graph; `w` and `mask` are constants.
pub fn lora_linear(
    x: &Tensor,
    w: &Tensor,
    a: &Tensor,
    b: &Tensor,
    scaling: f64,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    let op = LoraLinear { w: w.clone(), mask: mask.map(Tensor::contiguous).transpose()?, scaling };
    x.contiguous()?.apply_op3(a, b, op)
}

struct LoraLinear {
    w: Tensor,
    mask: Option<Tensor>,
    scaling: f64,
}

impl LoraLinear {
    #[allow(clippy::too_many_arguments)]
    fn fwd<S: BackendStorage>(
        &self,
        pick: Pick<S>,
        base: Product<S>,
        thin: Product<S>,
        xs: &S,
        xl: &Layout,
        a: &S,
        al: &Layout,
        b: &S,
        bl: &Layout,
    ) -> Result<(S, Shape)> {
        let (wg, wl) = self.w.storage_and_layout();
        let w = storage_on(&wg, pick, "lora-linear")?;
        let (n, k) = wl.shape().dims2()?;
        let r = al.shape().dims2()?.0;
        let rows = xl.shape().elem_count() / k;
        let x2 = Layout::contiguous_with_offset((rows, k), xl.start_offset());

        trace::product(xs.dtype(), (1, rows, n, k));
        let y = base(xs, w, (1, rows, n, k), &x2, &wl.transpose(0, 1)?)?;
        let dropped = match &self.mask {
            Some(m) => {
                let (mg, ml) = m.storage_and_layout();
                Some(xs.binary_impl::<Mul>(storage_on(&mg, pick, "lora-linear")?, xl, ml)?)
            }
            None => None,
        };
        let (xd, xdl) = match &dropped {
            Some(s) => (s, Layout::contiguous((rows, k))),
            None => (xs, x2),
        };
        trace::product(xd.dtype(), (1, rows, r, k));
        let h = thin(xd, a, (1, rows, r, k), &xdl, &al.transpose(0, 1)?)?;
        let scaled_b = b.affine(bl, self.scaling, 0.0)?;
        trace::product(h.dtype(), (1, rows, n, r));
        let delta = thin(
            &h,
            &scaled_b,
            (1, rows, n, r),
            &Layout::contiguous((rows, r)),
            &Layout::contiguous((n, r)).transpose(0, 1)?,
        )?;
        let out = Layout::contiguous((rows, n));
        let mut dims = xl.dims().to_vec();
        *dims.last_mut().expect("x has a feature dimension") = n;
        Ok((y.binary_impl::<Add>(&delta, &out, &out)?, Shape::from(dims)))
    }
}

impl CustomOp3 for LoraLinear {
    fn name(&self) -> &'static str {
        "lora-linear"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        xl: &Layout,
        a: &CpuStorage,
        al: &Layout,
        b: &CpuStorage,
        bl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.fwd(on_cpu, host_linear_product, thin_product, x, xl, a, al, b, bl)
    }

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        a: &CudaStorage,
        al: &Layout,
        b: &CudaStorage,
        bl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.fwd(on_cuda, backend_product, backend_product, x, xl, a, al, b, bl)
    }

    fn metal_fwd(
        &self,
        x: &MetalStorage,
        xl: &Layout,
        a: &MetalStorage,
        al: &Layout,
        b: &MetalStorage,
        bl: &Layout,
    ) -> Result<(MetalStorage, Shape)> {
        self.fwd(on_metal, backend_product, backend_product, x, xl, a, al, b, bl)
    }

    fn bwd(
        &self,
        x: &Tensor,
        a: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (n, k) = self.w.dims2()?;
        let rows = x.elem_count() / k;
        let g = grad.reshape((rows, n))?;
        let x2 = x.detach().reshape((rows, k))?;
        let mask = self.mask.as_ref().map(|m| m.reshape((rows, k))).transpose()?;
        let xd = match &mask {
            Some(m) => x2.mul(m)?,
            None => x2,
        };
        let (a_t, b_t) = (a.detach(), b.detach());
        // d(delta)/d(h) with h = xd a^T: g (scaling b), [rows, r].
        let gb = thin_matmul(&g, &(&b_t * self.scaling)?)?;
        let dx = match x.track_op() {
            true => {
                let through_adapter = thin_matmul(&gb, &a_t)?;
                let through_adapter = match &mask {
                    Some(m) => through_adapter.mul(m)?,
                    None => through_adapter,
                };
                Some((trace::matmul(&g, &self.w)? + through_adapter)?.reshape(x.shape())?)
            }
            false => None,
        };
        let da = match a.track_op() {
            true => Some(thin_matmul(&gb.t()?, &xd)?),
            false => None,
        };
        let db = match b.track_op() {
            true => Some(thin_matmul(&g.t()?, &(thin_matmul(&xd, &a_t.t()?)? * self.scaling)?)?),
            false => None,
        };
        Ok((dx, da, db))
    }
}

/// The rank-r GEMMs of a LoRA delta (one dimension is r). A short song's are a few
/// microseconds of work each, less than waking a second thread costs, so they stay on
/// the calling thread; from [`SPLIT_FLOPS`] up (a long song's rows) the output is cut in
/// two along its longer side and each half runs on its own thread. Every output value
/// is the same dot product in the same order either way. f32 2-D on the CPU; anything
/// else takes candle's matmul.
fn thin_product(
    a: &CpuStorage,
    b: &CpuStorage,
    bmnk: (usize, usize, usize, usize),
    al: &Layout,
    bl: &Layout,
) -> Result<CpuStorage> {
    let (batch, m, n, k) = bmnk;
    let (CpuStorage::F32(av), CpuStorage::F32(bv)) = (a, b) else {
        return a.matmul(b, bmnk, al, bl);
    };
    if batch != 1 || al.dims().len() != 2 || bl.dims().len() != 2 {
        return a.matmul(b, bmnk, al, bl);
    }
    let (sa, sb) = (al.stride(), bl.stride());
    let a = Mat { data: av, offset: al.start_offset(), rows: m, cols: k, rs: sa[0], cs: sa[1] };
    let b = Mat { data: bv, offset: bl.start_offset(), rows: k, cols: n, rs: sb[0], cs: sb[1] };
    let in_halves = 2 * m * n * k >= SPLIT_FLOPS && rayon::current_num_threads() > 1;
    Ok(CpuStorage::F32(rank_r_product(a, b, in_halves)))
}

/// `a b`, row-major, on the calling thread or `in_halves` on two.
fn rank_r_product(a: Mat, b: Mat, in_halves: bool) -> Vec<f32> {
    let (m, n) = (a.rows, b.cols);
    let mut out = vec![0f32; m * n];
    if !in_halves {
        matmul_into(&mut out, 0, n, a, b, false, Threads::Calling);
    } else if m >= n {
        let (top, bottom) = out.split_at_mut(m / 2 * n);
        rayon::join(
            || matmul_into(top, 0, n, a.row_range(0, m / 2), b, false, Threads::Calling),
            || matmul_into(bottom, 0, n, a.row_range(m / 2, m - m / 2), b, false, Threads::Calling),
        );
    } else {
        // Column halves interleave in each output row: each is written apart, then the
        // rows are stitched (the output is r values wide or r rows high: small).
        let (left, right) = (b.t().row_range(0, n / 2).t(), b.t().row_range(n / 2, n - n / 2).t());
        let (mut l, mut r) = (vec![0f32; m * left.cols], vec![0f32; m * right.cols]);
        rayon::join(
            || matmul_into(&mut l, 0, left.cols, a, left, false, Threads::Calling),
            || matmul_into(&mut r, 0, right.cols, a, right, false, Threads::Calling),
        );
        for ((row, lr), rr) in out.chunks_mut(n).zip(l.chunks(left.cols)).zip(r.chunks(right.cols)) {
            row[..left.cols].copy_from_slice(lr);
            row[left.cols..].copy_from_slice(rr);
        }
    }
    out
}

/// FLOPs (`2 m n k`) from which a rank-r product is worth both threads: a 30-second
/// song's (375 rows, ~6M) stay on one, a 4-minute song's (3000 rows, ~49M) split.
const SPLIT_FLOPS: usize = 16 << 20;

/// A 2-D product `a b` without a graph: [`thin_product`] on the CPU, candle's matmul
/// on Metal and CUDA (as the forward's rank-r products).
fn thin_matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    a.apply_op2_no_bwd(b, &ThinMatmul)
}

struct ThinMatmul;

impl ThinMatmul {
    fn fwd<S: BackendStorage>(&self, thin: Product<S>, a: &S, al: &Layout, b: &S, bl: &Layout) -> Result<(S, Shape)> {
        let ((m, k), (_, n)) = (al.shape().dims2()?, bl.shape().dims2()?);
        trace::product(a.dtype(), (1, m, n, k));
        Ok((thin(a, b, (1, m, n, k), al, bl)?, Shape::from((m, n))))
    }
}

impl candle_core::CustomOp2 for ThinMatmul {
    fn name(&self) -> &'static str {
        "thin-matmul"
    }

    fn cpu_fwd(&self, a: &CpuStorage, al: &Layout, b: &CpuStorage, bl: &Layout) -> Result<(CpuStorage, Shape)> {
        self.fwd(thin_product, a, al, b, bl)
    }

    fn cuda_fwd(&self, a: &CudaStorage, al: &Layout, b: &CudaStorage, bl: &Layout) -> Result<(CudaStorage, Shape)> {
        self.fwd(backend_product, a, al, b, bl)
    }

    fn metal_fwd(&self, a: &MetalStorage, al: &Layout, b: &MetalStorage, bl: &Layout) -> Result<(MetalStorage, Shape)> {
        self.fwd(backend_product, a, al, b, bl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ops::rel_err;
    use candle_core::{Device, Var};

    #[test]
    fn matches_the_composed_form_forward_and_backward() -> Result<()> {
        let dev = Device::Cpu;
        let (rows, k, n, r, scaling) = (7, 12, 10, 4, 0.37);
        let x = Var::randn(0f32, 1., (1, rows, k), &dev)?;
        let w = Tensor::randn(0f32, 1., (n, k), &dev)?;
        let a = Var::randn(0f32, 1., (r, k), &dev)?;
        let b = Var::randn(0f32, 1., (n, r), &dev)?;
        let keep = Tensor::rand(0f32, 1., (1, rows, k), &dev)?.ge(0.2)?.to_dtype(candle_core::DType::F32)?;
        let mask = (keep / 0.8)?;
        let g = Tensor::randn(0f32, 1., (1, rows, n), &dev)?;
        for mask in [None, Some(&mask)] {
            let fused = lora_linear(x.as_tensor(), &w, a.as_tensor(), b.as_tensor(), scaling, mask)?;
            let xd = match mask {
                Some(m) => x.as_tensor().mul(m)?,
                None => x.as_tensor().clone(),
            };
            let composed = (x.as_tensor().broadcast_matmul(&w.t()?)?
                + xd.broadcast_matmul(&a.as_tensor().t()?)?
                    .broadcast_matmul(&b.as_tensor().t()?)?
                    .affine(scaling, 0.0)?)?;
            let out_err = rel_err(&fused, &composed);
            let gf = (&fused * &g)?.sum_all()?.backward()?;
            let gc = (&composed * &g)?.sum_all()?.backward()?;
            let errs: Vec<f32> = [&x, &a, &b].iter().map(|v| rel_err(gf.get(v).unwrap(), gc.get(v).unwrap())).collect();
            println!("mask {}: output rel err {out_err:.2e}, d x/a/b rel err {errs:?}", mask.is_some());
            assert!(out_err < 1e-6);
            assert!(errs.iter().all(|&e| e < 1e-6));
        }
        Ok(())
    }

    #[test]
    fn a_long_songs_rank_r_products_split_over_threads_exactly() -> Result<()> {
        // A 4-minute song's shapes: 3000 rows, 512 features, rank 16 (row halves), and
        // the adapter gradient's 16 x 512 over 3000 rows (column halves).
        let data: Vec<f32> = (0..3000 * 512usize).map(|i| ((i * 7919) % 1009) as f32 / 1009.0 - 0.5).collect();
        let small: Vec<f32> = (0..3000 * 16usize).map(|i| ((i * 104729) % 997) as f32 / 997.0 - 0.5).collect();
        let x = Mat::rows(&data, 0, 3000, 512, 512);
        let a = Mat::rows(&small, 0, 16, 512, 512);
        let g = Mat::rows(&small, 0, 3000, 16, 16);
        for (lhs, rhs) in [(x, a.t()), (g.t(), x)] {
            let (m, n, k) = (lhs.rows, rhs.cols, lhs.cols);
            assert!(2 * m * n * k >= SPLIT_FLOPS, "a long song's product must take the split path");
            let (split, whole) = (rank_r_product(lhs, rhs, true), rank_r_product(lhs, rhs, false));
            let differing = split.iter().zip(&whole).filter(|(s, w)| s.to_bits() != w.to_bits()).count();
            println!("{m} x {n} x {k}: {differing} of {} values differ from one thread's product", m * n);
            assert_eq!(differing, 0);
        }
        Ok(())
    }

    #[test]
    fn frozen_inputs_get_no_gradient() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1., (5, 6), &dev)?; // data, not on the graph
        let w = Tensor::randn(0f32, 1., (3, 6), &dev)?;
        let a = Var::randn(0f32, 1., (2, 6), &dev)?;
        let b = Var::randn(0f32, 1., (3, 2), &dev)?;
        let grads = lora_linear(&x, &w, a.as_tensor(), b.as_tensor(), 1.0, None)?.sum_all()?.backward()?;
        assert!(grads.get(&x).is_none());
        assert!(grads.get(a.as_tensor()).is_some() && grads.get(b.as_tensor()).is_some());
        Ok(())
    }
}

//! Attention of one new query row per head over a KV cache (decoding, f32 on the CPU).
//! Each KV head's keys and values are read once for all the query heads that share
//! them (GQA), straight from the cache's strided view: no copy, no score matrix for a
//! general GEMM to be called on with two rows.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, Layout, Shape};
use rayon::prelude::*;

use super::matvec::MatvecWeight;
use super::simd;

/// `q (1, heads, 1, D)` contiguous, `k`, `v (1, KV, len, D)` views with a contiguous
/// last dimension -> `softmax(q k^T * scale) v`, `(1, heads, 1, D)`.
pub(crate) struct SingleQueryAttention {
    pub scale: f32,
}

/// A cache view's data, its start, and the distance between KV heads.
fn view<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> candle_core::Result<(&'a [f32], usize, usize)> {
    let CpuStorage::F32(data) = s else {
        candle_core::bail!("cached attention: {what} must be f32, is {:?}", s.dtype())
    };
    let (stride, dims) = (l.stride(), l.dims());
    if dims.len() != 4 || dims[0] != 1 || stride[3] != 1 || stride[2] != dims[3] {
        candle_core::bail!(
            "cached attention: {what} {dims:?} (strides {stride:?}) is not a (1, KV, len, D) cache view"
        );
    }
    Ok((data, l.start_offset(), stride[1]))
}

impl CustomOp3 for SingleQueryAttention {
    fn name(&self) -> &'static str {
        "single-query-attention"
    }

    fn cpu_fwd(
        &self,
        qs: &CpuStorage,
        ql: &Layout,
        ks: &CpuStorage,
        kl: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (Some((q0, q1)), CpuStorage::F32(q)) = (ql.contiguous_offsets(), qs) else {
            candle_core::bail!("cached attention: the queries must be contiguous f32");
        };
        let q = &q[q0..q1];
        let (k, k0, k_head) = view(ks, kl, "keys")?;
        let (v, v0, v_head) = view(vs, vl, "values")?;
        let (heads, d) = (ql.dims()[1], ql.dims()[3]);
        let (kv_heads, len) = (kl.dims()[1], kl.dims()[2]);
        if ql.dims() != [1, heads, 1, d]
            || kl.dims()[3] != d
            || vl.dims() != kl.dims()
            || !heads.is_multiple_of(kv_heads)
        {
            candle_core::bail!(
                "cached attention: queries {:?}, keys {:?}, values {:?} do not fit",
                ql.dims(),
                kl.dims(),
                vl.dims()
            );
        }
        let rep = heads / kv_heads;
        let mut out = vec![0f32; heads * d];
        out.par_chunks_mut(rep * d).enumerate().for_each(|(g, out)| {
            let (keys, values) = (&k[k0 + g * k_head..], &v[v0 + g * v_head..]);
            let queries = &q[g * rep * d..(g + 1) * rep * d];
            // scores[r][j] for this KV head's query heads r, one pass over the keys.
            let mut scores = vec![0f32; rep * len];
            for (j, key) in keys.chunks_exact(d).take(len).enumerate() {
                for (r, query) in queries.chunks_exact(d).enumerate() {
                    scores[r * len + j] = f32::dot(query, key) * self.scale;
                }
            }
            let mut probs = vec![0f32; rep * len];
            for (s, p) in scores.chunks_exact(len).zip(probs.chunks_exact_mut(len)) {
                simd::softmax_row(s, p);
            }
            for (j, value) in values.chunks_exact(d).take(len).enumerate() {
                for (r, o) in out.chunks_exact_mut(d).enumerate() {
                    simd::axpy_row(probs[r * len + j], value, o);
                }
            }
        });
        Ok((CpuStorage::F32(out), Shape::from((1, heads, 1, d))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    #[test]
    fn matches_the_composed_product_on_a_cache_view() {
        let dev = Device::Cpu;
        let (kv, rep, cap, len, d) = (2, 3, 11, 7, 20);
        let q = Tensor::randn(0f32, 1.0, (1, kv * rep, 1, d), &dev).unwrap();
        let k = Tensor::randn(0f32, 1.0, (1, kv, cap, d), &dev).unwrap().narrow(2, 0, len).unwrap();
        let v = Tensor::randn(0f32, 1.0, (1, kv, cap, d), &dev).unwrap().narrow(2, 0, len).unwrap();
        let scale = 0.3;
        let got = q.apply_op3_no_bwd(&k, &v, &SingleQueryAttention { scale }).unwrap();
        // Composed: each query head against its KV head.
        let q3 = q.reshape((kv, rep, d)).unwrap();
        let (k3, v3) = (k.squeeze(0).unwrap().contiguous().unwrap(), v.squeeze(0).unwrap().contiguous().unwrap());
        let scores = (q3.matmul(&k3.t().unwrap()).unwrap() * scale as f64).unwrap();
        let want = candle_core::Tensor::exp(&scores).unwrap();
        let want = want.broadcast_div(&want.sum_keepdim(2).unwrap()).unwrap().matmul(&v3).unwrap();
        let err = (got.flatten_all().unwrap() - want.flatten_all().unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        println!("cached attention vs composed: max abs error {err:.2e} (tolerance 1e-5)");
        assert!(err < 1e-5, "{err}");
    }
}

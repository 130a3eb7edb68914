//! Between the projections' `[B, P, heads * D]` and attention's grouped layout
//! `(B, KV, P * rep, D)` (rows ordered (position, query head within the group), see
//! attention.rs), with the per-head RMSNorm, RoPE and score scale applied on the way in.
//!
//! Composed, the way in records seven graph nodes (reshape, norm, RoPE, reshape,
//! transpose, copy, reshape) and the way out three, and candle's backward pays a
//! full-size gradient accumulation for each. On the CPU with f32 each direction is one
//! node and one pass over the rows, forward and backward; elsewhere the composed form
//! runs.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor};

use super::ops::{self, output, par_rows, rows};
use super::policy::KernelPolicy;
use crate::kernels::simd;

/// The shape of one attention input: `positions` rows per batch item of `kv_heads * rep`
/// heads of `head_dim` (rep = 1 for keys and values).
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub batch: usize,
    pub positions: usize,
    pub kv_heads: usize,
    pub rep: usize,
    pub head_dim: usize,
}

impl Geometry {
    fn heads(&self) -> usize {
        self.kv_heads * self.rep
    }

    /// For grouped row `o`, the head-row of the flat layout it holds (in units of
    /// `head_dim`) and its position.
    fn flat_of(&self, o: usize) -> (usize, usize) {
        let (r, rest) = (o % self.rep, o / self.rep);
        let (p, rest) = (rest % self.positions, rest / self.positions);
        let (g, b) = (rest % self.kv_heads, rest / self.kv_heads);
        ((b * self.positions + p) * self.heads() + g * self.rep + r, p)
    }

    /// For head-row `q` of the flat layout, its grouped row and its position.
    fn grouped_of(&self, q: usize) -> (usize, usize) {
        let (h, rest) = (q % self.heads(), q / self.heads());
        let (p, b) = (rest % self.positions, rest / self.positions);
        (((b * self.kv_heads + h / self.rep) * self.positions + p) * self.rep + h % self.rep, p)
    }

    fn grouped_shape(&self) -> Shape {
        Shape::from((self.batch, self.kv_heads, self.positions * self.rep, self.head_dim))
    }

    fn flat_shape(&self) -> Shape {
        Shape::from((self.batch, self.positions, self.heads() * self.head_dim))
    }
}

/// `x [B, P, heads * D]` to `(B, KV, P * rep, D)`: per head `rms_norm(., norm)` if given,
/// then RoPE with tables `[P, 1, D]` if given, times `scale`.
pub fn split(
    k: KernelPolicy,
    x: &Tensor,
    geo: Geometry,
    norm: Option<(&Tensor, f64)>,
    rope: Option<(&Tensor, &Tensor)>,
    scale: f64,
) -> Result<Tensor> {
    let constants_f32 = norm.iter().all(|(w, _)| w.dtype() == DType::F32 && !w.track_op())
        && rope.iter().all(|(c, s)| c.dtype() == DType::F32 && s.dtype() == DType::F32);
    if k.on_host(x) && constants_f32 {
        let op = Split {
            k,
            geo,
            norm: norm.map(|(w, eps)| Ok::<_, candle_core::Error>((ops::cpu_values(w)?, eps as f32))).transpose()?,
            rope: rope
                .map(|(c, s)| Ok::<_, candle_core::Error>((ops::cpu_values(c)?, ops::cpu_values(s)?)))
                .transpose()?,
            scale: scale as f32,
        };
        return x.contiguous()?.apply_op1(op);
    }
    split_composed(k, x, geo, norm, rope, scale)
}

fn split_composed(
    k: KernelPolicy,
    x: &Tensor,
    geo: Geometry,
    norm: Option<(&Tensor, f64)>,
    rope: Option<(&Tensor, &Tensor)>,
    scale: f64,
) -> Result<Tensor> {
    let Geometry { batch: b, positions: p, kv_heads: kv, rep, head_dim: d } = geo;
    let mut t = x.reshape((b, p, kv * rep, d))?;
    if let Some((w, eps)) = norm {
        t = ops::rms_norm(k, &t, w, eps)?;
    }
    t = match rope {
        Some((cos, sin)) => ops::rope(&t, cos, sin, scale)?,
        None if scale != 1.0 => (t * scale)?,
        None => t,
    };
    t.reshape((b, p, kv, rep * d))?.transpose(1, 2)?.contiguous()?.reshape((b, kv, p * rep, d))
}

/// `(B, KV, P * rep, D)` back to `[B, P, heads * D]`.
pub fn merge(k: KernelPolicy, x: &Tensor, geo: Geometry) -> Result<Tensor> {
    if k.on_host(x) {
        return x.contiguous()?.apply_op1(Merge { geo, k });
    }
    let Geometry { batch: b, positions: p, kv_heads: kv, rep, head_dim: d } = geo;
    x.reshape((b, kv, p, rep * d))?.transpose(1, 2)?.reshape((b, p, kv * rep * d))
}

fn check(what: &str, l: &Layout, expected: &Shape) -> Result<()> {
    if l.shape() != expected {
        candle_core::bail!("{what}: input {:?}, expected {expected:?}", l.shape())
    }
    Ok(())
}

/// The forward of [`split`]; the per-head constants copied out once per call.
#[derive(Clone)]
struct Split {
    k: KernelPolicy,
    geo: Geometry,
    norm: Option<(Vec<f32>, f32)>,
    rope: Option<(Vec<f32>, Vec<f32>)>,
    scale: f32,
}

impl CustomOp1 for Split {
    fn name(&self) -> &'static str {
        "split-heads"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        self.k.cpu_only(self.name())?;
        check("split-heads", l, &self.geo.flat_shape())?;
        let (x, _) = rows(s, l)?;
        let d = self.geo.head_dim;
        let (h, scale) = (d / 2, self.scale);
        let mut out = output(x.len());
        par_rows(&mut out, d, |o, y| {
            let (q, p) = self.geo.flat_of(o);
            let x = &x[q * d..(q + 1) * d];
            match &self.norm {
                Some((w, eps)) => simd::rms_norm_row(x, w, *eps, y),
                None => y.copy_from_slice(x),
            }
            match &self.rope {
                Some((cos, sin)) => {
                    let (c, s) = (&cos[p * d..(p + 1) * d], &sin[p * d..(p + 1) * d]);
                    for i in 0..h {
                        let (a, b) = (y[i], y[i + h]);
                        y[i] = scale * (a * c[i] - b * s[i]);
                        y[i + h] = scale * (b * c[i + h] + a * s[i + h]);
                    }
                }
                None if scale != 1.0 => y.iter_mut().for_each(|y| *y *= scale),
                None => {}
            }
        });
        Ok((CpuStorage::F32(out), self.geo.grouped_shape()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(x.apply_op2_no_bwd(&grad.contiguous()?, &SplitBwd(self.clone()))?))
    }
}

/// `dx` of [`Split`] from `x` and the grouped output gradient: RoPE's transpose (the
/// rotation by -angle, times the scale), then RMSNorm's input gradient.
struct SplitBwd(Split);

impl CustomOp2 for SplitBwd {
    fn name(&self) -> &'static str {
        "split-heads-bwd"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, gs: &CpuStorage, gl: &Layout) -> Result<(CpuStorage, Shape)> {
        let Split { k, geo, norm, rope, scale } = &self.0;
        k.cpu_only(self.name())?;
        check("split-heads-bwd", gl, &geo.grouped_shape())?;
        let (x, _) = rows(xs, xl)?;
        let (g, _) = rows(gs, gl)?;
        let d = geo.head_dim;
        let h = d / 2;
        let mut out = output(x.len());
        par_rows(&mut out, d, |q, dx| {
            let (o, p) = geo.grouped_of(q);
            let g = &g[o * d..(o + 1) * d];
            // First the gradient at the norm's output (u), in dx.
            match rope {
                Some((cos, sin)) => {
                    let (c, s) = (&cos[p * d..(p + 1) * d], &sin[p * d..(p + 1) * d]);
                    for i in 0..h {
                        dx[i] = scale * (g[i] * c[i] + g[i + h] * s[i + h]);
                        dx[i + h] = scale * (g[i + h] * c[i + h] - g[i] * s[i]);
                    }
                }
                None => dx.iter_mut().zip(g).for_each(|(u, &g)| *u = scale * g),
            }
            if let Some((w, eps)) = norm {
                simd::rms_norm_bwd_row(&x[q * d..(q + 1) * d], w, *eps, dx);
            }
        });
        Ok((CpuStorage::F32(out), geo.flat_shape()))
    }
}

/// The forward of [`merge`]: a permutation of rows; its backward is [`Split`] without
/// norm, RoPE or scale.
struct Merge {
    geo: Geometry,
    k: KernelPolicy,
}

impl CustomOp1 for Merge {
    fn name(&self) -> &'static str {
        "merge-heads"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        self.k.cpu_only(self.name())?;
        check("merge-heads", l, &self.geo.grouped_shape())?;
        let (x, _) = rows(s, l)?;
        let d = self.geo.head_dim;
        let mut out = output(x.len());
        par_rows(&mut out, d, |q, y| {
            let o = self.geo.grouped_of(q).0;
            y.copy_from_slice(&x[o * d..(o + 1) * d]);
        });
        Ok((CpuStorage::F32(out), self.geo.flat_shape()))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let split = Split { k: self.k, geo: self.geo, norm: None, rope: None, scale: 1.0 };
        Ok(Some(grad.contiguous()?.apply_op1_no_bwd(&split)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ops::rel_err;
    use candle_core::{Device, Var};

    const CPU: KernelPolicy = KernelPolicy::cpu();

    #[test]
    fn split_and_merge_match_the_composed_forms() -> Result<()> {
        let dev = Device::Cpu;
        let geo = Geometry { batch: 2, positions: 5, kv_heads: 3, rep: 2, head_dim: 8 };
        let x = Var::randn(0f32, 1., (2, 5, 6 * 8), &dev)?;
        let w = Tensor::randn(1f32, 0.2, 8, &dev)?;
        let angles = Tensor::randn(0f32, 1., (5, 1, 4), &dev)?;
        let angles = Tensor::cat(&[&angles, &angles], 2)?;
        let (cos, sin) = (angles.cos()?, angles.sin()?);
        let g = Tensor::randn(0f32, 1., (2, 3, 10, 8), &dev)?;
        // (name, RMSNorm (weight, eps)?, RoPE (cos, sin)?, scale)
        type Case<'a> = (&'a str, Option<(&'a Tensor, f64)>, Option<(&'a Tensor, &'a Tensor)>, f64);
        let cases: [Case; 3] = [
            ("norm + rope + scale", Some((&w, 1e-6)), Some((&cos, &sin)), 0.35),
            ("norm + scale", Some((&w, 1e-6)), None, 0.35),
            ("layout only", None, None, 1.0),
        ];
        for (name, norm, rope, scale) in cases {
            let fused = split(CPU, x.as_tensor(), geo, norm, rope, scale)?;
            let composed = split_composed(CPU, x.as_tensor(), geo, norm, rope, scale)?;
            let out_err = rel_err(&fused, &composed);
            let gf = (&fused * &g)?.sum_all()?.backward()?;
            let gc = (&composed * &g)?.sum_all()?.backward()?;
            let grad_err = rel_err(gf.get(&x).unwrap(), gc.get(&x).unwrap());
            println!("split, {name}: output rel err {out_err:.2e}, dx rel err {grad_err:.2e}");
            assert!(out_err < 1e-6 && grad_err < 1e-6);
        }

        let y = Var::randn(0f32, 1., (2, 3, 10, 8), &dev)?;
        let gm = Tensor::randn(0f32, 1., (2, 5, 48), &dev)?;
        let fused = merge(CPU, y.as_tensor(), geo)?;
        let composed = y.as_tensor().reshape((2, 3, 5, 16))?.transpose(1, 2)?.reshape((2, 5, 48))?;
        assert_eq!(rel_err(&fused, &composed), 0.0, "merge is a permutation");
        let gf = (&fused * &gm)?.sum_all()?.backward()?;
        let gc = (&composed * &gm)?.sum_all()?.backward()?;
        assert_eq!(rel_err(gf.get(&y).unwrap(), gc.get(&y).unwrap()), 0.0);
        Ok(())
    }

    /// Built under the GPU policy, the layout ops err in their forwards, naming themselves.
    #[test]
    fn layout_ops_err_under_the_gpu_policy() -> Result<()> {
        let k = KernelPolicy::gpu();
        let geo = Geometry { batch: 1, positions: 2, kv_heads: 1, rep: 2, head_dim: 4 };
        let flat = Tensor::zeros((1, 2, 8), candle_core::DType::F32, &Device::Cpu)?;
        let grouped = Tensor::zeros((1, 1, 4, 4), candle_core::DType::F32, &Device::Cpu)?;
        let split = Split { k, geo, norm: None, rope: None, scale: 1.0 };
        let runs = [
            ("split-heads", flat.apply_op1_no_bwd(&split)),
            ("split-heads-bwd", flat.apply_op2_no_bwd(&grouped, &SplitBwd(split.clone()))),
            ("merge-heads", grouped.apply_op1_no_bwd(&Merge { geo, k })),
        ];
        for (name, run) in runs {
            let err = run.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(name) && err.contains("no Metal or CUDA forward"), "{name}: {err:?}");
        }
        Ok(())
    }
}

//! The VAE's layers, shared by its two halves: weight-normalised convolutions (plain
//! and transposed, the Snake before each fused in on the CPU kernels), Snake, and the
//! residual unit.

use candle_core::{Device, Tensor};

use crate::kernels::conv1d as kernel;
use crate::kernels::cpu_gemm::host_f32;
use crate::model::KernelPolicy;
use crate::tensor_io::TensorSource;
use crate::Result;

/// `name.weight_g` `[a, 1, 1]` and `name.weight_v` `[a, b, k]` folded to g * v / |v|
/// with the norm over (b, k) (torch's `weight_norm` on dim 0), or its parametrization
/// names, or a plain `weight`.
fn folded_weight(f: &dyn TensorSource, name: &str, shape: [usize; 3]) -> Result<Tensor> {
    let v_keys = [format!("{name}.weight_v"), format!("{name}.parametrizations.weight.original1")];
    let g_keys = [format!("{name}.weight_g"), format!("{name}.parametrizations.weight.original0")];
    let Some(v_key) = v_keys.iter().find(|k| f.contains(k)) else {
        return f.get(&format!("{name}.weight"), &shape);
    };
    let v = f.get(v_key, &shape)?;
    let g_key = g_keys.iter().find(|k| f.contains(k)).unwrap_or(&g_keys[0]);
    let g = f.get(g_key, &[shape[0], 1, 1])?;
    let norm = v.sqr()?.sum_keepdim(1)?.sum_keepdim(2)?.sqrt()?;
    Ok(v.broadcast_mul(&g.broadcast_div(&norm)?)?)
}

/// Calls `f` with the values of contiguous f32 CPU tensors.
fn with_values<R, const N: usize>(ts: [&Tensor; N], f: impl FnOnce([&[f32]; N]) -> R) -> Result<R> {
    let guards = ts.map(|t| t.storage_and_layout());
    let mut values: [&[f32]; N] = [&[]; N];
    for (v, (storage, layout)) in values.iter_mut().zip(&guards) {
        let (start, end) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("vae: a strided tensor reached the CPU conv kernel".into()))?;
        *v = &host_f32(storage, "vae conv")?[start..end];
    }
    Ok(f(values))
}

/// `[1, C, n]` on the host from a kernel's output.
fn host_tensor(values: Vec<f32>, channels: usize, len: usize) -> Result<Tensor> {
    Ok(Tensor::from_vec(values, (1, channels, len), &Device::Cpu)?)
}

/// A 1-D convolution with its folded weight `[out, in, k]` and bias `[1, out, 1]`
/// (zeros where the checkpoint has none).
pub(super) struct Conv {
    pub(super) w: Tensor,
    b: Tensor,
    padding: usize,
    stride: usize,
    dilation: usize,
}

/// Stride, dilation and padding of a convolution.
#[derive(Clone, Copy)]
pub(super) struct Geometry {
    pub(super) stride: usize,
    pub(super) dilation: usize,
    pub(super) padding: usize,
}

impl Geometry {
    pub(super) const fn same(k: usize, dilation: usize) -> Self {
        Self { stride: 1, dilation, padding: (k - 1) / 2 * dilation }
    }
}

impl Conv {
    /// The folded weight (see [`folded_weight`]) and, with `bias`, `name.bias` `[out]`.
    pub(super) fn load(
        f: &dyn TensorSource,
        name: &str,
        (cin, cout, k): (usize, usize, usize),
        g: Geometry,
        bias: bool,
    ) -> Result<Self> {
        let w = folded_weight(f, name, [cout, cin, k])?;
        let b = match bias {
            true => f.get(&format!("{name}.bias"), &[cout])?.reshape((1, cout, 1))?,
            false => Tensor::zeros((1, cout, 1), w.dtype(), w.device())?,
        };
        Ok(Self { w, b, padding: g.padding, stride: g.stride, dilation: g.dilation })
    }

    /// The kernel's view of this conv over the weight and bias values `w`, `b`.
    fn on<'a>(&self, w: &'a [f32], b: &'a [f32]) -> kernel::Conv<'a> {
        let (cout, cin, k) = self.w.dims3().expect("a conv weight is [out, in, k]");
        kernel::Conv {
            weight: w,
            bias: Some(b),
            cin,
            cout,
            k,
            stride: self.stride,
            dilation: self.dilation,
            padding: self.padding,
        }
    }

    /// `conv(snake(x))`, or `conv(x)` without a Snake: `[1, in, n] -> [1, out, n']`.
    pub(super) fn forward(&self, k: KernelPolicy, x: &Tensor, snake: Option<&Snake>) -> Result<Tensor> {
        if k.on_host(x) {
            let x = x.contiguous()?;
            let n = x.dim(2)?;
            let (y, n_out) = match snake {
                Some(s) => with_values([&x, &self.w, &self.b, &s.alpha, &s.inv_beta], |[x, w, b, alpha, inv_beta]| {
                    kernel::conv1d(x, n, &self.on(w, b), Some(kernel::Snake { alpha, inv_beta }))
                })?,
                None => with_values([&x, &self.w, &self.b], |[x, w, b]| kernel::conv1d(x, n, &self.on(w, b), None))?,
            };
            return host_tensor(y, self.w.dim(0)?, n_out);
        }
        let x = match snake {
            Some(s) => s.forward(x)?,
            None => x.clone(),
        };
        Ok(x.conv1d(&self.w, self.padding, self.stride, self.dilation, 1)?.broadcast_add(&self.b)?)
    }
}

/// A weight-normalised `ConvTranspose1d` with k = 2s, stride s, padding ceil(s/2): n
/// input samples become n * s for even s. Weight `[in, out, k]`, norm over (out, k).
pub(super) struct ConvTranspose {
    w: Tensor,
    b: Tensor,
    stride: usize,
}

impl ConvTranspose {
    pub(super) fn load(f: &dyn TensorSource, name: &str, cin: usize, cout: usize, stride: usize) -> Result<Self> {
        Ok(Self {
            w: folded_weight(f, name, [cin, cout, 2 * stride])?,
            b: f.get(&format!("{name}.bias"), &[cout])?.reshape((1, cout, 1))?,
            stride,
        })
    }

    /// `snake(x) [1, in, n] -> [1, out, n * s]` (even s). Padding p crops p samples off
    /// each end of the unpadded output (candle: one matmul, col2im, then the crop).
    pub(super) fn forward(&self, k: KernelPolicy, x: &Tensor, snake: &Snake) -> Result<Tensor> {
        let (s, n) = (self.stride, x.dim(2)?);
        let (cin, cout, _) = self.w.dims3()?;
        if k.on_host(x) {
            let x = x.contiguous()?;
            let y = with_values([&x, &self.w, &self.b, &snake.alpha, &snake.inv_beta], |[x, w, b, alpha, inv_beta]| {
                kernel::conv_transpose1d(x, n, w, b, (cin, cout, s), Some(kernel::Snake { alpha, inv_beta }))
            })?;
            return host_tensor(y, cout, n * s);
        }
        let y = snake.forward(x)?.conv_transpose1d(&self.w, 0, 0, s, 1, 1)?; // (1, out, (n + 1) s)
        Ok(y.narrow(2, s.div_ceil(2), n * s)?.broadcast_add(&self.b)?)
    }
}

/// Snake with log-scale parameters: x + 1 / (e^beta + 1e-9) * sin(e^alpha * x)^2.
pub(super) struct Snake {
    /// `[1, C, 1]`: e^alpha
    alpha: Tensor,
    /// `[1, C, 1]`: 1 / (e^beta + 1e-9)
    inv_beta: Tensor,
}

impl Snake {
    pub(super) fn load(f: &dyn TensorSource, name: &str, c: usize) -> Result<Self> {
        let alpha = f.get(&format!("{name}.alpha"), &[1, c, 1])?.exp()?;
        let inv_beta = (f.get(&format!("{name}.beta"), &[1, c, 1])?.exp()? + 1e-9)?.recip()?;
        Ok(Self { alpha, inv_beta })
    }

    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let s = x.broadcast_mul(&self.alpha)?.sin()?.sqr()?;
        Ok((x + s.broadcast_mul(&self.inv_beta)?)?)
    }
}

/// snake -> conv k7 (dilated) -> snake -> conv k1, plus the input.
pub(super) struct ResidualUnit {
    snake1: Snake,
    conv1: Conv,
    snake2: Snake,
    conv2: Conv,
}

impl ResidualUnit {
    pub(super) fn load(f: &dyn TensorSource, name: &str, c: usize, dilation: usize) -> Result<Self> {
        Ok(Self {
            snake1: Snake::load(f, &format!("{name}.snake1"), c)?,
            conv1: Conv::load(f, &format!("{name}.conv1"), (c, c, 7), Geometry::same(7, dilation), true)?,
            snake2: Snake::load(f, &format!("{name}.snake2"), c)?,
            conv2: Conv::load(f, &format!("{name}.conv2"), (c, c, 1), Geometry::same(1, 1), true)?,
        })
    }

    pub(super) fn forward(&self, k: KernelPolicy, x: &Tensor) -> Result<Tensor> {
        if k.on_host(x) {
            let x = x.contiguous()?;
            let (c, n) = (x.dim(1)?, x.dim(2)?);
            let (s1, s2) = (&self.snake1, &self.snake2);
            let (c1, c2) = (&self.conv1, &self.conv2);
            let y = with_values(
                [&x, &s1.alpha, &s1.inv_beta, &c1.w, &c1.b, &s2.alpha, &s2.inv_beta, &c2.w, &c2.b],
                |[x, a1, ib1, w1, b1, a2, ib2, w2, b2]| {
                    let snake1 = kernel::Snake { alpha: a1, inv_beta: ib1 };
                    let snake2 = kernel::Snake { alpha: a2, inv_beta: ib2 };
                    kernel::residual_unit(x, n, snake1, &c1.on(w1, b1), snake2, &c2.on(w2, b2))
                },
            )?;
            return host_tensor(y, c, n);
        }
        let y = self.conv1.forward(k, x, Some(&self.snake1))?;
        let y = self.conv2.forward(k, &y, Some(&self.snake2))?;
        Ok((x + y)?) // same length: the padding keeps it
    }
}

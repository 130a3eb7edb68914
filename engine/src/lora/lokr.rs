//! LoKr, the Kronecker-product adapter as LyCORIS builds it (ACE-Step 1.5's `--algo lokr`
//! trains through LyCORIS): `delta W = scale * kron(w1, w2)` with `w1 [a, c]`, `w2 [b, d]`,
//! `out = a b`, `in = c d`; the larger half `w2` is a rank-`r` product `w2_a w2_b` unless
//! `r` is at least half its larger side, and `w1` is one too with `decompose_both`.
//! With both halves whole matrices LyCORIS fixes the scale at 1 (alpha = r).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, Var};
use rand_chacha::ChaCha8Rng;

use super::{kaiming_uniform, on_graph, LoraConfig};
use crate::trace;
use crate::Result;

/// LyCORIS's `factorization`: `dimension = m n` with `m <= n`, the pair closest to
/// balanced whose `m` is at most `factor` (-1: any), or exactly `factor` when it divides.
pub fn factorization(dimension: usize, factor: i64) -> (usize, usize) {
    if factor > 0 && dimension.is_multiple_of(factor as usize) {
        let (m, n) = (factor as usize, dimension / factor as usize);
        return (m.min(n), m.max(n));
    }
    let cap = if factor < 0 { dimension } else { factor as usize };
    let (mut m, mut n) = (1, dimension);
    while m < n {
        let mut next = m + 1;
        while !dimension.is_multiple_of(next) {
            next += 1;
        }
        let paired = dimension / next;
        if next + paired > m + n || next > cap {
            break;
        }
        (m, n) = (next, paired);
    }
    (m.min(n), m.max(n))
}

/// One half of the Kronecker product: a whole matrix, or a rank-r product `a b`.
pub enum Half {
    Whole(Var),
    Product(Var, Var),
}

impl Half {
    /// `[rows, cols]` as a tensor (the product taken), on the graph when `tracked`.
    fn matrix(&self, tracked: bool) -> Result<Tensor> {
        Ok(match self {
            Half::Whole(w) => on_graph(w, tracked),
            Half::Product(a, b) => trace::matmul(&on_graph(a, tracked), &on_graph(b, tracked))?,
        })
    }

    /// `(suffix, var)` under LyCORIS's names for half `which` (1 or 2).
    fn named(&self, which: u8) -> Vec<(String, &Var)> {
        match self {
            Half::Whole(w) => vec![(format!("lokr_w{which}"), w)],
            Half::Product(a, b) => vec![(format!("lokr_w{which}_a"), a), (format!("lokr_w{which}_b"), b)],
        }
    }
}

/// The shapes LyCORIS gives a `[out, in]` linear layer: `w1 [a, c]`, `w2 [b, d]`, and
/// whether each is a rank-r product.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Layout {
    pub w1: (usize, usize),
    pub w2: (usize, usize),
    pub w1_product: bool,
    pub w2_product: bool,
}

impl Layout {
    pub fn of(config: &LoraConfig, inp: usize, out: usize) -> Self {
        let (a, b) = factorization(out, config.factor);
        let (c, d) = factorization(inp, config.factor);
        let r = config.r as f64;
        Self {
            w1: (a, c),
            w2: (b, d),
            w1_product: config.decompose_both && r < a.max(c) as f64 / 2.0,
            w2_product: r < b.max(d) as f64 / 2.0,
        }
    }

    /// The alpha LyCORIS uses: r itself when both halves are whole matrices (scale 1).
    pub fn alpha(&self, config: &LoraConfig) -> f64 {
        match self.w1_product || self.w2_product {
            true => config.alpha,
            false => config.r as f64,
        }
    }

    pub fn scale(&self, config: &LoraConfig) -> f64 {
        self.alpha(config) / config.r as f64
    }

    /// Fresh tensors by name as LyCORIS initialises them: `w1` (or its factors) and
    /// `w2_a` kaiming-uniform, `w2` (or `w2_b`) zero, so the adapter starts as the base.
    pub fn init(&self, r: usize, rng: &mut ChaCha8Rng, device: &Device) -> Result<HashMap<String, Tensor>> {
        let ((a, c), (b, d)) = (self.w1, self.w2);
        let mut init = HashMap::new();
        match self.w1_product {
            true => {
                init.insert("lokr_w1_a".into(), kaiming_uniform(a, r, rng, device)?);
                init.insert("lokr_w1_b".into(), kaiming_uniform(r, c, rng, device)?);
            }
            false => _ = init.insert("lokr_w1".into(), kaiming_uniform(a, c, rng, device)?),
        }
        match self.w2_product {
            true => {
                init.insert("lokr_w2_a".into(), kaiming_uniform(b, r, rng, device)?);
                init.insert("lokr_w2_b".into(), Tensor::zeros((r, d), DType::F32, device)?);
            }
            false => _ = init.insert("lokr_w2".into(), Tensor::zeros((b, d), DType::F32, device)?),
        }
        Ok(init)
    }

    /// The tensor names and shapes of one module, in `Lokr::named` order.
    pub fn expected(&self, r: usize) -> Vec<(String, [usize; 2])> {
        let half = |which: u8, (rows, cols): (usize, usize), product: bool| match product {
            true => vec![(format!("lokr_w{which}_a"), [rows, r]), (format!("lokr_w{which}_b"), [r, cols])],
            false => vec![(format!("lokr_w{which}"), [rows, cols])],
        };
        [half(1, self.w1, self.w1_product), half(2, self.w2, self.w2_product)].concat()
    }
}

/// One LoKr-adapted module.
pub struct Lokr {
    pub w1: Half,
    pub w2: Half,
    pub scale: f64,
}

impl Lokr {
    /// `scale * kron(w1, w2)`, `[a b, c d]`, f32. The scale goes on the small `w1`: one
    /// full-size tensor fewer on the graph.
    pub fn delta(&self, tracked: bool) -> Result<Tensor> {
        let (w1, w2) = ((self.w1.matrix(tracked)? * self.scale)?, self.w2.matrix(tracked)?);
        let ((a, c), (b, d)) = (w1.dims2()?, w2.dims2()?);
        let kron = w1.reshape((a, 1, c, 1))?.broadcast_mul(&w2.reshape((1, b, 1, d))?)?;
        Ok(kron.reshape((a * b, c * d))?)
    }

    /// `(suffix, var)` under LyCORIS's names: w1's, then w2's.
    pub fn named(&self) -> Vec<(String, &Var)> {
        [self.w1.named(1), self.w2.named(2)].concat()
    }
}

/// LyCORIS's name of a module relative to the decoder, as upstream's `lokr_weights.safetensors`
/// keys it: `layers.0.cross_attn.k_proj` -> `lycoris_layers_0_cross_attn_k_proj`.
pub fn lycoris_name(module: &str) -> String {
    format!("lycoris_{}", module.replace('.', "_"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factorization_follows_lycoris_table() {
        // What LyCORIS 4.1.3's `factorization` returns (factor -1, 2, 4, 8, 16; its
        // docstring's table differs for 360), and the real DiT's widths.
        let table: [(usize, [(usize, usize); 5]); 6] = [
            (127, [(1, 127); 5]),
            (128, [(8, 16), (2, 64), (4, 32), (8, 16), (8, 16)]),
            (250, [(10, 25), (2, 125), (2, 125), (5, 50), (10, 25)]),
            (360, [(18, 20), (2, 180), (4, 90), (8, 45), (15, 24)]),
            (512, [(16, 32), (2, 256), (4, 128), (8, 64), (16, 32)]),
            (1024, [(32, 32), (2, 512), (4, 256), (8, 128), (16, 64)]),
        ];
        for (dimension, expected) in table {
            for (factor, want) in [-1, 2, 4, 8, 16].into_iter().zip(expected) {
                assert_eq!(factorization(dimension, factor), want, "{dimension} by factor {factor}");
            }
        }
        assert_eq!(factorization(2048, -1), (32, 64));
        assert_eq!(factorization(2048, 16), (16, 128));
        assert_eq!(factorization(6144, -1), (64, 96));
    }

    #[test]
    fn layouts_as_lycoris_builds_them() {
        let lokr = |r: usize, factor: i64, decompose_both: bool| LoraConfig {
            kind: super::super::AdapterKind::Lokr,
            r,
            factor,
            decompose_both,
            ..Default::default()
        };
        // Upstream's defaults on the 2B DiT's q_proj (2048 -> 2048): both halves whole, scale 1.
        let q = Layout::of(&lokr(64, -1, false), 2048, 2048);
        assert_eq!((q.w1, q.w2, q.w1_product, q.w2_product), ((32, 32), (64, 64), false, false));
        assert_eq!(q.scale(&lokr(64, -1, false)), 1.0);
        assert_eq!(super::super::parameters_per_layer(&lokr(64, -1, false), 2048, 2048), 32 * 32 + 64 * 64);
        let dora = LoraConfig { use_dora: true, ..lokr(64, -1, false) };
        assert_eq!(
            super::super::parameters_per_layer(&dora, 2048, 1024),
            32 * 32 + 32 * 64 + 1024,
            "and a magnitude a row"
        );
        // A small rank factorises w2 (and w1 with decompose_both) and scales by alpha / r.
        let small = lokr(4, -1, true);
        let k = Layout::of(&small, 2048, 1024);
        assert_eq!((k.w1, k.w2, k.w1_product, k.w2_product), ((32, 32), (32, 64), true, true));
        assert_eq!(k.scale(&small), 128.0 / 4.0);
        assert_eq!(k.expected(4)[0], ("lokr_w1_a".to_string(), [32, 4]));
        assert_eq!(lycoris_name("layers.0.cross_attn.k_proj"), "lycoris_layers_0_cross_attn_k_proj");
    }

    #[test]
    fn delta_is_the_kronecker_product() -> Result<()> {
        let dev = Device::Cpu;
        let w1 = Var::from_tensor(&Tensor::new(&[[1f32, 2.], [3., 4.]], &dev)?)?;
        let w2 = Var::from_tensor(&Tensor::new(&[[0f32, 5.], [6., 7.]], &dev)?)?;
        let m = Lokr { w1: Half::Whole(w1), w2: Half::Whole(w2), scale: 0.5 };
        let got = m.delta(false)?.to_vec2::<f32>()?;
        let kron = [[0., 5., 0., 10.], [6., 7., 12., 14.], [0., 15., 0., 20.], [18., 21., 24., 28.]];
        let want: Vec<Vec<f32>> = kron.iter().map(|row| row.iter().map(|v| v * 0.5).collect()).collect();
        assert_eq!(got, want);
        Ok(())
    }
}

//! The adapter in a forward pass: each adapted linear layer with its LoRA (the fused
//! op), PEFT's DoRA or LoKr's rebuilt weight, train-only dropout, and generation's
//! strength.

use candle_core::{DType, Tensor, Var};

use super::{on_graph, row_norms, Kernel, LoraAdapter, PartStrengths};
use crate::model::lora_linear::lora_linear;
use crate::model::{ops, LinearAdapter};
use crate::trace;
use crate::Result;

/// How the adapter takes part in a forward pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LoraMode {
    /// No dropout; the graph is recorded (inference, parity checks).
    Eval,
    /// Dropout with masks derived from `dropout_seed` and the module name, so a
    /// recomputed block (gradient checkpointing) draws exactly the same masks.
    Train { dropout_seed: u64 },
}

/// The adapter as seen by one forward pass.
#[derive(Clone, Copy)]
pub struct LoraCtx<'a> {
    adapter: &'a LoraAdapter,
    mode: LoraMode,
    /// Whether the adapter's tensors record a graph. Off for the no-graph forward of
    /// gradient checkpointing.
    tracked: bool,
    /// How much of the adapter applies (generation's adapter strength); 1 in training.
    strength: f64,
    /// Generation's strength per part of a layer, on top of `strength`.
    parts: PartStrengths,
}

impl<'a> LoraCtx<'a> {
    pub(super) fn new(adapter: &'a LoraAdapter, mode: LoraMode, tracked: bool) -> Self {
        Self { adapter, mode, tracked, strength: 1.0, parts: PartStrengths::default() }
    }

    /// The same adapter applied at `strength` (0 adds nothing, 1 is the adapter as
    /// trained; DoRA's and LoKr's weights move linearly from the base's, as ComfyUI
    /// applies a strength).
    pub fn with_strength(self, strength: f64) -> Self {
        Self { strength, ..self }
    }

    /// The same adapter with each part of a layer at its own strength (times the
    /// adapter's): a part at 0 is left as the base model has it.
    pub fn with_parts(self, parts: PartStrengths) -> Self {
        Self { parts, ..self }
    }

    /// The strength module `name`'s change applies at (no name lookup in training,
    /// where every part is whole).
    fn strength_of(&self, name: &str) -> f64 {
        match self.parts.is_whole() {
            true => self.strength,
            false => self.strength * self.parts.of(name),
        }
    }

    fn weight(&self, v: &Var, dtype: DType) -> Result<Tensor> {
        Ok(on_graph(v, self.tracked).to_dtype(dtype)?)
    }

    /// PEFT's DoRA: `W x + (m / |W + s B A| - 1) W xd + (m / |W + s B A|) s B A xd`,
    /// the norm a constant in backward; without dropout, `(m / |..|) (W + s B A) x`.
    fn dora_linear(
        &self,
        x: &Tensor,
        w: &Tensor,
        a: &Var,
        b: &Var,
        magnitude: &Var,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let scaling = self.adapter.config.scaling();
        let delta = (trace::matmul(&b.as_tensor().detach(), &a.as_tensor().detach())? * scaling)?;
        let norms = row_norms(&(w.to_dtype(DType::F32)? + delta)?)?.squeeze(1)?;
        let scale = self.weight(magnitude, DType::F32)?.div(&norms)?.to_dtype(x.dtype())?;
        let xd = match mask {
            Some(m) => x.mul(m)?,
            None => x.clone(),
        };
        let (a, b) = (self.weight(a, x.dtype())?, self.weight(b, x.dtype())?);
        let adapted = lora_linear(&xd, w, &a, &b, scaling, None)?.broadcast_mul(&scale)?;
        Ok(match mask {
            Some(_) => ops::add(&ops::linear(&(x - &xd)?, w, None)?, &adapted)?,
            None => adapted,
        })
    }
}

impl LinearAdapter for LoraCtx<'_> {
    /// Whether module `name` carries an adapter that changes it (not at strength 0).
    fn adapts(&self, name: &str) -> bool {
        self.adapter.adapts(name) && self.strength_of(name) != 0.0
    }

    /// Module `name` with weight `w` applied to `x`, its adapter included, or `None`
    /// when the module is not adapted. Adapter tensors are f32 and cast to the compute
    /// dtype here.
    fn linear(&self, name: &str, x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
        let strength = self.strength_of(name);
        let Some(m) = self.adapter.modules.get(name).filter(|_| strength != 0.0) else {
            return Ok(None);
        };
        let config = &self.adapter.config;
        let mask = match self.mode {
            LoraMode::Train { dropout_seed } if config.dropout > 0.0 => {
                Some(dropout_mask(dropout_seed, name, x, config.dropout)?)
            }
            _ => None,
        };
        let y = match (&m.kernel, &m.magnitude) {
            (Kernel::Lora { a, b }, None) => {
                let (a, b) = (self.weight(a, x.dtype())?, self.weight(b, x.dtype())?);
                return Ok(Some(lora_linear(x, w, &a, &b, config.scaling() * strength, mask.as_ref())?));
            }
            (Kernel::Lora { a, b }, Some(magnitude)) => self.dora_linear(x, w, a, b, magnitude, mask.as_ref())?,
            // LoKr: the adapted weight built whole and applied, in f32 as one GEMM. In a
            // 16-bit dtype (or part of the way) the change gets its own GEMM, as a small
            // change added to the base weight would round away.
            (Kernel::Lokr(_), _) => {
                let w32 = w.to_dtype(DType::F32)?;
                return Ok(Some(match (x.dtype(), strength) {
                    (DType::F32, 1.0) => ops::linear(x, &self.adapter.adapted_weight(m, &w32, self.tracked)?, None)?,
                    (dtype, s) => {
                        let change = (self.adapter.weight_change(m, &w32, self.tracked)? * s)?.to_dtype(dtype)?;
                        ops::add(&ops::linear(x, w, None)?, &ops::linear(x, &change, None)?)?
                    }
                }));
            }
        };
        Ok(Some(match strength {
            1.0 => y,
            s => {
                let base = ops::linear(x, w, None)?;
                ops::add(&base, &((y - &base)? * s)?)?
            }
        }))
    }
}

/// Inverted-dropout mask (0 or 1/(1-p)) shaped like `x`, a pure function of
/// (seed, module name, element index): the same masks on every recompute.
fn dropout_mask(seed: u64, name: &str, x: &Tensor, p: f64) -> Result<Tensor> {
    let mut h = seed ^ 0x9E37_79B9_7F4A_7C15;
    for byte in name.bytes() {
        h = splitmix64(h ^ byte as u64);
    }
    let keep = 1.0 - p;
    let threshold = (keep * (1u64 << 53) as f64) as u64;
    let scale = (1.0 / keep) as f32;
    let values: Vec<f32> = (0..x.elem_count() as u64)
        .map(|i| if splitmix64(h.wrapping_add(i)) >> 11 < threshold { scale } else { 0.0 })
        .collect();
    Ok(Tensor::from_vec(values, x.shape(), x.device())?.to_dtype(x.dtype())?)
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lora::LoraConfig;
    use crate::model::DitModel;
    use candle_core::Device;
    use std::collections::HashMap;

    /// An adapter of `config` on the demo DiT with every tensor moved off its start, its
    /// tensors, layer 0's q_proj weight and an input for it.
    fn moved_adapter(config: &LoraConfig) -> Result<(LoraAdapter, HashMap<String, Tensor>, Tensor, Tensor)> {
        let dev = Device::Cpu;
        let (cfg, weights) = crate::load::source::ModelSource::Demo.load_decoder(DType::F32, &dev)?;
        let model = DitModel::new(&cfg, &weights)?;
        let (adapter, moved) = crate::lora::tests::moved(config, &model, 1)?;
        let w = weights.get("layers.0.self_attn.q_proj.weight")?;
        let x = Tensor::randn(0f32, 1.0, (1, 7, w.dim(1)?), &dev)?;
        Ok((adapter, moved, w, x))
    }

    /// LoKr part of the way (generation's strength) applies `W + s (W' - W)`, and a
    /// 16-bit input gets the same through the change's own GEMM.
    #[test]
    fn lokr_at_a_strength_and_in_16_bit_applies_part_of_the_adapted_weight() -> Result<()> {
        let name = "layers.0.self_attn.q_proj";
        for use_dora in [false, true] {
            let config = LoraConfig {
                kind: crate::lora::AdapterKind::Lokr,
                r: 4,
                alpha: 8.0,
                dropout: 0.0,
                use_dora,
                ..Default::default()
            };
            let (adapter, _, w, x) = moved_adapter(&config)?;
            let adapted = adapter.merged_weight(name, &w)?.expect("adapted");
            let half = (&w + ((&adapted - &w)? * 0.5)?)?;
            let ctx = adapter.ctx(LoraMode::Eval, false);
            let ours = ctx.with_strength(0.5).linear(name, &x, &w)?.expect("adapted");
            let err = (&ours - x.broadcast_matmul(&half.t()?)?)?.abs()?.max_all()?.to_scalar::<f32>()?;
            let (x16, w16) = (x.to_dtype(DType::BF16)?, w.to_dtype(DType::BF16)?);
            let ours16 = ctx.linear(name, &x16, &w16)?.expect("adapted").to_dtype(DType::F32)?;
            let full = x.broadcast_matmul(&adapted.t()?)?;
            let err16 = (&ours16 - &full)?.abs()?.max_all()?.to_scalar::<f32>()?;
            let scale = full.abs()?.max_all()?.to_scalar::<f32>()?;
            println!(
                "LoKr (DoRA {use_dora}): strength 0.5 max abs {err:.3e}; bf16 {err16:.3e} of outputs up to {scale:.2}"
            );
            assert!(err <= 1e-5 * scale.max(1.0));
            assert!(err16 <= 2e-2 * scale, "bf16 off by more than its rounding");
            let effect = (&full - x.broadcast_matmul(&w.t()?)?)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(effect > 10.0 * err16, "the adapter's effect ({effect:.3e}) is what the bf16 check sees");
        }
        Ok(())
    }

    /// DoRA with dropout in training is PEFT's `W x + (m / |W + s B A| - 1) W xd +
    /// (m / |W + s B A|) s B A xd` (xd the dropped input): the fixture has no dropout
    /// (PEFT's masks are torch's), so the same masks are put through that formula here.
    #[test]
    fn dora_with_dropout_is_pefts_formula() -> Result<()> {
        let config = LoraConfig { r: 4, alpha: 8.0, dropout: 0.3, use_dora: true, ..Default::default() };
        let (adapter, moved, w, x) = moved_adapter(&config)?;
        let name = "layers.0.self_attn.q_proj";
        let ours = adapter.ctx(LoraMode::Train { dropout_seed: 5 }, false).linear(name, &x, &w)?.expect("adapted");

        let xd = (&x * dropout_mask(5, name, &x, config.dropout)?)?;
        let t = |param: &str| moved[&format!("{name}.{param}")].clone();
        let (a, b, m) = (t("lora_A.weight"), t("lora_B.weight"), t("lora_magnitude_vector"));
        let s = config.scaling();
        let norms = (&w + (b.matmul(&a)? * s)?)?.sqr()?.sum(1)?.sqrt()?;
        let ratio = m.div(&norms)?;
        let wx = x.broadcast_matmul(&w.t()?)?;
        let wxd = xd.broadcast_matmul(&w.t()?)?;
        let bax = (xd.broadcast_matmul(&a.t()?)?.broadcast_matmul(&b.t()?)? * s)?;
        let theirs = (wx + wxd.broadcast_mul(&(&ratio - 1.0)?)? + bax.broadcast_mul(&ratio)?)?;
        let err = (&ours - &theirs)?.abs()?.max_all()?.to_scalar::<f32>()?;
        let scale = theirs.abs()?.max_all()?.to_scalar::<f32>()?;
        println!("DoRA with dropout vs PEFT's formula: max abs {err:.3e} (outputs up to {scale:.2})");
        assert!(err <= 1e-5 * scale.max(1.0));
        let dropped = dropout_mask(5, name, &x, config.dropout)?.eq(0f32)?.to_dtype(DType::F32)?.sum_all()?;
        assert!(dropped.to_scalar::<f32>()? > 0.0, "the mask drops something");
        Ok(())
    }

    #[test]
    fn dropout_mask_is_deterministic_and_has_the_right_rate() -> Result<()> {
        let x = Tensor::zeros((4, 1000), DType::F32, &candle_core::Device::Cpu)?;
        let m1 = dropout_mask(7, "layers.0.self_attn.q_proj", &x, 0.1)?;
        let m2 = dropout_mask(7, "layers.0.self_attn.q_proj", &x, 0.1)?;
        let m3 = dropout_mask(7, "layers.0.self_attn.k_proj", &x, 0.1)?;
        let v1 = m1.flatten_all()?.to_vec1::<f32>()?;
        assert_eq!(v1, m2.flatten_all()?.to_vec1::<f32>()?);
        assert_ne!(v1, m3.flatten_all()?.to_vec1::<f32>()?);
        let dropped = v1.iter().filter(|v| **v == 0.0).count() as f64 / v1.len() as f64;
        assert!((dropped - 0.1).abs() < 0.02, "dropped fraction {dropped}");
        assert!(v1.iter().all(|v| *v == 0.0 || (*v - 1.0 / 0.9).abs() < 1e-6));
        Ok(())
    }
}

//! AdamW with f32 moments and savable state.
//!
//! candle-nn's AdamW keeps its moments in the parameter dtype and cannot be saved,
//! so a run could neither train f32 state under 16-bit parameters nor resume exactly.

use std::collections::HashMap;
use std::ops::Range;

use candle_core::{DType, Tensor, Var};
use serde::{Deserialize, Serialize};

use super::saved::{self, Saved};
use crate::{Error, Result};

/// AdamW hyper-parameters (PyTorch's names and defaults, ACE-Step's weight decay).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 }
    }
}

impl AdamWConfig {
    pub(super) fn problems(&self) -> Vec<(&'static str, String)> {
        [
            super::beta_problem("beta1", self.beta1),
            super::beta_problem("beta2", self.beta2),
            super::positive_problem("eps", self.eps),
            super::non_negative_problem("weight_decay", self.weight_decay),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// AdamW with PyTorch semantics: decoupled weight decay `p -= lr * wd * p` first, then
/// the bias-corrected Adam update. Moments are f32 whatever the parameter dtype; the
/// update is computed in f32 and cast back to the parameter's dtype.
///
/// The update is elementwise, so it runs over runs of parameters laid end to end (and
/// their moments kept that way): a GPU launches a dozen kernels per run rather than per
/// adapted tensor, with the same result bit for bit; a run's size bounds what the
/// update holds at once.
pub struct AdamW {
    vars: Vec<Var>,
    config: AdamWConfig,
    runs: Vec<Run>,
    step: u64,
}

/// Consecutive parameters updated as one vector, with both their moments.
struct Run {
    vars: Range<usize>,
    m: Tensor,
    v: Tensor,
}

/// The elements a run gathers before it closes (16 MiB of f32): a step's update then
/// holds a few such vectors beside the moments, not a few copies of the whole adapter.
const RUN_ELEMENTS: usize = 1 << 22;

const STEP_KEY: &str = "adamw.step";

fn m_key(i: usize) -> String {
    format!("adamw.m.{i}")
}

fn v_key(i: usize) -> String {
    format!("adamw.v.{i}")
}

/// `vars` split into runs of consecutive parameters of at most [`RUN_ELEMENTS`] (or one
/// larger parameter).
fn runs_of(vars: &[Var]) -> Vec<Range<usize>> {
    let mut runs: Vec<Range<usize>> = Vec::new();
    let mut elements = 0;
    for (i, var) in vars.iter().enumerate() {
        match runs.last_mut() {
            Some(run) if elements + var.elem_count() <= RUN_ELEMENTS => {
                run.end = i + 1;
                elements += var.elem_count();
            }
            _ => {
                runs.push(i..i + 1);
                elements = var.elem_count();
            }
        }
    }
    runs
}

/// Tensors laid end to end as one f32 vector.
fn flat(tensors: impl Iterator<Item = Result<Tensor>>) -> Result<Tensor> {
    let parts = tensors.map(|t| Ok(t?.to_dtype(DType::F32)?.flatten_all()?)).collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat(&parts, 0)?)
}

/// The slices of the flat `all` that belong to each of `vars`, shaped as it.
fn unflat<'a>(vars: &'a [Var], all: &'a Tensor) -> impl Iterator<Item = Result<Tensor>> + 'a {
    let mut start = 0;
    vars.iter().map(move |var| {
        let n = var.elem_count();
        start += n;
        Ok(all.narrow(0, start - n, n)?.reshape(var.shape())?)
    })
}

impl AdamW {
    /// A fresh optimizer: zero moments, step 0.
    pub fn new(vars: Vec<Var>, config: AdamWConfig) -> Result<Self> {
        Self::with_moments(vars, config, 0, |_, var| saved::zeros_like(var))
    }

    /// Rebuilds an optimizer from `state_tensors()` output (e.g. read back from a
    /// safetensors file; other keys are ignored). Moments stored in a lower precision
    /// are cast to f32 and moved to each parameter's device.
    pub fn from_state(vars: Vec<Var>, config: AdamWConfig, state: &HashMap<String, Tensor>) -> Result<Self> {
        let saved = Saved(state);
        let step = saved.count(STEP_KEY)?;
        Self::with_moments(vars, config, step, |key, var| saved.like(key, var))
    }

    /// An optimizer at `step` whose moments are `moment(key, var)`, gathered into runs.
    fn with_moments(
        vars: Vec<Var>,
        config: AdamWConfig,
        step: u64,
        moment: impl Fn(&str, &Var) -> Result<Tensor>,
    ) -> Result<Self> {
        let runs = runs_of(&vars)
            .into_iter()
            .map(|range| {
                let m = flat(range.clone().map(|i| moment(&m_key(i), &vars[i])))?;
                let v = flat(range.clone().map(|i| moment(&v_key(i), &vars[i])))?;
                Ok(Run { vars: range, m, v })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { vars, config, runs, step })
    }

    /// The state to checkpoint: `adamw.m.<i>`, `adamw.v.<i>` (f32, each shaped as its
    /// parameter, in parameter order) and `adamw.step` (a one-element i64 tensor, on the CPU).
    pub fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = vec![saved::count(STEP_KEY, self.step)?];
        for run in &self.runs {
            let vars = &self.vars[run.vars.clone()];
            for (i, (m, v)) in run.vars.clone().zip(unflat(vars, &run.m).zip(unflat(vars, &run.v))) {
                out.push((m_key(i), m?));
                out.push((v_key(i), v?));
            }
        }
        Ok(out)
    }

    /// Number of updates applied so far.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    pub fn vars(&self) -> &[Var] {
        &self.vars
    }

    /// Applies one update with learning rate `lr`. `grads[i]` is the gradient of
    /// `vars[i]` (any float dtype); the caller has already checked it is finite.
    pub fn step(&mut self, grads: &[Tensor], lr: f64) -> Result<()> {
        if grads.len() != self.vars.len() {
            return Err(Error::GradientCount { params: self.vars.len(), grads: grads.len() });
        }
        if let Some((i, g)) = grads.iter().enumerate().find(|(i, g)| g.dims() != self.vars[*i].dims()) {
            return Err(Error::GradientShape {
                index: i,
                grad: g.dims().to_vec(),
                param: self.vars[i].dims().to_vec(),
            });
        }
        self.step += 1;
        let AdamWConfig { beta1, beta2, eps, weight_decay } = self.config;
        // PyTorch's formulation: p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps).
        let t = i32::try_from(self.step).unwrap_or(i32::MAX);
        let bias_correction1 = 1.0 - beta1.powi(t);
        let bias_correction2_sqrt = (1.0 - beta2.powi(t)).sqrt();
        let step_size = lr / bias_correction1;
        for run in &mut self.runs {
            let vars = &self.vars[run.vars.clone()];
            let g = flat(grads[run.vars.clone()].iter().map(|g| Ok(g.detach())))?;
            let m = ((&run.m * beta1)? + (&g * (1.0 - beta1))?)?;
            let v = ((&run.v * beta2)? + (g.sqr()? * (1.0 - beta2))?)?;
            let p = (flat(vars.iter().map(saved::value_f32))? * (1.0 - lr * weight_decay))?;
            let denom = v.sqrt()?.affine(1.0 / bias_correction2_sqrt, eps)?;
            let p = (p - (m.div(&denom)? * step_size)?)?;
            for (var, value) in vars.iter().zip(unflat(vars, &p)) {
                saved::set(var, &value?)?;
            }
            (run.m, run.v) = (m, v);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn var(values: &[f32]) -> Var {
        Var::from_tensor(&Tensor::new(values, &Device::Cpu).unwrap()).unwrap()
    }

    fn vec(t: &Tensor) -> Vec<f32> {
        t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    /// The AdamW update rule written out in f64, straight from the paper's form.
    struct Reference {
        p: Vec<f64>,
        m: Vec<f64>,
        v: Vec<f64>,
        t: i32,
    }

    impl Reference {
        fn step(&mut self, g: &[f64], lr: f64, c: &AdamWConfig) {
            self.t += 1;
            for (i, &g) in g.iter().enumerate() {
                let (p, m, v) = (&mut self.p[i], &mut self.m[i], &mut self.v[i]);
                *p -= lr * c.weight_decay * *p;
                *m = c.beta1 * *m + (1.0 - c.beta1) * g;
                *v = c.beta2 * *v + (1.0 - c.beta2) * g * g;
                let m_hat = *m / (1.0 - c.beta1.powi(self.t));
                let v_hat = *v / (1.0 - c.beta2.powi(self.t));
                *p -= lr * m_hat / (v_hat.sqrt() + c.eps);
            }
        }
    }

    const GRADS: [[f32; 3]; 4] = [[0.5, -1.0, 2.0], [0.1, 0.3, -0.7], [-2.0, 0.0, 0.25], [1.5, -0.5, 0.0]];

    #[test]
    fn matches_f64_reference() {
        let config = AdamWConfig { beta1: 0.8, beta2: 0.95, eps: 1e-6, weight_decay: 0.1 };
        let init = [1.0f32, -0.5, 0.25];
        let mut opt = AdamW::new(vec![var(&init)], config).unwrap();
        let mut reference =
            Reference { p: init.iter().map(|&x| x as f64).collect(), m: vec![0.0; 3], v: vec![0.0; 3], t: 0 };
        for (k, g) in GRADS.iter().enumerate() {
            let lr = 0.01 * (k + 1) as f64;
            let grad = Tensor::new(g, &Device::Cpu).unwrap();
            opt.step(&[grad], lr).unwrap();
            let g64: Vec<f64> = g.iter().map(|&x| x as f64).collect();
            reference.step(&g64, lr, &config);
            let got = vec(opt.vars()[0].as_tensor());
            for (a, b) in got.iter().zip(&reference.p) {
                assert!((*a as f64 - b).abs() < 1e-6, "step {k}: {a} vs {b}");
            }
        }
        assert_eq!(opt.step_count(), 4);
    }

    #[test]
    fn parameters_of_several_shapes_update_as_each_alone() {
        let config = AdamWConfig { beta1: 0.8, beta2: 0.95, eps: 1e-6, weight_decay: 0.1 };
        let (a, b) = ([1.0f32, -0.5], [[0.25f32, 2.0, -1.0]]);
        let vars = vec![var(&a), Var::from_tensor(&Tensor::new(&b, &Device::Cpu).unwrap()).unwrap()];
        let mut together = AdamW::new(vars, config).unwrap();
        let mut alone = [AdamW::new(vec![var(&a)], config).unwrap(), AdamW::new(vec![var(&b[0])], config).unwrap()];
        for (k, g) in GRADS.iter().enumerate() {
            let lr = 0.01 * (k + 1) as f64;
            let (ga, gb) = (Tensor::new(&g[..2], &Device::Cpu).unwrap(), Tensor::new(&[*g], &Device::Cpu).unwrap());
            together.step(&[ga.clone(), gb.clone()], lr).unwrap();
            alone[0].step(&[ga], lr).unwrap();
            alone[1].step(&[gb.flatten_all().unwrap()], lr).unwrap();
        }
        assert_eq!(together.vars()[1].dims(), [1, 3]);
        for (i, one) in alone.iter().enumerate() {
            assert_eq!(vec(together.vars()[i].as_tensor()), vec(one.vars()[0].as_tensor()), "parameter {i}");
        }
        let state: HashMap<_, _> = together.state_tensors().unwrap().into_iter().collect();
        assert_eq!(state["adamw.m.1"].dims(), [1, 3], "each moment saved shaped as its parameter");
        assert_eq!(vec(&state["adamw.v.0"]), vec(&alone[0].state_tensors().unwrap()[2].1));
    }

    #[test]
    fn runs_close_at_their_size() {
        let zeros = |n: usize| Var::zeros(n, DType::F32, &Device::Cpu).unwrap();
        let vars = [3, RUN_ELEMENTS - 3, 1, RUN_ELEMENTS + 1, 2].map(zeros);
        assert_eq!(runs_of(&vars), [0..2, 2..3, 3..4, 4..5]);
    }

    #[test]
    fn a_gradient_of_the_wrong_shape_is_refused() {
        let mut opt = AdamW::new(vec![var(&[1.0, 2.0])], AdamWConfig::default()).unwrap();
        let err = opt.step(&[Tensor::new(&[[1.0f32, 2.0]], &Device::Cpu).unwrap()], 0.1).unwrap_err();
        assert!(matches!(err, Error::GradientShape { index: 0, .. }), "{err}");
        assert_eq!(opt.step_count(), 0, "nothing applied");
    }

    #[test]
    fn weight_decay_applies_with_zero_gradient() {
        let config = AdamWConfig { weight_decay: 0.5, ..Default::default() };
        let mut opt = AdamW::new(vec![var(&[2.0])], config).unwrap();
        opt.step(&[Tensor::new(&[0.0f32], &Device::Cpu).unwrap()], 0.1).unwrap();
        // Decoupled: p * (1 - lr * wd) = 2 * 0.95, and the Adam term is 0 / (0 + eps).
        assert!((vec(opt.vars()[0].as_tensor())[0] - 1.9).abs() < 1e-6);
    }

    #[test]
    fn moments_stay_f32_under_bf16_parameters() {
        let p = Var::from_tensor(&Tensor::new(&[1.0f32, 2.0], &Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap())
            .unwrap();
        let mut opt = AdamW::new(vec![p], AdamWConfig::default()).unwrap();
        let g = Tensor::new(&[0.5f32, -0.5], &Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap();
        for _ in 0..3 {
            opt.step(std::slice::from_ref(&g), 1e-2).unwrap();
        }
        assert_eq!(opt.vars()[0].dtype(), DType::BF16);
        for (key, t) in opt.state_tensors().unwrap() {
            if key != STEP_KEY {
                assert_eq!(t.dtype(), DType::F32, "{key}");
            }
        }
    }

    #[test]
    fn state_round_trip_continues_identically() {
        let config = AdamWConfig::default();
        let init = [0.3f32, -0.2, 0.9];
        let mut straight = AdamW::new(vec![var(&init)], config).unwrap();
        let mut first = AdamW::new(vec![var(&init)], config).unwrap();
        for g in &GRADS[..2] {
            let g = Tensor::new(g, &Device::Cpu).unwrap();
            straight.step(std::slice::from_ref(&g), 1e-2).unwrap();
            first.step(&[g], 1e-2).unwrap();
        }
        let state: HashMap<_, _> = first.state_tensors().unwrap().into_iter().collect();
        let params = var(&vec(first.vars()[0].as_tensor()));
        let mut resumed = AdamW::from_state(vec![params], config, &state).unwrap();
        assert_eq!(resumed.step_count(), 2);
        for g in &GRADS[2..] {
            let g = Tensor::new(g, &Device::Cpu).unwrap();
            straight.step(std::slice::from_ref(&g), 1e-2).unwrap();
            resumed.step(&[g], 1e-2).unwrap();
        }
        let a = vec(straight.vars()[0].as_tensor());
        let b = vec(resumed.vars()[0].as_tensor());
        assert_eq!(a, b, "bit-exact after restore");
    }

    #[test]
    fn restore_casts_f16_moments_to_f32() {
        let mut state = HashMap::new();
        state.insert(STEP_KEY.to_string(), Tensor::new(&[7i64], &Device::Cpu).unwrap());
        for (key, values) in [("adamw.m.0", [0.5f32, -0.25]), ("adamw.v.0", [0.125, 2.0])] {
            let t = Tensor::new(&values, &Device::Cpu).unwrap();
            state.insert(key.to_string(), t.to_dtype(DType::F16).unwrap());
        }
        let opt = AdamW::from_state(vec![var(&[1.0, 1.0])], AdamWConfig::default(), &state).unwrap();
        assert_eq!(opt.step_count(), 7);
        let saved: HashMap<_, _> = opt.state_tensors().unwrap().into_iter().collect();
        assert_eq!(saved["adamw.m.0"].dtype(), DType::F32);
        assert_eq!(vec(&saved["adamw.m.0"]), [0.5, -0.25]);
        assert_eq!(vec(&saved["adamw.v.0"]), [0.125, 2.0]);
    }

    #[test]
    fn state_survives_a_safetensors_file_with_f16_moments() {
        let mut opt = AdamW::new(vec![var(&[0.5, -1.5])], AdamWConfig::default()).unwrap();
        opt.step(&[Tensor::new(&[0.25f32, 1.0], &Device::Cpu).unwrap()], 1e-2).unwrap();
        // A checkpoint written by an engine that stored its moments in f16.
        let state: HashMap<String, Tensor> = (opt.state_tensors().unwrap().into_iter())
            .map(|(k, t)| match k.as_str() {
                STEP_KEY => (k, t),
                _ => (k, t.to_dtype(DType::F16).unwrap()),
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("training_state.safetensors");
        candle_core::safetensors::save(&state, &path).unwrap();
        let loaded = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
        let params = var(&vec(opt.vars()[0].as_tensor()));
        let resumed = AdamW::from_state(vec![params], AdamWConfig::default(), &loaded).unwrap();
        assert_eq!(resumed.step_count(), 1);
        for (key, t) in resumed.state_tensors().unwrap() {
            if key != STEP_KEY {
                assert_eq!(t.dtype(), DType::F32, "{key}");
                let want = vec(&state[&key]);
                assert_eq!(vec(&t), want, "{key}: the f16 values, exactly");
            }
        }
    }

    #[test]
    fn restore_errors_name_the_key() {
        let opt = AdamW::new(vec![var(&[1.0, 2.0])], AdamWConfig::default()).unwrap();
        let mut state: HashMap<_, _> = opt.state_tensors().unwrap().into_iter().collect();
        state.remove("adamw.v.0");
        let err = AdamW::from_state(vec![var(&[1.0, 2.0])], AdamWConfig::default(), &state).err().unwrap();
        assert!(err.to_string().contains("adamw.v.0"), "{err}");
        let err = AdamW::from_state(vec![var(&[1.0])], AdamWConfig::default(), &state).err().unwrap();
        assert!(err.to_string().contains("adamw.m.0"), "{err}");
    }

    #[test]
    fn gradient_count_must_match() {
        let mut opt = AdamW::new(vec![var(&[1.0])], AdamWConfig::default()).unwrap();
        assert!(matches!(opt.step(&[], 0.1), Err(Error::GradientCount { params: 1, grads: 0 })));
    }
}

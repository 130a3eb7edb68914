//! The optimizers a run can train with (AdamW, Prodigy, Adafactor), each with f32
//! state whatever the parameters' dtype and its whole state in the checkpoint, so a
//! run resumes bit-exact; plus global-norm gradient clipping and the non-finite check.

mod adafactor;
mod adamw;
mod prodigy;
mod saved;

use std::collections::HashMap;

use candle_core::{DType, Tensor, Var};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use adafactor::{Adafactor, AdafactorConfig};
pub use adamw::{AdamW, AdamWConfig};
pub use prodigy::{Prodigy, ProdigyConfig};

use crate::error::SettingErrors;
use crate::trace;
use crate::Result;

/// The optimizer and its hyper-parameters: run.toml's `[optimizer]` table, with
/// `kind = "prodigy"` or `"adafactor"`; a table without `kind` is AdamW, written
/// without it, so run.toml files from before the choice read and hash the same.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerConfig {
    AdamW(AdamWConfig),
    Prodigy(ProdigyConfig),
    Adafactor(AdafactorConfig),
}

/// The optimizers by name, as `--optimizer` and the window offer them.
pub const OPTIMIZERS: [&str; 3] = ["adamw", "prodigy", "adafactor"];

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self::AdamW(AdamWConfig::default())
    }
}

impl OptimizerConfig {
    /// The optimizer called `name`, with its reference defaults.
    pub fn named(name: &str) -> std::result::Result<Self, String> {
        match name {
            "adamw" => Ok(Self::AdamW(AdamWConfig::default())),
            "prodigy" => Ok(Self::Prodigy(ProdigyConfig::default())),
            "adafactor" => Ok(Self::Adafactor(AdafactorConfig::default())),
            other => Err(format!("unknown optimizer `{other}`: {}", OPTIMIZERS.join(", "))),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Self::AdamW(_) => "adamw",
            Self::Prodigy(_) => "prodigy",
            Self::Adafactor(_) => "adafactor",
        }
    }

    /// f32 values of state the optimizer keeps per trainable element, for the memory
    /// estimate: AdamW's two moments; Prodigy's two moments, its running sum `s` and
    /// the starting point; Adafactor's first moment when it keeps one (its factored
    /// second moment is a row and a column per matrix: counted as none).
    pub fn state_per_parameter(&self) -> u64 {
        match self {
            Self::AdamW(_) => 2,
            Self::Prodigy(c) => 3 + u64::from(c.beta1 > 0.0),
            Self::Adafactor(c) => u64::from(c.beta1.is_some()),
        }
    }

    /// Every hyper-parameter out of range, named as run.toml spells it.
    pub fn check(&self, e: &mut SettingErrors) {
        let field = |name: &str| format!("optimizer.{name}");
        let problems = match self {
            Self::AdamW(c) => c.problems(),
            Self::Prodigy(c) => c.problems(),
            Self::Adafactor(c) => c.problems(),
        };
        for (name, why) in problems {
            e.check(false, &field(name), || why);
        }
    }
}

/// `beta` must be in [0, 1).
fn beta_problem(name: &'static str, beta: f64) -> Option<(&'static str, String)> {
    (!(0.0..1.0).contains(&beta)).then(|| (name, format!("{beta} must be at least 0 and below 1")))
}

/// `x` must be a positive number.
fn positive_problem(name: &'static str, x: f64) -> Option<(&'static str, String)> {
    (!(x.is_finite() && x > 0.0)).then(|| (name, format!("{x} must be a positive number")))
}

/// `x` must be a finite number, 0 or more.
fn non_negative_problem(name: &'static str, x: f64) -> Option<(&'static str, String)> {
    (!(x.is_finite() && x >= 0.0)).then(|| (name, format!("{x} must be a number, 0 or more")))
}

impl Serialize for OptimizerConfig {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Tagged<'a, C> {
            kind: &'static str,
            #[serde(flatten)]
            config: &'a C,
        }
        match self {
            Self::AdamW(c) => c.serialize(s),
            Self::Prodigy(config) => Tagged { kind: self.kind(), config }.serialize(s),
            Self::Adafactor(config) => Tagged { kind: self.kind(), config }.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for OptimizerConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        // Through a JSON map, which keeps every f64 exactly (a TOML value is converted
        // through its text).
        let mut table = serde_json::Map::deserialize(d)?;
        let kind = match table.remove("kind") {
            None => "adamw".to_string(),
            Some(serde_json::Value::String(kind)) => kind,
            Some(other) => return Err(D::Error::custom(format!("kind: expected a name, found {other}"))),
        };
        let rest = serde_json::Value::Object(table);
        let parsed = match Self::named(&kind).map_err(D::Error::custom)? {
            Self::AdamW(_) => serde_json::from_value(rest).map(Self::AdamW),
            Self::Prodigy(_) => serde_json::from_value(rest).map(Self::Prodigy),
            Self::Adafactor(_) => serde_json::from_value(rest).map(Self::Adafactor),
        };
        parsed.map_err(|e| D::Error::custom(format!("{kind}: {e}")))
    }
}

/// A run's optimizer.
pub enum Optimizer {
    AdamW(AdamW),
    Prodigy(Prodigy),
    Adafactor(Adafactor),
}

impl Optimizer {
    /// A fresh optimizer over `vars`.
    pub fn new(vars: Vec<Var>, config: &OptimizerConfig) -> Result<Self> {
        Ok(match *config {
            OptimizerConfig::AdamW(c) => Self::AdamW(AdamW::new(vars, c)?),
            OptimizerConfig::Prodigy(c) => Self::Prodigy(Prodigy::new(vars, c)?),
            OptimizerConfig::Adafactor(c) => Self::Adafactor(Adafactor::new(vars, c)?),
        })
    }

    /// The optimizer as a checkpoint saved it (`state_tensors`).
    pub fn from_state(vars: Vec<Var>, config: &OptimizerConfig, state: &HashMap<String, Tensor>) -> Result<Self> {
        Ok(match *config {
            OptimizerConfig::AdamW(c) => Self::AdamW(AdamW::from_state(vars, c, state)?),
            OptimizerConfig::Prodigy(c) => Self::Prodigy(Prodigy::from_state(vars, c, state)?),
            OptimizerConfig::Adafactor(c) => Self::Adafactor(Adafactor::from_state(vars, c, state)?),
        })
    }

    /// Everything a resume needs, keyed `<kind>.<name>[.<parameter index>]`.
    pub fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        match self {
            Self::AdamW(o) => o.state_tensors(),
            Self::Prodigy(o) => o.state_tensors(),
            Self::Adafactor(o) => o.state_tensors(),
        }
    }

    /// Updates applied so far.
    pub fn step_count(&self) -> u64 {
        match self {
            Self::AdamW(o) => o.step_count(),
            Self::Prodigy(o) => o.step_count(),
            Self::Adafactor(o) => o.step_count(),
        }
    }

    /// One update at the schedule's learning rate `lr`; returns the step size it took:
    /// `lr`, or for Prodigy its adapted `d * lr`.
    pub fn step(&mut self, grads: &[Tensor], lr: f64) -> Result<f64> {
        match self {
            Self::AdamW(o) => o.step(grads, lr).map(|()| lr),
            Self::Prodigy(o) => o.step(grads, lr),
            Self::Adafactor(o) => o.step(grads, lr).map(|()| lr),
        }
    }
}

/// A step's gradients, checked and measured by one read-back (on a GPU each is a
/// synchronisation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradCheck {
    /// Whether every element of every gradient is finite.
    pub finite: bool,
    /// The global L2 norm, accumulated in f32.
    pub norm: f64,
}

/// Checks and measures `grads`: whether every element is finite and their global norm.
pub fn check(grads: &[Tensor]) -> Result<GradCheck> {
    if grads.is_empty() {
        return Ok(GradCheck { finite: true, norm: 0.0 });
    }
    // One vector of every gradient: a fixed number of kernels however many tensors
    // there are (a copy of the adapter's gradients, small beside a step's activations).
    let flat = grads.iter().map(|g| g.flatten_all()?.to_dtype(DType::F32)).collect::<candle_core::Result<Vec<_>>>()?;
    let flat = Tensor::cat(&flat, 0)?;
    // x - x is 0 for finite x and NaN for inf or NaN, so its sum is finite exactly when
    // every element is; no overflow can occur, unlike summing x itself.
    let nan_if_not_finite = flat.sub(&flat)?.sum_all()?;
    let sum_sq = flat.sqr()?.sum_all()?;
    let read = trace::read_back("gradient norm", &Tensor::stack(&[nan_if_not_finite, sum_sq], 0)?)?;
    Ok(GradCheck { finite: read[0].is_finite(), norm: f64::from(read[1]).sqrt() })
}

/// Global-norm clipping with PyTorch's `clip_grad_norm_` semantics, given the
/// gradients' `norm`: when it exceeds `max_norm`, every gradient is scaled by
/// `max_norm / (norm + 1e-6)`. A non-finite norm leaves the gradients untouched: such
/// a step must be skipped, not applied.
pub fn clip(grads: &mut [Tensor], norm: f64, max_norm: f64) -> Result<()> {
    if norm.is_finite() && norm > max_norm {
        let scale = max_norm / (norm + 1e-6);
        for g in grads.iter_mut() {
            *g = g.affine(scale, 0.0)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn vec(t: &Tensor) -> Vec<f32> {
        t.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap()
    }

    #[test]
    fn clipping_follows_pytorch() {
        let t = |v: &[f32]| Tensor::new(v, &Device::Cpu).unwrap();
        // Norm sqrt(9 + 16) = 5 over two tensors.
        let mut grads = vec![t(&[3.0]), t(&[0.0, 4.0])];
        let norm = check(&grads).unwrap().norm;
        assert!((norm - 5.0).abs() < 1e-9);
        clip(&mut grads, norm, 1.0).unwrap();
        let scale = 1.0 / (5.0 + 1e-6);
        assert!((vec(&grads[0])[0] as f64 - 3.0 * scale).abs() < 1e-6);
        assert!((vec(&grads[1])[1] as f64 - 4.0 * scale).abs() < 1e-6);

        let mut small = vec![t(&[0.3, 0.4])];
        let norm = check(&small).unwrap().norm;
        assert!((norm - 0.5).abs() < 1e-7);
        clip(&mut small, norm, 1.0).unwrap();
        assert_eq!(vec(&small[0]), [0.3, 0.4], "below the limit: untouched");
    }

    #[test]
    fn non_finite_detection() {
        let t = |v: &[f32]| Tensor::new(v, &Device::Cpu).unwrap();
        let finite = |grads: &[Tensor]| check(grads).unwrap().finite;
        assert!(finite(&[t(&[1.0, f32::MAX]), t(&[f32::MAX; 4])]));
        assert!(!finite(&[t(&[1.0]), t(&[0.0, f32::NAN])]));
        assert!(!finite(&[t(&[f32::NEG_INFINITY])]));
        let f16_inf = t(&[70000.0]).to_dtype(DType::F16).unwrap();
        assert!(!finite(&[f16_inf]));
        assert_eq!(check(&[]).unwrap(), GradCheck { finite: true, norm: 0.0 });

        let mut grads = vec![t(&[f32::INFINITY, 1.0])];
        let norm = check(&grads).unwrap().norm;
        assert!(norm.is_infinite());
        clip(&mut grads, norm, 1.0).unwrap();
        assert_eq!(vec(&grads[0])[1], 1.0, "non-finite norm: untouched");
    }

    #[derive(Serialize, Deserialize)]
    struct InToml {
        optimizer: OptimizerConfig,
    }

    fn toml_of(o: OptimizerConfig) -> String {
        toml::to_string(&InToml { optimizer: o }).unwrap()
    }

    #[test]
    fn adamw_is_written_as_before_the_choice_and_the_others_by_kind() {
        let adamw = toml_of(OptimizerConfig::default());
        assert_eq!(adamw, "[optimizer]\nbeta1 = 0.9\nbeta2 = 0.999\neps = 0.00000001\nweight_decay = 0.01\n");
        for name in OPTIMIZERS {
            let o = OptimizerConfig::named(name).unwrap();
            let back: InToml = toml::from_str(&toml_of(o)).unwrap();
            assert_eq!(back.optimizer, o, "{name} through TOML");
            let json = serde_json::to_string(&o).unwrap();
            assert_eq!(serde_json::from_str::<OptimizerConfig>(&json).unwrap(), o, "{name} through JSON: {json}");
        }
        assert!(toml_of(OptimizerConfig::named("prodigy").unwrap()).contains("kind = \"prodigy\""));
        let p: InToml = toml::from_str("[optimizer]\nkind = \"prodigy\"\nd_coef = 0.5\n").unwrap();
        assert_eq!(p.optimizer, OptimizerConfig::Prodigy(ProdigyConfig { d_coef: 0.5, ..Default::default() }));
    }

    #[test]
    fn bad_tables_are_refused_naming_what_is_wrong() {
        let err = |text: &str| toml::from_str::<InToml>(text).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err("[optimizer]\nkind = \"lion\"\n").contains("unknown optimizer `lion`"));
        assert!(err("[optimizer]\nkind = \"prodigy\"\nbeta4 = 1\n").contains("beta4"));
        assert!(err("[optimizer]\nd_coef = 1\n").contains("d_coef"), "AdamW has no d_coef");
        let mut e = SettingErrors::default();
        OptimizerConfig::Adafactor(AdafactorConfig { decay_rate: 0.5, ..Default::default() }).check(&mut e);
        OptimizerConfig::Prodigy(ProdigyConfig { d0: 0.0, ..Default::default() }).check(&mut e);
        let fields: Vec<_> = e.iter().map(|(f, _)| f.to_string()).collect();
        assert_eq!(fields, ["optimizer.decay_rate", "optimizer.d0"]);
    }

    /// The small problem of `scripts/make_optimizer_fixtures.py`: the gradient of each
    /// parameter is `(p - target) * weight + noise[step]`.
    struct Problem {
        reference: serde_json::Value,
    }

    impl Problem {
        fn load() -> Self {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/optimizers/reference.json");
            Self { reference: serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap() }
        }

        fn names(&self) -> Vec<String> {
            self.reference["shapes"].as_object().unwrap().keys().cloned().collect()
        }

        fn tensor(&self, values: &serde_json::Value, name: &str) -> Tensor {
            let shape: Vec<usize> = serde_json::from_value(self.reference["shapes"][name].clone()).unwrap();
            let v: Vec<f32> = serde_json::from_value(values[name].clone()).unwrap();
            Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
        }

        fn vars(&self) -> Vec<Var> {
            self.names().iter().map(|n| Var::from_tensor(&self.tensor(&self.reference["init"], n)).unwrap()).collect()
        }

        fn grads(&self, vars: &[Var], step: usize) -> Vec<Tensor> {
            let weight = self.reference["weight"].as_f64().unwrap();
            (self.names().iter().zip(vars))
                .map(|(n, v)| {
                    let target = self.tensor(&self.reference["target"], n);
                    let noise = self.tensor(&self.reference["noise"][step], n);
                    ((v.as_tensor() - target).unwrap() * weight).unwrap().add(&noise).unwrap()
                })
                .collect()
        }

        fn lr(&self, kind: &str, step: usize) -> f64 {
            self.reference["lrs"][kind][step].as_f64().unwrap()
        }
    }

    fn config_of(case: &serde_json::Value) -> OptimizerConfig {
        let mut table = case["options"].as_object().unwrap().clone();
        table.insert("kind".into(), case["kind"].clone());
        serde_json::from_value(serde_json::Value::Object(table)).unwrap()
    }

    #[test]
    fn follows_the_reference_optimizers() {
        let problem = Problem::load();
        println!("references: {}", problem.reference["made_with"]);
        for case in problem.reference["cases"].as_array().unwrap() {
            let (name, kind) = (case["name"].as_str().unwrap(), case["kind"].as_str().unwrap());
            let config = config_of(case);
            let vars = problem.vars();
            let mut opt = Optimizer::new(vars.clone(), &config).unwrap();
            let (mut worst_param, mut worst_d) = (0f64, 0f64);
            for (step, want) in case["steps"].as_array().unwrap().iter().enumerate() {
                let grads = problem.grads(&vars, step);
                opt.step(&grads, problem.lr(kind, step)).unwrap();
                for (n, v) in problem.names().iter().zip(&vars) {
                    let want: Vec<f64> = serde_json::from_value(want[n].clone()).unwrap();
                    let got = v.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    for (a, b) in got.iter().zip(&want) {
                        worst_param = worst_param.max((*a as f64 - b).abs() / b.abs().max(1e-3));
                    }
                }
                if let (Optimizer::Prodigy(p), Some(d)) = (&opt, want["d"].as_f64()) {
                    worst_d = worst_d.max((p.d() - d).abs() / d);
                }
            }
            println!("{name}: largest relative error {worst_param:.2e} in the parameters, {worst_d:.2e} in d");
            assert!(worst_param < 1e-4, "{name}: parameters off by {worst_param:.2e}");
            assert!(worst_d < 1e-4, "{name}: d off by {worst_d:.2e}");
        }
    }

    #[test]
    fn every_optimizer_resumes_bit_exact_through_a_checkpoint_file() {
        let problem = Problem::load();
        for case in problem.reference["cases"].as_array().unwrap() {
            let (name, kind) = (case["name"].as_str().unwrap(), case["kind"].as_str().unwrap());
            let config = config_of(case);
            let run = |vars: &[Var], opt: &mut Optimizer, steps: std::ops::Range<usize>| {
                for step in steps {
                    opt.step(&problem.grads(vars, step), problem.lr(kind, step)).unwrap();
                }
            };
            let straight = problem.vars();
            let mut opt = Optimizer::new(straight.clone(), &config).unwrap();
            run(&straight, &mut opt, 0..8);

            let first = problem.vars();
            let mut opt = Optimizer::new(first.clone(), &config).unwrap();
            run(&first, &mut opt, 0..4);
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("training_state.safetensors");
            let state: HashMap<_, _> = opt.state_tensors().unwrap().into_iter().collect();
            candle_core::safetensors::save(&state, &path).unwrap();
            let loaded = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
            let resumed: Vec<Var> = first.iter().map(|v| Var::from_tensor(v.as_tensor()).unwrap()).collect();
            let mut opt = Optimizer::from_state(resumed.clone(), &config, &loaded).unwrap();
            assert_eq!(opt.step_count(), 4, "{name}");
            run(&resumed, &mut opt, 4..8);
            for (a, b) in straight.iter().zip(&resumed) {
                let (a, b) = (a.as_tensor().flatten_all().unwrap(), b.as_tensor().flatten_all().unwrap());
                assert_eq!(a.to_vec1::<f32>().unwrap(), b.to_vec1::<f32>().unwrap(), "{name}: bit-exact after restore");
            }
        }
    }

    #[test]
    fn a_missing_state_tensor_is_named() {
        let problem = Problem::load();
        for name in ["prodigy", "adafactor"] {
            let config = OptimizerConfig::named(name).unwrap();
            let vars = problem.vars();
            let mut opt = Optimizer::new(vars.clone(), &config).unwrap();
            opt.step(&problem.grads(&vars, 0), 1e-3).unwrap();
            let mut state: HashMap<_, _> = opt.state_tensors().unwrap().into_iter().collect();
            let key = format!("{name}.{}.0", if name == "prodigy" { "s" } else { "row" });
            state.remove(&key).unwrap_or_else(|| panic!("{key} is saved"));
            let err = Optimizer::from_state(vars, &config, &state).err().unwrap().to_string();
            assert!(err.contains(&key), "{err}");
        }
    }
}

//! Adapters on the DiT's linear layers: LoRA (PEFT's, DoRA as an option) and LoKr
//! (LyCORIS's Kronecker product, as upstream ACE-Step trains it, with its weight
//! decomposition as the DoRA option). Injection by target-module suffix (as PEFT
//! matches), the libraries' initialisations, the forward with train-only dropout, their
//! files (`peft`, `lycoris`) and merging into base weights.
//!
//! The adapter lives beside the model, not inside it: loading another adapter replaces
//! this one and never touches the base weights.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{DType, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::SettingErrors;
use crate::model::weights::layer_linears;
use crate::model::{DitConfig, DitModel};
use crate::{Error, Result};

mod forward;
pub mod lokr;
pub mod lycoris;
pub mod peft;

pub use forward::{LoraCtx, LoraMode};
use lokr::{Half, Layout, Lokr};
pub use peft::LORA_METADATA_KEY;

/// Which adapter a run trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AdapterKind {
    /// Low-rank `B A` (PEFT's LoRA).
    #[default]
    Lora,
    /// Kronecker product `kron(w1, w2)` (LyCORIS's LoKr).
    Lokr,
}

/// The adapter kinds by the names `--adapter` and run.toml use.
pub const ADAPTERS: [&str; 2] = ["lora", "lokr"];

impl std::str::FromStr for AdapterKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "lora" => Ok(Self::Lora),
            "lokr" => Ok(Self::Lokr),
            other => Err(format!("unknown adapter `{other}` (expected {})", ADAPTERS.join(" or "))),
        }
    }
}

impl AdapterKind {
    pub fn name(self) -> &'static str {
        ADAPTERS[self as usize]
    }

    fn is_lora(&self) -> bool {
        *self == Self::Lora
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraConfig {
    /// LoRA, or LoKr (written only when it is LoKr, so earlier run.toml files hash the same).
    #[serde(skip_serializing_if = "AdapterKind::is_lora")]
    pub kind: AdapterKind,
    /// Rank r of each adapter (LoKr: LyCORIS's `linear_dim`).
    pub r: usize,
    /// Scaling numerator: the delta is multiplied by alpha / r (alpha / sqrt(r) with
    /// rsLoRA). LoKr: LyCORIS's `linear_alpha`, and a scale of 1 where r leaves both
    /// Kronecker halves whole matrices.
    pub alpha: f64,
    /// Dropout on the adapter's input, in training only (LoRA).
    pub dropout: f64,
    /// Module-name suffixes to adapt, matched as PEFT does (`name == t` or ends with `.t`).
    pub target_modules: Vec<String>,
    pub use_rslora: bool,
    /// DoRA: a magnitude per output row trained beside the adapter (PEFT's `use_dora`;
    /// LyCORIS's weight decomposition for LoKr).
    #[serde(skip_serializing_if = "is_false")]
    pub use_dora: bool,
    /// LoKr: the Kronecker split's factor, -1 for the most balanced (LyCORIS's `factor`).
    #[serde(skip_serializing_if = "is_balanced")]
    pub factor: i64,
    /// LoKr: `w1` a rank-r product too, where r is small enough for it.
    #[serde(skip_serializing_if = "is_false")]
    pub decompose_both: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_balanced(factor: &i64) -> bool {
    *factor == -1
}

impl Default for LoraConfig {
    /// ACE-Step's UI defaults: r 64, alpha 128, dropout 0.1 on q/k/v/o (its LoKr:
    /// linear_dim 64, linear_alpha 128, factor -1).
    fn default() -> Self {
        Self {
            kind: AdapterKind::Lora,
            r: 64,
            alpha: 128.0,
            dropout: 0.1,
            target_modules: ["q_proj", "k_proj", "v_proj", "o_proj"].map(String::from).to_vec(),
            use_rslora: false,
            use_dora: false,
            factor: -1,
            decompose_both: false,
        }
    }
}

impl LoraConfig {
    /// LoRA's scaling (LoKr's is per module: [`lokr::Layout::scale`]).
    pub fn scaling(&self) -> f64 {
        if self.use_rslora {
            self.alpha / (self.r as f64).sqrt()
        } else {
            self.alpha / self.r as f64
        }
    }

    /// Whether module `module` is adapted: PEFT's suffix match.
    pub fn targets(&self, module: &str) -> bool {
        self.target_modules.iter().any(|t| module == t || module.ends_with(&format!(".{t}")))
    }

    /// Switches to adapter `kind`, keeping rank, alpha, targets and DoRA; LoKr trains
    /// without dropout (as LyCORIS does), LoRA with ACE-Step's 0.1, and the LoKr-only
    /// settings go back to their defaults for LoRA.
    pub fn choose(&mut self, kind: AdapterKind) {
        if kind == self.kind {
            return;
        }
        let defaults = LoraConfig::default();
        self.kind = kind;
        match kind {
            AdapterKind::Lokr => (self.dropout, self.use_rslora) = (0.0, false),
            AdapterKind::Lora => {
                (self.dropout, self.factor, self.decompose_both) = (defaults.dropout, defaults.factor, false)
            }
        }
    }

    /// A short description for the run summary: `LoKr r 64 alpha 128 (DoRA)`.
    pub fn describe(&self) -> String {
        let kind = match self.kind {
            AdapterKind::Lora => "LoRA",
            AdapterKind::Lokr => "LoKr",
        };
        let dora = if self.use_dora { " + DoRA" } else { "" };
        format!("{kind}{dora} r {} alpha {}", self.r, self.alpha)
    }
}
/// The groups `--targets` names, each as the module suffixes it stands for.
pub const TARGET_GROUPS: [(&str, &[&str]); 3] = [
    ("self", &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]),
    ("cross", &["cross_attn.q_proj", "cross_attn.k_proj", "cross_attn.v_proj", "cross_attn.o_proj"]),
    ("mlp", &["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]),
];

/// A comma-separated target list (`self`, `cross`, `mlp`, or module suffixes as PEFT
/// matches them, e.g. `q_proj`) as `target_modules`, each once, in order.
pub fn parse_targets(list: &str) -> std::result::Result<Vec<String>, String> {
    let mut modules: Vec<String> = Vec::new();
    for item in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let suffixes = match TARGET_GROUPS.iter().find(|(group, _)| *group == item) {
            Some((_, suffixes)) => suffixes.iter().map(|s| s.to_string()).collect(),
            None if item
                .split('.')
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')) =>
            {
                vec![item.to_string()]
            }
            None => return Err(format!("`{item}` is neither self, cross, mlp nor a module name such as q_proj")),
        };
        for suffix in suffixes {
            if !modules.contains(&suffix) {
                modules.push(suffix);
            }
        }
    }
    match modules.is_empty() {
        true => Err("no targets: name self, cross, mlp or module names such as q_proj".into()),
        false => Ok(modules),
    }
}

/// The trainable part of one adapted module.
enum Kernel {
    /// `a [r, in]`, `b [out, r]`, f32.
    Lora {
        a: Var,
        b: Var,
    },
    Lokr(Lokr),
}

/// One adapted linear module.
struct Adapted {
    kernel: Kernel,
    /// DoRA's magnitude per output row: `[out]` (PEFT's) or `[out, 1]` (LyCORIS's).
    magnitude: Option<Var>,
    /// `(in, out)` features.
    features: (usize, usize),
}

pub struct LoraAdapter {
    pub config: LoraConfig,
    modules: BTreeMap<String, Adapted>,
}

/// Kaiming-uniform (a = sqrt(5)) as PEFT and LyCORIS initialise their down factors:
/// U(-1/sqrt(cols), 1/sqrt(cols)).
fn kaiming_uniform(rows: usize, cols: usize, rng: &mut ChaCha8Rng, device: &candle_core::Device) -> Result<Tensor> {
    let bound = 1.0 / (cols as f64).sqrt();
    let v: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-bound..bound) as f32).collect();
    Ok(Tensor::from_vec(v, (rows, cols), device)?)
}

/// The tensors module `[out, in]` holds under `config`, by name and shape, in the order
/// they are trained and saved: the kernel's, then DoRA's magnitude.
fn expected_params(config: &LoraConfig, inp: usize, out: usize) -> Vec<(String, Vec<usize>)> {
    let r = config.r;
    let mut params: Vec<(String, Vec<usize>)> = match config.kind {
        AdapterKind::Lora => vec![("lora_A.weight".into(), vec![r, inp]), ("lora_B.weight".into(), vec![out, r])],
        AdapterKind::Lokr => {
            Layout::of(config, inp, out).expected(r).into_iter().map(|(name, shape)| (name, shape.to_vec())).collect()
        }
    };
    if config.use_dora {
        params.push(match config.kind {
            AdapterKind::Lora => ("lora_magnitude_vector".into(), vec![out]),
            AdapterKind::Lokr => ("dora_scale".into(), vec![out, 1]),
        });
    }
    params
}

/// `v`'s tensor, on the graph only when `tracked` (off for checkpointing's no-graph pass).
fn on_graph(v: &Var, tracked: bool) -> Tensor {
    if tracked {
        v.as_tensor().clone()
    } else {
        v.as_tensor().detach()
    }
}

/// Row norms `[out, 1]` of an f32 `[out, in]` weight.
pub(crate) fn row_norms(w: &Tensor) -> Result<Tensor> {
    Ok(w.sqr()?.sum_keepdim(1)?.sqrt()?)
}

/// DoRA's rescaling of an adapted weight `merged = W + delta`: `merged m / |merged|` per
/// output row. PEFT takes the norm as a constant in backward and adds no epsilon;
/// LyCORIS differentiates it, plus f32's eps.
fn dora_rescale(kind: AdapterKind, merged: &Tensor, magnitude: &Tensor) -> Result<Tensor> {
    Ok(merged.broadcast_mul(&dora_factor(kind, merged, magnitude)?)?)
}

/// `m / |merged|` per output row, `[out, 1]` (see [`dora_rescale`]).
fn dora_factor(kind: AdapterKind, merged: &Tensor, magnitude: &Tensor) -> Result<Tensor> {
    let norms = row_norms(merged)?;
    let norms = match kind {
        AdapterKind::Lora => norms.detach(),
        AdapterKind::Lokr => (norms + f32::EPSILON as f64)?,
    };
    let (out, _) = merged.dims2()?;
    Ok(magnitude.reshape((out, 1))?.div(&norms)?)
}

impl LoraAdapter {
    /// Adapters on every module of `model` matched by `config.target_modules`,
    /// initialised as PEFT (LoRA: A kaiming-uniform, B zero) and LyCORIS (LoKr: w1 and
    /// w2's down factor kaiming-uniform, w2 or its up factor zero) do, DoRA's magnitude
    /// the base weight's row norms: the adapter starts as the base model. Deterministic
    /// in `seed`.
    pub fn new(config: LoraConfig, model: &DitModel, seed: u64) -> Result<Self> {
        let targets = Self::matched_modules(&config, model)?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let device = model.device();
        let mut modules = BTreeMap::new();
        for (name, w) in targets {
            let (out, inp) = w.dims2()?;
            let mut init: HashMap<String, Tensor> = match config.kind {
                AdapterKind::Lora => HashMap::from([
                    ("lora_A.weight".to_string(), kaiming_uniform(config.r, inp, &mut rng, device)?),
                    ("lora_B.weight".to_string(), Tensor::zeros((out, config.r), DType::F32, device)?),
                ]),
                AdapterKind::Lokr => Layout::of(&config, inp, out).init(config.r, &mut rng, device)?,
            };
            if config.use_dora {
                let (magnitude, shape) = expected_params(&config, inp, out).pop().expect("DoRA's magnitude is listed");
                init.insert(magnitude, row_norms(&w.to_dtype(DType::F32)?)?.reshape(shape)?);
            }
            let module = Self::assemble(&config, (inp, out), |param| {
                Ok(Var::from_tensor(&init.remove(param).expect("every expected tensor is initialised"))?)
            })?;
            modules.insert(name, module);
        }
        Ok(Self { config, modules })
    }

    /// Adapters from tensors named `<module>.<param>` as [`Self::named_tensors`] gives
    /// them (`lora_A.weight`, `lokr_w1`, `lora_magnitude_vector`, ...).
    pub fn from_tensors(
        config: LoraConfig,
        model: &DitModel,
        tensors: &HashMap<String, Tensor>,
        origin: &Path,
    ) -> Result<Self> {
        let bad = |reason: String| Error::Adapter { path: origin.to_path_buf(), reason };
        let targets = Self::matched_modules(&config, model).map_err(|e| bad(e.to_string()))?;
        let mut modules = BTreeMap::new();
        let mut known = Vec::new();
        for (name, w) in &targets {
            let (out, inp) = w.dims2()?;
            let shapes: HashMap<String, Vec<usize>> = expected_params(&config, inp, out).into_iter().collect();
            let module = Self::assemble(&config, (inp, out), |param| {
                let key = format!("{name}.{param}");
                let t = tensors.get(&key).ok_or_else(|| bad(format!("missing tensor `{key}`")))?;
                if t.dims() != shapes[param].as_slice() {
                    return Err(bad(format!("tensor `{key}` has shape {:?}, expected {:?}", t.dims(), shapes[param])));
                }
                // One NaN would make every song silence or NaN.
                if let Some(problem) = crate::finite::problem(t)? {
                    return Err(bad(format!("tensor `{key}`: {problem}")));
                }
                known.push(key);
                Ok(Var::from_tensor(&t.to_dtype(DType::F32)?.to_device(model.device())?)?)
            })?;
            modules.insert(name.clone(), module);
        }
        let mut extra: Vec<&String> = tensors.keys().filter(|k| !known.contains(k)).collect();
        if !extra.is_empty() {
            extra.sort();
            return Err(bad(format!("tensors for modules this model does not adapt: {extra:?}")));
        }
        Ok(Self { config, modules })
    }

    /// One module from its tensors, each taken by name.
    fn assemble(
        config: &LoraConfig,
        (inp, out): (usize, usize),
        mut take: impl FnMut(&str) -> Result<Var>,
    ) -> Result<Adapted> {
        let kernel = match config.kind {
            AdapterKind::Lora => Kernel::Lora { a: take("lora_A.weight")?, b: take("lora_B.weight")? },
            AdapterKind::Lokr => {
                let layout = Layout::of(config, inp, out);
                let mut half = |which: u8, product: bool| -> Result<Half> {
                    Ok(match product {
                        true => Half::Product(take(&format!("lokr_w{which}_a"))?, take(&format!("lokr_w{which}_b"))?),
                        false => Half::Whole(take(&format!("lokr_w{which}"))?),
                    })
                };
                let (w1, w2) = (half(1, layout.w1_product)?, half(2, layout.w2_product)?);
                Kernel::Lokr(Lokr { w1, w2, scale: layout.scale(config) })
            }
        };
        let magnitude = match (config.use_dora, config.kind) {
            (false, _) => None,
            (true, AdapterKind::Lora) => Some(take("lora_magnitude_vector")?),
            (true, AdapterKind::Lokr) => Some(take("dora_scale")?),
        };
        Ok(Adapted { kernel, magnitude, features: (inp, out) })
    }

    /// Reads an adapter folder: upstream's LoKr file if it holds one, else PEFT's.
    pub fn load(dir: &Path, model: &DitModel) -> Result<Self> {
        match dir.join(lycoris::WEIGHTS_FILE).is_file() {
            true => lycoris::load(dir, model),
            false => peft::load(dir, model),
        }
    }

    /// Whether `dir` holds an adapter (a PEFT or a LoKr folder).
    pub fn is_adapter_dir(dir: &Path) -> bool {
        dir.join(peft::CONFIG_FILE).is_file() || dir.join(lycoris::WEIGHTS_FILE).is_file()
    }

    /// The weights file of adapter folder `dir`: upstream's LoKr file where there is
    /// one, else PEFT's.
    pub fn weights_file(dir: &Path) -> std::path::PathBuf {
        let lokr = dir.join(lycoris::WEIGHTS_FILE);
        if lokr.is_file() {
            lokr
        } else {
            dir.join(peft::WEIGHTS_FILE)
        }
    }

    /// Writes the adapter folder its kind's tools load: PEFT's for LoRA (ACE-Step,
    /// diffusers, PEFT), upstream ACE-Step's LyCORIS file for LoKr.
    pub fn save(&self, dir: &Path) -> Result<()> {
        match self.config.kind {
            AdapterKind::Lora => peft::save(self, dir),
            AdapterKind::Lokr => lycoris::save(self, dir),
        }
    }

    /// `(<module>.<param>, var)` in a stable order: module name, then the kernel's
    /// tensors (A before B; w1 before w2), then DoRA's magnitude.
    fn named_vars(&self) -> Vec<(String, &Var)> {
        let mut all = Vec::new();
        for (name, m) in &self.modules {
            let mut params: Vec<(String, &Var)> = match &m.kernel {
                Kernel::Lora { a, b } => vec![("lora_A.weight".into(), a), ("lora_B.weight".into(), b)],
                Kernel::Lokr(k) => k.named(),
            };
            if let Some(magnitude) = &m.magnitude {
                let param = match m.kernel {
                    Kernel::Lora { .. } => "lora_magnitude_vector",
                    Kernel::Lokr(_) => "dora_scale",
                };
                params.push((param.into(), magnitude));
            }
            all.extend(params.into_iter().map(|(param, v)| (format!("{name}.{param}"), v)));
        }
        all
    }

    /// `<module>.<param>` -> tensor (f32), in [`Self::vars`]' order.
    pub fn named_tensors(&self) -> Vec<(String, Tensor)> {
        self.named_vars().into_iter().map(|(k, v)| (k, v.as_tensor().clone())).collect()
    }

    /// The trainable variables in a stable order (see [`Self::named_vars`]).
    pub fn vars(&self) -> Vec<Var> {
        self.named_vars().into_iter().map(|(_, v)| v.clone()).collect()
    }

    pub fn module_names(&self) -> impl Iterator<Item = &String> {
        self.modules.keys()
    }

    /// Each adapted module's `(in, out)` features.
    pub fn module_features(&self) -> Vec<(String, (usize, usize))> {
        self.modules.iter().map(|(name, m)| (name.clone(), m.features)).collect()
    }

    /// Whether module `name` carries an adapter.
    pub fn adapts(&self, name: &str) -> bool {
        self.modules.contains_key(name)
    }

    pub fn num_parameters(&self) -> usize {
        self.vars().iter().map(|v| v.elem_count()).sum()
    }

    /// Module `m`'s adapted weight on f32 base weight `w`: `w + change`, DoRA's rescaling
    /// of it where there is a magnitude; f32, on the graph when `tracked`.
    fn adapted_weight(&self, m: &Adapted, w: &Tensor, tracked: bool) -> Result<Tensor> {
        let merged = (w + self.change(m, tracked)?)?;
        match &m.magnitude {
            Some(magnitude) => dora_rescale(self.config.kind, &merged, &on_graph(magnitude, tracked)),
            None => Ok(merged),
        }
    }

    /// Module `m`'s adapted weight less `w`: the kernel's change itself, or DoRA's
    /// rescaled weight less `w`.
    fn weight_change(&self, m: &Adapted, w: &Tensor, tracked: bool) -> Result<Tensor> {
        match m.magnitude {
            Some(_) => Ok((self.adapted_weight(m, w, tracked)? - w)?),
            None => self.change(m, tracked),
        }
    }

    /// DoRA's factor on module `name`'s rows over base weight `base`: `m / |base + change|`
    /// `[out, 1]` as the trainer takes the norm; `None` without DoRA or an adapter there.
    pub fn dora_factor(&self, name: &str, base: &Tensor) -> Result<Option<Tensor>> {
        let Some(m) = self.modules.get(name) else {
            return Ok(None);
        };
        let Some(magnitude) = &m.magnitude else {
            return Ok(None);
        };
        let w = base.to_dtype(DType::F32)?;
        let merged = (&w + self.change(m, false)?.to_device(w.device())?)?;
        Ok(Some(dora_factor(self.config.kind, &merged, &magnitude.as_tensor().to_device(w.device())?)?))
    }

    /// Module `m`'s kernel as a weight change, f32, on the graph when `tracked`.
    fn change(&self, m: &Adapted, tracked: bool) -> Result<Tensor> {
        Ok(match &m.kernel {
            Kernel::Lora { a, b } => (on_graph(b, tracked).matmul(&on_graph(a, tracked))? * self.config.scaling())?,
            Kernel::Lokr(k) => k.delta(tracked)?,
        })
    }

    /// The adapted weight of module `name` (`W + scaling B A`, `W + scale kron(w1, w2)`,
    /// DoRA's rescaling included), in `base`'s dtype; `None` if `name` is not adapted.
    pub fn merged_weight(&self, name: &str, base: &Tensor) -> Result<Option<Tensor>> {
        let Some(m) = self.modules.get(name) else {
            return Ok(None);
        };
        Ok(Some(self.adapted_weight(m, &base.to_dtype(DType::F32)?, false)?.to_dtype(base.dtype())?))
    }

    pub fn ctx(&self, mode: LoraMode, tracked: bool) -> LoraCtx<'_> {
        LoraCtx::new(self, mode, tracked)
    }

    fn matched_modules<'m>(config: &LoraConfig, model: &'m DitModel) -> Result<BTreeMap<String, &'m Tensor>> {
        validate_config(config)?;
        let matched: BTreeMap<_, _> =
            model.adaptable_linears().into_iter().filter(|(name, _)| config.targets(name)).collect();
        if matched.is_empty() {
            return Err(Error::setting(
                "lora.target_modules",
                format!("{:?} match no module of the DiT's layers", config.target_modules),
            ));
        }
        Ok(matched)
    }
}

/// The adapter settings' ranges.
pub fn validate_config(config: &LoraConfig) -> Result<()> {
    let mut errors = SettingErrors::default();
    check_config(config, &mut errors);
    Ok(errors.into_result()?)
}

/// Notes every adapter setting out of its range, named as in run.toml (`lora.r`, ...).
pub fn check_config(config: &LoraConfig, errors: &mut SettingErrors) {
    let LoraConfig { kind, r, alpha, dropout, ref target_modules, use_rslora, factor, decompose_both, .. } = *config;
    // No fixed ceiling: the adapted layers bound it (`check_rank`, the model known), and
    // whether a large rank fits is the memory plan's verdict (train::fit).
    errors.check(r >= 1, "lora.r", || format!("the rank must be at least 1 (got {r})"));
    errors.check(alpha.is_finite() && alpha > 0.0, "lora.alpha", || format!("{alpha} must be a positive number"));
    errors.check((0.0..1.0).contains(&dropout), "lora.dropout", || format!("{dropout} must be in [0, 1)"));
    errors.check(!target_modules.is_empty(), "lora.target_modules", || {
        "no targets: choose self, cross or mlp (or module names such as q_proj)".into()
    });
    errors.check(factor == -1 || factor >= 1, "lora.factor", || {
        format!("{factor}: -1 (the most balanced split) or a whole number from 1")
    });
    match kind {
        AdapterKind::Lokr => {
            errors.check(dropout == 0.0, "lora.dropout", || {
                format!("{dropout}: LoKr trains without dropout, as LyCORIS does (set 0)")
            });
            errors.check(!use_rslora, "lora.use_rslora", || "rsLoRA scaling is for LoRA, not LoKr".into());
        }
        AdapterKind::Lora => {
            errors.check(factor == -1, "lora.factor", || format!("{factor}: only LoKr splits by a factor"));
            errors.check(!decompose_both, "lora.decompose_both", || "only LoKr decomposes both halves".into());
        }
    }
}

/// The rank against the layers `config` adapts in the DiT `dit` describes: above a
/// layer's smaller dimension, B·A (at most that rank) gains nothing and the extra
/// parameters only cost memory and time, so the setting is refused naming that layer.
/// (LoKr takes any rank: from half a half's larger side up, the half is a whole matrix.)
pub fn check_rank(config: &LoraConfig, dit: &DitConfig) -> Result<()> {
    if config.kind == AdapterKind::Lokr {
        return Ok(());
    }
    let narrowest = layer_linears(dit)
        .into_iter()
        .filter(|(name, _, _)| config.targets(name))
        .min_by_key(|(_, inp, out)| (*inp).min(*out));
    match narrowest {
        Some((name, inp, out)) if config.r > inp.min(out) => {
            let most = inp.min(out);
            let r = config.r;
            Err(Error::setting(
                "lora.r",
                format!("rank {r} is more than {most}, the smaller dimension of `{name}` ({inp} -> {out}): choose at most {most}"),
            ))
        }
        _ => Ok(()),
    }
}

/// Trainable values an adapter of `config` has on a `[out, in]` layer.
pub fn parameters_per_layer(config: &LoraConfig, inp: usize, out: usize) -> usize {
    expected_params(config, inp, out).iter().map(|(_, shape)| shape.iter().product::<usize>()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_by_group_or_module_name() {
        let parsed = parse_targets("self, mlp,q_proj,self").unwrap();
        assert_eq!(parsed.len(), 8, "{parsed:?}");
        let c = LoraConfig { target_modules: parsed, ..Default::default() };
        assert!(c.targets("layers.2.self_attn.k_proj") && c.targets("layers.2.mlp.down_proj"));
        assert!(c.targets("layers.2.cross_attn.q_proj"), "q_proj names both attentions' q");
        assert!(!c.targets("layers.2.cross_attn.k_proj"));
        let cross = LoraConfig { target_modules: parse_targets("cross").unwrap(), ..Default::default() };
        assert!(cross.targets("layers.0.cross_attn.o_proj") && !cross.targets("layers.0.self_attn.o_proj"));
        assert!(parse_targets("attn").is_ok(), "a suffix as PEFT takes it (the model then says if it matches)");
        assert!(parse_targets("self attn").unwrap_err().contains("`self attn`"));
        assert!(parse_targets(" , ").unwrap_err().starts_with("no targets"));
        let none = validate_config(&LoraConfig { target_modules: Vec::new(), ..Default::default() });
        assert!(none.unwrap_err().to_string().contains("lora.target_modules"), "an adapter that trains nothing");
    }

    #[test]
    fn suffix_matching_follows_peft() {
        let c = LoraConfig::default();
        assert!(c.targets("layers.0.self_attn.q_proj"));
        assert!(c.targets("layers.3.cross_attn.o_proj"));
        assert!(!c.targets("layers.0.mlp.up_proj"));
        assert!(!c.targets("layers.0.self_attn.xq_proj"));
    }

    #[test]
    fn a_rank_above_the_narrowest_adapted_layer_is_refused_naming_it() {
        // The demo DiT: 256 wide, its k/v projections 256 -> 128 (two KV heads of 64).
        let dit = crate::load::demo::demo_config();
        let with = |r: usize, targets: &[&str]| {
            let target_modules = targets.iter().map(|t| t.to_string()).collect();
            check_rank(&LoraConfig { r, target_modules, ..Default::default() }, &dit)
        };
        with(128, &["q_proj", "k_proj"]).unwrap();
        let err = with(129, &["q_proj", "k_proj"]).unwrap_err().to_string();
        assert_eq!(
            err,
            "setting `lora.r`: rank 129 is more than 128, the smaller dimension of \
             `layers.0.cross_attn.k_proj` (256 -> 128): choose at most 128"
        );
        // Without the narrow layers the bound is the hidden size.
        with(256, &["q_proj", "o_proj"]).unwrap();
        assert!(with(5000, &["q_proj"]).unwrap_err().to_string().contains("choose at most 256"));
    }

    #[test]
    fn rslora_scaling() {
        let mut c = LoraConfig { r: 16, alpha: 32.0, ..Default::default() };
        assert_eq!(c.scaling(), 2.0);
        c.use_rslora = true;
        assert_eq!(c.scaling(), 8.0);
    }
}

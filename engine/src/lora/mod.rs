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

use crate::model::DitModel;
use crate::trace;
use crate::{Error, Result};
use trigger::TriggerTag;

mod config;
mod forward;
pub mod lokr;
pub mod lycoris;
mod mix;
mod parts;
pub mod peft;
pub mod trigger;

pub use config::{
    check_config, check_rank, parse_targets, validate_config, AdapterKind, LoraConfig, ADAPTERS, TARGET_GROUPS,
};
pub use forward::{LoraCtx, LoraMode};
use lokr::{Half, Layout, Lokr};
pub use mix::AdapterMix;
pub use parts::{PartStrengths, MAX_PART_STRENGTH};
pub use peft::LORA_METADATA_KEY;

/// An adapter folder's settings and trigger word, read without its tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterSummary {
    pub config: LoraConfig,
    pub trigger: Option<TriggerTag>,
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
    /// The trigger word it was trained with, kept in its files.
    pub trigger: Option<TriggerTag>,
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
        Ok(Self { config, modules, trigger: None })
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
        Ok(Self { config, modules, trigger: None })
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

    /// The adapter trained with `trigger` (kept in its files when saved).
    pub fn with_trigger(self, trigger: Option<TriggerTag>) -> Self {
        Self { trigger, ..self }
    }

    /// What adapter folder `dir` holds, read from its config or header without a model:
    /// its settings and trigger word.
    pub fn describe(dir: &Path) -> Result<AdapterSummary> {
        match dir.join(lycoris::WEIGHTS_FILE).is_file() {
            true => lycoris::describe(dir),
            false => peft::describe(dir),
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
            Kernel::Lora { a, b } => {
                (trace::matmul(&on_graph(b, tracked), &on_graph(a, tracked))? * self.config.scaling())?
            }
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

/// Trainable values an adapter of `config` has on a `[out, in]` layer.
pub fn parameters_per_layer(config: &LoraConfig, inp: usize, out: usize) -> usize {
    expected_params(config, inp, out).iter().map(|(_, shape)| shape.iter().product::<usize>()).sum()
}

#[cfg(test)]
mod tests;

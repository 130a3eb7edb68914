//! LoRA adapters: injection by target-module suffix (as PEFT matches), PEFT's
//! initialisation, the forward delta with train-only dropout, PEFT directory read/write
//! and merging into base weights.
//!
//! The adapter lives beside the model, not inside it: loading another adapter replaces
//! this one and never touches the base weights.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::SettingErrors;
use crate::model::lora_linear::lora_linear;
use crate::model::weights::{diffusers_name, layer_linears};
use crate::model::{DitConfig, DitModel, LinearAdapter};
use crate::tensor_io::save_tensors_with_metadata;
use crate::{Error, Result};

/// PEFT's key prefix for a model wrapped by `get_peft_model` (ACE-Step's decoder).
const PEFT_PREFIX: &str = "base_model.model.";
/// The header key diffusers reads its LoRA config from, and the prefix of its keys
/// (diffusers' `LORA_ADAPTER_METADATA_KEY` and the ACE-Step pipeline's `transformer_name`).
pub const LORA_METADATA_KEY: &str = "lora_adapter_metadata";
const DIFFUSERS_PREFIX: &str = "transformer";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraConfig {
    /// Rank r of each adapter.
    pub r: usize,
    /// Scaling numerator: the delta is multiplied by alpha / r (alpha / sqrt(r) with rsLoRA).
    pub alpha: f64,
    /// Dropout on the adapter's input, in training only.
    pub dropout: f64,
    /// Module-name suffixes to adapt, matched as PEFT does (`name == t` or ends with `.t`).
    pub target_modules: Vec<String>,
    pub use_rslora: bool,
}

impl Default for LoraConfig {
    /// ACE-Step's UI defaults: r 64, alpha 128, dropout 0.1 on q/k/v/o.
    fn default() -> Self {
        Self {
            r: 64,
            alpha: 128.0,
            dropout: 0.1,
            target_modules: ["q_proj", "k_proj", "v_proj", "o_proj"].map(String::from).to_vec(),
            use_rslora: false,
        }
    }
}

impl LoraConfig {
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

/// One adapted linear module: `delta(x) = B(A(dropout(x))) * scaling`.
pub struct LoraModule {
    /// `[r, in]`, f32.
    pub a: Var,
    /// `[out, r]`, f32.
    pub b: Var,
}

pub struct LoraAdapter {
    pub config: LoraConfig,
    modules: BTreeMap<String, LoraModule>,
}

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
    /// Whether the LoRA tensors record a graph. Off for the no-graph forward of
    /// gradient checkpointing.
    tracked: bool,
    /// Multiplies the adapter's alpha / r (generation's adapter strength); 1 in training.
    strength: f64,
}

impl LoraAdapter {
    /// Adapters on every module of `model` matched by `config.target_modules`,
    /// initialised as PEFT does: A kaiming-uniform (a = sqrt(5)), i.e. U(-1/sqrt(in),
    /// 1/sqrt(in)); B zero. Deterministic in `seed`.
    pub fn new(config: LoraConfig, model: &DitModel, seed: u64) -> Result<Self> {
        let targets = Self::matched_modules(&config, model)?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let device = model.device();
        let mut modules = BTreeMap::new();
        for (name, (inp, out)) in targets {
            let bound = 1.0 / (inp as f64).sqrt();
            let a: Vec<f32> = (0..config.r * inp).map(|_| rng.random_range(-bound..bound) as f32).collect();
            let a = Var::from_tensor(&Tensor::from_vec(a, (config.r, inp), device)?)?;
            let b = Var::zeros((out, config.r), DType::F32, device)?;
            modules.insert(name, LoraModule { a, b });
        }
        Ok(Self { config, modules })
    }

    /// Adapters from tensors named `<module>.lora_A.weight` / `<module>.lora_B.weight`.
    pub fn from_tensors(
        config: LoraConfig,
        model: &DitModel,
        tensors: &HashMap<String, Tensor>,
        origin: &Path,
    ) -> Result<Self> {
        let bad = |reason: String| Error::Adapter { path: origin.to_path_buf(), reason };
        let targets = Self::matched_modules(&config, model).map_err(|e| bad(e.to_string()))?;
        let mut modules = BTreeMap::new();
        for (name, (inp, out)) in &targets {
            let fetch = |which: &str, shape: [usize; 2]| -> Result<Var> {
                let key = format!("{name}.{which}.weight");
                let t = tensors.get(&key).ok_or_else(|| bad(format!("missing tensor `{key}`")))?;
                if t.dims() != shape {
                    return Err(bad(format!("tensor `{key}` has shape {:?}, expected {:?}", t.dims(), shape)));
                }
                // One NaN would make every song silence or NaN.
                if let Some(problem) = crate::finite::problem(t)? {
                    return Err(bad(format!("tensor `{key}`: {problem}")));
                }
                Ok(Var::from_tensor(&t.to_dtype(DType::F32)?.to_device(model.device())?)?)
            };
            let a = fetch("lora_A", [config.r, *inp])?;
            let b = fetch("lora_B", [*out, config.r])?;
            modules.insert(name.clone(), LoraModule { a, b });
        }
        let known: Vec<String> =
            targets.keys().flat_map(|n| [format!("{n}.lora_A.weight"), format!("{n}.lora_B.weight")]).collect();
        let mut extra: Vec<&String> = tensors.keys().filter(|k| !known.contains(k)).collect();
        if !extra.is_empty() {
            extra.sort();
            return Err(bad(format!("tensors for modules this model does not adapt: {extra:?}")));
        }
        Ok(Self { config, modules })
    }

    /// Reads a PEFT adapter directory (`adapter_config.json` + `adapter_model.safetensors`),
    /// as ACE-Step's `PeftModel.from_pretrained(decoder, dir)` writes it.
    pub fn load_peft(dir: &Path, model: &DitModel) -> Result<Self> {
        let config_path = dir.join("adapter_config.json");
        let config = peft_config_from_file(&config_path)?;
        let weights_path = dir.join("adapter_model.safetensors");
        if !weights_path.is_file() {
            return Err(Error::Adapter { path: weights_path, reason: "file not found".into() });
        }
        let raw = candle_core::safetensors::load(&weights_path, &Device::Cpu).map_err(|e| Error::Adapter {
            path: weights_path.clone(),
            reason: format!("cannot read safetensors: {e}"),
        })?;
        let tensors =
            raw.into_iter().map(|(k, t)| (k.strip_prefix(PEFT_PREFIX).unwrap_or(&k).to_string(), t)).collect();
        Self::from_tensors(config, model, &tensors, &weights_path)
    }

    /// Writes a PEFT adapter directory that ACE-Step, diffusers and PEFT load.
    pub fn save_peft(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let config_path = dir.join("adapter_config.json");
        let json = serde_json::to_string_pretty(&self.peft_config_json()).expect("config serialises");
        std::fs::write(&config_path, json).map_err(|e| Error::io(&config_path, e))?;
        let tensors: HashMap<String, Tensor> =
            self.named_tensors().into_iter().map(|(k, t)| (format!("{PEFT_PREFIX}{k}"), t)).collect();
        let weights_path = dir.join("adapter_model.safetensors");
        save_tensors_with_metadata(&tensors, Some(self.header_metadata()), &weights_path)
    }

    /// The safetensors header PEFT and diffusers write: `format: pt`, and diffusers'
    /// `lora_adapter_metadata` (its ACE-Step loader takes alpha, rank and rsLoRA only
    /// from there and otherwise applies the adapter at alpha = r): the LoRA config
    /// under `transformer.`-prefixed keys with diffusers' module names, as JSON with
    /// sorted keys and two-space indent, as `json.dumps(.., indent=2, sort_keys=True)`.
    /// Its dropout is 0: diffusers injects the LoRA layers in training mode into a
    /// model the user already put in eval mode, so a dropout there would run at
    /// inference (two identical forwards differ, and neither matches the merged weights).
    pub fn header_metadata(&self) -> HashMap<String, String> {
        let c = &self.config;
        let mut targets: Vec<String> = c.target_modules.iter().map(|t| diffusers_target(t)).collect();
        targets.sort();
        let fields = [
            ("alpha_pattern", serde_json::json!({})),
            ("bias", "none".into()),
            ("fan_in_fan_out", false.into()),
            ("init_lora_weights", true.into()),
            ("lora_alpha", c.alpha.into()),
            ("lora_dropout", 0.0.into()),
            ("peft_type", "LORA".into()),
            ("r", c.r.into()),
            ("rank_pattern", serde_json::json!({})),
            ("target_modules", targets.into()),
            ("use_dora", false.into()),
            ("use_rslora", c.use_rslora.into()),
        ];
        let packed: BTreeMap<String, serde_json::Value> =
            fields.into_iter().map(|(k, v)| (format!("{DIFFUSERS_PREFIX}.{k}"), v)).collect();
        let json = serde_json::to_string_pretty(&packed).expect("metadata serialises");
        HashMap::from([("format".to_string(), "pt".to_string()), (LORA_METADATA_KEY.to_string(), json)])
    }

    fn peft_config_json(&self) -> serde_json::Value {
        let c = &self.config;
        serde_json::json!({
            "peft_type": "LORA",
            "task_type": "FEATURE_EXTRACTION",
            "r": c.r,
            "lora_alpha": c.alpha,
            // The training setting stays here: PEFT loads it with `inference_mode`
            // (dropout off), ACE-Step and PEFT users who train on keep it, and
            // `load_peft` reads it back.
            "lora_dropout": c.dropout,
            "target_modules": c.target_modules,
            "bias": "none",
            "use_rslora": c.use_rslora,
            "use_dora": false,
            "fan_in_fan_out": false,
            "init_lora_weights": true,
            "inference_mode": true,
            "modules_to_save": null,
            "base_model_name_or_path": null,
            "rank_pattern": {},
            "alpha_pattern": {},
        })
    }

    /// `<module>.lora_A.weight` / `.lora_B.weight` -> tensor (f32), sorted by module.
    pub fn named_tensors(&self) -> Vec<(String, Tensor)> {
        self.modules
            .iter()
            .flat_map(|(name, m)| {
                [
                    (format!("{name}.lora_A.weight"), m.a.as_tensor().clone()),
                    (format!("{name}.lora_B.weight"), m.b.as_tensor().clone()),
                ]
            })
            .collect()
    }

    /// The trainable variables in a stable order (module name, then A before B).
    pub fn vars(&self) -> Vec<Var> {
        self.modules.values().flat_map(|m| [m.a.clone(), m.b.clone()]).collect()
    }

    pub fn module_names(&self) -> impl Iterator<Item = &String> {
        self.modules.keys()
    }

    /// Whether module `name` carries an adapter.
    pub fn adapts(&self, name: &str) -> bool {
        self.modules.contains_key(name)
    }

    pub fn num_parameters(&self) -> usize {
        self.vars().iter().map(|v| v.elem_count()).sum()
    }

    /// `W + scaling * B A` for an adapted module; `None` if `name` is not adapted.
    pub fn merged_weight(&self, name: &str, base: &Tensor) -> Result<Option<Tensor>> {
        let Some(m) = self.modules.get(name) else {
            return Ok(None);
        };
        let delta = (m.b.as_tensor().matmul(m.a.as_tensor())? * self.config.scaling())?;
        Ok(Some((base.to_dtype(DType::F32)? + delta)?.to_dtype(base.dtype())?))
    }

    pub fn ctx(&self, mode: LoraMode, tracked: bool) -> LoraCtx<'_> {
        LoraCtx { adapter: self, mode, tracked, strength: 1.0 }
    }

    fn matched_modules(config: &LoraConfig, model: &DitModel) -> Result<BTreeMap<String, (usize, usize)>> {
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

/// A target-module suffix under diffusers' names (`q_proj` -> `to_q`, `self_attn.o_proj`
/// -> `self_attn.to_out.0`); names diffusers shares (`mlp.up_proj`) stay as they are.
fn diffusers_target(target: &str) -> String {
    diffusers_name(&format!(".{target}.")).trim_matches('.').to_string()
}

/// The LoRA settings' ranges.
pub fn validate_config(config: &LoraConfig) -> Result<()> {
    let mut errors = SettingErrors::default();
    check_config(config, &mut errors);
    Ok(errors.into_result()?)
}

/// Notes every LoRA setting out of its range, named as in run.toml (`lora.r`, ...).
pub fn check_config(config: &LoraConfig, errors: &mut SettingErrors) {
    let LoraConfig { r, alpha, dropout, ref target_modules, .. } = *config;
    // No fixed ceiling: the adapted layers bound it (`check_rank`, the model known), and
    // whether a large rank fits is the memory plan's verdict (train::fit).
    errors.check(r >= 1, "lora.r", || format!("the rank must be at least 1 (got {r})"));
    errors.check(alpha.is_finite() && alpha > 0.0, "lora.alpha", || format!("{alpha} must be a positive number"));
    errors.check((0.0..1.0).contains(&dropout), "lora.dropout", || format!("{dropout} must be in [0, 1)"));
    errors.check(!target_modules.is_empty(), "lora.target_modules", || {
        "no targets: choose self, cross or mlp (or module names such as q_proj)".into()
    });
}

/// The rank against the layers `config` adapts in the DiT `dit` describes: above a
/// layer's smaller dimension, B·A (at most that rank) gains nothing and the extra
/// parameters only cost memory and time, so the setting is refused naming that layer.
pub fn check_rank(config: &LoraConfig, dit: &DitConfig) -> Result<()> {
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

fn peft_config_from_file(path: &Path) -> Result<LoraConfig> {
    let bad = |reason: String| Error::Adapter { path: path.to_path_buf(), reason };
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
    if v["peft_type"].as_str() != Some("LORA") {
        return Err(bad(format!("peft_type is {}, expected \"LORA\"", v["peft_type"])));
    }
    if v["use_dora"].as_bool() == Some(true) {
        return Err(bad("DoRA adapters are not supported".into()));
    }
    if v.get("bias").and_then(|b| b.as_str()).is_some_and(|b| b != "none") {
        return Err(bad(format!("bias = {} is not supported (only \"none\")", v["bias"])));
    }
    for pattern in ["rank_pattern", "alpha_pattern"] {
        if v[pattern].as_object().is_some_and(|o| !o.is_empty()) {
            return Err(bad(format!("{pattern} is not supported")));
        }
    }
    let target_modules = match &v["target_modules"] {
        serde_json::Value::Array(items) => items
            .iter()
            .map(|t| t.as_str().map(String::from).ok_or_else(|| bad("target_modules must be strings".into())))
            .collect::<Result<Vec<_>>>()?,
        other => return Err(bad(format!("target_modules must be a list of names, found {other}"))),
    };
    let r = v["r"].as_u64().ok_or_else(|| bad("missing integer `r`".into()))? as usize;
    Ok(LoraConfig {
        r,
        alpha: v["lora_alpha"].as_f64().unwrap_or(8.0),
        dropout: v["lora_dropout"].as_f64().unwrap_or(0.0),
        target_modules,
        use_rslora: v["use_rslora"].as_bool().unwrap_or(false),
    })
}

impl LoraCtx<'_> {
    /// The same adapter with its delta multiplied by `strength` (0 adds nothing, 1 is
    /// the adapter as trained).
    pub fn with_strength(self, strength: f64) -> Self {
        Self { strength, ..self }
    }
}

impl LinearAdapter for LoraCtx<'_> {
    /// Whether module `name` carries an adapter.
    fn adapts(&self, name: &str) -> bool {
        self.adapter.adapts(name)
    }

    /// Module `name` with weight `w` applied to `x`, its LoRA delta included, or `None`
    /// when the module is not adapted. LoRA tensors are f32 and cast to the compute
    /// dtype here.
    fn linear(&self, name: &str, x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
        let Some(m) = self.adapter.modules.get(name) else {
            return Ok(None);
        };
        let config = &self.adapter.config;
        let mask = match self.mode {
            LoraMode::Train { dropout_seed } if config.dropout > 0.0 => {
                Some(dropout_mask(dropout_seed, name, x, config.dropout)?)
            }
            _ => None,
        };
        let weight = |v: &Var| -> Result<Tensor> {
            let t = if self.tracked { v.as_tensor().clone() } else { v.as_tensor().detach() };
            Ok(t.to_dtype(x.dtype())?)
        };
        let (a, b) = (weight(&m.a)?, weight(&m.b)?);
        Ok(Some(lora_linear(x, w, &a, &b, config.scaling() * self.strength, mask.as_ref())?))
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

    #[test]
    fn dropout_mask_is_deterministic_and_has_the_right_rate() -> Result<()> {
        let x = Tensor::zeros((4, 1000), DType::F32, &Device::Cpu)?;
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

//! An adapter's settings (`[lora]` in run.toml): LoRA or LoKr, rank, alpha, targets,
//! DoRA, and the checks of their ranges, alone and against a model's layers.

use serde::{Deserialize, Serialize};

use crate::error::SettingErrors;
use crate::model::weights::layer_linears;
use crate::model::DitConfig;
use crate::{Error, Result};

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

//! What a model is, as the catalog, `models list`, `inspect` and the app name it: its
//! size class (2B or XL, from the DiT's shape in config.json: a folder may be renamed,
//! so never from its name) and how it was trained (turbo, base or SFT).

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The DiT's size class. ACE-Step 1.5's 2B DiT is 24 layers of width 2048; the XL
/// (4B) one 32 layers of width 2560.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ModelSize {
    #[serde(rename = "2b")]
    TwoB,
    #[serde(rename = "xl")]
    Xl,
    /// Any other shape (the demo model, test models, a config.json without the fields).
    #[serde(rename = "other")]
    Other,
}

impl ModelSize {
    pub fn from_shape(hidden_size: usize, layers: usize) -> Self {
        match (hidden_size, layers) {
            (2048, 24) => ModelSize::TwoB,
            (2560, 32) => ModelSize::Xl,
            _ => ModelSize::Other,
        }
    }

    /// From a DiT's config.json as read (the fields missing: `Other`).
    fn of_json(config: &Value) -> Self {
        let field = |k: &str| config.get(k).and_then(Value::as_u64).map(|v| v as usize);
        match (field("hidden_size"), field("num_hidden_layers")) {
            (Some(hidden), Some(layers)) => Self::from_shape(hidden, layers),
            _ => ModelSize::Other,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            ModelSize::TwoB => "2B",
            ModelSize::Xl => "XL",
            ModelSize::Other => "custom-size",
        }
    }
}

/// How the DiT was trained: distilled to 8 steps without guidance (turbo), or the base
/// model and its supervised fine-tune, sampled with guidance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Flavor {
    Turbo,
    Base,
    Sft,
    /// config.json says none of them and the folder's name neither.
    Unknown,
}

impl Flavor {
    /// `is_turbo`, then `model_version` (`turbo`, `xl_sft`, ...), then the folder's name.
    fn of_json(config: &Value, dit_dir: &Path) -> Self {
        let version = config.get("model_version").and_then(Value::as_str).unwrap_or_default().to_ascii_lowercase();
        let named = |text: &str| {
            [(Flavor::Turbo, "turbo"), (Flavor::Sft, "sft"), (Flavor::Base, "base")]
                .into_iter()
                .find(|(_, word)| text.contains(word))
                .map(|(flavor, _)| flavor)
        };
        match config.get("is_turbo").and_then(Value::as_bool) {
            Some(true) => return Flavor::Turbo,
            Some(false) if version.is_empty() => return Flavor::Base,
            _ => {}
        }
        if !version.is_empty() {
            return named(&version).unwrap_or(Flavor::Unknown);
        }
        let name = dit_dir.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
        named(&name).unwrap_or(Flavor::Unknown)
    }

    pub fn name(self) -> &'static str {
        match self {
            Flavor::Turbo => "turbo",
            Flavor::Base => "base",
            Flavor::Sft => "sft",
            Flavor::Unknown => "unknown",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Flavor::Sft => "SFT",
            Flavor::Unknown => "of unknown variant",
            other => other.name(),
        }
    }
}

/// A model's size class and flavor: "XL turbo", "2B SFT".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelKind {
    pub size: ModelSize,
    pub flavor: Flavor,
}

impl ModelKind {
    /// From a DiT folder's config.json as read.
    pub fn of_config(config: &Value, dit_dir: &Path) -> Self {
        ModelKind { size: ModelSize::of_json(config), flavor: Flavor::of_json(config, dit_dir) }
    }

    /// Reads `<dit_dir>/config.json`; an unreadable one tells neither size nor flavor
    /// (beyond the folder's name), and the model's check says why.
    pub fn of_dit_folder(dit_dir: &Path) -> Self {
        let config = std::fs::read(dit_dir.join("config.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null);
        Self::of_config(&config, dit_dir)
    }

    pub fn label(self) -> String {
        format!("{} {}", self.size.label(), self.flavor.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kind(config: Value, folder: &str) -> ModelKind {
        ModelKind::of_config(&config, Path::new(folder))
    }

    #[test]
    fn size_comes_from_the_shape_not_the_folder_name() {
        let xl = json!({"hidden_size": 2560, "num_hidden_layers": 32, "model_version": "turbo"});
        let two_b = json!({"hidden_size": 2048, "num_hidden_layers": 24, "is_turbo": false});
        assert_eq!(kind(xl.clone(), "acestep-v15-turbo"), ModelKind { size: ModelSize::Xl, flavor: Flavor::Turbo });
        assert_eq!(kind(two_b, "acestep-v15-xl-base").size, ModelSize::TwoB);
        assert_eq!(kind(json!({"hidden_size": 2560, "num_hidden_layers": 24}), "x").size, ModelSize::Other);
        assert_eq!(kind(json!({"hidden_size": 32, "num_hidden_layers": 2}), "x").size, ModelSize::Other);
        assert_eq!(kind(Value::Null, "acestep-v15-xl-turbo").size, ModelSize::Other);
        assert_eq!(kind(xl, "x").label(), "XL turbo");
    }

    #[test]
    fn flavor_from_is_turbo_then_model_version_then_the_name() {
        let flavor = |config: Value, folder: &str| kind(config, folder).flavor;
        assert_eq!(flavor(json!({"is_turbo": true, "model_version": "base"}), "x"), Flavor::Turbo);
        assert_eq!(flavor(json!({"is_turbo": false, "model_version": "xl_sft"}), "x"), Flavor::Sft);
        assert_eq!(flavor(json!({"model_version": "XL_base"}), "acestep-v15-turbo"), Flavor::Base);
        assert_eq!(flavor(json!({"is_turbo": false}), "acestep-v15-turbo"), Flavor::Base);
        assert_eq!(flavor(json!({}), "acestep-v15-sft"), Flavor::Sft);
        assert_eq!(flavor(json!({"model_version": "v2"}), "acestep-v15-sft"), Flavor::Unknown);
        assert_eq!(flavor(Value::Null, "mine"), Flavor::Unknown);
        let sft = ModelKind { size: ModelSize::TwoB, flavor: Flavor::Sft };
        assert_eq!(sft.label(), "2B SFT");
    }
}

//! The user's training settings: defaults, validation, and persistence as JSON in the
//! platform config dir (`settings.json`), written atomically (temp file + rename).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Which base model to train against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelChoice {
    /// The small built-in demo model (no download, weight-free latent encoder).
    Demo,
    /// An ACE-Step 1.5 model folder on disk (config.json + safetensors).
    Folder { path: PathBuf },
}

/// Compute precision. `Auto` follows the engine's policy (CPU f32; Metal bf16 where
/// supported, else f16; CUDA bf16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    Auto,
    F32,
    Bf16,
    F16,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// The folder of songs last chosen (only ever read).
    pub dataset_dir: Option<PathBuf>,
    pub model: ModelChoice,
    /// Recompute each block in backward instead of keeping its activations.
    pub gradient_checkpointing: bool,
    /// Encode each song to latents once and reuse them across epochs and runs.
    pub latent_cache: bool,
    pub precision: Precision,
    /// Let the engine choose gradient checkpointing, batch, precision and crop length
    /// for this machine's memory (its `fit auto`); the window's default.
    pub fit_memory: bool,
    pub rank: u32,
    pub alpha: f64,
    pub dropout: f64,
    pub learning_rate: f64,
    pub epochs: u32,
    pub batch_size: u32,
    pub grad_accumulation: u32,
    /// Save a checkpoint every this many optimizer steps.
    pub save_every: u32,
    pub seed: u64,
    // The run settings below are passed to the engine as they are: `None` takes the
    // engine's default, and the engine judges the values (`RunConfig::validate`).
    /// Share of samples trained on the model's null condition (CFG dropout).
    pub cfg_dropout: Option<f64>,
    /// Share of the songs held out for validation.
    pub val_fraction: Option<f64>,
    /// Validation loss every this many steps (with songs held out).
    pub val_every_steps: Option<u64>,
    /// Finish after this many validations without a better loss.
    pub patience: Option<u64>,
    /// A preview song every this many steps (and one of the base model first).
    pub preview_every_steps: Option<u64>,
    /// Seconds of each preview.
    pub preview_seconds: Option<f64>,
    /// The previews' caption.
    pub preview_caption: Option<String>,
}

impl Default for Settings {
    /// ACE-Step's LoRA defaults: rank 64, alpha 128, dropout 0.1, lr 3e-4.
    fn default() -> Self {
        Settings {
            dataset_dir: None,
            model: ModelChoice::Demo,
            gradient_checkpointing: true,
            latent_cache: true,
            precision: Precision::Auto,
            fit_memory: true,
            rank: 64,
            alpha: 128.0,
            dropout: 0.1,
            learning_rate: 3e-4,
            epochs: 10,
            batch_size: 1,
            grad_accumulation: 1,
            save_every: 200,
            seed: 42,
            cfg_dropout: None,
            val_fraction: None,
            val_every_steps: None,
            patience: None,
            preview_every_steps: None,
            preview_seconds: None,
            preview_caption: None,
        }
    }
}

/// Field name -> what is wrong with it.
pub type FieldErrors = BTreeMap<String, String>;

/// Largest seed the web view can represent exactly (2^53 - 1).
pub const MAX_SEED: u64 = (1 << 53) - 1;

impl Settings {
    /// Checks every field; returns all problems at once so the UI can mark each one.
    pub fn validate(&self) -> Result<(), FieldErrors> {
        let mut e = FieldErrors::new();
        let mut bad = |field: &str, msg: String| {
            e.insert(field.to_string(), msg);
        };
        if !(1..=1024).contains(&self.rank) {
            bad("rank", format!("rank must be between 1 and 1024 (got {})", self.rank));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0 && self.alpha <= 100_000.0) {
            bad("alpha", format!("alpha must be a positive number (got {})", self.alpha));
        }
        if !(self.dropout.is_finite() && (0.0..1.0).contains(&self.dropout)) {
            bad("dropout", format!("dropout must be at least 0 and below 1 (got {})", self.dropout));
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0 && self.learning_rate <= 1.0) {
            bad("learning_rate", format!("learning rate must be above 0 and at most 1 (got {})", self.learning_rate));
        }
        if !(1..=100_000).contains(&self.epochs) {
            bad("epochs", format!("epochs must be between 1 and 100000 (got {})", self.epochs));
        }
        if !(1..=1024).contains(&self.batch_size) {
            bad("batch_size", format!("batch size must be between 1 and 1024 (got {})", self.batch_size));
        }
        if !(1..=1024).contains(&self.grad_accumulation) {
            bad(
                "grad_accumulation",
                format!("gradient accumulation must be between 1 and 1024 (got {})", self.grad_accumulation),
            );
        }
        if self.save_every == 0 {
            bad("save_every", "save every must be at least 1 step".to_string());
        }
        if self.seed > MAX_SEED {
            bad("seed", format!("seed must be at most {MAX_SEED}"));
        }
        if let ModelChoice::Folder { path } = &self.model {
            if path.as_os_str().is_empty() {
                bad("model", "choose a model folder, or the built-in demo model".to_string());
            }
        }
        if e.is_empty() {
            Ok(())
        } else {
            Err(e)
        }
    }
}

/// Where settings live: the engine's config folder (`OSTINATO_CONFIG_DIR` overrides the
/// platform's; tests use it to stay out of the real one), where the CLI keeps the
/// model folders the user added too.
pub fn default_config_dir() -> PathBuf {
    ostinato_engine::load::places::config_dir()
}

pub fn settings_path(config_dir: &Path) -> PathBuf {
    config_dir.join("settings.json")
}

/// Loads settings; a missing file gives the defaults. A file that cannot be read or
/// parsed also gives the defaults, plus a notice for the user saying why.
pub fn load(config_dir: &Path) -> (Settings, Option<String>) {
    let path = settings_path(config_dir);
    match std::fs::read(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Settings::default(), None),
        Err(e) => (Settings::default(), Some(format!("could not read {}: {e}; using defaults", path.display()))),
        Ok(bytes) => match serde_json::from_slice::<Settings>(&bytes) {
            Ok(s) => match s.validate() {
                Ok(()) => (s, None),
                Err(errs) => (
                    Settings::default(),
                    Some(format!(
                        "settings in {} are invalid ({}); using defaults",
                        path.display(),
                        errs.values().cloned().collect::<Vec<_>>().join("; ")
                    )),
                ),
            },
            Err(e) => (Settings::default(), Some(format!("could not parse {}: {e}; using defaults", path.display()))),
        },
    }
}

/// Writes settings atomically: a crash mid-write never leaves a half file.
pub fn save(config_dir: &Path, settings: &Settings) -> std::io::Result<()> {
    std::fs::create_dir_all(config_dir)?;
    let path = settings_path(config_dir);
    let tmp = config_dir.join("settings.json.tmp");
    let json = serde_json::to_vec_pretty(settings).map_err(std::io::Error::other)?;
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&json)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_ace_step_lora_defaults_and_valid() {
        let s = Settings::default();
        assert_eq!((s.rank, s.alpha, s.dropout, s.learning_rate), (64, 128.0, 0.1, 3e-4));
        assert!(s.gradient_checkpointing && s.latent_cache);
        s.validate().unwrap();
    }

    #[test]
    fn validation_names_every_bad_field() {
        let s = Settings { rank: 0, dropout: 1.0, learning_rate: f64::NAN, batch_size: 0, ..Default::default() };
        let e = s.validate().unwrap_err();
        assert_eq!(
            e.keys().map(String::as_str).collect::<Vec<_>>(),
            ["batch_size", "dropout", "learning_rate", "rank"]
        );
        assert!(e["rank"].contains("between 1 and 1024"), "{e:?}");
    }

    #[test]
    fn round_trips_and_survives_garbage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()), (Settings::default(), None));
        let s = Settings {
            gradient_checkpointing: false,
            model: ModelChoice::Folder { path: "/models/acestep".into() },
            precision: Precision::Bf16,
            ..Default::default()
        };
        save(dir.path(), &s).unwrap();
        assert_eq!(load(dir.path()), (s, None));
        std::fs::write(settings_path(dir.path()), b"{not json").unwrap();
        let (loaded, notice) = load(dir.path());
        assert_eq!(loaded, Settings::default());
        assert!(notice.unwrap().contains("could not parse"));
    }

    #[test]
    fn missing_fields_take_defaults() {
        let s: Settings = serde_json::from_str(r#"{"rank": 8}"#).unwrap();
        assert_eq!(s.rank, 8);
        assert_eq!(s.alpha, 128.0);
    }
}

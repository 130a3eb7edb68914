//! `RunConfig`: everything a run needs, saved as `run.toml` in the run directory.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::loss_scale::LossScaleConfig;
use super::optim::AdamWConfig;
use super::schedule::{LrSchedule, TimestepSampling};
use crate::data::DataSpec;
use crate::device::Precision;
use crate::lora::LoraConfig;
use crate::model::source::ModelSource;
use crate::{Error, Result};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// The run directory is `<runs_dir>/<name>`.
    pub name: String,
    pub runs_dir: PathBuf,
    pub model: ModelSource,
    pub data: DataSpec,
    pub lora: LoraConfig,
    pub optimizer: AdamWConfig,
    /// Peak learning rate.
    pub lr: f64,
    pub lr_schedule: LrSchedule,
    /// Timestep sampling; `None` takes the model's default (turbo: shift 3).
    pub timesteps: Option<TimestepSampling>,
    pub epochs: u64,
    /// Bound on optimizer updates for the whole run (the schedule spans it).
    pub max_steps: Option<u64>,
    /// Stop (resumably) once this many updates are applied, as the Stop button would.
    pub stop_at_step: Option<u64>,
    pub batch_size: usize,
    /// Batches whose gradients are summed into one update.
    pub grad_accum: usize,
    /// Global-norm gradient clipping.
    pub max_grad_norm: f64,
    /// The run fails after this many non-finite steps in a row.
    pub max_consecutive_skips: u32,
    /// Dynamic loss scaling, used with f16 compute only.
    pub loss_scale: LossScaleConfig,
    pub seed: u64,
    pub precision: Precision,
    /// Train on the CPU even where a GPU is available.
    pub force_cpu: bool,
    /// Recompute each block in backward instead of keeping its activations.
    pub gradient_checkpointing: bool,
    /// Encode every song once and keep its latents in the content-addressed cache.
    pub latent_cache: bool,
    /// Where the latent cache lives; `None` is the platform cache directory.
    pub cache_dir: Option<PathBuf>,
    pub save_every_steps: Option<u64>,
    pub save_every_epochs: Option<u64>,
    /// Step checkpoints kept besides `final/`.
    pub keep_checkpoints: usize,
}

impl Default for RunConfig {
    /// ACE-Step's trainer defaults where it has them (AdamW wd 0.01, warmup-cosine,
    /// clip 1.0) and its UI's LoRA defaults (r 64, alpha 128, dropout 0.1, lr 3e-4).
    fn default() -> Self {
        Self {
            name: String::new(),
            runs_dir: default_runs_dir(),
            model: ModelSource::Demo,
            data: DataSpec::default(),
            lora: LoraConfig::default(),
            optimizer: AdamWConfig::default(),
            lr: 3e-4,
            lr_schedule: LrSchedule::default(),
            timesteps: None,
            epochs: 10,
            max_steps: None,
            stop_at_step: None,
            batch_size: 1,
            grad_accum: 1,
            max_grad_norm: 1.0,
            max_consecutive_skips: 20,
            loss_scale: LossScaleConfig::default(),
            seed: 42,
            precision: Precision::Auto,
            force_cpu: false,
            gradient_checkpointing: true,
            latent_cache: true,
            cache_dir: None,
            save_every_steps: Some(100),
            save_every_epochs: None,
            keep_checkpoints: 3,
        }
    }
}

/// The platform's data directory for runs (e.g. `~/.local/share/ostinato/runs`).
pub fn default_runs_dir() -> PathBuf {
    directories::ProjectDirs::from("app", "Ostinato", "ostinato")
        .map(|d| d.data_dir().join("runs"))
        .unwrap_or_else(|| PathBuf::from("runs"))
}

impl RunConfig {
    pub fn run_dir(&self) -> PathBuf {
        self.runs_dir.join(&self.name)
    }

    /// Reads a TOML config; an unknown key is an error naming it.
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        toml::from_str(&text).map_err(|e| Error::BadFile {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("RunConfig serialises to TOML")
    }

    /// Settings that make no sense, before anything is loaded; the error names the
    /// field as run.toml spells it.
    pub fn validate(&self) -> Result<()> {
        if self.name.is_empty() || self.name.contains(['/', '\\']) || self.name.starts_with('.') {
            return Err(Error::setting("name", format!("`{}` must be a plain, non-empty folder name", self.name)));
        }
        for (field, value) in [("batch_size", self.batch_size), ("grad_accum", self.grad_accum), ("keep_checkpoints", self.keep_checkpoints)] {
            if value == 0 {
                return Err(Error::setting(field, "must be at least 1"));
            }
        }
        if self.epochs == 0 {
            return Err(Error::setting("epochs", "must be at least 1"));
        }
        for (field, value) in [("lr", self.lr), ("max_grad_norm", self.max_grad_norm)] {
            if !(value.is_finite() && value > 0.0) {
                return Err(Error::setting(field, format!("{value} must be a positive number")));
            }
        }
        crate::lora::validate_config(&self.lora)?;
        self.data.validate()
    }

    /// A stable hash of the settings that determine the training trajectory; resume
    /// refuses a checkpoint written under different ones. `stop_at_step` is excluded:
    /// it only says where to stop.
    pub fn trajectory_hash(&self) -> String {
        let mut c = self.clone();
        c.stop_at_step = None;
        c.runs_dir = PathBuf::new();
        blake3::hash(c.to_toml().as_bytes()).to_hex()[..16].to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_round_trip_and_unknown_keys_are_named() {
        let c = RunConfig { name: "r".into(), ..Default::default() };
        let back: RunConfig = toml::from_str(&c.to_toml()).unwrap();
        assert_eq!(back, c);
        let err = toml::from_str::<RunConfig>("name = \"x\"\nlearning_rate = 1.0\n").unwrap_err();
        assert!(err.to_string().contains("learning_rate"), "{err}");
    }

    #[test]
    fn hash_ignores_where_to_stop() {
        let a = RunConfig { name: "r".into(), ..Default::default() };
        let b = RunConfig { stop_at_step: Some(5), ..a.clone() };
        let c = RunConfig { lr: 1e-3, ..a.clone() };
        assert_eq!(a.trajectory_hash(), b.trajectory_hash());
        assert_ne!(a.trajectory_hash(), c.trajectory_hash());
    }
}

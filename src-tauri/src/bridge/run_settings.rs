//! The app's settings as the engine's run configuration, and the engine's judgement of
//! them named on the settings' own fields.

use std::path::{Path, PathBuf};

use ostinato_engine::device::Precision as EnginePrecision;
use ostinato_engine::load::source::ModelSource;
use ostinato_engine::train::config::default_run_name;
use ostinato_engine::train::RunConfig;
use ostinato_engine::Error as EngineError;

use super::{BridgeError, StartRequest};
use crate::settings::{ModelChoice, Precision, Settings};

pub(super) fn run_config(req: &StartRequest) -> RunConfig {
    let s = &req.settings;
    let mut c = RunConfig {
        name: default_run_name(),
        runs_dir: req.runs_dir.clone(),
        model: match &s.model {
            ModelChoice::Demo => ModelSource::Demo,
            ModelChoice::Folder { path } => ModelSource::Folder { path: path.clone() },
        },
        gradient_checkpointing: s.gradient_checkpointing,
        latent_cache: s.latent_cache,
        precision: match s.precision {
            Precision::Auto => EnginePrecision::Auto,
            Precision::F32 => EnginePrecision::F32,
            Precision::Bf16 => EnginePrecision::Bf16,
            Precision::F16 => EnginePrecision::F16,
        },
        lr: s.learning_rate,
        epochs: s.epochs as u64,
        batch_size: s.batch_size as usize,
        grad_accum: s.grad_accumulation as usize,
        save_every_steps: Some(s.save_every as u64),
        seed: s.seed,
        cfg_dropout: s.cfg_dropout,
        val_fraction: s.val_fraction,
        val_every_steps: s.val_every_steps,
        patience: s.patience,
        preview_every_steps: s.preview_every_steps,
        preview_seconds: s.preview_seconds,
        preview_caption: s.preview_caption.clone(),
        ..RunConfig::default()
    };
    c.data.folder = req.dataset_dir.clone();
    c.lora.r = s.rank as usize;
    c.lora.alpha = s.alpha;
    c.lora.dropout = s.dropout;
    c
}

/// The engine's judgement of the settings a run would get; a setting it refuses is
/// marked on its field.
pub fn check_run_settings(settings: &Settings, runs_dir: &Path) -> Result<(), BridgeError> {
    let req =
        StartRequest { settings: settings.clone(), dataset_dir: PathBuf::new(), runs_dir: runs_dir.to_path_buf() };
    match run_config(&req).validate() {
        Ok(()) => Ok(()),
        Err(EngineError::Setting { field, reason }) => {
            let field = match field.as_str() {
                "lr" => "learning_rate",
                "grad_accum" => "grad_accumulation",
                "save_every_steps" => "save_every",
                other => other,
            };
            Err(BridgeError::InvalidSettings([(field.to_string(), reason)].into()))
        }
        Err(e) => Err(BridgeError::Invalid(e.to_string())),
    }
}

//! Checkpoints: the adapter plus everything needed to continue exactly, written
//! crash-safely, and read back with a fallback to an older checkpoint only when the
//! newest is unreadable.
//!
//! ```text
//! checkpoints/step-NNNNNN/adapter/{adapter_config.json, adapter_model.safetensors}
//! checkpoints/step-NNNNNN/training_state.safetensors   AdamW moments (f32) and step
//! checkpoints/step-NNNNNN/training_state.json          positions, counters, scaler, hashes
//! ```
//! A checkpoint is written under `.tmp-*`, every file fsynced, then renamed into place
//! and the directory fsynced: a crash or a full disk never leaves a half checkpoint
//! under a `step-*` name.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::Device;
use serde::{Deserialize, Serialize};

use super::loss_scale::{LossScaler, SkipCounter};
use crate::lora::LoraAdapter;
use crate::tensor_io::save_tensors;
use crate::{Error, Result};

pub const ENGINE_VERSION: &str = env!("CARGO_PKG_VERSION");
const STATE_JSON: &str = "training_state.json";
const STATE_TENSORS: &str = "training_state.safetensors";

/// Where the run is and every counter that shapes what comes next. Random numbers
/// are not stored as generator states: every generator is seeded from (`seed`,
/// `attempts`, micro-batch) for noise, timesteps and dropout, from (`seed`, epoch)
/// for the shuffle and from (`seed`, epoch, item) for crops, so these positions are
/// the complete RNG state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingState {
    pub engine_version: String,
    /// `RunConfig::trajectory_hash` of the run that wrote it.
    pub config_hash: String,
    pub seed: u64,
    /// Optimizer updates applied (also the learning-rate scheduler's position).
    pub step: u64,
    /// Steps attempted, applied or skipped.
    pub attempts: u64,
    pub epoch: u64,
    /// Index of the next batch within the epoch.
    pub batch_in_epoch: usize,
    /// This epoch's shuffled sample order.
    pub epoch_order: Vec<usize>,
    /// Sum and count of this epoch's applied losses, for its `epoch_end` mean.
    pub epoch_loss_sum: f64,
    pub epoch_loss_count: u64,
    pub last_loss: Option<f64>,
    pub loss_scaler: LossScaler,
    pub skips: SkipCounter,
    /// Training seconds so far, pauses excluded.
    pub elapsed_s: f64,
    /// The lowest validation loss so far, whose adapter is `best/adapter`.
    #[serde(default)]
    pub best: Option<BestValidation>,
    /// Validations since the best one, for early stopping.
    #[serde(default)]
    pub validations_since_best: u64,
}

/// The step and loss of the best validation so far.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BestValidation {
    pub step: u64,
    pub loss: f64,
}

/// A checkpoint read back: its state, adapter tensors and optimizer tensors.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub state: TrainingState,
    pub adapter: LoraAdapter,
    pub optimizer_state: HashMap<String, candle_core::Tensor>,
}

pub fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

fn step_dir_name(step: u64) -> String {
    format!("step-{step:06}")
}

/// Writes checkpoint `state.step` and keeps the newest `keep` step checkpoints.
pub fn save_checkpoint(
    run_dir: &Path,
    state: &TrainingState,
    adapter: &LoraAdapter,
    optimizer_tensors: Vec<(String, candle_core::Tensor)>,
    keep: usize,
) -> Result<PathBuf> {
    let root = checkpoints_dir(run_dir);
    let target = root.join(step_dir_name(state.step));
    write_atomically(&root, &target, |tmp| {
        adapter.save(&tmp.join("adapter"))?;
        let tensors: HashMap<String, candle_core::Tensor> = optimizer_tensors.into_iter().collect();
        let path = tmp.join(STATE_TENSORS);
        save_tensors(&tensors, &path)?;
        let json = serde_json::to_vec_pretty(state).expect("state serialises");
        let path = tmp.join(STATE_JSON);
        std::fs::write(&path, json).map_err(|e| Error::io(&path, e))
    })?;
    prune(&root, keep)?;
    Ok(target)
}

/// Writes the run's `final/adapter` (replacing an older one) the same crash-safe way.
pub fn save_final_adapter(run_dir: &Path, adapter: &LoraAdapter) -> Result<PathBuf> {
    save_named_adapter(run_dir, "final", adapter)
}

/// Writes the run's `best/adapter` (replacing an older one) the same crash-safe way.
pub fn save_best_adapter(run_dir: &Path, adapter: &LoraAdapter) -> Result<PathBuf> {
    save_named_adapter(run_dir, "best", adapter)
}

fn save_named_adapter(run_dir: &Path, name: &str, adapter: &LoraAdapter) -> Result<PathBuf> {
    let target = run_dir.join(name);
    write_atomically(run_dir, &target, |tmp| adapter.save(&tmp.join("adapter")))?;
    Ok(target.join("adapter"))
}

/// Builds `target` in a temporary sibling with `fill`, fsyncs it, renames it into place.
fn write_atomically(parent: &Path, target: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    let name = target.file_name().and_then(|n| n.to_str()).expect("target has a name");
    let tmp = parent.join(format!(".tmp-{name}"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    fill(&tmp)?;
    fsync_tree(&tmp)?;
    if target.exists() {
        // Same step written twice (pause, then stop): the new one replaces it.
        std::fs::remove_dir_all(target).map_err(|e| Error::io(target, e))?;
    }
    std::fs::rename(&tmp, target).map_err(|e| Error::io(target, e))?;
    fsync_dir(parent)
}

fn fsync_tree(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        if path.is_dir() {
            fsync_tree(&path)?;
        } else {
            File::open(&path).and_then(|f| f.sync_all()).map_err(|e| Error::io(&path, e))?;
        }
    }
    fsync_dir(dir)
}

fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|f| f.sync_all()).map_err(|e| Error::io(dir, e))
}

/// Step checkpoint directories, newest first.
pub fn list_checkpoints(run_dir: &Path) -> Result<Vec<PathBuf>> {
    Ok(step_checkpoints(run_dir)?.into_iter().map(|(_, p)| p).collect())
}

/// The adapter folder of the checkpoint of `step` (there or not).
pub fn step_adapter_dir(run_dir: &Path, step: u64) -> PathBuf {
    checkpoints_dir(run_dir).join(step_dir_name(step)).join("adapter")
}

/// The steps whose checkpoint keeps an adapter folder, newest first (older ones are
/// pruned: `keep_checkpoints`).
pub fn kept_adapter_steps(run_dir: &Path) -> Result<Vec<u64>> {
    Ok(step_checkpoints(run_dir)?
        .into_iter()
        .map(|(step, _)| step)
        .filter(|s| step_adapter_dir(run_dir, *s).is_dir())
        .collect())
}

/// An adapter folder a run keeps, to listen with: its final one, its best (the lowest
/// validation loss), or a kept checkpoint's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeptAdapter {
    /// `final`, `best` or `step`.
    pub kind: &'static str,
    /// The checkpoint's step (kind `step`).
    pub step: Option<u64>,
    pub path: PathBuf,
}

/// Every adapter the run in `run_dir` keeps: final, best, then its checkpoints' newest first.
pub fn kept_adapters(run_dir: &Path) -> Result<Vec<KeptAdapter>> {
    let named = ["final", "best"].into_iter().map(|kind| KeptAdapter {
        kind,
        step: None,
        path: run_dir.join(kind).join("adapter"),
    });
    let steps = kept_adapter_steps(run_dir)?.into_iter().map(|step| KeptAdapter {
        kind: "step",
        step: Some(step),
        path: step_adapter_dir(run_dir, step),
    });
    Ok(named.filter(|a| a.path.is_dir()).chain(steps).collect())
}

/// Step checkpoint directories with their steps, newest first.
fn step_checkpoints(run_dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let root = checkpoints_dir(run_dir);
    if !root.is_dir() {
        return Ok(Vec::new());
    }
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(&root)
        .map_err(|e| Error::io(&root, e))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let step = name.strip_prefix("step-")?.parse().ok()?;
            Some((step, e.path()))
        })
        .collect();
    found.sort_by_key(|c| std::cmp::Reverse(c.0));
    Ok(found)
}

fn prune(root: &Path, keep: usize) -> Result<()> {
    let run_dir = root.parent().expect("checkpoints dir has a parent");
    for old in list_checkpoints(run_dir)?.into_iter().skip(keep) {
        std::fs::remove_dir_all(&old).map_err(|e| Error::io(&old, e))?;
    }
    Ok(())
}

/// Reads one checkpoint; any missing or corrupt file is an error naming it.
pub fn load_checkpoint(dir: &Path, model: &crate::model::DitModel) -> Result<Checkpoint> {
    let state: TrainingState = crate::error::read_json(&dir.join(STATE_JSON))?;
    let adapter = LoraAdapter::load(&dir.join("adapter"), model)?;
    let tensors_path = dir.join(STATE_TENSORS);
    if !tensors_path.is_file() {
        return Err(Error::io(&tensors_path, std::io::Error::new(std::io::ErrorKind::NotFound, "file not found")));
    }
    let optimizer_state = candle_core::safetensors::load(&tensors_path, &Device::Cpu)
        .map_err(|e| Error::BadFile { path: tensors_path.clone(), reason: format!("corrupt training state: {e}") })?;
    Ok(Checkpoint { dir: dir.to_path_buf(), state, adapter, optimizer_state })
}

/// The newest readable checkpoint, with a warning for each newer one that was not;
/// an error naming the file when none is readable (or there is none).
pub fn load_latest(run_dir: &Path, model: &crate::model::DitModel) -> Result<(Checkpoint, Vec<String>)> {
    let mut warnings = Vec::new();
    let mut first_error = None;
    for dir in list_checkpoints(run_dir)? {
        match load_checkpoint(&dir, model) {
            Ok(c) => return Ok((c, warnings)),
            Err(e) => {
                warnings
                    .push(format!("checkpoint {} is unreadable ({e}); falling back to an older one", dir.display()));
                first_error.get_or_insert(e);
            }
        }
    }
    Err(first_error.unwrap_or_else(|| Error::BadFile {
        path: checkpoints_dir(run_dir),
        reason: "no checkpoint to resume from".into(),
    }))
}

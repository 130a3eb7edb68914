//! The events every front end consumes, and the run's append-only `events.jsonl`.
//!
//! Each line of the log is one event: `{"v": 1, "type": "step", "step": 12, ...}`.
//! A past run is replayed from its log alone, so charts need no engine.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use crate::data::IssueKind;
use crate::{Error, Result};

/// The schema version written on every line (`"v"`). Bump it when a field changes
/// meaning or a required field is added. (`dataset_file`, `DatasetIssue::kind`,
/// `DatasetSummary::seconds_in_files`, `RunStarted::timestep_levels`, `Step::samples` and
/// `Preview::prompt` came later, optional: older logs still read.)
pub const SCHEMA_VERSION: u32 = 1;

/// Which memory-saving mechanisms a run uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryFeatures {
    /// Blocks are recomputed in backward from their saved inputs instead of keeping
    /// every activation.
    pub gradient_checkpointing: bool,
    /// Block inputs are made tracked leaves during recompute, so gradients reach every
    /// block (ACE-Step's `xt.requires_grad_(True)` fallback).
    pub block_input_grad_path: bool,
    /// Latents and conditioning come from the content-addressed cache.
    pub latent_cache: bool,
    /// The run's predicted peak memory (`train::fit`); absent in older logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_peak_bytes: Option<u64>,
    /// The memory the device offered when the run started, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<crate::metrics::MachineMemory>,
}

/// What preparing the dataset found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetSummary {
    /// Audio files found in the folder.
    pub files: u64,
    /// Files that became training samples.
    pub usable: u64,
    /// Files left out (each reported by a `dataset_issue` event of kind `skipped`).
    pub skipped: u64,
    /// Samples read from the latent cache.
    pub cache_hits: u64,
    /// Samples encoded (and then cached).
    pub cache_misses: u64,
    /// Seconds of audio trained on each epoch: the usable files after cuts and crops
    /// (logs without `seconds_in_files`: the whole files).
    pub total_seconds: f64,
    /// Seconds the usable files hold, before cuts; absent in older logs.
    #[serde(default)]
    pub seconds_in_files: Option<f64>,
}

/// One sample of a step: the noise level it was trained at and its own loss, so a
/// replay can tell which noise levels the adapter learns.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SampleLoss {
    /// The flow-matching timestep t the sample was noised at (1: pure noise).
    pub t: f32,
    /// The sample's MSE over its valid frames. A batch's loss is the mean of its
    /// samples' weighted by valid frames; the step's, the mean of its batches'.
    pub loss: f32,
}

/// One thing that happened in a run. Serialized with `"type"` as the tag, in
/// snake_case (`run_started`, `step`, ...). Numbers are finite: a non-finite step is
/// reported by `step_skipped`, never by `step`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// Training begins (also after a resume).
    RunStarted {
        /// The resolved run configuration (as in run.toml).
        config: serde_json::Value,
        /// The device trained on, with the reason for the choice, e.g. "cpu (Metal unavailable)".
        device: String,
        /// The compute dtype of the base model: "f32", "bf16", "f16" or "f32, weights held
        /// in bf16" (`Precision::describe`).
        precision: String,
        /// Memory-saving mechanisms in use.
        memory: MemoryFeatures,
        /// The adapter trained, as the engine describes it (`LoKr + DoRA r 4 alpha 8`);
        /// empty in older logs.
        #[serde(default)]
        adapter: String,
        /// Elements in the trained adapter tensors.
        trainable_params: u64,
        /// Elements in the whole model, base plus LoRA.
        total_params: u64,
        /// Share of samples trained on the null condition (CFG dropout), resolved
        /// from the model's default when the config names none; 0 in older logs.
        #[serde(default)]
        cfg_dropout: f64,
        /// The timesteps samples are drawn from when the run draws from a fixed set
        /// (turbo: its 8-step schedule), as the trainer uses them (f32); absent when t is
        /// drawn from a continuous distribution (base/SFT), and in older logs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timestep_levels: Option<Vec<f32>>,
        /// What the dataset preparation found.
        dataset: DatasetSummary,
        /// Optimizer updates the whole run will apply (the schedule's length).
        total_steps: u64,
    },
    /// Dataset preparation moved on: a file begins (or all are done), or, with
    /// `seconds_total`, a tile of `file` was encoded.
    DatasetProgress {
        /// Files prepared so far.
        done: u64,
        /// Files to prepare.
        total: u64,
        /// The file being prepared (the folder once all are done).
        file: PathBuf,
        /// Seconds of `file` encoded so far (per-tile events only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seconds_done: Option<f64>,
        /// Seconds of `file` to encode (per-tile events only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seconds_total: Option<f64>,
    },
    /// A file of the dataset is skipped, or something about a used one is ignored or
    /// looks wrong (`kind` says which).
    DatasetIssue {
        /// The file at fault.
        file: PathBuf,
        /// Why, in words for the user.
        reason: String,
        /// Skipped (the default: older logs reported only skipped files) or a warning.
        #[serde(default)]
        kind: IssueKind,
    },
    /// A song of the dataset is used: how much of it training sees.
    DatasetFile {
        /// The song.
        file: PathBuf,
        /// Seconds trained on each epoch (after the cut or crop).
        seconds_used: f64,
        /// Seconds the file decodes to.
        seconds_in_file: f64,
        /// How it is cut, in words ("cut to 240 s ..."); absent when used whole.
        note: Option<String>,
        /// ACE-Step's text prompt the song is trained with (caption and metas);
        /// absent in older logs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt: Option<String>,
    },
    /// An optimizer update was applied.
    Step {
        /// Updates applied so far, this one included (1-based).
        step: u64,
        /// The epoch this update belongs to (0-based).
        epoch: u64,
        /// The training loss of this update (f32 MSE, averaged over accumulated batches).
        loss: f64,
        /// The learning rate this update used.
        lr: f64,
        /// Global L2 norm of the gradients before clipping.
        grad_norm: f64,
        /// Training throughput over recent steps, in samples per second.
        samples_per_sec: f64,
        /// Memory in use now, in bytes: process RSS on CPU, allocated device memory on GPUs.
        memory_now_bytes: u64,
        /// Highest memory in use so far, in bytes (same source as `memory_now_bytes`).
        memory_peak_bytes: u64,
        /// Seconds spent training in this run, pauses excluded.
        elapsed_s: f64,
        /// Estimated seconds to the end of the run; absent until there is a rate to go by.
        eta_s: Option<f64>,
        /// Each sample's timestep and loss, in training order; absent in older logs.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        samples: Vec<SampleLoss>,
    },
    /// An update was not applied because its loss or gradients were not finite.
    StepSkipped {
        /// The update number that was skipped (the next `step` reuses it).
        step: u64,
        /// Why, e.g. "non-finite gradients".
        reason: String,
        /// Skips in a row, this one included.
        consecutive: u32,
        /// The loss scale after the skip (1 without dynamic loss scaling).
        loss_scale: f64,
    },
    /// An epoch ended.
    EpochEnd {
        /// The epoch that ended (0-based).
        epoch: u64,
        /// Updates applied so far.
        step: u64,
        /// Mean loss of the epoch's applied updates; absent when none was applied.
        mean_loss: Option<f64>,
    },
    /// A checkpoint was written (and renamed into place).
    CheckpointSaved {
        /// Updates applied at the checkpoint.
        step: u64,
        /// The checkpoint directory.
        path: PathBuf,
    },
    /// A preview song was written at a step boundary: the base model before step 1,
    /// then the adapter in training every `preview_every_steps`.
    Preview {
        /// Updates applied when it was made (0: the base model).
        step: u64,
        /// Which of the run's preview prompts it is (0: the first, or the only one).
        #[serde(default)]
        prompt: usize,
        /// The WAV file, relative to the run directory (`previews/step-000100.wav`).
        path: PathBuf,
        /// The caption it was made from.
        caption: String,
        /// The noise seed, the same for every preview of the run.
        seed: u64,
        /// Its length.
        seconds: f64,
        /// Seconds it took to make (sampling and decoding), outside the training time.
        took_s: f64,
    },
    /// The run paused at a step boundary (after writing a checkpoint).
    Paused {
        /// Updates applied so far.
        step: u64,
    },
    /// A paused run continues.
    Resumed {
        /// Updates applied so far.
        step: u64,
    },
    /// Something the user should know that does not stop the run.
    Warning {
        /// The warning, in words for the user.
        message: String,
    },
    /// The loss on the held-out clips at fixed timesteps and noise.
    Validation {
        /// Updates applied when it was measured.
        step: u64,
        loss: f64,
        /// The lowest so far: `best/adapter` now holds this step's adapter.
        #[serde(default)]
        best: bool,
    },
    /// The run completed all its steps.
    Finished {
        /// The final adapter directory.
        adapter_path: PathBuf,
        /// Updates applied in total.
        steps: u64,
        /// Loss of the last applied update; absent when none was applied.
        final_loss: Option<f64>,
        /// Why it ended before its last step (early stopping); absent when it ran to the end.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// The run was stopped before the end (by the user or `stop_at_step`); it can be resumed.
    Stopped {
        /// Updates applied so far.
        step: u64,
        /// The adapter written on stop; absent when no update was applied yet (an
        /// untrained adapter is no result). Logs from before it could be absent hold a path.
        #[serde(default)]
        adapter_path: Option<PathBuf>,
    },
    /// The run could not continue; the last checkpoint is its last good state.
    Failed {
        /// Updates applied before the failure.
        step: u64,
        /// Why, in words for the user.
        reason: String,
    },
}

/// One line of the log: the schema version beside the event's own fields.
#[derive(Serialize, Deserialize)]
struct Line<E> {
    v: u32,
    #[serde(flatten)]
    event: E,
}

/// Appends events to a run's `events.jsonl`, one flushed line each.
pub struct EventLog {
    file: File,
    path: PathBuf,
}

impl EventLog {
    /// Opens (or creates) the log for appending. A torn last line left by a crash
    /// mid-write is cut off first, so the next event starts on a line of its own.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let io = |e| Error::io(&path, e);
        let mut file = OpenOptions::new().read(true).append(true).create(true).open(&path).map_err(io)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io)?;
        if bytes.last().is_some_and(|&b| b != b'\n') {
            let keep = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            // Appends go to the end of the file as it is then: no seek needed.
            file.set_len(keep as u64).map_err(io)?;
        }
        Ok(Self { file, path })
    }

    /// Appends one event as a line and flushes it. The line goes out in a single
    /// write, so a crash leaves at most one torn line at the end.
    pub fn append(&mut self, event: &Event) -> Result<()> {
        let mut line = to_json_line(event).into_bytes();
        line.push(b'\n');
        let io = |e| Error::io(&self.path, e);
        self.file.write_all(&line).map_err(io)?;
        self.file.flush().map_err(io)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Replays a log. A last line without its newline that does not parse is a write
/// torn by a crash and is dropped; any other bad line is an error naming its number.
pub fn read_events(path: &Path) -> Result<Vec<Event>> {
    let text = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let mut lines: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
    // What follows the last newline: nothing, or an unterminated last line.
    let tail = lines.pop().filter(|l| !l.is_empty());
    let mut events = Vec::with_capacity(lines.len() + 1);
    for (i, line) in lines.iter().enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        events.push(parse_line(line).map_err(|reason| Error::EventLog {
            path: path.to_path_buf(),
            line: i + 1,
            reason,
        })?);
    }
    if let Some(Ok(event)) = tail.map(parse_line) {
        events.push(event);
    }
    Ok(events)
}

/// For a replay: drops what a resumed run logs again, from `step` on. After a crash
/// the run resumes from its last checkpoint and logs some steps (and validations)
/// again; the later replace the earlier.
pub(crate) fn drop_redone<T>(out: &mut Vec<T>, step: u64, step_of: impl Fn(&T) -> u64) {
    while out.last().is_some_and(|p| step_of(p) >= step) {
        out.pop();
    }
}

/// One event as its log line (without the newline): `{"v":1,"type":...}`.
pub fn to_json_line(event: &Event) -> String {
    serde_json::to_string(&Line { v: SCHEMA_VERSION, event }).expect("events serialise: their numbers are finite")
}

fn parse_line(line: &[u8]) -> std::result::Result<Event, String> {
    let Line { v, event } = serde_json::from_slice::<Line<Event>>(line).map_err(|e| e.to_string())?;
    if v > SCHEMA_VERSION {
        return Err(format!("schema version {v} is newer than this engine's {SCHEMA_VERSION}"));
    }
    Ok(event)
}

#[cfg(test)]
mod tests;

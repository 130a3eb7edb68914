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
/// `DatasetSummary::seconds_in_files`, `RunStarted::timestep_levels` and `Step::samples` came
/// later, optional: older logs still read.)
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
mod tests {
    use super::*;

    fn step(n: u64, loss: f64) -> Event {
        Event::Step {
            step: n,
            epoch: 0,
            loss,
            lr: 1e-4,
            grad_norm: 0.5,
            samples_per_sec: 2.0,
            memory_now_bytes: 1 << 20,
            memory_peak_bytes: 2 << 20,
            elapsed_s: n as f64,
            eta_s: None,
            samples: vec![SampleLoss { t: 0.75, loss: loss as f32 }],
        }
    }

    fn every_kind() -> Vec<Event> {
        vec![
            Event::RunStarted {
                config: serde_json::json!({"lr": 3e-4, "rank": 64}),
                device: "cpu".into(),
                precision: "f32".into(),
                memory: MemoryFeatures {
                    gradient_checkpointing: true,
                    block_input_grad_path: true,
                    latent_cache: false,
                    predicted_peak_bytes: Some(3 << 30),
                    machine: None,
                },
                adapter: "LoRA r 64 alpha 128".into(),
                trainable_params: 1000,
                total_params: 100_000,
                cfg_dropout: 0.15,
                timestep_levels: Some(vec![1.0, 0.5, 0.3]),
                dataset: DatasetSummary {
                    files: 3,
                    usable: 2,
                    skipped: 1,
                    cache_hits: 1,
                    cache_misses: 1,
                    total_seconds: 61.5,
                    seconds_in_files: Some(300.0),
                },
                total_steps: 40,
            },
            Event::DatasetProgress { done: 1, total: 3, file: "a.wav".into(), seconds_done: None, seconds_total: None },
            Event::DatasetProgress {
                done: 1,
                total: 3,
                file: "b.wav".into(),
                seconds_done: Some(10.0),
                seconds_total: Some(240.5),
            },
            Event::DatasetIssue { file: "b.mp3".into(), reason: "cannot decode".into(), kind: IssueKind::Skipped },
            Event::DatasetIssue {
                file: "a.json".into(),
                reason: "field \"bpm\" = \"fast\" is not a number: ignored; the song is used".into(),
                kind: IssueKind::Warning,
            },
            Event::DatasetFile {
                file: "a.wav".into(),
                seconds_used: 240.0,
                seconds_in_file: 505.0,
                note: Some("cut to 240 s".into()),
                prompt: Some("# Caption\nlofi\n".into()),
            },
            step(1, 0.9),
            Event::StepSkipped { step: 2, reason: "non-finite gradients".into(), consecutive: 1, loss_scale: 32768.0 },
            Event::EpochEnd { epoch: 0, step: 1, mean_loss: Some(0.9) },
            Event::CheckpointSaved { step: 1, path: "checkpoints/step-000001".into() },
            Event::Preview {
                step: 2,
                path: "previews/step-000002.wav".into(),
                caption: "calm piano".into(),
                seed: 7,
                seconds: 1.0,
                took_s: 0.5,
            },
            Event::Paused { step: 1 },
            Event::Resumed { step: 1 },
            Event::Warning { message: "fell back to an older checkpoint".into() },
            Event::Finished { adapter_path: "final/adapter".into(), steps: 1, final_loss: Some(0.9), reason: None },
            Event::Validation { step: 1, loss: 0.8, best: true },
            Event::Stopped { step: 1, adapter_path: Some("final/adapter".into()) },
            Event::Stopped { step: 0, adapter_path: None },
            Event::Failed { step: 1, reason: "20 consecutive non-finite steps".into() },
        ]
    }

    #[test]
    fn lines_are_tagged_and_versioned() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        EventLog::open(&path).unwrap().append(&step(3, 0.25)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let value: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(value["v"], 1);
        assert_eq!(value["type"], "step");
        assert_eq!(value["step"], 3);
        assert_eq!(value["loss"], 0.25);
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn every_event_round_trips_through_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let events = every_kind();
        let mut log = EventLog::open(&path).unwrap();
        for e in &events[..5] {
            log.append(e).unwrap();
        }
        drop(log);
        // Reopening appends after what is there.
        let mut log = EventLog::open(&path).unwrap();
        for e in &events[5..] {
            log.append(e).unwrap();
        }
        assert_eq!(read_events(&path).unwrap(), events);
    }

    #[test]
    fn torn_last_line_is_dropped_and_cut_on_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let mut log = EventLog::open(&path).unwrap();
        log.append(&step(1, 0.5)).unwrap();
        log.append(&step(2, 0.4)).unwrap();
        drop(log);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"v":1,"type":"step","step":3,"ep"#).unwrap();
        drop(f);
        assert_eq!(read_events(&path).unwrap(), [step(1, 0.5), step(2, 0.4)]);

        let mut log = EventLog::open(&path).unwrap();
        log.append(&step(3, 0.3)).unwrap();
        assert_eq!(read_events(&path).unwrap(), [step(1, 0.5), step(2, 0.4), step(3, 0.3)]);
    }

    #[test]
    fn a_stop_without_an_adapter_reads_back_and_old_stops_keep_theirs() {
        let old = r#"{"v":1,"type":"stopped","step":3,"adapter_path":"runs/r/final/adapter"}"#;
        let parsed = parse_line(old.as_bytes()).unwrap();
        assert_eq!(parsed, Event::Stopped { step: 3, adapter_path: Some("runs/r/final/adapter".into()) });
        let untrained = Event::Stopped { step: 0, adapter_path: None };
        let line = to_json_line(&untrained);
        assert!(line.contains(r#""adapter_path":null"#), "{line}");
        assert_eq!(parse_line(line.as_bytes()).unwrap(), untrained);
        assert_eq!(parse_line(br#"{"v":1,"type":"stopped","step":0}"#).unwrap(), untrained);
    }

    #[test]
    fn complete_last_line_without_newline_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        std::fs::write(&path, r#"{"v":1,"type":"paused","step":4}"#).unwrap();
        assert_eq!(read_events(&path).unwrap(), [Event::Paused { step: 4 }]);
    }

    #[test]
    fn corrupt_middle_line_names_its_number() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let good = r#"{"v":1,"type":"paused","step":4}"#;
        std::fs::write(&path, format!("{good}\n{good}\n{{garbage\n{good}\n")).unwrap();
        let err = read_events(&path).unwrap_err();
        assert!(matches!(err, Error::EventLog { line: 3, .. }), "{err}");
        assert!(err.to_string().contains("events.jsonl:3"), "{err}");
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        std::fs::write(&path, "{\"v\":2,\"type\":\"paused\",\"step\":4}\n").unwrap();
        let err = read_events(&path).unwrap_err();
        assert!(err.to_string().contains("schema version 2"), "{err}");
    }

    /// Older logs: issues without a kind were skipped files; the summary had no
    /// `seconds_in_files`; run_started had no `cfg_dropout` (they trained without) and
    /// no `timestep_levels`; steps had no per-sample `samples`.
    #[test]
    fn older_dataset_events_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let issue = r#"{"v":1,"type":"dataset_issue","file":"b.mp3","reason":"cannot decode"}"#;
        let summary = r#"{"files":1,"usable":1,"skipped":0,"cache_hits":0,"cache_misses":1,"total_seconds":12.5}"#;
        let started = format!(
            r#"{{"v":1,"type":"run_started","config":{{}},"device":"cpu","precision":"f32","memory":{{"gradient_checkpointing":true,"block_input_grad_path":true,"latent_cache":true}},"trainable_params":1,"total_params":2,"dataset":{summary},"total_steps":3}}"#
        );
        let step = r#"{"v":1,"type":"step","step":1,"epoch":0,"loss":0.5,"lr":0.001,"grad_norm":1.0,"samples_per_sec":2.0,"memory_now_bytes":1,"memory_peak_bytes":2,"elapsed_s":3.0,"eta_s":null}"#;
        std::fs::write(&path, format!("{issue}\n{started}\n{step}\n")).unwrap();
        let events = read_events(&path).unwrap();
        assert!(matches!(&events[0], Event::DatasetIssue { kind: IssueKind::Skipped, .. }));
        assert!(matches!(
            &events[1],
            Event::RunStarted { dataset: DatasetSummary { seconds_in_files: None, total_seconds, .. }, .. } if *total_seconds == 12.5
        ));
        assert!(
            matches!(&events[1], Event::RunStarted { cfg_dropout, timestep_levels: None, .. } if *cfg_dropout == 0.0)
        );
        assert!(matches!(&events[2], Event::Step { samples, loss, .. } if samples.is_empty() && *loss == 0.5));
        // And a new step line without samples is the old line.
        assert!(!to_json_line(&events[2]).contains("samples\""), "{}", to_json_line(&events[2]));
    }
}

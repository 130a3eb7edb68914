//! Past and present runs in a runs directory, summarised from their files alone
//! (`run.toml`, `events.jsonl`, `final/`, the live marker's lock), so
//! any front end can list them without the engine running them.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::lock;
use crate::events::read_events;
use crate::run_state::RunState;
pub use crate::run_state::RunStatus;
use crate::{Error, Result};

#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub name: String,
    pub dir: PathBuf,
    pub status: RunStatus,
    /// Optimizer updates applied (per the newest step event).
    pub steps: u64,
    pub total_steps: Option<u64>,
    pub last_loss: Option<f64>,
    /// The final adapter, once written.
    pub adapter: Option<PathBuf>,
    /// The step and loss of the lowest validation loss (`best/adapter`), once measured.
    pub best_step: Option<u64>,
    pub best_loss: Option<f64>,
    /// Whether [`Run::resume`](crate::train::Run::resume) can continue it: it is not
    /// finished and not in the hands of a live process. One without a checkpoint (stopped
    /// or killed before its first) resumes from the start.
    pub resumable: bool,
    /// Why the run failed (its `failed` event) or is damaged.
    pub reason: Option<String>,
    /// When the run last changed: the modification time of its `events.jsonl` (else of
    /// its `run.toml`), in seconds since the Unix epoch. For ordering runs by recency.
    pub updated_unix: Option<u64>,
}

/// Summaries of every run directory under `runs_dir`, newest name last.
pub fn list_runs(runs_dir: &Path) -> Result<Vec<RunSummary>> {
    if !runs_dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut runs = Vec::new();
    for entry in std::fs::read_dir(runs_dir).map_err(|e| Error::io(runs_dir, e))? {
        let dir = entry.map_err(|e| Error::io(runs_dir, e))?.path();
        if dir.join("run.toml").is_file() {
            runs.push(summarise(&dir));
        }
    }
    runs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(runs)
}

/// One run's summary; a log that cannot be read makes it `damaged`, not an error.
pub fn summarise(dir: &Path) -> RunSummary {
    let log = dir.join("events.jsonl");
    let events = if log.exists() { read_events(&log) } else { Ok(Vec::new()) };
    let (state, damaged) = match events {
        Ok(events) => (RunState::replay(&events), None),
        Err(e) => (RunState::default(), Some(e.to_string())),
    };
    let told = if damaged.is_some() { RunStatus::Damaged } else { state.status };
    let status = on_disk(told, is_live(dir));
    RunSummary {
        name: dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        dir: dir.to_path_buf(),
        status,
        steps: state.steps,
        total_steps: state.total_steps(),
        last_loss: state.last_loss(),
        adapter: Some(dir.join("final/adapter")).filter(|p| p.is_dir()),
        best_step: state.best.map(|b| b.0),
        best_loss: state.best.map(|b| b.1),
        resumable: !matches!(status, RunStatus::Running | RunStatus::Paused | RunStatus::Finished),
        reason: damaged.or(state.reason),
        updated_unix: modified_unix(&log).or_else(|| modified_unix(&dir.join("run.toml"))),
    }
}

/// The status its events tell, given whether a process trains the run now.
fn on_disk(told: RunStatus, live: bool) -> RunStatus {
    match (told, live) {
        (RunStatus::Paused, true) => RunStatus::Paused,
        (_, true) => RunStatus::Running,
        // Paused, then the process went away (the app was quit): resumable as stopped.
        (RunStatus::Paused, false) => RunStatus::Stopped,
        // Begun and never ended, and no process has it: a crash or a kill.
        (RunStatus::Idle | RunStatus::Running, false) => RunStatus::Interrupted,
        (other, false) => other,
    }
}

fn modified_unix(path: &Path) -> Option<u64> {
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok()?;
    modified.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs())
}

/// Whether a process trains the run now: it holds the run's lock.
pub fn is_live(dir: &Path) -> bool {
    lock::is_locked(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Event, EventLog};

    /// A run with a checkpoint at the last step of `events` (as every ended run has).
    fn run(runs: &Path, name: &str, events: &[Event]) -> PathBuf {
        let dir = bare_run(runs, name, events);
        checkpoint(&dir);
        dir
    }

    fn bare_run(runs: &Path, name: &str, events: &[Event]) -> PathBuf {
        let dir = runs.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("run.toml"), "").unwrap();
        let mut log = EventLog::open(dir.join("events.jsonl")).unwrap();
        for e in events {
            log.append(e).unwrap();
        }
        dir
    }

    fn checkpoint(dir: &Path) {
        std::fs::create_dir_all(dir.join("checkpoints/step-000001")).unwrap();
    }

    fn step(step: u64, loss: f64) -> Event {
        Event::Step {
            step,
            epoch: 0,
            loss,
            lr: 1e-3,
            grad_norm: 1.0,
            samples_per_sec: 1.0,
            memory_now_bytes: 0,
            memory_peak_bytes: 0,
            elapsed_s: 1.0,
            eta_s: None,
            samples: Vec::new(),
        }
    }

    #[test]
    fn status_resumability_and_update_time() {
        let tmp = tempfile::tempdir().unwrap();
        let runs = tmp.path();
        let stopped = Event::Stopped { step: 2, adapter_path: Some("a".into()) };
        let finished = Event::Finished { adapter_path: "a".into(), steps: 3, final_loss: Some(0.3), reason: None };
        let failed = Event::Failed { step: 1, reason: "x".into() };
        run(runs, "a-stopped", &[step(1, 0.9), step(2, 0.8), stopped]);
        run(runs, "b-finished", &[step(3, 0.3), finished]);
        run(runs, "c-failed", &[step(1, 0.9), failed]);
        run(runs, "d-crashed", &[step(1, 0.9)]);
        // Paused by a process that is gone: resumable as stopped.
        run(runs, "e-paused", &[step(1, 0.9), Event::Paused { step: 1 }]);
        // Trained by this (live) process: neither resumable nor interrupted.
        let live = run(runs, "f-live", &[step(1, 0.9)]);
        let _lock = lock::RunLock::acquire(&live).unwrap();
        std::fs::create_dir_all(runs.join("not-a-run")).unwrap();

        let list = list_runs(runs).unwrap();
        let got: Vec<_> = list.iter().map(|r| (r.name.as_str(), r.status, r.steps, r.resumable)).collect();
        assert_eq!(
            got,
            [
                ("a-stopped", RunStatus::Stopped, 2, true),
                ("b-finished", RunStatus::Finished, 3, false),
                ("c-failed", RunStatus::Failed, 1, true),
                ("d-crashed", RunStatus::Interrupted, 1, true),
                ("e-paused", RunStatus::Stopped, 1, true),
                ("f-live", RunStatus::Running, 1, false),
            ]
        );
        assert_eq!(list[0].last_loss, Some(0.8));
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        for r in &list {
            let t = r.updated_unix.expect("an update time");
            assert!(t <= now && t + 600 > now, "{}: {t} vs {now}", r.name);
        }
        // Without a log, run.toml's time stands in.
        let bare = runs.join("g-bare");
        std::fs::create_dir_all(&bare).unwrap();
        std::fs::write(bare.join("run.toml"), "").unwrap();
        checkpoint(&bare);
        let s = summarise(&bare);
        assert!(s.updated_unix.is_some() && s.resumable && s.status == RunStatus::Interrupted);
    }

    /// The summary is the run's `RunState` (status, steps, losses, best, failure) read
    /// together with its files.
    #[test]
    fn a_summary_tells_what_the_run_state_of_its_log_tells() {
        let tmp = tempfile::tempdir().unwrap();
        let events = [
            step(1, 0.9),
            Event::Validation { step: 1, loss: 0.8, best: true },
            step(2, 0.7),
            Event::Validation { step: 2, loss: 0.85, best: false },
            // Resumed from the checkpoint at step 1: step 2 again, then a failure.
            step(2, 0.6),
            Event::Failed { step: 2, reason: "out of memory".into() },
        ];
        let dir = run(tmp.path(), "resumed-then-failed", &events);
        let s = summarise(&dir);
        let state = RunState::replay(&events);
        assert_eq!((s.status, s.steps, s.last_loss), (state.status, state.steps, state.last_loss()));
        assert_eq!((s.status, s.steps, s.last_loss), (RunStatus::Failed, 2, Some(0.6)));
        assert_eq!((s.best_step, s.best_loss), (Some(1), Some(0.8)));
        assert_eq!(s.reason.as_deref(), Some("out of memory"));
        assert!(s.resumable);
    }

    /// Resume starts a run without a checkpoint from the start: such a run is resumable
    /// too, unless it finished.
    #[test]
    fn resumable_with_or_without_a_checkpoint_until_finished() {
        let tmp = tempfile::tempdir().unwrap();
        let stopped = Event::Stopped { step: 0, adapter_path: None };
        let stopped = bare_run(tmp.path(), "stopped-at-0", &[stopped]);
        let crashed = bare_run(tmp.path(), "crashed-in-step-1", &[]);
        let failed =
            bare_run(tmp.path(), "failed", &[step(1, 0.9), Event::Failed { step: 1, reason: "disk full".into() }]);
        let finished = Event::Finished { adapter_path: "a".into(), steps: 1, final_loss: None, reason: None };
        let finished = bare_run(tmp.path(), "finished", &[step(1, 0.9), finished]);
        for (dir, resumable) in [(&stopped, true), (&crashed, true), (&failed, true), (&finished, false)] {
            assert_eq!(summarise(dir).resumable, resumable, "{}", dir.display());
            checkpoint(dir);
            assert_eq!(summarise(dir).resumable, resumable, "{}", dir.display());
        }
        assert_eq!(summarise(&failed).reason.as_deref(), Some("disk full"));
    }

    #[test]
    fn a_damaged_log_marks_its_run_and_the_others_are_still_listed() {
        let tmp = tempfile::tempdir().unwrap();
        let first = run(tmp.path(), "a-first-line", &[step(1, 0.9)]);
        std::fs::write(first.join("events.jsonl"), "garbage\n").unwrap();
        let middle = run(tmp.path(), "b-middle-line", &[step(1, 0.9)]);
        let mut text = std::fs::read_to_string(middle.join("events.jsonl")).unwrap();
        text.push_str("{\"v\":1,\"type\":\"nonsense\"}\n");
        text.push_str(&std::fs::read_to_string(middle.join("events.jsonl")).unwrap());
        std::fs::write(middle.join("events.jsonl"), text).unwrap();
        run(tmp.path(), "c-fine", &[step(1, 0.9), Event::Stopped { step: 1, adapter_path: None }]);

        let list = list_runs(tmp.path()).unwrap();
        let got: Vec<_> = list.iter().map(|r| (r.name.as_str(), r.status, r.resumable)).collect();
        assert_eq!(
            got,
            [
                ("a-first-line", RunStatus::Damaged, true),
                ("b-middle-line", RunStatus::Damaged, true),
                ("c-fine", RunStatus::Stopped, true),
            ]
        );
        for (r, line) in list.iter().zip([":1:", ":2:"]) {
            let reason = r.reason.as_deref().unwrap();
            assert!(reason.contains("events.jsonl") && reason.contains(line), "{reason}");
        }
        let json = serde_json::to_value(&list[0]).unwrap();
        assert_eq!(json["status"], "damaged");
    }
}

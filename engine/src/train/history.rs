//! Past and present runs in a runs directory, summarised from their files alone
//! (`run.toml`, `events.jsonl`, `final/`, the live marker), so any front end can list
//! them without the engine running them.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::events::{read_events, Event};
use crate::{Error, Result};

/// Present while a process trains the run: holds that process's id.
pub const LIVE_MARKER: &str = "run.pid";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Running,
    Paused,
    Stopped,
    Finished,
    Failed,
    /// The process ended without a final event (a crash or a kill): resumable.
    Interrupted,
}

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
    /// Whether [`Run::resume`](crate::train::Run::resume) can continue it: it is stopped,
    /// failed or interrupted (not finished, and not in the hands of a live process).
    pub resumable: bool,
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
            runs.push(summarise(&dir)?);
        }
    }
    runs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(runs)
}

/// One run's summary.
pub fn summarise(dir: &Path) -> Result<RunSummary> {
    let log = dir.join("events.jsonl");
    let events = if log.exists() { read_events(&log)? } else { Vec::new() };
    let mut s = RunSummary {
        name: dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        dir: dir.to_path_buf(),
        status: RunStatus::Interrupted,
        steps: 0,
        total_steps: None,
        last_loss: None,
        adapter: Some(dir.join("final/adapter")).filter(|p| p.is_dir()),
        resumable: false,
        updated_unix: modified_unix(&log).or_else(|| modified_unix(&dir.join("run.toml"))),
    };
    for e in &events {
        match e {
            Event::RunStarted { total_steps, .. } => {
                s.total_steps = Some(*total_steps);
                s.status = RunStatus::Interrupted;
            }
            Event::Step { step, loss, .. } => {
                s.steps = *step;
                s.last_loss = Some(*loss);
            }
            Event::Paused { .. } => s.status = RunStatus::Paused,
            Event::Resumed { .. } => s.status = RunStatus::Interrupted,
            Event::Stopped { step, .. } => (s.status, s.steps) = (RunStatus::Stopped, *step),
            Event::Finished { steps, .. } => (s.status, s.steps) = (RunStatus::Finished, *steps),
            Event::Failed { .. } => s.status = RunStatus::Failed,
            _ => {}
        }
    }
    if is_live(dir) && !matches!(s.status, RunStatus::Paused) {
        s.status = RunStatus::Running;
    }
    if !is_live(dir) && s.status == RunStatus::Paused {
        // Paused, then the process went away (the app was quit): resumable as stopped.
        s.status = RunStatus::Stopped;
    }
    s.resumable = matches!(s.status, RunStatus::Stopped | RunStatus::Failed | RunStatus::Interrupted);
    Ok(s)
}

fn modified_unix(path: &Path) -> Option<u64> {
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok()?;
    modified.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs())
}

/// Whether the process named in the run's live marker is alive.
pub fn is_live(dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join(LIVE_MARKER)) else {
        return false;
    };
    let Ok(pid) = text.trim().parse::<i32>() else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    pid == std::process::id() as i32 || unsafe { libc::kill(pid, 0) } == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventLog;

    fn run(runs: &Path, name: &str, events: &[Event]) -> PathBuf {
        let dir = runs.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("run.toml"), "").unwrap();
        let mut log = EventLog::open(dir.join("events.jsonl")).unwrap();
        for e in events {
            log.append(e).unwrap();
        }
        dir
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
        }
    }

    #[test]
    fn status_resumability_and_update_time() {
        let tmp = tempfile::tempdir().unwrap();
        let runs = tmp.path();
        let stopped = Event::Stopped { step: 2, adapter_path: "a".into() };
        let finished = Event::Finished { adapter_path: "a".into(), steps: 3, final_loss: Some(0.3) };
        let failed = Event::Failed { step: 1, reason: "x".into() };
        run(runs, "a-stopped", &[step(1, 0.9), step(2, 0.8), stopped]);
        run(runs, "b-finished", &[step(3, 0.3), finished]);
        run(runs, "c-failed", &[step(1, 0.9), failed]);
        run(runs, "d-crashed", &[step(1, 0.9)]);
        // Paused by a process that is gone: resumable as stopped.
        run(runs, "e-paused", &[step(1, 0.9), Event::Paused { step: 1 }]);
        // Trained by this (live) process: neither resumable nor interrupted.
        let live = run(runs, "f-live", &[step(1, 0.9)]);
        std::fs::write(live.join(LIVE_MARKER), std::process::id().to_string()).unwrap();
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
        let s = summarise(&bare).unwrap();
        assert!(s.updated_unix.is_some() && s.resumable && s.status == RunStatus::Interrupted);
    }
}

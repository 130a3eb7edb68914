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
    Ok(s)
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

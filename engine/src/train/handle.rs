//! A run from outside: `Run::start` and `Run::resume` check what a run needs before
//! anything is written, take the run directory's lock and start the loop on its own
//! thread; the `RunHandle` controls it (pause, resume, stop) and hears its `Event`s.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver};
use std::thread::JoinHandle;

use super::config::RunConfig;
use super::control::RunControl;
use super::fit::{self, MemoryPlan};
use super::lock::RunLock;
use super::preview::check_preview_lm;
use super::run::{self, RunEnd};
use super::run_dir::{create_run_dir, write_config, Origin};
use crate::events::Event;
use crate::{Error, Result};

pub struct RunHandle {
    run_dir: PathBuf,
    control: RunControl,
    events: Receiver<Event>,
    thread: JoinHandle<Result<RunEnd>>,
}

impl RunHandle {
    pub fn pause(&self) {
        self.control.pause()
    }

    pub fn resume(&self) {
        self.control.resume()
    }

    pub fn stop(&self) {
        self.control.stop()
    }

    /// A handle on pause/resume/stop that can move to other threads.
    pub fn control(&self) -> RunControl {
        self.control.clone()
    }

    pub fn events(&self) -> &Receiver<Event> {
        &self.events
    }

    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    pub fn join(self) -> Result<RunEnd> {
        self.thread.join().unwrap_or_else(|_| Err(Error::Panicked("training")))
    }
}

pub struct Run;

impl Run {
    /// Starts a new run in `<runs_dir>/<name>` (which must not hold a run already).
    /// Its paths are made absolute first; the run directory is locked for its life.
    pub fn start(mut config: RunConfig) -> Result<RunHandle> {
        config.validate()?;
        config.resolve_paths()?;
        // A run predicted past the machine's memory does not start.
        let plan = fit::plan(&config)?;
        fit::check(&plan)?;
        crate::lora::check_rank(&config.lora, &config.model.shape()?.dit)?;
        check_preview_lm(&config)?;
        let run_dir = config.run_dir();
        let origin = Origin::New { created_dir: create_run_dir(&run_dir)? };
        let lock = RunLock::acquire(&run_dir)?;
        if run_dir.join("run.toml").exists() {
            return Err(Error::BadFile {
                path: run_dir,
                reason: "already holds a run: resume it or choose another name".into(),
            });
        }
        if let Err(e) = write_config(&run_dir, &config) {
            origin.discard(&run_dir);
            return Err(e);
        }
        Ok(spawn(config, run_dir, origin, lock, plan))
    }

    /// Continues a paused, stopped or crashed run from its newest readable checkpoint,
    /// or from the start when it has none (it ended before its first).
    pub fn resume(run_dir: &Path) -> Result<RunHandle> {
        Self::resume_with(run_dir, None)
    }

    /// As `resume`, stopping (resumably) once `stop_at_step` updates are applied. Errs
    /// at once, leaving the run as it was, when another process trains it or a folder
    /// it reads is missing.
    pub fn resume_with(run_dir: &Path, stop_at_step: Option<u64>) -> Result<RunHandle> {
        let run_dir = std::path::absolute(run_dir).map_err(|e| Error::io(run_dir, e))?;
        let mut config = RunConfig::from_toml_file(&run_dir.join("run.toml"))?;
        let lock = RunLock::acquire(&run_dir)?;
        config.check_input_folders()?;
        check_preview_lm(&config)?;
        let plan = fit::plan(&config)?;
        fit::check(&plan)?;
        config.stop_at_step = stop_at_step;
        config.runs_dir = run_dir.parent().map(Path::to_path_buf).unwrap_or_default();
        config.name = run_dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        write_config(&run_dir, &config)?;
        Ok(spawn(config, run_dir, Origin::Resumed, lock, plan))
    }
}

fn spawn(config: RunConfig, run_dir: PathBuf, origin: Origin, lock: RunLock, plan: MemoryPlan) -> RunHandle {
    let control = RunControl::default();
    let (tx, rx) = channel();
    let thread = {
        let (control, run_dir) = (control.clone(), run_dir.clone());
        std::thread::Builder::new()
            .name("ostinato-train".into())
            .spawn(move || {
                let end = run::train(&config, &run_dir, origin, lock, &plan, &control, tx);
                control.end();
                end
            })
            .expect("spawn training thread")
    };
    RunHandle { run_dir, control, events: rx, thread }
}

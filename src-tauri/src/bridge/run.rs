//! The current run: its control handle, its [`RunState`] folded from the engine's
//! events, and what the user asked of it; starting, resuming, pausing and stopping it.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use ostinato_engine::events::Event;
use ostinato_engine::generate::GenerateSpec;
use ostinato_engine::run_state::{RunState, RunStatus};
use ostinato_engine::train::songs::SongUpdate;

use super::forward::{forward, EventSink, Outgoing};
use super::state::AppState;
use super::views::{Charts, Request, RunSnapshot, RunView};
use super::{engine, BridgeError, RECENT_EVENTS};
use crate::settings::Settings;

/// Control of a run the engine is training (the engine's `RunControl` in the app, a
/// recorder in tests).
pub trait EngineRun: Send {
    fn pause(&self) -> Result<(), BridgeError>;
    fn resume(&self) -> Result<(), BridgeError>;
    fn stop(&self) -> Result<(), BridgeError>;
    /// The run directory (`<runs>/<run-id>`).
    fn run_dir(&self) -> PathBuf;
    /// Asks the run for a song at its next step boundary, written to `out`.
    fn generate(&self, spec: GenerateSpec, out: PathBuf) -> Result<Receiver<SongUpdate>, BridgeError>;
}

/// What `engine::start` gets: the validated settings and where things are.
#[derive(Debug, Clone)]
pub struct StartRequest {
    pub settings: Settings,
    pub dataset_dir: PathBuf,
    pub runs_dir: PathBuf,
    /// The label store whose labels the run records and trains with.
    pub labels_dir: PathBuf,
}

pub(super) struct CurrentRun {
    /// Present while the engine has the run.
    control: Option<Box<dyn EngineRun>>,
    /// Where views go; absent before the first run.
    sink: Option<Arc<dyn EventSink>>,
    /// Bumped for every new run, so a late forwarder of an old run changes nothing.
    pub generation: u64,
    pub state: RunState,
    requested: Option<Request>,
    run_dir: Option<PathBuf>,
    recent: VecDeque<Event>,
    pub charts: Option<Charts>,
}

impl CurrentRun {
    pub fn idle() -> Self {
        CurrentRun {
            control: None,
            sink: None,
            generation: 0,
            state: RunState::default(),
            requested: None,
            run_dir: None,
            recent: VecDeque::new(),
            charts: None,
        }
    }

    pub fn view(&self) -> RunView {
        RunView {
            state: self.state.clone(),
            run_dir: self.run_dir.clone(),
            requested: self.requested,
            active: self.state.status.is_active(),
        }
    }

    pub fn snapshot(&self) -> RunSnapshot {
        RunSnapshot { view: self.view(), recent_events: self.recent.iter().cloned().collect() }
    }

    /// The control of the run in `dir` while the engine has it.
    pub fn live_control(&self, dir: &Path) -> Option<&dyn EngineRun> {
        let live = self.run_dir.as_deref().and_then(|d| d.canonicalize().ok()).is_some_and(|d| d == dir);
        self.control.as_deref().filter(|_| live)
    }

    pub fn active_dir(&self) -> Option<&Path> {
        self.run_dir.as_deref().filter(|_| self.state.status.is_active())
    }

    /// Sends the view. Called under the state's lock: views go out in the order they
    /// were made, so the web view can take the last one it got.
    fn announce(&self) {
        if let Some(sink) = &self.sink {
            sink.send(Outgoing::Run(&self.view()));
        }
    }

    /// An engine event: forwarded, folded into the state, and the new view sent.
    pub fn take(&mut self, event: &Event) {
        if let Some(sink) = &self.sink {
            sink.send(Outgoing::Engine(event));
        }
        self.apply(event);
        self.announce();
    }

    /// Folds one engine event in. The engine's answer ends what was asked of it.
    fn apply(&mut self, event: &Event) {
        self.state.apply(event);
        if self.recent.len() == RECENT_EVENTS {
            self.recent.pop_front();
        }
        self.recent.push_back(event.clone());
        let status = self.state.status;
        if !status.is_active() {
            (self.control, self.requested) = (None, None);
        } else if self.requested == Some(Request::Pause) && status == RunStatus::Paused {
            self.requested = None;
        }
    }

    /// The engine's events ended. A run still active then ended without saying how.
    pub fn ended(&mut self) {
        if self.state.status.is_active() {
            let reason = "the engine stopped sending events without finishing the run".to_string();
            self.take(&Event::Failed { step: self.state.steps, reason });
        }
        self.control = None;
    }
}

impl AppState {
    /// Starts a run with the saved settings; events go to `sink` from a background thread.
    pub fn start_run(&self, sink: impl EventSink) -> Result<RunView, BridgeError> {
        let settings = self.settings();
        settings.validate().map_err(BridgeError::InvalidSettings)?;
        let dataset_dir = settings
            .dataset_dir()
            .map(Path::to_path_buf)
            .ok_or_else(|| BridgeError::Invalid("choose a dataset folder first".into()))?;
        if self.lock().run.state.status.is_active() {
            return Err(BridgeError::RunActive);
        }
        let req = self.start_request(settings, dataset_dir);
        let (control, events) = engine::start(&req)?;
        Ok(self.adopt_run(control, events, sink))
    }

    /// Continues a paused, stopped or interrupted run from its directory.
    pub fn resume_run(&self, dir: &Path, sink: impl EventSink) -> Result<RunView, BridgeError> {
        let dir = self.checked_run_dir(dir)?;
        if self.lock().run.state.status.is_active() {
            return Err(BridgeError::RunActive);
        }
        let (control, events) = engine::resume(&dir)?;
        Ok(self.adopt_run(control, events, sink))
    }

    /// Makes a freshly started engine run the current run and starts forwarding its
    /// events. Public so tests can drive the forwarder with a scripted run.
    pub fn adopt_run(&self, control: Box<dyn EngineRun>, events: Receiver<Event>, sink: impl EventSink) -> RunView {
        let sink: Arc<dyn EventSink> = Arc::new(sink);
        let (generation, view) = {
            let mut g = self.lock();
            let generation = g.next_generation;
            g.next_generation += 1;
            g.run = CurrentRun {
                run_dir: Some(control.run_dir()),
                control: Some(control),
                sink: Some(sink.clone()),
                generation,
                state: RunState::begun(),
                ..CurrentRun::idle()
            };
            g.run.announce();
            (generation, g.run.view())
        };
        let state = self.clone();
        std::thread::Builder::new()
            .name("ostinato-events".into())
            .spawn(move || forward(state, generation, events, sink))
            .expect("spawning the event thread");
        view
    }

    /// Hands `f` the run's control; on success records `request` (None clears it) and
    /// sends the new view.
    fn with_control(
        &self,
        allowed: impl FnOnce(&CurrentRun) -> Result<(), BridgeError>,
        request: Option<Request>,
        f: impl FnOnce(&dyn EngineRun) -> Result<(), BridgeError>,
    ) -> Result<RunView, BridgeError> {
        let mut g = self.lock();
        let control = g.run.control.as_deref().ok_or(BridgeError::NoActiveRun)?;
        allowed(&g.run)?;
        f(control)?;
        g.run.requested = request;
        g.run.announce();
        Ok(g.run.view())
    }

    /// Asks the run to pause; it is asked ("pausing") until the engine's `paused` event.
    pub fn pause(&self) -> Result<RunView, BridgeError> {
        let running = |r: &CurrentRun| match (r.state.status, r.requested) {
            (RunStatus::Running, None) => Ok(()),
            _ => Err(BridgeError::Invalid("the run is not running".into())),
        };
        self.with_control(running, Some(Request::Pause), |c| c.pause())
    }

    /// Continues a paused run, or one asked to pause that has not yet.
    pub fn resume(&self) -> Result<RunView, BridgeError> {
        let paused = |r: &CurrentRun| match (r.state.status, r.requested) {
            (RunStatus::Paused, None) | (RunStatus::Running, Some(Request::Pause)) => Ok(()),
            _ => Err(BridgeError::Invalid("the run is not paused".into())),
        };
        self.with_control(paused, None, |c| c.resume())
    }

    /// Asks the run to stop (it saves a checkpoint and ends with a `stopped` event).
    pub fn stop(&self) -> Result<RunView, BridgeError> {
        self.with_control(|_| Ok(()), Some(Request::Stop), |c| c.stop())
    }
}

//! The current run as the app keeps it: its control handle while the engine has it,
//! its [`RunState`] folded from the engine's events, the recent events, what the user
//! asked of it and its charts; each change sent to the web view as the run's view.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ostinato_engine::events::Event;
use ostinato_engine::run_state::{RunState, RunStatus};

use super::engine::EngineRun;
use super::outgoing::{EventSink, Outgoing};
use super::views::{Charts, Request, RunSnapshot, RunView};

/// How many recent events the state keeps for the UI (for `get_state` after a reload).
pub const RECENT_EVENTS: usize = 200;

pub(super) struct CurrentRun {
    /// Present while the engine has the run.
    pub(super) control: Option<Box<dyn EngineRun>>,
    /// Where views go; absent before the first run.
    sink: Option<Arc<dyn EventSink>>,
    /// Bumped for every new run, so a late forwarder of an old run changes nothing.
    pub generation: u64,
    pub state: RunState,
    pub(super) requested: Option<Request>,
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

    /// A run the engine has just started, its views going to `sink`.
    pub fn begun(control: Box<dyn EngineRun>, sink: Arc<dyn EventSink>, generation: u64) -> Self {
        CurrentRun {
            run_dir: Some(control.run_dir()),
            control: Some(control),
            sink: Some(sink),
            generation,
            state: RunState::begun(),
            ..CurrentRun::idle()
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
    pub(super) fn announce(&self) {
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

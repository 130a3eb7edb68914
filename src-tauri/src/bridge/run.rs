//! The current run's control: starting, resuming, pausing and stopping it, and the
//! thread that forwards each run's engine events to it and to the web view.

use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ostinato_engine::events::Event;
use ostinato_engine::run_state::RunStatus;

use super::current_run::CurrentRun;
use super::engine::{self, EngineRun};
use super::error::BridgeError;
use super::outgoing::{EventSink, Outgoing};
use super::state::AppState;
use super::views::{Request, RunView};

/// Charts are re-rendered at most this often while events arrive (2.5 Hz >= 2 Hz).
pub const CHART_INTERVAL: Duration = Duration::from_millis(400);

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
            g.run = CurrentRun::begun(control, sink.clone(), generation);
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

/// The forwarding loop of run `generation`: folds each event into the run's state and
/// sends it and the new view (under the state's lock, so views go out in the order they
/// were made), and redraws the charts at most every [`CHART_INTERVAL`] and once more
/// when the events end.
fn forward(state: AppState, generation: u64, events: Receiver<Event>, sink: Arc<dyn EventSink>) {
    let mut last_render: Option<Instant> = None;
    let mut dirty = false;
    let mut chart_error_reported = false;
    loop {
        let (ended, event) = match events.recv_timeout(CHART_INTERVAL / 2) {
            Ok(ev) => (false, Some(ev)),
            Err(RecvTimeoutError::Timeout) => (false, None),
            Err(RecvTimeoutError::Disconnected) => (true, None),
        };
        {
            let mut g = state.lock();
            if g.run.generation != generation {
                return;
            }
            if let Some(ev) = &event {
                g.run.take(ev);
                dirty = true;
            }
            if ended {
                g.run.ended();
            }
        }
        let due = last_render.is_none_or(|t| t.elapsed() >= CHART_INTERVAL);
        if dirty && (due || ended) {
            let (run, dark) = {
                let g = state.lock();
                (g.run.state.clone(), g.dark)
            };
            match engine::render_charts(&run, dark) {
                Ok(charts) => {
                    let mut g = state.lock();
                    if g.run.generation == generation {
                        sink.send(Outgoing::Charts(&charts));
                        g.run.charts = Some(charts);
                    }
                }
                Err(e) if !chart_error_reported => {
                    chart_error_reported = true;
                    eprintln!("ostinato: charts unavailable: {e}");
                }
                Err(_) => {}
            }
            last_render = Some(Instant::now());
            dirty = false;
        }
        if ended {
            return;
        }
    }
}

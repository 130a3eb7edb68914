//! Forwarding a run's engine events to the web view: each typed event once, the run's
//! view after each, and charts drawn from the run's state at most every
//! [`CHART_INTERVAL`].

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ostinato_engine::events::Event;
use serde::Serialize;

use super::engine;
use super::state::AppState;
use super::views::{CaptionEvent, Charts, RunView, SongProgress};

/// Name of the event every engine event is forwarded under (payload: the event itself,
/// `{"type": "step", ...}`).
pub const ENGINE_EVENT: &str = "engine-event";
/// Name of the event that carries freshly rendered charts (payload: [`Charts`]).
pub const CHARTS_EVENT: &str = "charts";
/// Name of the event sent whenever the run's view changes (payload: [`RunView`]).
pub const RUN_EVENT: &str = "run-state";
/// Name of the event that carries a requested song's progress (payload: [`SongProgress`]).
pub const SONG_EVENT: &str = "song";
/// Captioning with ACE-Step's LM: a song's stage, a song's outcome, the batch's end
/// (payloads: the [`CaptionEvent`] variants).
pub const CAPTION_PROGRESS_EVENT: &str = "caption-progress";
pub const CAPTION_SONG_EVENT: &str = "caption-song";
pub const CAPTION_DONE_EVENT: &str = "caption-done";
/// Charts are re-rendered at most this often while events arrive (2.5 Hz >= 2 Hz).
pub const CHART_INTERVAL: Duration = Duration::from_millis(400);

/// What the app sends the web view.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(untagged)]
pub enum Outgoing<'a> {
    Engine(&'a Event),
    Run(&'a RunView),
    Charts(&'a Charts),
    /// A model download's progress (models.rs).
    Download(&'a serde_json::Value),
    /// A requested song's progress (listen.rs).
    Song(&'a SongProgress),
    /// Captioning's progress and outcomes (captions.rs).
    Caption(&'a CaptionEvent),
}

impl Outgoing<'_> {
    /// The web view's event name for it.
    pub fn name(&self) -> &'static str {
        match self {
            Outgoing::Engine(_) => ENGINE_EVENT,
            Outgoing::Run(_) => RUN_EVENT,
            Outgoing::Charts(_) => CHARTS_EVENT,
            Outgoing::Download(_) => crate::models::DOWNLOAD_EVENT,
            Outgoing::Song(_) => SONG_EVENT,
            Outgoing::Caption(CaptionEvent::Progress(_)) => CAPTION_PROGRESS_EVENT,
            Outgoing::Caption(CaptionEvent::Song(_)) => CAPTION_SONG_EVENT,
            Outgoing::Caption(CaptionEvent::Done(_)) => CAPTION_DONE_EVENT,
        }
    }
}

/// Where forwarded events go: the app handle in the app, a recorder in tests.
pub trait EventSink: Send + Sync + 'static {
    fn send(&self, message: Outgoing<'_>);
}

impl<R: tauri::Runtime> EventSink for tauri::AppHandle<R> {
    fn send(&self, message: Outgoing<'_>) {
        use tauri::Emitter;
        if let Outgoing::Run(view) = message {
            crate::native::run_changed(self, view);
        }
        if let Err(e) = self.emit(message.name(), message) {
            eprintln!("ostinato: could not emit {}: {e}", message.name());
        }
    }
}

/// The forwarding loop of run `generation`: folds each event into the run's state and
/// sends it and the new view (under the state's lock, so views go out in the order they
/// were made), and redraws the charts at most every [`CHART_INTERVAL`] and once more
/// when the events end.
pub(super) fn forward(state: AppState, generation: u64, events: Receiver<Event>, sink: Arc<dyn EventSink>) {
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

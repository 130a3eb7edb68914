//! The app's backend state machine, and the ONLY place that talks to the training engine.
//!
//! Commands (commands.rs) call [`AppState`]: it keeps the settings, the current dataset
//! scan and the current run (state.rs; the run's control in run.rs). The forwarder
//! (forward.rs) folds each engine event into the run's `RunState` and sends the event,
//! the run's view and its charts to the web view; what the web view sees is in
//! views.rs. Previews, Generate and the audio the web view plays are in listen.rs.
//! The dataset editor (labels edited, analysed, accepted, written as sidecars) is in
//! labels.rs; captioning songs with ACE-Step's 5 Hz LM in captions.rs. The engine is
//! called from engine.rs, dataset_scan.rs, run_settings.rs, labels.rs, captions.rs and
//! listen.rs.

mod captions;
mod dataset_scan;
mod engine;
mod forward;
mod labels;
mod listen;
mod run;
mod run_settings;
mod state;
#[cfg(test)]
mod tests;
mod views;

use crate::settings::FieldErrors;

pub use forward::{
    EventSink, Outgoing, CAPTION_DONE_EVENT, CAPTION_PROGRESS_EVENT, CAPTION_SONG_EVENT, CHARTS_EVENT, CHART_INTERVAL,
    ENGINE_EVENT, RUN_EVENT, SONG_EVENT,
};
pub use run::{EngineRun, StartRequest};
pub use state::AppState;
pub use views::{
    CaptionEvent, CaptionProgress, CaptionStart, CaptionedSong, CaptionsDone, Charts, DatasetView, EstimateView,
    ExportFormat, FileRow, HistoryEntry, MemoryView, PreviewView, Request, RunSnapshot, RunSummary, RunView,
    SavedSongView, SidecarReport, SongChoices, SongProgress, SongStage, StateView,
};

/// How many recent events the state keeps for the UI (for `get_state` after a reload).
pub const RECENT_EVENTS: usize = 200;

#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("invalid settings")]
    InvalidSettings(FieldErrors),
    #[error("{0}")]
    Invalid(String),
    #[error("a run is already in progress; stop it first")]
    RunActive,
    #[error("no run is in progress")]
    NoActiveRun,
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("{0}")]
    Engine(String),
}

impl BridgeError {
    /// A stable machine-readable kind for the UI and tests.
    pub fn kind(&self) -> &'static str {
        match self {
            BridgeError::InvalidSettings(_) => "invalid_settings",
            BridgeError::Invalid(_) => "invalid",
            BridgeError::RunActive => "run_active",
            BridgeError::NoActiveRun => "no_active_run",
            BridgeError::Io { .. } => "io",
            BridgeError::Engine(_) => "engine",
        }
    }
}

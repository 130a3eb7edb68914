//! The app's backend state machine, and the ONLY place that talks to the training engine.
//!
//! Commands (commands.rs) call [`AppState`]: it keeps the settings, the current dataset
//! scan and the current run (state.rs). The run's control (run.rs) starts and steers
//! the engine's run and forwards its events to the current run (current_run.rs), which
//! folds each into its `RunState` and sends the event and the run's view to the web
//! view; what is sent, and under which names, is in outgoing.rs, what the web view sees
//! in views.rs. Previews, Generate and the audio the web view plays are in listen.rs;
//! A/B pairs and the adapters the window can pick in ab.rs.
//! The dataset editor (labels edited, analysed, accepted, written as sidecars) is in
//! labels.rs; captioning songs with ACE-Step's 5 Hz LM in captions.rs. The engine is
//! called from engine.rs, dataset_scan.rs, run_settings.rs, labels.rs, captions.rs,
//! listen.rs and ab.rs.
//!
//! Imports go one way, down: state, run control and the features on `AppState`
//! (state, run, labels, listen, ab, captions), then current_run, then outgoing and the
//! engine wrapper (engine, dataset_scan, run_settings), then views and error;
//! tests/layering.rs fails on any circle.

mod ab;
mod captions;
mod current_run;
mod dataset_scan;
mod engine;
mod error;
mod labels;
mod listen;
mod outgoing;
mod run;
mod run_settings;
mod state;
#[cfg(test)]
mod tests;
mod views;

pub use current_run::RECENT_EVENTS;
pub use engine::EngineRun;
pub(crate) use error::engine_err;
pub use error::BridgeError;
pub use outgoing::{
    EventSink, Outgoing, CAPTION_DONE_EVENT, CAPTION_PROGRESS_EVENT, CAPTION_SONG_EVENT, CHARTS_EVENT, DOWNLOAD_EVENT,
    ENGINE_EVENT, PAIR_EVENT, RUN_EVENT, SONG_EVENT,
};
pub use run::CHART_INTERVAL;
pub use run_settings::StartRequest;
pub use state::AppState;
pub use views::{
    AdapterChoiceView, AdapterView, CaptionEvent, CaptionProgress, CaptionStart, CaptionedSong, CaptionsDone, Charts,
    DatasetView, EstimateView, ExportFormat, FileRow, HistoryEntry, MemoryView, PairChoices, PairView, PreviewView,
    Request, RunSnapshot, RunSummary, RunView, SavedSongView, SidecarReport, SongChoices, SongProgress, SongStage,
    StateView,
};

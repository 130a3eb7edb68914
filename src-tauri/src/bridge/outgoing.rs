//! What the app sends the web view, under which event names, and where it goes (the
//! [`EventSink`]): the bridge's runs, songs, A/B pairs and captioning and the model download all
//! send through it.

use ostinato_engine::events::Event;
use serde::Serialize;

use super::views::{CaptionEvent, Charts, PairProgress, RunView, SongProgress};

/// Name of the event every engine event is forwarded under (payload: the event itself,
/// `{"type": "step", ...}`).
pub const ENGINE_EVENT: &str = "engine-event";
/// Name of the event that carries freshly rendered charts (payload: [`Charts`]).
pub const CHARTS_EVENT: &str = "charts";
/// Name of the event sent whenever the run's view changes (payload: [`RunView`]).
pub const RUN_EVENT: &str = "run-state";
/// Name of the event that carries a requested song's progress (payload: [`SongProgress`]).
pub const SONG_EVENT: &str = "song";
/// Name of the event that carries an A/B pair's progress (payload: [`PairProgress`]).
pub const PAIR_EVENT: &str = "pair";
/// Captioning with ACE-Step's LM: a song's stage, a song's outcome, the batch's end
/// (payloads: the [`CaptionEvent`] variants).
pub const CAPTION_PROGRESS_EVENT: &str = "caption-progress";
pub const CAPTION_SONG_EVENT: &str = "caption-song";
pub const CAPTION_DONE_EVENT: &str = "caption-done";
/// Name of the event every download event is forwarded under (models.rs): the engine's
/// `DownloadEvent` (`{"type": "progress", ...}`), then `cancelled` or `failed` (with
/// `error`) when it ends without `finished`.
pub const DOWNLOAD_EVENT: &str = "model-download";

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
    /// An A/B pair's progress (ab.rs).
    Pair(&'a PairProgress),
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
            Outgoing::Download(_) => DOWNLOAD_EVENT,
            Outgoing::Song(_) => SONG_EVENT,
            Outgoing::Pair(_) => PAIR_EVENT,
            Outgoing::Caption(CaptionEvent::Progress(_)) => CAPTION_PROGRESS_EVENT,
            Outgoing::Caption(CaptionEvent::Song(_)) => CAPTION_SONG_EVENT,
            Outgoing::Caption(CaptionEvent::Done(_)) => CAPTION_DONE_EVENT,
        }
    }
}

/// Where what is sent goes: the app handle in the app (lib.rs), a recorder in tests.
pub trait EventSink: Send + Sync + 'static {
    fn send(&self, message: Outgoing<'_>);
}

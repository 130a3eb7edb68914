//! What the web view sees: the values commands return and events carry, serialized as-is.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ostinato_engine::charts::Readout;
use ostinato_engine::data::Field;
use ostinato_engine::device::Precision;
use ostinato_engine::events::Event;
use ostinato_engine::generate::MixedAdapter;
use ostinato_engine::label::understand::labeller::Progress;
use ostinato_engine::label::Resolved;
use ostinato_engine::load::{DitVariant, LmVariant};
use ostinato_engine::lora::{self, PartStrengths};
use ostinato_engine::run_state::RunState;
use ostinato_engine::train::ab::{AbVoice, Side};
pub use ostinato_engine::train::history::RunSummary;
use ostinato_engine::train::state::KeptAdapter;
use ostinato_engine::train::{optim, schedule};
use serde::{Deserialize, Serialize};

use crate::settings::Settings;

/// One file of the dataset, as the files table shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileRow {
    /// Path relative to the dataset folder.
    pub name: String,
    pub duration_s: Option<f64>,
    pub has_caption: bool,
    pub has_lyrics: bool,
    /// "ok", "cached" or "bad".
    pub status: String,
    /// For a bad file: what is wrong, in words ("cannot decode: ...", "too short: 0.4 s").
    pub problem: Option<String>,
    /// For a song training cuts: how, in words ("cut to 240 s ...").
    pub note: Option<String>,
    /// Each label field as training uses it and where its value comes from (edited,
    /// sidecar, analysed); empty for a file that is not a song.
    pub labels: BTreeMap<Field, Resolved>,
    /// The labels were saved for an earlier version of the file (it changed since).
    pub stale: bool,
}

/// A scanned dataset folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetView {
    pub path: PathBuf,
    pub files: Vec<FileRow>,
    pub total_duration_s: f64,
    pub usable: usize,
    pub bad: usize,
    /// The language codes ACE-Step knows, for the language cells.
    pub languages: Vec<String>,
}

/// One field the analysis read from a song: a value not yet accepted, with how sure
/// it is, or why it cannot be told.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EstimateView {
    pub value: Option<String>,
    pub confidence: Option<f64>,
    /// Read with less confidence than the engine's `SURE`: shown as a guess.
    pub guess: bool,
    pub cannot_tell: Option<String>,
}

/// What became of the labels written as sidecars: files by outcome (written,
/// unchanged, replaced, kept), and the kept ones by name (they say something else).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SidecarReport {
    pub counts: BTreeMap<String, usize>,
    pub kept: Vec<String>,
}

/// SVG documents rendered by the engine's chart module.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Charts {
    /// Loss, raw and smoothed.
    pub loss: String,
    /// Samples per second.
    pub throughput: String,
    /// Memory now and peak.
    pub memory: String,
    /// Mean loss by noise level (timestep), first epoch against the latest.
    pub noise_levels: String,
    /// Per chart (by the names above): where its points lie, for a value under the pointer.
    pub readouts: BTreeMap<String, Readout>,
}

/// What the user asked of the run that the engine has not yet acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    /// Pause: until the engine's `paused` (the step in flight finishes first).
    Pause,
    /// Stop: until the engine's `stopped` (it writes a checkpoint and an adapter first).
    Stop,
}

/// The current (or last) run, as the Run panel and status bar show it: its state as the
/// engine's events tell it (`status`, `started`, `preparing`, `last_step`, ...,
/// flattened) and what the user asked that the engine has not yet done. Sent as a
/// `run-state` event after everything that changes it, in the order it changed.
#[derive(Debug, Clone, Serialize)]
pub struct RunView {
    #[serde(flatten)]
    pub state: RunState,
    pub run_dir: Option<PathBuf>,
    pub requested: Option<Request>,
    /// The engine has the run (running or paused): Start waits, the settings apply to the next run.
    pub active: bool,
}

/// The run as `get_state` gives it after a reload: its view and its recent events.
#[derive(Debug, Clone, Serialize)]
pub struct RunSnapshot {
    #[serde(flatten)]
    pub view: RunView,
    /// The last [`RECENT_EVENTS`](super::RECENT_EVENTS) events, oldest first.
    pub recent_events: Vec<Event>,
}

/// One run in the History panel: the engine's summary of it (name, dir, status, steps,
/// last loss, final adapter, resumable, update time), flattened, and whether it is the run
/// this app is training now (then the panel shows it as "active", not resumable).
#[derive(Debug, Clone, Serialize)]
pub struct HistoryEntry {
    #[serde(flatten)]
    pub summary: RunSummary,
    /// The run this app is training now (running or paused).
    pub active: bool,
}

pub use ostinato_engine::export::ExportFormat;

/// The engine's memory prediction for the saved settings, shown before Start.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryView {
    /// What the run trains, as the engine names it ("XL turbo", "2B SFT"); none for the
    /// demo model.
    pub model: Option<String>,
    /// "predicted peak 3.1 of 19.8 GB (RAM available)".
    pub summary: String,
    pub fits: bool,
    /// What fitting to this machine changed, in words.
    pub changes: Vec<String>,
    /// Why the run would not start, and what to change.
    pub problem: Option<String>,
}

/// The names the form's choices offer: the engine's.
#[derive(Debug, Clone, Serialize)]
pub struct Choices {
    pub adapters: &'static [&'static str],
    pub optimizers: &'static [&'static str],
    pub lr_schedules: &'static [&'static str],
    /// What an adapter can train, by group, with the modules each one names.
    pub target_groups: &'static [(&'static str, &'static [&'static str])],
    /// The variants the Model panel can download.
    pub model_variants: &'static [&'static str],
    /// The 5 Hz LMs it can download, each with its approximate size in words (named
    /// before the hub is asked).
    pub lm_variants: Vec<(&'static str, String)>,
    /// The precisions, each with what it means.
    pub precisions: &'static [(&'static str, &'static str)],
    /// The confidence below which a reading of the audio is shown as a guess.
    pub sure: f64,
}

impl Default for Choices {
    fn default() -> Self {
        Self {
            adapters: &lora::ADAPTERS,
            optimizers: &optim::OPTIMIZERS,
            lr_schedules: &schedule::SCHEDULES,
            target_groups: &lora::TARGET_GROUPS,
            model_variants: &DitVariant::NAMES,
            lm_variants: LmVariant::ALL
                .iter()
                .map(|v| (v.name(), format!("{} · {}", v.name(), v.approx_size())))
                .collect(),
            precisions: &Precision::CHOICES,
            sure: ostinato_engine::label::analysis::SURE,
        }
    }
}

/// Everything the UI needs on load (after which it follows events).
#[derive(Debug, Clone, Serialize)]
pub struct StateView {
    pub settings: Settings,
    /// The names each choice of the form offers, as the engine defines them.
    pub choices: Choices,
    pub dataset: Option<DatasetView>,
    pub run: RunSnapshot,
    pub charts: Option<Charts>,
    pub runs_dir: PathBuf,
    pub config_dir: PathBuf,
    pub notice: Option<String>,
    pub version: &'static str,
}

/// One preview of a run, as the previews panel lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PreviewView {
    /// Updates applied when it was made (0: the base model).
    pub step: u64,
    /// Which of the run's preview prompts it is (0: the first).
    pub prompt: usize,
    /// The WAV file (absolute).
    pub path: PathBuf,
    pub caption: String,
    pub seconds: f64,
    /// Seconds it took to make.
    pub took_s: f64,
}

/// A run's newest adapter as the Listen tab names it: its settings and the trigger
/// word kept in its files.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdapterView {
    pub path: PathBuf,
    /// "LoRA r 64 alpha 128".
    pub settings: String,
    pub trigger: Option<String>,
    /// prepend, append or replace.
    pub trigger_position: Option<&'static str>,
}

/// A song made from a run, as the Generate list shows it again: its WAV and what it was
/// asked with, or why that is not known.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SavedSongView {
    /// The WAV file (absolute).
    pub path: PathBuf,
    pub caption: Option<String>,
    pub seconds: Option<f64>,
    pub seed: Option<u64>,
    pub adapter_scale: Option<f64>,
    /// Why the request kept beside the song could not be read.
    pub problem: Option<String>,
}

/// What the user chose in the Generate form; the engine fills in the rest.
#[derive(Debug, Clone, Deserialize)]
pub struct SongChoices {
    pub caption: String,
    #[serde(default)]
    pub lyrics: String,
    pub duration_seconds: f64,
    pub seed: u64,
    /// 0: the base model; 1: the adapter as trained (an A/B pair's song leaves it out:
    /// its voices set the adapters).
    #[serde(default = "as_trained")]
    pub adapter_scale: f64,
    /// Plan the song with ACE-Step's 5 Hz LM first.
    #[serde(default)]
    pub plan_with_lm: bool,
    /// Other runs' adapters mixed in, each at its strength.
    #[serde(default)]
    pub more_adapters: Vec<MixedAdapter>,
    /// A strength per part of each layer (self, cross, mlp), on every adapter.
    #[serde(default)]
    pub parts: PartStrengths,
}

fn as_trained() -> f64 {
    1.0
}

/// An adapter a run keeps, as the window's pickers offer it: the run, and which of its
/// adapters (`final`, `best`, a checkpoint's `step`) at `path`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdapterChoiceView {
    pub run: String,
    pub run_dir: PathBuf,
    #[serde(flatten)]
    pub adapter: KeptAdapter,
}

/// An A/B pair the user asked for: two voices, and the song both make (the Generate
/// form's, without its adapters).
#[derive(Debug, Clone, Deserialize)]
pub struct PairChoices {
    pub a: AbVoice,
    pub b: AbVoice,
    pub song: SongChoices,
}

/// A pair's progress, sent as a `pair` event: the side being made and where it is.
#[derive(Debug, Clone, Serialize)]
pub struct PairProgress {
    /// The id `generate_pair` returned.
    pub id: u64,
    pub side: Side,
    #[serde(flatten)]
    pub stage: SongStage,
}

/// A kept pair, as the A/B list shows it again: what both sides made, each side's voice
/// in words and its WAV (None when it was never made), or why its request is unreadable.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairView {
    pub dir: PathBuf,
    pub caption: Option<String>,
    pub seed: Option<u64>,
    pub seconds: Option<f64>,
    pub a: PairSideView,
    pub b: PairSideView,
    pub problem: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairSideView {
    pub voice: Option<String>,
    pub path: Option<PathBuf>,
}

/// A song's progress, sent as a `song` event.
#[derive(Debug, Clone, Serialize)]
pub struct SongProgress {
    /// The id `generate` returned.
    pub id: u64,
    #[serde(flatten)]
    pub stage: SongStage,
}

/// Where a song is: waiting for the run's next step boundary (`live`) or for its model
/// to load, sampling, decoding, written, or failed.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "stage", rename_all = "snake_case")]
pub enum SongStage {
    Waiting {
        live: bool,
    },
    /// Not planned by the 5 Hz LM, and why.
    Unplanned {
        reason: String,
    },
    /// The 5 Hz LM writing its plan: the phase and its tokens so far.
    Planning {
        phase: String,
        tokens: usize,
    },
    /// The plan written: its audio codes.
    Planned {
        codes: usize,
    },
    Sampling {
        step: usize,
        steps: usize,
    },
    Decoding,
    Written {
        path: PathBuf,
        seconds: f64,
    },
    Failed {
        message: String,
    },
}

/// Where captioning with ACE-Step's LM is, sent as a `caption-progress` event: the song
/// and its number in the batch with the engine's stage for it (listening, writing);
/// no song (number 0) and no stage while the LM loads.
#[derive(Debug, Clone, Serialize)]
pub struct CaptionProgress {
    pub batch: u64,
    pub song: Option<String>,
    pub number: usize,
    pub songs: usize,
    #[serde(flatten)]
    pub stage: Option<Progress>,
}

/// One song captioned, or why not, sent as a `caption-song` event.
#[derive(Debug, Clone, Serialize)]
pub struct CaptionedSong {
    pub batch: u64,
    pub song: String,
    pub number: usize,
    pub songs: usize,
    /// Its row with the LM's labels kept; None when it failed (it keeps its labels).
    pub row: Option<FileRow>,
    /// The LM's tempo, key and meter: guesses the user may accept, never taken by themselves.
    pub guesses: BTreeMap<Field, String>,
    /// What the LM wrote that is no label value: the field, the value, why it is left out.
    pub refused: Vec<(Field, String, String)>,
    pub error: Option<String>,
}

/// How a captioning ended, sent as a `caption-done` event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaptionsDone {
    pub batch: u64,
    pub songs: usize,
    pub captioned: usize,
    pub failed: usize,
    pub cancelled: bool,
    /// What stopped the whole batch (the LM could not be loaded).
    pub error: Option<String>,
}

/// What captioning sends the web view, each under its own event name.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum CaptionEvent {
    Progress(CaptionProgress),
    Song(CaptionedSong),
    Done(CaptionsDone),
}

/// A captioning started: its id (its events carry it: the web view may get them out of
/// order, and one of a batch that has ended is stale), the LM it uses and how many songs
/// it captions.
#[derive(Debug, Clone, Serialize)]
pub struct CaptionStart {
    pub batch: u64,
    pub lm: String,
    pub path: PathBuf,
    pub songs: usize,
}

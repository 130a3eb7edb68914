//! The app's backend state machine, and the ONLY place that talks to the training engine.
//!
//! Commands (commands.rs) call [`AppState`]; `AppState` keeps the settings, the current
//! dataset scan, the current run (its control handle, status and latest events) and
//! forwards engine events to the web view from a background thread.
//!
//! Everything that needs the engine goes through the [`engine`] module at the bottom of
//! this file, the dataset scan (dataset_scan.rs) and the settings' conversion into a run
//! configuration (run_settings.rs).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

mod dataset_scan;
mod run_settings;

use crate::models::Models;
use crate::settings::{self, FieldErrors, Settings};
use ostinato_engine::load::ModelPlaces;

pub use engine::RunSummary;

/// Name of the event every engine event is forwarded under (payload: the event itself,
/// `{"type": "step", ...}`).
pub const ENGINE_EVENT: &str = "engine-event";
/// Name of the event that carries freshly rendered charts (payload: [`Charts`]).
pub const CHARTS_EVENT: &str = "charts";
/// Name of the event sent whenever the run's status changes (payload: [`RunView`]).
pub const RUN_EVENT: &str = "run-state";
/// How many recent events the state keeps for the UI (and for `get_state` after a reload).
pub const RECENT_EVENTS: usize = 200;
/// Charts are re-rendered at most this often while events arrive (2.5 Hz >= 2 Hz).
pub const CHART_INTERVAL: Duration = Duration::from_millis(400);

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

// ---------------------------------------------------------------------------------------
// What the UI sees (serialized to the web view as-is).
// ---------------------------------------------------------------------------------------

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
}

/// A scanned dataset folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetView {
    pub path: PathBuf,
    pub files: Vec<FileRow>,
    pub total_duration_s: f64,
    pub usable: usize,
    pub bad: usize,
}

/// SVG documents rendered by the engine's chart module.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Charts {
    /// Loss, raw and smoothed.
    pub loss: String,
    /// Samples per second.
    pub throughput: String,
    /// Memory now and peak.
    pub memory: String,
    /// Mean loss by noise level (timestep), first epoch against the latest.
    pub noise_levels: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Idle,
    Running,
    Pausing,
    Paused,
    Stopping,
    Stopped,
    Finished,
    Failed,
}

impl RunStatus {
    pub fn is_active(self) -> bool {
        matches!(self, RunStatus::Running | RunStatus::Pausing | RunStatus::Paused | RunStatus::Stopping)
    }

    /// The status an engine event moves a run to, if it changes it.
    pub fn after_event(event_type: &str) -> Option<RunStatus> {
        Some(match event_type {
            "run_started" | "resumed" | "step" => RunStatus::Running,
            "paused" => RunStatus::Paused,
            "stopped" => RunStatus::Stopped,
            "finished" => RunStatus::Finished,
            "failed" => RunStatus::Failed,
            _ => return None,
        })
    }
}

/// The current (or last) run, as the Run panel and status bar show it.
#[derive(Debug, Clone, Serialize)]
pub struct RunView {
    pub status: RunStatus,
    pub run_dir: Option<PathBuf>,
    /// The run's `run_started` event (config, device, precision, memory features, ...).
    pub started: Option<Value>,
    /// The latest `step` event (step, epoch, loss, samples/s, memory, elapsed, eta).
    pub last_step: Option<Value>,
    /// The error of a failed run, or of the event stream.
    pub error: Option<String>,
    /// The last [`RECENT_EVENTS`] events, oldest first.
    pub recent_events: Vec<Value>,
    /// Numbers views in the order they were made (under the state's lock), so a higher
    /// number never shows older state. The web view drops a view older than the one it
    /// shows: a command's reply ("pausing") can reach it after the `run-state` event of
    /// what followed ("paused").
    pub revision: u64,
}

/// One run in the History panel: the engine's summary of it (name, dir, status, steps,
/// last loss, final adapter, resumable, update time), flattened, and whether it is the run
/// this app is training now (then the panel shows it as "active", not resumable).
#[derive(Debug, Clone, Serialize)]
pub struct HistoryEntry {
    #[serde(flatten)]
    pub summary: RunSummary,
    /// The run this app is training now (running, pausing, paused or stopping).
    pub active: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExportFormat {
    /// PEFT adapter (adapter_config.json + adapter_model.safetensors): ACE-Step, diffusers.
    Peft,
    /// Single-file LoRA with ComfyUI key names.
    Comfyui,
    /// Full model weights with the adapter merged in.
    Merged,
}

/// The engine's memory prediction for the saved settings, shown before Start.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryView {
    /// "predicted peak 3.1 of 19.8 GB (RAM available)".
    pub summary: String,
    pub fits: bool,
    /// What fitting to this machine changed, in words.
    pub changes: Vec<String>,
    /// Why the run would not start, and what to change.
    pub problem: Option<String>,
}

/// Everything the UI needs on load (after which it follows events).
#[derive(Debug, Clone, Serialize)]
pub struct StateView {
    pub settings: Settings,
    pub dataset: Option<DatasetView>,
    pub run: RunView,
    pub charts: Option<Charts>,
    pub runs_dir: PathBuf,
    pub config_dir: PathBuf,
    pub notice: Option<String>,
    pub version: &'static str,
}

// ---------------------------------------------------------------------------------------
// Sending events to the web view.
// ---------------------------------------------------------------------------------------

/// Where forwarded events go: the app handle in the app, a recorder in tests.
pub trait EventSink: Send + Sync + 'static {
    fn send(&self, event: &str, payload: Value);
}

impl<R: tauri::Runtime> EventSink for tauri::AppHandle<R> {
    fn send(&self, event: &str, payload: Value) {
        use tauri::Emitter;
        if let Err(e) = self.emit(event, payload) {
            eprintln!("ostinato: could not emit {event}: {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// The state machine.
// ---------------------------------------------------------------------------------------

/// Control of a run the engine is training. The lead implements this for the engine's
/// `RunHandle` (pause/resume/stop forward to it).
pub trait EngineRun: Send {
    fn pause(&self) -> Result<(), BridgeError>;
    fn resume(&self) -> Result<(), BridgeError>;
    fn stop(&self) -> Result<(), BridgeError>;
    /// The run directory (`<runs>/<run-id>`).
    fn run_dir(&self) -> PathBuf;
}

/// What `engine::start` gets: the validated settings and where things are.
#[derive(Debug, Clone)]
pub struct StartRequest {
    pub settings: Settings,
    pub dataset_dir: PathBuf,
    pub runs_dir: PathBuf,
}

struct CurrentRun {
    /// Present while the engine is running the run.
    control: Option<Box<dyn EngineRun>>,
    /// Bumped for every new run, so a late forwarder of an old run changes nothing.
    generation: u64,
    status: RunStatus,
    run_dir: Option<PathBuf>,
    started: Option<Value>,
    last_step: Option<Value>,
    error: Option<String>,
    recent: VecDeque<Value>,
    /// Every event of this run, for re-rendering charts.
    all: Vec<Value>,
    charts: Option<Charts>,
}

impl CurrentRun {
    fn idle() -> Self {
        CurrentRun {
            control: None,
            generation: 0,
            status: RunStatus::Idle,
            run_dir: None,
            started: None,
            last_step: None,
            error: None,
            recent: VecDeque::new(),
            all: Vec::new(),
            charts: None,
        }
    }

    fn view(&self, revision: u64) -> RunView {
        RunView {
            status: self.status,
            run_dir: self.run_dir.clone(),
            started: self.started.clone(),
            last_step: self.last_step.clone(),
            error: self.error.clone(),
            recent_events: self.recent.iter().cloned().collect(),
            revision,
        }
    }

    /// Folds one engine event into the state. Returns true when the status changed.
    fn apply(&mut self, event: &Value) -> bool {
        let ty = event.get("type").and_then(Value::as_str).unwrap_or("");
        match ty {
            "run_started" => self.started = Some(event.clone()),
            "step" => self.last_step = Some(event.clone()),
            "failed" => {
                self.error = Some(
                    event
                        .get("reason")
                        .or_else(|| event.get("error"))
                        .and_then(Value::as_str)
                        .unwrap_or("training failed")
                        .to_string(),
                )
            }
            _ => {}
        }
        if self.recent.len() == RECENT_EVENTS {
            self.recent.pop_front();
        }
        self.recent.push_back(event.clone());
        self.all.push(event.clone());
        let before = self.status;
        if let Some(next) = RunStatus::after_event(ty) {
            // A step that was already queued when Pause was pressed must not flip the
            // status back to running; only `paused` / a terminal event ends "pausing".
            let keep = (before == RunStatus::Pausing || before == RunStatus::Stopping) && ty == "step";
            if !keep {
                self.status = next;
            }
        }
        if !self.status.is_active() {
            self.control = None;
        }
        before != self.status
    }
}

struct Inner {
    settings: Settings,
    dataset: Option<DatasetView>,
    run: CurrentRun,
    notice: Option<String>,
    next_generation: u64,
    /// The last [`RunView::revision`] handed out.
    views: u64,
    /// The web view's appearance: charts are rendered to match it.
    dark: bool,
}

impl Inner {
    /// The current run's view, with the next revision number.
    fn run_view(&mut self) -> RunView {
        self.views += 1;
        self.run.view(self.views)
    }
}

struct Shared {
    inner: Mutex<Inner>,
    config_dir: PathBuf,
    runs_dir: PathBuf,
    models: Models,
}

/// The backend state. Cheap to clone (one `Arc`); managed by tauri and shared with the
/// event-forwarding thread.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    /// Loads settings from `config_dir`; runs live under `runs_dir`; models are looked
    /// for in the system's places.
    pub fn new(config_dir: PathBuf, runs_dir: PathBuf) -> Self {
        Self::with_model_places(config_dir, runs_dir, ModelPlaces::system())
    }

    /// As `new`, looking for models in `places` (and the folders added in `config_dir`).
    pub fn with_model_places(config_dir: PathBuf, runs_dir: PathBuf, places: ModelPlaces) -> Self {
        let (settings, notice) = settings::load(&config_dir);
        AppState(Arc::new(Shared {
            inner: Mutex::new(Inner {
                settings,
                dataset: None,
                run: CurrentRun::idle(),
                notice,
                next_generation: 1,
                views: 0,
                dark: false,
            }),
            models: Models::new(places, config_dir.clone()),
            config_dir,
            runs_dir,
        }))
    }

    /// The model picker: models found, added folders, the download.
    pub fn models(&self) -> &Models {
        &self.0.models
    }

    /// The platform's config dir and runs dir (or `OSTINATO_CONFIG_DIR` / `OSTINATO_RUNS_DIR`).
    pub fn from_env() -> Self {
        AppState::new(settings::default_config_dir(), engine::default_runs_dir())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock must not take the whole UI down with it.
        self.0.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn runs_dir(&self) -> &Path {
        &self.0.runs_dir
    }

    pub fn state(&self) -> StateView {
        let mut g = self.lock();
        StateView {
            settings: g.settings.clone(),
            dataset: g.dataset.clone(),
            run: g.run_view(),
            charts: g.run.charts.clone(),
            runs_dir: self.0.runs_dir.clone(),
            config_dir: self.0.config_dir.clone(),
            notice: g.notice.clone(),
            version: env!("CARGO_PKG_VERSION"),
        }
    }

    /// The web view reports light/dark appearance; charts are drawn to match it.
    pub fn set_appearance(&self, dark: bool) {
        self.lock().dark = dark;
    }

    pub fn settings(&self) -> Settings {
        self.lock().settings.clone()
    }

    /// Validates (the run settings by the engine), persists and adopts new settings.
    pub fn save_settings(&self, new: Settings) -> Result<Settings, BridgeError> {
        new.validate().map_err(BridgeError::InvalidSettings)?;
        run_settings::check_run_settings(&new, &self.0.runs_dir)?;
        settings::save(&self.0.config_dir, &new).map_err(|source| BridgeError::Io {
            context: format!("saving settings in {}", self.0.config_dir.display()),
            source,
        })?;
        let mut g = self.lock();
        g.settings = new.clone();
        g.notice = None;
        Ok(new)
    }

    pub fn reset_settings(&self) -> Result<Settings, BridgeError> {
        let keep_dataset = self.lock().settings.dataset_dir.clone();
        self.save_settings(Settings { dataset_dir: keep_dataset, ..Settings::default() })
    }

    /// Remembers `path` as the dataset folder (persisted) and scans it with the engine.
    /// Slow (decodes audio for durations): call it off the UI thread.
    pub fn scan_dataset(&self, path: &Path) -> Result<DatasetView, BridgeError> {
        if !path.is_dir() {
            return Err(BridgeError::Invalid(format!("not a folder: {}", path.display())));
        }
        let mut s = self.settings();
        if s.dataset_dir.as_deref() != Some(path) {
            s.dataset_dir = Some(path.to_path_buf());
            self.save_settings(s.clone())?;
        }
        let view = dataset_scan::scan(path, &s)?;
        self.lock().dataset = Some(view.clone());
        Ok(view)
    }

    /// The memory the saved settings would need on this machine (fitted to it when the
    /// settings ask), as the engine predicts it.
    pub fn memory_plan(&self) -> Result<MemoryView, BridgeError> {
        let settings = self.settings();
        settings.validate().map_err(BridgeError::InvalidSettings)?;
        let dataset_dir = settings.dataset_dir.clone().unwrap_or_default();
        engine::memory_plan(&StartRequest { settings, dataset_dir, runs_dir: self.0.runs_dir.clone() })
    }

    /// Starts a run with the saved settings; events go to `sink` from a background thread.
    pub fn start_run(&self, sink: impl EventSink) -> Result<RunView, BridgeError> {
        let settings = self.settings();
        settings.validate().map_err(BridgeError::InvalidSettings)?;
        let dataset_dir =
            settings.dataset_dir.clone().ok_or_else(|| BridgeError::Invalid("choose a dataset folder first".into()))?;
        if self.lock().run.status.is_active() {
            return Err(BridgeError::RunActive);
        }
        let req = StartRequest { settings, dataset_dir, runs_dir: self.0.runs_dir.clone() };
        let (control, events) = engine::start(&req)?;
        Ok(self.adopt_run(control, events, sink))
    }

    /// Continues a paused, stopped or interrupted run from its directory.
    pub fn resume_run(&self, dir: &Path, sink: impl EventSink) -> Result<RunView, BridgeError> {
        let dir = self.checked_run_dir(dir)?;
        if self.lock().run.status.is_active() {
            return Err(BridgeError::RunActive);
        }
        let (control, events) = engine::resume(&dir)?;
        Ok(self.adopt_run(control, events, sink))
    }

    /// Makes a freshly started engine run the current run and starts forwarding its
    /// events. Public so tests can drive the forwarder with a scripted run.
    pub fn adopt_run(&self, control: Box<dyn EngineRun>, events: Receiver<Value>, sink: impl EventSink) -> RunView {
        let sink: Arc<dyn EventSink> = Arc::new(sink);
        let (generation, view) = {
            let mut g = self.lock();
            let generation = g.next_generation;
            g.next_generation += 1;
            g.run = CurrentRun::idle();
            g.run.generation = generation;
            g.run.run_dir = Some(control.run_dir());
            g.run.status = RunStatus::Running;
            g.run.control = Some(control);
            (generation, g.run_view())
        };
        sink.send(RUN_EVENT, serde_json::to_value(&view).unwrap_or(Value::Null));
        let state = self.clone();
        std::thread::Builder::new()
            .name("ostinato-events".into())
            .spawn(move || state.forward(generation, events, sink))
            .expect("spawning the event thread");
        view
    }

    /// The forwarding loop: folds each event into the state, emits it, and re-renders the
    /// charts at most every [`CHART_INTERVAL`] (and once more when the run ends).
    fn forward(&self, generation: u64, events: Receiver<Value>, sink: Arc<dyn EventSink>) {
        let mut last_render: Option<Instant> = None;
        let mut dirty = false;
        let mut chart_error_reported = false;
        loop {
            let (ended, event) = match events.recv_timeout(CHART_INTERVAL / 2) {
                Ok(ev) => (false, Some(ev)),
                Err(RecvTimeoutError::Timeout) => (false, None),
                Err(RecvTimeoutError::Disconnected) => (true, None),
            };
            if let Some(ev) = event {
                let changed = {
                    let mut g = self.lock();
                    if g.run.generation != generation {
                        return;
                    }
                    g.run.apply(&ev)
                };
                sink.send(ENGINE_EVENT, ev);
                if changed {
                    let view = self.lock().run_view();
                    sink.send(RUN_EVENT, serde_json::to_value(view).unwrap_or(Value::Null));
                }
                dirty = true;
            }
            if ended {
                let view = {
                    let mut g = self.lock();
                    if g.run.generation != generation {
                        return;
                    }
                    g.run.control = None;
                    if g.run.status.is_active() {
                        // The engine's thread went away without saying how the run ended.
                        g.run.status = RunStatus::Failed;
                        g.run.error.get_or_insert_with(|| {
                            "the engine stopped sending events without finishing the run".into()
                        });
                    }
                    g.run_view()
                };
                sink.send(RUN_EVENT, serde_json::to_value(view).unwrap_or(Value::Null));
            }
            let due = last_render.is_none_or(|t| t.elapsed() >= CHART_INTERVAL);
            if dirty && (due || ended) {
                let (events, dark) = {
                    let g = self.lock();
                    (g.run.all.clone(), g.dark)
                };
                match engine::render_charts(&events, dark) {
                    Ok(charts) => {
                        let mut g = self.lock();
                        if g.run.generation == generation {
                            g.run.charts = Some(charts.clone());
                        }
                        drop(g);
                        sink.send(CHARTS_EVENT, serde_json::to_value(charts).unwrap_or(Value::Null));
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

    fn with_control(
        &self,
        next: Option<RunStatus>,
        f: impl FnOnce(&dyn EngineRun) -> Result<(), BridgeError>,
    ) -> Result<RunView, BridgeError> {
        let mut g = self.lock();
        let control = g.run.control.as_deref().ok_or(BridgeError::NoActiveRun)?;
        f(control)?;
        if let Some(next) = next {
            g.run.status = next;
        }
        Ok(g.run_view())
    }

    /// Asks the run to pause; the status is "pausing" until the engine's `paused` event.
    pub fn pause(&self) -> Result<RunView, BridgeError> {
        if self.lock().run.status != RunStatus::Running {
            return Err(BridgeError::Invalid("the run is not running".into()));
        }
        self.with_control(Some(RunStatus::Pausing), |c| c.pause())
    }

    pub fn resume(&self) -> Result<RunView, BridgeError> {
        if !matches!(self.lock().run.status, RunStatus::Paused | RunStatus::Pausing) {
            return Err(BridgeError::Invalid("the run is not paused".into()));
        }
        self.with_control(None, |c| c.resume())
    }

    /// Asks the run to stop (it saves a checkpoint and ends with a `stopped` event).
    pub fn stop(&self) -> Result<RunView, BridgeError> {
        self.with_control(Some(RunStatus::Stopping), |c| c.stop())
    }

    /// The runs under the runs dir, most recently updated first.
    pub fn list_runs(&self) -> Result<Vec<HistoryEntry>, BridgeError> {
        // Runs are directly under the runs dir: the current one is known by its name.
        let active = {
            let g = self.lock();
            g.run
                .status
                .is_active()
                .then(|| g.run.run_dir.as_deref().and_then(Path::file_name).map(|n| n.to_owned()))
                .flatten()
        };
        let runs_dir = self.0.runs_dir.canonicalize().unwrap_or_else(|_| self.0.runs_dir.clone());
        let mut runs = engine::list_runs(&runs_dir)?;
        runs.sort_by(|a, b| b.updated_unix.cmp(&a.updated_unix).then_with(|| b.name.cmp(&a.name)));
        Ok(runs
            .into_iter()
            .map(|mut summary| {
                let active = active.as_deref().is_some_and(|n| n == summary.name.as_str());
                summary.resumable &= !active;
                HistoryEntry { summary, active }
            })
            .collect())
    }

    /// Charts of the current run (`dir` = None) or of a past run replayed from its log.
    pub fn charts(&self, dir: Option<&Path>) -> Result<Charts, BridgeError> {
        match dir {
            None => {
                let (events, dark) = {
                    let g = self.lock();
                    (g.run.all.clone(), g.dark)
                };
                engine::render_charts(&events, dark)
            }
            Some(dir) => {
                let dir = self.checked_run_dir(dir)?;
                engine::replay_charts(&dir.join("events.jsonl"), self.lock().dark)
            }
        }
    }

    /// Exports a run's adapter (its final one, else its newest checkpoint) into `to`.
    pub fn export(&self, dir: &Path, format: ExportFormat, to: &Path) -> Result<PathBuf, BridgeError> {
        let dir = self.checked_run_dir(dir)?;
        if !to.is_dir() {
            return Err(BridgeError::Invalid(format!("not a folder: {}", to.display())));
        }
        engine::export(&dir, format, to, &self.settings())
    }

    /// Only directories directly under the runs dir are accepted as runs: the web view
    /// cannot point resume/export/charts at arbitrary paths.
    fn checked_run_dir(&self, dir: &Path) -> Result<PathBuf, BridgeError> {
        let bad = || BridgeError::Invalid(format!("not a run of this app: {}", dir.display()));
        let dir = dir.canonicalize().map_err(|_| bad())?;
        let runs = self.0.runs_dir.canonicalize().map_err(|_| bad())?;
        if dir.parent() != Some(runs.as_path()) || !dir.join("events.jsonl").is_file() {
            return Err(bad());
        }
        Ok(dir)
    }
}

/// Turns a receiver of any serializable event type (the engine's `Event`) into the
/// `Value` receiver the forwarder takes, on a small thread of its own.
pub fn value_channel<T: Serialize + Send + 'static>(rx: Receiver<T>) -> Receiver<Value> {
    let (tx, out) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("ostinato-event-json".into())
        .spawn(move || {
            for ev in rx {
                let v = serde_json::to_value(&ev)
                    .unwrap_or_else(|e| json!({"type": "bridge_error", "error": e.to_string()}));
                if tx.send(v).is_err() {
                    break;
                }
            }
        })
        .expect("spawning the event conversion thread");
    out
}

// ---------------------------------------------------------------------------------------
// The engine: the only place the app calls it.
// ---------------------------------------------------------------------------------------
mod engine {
    use super::*;
    use super::run_settings::run_config;
    use ostinato_engine::charts::{render_svg, Chart, Theme};
    use ostinato_engine::events::{read_events, Event};
    use ostinato_engine::run_state::RunState;
    use ostinato_engine::export::{export_run, ExportFormat as EngineFormat};
    pub use ostinato_engine::train::history::RunSummary;
    use ostinato_engine::train::{fit, history, Run, RunControl, RunHandle};
    use ostinato_engine::Error as EngineError;

    pub(super) fn engine_err(e: impl std::fmt::Display) -> BridgeError {
        BridgeError::Engine(e.to_string())
    }

    /// `OSTINATO_RUNS_DIR`, else the engine's default (the one the CLI uses too).
    pub fn default_runs_dir() -> PathBuf {
        std::env::var_os("OSTINATO_RUNS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(ostinato_engine::train::config::default_runs_dir)
    }

    struct Handle {
        control: RunControl,
        run_dir: PathBuf,
    }

    impl EngineRun for Handle {
        fn pause(&self) -> Result<(), BridgeError> {
            self.control.pause();
            Ok(())
        }
        fn resume(&self) -> Result<(), BridgeError> {
            self.control.resume();
            Ok(())
        }
        fn stop(&self) -> Result<(), BridgeError> {
            self.control.stop();
            Ok(())
        }
        fn run_dir(&self) -> PathBuf {
            self.run_dir.clone()
        }
    }

    /// The run's control and its events as JSON values; the handle's thread is
    /// joined by the event thread once the events end.
    fn attach(handle: RunHandle) -> (Box<dyn EngineRun>, Receiver<Value>) {
        let control = Handle { control: handle.control(), run_dir: handle.run_dir().to_path_buf() };
        let (tx, rx) = std::sync::mpsc::channel::<Event>();
        std::thread::Builder::new()
            .name("ostinato-run-events".into())
            .spawn(move || {
                for event in handle.events().iter() {
                    if tx.send(event).is_err() {
                        break;
                    }
                }
                let _ = handle.join();
            })
            .expect("spawning the run event thread");
        (Box::new(control), value_channel(rx))
    }

    pub fn start(req: &StartRequest) -> Result<(Box<dyn EngineRun>, Receiver<Value>), BridgeError> {
        let mut config = run_config(req);
        if req.settings.fit_memory {
            fit::fit_auto(&mut config).map_err(engine_err)?;
        }
        Run::start(config).map(attach).map_err(engine_err)
    }

    /// The engine's plan for the settings: fitted when they ask, else as given; a
    /// plan that does not fit carries the engine's reason.
    pub fn memory_plan(req: &StartRequest) -> Result<MemoryView, BridgeError> {
        let mut config = run_config(req);
        let given = fit::plan(&config).map_err(engine_err)?;
        let plan = match req.settings.fit_memory {
            true => fit::fit_auto(&mut config),
            false => fit::check(&given).map(|()| given.clone()),
        };
        match plan {
            Ok(p) => Ok(MemoryView { summary: p.summary(), fits: true, changes: p.changes, problem: None }),
            Err(e @ EngineError::WontFit { .. }) => Ok(MemoryView {
                summary: given.summary(),
                fits: false,
                changes: Vec::new(),
                problem: Some(e.to_string()),
            }),
            Err(e) => Err(engine_err(e)),
        }
    }

    pub fn resume(run_dir: &Path) -> Result<(Box<dyn EngineRun>, Receiver<Value>), BridgeError> {
        Run::resume(run_dir).map(attach).map_err(engine_err)
    }

    /// Every run under `runs_dir`, summarised by the engine from its files.
    pub fn list_runs(runs_dir: &Path) -> Result<Vec<RunSummary>, BridgeError> {
        history::list_runs(runs_dir).map_err(engine_err)
    }

    /// The charts, drawn by the engine from the run's events.
    pub fn render_charts(events: &[Value], dark: bool) -> Result<Charts, BridgeError> {
        let events: Vec<Event> = events.iter().filter_map(|v| serde_json::from_value(v.clone()).ok()).collect();
        draw_charts(&events, dark)
    }

    /// The charts of a past run, replayed from its `events.jsonl`.
    pub fn replay_charts(log: &Path, dark: bool) -> Result<Charts, BridgeError> {
        draw_charts(&read_events(log).map_err(engine_err)?, dark)
    }

    fn draw_charts(events: &[Event], dark: bool) -> Result<Charts, BridgeError> {
        let theme = if dark { Theme::Dark } else { Theme::Light };
        let run = RunState::replay(events);
        let draw = |chart| render_svg(chart, &run, (720, 300), theme).map(|d| d.svg).map_err(engine_err);
        Ok(Charts {
            loss: draw(Chart::Loss)?,
            throughput: draw(Chart::Throughput)?,
            memory: draw(Chart::Memory)?,
            noise_levels: draw(Chart::NoiseLevel)?,
        })
    }

    /// Into the folder `to`: `<run>-peft/`, `<run>-comfyui.safetensors` or
    /// `<run>-merged.safetensors`.
    pub fn export(
        run_dir: &Path,
        format: ExportFormat,
        to: &Path,
        _settings: &Settings,
    ) -> Result<PathBuf, BridgeError> {
        let run = run_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let (format, target) = match format {
            ExportFormat::Peft => (EngineFormat::Peft, to.join(format!("{run}-peft"))),
            ExportFormat::Comfyui => (EngineFormat::Comfyui, to.join(format!("{run}-comfyui.safetensors"))),
            ExportFormat::Merged => (EngineFormat::Merged, to.join(format!("{run}-merged.safetensors"))),
        };
        export_run(run_dir, format, &target).map_err(engine_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[derive(Default, Clone)]
    struct Recorder(Arc<Mutex<Vec<(String, Value)>>>);
    impl EventSink for Recorder {
        fn send(&self, event: &str, payload: Value) {
            self.0.lock().unwrap().push((event.to_string(), payload));
        }
    }

    /// A test double for the engine's run control: records calls. Events come from the
    /// test through the channel.
    struct Scripted(PathBuf, Arc<Mutex<Vec<&'static str>>>);
    impl EngineRun for Scripted {
        fn pause(&self) -> Result<(), BridgeError> {
            self.1.lock().unwrap().push("pause");
            Ok(())
        }
        fn resume(&self) -> Result<(), BridgeError> {
            self.1.lock().unwrap().push("resume");
            Ok(())
        }
        fn stop(&self) -> Result<(), BridgeError> {
            self.1.lock().unwrap().push("stop");
            Ok(())
        }
        fn run_dir(&self) -> PathBuf {
            self.0.clone()
        }
    }

    fn wait_for(mut f: impl FnMut() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(5), "timed out");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The race the window met on CI: the engine paused before Pause's reply reached
    /// the web view, which then showed the reply's "pausing" for good. The `run-state`
    /// view sent for `paused` must outrank that reply, as the web view keeps the higher.
    #[test]
    fn a_commands_reply_is_outranked_by_the_views_that_follow_it() {
        let tmp = tempfile::tempdir().unwrap();
        let state = AppState::new(tmp.path().join("cfg"), tmp.path().join("runs"));
        let (tx, rx) = mpsc::channel();
        let rec = Recorder::default();
        let started = state.adopt_run(Box::new(Scripted(tmp.path().join("runs/r1"), Arc::default())), rx, rec.clone());
        let reply = state.pause().unwrap();
        assert_eq!(reply.status, RunStatus::Pausing);
        assert!(reply.revision > started.revision, "{} after {}", reply.revision, started.revision);
        tx.send(json!({"type": "paused", "step": 1})).unwrap();
        wait_for(|| state.state().run.status == RunStatus::Paused);
        let paused = rec
            .0
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(e, v)| e == RUN_EVENT && v["status"] == "paused")
            .map(|(_, v)| v.clone());
        let paused = paused.expect("a run-state view for paused");
        assert!(paused["revision"].as_u64().unwrap() > reply.revision, "paused {paused} vs reply {}", reply.revision);
        assert!(state.state().run.revision > paused["revision"].as_u64().unwrap());
    }

    #[test]
    fn forwards_events_and_tracks_status() {
        let tmp = tempfile::tempdir().unwrap();
        let state = AppState::new(tmp.path().join("cfg"), tmp.path().join("runs"));
        let calls = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let rec = Recorder::default();
        let view = state.adopt_run(Box::new(Scripted(tmp.path().join("runs/r1"), calls.clone())), rx, rec.clone());
        assert_eq!(view.status, RunStatus::Running);

        tx.send(json!({"type": "run_started", "device": "cpu"})).unwrap();
        tx.send(json!({"type": "step", "step": 1, "loss": 0.9})).unwrap();
        wait_for(|| state.state().run.last_step.is_some());
        state.pause().unwrap();
        assert_eq!(state.state().run.status, RunStatus::Pausing);
        // A step already in flight keeps the run "pausing".
        tx.send(json!({"type": "step", "step": 2, "loss": 0.8})).unwrap();
        tx.send(json!({"type": "paused", "step": 2})).unwrap();
        wait_for(|| state.state().run.status == RunStatus::Paused);
        assert!(state.pause().is_err(), "pausing a paused run is an error");
        state.resume().unwrap();
        tx.send(json!({"type": "resumed"})).unwrap();
        wait_for(|| state.state().run.status == RunStatus::Running);
        state.stop().unwrap();
        tx.send(json!({"type": "stopped", "step": 2})).unwrap();
        drop(tx);
        wait_for(|| state.state().run.status == RunStatus::Stopped);
        assert_eq!(*calls.lock().unwrap(), ["pause", "resume", "stop"]);
        assert!(matches!(state.stop(), Err(BridgeError::NoActiveRun)));

        let s = state.state();
        assert_eq!(s.run.last_step.unwrap()["step"], 2);
        assert_eq!(s.run.started.unwrap()["device"], "cpu");
        assert_eq!(s.run.recent_events.len(), 6);
        wait_for(|| rec.0.lock().unwrap().iter().filter(|(n, _)| n == ENGINE_EVENT).count() == 6);
        let sent = rec.0.lock().unwrap();
        let types: Vec<_> =
            sent.iter().filter(|(n, _)| n == ENGINE_EVENT).map(|(_, v)| v["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["run_started", "step", "step", "paused", "resumed", "stopped"]);
        assert!(sent.iter().any(|(n, v)| n == RUN_EVENT && v["status"] == "stopped"));
    }

    #[test]
    fn a_stream_that_just_ends_is_a_failure() {
        let tmp = tempfile::tempdir().unwrap();
        let state = AppState::new(tmp.path().join("cfg"), tmp.path().join("runs"));
        let (tx, rx) = mpsc::channel();
        state.adopt_run(Box::new(Scripted(tmp.path().into(), Default::default())), rx, Recorder::default());
        tx.send(json!({"type": "step", "step": 1})).unwrap();
        drop(tx);
        wait_for(|| state.state().run.status == RunStatus::Failed);
        assert!(state.state().run.error.unwrap().contains("stopped sending events"));
    }

    #[test]
    fn recent_events_are_bounded() {
        let mut run = CurrentRun::idle();
        for i in 0..(RECENT_EVENTS + 10) {
            run.apply(&json!({"type": "step", "step": i}));
        }
        assert_eq!(run.recent.len(), RECENT_EVENTS);
        assert_eq!(run.recent[0]["step"], 10);
        assert_eq!(run.all.len(), RECENT_EVENTS + 10);
    }

    /// A `step` line as the engine writes it.
    fn step_line(step: u64, loss: f64) -> Value {
        json!({"v": 1, "type": "step", "step": step, "epoch": 0, "loss": loss, "lr": 1e-3, "grad_norm": 1.0,
            "samples_per_sec": 1.0, "memory_now_bytes": 0, "memory_peak_bytes": 0, "elapsed_s": 1.0, "eta_s": null})
    }

    #[test]
    fn lists_runs_newest_first_with_the_current_one_active() {
        let tmp = tempfile::tempdir().unwrap();
        let runs = tmp.path().join("runs");
        let now = std::time::SystemTime::now();
        // Updated `age` seconds ago; names sort the other way round, so the order is by time.
        let write = |id: &str, age: u64, lines: &[Value], tail: &str| {
            let d = runs.join(id);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("run.toml"), "").unwrap();
            let mut s: String = lines.iter().map(|l| format!("{l}\n")).collect();
            s.push_str(tail);
            let log = d.join("events.jsonl");
            std::fs::write(&log, s).unwrap();
            let f = std::fs::File::options().write(true).open(&log).unwrap();
            f.set_modified(now - Duration::from_secs(age)).unwrap();
        };
        // Paused, then the app was quit: resumable (as stopped).
        write("a-paused", 100, &[step_line(5, 0.5), json!({"v": 1, "type": "paused", "step": 5})], "");
        // Cut mid-line by a crash: the partial line is skipped and the run is interrupted.
        write("b-crashed", 200, &[step_line(7, 0.4)], "{\"v\":1,\"type\":\"st");
        write(
            "c-done",
            300,
            &[
                step_line(9, 0.3),
                json!({"v": 1, "type": "finished", "adapter_path": "x", "steps": 9, "final_loss": 0.3}),
            ],
            "",
        );
        // Resumable runs have a checkpoint to resume from.
        for (id, step) in [("a-paused", 5), ("b-crashed", 7)] {
            std::fs::create_dir_all(runs.join(id).join(format!("checkpoints/step-{step:06}"))).unwrap();
        }
        // A folder with a log but no run.toml is not a run.
        let no_config = runs.join("d-no-config");
        std::fs::create_dir_all(&no_config).unwrap();
        std::fs::write(no_config.join("events.jsonl"), format!("{}\n", step_line(1, 0.1))).unwrap();

        let state = AppState::new(tmp.path().join("cfg"), runs.clone());
        let list = state.list_runs().unwrap();
        let got: Vec<_> =
            list.iter().map(|r| (r.summary.name.as_str(), r.summary.steps, r.summary.resumable, r.active)).collect();
        assert_eq!(got, [("a-paused", 5, true, false), ("b-crashed", 7, true, false), ("c-done", 9, false, false)]);
        let json = serde_json::to_value(&list).unwrap();
        let statuses: Vec<_> = json.as_array().unwrap().iter().map(|r| r["status"].as_str().unwrap()).collect();
        assert_eq!(statuses, ["stopped", "interrupted", "finished"]);
        assert_eq!(json[0]["last_loss"], 0.5);
        assert_eq!(json[0]["dir"], json!(runs.canonicalize().unwrap().join("a-paused")));
        assert_eq!(json[2]["adapter"], Value::Null);

        // The run the app is training now is active, and not resumable from the list.
        let (tx, rx) = mpsc::channel::<Value>();
        state.adopt_run(Box::new(Scripted(runs.join("b-crashed"), Default::default())), rx, Recorder::default());
        let list = state.list_runs().unwrap();
        let active: Vec<_> =
            list.iter().filter(|r| r.active).map(|r| (r.summary.name.as_str(), r.summary.resumable)).collect();
        assert_eq!(active, [("b-crashed", false)]);
        drop(tx);

        // Paths outside the runs dir are refused before the engine is asked.
        assert!(matches!(state.resume_run(tmp.path(), Recorder::default()), Err(BridgeError::Invalid(_))));
        std::fs::create_dir_all(runs.join("not-a-run")).unwrap();
        assert!(matches!(state.resume_run(&runs.join("not-a-run"), Recorder::default()), Err(BridgeError::Invalid(_))));
        // A run directory without run.toml: the engine says what is missing.
        wait_for(|| !state.state().run.status.is_active());
        match state.resume_run(&no_config, Recorder::default()) {
            Err(BridgeError::Engine(m)) => assert!(m.contains("run.toml"), "{m}"),
            other => panic!("{other:?}"),
        }
        // A past run's charts are replayed from its log.
        let charts = state.charts(Some(&runs.join("c-done"))).unwrap();
        assert!(charts.loss.contains("<svg"), "{}", charts.loss);
    }

    #[test]
    fn value_channel_serializes() {
        #[derive(Serialize)]
        #[serde(tag = "type", rename_all = "snake_case")]
        enum Ev {
            Step { step: u64 },
        }
        let (tx, rx) = mpsc::channel();
        let out = value_channel(rx);
        tx.send(Ev::Step { step: 3 }).unwrap();
        drop(tx);
        assert_eq!(out.recv().unwrap(), json!({"type": "step", "step": 3}));
        assert!(out.recv().is_err());
    }
}

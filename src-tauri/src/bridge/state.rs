//! The app's state: settings, the current dataset scan, the current run, the web view's
//! appearance; what reads and changes them apart from the run's control (run.rs) and
//! the dataset editor, listening and captioning (labels.rs, listen.rs, captions.rs).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use ostinato_engine::cancel::Cancel;
use ostinato_engine::load::ModelPlaces;

use super::current_run::CurrentRun;
use super::error::BridgeError;
use super::run_settings::StartRequest;
use super::views::{Charts, Choices, DatasetView, ExportFormat, HistoryEntry, MemoryView, StateView};
use super::{dataset_scan, engine};
use crate::models::Models;
use crate::settings::{self, Settings};

pub(super) struct Inner {
    pub settings: Settings,
    pub dataset: Option<DatasetView>,
    pub run: CurrentRun,
    pub notice: Option<String>,
    pub next_generation: u64,
    /// The id of the next requested song or A/B pair.
    pub next_song: u64,
    /// The web view's appearance: charts are rendered to match it.
    pub dark: bool,
    /// The cancel token of the captioning in progress (captions.rs): one at a time.
    pub captioning: Option<Cancel>,
    /// The id of the next captioning batch.
    pub next_caption_batch: u64,
}

impl Inner {
    /// A new id for a requested song or A/B pair (their events carry it).
    pub fn take_song_id(&mut self) -> u64 {
        self.next_song += 1;
        self.next_song - 1
    }
}

struct Shared {
    inner: Mutex<Inner>,
    config_dir: PathBuf,
    runs_dir: PathBuf,
    /// The label store's folder: `labels` beside the runs folder (in the platform
    /// data folder, where the CLI keeps them too).
    labels_dir: PathBuf,
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
                next_song: 1,
                dark: false,
                captioning: None,
                next_caption_batch: 1,
            }),
            models: Models::new(places, config_dir.clone()),
            config_dir,
            labels_dir: runs_dir.parent().unwrap_or(Path::new(".")).join("labels"),
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

    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock must not take the whole UI down with it.
        self.0.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn runs_dir(&self) -> &Path {
        &self.0.runs_dir
    }

    pub fn labels_dir(&self) -> &Path {
        &self.0.labels_dir
    }

    /// What a run started now is asked to train on.
    pub(super) fn start_request(&self, settings: Settings, dataset_dir: PathBuf) -> StartRequest {
        StartRequest { settings, dataset_dir, runs_dir: self.0.runs_dir.clone(), labels_dir: self.0.labels_dir.clone() }
    }

    pub fn state(&self) -> StateView {
        let g = self.lock();
        StateView {
            settings: g.settings.clone(),
            choices: Choices::default(),
            dataset: g.dataset.clone(),
            run: g.run.snapshot(),
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

    /// Validates (by the engine), persists and adopts new settings (with what a new
    /// optimizer brings: `Settings::adopting`).
    pub fn save_settings(&self, new: Settings) -> Result<Settings, BridgeError> {
        let new = self.settings().adopting(new);
        new.validate().map_err(BridgeError::InvalidSettings)?;
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
        let mut fresh = Settings::default();
        fresh.run.data.folder = self.lock().settings.run.data.folder.clone();
        self.save_settings(fresh)
    }

    /// Remembers `path` as the dataset folder (persisted) and scans it with the engine.
    /// Slow (decodes audio for durations): call it off the UI thread.
    pub fn scan_dataset(&self, path: &Path) -> Result<DatasetView, BridgeError> {
        if !path.is_dir() {
            return Err(BridgeError::Invalid(format!("not a folder: {}", path.display())));
        }
        let mut s = self.settings();
        if s.dataset_dir() != Some(path) {
            s.run.data.folder = path.to_path_buf();
            self.save_settings(s.clone())?;
        }
        let view = dataset_scan::scan(path, &self.label_store())?;
        self.lock().dataset = Some(view.clone());
        Ok(view)
    }

    /// The scanned dataset's folder, when `name` (relative to it) is one of its usable songs.
    pub(super) fn usable_song_folder(&self, name: &str) -> Result<PathBuf, BridgeError> {
        let g = self.lock();
        let dataset = g.dataset.as_ref().ok_or_else(|| BridgeError::Invalid("scan a dataset folder first".into()))?;
        match dataset.files.iter().any(|f| f.name == name && f.status == "ok") {
            true => Ok(dataset.path.clone()),
            false => Err(BridgeError::Invalid(format!("not a usable song of the dataset: {name}"))),
        }
    }

    /// The memory the saved settings would need on this machine (fitted to it when the
    /// settings ask), as the engine predicts it.
    pub fn memory_plan(&self) -> Result<MemoryView, BridgeError> {
        let settings = self.settings();
        settings.validate().map_err(BridgeError::InvalidSettings)?;
        let dataset_dir = settings.run.data.folder.clone();
        engine::memory_plan(&self.start_request(settings, dataset_dir))
    }

    /// The runs under the runs dir, most recently updated first.
    pub fn list_runs(&self) -> Result<Vec<HistoryEntry>, BridgeError> {
        // Runs are directly under the runs dir: the current one is known by its name.
        let active = self.lock().run.active_dir().and_then(Path::file_name).map(|n| n.to_owned());
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

    /// Charts of the current run (`dir` = None), drawn from its state, or of a past run
    /// replayed from its log.
    pub fn charts(&self, dir: Option<&Path>) -> Result<Charts, BridgeError> {
        match dir {
            None => {
                let (run, dark) = {
                    let g = self.lock();
                    (g.run.state.clone(), g.dark)
                };
                engine::render_charts(&run, dark)
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
        engine::export(&dir, format, to)
    }

    /// Only directories directly under the runs dir are accepted as runs: the web view
    /// cannot point resume/export/charts at arbitrary paths.
    pub(super) fn checked_run_dir(&self, dir: &Path) -> Result<PathBuf, BridgeError> {
        let bad = || BridgeError::Invalid(format!("not a run of this app: {}", dir.display()));
        let dir = dir.canonicalize().map_err(|_| bad())?;
        let runs = self.0.runs_dir.canonicalize().map_err(|_| bad())?;
        if dir.parent() != Some(runs.as_path()) || !dir.join("events.jsonl").is_file() {
            return Err(bad());
        }
        Ok(dir)
    }
}

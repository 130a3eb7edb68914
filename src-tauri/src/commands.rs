//! IPC commands the web view calls. Thin: each one hands over to [`AppState`] and turns
//! its error into a [`CommandError`] the UI can show. Anything slow runs off the main
//! thread (async commands + `spawn_blocking`).

pub mod listen;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;
use tauri::{AppHandle, Runtime, State};

use crate::bridge::{
    AppState, BridgeError, CaptionStart, Charts, DatasetView, EstimateView, ExportFormat, FileRow, HistoryEntry,
    MemoryView, RunView, SidecarReport, StateView,
};
use crate::settings::{FieldErrors, Settings};
use ostinato_engine::data::Field;
use ostinato_engine::load::{Downloadable, FoundLm, FoundModel, Hub};

/// What a failed command rejects with in JS: `{kind, message, fields?}`.
#[derive(Debug, Serialize)]
pub struct CommandError {
    pub kind: &'static str,
    pub message: String,
    /// For invalid settings: field name -> problem.
    #[serde(skip_serializing_if = "FieldErrors::is_empty")]
    pub fields: FieldErrors,
}

impl From<BridgeError> for CommandError {
    fn from(e: BridgeError) -> Self {
        let kind = e.kind();
        match e {
            BridgeError::InvalidSettings(fields) => {
                CommandError { kind, message: fields.values().cloned().collect::<Vec<_>>().join("; "), fields }
            }
            other => CommandError { kind, message: other.to_string(), fields: FieldErrors::new() },
        }
    }
}

type Res<T> = Result<T, CommandError>;

/// Runs blocking bridge work on tauri's blocking pool so the UI thread never waits.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, BridgeError> + Send + 'static) -> Res<T> {
    tauri::async_runtime::spawn_blocking(f)
        .await
        .map_err(|e| CommandError { kind: "internal", message: e.to_string(), fields: FieldErrors::new() })?
        .map_err(CommandError::from)
}

#[tauri::command]
pub fn get_state(state: State<'_, AppState>) -> StateView {
    state.state()
}

/// The web view's light/dark appearance, so the engine draws charts to match.
#[tauri::command]
pub fn set_appearance(state: State<'_, AppState>, dark: bool) {
    state.set_appearance(dark)
}

#[tauri::command]
pub fn save_settings(state: State<'_, AppState>, settings: Settings) -> Res<Settings> {
    Ok(state.save_settings(settings)?)
}

#[tauri::command]
pub fn reset_settings(state: State<'_, AppState>) -> Res<Settings> {
    Ok(state.reset_settings()?)
}

/// Native folder dialog (rfd, gtk3 on Linux). `None` when the user cancels.
#[tauri::command]
pub async fn choose_folder(title: Option<String>, start: Option<String>) -> Res<Option<String>> {
    let mut dialog = rfd::AsyncFileDialog::new().set_title(title.as_deref().unwrap_or("Choose a folder"));
    if let Some(start) = start.filter(|s| !s.is_empty()) {
        dialog = dialog.set_directory(start);
    }
    Ok(dialog.pick_folder().await.map(|h| h.path().display().to_string()))
}

#[tauri::command]
pub async fn scan_dataset(state: State<'_, AppState>, path: String) -> Res<DatasetView> {
    let state = state.inner().clone();
    blocking(move || state.scan_dataset(&PathBuf::from(path))).await
}

/// Sets one label (caption, lyrics, bpm, keyscale, timesignature, language, genre) of a song
/// of the scanned dataset, checked by the engine; the song's row as it now is.
#[tauri::command]
pub async fn set_label(state: State<'_, AppState>, name: String, field: String, value: String) -> Res<FileRow> {
    let state = state.inner().clone();
    blocking(move || state.set_label(&name, &field, &value)).await
}

/// Accepts the analysis's readings (field -> value) for a song; its row as it now is.
#[tauri::command]
pub async fn accept_labels(state: State<'_, AppState>, name: String, values: BTreeMap<String, String>) -> Res<FileRow> {
    let state = state.inner().clone();
    blocking(move || state.accept_labels(&name, &values)).await
}

/// Tempo, key and time signature read from a song's audio, as estimates.
#[tauri::command]
pub async fn analyse_song(state: State<'_, AppState>, name: String) -> Res<BTreeMap<Field, EstimateView>> {
    let state = state.inner().clone();
    blocking(move || state.analyse_song(&name)).await
}

/// The complete 5 Hz LMs found, the one captioning takes by default first.
#[tauri::command]
pub async fn caption_lms(state: State<'_, AppState>) -> Res<Vec<FoundLm>> {
    let state = state.inner().clone();
    blocking(move || state.caption_lms()).await
}

/// Starts captioning songs of the scanned folder (`names`; absent: every usable one)
/// with ACE-Step's LM at `lm` (absent: the one found first); their progress and
/// outcomes arrive as `caption-progress`, `caption-song` and `caption-done` events.
#[tauri::command]
pub async fn caption_songs<R: Runtime>(
    app: AppHandle<R>,
    state: State<'_, AppState>,
    names: Option<Vec<String>>,
    lm: Option<String>,
) -> Res<CaptionStart> {
    let state = state.inner().clone();
    blocking(move || state.start_captions(names, lm.as_deref().map(std::path::Path::new), app)).await
}

/// Cancels the captioning in progress; whether there was one.
#[tauri::command]
pub fn cancel_captions(state: State<'_, AppState>) -> bool {
    state.cancel_captions()
}

/// Writes every song's labels beside it as ACE-Step sidecars (replacing ones that say
/// something else only with `replace`).
#[tauri::command]
pub async fn write_sidecars(state: State<'_, AppState>, replace: bool) -> Res<SidecarReport> {
    let state = state.inner().clone();
    blocking(move || state.write_sidecars(replace)).await
}

/// The predicted peak memory of a run with the saved settings, before Start.
#[tauri::command]
pub async fn memory_plan(state: State<'_, AppState>) -> Res<MemoryView> {
    let state = state.inner().clone();
    blocking(move || state.memory_plan()).await
}

#[tauri::command]
pub async fn start_run<R: Runtime>(app: AppHandle<R>, state: State<'_, AppState>) -> Res<RunView> {
    let state = state.inner().clone();
    blocking(move || state.start_run(app)).await
}

#[tauri::command]
pub fn pause_run(state: State<'_, AppState>) -> Res<RunView> {
    Ok(state.pause()?)
}

#[tauri::command]
pub fn resume_run(state: State<'_, AppState>) -> Res<RunView> {
    Ok(state.resume()?)
}

#[tauri::command]
pub fn stop_run(state: State<'_, AppState>) -> Res<RunView> {
    Ok(state.stop()?)
}

#[tauri::command]
pub async fn list_runs(state: State<'_, AppState>) -> Res<Vec<HistoryEntry>> {
    let state = state.inner().clone();
    blocking(move || state.list_runs()).await
}

/// Resumes a past (paused / stopped / interrupted) run from its directory.
#[tauri::command]
pub async fn resume_past_run<R: Runtime>(app: AppHandle<R>, state: State<'_, AppState>, dir: String) -> Res<RunView> {
    let state = state.inner().clone();
    blocking(move || state.resume_run(&PathBuf::from(dir), app)).await
}

/// Charts of the current run (`dir` absent) or of a past run replayed from its log.
#[tauri::command]
pub async fn run_charts(state: State<'_, AppState>, dir: Option<String>) -> Res<Charts> {
    let state = state.inner().clone();
    blocking(move || state.charts(dir.as_deref().map(std::path::Path::new))).await
}

#[tauri::command]
pub async fn export_run(state: State<'_, AppState>, dir: String, format: ExportFormat, to: String) -> Res<String> {
    let state = state.inner().clone();
    blocking(move || state.export(&PathBuf::from(dir), format, &PathBuf::from(to)).map(|p| p.display().to_string()))
        .await
}

/// The ACE-Step models found on this machine (hub cache, ACE-Step checkpoints, added
/// folders): variant, size on disk, complete or what is missing.
#[tauri::command]
pub async fn list_models(state: State<'_, AppState>) -> Res<Vec<FoundModel>> {
    let state = state.inner().clone();
    blocking(move || state.models().list()).await
}

/// The 5 Hz LMs (for labelling) found in the same places: name, size on disk,
/// complete or what is missing.
#[tauri::command]
pub async fn list_lms(state: State<'_, AppState>) -> Res<Vec<FoundLm>> {
    let state = state.inner().clone();
    blocking(move || state.models().list_lms()).await
}

/// Remembers a folder that holds a model; the new list.
#[tauri::command]
pub async fn add_model_folder(state: State<'_, AppState>, path: String) -> Res<Vec<FoundModel>> {
    let state = state.inner().clone();
    blocking(move || state.models().add(&PathBuf::from(path))).await
}

/// Forgets an added folder (nothing is deleted); the new list.
#[tauri::command]
pub async fn remove_model_folder(state: State<'_, AppState>, path: String) -> Res<Vec<FoundModel>> {
    let state = state.inner().clone();
    blocking(move || state.models().remove(&PathBuf::from(path))).await
}

/// Starts downloading a variant (turbo, base, sft, ...) or a 5 Hz LM (lm-1.7b, ...)
/// into the Hugging Face cache; its progress arrives as `model-download` events.
#[tauri::command]
pub fn download_model<R: Runtime>(app: AppHandle<R>, state: State<'_, AppState>, variant: String) -> Res<()> {
    let variant: Downloadable = variant.parse().map_err(|e: String| CommandError::from(BridgeError::Invalid(e)))?;
    Ok(state.models().start_download(variant, Hub::from_env(), app)?)
}

/// The menu's shortcuts as this platform writes them (`⌘↩` on a Mac, `Ctrl+Enter`
/// elsewhere), by menu item id (`run.start`), for the page's buttons.
#[tauri::command]
pub fn shortcuts() -> std::collections::BTreeMap<&'static str, String> {
    crate::native::menu::shortcut_labels(crate::native::shortcuts::Platform::current())
}

/// Cancels the download in progress; whether there was one.
#[tauri::command]
pub fn cancel_download(state: State<'_, AppState>) -> bool {
    state.models().cancel_download()
}

//! Commands of listening: previews, Generate, A/B pairs, and audio for the player. Audio goes to
//! the web view as raw bytes (an `ArrayBuffer` in JS) the page turns into a `blob:`
//! URL: no file URL and no asset protocol, so the page reaches no file by itself.

use std::path::PathBuf;

use tauri::ipc::Response;
use tauri::{AppHandle, Runtime, State};

use super::{blocking, Res};
use crate::bridge::{
    AdapterChoiceView, AdapterView, AppState, PairChoices, PairView, PreviewView, SavedSongView, SongChoices,
};

/// Every preview of a run (the current one or one from History), oldest first.
#[tauri::command]
pub async fn run_previews(state: State<'_, AppState>, dir: String) -> Res<Vec<PreviewView>> {
    let state = state.inner().clone();
    blocking(move || state.previews(&PathBuf::from(dir))).await
}

/// The run's newest adapter and its trigger word; null before its first checkpoint.
#[tauri::command]
pub async fn run_adapter(state: State<'_, AppState>, dir: String) -> Res<Option<AdapterView>> {
    let state = state.inner().clone();
    blocking(move || state.adapter(&PathBuf::from(dir))).await
}

/// Every song made from a run (in any session), oldest first.
#[tauri::command]
pub async fn run_songs(state: State<'_, AppState>, dir: String) -> Res<Vec<SavedSongView>> {
    let state = state.inner().clone();
    blocking(move || state.songs(&PathBuf::from(dir))).await
}

/// The bytes of a WAV file inside the runs folder; any other path is refused.
#[tauri::command]
pub async fn audio_bytes(state: State<'_, AppState>, path: String) -> Res<Response> {
    let state = state.inner().clone();
    blocking(move || state.audio(&PathBuf::from(path)).map(Response::new)).await
}

/// The engine's picture (SVG) of a WAV file inside the runs folder.
#[tauri::command]
pub async fn audio_picture(state: State<'_, AppState>, path: String) -> Res<String> {
    let state = state.inner().clone();
    blocking(move || state.audio_picture(&PathBuf::from(path))).await
}

/// Starts a song from the run in `dir`; returns its id, and its progress arrives as
/// `song` events with that id.
#[tauri::command]
pub async fn generate_song<R: Runtime>(
    app: AppHandle<R>,
    state: State<'_, AppState>,
    dir: String,
    choices: SongChoices,
) -> Res<u64> {
    let state = state.inner().clone();
    blocking(move || state.generate(&PathBuf::from(dir), choices, app)).await
}

/// Every adapter the runs keep (final, best, kept checkpoints'), newest runs first.
#[tauri::command]
pub async fn adapter_choices(state: State<'_, AppState>) -> Res<Vec<AdapterChoiceView>> {
    let state = state.inner().clone();
    blocking(move || state.adapter_choices()).await
}

/// Starts an A/B pair from the run in `dir`; returns its id, and its progress arrives as
/// `pair` events with that id and the side being made.
#[tauri::command]
pub async fn generate_pair<R: Runtime>(
    app: AppHandle<R>,
    state: State<'_, AppState>,
    dir: String,
    choices: PairChoices,
) -> Res<u64> {
    let state = state.inner().clone();
    blocking(move || state.generate_pair(&PathBuf::from(dir), choices, app)).await
}

/// Every A/B pair made from a run (in any session), oldest first.
#[tauri::command]
pub async fn run_pairs(state: State<'_, AppState>, dir: String) -> Res<Vec<PairView>> {
    let state = state.inner().clone();
    blocking(move || state.pairs(&PathBuf::from(dir))).await
}

/// A song of the scanned dataset (by its name in the files table) as WAV bytes: as it
/// is, or (`heard`) as the model hears it.
#[tauri::command]
pub async fn dataset_audio(state: State<'_, AppState>, name: String, heard: bool) -> Res<Response> {
    let state = state.inner().clone();
    blocking(move || state.dataset_audio(&name, heard).map(Response::new)).await
}

//! The dataset editor: a song's label edited, or the audio's reading accepted (both
//! kept in the label store, never in the songs' folder), the audio analysed on
//! request, what ACE-Step's LM wrote of a song kept (captions.rs runs it), and every
//! song's labels written as ACE-Step sidecars when the user asks.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ostinato_engine::data::{Field, Labels};
use ostinato_engine::label::analysis::{analyse_file, Reading};
use ostinato_engine::label::sidecars::{write_sidecars, Outcome};
use ostinato_engine::label::store::{Found, LabelStore, Saved};
use ostinato_engine::label::{keep_understood, reading, resolve, stored_song, stored_songs, StoredSong, ANALYSED};

use super::dataset_scan::show_labels;
use super::error::{engine_err, BridgeError};
use super::state::AppState;
use super::views::{EstimateView, FileRow, SidecarReport};

impl AppState {
    pub(super) fn label_store(&self) -> LabelStore {
        LabelStore::new(self.labels_dir())
    }

    /// The scanned folder's usable song `name` as the store knows it, or why not.
    fn stored_song(&self, name: &str) -> Result<(StoredSong, Found), BridgeError> {
        let folder = self.usable_song_folder(name)?;
        let song = stored_song(&self.label_store(), &folder.join(name));
        let found = song.found.clone().map_err(|why| BridgeError::Invalid(format!("{name}: {why}")))?;
        Ok((song, found))
    }

    /// Keeps `change` of the song's saved labels; the song's row as it now is.
    fn change_labels(&self, name: &str, change: impl FnOnce(&mut Saved)) -> Result<FileRow, BridgeError> {
        let (song, mut found) = self.stored_song(name)?;
        change(&mut found.saved);
        self.label_store().save(&song.file.path, &found.hash, &found.saved).map_err(engine_err)?;
        found.stale = false;
        let mut g = self.lock();
        let row = g.dataset.as_mut().and_then(|d| d.files.iter_mut().find(|f| f.name == name));
        let row = row.ok_or_else(|| BridgeError::Invalid(format!("not a song of the dataset: {name}")))?;
        show_labels(row, &song, &found);
        Ok(row.clone())
    }

    /// Sets one label of the song `name` as the user typed it (checked by the engine;
    /// blank clears the edit, and the sidecar's value or the reading shows again).
    pub fn set_label(&self, name: &str, field: &str, text: &str) -> Result<FileRow, BridgeError> {
        let field: Field = field.parse().map_err(BridgeError::Invalid)?;
        let value = field.parse(text).map_err(|why| BridgeError::Invalid(format!("{field}: {why}")))?;
        self.change_labels(name, |saved| saved.edited.put(field, value))
    }

    /// Accepts the analysis's readings for the song `name` (they fill what its
    /// sidecars leave unset); each value is checked by the engine.
    pub fn accept_labels(&self, name: &str, values: &BTreeMap<String, String>) -> Result<FileRow, BridgeError> {
        let mut checked = Vec::new();
        for (field, text) in values {
            let field: Field = field.parse().map_err(BridgeError::Invalid)?;
            let value = field.parse(text).map_err(|why| BridgeError::Invalid(format!("{field}: {why}")))?;
            checked.push((field, value));
        }
        self.change_labels(name, |saved| checked.into_iter().for_each(|(f, v)| saved.accepted.put(f, v)))
    }

    /// Keeps what ACE-Step's LM wrote of the song `name` in place of what it wrote
    /// before; its tempo, key and meter are kept only to be shown (the user accepts
    /// them, or not). The song's row as it now is.
    pub(super) fn keep_lm_labels(&self, name: &str, lm: &Labels) -> Result<FileRow, BridgeError> {
        self.change_labels(name, |saved| keep_understood(saved, lm, false))
    }

    /// Reads tempo, key and time signature from the song's audio: estimates, not kept
    /// until accepted. Slow (the whole song is read): call it off the UI thread.
    pub fn analyse_song(&self, name: &str) -> Result<BTreeMap<Field, EstimateView>, BridgeError> {
        let (song, _) = self.stored_song(name)?;
        let analysis = analyse_file(&song.file.path)
            .map_err(|why| BridgeError::Invalid(format!("{name} cannot be analysed: {why}")))?;
        let view = |reading: Reading<String>| match reading {
            Ok(e) => EstimateView {
                guess: e.is_guess(),
                value: Some(e.value),
                confidence: Some(e.confidence),
                cannot_tell: None,
            },
            Err(why) => EstimateView { value: None, confidence: None, guess: false, cannot_tell: Some(why) },
        };
        Ok(ANALYSED.into_iter().filter_map(|f| Some((f, view(reading(&analysis, f)?)))).collect())
    }

    /// Writes every song's labels beside it as ACE-Step sidecars; one that says
    /// something else is replaced only with `replace`.
    pub fn write_sidecars(&self, replace: bool) -> Result<SidecarReport, BridgeError> {
        let folder = self.lock().dataset.as_ref().map(|d| d.path.clone());
        let folder: PathBuf = folder.ok_or_else(|| BridgeError::Invalid("scan a dataset folder first".into()))?;
        let songs = stored_songs(&self.label_store(), &folder).map_err(engine_err)?.songs;
        let mut report = SidecarReport { counts: BTreeMap::new(), kept: Vec::new() };
        for song in songs {
            let Ok(found) = song.found else { continue };
            for file in write_sidecars(&song.file.path, &resolve(&song.file.sidecars, &found.saved), replace)
                .map_err(engine_err)?
            {
                *report.counts.entry(file.outcome.name().to_string()).or_default() += 1;
                if file.outcome == Outcome::Kept {
                    report.kept.push(file.path.strip_prefix(&folder).unwrap_or(&file.path).display().to_string());
                }
            }
        }
        Ok(report)
    }
}

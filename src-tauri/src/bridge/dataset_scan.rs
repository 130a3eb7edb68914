//! The dataset scan the Dataset panel and the files table show: every audio file of a
//! folder checked as training would check it, without encoding anything, with each
//! song's labels and where they come from.

use std::collections::BTreeMap;
use std::path::Path;

use ostinato_engine::codec::INSTRUMENTAL;
use ostinato_engine::data::labels::LANGUAGES;
use ostinato_engine::data::{cut_note, DataSpec, Field};
use ostinato_engine::label::store::{Found, LabelStore};
use ostinato_engine::label::{resolve, stored_songs, Resolved, StoredSong};

use super::error::{engine_err, BridgeError};
use super::views::{DatasetView, FileRow};

/// Every audio file under `dir` with its duration, labels and, for a bad one, what is
/// wrong: the engine's check of a folder, the one training applies.
pub fn scan(dir: &Path, store: &LabelStore) -> Result<DatasetView, BridgeError> {
    let folder = stored_songs(store, dir).map_err(engine_err)?;
    let mut files: Vec<FileRow> = folder.songs.iter().map(|song| song_row(dir, song)).collect();
    for (path, reason) in &folder.skipped {
        files.push(FileRow {
            name: name(dir, path),
            duration_s: None,
            has_caption: false,
            has_lyrics: false,
            status: "bad".into(),
            problem: Some(reason.clone()),
            note: None,
            labels: BTreeMap::new(),
            stale: false,
        });
    }
    let usable = files.iter().filter(|f| f.status == "ok").count();
    Ok(DatasetView {
        path: dir.to_path_buf(),
        total_duration_s: files.iter().filter_map(|f| f.duration_s).sum(),
        usable,
        bad: files.len() - usable,
        files,
        languages: LANGUAGES.iter().map(|l| l.to_string()).collect(),
    })
}

/// A song's row: decoded as training decodes it, its labels resolved over its sidecars.
fn song_row(dir: &Path, song: &StoredSong) -> FileRow {
    let spec = DataSpec::new(dir);
    let checked = song.found.clone().and_then(|found| Ok((song.file.check(&spec)?.seconds_in_file(), found)));
    let mut row = FileRow {
        name: name(dir, &song.file.path),
        duration_s: None,
        has_caption: false,
        has_lyrics: false,
        status: "bad".into(),
        problem: None,
        note: None,
        labels: BTreeMap::new(),
        stale: false,
    };
    match checked {
        Ok((seconds, found)) => {
            (row.duration_s, row.status) = (Some(seconds), "ok".into());
            row.note = cut_note(spec.cut(None), seconds);
            show_labels(&mut row, song, &found);
        }
        Err(why) => row.problem = Some(why),
    }
    row
}

/// Sets the row's label columns from the store's record of the song.
pub fn show_labels(row: &mut FileRow, song: &StoredSong, found: &Found) {
    row.labels = resolve(&song.file.sidecars, &found.saved);
    row.stale = found.stale;
    let given = |field| row.labels.get(&field).and_then(|r: &Resolved| r.value.as_deref()).map(str::trim);
    row.has_caption = given(Field::Caption).is_some_and(|c| !c.is_empty());
    row.has_lyrics = given(Field::Lyrics).is_some_and(|l| !l.is_empty() && l != INSTRUMENTAL);
}

fn name(dir: &Path, path: &Path) -> String {
    path.strip_prefix(dir).unwrap_or(path).display().to_string()
}

//! What a song is trained with, beyond its audio: tempo, key and meter read from the
//! signal (`analysis`), and each field's value with where it comes from.

pub mod analysis;
pub mod sidecars;
pub mod store;
pub mod understand;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::codec::SongMeta;
use crate::data::sidecar::Sidecars;
use crate::data::{inspect_folder, song_key, Field, FolderInspection, Labels, SongFile};
use analysis::{Analysis, Reading};
use store::{LabelStore, Saved};

/// Where a field's value comes from, in order of precedence: what the user gave in
/// Ostinato, then what they wrote beside the song, then what ACE-Step's LM wrote of the
/// audio (the fields in [`UNDERSTOOD`]), then the audio's reading they accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Edited,
    Sidecar,
    Lm,
    Analysed,
}

/// The fields ACE-Step's LM fills by itself; its tempo, key and meter are taken only
/// when the user picks them.
pub const UNDERSTOOD: [Field; 4] = [Field::Caption, Field::Lyrics, Field::Language, Field::Genre];

/// One field's value as training uses it (None: unknown, N/A to ACE-Step) and its source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resolved {
    pub value: Option<String>,
    pub source: Option<Source>,
}

/// What the song's sidecars give for `field` (the instrumental marker they default
/// lyrics to is no value).
pub fn sidecar_value(meta: &SongMeta, field: Field) -> Option<String> {
    let text = |s: &str| Some(s.to_string()).filter(|_| !s.trim().is_empty());
    match field {
        Field::Caption => text(&meta.caption),
        Field::Lyrics => meta.has_lyrics().then(|| meta.lyrics.clone()),
        Field::Bpm => meta.bpm.map(|b| b.to_string()),
        Field::Keyscale => meta.keyscale.clone(),
        Field::Timesignature => meta.timesignature.clone(),
        Field::Language => meta.language.clone(),
        Field::Genre => meta.genre.clone(),
    }
}

/// Every field of a song, resolved by precedence (edited > sidecar > LM > analysed).
pub fn resolve(sidecars: &SongMeta, saved: &Saved) -> BTreeMap<Field, Resolved> {
    Field::ALL
        .into_iter()
        .map(|field| {
            let understood = saved.understood.get(field).filter(|_| UNDERSTOOD.contains(&field));
            let candidates = [
                (saved.edited.get(field).map(str::to_string), Source::Edited),
                (sidecar_value(sidecars, field), Source::Sidecar),
                (understood.map(str::to_string), Source::Lm),
                (saved.accepted.get(field).map(str::to_string), Source::Analysed),
            ];
            let winner = candidates.into_iter().find_map(|(value, source)| value.map(|v| (v, source)));
            let resolved = match winner {
                Some((value, source)) => Resolved { value: Some(value), source: Some(source) },
                None => Resolved { value: None, source: None },
            };
            (field, resolved)
        })
        .collect()
}

/// What a run records for the song: the edited values, and the LM's and the accepted
/// readings where the sidecars say nothing (the sidecars themselves are read by training).
pub fn given(sidecars: &SongMeta, saved: &Saved) -> Labels {
    let mut labels = Labels::default();
    for (field, resolved) in resolve(sidecars, saved) {
        if matches!(resolved.source, Some(Source::Edited | Source::Lm | Source::Analysed)) {
            labels.put(field, resolved.value);
        }
    }
    labels
}

/// A song of a folder with what the store keeps for it.
#[derive(Debug, Clone)]
pub struct StoredSong {
    pub file: SongFile,
    /// The store's record, or why the file cannot be read.
    pub found: std::result::Result<store::Found, String>,
}

/// A folder as the label store sees it.
#[derive(Debug)]
pub struct StoredFolder {
    /// The songs, sorted, each with its sidecars (no labels over them) and the store's record.
    pub songs: Vec<StoredSong>,
    /// Entries the scan leaves out (not audio, unreadable), and why.
    pub skipped: Vec<(std::path::PathBuf, String)>,
}

/// `folder`'s songs with the store's record of each.
pub fn stored_songs(store: &LabelStore, folder: &Path) -> crate::Result<StoredFolder> {
    let FolderInspection { songs, skipped } = inspect_folder(folder, &BTreeMap::new())?;
    let paths: Vec<_> = songs.iter().map(|s| s.path.clone()).collect();
    let found = store.find_all(&paths);
    let songs = songs.into_iter().zip(found).map(|(file, found)| StoredSong { file, found }).collect();
    Ok(StoredFolder { songs, skipped })
}

/// The song at `path` with the store's record of it (its sidecars read alone).
pub fn stored_song(store: &LabelStore, path: &Path) -> StoredSong {
    let file = SongFile::read(path.to_path_buf(), &mut Sidecars::new(), None);
    StoredSong { found: store.find(path), file }
}

/// The labels the store gives the songs of `folder`, as `DataSpec::labels` holds them
/// (a song the store has nothing for, or cannot read, is left out: training reports it).
pub fn saved_labels(store: &LabelStore, folder: &Path) -> crate::Result<BTreeMap<String, Labels>> {
    if !store.exists() {
        return Ok(BTreeMap::new()); // nothing was ever saved: no song need be hashed
    }
    Ok(stored_songs(store, folder)?
        .songs
        .into_iter()
        .filter_map(|song| {
            let found = song.found.ok()?;
            let labels = given(&song.file.sidecars, &found.saved);
            (!labels.is_empty()).then(|| (song_key(folder, &song.file.path), labels))
        })
        .collect())
}

/// The fields the signal analysis reads.
pub const ANALYSED: [Field; 3] = [Field::Bpm, Field::Keyscale, Field::Timesignature];

/// Keeps what ACE-Step's LM wrote of a song (`lm`) in place of what it wrote before;
/// with `take_metas` its tempo, key and meter are accepted too, over the analysis's
/// (the user's pick: upstream warns the LM may invent them).
pub fn keep_understood(saved: &mut Saved, lm: &Labels, take_metas: bool) {
    saved.understood = lm.clone();
    if take_metas {
        for field in ANALYSED {
            if let Some(value) = lm.get(field) {
                saved.accepted.put(field, Some(value.to_string()));
            }
        }
    }
}

/// The analysis's reading of `field` written as a label value ("120", "F# minor", "3"),
/// or why it cannot be told; None for a field the analysis does not read.
pub fn reading(analysis: &Analysis, field: Field) -> Option<Reading<String>> {
    let text = |r: &Reading<u32>| r.clone().map(|e| e.map(|v| v.to_string()));
    Some(match field {
        Field::Bpm => text(&analysis.bpm),
        Field::Keyscale => analysis.keyscale.clone(),
        Field::Timesignature => text(&analysis.timesignature),
        _ => return None,
    })
}

/// The analysis's readings of the fields it reads, as label values (bpm "120").
pub fn readings(analysis: &Analysis) -> Labels {
    let mut labels = Labels::default();
    for field in ANALYSED {
        labels.put(field, reading(analysis, field).and_then(Result::ok).map(|e| e.value));
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edited_beats_sidecar_beats_lm_beats_analysed() {
        let sidecars = SongMeta { bpm: Some(90), caption: "from the sidecar".into(), ..SongMeta::default() };
        let mut saved = Saved::default();
        saved.edited.set(Field::Caption, "typed in the window").unwrap();
        saved.accepted.set(Field::Bpm, "120").unwrap();
        saved.accepted.set(Field::Keyscale, "A minor").unwrap();
        saved.understood.set(Field::Lyrics, "[Verse]\nla la").unwrap();
        saved.understood.set(Field::Caption, "the LM's caption").unwrap();
        saved.understood.set(Field::Bpm, "140").unwrap();
        saved.understood.set(Field::Timesignature, "3").unwrap();
        let fields = resolve(&sidecars, &saved);
        let at = |f: Field| (fields[&f].value.as_deref(), fields[&f].source);
        assert_eq!(at(Field::Caption), (Some("typed in the window"), Some(Source::Edited)));
        assert_eq!(at(Field::Bpm), (Some("90"), Some(Source::Sidecar)));
        assert_eq!(at(Field::Keyscale), (Some("A minor"), Some(Source::Analysed)));
        assert_eq!(at(Field::Lyrics), (Some("[Verse]\nla la"), Some(Source::Lm)));
        // The LM's tempo and meter are not taken by themselves (the analysis's or none).
        assert_eq!(at(Field::Timesignature), (None, None));
        assert_eq!(at(Field::Language), (None, None));
        let run = given(&sidecars, &saved);
        assert_eq!(
            (run.caption.as_deref(), run.bpm.as_deref(), run.keyscale.as_deref(), run.lyrics.as_deref()),
            (Some("typed in the window"), None, Some("A minor"), Some("[Verse]\nla la"))
        );
        assert_eq!(run.timesignature, None);

        // Picked, the LM's tempo and meter are accepted over the analysis's.
        let lm = saved.understood.clone();
        keep_understood(&mut saved, &lm, true);
        let fields = resolve(&sidecars, &saved);
        assert_eq!(fields[&Field::Timesignature].value.as_deref(), Some("3"));
        assert_eq!(fields[&Field::Keyscale].value.as_deref(), Some("A minor"), "the LM gave no key: kept");
        assert_eq!(fields[&Field::Bpm].source, Some(Source::Sidecar), "a sidecar still wins");
    }
}

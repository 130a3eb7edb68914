//! A song's labels written as ACE-Step sidecars beside it, only when the user asks:
//! `<stem>.caption.txt`, `<stem>.lyrics.txt` and `<stem>.json` (bpm, keyscale,
//! timesignature, language, with any other keys already in it kept). Each file is
//! written whole (a temporary file linked or renamed into place); one that is there
//! with something else in it is replaced only when `replace` says so.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value};

use super::Resolved;
use crate::atomic::{write_atomically, write_new_atomically};
use crate::data::regular::read_regular;
use crate::data::Field;
use crate::{Error, Result};

/// What became of one sidecar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// There was none: written.
    Written,
    /// It already says this.
    Unchanged,
    /// It says something else and was replaced, as asked.
    Replaced,
    /// It says something else and was left as it is (not asked to replace).
    Kept,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Written => "written",
            Outcome::Unchanged => "unchanged",
            Outcome::Replaced => "replaced",
            Outcome::Kept => "kept",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SidecarFile {
    pub path: PathBuf,
    pub outcome: Outcome,
}

/// Writes the sidecars for the song at `song` from its resolved `fields`; a field
/// without a value writes nothing.
pub fn write_sidecars(song: &Path, fields: &BTreeMap<Field, Resolved>, replace: bool) -> Result<Vec<SidecarFile>> {
    let value = |f: Field| fields.get(&f).and_then(|r| r.value.clone());
    let mut files = Vec::new();
    for (suffix, field) in [(".caption.txt", Field::Caption), (".lyrics.txt", Field::Lyrics)] {
        if let Some(text) = value(field) {
            let path = beside(song, suffix);
            let same = |old: &[u8]| String::from_utf8_lossy(old).trim() == text.trim();
            files.push(write_one(&path, format!("{text}\n").into_bytes(), same, replace)?);
        }
    }
    let metas: Vec<(Field, Value)> = [Field::Bpm, Field::Keyscale, Field::Timesignature, Field::Language, Field::Genre]
        .into_iter()
        .filter_map(|f| value(f).map(|v| (f, json_value(f, v))))
        .collect();
    if !metas.is_empty() {
        let path = beside(song, ".json");
        let old = read_regular(&path).ok();
        let mut object =
            old.as_deref().and_then(|b| serde_json::from_slice::<Map<String, Value>>(b).ok()).unwrap_or_default();
        let before = object.clone();
        for (field, v) in metas {
            object.insert(field.name().to_string(), v);
        }
        let bytes = serde_json::to_vec_pretty(&object).expect("a JSON object serialises");
        let same = |old: &[u8]| {
            serde_json::from_slice::<Map<String, Value>>(old).is_ok_and(|o| o == before && before == object)
        };
        files.push(write_one(&path, bytes, same, replace)?);
    }
    Ok(files)
}

/// A number where ACE-Step's sidecars write one (bpm), text otherwise.
fn json_value(field: Field, value: String) -> Value {
    match (field, value.parse::<u32>()) {
        (Field::Bpm, Ok(bpm)) => Value::from(bpm),
        _ => Value::from(value),
    }
}

fn beside(song: &Path, suffix: &str) -> PathBuf {
    let mut name = OsString::from(song.file_stem().unwrap_or_default());
    name.push(suffix);
    song.with_file_name(name)
}

/// Writes `bytes` at `path` unless a file there already says the same (`same`), or
/// says something else and `replace` is false.
fn write_one(path: &Path, bytes: Vec<u8>, same: impl Fn(&[u8]) -> bool, replace: bool) -> Result<SidecarFile> {
    let done = |outcome| Ok(SidecarFile { path: path.to_path_buf(), outcome });
    match read_regular(path) {
        Ok(old) if same(&old) => done(Outcome::Unchanged),
        Ok(_) if !replace => done(Outcome::Kept),
        Ok(_) => write_atomically(path, &bytes).and_then(|()| done(Outcome::Replaced)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match write_new_atomically(path, &bytes) {
            Ok(()) => done(Outcome::Written),
            // Made since it was read: someone else's, left alone.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => done(Outcome::Kept),
            Err(e) => Err(Error::io(path, e)),
        },
        Err(e) => Err(Error::io(path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::sidecar::Sidecars;
    use crate::label::Source;

    fn fields(pairs: &[(Field, &str)]) -> BTreeMap<Field, Resolved> {
        pairs.iter().map(|(f, v)| (*f, Resolved { value: Some(v.to_string()), source: Some(Source::Edited) })).collect()
    }

    #[test]
    fn sidecars_are_written_as_ace_step_reads_them_and_kept_unless_asked() {
        let dir = tempfile::tempdir().unwrap();
        let song = dir.path().join("song.mp3");
        std::fs::write(dir.path().join("song.json"), r#"{"genre": "dub", "bpm": 70}"#).unwrap();
        let labels = fields(&[
            (Field::Caption, "dub techno, deep chords"),
            (Field::Bpm, "118"),
            (Field::Keyscale, "F# minor"),
            (Field::Timesignature, "4"),
        ]);
        let first = write_sidecars(&song, &labels, false).unwrap();
        let outcomes: Vec<_> = first.iter().map(|f| (f.path.file_name().unwrap().to_owned(), f.outcome)).collect();
        assert_eq!(outcomes, [("song.caption.txt".into(), Outcome::Written), ("song.json".into(), Outcome::Kept)]);
        assert_eq!(std::fs::read_to_string(dir.path().join("song.json")).unwrap(), r#"{"genre": "dub", "bpm": 70}"#);

        let replaced = write_sidecars(&song, &labels, true).unwrap();
        assert_eq!(replaced.iter().map(|f| f.outcome).collect::<Vec<_>>(), [Outcome::Unchanged, Outcome::Replaced]);
        let meta = Sidecars::new().read(&song, &mut Vec::new());
        assert_eq!(meta.caption, "dub techno, deep chords");
        assert_eq!(
            (meta.bpm, meta.keyscale.as_deref(), meta.timesignature.as_deref()),
            (Some(118), Some("F# minor"), Some("4"))
        );
        assert_eq!(meta.genre.as_deref(), Some("dub"));
        let again = write_sidecars(&song, &labels, false).unwrap();
        assert!(again.iter().all(|f| f.outcome == Outcome::Unchanged), "{again:?}");
        // No temporary file is left behind.
        let mut names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        assert_eq!(names, ["song.caption.txt", "song.json"]);
    }
}

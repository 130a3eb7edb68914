//! The one dataset check every shell calls: which files of a folder are songs, what
//! their sidecars say (and the labels given in Ostinato over them), and whether
//! training can use each. `prepare_dataset` goes
//! through the same listing and the same per-file check, so the app's scan and a run
//! reach the same verdicts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::audio::{self, Cut, Decoded};
use super::scan::scan_folder;
use super::sidecar::Sidecars;
use super::{song_key, DataSpec, Labels};
use crate::codec::SongMeta;
use crate::error::Result;

/// A folder as training finds it, before any song is decoded.
#[derive(Debug)]
pub struct FolderInspection {
    /// The audio files, sorted, with what their sidecars say.
    pub songs: Vec<SongFile>,
    /// Entries the scan leaves out (not audio, unreadable), and why.
    pub skipped: Vec<(PathBuf, String)>,
}

/// One audio file, what its sidecars say and what it is trained with.
#[derive(Debug, Clone)]
pub struct SongFile {
    pub path: PathBuf,
    /// What training uses: the sidecars' values with the given labels over them.
    pub meta: SongMeta,
    /// What the sidecars alone say.
    pub sidecars: SongMeta,
    /// Sidecar values ignored (the sidecar, why): the song is still used.
    pub warnings: Vec<(PathBuf, String)>,
}

impl SongFile {
    /// The song at `path`: its sidecars read (through `sidecars`, which remembers each
    /// folder's CSV rows), with `given` labels over them.
    pub fn read(path: PathBuf, sidecars: &mut Sidecars, given: Option<&Labels>) -> Self {
        let mut warnings = Vec::new();
        let read = sidecars.read(&path, &mut warnings);
        let mut meta = read.clone();
        if let Some(given) = given {
            given.apply(&mut meta);
        }
        SongFile { path, meta, sidecars: read, warnings }
    }

    /// Decodes the part of the file training under `spec` uses (the cut, the middle
    /// crop): it, with the file's length, when training can use it, else why the
    /// file is skipped.
    pub fn check(&self, spec: &DataSpec) -> std::result::Result<Decoded, String> {
        decode_checked(&self.path, spec.cut(None))
    }
}

/// Lists `folder` and reads every song's sidecars, with `labels` (by `song_key`) over
/// them; fails only when the folder itself cannot be read.
pub fn inspect_folder(folder: &Path, labels: &BTreeMap<String, Labels>) -> Result<FolderInspection> {
    let scanned = scan_folder(folder)?;
    let mut sidecars = Sidecars::new();
    let songs = scanned
        .audio
        .into_iter()
        .map(|path| {
            let given = labels.get(&song_key(folder, &path));
            SongFile::read(path, &mut sidecars, given)
        })
        .collect();
    Ok(FolderInspection { songs, skipped: scanned.skipped })
}

/// The part `cut` keeps of the file decoded, or (in words, without the path) why
/// training cannot use it.
pub(crate) fn decode_checked(path: &Path, cut: Cut) -> std::result::Result<Decoded, String> {
    let decoded = audio::decode_file(path, cut)?;
    audio::check_usable(&decoded.audio)?;
    Ok(decoded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::testutil::{good_wav, prepare, write_file};
    use crate::data::{DataEvent, DataSpec, IssueKind};
    use std::path::PathBuf;

    /// Every file's verdict from `inspect_folder` (the app's scan): None when training
    /// can use it, else why not.
    fn inspected(folder: &Path) -> BTreeMap<PathBuf, Option<String>> {
        let inspection = inspect_folder(folder, &Default::default()).unwrap();
        let spec = DataSpec::new(folder);
        let songs = inspection.songs.iter().map(|s| (s.path.clone(), s.check(&spec).err()));
        songs.chain(inspection.skipped.into_iter().map(|(file, reason)| (file, Some(reason)))).collect()
    }

    /// Every file's verdict from training's preparation (no cache: every song decoded).
    fn prepared(folder: &Path) -> BTreeMap<PathBuf, Option<String>> {
        let (_, events) = prepare(&DataSpec::new(folder), None);
        let verdict = |e: DataEvent| match e {
            DataEvent::Used(u) => Some((u.file, None)),
            DataEvent::Issue(i) if i.kind == IssueKind::Skipped => Some((i.file, Some(i.reason))),
            _ => None,
        };
        events.into_iter().filter_map(verdict).collect()
    }

    #[test]
    fn inspect_folder_gives_the_verdicts_training_reaches() {
        let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/demo");
        let verdicts = inspected(&demo);
        assert_eq!(verdicts.len(), 6, "{verdicts:?}");
        assert!(verdicts.values().all(Option::is_none), "{verdicts:?}");
        assert_eq!(verdicts, prepared(&demo));
        assert!(inspect_folder(&demo, &Default::default()).unwrap().songs.iter().all(|s| s.meta.has_caption()));

        let src = tempfile::tempdir().unwrap();
        let good = good_wav(src.path(), "good.wav", 1.5, 440.0);
        let notes = write_file(src.path(), "notes.wav", b"not audio");
        let short = good_wav(src.path(), "short.wav", 0.2, 440.0);
        let readme = write_file(src.path(), "readme.md", b"songs");
        let verdicts = inspected(src.path());
        assert_eq!(verdicts[&good], None);
        assert!(verdicts[&notes].is_some());
        assert!(verdicts[&short].as_deref().is_some_and(|r| r.starts_with("too short")), "{verdicts:?}");
        assert!(verdicts[&readme].is_some());
        assert_eq!(verdicts, prepared(src.path()));
    }
}

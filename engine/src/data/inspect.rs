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

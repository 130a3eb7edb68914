//! Dataset preparation: inspect the folder (scan, sidecars), decode and check every
//! song as `inspect` does, and encode it (or find it in the cache: `cached`). Bad files
//! are reported and skipped; no usable file at all is an error before training starts.
//! Every used song is reported with the seconds training sees of it, and every oddity
//! that does not keep it out (an ignored sidecar value, a file shorter than its header
//! says) as a warning.

mod cached;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use super::cache::LatentCache;
use super::dataset::{cut_note, DatasetItem, PreparedDataset, Song};
use super::inspect::{decode_checked, inspect_folder, SongFile};
use super::scan::AUDIO_EXTENSIONS;
use super::sidecar::apply_trigger;
use super::{DataEvent, DataSpec, FileUse, Issue, IssueKind, Stage};
use crate::cancel::Cancel;
use crate::codec::condition::text_prompt;
use crate::codec::{Conditioner, LatentEncoder, SongMeta};
use crate::error::{Error, Result};

pub use cached::cached_latents;

/// Prepares the dataset in `spec.folder`. With a cache, every song is encoded once
/// (or loaded) now; without, songs are only decoded and checked now and encoded per
/// epoch through `PreparedDataset::sample`. Encoder and conditioner failures are
/// errors; a bad file is an issue. Once `cancel` is set it returns
/// `Error::Cancelled` before the next file, or the encoder's next chunk.
pub fn prepare_dataset(
    spec: &DataSpec,
    encoder: &dyn LatentEncoder,
    conditioner: &dyn Conditioner,
    cache: Option<&LatentCache>,
    cancel: &Cancel,
    report: &mut dyn FnMut(DataEvent),
) -> Result<PreparedDataset> {
    spec.validate()?;
    let folder = inspect_folder(&spec.folder, &spec.labels)?;
    let total = folder.songs.len();
    let mut prep = Preparer::new(spec, encoder, conditioner, cache, cancel, report);
    for (file, reason) in folder.skipped {
        prep.issue(file, reason, IssueKind::Skipped);
    }
    prep.progress(Stage::Scanning, total, total, None);
    for (done, song) in folder.songs.into_iter().enumerate() {
        cancel.check()?;
        prep.progress(Stage::Encoding, done, total, Some(song.path.clone()));
        prep.position = (done, total);
        prep.add(song)?;
    }
    prep.progress(Stage::Encoding, total, total, None);
    prep.finish(total)
}

/// The error for a folder where no file could be used, with the first reason.
fn nothing_usable(data: &PreparedDataset, total: usize) -> Error {
    let first = data.issues.iter().find(|i| i.kind == IssueKind::Skipped);
    let detail = match first {
        _ if total == 0 => format!("no audio files found (supported: {})", AUDIO_EXTENSIONS.join(", ")),
        Some(i) => format!("none of {total} audio file(s) could be used (e.g. {}: {})", i.file.display(), i.reason),
        None => format!("none of {total} audio file(s) could be used"),
    };
    Error::NoUsableAudio { folder: data.spec.folder.clone(), detail }
}

/// A song to use, or why the file is skipped; `Err` of the outer `Result` ends
/// preparation (an encoder failure, a cancel).
type Verdict = Result<std::result::Result<DatasetItem, String>>;

/// What `prepare_dataset` keeps while it goes through the files.
struct Preparer<'a> {
    spec: &'a DataSpec,
    encoder: &'a dyn LatentEncoder,
    conditioner: &'a dyn Conditioner,
    cache: Option<&'a LatentCache>,
    cancel: &'a Cancel,
    /// The spec's part of every cache key.
    settings: String,
    data: PreparedDataset,
    /// (files prepared before this one, files): where the per-tile progress sits.
    position: (usize, usize),
    report: &'a mut dyn FnMut(DataEvent),
}

impl<'a> Preparer<'a> {
    fn new(
        spec: &'a DataSpec,
        encoder: &'a dyn LatentEncoder,
        conditioner: &'a dyn Conditioner,
        cache: Option<&'a LatentCache>,
        cancel: &'a Cancel,
        report: &'a mut dyn FnMut(DataEvent),
    ) -> Self {
        Preparer {
            spec,
            encoder,
            conditioner,
            cache,
            cancel,
            // The cache keeps the song's head whatever the crop (crops are windows of it).
            settings: format!("max{}:cropNone:cut-centre", spec.max_duration_seconds),
            data: PreparedDataset::empty(spec),
            position: (0, 0),
            report,
        }
    }

    fn progress(&mut self, stage: Stage, done: usize, total: usize, file: Option<PathBuf>) {
        (self.report)(DataEvent::Progress { stage, done, total, file, seconds: None });
    }

    /// The dataset, or the error of a folder without a usable song among its `total`.
    fn finish(self, total: usize) -> Result<PreparedDataset> {
        match self.data.items.is_empty() {
            true => Err(nothing_usable(&self.data, total)),
            false => Ok(self.data),
        }
    }

    fn issue(&mut self, file: PathBuf, reason: String, kind: IssueKind) {
        let issue = Issue { file, reason, kind };
        (self.report)(DataEvent::Issue(issue.clone()));
        self.data.issues.push(issue);
    }

    /// Prepares one audio file and reports what became of it: its warnings (sidecar
    /// values ignored, a short decode), then either how much of it is used or why
    /// it is skipped.
    fn add(&mut self, song: SongFile) -> Result<()> {
        let SongFile { path, meta, mut warnings, .. } = song;
        let meta = self.training_meta(meta);
        match self.song(&path, meta, &mut warnings)? {
            Ok(item) => {
                for (file, reason) in warnings {
                    self.issue(file, format!("{reason}; the song is used"), IssueKind::Warning);
                }
                self.used(item);
            }
            Err(reason) => {
                for (file, reason) in warnings {
                    self.issue(file, reason, IssueKind::Warning);
                }
                self.issue(path, reason, IssueKind::Skipped);
            }
        }
        Ok(())
    }

    fn used(&mut self, item: DatasetItem) {
        let seconds = item.meta.duration_seconds;
        let cut = self.spec.cut(None);
        (self.report)(DataEvent::Used(FileUse {
            file: item.source.clone(),
            seconds_used: item.seconds_used,
            seconds_in_file: seconds,
            note: cut_note(cut, seconds),
            prompt: text_prompt(&item.meta),
        }));
        self.data.items.push(item);
    }

    /// The song from the cache, or decoded (and, with a cache, encoded and stored).
    fn song(&mut self, path: &Path, mut meta: SongMeta, warnings: &mut Vec<(PathBuf, String)>) -> Verdict {
        let key = match self.cache_key(path, &meta) {
            Ok(key) => key,
            Err(reason) => return Ok(Err(reason)),
        };
        if let Some(item) = self.cache_hit(path, key.as_ref()) {
            return Ok(Ok(item));
        }
        // With the cache the song's head is encoded (crops are windows of it); without,
        // the crop is decoded only to check the file (each epoch encodes its own).
        let cut = if self.cache.is_some() { self.spec.cached_cut() } else { self.spec.cut(None) };
        let decoded = match decode_checked(path, cut) {
            Ok(d) => d,
            Err(reason) => return Ok(Err(reason)),
        };
        warnings.extend(decoded.shortfall().map(|w| (path.to_path_buf(), w)));
        meta.duration_seconds = decoded.seconds_in_file();
        let song = Song { source: path, audio: &decoded.audio, meta: &meta };
        let cached = match (self.cache, key) {
            (Some(cache), Some(key)) => match self.encode_and_store(cache, &key, &song)? {
                Ok(sample) => Some(sample),
                Err(reason) => return Ok(Err(reason)),
            },
            _ => None,
        };
        let seconds_used = self.spec.cut(None).seconds_of(meta.duration_seconds);
        Ok(Ok(DatasetItem { source: path.to_path_buf(), meta, seconds_used, cached }))
    }

    /// A song's metadata as training uses it: the trigger tag added to its caption.
    fn training_meta(&self, mut meta: SongMeta) -> SongMeta {
        meta.caption = apply_trigger(&meta.caption, self.spec.trigger.as_ref());
        meta
    }
}

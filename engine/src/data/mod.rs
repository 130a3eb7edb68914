//! Training data: a folder of songs becomes ACE-Step training samples.
//!
//! scan (find audio) -> sidecar (captions, lyrics, metas) -> audio (decode, resample,
//! cut) -> the codecs' encoders (latents, condition) -> cache (content-addressed).
//! `inspect` is the check of a folder every shell calls (scan, sidecars, decode);
//! `prepare` ties it all together into a `dataset`. The source folder is only ever read.

pub mod audio;
pub mod cache;
pub mod dataset;
mod guard;
pub mod inspect;
pub mod labels;
pub mod prepare;
pub mod preprocessed;
pub mod regular;
pub mod scan;
pub mod sidecar;
pub mod synth;
pub mod wav;

#[cfg(test)]
pub(crate) mod testutil;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use crate::error::SettingErrors;

pub use cache::LatentCache;
pub use dataset::{cut_note, encode_item, DatasetItem, PreparedDataset};
pub use inspect::{inspect_folder, FolderInspection, SongFile};
pub use labels::{Field, Labels};
pub use prepare::{cached_latents, prepare_dataset};

/// One preprocessed sample, with ACE-Step's preprocessed-sample tensors.
#[derive(Debug, Clone)]
pub struct TrainingSample {
    pub source: PathBuf,
    /// (T, 64)
    pub target_latents: Tensor,
    /// (T,) f32 1 = valid frame
    pub attention_mask: Tensor,
    /// (L, D)
    pub encoder_hidden_states: Tensor,
    /// (L,) f32 1 = valid row
    pub encoder_attention_mask: Tensor,
    /// (T, 128): silence latent ++ ones
    pub context_latents: Tensor,
}

impl TrainingSample {
    /// Frames `start..start + len` of the sample (its condition whole): a window of a
    /// cached song.
    pub fn window(&self, start: usize, len: usize) -> candle_core::Result<TrainingSample> {
        Ok(TrainingSample {
            source: self.source.clone(),
            target_latents: self.target_latents.narrow(0, start, len)?,
            attention_mask: self.attention_mask.narrow(0, start, len)?,
            encoder_hidden_states: self.encoder_hidden_states.clone(),
            encoder_attention_mask: self.encoder_attention_mask.clone(),
            context_latents: self.context_latents.narrow(0, start, len)?,
        })
    }
}

/// The trigger tag is the adapter's too: its type lives with the adapter's files.
pub use crate::lora::trigger::{TagMode, TriggerTag};

/// Which folder to read and how to cut its songs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DataSpec {
    pub folder: PathBuf,
    /// Songs are cut to this length (ACE-Step: 240 s).
    pub max_duration_seconds: f64,
    /// Train on windows this long instead, at an offset drawn from the run's seed each
    /// epoch (with the cache on, windows of the song's cached latents).
    pub crop_seconds: Option<f64>,
    pub trigger: Option<TriggerTag>,
    /// Labels given in Ostinato (edited, or read from the audio and accepted), by the
    /// song's path relative to `folder`: each field set wins over the song's sidecars.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, Labels>,
}

impl Default for DataSpec {
    fn default() -> Self {
        Self {
            folder: PathBuf::new(),
            max_duration_seconds: 240.0,
            crop_seconds: None,
            trigger: None,
            labels: BTreeMap::new(),
        }
    }
}

impl DataSpec {
    pub fn new(folder: impl Into<PathBuf>) -> Self {
        Self { folder: folder.into(), ..Self::default() }
    }

    /// Every song must give at least `audio::MIN_SECONDS` of training audio.
    pub fn validate(&self) -> crate::Result<()> {
        match self.too_short().first() {
            Some((field, seconds)) => {
                Err(crate::Error::BadDataSpec(format!("{field} is {seconds}, must be at least {}", audio::MIN_SECONDS)))
            }
            None => Ok(()),
        }
    }

    /// The part of a song the latent cache keeps: the head up to `max_duration_seconds`
    /// (crops are windows of it, cut each epoch).
    pub fn cached_cut(&self) -> audio::Cut {
        audio::Cut::Head { max_seconds: self.max_duration_seconds }
    }

    /// The part of a song training uses: a crop at `offset` (a fraction of the free
    /// room; None: the centre), else the head up to `max_duration_seconds`.
    pub fn cut(&self, offset: Option<f64>) -> audio::Cut {
        match self.crop_seconds {
            Some(seconds) => {
                audio::Cut::Crop { seconds: seconds.min(self.max_duration_seconds), offset: offset.unwrap_or(0.5) }
            }
            None => audio::Cut::Head { max_seconds: self.max_duration_seconds },
        }
    }

    /// Notes every field out of range, named as in run.toml (`data.crop_seconds`,
    /// `data.labels."song.mp3".bpm`).
    pub fn check(&self, errors: &mut SettingErrors) {
        for (field, seconds) in self.too_short() {
            errors.check(false, &format!("data.{field}"), || {
                format!("{seconds} must be at least {} s", audio::MIN_SECONDS)
            });
        }
        for (song, labels) in &self.labels {
            if let Err((field, why)) = labels.check() {
                errors.check(false, &format!("data.labels.\"{song}\".{field}"), || why);
            }
        }
    }

    /// The lengths that would give a song less than `audio::MIN_SECONDS`: (field, value).
    fn too_short(&self) -> Vec<(&'static str, f64)> {
        let enough = |s: f64| s >= audio::MIN_SECONDS; // false for NaN too
        [("max_duration_seconds", Some(self.max_duration_seconds)), ("crop_seconds", self.crop_seconds)]
            .into_iter()
            .filter_map(|(field, seconds)| seconds.filter(|s| !enough(*s)).map(|s| (field, s)))
            .collect()
    }
}

/// How a song of `folder` is named in `DataSpec::labels`: its path relative to the folder.
pub fn song_key(folder: &Path, path: &Path) -> String {
    path.strip_prefix(folder).unwrap_or(path).to_string_lossy().into_owned()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Scanning,
    Encoding,
}

/// Whether an issue keeps a file out of training.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IssueKind {
    /// The file is left out.
    #[default]
    Skipped,
    /// Something was ignored or looks wrong, but the song is used.
    Warning,
}

/// A file that is skipped, or a warning about one, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Issue {
    pub file: PathBuf,
    pub reason: String,
    pub kind: IssueKind,
}

/// How much of a used song training sees.
#[derive(Debug, Clone, PartialEq)]
pub struct FileUse {
    pub file: PathBuf,
    /// Seconds trained on each epoch (after the cut or crop).
    pub seconds_used: f64,
    /// Seconds the file decodes to.
    pub seconds_in_file: f64,
    /// How the song is cut, when it is ("cut to 240 s"); None when used whole.
    pub note: Option<String>,
    /// ACE-Step's text prompt the song is trained with: caption and metas.
    pub prompt: String,
}

/// What dataset preparation tells the run loop (which maps it to engine events).
#[derive(Debug, Clone, PartialEq)]
pub enum DataEvent {
    Progress {
        stage: Stage,
        done: usize,
        total: usize,
        file: Option<PathBuf>,
        /// While `file` is encoded: (seconds encoded, seconds), after each tile.
        seconds: Option<(f64, f64)>,
    },
    Issue(Issue),
    Used(FileUse),
}

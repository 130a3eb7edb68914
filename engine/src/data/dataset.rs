//! The dataset a run trains on: its usable songs (`DatasetItem`), and how one song
//! becomes a training sample (decoded, resampled, encoded, conditioned). `prepare`
//! builds it from a folder.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use rand::{Rng, RngCore};

use super::audio::{self, Cut};
use super::{DataSpec, Issue, IssueKind, TrainingSample};
use crate::cancel::Cancel;
use crate::codec::{Conditioner, LatentEncoder, SongMeta, StereoAudio};
use crate::error::{Error, Result};

/// One usable song.
#[derive(Debug, Clone)]
pub struct DatasetItem {
    pub source: PathBuf,
    pub meta: SongMeta,
    /// Seconds of it training sees each epoch (after the cut or crop).
    pub seconds_used: f64,
    /// Present when the cache is on: the sample every epoch reuses.
    pub cached: Option<TrainingSample>,
}

#[derive(Debug)]
pub struct PreparedDataset {
    pub spec: DataSpec,
    pub items: Vec<DatasetItem>,
    /// Every skipped file and every warning; also sent as `DataEvent::Issue`.
    pub issues: Vec<Issue>,
    pub cache_hits: usize,
    pub cache_misses: usize,
}

impl PreparedDataset {
    /// No songs yet.
    pub fn empty(spec: &DataSpec) -> Self {
        Self { spec: spec.clone(), items: Vec::new(), issues: Vec::new(), cache_hits: 0, cache_misses: 0 }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// A dataset of samples preprocessed earlier (ours or ACE-Step's), used as they are.
    pub fn preprocessed(spec: &DataSpec, samples: Vec<TrainingSample>, frames_per_second: f64) -> Result<Self> {
        let items = samples
            .into_iter()
            .map(|s| {
                let seconds = s.target_latents.dim(0)? as f64 / frames_per_second;
                Ok(DatasetItem {
                    source: s.source.clone(),
                    meta: SongMeta { duration_seconds: seconds, ..SongMeta::default() },
                    seconds_used: seconds,
                    cached: Some(s),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { cache_hits: items.len(), items, ..Self::empty(spec) })
    }

    /// Files left out (the other issues are warnings about used songs).
    pub fn skipped(&self) -> usize {
        self.issues.iter().filter(|i| i.kind == IssueKind::Skipped).count()
    }

    /// Seconds of audio training sees each epoch (after cuts and crops).
    pub fn seconds_used(&self) -> f64 {
        self.items.iter().map(|i| i.seconds_used).sum()
    }

    /// Seconds of audio the used files hold (whole files, before cuts).
    pub fn seconds_in_files(&self) -> f64 {
        self.items.iter().map(|i| i.meta.duration_seconds).sum()
    }

    /// The training sample for item `index`, with a crop's offset drawn from `rng`: a
    /// window of the cached song, or (cache off) a fresh encoding of the crop.
    pub fn sample(
        &self,
        index: usize,
        encoder: &dyn LatentEncoder,
        conditioner: &dyn Conditioner,
        rng: &mut dyn RngCore,
    ) -> Result<TrainingSample> {
        let item = &self.items[index];
        match &item.cached {
            Some(s) => self.window(s, encoder.frames_per_second(), Some(rng.random::<f64>())),
            None => encode_item(item, &self.spec, encoder, conditioner, rng),
        }
    }

    /// The crop of a cached sample at `offset` (a fraction of the free room; None: the
    /// centre), as `Cut::Crop` places it in the audio; the whole sample without crops.
    pub fn window(
        &self,
        sample: &TrainingSample,
        frames_per_second: f64,
        offset: Option<f64>,
    ) -> Result<TrainingSample> {
        let frames = sample.target_latents.dim(0)?;
        let Some(seconds) = self.spec.crop_seconds else {
            return Ok(sample.clone());
        };
        let len = ((seconds * frames_per_second).round() as usize).clamp(1, frames);
        let room = frames - len;
        let start = (room as f64 * offset.unwrap_or(0.5).clamp(0.0, 1.0)).round() as usize;
        Ok(sample.window(start, len)?)
    }
}

/// Decodes and encodes one song from its file, drawing the crop offset (if any) from
/// `rng`: the run loop calls this every epoch when the cache is off.
pub fn encode_item(
    item: &DatasetItem,
    spec: &DataSpec,
    encoder: &dyn LatentEncoder,
    conditioner: &dyn Conditioner,
    rng: &mut dyn RngCore,
) -> Result<TrainingSample> {
    let bad = |reason| Error::BadAudio { path: item.source.clone(), reason };
    let decoded = audio::decode_file(&item.source, spec.cut(Some(rng.random::<f64>()))).map_err(bad)?;
    let song = Song { source: &item.source, audio: &decoded.audio, meta: &item.meta };
    encode_song(&song, encoder, conditioner, &Cancel::never(), &mut |_, _| {})
}

/// How `cut` shortens a song of `seconds`, in words; None when it keeps it whole.
pub fn cut_note(cut: Cut, seconds: f64) -> Option<String> {
    match cut {
        Cut::Head { max_seconds } if seconds > max_seconds => {
            Some(format!("cut to {max_seconds} s (the longest a song is trained on)"))
        }
        Cut::Crop { seconds: crop, .. } if seconds > crop => Some(format!("a random {crop} s crop each epoch")),
        _ => None,
    }
}

/// The part of a song training uses, decoded, and what its sidecars say.
pub(super) struct Song<'a> {
    pub source: &'a Path,
    pub audio: &'a StereoAudio,
    pub meta: &'a SongMeta,
}

/// Resample (the cut was decoded at the source rate: less to resample), encode, condition.
pub(super) fn encode_song(
    song: &Song,
    encoder: &dyn LatentEncoder,
    conditioner: &dyn Conditioner,
    cancel: &Cancel,
    progress: &mut dyn FnMut(f64, f64),
) -> Result<TrainingSample> {
    let piece = audio::resample(song.audio, encoder.sample_rate())
        .map_err(|reason| Error::BadAudio { path: song.source.to_path_buf(), reason })?;
    let target_latents = encoder.encode_cancellable(&piece, cancel, progress)?;
    let frames = target_latents.dim(0)?;
    let c = conditioner.condition(song.meta, frames)?;
    Ok(TrainingSample {
        source: song.source.to_path_buf(),
        target_latents,
        attention_mask: Tensor::ones(frames, DType::F32, &Device::Cpu)?,
        encoder_hidden_states: c.encoder_hidden_states,
        encoder_attention_mask: c.encoder_attention_mask,
        context_latents: c.context_latents,
    })
}

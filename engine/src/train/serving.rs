//! The training set and its serving, epoch by epoch: the dataset a run reads at set-up
//! (preprocessed samples as they are, or songs prepared through the codecs), each
//! epoch's seeded order, and the next group of batches to train on.

use std::path::Path;

use candle_core::{DType, Device};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::config::RunConfig;
use super::flow::Batch;
use super::sink::Sink;
use super::state::TrainingState;
use crate::cancel::Cancel;
use crate::codec::{Conditioner, LatentEncoder};
use crate::data::preprocessed::{is_preprocessed_dir, read_preprocessed_dir, SampleMaker};
use crate::data::{prepare_dataset, DataEvent, FileUse, Issue, PreparedDataset};
use crate::events::Event;
use crate::{Error, Result};

/// The run's training set, with the codecs its samples are made with.
pub(super) struct Serving {
    data: PreparedDataset,
    encoder: Box<dyn LatentEncoder>,
    conditioner: Box<dyn Conditioner>,
    batch_size: usize,
    grad_accum: usize,
    seed: u64,
    batches_per_epoch: usize,
}

impl Serving {
    pub fn new(
        config: &RunConfig,
        data: PreparedDataset,
        encoder: Box<dyn LatentEncoder>,
        conditioner: Box<dyn Conditioner>,
    ) -> Self {
        Self {
            batches_per_epoch: data.len().div_ceil(config.batch_size),
            data,
            encoder,
            conditioner,
            batch_size: config.batch_size,
            grad_accum: config.grad_accum,
            seed: config.seed,
        }
    }

    pub fn data(&self) -> &PreparedDataset {
        &self.data
    }

    pub fn conditioner(&self) -> &dyn Conditioner {
        self.conditioner.as_ref()
    }

    /// Optimizer updates an epoch makes (its last group may be short).
    pub fn updates_per_epoch(&self) -> u64 {
        self.batches_per_epoch.div_ceil(self.grad_accum) as u64
    }

    /// Whether `state`'s epoch has served its last batch.
    pub fn epoch_done(&self, state: &TrainingState) -> bool {
        state.batch_in_epoch >= self.batches_per_epoch
    }

    /// The next `grad_accum` batches of this epoch (fewer at its end: the remainder
    /// is flushed, not carried over).
    pub fn next_group(&self, state: &mut TrainingState, dtype: DType, device: &Device) -> Result<Vec<Batch>> {
        let (bs, n) = (self.batch_size, self.data.len());
        let end = (state.batch_in_epoch + self.grad_accum).min(self.batches_per_epoch);
        let mut group = Vec::with_capacity(end - state.batch_in_epoch);
        for b in state.batch_in_epoch..end {
            let samples = state.epoch_order[b * bs..((b + 1) * bs).min(n)]
                .iter()
                .map(|&i| {
                    // Fresh crops without the cache: seeded per (seed, epoch, item).
                    let seed = self.seed ^ (state.epoch << 32) ^ i as u64;
                    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(0xA24B_AED4_963E_E407));
                    self.data.sample(i, self.encoder.as_ref(), self.conditioner.as_ref(), &mut rng)
                })
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<_> = samples.iter().collect();
            group.push(Batch::collate(&refs, dtype, device)?);
        }
        state.batch_in_epoch = end;
        Ok(group)
    }

    /// Ends `state`'s epoch (`epoch_end` with its mean loss, at update `step`) and
    /// begins the next one's order.
    pub fn end_epoch(&self, state: &mut TrainingState, step: u64, sink: &mut Sink) {
        sink.emit(Event::EpochEnd {
            epoch: state.epoch,
            step,
            mean_loss: (state.epoch_loss_count > 0).then(|| state.epoch_loss_sum / state.epoch_loss_count as f64),
        });
        state.epoch += 1;
        state.batch_in_epoch = 0;
        state.epoch_loss_sum = 0.0;
        state.epoch_loss_count = 0;
        state.epoch_order = epoch_order(self.seed, state.epoch, self.data.len());
    }
}

/// The shuffled sample order of an epoch: a pure function of (seed, epoch).
pub(super) fn epoch_order(seed: u64, epoch: u64, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    order.shuffle(&mut rng);
    order
}

/// The run's training set: a folder of preprocessed samples as it is, or a folder of
/// songs prepared (encoded, or found in the latent cache). Stopped while preparing, an
/// empty set: the run then stops before step 1.
pub(super) fn load_dataset(
    config: &RunConfig,
    encoder: &dyn LatentEncoder,
    conditioner: &dyn Conditioner,
    condition_width: usize,
    cancel: &Cancel,
    sink: &mut Sink,
) -> Result<PreparedDataset> {
    if is_preprocessed_dir(&config.data.folder) {
        let model = SampleMaker { encoder, conditioner, condition_width };
        let samples = read_preprocessed_dir(&config.data.folder, &model)?;
        return PreparedDataset::preprocessed(&config.data, samples, encoder.frames_per_second());
    }
    let cache = config.latent_cache()?;
    let emit = &mut |e| sink.emit(data_event(e, &config.data.folder));
    match prepare_dataset(&config.data, encoder, conditioner, cache.as_ref(), cancel, emit) {
        Err(Error::Cancelled) => Ok(PreparedDataset::empty(&config.data)),
        prepared => prepared,
    }
}

fn data_event(e: DataEvent, folder: &Path) -> Event {
    match e {
        DataEvent::Progress { stage, done, total, file, seconds } => Event::DatasetProgress {
            // The scan's end counts the files found, none of them prepared yet: a
            // progress bar starts empty, not full.
            done: if stage == crate::data::Stage::Scanning { 0 } else { done as u64 },
            total: total as u64,
            file: file.unwrap_or_else(|| folder.to_path_buf()),
            seconds_done: seconds.map(|s| s.0),
            seconds_total: seconds.map(|s| s.1),
        },
        DataEvent::Issue(Issue { file, reason, kind }) => Event::DatasetIssue { file, reason, kind },
        DataEvent::Used(FileUse { file, seconds_used, seconds_in_file, note, prompt }) => {
            Event::DatasetFile { file, seconds_used, seconds_in_file, note, prompt: Some(prompt) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tile_of_a_file_becomes_a_dataset_progress_event_with_seconds() {
        let tile = DataEvent::Progress {
            stage: crate::data::Stage::Encoding,
            done: 2,
            total: 5,
            file: Some("song.wav".into()),
            seconds: Some((30.0, 240.0)),
        };
        let want = Event::DatasetProgress {
            done: 2,
            total: 5,
            file: "song.wav".into(),
            seconds_done: Some(30.0),
            seconds_total: Some(240.0),
        };
        assert_eq!(data_event(tile, Path::new("folder")), want);
        let scanned =
            DataEvent::Progress { stage: crate::data::Stage::Scanning, done: 5, total: 5, file: None, seconds: None };
        assert!(matches!(data_event(scanned, Path::new("folder")), Event::DatasetProgress { done: 0, total: 5, .. }));
        let end =
            DataEvent::Progress { stage: crate::data::Stage::Encoding, done: 5, total: 5, file: None, seconds: None };
        assert!(matches!(
            data_event(end, Path::new("folder")),
            Event::DatasetProgress { done: 5, seconds_done: None, seconds_total: None, .. }
        ));
    }
}

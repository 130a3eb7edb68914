//! Validation: clips held out of training (named, or a seeded share) and their loss
//! at fixed timesteps with fixed noise, so successive values are comparable. It draws
//! from its own seeds only: the training streams, and so resume, are untouched. A live
//! run measures it when due, keeps the best adapter, and stops once patience runs out.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::config::RunConfig;
use super::flow::{Batch, FlowBatch};
use super::sink::Sink;
use super::state::{self, BestValidation, TrainingState};
use super::step::{mix, Trainer};
use crate::codec::{Conditioner, LatentEncoder};
use crate::data::{DatasetItem, PreparedDataset};
use crate::device;
use crate::events::Event;
use crate::lora::{LoraAdapter, LoraMode};
use crate::model::timesteps::turbo_timesteps;
use crate::model::DitModel;
use crate::trace;
use crate::{Error, Result};

/// Seeds the held-out share's draw and the validation noise apart from training's.
const SPLIT_SALT: u64 = 0x5A11_7000_0000_0001;
const NOISE_SALT: u64 = 0x5A11_7000_0000_0002;

/// Splits `data` into (training, held out) as the config says; the held-out set is
/// empty without validation. Errs naming the setting when a named file is not a usable
/// clip or no clip is left to train on.
pub fn split(mut data: PreparedDataset, config: &RunConfig) -> Result<(PreparedDataset, PreparedDataset)> {
    let items = std::mem::take(&mut data.items);
    let (field, held_out) = match (&config.val_files[..], config.val_fraction) {
        ([], None) => ("", vec![false; items.len()]),
        ([], Some(fraction)) => ("val_fraction", drawn(&items, fraction, config.seed)),
        (names, _) => ("val_files", named(&items, names, &config.data.folder)?),
    };
    let (mut train, mut val) = (Vec::new(), Vec::new());
    for (item, out) in items.into_iter().zip(held_out) {
        if out {
            val.push(item)
        } else {
            train.push(item)
        }
    }
    if train.is_empty() && !val.is_empty() {
        return Err(Error::setting(field, "holds out every clip: leave at least one to train on"));
    }
    let held = PreparedDataset { items: val, ..PreparedDataset::empty(&data.spec) };
    data.items = train;
    Ok((data, held))
}

/// A share of the clips (at least one) drawn from the seed, independent of scan order.
fn drawn(items: &[DatasetItem], fraction: f64, seed: u64) -> Vec<bool> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| items[a].source.cmp(&items[b].source));
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed ^ SPLIT_SALT));
    let count = ((fraction * items.len() as f64).round() as usize).max(1);
    let mut out = vec![false; items.len()];
    for &i in &order[..count.min(items.len())] {
        out[i] = true;
    }
    out
}

/// The clips named (paths relative to the audio folder); each name must be one.
fn named(items: &[DatasetItem], names: &[String], folder: &Path) -> Result<Vec<bool>> {
    let relative = |item: &DatasetItem| item.source.strip_prefix(folder).unwrap_or(&item.source).to_path_buf();
    for name in names {
        if !items.iter().any(|i| relative(i) == Path::new(name)) {
            return Err(Error::setting("val_files", format!("`{name}` is not a usable clip of {}", folder.display())));
        }
    }
    Ok(items.iter().map(|i| names.iter().any(|n| relative(i) == Path::new(n))).collect())
}

/// The held-out clips, encoded once, and how their loss is measured.
pub struct Validator {
    batches: Vec<Batch>,
    timesteps: [f64; 8],
    seed: u64,
}

impl Validator {
    /// `None` when no clip is held out. Crops (cache off) are drawn once, seeded.
    pub fn new(
        held_out: &PreparedDataset,
        encoder: &dyn LatentEncoder,
        conditioner: &dyn Conditioner,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Option<Self>> {
        if held_out.is_empty() {
            return Ok(None);
        }
        let batches = (0..held_out.len())
            .map(|i| {
                let mut rng = ChaCha8Rng::seed_from_u64(mix(seed ^ NOISE_SALT, i as u64, u64::MAX));
                let sample = held_out.sample(i, encoder, conditioner, &mut rng)?;
                Batch::collate(&[&sample], dtype, device)
            })
            .collect::<Result<Vec<_>>>()?;
        // The turbo model's 8 timesteps (shift 3) span (0, 1] for every model alike.
        Ok(Some(Self { batches, timesteps: turbo_timesteps(3.0), seed }))
    }

    /// Mean flow-matching loss over every clip at every fixed timestep: no graph, LoRA
    /// dropout off, the same noise each time.
    pub fn loss(&self, model: &DitModel, adapter: &LoraAdapter) -> Result<f64> {
        let ctx = adapter.ctx(LoraMode::Eval, false);
        let mut sum = 0.0;
        for (c, batch) in self.batches.iter().enumerate() {
            for (k, &t) in self.timesteps.iter().enumerate() {
                let mut rng = ChaCha8Rng::seed_from_u64(mix(self.seed ^ NOISE_SALT, c as u64, k as u64));
                let flow = FlowBatch::new(batch, &[t as f32], &mut rng)?;
                let prediction = model.forward(&flow.inputs, Some(&ctx))?;
                sum += trace::read_back("validation loss", &flow.loss(&prediction)?.mean)?[0] as f64;
            }
        }
        Ok(sum / (self.batches.len() * self.timesteps.len()) as f64)
    }
}

/// A live run's validation: when it is due, and what a better or a worse loss does.
pub(super) struct Validation {
    /// Present when clips are held out.
    validator: Option<Validator>,
    every_steps: Option<u64>,
    patience: Option<u64>,
    run_dir: PathBuf,
}

impl Validation {
    pub fn new(config: &RunConfig, run_dir: &Path, validator: Option<Validator>) -> Self {
        Self {
            validator,
            every_steps: config.val_every_steps,
            patience: config.patience,
            run_dir: run_dir.to_path_buf(),
        }
    }

    /// After update `step`: measures the validation loss when due; a better one rewrites
    /// `best/adapter` (before the event, so whoever sees `best` finds it). Returns why to
    /// stop once patience runs out.
    pub fn after_update(
        &self,
        step: u64,
        trainer: &Trainer,
        state: &mut TrainingState,
        sink: &mut Sink,
    ) -> Result<Option<String>> {
        let Some(validator) =
            self.validator.as_ref().filter(|_| self.every_steps.is_some_and(|n| step.is_multiple_of(n)))
        else {
            return Ok(None);
        };
        let loss = device::in_step_scope(|| validator.loss(&trainer.model, &trainer.adapter))?;
        let best = state.best.is_none_or(|b| loss < b.loss);
        if best {
            state::save_best_adapter(&self.run_dir, &trainer.adapter)?;
            state.best = Some(BestValidation { step, loss });
            state.validations_since_best = 0;
        } else {
            state.validations_since_best += 1;
        }
        sink.emit(Event::Validation { step, loss, best });
        let waited = state.validations_since_best;
        Ok(self.patience.filter(|&p| waited >= p).map(|p| {
            format!("no better validation loss in {p} validations (best at step {})", state.best.map_or(0, |b| b.step))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::SongMeta;
    use std::path::PathBuf;

    fn dataset(n: usize) -> PreparedDataset {
        let mut d = PreparedDataset::empty(&Default::default());
        d.items = (0..n)
            .map(|i| DatasetItem {
                source: PathBuf::from(format!("/songs/s{i}.wav")),
                meta: SongMeta::default(),
                seconds_used: 1.0,
                cached: None,
            })
            .collect();
        d
    }

    fn config(files: &[&str], fraction: Option<f64>) -> RunConfig {
        let mut c = RunConfig {
            val_files: files.iter().map(|f| f.to_string()).collect(),
            val_fraction: fraction,
            ..Default::default()
        };
        c.data.folder = "/songs".into();
        c
    }

    fn sources(d: &PreparedDataset) -> Vec<PathBuf> {
        d.items.iter().map(|i| i.source.clone()).collect()
    }

    #[test]
    fn a_drawn_share_is_disjoint_seeded_and_leaves_training_clips() {
        let (train, val) = split(dataset(10), &config(&[], Some(0.3))).unwrap();
        assert_eq!((train.len(), val.len()), (7, 3));
        assert!(sources(&val).iter().all(|s| !sources(&train).contains(s)));
        let (_, again) = split(dataset(10), &config(&[], Some(0.3))).unwrap();
        assert_eq!(sources(&val), sources(&again), "the same seed holds out the same clips");
        let other = RunConfig { seed: 7, ..config(&[], Some(0.3)) };
        assert_ne!(sources(&split(dataset(10), &other).unwrap().1), sources(&val));
        let err = split(dataset(1), &config(&[], Some(0.3))).unwrap_err().to_string();
        assert!(err.contains("val_fraction") && err.contains("at least one"), "{err}");
    }

    #[test]
    fn named_files_are_held_out_and_unknown_or_all_are_errors_naming_the_setting() {
        let (train, val) = split(dataset(3), &config(&["s1.wav"], None)).unwrap();
        assert_eq!(sources(&val), [PathBuf::from("/songs/s1.wav")]);
        assert_eq!(train.len(), 2);
        let err = split(dataset(3), &config(&["nope.wav"], None)).unwrap_err().to_string();
        assert!(err.contains("val_files") && err.contains("nope.wav"), "{err}");
        let err = split(dataset(2), &config(&["s0.wav", "s1.wav"], None)).unwrap_err().to_string();
        assert!(err.contains("val_files"), "{err}");
        let (train, val) = split(dataset(3), &config(&[], None)).unwrap();
        assert_eq!((train.len(), val.len()), (3, 0));
    }
}

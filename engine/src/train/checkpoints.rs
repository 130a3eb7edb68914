//! A run's checkpoints and its start point: when a save is due, the save itself (none
//! when the state on disk is this one already), the final adapter, and where a run
//! starts: the newest checkpoint a resumed run may go on from, or the fresh counters.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Tensor};

use super::config::RunConfig;
use super::loss_scale::{LossScaler, SkipCounter};
use super::serving::epoch_order;
use super::sink::Sink;
use super::state::{self, Checkpoint, TrainingState};
use super::step::Trainer;
use crate::events::Event;
use crate::lora::LoraAdapter;
use crate::model::DitModel;
use crate::{Error, Result};

/// The saves of a live run.
pub(super) struct Checkpoints {
    run_dir: PathBuf,
    keep: usize,
    every_steps: Option<u64>,
    every_epochs: Option<u64>,
    /// The state on disk: the newest checkpoint's, or the start's, which resume makes
    /// again without one.
    saved: TrainingState,
}

impl Checkpoints {
    pub fn new(config: &RunConfig, run_dir: &Path, saved: TrainingState) -> Self {
        Self {
            run_dir: run_dir.to_path_buf(),
            keep: config.keep_checkpoints,
            every_steps: config.save_every_steps,
            every_epochs: config.save_every_epochs,
            saved,
        }
    }

    /// Whether the periodic saves ask for a checkpoint at this step boundary: after
    /// every `save_every_steps`-th update, and as every `save_every_epochs`-th epoch
    /// begins, once per update.
    pub fn due(&self, state: &TrainingState, step: u64) -> bool {
        let by_steps = self.every_steps.is_some_and(|n| step.is_multiple_of(n));
        let by_epochs = self.every_epochs.is_some_and(|n| state.batch_in_epoch == 0 && state.epoch.is_multiple_of(n));
        step > self.saved.step && (by_steps || by_epochs)
    }

    /// Saves `state` (its counters brought up to `trainer`'s) at this step boundary
    /// unless it is on disk already: a stop, a pause or the end where a save just was,
    /// or the start (nothing tried yet).
    pub fn save(&mut self, state: &mut TrainingState, trainer: &Trainer, sink: &mut Sink) -> Result<()> {
        state.step = trainer.applied_steps();
        state.attempts = trainer.attempts;
        state.loss_scaler = trainer.scaler.clone();
        state.skips = trainer.skips.clone();
        if *state == self.saved {
            return Ok(());
        }
        let path = state::save_checkpoint(
            &self.run_dir,
            state,
            &trainer.adapter,
            trainer.optimizer.state_tensors()?,
            self.keep,
        )?;
        self.saved = state.clone();
        sink.emit(Event::CheckpointSaved { step: state.step, path });
        Ok(())
    }

    /// Writes `final/adapter`.
    pub fn save_final(&self, adapter: &LoraAdapter) -> Result<PathBuf> {
        state::save_final_adapter(&self.run_dir, adapter)
    }
}

/// Where a run starts: its adapter, the optimizer's saved tensors (none when fresh)
/// and its counters.
pub(super) struct StartPoint {
    pub adapter: LoraAdapter,
    pub optimizer_state: Option<HashMap<String, Tensor>>,
    pub state: TrainingState,
}

impl StartPoint {
    /// From the checkpoint a resumed run goes on from, else fresh for `samples` clips.
    pub fn new(
        resumed: Option<Checkpoint>,
        dit: &DitModel,
        config: &RunConfig,
        dtype: DType,
        samples: usize,
    ) -> Result<Self> {
        Ok(match resumed {
            Some(ckpt) => {
                Self { adapter: ckpt.adapter, optimizer_state: Some(ckpt.optimizer_state), state: ckpt.state }
            }
            None => Self {
                adapter: LoraAdapter::new(config.lora.clone(), dit, config.seed)?
                    .with_trigger(config.data.trigger.clone()),
                optimizer_state: None,
                state: fresh_state(config, dtype, samples),
            },
        })
    }
}

/// The checkpoint a resumed run goes on from, or `None` to start from the start as a
/// new run does: when it stopped or died before its first checkpoint, or its newest one
/// is from before the first attempt (older engines wrote one at a stop while the dataset
/// was prepared, with no clips in it). `clips`: the clips prepared (`None` when a stop
/// cut the preparation short), which a checkpoint must have been trained on.
pub(super) fn resume_point(
    run_dir: &Path,
    dit: &DitModel,
    config: &RunConfig,
    clips: Option<usize>,
    sink: &mut Sink,
) -> Result<Option<Checkpoint>> {
    if state::list_checkpoints(run_dir)?.is_empty() {
        return Ok(None);
    }
    let (mut ckpt, warnings) = state::load_latest(run_dir, dit)?;
    for message in warnings {
        sink.emit(Event::Warning { message });
    }
    if !config.matches_trajectory(&ckpt.state.config_hash) {
        return Err(Error::BadFile {
            path: run_dir.join("run.toml"),
            reason: "the settings differ from those the checkpoint was trained with".into(),
        });
    }
    // Its successors carry this engine's hash (older ones held the run's name).
    ckpt.state.config_hash = config.trajectory_hash();
    if ckpt.state.attempts == 0 {
        return Ok(None);
    }
    if let Some(clips) = clips {
        check_clips(&ckpt.state, clips, &config.data.folder)?;
    }
    Ok(Some(ckpt))
}

/// A checkpoint goes on only with the clips it was trained on: its epoch order must be
/// an order of them (songs added or removed since would index past them).
fn check_clips(state: &TrainingState, clips: usize, folder: &Path) -> Result<()> {
    let mut order = state.epoch_order.clone();
    order.sort_unstable();
    if order.into_iter().eq(0..clips) {
        return Ok(());
    }
    Err(Error::BadFile {
        path: folder.to_path_buf(),
        reason: format!(
            "{clips} clips to train on, but the checkpoint was trained on {}: put the songs back as they were, or start a new run",
            state.epoch_order.len()
        ),
    })
}

/// The counters of a run before its first step.
fn fresh_state(config: &RunConfig, dtype: DType, samples: usize) -> TrainingState {
    let loss_scaler = if dtype == DType::F16 { LossScaler::dynamic(config.loss_scale) } else { LossScaler::disabled() };
    TrainingState {
        engine_version: state::ENGINE_VERSION.into(),
        config_hash: config.trajectory_hash(),
        seed: config.seed,
        step: 0,
        attempts: 0,
        epoch: 0,
        batch_in_epoch: 0,
        epoch_order: epoch_order(config.seed, 0, samples),
        epoch_loss_sum: 0.0,
        epoch_loss_count: 0,
        last_loss: None,
        loss_scaler,
        skips: SkipCounter::new(config.max_consecutive_skips),
        elapsed_s: 0.0,
        best: None,
        validations_since_best: 0,
    }
}

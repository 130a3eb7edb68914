//! The training loop, top to bottom: set up, then for each step train, then whatever
//! is due (checkpoint, preview, songs asked, validation, the end, a pause or a stop),
//! then finish. Each of those is a service in its own module; this file only calls them
//! in order. It runs on the thread `Run::start` spawns (`handle`).

use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::time::Instant;

use super::cfg_dropout::CfgDropout;
use super::checkpoints::{resume_point, Checkpoints, StartPoint};
use super::config::RunConfig;
use super::control::{Asked, RunControl};
use super::fit::MemoryPlan;
use super::listening::Listening;
use super::lock::RunLock;
use super::optim::Optimizer;
use super::run_dir::Origin;
use super::schedule::LrScheduler;
use super::serving::{load_dataset, Serving};
use super::sink::Sink;
use super::songs::Voice;
use super::state::TrainingState;
use super::step::{StepOutcome, StepSettings, Trainer};
use super::validation::{self, Validation, Validator};
use crate::cancel::Cancel;
use crate::data::PreparedDataset;
use crate::device;
use crate::events::{DatasetSummary, Event, EventLog, MemoryFeatures};
use crate::load::source::LoadedModel;
use crate::metrics::{MemoryProbe, RateMeter};
use crate::model::timesteps::TimestepSampling;
use crate::Result;

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEnd {
    Finished {
        adapter: PathBuf,
        steps: u64,
    },
    /// `adapter` is `None` when the run stopped before its first update.
    Stopped {
        adapter: Option<PathBuf>,
        steps: u64,
    },
    Failed {
        reason: String,
        steps: u64,
    },
}

/// The thread's body: set up, train, and end a failure with an event (after removing
/// a new run that trained nothing).
pub(super) fn train(
    config: &RunConfig,
    run_dir: &Path,
    origin: Origin,
    lock: RunLock,
    plan: &MemoryPlan,
    control: &RunControl,
    tx: Sender<Event>,
) -> Result<RunEnd> {
    let log = match EventLog::open(run_dir.join("events.jsonl")) {
        Ok(log) => log,
        Err(e) => {
            origin.discard(run_dir);
            return Err(e);
        }
    };
    let mut sink = Sink::new(log, tx, lock);
    let resuming = origin == Origin::Resumed;
    let (result, steps) = match Loop::setup(config, run_dir, resuming, plan, control.cancel(), &mut sink) {
        Ok(mut training) => {
            // A stop during setup ends the run before its first step, as a stop between steps does.
            let result = match control.cancel().is_cancelled() {
                true => training.stop(&mut sink),
                false => training.run(control, &mut sink),
            };
            (result, training.trainer.applied_steps())
        }
        Err(e) => (Err(e), 0),
    };
    let reason = match &result {
        Ok(RunEnd::Failed { reason, .. }) => reason.clone(),
        Ok(_) => return result,
        Err(e) => e.to_string(),
    };
    if steps == 0 {
        origin.discard(run_dir);
    }
    sink.emit(Event::Failed { step: steps, reason });
    result
}

struct Loop {
    config: RunConfig,
    trainer: Trainer,
    /// Where the run is: saved by `checkpoints`, advanced by `serving` and each step.
    state: TrainingState,
    total_steps: u64,
    serving: Serving,
    checkpoints: Checkpoints,
    validation: Validation,
    listening: Listening,
}

impl Loop {
    fn setup(
        config: &RunConfig,
        run_dir: &Path,
        resuming: bool,
        plan: &MemoryPlan,
        cancel: &Cancel,
        sink: &mut Sink,
    ) -> Result<Self> {
        // 1. Device, model, dataset.
        let selected = device::select(config.force_cpu)?;
        let dtype = config.precision.dtype(&selected.device);
        let LoadedModel {
            dit,
            encoder,
            conditioner,
            default_timesteps,
            null_condition,
            default_cfg_dropout,
            parameters,
        } = config.model.load(config.precision, &selected.device)?;
        let cfg_dropout = config.cfg_dropout.unwrap_or(default_cfg_dropout);
        let dropout = CfgDropout::for_ratio(cfg_dropout, &null_condition)?;
        let turbo = matches!(default_timesteps, TimestepSampling::Turbo { .. });
        let condition_width = dit.config().encoder_hidden_size;
        let data = load_dataset(config, encoder.as_ref(), conditioner.as_ref(), condition_width, cancel, sink)?;

        // 2. Held-out clips leave the training set before anything depends on its size.
        let (data, held_out) = match data.is_empty() {
            true => (data, PreparedDataset::empty(&config.data)),
            false => validation::split(data, config)?,
        };
        let validator =
            Validator::new(&held_out, encoder.as_ref(), conditioner.as_ref(), config.seed, dtype, &selected.device)?;
        let voice = Voice::new(config.model.clone(), selected.device.clone(), turbo, null_condition);
        let listening = Listening::new(config, run_dir, &data, voice, cancel)?;
        let serving = Serving::new(config, data, encoder, conditioner);
        let total_steps = (serving.updates_per_epoch() * config.epochs).min(config.max_steps.unwrap_or(u64::MAX));

        // 3. Adapter, optimizer and counters: from the newest checkpoint, or fresh.
        let clips = serving.data().len();
        let resumed = match resuming {
            // A stop while preparing leaves no clips to check the checkpoint against.
            true => resume_point(run_dir, &dit, config, (!cancel.is_cancelled()).then_some(clips), sink)?,
            false => None,
        };
        let StartPoint { adapter, optimizer_state, state } = StartPoint::new(resumed, &dit, config, dtype, clips)?;
        let vars = adapter.vars();
        let optimizer = match optimizer_state {
            Some(s) => Optimizer::from_state(vars, &config.optimizer, &s)?,
            None => Optimizer::new(vars, &config.optimizer)?,
        };
        let trainer = Trainer {
            settings: StepSettings {
                checkpointing: config.gradient_checkpointing,
                max_grad_norm: config.max_grad_norm,
                timesteps: config.timesteps.clone().unwrap_or(default_timesteps),
                seed: config.seed,
                cfg_dropout: dropout,
            },
            lr: LrScheduler::new(config.lr_schedule.clone(), config.lr, total_steps),
            scaler: state.loss_scaler.clone(),
            skips: state.skips.clone(),
            attempts: state.attempts,
            optimizer,
            adapter,
            model: dit,
        };

        // 4. A run stopped during setup never started.
        if !cancel.is_cancelled() {
            let started = Started { plan, parameters, cfg_dropout, total_steps };
            let device = format!("{} ({})", selected.name, selected.reason);
            let precision = config.precision.describe(&selected.device);
            sink.emit(started.event(config, device, precision, &trainer, serving.data()));
        }
        Ok(Self {
            config: config.clone(),
            trainer,
            checkpoints: Checkpoints::new(config, run_dir, state.clone()),
            state,
            total_steps,
            serving,
            validation: Validation::new(config, run_dir, validator),
            listening,
        })
    }

    fn run(&mut self, control: &RunControl, sink: &mut Sink) -> Result<RunEnd> {
        let mut probe = MemoryProbe::for_device(self.trainer.model.device());
        let mut rate = RateMeter::new(20);
        while self.state.epoch < self.config.epochs {
            while !self.serving.epoch_done(&self.state) {
                // Step boundary: a checkpoint, a preview, songs asked, the end, a stop
                // point, a pause or a stop.
                let step = self.trainer.applied_steps();
                if self.checkpoints.due(&self.state, step) {
                    self.checkpoints.save(&mut self.state, &self.trainer, sink)?;
                }
                let conditioner = self.serving.conditioner();
                self.listening.preview_if_due(step, &self.trainer, conditioner, sink);
                self.listening.serve(control.take_songs(), &self.trainer, conditioner);
                if step >= self.total_steps {
                    return self.finish(sink, None);
                }
                if self.config.stop_at_step.is_some_and(|s| step >= s) || self.pause_or_stop(control, sink)? {
                    return self.stop(sink);
                }

                // One update.
                let started = Instant::now();
                let model = &self.trainer.model;
                let group = self.serving.next_group(&mut self.state, model.dtype(), model.device())?;
                let sample_count: u64 = group.iter().map(|b| b.len() as u64).sum();
                let outcome = device::in_step_scope(|| self.trainer.step(&group))?;
                let seconds = started.elapsed().as_secs_f64();
                self.state.elapsed_s += seconds;
                match outcome {
                    StepOutcome::Applied { loss, lr, grad_norm, samples } => {
                        rate.record(sample_count, seconds);
                        self.state.epoch_loss_sum += loss;
                        self.state.epoch_loss_count += 1;
                        self.state.last_loss = Some(loss);
                        let memory = probe.sample();
                        let step = self.trainer.applied_steps();
                        sink.emit(Event::Step {
                            step,
                            epoch: self.state.epoch,
                            loss,
                            lr,
                            grad_norm,
                            samples_per_sec: rate.samples_per_sec(),
                            memory_now_bytes: memory.now_bytes,
                            memory_peak_bytes: memory.peak_bytes,
                            elapsed_s: self.state.elapsed_s,
                            eta_s: rate.eta_s(self.total_steps.saturating_sub(step)),
                            samples,
                        });
                        if let Some(reason) =
                            self.validation.after_update(step, &self.trainer, &mut self.state, sink)?
                        {
                            return self.finish(sink, Some(reason));
                        }
                    }
                    StepOutcome::Skipped { reason, consecutive, loss_scale, give_up } => {
                        sink.emit(Event::StepSkipped {
                            step: self.trainer.applied_steps() + 1,
                            reason: reason.clone(),
                            consecutive,
                            loss_scale,
                        });
                        if give_up {
                            let reason = format!(
                                "{consecutive} steps in a row had {reason}; the last checkpoint holds the last good state"
                            );
                            return Ok(RunEnd::Failed { reason, steps: self.trainer.applied_steps() });
                        }
                    }
                }
            }
            self.serving.end_epoch(&mut self.state, self.trainer.applied_steps(), sink);
        }
        self.finish(sink, None)
    }

    /// Holds the run while paused (after checkpointing); true when a stop was requested.
    fn pause_or_stop(&mut self, control: &RunControl, sink: &mut Sink) -> Result<bool> {
        match control.asked() {
            Asked::Train => Ok(false),
            Asked::Stop => Ok(true),
            Asked::Pause => {
                self.checkpoints.save(&mut self.state, &self.trainer, sink)?;
                let (listening, trainer, conditioner) =
                    (&mut self.listening, &self.trainer, self.serving.conditioner());
                Ok(control.hold(trainer.applied_steps(), sink, |songs| listening.serve(songs, trainer, conditioner)))
            }
        }
    }

    /// Checkpoints (a run stopped before its first step needs none: it resumes from the
    /// start) and writes the final adapter once a step is trained: before that it would
    /// be the untrained start.
    fn stop(&mut self, sink: &mut Sink) -> Result<RunEnd> {
        self.checkpoints.save(&mut self.state, &self.trainer, sink)?;
        let steps = self.trainer.applied_steps();
        let adapter = match steps {
            0 => None,
            _ => Some(self.checkpoints.save_final(&self.trainer.adapter)?),
        };
        sink.emit(Event::Stopped { step: steps, adapter_path: adapter.clone() });
        Ok(RunEnd::Stopped { adapter, steps })
    }

    /// `reason` says why a run ends before its last step.
    fn finish(&mut self, sink: &mut Sink, reason: Option<String>) -> Result<RunEnd> {
        let steps = self.trainer.applied_steps();
        // The last step's preview, when the run ends with its epochs.
        self.listening.preview_if_due(steps, &self.trainer, self.serving.conditioner(), sink);
        self.checkpoints.save(&mut self.state, &self.trainer, sink)?;
        let adapter = self.checkpoints.save_final(&self.trainer.adapter)?;
        sink.emit(Event::Finished { adapter_path: adapter.clone(), steps, final_loss: self.state.last_loss, reason });
        Ok(RunEnd::Finished { adapter, steps })
    }
}

/// What the `run_started` event tells beside the config and the trainer.
struct Started<'a> {
    plan: &'a MemoryPlan,
    parameters: u64,
    cfg_dropout: f64,
    total_steps: u64,
}

impl Started<'_> {
    /// The `run_started` event: what the run is about to do, on what, with what.
    fn event(
        self,
        config: &RunConfig,
        device: String,
        precision: String,
        trainer: &Trainer,
        data: &PreparedDataset,
    ) -> Event {
        let trainable = trainer.adapter.num_parameters() as u64;
        Event::RunStarted {
            config: serde_json::to_value(config).expect("config serialises"),
            device,
            precision,
            memory: MemoryFeatures {
                gradient_checkpointing: config.gradient_checkpointing,
                block_input_grad_path: config.gradient_checkpointing,
                latent_cache: config.latent_cache,
                predicted_peak_bytes: Some(self.plan.predicted_peak_bytes),
                machine: self.plan.machine.clone(),
            },
            adapter: config.lora.describe(),
            trainable_params: trainable,
            total_params: self.parameters + trainable,
            cfg_dropout: self.cfg_dropout,
            timestep_levels: trainer.settings.timesteps.levels().map(|l| l.iter().map(|&t| t as f32).collect()),
            dataset: DatasetSummary {
                files: (data.len() + data.skipped()) as u64,
                usable: data.len() as u64,
                skipped: data.skipped() as u64,
                cache_hits: data.cache_hits as u64,
                cache_misses: data.cache_misses as u64,
                total_seconds: data.seconds_used(),
                seconds_in_files: Some(data.seconds_in_files()),
            },
            total_steps: self.total_steps,
        }
    }
}

//! A run's state, folded from its events: its status, progress, latest numbers and the
//! series charts draw. Kept once here; the CLI's progress, `train::history`, the app
//! and (serialized) its window all read a run through it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::events::{drop_redone, DatasetSummary, Event, MemoryFeatures, SampleLoss};

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Nothing has begun: the state before a run's first event.
    #[default]
    Idle,
    /// Begun and not ended: preparing its dataset or training.
    Running,
    /// Paused at a step boundary.
    Paused,
    /// Stopped before its end (by the user or `stop_at_step`); resumable.
    Stopped,
    Finished,
    Failed,
    /// The process ended without a final event (a crash or a kill): resumable. Only a
    /// run directory tells this (its events alone end "running").
    Interrupted,
    /// The event log cannot be read: the status is unknown.
    Damaged,
}

impl RunStatus {
    /// Whether the run is in the hands of the engine: begun, not ended.
    pub fn is_active(self) -> bool {
        matches!(self, RunStatus::Running | RunStatus::Paused)
    }
}

/// What `run_started` tells of the run (its resolved config stays in `run.toml`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Started {
    pub device: String,
    pub precision: String,
    /// The adapter trained (`LoRA r 64 alpha 128`).
    pub adapter: String,
    pub memory: MemoryFeatures,
    pub trainable_params: u64,
    pub total_params: u64,
    pub cfg_dropout: f64,
    pub dataset: DatasetSummary,
    pub total_steps: u64,
}

/// Dataset preparation, as its latest `dataset_progress` event tells it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Preparing {
    /// Files prepared so far, of `total`.
    pub done: u64,
    pub total: u64,
    /// The file being prepared.
    pub file: PathBuf,
    /// Seconds of `file` encoded so far and in all (per-tile progress).
    pub seconds: Option<(f64, f64)>,
    /// The share of the preparation done, 0 to 1 (see [`preparation_fraction`]).
    pub fraction: f64,
}

/// The share of dataset preparation done: files done plus the encoded part of the
/// current one.
pub fn preparation_fraction(done: u64, total: u64, seconds: Option<(f64, f64)>) -> f64 {
    let part = seconds.map_or(0.0, |(d, t)| if t > 0.0 { (d / t).clamp(0.0, 1.0) } else { 1.0 });
    if total == 0 {
        1.0
    } else {
        ((done as f64 + part) / total as f64).min(1.0)
    }
}

/// One applied update, as its `step` event tells it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepRecord {
    pub step: u64,
    /// 0-based.
    pub epoch: u64,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub samples_per_sec: f64,
    pub memory_now_bytes: u64,
    pub memory_peak_bytes: u64,
    pub elapsed_s: f64,
    pub eta_s: Option<f64>,
    /// Each sample's timestep and loss (for the noise-level chart; not sent to views).
    #[serde(skip)]
    pub samples: Vec<SampleLoss>,
}

/// A run as its events tell it. Serialized (for a front end's view) without the series.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RunState {
    pub status: RunStatus,
    /// The latest `run_started` (a resumed run starts again).
    pub started: Option<Started>,
    /// Dataset preparation while it goes on; `None` before and after it.
    pub preparing: Option<Preparing>,
    /// Updates applied: the newest step's, or what the run's end says.
    pub steps: u64,
    /// The newest `step` event.
    pub last_step: Option<StepRecord>,
    /// The step and loss of the lowest validation loss so far (`best/adapter`).
    pub best: Option<(u64, f64)>,
    /// The adapter the run's end wrote (`finished`, or a `stopped` after some update).
    pub adapter: Option<PathBuf>,
    /// Why the run failed.
    pub reason: Option<String>,
    /// Why it finished before its last step (early stopping).
    pub finished_early: Option<String>,
    /// Every applied update, redone ones replaced (charts).
    #[serde(skip)]
    series: Vec<StepRecord>,
    /// Every validation loss as (step, loss), redone ones replaced (charts).
    #[serde(skip)]
    validations: Vec<(u64, f64)>,
    /// The timesteps the run draws t from, when it draws from a fixed set.
    #[serde(skip)]
    timestep_levels: Option<Vec<f32>>,
}

impl RunState {
    /// A run that has begun (the engine took it) before its first event.
    pub fn begun() -> Self {
        RunState { status: RunStatus::Running, ..RunState::default() }
    }

    /// The state a whole log tells.
    pub fn replay(events: &[Event]) -> Self {
        let mut state = RunState::default();
        for event in events {
            state.apply(event);
        }
        state
    }

    /// Folds one event in.
    pub fn apply(&mut self, event: &Event) {
        if self.status == RunStatus::Idle {
            self.status = RunStatus::Running;
        }
        match event {
            Event::RunStarted {
                device,
                precision,
                adapter,
                memory,
                trainable_params,
                total_params,
                cfg_dropout,
                timestep_levels,
                dataset,
                total_steps,
                ..
            } => {
                self.started = Some(Started {
                    device: device.clone(),
                    precision: precision.clone(),
                    adapter: adapter.clone(),
                    memory: memory.clone(),
                    trainable_params: *trainable_params,
                    total_params: *total_params,
                    cfg_dropout: *cfg_dropout,
                    dataset: dataset.clone(),
                    total_steps: *total_steps,
                });
                self.timestep_levels = timestep_levels.clone();
                self.status = RunStatus::Running;
                (self.preparing, self.reason, self.finished_early) = (None, None, None);
            }
            Event::DatasetProgress { done, total, file, seconds_done, seconds_total } => {
                let seconds = seconds_done.zip(*seconds_total);
                self.preparing = Some(Preparing {
                    done: *done,
                    total: *total,
                    file: file.clone(),
                    seconds,
                    fraction: preparation_fraction(*done, *total, seconds),
                });
            }
            Event::Step {
                step,
                epoch,
                loss,
                lr,
                grad_norm,
                samples_per_sec,
                memory_now_bytes,
                memory_peak_bytes,
                elapsed_s,
                eta_s,
                samples,
            } => {
                let record = StepRecord {
                    step: *step,
                    epoch: *epoch,
                    loss: *loss,
                    lr: *lr,
                    grad_norm: *grad_norm,
                    samples_per_sec: *samples_per_sec,
                    memory_now_bytes: *memory_now_bytes,
                    memory_peak_bytes: *memory_peak_bytes,
                    elapsed_s: *elapsed_s,
                    eta_s: *eta_s,
                    samples: samples.clone(),
                };
                // A resumed run redoes the steps after its checkpoint: the later replace the earlier.
                drop_redone(&mut self.series, *step, |s| s.step);
                self.series.push(record.clone());
                self.steps = *step;
                self.last_step = Some(record);
                self.status = RunStatus::Running;
            }
            Event::Validation { step, loss, best } => {
                drop_redone(&mut self.validations, *step, |v| v.0);
                self.validations.push((*step, *loss));
                if *best {
                    self.best = Some((*step, *loss));
                }
            }
            Event::Paused { .. } => self.status = RunStatus::Paused,
            Event::Resumed { .. } => self.status = RunStatus::Running,
            Event::Stopped { step, adapter_path } => {
                (self.status, self.steps, self.adapter) = (RunStatus::Stopped, *step, adapter_path.clone());
                self.preparing = None;
            }
            Event::Finished { adapter_path, steps, reason, .. } => {
                (self.status, self.steps, self.adapter) = (RunStatus::Finished, *steps, Some(adapter_path.clone()));
                (self.preparing, self.finished_early) = (None, reason.clone());
            }
            Event::Failed { reason, .. } => {
                (self.status, self.reason) = (RunStatus::Failed, Some(reason.clone()));
                self.preparing = None;
            }
            Event::DatasetIssue { .. }
            | Event::DatasetFile { .. }
            | Event::StepSkipped { .. }
            | Event::EpochEnd { .. }
            | Event::CheckpointSaved { .. }
            | Event::Preview { .. }
            | Event::Warning { .. } => {}
        }
    }

    /// Updates the whole run will apply, once it has started training.
    pub fn total_steps(&self) -> Option<u64> {
        self.started.as_ref().map(|s| s.total_steps)
    }

    /// The newest applied update's loss.
    pub fn last_loss(&self) -> Option<f64> {
        self.last_step.as_ref().map(|s| s.loss)
    }

    /// Every applied update in step order, redone ones replaced.
    pub fn series(&self) -> &[StepRecord] {
        &self.series
    }

    /// Every validation loss as (step, loss), redone ones replaced.
    pub fn validations(&self) -> &[(u64, f64)] {
        &self.validations
    }

    /// The run's fixed timesteps, when it draws t from a fixed set (turbo).
    pub fn timestep_levels(&self) -> Option<&[f32]> {
        self.timestep_levels.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::IssueKind;

    fn started(total_steps: u64) -> Event {
        Event::RunStarted {
            config: serde_json::json!({}),
            device: "cpu".into(),
            precision: "f32".into(),
            memory: MemoryFeatures {
                gradient_checkpointing: true,
                block_input_grad_path: true,
                latent_cache: true,
                predicted_peak_bytes: None,
                machine: None,
            },
            adapter: "LoRA r 64 alpha 128".into(),
            trainable_params: 10,
            total_params: 100,
            cfg_dropout: 0.0,
            timestep_levels: Some(vec![1.0, 0.5]),
            dataset: DatasetSummary {
                files: 2,
                usable: 2,
                skipped: 0,
                cache_hits: 0,
                cache_misses: 2,
                total_seconds: 20.0,
                seconds_in_files: None,
            },
            total_steps,
        }
    }

    fn step(step: u64, loss: f64) -> Event {
        Event::Step {
            step,
            epoch: (step - 1) / 2,
            loss,
            lr: 1e-4,
            grad_norm: 1.0,
            samples_per_sec: 2.0,
            memory_now_bytes: 1 << 20,
            memory_peak_bytes: 2 << 20,
            elapsed_s: step as f64,
            eta_s: Some(1.0),
            samples: vec![SampleLoss { t: 0.5, loss: loss as f32 }],
        }
    }

    fn progress(done: u64, total: u64, seconds: Option<(f64, f64)>) -> Event {
        Event::DatasetProgress {
            done,
            total,
            file: format!("song-{done}.wav").into(),
            seconds_done: seconds.map(|s| s.0),
            seconds_total: seconds.map(|s| s.1),
        }
    }

    #[test]
    fn nothing_has_begun_until_an_event_says_so() {
        let state = RunState::replay(&[]);
        assert_eq!((state.status, state.steps, state.last_loss()), (RunStatus::Idle, 0, None));
        assert_eq!(RunState::begun().status, RunStatus::Running);
        assert!(!RunStatus::Idle.is_active() && RunStatus::Paused.is_active());
    }

    #[test]
    fn preparation_is_followed_and_ends_when_training_starts() {
        let mut state = RunState::default();
        state.apply(&progress(0, 2, None));
        assert_eq!(state.status, RunStatus::Running);
        state.apply(&progress(1, 2, Some((30.0, 120.0))));
        let p = state.preparing.clone().unwrap();
        assert_eq!((p.done, p.total, p.file.to_str(), p.seconds), (1, 2, Some("song-1.wav"), Some((30.0, 120.0))));
        assert!((p.fraction - 1.25 / 2.0).abs() < 1e-12, "{}", p.fraction);
        state.apply(&Event::DatasetIssue { file: "x.mp3".into(), reason: "bad".into(), kind: IssueKind::Skipped });
        state.apply(&progress(2, 2, None));
        assert_eq!(state.preparing.as_ref().unwrap().fraction, 1.0);
        state.apply(&started(4));
        assert_eq!(state.preparing, None, "the dataset line no longer says preparing");
        assert_eq!(state.total_steps(), Some(4));
        assert_eq!(state.started.as_ref().unwrap().dataset.usable, 2);
        assert_eq!(state.timestep_levels(), Some(&[1.0, 0.5][..]));
    }

    #[test]
    fn a_run_through_pause_validation_and_its_finish() {
        let events = [
            progress(2, 2, None),
            started(4),
            step(1, 0.9),
            step(2, 0.8),
            Event::Validation { step: 2, loss: 0.7, best: true },
            Event::Paused { step: 2 },
        ];
        let mut state = RunState::replay(&events);
        assert_eq!((state.status, state.steps, state.last_loss()), (RunStatus::Paused, 2, Some(0.8)));
        assert_eq!(state.last_step.as_ref().map(|s| (s.epoch, s.elapsed_s)), Some((0, 2.0)));
        for e in [
            Event::Resumed { step: 2 },
            step(3, 0.6),
            Event::Validation { step: 3, loss: 0.75, best: false },
            step(4, 0.5),
            Event::EpochEnd { epoch: 1, step: 4, mean_loss: Some(0.55) },
        ] {
            state.apply(&e);
            assert_eq!(state.status, RunStatus::Running, "{e:?}");
        }
        state.apply(&Event::Finished {
            adapter_path: "final/adapter".into(),
            steps: 4,
            final_loss: Some(0.5),
            reason: Some("no better validation loss in 1 validation".into()),
        });
        assert_eq!(state.status, RunStatus::Finished);
        assert!(!state.status.is_active());
        assert_eq!((state.steps, state.best), (4, Some((2, 0.7))));
        assert_eq!(state.adapter.as_deref(), Some(std::path::Path::new("final/adapter")));
        assert!(state.finished_early.as_deref().unwrap().starts_with("no better"));
        assert_eq!(state.series().iter().map(|s| s.step).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert_eq!(state.validations(), [(2, 0.7), (3, 0.75)]);
    }

    #[test]
    fn a_resumed_run_redoes_steps_after_its_checkpoint_and_they_replace_the_first() {
        // Crash after step 3; resume from the checkpoint at step 1: preparing again, then 2-3 again.
        let events = [
            started(3),
            step(1, 0.9),
            step(2, 0.8),
            Event::Validation { step: 2, loss: 0.9, best: true },
            step(3, 0.7),
            progress(1, 2, None),
            started(3),
            step(2, 0.6),
            Event::Validation { step: 2, loss: 0.4, best: true },
        ];
        let state = RunState::replay(&events);
        assert_eq!((state.status, state.steps, state.last_loss()), (RunStatus::Running, 2, Some(0.6)));
        let losses: Vec<(u64, f64)> = state.series().iter().map(|s| (s.step, s.loss)).collect();
        assert_eq!(losses, [(1, 0.9), (2, 0.6)]);
        assert_eq!(state.validations(), [(2, 0.4)]);
        assert_eq!(state.best, Some((2, 0.4)));
        assert_eq!(state.series()[1].samples, [SampleLoss { t: 0.5, loss: 0.6 }]);
    }

    #[test]
    fn failed_and_stopped_runs_end_preparation_and_a_restart_clears_the_failure() {
        let mut state = RunState::replay(&[progress(1, 6, None), Event::Failed { step: 0, reason: "no audio".into() }]);
        assert_eq!(
            (state.status, state.reason.as_deref(), &state.preparing),
            (RunStatus::Failed, Some("no audio"), &None)
        );
        state.apply(&started(2));
        assert_eq!((state.status, state.reason.as_deref()), (RunStatus::Running, None));

        let stopped = RunState::replay(&[progress(3, 6, None), Event::Stopped { step: 0, adapter_path: None }]);
        assert_eq!((stopped.status, stopped.steps, &stopped.preparing), (RunStatus::Stopped, 0, &None));
        assert_eq!(stopped.adapter, None, "an untrained stop writes no adapter");
        let stopped =
            RunState::replay(&[step(1, 0.5), step(2, 0.4), Event::Stopped { step: 2, adapter_path: Some("a".into()) }]);
        assert_eq!((stopped.steps, stopped.adapter.as_deref()), (2, Some(std::path::Path::new("a"))));
    }

    #[test]
    fn the_view_serializes_status_and_numbers_without_the_series() {
        let state = RunState::replay(&[started(4), step(1, 0.9), Event::Paused { step: 1 }]);
        let json = serde_json::to_value(&state).unwrap();
        assert_eq!(json["status"], "paused");
        assert_eq!(json["last_step"]["loss"], 0.9);
        assert_eq!(json["started"]["device"], "cpu");
        assert!(json.get("series").is_none() && json["last_step"].get("samples").is_none(), "{json}");
    }
}

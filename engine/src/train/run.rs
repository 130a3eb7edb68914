//! A run: the training loop on its own thread, controlled through a `RunHandle`
//! (pause, resume, stop) and observed through `Event`s, which also go to the run
//! directory's `events.jsonl`.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use candle_core::DType;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::cfg_dropout::CfgDropout;
use super::config::RunConfig;
use super::fit::{self, MemoryPlan};
use super::flow::Batch;
use super::lock::RunLock;
use super::loss_scale::{LossScaler, SkipCounter};
use super::optim::Optimizer;
use super::preview::Previews;
use super::schedule::LrScheduler;
use super::songs::{self, SongRequest, SongUpdate, Trained, Voice};
use super::state::{self, BestValidation, Checkpoint, TrainingState};
use super::step::{StepOutcome, StepSettings, Trainer};
use super::validation::{self, Validator};
use crate::cancel::Cancel;
use crate::codec::{Conditioner, LatentEncoder};
use crate::data::preprocessed::{is_preprocessed_dir, read_preprocessed_dir, SampleMaker};
use crate::data::{prepare_dataset, DataEvent, FileUse, Issue, PreparedDataset};
use crate::device;
use crate::events::{DatasetSummary, Event, EventLog, MemoryFeatures};
use crate::generate::GenerateSpec;
use crate::load::source::LoadedModel;
use crate::lora::LoraAdapter;
use crate::metrics::{MemoryProbe, RateMeter};
use crate::model::timesteps::TimestepSampling;
use crate::model::DitModel;
use crate::{Error, Result};

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

#[derive(Default)]
struct Requests {
    pause: bool,
    stop: bool,
    /// Songs asked for, served at the next step boundary (also while paused).
    songs: Vec<SongRequest>,
    /// The loop is over: no song will be served any more.
    ended: bool,
}

/// Requests from the front end, read by the loop at step boundaries.
#[derive(Default)]
struct Control {
    requests: Mutex<Requests>,
    wake: Condvar,
    /// Set by a stop as well: setup's long work (dataset preparation) polls it.
    cancel: Cancel,
}

impl Control {
    /// The songs asked for so far, taken from the queue.
    fn take_songs(&self) -> Vec<SongRequest> {
        std::mem::take(&mut self.requests.lock().expect("control lock").songs)
    }
}

/// Pause, resume and stop a run from any thread (a signal handler, a UI command).
#[derive(Clone)]
pub struct RunControl(Arc<Control>);

impl RunControl {
    /// Pause at the next step boundary (after writing a checkpoint).
    pub fn pause(&self) {
        self.0.requests.lock().expect("control lock").pause = true;
    }

    /// Continue a paused run.
    pub fn resume(&self) {
        self.0.requests.lock().expect("control lock").pause = false;
        self.0.wake.notify_all();
    }

    /// Stop at the next step boundary (during dataset preparation: before the next
    /// file or encoder chunk): checkpoint and final adapter (once a step is trained),
    /// `stopped`.
    pub fn stop(&self) {
        self.0.requests.lock().expect("control lock").stop = true;
        self.0.cancel.cancel();
        self.0.wake.notify_all();
    }

    /// Asks the run for a song of `spec` with the model and adapter it trains, written to
    /// `out`, made at its next step boundary (at once when paused). Its progress and end
    /// come on the receiver; a run that has ended refuses.
    pub fn generate(&self, spec: GenerateSpec, out: PathBuf) -> Result<Receiver<SongUpdate>> {
        let (updates, rx) = channel();
        let mut r = self.0.requests.lock().expect("control lock");
        if r.ended {
            return Err(Error::BadRequest("the run has ended: generate from its saved adapter".into()));
        }
        r.songs.push(SongRequest { spec, out, updates });
        self.0.wake.notify_all();
        Ok(rx)
    }
}

pub struct RunHandle {
    run_dir: PathBuf,
    control: RunControl,
    events: Receiver<Event>,
    thread: JoinHandle<Result<RunEnd>>,
}

impl RunHandle {
    pub fn pause(&self) {
        self.control.pause()
    }

    pub fn resume(&self) {
        self.control.resume()
    }

    pub fn stop(&self) {
        self.control.stop()
    }

    /// A handle on pause/resume/stop that can move to other threads.
    pub fn control(&self) -> RunControl {
        self.control.clone()
    }

    pub fn events(&self) -> &Receiver<Event> {
        &self.events
    }

    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    pub fn join(self) -> Result<RunEnd> {
        self.thread.join().unwrap_or_else(|_| Err(Error::Panicked("training")))
    }
}

pub struct Run;

impl Run {
    /// Starts a new run in `<runs_dir>/<name>` (which must not hold a run already).
    /// Its paths are made absolute first; the run directory is locked for its life.
    pub fn start(mut config: RunConfig) -> Result<RunHandle> {
        config.validate()?;
        config.resolve_paths()?;
        // A run predicted past the machine's memory does not start.
        let plan = fit::plan(&config)?;
        fit::check(&plan)?;
        crate::lora::check_rank(&config.lora, &config.model.shape()?.dit)?;
        let run_dir = config.run_dir();
        let origin = Origin::New { created_dir: create_run_dir(&run_dir)? };
        let lock = RunLock::acquire(&run_dir)?;
        if run_dir.join("run.toml").exists() {
            return Err(Error::BadFile {
                path: run_dir,
                reason: "already holds a run: resume it or choose another name".into(),
            });
        }
        if let Err(e) = write_config(&run_dir, &config) {
            origin.discard(&run_dir);
            return Err(e);
        }
        Ok(spawn(config, run_dir, origin, lock, plan))
    }

    /// Continues a paused, stopped or crashed run from its newest readable checkpoint,
    /// or from the start when it has none (it ended before its first).
    pub fn resume(run_dir: &Path) -> Result<RunHandle> {
        Self::resume_with(run_dir, None)
    }

    /// As `resume`, stopping (resumably) once `stop_at_step` updates are applied. Errs
    /// at once, leaving the run as it was, when another process trains it or a folder
    /// it reads is missing.
    pub fn resume_with(run_dir: &Path, stop_at_step: Option<u64>) -> Result<RunHandle> {
        let run_dir = std::path::absolute(run_dir).map_err(|e| Error::io(run_dir, e))?;
        let mut config = RunConfig::from_toml_file(&run_dir.join("run.toml"))?;
        let lock = RunLock::acquire(&run_dir)?;
        config.check_input_folders()?;
        let plan = fit::plan(&config)?;
        fit::check(&plan)?;
        config.stop_at_step = stop_at_step;
        config.runs_dir = run_dir.parent().map(Path::to_path_buf).unwrap_or_default();
        config.name = run_dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        write_config(&run_dir, &config)?;
        Ok(spawn(config, run_dir, Origin::Resumed, lock, plan))
    }
}

/// Whose directory a run trains in.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Origin {
    /// A new run; whether its start created the directory.
    New {
        created_dir: bool,
    },
    Resumed,
}

impl Origin {
    /// Removes a new run that trained nothing, so that no failed run blocks its name;
    /// a resumed run's directory is never touched.
    fn discard(self, run_dir: &Path) {
        match self {
            Origin::New { created_dir: true } => {
                let _ = std::fs::remove_dir_all(run_dir);
            }
            // The folder was there before the run: remove only what the start wrote.
            Origin::New { created_dir: false } => {
                for name in ["run.toml", "events.jsonl"] {
                    let _ = std::fs::remove_file(run_dir.join(name));
                }
            }
            Origin::Resumed => {}
        }
    }
}

/// Creates `run_dir` and its parents; true when this call created it.
fn create_run_dir(run_dir: &Path) -> Result<bool> {
    if let Some(parent) = run_dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    match std::fs::create_dir(run_dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(Error::io(run_dir, e)),
    }
}

fn write_config(run_dir: &Path, config: &RunConfig) -> Result<()> {
    let path = run_dir.join("run.toml");
    std::fs::write(&path, config.to_toml()).map_err(|e| Error::io(&path, e))
}

fn spawn(config: RunConfig, run_dir: PathBuf, origin: Origin, lock: RunLock, plan: MemoryPlan) -> RunHandle {
    let control = Arc::new(Control::default());
    let (tx, rx) = channel();
    let thread = {
        let (control, run_dir) = (control.clone(), run_dir.clone());
        std::thread::Builder::new()
            .name("ostinato-train".into())
            .spawn(move || {
                let end = train(&config, &run_dir, origin, lock, &plan, &control, tx);
                // Requests not served are dropped: their requesters hear the run ended.
                let mut r = control.requests.lock().expect("control lock");
                (r.ended, r.songs) = (true, Vec::new());
                end
            })
            .expect("spawn training thread")
    };
    RunHandle { run_dir, control: RunControl(control), events: rx, thread }
}

/// The thread's body: set up, train, and end a failure with an event (after removing
/// a new run that trained nothing).
fn train(
    config: &RunConfig,
    run_dir: &Path,
    origin: Origin,
    lock: RunLock,
    plan: &MemoryPlan,
    control: &Control,
    tx: Sender<Event>,
) -> Result<RunEnd> {
    let log = match EventLog::open(run_dir.join("events.jsonl")) {
        Ok(log) => log,
        Err(e) => {
            origin.discard(run_dir);
            return Err(e);
        }
    };
    let mut sink = Sink { log, tx, lock: Some(lock) };
    let (result, steps) =
        match Loop::setup(config, run_dir, origin == Origin::Resumed, plan, &control.cancel, &mut sink) {
            Ok(mut training) => {
                // A stop during setup ends the run before its first step, as a stop between steps does.
                let result = if control.cancel.is_cancelled() {
                    training.stop(&mut sink)
                } else {
                    training.run(control, &mut sink)
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

/// Every event goes to the log (flushed) and to the front end.
struct Sink {
    log: EventLog,
    tx: Sender<Event>,
    /// The run directory's lock, let go with the run's final event.
    lock: Option<RunLock>,
}

impl Sink {
    fn emit(&mut self, event: Event) {
        // A full disk must not kill training: the checkpoint path reports write errors.
        let _ = self.log.append(&event);
        if matches!(event, Event::Finished { .. } | Event::Stopped { .. } | Event::Failed { .. }) {
            // The run ends with this event: whoever sees it and then lists the runs must
            // not find the run live (the training thread ends only later), and the next
            // writer appends after it.
            self.lock = None;
        }
        let _ = self.tx.send(event);
    }
}

struct Loop {
    config: RunConfig,
    run_dir: PathBuf,
    encoder: Box<dyn crate::codec::LatentEncoder>,
    conditioner: Box<dyn crate::codec::Conditioner>,
    data: PreparedDataset,
    /// Present when clips are held out.
    validator: Option<Validator>,
    trainer: Trainer,
    state: TrainingState,
    /// The state on disk: the newest checkpoint's, or the start's, which resume makes
    /// again without one.
    saved: TrainingState,
    total_steps: u64,
    batches_per_epoch: usize,
    previews: Option<Previews>,
    /// The decoder and what sampling needs beside the DiT: previews and requested songs.
    voice: Voice,
    /// The step whose preview was last tried: one try per step, however it ended.
    previewed_step: Option<u64>,
    /// Set by a stop: ends a preview between its sampling steps.
    cancel: Cancel,
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

        // Held-out clips leave the training set before anything depends on its size.
        let (data, held_out) = match data.is_empty() {
            true => (data, PreparedDataset::empty(&config.data)),
            false => validation::split(data, config)?,
        };
        let validator =
            Validator::new(&held_out, encoder.as_ref(), conditioner.as_ref(), config.seed, dtype, &selected.device)?;
        let previews = Previews::new(config, &data);
        let mut voice = Voice::new(config.model.clone(), selected.device.clone(), turbo, null_condition);
        if previews.is_some() {
            voice.load_decoder()?;
        }

        // 2. Schedule length.
        let batches_per_epoch = data.len().div_ceil(config.batch_size);
        let updates_per_epoch = batches_per_epoch.div_ceil(config.grad_accum) as u64;
        let total_steps = (updates_per_epoch * config.epochs).min(config.max_steps.unwrap_or(u64::MAX));

        // 3. Adapter, optimizer and counters: from the newest checkpoint, or fresh.
        let resumed = match resuming {
            // A stop while preparing leaves no clips to check the checkpoint against.
            true => resume_point(run_dir, &dit, config, (!cancel.is_cancelled()).then_some(data.len()), sink)?,
            false => None,
        };
        let (adapter, optimizer_state, state) = match resumed {
            Some(ckpt) => (ckpt.adapter, Some(ckpt.optimizer_state), ckpt.state),
            None => {
                let adapter = LoraAdapter::new(config.lora.clone(), &dit, config.seed)?;
                (adapter, None, fresh_state(config, config.trajectory_hash(), dtype, data.len()))
            }
        };
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

        // A run stopped during setup never started.
        if !cancel.is_cancelled() {
            let device = format!("{} ({})", selected.name, selected.reason);
            let precision = config.precision.describe(&selected.device);
            sink.emit(run_started(
                config,
                device,
                precision,
                plan,
                &trainer,
                parameters,
                cfg_dropout,
                &data,
                total_steps,
            ));
        }
        Ok(Self {
            config: config.clone(),
            run_dir: run_dir.to_path_buf(),
            encoder,
            conditioner,
            data,
            validator,
            trainer,
            saved: state.clone(),
            state,
            total_steps,
            batches_per_epoch,
            previews,
            voice,
            previewed_step: None,
            cancel: cancel.clone(),
        })
    }

    fn run(&mut self, control: &Control, sink: &mut Sink) -> Result<RunEnd> {
        let mut probe = MemoryProbe::for_device(self.trainer.model.device());
        let mut rate = RateMeter::new(20);
        while self.state.epoch < self.config.epochs {
            while self.state.batch_in_epoch < self.batches_per_epoch {
                // Step boundary: a checkpoint, a preview, the end, a stop point, or a request
                // from the front end.
                if self.save_due() {
                    self.checkpoint(sink)?;
                }
                let step = self.trainer.applied_steps();
                self.preview_if_due(sink);
                self.serve_songs(control.take_songs());
                if step >= self.total_steps {
                    return self.finish(sink, None);
                }
                if self.config.stop_at_step.is_some_and(|s| step >= s) || self.wait_if_paused(control, sink)? {
                    return self.stop(sink);
                }

                let started = Instant::now();
                let group = self.next_group()?;
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
                        if self.config.val_every_steps.is_some_and(|n| step.is_multiple_of(n)) {
                            if let Some(reason) = self.validate(sink)? {
                                return self.finish(sink, Some(reason));
                            }
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
            self.end_epoch(sink);
        }
        self.finish(sink, None)
    }

    /// The next `grad_accum` batches of this epoch (fewer at its end: the remainder
    /// is flushed, not carried over).
    fn next_group(&mut self) -> Result<Vec<Batch>> {
        let (bs, n) = (self.config.batch_size, self.data.len());
        let end = (self.state.batch_in_epoch + self.config.grad_accum).min(self.batches_per_epoch);
        let mut group = Vec::with_capacity(end - self.state.batch_in_epoch);
        for b in self.state.batch_in_epoch..end {
            let samples = self.state.epoch_order[b * bs..((b + 1) * bs).min(n)]
                .iter()
                .map(|&i| {
                    // Fresh crops without the cache: seeded per (seed, epoch, item).
                    let seed = self.config.seed ^ (self.state.epoch << 32) ^ i as u64;
                    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(0xA24B_AED4_963E_E407));
                    self.data.sample(i, self.encoder.as_ref(), self.conditioner.as_ref(), &mut rng)
                })
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<_> = samples.iter().collect();
            group.push(Batch::collate(&refs, self.trainer.model.dtype(), self.trainer.model.device())?);
        }
        self.state.batch_in_epoch = end;
        Ok(group)
    }

    fn end_epoch(&mut self, sink: &mut Sink) {
        let s = &mut self.state;
        sink.emit(Event::EpochEnd {
            epoch: s.epoch,
            step: self.trainer.optimizer.step_count(),
            mean_loss: (s.epoch_loss_count > 0).then(|| s.epoch_loss_sum / s.epoch_loss_count as f64),
        });
        s.epoch += 1;
        s.batch_in_epoch = 0;
        s.epoch_loss_sum = 0.0;
        s.epoch_loss_count = 0;
        s.epoch_order = epoch_order(self.config.seed, s.epoch, self.data.len());
    }

    /// Whether the periodic saves ask for a checkpoint at this step boundary: after
    /// every `save_every_steps`-th update, and as every `save_every_epochs`-th epoch
    /// begins, once per update.
    fn save_due(&self) -> bool {
        let (step, epoch) = (self.trainer.applied_steps(), self.state.epoch);
        let by_steps = self.config.save_every_steps.is_some_and(|n| step.is_multiple_of(n));
        let by_epochs =
            self.config.save_every_epochs.is_some_and(|n| self.state.batch_in_epoch == 0 && epoch.is_multiple_of(n));
        step > self.saved.step && (by_steps || by_epochs)
    }

    /// Blocks while paused (after checkpointing); true when a stop was requested.
    fn wait_if_paused(&mut self, control: &Control, sink: &mut Sink) -> Result<bool> {
        let pause = {
            let r = control.requests.lock().expect("control lock");
            if r.stop {
                return Ok(true);
            }
            r.pause
        };
        if !pause {
            return Ok(false);
        }
        self.checkpoint(sink)?;
        let step = self.trainer.applied_steps();
        sink.emit(Event::Paused { step });
        let mut r = control.requests.lock().expect("control lock");
        while r.pause && !r.stop {
            if r.songs.is_empty() {
                r = control.wake.wait(r).expect("control lock");
                continue;
            }
            let songs = std::mem::take(&mut r.songs);
            drop(r);
            self.serve_songs(songs);
            r = control.requests.lock().expect("control lock");
        }
        if r.stop {
            return Ok(true);
        }
        sink.emit(Event::Resumed { step });
        Ok(false)
    }

    /// Saves the state at this step boundary unless it is on disk already: a stop, a
    /// pause or the end where a save just was, or the start (nothing tried yet).
    fn checkpoint(&mut self, sink: &mut Sink) -> Result<()> {
        self.state.step = self.trainer.applied_steps();
        self.state.attempts = self.trainer.attempts;
        self.state.loss_scaler = self.trainer.scaler.clone();
        self.state.skips = self.trainer.skips.clone();
        if self.state == self.saved {
            return Ok(());
        }
        let path = state::save_checkpoint(
            &self.run_dir,
            &self.state,
            &self.trainer.adapter,
            self.trainer.optimizer.state_tensors()?,
            self.config.keep_checkpoints,
        )?;
        self.saved = self.state.clone();
        sink.emit(Event::CheckpointSaved { step: self.state.step, path });
        Ok(())
    }

    /// Checkpoints (a run stopped before its first step needs none: it resumes from the
    /// start) and writes the final adapter once a step is trained: before that it would
    /// be the untrained start.
    fn stop(&mut self, sink: &mut Sink) -> Result<RunEnd> {
        self.checkpoint(sink)?;
        let steps = self.trainer.applied_steps();
        let adapter = match steps {
            0 => None,
            _ => Some(state::save_final_adapter(&self.run_dir, &self.trainer.adapter)?),
        };
        sink.emit(Event::Stopped { step: steps, adapter_path: adapter.clone() });
        Ok(RunEnd::Stopped { adapter, steps })
    }

    /// Measures the validation loss; a better one rewrites `best/adapter` (before the
    /// event, so whoever sees `best` finds it). Returns why to stop once patience runs out.
    fn validate(&mut self, sink: &mut Sink) -> Result<Option<String>> {
        let Some(validator) = &self.validator else {
            return Ok(None);
        };
        let step = self.trainer.applied_steps();
        let loss = device::in_step_scope(|| validator.loss(&self.trainer.model, &self.trainer.adapter))?;
        let best = self.state.best.is_none_or(|b| loss < b.loss);
        if best {
            state::save_best_adapter(&self.run_dir, &self.trainer.adapter)?;
            self.state.best = Some(BestValidation { step, loss });
            self.state.validations_since_best = 0;
        } else {
            self.state.validations_since_best += 1;
        }
        sink.emit(Event::Validation { step, loss, best });
        let waited = self.state.validations_since_best;
        Ok(self.config.patience.filter(|&p| waited >= p).map(|p| {
            format!(
                "no better validation loss in {p} validations (best at step {})",
                self.state.best.map_or(0, |b| b.step)
            )
        }))
    }

    /// `reason` says why a run ends before its last step.
    fn finish(&mut self, sink: &mut Sink, reason: Option<String>) -> Result<RunEnd> {
        // The last step's preview, when the run ends with its epochs.
        self.preview_if_due(sink);
        self.checkpoint(sink)?;
        let adapter = state::save_final_adapter(&self.run_dir, &self.trainer.adapter)?;
        let steps = self.trainer.applied_steps();
        sink.emit(Event::Finished { adapter_path: adapter.clone(), steps, final_loss: self.state.last_loss, reason });
        Ok(RunEnd::Finished { adapter, steps })
    }

    /// Makes the preview due at this step boundary unless it was tried already or is
    /// there (made before a stop and resume). A stop ends it unwritten; a failure is a
    /// warning: a preview is never worth the run.
    fn preview_if_due(&mut self, sink: &mut Sink) {
        let step = self.trainer.applied_steps();
        let Some(previews) = &self.previews else { return };
        if self.previewed_step.replace(step) == Some(step) {
            return;
        }
        let Some(rel) = previews.due(step).filter(|rel| !self.run_dir.join(rel).exists()) else { return };
        let parts = Trained {
            model: &self.trainer.model,
            adapter: &self.trainer.adapter,
            conditioner: self.conditioner.as_ref(),
        };
        match previews.make(&self.run_dir, &rel, step, &mut self.voice, &parts, &self.cancel) {
            Ok(event) => sink.emit(event),
            Err(Error::Cancelled) => {}
            Err(e) => sink.emit(Event::Warning { message: format!("the preview at step {step} failed: {e}") }),
        }
    }

    /// Makes the songs asked of the run, with the model and adapter as they are at this
    /// step boundary.
    fn serve_songs(&mut self, requests: Vec<SongRequest>) {
        let parts = Trained {
            model: &self.trainer.model,
            adapter: &self.trainer.adapter,
            conditioner: self.conditioner.as_ref(),
        };
        for request in requests {
            songs::serve(request, &mut self.voice, &parts, &self.cancel);
        }
    }
}

/// The run's training set: a folder of preprocessed samples as it is, or a folder of
/// songs prepared (encoded, or found in the latent cache). Stopped while preparing, an
/// empty set: `train` then stops before step 1.
fn load_dataset(
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

/// The checkpoint a resumed run goes on from, or `None` to start from the start as a
/// new run does: when it stopped or died before its first checkpoint, or its newest one
/// is from before the first attempt (older engines wrote one at a stop while the dataset
/// was prepared, with no clips in it). `clips`: the clips prepared (`None` when a stop
/// cut the preparation short), which a checkpoint must have been trained on.
fn resume_point(
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
fn fresh_state(config: &RunConfig, config_hash: String, dtype: DType, samples: usize) -> TrainingState {
    let loss_scaler = if dtype == DType::F16 { LossScaler::dynamic(config.loss_scale) } else { LossScaler::disabled() };
    TrainingState {
        engine_version: state::ENGINE_VERSION.into(),
        config_hash,
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

/// The `run_started` event: what the run is about to do, on what, with what.
#[allow(clippy::too_many_arguments)]
fn run_started(
    config: &RunConfig,
    device: String,
    precision: String,
    plan: &MemoryPlan,
    trainer: &Trainer,
    parameters: u64,
    cfg_dropout: f64,
    data: &PreparedDataset,
    total_steps: u64,
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
            predicted_peak_bytes: Some(plan.predicted_peak_bytes),
            machine: plan.machine.clone(),
        },
        adapter: config.lora.describe(),
        trainable_params: trainable,
        total_params: parameters + trainable,
        cfg_dropout,
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
        total_steps,
    }
}

/// The shuffled sample order of an epoch: a pure function of (seed, epoch).
fn epoch_order(seed: u64, epoch: u64, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    order.shuffle(&mut rng);
    order
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
    use crate::train::history;

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

    #[test]
    fn the_live_marker_is_gone_before_the_final_event_is_seen() {
        let tmp = tempfile::tempdir().unwrap();
        let marker = tmp.path().join(crate::train::lock::LIVE_MARKER);
        let (tx, rx) = channel();
        let lock = Some(RunLock::acquire(tmp.path()).unwrap());
        let mut sink = Sink { log: EventLog::open(tmp.path().join("events.jsonl")).unwrap(), tx, lock };
        sink.emit(Event::Paused { step: 1 });
        assert!(marker.exists(), "a paused run is still live");
        assert!(history::is_live(tmp.path()));
        sink.emit(Event::Stopped { step: 1, adapter_path: Some("a".into()) });
        assert!(matches!(rx.recv().unwrap(), Event::Paused { .. }));
        assert!(matches!(rx.recv().unwrap(), Event::Stopped { .. }));
        assert!(!marker.exists());
        assert!(!history::is_live(tmp.path()));
        assert_eq!(history::summarise(tmp.path()).status, history::RunStatus::Stopped);
    }
}

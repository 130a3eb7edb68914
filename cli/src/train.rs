//! `train` and `resume`: build the run config, start the run, follow its events,
//! turn Ctrl-C / SIGTERM into a graceful stop.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use ostinato_engine::cancel::Cancel;
use ostinato_engine::data::{TagMode, TriggerTag};
use ostinato_engine::label::saved_labels;
use ostinato_engine::label::store::LabelStore;
use ostinato_engine::load::source::ModelSource;
use ostinato_engine::lora::parse_targets;
use ostinato_engine::train::config::default_run_name;
use ostinato_engine::train::fit::{self, Fit};
use ostinato_engine::train::schedule::LrSchedule;
use ostinato_engine::train::{Run, RunConfig, RunEnd, RunHandle};

use crate::args::TrainArgs;
use crate::progress::{self, Mode, Progress};

/// Exit code after a stop by Ctrl-C or SIGTERM (128 + SIGINT).
pub const INTERRUPTED: i32 = 130;

/// A cancel that Ctrl-C sets; a second Ctrl-C exits at once.
pub fn cancel_on_ctrl_c() -> anyhow::Result<Cancel> {
    let cancel = Cancel::never();
    let set = cancel.clone();
    ctrlc::set_handler(move || {
        if set.is_cancelled() {
            std::process::exit(INTERRUPTED);
        }
        set.cancel();
    })
    .context("cannot install the Ctrl-C handler")?;
    Ok(cancel)
}

pub fn train(args: TrainArgs) -> anyhow::Result<i32> {
    let mut config = build_config(&args)?;
    let mode = Mode::choose(args.json, args.quiet);
    let plan = match args.fit {
        Fit::Auto => fit::fit_auto(&mut config).context("cannot fit the run to this machine")?,
        Fit::Off => fit::plan(&config)?,
    };
    // A plan that does not fit is refused before it is shown as the run's.
    fit::check(&plan).context("cannot start the run")?;
    let changes = match plan.changes.is_empty() {
        true => String::new(),
        false => format!(" (fit auto: {})", plan.changes.join(", ")),
    };
    progress::preamble(mode, &format!("memory: {}{changes}", plan.summary()));
    let handle = Run::start(config).context("cannot start the run")?;
    follow(handle, mode)
}

pub fn resume(run_dir: &Path, mode: Mode, stop_at_step: Option<u64>) -> anyhow::Result<i32> {
    if !run_dir.join("run.toml").is_file() {
        bail!("{} is not a run directory (no run.toml)", run_dir.display());
    }
    follow(Run::resume_with(run_dir, stop_at_step)?, mode)
}

/// Flags override the config file, which overrides the defaults.
fn build_config(a: &TrainArgs) -> anyhow::Result<RunConfig> {
    let mut c = match &a.config {
        Some(path) => RunConfig::from_toml_file(path)?,
        None => RunConfig::default(),
    };
    if !a.audio_dir.is_dir() {
        bail!("audio folder {} does not exist or is not a folder", a.audio_dir.display());
    }
    c.data.folder = a.audio_dir.clone();
    if let Some(model) = &a.model {
        c.model = ModelSource::Folder { path: model.clone() };
    } else if a.demo || a.config.is_none() {
        c.model = ModelSource::Demo;
    }
    if let Some(dir) = &a.runs_dir {
        c.runs_dir = dir.clone();
    }
    c.name = a.name.clone().unwrap_or_else(default_run_name);
    let store = match &a.labels_dir {
        Some(dir) => LabelStore::new(dir),
        None => LabelStore::open_default(),
    };
    // The config file's own labels for a song win over the store's.
    let saved = saved_labels(&store, &c.data.folder)?;
    c.data.labels = saved.into_iter().chain(std::mem::take(&mut c.data.labels)).collect();
    if a.gradient_checkpointing || a.no_gradient_checkpointing {
        c.gradient_checkpointing = a.gradient_checkpointing;
    }
    if a.cache || a.no_cache {
        c.latent_cache = a.cache;
    }
    let set = |dst: &mut u64, v: Option<u64>| v.into_iter().for_each(|v| *dst = v);
    set(&mut c.epochs, a.epochs);
    set(&mut c.seed, a.seed);
    c.max_steps = a.max_steps.or(c.max_steps);
    c.stop_at_step = a.stop_at_step.or(c.stop_at_step);
    c.save_every_steps = a.save_every_steps.or(c.save_every_steps);
    c.batch_size = a.batch_size.unwrap_or(c.batch_size);
    c.grad_accum = a.grad_accum.unwrap_or(c.grad_accum);
    if let Some(name) = &a.optimizer {
        c.choose_optimizer(name).map_err(|e| anyhow::anyhow!("--optimizer: {e}"))?;
    }
    c.lr = a.lr.unwrap_or(c.lr);
    if let Some(name) = &a.lr_schedule {
        c.lr_schedule = LrSchedule::named(name).map_err(anyhow::Error::msg)?;
    }
    if let Some(n) = a.warmup_steps {
        c.lr_schedule.set_warmup(n).map_err(anyhow::Error::msg)?;
    }
    if let Some(n) = a.cycles {
        c.lr_schedule.set_cycles(n).map_err(anyhow::Error::msg)?;
    }
    if let Some(kind) = &a.adapter {
        c.lora.choose(kind.parse().map_err(|e| anyhow::anyhow!("--adapter: {e}"))?);
    }
    c.lora.r = a.rank.unwrap_or(c.lora.r);
    c.lora.use_dora |= a.dora;
    c.lora.factor = a.factor.unwrap_or(c.lora.factor);
    c.lora.decompose_both |= a.decompose_both;
    c.lora.alpha = a.alpha.unwrap_or(c.lora.alpha);
    c.lora.dropout = a.dropout.unwrap_or(c.lora.dropout);
    if let Some(list) = &a.targets {
        c.lora.target_modules = parse_targets(list).map_err(|e| anyhow::anyhow!("--targets: {e}"))?;
    }
    c.cfg_dropout = a.cfg_dropout.or(c.cfg_dropout);
    c.precision = a.precision.unwrap_or(c.precision);
    c.data.crop_seconds = a.crop_seconds.or(c.data.crop_seconds);
    if let Some(tag) = &a.trigger {
        let mode = a.trigger_position.unwrap_or(TagMode::Prepend);
        c.data.trigger = Some(TriggerTag { tag: tag.clone(), mode });
    }
    c.preview_every_steps = a.preview_every_steps.or(c.preview_every_steps);
    c.preview_seconds = a.preview_seconds.or(c.preview_seconds);
    c.preview_caption = a.preview_caption.clone().or(c.preview_caption.take());
    if !a.preview_prompts.is_empty() {
        c.preview_prompts = a.preview_prompts.clone();
    }
    c.preview_at_step_0 = a.preview_at_step_0.or(c.preview_at_step_0);
    if !a.val_files.is_empty() {
        c.val_files = a.val_files.clone();
    }
    c.val_fraction = a.val_fraction.or(c.val_fraction);
    c.val_every_steps = a.val_every_steps.or(c.val_every_steps);
    c.patience = a.patience.or(c.patience);
    c.validate()?;
    Ok(c)
}

/// Shows the run's events until it ends; maps how it ended to an exit code.
fn follow(handle: RunHandle, mode: Mode) -> anyhow::Result<i32> {
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let (control, interrupted) = (handle.control(), interrupted.clone());
        ctrlc::set_handler(move || {
            if interrupted.swap(true, Ordering::SeqCst) {
                // Second Ctrl-C: leave now. Checkpoints are renamed into place whole,
                // so the newest one on disk is intact.
                std::process::exit(INTERRUPTED);
            }
            eprintln!("\nstopping after this step (Ctrl-C again to quit at once)...");
            control.stop();
        })
        .context("cannot install the Ctrl-C handler")?;
    }
    let mut progress = Progress::new(mode);
    for event in handle.events().iter() {
        progress.show(&event);
    }
    let end = handle.join();
    progress.finish();
    match end? {
        RunEnd::Finished { .. } => Ok(0),
        RunEnd::Stopped { .. } if interrupted.load(Ordering::SeqCst) => Ok(INTERRUPTED),
        RunEnd::Stopped { .. } => Ok(0),
        RunEnd::Failed { reason, .. } => bail!("training failed: {reason}"),
    }
}

//! `RunConfig`: everything a run needs, saved as `run.toml` in the run directory.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::loss_scale::LossScaleConfig;
use super::optim::OptimizerConfig;
use super::prompts::{check_prompts, PreviewPrompt, PromptDefaults};
use super::schedule::LrSchedule;
use crate::data::{DataSpec, LatentCache};
use crate::device::Precision;
use crate::error::SettingErrors;
use crate::generate::song::MAX_SECONDS;
use crate::load::source::ModelSource;
use crate::lora::LoraConfig;
use crate::model::timesteps::TimestepSampling;
use crate::{Error, Result};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// The run directory is `<runs_dir>/<name>`.
    pub name: String,
    pub runs_dir: PathBuf,
    pub model: ModelSource,
    pub data: DataSpec,
    pub lora: LoraConfig,
    pub optimizer: OptimizerConfig,
    /// Peak learning rate.
    pub lr: f64,
    pub lr_schedule: LrSchedule,
    /// Timestep sampling; `None` takes the model's default (turbo: shift 3).
    pub timesteps: Option<TimestepSampling>,
    /// Share of samples trained on the model's null condition (CFG dropout), in
    /// [0, 1]; `None` takes the model's default (base/SFT 0.15, turbo and demo 0).
    pub cfg_dropout: Option<f64>,
    pub epochs: u64,
    /// Bound on optimizer updates for the whole run (the schedule spans it).
    pub max_steps: Option<u64>,
    /// Stop (resumably) once this many updates are applied, as the Stop button would.
    pub stop_at_step: Option<u64>,
    pub batch_size: usize,
    /// Batches whose gradients are summed into one update.
    pub grad_accum: usize,
    /// Global-norm gradient clipping.
    pub max_grad_norm: f64,
    /// The run fails after this many non-finite steps in a row.
    pub max_consecutive_skips: u32,
    /// Dynamic loss scaling, used with f16 compute only.
    pub loss_scale: LossScaleConfig,
    pub seed: u64,
    pub precision: Precision,
    /// Train on the CPU even where a GPU is available.
    pub force_cpu: bool,
    /// Recompute each block in backward instead of keeping its activations.
    pub gradient_checkpointing: bool,
    /// Encode every song once and keep its latents in the content-addressed cache.
    pub latent_cache: bool,
    /// Where the latent cache lives; `None` is the platform cache directory.
    pub cache_dir: Option<PathBuf>,
    pub save_every_steps: Option<u64>,
    pub save_every_epochs: Option<u64>,
    /// Step checkpoints kept besides `final/`.
    pub keep_checkpoints: usize,
    /// A preview song every this many applied steps, and one of the base model before
    /// step 1; `None`: no previews.
    pub preview_every_steps: Option<u64>,
    /// Seconds of each preview; `None`: 10. (Optional, as the other preview settings,
    /// so that run.toml files from before previews keep their trajectory hash.)
    pub preview_seconds: Option<f64>,
    /// The previews' caption; `None`: the first usable song's caption.
    pub preview_caption: Option<String>,
    /// The user's own preview prompts, each previewed at every preview step; empty:
    /// one, of the preview caption, seconds and seed above.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub preview_prompts: Vec<PreviewPrompt>,
    /// A preview of the base model before step 1, to compare with; `None`: yes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preview_at_step_0: Option<bool>,
    /// Files of the audio folder (paths relative to it) held out for validation.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub val_files: Vec<String>,
    /// Share of the clips held out for validation, drawn from the run seed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_fraction: Option<f64>,
    /// Validation loss every this many updates (when clips are held out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_every_steps: Option<u64>,
    /// Finish early after this many validations without a better loss.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patience: Option<u64>,
}

impl Default for RunConfig {
    /// ACE-Step's trainer defaults where it has them (AdamW wd 0.01, warmup-cosine,
    /// clip 1.0) and its UI's LoRA defaults (r 64, alpha 128, dropout 0.1, lr 3e-4).
    fn default() -> Self {
        Self {
            name: String::new(),
            runs_dir: default_runs_dir(),
            model: ModelSource::Demo,
            data: DataSpec::default(),
            lora: LoraConfig::default(),
            optimizer: OptimizerConfig::default(),
            lr: 3e-4,
            lr_schedule: LrSchedule::default(),
            timesteps: None,
            cfg_dropout: None,
            epochs: 10,
            max_steps: None,
            stop_at_step: None,
            batch_size: 1,
            grad_accum: 1,
            max_grad_norm: 1.0,
            max_consecutive_skips: 20,
            loss_scale: LossScaleConfig::default(),
            seed: 42,
            precision: Precision::Auto,
            force_cpu: false,
            gradient_checkpointing: true,
            latent_cache: true,
            cache_dir: None,
            save_every_steps: Some(100),
            save_every_epochs: None,
            keep_checkpoints: 3,
            preview_every_steps: None,
            preview_seconds: None,
            preview_caption: None,
            preview_prompts: Vec::new(),
            preview_at_step_0: None,
            val_files: Vec::new(),
            val_fraction: None,
            val_every_steps: None,
            patience: None,
        }
    }
}

/// Seconds of a preview when the config names none.
pub const DEFAULT_PREVIEW_SECONDS: f64 = 10.0;

/// The largest seed: the config travels as JSON (the run_started event, the app's
/// settings), whose readers hold whole numbers exactly only up to 2^53 - 1.
pub const MAX_SEED: u64 = (1 << 53) - 1;

/// A new run's name: the UTC date and time, so names sort by age, and a random
/// suffix, so that runs started in the same second into one folder do not clash
/// (`2026-12-02_034512-3f9a1c`).
pub fn default_run_name() -> String {
    let t = time::OffsetDateTime::now_utc();
    let suffix = rand::random::<u32>() >> 8;
    format!(
        "{:04}-{:02}-{:02}_{:02}{:02}{:02}-{suffix:06x}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// The platform's data directory for runs (e.g. `~/.local/share/ostinato/runs`).
pub fn default_runs_dir() -> PathBuf {
    crate::load::places::data_dir("runs")
}

impl RunConfig {
    pub fn run_dir(&self) -> PathBuf {
        self.runs_dir.join(&self.name)
    }

    /// Reads a TOML config; an unknown key is an error naming it.
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        toml::from_str(&text).map_err(|e| Error::BadFile { path: path.to_path_buf(), reason: e.to_string() })
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("RunConfig serialises to TOML")
    }

    /// Makes every path absolute (the audio and model folders canonical, so they must
    /// exist), so that run.toml means the same from any working directory.
    pub fn resolve_paths(&mut self) -> Result<()> {
        let absolute = |p: &Path| std::path::absolute(p).map_err(|e| Error::io(p, e));
        self.runs_dir = absolute(&self.runs_dir)?;
        if let Some(dir) = &self.cache_dir {
            self.cache_dir = Some(absolute(dir)?);
        }
        self.data.folder = readable_folder("audio folder", &self.data.folder)?;
        if let ModelSource::Folder { path } = &mut self.model {
            *path = readable_folder("model folder", path)?;
        }
        Ok(())
    }

    /// Trains with the optimizer called `name` (`optim::OPTIMIZERS`), with its
    /// reference defaults unless it is the one already set. Prodigy learns its step
    /// size, so it also sets what its authors recommend around it: lr 1 (a multiplier
    /// of the learnt size) and a constant schedule; set either after this to change it.
    pub fn choose_optimizer(&mut self, name: &str) -> std::result::Result<(), String> {
        let chosen = OptimizerConfig::named(name)?;
        if chosen.kind() == self.optimizer.kind() {
            return Ok(());
        }
        if let OptimizerConfig::Prodigy(_) = chosen {
            self.lr = 1.0;
            self.lr_schedule = LrSchedule::Constant;
        }
        self.optimizer = chosen;
        Ok(())
    }

    /// Errs naming the first folder the run reads that is not there (resume checks
    /// before it touches the run: put the folder back and resume again).
    pub fn check_input_folders(&self) -> Result<()> {
        self.clone().resolve_paths()
    }

    /// Every setting that makes no sense, before anything is loaded, each named as
    /// run.toml spells it. The one judge of settings: the CLI and the app call it.
    pub fn validate(&self) -> std::result::Result<(), SettingErrors> {
        let mut e = SettingErrors::default();
        let plain_name = !(self.name.is_empty() || self.name.contains(['/', '\\']) || self.name.starts_with('.'));
        e.check(plain_name, "name", || format!("`{}` must be a plain, non-empty folder name", self.name));
        if let ModelSource::Folder { path } = &self.model {
            e.check(!path.as_os_str().is_empty(), "model", || {
                "choose a model folder, or the built-in demo model".into()
            });
        }
        for (field, value) in [
            ("batch_size", self.batch_size),
            ("grad_accum", self.grad_accum),
            ("keep_checkpoints", self.keep_checkpoints),
        ] {
            e.check(value >= 1, field, || "must be at least 1".into());
        }
        for (field, value) in [
            ("epochs", Some(self.epochs)),
            ("max_steps", self.max_steps),
            ("save_every_steps", self.save_every_steps),
            ("save_every_epochs", self.save_every_epochs),
            ("preview_every_steps", self.preview_every_steps),
        ] {
            e.check(value != Some(0), field, || "must be at least 1".into());
        }
        for (field, value) in [("lr", self.lr), ("max_grad_norm", self.max_grad_norm)] {
            e.check(value.is_finite() && value > 0.0, field, || format!("{value} must be a positive number"));
        }
        e.check(self.seed <= MAX_SEED, "seed", || {
            format!("{} must be at most {MAX_SEED}, the largest whole number JSON readers hold exactly", self.seed)
        });
        if let Some(ratio) = self.cfg_dropout {
            e.check((0.0..=1.0).contains(&ratio), "cfg_dropout", || format!("{ratio} must be between 0 and 1"));
        }
        let seconds = self.preview_seconds();
        e.check(seconds > 0.0 && seconds <= MAX_SECONDS, "preview_seconds", || {
            format!("{seconds} must be more than 0 and at most {MAX_SECONDS}")
        });
        check_prompts(&self.preview_prompts, &self.prompt_defaults(""), &mut e);
        if let Err((field, why)) = self.lr_schedule.check() {
            e.check(false, &format!("lr_schedule.{field}"), || why);
        }
        self.optimizer.check(&mut e);
        self.check_validation(&mut e);
        crate::lora::check_config(&self.lora, &mut e);
        self.data.check(&mut e);
        e.into_result()
    }

    /// The latent cache the run reads and fills: its own folder, the platform's, or
    /// none when caching is off.
    pub fn latent_cache(&self) -> Result<Option<LatentCache>> {
        match (&self.latent_cache, &self.cache_dir) {
            (false, _) => Ok(None),
            (true, Some(dir)) => LatentCache::new(dir).map(Some),
            (true, None) => LatentCache::open_default().map(Some),
        }
    }

    pub fn preview_seconds(&self) -> f64 {
        self.preview_seconds.unwrap_or(DEFAULT_PREVIEW_SECONDS)
    }

    /// What the run's preview prompts fall back on, `caption` the run's preview caption
    /// (or its first song's).
    pub fn prompt_defaults<'a>(&'a self, caption: &'a str) -> PromptDefaults<'a> {
        PromptDefaults {
            caption: self.preview_caption.as_deref().unwrap_or(caption),
            seconds: self.preview_seconds(),
            seed: self.preview_seed(),
            trigger: self.data.trigger.as_ref(),
        }
    }

    /// The seed of every preview of this run: fixed, so that previews differ only by
    /// what training changed; derived from the run seed, never drawn from its streams.
    pub fn preview_seed(&self) -> u64 {
        self.seed ^ 0x5052_4556_4945_5753
    }

    /// Clips are held out one way only, validation needs a period, patience needs validation.
    fn check_validation(&self, e: &mut SettingErrors) {
        let by_name = !self.val_files.is_empty();
        e.check(!(by_name && self.val_fraction.is_some()), "val_fraction", || {
            "cannot be combined with val_files: hold clips out one way".into()
        });
        if let Some(f) = self.val_fraction {
            e.check(f > 0.0 && f < 1.0, "val_fraction", || format!("{f} must be between 0 and 1 (exclusive)"));
        }
        for (field, value) in [("val_every_steps", self.val_every_steps), ("patience", self.patience)] {
            e.check(value != Some(0), field, || "must be at least 1".into());
        }
        let held_out = by_name || self.val_fraction.is_some();
        e.check(held_out == self.val_every_steps.is_some(), "val_every_steps", || {
            "is needed exactly when clips are held out (val_files or val_fraction)".into()
        });
        e.check(self.patience.is_none() || held_out, "patience", || {
            "needs validation (val_files or val_fraction)".into()
        });
    }

    /// A stable hash of the settings that determine the training trajectory; resume
    /// refuses a checkpoint written under different ones. `stop_at_step` is excluded:
    /// it only says where to stop; so are the previews, which change nothing trained,
    /// and where the run is (its runs folder and name: a copied or renamed run resumes).
    pub fn trajectory_hash(&self) -> String {
        Self { name: String::new(), ..self.clone() }.named_trajectory_hash()
    }

    /// Whether a checkpoint of trajectory hash `hash` was trained with these settings.
    /// Older checkpoints hashed the run's name too: they match in the folder of that name.
    pub fn matches_trajectory(&self, hash: &str) -> bool {
        hash == self.trajectory_hash() || hash == self.named_trajectory_hash()
    }

    /// The trajectory hash with the run's name in it.
    fn named_trajectory_hash(&self) -> String {
        let mut c = self.clone();
        c.stop_at_step = None;
        (c.preview_every_steps, c.preview_seconds, c.preview_caption) = (None, None, None);
        (c.preview_prompts, c.preview_at_step_0) = (Vec::new(), None);
        c.runs_dir = PathBuf::new();
        blake3::hash(c.to_toml().as_bytes()).to_hex()[..16].to_string()
    }
}

/// `path` canonical, or an error naming it when it is not a folder that can be read.
fn readable_folder(what: &'static str, path: &Path) -> Result<PathBuf> {
    let error = |cause| Error::InputFolder { what, path: path.to_path_buf(), cause };
    let canonical = path.canonicalize().map_err(error)?;
    if !canonical.is_dir() {
        return Err(error(std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a folder")));
    }
    Ok(canonical)
}

#[cfg(test)]
mod tests;

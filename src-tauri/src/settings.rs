//! The window's settings: the template of the next run's `RunConfig`, in the names
//! the settings form uses, with the engine's types. Defaults and every range are the
//! engine's (`RunConfig::default`, `RunConfig::validate`). Saved as JSON in the
//! platform config dir (`settings.json`), written atomically (temp file + rename).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ostinato_engine::data::{TagMode, TriggerTag};
use ostinato_engine::device::Precision;
use ostinato_engine::load::source::ModelSource;
use ostinato_engine::train::config::default_run_name;
use ostinato_engine::train::RunConfig;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// The folder of songs last chosen (only ever read).
    pub dataset_dir: Option<PathBuf>,
    pub model: ModelSource,
    /// Recompute each block in backward instead of keeping its activations.
    pub gradient_checkpointing: bool,
    /// Encode each song to latents once and reuse them across epochs and runs.
    pub latent_cache: bool,
    pub precision: Precision,
    /// Let the engine choose gradient checkpointing, batch, precision and crop length
    /// for this machine's memory (its `fit auto`); the window's default.
    pub fit_memory: bool,
    pub rank: usize,
    pub alpha: f64,
    pub dropout: f64,
    pub learning_rate: f64,
    pub epochs: u64,
    pub batch_size: usize,
    pub grad_accumulation: usize,
    /// A checkpoint every this many optimizer steps; `None`: only the final adapter.
    pub save_every: Option<u64>,
    pub seed: u64,
    // `None` takes the engine's default (or leaves the feature off).
    /// Share of samples trained on the model's null condition (CFG dropout).
    pub cfg_dropout: Option<f64>,
    /// Share of the songs held out for validation.
    pub val_fraction: Option<f64>,
    /// Validation loss every this many steps (with songs held out).
    pub val_every_steps: Option<u64>,
    /// Finish after this many validations without a better loss.
    pub patience: Option<u64>,
    /// A preview song every this many steps (and one of the base model first).
    pub preview_every_steps: Option<u64>,
    /// Seconds of each preview.
    pub preview_seconds: Option<f64>,
    /// The previews' caption.
    pub preview_caption: Option<String>,
    /// A word or phrase joined to every caption, so the adapter answers to it.
    pub trigger_tag: Option<String>,
    /// Where the trigger goes in each caption.
    pub trigger_position: TagMode,
}

/// The run config's fields the form shows under another name: (run.toml, form).
const FORM_NAMES: [(&str, &str); 6] = [
    ("lora.r", "rank"),
    ("lora.alpha", "alpha"),
    ("lora.dropout", "dropout"),
    ("lr", "learning_rate"),
    ("grad_accum", "grad_accumulation"),
    ("save_every_steps", "save_every"),
];

/// The form's name of a run config field.
fn form_name(field: &str) -> &str {
    FORM_NAMES.iter().find(|(config, _)| *config == field).map_or(field, |&(_, form)| form)
}

impl Default for Settings {
    /// The engine's defaults; the window fits each run to the machine.
    fn default() -> Self {
        Settings::from_template(&RunConfig::default(), true)
    }
}

/// Field name (as the form names it) -> what is wrong with it.
pub type FieldErrors = BTreeMap<String, String>;

impl Settings {
    /// The window's settings for a run config: the fields the form shows, and whether
    /// runs are fitted to the machine (the app's own choice).
    pub fn from_template(c: &RunConfig, fit_memory: bool) -> Self {
        Settings {
            dataset_dir: Some(c.data.folder.clone()).filter(|f| !f.as_os_str().is_empty()),
            model: c.model.clone(),
            gradient_checkpointing: c.gradient_checkpointing,
            latent_cache: c.latent_cache,
            precision: c.precision,
            fit_memory,
            rank: c.lora.r,
            alpha: c.lora.alpha,
            dropout: c.lora.dropout,
            learning_rate: c.lr,
            epochs: c.epochs,
            batch_size: c.batch_size,
            grad_accumulation: c.grad_accum,
            save_every: c.save_every_steps,
            seed: c.seed,
            cfg_dropout: c.cfg_dropout,
            val_fraction: c.val_fraction,
            val_every_steps: c.val_every_steps,
            patience: c.patience,
            preview_every_steps: c.preview_every_steps,
            preview_seconds: c.preview_seconds,
            preview_caption: c.preview_caption.clone(),
            trigger_tag: c.data.trigger.as_ref().map(|t| t.tag.clone()),
            trigger_position: c.data.trigger.as_ref().map_or(TagMode::Prepend, |t| t.mode),
        }
    }

    /// The config of a new run under `runs_dir` with these settings, named by the
    /// engine; the engine's defaults for everything the form does not show.
    pub fn run_config(&self, runs_dir: PathBuf) -> RunConfig {
        let mut c = RunConfig {
            name: default_run_name(),
            runs_dir,
            model: self.model.clone(),
            gradient_checkpointing: self.gradient_checkpointing,
            latent_cache: self.latent_cache,
            precision: self.precision,
            lr: self.learning_rate,
            epochs: self.epochs,
            batch_size: self.batch_size,
            grad_accum: self.grad_accumulation,
            save_every_steps: self.save_every,
            seed: self.seed,
            cfg_dropout: self.cfg_dropout,
            val_fraction: self.val_fraction,
            val_every_steps: self.val_every_steps,
            patience: self.patience,
            preview_every_steps: self.preview_every_steps,
            preview_seconds: self.preview_seconds,
            preview_caption: self.preview_caption.clone(),
            ..RunConfig::default()
        };
        c.data.folder = self.dataset_dir.clone().unwrap_or_default();
        let tag = self.trigger_tag.as_deref().map(str::trim).filter(|t| !t.is_empty());
        c.data.trigger = tag.map(|tag| TriggerTag { tag: tag.to_string(), mode: self.trigger_position });
        (c.lora.r, c.lora.alpha, c.lora.dropout) = (self.rank, self.alpha, self.dropout);
        c
    }

    /// The engine's judgement of every field (`RunConfig::validate`), each problem
    /// named as the form names the field.
    pub fn validate(&self) -> Result<(), FieldErrors> {
        self.run_config(PathBuf::new()).validate().map_err(|errors| {
            errors.iter().map(|(field, reason)| (form_name(field).to_string(), reason.to_string())).collect()
        })
    }
}

/// Where settings live: the engine's config folder (`OSTINATO_CONFIG_DIR` overrides the
/// platform's; tests use it to stay out of the real one), where the CLI keeps the
/// model folders the user added too.
pub fn default_config_dir() -> PathBuf {
    ostinato_engine::load::places::config_dir()
}

pub fn settings_path(config_dir: &Path) -> PathBuf {
    config_dir.join("settings.json")
}

/// Loads settings; a missing file gives the defaults. A file that cannot be read or
/// parsed also gives the defaults, plus a notice for the user saying why.
pub fn load(config_dir: &Path) -> (Settings, Option<String>) {
    let path = settings_path(config_dir);
    match std::fs::read(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Settings::default(), None),
        Err(e) => (Settings::default(), Some(format!("could not read {}: {e}; using defaults", path.display()))),
        Ok(bytes) => match serde_json::from_slice::<Settings>(&bytes) {
            Ok(s) => match s.validate() {
                Ok(()) => (s, None),
                Err(errs) => (
                    Settings::default(),
                    Some(format!(
                        "settings in {} are invalid ({}); using defaults",
                        path.display(),
                        errs.values().cloned().collect::<Vec<_>>().join("; ")
                    )),
                ),
            },
            Err(e) => (Settings::default(), Some(format!("could not parse {}: {e}; using defaults", path.display()))),
        },
    }
}

/// Writes settings atomically: a crash mid-write never leaves a half file.
pub fn save(config_dir: &Path, settings: &Settings) -> std::io::Result<()> {
    std::fs::create_dir_all(config_dir)?;
    let path = settings_path(config_dir);
    let tmp = config_dir.join("settings.json.tmp");
    let json = serde_json::to_vec_pretty(settings).map_err(std::io::Error::other)?;
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&json)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_ace_step_lora_defaults_and_valid() {
        let s = Settings::default();
        assert_eq!((s.rank, s.alpha, s.dropout, s.learning_rate), (64, 128.0, 0.1, 3e-4));
        assert!(s.gradient_checkpointing && s.latent_cache);
        s.validate().unwrap();
    }

    #[test]
    fn validation_names_every_bad_field() {
        let s = Settings { rank: 0, dropout: 1.0, learning_rate: f64::NAN, batch_size: 0, ..Default::default() };
        let e = s.validate().unwrap_err();
        assert_eq!(
            e.keys().map(String::as_str).collect::<Vec<_>>(),
            ["batch_size", "dropout", "learning_rate", "rank"]
        );
        assert!(e["rank"].contains("the rank must be at least 1"), "{e:?}");
    }

    /// The window's defaults are the engine's, and its settings are a run config's:
    /// every field the form shows survives settings -> RunConfig -> settings.
    #[test]
    fn settings_are_a_run_config_template() {
        let runs = PathBuf::from("/runs");
        let engine = RunConfig { name: String::new(), runs_dir: runs.clone(), ..RunConfig::default() };
        let from_defaults = RunConfig { name: String::new(), ..Settings::default().run_config(runs.clone()) };
        assert_eq!(from_defaults, engine, "the app's defaults are the engine's");
        assert_eq!(Settings::default().save_every, Some(100));

        let s = Settings {
            dataset_dir: Some("/songs".into()),
            model: ModelSource::Folder { path: "/models/acestep".into() },
            gradient_checkpointing: false,
            latent_cache: false,
            precision: Precision::Bf16,
            fit_memory: false,
            rank: 8,
            alpha: 16.0,
            dropout: 0.05,
            learning_rate: 1e-4,
            epochs: 3,
            batch_size: 2,
            grad_accumulation: 4,
            save_every: None,
            seed: 7,
            cfg_dropout: Some(0.2),
            val_fraction: Some(0.25),
            val_every_steps: Some(5),
            patience: Some(2),
            preview_every_steps: Some(10),
            preview_seconds: Some(4.0),
            preview_caption: Some("a caption".into()),
            trigger_tag: Some("ostn".into()),
            trigger_position: TagMode::Append,
        };
        let c = s.run_config(runs.clone());
        assert_eq!((c.runs_dir.clone(), c.data.folder.clone(), c.lora.r, c.lr), (runs, "/songs".into(), 8, 1e-4));
        assert_eq!(c.data.trigger, Some(TriggerTag { tag: "ostn".into(), mode: TagMode::Append }));
        c.validate().unwrap();
        assert_eq!(Settings::from_template(&c, false), s);
    }

    /// A value the engine refuses gets the engine's reason, on the form's field.
    #[test]
    fn validation_is_the_engines() {
        let s = Settings { rank: 0, learning_rate: -2.0, save_every: Some(0), ..Default::default() };
        let engine: FieldErrors = s
            .run_config(PathBuf::new())
            .validate()
            .unwrap_err()
            .iter()
            .map(|(f, r)| (f.to_string(), r.to_string()))
            .collect();
        let app = s.validate().unwrap_err();
        assert_eq!(app.len(), 3, "{app:?}");
        for (config, form) in [("lora.r", "rank"), ("lr", "learning_rate"), ("save_every_steps", "save_every")] {
            assert_eq!(app[form], engine[config], "{form}");
        }
    }

    #[test]
    fn round_trips_and_survives_garbage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()), (Settings::default(), None));
        let s = Settings {
            gradient_checkpointing: false,
            model: ModelSource::Folder { path: "/models/acestep".into() },
            precision: Precision::Bf16,
            ..Default::default()
        };
        save(dir.path(), &s).unwrap();
        assert_eq!(load(dir.path()), (s, None));
        std::fs::write(settings_path(dir.path()), b"{not json").unwrap();
        let (loaded, notice) = load(dir.path());
        assert_eq!(loaded, Settings::default());
        assert!(notice.unwrap().contains("could not parse"));
    }

    #[test]
    fn missing_fields_take_defaults() {
        let s: Settings = serde_json::from_str(r#"{"rank": 8}"#).unwrap();
        assert_eq!(s.rank, 8);
        assert_eq!(s.alpha, 128.0);
    }
}

//! The window's settings: the next run's `RunConfig` itself, the engine's one definition
//! of every run setting (its fields, defaults and checks), plus what is the app's own
//! (fitting runs to the machine). The form names each field by its run.toml path
//! (`lora.r`, `lr`, `optimizer`), so a setting added to the engine reaches the window
//! by a form control, and its errors come back under that path. Saved as JSON in the
//! platform config dir (`settings.json`), written atomically (temp file + rename).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ostinato_engine::train::config::default_run_name;
use ostinato_engine::train::RunConfig;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// The next run's config; its name and runs folder are given at Start, and its
    /// `data.folder` is the dataset folder last chosen (only ever read).
    pub run: RunConfig,
    /// Let the engine choose gradient checkpointing, batch, precision and crop length
    /// for this machine's memory (its `fit auto`); the window's default.
    pub fit_memory: bool,
}

impl Default for Settings {
    /// The engine's defaults; the window fits each run to the machine.
    fn default() -> Self {
        Settings { run: RunConfig { name: String::new(), ..RunConfig::default() }, fit_memory: true }
    }
}

/// Field (its run.toml path) -> what is wrong with it.
pub type FieldErrors = BTreeMap<String, String>;

impl Settings {
    /// The folder of songs last chosen, if any.
    pub fn dataset_dir(&self) -> Option<&Path> {
        Some(self.run.data.folder.as_path()).filter(|f| !f.as_os_str().is_empty())
    }

    /// The config of a new run under `runs_dir` with these settings, named by the engine.
    pub fn run_config(&self, runs_dir: PathBuf) -> RunConfig {
        RunConfig { name: default_run_name(), runs_dir, ..self.run.clone() }
    }

    /// `self` changed to `new`, where a new choice of optimizer or adapter brings the
    /// settings the engine sets with it (`RunConfig::choose_optimizer`: Prodigy's lr 1
    /// and constant schedule; `LoraConfig::choose`: LoKr without dropout), as
    /// `--optimizer` and `--adapter` do.
    pub fn adopting(&self, mut new: Settings) -> Settings {
        let kind = new.run.optimizer.kind();
        if kind != self.run.optimizer.kind() {
            new.run.optimizer = self.run.optimizer;
            new.run.choose_optimizer(kind).expect("a kind the engine named");
        }
        let adapter = new.run.lora.kind;
        if adapter != self.run.lora.kind {
            new.run.lora.kind = self.run.lora.kind;
            new.run.lora.choose(adapter);
        }
        new
    }

    /// The engine's judgement of every field (`RunConfig::validate`), by run.toml path.
    pub fn validate(&self) -> Result<(), FieldErrors> {
        self.run_config(PathBuf::new())
            .validate()
            .map_err(|errors| errors.iter().map(|(field, reason)| (field.to_string(), reason.to_string())).collect())
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
        Ok(bytes) if is_older_format(&bytes) => (
            Settings::default(),
            Some(format!(
                "{} holds settings of an earlier version, which are not read; using defaults",
                path.display()
            )),
        ),
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

/// Settings written before they were a run config: a flat object without `run`.
fn is_older_format(bytes: &[u8]) -> bool {
    let value: Option<serde_json::Value> = serde_json::from_slice(bytes).ok();
    value.is_some_and(|v| v.as_object().is_some_and(|o| !o.is_empty() && !o.contains_key("run")))
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
    use ostinato_engine::load::source::ModelSource;
    use ostinato_engine::train::optim::OptimizerConfig;
    use ostinato_engine::train::schedule::LrSchedule;

    #[test]
    fn defaults_are_the_engines_and_valid() {
        let s = Settings::default();
        let engine = RunConfig::default();
        assert_eq!((s.run.lora.r, s.run.lora.alpha, s.run.lr), (engine.lora.r, engine.lora.alpha, engine.lr));
        assert_eq!(RunConfig { name: String::new(), runs_dir: "/runs".into(), ..s.run_config("/runs".into()) }, {
            RunConfig { name: String::new(), runs_dir: "/runs".into(), ..engine }
        });
        assert!(s.fit_memory);
        s.validate().unwrap();
    }

    #[test]
    fn validation_names_every_bad_field_by_its_run_toml_path() {
        let mut s = Settings::default();
        (s.run.lora.r, s.run.lora.dropout, s.run.lr, s.run.batch_size) = (0, 1.0, f64::NAN, 0);
        let e = s.validate().unwrap_err();
        assert_eq!(e.keys().map(String::as_str).collect::<Vec<_>>(), ["batch_size", "lora.dropout", "lora.r", "lr"]);
        assert!(e["lora.r"].contains("the rank must be at least 1"), "{e:?}");
    }

    /// Choosing Prodigy brings its lr and schedule, as the CLI's `--optimizer`; its own
    /// settings, once chosen, are kept as edited.
    #[test]
    fn a_new_optimizer_brings_the_engines_settings_with_it() {
        let old = Settings::default();
        let mut new = old.clone();
        new.run.optimizer = OptimizerConfig::named("prodigy").unwrap();
        let adopted = old.adopting(new);
        assert_eq!((adopted.run.lr, adopted.run.lr_schedule.clone()), (1.0, LrSchedule::Constant));
        let mut tuned = adopted.clone();
        tuned.run.optimizer = match tuned.run.optimizer {
            OptimizerConfig::Prodigy(c) => {
                OptimizerConfig::Prodigy(ostinato_engine::train::optim::ProdigyConfig { d_coef: 0.5, ..c })
            }
            other => other,
        };
        tuned.run.lr = 0.8;
        assert_eq!(adopted.adopting(tuned.clone()), tuned);

        // LoKr trains without dropout: choosing it sets 0, as --adapter does.
        let mut lokr = Settings::default();
        lokr.run.lora.kind = ostinato_engine::lora::AdapterKind::Lokr;
        let adopted = old.adopting(lokr);
        assert_eq!(adopted.run.lora.dropout, 0.0);
        adopted.validate().unwrap();
    }

    #[test]
    fn round_trips_and_survives_garbage_and_older_files() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()), (Settings::default(), None));
        let mut s = Settings::default();
        s.run.gradient_checkpointing = false;
        s.run.model = ModelSource::Folder { path: "/models/acestep".into() };
        s.run.optimizer = OptimizerConfig::named("adafactor").unwrap();
        save(dir.path(), &s).unwrap();
        assert_eq!(load(dir.path()), (s, None));
        std::fs::write(settings_path(dir.path()), b"{not json").unwrap();
        let (loaded, notice) = load(dir.path());
        assert_eq!(loaded, Settings::default());
        assert!(notice.unwrap().contains("could not parse"));
        std::fs::write(settings_path(dir.path()), br#"{"rank": 8, "learning_rate": 0.001}"#).unwrap();
        let (loaded, notice) = load(dir.path());
        assert_eq!(loaded, Settings::default());
        assert!(notice.unwrap().contains("earlier version"));
    }

    #[test]
    fn missing_fields_take_defaults() {
        let s: Settings = serde_json::from_str(r#"{"run": {"lora": {"r": 8}}}"#).unwrap();
        assert_eq!(s.run.lora.r, 8);
        assert_eq!(s.run.lora.alpha, 128.0);
        assert!(s.fit_memory);
    }
}

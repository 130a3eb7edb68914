//! The engine's typed errors. Each carries the file, key or shape at fault.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    // The cause is part of the message and deliberately not a `source`: a front end
    // printing the error chain would otherwise say it twice.
    #[error("{path}: {cause}")]
    Io { path: PathBuf, cause: std::io::Error },

    #[error("{path}: invalid JSON: {cause}")]
    Json { path: PathBuf, cause: serde_json::Error },

    #[error("missing required field `{0}`")]
    MissingConfigField(String),

    /// A config (the DiT's, the VAE's, the condition encoder's) that is not a model the
    /// engine can build; `what` names whose.
    #[error("{what} config: {reason}")]
    BadConfig { what: &'static str, reason: String },

    /// A training or generation setting out of its range, named as in run.toml.
    #[error("setting `{field}`: {reason}")]
    Setting { field: String, reason: String },

    /// A run config's settings out of their ranges (`RunConfig::validate`).
    #[error(transparent)]
    Settings(#[from] SettingErrors),

    /// A run predicted to need more memory than its device offers: the prediction,
    /// what takes the memory and what to change.
    #[error("{summary}: the run would not fit (it needs {needed_gb:.1} GB with headroom for the rest of the process); {why}")]
    WontFit { summary: String, needed_gb: f64, why: String },

    /// Weights that do not fit the model their config describes: every problem found,
    /// and the config the expected shapes come from.
    #[error("{}", weights_message(path, config.as_deref(), problems))]
    Weights { path: PathBuf, config: Option<PathBuf>, problems: Vec<String> },

    #[error("weights: missing tensor `{key}` (expected shape {expected:?})")]
    MissingTensor { key: String, expected: Vec<usize> },

    #[error("weights: tensor `{key}` has shape {found:?}, expected {expected:?}")]
    ShapeMismatch { key: String, expected: Vec<usize>, found: Vec<usize> },

    #[error("weights: unexpected tensor(s) not used by the model: {}", .0.join(", "))]
    UnexpectedTensors(Vec<String>),

    #[error("{path}: {reason}")]
    BadFile { path: PathBuf, reason: String },

    #[error("adapter {path}: {reason}")]
    Adapter { path: PathBuf, reason: String },

    #[error("training state: `{key}`: {reason}")]
    TrainingState { key: String, reason: String },

    #[error("optimizer: {params} parameters but {grads} gradients")]
    GradientCount { params: usize, grads: usize },

    #[error("optimizer: gradient {index} has shape {grad:?}, its parameter {param:?}")]
    GradientShape { index: usize, grad: Vec<usize>, param: Vec<usize> },

    #[error("{path}:{line}: {reason}")]
    EventLog { path: PathBuf, line: usize, reason: String },

    #[error("chart: {0}")]
    Chart(String),

    #[error("{path}: {reason}")]
    BadAudio { path: PathBuf, reason: String },

    /// ACE-Step's LM could not label the song at `path`.
    #[error("{path}: ACE-Step's LM: {reason}")]
    Understand { path: PathBuf, reason: String },

    #[error("dataset settings: {0}")]
    BadDataSpec(String),

    #[error("no usable audio in {folder}: {detail}")]
    NoUsableAudio { folder: PathBuf, detail: String },

    #[error("latent encoder: {0}")]
    Encoder(String),

    /// A thread of the engine panicked: a bug, reported instead of taking the app down.
    #[error("the {0} thread panicked")]
    Panicked(&'static str),

    /// Work stopped early because its `Cancel` token was set (a stop, not a failure).
    #[error("cancelled")]
    Cancelled,

    #[error("latent cache {path}: {reason}")]
    Cache { path: PathBuf, reason: String },

    #[error("{path}: `{key}`: {reason}")]
    ModelFile { path: PathBuf, key: String, reason: String },

    #[error("model folder {path}: {}", .problems.join("; "))]
    ModelFolder { path: PathBuf, problems: Vec<String> },

    /// A folder the run reads (its audio, its model) is not where the config says.
    #[error("{what} {path} cannot be read: {cause}")]
    InputFolder { what: &'static str, path: PathBuf, cause: std::io::Error },

    /// Another process holds the run directory's lock: one writer per run.
    #[error("{dir} is being trained by {}: one process at a time may train a run", holder(.pid))]
    RunBusy { dir: PathBuf, pid: Option<u32> },

    #[error("generate: {0}")]
    BadRequest(String),

    /// NaN or infinity where numbers were due: `what` names the tensor (and the step
    /// that made it, or the file it came from).
    #[error("{what}: {problem}")]
    NonFinite { what: String, problem: String },

    /// A model download, or the hub it comes from: `what` names the repository and the
    /// file (or the folder) at fault.
    #[error("{what}: {reason}")]
    Download { what: String, reason: String },

    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

fn holder(pid: &Option<u32>) -> String {
    pid.map_or_else(|| "another process".into(), |pid| format!("process {pid}"))
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn io(path: impl Into<PathBuf>, cause: std::io::Error) -> Self {
        Error::Io { path: path.into(), cause }
    }

    pub fn download(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Download { what: what.into(), reason: reason.into() }
    }

    pub fn setting(field: &str, reason: impl Into<String>) -> Self {
        Error::Setting { field: field.to_string(), reason: reason.into() }
    }
}

/// Every setting found out of its range, each named as run.toml spells it (`lora.r`,
/// `lr`), so that a front end can mark each one on its own field.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SettingErrors(Vec<(String, String)>);

impl SettingErrors {
    /// Notes `field` as out of range unless `ok`.
    pub fn check(&mut self, ok: bool, field: &str, reason: impl FnOnce() -> String) {
        if !ok {
            self.0.push((field.to_string(), reason()));
        }
    }

    /// (field, reason), in the order found.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(field, reason)| (field.as_str(), reason.as_str()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Ok when nothing was found.
    pub fn into_result(self) -> std::result::Result<(), SettingErrors> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(self)
        }
    }
}

impl std::fmt::Display for SettingErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (field, reason)) in self.iter().enumerate() {
            let sep = if i == 0 { "" } else { "; " };
            write!(f, "{sep}setting `{field}`: {reason}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SettingErrors {}

/// At most this many of a weights file's problems are spelled out.
const SHOWN_PROBLEMS: usize = 8;

fn weights_message(path: &Path, config: Option<&Path>, problems: &[String]) -> String {
    let against = config.map(|c| format!(" (shapes as {} gives them)", c.display())).unwrap_or_default();
    let mut shown = problems.iter().take(SHOWN_PROBLEMS).cloned().collect::<Vec<_>>().join("; ");
    if problems.len() > SHOWN_PROBLEMS {
        shown.push_str(&format!("; and {} more", problems.len() - SHOWN_PROBLEMS));
    }
    format!("{}: {shown}{against}", path.display())
}

/// Reads and parses a JSON file; errors name the file.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|cause| Error::Json { path: path.to_path_buf(), cause })
}

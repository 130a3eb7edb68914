//! The engine's typed errors. Each carries the file, key or shape at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    #[error("model config: missing required field `{0}`")]
    MissingConfigField(String),

    #[error("model config: {0}")]
    BadConfig(String),

    #[error("weights: missing tensor `{key}` (expected shape {expected:?})")]
    MissingTensor { key: String, expected: Vec<usize> },

    #[error("weights: tensor `{key}` has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        key: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },

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

    #[error("{path}:{line}: {reason}")]
    EventLog {
        path: PathBuf,
        line: usize,
        reason: String,
    },

    #[error("chart: {0}")]
    Chart(String),

    #[error("{path}: {reason}")]
    BadAudio { path: PathBuf, reason: String },

    #[error("dataset settings: {0}")]
    BadDataSpec(String),

    #[error("no usable audio in {folder}: {detail}")]
    NoUsableAudio { folder: PathBuf, detail: String },

    #[error("latent encoder: {0}")]
    Encoder(String),

    #[error("latent cache {path}: {reason}")]
    Cache { path: PathBuf, reason: String },

    #[error("{path}: `{key}`: {reason}")]
    ModelFile { path: PathBuf, key: String, reason: String },

    #[error("model folder {path}: {}", .problems.join("; "))]
    ModelFolder { path: PathBuf, problems: Vec<String> },

    #[error("generate: {0}")]
    BadRequest(String),

    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// Reads and parses a JSON file; errors name the file.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })
}

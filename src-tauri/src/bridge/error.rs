//! What the bridge's calls fail with, and the engine's errors as one of them: at the
//! bottom, so every file of the bridge (and models.rs) can return it.

use crate::settings::FieldErrors;

#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("invalid settings")]
    InvalidSettings(FieldErrors),
    #[error("{0}")]
    Invalid(String),
    #[error("a run is already in progress; stop it first")]
    RunActive,
    #[error("no run is in progress")]
    NoActiveRun,
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("{0}")]
    Engine(String),
}

impl BridgeError {
    /// A stable machine-readable kind for the UI and tests.
    pub fn kind(&self) -> &'static str {
        match self {
            BridgeError::InvalidSettings(_) => "invalid_settings",
            BridgeError::Invalid(_) => "invalid",
            BridgeError::RunActive => "run_active",
            BridgeError::NoActiveRun => "no_active_run",
            BridgeError::Io { .. } => "io",
            BridgeError::Engine(_) => "engine",
        }
    }
}

pub(crate) fn engine_err(e: impl std::fmt::Display) -> BridgeError {
    BridgeError::Engine(e.to_string())
}

/// An engine error naming a setting (`Error::Setting`) as that field's error, which the
/// window shows beside the field; any other as the engine's.
pub(crate) fn setting_err(e: ostinato_engine::Error) -> BridgeError {
    match e {
        ostinato_engine::Error::Setting { field, reason } => BridgeError::InvalidSettings([(field, reason)].into()),
        e => engine_err(e),
    }
}

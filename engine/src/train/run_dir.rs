//! A run's directory at its start: made (or found empty), given its `run.toml`, and
//! removed again when a new run ends having trained nothing, so that no failed run
//! blocks its name.

use std::path::Path;

use super::config::RunConfig;
use crate::{Error, Result};

/// Whose directory a run trains in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Origin {
    /// A new run; whether its start created the directory.
    New {
        created_dir: bool,
    },
    Resumed,
}

impl Origin {
    /// Removes a new run that trained nothing; a resumed run's directory is never touched.
    pub fn discard(self, run_dir: &Path) {
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
pub(super) fn create_run_dir(run_dir: &Path) -> Result<bool> {
    if let Some(parent) = run_dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    match std::fs::create_dir(run_dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(Error::io(run_dir, e)),
    }
}

pub(super) fn write_config(run_dir: &Path, config: &RunConfig) -> Result<()> {
    let path = run_dir.join("run.toml");
    std::fs::write(&path, config.to_toml()).map_err(|e| Error::io(&path, e))
}

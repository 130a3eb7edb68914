//! Where models are looked for: the hub cache, ACE-Step's own `checkpoints/` folders,
//! the folder downloads are put together in, and the folders the user added (kept in
//! `models.json` in the platform config folder, beside the app's settings).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::layout::{hf_cache_dir, models_in};
use super::lm::lms_in;
use crate::{Error, Result};

/// Every place `find_models` looks, in order.
#[derive(Debug, Clone, Default)]
pub struct ModelPlaces {
    /// Folders of models this app put together from several hub repositories.
    pub downloads: PathBuf,
    pub hub_cache: Option<PathBuf>,
    /// ACE-Step checkpoints folders (`<ACE-Step>/checkpoints`).
    pub checkpoints: Vec<PathBuf>,
    /// Folders the user added.
    pub added: Vec<PathBuf>,
}

impl ModelPlaces {
    /// The platform's places and the added folders of `models.json` (see `system`).
    pub fn from_env() -> Result<Self> {
        Ok(Self { added: AddedFolders::load(&config_dir())?.folders, ..Self::system() })
    }

    /// The platform's places, without added folders: the hub cache (`HF_HUB_CACHE`,
    /// `HF_HOME`), ACE-Step's `ACESTEP_CHECKPOINTS_DIR`, `./checkpoints` and
    /// `~/ACE-Step-1.5/checkpoints`, and the downloads folder.
    pub fn system() -> Self {
        let mut checkpoints: Vec<PathBuf> =
            std::env::var_os("ACESTEP_CHECKPOINTS_DIR").map(PathBuf::from).into_iter().collect();
        if let Ok(cwd) = std::env::current_dir() {
            checkpoints.push(cwd.join("checkpoints"));
        }
        if let Some(d) = directories::BaseDirs::new() {
            checkpoints.push(d.home_dir().join("ACE-Step-1.5").join("checkpoints"));
        }
        Self { downloads: default_downloads_dir(), hub_cache: hf_cache_dir(), checkpoints, added: Vec::new() }
    }
}

/// Where settings live: `OSTINATO_CONFIG_DIR`, else the platform config folder
/// (e.g. `~/.config/ostinato`). The app's settings.json is kept here too.
pub fn config_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("OSTINATO_CONFIG_DIR") {
        return PathBuf::from(dir);
    }
    directories::ProjectDirs::from("app", "Ostinato", "Ostinato")
        .map(|d| d.config_dir().to_path_buf())
        .unwrap_or_else(|| std::env::temp_dir().join("ostinato-config"))
}

/// `name` in the platform data folder (e.g. `~/.local/share/ostinato/<name>`), where
/// runs, downloaded models and labels live side by side; `name` alone without one.
pub fn data_dir(name: &str) -> PathBuf {
    directories::ProjectDirs::from("app", "Ostinato", "ostinato")
        .map(|d| d.data_dir().join(name))
        .unwrap_or_else(|| PathBuf::from(name))
}

/// `<platform data folder>/models`, beside the runs.
pub fn default_downloads_dir() -> PathBuf {
    data_dir("models")
}

/// The model folders the user added, as kept in `<config>/models.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct AddedFolders {
    pub folders: Vec<PathBuf>,
}

impl AddedFolders {
    pub fn path(config_dir: &Path) -> PathBuf {
        config_dir.join("models.json")
    }

    /// None added when the file does not exist; an unreadable file is an error naming it.
    pub fn load(config_dir: &Path) -> Result<Self> {
        let path = Self::path(config_dir);
        match std::fs::read(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(Error::io(&path, e)),
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|cause| Error::Json { path, cause }),
        }
    }

    /// Adds `dir` (made absolute) once it holds at least one ACE-Step model or 5 Hz LM;
    /// returns it.
    pub fn add(config_dir: &Path, dir: &Path) -> Result<PathBuf> {
        let abs = std::fs::canonicalize(dir).map_err(|e| Error::io(dir, e))?;
        if models_in(&abs).is_empty() && lms_in(&abs).is_empty() {
            return Err(Error::ModelFolder {
                path: dir.to_path_buf(),
                problems: vec!["no ACE-Step model here (expected acestep-v15-*/config.json or an acestep-5Hz-lm-* folder, or a folder or hub cache that holds one)".into()],
            });
        }
        let mut added = Self::load(config_dir)?;
        if !added.folders.contains(&abs) {
            added.folders.push(abs.clone());
            added.save(config_dir)?;
        }
        Ok(abs)
    }

    /// Removes `dir` (as given or made absolute); whether it was there.
    pub fn remove(config_dir: &Path, dir: &Path) -> Result<bool> {
        let mut added = Self::load(config_dir)?;
        let abs = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let before = added.folders.len();
        added.folders.retain(|f| f != dir && f != &abs);
        let removed = added.folders.len() < before;
        if removed {
            added.save(config_dir)?;
        }
        Ok(removed)
    }

    /// Temp file + rename: a crash never leaves half a list.
    fn save(&self, config_dir: &Path) -> Result<()> {
        std::fs::create_dir_all(config_dir).map_err(|e| Error::io(config_dir, e))?;
        let path = Self::path(config_dir);
        let tmp = config_dir.join(".models.json.tmp");
        let json = serde_json::to_vec_pretty(self).expect("a list of paths serialises");
        std::fs::write(&tmp, json).map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))
    }
}

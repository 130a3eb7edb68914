//! Finds ACE-Step 1.5 models on disk and says, for each, its variant, its size and
//! whether it is complete: every file a run opens is there and every tensor's header
//! fits its config (`ModelFolder::check_weights`, which reads no weights).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::folder::{models_in, subfolders, ModelFolder, TEXT_DIR, VAE_DIR};
use super::places::ModelPlaces;
use crate::Error;

/// Where a model was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Put together by `ostinato models download` from several hub repositories.
    Downloaded,
    HubCache,
    /// An ACE-Step `checkpoints/` folder.
    Checkpoints,
    /// A folder the user added.
    Added,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FoundModel {
    /// The DiT folder: what `--model` and the app's model choice take.
    pub path: PathBuf,
    /// turbo, base or sft (config.json's `model_version`), else what the folder says.
    pub variant: String,
    pub origin: Origin,
    /// Bytes of the DiT, VAE and text encoder folders (links followed).
    pub bytes: u64,
    pub complete: bool,
    /// Why it is not complete: every missing or malformed file, by name.
    pub problems: Vec<String>,
}

/// Every model in `places`, each once (the first place that has it names it).
pub fn find_models(places: &ModelPlaces) -> Vec<FoundModel> {
    let mut candidates: Vec<(Origin, PathBuf)> = Vec::new();
    let mut add = |origin: Origin, dir: &Path| candidates.extend(models_in(dir).into_iter().map(|d| (origin, d)));
    for sub in subfolders(&places.downloads) {
        add(Origin::Downloaded, &sub);
    }
    if let Some(cache) = &places.hub_cache {
        add(Origin::HubCache, cache);
    }
    for dir in &places.checkpoints {
        add(Origin::Checkpoints, dir);
    }
    for dir in &places.added {
        add(Origin::Added, dir);
    }
    let mut seen = HashSet::new();
    candidates
        .into_iter()
        .filter(|(_, dit)| seen.insert(std::fs::canonicalize(dit).unwrap_or_else(|_| dit.clone())))
        .map(|(origin, dit)| examine(origin, dit))
        .collect()
}

fn examine(origin: Origin, dit: PathBuf) -> FoundModel {
    let root = dit.parent().map(Path::to_path_buf).unwrap_or_default();
    let problems = match check(&dit) {
        Ok(()) => Vec::new(),
        Err(Error::ModelFolder { problems, .. }) => problems,
        Err(e) => vec![e.to_string()],
    };
    FoundModel {
        variant: variant_label(&dit),
        origin,
        bytes: [dit.clone(), root.join(VAE_DIR), root.join(TEXT_DIR)].iter().map(|d| bytes_under(d)).sum(),
        complete: problems.is_empty(),
        problems,
        path: dit,
    }
}

/// Opens the model (every file, every config) and checks every tensor's header.
/// Opened by root and name, so a DiT folder missing its silence latent says so.
fn check(dit: &Path) -> crate::Result<()> {
    let name = dit.file_name().and_then(|n| n.to_str());
    ModelFolder::open(dit.parent().unwrap_or(dit), name)?.check_weights().map(|_| ())
}

/// turbo / base / sft from config.json's `model_version`, else `is_turbo`, else the
/// folder's name.
fn variant_label(dit: &Path) -> String {
    let config: Option<Value> =
        std::fs::read(dit.join("config.json")).ok().and_then(|b| serde_json::from_slice(&b).ok());
    let field = |k: &str| config.as_ref().and_then(|c| c.get(k).cloned());
    if let Some(Value::String(v)) = field("model_version") {
        return v;
    }
    if let Some(Value::Bool(turbo)) = field("is_turbo") {
        return if turbo { "turbo" } else { "base" }.into();
    }
    let name = dit.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    ["turbo", "sft", "base"].into_iter().find(|v| name.contains(v)).unwrap_or("unknown").into()
}

/// Bytes of every file under `dir`, following links.
fn bytes_under(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let p = e.path();
            match std::fs::metadata(&p) {
                Ok(m) if m.is_dir() => bytes_under(&p),
                Ok(m) => m.len(),
                Err(_) => 0,
            }
        })
        .sum()
}

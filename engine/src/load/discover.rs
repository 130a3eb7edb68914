//! Finds ACE-Step 1.5 models on disk and says, for each, what it is (2B or XL, turbo,
//! base or SFT), its bytes and whether it is complete: every file a run opens is there
//! and every tensor's header fits its config (`ModelFolder::check_weights`, which reads
//! no weights). The 5 Hz LMs (for labelling) are found in the same places.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::catalog::LmVariant;
use super::folder::ModelFolder;
use super::kind::{Flavor, ModelKind, ModelSize};
use super::layout::{models_in, subfolders, TEXT_DIR, VAE_DIR};
use super::lm::{lm_variant_of, lms_in, LmFolder};
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
    /// turbo, base or sft, as config.json says (else the folder's name).
    pub variant: Flavor,
    /// 2B or XL, from the DiT's shape in config.json.
    pub size: ModelSize,
    /// Both in words, as front ends show them: "XL turbo", "2B SFT".
    pub label: String,
    pub origin: Origin,
    /// Bytes of the DiT, VAE and text encoder folders (links followed).
    pub bytes: u64,
    pub complete: bool,
    /// Why it is not complete: every missing or malformed file, by name.
    pub problems: Vec<String>,
}

impl FoundModel {
    pub fn kind(&self) -> ModelKind {
        ModelKind { size: self.size, flavor: self.variant }
    }
}

/// Every model in `places`, each once (the first place that has it names it).
pub fn find_models(places: &ModelPlaces) -> Vec<FoundModel> {
    found_in(places, models_in).into_iter().map(|(origin, dit)| examine(origin, dit)).collect()
}

/// A 5 Hz LM found on disk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FoundLm {
    /// The catalog's name ("lm-1.7b"), else the folder's.
    pub name: String,
    /// The LM folder: what labelling takes.
    pub path: PathBuf,
    pub origin: Origin,
    /// Bytes of the folder (links followed).
    pub bytes: u64,
    pub complete: bool,
    /// Why it is not complete: every missing or malformed file, by name.
    pub problems: Vec<String>,
}

/// Every 5 Hz LM in `places`, each once, as `find_models` finds models.
pub fn find_lms(places: &ModelPlaces) -> Vec<FoundLm> {
    found_in(places, lms_in)
        .into_iter()
        .map(|(origin, path)| {
            let problems = match LmFolder::open(&path) {
                Ok(_) => Vec::new(),
                Err(Error::ModelFolder { problems, .. }) => problems,
                Err(e) => vec![e.to_string()],
            };
            let name = lm_variant_of(&path).map(|v| v.name().to_string());
            FoundLm {
                name: name.unwrap_or_else(|| path.file_name().unwrap_or_default().to_string_lossy().into_owned()),
                origin,
                bytes: bytes_under(&path),
                complete: problems.is_empty(),
                problems,
                path,
            }
        })
        .collect()
}

/// The LM labelling uses when none is named: the default variant (upstream's
/// 1.7B) where it is complete, else the first complete one.
pub fn preferred_lm(found: &[FoundLm]) -> Option<&FoundLm> {
    let complete = || found.iter().filter(|lm| lm.complete);
    complete().find(|lm| lm.name == LmVariant::DEFAULT.name()).or_else(|| complete().next())
}

/// What `find_in` finds in each place, in order, each folder once.
fn found_in(places: &ModelPlaces, find_in: fn(&Path) -> Vec<PathBuf>) -> Vec<(Origin, PathBuf)> {
    let mut candidates: Vec<(Origin, PathBuf)> = Vec::new();
    let mut add = |origin: Origin, dir: &Path| candidates.extend(find_in(dir).into_iter().map(|d| (origin, d)));
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
    candidates.retain(|(_, dir)| seen.insert(std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone())));
    candidates
}

fn examine(origin: Origin, dit: PathBuf) -> FoundModel {
    let root = dit.parent().map(Path::to_path_buf).unwrap_or_default();
    let problems = match check(&dit) {
        Ok(()) => Vec::new(),
        Err(Error::ModelFolder { problems, .. }) => problems,
        Err(e) => vec![e.to_string()],
    };
    let kind = ModelKind::of_dit_folder(&dit);
    FoundModel {
        variant: kind.flavor,
        size: kind.size,
        label: kind.label(),
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

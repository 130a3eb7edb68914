//! Where ACE-Step 1.5's model folders sit on disk: a model root holds `vae/`,
//! `Qwen3-Embedding-0.6B/` and its `acestep-v15-*` DiT folders; the Hugging Face cache
//! holds roots as `models--<org>--<name>/snapshots/<rev>/`. Finding them, not reading
//! them (`folder` reads and checks one).

use std::path::{Path, PathBuf};

pub const VAE_DIR: &str = "vae";
pub const TEXT_DIR: &str = "Qwen3-Embedding-0.6B";
pub const DIT_PREFIX: &str = "acestep-v15-";

/// `<cache>/models--<org>--<name>/snapshots/<rev>`: the revision `refs/main` names,
/// else the most recently modified snapshot.
pub fn hf_snapshot(repo_dir: &Path) -> Option<PathBuf> {
    let snapshots = repo_dir.join("snapshots");
    if let Ok(rev) = std::fs::read_to_string(repo_dir.join("refs").join("main")) {
        let p = snapshots.join(rev.trim());
        if p.is_dir() {
            return Some(p);
        }
    }
    std::fs::read_dir(&snapshots)
        .ok()?
        .flatten()
        .filter(|e| e.path().is_dir())
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
}

/// The Hugging Face hub cache: `$HF_HUB_CACHE`, `$HF_HOME/hub`, `~/.cache/huggingface/hub`.
pub fn hf_cache_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return Some(p.into());
    }
    if let Some(p) = std::env::var_os("HF_HOME") {
        return Some(PathBuf::from(p).join("hub"));
    }
    directories::BaseDirs::new().map(|d| d.home_dir().join(".cache").join("huggingface").join("hub"))
}

pub(super) fn is_root(p: &Path) -> bool {
    p.join(VAE_DIR).is_dir() || p.join(TEXT_DIR).is_dir() || dit_dirs(p).next().is_some()
}

pub(super) fn dit_dirs(root: &Path) -> impl Iterator<Item = PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(DIT_PREFIX)))
        .collect();
    dirs.sort();
    dirs.into_iter()
}

/// The model root for `path`: the root itself, its DiT folder's parent, a hub repo
/// folder (`models--*`) or a hub cache holding an ACE-Step repo.
pub fn resolve_root(path: &Path) -> Option<(PathBuf, Option<PathBuf>)> {
    if path.join("config.json").is_file() && path.join("silence_latent.pt").exists() {
        return Some((path.parent()?.to_path_buf(), Some(path.to_path_buf())));
    }
    if is_root(path) {
        return Some((path.to_path_buf(), None));
    }
    if path.join("snapshots").is_dir() {
        return hf_snapshot(path).map(|p| (p, None));
    }
    // A hub cache: the first `models--*` repo whose snapshot looks like a root.
    let mut repos: Vec<PathBuf> = std::fs::read_dir(path)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("models--")))
        .collect();
    repos.sort();
    repos.iter().filter_map(|r| hf_snapshot(r)).find(|s| is_root(s) && dit_dirs(s).next().is_some()).map(|p| (p, None))
}

/// The DiT folders in `dir`: itself, a model root's `acestep-v15-*` folders, a hub
/// repository's snapshot, or every ACE-Step snapshot of a hub cache.
pub fn models_in(dir: &Path) -> Vec<PathBuf> {
    if is_dit_dir(dir) {
        return vec![dir.to_path_buf()];
    }
    if is_root(dir) {
        return dit_dirs(dir).collect();
    }
    if dir.join("snapshots").is_dir() {
        return hf_snapshot(dir).map(|s| models_in(&s)).unwrap_or_default();
    }
    subfolders(dir)
        .into_iter()
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("models--")))
        .flat_map(|repo| models_in(&repo))
        .collect()
}

/// A DiT folder: a config.json with ACE-Step's silence latent beside it.
fn is_dit_dir(dir: &Path) -> bool {
    dir.join("config.json").is_file() && dir.join("silence_latent.pt").exists()
}

pub(super) fn subfolders(dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
        .collect();
    dirs.sort();
    dirs
}

/// Why `path` is no model folder, pointing at what a user most likely meant.
pub(super) fn not_a_model_reason(path: &Path) -> String {
    let expected = "expected acestep-v15-*/config.json, vae/ and Qwen3-Embedding-0.6B/";
    if !path.exists() {
        return "does not exist".into();
    }
    if path.is_file() {
        return format!("is a file, not a model folder ({expected})");
    }
    match path.file_name().and_then(|n| n.to_str()) {
        Some(part @ (VAE_DIR | TEXT_DIR)) => {
            format!("is the model's {part}/ part: give the folder that holds it ({expected})")
        }
        _ => format!("no ACE-Step model here ({expected})"),
    }
}

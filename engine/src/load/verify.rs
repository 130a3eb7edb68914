//! `ostinato models verify`: a model folder opens, every tensor's header fits its
//! config, and every file that lives in a hub cache still matches the checksum its
//! blob is named by (sha256 for LFS files, git's sha1 for small ones). A 5 Hz LM
//! folder is checked the same way (`verify_lm`).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::folder::ModelFolder;
use super::hub::BlobId;
use super::layout::{TEXT_DIR, VAE_DIR};
use super::lm::LmFolder;
use crate::{Error, Result};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verified {
    /// The model root (or the LM folder).
    pub model: PathBuf,
    /// Tensor headers checked against the configs (an LM's: read).
    pub tensors: usize,
    /// Files re-hashed against their hub checksum.
    pub hashed: usize,
    /// Files outside a hub cache, which have no checksum to compare with.
    pub unhashed: usize,
}

/// Checks the model at `dir` (any path `ModelFolder::open` takes); every problem is
/// named in the error. `on_file` hears of each file before it is hashed.
pub fn verify_model(dir: &Path, on_file: &mut dyn FnMut(&Path)) -> Result<Verified> {
    let folder = ModelFolder::open(dir, None)?;
    let tensors = folder.check_weights()?;
    let mut files = Vec::new();
    for part in [folder.dit_dir.clone(), folder.root.join(VAE_DIR), folder.root.join(TEXT_DIR)] {
        files_under(&part, &mut files);
    }
    check_hashes(folder.root, tensors, files, on_file)
}

/// Checks the 5 Hz LM folder at `dir` (`LmFolder::open`: its files, config and weight
/// headers) and its hub checksums, as `verify_model` does a model.
pub fn verify_lm(dir: &Path, on_file: &mut dyn FnMut(&Path)) -> Result<Verified> {
    let lm = LmFolder::open(dir)?;
    let mut files = Vec::new();
    files_under(&lm.dir, &mut files);
    check_hashes(lm.dir, lm.tensors, files, on_file)
}

/// Re-hashes each of `files` that lives in a hub cache; every mismatch is named.
fn check_hashes(
    model: PathBuf,
    tensors: usize,
    files: Vec<PathBuf>,
    on_file: &mut dyn FnMut(&Path),
) -> Result<Verified> {
    let (mut hashed, mut unhashed, mut problems) = (0, 0, Vec::new());
    for file in files {
        match hub_blob(&file) {
            Some(id) => {
                on_file(&file);
                hashed += 1;
                if let Err(why) = id.check_file(&file)? {
                    problems.push(format!("{}: {why}", file.display()));
                }
            }
            None => unhashed += 1,
        }
    }
    if !problems.is_empty() {
        return Err(Error::ModelFolder { path: model, problems });
    }
    Ok(Verified { model, tensors, hashed, unhashed })
}

/// The checksum of a file that resolves to a hub cache blob (`.../blobs/<id>`).
fn hub_blob(file: &Path) -> Option<BlobId> {
    let real = std::fs::canonicalize(file).ok()?;
    let in_blobs = real.parent()?.file_name()? == "blobs";
    in_blobs.then(|| BlobId::from_name(real.file_name()?.to_str()?)).flatten()
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files_under(&p, out);
        } else {
            out.push(p);
        }
    }
}

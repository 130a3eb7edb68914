//! Files written whole or not at all: through a temporary sibling that is fsynced and
//! renamed (or linked, when nothing may be replaced) into place.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// Checks that `path` can be written (an existing folder that takes a new file, and
/// not itself a folder) before any work is done.
pub fn check_writable(path: &Path) -> Result<()> {
    let parent = parent_of(path);
    if path.is_dir() {
        return Err(Error::io(path, std::io::Error::other("is a folder, not a file")));
    }
    if !parent.is_dir() {
        return Err(Error::io(path, std::io::Error::other(format!("folder {} does not exist", parent.display()))));
    }
    // A read-only folder fails here, not after minutes of sampling.
    let probe = temp_sibling(path);
    std::fs::File::create(&probe).map_err(|e| Error::io(path, e))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The hidden temporary file beside `path` that is renamed over it.
fn temp_sibling(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    parent_of(path).join(format!(".{name}.{}.tmp", std::process::id()))
}

/// Writes `bytes` to `path` through a temporary sibling that is fsynced and renamed
/// into place: a crash or a full disk leaves the old file or none, never half of one.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    check_writable(path)?;
    let parent = parent_of(path);
    let tmp = temp_sibling(path);
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    if let Err(e) = written.and_then(|_| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(path, e));
    }
    // The rename itself is durable once the folder is synced.
    std::fs::File::open(&parent).and_then(|d| d.sync_all()).map_err(|e| Error::io(&parent, e))
}

/// Writes `bytes` to `path` as [`write_atomically`] does, but only where no file is:
/// an existing one is left as it is and the error's kind is `AlreadyExists`. The
/// temporary file is hard-linked into place, which fails rather than replace.
pub fn write_new_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temp_sibling(path);
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    let linked = written.and_then(|_| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    linked?;
    std::fs::File::open(parent_of(path)).and_then(|d| d.sync_all())
}

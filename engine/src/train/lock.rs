//! One writer per run directory: an OS advisory lock on the live marker (`run.pid`),
//! held for the run's life by whoever trains it (CLI, app, `resume`). The marker holds
//! the holder's process id, for the error a second writer gets. The OS drops the lock
//! when its process ends, so a killed run never blocks the next one.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{Error, Result};

/// Present and locked while a process trains the run: holds its id.
pub const LIVE_MARKER: &str = "run.pid";

/// Attempts before a held lock is reported: a lister's brief shared lock (see
/// [`is_locked`]) must not look like a second writer.
const ATTEMPTS: u32 = 3;
const RETRY_AFTER: Duration = Duration::from_millis(20);

/// The run directory's lock; dropping it removes the marker and unlocks.
#[derive(Debug)]
pub struct RunLock {
    file: File,
    path: PathBuf,
}

impl RunLock {
    /// Takes the lock of `run_dir` (which must exist), or names the process holding it.
    pub fn acquire(run_dir: &Path) -> Result<Self> {
        let path = run_dir.join(LIVE_MARKER);
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| Error::io(&path, e))?;
            if !try_lock(&file).map_err(|e| Error::io(&path, e))? {
                return Err(Error::RunBusy { dir: run_dir.to_path_buf(), pid: holder_pid(&path) });
            }
            // The previous holder removes the marker as it lets go: if it did so after we
            // opened it, our lock is on a file nobody else finds. Take the one at the path.
            if is_at(&file, &path) {
                let mut lock = Self { file, path };
                lock.write_pid()?;
                return Ok(lock);
            }
        }
    }

    fn write_pid(&mut self) -> Result<()> {
        let io = |e| Error::io(&self.path, e);
        self.file.set_len(0).map_err(io)?;
        self.file.write_all(std::process::id().to_string().as_bytes()).map_err(io)?;
        self.file.flush().map_err(io)
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Removed before the file closes (which unlocks): whoever opens the path next
        // finds a new marker or none, never a stale one still locked.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The exclusive lock, retried briefly; false when another holder keeps it.
fn try_lock(file: &File) -> std::io::Result<bool> {
    let mut attempt = 1;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(true),
            Err(TryLockError::WouldBlock) if attempt == ATTEMPTS => return Ok(false),
            Err(TryLockError::WouldBlock) => attempt += 1,
            Err(TryLockError::Error(e)) => return Err(e),
        }
        std::thread::sleep(RETRY_AFTER);
    }
}

/// Whether `file` is still the file at `path` (not removed or replaced).
fn is_at(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

fn holder_pid(marker: &Path) -> Option<u32> {
    std::fs::read_to_string(marker).ok()?.trim().parse().ok()
}

/// Whether a process (this one included) holds the lock of `run_dir` now.
pub fn is_locked(run_dir: &Path) -> bool {
    let Ok(file) = File::open(run_dir.join(LIVE_MARKER)) else {
        return false;
    };
    // A shared lock is refused only while a writer holds the exclusive one; it is
    // released when `file` closes.
    matches!(file.try_lock_shared(), Err(TryLockError::WouldBlock))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_named_by_pid_and_gone_with_its_lock() {
        let tmp = tempfile::tempdir().unwrap();
        let marker = tmp.path().join(LIVE_MARKER);
        let lock = RunLock::acquire(tmp.path()).unwrap();
        assert!(is_locked(tmp.path()));
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), std::process::id().to_string());
        // A second writer, even in this process (another open file), is refused.
        let err = RunLock::acquire(tmp.path()).unwrap_err();
        assert!(matches!(err, Error::RunBusy { pid: Some(p), .. } if p == std::process::id()), "{err}");
        assert!(err.to_string().contains(&format!("process {}", std::process::id())), "{err}");
        drop(lock);
        assert!(!marker.exists() && !is_locked(tmp.path()));
        RunLock::acquire(tmp.path()).unwrap();
    }

    #[test]
    fn a_marker_left_by_a_killed_process_does_not_block() {
        let tmp = tempfile::tempdir().unwrap();
        // What a SIGKILL leaves: the marker with a pid, and no lock (the OS dropped it).
        std::fs::write(tmp.path().join(LIVE_MARKER), "999999999").unwrap();
        assert!(!is_locked(tmp.path()));
        let _lock = RunLock::acquire(tmp.path()).unwrap();
        assert_eq!(std::fs::read_to_string(tmp.path().join(LIVE_MARKER)).unwrap(), std::process::id().to_string());
    }
}

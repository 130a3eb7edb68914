//! Find the audio files in a folder: recursive, following symlinks once (a loop is
//! visited once), skipping hidden entries and runs' folders; anything else is reported
//! with a reason.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::regular::not_regular;
use crate::error::{Error, Result};

/// Extensions symphonia decodes with the features we build it with.
pub const AUDIO_EXTENSIONS: &[&str] =
    &["wav", "wave", "flac", "mp3", "ogg", "oga", "m4a", "mp4", "aif", "aiff", "aifc"];

/// Sidecars (captions, lyrics, metadata) sit beside the audio and are not reported.
const SIDECAR_EXTENSIONS: &[&str] = &["txt", "json", "csv"];

/// The file that makes a folder a run's (a run writes it first). A run's previews and
/// songs are not for training, also where a runs folder sits inside the audio folder.
const RUN_FILE: &str = "run.toml";

#[derive(Debug, Default)]
pub struct ScanOutcome {
    /// Candidate audio files, sorted.
    pub audio: Vec<PathBuf>,
    /// Entries that are not used, and why.
    pub skipped: Vec<(PathBuf, String)>,
}

fn extension(path: &Path) -> Option<String> {
    path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase)
}

pub fn is_audio(path: &Path) -> bool {
    extension(path).is_some_and(|e| AUDIO_EXTENSIONS.contains(&e.as_str()))
}

/// Scans `folder`. Fails only when the folder itself cannot be read.
pub fn scan_folder(folder: &Path) -> Result<ScanOutcome> {
    let root = folder.canonicalize().map_err(|e| Error::io(folder, e))?;
    if !root.is_dir() {
        return Err(Error::io(folder, std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a folder")));
    }
    let mut out = ScanOutcome::default();
    let mut visited = HashSet::from([root]);
    let mut stack = vec![folder.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if dir == folder => return Err(Error::io(folder, e)),
            Err(e) => {
                out.skipped.push((dir, format!("cannot read folder: {e}")));
                continue;
            }
        };
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    out.skipped.push((dir.clone(), format!("cannot list folder: {e}")));
                    continue;
                }
            };
            let path = entry.path();
            if entry.file_name().as_encoded_bytes().starts_with(b".") {
                continue;
            }
            // Follows symlinks: a linked file or folder counts like a real one.
            let meta = match std::fs::metadata(&path) {
                Ok(m) => m,
                Err(e) => {
                    out.skipped.push((path, format!("cannot read (broken link?): {e}")));
                    continue;
                }
            };
            let sidecar = extension(&path).is_some_and(|e| SIDECAR_EXTENSIONS.contains(&e.as_str()));
            if meta.is_dir() && path.join(RUN_FILE).is_file() {
                out.skipped.push((path, "a run's folder (its previews and songs are not for training)".into()));
            } else if meta.is_dir() {
                if let Ok(real) = path.canonicalize() {
                    if visited.insert(real) {
                        stack.push(path);
                    }
                }
            } else if let Some(why) = not_regular(&meta).filter(|_| !sidecar) {
                // A pipe or device is never opened: reading it waits forever.
                out.skipped.push((path, why));
            } else if is_audio(&path) {
                out.audio.push(path);
            } else {
                match extension(&path) {
                    Some(e) if SIDECAR_EXTENSIONS.contains(&e.as_str()) => {}
                    Some(e) => out.skipped.push((path, format!("unsupported file type .{e}"))),
                    None => out.skipped.push((path, "unsupported file (no extension)".into())),
                }
            }
        }
    }
    out.audio.sort();
    out.skipped.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn finds_audio_recursively_skipping_hidden_sidecars_and_loops() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::create_dir_all(d.join("album/disc2")).unwrap();
        fs::create_dir_all(d.join(".hidden")).unwrap();
        for f in ["a.wav", "b.FLAC", "album/c.mp3", "album/disc2/d.m4a", ".hidden/e.wav", ".f.wav"] {
            fs::write(d.join(f), b"x").unwrap();
        }
        for f in ["a.caption.txt", "a.txt", "a.json", "list.csv"] {
            fs::write(d.join(f), b"x").unwrap();
        }
        fs::write(d.join("cover.jpg"), b"x").unwrap();
        fs::write(d.join("README"), b"x").unwrap();
        std::os::unix::fs::symlink(d, d.join("album/loop")).unwrap();
        std::os::unix::fs::symlink(d.join("missing.wav"), d.join("dangling.wav")).unwrap();
        crate::data::testutil::mkfifo(&d.join("pipe.wav"));
        crate::data::testutil::mkfifo(&d.join("pipe.caption.txt"));

        let s = scan_folder(d).unwrap();
        let rel: Vec<_> = s.audio.iter().map(|p| p.strip_prefix(d).unwrap().to_path_buf()).collect();
        assert_eq!(rel, ["a.wav", "album/c.mp3", "album/disc2/d.m4a", "b.FLAC"].map(PathBuf::from));
        let skipped: Vec<_> =
            s.skipped.iter().map(|(p, r)| (p.file_name().unwrap().to_str().unwrap(), r.as_str())).collect();
        assert_eq!(skipped.len(), 4, "{skipped:?}");
        assert!(skipped.iter().any(|(f, r)| *f == "pipe.wav" && r.contains("named pipe")));
        assert!(skipped.iter().any(|(f, r)| *f == "cover.jpg" && r.contains(".jpg")));
        assert!(skipped.iter().any(|(f, _)| *f == "README"));
        assert!(skipped.iter().any(|(f, r)| *f == "dangling.wav" && r.contains("broken link")));
    }

    #[test]
    fn a_runs_folder_inside_is_skipped_run_by_run_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::create_dir_all(d.join("runs/first/previews")).unwrap();
        fs::write(d.join("runs/first/run.toml"), b"").unwrap();
        for f in ["song.wav", "runs/first/previews/step-000001.wav", "runs/first/songs.wav"] {
            fs::write(d.join(f), b"x").unwrap();
        }
        let s = scan_folder(d).unwrap();
        assert_eq!(s.audio, [d.join("song.wav")]);
        assert_eq!(s.skipped.len(), 1, "{:?}", s.skipped);
        assert_eq!(s.skipped[0].0, d.join("runs/first"));
        assert!(s.skipped[0].1.contains("a run's folder"), "{}", s.skipped[0].1);
    }

    #[test]
    fn missing_folder_is_an_error_naming_it() {
        let e = scan_folder(Path::new("/no/such/folder")).unwrap_err();
        assert!(e.to_string().contains("/no/such/folder"), "{e}");
    }
}

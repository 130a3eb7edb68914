//! Opening the user's files: only regular files (or links to one) are read. A named
//! pipe would block its reader forever, and a device never ends; both are refused
//! with a reason instead, without waiting for a writer.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::path::Path;

/// `path` opened for reading, or an error when it is not a regular file.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    // Opening a pipe without a writer returns at once instead of waiting for one; a
    // regular file reads the same either way.
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let file = options.open(path)?;
    let meta = file.metadata()?;
    match not_regular(&meta) {
        Some(why) => Err(io::Error::new(io::ErrorKind::InvalidInput, why)),
        None => Ok(file),
    }
}

/// The whole of a regular file.
pub fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open_regular(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Why an entry is not a regular file ("a named pipe (FIFO), not a regular file"), or None.
pub fn not_regular(meta: &Metadata) -> Option<String> {
    if meta.is_file() {
        return None;
    }
    let kind = if meta.is_dir() { "a folder" } else { special_kind(meta) };
    Some(format!("{kind}, not a regular file"))
}

#[cfg(unix)]
fn special_kind(meta: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_fifo() {
        "a named pipe (FIFO)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn special_kind(_: &Metadata) -> &'static str {
    "a special file"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::testutil::mkfifo;

    /// A pipe nobody writes to: opening it does not wait, and reading it is refused.
    #[test]
    fn a_named_pipe_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("song.wav");
        mkfifo(&fifo);
        let e = read_regular(&fifo).unwrap_err();
        assert!(e.to_string().contains("named pipe"), "{e}");
        let e = open_regular(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("a device"), "{e}");
        let e = open_regular(dir.path()).unwrap_err();
        assert!(e.to_string().contains("a folder"), "{e}");
        std::fs::write(dir.path().join("a.txt"), "words").unwrap();
        std::os::unix::fs::symlink(dir.path().join("a.txt"), dir.path().join("link.txt")).unwrap();
        assert_eq!(read_regular(&dir.path().join("link.txt")).unwrap(), b"words");
    }
}

//! The generated song on disk: 32-bit float WAV, the decoder's samples unchanged (no
//! clipping, no normalisation), written whole or not at all.
//!
//! `hound` writes the file (the data module's `wav_bytes` clamps to [-1, 1], which
//! would clip a decoder output that goes past full scale).

use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};

use crate::codec::StereoAudio;
use crate::{Error, Result};

/// The bytes of a stereo 32-bit float WAV of `audio`; audio holding NaN or infinity
/// is refused (no player plays it).
pub fn float_wav_bytes(audio: &StereoAudio) -> Result<Vec<u8>> {
    crate::finite::ensure_audio(&audio.left, &audio.right, || "the audio to write".into())?;
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: audio.sample_rate,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let fail = |e: hound::Error| Error::BadRequest(format!("cannot encode the WAV: {e}"));
    let mut out = Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut out, spec).map_err(fail)?;
    for (l, r) in audio.left.iter().zip(&audio.right) {
        w.write_sample(*l).map_err(fail)?;
        w.write_sample(*r).map_err(fail)?;
    }
    w.finalize().map_err(fail)?;
    Ok(out.into_inner())
}

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

/// `audio` as a float WAV at `path` (see [`write_atomically`]).
pub fn write_wav(path: &Path, audio: &StereoAudio) -> Result<()> {
    write_atomically(path, &float_wav_bytes(audio)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_wav_round_trips_unclipped() {
        let dir = tempfile::tempdir().unwrap();
        let audio =
            StereoAudio { sample_rate: 48_000, left: vec![0.0, 1.5, -2.25, 0.125], right: vec![-0.5, 3.0, 1e-8, -1.0] };
        let path = dir.path().join("out.wav");
        write_wav(&path, &audio).unwrap();
        let back = crate::data::audio::decode(&path).unwrap();
        assert_eq!(back.sample_rate, 48_000);
        assert_eq!(back.left, audio.left, "samples past full scale are kept");
        assert_eq!(back.right, audio.right);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(leftovers.len(), 1, "no temporary file is left: {leftovers:?}");
    }

    #[test]
    fn audio_with_nan_or_infinity_is_refused_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.wav");
        for bad in [f32::NAN, f32::INFINITY] {
            let audio = StereoAudio { sample_rate: 48_000, left: vec![0.0, 0.5], right: vec![bad, 0.25] };
            let err = write_wav(&path, &audio).unwrap_err().to_string();
            assert!(err.contains("the audio to write: 1 of 4 values are not finite"), "{err}");
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn unwritable_paths_are_named_and_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let audio = StereoAudio::silence(48_000, 10);
        for bad in [dir.path().join("missing/out.wav"), dir.path().to_path_buf()] {
            let err = write_wav(&bad, &audio).unwrap_err().to_string();
            assert!(err.contains(&bad.display().to_string()), "{err}");
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}

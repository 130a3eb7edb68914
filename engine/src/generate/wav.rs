//! The generated song on disk: 32-bit float WAV, the decoder's samples unchanged (no
//! clipping, no normalisation), written whole or not at all.
//!
//! `hound` writes the file (the data module's `wav_bytes` clamps to [-1, 1], which
//! would clip a decoder output that goes past full scale).

use std::io::Cursor;
use std::path::Path;

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

/// `audio` as a float WAV at `path` (see [`crate::atomic::write_atomically`]).
pub fn write_wav(path: &Path, audio: &StereoAudio) -> Result<()> {
    crate::atomic::write_atomically(path, &float_wav_bytes(audio)?)
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

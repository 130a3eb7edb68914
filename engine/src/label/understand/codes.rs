//! A song file to the 5 Hz codes ACE-Step's LM reads, as upstream's
//! `convert_src_audio_to_codes` makes them: the whole song decoded, resampled to the
//! encoder's rate, refused when silent, encoded to latents, and tokenized (a code per
//! window of latent frames; with several quantizers, window by window).

use std::path::Path;

use crate::cancel::Cancel;
use crate::data::audio::{decode_file, resample, Cut};
use crate::load::source::SongTokenizer;
use crate::{Error, Result};

/// Below this every sample is silence, as upstream's `is_silence` tells it.
const SILENCE: f32 = 1e-6;

/// The song at `path` as 5 Hz codes. `progress(seconds encoded, seconds of audio)`.
pub fn song_codes(
    path: &Path,
    tokenizer: &SongTokenizer,
    cancel: &Cancel,
    progress: &mut dyn FnMut(f64, f64),
) -> Result<Vec<u32>> {
    let bad = |reason: String| Error::BadAudio { path: path.to_path_buf(), reason };
    let whole = decode_file(path, Cut::Head { max_seconds: f64::INFINITY }).map_err(bad)?;
    let audio = resample(&whole.audio, tokenizer.encoder.sample_rate()).map_err(bad)?;
    if audio.left.iter().chain(&audio.right).all(|s| s.abs() < SILENCE) {
        return Err(bad("the audio is silent: ACE-Step's LM has nothing to describe".into()));
    }
    let window = tokenizer.tokenizer.pool_window();
    let code_seconds = window as f64 / tokenizer.encoder.frames_per_second();
    let latents = tokenizer.encoder.encode_cancellable(&audio, cancel, progress)?;
    if latents.dim(0)? < window {
        return Err(bad(format!(
            "{:.2} s long: shorter than one 5 Hz code ({code_seconds:.1} s), which ACE-Step's LM needs",
            audio.duration_seconds()
        )));
    }
    cancel.check()?;
    let codes = tokenizer.tokenizer.tokenize(&latents, &tokenizer.silence)?.codes;
    let windows = codes.first().map_or(0, Vec::len);
    Ok((0..windows).flat_map(|i| codes.iter().map(move |q| q[i])).collect())
}

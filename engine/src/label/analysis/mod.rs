//! Tempo, key and time signature read from a song's audio, each with how sure the
//! reading is, or why it cannot be told: never a made-up value.
//!
//! The song is streamed (a block of audio in memory at a time) into the features
//! (`features`): an onset envelope and pitch-class frames. From those: the tempo and
//! its beats (`tempo`, `beats`), the key (`key`), the meter (`meter`). The first
//! `ANALYSED_SECONDS` are read: ACE-Step's longest song.

mod beats;
mod features;
mod key;
mod meter;
mod tempo;

use std::path::Path;

use crate::data::audio::{self, Cut, SILENCE_PEAK};
use features::{FeatureStream, Features};

/// Audio analysed from the start of a song (ACE-Step's DURATION_MAX).
pub const ANALYSED_SECONDS: f64 = 600.0;
/// Audio needed to tell a tempo and meter: a few bars at the slowest tempo.
pub const MIN_RHYTHM_SECONDS: f64 = 6.0;

/// One field's reading: its value and how sure (0 to 1), or why it cannot be told.
pub type Reading<T> = Result<Estimate<T>, String>;

/// The confidence from which a reading is offered as read; below it, as a guess.
pub const SURE: f64 = 0.8;

#[derive(Debug, Clone, PartialEq)]
pub struct Estimate<T> {
    pub value: T,
    pub confidence: f64,
}

impl<T> Estimate<T> {
    /// The same reading, its value written another way.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Estimate<U> {
        Estimate { value: f(self.value), confidence: self.confidence }
    }

    /// Read with less confidence than [`SURE`]: a guess to be shown as one.
    pub fn is_guess(&self) -> bool {
        self.confidence < SURE
    }
}

/// What the audio says of a song, as ACE-Step's metadata fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Analysis {
    /// Seconds in the whole file.
    pub duration: f64,
    pub bpm: Reading<u32>,
    /// "F# minor"
    pub keyscale: Reading<String>,
    /// The numerator: 3, 4 or 6 (ACE-Step's 2 is never read: 2/4 is written 4).
    pub timesignature: Reading<u32>,
}

/// Analyses a song file. The error (a file that does not decode) is a reason without
/// the path; a song that decodes but is too short or silent to tell a field gets that
/// field's reason instead.
pub fn analyse_file(path: &Path) -> Result<Analysis, String> {
    let mut stream: Option<FeatureStream> = None;
    let mut failed: Result<(), String> = Ok(());
    let duration = audio::stream_mono(path, Cut::Head { max_seconds: ANALYSED_SECONDS }, &mut |rate, block| {
        if failed.is_ok() {
            failed = match &mut stream {
                Some(s) => s.push(block),
                None => FeatureStream::new(rate).and_then(|s| stream.insert(s).push(block)),
            };
        }
    })?;
    failed?;
    let features = match stream {
        Some(s) => s.finish()?,
        None => return Err("no audio decodes".into()),
    };
    Ok(analyse(&features, duration))
}

/// Each field's reading from a song's features.
fn analyse(features: &Features, duration: f64) -> Analysis {
    let silent = match features.peak {
        p if p.is_nan() => Some("contains non-finite samples"),
        p if p < SILENCE_PEAK => Some("silent"),
        _ => None,
    };
    if let Some(why) = silent {
        return Analysis { duration, bpm: cannot(why), keyscale: cannot(why), timesignature: cannot(why) };
    }
    let tuning = key::tuning(&features.pitch);
    let keyscale = key::estimate(&features.pitch, &features.bass, tuning)
        .map(|k| Estimate { value: k.keyscale(), confidence: k.confidence });
    if features.seconds < MIN_RHYTHM_SECONDS {
        let why = format!("too short to tell ({:.1} s, need {MIN_RHYTHM_SECONDS} s)", features.seconds);
        return Analysis { duration, bpm: cannot(&why), keyscale, timesignature: cannot(&why) };
    }
    let tempo = tempo::estimate(&features.onset, Features::ONSET_RATE);
    let timesignature = match &tempo {
        Ok(t) => {
            meter::estimate(t, features, tuning).map(|m| Estimate { value: m.numerator, confidence: m.confidence })
        }
        Err(why) => Err(format!("no beat to count bars by ({why})")),
    };
    let bpm = tempo.map(|t| Estimate { value: t.bpm.round() as u32, confidence: t.confidence });
    Analysis { duration, bpm, keyscale, timesignature }
}

/// A field that cannot be told, and why.
fn cannot<T>(why: &str) -> Reading<T> {
    Err(why.to_string())
}

//! Key: the song's pitch-class profile correlated with major and minor key profiles
//! (Krumhansl and Schmuckler's method), with the bass's profile as a second vote for
//! the tonic: a relative major and minor share their notes, and what tells them
//! apart is the note the harmony comes home to.
//!
//! The profiles say how often each note is written; a recording's peaks also hold each
//! note's overtones (the third harmonic sounds a fifth above, the fifth a major third),
//! which lean every key's profile towards its dominant's. So each profile is compared
//! as it would sound: every note with its first harmonics added, each quieter than the
//! one below it.
//!
//! The recording's tuning is read first (the circular mean of where its spectral
//! peaks fall between semitones), so a song a quarter-tone off A = 440 Hz still
//! folds onto the right pitch classes.

use super::features::{FINE, FINE_BINS};

/// Key profiles from the Kostka-Payne harmony textbook's excerpts (Temperley, "Music and
/// Probability", 2007): how often each scale degree is written in a major and a minor
/// key, tonic first. Of the published profiles (Krumhansl-Kessler, Temperley's
/// Kostka-Payne, Albrecht-Shanahan, Aarden-Essen), as heard with their harmonics, these
/// scored best on the bench's tuning source (Bach's chorales, bench/NOTES.md).
const MAJOR: [f64; 12] = [0.748, 0.060, 0.488, 0.082, 0.670, 0.460, 0.096, 0.715, 0.104, 0.366, 0.057, 0.400];
const MINOR: [f64; 12] = [0.712, 0.084, 0.474, 0.618, 0.049, 0.460, 0.105, 0.747, 0.404, 0.067, 0.133, 0.330];
/// Harmonics a note is heard with, and how much quieter each is than the one below.
const HARMONICS: u32 = 6;
const HARMONIC_SLOPE: f64 = 0.8;
/// How much the bass's share of the tonic adds to a key's correlation.
const BASS_WEIGHT: f64 = 0.25;
/// How much the bass of the first and last seconds adds: songs start and end at home
/// far more often than anywhere else.
const EDGE_WEIGHT: f64 = 0.3;
/// The first and last seconds, in pitch frames (4 s).
const EDGE_FRAMES: usize = 43;
/// Frames this much quieter than the loudest carry no pitch worth counting.
const QUIET_FRAME: f32 = 1e-3;
/// Below this correlation the pitches fit no key (drums, noise, atonal music).
const MIN_CORRELATION: f64 = 0.4;
/// Pitched audio needed to tell a key, in pitch frames (3 s).
const MIN_FRAMES: usize = 32;

/// Tonic names as keys are usually spelled (flats where a flat key is the usual one).
const MAJOR_NAMES: [&str; 12] = ["C", "Db", "D", "Eb", "E", "F", "F#", "G", "Ab", "A", "Bb", "B"];
const MINOR_NAMES: [&str; 12] = ["C", "C#", "D", "Eb", "E", "F", "F#", "G", "G#", "A", "Bb", "B"];

#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    /// Pitch class of the tonic, C = 0.
    pub tonic: usize,
    pub minor: bool,
    pub confidence: f64,
}

impl Key {
    /// As ACE-Step writes `keyscale`: "F# minor", "Bb major".
    pub fn keyscale(&self) -> String {
        match self.minor {
            true => format!("{} minor", MINOR_NAMES[self.tonic]),
            false => format!("{} major", MAJOR_NAMES[self.tonic]),
        }
    }
}

/// The key of a song's pitch frames (all peaks, and the bass's), tuned as `tuning`.
pub fn estimate(pitch: &[[f32; FINE_BINS]], bass: &[[f32; FINE_BINS]], tuning: f64) -> Result<Key, String> {
    let (profile, frames) = mean_chroma(pitch, tuning);
    if frames < MIN_FRAMES {
        return Err("too little pitched sound to tell a key".into());
    }
    let (bass_profile, _) = mean_chroma(bass, tuning);
    let edges = |frames: &[[f32; FINE_BINS]]| {
        let n = frames.len().min(EDGE_FRAMES);
        let (first, _) = mean_chroma(&frames[..n], tuning);
        let (last, _) = mean_chroma(&frames[frames.len() - n..], tuning);
        std::array::from_fn::<f64, 12, _>(|pc| first[pc] + last[pc])
    };
    let edge_profile = edges(bass);
    let share = |profile: &[f64; 12], pc: usize| {
        let total: f64 = profile.iter().sum();
        if total > 0.0 {
            profile[pc] / total
        } else {
            0.0
        }
    };
    let shapes = [heard(&MAJOR), heard(&MINOR)];
    let mut scores: Vec<(f64, usize, bool)> = Vec::with_capacity(24);
    for tonic in 0..12 {
        for (minor, shape) in [(false, &shapes[0]), (true, &shapes[1])] {
            let rotated: [f64; 12] = std::array::from_fn(|pc| shape[(pc + 12 - tonic) % 12]);
            let votes = BASS_WEIGHT * share(&bass_profile, tonic) + EDGE_WEIGHT * share(&edge_profile, tonic);
            scores.push((correlation(&profile, &rotated) + votes, tonic, minor));
        }
    }
    scores.sort_by(|a, b| b.0.total_cmp(&a.0));
    let (best, tonic, minor) = scores[0];
    let fit = correlation(&profile, &std::array::from_fn(|pc| shapes[usize::from(minor)][(pc + 12 - tonic) % 12]));
    if fit.is_nan() || fit < MIN_CORRELATION {
        return Err("the pitches fit no major or minor key".into());
    }
    let margin = best - scores[1].0;
    let confidence = (fit * (0.4 + 0.6 * (margin / 0.15).min(1.0))).clamp(0.0, 1.0);
    Ok(Key { tonic, minor, confidence })
}

/// A profile as it sounds: each pitch class with its harmonics at their pitch classes
/// (harmonic h sounds 12 log2 h semitones up), the h-th at HARMONIC_SLOPE^(h-1).
fn heard(written: &[f64; 12]) -> [f64; 12] {
    let mut sounding = [0.0f64; 12];
    for (pc, weight) in written.iter().enumerate() {
        for h in 1..=HARMONICS {
            let up = (12.0 * f64::from(h).log2()).round() as usize;
            sounding[(pc + up) % 12] += weight * HARMONIC_SLOPE.powi(h as i32 - 1);
        }
    }
    sounding
}

/// Where the peaks sit between semitones, in fine bins (-FINE/2..FINE/2): the circular
/// mean of their positions within a semitone, weighted by height.
pub fn tuning(pitch: &[[f32; FINE_BINS]]) -> f64 {
    let (mut sin, mut cos) = (0.0f64, 0.0f64);
    for frame in pitch {
        for (i, v) in frame.iter().enumerate() {
            let angle = std::f64::consts::TAU * (i % FINE) as f64 / FINE as f64;
            sin += f64::from(*v) * angle.sin();
            cos += f64::from(*v) * angle.cos();
        }
    }
    match sin == 0.0 && cos == 0.0 {
        true => 0.0,
        false => sin.atan2(cos) / std::f64::consts::TAU * FINE as f64,
    }
}

/// The mean of the frames' chroma (each frame's twelve classes summing to 1, so loud
/// passages do not outvote quiet ones), and how many frames had pitch.
fn mean_chroma(frames: &[[f32; FINE_BINS]], tuning: f64) -> ([f64; 12], usize) {
    let loudest = frames.iter().map(|f| f.iter().sum::<f32>()).fold(0.0f32, f32::max);
    let mut sum = [0.0f64; 12];
    let mut counted = 0;
    for frame in frames {
        let chroma = fold(frame, tuning);
        let total: f64 = chroma.iter().sum();
        if loudest <= 0.0 || total < f64::from(QUIET_FRAME * loudest) {
            continue;
        }
        for (s, c) in sum.iter_mut().zip(chroma) {
            *s += c / total;
        }
        counted += 1;
    }
    (sum.map(|s| s / counted.max(1) as f64), counted)
}

/// Fine bins to twelve pitch classes centred on the tuning, each class taking the
/// bins within half a semitone with a raised-cosine weight (off-pitch energy counts less).
pub fn fold(frame: &[f32; FINE_BINS], tuning: f64) -> [f64; 12] {
    let mut chroma = [0.0f64; 12];
    for (i, v) in frame.iter().enumerate() {
        if *v == 0.0 {
            continue;
        }
        let semitones = (i as f64 - tuning) / FINE as f64;
        let class = semitones.round();
        let off = semitones - class;
        let weight = (std::f64::consts::PI * off).cos().powi(2);
        chroma[(class as i64).rem_euclid(12) as usize] += f64::from(*v) * weight;
    }
    chroma
}

/// Pearson correlation of two profiles.
fn correlation(a: &[f64; 12], b: &[f64; 12]) -> f64 {
    let (ma, mb) = (a.iter().sum::<f64>() / 12.0, b.iter().sum::<f64>() / 12.0);
    let (mut ab, mut aa, mut bb) = (0.0, 0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        ab += (x - ma) * (y - mb);
        aa += (x - ma).powi(2);
        bb += (y - mb).powi(2);
    }
    ab / (aa * bb).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames sounding the given pitch classes, `cents` off A = 440 Hz.
    fn frames(classes: &[usize], cents: f64, n: usize) -> Vec<[f32; FINE_BINS]> {
        let mut frame = [0.0f32; FINE_BINS];
        for c in classes {
            let fine = (*c as f64 * FINE as f64 + cents / 100.0 * FINE as f64).rem_euclid(FINE_BINS as f64);
            frame[fine.round() as usize % FINE_BINS] += 1.0;
        }
        vec![frame; n]
    }

    #[test]
    fn a_scale_with_its_tonic_in_the_bass_names_the_key_even_when_detuned() {
        // A minor's scale, its tonic triad weighted, 30 cents sharp; A in the bass.
        let classes = [9, 9, 0, 4, 9, 11, 0, 2, 4, 5, 7, 4];
        let pitch = frames(&classes, 30.0, 100);
        let sharp = tuning(&pitch);
        let key = estimate(&pitch, &frames(&[9], 30.0, 100), sharp).unwrap();
        assert_eq!(key.keyscale(), "A minor");
        let semitones = sharp / FINE as f64;
        assert!((semitones - 0.3).abs() < 0.05, "tuning {semitones}");
        // The same notes over C in the bass: C major.
        let classes = [0, 0, 4, 7, 0, 2, 4, 5, 7, 9, 11, 7];
        let pitch = frames(&classes, 0.0, 100);
        let key = estimate(&pitch, &frames(&[0], 0.0, 100), tuning(&pitch)).unwrap();
        assert_eq!(key.keyscale(), "C major");
    }

    #[test]
    fn no_pitch_is_no_key() {
        let silent = vec![[0.0f32; FINE_BINS]; 200];
        assert!(estimate(&silent, &silent, 0.0).is_err());
        assert!(estimate(&frames(&[0, 4, 7], 0.0, 5), &silent, 0.0).is_err(), "too short");
    }
}

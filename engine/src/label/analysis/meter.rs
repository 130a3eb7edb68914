//! Meter, as ACE-Step's `timesignature` numerator (2, 3, 4 or 6): how the counted
//! beats group into bars, and whether they divide in two or in three.
//!
//! A bar shows in what changes on its first beat: the harmony (chords change on the
//! one far more than elsewhere), the low end (kick and bass land there) and the
//! loudness of the onset. Each beat gets those three, each relative to its mean; the
//! grouping (2, 3 or 4 beats) in which one beat stands out most is the bar. Beats that
//! divide in three (the onsets fall at their thirds, not their halves) make compound
//! time: two such beats a bar is 6/8, written 6.

use super::beats::{grouping_contrast, strength_at};
use super::features::{Features, FINE_BINS};
use super::key::fold;
use super::tempo::Tempo;

/// Thirds this much stronger than halves make a beat compound.
const COMPOUND: f64 = 1.25;
/// The most a meter is trusted: on music from elsewhere (bench/NOTES.md, the chorales
/// this was set on) meters read with a clear margin were right no more often than those
/// read with a slight one, 79-83% of the time, short of the 90% a sure reading must be.
/// So a meter is always offered as a guess (below [`super::SURE`]).
const GUESS_CEILING: f64 = 0.75;
/// Beats needed to see bars: three of four beats.
const MIN_BEATS: usize = 12;

#[derive(Debug, Clone, PartialEq)]
pub struct Meter {
    pub numerator: u32,
    pub confidence: f64,
}

/// The meter of a song at the tempo found, from its features (tuning in fine bins).
pub fn estimate(tempo: &Tempo, features: &Features, tuning: f64) -> Result<Meter, String> {
    let beats = &tempo.beats;
    if beats.len() < MIN_BEATS {
        return Err(format!("too few beats to see bars ({} found, need {MIN_BEATS})", beats.len()));
    }
    let cues = [
        beats.iter().map(|b| f64::from(strength_at(&features.low_onset, *b))).collect::<Vec<_>>(),
        beats.iter().map(|b| f64::from(strength_at(&features.onset, *b))).collect(),
        harmonic_change(beats, &features.pitch, tuning),
    ];
    let per_beat: Vec<f64> =
        (0..beats.len()).map(|k| cues.iter().map(|cue| cue[k] / mean(cue).max(1e-12)).sum::<f64>()).collect();
    let mut groupings: Vec<(f64, usize)> = [2, 3, 4].iter().map(|g| (grouping_contrast(&per_beat, *g), *g)).collect();
    groupings.sort_by(|a, b| b.0.total_cmp(&a.0));
    let (contrast, group) = groupings[0];
    let compound = tempo.accents.thirds > COMPOUND * tempo.accents.half;
    // Bars of two and of four beats (with a strong third beat) cannot be told apart
    // by ear; four is what such a song is written in far more often.
    let numerator = match (compound, group) {
        (_, 3) => 3,
        (true, _) => 6,
        (false, _) => 4,
    };
    let margin = (contrast - groupings[1].0) / contrast.abs().max(1e-12);
    Ok(Meter { numerator, confidence: GUESS_CEILING * (margin * 2.0).clamp(0.0, 1.0) })
}

/// For each beat, how much the harmony changes there: one less the cosine similarity
/// of the mean chroma over the beat before it and the beat after it.
fn harmonic_change(beats: &[f64], pitch: &[[f32; FINE_BINS]], tuning: f64) -> Vec<f64> {
    // Onset frame i is centred at 256 i + 512 samples, pitch frame j at 2048 j + 4096.
    let pitch_frame = |onset_frame: f64| ((onset_frame * 256.0 - 3584.0) / 2048.0).max(0.0);
    let chroma: Vec<[f64; 12]> = pitch.iter().map(|f| fold(f, tuning)).collect();
    let span = |from: f64, to: f64| {
        let (a, b) = (pitch_frame(from).round() as usize, pitch_frame(to).round() as usize);
        let mut sum = [0.0f64; 12];
        for frame in chroma.get(a.min(chroma.len())..b.max(a + 1).min(chroma.len())).unwrap_or(&[]) {
            for (s, c) in sum.iter_mut().zip(frame) {
                *s += c;
            }
        }
        sum
    };
    (0..beats.len())
        .map(|k| {
            let before = if k > 0 { span(beats[k - 1], beats[k]) } else { [0.0; 12] };
            let after = beats.get(k + 1).map_or([0.0; 12], |next| span(beats[k], *next));
            1.0 - cosine(&before, &after)
        })
        .collect()
}

fn cosine(a: &[f64; 12], b: &[f64; 12]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = (a.iter().map(|x| x * x).sum::<f64>() * b.iter().map(|x| x * x).sum::<f64>()).sqrt();
    if norm > 0.0 {
        dot / norm
    } else {
        1.0
    }
}

fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len().max(1) as f64
}

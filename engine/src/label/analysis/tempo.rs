//! Tempo: how often the onsets repeat (their autocorrelation, read at a period's first
//! four multiples so that a true beat, which recurs at each of them, stands out), then
//! which level of the meter a musician counts.
//!
//! Periodicity alone cannot tell a beat from its half or its double: all three repeat.
//! What tells them apart is accent. Beats are played alike and their subdivisions
//! softer; the level below the beat alternates loud and soft, the level above has loud
//! notes between its pulses. So beats are tracked at each candidate level, and the
//! level chosen is the one whose subdivisions are weakest against its beats while its
//! beats are most alike, with a mild preference for moderate tempos (a log-normal
//! around 110 BPM, one octave wide) where the two are close.

use super::beats::{grouping_contrast, strength_at, track, Accents};

/// ACE-Step's tempo range (constants.py: BPM_MIN, BPM_MAX).
pub const BPM_RANGE: (f64, f64) = (30.0, 300.0);
/// The tempo a listener leans to, and how far (in octaves) the lean reaches.
const PRIOR_BPM: f64 = 110.0;
const PRIOR_OCTAVES: f64 = 1.0;
/// Below this periodicity (normalised autocorrelation) there is no steady beat. Set on
/// the bench's tuning source (Bach's chorales, where organ and strings start their notes
/// softly): their tempos were still read right down to 0.02.
const MIN_PERIODICITY: f64 = 0.02;
/// Weights of the evidence against a candidate's subdivisions being as strong as its
/// beats: its beats alternating loud and soft, its beats landing off the onsets, its
/// distance from the tempo listeners lean to. Set on the bench's development set
/// (bench/NOTES.md) and checked on a second set made from another seed.
const ALTERNATION_WEIGHT: f64 = 0.25;
const LANDING_WEIGHT: f64 = 1.0;
const PRIOR_WEIGHT: f64 = 1.5;
/// Metrical levels tried around the most periodic tempo: its halves, doubles and thirds,
/// never 3:2 from it. In an even run of notes a 3:2 level cuts across them and its
/// subdivisions fall between onsets, so it looked like a beat with weak subdivisions: a
/// jig read at two thirds of its beat, a reel at three halves (O'Neill's tunes, the
/// bench's tempo tuning source; bench/NOTES.md).
const LEVELS: [f64; 5] = [1.0 / 3.0, 0.5, 1.0, 2.0, 3.0];

/// A tempo, the beats found at it, and how the onsets fall around them.
#[derive(Debug, Clone)]
pub struct Tempo {
    pub bpm: f64,
    /// Beat positions, in onset frames.
    pub beats: Vec<f64>,
    pub accents: Accents,
    pub confidence: f64,
}

/// The counted tempo of an onset envelope at `rate` frames per second.
pub fn estimate(onset: &[f32], rate: f64) -> Result<Tempo, String> {
    let period_of = |bpm: f64| 60.0 * rate / bpm;
    let max_lag = (4.0 * period_of(BPM_RANGE.0)).ceil() as usize;
    let acf = autocorrelation(&detrended(onset, rate), max_lag);
    let salience = |bpm: f64| {
        let p = period_of(bpm);
        (1..=4).map(|k| interpolate(&acf, k as f64 * p)).sum::<f64>() / 4.0
    };
    let prior = |bpm: f64| -0.5 * ((bpm / PRIOR_BPM).log2() / PRIOR_OCTAVES).powi(2);
    // A grid a quarter of a percent apart: finer than any tolerance asked of a tempo.
    let grid: Vec<f64> =
        std::iter::successors(Some(BPM_RANGE.0), |b| Some(b * 1.0025)).take_while(|b| *b <= BPM_RANGE.1).collect();
    let most_periodic = grid
        .iter()
        .copied()
        .max_by(|a, b| (salience(*a) * prior(*a).exp()).total_cmp(&(salience(*b) * prior(*b).exp())))
        .ok_or("no tempo range")?;
    let periodicity = salience(most_periodic);
    if periodicity.is_nan() || periodicity < MIN_PERIODICITY {
        return Err("no steady beat".into());
    }
    // Each candidate level at the most periodic tempo near it (within 3%).
    let peak_near = |bpm: f64| {
        grid.iter()
            .copied()
            .filter(|b| (b / bpm - 1.0).abs() <= 0.03)
            .max_by(|a, b| salience(*a).total_cmp(&salience(*b)))
    };
    let envelope_mean = onset.iter().map(|x| f64::from(*x)).sum::<f64>() / onset.len().max(1) as f64;
    let mut scored: Vec<(f64, Tempo)> = LEVELS
        .iter()
        .filter_map(|m| peak_near(most_periodic * m))
        .map(|bpm| {
            let beats = track(onset, period_of(bpm));
            let accents = Accents::of(onset, &beats);
            let per_beat: Vec<f64> = beats.iter().map(|b| f64::from(strength_at(onset, *b))).collect();
            let alternation = grouping_contrast(&per_beat, 2);
            let landing = (accents.on / envelope_mean).max(1e-9).ln();
            let score = -accents.subdivision() - ALTERNATION_WEIGHT * alternation
                + LANDING_WEIGHT * landing
                + PRIOR_WEIGHT * prior(bpm);
            let bpm = measured_bpm(&beats, rate).unwrap_or(bpm);
            (score, Tempo { bpm, beats, accents, confidence: 0.0 })
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    let margin = match scored.get(1) {
        Some(second) => scored[0].0 - second.0,
        None => 1.0,
    };
    let (_, mut best) = scored.into_iter().next().ok_or("no steady beat")?;
    if !(BPM_RANGE.0..=BPM_RANGE.1).contains(&best.bpm) {
        return Err(format!(
            "the beat found ({:.0} BPM) is outside ACE-Step's {}-{} BPM",
            best.bpm, BPM_RANGE.0, BPM_RANGE.1
        ));
    }
    // Sure when the onsets repeat strongly and one level clearly wins: on the bench's
    // development set the levels chosen right won by a median 0.86, the wrong ones by
    // 0.47 at most.
    best.confidence = ((periodicity / 0.5).min(1.0) * (0.3 + 0.7 * margin.min(1.0))).clamp(0.0, 1.0);
    Ok(best)
}

/// The tempo the beats keep: their mean interval, leaving out intervals more than 15%
/// off the median (a beat the tracker dropped or added).
fn measured_bpm(beats: &[f64], rate: f64) -> Option<f64> {
    let mut gaps: Vec<f64> = beats.windows(2).map(|w| w[1] - w[0]).collect();
    if gaps.len() < 4 {
        return None;
    }
    gaps.sort_by(f64::total_cmp);
    let median = gaps[gaps.len() / 2];
    let kept: Vec<f64> = gaps.into_iter().filter(|g| (g / median - 1.0).abs() <= 0.15).collect();
    let mean = kept.iter().sum::<f64>() / kept.len() as f64;
    Some(60.0 * rate / mean)
}

/// The envelope less its mean over the surrounding second: what repeats, not how loud.
fn detrended(onset: &[f32], rate: f64) -> Vec<f64> {
    let half = (rate / 2.0) as usize;
    let mut prefix = vec![0.0f64; onset.len() + 1];
    for (i, x) in onset.iter().enumerate() {
        prefix[i + 1] = prefix[i] + f64::from(*x);
    }
    (0..onset.len())
        .map(|i| {
            let (a, b) = (i.saturating_sub(half), (i + half + 1).min(onset.len()));
            f64::from(onset[i]) - (prefix[b] - prefix[a]) / (b - a) as f64
        })
        .collect()
}

/// The autocorrelation at lags 0..=max_lag, each lag's sum divided by its number of
/// terms, then by lag 0's.
fn autocorrelation(x: &[f64], max_lag: usize) -> Vec<f64> {
    let n = x.len();
    let mut r: Vec<f64> = (0..=max_lag.min(n.saturating_sub(1)))
        .map(|lag| x[..n - lag].iter().zip(&x[lag..]).map(|(a, b)| a * b).sum::<f64>() / (n - lag) as f64)
        .collect();
    let zero = r.first().copied().unwrap_or(0.0);
    if zero > 0.0 {
        r.iter_mut().for_each(|v| *v /= zero);
    }
    r
}

/// `r` at a fractional lag (0 beyond its end).
fn interpolate(r: &[f64], lag: f64) -> f64 {
    let i = lag.floor() as usize;
    match (r.get(i), r.get(i + 1)) {
        (Some(a), Some(b)) => a + (b - a) * (lag - i as f64),
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An envelope of 4/4 bars: loud beats, eighths between at a fifth of their
    /// strength, an accent on the one.
    fn four_four(bpm: f64, rate: f64, seconds: f64) -> Vec<f32> {
        let n = (seconds * rate) as usize;
        let mut x = vec![0.0f32; n];
        let eighth = 30.0 * rate / bpm;
        let mut k = 0;
        while (k as f64 * eighth) < n as f64 - 1.0 {
            let v = match k % 8 {
                0 => 1.2,
                k if k % 2 == 0 => 1.0,
                _ => 0.2,
            };
            x[(k as f64 * eighth).round() as usize] = v;
            k += 1;
        }
        x
    }

    #[test]
    fn the_counted_beat_of_a_click_track_at_many_tempos() {
        let rate = 86.13;
        for bpm in [62.0, 75.0, 91.0, 120.0, 133.0, 150.0, 174.0] {
            let t = estimate(&four_four(bpm, rate, 30.0), rate).unwrap();
            assert!((t.bpm / bpm - 1.0).abs() < 0.02, "{bpm} BPM estimated as {:.1}", t.bpm);
        }
    }

    /// A jig's melody: 6/8 bars of running eighths and of quarter-eighth pairs, the
    /// notes' loudness varying with no accent on the beat, at `bpm` dotted quarters a
    /// minute. With levels 3:2 from the most periodic pulse, 100, 110, 115 and 120 were
    /// read at two thirds or three quarters of their beat.
    fn jig(bpm: f64, rate: f64, seconds: f64) -> Vec<f32> {
        const BARS: [&[usize]; 4] = [&[0, 1, 2, 3, 4, 5], &[0, 2, 3, 5], &[0, 1, 2, 3, 5], &[0, 2, 3, 4, 5]];
        let n = (seconds * rate) as usize;
        let mut x = vec![0.0f32; n];
        let eighth = 20.0 * rate / bpm;
        for bar in 0.. {
            let start = bar as f64 * 6.0 * eighth;
            if start >= n as f64 {
                break;
            }
            for k in BARS[bar % BARS.len()] {
                if let Some(v) = x.get_mut((start + *k as f64 * eighth).round() as usize) {
                    *v = 0.6 + 0.4 * (((bar * 7 + k * 13) % 11) as f32 / 10.0);
                }
            }
        }
        x
    }

    #[test]
    fn a_jig_is_counted_in_dotted_quarters_not_at_two_thirds_of_them() {
        let rate = 86.13;
        for bpm in [90.0, 95.0, 100.0, 105.0, 110.0, 115.0, 120.0] {
            let t = estimate(&jig(bpm, rate, 12.0), rate).unwrap();
            assert!((t.bpm / bpm - 1.0).abs() < 0.04, "a jig at {bpm} BPM estimated as {:.1}", t.bpm);
        }
    }

    #[test]
    fn flat_onsets_have_no_tempo() {
        let noise: Vec<f32> = (0..3000).map(|i| ((i * 7919) % 13) as f32 / 13.0).collect();
        assert!(estimate(&vec![0.0; 3000], 86.13).is_err());
        let _ = estimate(&noise, 86.13); // no panic on arbitrary input
    }
}

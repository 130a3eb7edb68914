//! Beats at a given tempo, and how strong the sound is on them, between them and at
//! their thirds: what tells a beat from its subdivision or its bar.

/// Beat positions (in onset frames) that follow the onsets at a period, by dynamic
/// programming (Ellis, "Beat tracking by dynamic programming", 2007): each frame's
/// score is its onset strength plus the best earlier beat's score, less a penalty
/// for an interval off the period (squared log ratio). The best chain is read back
/// from the best-scoring frame of the last period.
pub fn track(onset: &[f32], period: f64) -> Vec<f64> {
    // How much an interval off the period costs against the onset strength (Ellis: 100
    // for an envelope of unit deviation).
    const TIGHTNESS: f64 = 100.0;
    let n = onset.len();
    if n == 0 || period < 2.0 {
        return Vec::new();
    }
    let scale = deviation(onset).max(1e-9);
    let strength: Vec<f64> = onset.iter().map(|&x| f64::from(x) / scale).collect();
    let (lo, hi) = ((period * 0.5).round() as usize, (period * 2.0).round() as usize);
    let penalty: Vec<f64> = (0..=hi).map(|gap| (gap.max(1) as f64 / period).ln().powi(2) * TIGHTNESS).collect();
    let mut score = vec![0.0f64; n];
    let mut back = vec![None; n];
    for t in 0..n {
        let best = (lo.max(1)..=hi.min(t))
            .map(|gap| (score[t - gap] - penalty[gap], t - gap))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        score[t] = strength[t];
        if let Some((s, from)) = best {
            score[t] += s.max(0.0);
            back[t] = Some(from);
        }
    }
    let tail = n.saturating_sub(period.round() as usize)..n;
    let mut at = tail.max_by(|a, b| score[*a].total_cmp(&score[*b])).unwrap_or(n - 1);
    let mut beats = vec![at as f64];
    while let Some(from) = back[at] {
        at = from;
        beats.push(at as f64);
    }
    beats.reverse();
    beats
}

/// Standard deviation.
fn deviation(x: &[f32]) -> f64 {
    let n = x.len().max(1) as f64;
    let mean = x.iter().map(|v| f64::from(*v)).sum::<f64>() / n;
    (x.iter().map(|v| (f64::from(*v) - mean).powi(2)).sum::<f64>() / n).sqrt()
}

/// The strongest value of `signal` within two frames of `at` (23 ms: a played note
/// is rarely exactly on the grid).
pub fn strength_at(signal: &[f32], at: f64) -> f32 {
    let centre = at.round() as isize;
    (centre - 2..=centre + 2)
        .filter_map(|i| usize::try_from(i).ok().and_then(|i| signal.get(i)))
        .fold(0.0, |m, x| m.max(*x))
}

/// Mean strength on the beats, halfway between them and at their thirds.
#[derive(Debug, Clone, Copy)]
pub struct Accents {
    pub on: f64,
    pub half: f64,
    pub thirds: f64,
}

impl Accents {
    pub fn of(signal: &[f32], beats: &[f64]) -> Self {
        let (mut on, mut half, mut thirds) = (0.0, 0.0, 0.0);
        let n = beats.len().saturating_sub(1).max(1) as f64;
        for pair in beats.windows(2) {
            let (a, gap) = (pair[0], pair[1] - pair[0]);
            on += f64::from(strength_at(signal, a));
            half += f64::from(strength_at(signal, a + gap / 2.0));
            thirds += 0.5 * f64::from(strength_at(signal, a + gap / 3.0) + strength_at(signal, a + 2.0 * gap / 3.0));
        }
        Accents { on: on / n, half: half / n, thirds: thirds / n }
    }

    /// How strong the strongest subdivision is against the beats (1: as strong).
    pub fn subdivision(&self) -> f64 {
        self.half.max(self.thirds) / self.on.max(1e-12)
    }
}

/// How much one beat in every `group` stands out from the others, at its best phase,
/// as a fraction of the mean: 0 when every beat is alike.
pub fn grouping_contrast(per_beat: &[f64], group: usize) -> f64 {
    if per_beat.len() < 2 * group {
        return 0.0;
    }
    let mean = per_beat.iter().sum::<f64>() / per_beat.len() as f64;
    if mean <= 0.0 {
        return 0.0;
    }
    (0..group)
        .map(|phase| {
            let (mut on, mut n_on, mut off, mut n_off) = (0.0, 0, 0.0, 0);
            for (k, v) in per_beat.iter().enumerate() {
                if k % group == phase {
                    on += v;
                    n_on += 1;
                } else {
                    off += v;
                    n_off += 1;
                }
            }
            (on / n_on as f64 - off / n_off as f64) / mean
        })
        .fold(f64::MIN, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clicks every `period` frames from `first`, loud on every `group`-th.
    fn clicks(n: usize, period: f64, first: f64) -> Vec<f32> {
        let mut x = vec![0.0f32; n];
        let mut t = first;
        while (t as usize) < n {
            x[t.round() as usize] = 1.0;
            t += period;
        }
        x
    }

    #[test]
    fn beats_land_on_clicks_at_the_period() {
        let x = clicks(4000, 43.07, 10.0);
        let beats = track(&x, 43.0);
        assert!(beats.len() >= 90, "{} beats", beats.len());
        for b in &beats {
            let off = ((b - 10.0) / 43.07 - ((b - 10.0) / 43.07).round()).abs() * 43.07;
            assert!(off <= 1.0, "beat at {b} is {off} frames off a click");
        }
    }

    #[test]
    fn contrast_finds_the_group_that_stands_out() {
        let waltz: Vec<f64> = (0..30).map(|k| if k % 3 == 1 { 2.0 } else { 1.0 }).collect();
        assert!(grouping_contrast(&waltz, 3) > 0.5);
        assert!(grouping_contrast(&waltz, 3) > grouping_contrast(&waltz, 2));
        assert!(grouping_contrast(&waltz, 3) > grouping_contrast(&waltz, 4));
        assert_eq!(grouping_contrast(&[1.0; 24], 4), 0.0);
    }
}

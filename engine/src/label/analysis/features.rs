//! The analysis front end: a song streamed in block by block becomes the feature
//! sequences the estimates read, with nothing of the audio kept.
//!
//! - Onset strength (86 frames/s): how much new sound starts in each 11.6 ms, as
//!   SuperFlux does it (log-compressed quarter-octave band magnitudes, the rise over a
//!   frame before, against a maximum over neighbouring bands so vibrato does not count),
//!   with the bands below 200 Hz (kick, bass) kept apart too.
//! - Pitch classes (10.8 frames/s): the spectrum's peaks from 50 Hz to 5 kHz, each at
//!   its interpolated frequency, in bins of a tenth of a semitone, so that the
//!   recording's tuning can be read before folding to twelve classes; peaks below
//!   160 Hz are kept apart too (the bass names the tonic).

use std::sync::Arc;

use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};
use rubato::{FftFixedIn, Resampler};

/// Everything is analysed at this rate: enough for onsets and pitch.
pub const RATE: u32 = 22_050;
const ONSET_FFT: usize = 1024;
const ONSET_HOP: usize = 256;
const CHROMA_FFT: usize = 8192;
const CHROMA_HOP: usize = 2048;
/// Fine pitch bins per semitone.
pub const FINE: usize = 10;
pub const FINE_BINS: usize = 12 * FINE;
/// Onset bands: quarter octaves from here up.
const LOWEST_BAND_HZ: f32 = 30.0;
const LOW_BAND_HZ: f32 = 200.0;
/// Pitch is read from peaks in this range; the bass profile from those below BASS_HZ.
const PITCH_HZ: (f32, f32) = (50.0, 5000.0);
const BASS_HZ: f32 = 160.0;
/// Band magnitudes are compressed as ln(1 + COMPRESSION * magnitude).
const COMPRESSION: f32 = 1000.0;
/// Peaks more than 60 dB below a frame's strongest are noise.
const PEAK_FLOOR: f32 = 1e-3;

/// The features of one song.
pub struct Features {
    /// Onset strength per onset frame.
    pub onset: Vec<f32>,
    /// The same, from the bands below 200 Hz only.
    pub low_onset: Vec<f32>,
    /// Per pitch frame: peak magnitude in each fine pitch bin (bin 0: C, A = 440 Hz).
    pub pitch: Vec<[f32; FINE_BINS]>,
    /// The same, from peaks below 160 Hz only.
    pub bass: Vec<[f32; FINE_BINS]>,
    /// Seconds of audio analysed.
    pub seconds: f64,
    /// The largest absolute sample.
    pub peak: f32,
}

impl Features {
    /// Onset frames per second.
    pub const ONSET_RATE: f64 = RATE as f64 / ONSET_HOP as f64;
}

/// A short-time spectrum: its window, FFT and scratch.
struct Spectrum {
    window: Vec<f32>,
    fft: Arc<dyn RealToComplex<f32>>,
    input: Vec<f32>,
    output: Vec<Complex<f32>>,
    /// Magnitudes, scaled so a full-scale sine peaks near 0.5.
    magnitude: Vec<f32>,
}

impl Spectrum {
    fn new(planner: &mut RealFftPlanner<f32>, size: usize) -> Self {
        let window: Vec<f32> =
            (0..size).map(|i| 0.5 - 0.5 * (std::f32::consts::TAU * i as f32 / size as f32).cos()).collect();
        let fft = planner.plan_fft_forward(size);
        let output = fft.make_output_vec();
        Spectrum { window, input: vec![0.0; size], magnitude: vec![0.0; output.len()], output, fft }
    }

    fn of(&mut self, frame: &[f32]) -> &[f32] {
        let scale = 1.0 / self.window.iter().sum::<f32>();
        for ((x, s), w) in self.input.iter_mut().zip(frame).zip(&self.window) {
            *x = s * w;
        }
        self.fft.process(&mut self.input, &mut self.output).expect("buffers sized by the plan");
        for (m, c) in self.magnitude.iter_mut().zip(&self.output) {
            *m = c.norm() * scale;
        }
        &self.magnitude
    }
}

/// Builds `Features` from mono blocks at any rate.
pub struct FeatureStream {
    resampler: Option<FftFixedIn<f32>>,
    /// Input not yet resampled.
    input: Vec<f32>,
    /// Audio at RATE from `buffer_start` on, not yet needed by every frame.
    buffer: Vec<f32>,
    buffer_start: usize,
    next_onset: usize,
    next_pitch: usize,
    onset_spectrum: Spectrum,
    pitch_spectrum: Spectrum,
    /// Onset band of each onset-FFT bin (None: below the lowest band).
    band_of_bin: Vec<Option<usize>>,
    bands: usize,
    low_bands: usize,
    previous_bands: Vec<f32>,
    current_bands: Vec<f32>,
    frames_in: u64,
    input_rate: u32,
    features: Features,
}

impl FeatureStream {
    pub fn new(input_rate: u32) -> Result<Self, String> {
        let resampler = match input_rate {
            RATE => None,
            rate => Some(
                FftFixedIn::new(rate as usize, RATE as usize, 2048, 2, 1)
                    .map_err(|e| format!("resampling {rate} Hz -> {RATE} Hz: {e}"))?,
            ),
        };
        let mut planner = RealFftPlanner::new();
        let bin_hz = RATE as f32 / ONSET_FFT as f32;
        let band_of_bin: Vec<Option<usize>> = (0..=ONSET_FFT / 2)
            .map(|k| {
                let hz = k as f32 * bin_hz;
                (hz >= LOWEST_BAND_HZ).then(|| (4.0 * (hz / LOWEST_BAND_HZ).log2()) as usize)
            })
            .collect();
        let bands = band_of_bin.iter().flatten().max().map_or(0, |b| b + 1);
        let low_bands = (4.0 * (LOW_BAND_HZ / LOWEST_BAND_HZ).log2()).ceil() as usize;
        Ok(FeatureStream {
            resampler,
            input: Vec::new(),
            buffer: Vec::new(),
            buffer_start: 0,
            next_onset: 0,
            next_pitch: 0,
            onset_spectrum: Spectrum::new(&mut planner, ONSET_FFT),
            pitch_spectrum: Spectrum::new(&mut planner, CHROMA_FFT),
            band_of_bin,
            bands,
            low_bands,
            previous_bands: vec![0.0; bands],
            current_bands: vec![0.0; bands],
            frames_in: 0,
            input_rate,
            features: Features {
                onset: Vec::new(),
                low_onset: Vec::new(),
                pitch: Vec::new(),
                bass: Vec::new(),
                seconds: 0.0,
                peak: 0.0,
            },
        })
    }

    /// Takes the next block of mono samples.
    pub fn push(&mut self, block: &[f32]) -> Result<(), String> {
        self.frames_in += block.len() as u64;
        let peak = block.iter().fold(self.features.peak, |p, x| p.max(x.abs()));
        // NaN compares false: a NaN sample makes the peak NaN, which the caller refuses.
        self.features.peak = if block.iter().all(|x| x.is_finite()) { peak } else { f32::NAN };
        match &mut self.resampler {
            None => self.buffer.extend_from_slice(block),
            Some(resampler) => {
                self.input.extend_from_slice(block);
                let mut used = 0;
                while self.input.len() - used >= resampler.input_frames_next() {
                    let n = resampler.input_frames_next();
                    let out = resampler.process(&[&self.input[used..used + n]], None).map_err(|e| e.to_string())?;
                    self.buffer.extend_from_slice(&out[0]);
                    used += n;
                }
                self.input.drain(..used);
            }
        }
        self.run_frames();
        Ok(())
    }

    /// The features of everything pushed.
    pub fn finish(mut self) -> Result<Features, String> {
        if let Some(resampler) = &mut self.resampler {
            if !self.input.is_empty() {
                let out = resampler.process_partial(Some(&[&self.input[..]]), None).map_err(|e| e.to_string())?;
                self.buffer.extend_from_slice(&out[0]);
            }
        }
        self.run_frames();
        self.features.seconds = self.frames_in as f64 / f64::from(self.input_rate);
        Ok(self.features)
    }

    /// Computes every frame the buffer holds, then drops the audio no frame needs.
    fn run_frames(&mut self) {
        let end = self.buffer_start + self.buffer.len();
        // Taken out for the while, so frames are read from it without a copy.
        let buffer = std::mem::take(&mut self.buffer);
        while self.next_onset * ONSET_HOP + ONSET_FFT <= end {
            let at = self.next_onset * ONSET_HOP - self.buffer_start;
            self.onset_frame(&buffer[at..at + ONSET_FFT]);
            self.next_onset += 1;
        }
        while self.next_pitch * CHROMA_HOP + CHROMA_FFT <= end {
            let at = self.next_pitch * CHROMA_HOP - self.buffer_start;
            self.pitch_frame(&buffer[at..at + CHROMA_FFT]);
            self.next_pitch += 1;
        }
        self.buffer = buffer;
        let keep_from = (self.next_onset * ONSET_HOP).min(self.next_pitch * CHROMA_HOP);
        let drop = keep_from.saturating_sub(self.buffer_start).min(self.buffer.len());
        self.buffer.drain(..drop);
        self.buffer_start += drop;
    }

    fn onset_frame(&mut self, frame: &[f32]) {
        let magnitude = self.onset_spectrum.of(frame);
        self.current_bands.fill(0.0);
        for (m, band) in magnitude.iter().zip(&self.band_of_bin) {
            if let Some(b) = band {
                self.current_bands[*b] += m;
            }
        }
        for b in &mut self.current_bands {
            *b = (COMPRESSION * *b).ln_1p();
        }
        let (mut all, mut low) = (0.0, 0.0);
        // The first frame has nothing before it to rise from.
        if self.next_onset > 0 {
            for b in 0..self.bands {
                let before = self.previous_bands[b.saturating_sub(1)..(b + 2).min(self.bands)]
                    .iter()
                    .fold(f32::MIN, |m, x| m.max(*x));
                let rise = (self.current_bands[b] - before).max(0.0);
                all += rise;
                if b < self.low_bands {
                    low += rise;
                }
            }
        }
        self.features.onset.push(all / self.bands as f32);
        self.features.low_onset.push(low / self.low_bands as f32);
        std::mem::swap(&mut self.previous_bands, &mut self.current_bands);
    }

    fn pitch_frame(&mut self, frame: &[f32]) {
        let magnitude = self.pitch_spectrum.of(frame);
        let bin_hz = RATE as f32 / CHROMA_FFT as f32;
        let first = (PITCH_HZ.0 / bin_hz) as usize;
        let last = ((PITCH_HZ.1 / bin_hz) as usize).min(magnitude.len() - 2);
        let strongest = magnitude[first..=last].iter().fold(0.0f32, |m, x| m.max(*x));
        let (mut pitch, mut bass) = ([0.0f32; FINE_BINS], [0.0f32; FINE_BINS]);
        if strongest > 0.0 {
            for k in first.max(1)..=last {
                let (a, b, c) = (magnitude[k - 1], magnitude[k], magnitude[k + 1]);
                if !(b > a && b >= c && b > PEAK_FLOOR * strongest) {
                    continue;
                }
                // Parabolic interpolation of the log magnitude: the peak's true place.
                let (la, lb, lc) = (a.max(1e-12).ln(), b.ln(), c.max(1e-12).ln());
                let curve = la - 2.0 * lb + lc;
                let delta = if curve < 0.0 { (0.5 * (la - lc) / curve).clamp(-0.5, 0.5) } else { 0.0 };
                let hz = (k as f32 + delta) * bin_hz;
                let height = (lb - 0.25 * (la - lc) * delta).exp();
                // Fine pitch bin, C = 0: MIDI 60 is C4.
                let fine = (12.0 * (hz / 440.0).log2() + 69.0) * FINE as f32;
                let fine = fine.rem_euclid(FINE_BINS as f32);
                let lower = fine.floor() as usize % FINE_BINS;
                let upper = (lower + 1) % FINE_BINS;
                let share = fine - fine.floor();
                for bins in std::iter::once(&mut pitch).chain((hz < BASS_HZ).then_some(&mut bass)) {
                    bins[lower] += height * (1.0 - share);
                    bins[upper] += height * share;
                }
            }
        }
        self.features.pitch.push(pitch);
        self.features.bass.push(bass);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushes `x` at `rate` in uneven blocks, as a decoder hands packets over.
    fn features(x: &[f32], rate: u32) -> Features {
        let mut stream = FeatureStream::new(rate).unwrap();
        for block in x.chunks(1151) {
            stream.push(block).unwrap();
        }
        stream.finish().unwrap()
    }

    #[test]
    fn a_tone_lands_in_its_pitch_class_at_any_input_rate() {
        for rate in [22_050, 44_100, 48_000] {
            // A3 = 220 Hz and E5 = 659.26 Hz, 3 s.
            let x: Vec<f32> = (0..3 * rate)
                .map(|i| {
                    let t = i as f32 / rate as f32;
                    0.3 * (std::f32::consts::TAU * 220.0 * t).sin() + 0.2 * (std::f32::consts::TAU * 659.26 * t).sin()
                })
                .collect();
            let f = features(&x, rate);
            assert!((f.seconds - 3.0).abs() < 1e-9);
            let frame = &f.pitch[f.pitch.len() / 2];
            let mut bins: Vec<usize> = (0..FINE_BINS).collect();
            bins.sort_by(|a, b| frame[*b].total_cmp(&frame[*a]));
            // A is class 9 (fine bin 90), E class 4 (fine bin 40); at most a fine bin off.
            let near = |bin: usize, want: usize| (bin as isize - want as isize).abs() <= 1;
            assert!(near(bins[0], 90) || near(bins[0], 40), "{rate} Hz: strongest fine bin {}", bins[0]);
            assert!(bins[..4].iter().any(|b| near(*b, 90)) && bins[..4].iter().any(|b| near(*b, 40)));
            // 220 Hz is above the bass range; nothing below 160 Hz sounds.
            assert!(f.bass[f.bass.len() / 2].iter().all(|v| *v == 0.0));
        }
    }

    #[test]
    fn onsets_peak_where_notes_start() {
        let rate = 44_100;
        // A 60 ms burst of a low and a high tone every half second.
        let x: Vec<f32> = (0..4 * rate)
            .map(|i| {
                let t = i as f32 / rate as f32;
                let since = t % 0.5;
                let env = if since < 0.06 { 1.0 - since / 0.06 } else { 0.0 };
                env * (0.5 * (std::f32::consts::TAU * 80.0 * t).sin()
                    + 0.3 * (std::f32::consts::TAU * 2000.0 * t).sin())
            })
            .collect();
        let f = features(&x, rate);
        let frames_per_note = Features::ONSET_RATE * 0.5;
        for note in 1..7 {
            // The onset frame whose window first holds the note (its start + a quarter window).
            let at = (note as f64 * frames_per_note) as usize;
            let around = &f.onset[at.saturating_sub(4)..at + 3];
            let between = &f.onset[at + 10..at + 30];
            let peak = around.iter().fold(0.0f32, |m, x| m.max(*x));
            assert!(
                peak > 10.0 * between.iter().fold(0.0f32, |m, x| m.max(*x)),
                "note {note}: {around:?} vs {between:?}"
            );
            let low_peak = f.low_onset[at.saturating_sub(4)..at + 3].iter().fold(0.0f32, |m, x| m.max(*x));
            assert!(low_peak > 0.0, "the 80 Hz part shows in the low band");
        }
    }
}

//! The demo model's weight-free latent decoder, the inverse of `MelEncoder`: so a demo
//! run makes audible audio with no download.
//!
//! latents -> normalised log-mels by the pseudo-inverse of the encoder's projection
//! (anchored at silence: directions the 64 channels do not see stay at the floor) ->
//! mel energies -> a power spectrum spread over each band's FFT bins -> magnitudes,
//! whose phase Griffin-Lim reconstructs on the encoder's own STFT grid (Hann window
//! of 2 hops, centred on each latent frame). The encoder hears only the mid signal,
//! so both channels carry it.

use std::sync::Arc;

use candle_core::{DType, Tensor};
use rand::{Rng, SeedableRng};
use realfft::num_complex::Complex;
use realfft::{ComplexToReal, RealFftPlanner, RealToComplex};

use super::decode::LatentDecoder;
use crate::codec::encode::{MelEncoder, CHANNELS, HOP, LOG_CENTER, LOG_FLOOR, LOG_SCALE, N_MELS, RATE, WIN};
use crate::codec::{LatentEncoder, StereoAudio};
use crate::{Error, Result};

/// Griffin-Lim iterations: the re-encoded latents stop improving noticeably by here.
const ITERATIONS: usize = 32;
/// Refinements of the power spectrum against the band energies.
const SPECTRUM_ITERATIONS: usize = 20;
/// Seeds the initial phases, so decoding is deterministic.
const PHASE_SEED: u64 = 0x6D65_6C64;

pub struct MelDecoder {
    encoder: MelEncoder,
    /// (N_MELS, CHANNELS) row-major: the projection's pseudo-inverse.
    pinv: Vec<f32>,
    /// The normalised log-mel of silence (every band at the floor).
    floor: f32,
    /// The normalised log-mel of a band holding a full-scale sine (power 1/4).
    full_scale: f32,
    /// The latent of silence: the projection of `floor` in every band.
    floor_latent: Vec<f32>,
    /// Per FFT bin, its bands `(band, weight)`, and the sum of its weights (0 outside
    /// the filter bank's range).
    bins: Vec<(Vec<(usize, f32)>, f32)>,
    forward: Arc<dyn RealToComplex<f32>>,
    inverse: Arc<dyn ComplexToReal<f32>>,
}

impl Default for MelDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl MelDecoder {
    pub fn new() -> Self {
        let encoder = MelEncoder::new();
        let p = encoder.projection();
        let pinv = pseudo_inverse(p, CHANNELS, N_MELS);
        let floor = (LOG_FLOOR.ln() - LOG_CENTER) / LOG_SCALE;
        let full_scale = ((0.25 + LOG_FLOOR).ln() - LOG_CENTER) / LOG_SCALE;
        let floor_latent = p.chunks_exact(N_MELS).map(|row| row.iter().sum::<f32>() * floor).collect();
        let mut bins = vec![(Vec::new(), 0.0f32); WIN / 2 + 1];
        for (m, filter) in encoder.filters().iter().enumerate() {
            for &(k, w) in filter {
                bins[k].0.push((m, w));
                bins[k].1 += w;
            }
        }
        let mut planner = RealFftPlanner::<f32>::new();
        Self {
            forward: planner.plan_fft_forward(WIN),
            inverse: planner.plan_fft_inverse(WIN),
            encoder,
            pinv,
            floor,
            full_scale,
            floor_latent,
            bins,
        }
    }

    /// STFT magnitudes `[T][WIN / 2 + 1]` whose frames the encoder maps to `latents`.
    fn magnitudes(&self, latents: &[f32]) -> Vec<Vec<f32>> {
        latents
            .chunks_exact(CHANNELS)
            .map(|z| {
                // Normalised log-mels, then band energies.
                let energy: Vec<f32> = self
                    .pinv
                    .chunks_exact(CHANNELS)
                    .map(|row| {
                        let m = self.floor
                            + row.iter().zip(z).zip(&self.floor_latent).map(|((w, z), f)| w * (z - f)).sum::<f32>();
                        // No band holds more than a full-scale sine's energy: latents
                        // past what any [-1, 1] audio encodes to are held there.
                        let m = m.clamp(self.floor, self.full_scale);
                        ((m * LOG_SCALE + LOG_CENTER).exp() - LOG_FLOOR).max(0.0)
                    })
                    .collect();
                self.power_spectrum(&energy).into_iter().map(f32::sqrt).collect()
            })
            .collect()
    }

    /// A power spectrum whose mel filter bank gives `energy`: each band's energy spread
    /// evenly over its bins, then refined by multiplicative updates (Lee and Seung's for
    /// a non-negative F p = e) so overlapping bands add up to their energies.
    fn power_spectrum(&self, energy: &[f32]) -> Vec<f32> {
        let filters = self.encoder.filters();
        let per_bin: Vec<f32> =
            filters.iter().zip(energy).map(|(f, e)| e / f.iter().map(|&(_, w)| w).sum::<f32>()).collect();
        let spread = |band_values: &[f32]| -> Vec<f32> {
            self.bins
                .iter()
                .map(|(bands, coverage)| match *coverage > 0.0 {
                    true => bands.iter().map(|&(m, w)| w * band_values[m]).sum::<f32>() / coverage,
                    false => 0.0,
                })
                .collect()
        };
        let mut p = spread(&per_bin);
        for _ in 0..SPECTRUM_ITERATIONS {
            let ratio: Vec<f32> = filters
                .iter()
                .zip(energy)
                .map(|(f, e)| {
                    let got: f32 = f.iter().map(|&(k, w)| w * p[k]).sum();
                    if got > 0.0 {
                        e / got
                    } else {
                        0.0
                    }
                })
                .collect();
            p.iter_mut().zip(spread(&ratio)).for_each(|(p, r)| *p *= r);
        }
        p
    }

    /// Frame i of the STFT grid starts at sample `i * HOP - HOP / 2` (centred on its
    /// latent frame, as the encoder frames it).
    fn frame_start(i: usize) -> isize {
        (i * HOP) as isize - (HOP / 2) as isize
    }

    fn stft(&self, x: &[f32], frames: usize) -> Vec<Vec<Complex<f32>>> {
        let window = self.encoder.window();
        let mut buf = self.forward.make_input_vec();
        (0..frames)
            .map(|i| {
                let s = Self::frame_start(i);
                for (j, b) in buf.iter_mut().enumerate() {
                    let n = s + j as isize;
                    *b = if n >= 0 && (n as usize) < x.len() { x[n as usize] * window[j] } else { 0.0 };
                }
                let mut spectrum = self.forward.make_output_vec();
                // Lengths match the plan, so the FFT cannot fail.
                let _ = self.forward.process(&mut buf, &mut spectrum);
                spectrum
            })
            .collect()
    }

    /// The least-squares inverse of `stft` (Griffin and Lim's): overlap-add of the
    /// windowed frames divided by the summed squared window.
    fn istft(&self, spectra: &[Vec<Complex<f32>>], len: usize) -> Vec<f32> {
        let window = self.encoder.window();
        let (mut out, mut norm) = (vec![0f32; len], vec![0f32; len]);
        let mut frame = self.inverse.make_output_vec();
        for (i, spectrum) in spectra.iter().enumerate() {
            let mut s = spectrum.clone();
            // A real signal's DC and Nyquist bins are real.
            let last = s.len() - 1;
            s[0].im = 0.0;
            s[last].im = 0.0;
            let _ = self.inverse.process(&mut s, &mut frame);
            let start = Self::frame_start(i);
            for (j, v) in frame.iter().enumerate() {
                let n = start + j as isize;
                if n >= 0 && (n as usize) < len {
                    out[n as usize] += window[j] * v / WIN as f32;
                    norm[n as usize] += window[j] * window[j];
                }
            }
        }
        out.iter().zip(&norm).map(|(o, n)| if *n > 1e-12 { o / n } else { 0.0 }).collect()
    }

    /// Mono audio of `latents.len() / CHANNELS * HOP` samples.
    fn griffin_lim(&self, latents: &[f32]) -> Vec<f32> {
        let mags = self.magnitudes(latents);
        let (frames, len) = (mags.len(), mags.len() * HOP);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(PHASE_SEED);
        let mut phases: Vec<Vec<Complex<f32>>> = mags
            .iter()
            .map(|m| m.iter().map(|_| Complex::from_polar(1.0, rng.random_range(0.0..std::f32::consts::TAU))).collect())
            .collect();
        let with_phase = |phases: &[Vec<Complex<f32>>]| -> Vec<Vec<Complex<f32>>> {
            mags.iter().zip(phases).map(|(m, p)| m.iter().zip(p).map(|(a, p)| p * *a).collect()).collect()
        };
        for _ in 0..ITERATIONS {
            let x = self.istft(&with_phase(&phases), len);
            phases = self
                .stft(&x, frames)
                .into_iter()
                .map(|s| {
                    s.into_iter().map(|c| if c.norm() > 0.0 { c / c.norm() } else { Complex::new(1.0, 0.0) }).collect()
                })
                .collect();
        }
        self.istft(&with_phase(&phases), len)
    }
}

/// The Moore-Penrose pseudo-inverse `(cols, rows)` of a full-row-rank `(rows, cols)`
/// matrix P (rows < cols): `P^T (P P^T)^-1`, by Cholesky in f64.
fn pseudo_inverse(p: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let at = |i: usize, j: usize| p[i * cols + j] as f64;
    // G = P P^T (rows x rows), then its Cholesky factor L (G = L L^T).
    let mut l = vec![0f64; rows * rows];
    for i in 0..rows {
        for j in 0..=i {
            let g: f64 = (0..cols).map(|k| at(i, k) * at(j, k)).sum();
            let s = g - (0..j).map(|k| l[i * rows + k] * l[j * rows + k]).sum::<f64>();
            l[i * rows + j] = if i == j { s.sqrt() } else { s / l[j * rows + j] };
        }
    }
    // Column c of P: solve G y = P[:, c]; row c of the pseudo-inverse is y^T.
    let mut out = vec![0f32; cols * rows];
    for c in 0..cols {
        let mut y: Vec<f64> = (0..rows).map(|i| at(i, c)).collect();
        for i in 0..rows {
            y[i] = (y[i] - (0..i).map(|k| l[i * rows + k] * y[k]).sum::<f64>()) / l[i * rows + i];
        }
        for i in (0..rows).rev() {
            y[i] = (y[i] - (i + 1..rows).map(|k| l[k * rows + i] * y[k]).sum::<f64>()) / l[i * rows + i];
        }
        for (i, v) in y.iter().enumerate() {
            out[c * rows + i] = *v as f32;
        }
    }
    out
}

impl LatentDecoder for MelDecoder {
    fn sample_rate(&self) -> u32 {
        RATE
    }

    fn frames_per_second(&self) -> f64 {
        self.encoder.frames_per_second()
    }

    fn latent_channels(&self) -> usize {
        CHANNELS
    }

    fn decode(&self, latents: &Tensor) -> Result<StereoAudio> {
        let (_, c) = latents.dims2()?;
        if c != CHANNELS {
            return Err(Error::Encoder(format!(
                "the mel decoder takes [frames, {CHANNELS}] latents, got {:?}",
                latents.dims()
            )));
        }
        let z: Vec<f32> = latents.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let mid = self.griffin_lim(&z);
        Ok(StereoAudio { sample_rate: RATE, left: mid.clone(), right: mid })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(f: f32) -> StereoAudio {
        let x: Vec<f32> =
            (0..2 * RATE as usize).map(|i| 0.5 * (std::f32::consts::TAU * f * i as f32 / RATE as f32).sin()).collect();
        StereoAudio { sample_rate: RATE, left: x.clone(), right: x }
    }

    /// The frequency of the largest bin of a Hann-windowed FFT over the middle second.
    fn dominant_hz(x: &[f32]) -> f32 {
        let n = RATE as usize;
        let start = (x.len() - n) / 2;
        let fft = RealFftPlanner::<f32>::new().plan_fft_forward(n);
        let mut buf: Vec<f32> =
            (0..n).map(|i| x[start + i] * (0.5 - 0.5 * (std::f32::consts::TAU * i as f32 / n as f32).cos())).collect();
        let mut spectrum = fft.make_output_vec();
        fft.process(&mut buf, &mut spectrum).unwrap();
        let k = (0..spectrum.len()).max_by(|&a, &b| spectrum[a].norm().total_cmp(&spectrum[b].norm())).unwrap();
        k as f32 * RATE as f32 / n as f32
    }

    fn rms(v: &[f32]) -> f32 {
        (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt()
    }

    #[test]
    fn pseudo_inverse_is_a_right_inverse() {
        let e = MelEncoder::new();
        let pinv = pseudo_inverse(e.projection(), CHANNELS, N_MELS);
        // P P+ = I (CHANNELS x CHANNELS).
        let mut worst = 0f32;
        for i in 0..CHANNELS {
            for j in 0..CHANNELS {
                let v: f32 = (0..N_MELS).map(|k| e.projection()[i * N_MELS + k] * pinv[k * CHANNELS + j]).sum();
                worst = worst.max((v - if i == j { 1.0 } else { 0.0 }).abs());
            }
        }
        println!("max |P P+ - I| = {worst:.2e}");
        assert!(worst < 1e-4);
    }

    /// rms(a - b) / rms(a) of two latents.
    fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
        let (a, b): (Vec<f32>, Vec<f32>) =
            (a.flatten_all().unwrap().to_vec1().unwrap(), b.flatten_all().unwrap().to_vec1().unwrap());
        let diff: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x - y).collect();
        rms(&diff) / rms(&a)
    }

    #[test]
    fn tones_decode_to_their_pitch_and_envelope() {
        let (enc, dec) = (MelEncoder::new(), MelDecoder::new());
        let mel = |f: f32| 2595.0 * (1.0 + f / 700.0).log10();
        // The filter bank's band spacing in mel: it resolves no finer pitch than this.
        let band = (mel(16_000.0) - mel(30.0)) / (N_MELS + 1) as f32;
        let tones = [220.0f32, 440.0, 2000.0];
        let latents: Vec<Tensor> = tones.iter().map(|&f| enc.encode(&tone(f)).unwrap()).collect();
        for (i, (&f, z)) in tones.iter().zip(&latents).enumerate() {
            let audio = dec.decode(z).unwrap();
            assert_eq!(audio.frames(), z.dim(0).unwrap() * HOP);
            assert_eq!(audio.left, audio.right);
            let got = dominant_hz(&audio.left);
            // The envelope: re-encoding the decoded audio gives back the latents, and
            // much closer than another tone's latents are.
            let back = enc.encode(&audio).unwrap();
            let rel = rel_err(z, &back);
            let other = rel_err(z, &latents[(i + 1) % tones.len()]);
            println!(
                "{f} Hz: dominant {got} Hz ({:.2} bands off), re-encoded latents rel rms error {rel:.3} (another tone's: {other:.3}), peak {:.3}",
                (mel(got) - mel(f)).abs() / band,
                audio.peak()
            );
            assert!((mel(got) - mel(f)).abs() <= band, "{f} Hz decoded as {got} Hz");
            assert!(rel < 0.2 && rel < other / 3.0, "{f} Hz: re-encoded latents differ by {rel}");
        }
    }

    #[test]
    fn silence_decodes_to_silence_and_decoding_is_deterministic() {
        let (enc, dec) = (MelEncoder::new(), MelDecoder::new());
        let silent = dec.decode(&crate::codec::encode::silence_latent(&enc, 10).unwrap()).unwrap();
        println!("silence peak {:.2e}", silent.peak());
        assert!(silent.peak() < 1e-3);
        let z = enc.encode(&tone(440.0)).unwrap();
        assert_eq!(dec.decode(&z).unwrap(), dec.decode(&z).unwrap());
        assert!(dec.decode(&Tensor::zeros((3, 8), DType::F32, &candle_core::Device::Cpu).unwrap()).is_err());
        // Latents far outside the encoder's range stay bounded: at most every band at
        // full scale (without the bound, exp of the log-mels overflows).
        let wild = (Tensor::randn(0f32, 1.0, (10, CHANNELS), &candle_core::Device::Cpu).unwrap() * 20.0).unwrap();
        let peak = dec.decode(&wild).unwrap().peak();
        println!("latents of std 20 decode to peak {peak:.2}");
        assert!(peak.is_finite() && peak < N_MELS as f32, "peak {peak}");
    }
}

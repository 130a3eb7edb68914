//! Latent encoders: audio -> (T, C) latents at the model's latent rate. The real
//! ACE-Step VAE encoder implements the same trait; `MelEncoder` is the weight-free
//! encoder of the built-in demo model.

use std::sync::Arc;

use candle_core::{Device, Tensor};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use realfft::{RealFftPlanner, RealToComplex};

use super::StereoAudio;
use crate::cancel::Cancel;
use crate::{Error, Result};

pub trait LatentEncoder: Send + Sync {
    /// Stable id including every setting; it enters the cache key.
    fn id(&self) -> String;
    /// The audio rate the encoder takes (48 kHz for ACE-Step).
    fn sample_rate(&self) -> u32;
    /// Latent frames per second (25 for ACE-Step: hop 1920 at 48 kHz).
    fn frames_per_second(&self) -> f64;
    /// Latent channels (64 for ACE-Step).
    fn latent_channels(&self) -> usize;
    /// Encodes audio at `sample_rate()` to (T, latent_channels) f32 on the CPU,
    /// T = floor(seconds * frames_per_second).
    fn encode(&self, audio: &StereoAudio) -> Result<Tensor> {
        self.encode_cancellable(audio, &Cancel::never(), &mut |_, _| {})
    }
    /// As `encode`, but `Err(Error::Cancelled)` between two chunks (tiles) once
    /// `cancel` is set: a long song must not hold up a stop. After each chunk,
    /// `progress(seconds encoded, seconds of audio)`.
    fn encode_cancellable(
        &self,
        audio: &StereoAudio,
        cancel: &Cancel,
        progress: &mut dyn FnMut(f64, f64),
    ) -> Result<Tensor>;
}

/// Samples of audio per latent frame.
pub fn hop(encoder: &dyn LatentEncoder) -> usize {
    (encoder.sample_rate() as f64 / encoder.frames_per_second()).round() as usize
}

/// The encoder's latent for `frames` frames of silence, (frames, C): ACE-Step's
/// context latents start from it.
pub fn silence_latent(encoder: &dyn LatentEncoder, frames: usize) -> Result<Tensor> {
    encoder.encode(&StereoAudio::silence(encoder.sample_rate(), frames * hop(encoder)))
}

/// Log-mel features of the mid signal, 25 frames a second, mixed to 64 channels
/// by a fixed seeded Gaussian projection. Deterministic and weight-free; values
/// are O(1): log-mels are shifted and scaled so the floor sits near -1 and loud
/// bands near +1.5, and the projection keeps that scale.
pub struct MelEncoder {
    fft: Arc<dyn RealToComplex<f32>>,
    window: Vec<f32>,
    /// (n_mels, bins) triangular filters, row-major.
    filters: Vec<Vec<(usize, f32)>>,
    /// (channels, n_mels) row-major.
    projection: Vec<f32>,
}

pub(crate) const RATE: u32 = 48_000;
pub(crate) const HOP: usize = 1920;
pub(crate) const WIN: usize = 2 * HOP;
pub(crate) const N_MELS: usize = 96;
pub(crate) const CHANNELS: usize = 64;
const SEED: u64 = 0x05_71_4A_70;
const F_MIN: f64 = 30.0;
const F_MAX: f64 = 16_000.0;
/// log(power) is mapped by (x - LOG_CENTER) / LOG_SCALE.
pub(crate) const LOG_CENTER: f32 = -10.0;
pub(crate) const LOG_SCALE: f32 = 4.0;
pub(crate) const LOG_FLOOR: f32 = 1e-6;
/// Frames between two looks at the cancel token (one second of audio).
const CANCEL_EVERY: usize = 25;

fn hz_to_mel(f: f64) -> f64 {
    2595.0 * (1.0 + f / 700.0).log10()
}

fn mel_to_hz(m: f64) -> f64 {
    700.0 * (10f64.powf(m / 2595.0) - 1.0)
}

impl Default for MelEncoder {
    fn default() -> Self {
        Self::new()
    }
}

impl MelEncoder {
    pub fn new() -> Self {
        let fft = RealFftPlanner::<f32>::new().plan_fft_forward(WIN);
        // Hann window, scaled so a full-scale sine peaks at power 0.25.
        let hann: Vec<f32> =
            (0..WIN).map(|i| 0.5 - 0.5 * (2.0 * std::f32::consts::PI * i as f32 / WIN as f32).cos()).collect();
        let sum: f32 = hann.iter().sum();
        let window = hann.iter().map(|w| w / sum).collect();

        let bins = WIN / 2 + 1;
        let bin_hz = RATE as f64 / WIN as f64;
        let (lo, hi) = (hz_to_mel(F_MIN), hz_to_mel(F_MAX));
        let edges: Vec<f64> =
            (0..N_MELS + 2).map(|i| mel_to_hz(lo + (hi - lo) * i as f64 / (N_MELS + 1) as f64)).collect();
        let filters = (0..N_MELS)
            .map(|m| {
                let (a, b, c) = (edges[m], edges[m + 1], edges[m + 2]);
                (0..bins)
                    .filter_map(|k| {
                        let f = k as f64 * bin_hz;
                        let w = if f <= a || f >= c {
                            0.0
                        } else if f <= b {
                            (f - a) / (b - a)
                        } else {
                            (c - f) / (c - b)
                        };
                        (w > 0.0).then_some((k, w as f32))
                    })
                    .collect()
            })
            .collect();

        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(SEED);
        let scale = 1.0 / (N_MELS as f32).sqrt();
        let projection = (0..CHANNELS * N_MELS)
            .map(|_| scale * <StandardNormal as Distribution<f32>>::sample(&StandardNormal, &mut rng))
            .collect();
        Self { fft, window, filters, projection }
    }

    /// The analysis window (Hann, summing to 1), `WIN` long.
    pub(crate) fn window(&self) -> &[f32] {
        &self.window
    }

    /// Per mel band, its FFT bins and triangular weights.
    pub(crate) fn filters(&self) -> &[Vec<(usize, f32)>] {
        &self.filters
    }

    /// The (channels, n_mels) row-major projection of normalised log-mels to latents.
    pub(crate) fn projection(&self) -> &[f32] {
        &self.projection
    }

    /// Normalised log-mel energies of the frame centred on `centre`.
    fn log_mel(
        &self,
        mid: &[f32],
        centre: usize,
        spectrum: &mut [realfft::num_complex::Complex<f32>],
        frame: &mut [f32],
        out: &mut [f32],
    ) {
        for (i, (x, w)) in frame.iter_mut().zip(&self.window).enumerate() {
            let j = (centre + i).checked_sub(WIN / 2);
            *x = j.and_then(|j| mid.get(j)).map_or(0.0, |s| s * w);
        }
        // Lengths match the plan, so the FFT cannot fail.
        let _ = self.fft.process(frame, spectrum);
        for (o, filter) in out.iter_mut().zip(&self.filters) {
            let e: f32 = filter.iter().map(|&(k, w)| w * spectrum[k].norm_sqr()).sum();
            *o = ((e + LOG_FLOOR).ln() - LOG_CENTER) / LOG_SCALE;
        }
    }
}

impl LatentEncoder for MelEncoder {
    fn id(&self) -> String {
        format!("mel-demo-v1:rate{RATE}:hop{HOP}:win{WIN}:mels{N_MELS}:{F_MIN}-{F_MAX}Hz:ch{CHANNELS}:seed{SEED}")
    }

    fn sample_rate(&self) -> u32 {
        RATE
    }

    fn frames_per_second(&self) -> f64 {
        RATE as f64 / HOP as f64
    }

    fn latent_channels(&self) -> usize {
        CHANNELS
    }

    fn encode_cancellable(
        &self,
        audio: &StereoAudio,
        cancel: &Cancel,
        progress: &mut dyn FnMut(f64, f64),
    ) -> Result<Tensor> {
        if audio.sample_rate != RATE {
            return Err(Error::Encoder(format!("mel encoder takes {RATE} Hz audio, got {} Hz", audio.sample_rate)));
        }
        let mid: Vec<f32> = audio.left.iter().zip(&audio.right).map(|(l, r)| 0.5 * (l + r)).collect();
        let t = mid.len() / HOP;
        let mut frame = self.fft.make_input_vec();
        let mut spectrum = self.fft.make_output_vec();
        let mut mel = vec![0.0f32; N_MELS];
        let mut latents = Vec::with_capacity(t * CHANNELS);
        for i in 0..t {
            if i % CANCEL_EVERY == 0 {
                cancel.check()?;
                progress(i as f64 / self.frames_per_second(), t as f64 / self.frames_per_second());
            }
            self.log_mel(&mid, i * HOP + HOP / 2, &mut spectrum, &mut frame, &mut mel);
            latents.extend(
                self.projection.chunks_exact(N_MELS).map(|row| row.iter().zip(&mel).map(|(w, m)| w * m).sum::<f32>()),
            );
        }
        progress(t as f64 / self.frames_per_second(), t as f64 / self.frames_per_second());
        Ok(Tensor::from_vec(latents, (t, CHANNELS), &Device::Cpu)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::testutil::sine;

    fn stereo(x: Vec<f32>) -> StereoAudio {
        StereoAudio { sample_rate: RATE, left: x.clone(), right: x }
    }

    #[test]
    fn shape_rate_and_scale() {
        let e = MelEncoder::new();
        assert_eq!(e.frames_per_second(), 25.0);
        assert_eq!(hop(&e), 1920);
        let z = e.encode(&stereo(sine(440.0, 0.5, RATE, RATE as usize * 2 + 100))).unwrap();
        assert_eq!(z.dims(), [50, 64]);
        let v: Vec<f32> = z.flatten_all().unwrap().to_vec1().unwrap();
        let rms = (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
        assert!(rms > 0.2 && rms < 3.0, "rms {rms}");
        assert!(v.iter().all(|x| x.is_finite() && x.abs() < 10.0));
    }

    #[test]
    fn deterministic_and_sensitive_to_content() {
        let a = MelEncoder::new().encode(&stereo(sine(440.0, 0.5, RATE, RATE as usize))).unwrap();
        let b = MelEncoder::new().encode(&stereo(sine(440.0, 0.5, RATE, RATE as usize))).unwrap();
        let c = MelEncoder::new().encode(&stereo(sine(2000.0, 0.5, RATE, RATE as usize))).unwrap();
        let diff =
            |x: &Tensor, y: &Tensor| (x - y).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert_eq!(diff(&a, &b), 0.0);
        assert!(diff(&a, &c) > 0.5);
    }

    #[test]
    fn silence_latent_is_constant_per_frame() {
        let e = MelEncoder::new();
        let s = silence_latent(&e, 10).unwrap();
        assert_eq!(s.dims(), [10, 64]);
        let first = s.narrow(0, 0, 1).unwrap();
        let spread = s.broadcast_sub(&first).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert_eq!(spread, 0.0);
    }

    #[test]
    fn demo_clip_latents_are_order_one() {
        let e = MelEncoder::new();
        for (seed, clip) in crate::data::synth::CLIPS.iter().enumerate() {
            let [left, right] = clip.render(seed as u64);
            let z = e.encode(&StereoAudio { sample_rate: RATE, left, right }).unwrap();
            let v: Vec<f32> = z.flatten_all().unwrap().to_vec1().unwrap();
            let mean = v.iter().sum::<f32>() / v.len() as f32;
            let std = (v.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / v.len() as f32).sqrt();
            let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert!(
                mean.abs() < 0.5 && (0.3..1.5).contains(&std) && max < 6.0,
                "{}: mean {mean} std {std} max {max}",
                clip.name
            );
        }
    }

    #[test]
    fn a_cancelled_encode_gives_up_at_its_first_chunk() {
        let cancel = Cancel::default();
        cancel.cancel();
        let a = stereo(sine(440.0, 0.5, RATE, RATE as usize * 30));
        let r = MelEncoder::new().encode_cancellable(&a, &cancel, &mut |_, _| {});
        assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
    }

    #[test]
    fn wrong_rate_is_an_error() {
        let a = StereoAudio::silence(44_100, 44_100);
        assert!(MelEncoder::new().encode(&a).is_err());
    }

    #[test]
    fn ten_seconds_encode_to_250_frames() {
        let e = MelEncoder::new();
        let a = stereo(sine(440.0, 0.5, RATE, RATE as usize * 10));
        let t = std::time::Instant::now();
        let z = e.encode(&a).unwrap();
        // Speed is the benches' to measure (these machines are shared): only printed here.
        println!("10 s encoded in {:?}", t.elapsed());
        assert_eq!(z.dims(), [250, 64]);
    }
}

//! Generation benchmarks at full ACE-Step size with random weights: a 30 s song
//! (8 turbo steps on the 24-layer DiT, then the full-size VAE decode), and the memory a
//! preview adds to a full-size training run.
//!
//! As for the training presets, one call measures one configuration in its own
//! process: peak RSS (getrusage) is process-wide and never goes down.

use std::path::Path;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use super::{median, random_batch, train_step, trainer, BenchSpec};
use crate::codec::decode::VaeDecoder;
use crate::codec::vae::{VaeConfig, VAE_WEIGHTS};
use crate::codec::LatentDecoder;
use crate::generate::sampler::{noise, sample, timesteps, Conditions};
use crate::generate::song::{DEFAULT_SHIFT, TURBO_STEPS};
use crate::lora::LoraMode;
use crate::model::{DecoderWeights, DitModel, LinearAdapter};
use crate::tensor_io::save_tensors;
use crate::train::step::Trainer;
use crate::{heap, metrics, Result};

/// ACE-Step 1.5's VAE (`vae/config.json`): hop 1920 at 48 kHz, decoder width 128.
const ACE_STEP_VAE_CONFIG: &str = r#"{"encoder_hidden_size": 128, "downsampling_ratios": [2, 4, 4, 6, 10],
    "channel_multiples": [1, 2, 4, 8, 16], "decoder_channels": 128, "decoder_input_channels": 64,
    "audio_channels": 2, "sampling_rate": 48000}"#;

/// What a generation bench measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GenerationReport {
    pub preset: String,
    pub device: String,
    pub frames: usize,
    pub layers: usize,
    pub encoder_len: usize,
    pub steps: usize,
    /// Seconds of each sampling step (one DiT forward and the Euler update).
    pub step_times_s: Vec<f64>,
    pub median_s_per_step: f64,
    /// All sampling steps.
    pub sampling_s: f64,
    /// The VAE decode of the sampled latents.
    pub decode_s: f64,
    /// RSS once the DiT and the VAE decoder are loaded, before sampling.
    pub model_rss_bytes: u64,
    /// The process's peak RSS after sampling, and after decoding (getrusage).
    pub sampling_peak_rss_bytes: u64,
    pub peak_rss_bytes: u64,
    /// Peak live heap above the loaded models during sampling and during decoding.
    pub sampling_heap_bytes: Option<u64>,
    pub decode_heap_bytes: Option<u64>,
}

/// A full-size VAE (ACE-Step's config) with seeded random weights, written to `dir`
/// as a model folder's `vae/` (config.json + plain `weight` tensors, decoder only).
pub fn write_random_vae(dir: &Path, seed: u64) -> Result<VaeConfig> {
    let cfg: VaeConfig = serde_json::from_str(ACE_STEP_VAE_CONFIG).expect("the constant parses");
    std::fs::create_dir_all(dir).map_err(|e| crate::Error::io(dir, e))?;
    std::fs::write(dir.join("config.json"), ACE_STEP_VAE_CONFIG).map_err(|e| crate::Error::io(dir, e))?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut tensors = std::collections::HashMap::new();
    let mut conv = |name: String, shape: [usize; 3], fan_in: usize, bias: Option<usize>| -> Result<()> {
        let std = (fan_in as f32).sqrt().recip();
        let n = shape.iter().product();
        let v: Vec<f32> =
            (0..n).map(|_| std * <StandardNormal as Distribution<f32>>::sample(&StandardNormal, &mut rng)).collect();
        tensors.insert(format!("{name}.weight"), Tensor::from_vec(v, shape.to_vec(), &Device::Cpu)?);
        if let Some(c) = bias {
            tensors.insert(format!("{name}.bias"), Tensor::zeros(c, DType::F32, &Device::Cpu)?);
        }
        Ok(())
    };
    let mut snakes = Vec::new();
    let h = cfg.decoder_channels;
    let mut mult = vec![1];
    mult.extend(&cfg.channel_multiples);
    let n = cfg.downsampling_ratios.len();
    let top = h * mult[n];
    conv("decoder.conv1".into(), [top, cfg.latent_channels(), 7], cfg.latent_channels() * 7, Some(top))?;
    for (i, &s) in cfg.downsampling_ratios.iter().rev().enumerate() {
        let (cin, cout) = (h * mult[n - i], h * mult[n - i - 1]);
        let block = format!("decoder.block.{i}");
        snakes.push((format!("{block}.snake1"), cin));
        conv(format!("{block}.conv_t1"), [cin, cout, 2 * s], cin * 2, Some(cout))?;
        for j in 1..=3 {
            let unit = format!("{block}.res_unit{j}");
            snakes.push((format!("{unit}.snake1"), cout));
            snakes.push((format!("{unit}.snake2"), cout));
            conv(format!("{unit}.conv1"), [cout, cout, 7], cout * 7, Some(cout))?;
            conv(format!("{unit}.conv2"), [cout, cout, 1], cout, Some(cout))?;
        }
    }
    snakes.push(("decoder.snake1".into(), h));
    conv("decoder.conv2".into(), [cfg.audio_channels, h, 7], h * 7, None)?;
    // Snake alpha = beta = 0 (log scale): x + sin(x)^2.
    for (name, c) in snakes {
        for p in ["alpha", "beta"] {
            tensors.insert(format!("{name}.{p}"), Tensor::zeros((1, c, 1), DType::F32, &Device::Cpu)?);
        }
    }
    save_tensors(&tensors, &dir.join(VAE_WEIGHTS))?;
    Ok(cfg)
}

/// Seeded N(0, 1) `[1, a, b]`.
fn randn(seed: u64, a: usize, b: usize) -> Result<Tensor> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let v: Vec<f32> = (0..a * b).map(|_| StandardNormal.sample(&mut rng)).collect();
    Ok(Tensor::from_vec(v, (1, a, b), &Device::Cpu)?)
}

/// Random conditions of `spec`'s shapes.
fn conditions(spec: &BenchSpec, frames: usize) -> Result<Conditions> {
    let cfg = &spec.config;
    Ok(Conditions {
        context_latents: randn(5, frames, cfg.context_channels())?,
        encoder_hidden_states: randn(6, spec.encoder_len, cfg.encoder_hidden_size)?,
    })
}

/// 8 turbo steps of `frames` latent frames with `model` (and `lora`), then the decode:
/// the step times and the two durations, with the heap peaks of each phase.
struct Song {
    step_times_s: Vec<f64>,
    sampling_s: f64,
    decode_s: f64,
    sampling_peak_rss: u64,
    sampling_heap: Option<u64>,
    decode_heap: Option<u64>,
}

fn make_song(
    model: &DitModel,
    lora: Option<&dyn LinearAdapter>,
    decoder: &VaeDecoder,
    spec: &BenchSpec,
    frames: usize,
) -> Result<Song> {
    let cond = conditions(spec, frames)?;
    let x = noise(7, frames, spec.config.audio_acoustic_hidden_dim, &Device::Cpu)?;
    let schedule = timesteps(TURBO_STEPS, DEFAULT_SHIFT)?;
    let heap_base = heap::live_bytes();
    heap::reset_peak();
    let start = Instant::now();
    let mut last = start;
    let mut step_times_s = Vec::new();
    let latents = sample(model, lora, &x, &cond, &schedule, None, |k, _| {
        if k > 0 {
            step_times_s.push(last.elapsed().as_secs_f64());
            last = Instant::now();
        }
        Ok(())
    })?;
    step_times_s.push(last.elapsed().as_secs_f64());
    let sampling_s = start.elapsed().as_secs_f64();
    let sampling_peak_rss = metrics::peak_rss_bytes().unwrap_or(0);
    let sampling_heap = heap_base.zip(heap::peak_bytes()).map(|(b, p)| p.saturating_sub(b));
    drop(cond);

    let heap_base = heap::live_bytes();
    heap::reset_peak();
    let start = Instant::now();
    let audio = decoder.decode(&latents.squeeze(0)?)?;
    let decode_s = start.elapsed().as_secs_f64();
    let decode_heap = heap_base.zip(heap::peak_bytes()).map(|(b, p)| p.saturating_sub(b));
    drop(audio);
    Ok(Song { step_times_s, sampling_s, decode_s, sampling_peak_rss, sampling_heap, decode_heap })
}

/// A 30 s song at full size on the CPU: `spec`'s DiT with seeded random weights
/// (f32), 8 turbo steps, then the full-size VAE decode (random weights, written to a
/// temporary folder and loaded as a model folder's `vae/` is).
pub fn run_generation(name: &str, spec: &BenchSpec) -> Result<GenerationReport> {
    let device = Device::Cpu;
    let cfg = &spec.config;
    let weights = DecoderWeights::random(cfg, 0xBE_0C4, 0.02, DType::F32, &device)?;
    let model = DitModel::new(cfg, &weights)?;
    drop(weights);
    let vae_dir = tempfile::tempdir().map_err(|e| crate::Error::io(std::env::temp_dir(), e))?;
    write_random_vae(vae_dir.path(), 9)?;
    let decoder = VaeDecoder::from_dir(vae_dir.path(), &device)?;
    let model_rss = metrics::process_rss_bytes().unwrap_or(0);

    let song = make_song(&model, None, &decoder, spec, spec.frames)?;
    Ok(GenerationReport {
        preset: name.to_string(),
        device: "cpu".into(),
        frames: spec.frames,
        layers: cfg.num_hidden_layers,
        encoder_len: spec.encoder_len,
        steps: song.step_times_s.len(),
        median_s_per_step: median(&song.step_times_s),
        step_times_s: song.step_times_s,
        sampling_s: song.sampling_s,
        decode_s: song.decode_s,
        model_rss_bytes: model_rss,
        sampling_peak_rss_bytes: song.sampling_peak_rss,
        peak_rss_bytes: metrics::peak_rss_bytes().unwrap_or(0),
        sampling_heap_bytes: song.sampling_heap,
        decode_heap_bytes: song.decode_heap,
    })
}

/// What a preview adds to a training run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreviewMemoryReport {
    pub preset: String,
    pub frames: usize,
    pub preview_frames: usize,
    pub layers: usize,
    pub gradient_checkpointing: bool,
    pub training_steps: usize,
    /// Median seconds of the training steps.
    pub median_s_per_step: f64,
    /// The process's peak RSS after the training steps (before the VAE is loaded).
    pub training_peak_rss_bytes: u64,
    /// RSS once the preview's VAE decoder is loaded.
    pub decoder_loaded_rss_bytes: u64,
    /// The peak after a preview (and one more training step).
    pub peak_rss_bytes: u64,
    /// `peak_rss_bytes - training_peak_rss_bytes`: what previews add to the run's peak.
    pub preview_extra_bytes: u64,
    /// Live heap peaks above the state before each phase: a training step, the
    /// preview's sampling, its decode.
    pub training_heap_bytes: Option<u64>,
    pub preview_sampling_heap_bytes: Option<u64>,
    pub preview_decode_heap_bytes: Option<u64>,
    pub preview_sampling_s: f64,
    pub preview_decode_s: f64,
}

/// A full-size training run with a preview in between: `steps` training steps as the
/// training bench takes them (on `spec`, f32 CPU), then the full-size VAE decoder is
/// loaded and a preview of `preview_frames` is made with the adapter in training, then
/// one more training step. The preview's cost is the peak above the training peak.
pub fn run_training_preview(
    name: &str,
    spec: &BenchSpec,
    checkpointing: bool,
    steps: usize,
    preview_frames: usize,
) -> Result<PreviewMemoryReport> {
    let device = Device::Cpu;
    let cfg = &spec.config;
    let weights = DecoderWeights::random(cfg, 0xBE_0C4, 0.02, DType::F32, &device)?;
    let model = DitModel::new(cfg, &weights)?;
    drop(weights);
    let mut trainer = trainer(spec, model, checkpointing)?;
    let batch = random_batch(spec, &device)?;
    let heap_base = heap::live_bytes();
    heap::reset_peak();
    let timed_step = |trainer: &mut Trainer| -> Result<f64> {
        let start = Instant::now();
        train_step(trainer, &batch)?;
        Ok(start.elapsed().as_secs_f64())
    };
    let times = (0..steps.max(1)).map(|_| timed_step(&mut trainer)).collect::<Result<Vec<_>>>()?;
    let training_peak = metrics::peak_rss_bytes().unwrap_or(0);
    let training_heap = heap_base.zip(heap::peak_bytes()).map(|(b, p)| p.saturating_sub(b));

    // The preview: the run's model and adapter (strength 1), the decoder loaded for it.
    let vae_dir = tempfile::tempdir().map_err(|e| crate::Error::io(std::env::temp_dir(), e))?;
    write_random_vae(vae_dir.path(), 9)?;
    let decoder = VaeDecoder::from_dir(vae_dir.path(), &device)?;
    let decoder_loaded = metrics::process_rss_bytes().unwrap_or(0);
    let lora = trainer.adapter.ctx(LoraMode::Eval, false);
    let song = make_song(&trainer.model, Some(&lora), &decoder, spec, preview_frames)?;
    timed_step(&mut trainer)?;
    let peak = metrics::peak_rss_bytes().unwrap_or(0);
    Ok(PreviewMemoryReport {
        preset: name.to_string(),
        frames: spec.frames,
        preview_frames,
        layers: cfg.num_hidden_layers,
        gradient_checkpointing: checkpointing,
        training_steps: times.len(),
        median_s_per_step: median(&times),
        training_peak_rss_bytes: training_peak,
        decoder_loaded_rss_bytes: decoder_loaded,
        peak_rss_bytes: peak,
        preview_extra_bytes: peak.saturating_sub(training_peak),
        training_heap_bytes: training_heap,
        preview_sampling_heap_bytes: song.sampling_heap,
        preview_decode_heap_bytes: song.decode_heap,
        preview_sampling_s: song.sampling_s,
        preview_decode_s: song.decode_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_vae_loads_as_a_model_folder_vae() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = write_random_vae(dir.path(), 1).unwrap();
        assert_eq!((cfg.hop(), cfg.latent_channels()), (1920, 64));
        let decoder = VaeDecoder::from_dir(dir.path(), &Device::Cpu).unwrap();
        let audio = decoder.decode(&Tensor::ones((2, 64), DType::F32, &Device::Cpu).unwrap()).unwrap();
        assert_eq!((audio.sample_rate, audio.frames()), (48_000, 2 * 1920));
        assert!(audio.left.iter().all(|x| x.is_finite()));
    }
}

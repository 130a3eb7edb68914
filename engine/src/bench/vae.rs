//! `ostinato bench --preset vae-*`: the VAE's encode (audio -> posterior) and decode
//! (latents -> audio) at ACE-Step's real VAE config with seeded random weights, timed,
//! with the memory above the weights and the FLOP rate.
//!
//! As for the DiT presets, one process measures one configuration (peak RSS is
//! process-wide); `bench/interleave.py` alternates processes.

use std::time::Instant;

use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::cancel::Cancel;
use crate::codec::vae::{OobleckDecoder, OobleckEncoder, VaeConfig, TILE_FRAMES};
use crate::kernels::conv_profile;
pub use crate::kernels::conv_profile::LayerTime;
use crate::kernels::conv_tile::Micro;
use crate::tensor_io::RandomTensors;
use crate::{heap, metrics, Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VaePreset {
    /// Encode 30 s of stereo 48 kHz audio.
    Encode30s,
    /// Encode a 4-minute song.
    Encode240s,
    /// Decode 750 latent frames (30 s).
    Decode30s,
    /// Decode 6000 latent frames (240 s).
    Decode240s,
}

impl VaePreset {
    pub const ALL: [VaePreset; 4] =
        [VaePreset::Encode30s, VaePreset::Encode240s, VaePreset::Decode30s, VaePreset::Decode240s];

    pub fn name(self) -> &'static str {
        match self {
            VaePreset::Encode30s => "vae-encode-30s",
            VaePreset::Encode240s => "vae-encode-240s",
            VaePreset::Decode30s => "vae-decode-30s",
            VaePreset::Decode240s => "vae-decode-240s",
        }
    }

    pub fn seconds(self) -> usize {
        match self {
            VaePreset::Encode30s | VaePreset::Decode30s => 30,
            VaePreset::Encode240s | VaePreset::Decode240s => 240,
        }
    }

    pub fn encodes(self) -> bool {
        matches!(self, VaePreset::Encode30s | VaePreset::Encode240s)
    }
}

/// ACE-Step 1.5's `vae/config.json`.
pub fn ace_step_vae_config() -> VaeConfig {
    VaeConfig {
        encoder_hidden_size: 128,
        downsampling_ratios: vec![2, 4, 4, 6, 10],
        channel_multiples: vec![1, 2, 4, 8, 16],
        decoder_channels: 128,
        decoder_input_channels: 64,
        audio_channels: 2,
        sampling_rate: 48_000,
    }
}

/// `2 cin cout k n_out`: the multiply-adds of one conv, counted as two FLOPs.
fn conv_flops(cin: usize, cout: usize, k: usize, n_out: usize) -> f64 {
    2.0 * (cin * cout * k) as f64 * n_out as f64
}

/// The three residual units of one stage: k7 and 1x1 convs at `c` channels, `n` samples.
fn residual_flops(c: usize, n: usize) -> f64 {
    3.0 * (conv_flops(c, c, 7, n) + conv_flops(c, c, 1, n))
}

/// Convolution FLOPs of one untiled encode of `samples` samples (Snake not counted).
pub fn encoder_flops(cfg: &VaeConfig, samples: usize) -> f64 {
    let h = cfg.encoder_hidden_size;
    let mut n = samples;
    let mut c = h;
    let mut flops = conv_flops(cfg.audio_channels, h, 7, n);
    for (&s, &m) in cfg.downsampling_ratios.iter().zip(&cfg.channel_multiples) {
        flops += residual_flops(c, n);
        n /= s;
        flops += conv_flops(c, h * m, 2 * s, n);
        c = h * m;
    }
    flops + conv_flops(c, h, 3, n)
}

/// Convolution FLOPs of one untiled decode of `frames` latent frames.
pub fn decoder_flops(cfg: &VaeConfig, frames: usize) -> f64 {
    let h = cfg.decoder_channels;
    let mut n = frames;
    let mut c = h * cfg.channel_multiples.last().copied().unwrap_or(1);
    let mut flops = conv_flops(cfg.latent_channels(), c, 7, n);
    let outs = cfg.channel_multiples.iter().rev().skip(1).chain([&1]).map(|m| h * m);
    for (&s, cout) in cfg.downsampling_ratios.iter().rev().zip(outs) {
        flops += conv_flops(c, cout, 2 * s, n); // each input sample meets all k taps
        n *= s;
        flops += residual_flops(cout, n);
        c = cout;
    }
    flops + conv_flops(c, cfg.audio_channels, 7, n)
}

/// What [`run_vae`] measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VaeBenchReport {
    pub preset: String,
    pub device: String,
    pub threads: usize,
    pub seconds_of_audio: usize,
    /// Latent frames per tile (plus the receptive field's overlap on each side).
    pub tile_frames: usize,
    pub warmup: usize,
    pub runs_s: Vec<f64>,
    /// Median seconds of one pass (named as the DiT report's, for `bench/interleave.py`).
    pub median_s_per_step: f64,
    /// Convolution FLOPs of the untiled pass (the tiles' overlap is extra work, not counted).
    pub gflop: f64,
    pub gflop_per_s: f64,
    /// CPU seconds (all threads) per timed pass, median; with `gflop` the rate per
    /// busy core, which a loaded machine does not hide (spinning threads count too).
    pub cpu_s_per_step: Option<f64>,
    /// `gflop / cpu_s_per_step`.
    pub gflop_per_cpu_s: Option<f64>,
    /// Seconds of audio per second of compute.
    pub realtime_factor: f64,
    pub peak_rss_bytes: u64,
    /// Resident set size once the weights and the input exist.
    pub model_rss_bytes: u64,
    /// `peak_rss_bytes - model_rss_bytes`.
    pub activation_bytes: u64,
    /// The most heap bytes live at once during the runs minus those live before them
    /// (None unless the binary counts its heap).
    pub activation_heap_bytes: Option<u64>,
    /// The timed passes' convolution time per geometry, slowest first (the CPU
    /// kernels only: empty on other devices).
    #[serde(default)]
    pub layers: Vec<LayerTime>,
    /// The CPU's f32 peak for `threads` cores, measured (one core's best FMA-loop rate
    /// on the conv tile's vectors x threads; None off the CPU).
    #[serde(default)]
    pub peak_gflop_per_s: Option<f64>,
    /// Which register tile the CPU convs ran (`avx512`, `avx2`, `portable`).
    #[serde(default)]
    pub conv_tile: Option<String>,
}

/// Builds the encoder or decoder with random weights on `device`, a seeded input of
/// the preset's length, and times `warmup` untimed then `runs` timed passes.
pub fn run_vae(preset: VaePreset, warmup: usize, runs: usize, device: &Device) -> Result<VaeBenchReport> {
    if runs == 0 {
        return Err(Error::setting("steps", "bench needs at least one timed run"));
    }
    let cfg = ace_step_vae_config();
    let weights = RandomTensors { seed: 0x0B1EC, device: device.clone() };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let frames = preset.seconds() * cfg.sampling_rate as usize / cfg.hop();
    let (pass, gflop, tile_frames): (Box<dyn Fn() -> Result<()>>, f64, usize) = if preset.encodes() {
        let encoder = OobleckEncoder::load(&cfg, &weights)?;
        let n = frames * cfg.hop();
        let audio: Vec<f32> = (0..2 * n).map(|_| rng.random_range(-0.5f32..0.5)).collect();
        let audio = Tensor::from_vec(audio, (2, n), device)?;
        let pass = move || encoder.encode(&audio, TILE_FRAMES, &Cancel::never(), &mut |_, _| {}).map(|_| ());
        (Box::new(pass), encoder_flops(&cfg, n) / 1e9, TILE_FRAMES)
    } else {
        let decoder = OobleckDecoder::load(&cfg, &weights)?;
        let z: Vec<f32> = (0..frames * cfg.latent_channels()).map(|_| rng.random_range(-1f32..1.0)).collect();
        let z = Tensor::from_vec(z, (frames, cfg.latent_channels()), device)?;
        let pass = move || decoder.decode(&z, TILE_FRAMES).map(|_| ());
        (Box::new(pass), decoder_flops(&cfg, frames) / 1e9, TILE_FRAMES)
    };
    let baseline = metrics::process_rss_bytes().unwrap_or(0);
    let heap_baseline = heap::live_bytes();
    heap::reset_peak();
    let (mut times, mut cpu) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for i in 0..warmup + runs {
        if i == warmup {
            conv_profile::start();
        }
        let (start, cpu_start) = (Instant::now(), metrics::process_cpu_seconds());
        pass()?;
        device.synchronize()?;
        if i >= warmup {
            times.push(start.elapsed().as_secs_f64());
            if let Some((a, b)) = cpu_start.zip(metrics::process_cpu_seconds()) {
                cpu.push(b - a);
            }
        }
    }
    let layers = conv_profile::stop();
    let threads = candle_core::utils::get_num_threads();
    let tile = device.is_cpu().then(Micro::best);
    let peak_gflop_per_s = tile.map(|m| m.peak_gflop_per_s() * threads as f64);
    let median = super::median(&times);
    let cpu_s_per_step = (cpu.len() == runs).then(|| super::median(&cpu));
    let peak = metrics::peak_rss_bytes().unwrap_or(0);
    Ok(VaeBenchReport {
        preset: preset.name().to_string(),
        device: super::device_name(device).to_string(),
        threads,
        seconds_of_audio: preset.seconds(),
        tile_frames,
        warmup,
        runs_s: times,
        median_s_per_step: median,
        gflop,
        gflop_per_s: gflop / median,
        cpu_s_per_step,
        gflop_per_cpu_s: cpu_s_per_step.map(|c| gflop / c),
        realtime_factor: preset.seconds() as f64 / median,
        peak_rss_bytes: peak,
        model_rss_bytes: baseline,
        activation_bytes: peak.saturating_sub(baseline),
        activation_heap_bytes: heap_baseline.zip(heap::peak_bytes()).map(|(base, peak)| peak.saturating_sub(base)),
        layers,
        peak_gflop_per_s,
        conv_tile: tile.map(|m| m.name().to_string()),
    })
}

impl VaeBenchReport {
    /// A small human-readable table, then the time per conv geometry.
    pub fn table(&self) -> String {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let total: f64 = self.runs_s.iter().sum();
        let layers: String = self
            .layers
            .iter()
            .map(|l| {
                format!(
                    "  {:<14} {:>4} -> {:<4} k{:<2} s{:<2} d{:<2} {:>8.2} s {:>5.1}% {:>7.1} GFLOP/s\n",
                    l.kind,
                    l.cin,
                    l.cout,
                    l.k,
                    l.stride,
                    l.dilation,
                    l.seconds,
                    100.0 * l.seconds / total.max(1e-12),
                    l.gflop_per_s(),
                )
            })
            .collect();
        let table = format!(
            "preset                  {}\n\
             device / threads        {} / {}\n\
             audio                   {} s, tiles of {} latent frames\n\
             median s                {:.3} (over {} runs after {} warm-up)\n\
             conv GFLOP, GFLOP/s     {:.1}, {:.1} ({} per CPU second)\n\
             measured peak           {}\n\
             realtime factor         {:.2}x\n\
             peak RSS                {:.1} MiB\n\
             weights + input RSS     {:.1} MiB\n\
             above the weights       {:.1} MiB (RSS), {} (live heap)\n",
            self.preset,
            self.device,
            self.threads,
            self.seconds_of_audio,
            self.tile_frames,
            self.median_s_per_step,
            self.runs_s.len(),
            self.warmup,
            self.gflop,
            self.gflop_per_s,
            self.gflop_per_cpu_s.map_or("n/a".into(), |g| format!("{g:.1}")),
            self.peak_gflop_per_s.map_or("n/a".into(), |p| format!(
                "{p:.0} GFLOP/s for {} threads ({:.0}% reached, {} tile)",
                self.threads,
                100.0 * self.gflop_per_s / p,
                self.conv_tile.as_deref().unwrap_or("?")
            )),
            self.realtime_factor,
            mib(self.peak_rss_bytes),
            mib(self.model_rss_bytes),
            mib(self.activation_bytes),
            self.activation_heap_bytes.map_or("not counted".into(), |b| format!("{:.1} MiB", mib(b))),
        );
        match layers.is_empty() {
            true => table,
            false => format!("{table}conv time per geometry (of all timed passes):\n{layers}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flop_counts_follow_the_architecture() {
        let cfg = ace_step_vae_config();
        // One second of audio: about 122 GFLOP each way (the residual units at 128
        // channels and full rate alone are 3 * 2 * 8 * 128^2 * 48000 = 37.7 GFLOP).
        let (enc, dec) = (encoder_flops(&cfg, 48_000) / 1e9, decoder_flops(&cfg, 25) / 1e9);
        println!("1 s: encoder {enc:.1} GFLOP, decoder {dec:.1} GFLOP");
        assert!((115.0..130.0).contains(&enc) && (115.0..130.0).contains(&dec), "{enc} {dec}");
        // Linear in length.
        assert!((encoder_flops(&cfg, 480_000) / 1e10 - enc).abs() < 1e-6 * enc);
        for p in VaePreset::ALL {
            assert!(p.name().starts_with("vae-") && p.seconds() >= 30);
        }
    }
}

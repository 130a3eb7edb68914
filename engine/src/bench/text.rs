//! `ostinato bench --preset text-encode`: the text side of preparing one song, at the
//! real models' sizes with seeded random weights: its caption prompt (256 tokens, as
//! preprocessing pads it) through the whole Qwen3-Embedding-0.6B stack, its lyrics (512
//! tokens) embedded, then ACE-Step's condition encoder (the 8-layer lyric encoder, the
//! 4-layer timbre encoder on one zero frame, the text projector, the packing) — what
//! `RealConditioner::condition` runs per song, less the tokenizer.
//!
//! One process measures one configuration (peak RSS is process-wide).

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::{device_name, dit_config, median};
use crate::codec::condition_encoder::{ConditionEncoder, ConditionEncoderConfig};
use crate::codec::qwen3::{Qwen3Config, Qwen3Encoder};
use crate::codec::transformer::LayerDims;
use crate::load::folder::{LYRIC_TOKENS, TEXT_TOKENS};
use crate::tensor_io::RandomTensors;
use crate::{heap, metrics, Error, Result};

/// The preset's name.
pub const TEXT_ENCODE: &str = "text-encode";

/// Qwen3-Embedding-0.6B's `config.json`, the fields the encoder reads.
const QWEN3_EMBEDDING_0_6B: &str = r#"{"vocab_size": 151669, "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0}"#;

/// What [`run_text`] measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TextBenchReport {
    pub preset: String,
    pub device: String,
    pub threads: usize,
    pub text_tokens: usize,
    pub lyric_tokens: usize,
    pub warmup: usize,
    /// Seconds of each timed song (Qwen3, then the condition encoder).
    pub runs_s: Vec<f64>,
    /// Median seconds per song (named as the other reports', for `bench/interleave.py`).
    pub median_s_per_step: f64,
    /// Median seconds of the Qwen3 stack and of the condition encoder.
    pub qwen3_s: f64,
    pub condition_encoder_s: f64,
    /// Multiply-adds x 2 of the linears and attention products per song.
    pub gflop: f64,
    pub gflop_per_s: f64,
    pub cpu_s_per_step: Option<f64>,
    pub gflop_per_cpu_s: Option<f64>,
    pub peak_rss_bytes: u64,
    /// Resident set size once the weights exist.
    pub model_rss_bytes: u64,
    pub activation_bytes: u64,
    pub activation_heap_bytes: Option<u64>,
}

/// FLOPs of `layers` transformer layers of `dims` over `len` tokens: the projections,
/// the MLP, and attention's two products over the whole square.
fn stack_flops(dims: &LayerDims, layers: usize, len: usize) -> f64 {
    let (h, hd) = (dims.hidden, dims.head_dim);
    let projections = h * hd * (2 * dims.heads + 2 * dims.kv_heads) + 3 * h * dims.intermediate;
    let attention = 2 * len * dims.heads * hd;
    2.0 * (layers * len * (projections + attention)) as f64
}

/// Builds Qwen3 and the condition encoder with random weights on `device` and times
/// `warmup` untimed then `runs` timed songs.
pub fn run_text(warmup: usize, runs: usize, device: &Device) -> Result<TextBenchReport> {
    if runs == 0 {
        return Err(Error::setting("steps", "bench needs at least one timed run"));
    }
    let qwen_cfg: Qwen3Config = serde_json::from_str(QWEN3_EMBEDDING_0_6B).expect("the constant parses");
    let encoder_cfg =
        ConditionEncoderConfig::from_value(&serde_json::json!({}), &dit_config(2048, 2048, 6144, 24, 16, 8, 128))?;
    let weights = RandomTensors { seed: 0x7E47, device: device.clone() };
    let qwen = Qwen3Encoder::load(&qwen_cfg, &weights)?;
    let encoder = ConditionEncoder::load(&encoder_cfg, &weights, "encoder")?;

    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut ids = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..qwen_cfg.vocab_size as u32)).collect() };
    let (text_ids, lyric_ids) = (ids(TEXT_TOKENS), ids(LYRIC_TOKENS));
    let (text_mask, lyric_mask) = (vec![true; TEXT_TOKENS], vec![true; LYRIC_TOKENS]);
    let zero_reference = Tensor::zeros((1, encoder_cfg.timbre_hidden_dim), DType::F32, device)?;
    let song = || -> Result<(f64, f64)> {
        let start = Instant::now();
        let text = qwen.forward(&text_ids)?;
        let lyrics = qwen.embed(&lyric_ids)?;
        device.synchronize()?;
        let qwen_s = start.elapsed().as_secs_f64();
        let start = Instant::now();
        encoder.forward(&text, &text_mask, &lyrics, &lyric_mask, &zero_reference)?;
        device.synchronize()?;
        Ok((qwen_s, start.elapsed().as_secs_f64()))
    };

    let baseline = metrics::process_rss_bytes().unwrap_or(0);
    let heap_baseline = heap::live_bytes();
    heap::reset_peak();
    let (mut times, mut parts, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..warmup + runs {
        let cpu_start = metrics::process_cpu_seconds();
        let (q, e) = song()?;
        if i >= warmup {
            times.push(q + e);
            parts.push((q, e));
            if let Some((a, b)) = cpu_start.zip(metrics::process_cpu_seconds()) {
                cpu.push(b - a);
            }
        }
    }
    let gflop = (stack_flops(&qwen_cfg.dims(), qwen_cfg.num_hidden_layers, TEXT_TOKENS)
        + stack_flops(&encoder_cfg.dims, encoder_cfg.lyric_layers, LYRIC_TOKENS)
        + stack_flops(&encoder_cfg.dims, encoder_cfg.timbre_layers, 1)
        + 2.0 * (TEXT_TOKENS * encoder_cfg.dims.hidden * encoder_cfg.text_hidden_dim) as f64)
        / 1e9;
    let med = median(&times);
    let cpu_s_per_step = (cpu.len() == runs).then(|| median(&cpu));
    let peak = metrics::peak_rss_bytes().unwrap_or(0);
    Ok(TextBenchReport {
        preset: TEXT_ENCODE.to_string(),
        device: device_name(device).to_string(),
        threads: candle_core::utils::get_num_threads(),
        text_tokens: TEXT_TOKENS,
        lyric_tokens: LYRIC_TOKENS,
        warmup,
        median_s_per_step: med,
        qwen3_s: median(&parts.iter().map(|p| p.0).collect::<Vec<_>>()),
        condition_encoder_s: median(&parts.iter().map(|p| p.1).collect::<Vec<_>>()),
        runs_s: times,
        gflop,
        gflop_per_s: gflop / med,
        cpu_s_per_step,
        gflop_per_cpu_s: cpu_s_per_step.map(|c| gflop / c),
        peak_rss_bytes: peak,
        model_rss_bytes: baseline,
        activation_bytes: peak.saturating_sub(baseline),
        activation_heap_bytes: heap_baseline.zip(heap::peak_bytes()).map(|(base, peak)| peak.saturating_sub(base)),
    })
}

impl TextBenchReport {
    pub fn table(&self) -> String {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        format!(
            "preset                  {}\n\
             device / threads        {} / {}\n\
             tokens                  {} text through Qwen3, {} lyrics through the lyric encoder\n\
             median s per song       {:.3} (Qwen3 {:.3}, condition encoder {:.3}; {} runs after {} warm-up)\n\
             GFLOP, GFLOP/s          {:.1}, {:.1} ({} per CPU second)\n\
             peak RSS                {:.1} MiB\n\
             weights RSS             {:.1} MiB\n\
             above the weights       {:.1} MiB (RSS), {} (live heap)\n",
            self.preset,
            self.device,
            self.threads,
            self.text_tokens,
            self.lyric_tokens,
            self.median_s_per_step,
            self.qwen3_s,
            self.condition_encoder_s,
            self.runs_s.len(),
            self.warmup,
            self.gflop,
            self.gflop_per_s,
            self.gflop_per_cpu_s.map_or("n/a".into(), |g| format!("{g:.1}")),
            mib(self.peak_rss_bytes),
            mib(self.model_rss_bytes),
            mib(self.activation_bytes),
            self.activation_heap_bytes.map_or("not counted".into(), |b| format!("{:.1} MiB", mib(b))),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flops_follow_the_real_sizes() {
        let qwen: Qwen3Config = serde_json::from_str(QWEN3_EMBEDDING_0_6B).unwrap();
        // Qwen3-0.6B's layers hold ~440M weights besides the 155M embedding: about
        // 2 x 440M FLOPs a token, plus attention.
        let per_token = stack_flops(&qwen.dims(), qwen.num_hidden_layers, 1) / 1e6;
        println!("Qwen3 per token at length 1: {per_token:.0} MFLOP");
        assert!((850.0..900.0).contains(&per_token), "{per_token}");
        // Attention grows with the length: twice the tokens, more than twice the FLOPs.
        let (a, b) = (stack_flops(&qwen.dims(), 1, 256), stack_flops(&qwen.dims(), 1, 512));
        assert!(b > 2.0 * a);
    }
}

//! `ostinato bench --preset lm-0.6b` / `lm-1.7b`: labelling one 4-minute song with the 5 Hz
//! LM at its real sizes, seeded random weights: a 1240-token prompt (1200 audio codes and
//! the instruction) prefilled, then greedy decoding to [`NEW_TOKENS`] new tokens over the
//! KV cache. Each step computes the LM head's rows a caption or lyrics step reads: all
//! but the 64000 audio-code tokens (see `MetadataConstraint::rows`; a metadata value's
//! steps read only their allowed tokens, fewer, and the step after a caption's newline
//! reads all, so the bench stands for the bulk of a song's tokens). Reports
//! seconds per song, its prefill and decode parts, tokens per second, and peak RSS
//! against the held weights.
//!
//! One process measures one configuration (peak RSS is process-wide).

use std::time::Instant;

use candle_core::Device;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::{device_name, median};
use crate::codec::qwen3::Qwen3Config;
use crate::codec::CausalLm;
use crate::device::Precision;
use crate::label::understand::prompt::AUDIO_CODES;
use crate::tensor_io::RandomTensors;
use crate::{metrics, Error, Result};

/// A 4-minute song's prompt: 1200 codes at 5 Hz plus the instruction around them.
pub const PROMPT_TOKENS: usize = 1240;
/// Tokens generated per song (a caption and metadata block runs about this long).
pub const NEW_TOKENS: usize = 200;
/// A stand-in for where `<|audio_code_0|>` sits (after Qwen3's 151669 tokens): the cost
/// of skipping the 64000 code rows does not depend on where they are.
const AUDIO_CODE_0: u32 = 151_669;

/// The two 5 Hz LM sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LmPreset {
    /// acestep-5Hz-lm-0.6B: hidden 1024, MLP 3072.
    Lm0_6b,
    /// acestep-5Hz-lm-1.7B: hidden 2048, MLP 6144.
    Lm1_7b,
}

impl LmPreset {
    pub const ALL: [LmPreset; 2] = [LmPreset::Lm0_6b, LmPreset::Lm1_7b];

    pub fn name(self) -> &'static str {
        match self {
            LmPreset::Lm0_6b => "lm-0.6b",
            LmPreset::Lm1_7b => "lm-1.7b",
        }
    }

    /// The real LM's config: vocabulary 217204 (Qwen3's and 65000 audio-code tokens),
    /// 28 layers, 16/8 heads of 128, tied embeddings.
    pub fn config(self) -> Qwen3Config {
        let (hidden, intermediate) = match self {
            LmPreset::Lm0_6b => (1024, 3072),
            LmPreset::Lm1_7b => (2048, 6144),
        };
        Qwen3Config {
            vocab_size: 217_204,
            hidden_size: hidden,
            intermediate_size: intermediate,
            num_hidden_layers: 28,
            num_attention_heads: 16,
            num_key_value_heads: 8,
            head_dim: Some(128),
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            attention_bias: false,
            tie_word_embeddings: true,
        }
    }
}

/// The LM's parameters (embedding once: tied).
fn parameters(cfg: &Qwen3Config) -> usize {
    let d = cfg.dims();
    let attention = d.hidden * d.head_dim * (2 * d.heads + 2 * d.kv_heads) + 2 * d.head_dim;
    let layer = attention + 3 * d.hidden * d.intermediate + 2 * d.hidden;
    cfg.vocab_size * d.hidden + cfg.num_hidden_layers * layer + d.hidden
}

/// What [`run_lm`] measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LmBenchReport {
    pub preset: String,
    pub device: String,
    pub threads: usize,
    /// What the weights are held in and computed in.
    pub precision: String,
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    /// LM-head rows computed per token, of `vocab_size`.
    pub kept_rows: usize,
    pub vocab_size: usize,
    pub warmup: usize,
    /// Seconds of each timed song (prefill + decode).
    pub runs_s: Vec<f64>,
    /// Median seconds per song (named as the other reports', for `bench/interleave.py`).
    pub median_s_per_step: f64,
    pub prefill_s: f64,
    pub decode_s: f64,
    /// New tokens after the first (each one decoding step) per second of decoding.
    pub decode_tokens_per_s: f64,
    pub parameters: usize,
    /// The parameters in the held dtype.
    pub weight_bytes: u64,
    pub peak_rss_bytes: u64,
    /// Resident set size once the weights exist.
    pub model_rss_bytes: u64,
    /// `peak_rss_bytes - weight_bytes`.
    pub above_weights_bytes: u64,
    /// The last song's generated ids, for a glance that decoding ran.
    pub last_ids: Vec<u32>,
}

/// Builds the LM with random weights on `device` and times `warmup` untimed then `runs`
/// timed songs.
pub fn run_lm(
    preset: LmPreset,
    precision: Precision,
    warmup: usize,
    runs: usize,
    device: &Device,
) -> Result<LmBenchReport> {
    if runs == 0 {
        return Err(Error::setting("steps", "bench needs at least one timed run"));
    }
    let cfg = preset.config();
    let lm = CausalLm::from_source(&cfg, &RandomTensors { seed: 0x5A, device: device.clone() }, precision)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let prompt: Vec<u32> = (0..PROMPT_TOKENS).map(|_| rng.random_range(0..cfg.vocab_size as u32)).collect();
    let vocab = cfg.vocab_size as u32;
    let keep = [0..AUDIO_CODE_0, AUDIO_CODE_0 + AUDIO_CODES..vocab];
    let greedy = |logits: &[f32]| logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |m| m.0 as u32);
    let song = || -> Result<(f64, f64, Vec<u32>)> {
        let start = Instant::now();
        let mut cache = lm.new_cache()?;
        cache.reserve(PROMPT_TOKENS + NEW_TOKENS)?;
        let mut ids = vec![greedy(&lm.logits(&lm.prefill(&prompt, &mut cache)?, Some(&keep))?)];
        let prefill_s = start.elapsed().as_secs_f64();
        let start = Instant::now();
        while ids.len() < NEW_TOKENS {
            let hidden = lm.step(*ids.last().expect("one id"), &mut cache)?;
            ids.push(greedy(&lm.logits(&hidden, Some(&keep))?));
        }
        Ok((prefill_s, start.elapsed().as_secs_f64(), ids))
    };

    let baseline = metrics::process_rss_bytes().unwrap_or(0);
    let (mut parts, mut last_ids) = (Vec::new(), Vec::new());
    for i in 0..warmup + runs {
        let (prefill, decode, ids) = song()?;
        if i >= warmup {
            parts.push((prefill, decode));
        }
        last_ids = ids;
    }
    let times: Vec<f64> = parts.iter().map(|(p, d)| p + d).collect();
    let decode_s = median(&parts.iter().map(|p| p.1).collect::<Vec<_>>());
    let held = lm.held_dtype();
    let params = parameters(&cfg);
    let weight_bytes = (params * held.size_in_bytes()) as u64;
    let peak = metrics::peak_rss_bytes().unwrap_or(0);
    Ok(LmBenchReport {
        preset: preset.name().to_string(),
        device: device_name(device).to_string(),
        threads: candle_core::utils::get_num_threads(),
        precision: format!("weights {held:?}, compute {:?}", lm.compute_dtype()).to_lowercase(),
        prompt_tokens: PROMPT_TOKENS,
        new_tokens: NEW_TOKENS,
        kept_rows: keep.iter().map(|r| r.len()).sum(),
        vocab_size: cfg.vocab_size,
        warmup,
        median_s_per_step: median(&times),
        prefill_s: median(&parts.iter().map(|p| p.0).collect::<Vec<_>>()),
        decode_s,
        decode_tokens_per_s: (NEW_TOKENS - 1) as f64 / decode_s,
        runs_s: times,
        parameters: params,
        weight_bytes,
        peak_rss_bytes: peak,
        model_rss_bytes: baseline,
        above_weights_bytes: peak.saturating_sub(weight_bytes),
        last_ids,
    })
}

impl LmBenchReport {
    pub fn table(&self) -> String {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        format!(
            "preset                  {}\n\
             device / threads        {} / {}\n\
             precision               {}\n\
             tokens                  {} prompt, {} new (greedy, {} of {} LM-head rows)\n\
             median s per song       {:.3} (prefill {:.3}, decode {:.3}; {} runs after {} warm-up)\n\
             decode tokens/s         {:.2}\n\
             parameters              {:.3} B, {:.1} MiB held\n\
             peak RSS                {:.1} MiB ({:.1} MiB above the weights)\n\
             weights RSS             {:.1} MiB\n",
            self.preset,
            self.device,
            self.threads,
            self.precision,
            self.prompt_tokens,
            self.new_tokens,
            self.kept_rows,
            self.vocab_size,
            self.median_s_per_step,
            self.prefill_s,
            self.decode_s,
            self.runs_s.len(),
            self.warmup,
            self.decode_tokens_per_s,
            self.parameters as f64 / 1e9,
            mib(self.weight_bytes),
            mib(self.peak_rss_bytes),
            mib(self.above_weights_bytes),
            mib(self.model_rss_bytes),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_are_the_real_lms() {
        // Qwen3-0.6B's layers hold ~440M weights; the 5 Hz LM's embedding adds
        // 217204 x 1024 = 222M.
        let small = parameters(&LmPreset::Lm0_6b.config()) as f64 / 1e6;
        let large = parameters(&LmPreset::Lm1_7b.config()) as f64 / 1e6;
        println!("lm-0.6b {small:.0} M, lm-1.7b {large:.0} M parameters");
        assert!((650.0..680.0).contains(&small), "{small}");
        assert!((1800.0..1900.0).contains(&large), "{large}");
    }
}

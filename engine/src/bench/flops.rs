//! What one training step of a bench configuration must compute, counted from its
//! shapes (not measured): the forward, the backward and (with checkpointing) the
//! forward recomputed, each by part: the linear products, attention's score and value
//! products, and LoRA's rank-r products. A product of `m x k` by `k x n` is `2 m k n`
//! FLOPs; norms, softmax, modulation and the optimizer are left out (a few percent).
//!
//! The backward counts only what the step needs: the base weights are frozen, so no
//! weight gradients; no gradient of the step's inputs (the patch embedding's input, the
//! condition embedder's); through attention, the four products of the score and value
//! gradients (twice the forward); through a LoRA product, its two weight gradients and
//! its input gradient (twice its forward).

use serde::{Deserialize, Serialize};

use super::BenchSpec;
use crate::lora::AdapterKind;
use crate::model::weights::layer_linears;

/// FLOPs by part.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Parts {
    pub linears: f64,
    pub attention: f64,
    /// LoRA's rank-r products; None for LoKr and DoRA, whose weight rebuilds are not counted.
    pub lora: Option<f64>,
}

impl Parts {
    pub fn total(&self) -> f64 {
        self.linears + self.attention + self.lora.unwrap_or(0.0)
    }

    fn scaled(&self, by: f64) -> Parts {
        Parts { linears: by * self.linears, attention: by * self.attention, lora: self.lora.map(|l| by * l) }
    }
}

/// A step's arithmetic: forward, backward, and the recompute checkpointing adds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepFlops {
    pub forward: Parts,
    pub backward: Parts,
    pub recompute: Parts,
}

impl StepFlops {
    pub fn total(&self) -> f64 {
        self.forward.total() + self.backward.total() + self.recompute.total()
    }
}

/// "forward 9.610 (linears 8.470, attention 1.110, LoRA 0.030) + backward ... = 29.900 TFLOP".
impl std::fmt::Display for StepFlops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = |x: f64| format!("{:.3}", x / 1e12);
        let parts = |p: &Parts| {
            let lora = p.lora.map_or("not counted".into(), t);
            format!("{} (linears {}, attention {}, LoRA {lora})", t(p.total()), t(p.linears), t(p.attention))
        };
        write!(f, "forward {} + backward {}", parts(&self.forward), parts(&self.backward))?;
        if self.recompute.total() > 0.0 {
            write!(f, " + recompute {}", parts(&self.recompute))?;
        }
        write!(f, " = {} TFLOP", t(self.total()))
    }
}

/// The arithmetic of one training step of `spec`, with or without checkpointing.
pub fn step_flops(spec: &BenchSpec, checkpointing: bool) -> StepFlops {
    let cfg = &spec.config;
    let batch = spec.batch as f64;
    let patches = spec.frames.div_ceil(cfg.patch_size);
    let (tokens, encoder_tokens) = (batch * patches as f64, batch * spec.encoder_len as f64);
    let product = |rows: f64, inp: usize, out: usize| 2.0 * rows * inp as f64 * out as f64;
    // Cross-attention's keys and values run over the condition's tokens; the rest over the song's.
    let on_condition = |name: &str| name.contains("cross_attn.k_proj") || name.contains("cross_attn.v_proj");
    let rows = |name: &str| if on_condition(name) { encoder_tokens } else { tokens };

    let linears = layer_linears(cfg);
    let layer_linears_fwd: f64 = linears.iter().map(|(name, inp, out)| product(rows(name), *inp, *out)).sum();
    // Cross-attention's keys and values of the condition need no input gradient.
    let layer_linears_bwd: f64 = linears
        .iter()
        .filter(|(name, _, _)| !on_condition(name))
        .map(|(name, inp, out)| product(rows(name), *inp, *out))
        .sum();
    let outside = product(tokens, cfg.in_channels * cfg.patch_size, cfg.hidden_size)
        + product(tokens, cfg.hidden_size, cfg.audio_acoustic_hidden_dim * cfg.patch_size)
        + product(encoder_tokens, cfg.encoder_hidden_size, cfg.hidden_size);
    // The output projection's input gradient is needed; the patch embedding's and the
    // condition embedder's are not.
    let outside_bwd = product(tokens, cfg.hidden_size, cfg.audio_acoustic_hidden_dim * cfg.patch_size);

    // Scores and values: 2 d FLOPs each per (query, key) pair, per head.
    let per_pair = 4.0 * (cfg.num_attention_heads * cfg.head_dim) as f64 * batch;
    let attention: f64 = (0..cfg.num_hidden_layers)
        .map(|layer| {
            let self_pairs = match cfg.is_sliding(layer) {
                true => band_pairs(patches, cfg.sliding_window),
                false => (patches * patches) as f64,
            };
            per_pair * (self_pairs + (patches * spec.encoder_len) as f64)
        })
        .sum();

    let lora = (spec.lora.kind == AdapterKind::Lora && !spec.lora.use_dora).then(|| {
        let r = spec.lora.r;
        linears
            .iter()
            .filter(|(name, _, _)| spec.lora.targets(name))
            .map(|(name, inp, out)| product(rows(name), *inp, r) + product(rows(name), r, *out))
            .sum::<f64>()
    });

    let layers = Parts { linears: layer_linears_fwd, attention, lora };
    StepFlops {
        forward: Parts { linears: layer_linears_fwd + outside, ..layers },
        backward: Parts { linears: layer_linears_bwd + outside_bwd, ..layers.scaled(2.0) },
        recompute: if checkpointing { layers } else { Parts::default() },
    }
}

/// The (query, key) pairs of a sliding-window layer over `positions`: each position
/// sees the keys within `window` of it on either side.
fn band_pairs(positions: usize, window: usize) -> f64 {
    (0..positions).map(|i| ((i + window + 1).min(positions) - i.saturating_sub(window)) as f64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Preset;
    use crate::lora::LoraConfig;

    #[test]
    fn a_band_counts_the_keys_each_position_sees() {
        assert_eq!(band_pairs(5, 1), 13.0); // 2 + 3 + 3 + 3 + 2
        assert_eq!(band_pairs(3, 10), 9.0, "a window wider than the song is full attention");
    }

    /// The 2B on a 4-minute song, as counted by hand in issue 50: linears about 2.8
    /// GFLOP a token, about 29 TFLOP a step with checkpointing and 20 without.
    #[test]
    fn the_2b_on_a_4_minute_song_is_what_a_hand_count_says() {
        let spec = Preset::Full240s.spec();
        let on = step_flops(&spec, true);
        let off = step_flops(&spec, false);
        let per_token = on.recompute.linears / 3000.0 / 1e9;
        println!(
            "full-240s: {per_token:.3} GFLOP a token in the layers' linears; {:.2} TFLOP a step with checkpointing, {:.2} without ({on:?})",
            on.total() / 1e12,
            off.total() / 1e12
        );
        // Self 2 x (2048 x 2048) + 2 x (2048 x 1024), cross 2 x (2048 x 2048), MLP 3 x (2048 x 6144),
        // 2 FLOPs each, over 24 layers (cross keys and values run over the 256 encoder tokens).
        let self_and_mlp =
            2.0 * (2.0 * 2048.0 * 2048.0 + 2.0 * 2048.0 * 1024.0 + 2.0 * 2048.0 * 2048.0 + 3.0 * 2048.0 * 6144.0);
        assert!((per_token - 24.0 * self_and_mlp / 1e9).abs() < 0.05, "{per_token}");
        assert!((2.7..2.9).contains(&per_token), "{per_token}");
        assert!((27e12..31e12).contains(&on.total()) && (18e12..22e12).contains(&off.total()), "{on:?} {off:?}");
        assert_eq!(on.total() - off.total(), on.recompute.total(), "checkpointing adds one forward of the layers");
        assert_eq!(off.recompute, Parts::default());
        // LoRA r 16 on the attentions' q/k/v/o: a small share of the step.
        let lora = on.forward.lora.unwrap();
        assert!(lora > 0.0 && lora < 0.02 * on.forward.linears, "{lora:e}");
        let lokr = BenchSpec { lora: LoraConfig { kind: AdapterKind::Lokr, ..spec.lora.clone() }, ..spec.clone() };
        assert_eq!(step_flops(&lokr, true).forward.lora, None, "LoKr's rebuild is not counted as LoRA products");
    }
}

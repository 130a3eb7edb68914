//! The built-in demo model: a small DiT of the real ACE-Step 1.5 architecture with
//! seeded random weights, so the whole app runs with zero downloads.
//!
//! Config: hidden 256, MLP 768, 4 layers (sliding, full, sliding, full), 4 query
//! heads / 2 KV heads of 64, patch 2, sliding window 16, the real 192 input and 64
//! latent channels. Weights: `DecoderWeights::random` with std 0.02, seed `DEMO_SEED`;
//! a null condition embedding of standard normals (as ACE-Step initialises its own),
//! so CFG dropout can be tried on the demo too.

use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::model::{DecoderWeights, DitConfig, LayerType};
use crate::Result;

pub const DEMO_SEED: u64 = 0x0571_4A70;

pub fn demo_config() -> DitConfig {
    DitConfig {
        hidden_size: 256,
        intermediate_size: 768,
        num_hidden_layers: 4,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 64,
        in_channels: 192,
        audio_acoustic_hidden_dim: 64,
        encoder_hidden_size: 256,
        patch_size: 2,
        sliding_window: 16,
        use_sliding_window: true,
        layer_types: [LayerType::SlidingAttention, LayerType::FullAttention].repeat(2),
        rope_theta: 1_000_000.0,
        rms_norm_eps: 1e-6,
    }
}

pub fn demo_weights(dtype: DType, device: &Device) -> Result<DecoderWeights> {
    DecoderWeights::random(&demo_config(), DEMO_SEED, 0.02, dtype, device)
}

/// `[1, 1, E]` f32, the same on every call.
pub fn demo_null_condition(device: &Device) -> Result<Tensor> {
    let width = demo_config().encoder_hidden_size;
    let mut rng = ChaCha8Rng::seed_from_u64(DEMO_SEED ^ 0x4E55_11C0);
    let values: Vec<f32> = (0..width).map(|_| StandardNormal.sample(&mut rng)).collect();
    Ok(Tensor::from_vec(values, (1, 1, width), device)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_model_is_deterministic() -> Result<()> {
        let a = demo_weights(DType::F32, &Device::Cpu)?;
        let b = demo_weights(DType::F32, &Device::Cpu)?;
        let key = "layers.2.self_attn.q_proj.weight";
        let (a, b) = (a.get(key)?, b.get(key)?);
        assert_eq!(a.flatten_all()?.to_vec1::<f32>()?, b.flatten_all()?.to_vec1::<f32>()?);
        Ok(())
    }
}

//! `DitConfig`: the DiT's hyper-parameters, read from ACE-Step's own `config.json`
//! (the `acestep-v15-turbo` layout) or from the `config` object of a fixture's json.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Error, Result};

/// Attention kind of one layer, named as in ACE-Step's `layer_types`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerType {
    SlidingAttention,
    FullAttention,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DitConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// Channels entering `proj_in`: context latents (128) + noisy latents (64).
    pub in_channels: usize,
    /// Channels of the audio latent the DiT predicts (64).
    pub audio_acoustic_hidden_dim: usize,
    /// Width of the condition encoder's output fed to `condition_embedder`
    /// (equal to `hidden_size` except on wider variants).
    pub encoder_hidden_size: usize,
    pub patch_size: usize,
    pub sliding_window: usize,
    pub use_sliding_window: bool,
    pub layer_types: Vec<LayerType>,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
}

/// The fields as they may appear in a config file; unknown fields are ignored.
#[derive(Deserialize)]
struct RawConfig {
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    in_channels: Option<usize>,
    audio_acoustic_hidden_dim: Option<usize>,
    encoder_hidden_size: Option<usize>,
    patch_size: Option<usize>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    layer_types: Option<Vec<LayerType>>,
    rope_theta: Option<f64>,
    rms_norm_eps: Option<f64>,
    attention_bias: Option<bool>,
}

fn required<T>(value: Option<T>, name: &str) -> Result<T> {
    value.ok_or_else(|| Error::MissingConfigField(name.to_string()))
}

impl DitConfig {
    /// Reads ACE-Step's `config.json`, or a fixture json whose `config` object holds it;
    /// an error names the file (and what it holds instead, when it is another model's).
    pub fn from_file(path: &Path) -> Result<Self> {
        let value: Value = crate::error::read_json(path)?;
        Self::from_value(&value).map_err(|e| {
            let other = ["_class_name", "model_type"]
                .iter()
                .find_map(|k| value.get(k).and_then(Value::as_str))
                .filter(|name| !name.to_lowercase().replace('_', "").contains("acestep"))
                .map(|name| format!(" (this is a `{name}` config, not an ACE-Step DiT's)"))
                .unwrap_or_default();
            Error::BadFile { path: path.to_path_buf(), reason: format!("{e}{other}") }
        })
    }

    /// Accepts the config object itself or a document with it under `config`.
    pub fn from_value(value: &Value) -> Result<Self> {
        let object = match value.get("config") {
            Some(inner) if inner.get("hidden_size").is_some() => inner,
            _ => value,
        };
        let raw: RawConfig = serde_json::from_value(object.clone())
            .map_err(|e| Error::BadConfig { what: "DiT", reason: e.to_string() })?;
        Self::from_raw(raw)
    }

    fn from_raw(raw: RawConfig) -> Result<Self> {
        let hidden_size = required(raw.hidden_size, "hidden_size")?;
        let num_attention_heads = required(raw.num_attention_heads, "num_attention_heads")?;
        let num_hidden_layers = required(raw.num_hidden_layers, "num_hidden_layers")?;
        if raw.attention_bias == Some(true) {
            return Err(Error::BadConfig {
                what: "DiT",
                reason: "attention_bias = true is not an ACE-Step 1.5 DiT".into(),
            });
        }
        // ACE-Step's default: layer i is a sliding-window layer when (i + 1) is odd.
        let layer_types = raw.layer_types.unwrap_or_else(|| {
            (0..num_hidden_layers)
                .map(|i| if (i + 1) % 2 == 1 { LayerType::SlidingAttention } else { LayerType::FullAttention })
                .collect()
        });
        let config = DitConfig {
            hidden_size,
            intermediate_size: required(raw.intermediate_size, "intermediate_size")?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: required(raw.num_key_value_heads, "num_key_value_heads")?,
            head_dim: raw.head_dim.unwrap_or(hidden_size / num_attention_heads.max(1)),
            in_channels: required(raw.in_channels, "in_channels")?,
            audio_acoustic_hidden_dim: required(raw.audio_acoustic_hidden_dim, "audio_acoustic_hidden_dim")?,
            encoder_hidden_size: raw.encoder_hidden_size.unwrap_or(hidden_size),
            patch_size: required(raw.patch_size, "patch_size")?,
            sliding_window: raw.sliding_window.unwrap_or(128),
            use_sliding_window: raw.use_sliding_window.unwrap_or(true),
            layer_types,
            rope_theta: raw.rope_theta.unwrap_or(1_000_000.0),
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(Error::BadConfig { what: "DiT", reason });
        if self.layer_types.len() != self.num_hidden_layers {
            return bad(format!(
                "layer_types has {} entries but num_hidden_layers is {}",
                self.layer_types.len(),
                self.num_hidden_layers
            ));
        }
        if self.num_key_value_heads == 0 || !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return bad(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} must be even for RoPE", self.head_dim));
        }
        if self.patch_size == 0 {
            return bad("patch_size must be at least 1".into());
        }
        if self.in_channels <= self.audio_acoustic_hidden_dim {
            return bad(format!(
                "in_channels {} must exceed audio_acoustic_hidden_dim {} (context channels come first)",
                self.in_channels, self.audio_acoustic_hidden_dim
            ));
        }
        Ok(())
    }

    /// Channels of the context latents (silence latent + mask) concatenated before the noisy latent.
    pub fn context_channels(&self) -> usize {
        self.in_channels - self.audio_acoustic_hidden_dim
    }

    /// Whether layer `i` attends only within the sliding window band.
    pub fn is_sliding(&self, layer: usize) -> bool {
        self.use_sliding_window && self.layer_types[layer] == LayerType::SlidingAttention
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn turbo_like() -> Value {
        json!({
            "architectures": ["AceStepConditionGenerationModel"],
            "auto_map": {"AutoModel": "modeling_acestep_v15_turbo.AceStepConditionGenerationModel"},
            "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
            "in_channels": 192, "audio_acoustic_hidden_dim": 64, "patch_size": 2,
            "sliding_window": 128, "use_sliding_window": true, "rope_theta": 1000000,
            "rms_norm_eps": 1e-6, "text_hidden_dim": 1024, "some_future_field": [1, 2]
        })
    }

    #[test]
    fn reads_acestep_config_and_defaults_layer_types() {
        let c = DitConfig::from_value(&turbo_like()).unwrap();
        assert_eq!(c.hidden_size, 2048);
        assert_eq!(c.layer_types.len(), 24);
        assert!(c.is_sliding(0) && !c.is_sliding(1) && c.is_sliding(22) && !c.is_sliding(23));
        assert_eq!(c.context_channels(), 128);
    }

    #[test]
    fn reads_fixture_style_config_object() {
        let doc = json!({"config": turbo_like(), "lora": {"r": 4}});
        assert_eq!(DitConfig::from_value(&doc).unwrap().num_hidden_layers, 24);
    }

    #[test]
    fn missing_required_field_is_named() {
        let mut v = turbo_like();
        v.as_object_mut().unwrap().remove("num_key_value_heads");
        let err = DitConfig::from_value(&v).unwrap_err().to_string();
        assert!(err.contains("num_key_value_heads"), "{err}");
    }

    #[test]
    fn inconsistent_layer_types_are_rejected() {
        let mut v = turbo_like();
        v["layer_types"] = json!(["full_attention"]);
        assert!(DitConfig::from_value(&v).is_err());
    }
}

//! Fixture discovery shared by the engine's integration tests.

#![allow(dead_code)] // each test binary uses its own subset

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use ostinato_engine::lora::LoraConfig;
use ostinato_engine::model::{DitConfig, DitInputs};

/// A small random-model config: width 64, MLP 160, 4 / 2 heads of 16, sliding window
/// 4, `layers` layers (sliding and full in turn).
pub fn small_config(layers: usize) -> DitConfig {
    DitConfig::from_value(&serde_json::json!({
        "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": layers,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "in_channels": 192, "audio_acoustic_hidden_dim": 64, "patch_size": 2,
        "sliding_window": 4
    }))
    .expect("a valid config")
}

/// The first song of the demo set (`assets/demo`).
pub fn demo_song() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/demo");
    let mut songs: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
    songs.sort();
    songs.into_iter().find(|p| p.extension().is_some_and(|e| e == "wav")).expect("a demo song")
}

/// `OSTINATO_FIXTURES`, else `../shared/fixtures` beside the repository.
pub fn fixtures_dir() -> PathBuf {
    let dir = std::env::var_os("OSTINATO_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures"));
    assert!(
        dir.is_dir(),
        "fixture directory {} not found: set OSTINATO_FIXTURES to the folder holding dit_*.safetensors",
        dir.display()
    );
    dir
}

pub struct Fixture {
    pub name: String,
    pub weights: PathBuf,
    pub json: serde_json::Value,
    pub tensors: HashMap<String, Tensor>,
}

impl Fixture {
    pub fn config(&self) -> DitConfig {
        DitConfig::from_value(&self.json).expect("fixture config parses")
    }

    pub fn lora_config(&self) -> LoraConfig {
        let l = &self.json["lora"];
        LoraConfig {
            r: l["r"].as_u64().expect("lora.r") as usize,
            alpha: l["alpha"].as_f64().expect("lora.alpha"),
            dropout: l["dropout"].as_f64().unwrap_or(0.0),
            target_modules: serde_json::from_value(l["target_modules"].clone()).expect("targets"),
            ..LoraConfig::default()
        }
    }

    pub fn t(&self, key: &str) -> &Tensor {
        self.tensors.get(key).unwrap_or_else(|| panic!("{}: fixture lacks `{key}`", self.name))
    }

    pub fn inputs(&self) -> DitInputs {
        DitInputs {
            hidden_states: self.t("in.hidden_states").clone(),
            context_latents: self.t("in.context_latents").clone(),
            encoder_hidden_states: self.t("in.encoder_hidden_states").clone(),
            timestep: self.t("in.timestep").clone(),
            timestep_r: self.t("in.timestep_r").clone(),
        }
    }

    /// Tensors under `prefix`, with the prefix removed.
    pub fn group(&self, prefix: &str) -> HashMap<String, Tensor> {
        self.tensors.iter().filter_map(|(k, t)| k.strip_prefix(prefix).map(|k| (k.to_string(), t.clone()))).collect()
    }
}

/// Every `dit_*.safetensors` with a same-named `.json` in the fixture directory.
pub fn dit_fixtures() -> Vec<Fixture> {
    let mut found = fixtures_in(&fixtures_dir(), "dit_");
    // This crate's own after them (the XL decoder, `scripts/make-xl-fixtures`): dit_tiny
    // stays first.
    found.extend(fixtures_in(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"), "dit_"));
    assert!(!found.is_empty(), "no dit_*.safetensors + .json fixtures in {}", fixtures_dir().display());
    found
}

/// Every `sample_*` fixture (the sampling loop): the fixture directory's and this
/// crate's own (`tests/fixtures/`, made by `scripts/make_real_fixtures.py`).
pub fn sample_fixtures() -> Vec<Fixture> {
    let mut found = fixtures_in(&fixtures_dir(), "sample_");
    found.extend(fixtures_in(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"), "sample_"));
    assert!(!found.is_empty(), "no sample_*.safetensors + .json fixtures in {}", fixtures_dir().display());
    found
}

/// Every `adapters_*` fixture (LoKr and DoRA as LyCORIS and PEFT compute them): this
/// crate's own (`tests/fixtures/`, made by `scripts/make-adapter-fixtures`) and any in
/// the fixture directory.
pub fn adapter_fixtures() -> Vec<Fixture> {
    let mut found = fixtures_in(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"), "adapters_");
    found.extend(fixtures_in(&fixtures_dir(), "adapters_"));
    assert!(!found.is_empty(), "no adapters_*.safetensors + .json fixtures in tests/fixtures");
    found
}

/// `<prefix>*.safetensors` files of `dir` with a same-named `.json`, sorted by name.
fn fixtures_in(dir: &Path, prefix: &str) -> Vec<Fixture> {
    let mut found: Vec<Fixture> = std::fs::read_dir(dir)
        .expect("fixture directory readable")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with(prefix) && name.ends_with(".safetensors") && p.with_extension("json").is_file()
        })
        .map(|weights| {
            let json = std::fs::read_to_string(weights.with_extension("json")).expect("fixture json");
            Fixture {
                name: weights.file_stem().unwrap().to_string_lossy().into_owned(),
                json: serde_json::from_str(&json).expect("fixture json parses"),
                tensors: candle_core::safetensors::load(&weights, &Device::Cpu).expect("fixture loads"),
                weights,
            }
        })
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

/// max |a - b|.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    let d = (a.to_dtype(candle_core::DType::F32).unwrap() - b.to_dtype(candle_core::DType::F32).unwrap()).unwrap();
    d.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

/// max |a - b| / max |b|: the error relative to the tensor's scale.
pub fn max_rel_diff(a: &Tensor, reference: &Tensor) -> f32 {
    let scale = reference.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
    max_abs_diff(a, reference) / scale.max(f32::MIN_POSITIVE)
}

//! Text to latents with a whole model folder: a base/SFT variant of the tiny random
//! ACE-Step model in `tests/fixtures/real/model` guides with the checkpoint's
//! `null_condition_emb`, and says which file lacks it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use ostinato_engine::generate::{GenerateSpec, Generator};
use ostinato_engine::model::source::ModelSource;

/// The tiny model folder copied to `dir`, turned into a base model; `null` adds a
/// `null_condition_emb` to its model.safetensors.
fn base_model(dir: &Path, null: bool) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real/model");
    for sub in ["acestep-v15-turbo", "vae", "Qwen3-Embedding-0.6B"] {
        let dst = dir.join(sub.replace("turbo", "base"));
        std::fs::create_dir_all(&dst).unwrap();
        for f in std::fs::read_dir(src.join(sub)).unwrap().flatten() {
            std::fs::copy(f.path(), dst.join(f.file_name())).unwrap();
        }
    }
    let dit = dir.join("acestep-v15-base");
    let cfg_path = dit.join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["model_version"] = "base".into();
    cfg["is_turbo"] = false.into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    if null {
        let weights = dit.join("model.safetensors");
        let mut tensors: HashMap<String, Tensor> = candle_core::safetensors::load(&weights, &Device::Cpu).unwrap();
        tensors.insert("null_condition_emb".into(), Tensor::randn(0f32, 1.0, (1, 1, 32), &Device::Cpu).unwrap());
        candle_core::safetensors::save(&tensors, &weights).unwrap();
    }
    dir.to_path_buf()
}

fn spec(guidance: Option<f64>) -> GenerateSpec {
    GenerateSpec { caption: "warm lo-fi piano".into(), duration_seconds: 1.0, seed: 3, steps: Some(4), guidance, ..GenerateSpec::default() }
}

#[test]
fn base_models_guide_with_null_condition_emb_and_name_the_file_without_it() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = base_model(&tmp.path().join("without"), false);
    let g = Generator::load(&ModelSource::Folder { path: missing }).unwrap();
    let err = g.latents(&spec(None), &mut |_| {}).unwrap_err().to_string();
    println!("{err}");
    assert!(err.contains("acestep-v15-base/model.safetensors") && err.contains("null_condition_emb"), "{err}");
    // Guidance 1 is off: no unconditional branch needed.
    g.latents(&spec(Some(1.0)), &mut |_| {}).unwrap();

    let g = Generator::load(&ModelSource::Folder { path: base_model(&tmp.path().join("with"), true) }).unwrap();
    let guided = g.latents(&spec(None), &mut |_| {}).unwrap();
    let again = g.latents(&spec(None), &mut |_| {}).unwrap();
    let plain = g.latents(&spec(Some(1.0)), &mut |_| {}).unwrap();
    let diff = |a: &Tensor, b: &Tensor| (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    println!("guidance 7 vs 1: max abs latent difference {:.3e}", diff(&guided, &plain));
    assert_eq!(guided.dims(), [25, 8]);
    assert_eq!(diff(&guided, &again), 0.0, "deterministic");
    assert!(diff(&guided, &plain) > 1e-3, "guidance changes the song");
}

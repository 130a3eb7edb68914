//! Text to latents with a whole model folder (the tiny random ACE-Step model in
//! `tests/fixtures/real/model`): the text2music condition and latents against diffusers'
//! `AceStepPipeline` (`real/text2music.*`, made by `scripts/make-real-fixtures
//! --text2music`), and a base/SFT variant that guides with the checkpoint's
//! `null_condition_emb` and says which file lacks it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use ostinato_engine::codec::condition::{lyrics_prompt, text_prompt, Task};
use ostinato_engine::codec::tokenizer::{Padding, TextTokenizer};
use ostinato_engine::codec::SongMeta;
use ostinato_engine::device::Precision;
use ostinato_engine::generate::sampler::{sample, timesteps, Conditions};
use ostinato_engine::generate::{GenerateSpec, Generator};
use ostinato_engine::load::folder::{ModelFolder, GENERATION_LYRIC_TOKENS, TEXT_TOKENS};
use ostinato_engine::load::source::ModelSource;

const TOL: f32 = 1e-4;

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

fn ids(t: &Tensor) -> Vec<u32> {
    t.to_dtype(DType::I64).unwrap().to_vec1::<i64>().unwrap().into_iter().map(|i| i as u32).collect()
}

#[test]
fn text2music_condition_and_latents_match_diffusers_pipeline() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real/model");
    let fixture = model.parent().unwrap();
    let e = candle_core::safetensors::load(fixture.join("text2music.safetensors"), &Device::Cpu).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("text2music.json")).unwrap()).unwrap();
    let source = ModelSource::Folder { path: model.clone() };
    let loaded = source.load(Precision::F32, &Device::Cpu).unwrap();
    let generator = Generator::load(&source).unwrap();
    let folder = ModelFolder::open(&model, None).unwrap();
    let text_tokens = TextTokenizer::from_dir(&folder.text_dir(), TEXT_TOKENS, Padding::None).unwrap();
    let lyric_tokens = TextTokenizer::from_dir(&folder.text_dir(), GENERATION_LYRIC_TOKENS, Padding::None).unwrap();

    for (i, case) in json["cases"].as_array().unwrap().iter().enumerate() {
        let t = |k: &str| &e[&format!("case{i}.{k}")];
        let meta = SongMeta {
            caption: case["prompt"].as_str().unwrap().into(),
            lyrics: case["lyrics"].as_str().unwrap().into(),
            language: Some(case["vocal_language"].as_str().unwrap().into()),
            duration_seconds: case["audio_duration"].as_f64().unwrap(),
            ..SongMeta::default()
        };
        // 1. The texts and their tokens: cut at 256 / 2048, not padded.
        assert_eq!(text_prompt(&meta), case["text_prompt"].as_str().unwrap(), "case {i}: text prompt");
        assert_eq!(lyrics_prompt(&meta), case["lyrics_prompt"].as_str().unwrap(), "case {i}: lyrics prompt");
        let text = text_tokens.encode(&text_prompt(&meta)).unwrap();
        let lyrics = lyric_tokens.encode(&lyrics_prompt(&meta)).unwrap();
        assert_eq!(text.ids, ids(t("text_input_ids")), "case {i}: text token ids");
        assert_eq!(lyrics.ids, ids(t("lyric_input_ids")), "case {i}: lyric token ids");
        assert!(text.mask.iter().chain(&lyrics.mask).all(|&m| m), "case {i}: no padding");

        // 2. The condition: Qwen3 + condition encoder with the silence latent as the
        // timbre reference, context latents from the silence latent.
        let frames = generator.frames_for(meta.duration_seconds).unwrap();
        assert_eq!(frames as u64, case["frames"].as_u64().unwrap(), "case {i}: frames");
        let reference = folder.silence_latent().unwrap();
        let reference = reference.narrow(0, 0, t("timbre_reference").dim(0).unwrap()).unwrap();
        assert_eq!(
            max_diff(&reference, t("timbre_reference")),
            0.0,
            "case {i}: the timbre reference is the silence latent"
        );
        let c = loaded.conditioner.generation_condition(&meta, Task::Text2Music, frames).unwrap();
        let errs = [
            ("encoder_hidden_states", max_diff(&c.encoder_hidden_states, t("encoder_hidden_states"))),
            ("encoder_attention_mask", max_diff(&c.encoder_attention_mask, t("encoder_attention_mask"))),
            ("context_latents", max_diff(&c.context_latents, t("context_latents"))),
        ];

        // 3. The turbo loop from the pipeline's noise.
        let cond = Conditions {
            context_latents: c.context_latents.unsqueeze(0).unwrap(),
            encoder_hidden_states: c.encoder_hidden_states.unsqueeze(0).unwrap(),
        };
        let noise = t("noise").unsqueeze(0).unwrap();
        let latents =
            sample(&loaded.dit, None, &noise, &cond, &timesteps(8, 3.0).unwrap(), None, |_, _| Ok(())).unwrap();
        let latents_err = max_diff(&latents.squeeze(0).unwrap(), t("latents"));
        println!(
            "text2music case {i} ({} text, {} lyric tokens, {frames} frames): {errs:?}, latents {latents_err:.2e}",
            text.ids.len(),
            lyrics.ids.len()
        );
        for (k, err) in errs.into_iter().chain([("latents", latents_err)]) {
            assert!(err <= TOL, "case {i}: {k} max abs error {err:e}");
        }
    }
}

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
    GenerateSpec {
        caption: "warm lo-fi piano".into(),
        duration_seconds: 1.0,
        seed: 3,
        steps: Some(4),
        guidance,
        ..GenerateSpec::default()
    }
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

//! 5 Hz audio codes -> 25 Hz hints with a model folder's own detokenizer, and a song
//! conditioned on them, against upstream's code (`tests/fixtures/*/hints*.safetensors`,
//! made by `scripts/make-hints-fixtures`): every tiny model folder with a hints fixture
//! (2B and XL), and every hinted song fixture.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use ostinato_engine::device::Precision;
use ostinato_engine::generate::sampler::{sample, timesteps, Conditions};
use ostinato_engine::generate::{GenerateSpec, Generator};
use ostinato_engine::load::folder::ModelFolder;
use ostinato_engine::load::source::ModelSource;

/// Hints and the quantizer's vectors: f32 through a few small layers.
const HINTS_TOL: f32 = 1e-4;
/// The condition and the song's latents after 8 turbo steps, as the text2music test.
const SONG_TOL: f32 = 1e-4;

fn fixtures_with(file: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut found: Vec<PathBuf> =
        std::fs::read_dir(&root).unwrap().flatten().map(|e| e.path()).filter(|dir| dir.join(file).is_file()).collect();
    found.sort();
    assert!(!found.is_empty(), "no {file} under {}", root.display());
    found
}

fn load(path: &Path) -> std::collections::HashMap<String, Tensor> {
    candle_core::safetensors::load(path, &Device::Cpu).unwrap()
}

fn codes(t: &Tensor) -> Vec<u32> {
    t.to_dtype(DType::I64).unwrap().to_vec1::<i64>().unwrap().into_iter().map(|c| c as u32).collect()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

fn name(dir: &Path) -> String {
    dir.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn every_model_folders_detokenizer_makes_upstreams_hints() {
    for dir in fixtures_with("hints.safetensors") {
        let e = load(&dir.join("hints.safetensors"));
        let folder = ModelFolder::open(&dir.join("model"), None).unwrap();
        let detokenizer = folder.audio_detokenizer(&Device::Cpu).unwrap().unwrap();
        let codes = codes(&e["codes"]);
        let quantized = max_diff(&detokenizer.quantized(&codes).unwrap(), &e["quantized"]);
        let hints = detokenizer.hints(&codes).unwrap();
        assert_eq!(hints.dims()[0], detokenizer.pool_window() * codes.len(), "{}: 25 Hz rows", name(&dir));
        let hints = max_diff(&hints, &e["hints"]);
        println!(
            "{}: {} codes, quantizer output max abs {quantized:.2e}, hints max abs {hints:.2e}",
            name(&dir),
            codes.len()
        );
        assert!(quantized <= HINTS_TOL && hints <= HINTS_TOL, "{}: {quantized:e} / {hints:e}", name(&dir));
    }
}

#[test]
fn codes_outside_the_codebook_are_named_by_position_and_value() {
    for dir in fixtures_with("hints.safetensors") {
        let folder = ModelFolder::open(&dir.join("model"), None).unwrap();
        let detokenizer = folder.audio_detokenizer(&Device::Cpu).unwrap().unwrap();
        let err = detokenizer.hints(&[0, 63999, 64000]).unwrap_err().to_string();
        println!("{}: {err}", name(&dir));
        assert!(err.contains("audio code 64000 at position 2") && err.contains("0 to 63999"), "{err}");
        assert!(detokenizer.hints(&[]).is_err(), "no codes, no hints");
    }
}

fn hinted_spec(json: &serde_json::Value, codes: Vec<u32>) -> GenerateSpec {
    GenerateSpec {
        caption: json["prompt"].as_str().unwrap().into(),
        lyrics: json["lyrics"].as_str().unwrap().into(),
        language: Some(json["vocal_language"].as_str().unwrap().into()),
        duration_seconds: json["audio_duration"].as_f64().unwrap(),
        audio_codes: codes,
        ..GenerateSpec::default()
    }
}

#[test]
fn a_song_over_a_plans_hints_matches_diffusers_pipeline() {
    for dir in fixtures_with("hints_song.safetensors") {
        let e = load(&dir.join("hints_song.safetensors"));
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("hints_song.json")).unwrap()).unwrap();
        let source = ModelSource::Folder { path: dir.join("model") };
        let generator = Generator::load(&source).unwrap();
        let spec = hinted_spec(&json, codes(&e["codes"]));
        let frames = generator.frames_for(spec.duration_seconds).unwrap();
        assert_eq!(frames as u64, json["frames"].as_u64().unwrap(), "{}: frames", name(&dir));
        let c = generator.condition(&spec).unwrap();
        let errs = [
            ("encoder_hidden_states", max_diff(&c.encoder_hidden_states, &e["encoder_hidden_states"])),
            ("encoder_attention_mask", max_diff(&c.encoder_attention_mask, &e["encoder_attention_mask"])),
            ("context_latents", max_diff(&c.context_latents, &e["context_latents"])),
        ];
        let dit = source.load(Precision::F32, &Device::Cpu).unwrap().dit;
        let cond = Conditions {
            context_latents: c.context_latents.unsqueeze(0).unwrap(),
            encoder_hidden_states: c.encoder_hidden_states.unsqueeze(0).unwrap(),
        };
        let noise = e["noise"].unsqueeze(0).unwrap();
        let latents = sample(&dit, None, &noise, &cond, &timesteps(8, 3.0).unwrap(), None, |_, _| Ok(())).unwrap();
        let latents_err = max_diff(&latents.squeeze(0).unwrap(), &e["latents"]);
        println!("{} hinted song ({frames} frames): {errs:?}, latents max abs {latents_err:.2e}", name(&dir));
        for (k, err) in errs.into_iter().chain([("latents", latents_err)]) {
            assert!(err <= SONG_TOL, "{}: {k} max abs error {err:e}", name(&dir));
        }

        // Through the generator: bad codes are named before any sampling.
        let bad = hinted_spec(&json, vec![5, 70000]);
        let err = generator.latents(&bad, &mut |_| {}).unwrap_err().to_string();
        assert!(err.contains("audio code 70000 at position 1"), "{err}");
    }
}

#[test]
fn the_demo_model_cannot_take_a_plan() {
    let generator = Generator::load(&ModelSource::Demo).unwrap();
    let spec = GenerateSpec { duration_seconds: 1.0, audio_codes: vec![1, 2, 3], ..GenerateSpec::default() };
    let err = generator.latents(&spec, &mut |_| {}).unwrap_err().to_string();
    println!("{err}");
    assert!(err.contains("demo model cannot take a plan"), "{err}");
}

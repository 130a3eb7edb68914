//! An ACE-Step 1.5 XL model folder (`tests/fixtures/real_xl/model`, made by
//! `scripts/make-xl-model-fixtures`): sharded DiT weights, condition encoders at the
//! config's `encoder_*` sizes (narrower than the DiT, other heads and MLP), the timbre
//! encoder's special token, the null condition at the encoder width; the song of
//! `tests/fixtures/real` conditioned as upstream's XL code conditions it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use ostinato_engine::codec::condition::Conditioner;
use ostinato_engine::codec::condition_encoder::ConditionEncoder;
use ostinato_engine::codec::qwen3::Qwen3Encoder;
use ostinato_engine::codec::SongMeta;
use ostinato_engine::load::folder::ModelFolder;
use ostinato_engine::model::KernelPolicy;
use ostinato_engine::tensor_io::TensorFile;

const TOL: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn xl_model() -> PathBuf {
    fixture("real_xl/model")
}

fn expected(dir: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(fixture(dir).join("expected.safetensors"), &Device::Cpu).unwrap()
}

/// The error opening the folder at `root`.
fn open_error(root: &Path) -> String {
    match ModelFolder::open(root, None) {
        Ok(_) => panic!("{} opened", root.display()),
        Err(e) => e.to_string(),
    }
}

fn ints(t: &Tensor) -> Vec<i64> {
    t.to_dtype(DType::I64).unwrap().to_vec1().unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

/// The 2B fixture's song: its meta, token ids and masks.
fn song() -> (SongMeta, HashMap<String, Tensor>) {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("real/expected.json")).unwrap()).unwrap();
    let m = &json["meta"];
    let meta = SongMeta {
        caption: m["caption"].as_str().unwrap().into(),
        lyrics: m["lyrics"].as_str().unwrap().into(),
        bpm: Some(m["bpm"].as_u64().unwrap() as u32),
        keyscale: Some(m["keyscale"].as_str().unwrap().into()),
        timesignature: Some(m["timesignature"].as_str().unwrap().into()),
        duration_seconds: m["duration_seconds"].as_f64().unwrap(),
        ..SongMeta::default()
    };
    (meta, expected("real"))
}

#[test]
fn the_xl_folder_is_read_at_its_own_widths_from_its_shards() {
    let folder = ModelFolder::open(&xl_model(), None).unwrap();
    assert!(folder.dit_weights().ends_with("model.safetensors.index.json"));
    assert_eq!((folder.dit.hidden_size, folder.dit.encoder_hidden_size), (40, 32));
    assert_eq!(folder.dit.num_attention_heads * folder.dit.head_dim, 64, "attention wider than the DiT");
    let d = folder.encoder.dims;
    assert_eq!((d.hidden, d.intermediate, d.heads, d.kv_heads, d.head_dim), (32, 48, 2, 1, 16));
    assert!(folder.encoder.timbre_special_token);
    let checked = folder.check_weights().unwrap();
    println!("xl folder: {checked} tensors checked over {:?}", folder.dit_weights());
    folder.load_decoder(DType::F32, &Device::Cpu).unwrap();
    let null = folder.null_condition(&Device::Cpu).unwrap().unwrap();
    assert_eq!(null.dims(), [1, 1, 32]);

    // The 2B folder keeps the DiT's sizes and pools the first frame.
    let two_b = ModelFolder::open(&fixture("real/model"), None).unwrap();
    assert!(!two_b.encoder.timbre_special_token);
    assert_eq!(two_b.encoder.dims.heads, two_b.dit.num_attention_heads);
}

#[test]
fn xl_condition_encoder_matches_upstreams_xl_code() {
    xl_condition_encoder_matches(KernelPolicy::cpu());
}

#[test]
fn xl_condition_encoder_under_the_gpu_policy_matches_upstreams_xl_code() {
    xl_condition_encoder_matches(KernelPolicy::gpu());
}

fn xl_condition_encoder_matches(kernels: KernelPolicy) {
    let xl = expected("real_xl");
    let folder = ModelFolder::open(&xl_model(), None).unwrap();
    let file = TensorFile::open(&folder.dit_weights(), &Device::Cpu).unwrap();
    let encoder = ConditionEncoder::load(&folder.encoder, &file, "encoder").unwrap().with_kernels(kernels);
    // The special token's row of a 7-frame reference (sliding and full layers).
    let timbre = encoder.timbre(&xl["timbre_reference"]).unwrap();
    let err = max_diff(&timbre, &xl["timbre"]);
    println!("xl timbre [{:?}] ({kernels:?}): max abs err {err:.2e}", timbre.dims());
    assert!(err < TOL, "timbre err {err}");

    // The song's packed condition from the reference's text states.
    let (_, song) = song();
    let qwen_file = TensorFile::open(&folder.text_dir().join("model.safetensors"), &Device::Cpu).unwrap();
    let qwen = Qwen3Encoder::load(&folder.text, &qwen_file).unwrap().with_kernels(kernels);
    let ids: Vec<u32> = ints(&song["lyric_input_ids"]).into_iter().map(|i| i as u32).collect();
    let mask = |k: &str| -> Vec<bool> { ints(&song[k]).into_iter().map(|m| m != 0).collect() };
    let zero_reference = Tensor::zeros((1, folder.encoder.timbre_hidden_dim), DType::F32, &Device::Cpu).unwrap();
    let packed = encoder
        .forward(
            &song["text_hidden_states"],
            &mask("text_attention_mask"),
            &qwen.embed(&ids).unwrap(),
            &mask("lyric_attention_mask"),
            &zero_reference,
        )
        .unwrap();
    let err = max_diff(&packed.states, &xl["encoder_hidden_states"]);
    println!("xl condition [{:?}] ({kernels:?}): max abs err {err:.2e}", packed.states.dims());
    assert!(err < TOL, "condition err {err}");
}

#[test]
fn xl_audio_tokenizer_makes_upstreams_codes_at_the_encoder_width() {
    xl_audio_tokenizer_matches(KernelPolicy::cpu());
}

#[test]
fn xl_audio_tokenizer_under_the_gpu_policy_makes_upstreams_codes() {
    xl_audio_tokenizer_matches(KernelPolicy::gpu());
}

/// 23 latent frames (the last window completed from the silence latent) -> 5 codes of
/// a 64000-code residual FSQ over the 32-wide encoder states.
fn xl_audio_tokenizer_matches(kernels: KernelPolicy) {
    let xl = expected("real_xl");
    let folder = ModelFolder::open(&xl_model(), None).unwrap();
    assert_eq!((folder.audio_codes.fsq_dim, folder.audio_codes.codebook_size()), (32, 64000));
    let tokenizer = folder.audio_tokenizer(&Device::Cpu).unwrap().with_kernels(kernels);
    let out = tokenizer.tokenize(&xl["tokenizer_latents"], &folder.silence_latent().unwrap()).unwrap();
    let want: Vec<u32> = ints(&xl["tokenizer_codes"]).into_iter().map(|c| c as u32).collect();
    assert_eq!(out.codes, std::slice::from_ref(&want), "the codes ({kernels:?})");
    let err = max_diff(&out.quantized, &xl["tokenizer_quantized"]);
    println!("xl audio codes {want:?} equal ({kernels:?}); quantized {:?} max abs err {err:.2e}", out.quantized.dims());
    assert!(err < TOL, "quantized err {err}");
}

#[test]
fn the_song_is_preprocessed_as_upstreams_xl_code_conditions_it() {
    let xl = expected("real_xl");
    let folder = ModelFolder::open(&xl_model(), None).unwrap();
    let (meta, song) = song();
    let cond = folder.conditioner(&Device::Cpu).unwrap();
    let c = cond.condition(&meta, song["vae_mean"].dim(0).unwrap()).unwrap();
    let errs = [
        ("encoder_hidden_states", max_diff(&c.encoder_hidden_states, &xl["encoder_hidden_states"])),
        ("encoder_attention_mask", max_diff(&c.encoder_attention_mask, &xl["encoder_attention_mask"])),
        ("context_latents", max_diff(&c.context_latents, &xl["context_latents"])),
    ];
    println!("xl preprocessing vs upstream's XL code: {errs:?}");
    for (k, err) in errs {
        assert!(err < TOL, "{k}: {err}");
    }
}

#[test]
fn a_missing_shard_or_a_tensor_in_two_shards_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dit = tmp.path().join("acestep-v15-xl-turbo");
    std::fs::create_dir(&dit).unwrap();
    for f in std::fs::read_dir(xl_model().join("acestep-v15-xl-turbo")).unwrap().flatten() {
        std::fs::copy(f.path(), dit.join(f.file_name())).unwrap();
    }
    for shared in ["vae", "Qwen3-Embedding-0.6B"] {
        std::os::unix::fs::symlink(fixture("real/model").join(shared), tmp.path().join(shared)).unwrap();
    }
    ModelFolder::open(tmp.path(), None).unwrap();

    // The second shard holding the first one's tensors too.
    let (first, second) = (dit.join("model-00001-of-00002.safetensors"), dit.join("model-00002-of-00002.safetensors"));
    std::fs::copy(&first, &second).unwrap();
    let err = open_error(tmp.path());
    assert!(err.contains("model-00002-of-00002.safetensors") && err.contains("is also in"), "{err}");

    std::fs::remove_file(&second).unwrap();
    let err = open_error(tmp.path());
    println!("{err}");
    assert!(
        err.contains("model.safetensors.index.json") && err.contains("`model-00002-of-00002.safetensors` is missing")
    );
}

//! The real ACE-Step model path against reference outputs of the PyTorch
//! implementations (diffusers 0.42.1, transformers), on the tiny random model folder
//! in `tests/fixtures/real/` (made by `scripts/make-real-fixtures`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use ostinato_engine::cancel::Cancel;
use ostinato_engine::codec::condition::{text_prompt, Conditioner};
use ostinato_engine::codec::condition_encoder::ConditionEncoder;
use ostinato_engine::codec::encode::LatentEncoder;
use ostinato_engine::codec::qwen3::Qwen3Encoder;
use ostinato_engine::codec::tokenizer::{Padding, TextTokenizer};
use ostinato_engine::codec::vae::{LatentChoice, TILE_FRAMES};
use ostinato_engine::codec::{SongMeta, StereoAudio};
use ostinato_engine::data::preprocessed::{
    read_preprocessed_dir, read_sample, write_preprocessed, Manifest, SampleMaker,
};
use ostinato_engine::data::TrainingSample;
use ostinato_engine::load::folder::{ModelFolder, Variant, LYRIC_TOKENS, TEXT_TOKENS};
use ostinato_engine::load::source::ModelSource;
use ostinato_engine::model::{DecoderWeights, KernelPolicy};
use ostinato_engine::tensor_io::torch_pt::write_pt;
use ostinato_engine::tensor_io::TensorFile;
use ostinato_engine::Error;

fn real_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real")
}

fn model_dir() -> PathBuf {
    real_dir().join("model")
}

fn expected() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(real_dir().join("expected.safetensors"), &Device::Cpu).unwrap()
}

fn meta() -> SongMeta {
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(real_dir().join("expected.json")).unwrap()).unwrap();
    let m = &j["meta"];
    SongMeta {
        caption: m["caption"].as_str().unwrap().into(),
        lyrics: m["lyrics"].as_str().unwrap().into(),
        bpm: Some(m["bpm"].as_u64().unwrap() as u32),
        keyscale: Some(m["keyscale"].as_str().unwrap().into()),
        timesignature: Some(m["timesignature"].as_str().unwrap().into()),
        duration_seconds: m["duration_seconds"].as_f64().unwrap(),
        ..SongMeta::default()
    }
}

/// The script's clip: the same formula in f64, then f32.
fn clip() -> StereoAudio {
    let rate = 48_000u32;
    let n = 2 * rate as usize;
    let tau = 2.0 * std::f64::consts::PI;
    let t = |i: usize| i as f64 / rate as f64;
    StereoAudio {
        sample_rate: rate,
        left: (0..n)
            .map(|i| (0.5 * (tau * 220.0 * t(i)).sin() + 0.25 * (tau * 1234.5 * t(i) + 0.3).sin()) as f32)
            .collect(),
        right: (0..n)
            .map(|i| (0.4 * (tau * 330.0 * t(i)).sin() * (-t(i)).exp() + 0.2 * (tau * 97.0 * t(i)).sin()) as f32)
            .collect(),
    }
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    (a.to_dtype(DType::F32).unwrap() - b.to_dtype(DType::F32).unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

fn ints(t: &Tensor) -> Vec<i64> {
    t.to_dtype(DType::I64).unwrap().to_vec1().unwrap()
}

#[test]
fn tokenizer_matches_transformers() {
    let e = expected();
    let dir = model_dir().join("Qwen3-Embedding-0.6B");
    let text =
        TextTokenizer::from_dir(&dir, TEXT_TOKENS, Padding::ToLimit).unwrap().encode(&text_prompt(&meta())).unwrap();
    let ids: Vec<i64> = text.ids.iter().map(|&i| i as i64).collect();
    assert_eq!(ids, ints(&e["text_input_ids"]), "text ids (left padding read from tokenizer_config.json)");
    let mask: Vec<i64> = text.mask.iter().map(|&m| m as i64).collect();
    assert_eq!(mask, ints(&e["text_attention_mask"]));
    assert!(!text.mask[0] && text.mask[TEXT_TOKENS - 1], "Qwen3-Embedding pads on the left");

    let lyrics = TextTokenizer::from_dir(&dir, LYRIC_TOKENS, Padding::ToLimit).unwrap().encode(&meta().lyrics).unwrap();
    let ids: Vec<i64> = lyrics.ids.iter().map(|&i| i as i64).collect();
    assert_eq!(ids, ints(&e["lyric_input_ids"]));
}

#[test]
fn qwen3_matches_transformers() {
    qwen3_matches(KernelPolicy::cpu());
}

/// The Mac (Metal) and CUDA path on the CPU: the kernel policy those devices get, where
/// any op without a Metal and a CUDA forward errs (`model::policy`). Likewise for the
/// condition encoder and the VAE encoder below.
#[test]
fn qwen3_under_the_gpu_policy_matches_transformers() {
    qwen3_matches(KernelPolicy::gpu());
}

fn qwen3_matches(kernels: KernelPolicy) {
    let e = expected();
    let folder = ModelFolder::open(&model_dir(), None).unwrap();
    let f = TensorFile::open(&folder.text_dir().join("model.safetensors"), &Device::Cpu).unwrap();
    let qwen = Qwen3Encoder::load(&folder.text, &f).unwrap().with_kernels(kernels);
    let ids: Vec<u32> = ints(&e["text_input_ids"]).iter().map(|&i| i as u32).collect();
    let out = qwen.forward(&ids).unwrap();
    let err = max_diff(&out, &e["text_hidden_states"]);
    println!("qwen3 last hidden state [{}x{}]: max abs err {err:.2e}", out.dim(0).unwrap(), out.dim(1).unwrap());
    assert!(err < 1e-4, "qwen3 err {err}");
}

#[test]
fn condition_encoder_matches_diffusers() {
    condition_encoder_matches(KernelPolicy::cpu());
}

#[test]
fn condition_encoder_under_the_gpu_policy_matches_diffusers() {
    condition_encoder_matches(KernelPolicy::gpu());
}

fn condition_encoder_matches(kernels: KernelPolicy) {
    let e = expected();
    let folder = ModelFolder::open(&model_dir(), None).unwrap();
    let qf = TensorFile::open(&folder.text_dir().join("model.safetensors"), &Device::Cpu).unwrap();
    let qwen = Qwen3Encoder::load(&folder.text, &qf).unwrap().with_kernels(kernels);
    let df = TensorFile::open(&folder.dit_weights(), &Device::Cpu).unwrap();
    let enc = ConditionEncoder::load(&folder.encoder, &df, "encoder").unwrap().with_kernels(kernels);
    let mask = |k: &str| -> Vec<bool> { ints(&e[k]).iter().map(|&m| m != 0).collect() };
    let lyric_ids: Vec<u32> = ints(&e["lyric_input_ids"]).iter().map(|&i| i as u32).collect();
    let lyrics = qwen.embed(&lyric_ids).unwrap();
    // Training's timbre reference: one zero frame.
    let zero_reference = Tensor::zeros((1, folder.encoder.timbre_hidden_dim), DType::F32, &Device::Cpu).unwrap();
    let packed = enc
        .forward(
            &e["text_hidden_states"],
            &mask("text_attention_mask"),
            &lyrics,
            &mask("lyric_attention_mask"),
            &zero_reference,
        )
        .unwrap();
    let err = max_diff(&packed.states, &e["encoder_hidden_states"]);
    // Padded lyric rows whose sliding window holds no valid key attend uniformly:
    // finite, and equal to the reference (f32 minimum masks, not -inf).
    let finite = packed.states.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().all(|x| x.is_finite());
    println!("condition encoder [{:?}]: max abs err {err:.2e}", packed.states.dims());
    assert!(finite);
    assert!(err < 1e-4, "condition encoder err {err}");
    let want: Vec<bool> = e["encoder_attention_mask"].to_vec1::<f32>().unwrap().iter().map(|&m| m != 0.0).collect();
    assert_eq!(packed.mask, want);
}

#[test]
fn vae_encoder_matches_diffusers_whole_and_chunked() {
    vae_encoder_matches(KernelPolicy::cpu());
}

#[test]
fn vae_encoder_under_the_gpu_policy_matches_diffusers_whole_and_chunked() {
    vae_encoder_matches(KernelPolicy::gpu());
}

fn vae_encoder_matches(kernels: KernelPolicy) {
    let e = expected();
    let folder = ModelFolder::open(&model_dir(), None).unwrap();
    let vae = folder.latent_encoder(&Device::Cpu).unwrap().with_kernels(kernels);
    assert_eq!((vae.sample_rate(), vae.frames_per_second(), vae.latent_channels()), (48_000, 25.0, 8));
    let audio = clip();
    let n = audio.left.len();
    let x =
        Tensor::from_vec(audio.left.iter().chain(&audio.right).copied().collect::<Vec<f32>>(), (2, n), &Device::Cpu)
            .unwrap();

    let whole = vae.encoder().encode(&x, 10_000, &Cancel::never(), &mut |_, _| {}).unwrap();
    let err_mean = max_diff(&whole.mean, &e["vae_mean"]);
    let err_scale = max_diff(&whole.scale, &e["vae_scale"]);
    let err_std = max_diff(&whole.std().unwrap(), &e["vae_std"]);
    let chunked = vae.encoder().encode(&x, 7, &Cancel::never(), &mut |_, _| {}).unwrap();
    let err_chunk = max_diff(&chunked.mean, &whole.mean).max(max_diff(&chunked.scale, &whole.scale));
    let scale: f32 = e["vae_mean"].abs().unwrap().max_all().unwrap().to_scalar().unwrap();
    println!(
        "vae [{:?}], |mean| max {scale:.2}: mean err {err_mean:.2e}, scale err {err_scale:.2e}, std err {err_std:.2e}, chunked(7) vs whole {err_chunk:.2e}",
        whole.mean.dims()
    );
    assert!(err_mean < 1e-4 && err_scale < 1e-4 && err_std < 1e-4);
    assert!(err_chunk < 1e-5, "chunked vs whole {err_chunk}");

    // LatentEncoder: the mean by default; a seeded sample is reproducible and differs.
    let z = vae.encode(&audio).unwrap();
    assert!(max_diff(&z, &e["vae_mean"]) < 1e-4);
    let vae = vae.with_choice(LatentChoice::Sample { seed: 7 });
    let (a, b) = (vae.encode(&audio).unwrap(), vae.encode(&audio).unwrap());
    assert_eq!(max_diff(&a, &b), 0.0);
    assert!(max_diff(&a, &e["vae_mean"]) > 1e-3);
}

/// Seeded stereo noise `[2, n]` in [-0.5, 0.5).
fn noise_audio(n: usize, seed: u64) -> Tensor {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let v: Vec<f32> = (0..2 * n).map(|_| rng.random_range(-0.5f32..0.5)).collect();
    Tensor::from_vec(v, (2, n), &Device::Cpu).unwrap()
}

#[test]
fn vae_encoder_tiles_equal_the_untiled_encode_on_a_long_song() {
    let folder = ModelFolder::open(&model_dir(), None).unwrap();
    let vae = folder.latent_encoder(&Device::Cpu).unwrap();
    let (enc, never) = (vae.encoder(), Cancel::never());
    let hop = enc.config().hop();
    // The stated receptive field: a change of one sample moves only the frames within
    // it (ACE-Step's ratios, so ACE-Step's bound: 26249 samples, 13.7 frames).
    let rf = enc.config().receptive_field();
    assert_eq!(rf, 26_249);
    let (frames, p) = (120, 60 * hop + 7);
    let x = noise_audio(frames * hop, 1);
    let bumped = x.slice_assign(&[0..1, p..p + 1], &Tensor::ones((1, 1), DType::F32, &Device::Cpu).unwrap()).unwrap();
    let (a, b) = (
        enc.encode(&x, 100_000, &never, &mut |_, _| {}).unwrap(),
        enc.encode(&bumped, 100_000, &never, &mut |_, _| {}).unwrap(),
    );
    let changed: Vec<f32> = (&a.mean - &b.mean).unwrap().abs().unwrap().max(1).unwrap().to_vec1().unwrap();
    let first = changed.iter().position(|&d| d > 0.0).unwrap();
    let last = changed.iter().rposition(|&d| d > 0.0).unwrap();
    println!(
        "sample {p} (frame {}) changes frames {first}..={last}; bound {:.1} frames either side",
        p / hop,
        rf as f64 / hop as f64
    );
    assert!(p - first * hop <= rf + hop && (last + 1) * hop - p <= rf + hop, "outside the receptive field");
    assert!(last - first >= 4, "the bound is exercised");

    // 80 s plus a part frame: in the default tiles (250 frames + overlap) as one pass.
    let x = noise_audio(2000 * hop + 777, 2);
    let whole = enc.encode(&x, 100_000, &never, &mut |_, _| {}).unwrap();
    let tiled = enc.encode(&x, TILE_FRAMES, &never, &mut |_, _| {}).unwrap();
    let err = max_diff(&tiled.mean, &whole.mean).max(max_diff(&tiled.scale, &whole.scale));
    println!("2000 frames in tiles of {TILE_FRAMES} vs whole: max abs err {err:.2e}");
    assert_eq!(whole.mean.dims(), &[2000, 8]);
    assert!(err <= 1e-5, "tiled vs whole {err}");
}

#[test]
fn vae_encode_reports_each_tile_and_a_cancel_stops_within_one() {
    let folder = ModelFolder::open(&model_dir(), None).unwrap();
    let vae = folder.latent_encoder(&Device::Cpu).unwrap().with_chunk_frames(50);
    let x = noise_audio(300 * 1920, 3);
    let audio = StereoAudio {
        sample_rate: 48_000,
        left: x.get(0).unwrap().to_vec1().unwrap(),
        right: x.get(1).unwrap().to_vec1().unwrap(),
    };
    // 300 frames (12 s) in tiles of 50: six reports, 2 s apart.
    let mut seen = Vec::new();
    vae.encode_cancellable(&audio, &Cancel::never(), &mut |done, total| seen.push((done, total))).unwrap();
    let want: Vec<(f64, f64)> = (1..=6).map(|i| (2.0 * i as f64, 12.0)).collect();
    assert_eq!(seen, want);

    // A cancel during the first tile: the encode ends before a second one starts.
    let cancel = Cancel::default();
    let mut tiles = 0;
    let r = vae.encode_cancellable(&audio, &cancel, &mut |_, _| {
        tiles += 1;
        cancel.cancel();
    });
    assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
    assert_eq!(tiles, 1);
}

/// A complete model folder laid out as the Hugging Face cache holds it
/// (`models--ACE-Step--Ace-Step1.5/snapshots/<rev>/...`, `refs/main`), with the tiny
/// components' files and a silence latent this test writes in torch's zip format.
fn write_tiny_hf_cache(cache: &Path) -> (PathBuf, Tensor) {
    let repo = cache.join("models--ACE-Step--Ace-Step1.5");
    let snap = repo.join("snapshots").join("0123abcd");
    for sub in ["acestep-v15-turbo", "vae", "Qwen3-Embedding-0.6B"] {
        let (src, dst) = (model_dir().join(sub), snap.join(sub));
        std::fs::create_dir_all(&dst).unwrap();
        for f in std::fs::read_dir(&src).unwrap().flatten() {
            std::fs::copy(f.path(), dst.join(f.file_name())).unwrap();
        }
    }
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abcd\n").unwrap();
    // [1, C, F] like ACE-Step's file.
    let silence = Tensor::randn(0f32, 1.0, (1, 8, 40), &Device::Cpu).unwrap();
    write_pt(&snap.join("acestep-v15-turbo/silence_latent.pt"), &[(None, &silence)]).unwrap();
    (snap, silence.squeeze(0).unwrap().t().unwrap())
}

#[test]
fn model_folder_end_to_end_matches_reference_preprocessing() {
    let e = expected();
    let folder = ModelFolder::open(&model_dir(), None).unwrap();
    assert_eq!(folder.variant(), Variant::Turbo);
    assert!(
        matches!(folder.default_timestep_sampling(), ostinato_engine::model::timesteps::TimestepSampling::Turbo { shift } if shift == 3.0)
    );
    DecoderWeights::load(&[&folder.dit_weights()], &folder.dit, DType::F32, &Device::Cpu).unwrap();

    // Encode + condition one clip, as `ostinato preprocess` does.
    let vae = folder.latent_encoder(&Device::Cpu).unwrap();
    let cond = folder.conditioner(&Device::Cpu).unwrap();
    let latents = vae.encode(&clip()).unwrap();
    let t = latents.dim(0).unwrap();
    let c = cond.condition(&meta(), t).unwrap();
    let sample = TrainingSample {
        source: PathBuf::from("clip.wav"),
        attention_mask: Tensor::ones(t, DType::F32, &Device::Cpu).unwrap(),
        target_latents: latents,
        encoder_hidden_states: c.encoder_hidden_states,
        encoder_attention_mask: c.encoder_attention_mask,
        context_latents: c.context_latents,
    };
    let errs = [
        ("target_latents", max_diff(&sample.target_latents, &e["target_latents"])),
        ("encoder_hidden_states", max_diff(&sample.encoder_hidden_states, &e["encoder_hidden_states"])),
        ("encoder_attention_mask", max_diff(&sample.encoder_attention_mask, &e["encoder_attention_mask"])),
        ("context_latents", max_diff(&sample.context_latents, &e["context_latents"])),
    ];
    println!("end to end vs reference preprocessing: {errs:?}");
    for (k, err) in errs {
        assert!(err < 1e-4, "{k}: {err}");
    }

    // Written and read back.
    let dir = tempfile::tempdir().unwrap();
    let files =
        write_preprocessed(dir.path(), std::slice::from_ref(&sample), &Manifest::new(vae.id(), cond.id())).unwrap();
    assert_eq!(files, [dir.path().join("clip.safetensors")]);
    let model = SampleMaker { encoder: &vae, conditioner: &cond, condition_width: folder.dit.encoder_hidden_size };
    let back = read_preprocessed_dir(dir.path(), &model).unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(max_diff(&back[0].encoder_hidden_states, &sample.encoder_hidden_states), 0.0);
    assert_eq!(max_diff(&back[0].context_latents, &sample.context_latents), 0.0);
}

#[test]
fn hf_cache_layout_and_test_written_silence_latent() {
    let cache = tempfile::tempdir().unwrap();
    let (snap, silence) = write_tiny_hf_cache(cache.path());
    let folder = ModelFolder::find_in_hf_cache(Some(cache.path())).unwrap();
    assert_eq!(folder.root, snap);
    assert_eq!(max_diff(&folder.silence_latent().unwrap(), &silence), 0.0);
    // The DiT folder itself is accepted too.
    let direct = ModelFolder::open(&snap.join("acestep-v15-turbo"), None).unwrap();
    assert_eq!(direct.root, snap);
    let c = folder.conditioner(&Device::Cpu).unwrap().condition(&meta(), 50).unwrap();
    assert_eq!(c.context_latents.dims(), [50, 16]);
    // Frames past the silence latent's 40 wrap to its start, as ACE-Step pads.
    assert_eq!(
        max_diff(
            &c.context_latents.narrow(0, 40, 10).unwrap().narrow(1, 0, 8).unwrap(),
            &silence.narrow(0, 0, 10).unwrap()
        ),
        0.0
    );

    // A base variant by config.
    let cfg_path = snap.join("acestep-v15-turbo/config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["model_version"] = "base".into();
    cfg["is_turbo"] = false.into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let base = ModelFolder::open(&snap, None).unwrap();
    assert_eq!(base.variant(), Variant::Base);
}

#[test]
fn validation_names_every_missing_or_malformed_file() {
    let cache = tempfile::tempdir().unwrap();
    let (snap, _) = write_tiny_hf_cache(cache.path());
    std::fs::remove_file(snap.join("vae/diffusion_pytorch_model.safetensors")).unwrap();
    std::fs::write(snap.join("Qwen3-Embedding-0.6B/config.json"), "{ not json").unwrap();
    std::fs::write(snap.join("acestep-v15-turbo/silence_latent.pt"), b"PK garbage").unwrap();
    std::fs::remove_file(snap.join("Qwen3-Embedding-0.6B/tokenizer.json")).unwrap();
    let err = ModelFolder::open(&snap, None).err().expect("invalid folder");
    let Error::ModelFolder { problems, .. } = &err else { panic!("{err}") };
    println!("{err}");
    let text = err.to_string();
    for file in [
        "diffusion_pytorch_model.safetensors",
        "Qwen3-Embedding-0.6B/config.json",
        "silence_latent.pt",
        "tokenizer.json",
    ] {
        assert!(text.contains(file), "{file} not named in: {text}");
    }
    assert!(problems.len() >= 4);
}

#[test]
fn reads_acestep_preprocessed_pt() {
    let e = expected();
    let s = read_sample(&real_dir().join("acestep_sample.pt")).unwrap();
    // Saved in bf16 with a bool mask by ACE-Step's trainer.
    let rel = |a: &Tensor, b: &Tensor| {
        let scale: f32 = b.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
        max_diff(a, b) / scale.max(1e-6)
    };
    assert!(rel(&s.target_latents, &e["target_latents"]) < 1e-2);
    assert!(rel(&s.encoder_hidden_states, &e["encoder_hidden_states"]) < 1e-2);
    assert!(rel(&s.context_latents, &e["context_latents"]) < 1e-2);
    assert_eq!(max_diff(&s.encoder_attention_mask, &e["encoder_attention_mask"]), 0.0);
    assert_eq!(s.attention_mask.sum_all().unwrap().to_scalar::<f32>().unwrap(), 50.0);
}

/// A copy of the tiny model folder the test may break.
fn model_copy(dir: &Path) -> PathBuf {
    let root = dir.join("model");
    for sub in ["acestep-v15-turbo", "vae", "Qwen3-Embedding-0.6B"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
        for f in std::fs::read_dir(model_dir().join(sub)).unwrap().flatten() {
            std::fs::copy(f.path(), root.join(sub).join(f.file_name())).unwrap();
        }
    }
    root
}

#[test]
fn weight_check_reads_headers_and_names_every_misfit_with_its_config() {
    let folder = ModelFolder::open(&model_dir(), None).unwrap();
    let checked = folder.check_weights().unwrap();
    println!("tiny model folder: {checked} tensors checked");
    let dit = ostinato_engine::model::weights::expected_shapes(&folder.dit).len();
    assert!(checked > dit, "the encoders' tensors are checked too: {checked} vs the DiT's {dit}");

    // A config whose MLP width disagrees with the weights: every MLP tensor of both
    // layers is named, with config.json, and training's load names config.json too.
    let tmp = tempfile::tempdir().unwrap();
    let root = model_copy(tmp.path());
    let cfg_path = root.join("acestep-v15-turbo/config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["intermediate_size"] = 48.into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let folder = ModelFolder::open(&root, None).unwrap();
    let err = folder.check_weights().unwrap_err().to_string();
    println!("{err}");
    for layer in 0..2 {
        for proj in ["gate_proj", "up_proj", "down_proj"] {
            assert!(
                err.contains(&format!("decoder.layers.{layer}.mlp.{proj}.weight")),
                "{proj} of layer {layer}: {err}"
            );
        }
    }
    assert!(err.contains("model.safetensors") && err.contains(&cfg_path.display().to_string()), "{err}");
    let load = folder.load_decoder(DType::F32, &Device::Cpu).err().expect("shapes differ").to_string();
    assert!(load.contains(&cfg_path.display().to_string()) && load.contains("up_proj"), "{load}");

    // A mis-shaped tensor in the VAE and a missing one in Qwen3 are named by file.
    let tmp = tempfile::tempdir().unwrap();
    let root = model_copy(tmp.path());
    let edit = |path: PathBuf, f: &dyn Fn(&mut HashMap<String, Tensor>)| {
        let mut t = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
        f(&mut t);
        candle_core::safetensors::save(&t, &path).unwrap();
    };
    edit(root.join("vae/diffusion_pytorch_model.safetensors"), &|t| {
        t.insert("encoder.conv1.bias".into(), Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap());
    });
    edit(root.join("Qwen3-Embedding-0.6B/model.safetensors"), &|t| {
        let key = t.keys().find(|k| k.ends_with("layers.1.mlp.up_proj.weight")).unwrap().clone();
        t.remove(&key);
    });
    let err = ModelFolder::open(&root, None).unwrap().check_weights().unwrap_err().to_string();
    println!("{err}");
    assert!(err.contains("diffusion_pytorch_model.safetensors: tensor `encoder.conv1.bias` has shape [3]"), "{err}");
    assert!(
        err.contains("Qwen3-Embedding-0.6B/model.safetensors: missing tensor")
            && err.contains("layers.1.mlp.up_proj.weight"),
        "{err}"
    );
}

/// The tiny fixture has no top-level `null_condition_emb` (only a stray
/// `encoder.null_condition_emb`): CFG dropout names the file. A test-only copy with
/// the key loads it, and the variant sets the default ratio.
#[test]
fn null_condition_is_read_from_the_checkpoint_or_its_absence_named() {
    let source = |root: PathBuf| ModelSource::Folder { path: root };
    let (missing, ratio) = source(model_dir()).guidance(&Device::Cpu).unwrap();
    let why = missing.expect_err("the fixture has no top-level null condition");
    assert!(why.contains("acestep-v15-turbo/model.safetensors has no `null_condition_emb`"), "{why}");
    assert_eq!((ratio, Variant::Base.default_cfg_dropout()), (0.0, 0.15), "turbo 0, base/SFT 0.15");

    let tmp = tempfile::tempdir().unwrap();
    let root = model_copy(tmp.path());
    let weights = root.join("acestep-v15-turbo/model.safetensors");
    let mut tensors = candle_core::safetensors::load(&weights, &Device::Cpu).unwrap();
    let null = Tensor::randn(0f32, 1., (1, 1, 32), &Device::Cpu).unwrap();
    tensors.insert("null_condition_emb".into(), null.clone());
    candle_core::safetensors::save(&tensors, &weights).unwrap();
    let loaded = source(root.clone()).guidance(&Device::Cpu).unwrap().0.unwrap();
    assert_eq!(max_diff(&loaded, &null), 0.0);

    tensors.insert("null_condition_emb".into(), Tensor::zeros((1, 1, 16), DType::F32, &Device::Cpu).unwrap());
    candle_core::safetensors::save(&tensors, &weights).unwrap();
    let err = source(root).guidance(&Device::Cpu).expect_err("mis-shaped").to_string();
    assert!(err.contains("model.safetensors") && err.contains("null_condition_emb"), "{err}");
}

#[test]
fn a_truncated_weights_file_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let root = model_copy(tmp.path());
    let weights = root.join("acestep-v15-turbo/model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() - 1000]).unwrap();
    let err = ModelFolder::open(&root, None).err().expect("truncated").to_string();
    println!("{err}");
    assert!(err.contains(&weights.display().to_string()), "{err}");
}

#[test]
fn a_component_folder_or_a_file_is_no_model_and_says_so() {
    let vae = ModelFolder::open(&model_dir().join("vae"), None).err().unwrap().to_string();
    assert!(vae.contains("vae/ part"), "{vae}");
    let file = model_dir().join("vae/config.json");
    let err = ModelFolder::open(&file, None).err().unwrap().to_string();
    assert!(err.contains("is a file, not a model folder"), "{err}");
    // A VAE config read as the DiT's names the file and what it is.
    let err = ostinato_engine::model::DitConfig::from_file(&file).unwrap_err().to_string();
    assert!(err.contains(&file.display().to_string()) && err.contains("AutoencoderOobleck"), "{err}");
}

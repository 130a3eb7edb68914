//! End-to-end tests of the `ostinato` binary on audio the tests generate.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ostinato_engine::data::synth;
use ostinato_engine::events::{read_events, Event};

fn ostinato() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ostinato"))
}

/// Three demo clips in a folder of their own.
fn audio(dir: &Path) -> PathBuf {
    let audio = dir.join("songs");
    synth::write_demo(&audio).unwrap();
    for entry in std::fs::read_dir(&audio).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !["pluck_arpeggio", "drum_groove", "funk_bass"].iter().any(|p| name.starts_with(p)) {
            std::fs::remove_file(path).unwrap();
        }
    }
    audio
}

/// `train <audio> --demo` with quick settings and the given extra flags.
fn train(dir: &Path, audio: &Path, name: &str, extra: &[&str]) -> Command {
    let mut c = ostinato();
    c.args(["train", audio.to_str().unwrap(), "--demo", "--name", name])
        .args(["--runs-dir", dir.join("runs").to_str().unwrap()])
        .args(["--crop-seconds", "3", "--rank", "4", "--alpha", "8", "--lr", "1e-3", "--seed", "3"])
        .args(["--save-every-steps", "3"])
        .args(extra)
        .env("XDG_CACHE_HOME", dir.join("cache"));
    c
}

fn ok(out: Output) -> Output {
    assert!(
        out.status.success(),
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn step_losses(run: &Path) -> Vec<(u64, u64, f64)> {
    read_events(&run.join("events.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(|e| match e {
            Event::Step { step, epoch, loss, .. } => Some((step, epoch, loss)),
            _ => None,
        })
        .collect()
}

fn adapter(run: &Path) -> Vec<u8> {
    std::fs::read(run.join("final/adapter/adapter_model.safetensors")).unwrap()
}

#[test]
fn train_writes_an_adapter_and_the_loss_falls() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let out = ok(train(tmp.path(), &songs, "demo", &["--epochs", "12"]).output().unwrap());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let run = tmp.path().join("runs/demo");
    assert!(stdout.contains(&run.join("final/adapter/adapter_model.safetensors").display().to_string()), "{stdout}");
    assert!(!adapter(&run).is_empty());

    let losses = step_losses(&run);
    assert_eq!(losses.len(), 36);
    let epoch_mean = |e: u64| {
        let l: Vec<f64> = losses.iter().filter(|s| s.1 == e).map(|s| s.2).collect();
        l.iter().sum::<f64>() / l.len() as f64
    };
    let (first, last) = ((epoch_mean(0) + epoch_mean(1)) / 2.0, (epoch_mean(10) + epoch_mean(11)) / 2.0);
    println!("mean loss of the first two epochs {first:.4}, of the last two {last:.4}");
    assert!(last < first, "loss falls: {first} -> {last}");

    // `runs` lists it as finished with its adapter.
    let out = ok(ostinato().args(["runs", "--json", "--runs-dir", tmp.path().join("runs").to_str().unwrap()]).output().unwrap());
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(runs[0]["status"], "finished");
    assert_eq!(runs[0]["steps"], 36);

    // Every export format writes.
    for (format, to) in [("peft", "peft"), ("comfyui", "comfy.safetensors"), ("merged", "merged.safetensors")] {
        let to = tmp.path().join(to);
        ok(ostinato().args(["export", run.to_str().unwrap(), "--format", format, "--to", to.to_str().unwrap()]).output().unwrap());
        assert!(to.exists(), "{format}");
    }
}

#[test]
fn json_mode_prints_only_events() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let out = ok(train(tmp.path(), &songs, "json", &["--max-steps", "2", "--json"]).output().unwrap());
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("every stdout line is a JSON event"))
        .collect();
    assert!(lines.iter().all(|l| l["v"] == 1 && l["type"].is_string()));
    assert_eq!(lines.last().unwrap()["type"], "finished");
}

#[test]
fn stop_at_step_then_resume_matches_an_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    ok(train(tmp.path(), &songs, "straight", &["--max-steps", "8"]).output().unwrap());
    ok(train(tmp.path(), &songs, "split", &["--max-steps", "8", "--stop-at-step", "4"]).output().unwrap());
    let split = tmp.path().join("runs/split");
    assert_eq!(step_losses(&split).len(), 4);
    ok(ostinato().args(["resume", split.to_str().unwrap()]).output().unwrap());
    let straight = tmp.path().join("runs/straight");
    assert_eq!(step_losses(&straight), step_losses(&split));
    assert!(adapter(&straight) == adapter(&split), "identical adapter bytes");
}

#[test]
fn sigint_mid_run_stops_gracefully_and_leaves_a_resumable_run() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let mut child = train(tmp.path(), &songs, "interrupted", &["--max-steps", "200"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let run = tmp.path().join("runs/interrupted");
    let deadline = Instant::now() + Duration::from_secs(300);
    while !run.join("events.jsonl").exists() || step_losses(&run).len() < 3 {
        assert!(Instant::now() < deadline, "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: sending SIGINT to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let events = read_events(&run.join("events.jsonl")).unwrap();
    let stopped_at = events.iter().find_map(|e| match e {
        Event::Stopped { step, .. } => Some(*step),
        _ => None,
    });
    let stopped_at = stopped_at.expect("a stopped event");
    assert!(stopped_at < 200);
    assert!(run.join(format!("checkpoints/step-{stopped_at:06}")).is_dir());

    let out = ok(ostinato().args(["resume", run.to_str().unwrap(), "--stop-at-step", &(stopped_at + 2).to_string()]).output().unwrap());
    assert!(String::from_utf8_lossy(&out.stdout).contains("adapter:"));
    assert_eq!(step_losses(&run).last().unwrap().0, stopped_at + 2);
}

fn fails_with(cmd: &mut Command, needle: &str) {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "should fail: {stderr}");
    assert!(stderr.contains(needle), "stderr should mention `{needle}`:\n{stderr}");
}

#[test]
fn bad_input_gives_clear_errors_and_non_zero_exit() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let runs = runs.to_str().unwrap();
    fails_with(ostinato().args(["train", "/nonexistent/songs", "--runs-dir", runs]), "/nonexistent/songs");

    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    fails_with(ostinato().args(["train", empty.to_str().unwrap(), "--runs-dir", runs, "--name", "e"]), "no audio files");

    let junk = tmp.path().join("junk");
    std::fs::create_dir(&junk).unwrap();
    std::fs::write(junk.join("song.wav"), "not audio at all").unwrap();
    fails_with(ostinato().args(["train", junk.to_str().unwrap(), "--runs-dir", runs, "--name", "j"]), "no usable audio");

    let songs = audio(tmp.path());
    let bad_model = tmp.path().join("model");
    std::fs::create_dir(&bad_model).unwrap();
    fails_with(
        ostinato().args(["train", songs.to_str().unwrap(), "--model", bad_model.to_str().unwrap(), "--runs-dir", runs, "--name", "m"]),
        "model",
    );
    fails_with(ostinato().args(["train", songs.to_str().unwrap(), "--precision", "fp8"]), "fp8");
    fails_with(ostinato().args(["train", songs.to_str().unwrap(), "--epochs", "many"]), "many");
    fails_with(ostinato().args(["inspect", bad_model.to_str().unwrap()]), "config.json");
}

#[test]
fn preprocess_then_train_on_the_preprocessed_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let out = tmp.path().join("pre");
    ok(ostinato().args(["preprocess", songs.to_str().unwrap(), "--out", out.to_str().unwrap(), "--crop-seconds", "3"]).output().unwrap());
    let written: Vec<_> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(written.iter().filter(|n| n.to_string_lossy().ends_with(".safetensors")).count(), 3, "{written:?}");
    let sample = candle_core::safetensors::load(out.join(written.iter().find(|n| n.to_string_lossy().ends_with(".safetensors")).unwrap()), &candle_core::Device::Cpu).unwrap();
    for key in ["target_latents", "attention_mask", "encoder_hidden_states", "encoder_attention_mask", "context_latents"] {
        assert!(sample.contains_key(key), "{key}");
    }
    assert_eq!(sample["target_latents"].dims(), &[75, 64]);
    assert_eq!(sample["context_latents"].dims(), &[75, 128]);

    ok(train(tmp.path(), &out, "pre", &["--max-steps", "3"]).output().unwrap());
    assert_eq!(step_losses(&tmp.path().join("runs/pre")).len(), 3);
}

#[test]
fn trains_an_acestep_model_folder_end_to_end() {
    // The tiny random ACE-Step model the real-model fixtures were made with: every
    // component (DiT, VAE, Qwen3, condition encoder, silence latent) in the real layout.
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/real/model");
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let mut c = ostinato();
    c.args(["train", songs.to_str().unwrap(), "--model", model.to_str().unwrap(), "--name", "real"])
        .args(["--runs-dir", tmp.path().join("runs").to_str().unwrap()])
        .args(["--crop-seconds", "2", "--rank", "2", "--max-steps", "3"])
        .env("XDG_CACHE_HOME", tmp.path().join("cache"));
    ok(c.output().unwrap());
    let run = tmp.path().join("runs/real");
    assert_eq!(step_losses(&run).len(), 3);
    assert!(step_losses(&run).iter().all(|s| s.2.is_finite()));
    assert!(!adapter(&run).is_empty());
}

#[test]
fn bench_reports_one_configuration_as_json() {
    for (flag, on) in [("off", false), ("on", true)] {
        let out = ok(ostinato()
            .args(["bench", "--cpu", "--preset", "small-30s", "--layers", "1", "--gradient-checkpointing", flag])
            .args(["--warmup", "0", "--steps", "2", "--json"])
            .output()
            .unwrap());
        // --json: one JSON object is all of stdout.
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["layers"], 1);
        assert_eq!(report["gradient_checkpointing"], on);
        assert_eq!(report["step_times_s"].as_array().unwrap().len(), 2);
        for key in ["median_s_per_step", "peak_rss_bytes", "activation_bytes", "activation_heap_bytes"] {
            assert!(report[key].as_f64().unwrap() > 0.0, "{key}: {report}");
        }
    }
    let err = ostinato().args(["bench", "--preset", "huge"]).output().unwrap();
    assert!(!err.status.success() && String::from_utf8_lossy(&err.stderr).contains("huge"));
    let err = ostinato().args(["bench", "--gradient-checkpointing", "maybe"]).output().unwrap();
    assert!(!err.status.success() && String::from_utf8_lossy(&err.stderr).contains("maybe"));
}

/// `generate --demo` with a short duration and the given extra flags.
fn generate(out: &Path, extra: &[&str]) -> Command {
    let mut c = ostinato();
    c.args(["generate", "--demo", "--caption", "warm lo-fi piano", "--duration", "2", "--out", out.to_str().unwrap()]).args(extra);
    c
}

#[test]
fn generate_is_deterministic_and_decode_reproduces_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, c) = (tmp.path().join("a.wav"), tmp.path().join("b.wav"), tmp.path().join("c.wav"));
    let latents = tmp.path().join("a.safetensors");
    let out = ok(generate(&a, &["--seed", "5", "--json", "--latents-out", latents.to_str().unwrap()]).output().unwrap());
    ok(generate(&b, &["--seed", "5"]).output().unwrap());
    ok(generate(&c, &["--seed", "6"]).output().unwrap());
    let bytes = std::fs::read(&a).unwrap();
    assert_eq!(bytes, std::fs::read(&b).unwrap(), "the same arguments give the same bytes");
    assert_ne!(bytes, std::fs::read(&c).unwrap(), "another seed, another song");

    // 48 kHz stereo, 2 s = 50 latent frames of 1920 samples, audible.
    let audio = ostinato_engine::data::audio::decode(&a).unwrap();
    assert_eq!((audio.sample_rate, audio.frames()), (48_000, 50 * 1920));
    println!("demo song peak {:.3}", audio.peak());
    // Audible, and bounded (at most every mel band at full scale).
    assert!(audio.peak() > 1e-3 && audio.peak() < 96.0);

    // JSON events: started, 8 steps, decoding, written.
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let types: Vec<&str> = lines.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, [&["started"][..], &["step"; 8], &["decoding", "written"]].concat());
    assert_eq!(lines[0]["frames"], 50);

    // The latents decode to the same WAV.
    let d = tmp.path().join("d.wav");
    ok(ostinato().args(["decode", latents.to_str().unwrap(), "--demo", "--out", d.to_str().unwrap()]).output().unwrap());
    assert_eq!(std::fs::read(&d).unwrap(), bytes);
}

/// A PEFT adapter for `source`'s DiT with random A and B (r 2), saved in `dir`.
fn random_adapter(source: &ostinato_engine::model::source::ModelSource, dir: &Path, targets: &[&str]) {
    use ostinato_engine::lora::{LoraAdapter, LoraConfig};
    let dev = candle_core::Device::Cpu;
    let (cfg, w) = source.load_decoder(candle_core::DType::F32, &dev).unwrap();
    let dit = ostinato_engine::model::DitModel::new(&cfg, &w).unwrap();
    let config = LoraConfig { r: 2, alpha: 4.0, dropout: 0.0, target_modules: targets.iter().map(|t| t.to_string()).collect(), use_rslora: false };
    let fresh = LoraAdapter::new(config.clone(), &dit, 1).unwrap();
    let tensors = fresh
        .named_tensors()
        .into_iter()
        .map(|(k, t)| (k, (t.randn_like(0.0, 0.5).unwrap())))
        .collect();
    LoraAdapter::from_tensors(config, &dit, &tensors, dir).unwrap().save_peft(dir).unwrap();
}

#[test]
fn adapter_scale_zero_is_the_base_model_and_one_changes_the_song() {
    let tmp = tempfile::tempdir().unwrap();
    let adapter = tmp.path().join("adapter");
    random_adapter(&ostinato_engine::model::source::ModelSource::Demo, &adapter, &["q_proj", "k_proj", "v_proj", "o_proj"]);
    let song = |name: &str, extra: &[&str]| {
        let p = tmp.path().join(name);
        ok(generate(&p, extra).output().unwrap());
        std::fs::read(p).unwrap()
    };
    let base = song("base.wav", &[]);
    let a = adapter.to_str().unwrap();
    assert_eq!(song("zero.wav", &["--adapter", a, "--adapter-scale", "0"]), base);
    assert_ne!(song("one.wav", &["--adapter", a]), base);
}

#[test]
fn generates_and_decodes_with_an_acestep_model_folder() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/real/model");
    let tmp = tempfile::tempdir().unwrap();
    let (out, latents) = (tmp.path().join("song.wav"), tmp.path().join("z.safetensors"));
    ok(ostinato()
        .args(["generate", "--model", model.to_str().unwrap(), "--caption", "warm lo-fi piano", "--lyrics", "la la la"])
        .args(["--duration", "1", "--out", out.to_str().unwrap(), "--latents-out", latents.to_str().unwrap()])
        .output()
        .unwrap());
    let audio = ostinato_engine::data::audio::decode(&out).unwrap();
    assert_eq!((audio.sample_rate, audio.frames()), (48_000, 25 * 1920));
    let z = candle_core::safetensors::load(&latents, &candle_core::Device::Cpu).unwrap();
    assert_eq!(z["latents"].dims(), [25, 8]);
    let again = tmp.path().join("again.wav");
    ok(ostinato().args(["decode", latents.to_str().unwrap(), "--model", model.to_str().unwrap(), "--out", again.to_str().unwrap()]).output().unwrap());
    assert_eq!(std::fs::read(&again).unwrap(), std::fs::read(&out).unwrap());
    // The turbo model has no guidance to give.
    fails_with(
        ostinato().args(["generate", "--model", model.to_str().unwrap(), "--caption", "x", "--duration", "1", "--guidance", "7"]).args(["--out", again.to_str().unwrap()]),
        "turbo",
    );
}

#[test]
fn bad_generate_and_decode_input_gives_clear_errors_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.wav");
    fails_with(ostinato().args(["generate", "--demo", "--caption", "x", "--duration", "0", "--out", out.to_str().unwrap()]), "duration 0");
    fails_with(ostinato().args(["generate", "--demo", "--caption", "x", "--duration", "601", "--out", out.to_str().unwrap()]), "600");

    let no_config = tmp.path().join("not-an-adapter");
    std::fs::create_dir(&no_config).unwrap();
    fails_with(&mut generate(&out, &["--adapter", no_config.to_str().unwrap()]), "adapter_config.json");

    // An adapter made for another model: the first tensor that does not fit is named.
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/real/model");
    let other = tmp.path().join("other-adapter");
    random_adapter(&ostinato_engine::model::source::ModelSource::Folder { path: model }, &other, &["q_proj"]);
    fails_with(&mut generate(&out, &["--adapter", other.to_str().unwrap()]), "layers.0.cross_attn.q_proj.lora_A.weight` has shape [2, 32]");
    // Targets the model does not have.
    let config = other.join("adapter_config.json");
    let text = std::fs::read_to_string(&config).unwrap().replace("\"q_proj\"", "\"gate_projection\"");
    std::fs::write(&config, text).unwrap();
    fails_with(&mut generate(&out, &["--adapter", other.to_str().unwrap()]), "gate_projection");

    fails_with(&mut generate(&out, &["--guidance", "5"]), "turbo");
    let unwritable = tmp.path().join("no/such/folder/out.wav");
    fails_with(&mut generate(&unwritable, &[]), "no/such/folder/out.wav");

    // Latents of the wrong shape.
    let z = tmp.path().join("z.safetensors");
    let t = candle_core::Tensor::zeros((10, 32), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
    candle_core::safetensors::save(&[("latents".to_string(), t)].into_iter().collect::<std::collections::HashMap<_, _>>(), &z).unwrap();
    fails_with(ostinato().args(["decode", z.to_str().unwrap(), "--demo", "--out", out.to_str().unwrap()]), "[10, 32]");
    fails_with(ostinato().args(["decode", z.to_str().unwrap(), "--out", out.to_str().unwrap()]), "--demo");

    assert!(!out.exists(), "nothing is written on failure");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.iter().all(|n| !n.to_string_lossy().ends_with(".tmp")), "{left:?}");
}

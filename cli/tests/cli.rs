//! End-to-end tests of the `ostinato` binary on audio the tests generate.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ostinato_engine::data::synth;
use ostinato_engine::data::wav::{write_wav, SampleFormat};
use ostinato_engine::events::{read_events, Event};
use ostinato_engine::train::optim::{AdafactorConfig, OptimizerConfig};
use ostinato_engine::train::RunConfig;

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
    let mut c = unnamed_train(dir, audio, extra);
    c.args(["--name", name]);
    c
}

/// As `train`, the run named by the CLI.
fn unnamed_train(dir: &Path, audio: &Path, extra: &[&str]) -> Command {
    let mut c = ostinato();
    c.args(["train", audio.to_str().unwrap(), "--demo"])
        .args(["--runs-dir", dir.join("runs").to_str().unwrap()])
        .args(["--crop-seconds", "3", "--rank", "4", "--alpha", "8", "--lr", "1e-3", "--seed", "3"])
        .args(["--save-every-steps", "3"])
        .args(extra)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("XDG_DATA_HOME", dir.join("data"));
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
    let out = ok(ostinato()
        .args(["runs", "--json", "--runs-dir", tmp.path().join("runs").to_str().unwrap()])
        .output()
        .unwrap());
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(runs[0]["status"], "finished");
    assert_eq!(runs[0]["steps"], 36);

    // Every export format writes.
    for (format, to) in [("peft", "peft"), ("comfyui", "comfy.safetensors"), ("merged", "merged.safetensors")] {
        let to = tmp.path().join(to);
        ok(ostinato()
            .args(["export", run.to_str().unwrap(), "--format", format, "--to", to.to_str().unwrap()])
            .output()
            .unwrap());
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
fn bf16_weights_train_and_are_reported_and_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let args = ["--max-steps", "4", "--precision", "bf16-weights", "--json"];
    let out = ok(train(tmp.path(), &songs, "held", &args).output().unwrap());
    let started = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["type"] == "run_started")
        .expect("a run_started event");
    assert_eq!(started["precision"], "f32, weights held in bf16", "{started}");
    let run = tmp.path().join("runs/held");
    assert!(std::fs::read_to_string(run.join("run.toml")).unwrap().contains("precision = \"bf16-weights\""));
    // Stopped halfway and resumed: the same losses.
    let split = ["--max-steps", "4", "--precision", "bf16-weights", "--stop-at-step", "2"];
    ok(train(tmp.path(), &songs, "split", &split).output().unwrap());
    ok(ostinato().args(["resume", tmp.path().join("runs/split").to_str().unwrap()]).output().unwrap());
    assert_eq!(step_losses(&tmp.path().join("runs/split")), step_losses(&run));
    fails_with(&mut train(tmp.path(), &songs, "bad", &["--precision", "bf8"]), "bf16-weights");
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

    let out = ok(ostinato()
        .args(["resume", run.to_str().unwrap(), "--stop-at-step", &(stopped_at + 2).to_string()])
        .output()
        .unwrap());
    assert!(String::from_utf8_lossy(&out.stdout).contains("adapter:"));
    assert_eq!(step_losses(&run).last().unwrap().0, stopped_at + 2);
}

/// SIGTERM while the songs are being encoded: the run stops before the next song or
/// encoder chunk, not after the whole folder, and ends as a stopped run.
#[test]
fn sigterm_while_the_dataset_is_prepared_stops_promptly() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = tmp.path().join("long");
    std::fs::create_dir(&songs).unwrap();
    // Eight 30 s songs at the encoder's rate, encoded whole (no crop): seconds each.
    let tone: Vec<f32> = (0..48_000 * 30).map(|i| 0.5 * (i as f32 * 0.05).sin()).collect();
    for i in 0..8 {
        write_wav(&songs.join(format!("song{i}.wav")), 48_000, SampleFormat::Int(16), std::slice::from_ref(&tone))
            .unwrap();
    }
    let runs = tmp.path().join("runs");
    let mut child = ostinato()
        .args(["train", songs.to_str().unwrap(), "--demo", "--name", "early", "--json", "--cache"])
        .args(["--runs-dir", runs.to_str().unwrap()])
        .env("XDG_CACHE_HOME", tmp.path().join("cache"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first_song =
        lines.by_ref().map(|l| l.unwrap()).find(|l| l.contains(r#""type":"dataset_progress""#) && l.contains(".wav"));
    assert!(first_song.is_some(), "no dataset_progress line for a song");
    // Keep reading, so the child never blocks on a full pipe.
    let rest = std::thread::spawn(move || lines.map(|l| l.unwrap()).collect::<Vec<_>>());
    // SAFETY: sending SIGTERM to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let sent = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        // A correctness bound, not a benchmark: the whole folder takes far longer.
        assert!(sent.elapsed() < Duration::from_secs(20), "still running 20 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(130));
    let songs_started = rest
        .join()
        .unwrap()
        .iter()
        .filter(|l| l.contains(r#""type":"dataset_progress""#) && l.contains(".wav"))
        .count();
    assert!(songs_started <= 1, "{songs_started} more songs were prepared after SIGTERM");

    let out = ok(ostinato().args(["runs", "--runs-dir", runs.to_str().unwrap(), "--json"]).output().unwrap());
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let early = listed.as_array().unwrap().iter().find(|r| r["name"] == "early").expect("the run is listed");
    assert_eq!(early["status"], "stopped", "{early}");
    assert_eq!(early["steps"], 0, "{early}");
}

fn fails_with(cmd: &mut Command, needle: &str) -> String {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "should fail: {stderr}");
    assert!(stderr.contains(needle), "stderr should mention `{needle}`:\n{stderr}");
    stderr
}

/// As `fails_with`, the cause said once.
fn fails_once_with(cmd: &mut Command, needle: &str) {
    let stderr = fails_with(cmd, needle);
    assert_eq!(stderr.matches(needle).count(), 1, "`{needle}` once:\n{stderr}");
}

#[test]
fn bad_input_gives_clear_errors_and_non_zero_exit() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let runs = runs.to_str().unwrap();
    fails_with(ostinato().args(["train", "/nonexistent/songs", "--runs-dir", runs]), "/nonexistent/songs");

    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    fails_once_with(
        ostinato().args(["train", empty.to_str().unwrap(), "--runs-dir", runs, "--name", "e"]),
        "no audio files",
    );

    let junk = tmp.path().join("junk");
    std::fs::create_dir(&junk).unwrap();
    std::fs::write(junk.join("song.wav"), "not audio at all").unwrap();
    fails_once_with(
        ostinato().args(["train", junk.to_str().unwrap(), "--runs-dir", runs, "--name", "j"]),
        "no usable audio",
    );
    // A start that failed leaves no run behind: the name is free for the next one.
    for name in ["e", "j"] {
        assert!(!tmp.path().join("runs").join(name).exists(), "{name}");
    }
    let songs = audio(tmp.path());
    ok(train(tmp.path(), &songs, "j", &["--max-steps", "1"]).output().unwrap());

    let bad_model = tmp.path().join("model");
    std::fs::create_dir(&bad_model).unwrap();
    fails_with(
        ostinato().args([
            "train",
            songs.to_str().unwrap(),
            "--model",
            bad_model.to_str().unwrap(),
            "--runs-dir",
            runs,
            "--name",
            "m",
        ]),
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
    ok(ostinato()
        .args(["preprocess", songs.to_str().unwrap(), "--out", out.to_str().unwrap(), "--crop-seconds", "3"])
        .output()
        .unwrap());
    let written: Vec<_> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(written.iter().filter(|n| n.to_string_lossy().ends_with(".safetensors")).count(), 3, "{written:?}");
    let sample = candle_core::safetensors::load(
        out.join(written.iter().find(|n| n.to_string_lossy().ends_with(".safetensors")).unwrap()),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    for key in
        ["target_latents", "attention_mask", "encoder_hidden_states", "encoder_attention_mask", "context_latents"]
    {
        assert!(sample.contains_key(key), "{key}");
    }
    assert_eq!(sample["target_latents"].dims(), &[75, 64]);
    assert_eq!(sample["context_latents"].dims(), &[75, 128]);

    ok(train(tmp.path(), &out, "pre", &["--max-steps", "3"]).output().unwrap());
    assert_eq!(step_losses(&tmp.path().join("runs/pre")).len(), 3);
}

/// `preprocess <songs> --out <out>`, with the tiny ACE-Step model or the demo's.
fn preprocess(songs: &Path, out: &Path, model: Option<&Path>) -> Command {
    let mut c = ostinato();
    c.args(["preprocess", songs.to_str().unwrap(), "--out", out.to_str().unwrap(), "--crop-seconds", "2"]);
    if let Some(model) = model {
        c.args(["--model", model.to_str().unwrap()]);
    }
    c
}

#[test]
fn a_preprocessed_folder_trains_only_with_the_model_that_made_it() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let (by_tiny, by_demo) = (tmp.path().join("pre-tiny"), tmp.path().join("pre-demo"));
    ok(preprocess(&songs, &by_tiny, Some(&tiny_model())).output().unwrap());
    ok(preprocess(&songs, &by_demo, None).output().unwrap());
    let (tiny_encoder, demo_encoder) = ("`oobleck-vae:", "`mel-demo-v1:");

    // The tiny model's samples under the demo model: the folder and both ids named.
    let stderr = fails_with(
        &mut train(tmp.path(), &by_tiny, "tiny-on-demo", &["--max-steps", "1"]),
        &format!("{}: was preprocessed with another model", by_tiny.display()),
    );
    assert!(stderr.contains(tiny_encoder) && stderr.contains(demo_encoder), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    // The demo's samples under the tiny model, likewise.
    let mut on_tiny = ostinato();
    on_tiny
        .args(["train", by_demo.to_str().unwrap(), "--model", tiny_model().to_str().unwrap()])
        .args(["--runs-dir", tmp.path().join("runs").to_str().unwrap(), "--name", "demo-on-tiny"])
        .args(["--rank", "2", "--max-steps", "1"])
        .env("XDG_CACHE_HOME", tmp.path().join("cache"));
    let stderr = fails_with(&mut on_tiny, &format!("{}: was preprocessed with another model", by_demo.display()));
    assert!(stderr.contains(tiny_encoder) && stderr.contains(demo_encoder), "{stderr}");

    // Without a manifest (as ACE-Step's own folders come) each sample's widths are
    // checked: the file and the tensor named.
    std::fs::remove_file(by_tiny.join("manifest.json")).unwrap();
    let stderr = fails_with(
        &mut train(tmp.path(), &by_tiny, "no-manifest", &["--max-steps", "1"]),
        "`target_latents`: 8 latent channels, but this run's model has 64",
    );
    assert!(stderr.contains(&by_tiny.display().to_string()) && !stderr.contains("panicked"), "{stderr}");
}

#[test]
fn preprocess_never_writes_into_the_song_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let listing = || {
        let mut names: Vec<_> = std::fs::read_dir(&songs).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        names
    };
    let before = listing();
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&songs, &link).unwrap();
    for out in [songs.clone(), songs.join("pre"), songs.join("new/deeper"), tmp.path().join("x/../songs/pre"), link] {
        fails_with(&mut preprocess(&songs, &out, None), "is inside the song folder");
    }
    assert_eq!(listing(), before, "the song folder is as it was");
    // Beside it is fine.
    ok(preprocess(&songs, &tmp.path().join("songs-pre"), None).output().unwrap());
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
fn trains_validates_previews_generates_and_exports_with_an_xl_model_folder() {
    // The tiny ACE-Step 1.5 XL model: a sharded DiT 40 wide over 32-wide encoders with
    // their own heads, the timbre encoder's special token (engine/tests/xl_model.rs
    // checks it against upstream's XL code).
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/real_xl/model");
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let mut c = ostinato();
    c.args(["train", songs.to_str().unwrap(), "--model", model.to_str().unwrap(), "--name", "xl"])
        .args(["--runs-dir", tmp.path().join("runs").to_str().unwrap()])
        .args(["--crop-seconds", "2", "--rank", "2", "--max-steps", "4", "--cfg-dropout", "0.5"])
        .args([
            "--val-fraction",
            "0.34",
            "--val-every-steps",
            "2",
            "--preview-every-steps",
            "2",
            "--preview-seconds",
            "1",
        ])
        .env("XDG_CACHE_HOME", tmp.path().join("cache"));
    ok(c.output().unwrap());
    let run = tmp.path().join("runs/xl");
    assert!(step_losses(&run).len() == 4 && step_losses(&run).iter().all(|s| s.2.is_finite()));
    let events = read_events(&run.join("events.jsonl")).unwrap();
    let validations = events.iter().filter(|e| matches!(e, Event::Validation { .. })).count();
    let previews = events.iter().filter(|e| matches!(e, Event::Preview { .. })).count();
    assert!(validations >= 2 && previews >= 2, "{validations} validations, {previews} previews");

    // A song from the run's adapter.
    let song = tmp.path().join("song.wav");
    let final_adapter = run.join("final/adapter");
    ok(ostinato()
        .args(["generate", "--model", model.to_str().unwrap(), "--adapter", final_adapter.to_str().unwrap()])
        .args(["--caption", "warm lo-fi piano", "--duration", "1", "--out", song.to_str().unwrap()])
        .output()
        .unwrap());
    let audio = ostinato_engine::data::audio::decode(&song).unwrap();
    assert_eq!((audio.sample_rate, audio.frames()), (48_000, 25 * 1920));

    // Every export; the merged DiT folder is one model.safetensors (no shards, no index)
    // that opens as a model beside the VAE and text encoder.
    let root = tmp.path().join("merged-model");
    std::fs::create_dir(&root).unwrap();
    for shared in ["vae", "Qwen3-Embedding-0.6B"] {
        std::os::unix::fs::symlink(model.join(shared), root.join(shared)).unwrap();
    }
    let merged_dit = root.join("acestep-v15-xl-turbo");
    for (format, to, full) in [
        ("peft", tmp.path().join("peft"), false),
        ("comfyui", tmp.path().join("comfy.safetensors"), false),
        ("merged", tmp.path().join("merged.safetensors"), false),
        ("merged", merged_dit.clone(), true),
    ] {
        let mut c = ostinato();
        c.args(["export", run.to_str().unwrap(), "--format", format, "--to", to.to_str().unwrap()]);
        if full {
            c.arg("--full");
        }
        ok(c.output().unwrap());
        assert!(to.exists(), "{format}");
    }
    let mut files: Vec<String> =
        std::fs::read_dir(&merged_dit).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    assert_eq!(files, ["config.json", "model.safetensors", "silence_latent.pt"]);
    let out = ok(ostinato().args(["inspect", root.to_str().unwrap()]).output().unwrap());
    assert!(String::from_utf8_lossy(&out.stdout).contains("weights: all"));
    let merged_song = tmp.path().join("merged.wav");
    ok(ostinato()
        .args(["generate", "--model", root.to_str().unwrap(), "--caption", "warm lo-fi piano", "--duration", "1"])
        .args(["--out", merged_song.to_str().unwrap()])
        .output()
        .unwrap());
    assert!(merged_song.is_file());

    // As XL base: guided by the encoder-wide null condition, trained on base's timesteps.
    let base = tmp.path().join("xl-base");
    let base_dit = base.join("acestep-v15-xl-base");
    std::fs::create_dir_all(&base_dit).unwrap();
    for f in std::fs::read_dir(model.join("acestep-v15-xl-turbo")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), base_dit.join(f.file_name())).unwrap();
    }
    for shared in ["vae", "Qwen3-Embedding-0.6B"] {
        std::os::unix::fs::symlink(model.join(shared), base.join(shared)).unwrap();
    }
    let config_path = base_dit.join("config.json");
    let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    config["model_version"] = "xl_base".into();
    config["is_turbo"] = false.into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let guided = tmp.path().join("guided.wav");
    ok(ostinato()
        .args(["generate", "--model", base.to_str().unwrap(), "--caption", "warm lo-fi piano", "--duration", "1"])
        .args(["--guidance", "3", "--steps", "4", "--out", guided.to_str().unwrap()])
        .output()
        .unwrap());
    assert!(guided.is_file());
    let mut c = ostinato();
    c.args(["train", songs.to_str().unwrap(), "--model", base.to_str().unwrap(), "--name", "xl-base"])
        .args(["--runs-dir", tmp.path().join("runs").to_str().unwrap()])
        .args(["--crop-seconds", "2", "--rank", "2", "--max-steps", "2"])
        .env("XDG_CACHE_HOME", tmp.path().join("cache"));
    ok(c.output().unwrap());
    assert_eq!(step_losses(&tmp.path().join("runs/xl-base")).len(), 2);
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
        for key in ["median_s_per_step", "peak_rss_bytes", "activation_bytes", "activation_heap_bytes", "tflops_per_s"]
        {
            assert!(report[key].as_f64().unwrap() > 0.0, "{key}: {report}");
        }
        // The step's arithmetic by part, counted for the one layer: a recompute only with checkpointing.
        let flops = &report["flops"];
        for part in ["forward", "backward"] {
            assert!(
                flops[part]["linears"].as_f64().unwrap() > 0.0 && flops[part]["lora"].as_f64().unwrap() > 0.0,
                "{flops}"
            );
        }
        assert_eq!(flops["recompute"]["linears"].as_f64().unwrap() > 0.0, on, "{flops}");
    }
    let err = ostinato().args(["bench", "--preset", "huge"]).output().unwrap();
    assert!(!err.status.success() && String::from_utf8_lossy(&err.stderr).contains("huge"));
    let err = ostinato().args(["bench", "--gradient-checkpointing", "maybe"]).output().unwrap();
    assert!(!err.status.success() && String::from_utf8_lossy(&err.stderr).contains("maybe"));
}

/// `YYYY-MM-DDTHH:MM:SSZ ` at the start of a log line.
fn timestamped(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 21
        && b[..20].iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
        && b[20] == b' '
}

#[test]
fn without_a_terminal_progress_is_plain_timestamped_lines_and_quiet_keeps_only_the_result() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    std::fs::write(songs.join("broken.wav"), "not audio at all").unwrap();
    // Output captured: stderr is a pipe, not a terminal.
    let out = ok(train(tmp.path(), &songs, "logged", &["--max-steps", "4"]).output().unwrap());
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stderr}");
    assert!(stderr.lines().all(timestamped), "every line timestamped:\n{stderr}");
    for needle in [
        "preparing dataset",
        "skipped",
        "broken.wav",
        "training on",
        "3 songs",
        "step 4/4",
        "checkpoint at step 3",
        "finished after 4 steps",
    ] {
        assert!(stderr.contains(needle), "`{needle}` in:\n{stderr}");
    }
    assert!(String::from_utf8_lossy(&out.stdout).contains("adapter:"));

    // Resume says as much.
    let run = tmp.path().join("runs/logged");
    let out = ok(ostinato().args(["resume", run.to_str().unwrap()]).output().unwrap());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.lines().all(timestamped) && stderr.contains("training on"), "{stderr}");

    let out = ok(train(tmp.path(), &songs, "quiet", &["--max-steps", "2", "--quiet"]).output().unwrap());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "--quiet prints nothing but the result");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("adapter: "));
}

#[test]
fn negative_numbers_are_values_and_errors_name_the_setting() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    for lr in [&["--lr", "-1"][..], &["--lr=-1"][..]] {
        let out = ostinato()
            .args(["train", songs.to_str().unwrap(), "--runs-dir", tmp.path().to_str().unwrap()])
            .args(lr)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains("setting `lr`: -1 must be a positive number"), "{stderr}");
        assert!(!stderr.contains("model config") && !stderr.contains("unexpected argument"), "{stderr}");
    }
    fails_with(ostinato().args(["train", songs.to_str().unwrap(), "--alpha", "-8"]), "setting `lora.alpha`");
    fails_with(ostinato().args(["train", songs.to_str().unwrap(), "--dropout", "1.5"]), "setting `lora.dropout`");
}

#[test]
fn a_rank_above_an_adapted_layers_width_is_refused_naming_the_layer() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let runs = tmp.path().join("runs");
    let mut wide = ostinato();
    wide.args(["train", songs.to_str().unwrap(), "--demo", "--rank", "5000", "--name", "wide"])
        .args(["--runs-dir", runs.to_str().unwrap()])
        .env("XDG_CACHE_HOME", tmp.path().join("cache"));
    // The demo's layers are 256 wide, its key and value projections 128.
    let stderr = fails_with(&mut wide, "setting `lora.r`: rank 5000 is more than 128");
    assert!(stderr.contains("k_proj` (256 -> 128): choose at most 128"), "{stderr}");
    assert!(!tmp.path().join("runs/wide").exists(), "a refused run leaves no folder");
}

/// `--cfg-dropout` reaches run.toml, run_started and the start line; unset, the demo's
/// default 0 is shown; out of range, or on a model without `null_condition_emb`, it is refused.
#[test]
fn cfg_dropout_is_set_shown_and_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let started = |name: &str, extra: &[&str]| -> serde_json::Value {
        let out = ok(train(tmp.path(), &songs, name, &[&["--max-steps", "1", "--json"][..], extra].concat())
            .output()
            .unwrap());
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let line = stdout.lines().find(|l| l.contains("\"run_started\"")).expect("a run_started event");
        serde_json::from_str(line).unwrap()
    };
    assert_eq!(started("cfg", &["--cfg-dropout", "0.5"])["cfg_dropout"], 0.5);
    let toml = std::fs::read_to_string(tmp.path().join("runs/cfg/run.toml")).unwrap();
    assert!(toml.contains("cfg_dropout = 0.5"), "{toml}");
    assert_eq!(started("default", &[])["cfg_dropout"], 0.0);
    let plain =
        ok(train(tmp.path(), &songs, "plain", &["--max-steps", "1", "--cfg-dropout", "0.25"]).output().unwrap());
    let stderr = String::from_utf8_lossy(&plain.stderr);
    assert!(stderr.contains("CFG dropout 0.25"), "the start line shows it: {stderr}");

    fails_with(ostinato().args(["train", songs.to_str().unwrap(), "--cfg-dropout", "1.5"]), "setting `cfg_dropout`");
    let mut c = ostinato();
    c.args(["train", songs.to_str().unwrap(), "--model", tiny_model().to_str().unwrap(), "--cfg-dropout", "0.15"])
        .args(["--runs-dir", tmp.path().join("runs").to_str().unwrap(), "--crop-seconds", "2", "--rank", "8"])
        .env("XDG_CACHE_HOME", tmp.path().join("cache"));
    let message = fails_with(&mut c, "setting `cfg_dropout`");
    assert!(message.contains("model.safetensors has no `null_condition_emb`"), "{message}");
}

#[test]
fn train_writes_previews_and_reports_them() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let flags = [
        "--max-steps",
        "4",
        "--json",
        "--preview-every-steps",
        "2",
        "--preview-seconds",
        "1",
        "--preview-caption",
        "soft bells",
    ];
    let out = ok(train(tmp.path(), &songs, "previews", &flags).output().unwrap());
    let previews: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["type"] == "preview")
        .collect();
    let steps: Vec<_> = previews.iter().map(|e| e["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [0, 2, 4]);
    let run = tmp.path().join("runs/previews");
    for (e, name) in previews.iter().zip(["base.wav", "step-000002.wav", "step-000004.wav"]) {
        assert_eq!(e["path"], format!("previews/{name}"));
        assert_eq!((&e["caption"], &e["seconds"]), (&serde_json::json!("soft bells"), &serde_json::json!(1.0)));
        assert!(e["seed"].is_u64() && e["took_s"].as_f64().unwrap() > 0.0, "{e}");
        let audio = ostinato_engine::data::audio::decode(&run.join("previews").join(name)).unwrap();
        assert_eq!((audio.sample_rate, audio.frames()), (48_000, 25 * 1920), "{name}: 1 s");
    }
    let toml = std::fs::read_to_string(run.join("run.toml")).unwrap();
    assert!(toml.contains("preview_every_steps = 2") && toml.contains("preview_caption = \"soft bells\""), "{toml}");

    let lines = ok(train(
        tmp.path(),
        &songs,
        "lines",
        &["--max-steps", "1", "--preview-every-steps", "1", "--preview-seconds", "1"],
    )
    .output()
    .unwrap());
    let stderr = String::from_utf8_lossy(&lines.stderr);
    assert!(stderr.contains("preview of the base model: previews/base.wav"), "{stderr}");
    assert!(stderr.contains("preview of step 1: previews/step-000001.wav"), "{stderr}");
    fails_with(
        ostinato().args(["train", songs.to_str().unwrap(), "--preview-seconds", "0"]),
        "setting `preview_seconds`",
    );
}

/// A runs folder inside the audio folder: each run's folder (its previews) is left out
/// of the next run's songs, and the dataset issues say so.
#[test]
fn a_runs_folder_inside_the_audio_folder_is_not_trained_on() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let runs = songs.join("runs");
    let run = |name: &str| {
        let mut c = ostinato();
        c.args(["train", songs.to_str().unwrap(), "--demo", "--name", name, "--json", "--max-steps", "1"])
            .args(["--runs-dir", runs.to_str().unwrap(), "--crop-seconds", "3", "--rank", "4"])
            .args(["--preview-every-steps", "1", "--preview-seconds", "2"])
            .env("XDG_CACHE_HOME", tmp.path().join("cache"));
        let out = ok(c.output().unwrap());
        let events: Vec<serde_json::Value> =
            String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        events
    };
    run("first");
    assert!(runs.join("first/previews/step-000001.wav").is_file());
    let events = run("second");
    let started = events.iter().find(|e| e["type"] == "run_started").expect("run_started");
    assert_eq!(started["dataset"]["usable"], 3, "the three songs, no preview: {started}");
    let issue = events
        .iter()
        .find(|e| e["type"] == "dataset_issue" && e["file"].as_str().unwrap().ends_with("runs/first"))
        .expect("the first run's folder is named");
    assert!(issue["reason"].as_str().unwrap().contains("a run's folder"), "{issue}");
}

fn tiny_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/real/model")
}

#[test]
fn inspect_checks_every_weight_and_names_what_is_wrong() {
    let out = ok(ostinato().args(["inspect", tiny_model().to_str().unwrap()]).output().unwrap());
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    // The tiny model is turbo, and neither 2B- nor XL-shaped.
    assert!(stdout.contains("weights: all") && stdout.contains("DiT (custom-size turbo): 2 layers"), "{stdout}");
    assert!(stdout.contains("estimated training memory for a 4-minute song"), "{stdout}");

    // Truncated weights, and a config that does not fit them.
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    for sub in ["acestep-v15-turbo", "vae", "Qwen3-Embedding-0.6B"] {
        std::fs::create_dir_all(model.join(sub)).unwrap();
        for f in std::fs::read_dir(tiny_model().join(sub)).unwrap().flatten() {
            std::fs::copy(f.path(), model.join(sub).join(f.file_name())).unwrap();
        }
    }
    let vae_weights = model.join("vae/diffusion_pytorch_model.safetensors");
    let bytes = std::fs::read(&vae_weights).unwrap();
    std::fs::write(&vae_weights, &bytes[..bytes.len() / 2]).unwrap();
    fails_with(ostinato().args(["inspect", model.to_str().unwrap()]), &vae_weights.display().to_string());
    std::fs::write(&vae_weights, &bytes).unwrap();

    // The variant is config.json's, whatever the folder is called.
    let config = model.join("acestep-v15-turbo/config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    let sft = text.replace("\"model_version\": \"turbo\"", "\"model_version\": \"sft\"");
    std::fs::write(&config, sft.replace("\"is_turbo\": true", "\"is_turbo\": false")).unwrap();
    let out = ok(ostinato().args(["inspect", model.to_str().unwrap()]).output().unwrap());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("DiT (custom-size SFT)"), "{stdout}");
    std::fs::write(&config, text.replace("\"hidden_size\": 32", "\"hidden_size\": 48")).unwrap();
    fails_with(ostinato().args(["inspect", model.to_str().unwrap()]), &config.display().to_string());
    let songs = audio(tmp.path());
    let mut c = ostinato();
    c.args([
        "train",
        songs.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--runs-dir",
        tmp.path().join("runs").to_str().unwrap(),
    ])
    // A rank the tiny model's 16-wide layers take, so the broken config is what fails.
    .args(["--crop-seconds", "2", "--max-steps", "1", "--rank", "8"])
    .env("XDG_CACHE_HOME", tmp.path().join("cache"));
    fails_with(&mut c, &config.display().to_string());

    // Not a model folder: a file, or one part of a model.
    let song = std::fs::read_dir(&songs).unwrap().next().unwrap().unwrap().path();
    fails_with(ostinato().args(["inspect", song.to_str().unwrap()]), "is a file, not a model folder");
    fails_with(ostinato().args(["inspect", tiny_model().join("vae").to_str().unwrap()]), "vae/ part");
}

/// A 3 MiB tmpfs at `dir`, unmounted on drop; None (with a loud line) where this
/// process may not mount one.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(dir: &Path) -> Option<Self> {
        std::fs::create_dir_all(dir).unwrap();
        let status =
            Command::new("mount").args(["-t", "tmpfs", "-o", "size=3m", "tmpfs", dir.to_str().unwrap()]).status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("SKIPPED: cannot mount a tmpfs here (needs root); the full-disk test did not run");
            return None;
        }
        Some(Self(dir.to_path_buf()))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_names_the_file_and_says_its_cause_once() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let Some(disk) = SmallDisk::mount(&tmp.path().join("disk")) else { return };
    // Leave a few KiB: the run starts, its first checkpoint does not fit.
    let filler = vec![0u8; 3 * 1024 * 1024 - 24 * 1024];
    let _ = std::fs::write(disk.0.join("filler"), filler);
    let out = ostinato()
        .args(["train", songs.to_str().unwrap(), "--demo", "--name", "full", "--crop-seconds", "3"])
        .args(["--max-steps", "6", "--save-every-steps", "3", "--rank", "16"])
        .args(["--runs-dir", disk.0.join("runs").to_str().unwrap()])
        .env("XDG_CACHE_HOME", tmp.path().join("cache"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stderr}");
    assert!(!out.status.success());
    let error = stderr.lines().find(|l| l.starts_with("error: ")).expect("an error line");
    assert!(error.contains(&disk.0.display().to_string()), "the path is named: {error}");
    assert_eq!(error.matches("os error 28").count(), 1, "the cause once: {error}");
    // Failed before its first checkpoint: resumable, from the start, once there is room.
    let listed = runs_json(&disk.0.join("runs"));
    assert_eq!((&listed[0]["status"], &listed[0]["resumable"]), (&"failed".into(), &true.into()), "{listed}");
}

fn wait_for_steps(run: &Path, steps: usize) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !run.join("events.jsonl").exists() || step_losses(run).len() < steps {
        assert!(Instant::now() < deadline, "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn runs_json(runs: &Path) -> serde_json::Value {
    let out = ok(ostinato().args(["runs", "--json", "--runs-dir", runs.to_str().unwrap()]).output().unwrap());
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_second_writer_is_refused_naming_the_holder_and_a_killed_holder_blocks_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let mut holder = train(tmp.path(), &songs, "held", &["--max-steps", "200"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let run = tmp.path().join("runs/held");
    wait_for_steps(&run, 4); // past the checkpoint at step 3
    let holder_named = format!("process {}", holder.id());
    let asked = Instant::now();
    fails_once_with(ostinato().args(["resume", run.to_str().unwrap()]), &holder_named);
    assert!(asked.elapsed() < Duration::from_secs(10), "refused at once: {:?}", asked.elapsed());
    fails_once_with(&mut train(tmp.path(), &songs, "held", &[]), &holder_named);
    let listed = runs_json(&tmp.path().join("runs"));
    assert_eq!((&listed[0]["status"], &listed[0]["resumable"]), (&"running".into(), &false.into()));

    holder.kill().unwrap(); // SIGKILL: the OS drops its lock
    holder.wait().unwrap();
    let listed = runs_json(&tmp.path().join("runs"));
    assert_eq!((&listed[0]["status"], &listed[0]["resumable"]), (&"interrupted".into(), &true.into()));
    let logged = step_losses(&run).len() as u64;
    ok(ostinato()
        .args(["resume", run.to_str().unwrap(), "--stop-at-step", &(logged + 1).to_string()])
        .output()
        .unwrap());
    assert_eq!(step_losses(&run).last().unwrap().0, logged + 1);
}

#[test]
fn default_names_started_together_do_not_clash() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let start = || unnamed_train(tmp.path(), &songs, &["--max-steps", "1", "--no-cache"]).output();
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(start);
        let b = s.spawn(start);
        (a.join().unwrap().unwrap(), b.join().unwrap().unwrap())
    });
    ok(a);
    ok(b);
    let listed = runs_json(&tmp.path().join("runs"));
    let names: Vec<_> = listed.as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(listed.as_array().unwrap().iter().all(|r| r["status"] == "finished"), "{listed}");
    println!("{names:?}");
}

#[test]
fn relative_paths_are_stored_absolute_and_a_moved_audio_folder_is_named_until_it_is_back() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    let songs = audio(&work);
    let mut c = ostinato();
    c.current_dir(&work)
        .args(["train", "songs", "--demo", "--name", "rel", "--runs-dir", "runs"])
        .args(["--crop-seconds", "3", "--rank", "4", "--max-steps", "3", "--stop-at-step", "1"])
        .env("XDG_CACHE_HOME", tmp.path().join("cache"));
    ok(c.output().unwrap());
    let run = work.join("runs/rel");
    let config = RunConfig::from_toml_file(&run.join("run.toml")).unwrap();
    assert_eq!(config.data.folder, songs.canonicalize().unwrap());
    assert_eq!(config.runs_dir, work.join("runs"));

    // Moved away: `resume`, from another directory, names the folder and changes nothing.
    std::fs::rename(&songs, work.join("elsewhere")).unwrap();
    let resume = |cwd: &Path| {
        let mut c = ostinato();
        c.current_dir(cwd).args(["resume", "work/runs/rel"]).env("XDG_CACHE_HOME", tmp.path().join("cache"));
        c
    };
    let stderr = fails_with(&mut resume(tmp.path()), &format!("audio folder {}", config.data.folder.display()));
    assert_eq!(stderr.matches("No such file").count(), 1, "{stderr}");
    let listed = runs_json(&work.join("runs"));
    assert_eq!((&listed[0]["status"], &listed[0]["resumable"]), (&"stopped".into(), &true.into()));

    std::fs::rename(work.join("elsewhere"), &songs).unwrap();
    ok(resume(tmp.path()).output().unwrap());
    assert_eq!(step_losses(&run).iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2, 3]);
}

#[test]
fn runs_json_is_truthful_about_checkpoints_and_damaged_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let run = |name: &str, log: &str, checkpoint: bool| {
        let dir = runs.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("run.toml"), "").unwrap();
        std::fs::write(dir.join("events.jsonl"), log).unwrap();
        if checkpoint {
            std::fs::create_dir_all(dir.join("checkpoints/step-000000")).unwrap();
        }
    };
    let stopped = "{\"v\":1,\"type\":\"stopped\",\"step\":0,\"adapter_path\":null}\n";
    run("a-damaged", &format!("garbage\n{stopped}"), true);
    run("b-checkpointed", stopped, true);
    run("c-no-checkpoint", stopped, false);
    run("d-finished", "{\"v\":1,\"type\":\"finished\",\"adapter_path\":\"a\",\"steps\":1}\n", true);
    let listed = runs_json(&runs);
    let got: Vec<_> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap(), r["status"].as_str().unwrap(), r["resumable"].as_bool().unwrap()))
        .collect();
    assert_eq!(
        got,
        [
            ("a-damaged", "damaged", true),
            ("b-checkpointed", "stopped", true),
            // Resumed from the start.
            ("c-no-checkpoint", "stopped", true),
            ("d-finished", "finished", false),
        ]
    );
    let reason = listed[0]["reason"].as_str().unwrap();
    assert!(reason.contains("events.jsonl:1:"), "{reason}");
    let out = ok(ostinato().args(["runs", "--runs-dir", runs.to_str().unwrap()]).output().unwrap());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("damaged") && table.contains("events.jsonl:1:"), "{table}");
}

/// `generate --demo` with a short duration and the given extra flags.
fn generate(out: &Path, extra: &[&str]) -> Command {
    let mut c = ostinato();
    c.args(["generate", "--demo", "--caption", "warm lo-fi piano", "--duration", "2", "--out", out.to_str().unwrap()])
        .args(extra);
    c
}

#[test]
fn generate_is_deterministic_and_decode_reproduces_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, c) = (tmp.path().join("a.wav"), tmp.path().join("b.wav"), tmp.path().join("c.wav"));
    let latents = tmp.path().join("a.safetensors");
    let out =
        ok(generate(&a, &["--seed", "5", "--json", "--latents-out", latents.to_str().unwrap()]).output().unwrap());
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

    // JSON events: unplanned (no --lm), started, 8 steps, decoding, written.
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let types: Vec<&str> = lines.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, [&["unplanned", "started"][..], &["step"; 8], &["decoding", "written"]].concat());
    assert!(!lines[0]["reason"].as_str().unwrap().is_empty(), "{}", lines[0]);
    assert_eq!(lines[1]["frames"], 50);

    // The latents decode to the same WAV.
    let d = tmp.path().join("d.wav");
    ok(ostinato()
        .args(["decode", latents.to_str().unwrap(), "--demo", "--out", d.to_str().unwrap()])
        .output()
        .unwrap());
    assert_eq!(std::fs::read(&d).unwrap(), bytes);
}

/// A PEFT adapter for `source`'s DiT with random A and B (r 2), saved in `dir`.
fn random_adapter(source: &ostinato_engine::load::source::ModelSource, dir: &Path, targets: &[&str]) {
    use ostinato_engine::lora::{LoraAdapter, LoraConfig};
    let dev = candle_core::Device::Cpu;
    let (cfg, w) = source.load_decoder(candle_core::DType::F32, &dev).unwrap();
    let dit = ostinato_engine::model::DitModel::new(&cfg, &w).unwrap();
    let config = LoraConfig {
        r: 2,
        alpha: 4.0,
        dropout: 0.0,
        target_modules: targets.iter().map(|t| t.to_string()).collect(),
        ..LoraConfig::default()
    };
    let fresh = LoraAdapter::new(config.clone(), &dit, 1).unwrap();
    let tensors = fresh.named_tensors().into_iter().map(|(k, t)| (k, (t.randn_like(0.0, 0.5).unwrap()))).collect();
    LoraAdapter::from_tensors(config, &dit, &tensors, dir).unwrap().save(dir).unwrap();
}

#[test]
fn adapter_scale_zero_is_the_base_model_and_one_changes_the_song() {
    let tmp = tempfile::tempdir().unwrap();
    let adapter = tmp.path().join("adapter");
    random_adapter(
        &ostinato_engine::load::source::ModelSource::Demo,
        &adapter,
        &["q_proj", "k_proj", "v_proj", "o_proj"],
    );
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
fn several_adapters_mix_each_at_its_scale_and_parts_scale_their_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let demo = ostinato_engine::load::source::ModelSource::Demo;
    let (first, second) = (tmp.path().join("attention"), tmp.path().join("mlp"));
    random_adapter(&demo, &first, &["q_proj", "k_proj", "v_proj", "o_proj"]);
    random_adapter(&demo, &second, &["gate_proj", "up_proj", "down_proj"]);
    let (a, b) = (first.to_str().unwrap(), second.to_str().unwrap());
    let song = |name: &str, extra: &[&str]| {
        let p = tmp.path().join(name);
        ok(generate(&p, extra).output().unwrap());
        std::fs::read(p).unwrap()
    };
    let base = song("base.wav", &[]);
    let a_alone = song("a.wav", &["--adapter", a, "--adapter-scale", "0.5"]);
    let with_b_off = ["--adapter", a, "--adapter", b, "--adapter-scale", "0.5", "--adapter-scale", "0"];
    assert_eq!(song("a-b0.wav", &with_b_off), a_alone, "an adapter at 0 adds nothing");
    let both = song("ab.wav", &["--adapter", a, "--adapter", b, "--adapter-scale", "0.5"]);
    assert_ne!(both, a_alone, "one --adapter-scale applies to both");
    assert_eq!(
        song("ab-mlp0.wav", &["--adapter", a, "--adapter", b, "--adapter-scale", "0.5", "--parts", "mlp=0"]),
        a_alone
    );
    assert_eq!(song("a-attn0.wav", &["--adapter", a, "--parts", "self=0,cross=0"]), base);

    let out = tmp.path().join("refused.wav");
    let three =
        ["--adapter", a, "--adapter", b, "--adapter-scale", "1", "--adapter-scale", "1", "--adapter-scale", "1"];
    fails_with(
        &mut generate(&out, &three),
        "setting `adapter_scale`: 3 scales for 2 adapters: give one for each, in the same order, or one for all",
    );
    fails_with(
        &mut generate(&out, &["--adapter", a, "--adapter", b, "--adapter-scale", "1", "--adapter-scale", "9"]),
        "setting `more_adapters[0].scale`: 9 is out of range",
    );
    fails_with(
        &mut generate(&out, &["--adapter", a, "--parts", "attn=1"]),
        "`attn` is not a part: they are self, cross and mlp",
    );
    fails_with(&mut generate(&out, &["--adapter", a, "--parts", "mlp=5"]), "mlp=5 is out of range");
    assert!(!out.exists());
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
    ok(ostinato()
        .args([
            "decode",
            latents.to_str().unwrap(),
            "--model",
            model.to_str().unwrap(),
            "--out",
            again.to_str().unwrap(),
        ])
        .output()
        .unwrap());
    assert_eq!(std::fs::read(&again).unwrap(), std::fs::read(&out).unwrap());
    // The turbo model has no guidance to give.
    fails_with(
        ostinato()
            .args([
                "generate",
                "--model",
                model.to_str().unwrap(),
                "--caption",
                "x",
                "--duration",
                "1",
                "--guidance",
                "7",
            ])
            .args(["--out", again.to_str().unwrap()]),
        "turbo",
    );
}

#[test]
fn bad_generate_and_decode_input_gives_clear_errors_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.wav");
    fails_with(
        ostinato().args(["generate", "--demo", "--caption", "x", "--duration", "0", "--out", out.to_str().unwrap()]),
        "duration 0",
    );
    fails_with(
        ostinato().args(["generate", "--demo", "--caption", "x", "--duration", "601", "--out", out.to_str().unwrap()]),
        "600",
    );

    let no_config = tmp.path().join("not-an-adapter");
    std::fs::create_dir(&no_config).unwrap();
    fails_with(&mut generate(&out, &["--adapter", no_config.to_str().unwrap()]), "adapter_config.json");

    // An adapter made for another model: the first tensor that does not fit is named.
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/real/model");
    let other = tmp.path().join("other-adapter");
    random_adapter(&ostinato_engine::load::source::ModelSource::Folder { path: model }, &other, &["q_proj"]);
    fails_with(
        &mut generate(&out, &["--adapter", other.to_str().unwrap()]),
        "layers.0.cross_attn.q_proj.lora_A.weight` has shape [2, 32]",
    );
    // Targets the model does not have.
    let config = other.join("adapter_config.json");
    let text = std::fs::read_to_string(&config).unwrap().replace("\"q_proj\"", "\"gate_projection\"");
    std::fs::write(&config, text).unwrap();
    fails_with(&mut generate(&out, &["--adapter", other.to_str().unwrap()]), "gate_projection");

    // An adapter folder without its weights.
    let no_weights = tmp.path().join("no-weights");
    std::fs::create_dir(&no_weights).unwrap();
    std::fs::copy(other.join("adapter_config.json"), no_weights.join("adapter_config.json")).unwrap();
    fails_with(
        &mut generate(&out, &["--adapter", no_weights.to_str().unwrap()]),
        "no-weights/adapter_model.safetensors",
    );

    fails_with(&mut generate(&out, &["--guidance", "5"]), "turbo");
    let unwritable = tmp.path().join("no/such/folder/out.wav");
    fails_with(&mut generate(&unwritable, &[]), "no/such/folder/out.wav");
    let folder = tmp.path().join("a-folder.wav");
    std::fs::create_dir(&folder).unwrap();
    fails_with(&mut generate(&folder, &[]), "a-folder.wav: is a folder");
    // An unwritable --latents-out fails before the song is made: no WAV either.
    fails_with(
        &mut generate(&out, &["--latents-out", unwritable.with_extension("safetensors").to_str().unwrap()]),
        "no/such/folder/out.safetensors",
    );

    // Latents of the wrong shape.
    let z = tmp.path().join("z.safetensors");
    let t = candle_core::Tensor::zeros((10, 32), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
    candle_core::safetensors::save(
        &[("latents".to_string(), t)].into_iter().collect::<std::collections::HashMap<_, _>>(),
        &z,
    )
    .unwrap();
    fails_with(ostinato().args(["decode", z.to_str().unwrap(), "--demo", "--out", out.to_str().unwrap()]), "[10, 32]");
    fails_with(ostinato().args(["decode", z.to_str().unwrap(), "--out", out.to_str().unwrap()]), "--demo");
    fails_with(
        ostinato().args(["decode", z.to_str().unwrap(), "--demo", "--out", unwritable.to_str().unwrap()]),
        "no/such/folder/out.wav",
    );

    assert!(!out.exists(), "nothing is written on failure");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.iter().all(|n| !n.to_string_lossy().ends_with(".tmp")), "{left:?}");
}

/// The adapter saved in `dir` with every tensor passed through `change`.
fn rewrite_adapter(dir: &Path, change: impl Fn(&str, candle_core::Tensor) -> candle_core::Tensor) {
    let file = dir.join("adapter_model.safetensors");
    let tensors: std::collections::HashMap<String, candle_core::Tensor> =
        candle_core::safetensors::load(&file, &candle_core::Device::Cpu)
            .unwrap()
            .into_iter()
            .map(|(k, t)| {
                let t = change(&k, t);
                (k, t)
            })
            .collect();
    candle_core::safetensors::save(&tensors, &file).unwrap();
}

/// Latents `[20, channels]` of 0.5 with `odd` at frame 3, channel 5, as `decode` reads them.
fn latents_file(path: &Path, channels: usize, odd: f32) {
    let mut values = vec![0.5; 20 * channels];
    values[3 * channels + 5] = odd;
    let t = candle_core::Tensor::from_vec(values, (20, channels), &candle_core::Device::Cpu).unwrap();
    candle_core::safetensors::save(&[("latents".to_string(), t)].into_iter().collect(), path).unwrap();
}

#[test]
fn non_finite_songs_are_errors_naming_their_cause_and_nothing_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("song.wav");
    let demo = ostinato_engine::load::source::ModelSource::Demo;

    // One NaN in an adapter: refused as it is loaded, the file and the tensor named.
    let nan = tmp.path().join("nan-adapter");
    random_adapter(&demo, &nan, &["q_proj"]);
    let poisoned = "base_model.model.layers.1.self_attn.q_proj.lora_B.weight";
    rewrite_adapter(&nan, |key, t| {
        if key != poisoned {
            return t;
        }
        let mut v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        v[7] = f32::NAN;
        candle_core::Tensor::from_vec(v, t.shape(), t.device()).unwrap()
    });
    let stderr = fails_with(
        &mut generate(&out, &["--adapter", nan.to_str().unwrap()]),
        "layers.1.self_attn.q_proj.lora_B.weight`: 1 of 512 values are not finite",
    );
    assert!(stderr.contains(&nan.join("adapter_model.safetensors").display().to_string()), "{stderr}");

    // Finite but huge: the first sampling step overflows; the step and the adapter named.
    let huge = tmp.path().join("huge-adapter");
    random_adapter(&demo, &huge, &["q_proj", "k_proj", "v_proj", "o_proj"]);
    rewrite_adapter(&huge, |_, t| (t * 1e30).unwrap());
    fails_with(
        &mut generate(&out, &["--adapter", huge.to_str().unwrap()]),
        "sampling step 1 of 8: the latents after the DiT's prediction (the adapter at scale 1): ",
    );

    // Latents with one NaN (which the demo's decoder turned into silence): `decode`
    // names the file and the tensor.
    let z = tmp.path().join("z.safetensors");
    latents_file(&z, 64, f32::NAN);
    let decode = |z: &Path, model: &[&str]| {
        let mut c = ostinato();
        c.args(["decode", z.to_str().unwrap(), "--out", out.to_str().unwrap()]).args(model);
        c
    };
    fails_with(
        &mut decode(&z, &["--demo"]),
        &format!("{}: `latents`: 1 of 1280 values are not finite (NaN or infinite)", z.display()),
    );
    // One huge but finite latent, which the VAE decodes into tens of thousands of NaN
    // samples: the decoder named.
    latents_file(&z, 8, 1e30);
    fails_with(&mut decode(&z, &["--model", tiny_model().to_str().unwrap()]), "the decoder's audio: ");

    assert!(!out.exists(), "no song is written");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.iter().all(|n| !n.to_string_lossy().ends_with(".tmp")), "{left:?}");
}

#[test]
fn generate_settings_out_of_range_are_named_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("song.wav");
    let adapter = tmp.path().join("adapter");
    random_adapter(&ostinato_engine::load::source::ModelSource::Demo, &adapter, &["q_proj"]);
    let a = adapter.to_str().unwrap();
    fails_with(
        &mut generate(&out, &["--steps", "100000"]),
        "setting `steps`: 100000 is out of range: it must be 1 to 200",
    );
    fails_with(&mut generate(&out, &["--steps", "0"]), "setting `steps`");
    for scale in ["1e30", "4.5", "-1", "NaN"] {
        let flag = format!("--adapter-scale={scale}");
        fails_with(&mut generate(&out, &["--adapter", a, &flag]), "setting `adapter_scale`");
    }
    assert!(!out.exists());
    // The ends of the ranges are songs.
    ok(generate(&out, &["--steps", "1", "--adapter", a, "--adapter-scale", "4"]).output().unwrap());
}

#[test]
fn validation_flags_best_adapter_in_runs_and_export_which() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let val = ["--val-files", "drum_groove_128.wav", "--val-every-steps", "3", "--max-steps", "6"];
    ok(train(tmp.path(), &songs, "val", &val).output().unwrap());
    let run = tmp.path().join("runs/val");
    let out = ok(ostinato()
        .args(["runs", "--json", "--runs-dir", tmp.path().join("runs").to_str().unwrap()])
        .output()
        .unwrap());
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let best_step = runs[0]["best_step"].as_u64().expect("a best step");
    assert!([3, 6].contains(&best_step), "{runs}");
    assert!(runs[0]["best_loss"].as_f64().is_some(), "{runs}");

    let export = |which: &str, to: &str| {
        let to = tmp.path().join(to);
        let mut c = ostinato();
        c.args(["export", run.to_str().unwrap(), "--format", "peft", "--to", to.to_str().unwrap(), "--which", which]);
        (c, to)
    };
    for (which, from) in [
        ("best", "best/adapter".to_string()),
        ("final", "final/adapter".into()),
        ("step-3", "checkpoints/step-000003/adapter".into()),
    ] {
        let (mut c, to) = export(which, which);
        ok(c.output().unwrap());
        let file = "adapter_model.safetensors";
        assert!(std::fs::read(to.join(file)).unwrap() == std::fs::read(run.join(&from).join(file)).unwrap(), "{which}");
    }
    fails_with(&mut export("step-4", "x").0, "no checkpoint of step 4");
    fails_with(&mut export("worst", "x").0, "expected best, final or step-N");
    // Held out one way only; a run without validation has no best adapter.
    fails_with(
        &mut train(tmp.path(), &songs, "both", &["--val-files", "a.wav", "--val-fraction", "0.5"]),
        "--val-fraction",
    );
    fails_with(&mut train(tmp.path(), &songs, "noperiod", &["--val-fraction", "0.5"]), "val_every_steps");
    ok(train(tmp.path(), &songs, "plain", &["--max-steps", "1"]).output().unwrap());
    let plain = tmp.path().join("runs/plain");
    fails_with(
        ostinato().args(["export", plain.to_str().unwrap(), "--format", "peft", "--to", "x", "--which", "best"]),
        "no best adapter",
    );
}

/// `runs --charts` replays a trained run's log into PNG and SVG charts: the loss with
/// its validation curve, and the loss by noise level, first epoch against the latest.
#[test]
fn runs_charts_writes_every_chart_of_a_trained_run_with_loss_by_noise_level() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let val = ["--val-files", "drum_groove_128.wav", "--val-every-steps", "2", "--epochs", "3"];
    ok(train(tmp.path(), &songs, "charted", &val).output().unwrap());
    let run = tmp.path().join("runs/charted");
    let out = ok(ostinato().args(["runs", "--charts", run.to_str().unwrap()]).output().unwrap());
    let listed: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout).lines().map(PathBuf::from).collect();
    let charts = run.join("charts");
    for stem in ["loss", "noise-levels", "throughput", "memory"] {
        for ext in ["png", "svg"] {
            let file = charts.join(format!("{stem}.{ext}"));
            assert!(listed.contains(&file), "{} in {listed:?}", file.display());
        }
        assert_eq!(&std::fs::read(charts.join(format!("{stem}.png"))).unwrap()[1..4], b"PNG");
    }
    assert_eq!(listed.len(), 8, "{listed:?}");
    let svg = |stem: &str| std::fs::read_to_string(charts.join(format!("{stem}.svg"))).unwrap();
    let texts = |stem: &str| -> Vec<String> {
        svg(stem).split("</text>").filter_map(|t| t.rsplit_once('>').map(|(_, text)| text.trim().to_string())).collect()
    };
    for text in ["Loss by noise level", "epoch 1", "epoch 3"] {
        assert!(texts("noise-levels").iter().any(|t| t == text), "{text} in {:?}", texts("noise-levels"));
    }
    assert!(texts("loss").iter().any(|t| t == "validation"), "{:?}", texts("loss"));
    let left: Vec<_> =
        std::fs::read_dir(&charts).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(left.iter().all(|n| !n.starts_with('.')), "no temporary files left: {left:?}");
    fails_with(ostinato().args(["runs", "--charts", tmp.path().to_str().unwrap()]), "not a run directory");
}

#[path = "../../engine/tests/hub_server/mod.rs"]
mod hub_server;

/// `ostinato models ...` with every place it looks (hub cache, config, home, working
/// folder) inside `dir`, against the hub at `endpoint`.
fn models_cmd(dir: &Path, endpoint: &str, args: &[&str]) -> Command {
    let mut c = ostinato();
    c.arg("models")
        .args(args)
        .current_dir(dir)
        .env("HOME", dir.join("home"))
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("HF_HUB_CACHE", dir.join("hub"))
        .env("HF_ENDPOINT", endpoint)
        .env("OSTINATO_CONFIG_DIR", dir.join("config"))
        .env_remove("ACESTEP_CHECKPOINTS_DIR")
        .env_remove("HF_TOKEN")
        .env_remove("HF_HOME");
    c
}

#[test]
fn models_download_list_verify_add_and_remove() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let hub = hub_server::FakeHub::start();
    hub.add_folder("ACE-Step/Ace-Step1.5", "0ddba11", &tiny_model(), "");
    let run = |args: &[&str]| ok(models_cmd(dir, &hub.url, args).output().unwrap());
    let text = |out: Output| String::from_utf8_lossy(&out.stdout).into_owned();

    let empty = text(run(&["list"]));
    assert!(empty.contains("no ACE-Step 1.5 model found") && empty.contains("models download turbo"), "{empty}");

    // Download: JSON events, the last one the model folder in the hub cache.
    let events = text(run(&["download", "turbo", "--json"]));
    let events: Vec<serde_json::Value> = events.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!((&events[0]["type"], &events[1]["type"]), (&"listing_files".into(), &"planned".into()));
    assert!(events.iter().any(|e| e["type"] == "progress"));
    let last = events.last().unwrap();
    assert_eq!(last["type"], "finished");
    let model = PathBuf::from(last["model"].as_str().unwrap());
    assert_eq!(model, dir.join("hub/models--ACE-Step--Ace-Step1.5/snapshots/0ddba11/acestep-v15-turbo"));

    // Listed complete, verified, and opened by `inspect`.
    let list: serde_json::Value = serde_json::from_str(&text(run(&["list", "--json"]))).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(
        (&list[0]["variant"], &list[0]["size"], &list[0]["complete"], &list[0]["origin"]),
        (&"turbo".into(), &"other".into(), &true.into(), &"hub_cache".into())
    );
    assert_eq!(list[0]["path"], model.to_str().unwrap());
    let verified = text(run(&["verify", model.to_str().unwrap()]));
    assert!(verified.starts_with("ok ") && verified.contains("9 files match their hub checksums"), "{verified}");
    // A variant names the catalog's model of that size: the tiny turbo is not the 2B one.
    fails_with(&mut models_cmd(dir, &hub.url, &["verify", "turbo"]), "no turbo model found");
    ok(ostinato().args(["inspect", model.to_str().unwrap()]).output().unwrap());

    // A folder added is listed (and remembered) until removed.
    let added = text(run(&["add", tiny_model().to_str().unwrap()]));
    assert!(added.starts_with("added "), "{added}");
    let table = text(run(&["list"]));
    assert!(table.contains("added") && table.contains("hub cache") && table.contains("complete"), "{table}");
    assert!(table.lines().skip(1).all(|l| l.starts_with("custom-size turbo ")), "{table}");
    run(&["remove", tiny_model().to_str().unwrap()]);
    assert_eq!(text(run(&["list"])).lines().count(), 2, "header and the downloaded model");

    // A variant the hub does not have: the repository is named.
    let out = models_cmd(dir, &hub.url, &["download", "sft"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("ACE-Step/acestep-v15-sft"), "{stderr}");
    let out = models_cmd(dir, &hub.url, &["download", "xl-sft"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("ACE-Step/acestep-v15-xl-sft"), "{stderr}");
    // A name that is no variant: every variant is named.
    fails_with(&mut models_cmd(dir, &hub.url, &["download", "xl"]), "turbo, base, sft, xl-turbo, xl-base, xl-sft");
}

#[test]
fn models_download_list_and_verify_a_5hz_lm() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let lm = dir.join("lm-source");
    ostinato_engine::label::understand::tiny::write_tiny_lm(&lm, 3).unwrap();
    let hub = hub_server::FakeHub::start();
    hub.add_folder("ACE-Step/acestep-5Hz-lm-0.6B", "0b0e", &lm, "");
    let run = |args: &[&str]| ok(models_cmd(dir, &hub.url, args).output().unwrap());

    // The size is said from the plan, before any file is fetched.
    let out = run(&["download", "lm-0.6b"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let folder = dir.join("hub/models--ACE-Step--acestep-5Hz-lm-0.6B/snapshots/0b0e");
    assert_eq!(stdout.trim(), folder.to_str().unwrap());
    let planned = stderr.lines().find(|l| l.starts_with("lm-0.6b: 5 files, ")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(planned.contains(" GB (") && planned.contains(" to fetch) into "), "{planned}");

    // Listed beside the models, told apart by `kind`; in the table under its own header.
    let list: serde_json::Value = serde_json::from_slice(&run(&["list", "--json"]).stdout).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(
        (&list[0]["kind"], &list[0]["name"], &list[0]["complete"], &list[0]["origin"]),
        (&"lm".into(), &"lm-0.6b".into(), &true.into(), &"hub_cache".into())
    );
    assert_eq!(list[0]["path"], folder.to_str().unwrap());
    let table = String::from_utf8_lossy(&run(&["list"]).stdout).into_owned();
    assert!(table.contains("no ACE-Step 1.5 model found"), "no DiT yet: {table}");
    let row = table.lines().skip_while(|l| !l.starts_with("5 Hz LM ")).nth(1).unwrap_or_else(|| panic!("{table}"));
    assert!(row.starts_with("lm-0.6b ") && row.contains("complete") && row.ends_with("snapshots/0b0e"), "{table}");

    // Verified by folder and by name: 5 files against their hub checksums.
    for target in [folder.to_str().unwrap(), "lm-0.6b"] {
        let verified = String::from_utf8_lossy(&run(&["verify", target]).stdout).into_owned();
        assert!(verified.starts_with("ok ") && verified.contains("5 files match their hub checksums"), "{verified}");
    }
    fails_with(&mut models_cmd(dir, &hub.url, &["verify", "lm-4b"]), "no lm-4b model found");
    // A DiT in the same list keeps its shape, tagged `dit`.
    hub.add_folder("ACE-Step/Ace-Step1.5", "0ddba11", &tiny_model(), "");
    run(&["download", "turbo"]);
    let list: serde_json::Value = serde_json::from_slice(&run(&["list", "--json"]).stdout).unwrap();
    assert_eq!(
        (&list[0]["kind"], &list[0]["variant"], &list[1]["kind"]),
        (&"dit".into(), &"turbo".into(), &"lm".into())
    );
    // The LMs a download takes are named with the rest.
    fails_with(&mut models_cmd(dir, &hub.url, &["download", "lm"]), "lm-0.6b, lm-1.7b, lm-4b");
}

#[test]
fn models_list_tells_2b_from_xl_by_the_config() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // ./checkpoints, as ACE-Step lays it out: an XL-shaped config under the 2B turbo's
    // folder name, a 2B-shaped one under XL SFT's (the tiny weights fit neither).
    let ckpt = dir.join("checkpoints");
    let dit_config = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let dit = ckpt.join(name);
        std::fs::create_dir_all(&dit).unwrap();
        for f in std::fs::read_dir(tiny_model().join("acestep-v15-turbo")).unwrap().flatten() {
            std::fs::copy(f.path(), dit.join(f.file_name())).unwrap();
        }
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dit.join("config.json")).unwrap()).unwrap();
        json.as_object_mut().unwrap().remove("layer_types");
        edit(&mut json);
        std::fs::write(dit.join("config.json"), json.to_string()).unwrap();
    };
    dit_config("acestep-v15-turbo", &|j| {
        (j["hidden_size"], j["num_hidden_layers"]) = (2560.into(), 32.into());
    });
    dit_config("acestep-v15-xl-sft", &|j| {
        (j["hidden_size"], j["num_hidden_layers"]) = (2048.into(), 24.into());
        (j["model_version"], j["is_turbo"]) = ("sft".into(), false.into());
    });
    let out = ok(models_cmd(dir, "http://127.0.0.1:9", &["list"]).output().unwrap());
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let row = |folder: &str| table.lines().find(|l| l.ends_with(folder)).unwrap_or_else(|| panic!("{folder}: {table}"));
    assert!(row("acestep-v15-turbo").starts_with("XL turbo "), "{table}");
    assert!(row("acestep-v15-xl-sft").starts_with("2B SFT "), "{table}");
    assert!(table.starts_with("model "), "{table}");
}

#[test]
fn models_download_from_an_unreachable_hub_fails_at_once_and_names_hf_endpoint() {
    let tmp = tempfile::tempdir().unwrap();
    // A port of 127.0.0.1 with nothing listening.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let out = models_cmd(tmp.path(), &url, &["download", "turbo"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stderr}");
    assert!(!out.status.success());
    assert!(stderr.contains(&format!("asking {url} for the files of ACE-Step/Ace-Step1.5")), "{stderr}");
    assert!(stderr.contains(&format!("cannot reach the hub at {url} (")) && stderr.contains("HF_ENDPOINT"), "{stderr}");
    assert!(!stderr.contains("try 2"), "not retried: {stderr}");
}

#[test]
fn models_download_says_each_retry_in_text_and_json() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = hub_server::FakeHub::start();
    hub.add_folder("ACE-Step/Ace-Step1.5", "0ddba11", &tiny_model(), "");
    // The file list's first request is dropped: tried again after the engine's 2 s.
    hub.fault_listing("ACE-Step/Ace-Step1.5", hub_server::Fault::HangUpOnce);
    let out = ok(models_cmd(tmp.path(), &hub.url, &["download", "turbo"]).output().unwrap());
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stderr}");
    let said = stderr.lines().find(|l| l.starts_with("the file list of ACE-Step/Ace-Step1.5: "));
    assert!(said.is_some_and(|l| l.ends_with("; try 2 of 5 in 2 s")), "{stderr}");

    hub.fault_listing("ACE-Step/Ace-Step1.5", hub_server::Fault::HangUpOnce);
    let out = ok(models_cmd(tmp.path(), &hub.url, &["download", "turbo", "--json"]).output().unwrap());
    let events: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(events[0]["type"], "listing_files");
    let retry = events.iter().find(|e| e["type"] == "retrying").expect("a retrying event");
    assert_eq!(
        (&retry["what"], &retry["next_try"], &retry["tries"], &retry["wait_ms"]),
        (&"the file list of ACE-Step/Ace-Step1.5".into(), &2.into(), &5.into(), &2000.into())
    );
    assert!(retry["reason"].as_str().is_some_and(|r| !r.is_empty()), "{retry}");
    assert_eq!(events.last().unwrap()["type"], "finished");
}

#[test]
fn a_run_predicted_past_memory_is_refused_and_fit_auto_says_what_it_chose() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let runs = tmp.path().join("runs");
    // Rank 10 million: 143 billion trainable parameters, more than any machine holds.
    let out = ostinato()
        .args(["train", songs.to_str().unwrap(), "--demo", "--runs-dir", runs.to_str().unwrap(), "--name", "huge"])
        .args(["--rank", "10000000", "--crop-seconds", "3"])
        .env("XDG_CACHE_HOME", tmp.path().join("cache"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stderr}");
    assert!(!out.status.success());
    for part in ["predicted peak", "the run would not fit", "143.36 billion trainable parameters", "--rank"] {
        assert!(stderr.contains(part), "missing `{part}` in: {stderr}");
    }
    // The prediction is shown once, as the refusal: never first as a plan about to run.
    assert!(!stderr.contains("memory: predicted peak"), "{stderr}");
    assert_eq!(stderr.matches("predicted peak").count(), 1, "{stderr}");
    assert!(!runs.join("huge").exists(), "a refused run leaves no folder");

    // With room to spare fit auto turns checkpointing off (faster) and says so.
    let out = ok(train(tmp.path(), &songs, "fitted", &["--max-steps", "1", "--fit", "auto"]).output().unwrap());
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stderr}");
    let line =
        stderr.lines().find(|l| l.contains("memory: predicted peak")).expect("the plan is shown before training");
    assert!(line.contains("(fit auto: gradient checkpointing off)"), "{line}");
    let config = RunConfig::from_toml_file(&runs.join("fitted/run.toml")).unwrap();
    assert!(!config.gradient_checkpointing);
    let started = read_events(&runs.join("fitted/events.jsonl")).unwrap().into_iter().find_map(|e| match e {
        Event::RunStarted { memory, .. } => Some(memory),
        _ => None,
    });
    let memory = started.expect("run_started");
    assert!(memory.predicted_peak_bytes.is_some_and(|p| p > 0) && memory.machine.is_some(), "{memory:?}");
}

#[test]
fn label_prints_each_songs_tempo_key_and_meter_as_json_lines_and_as_a_table() {
    let clips = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/data/labels");
    let store = tempfile::tempdir().unwrap();
    let label = |dir: &Path, more: &[&str]| {
        let mut cmd = ostinato();
        cmd.args(["label", dir.to_str().unwrap(), "--labels-dir", store.path().to_str().unwrap()]).args(more);
        cmd.output().unwrap()
    };
    let out = label(&clips, &["--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let (songs, skipped): (Vec<_>, Vec<_>) = rows.iter().partition(|r| r.get("skipped").is_none());
    assert_eq!(songs.len(), 6);
    assert!(skipped.iter().any(|r| r["file"] == "README.md"), "files that are not songs are named: {skipped:?}");
    let first = songs[0];
    assert_eq!(first["file"], "song-3-000.ogg");
    assert_eq!(
        (first["bpm"].as_u64(), first["keyscale"].as_str(), first["timesignature"].as_str()),
        (Some(112), Some("C major"), Some("4"))
    );
    for field in ["bpm", "keyscale", "timesignature"] {
        let c = first["confidence"][field].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&c), "{field} confidence {c}");
        assert!(first["cannot_tell"][field].is_null());
        assert_eq!(first["source"][field], "analysed");
    }
    assert!((first["duration"].as_f64().unwrap() - 18.23).abs() < 0.05);

    // A sidecar's value is kept, the audio's shown beside it (in a copy of two songs).
    let dir = tempfile::tempdir().unwrap();
    for name in ["song-3-000.ogg", "song-3-024.ogg"] {
        std::fs::copy(clips.join(name), dir.path().join(name)).unwrap();
    }
    std::fs::write(dir.path().join("song-3-000.json"), r#"{"bpm": 56, "timesignature": "4"}"#).unwrap();
    let out = label(dir.path(), &["--json"]);
    let rows: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let kept = rows.iter().find(|r| r["file"] == "song-3-000.ogg").unwrap();
    assert_eq!(
        (kept["bpm"].as_u64(), kept["source"]["bpm"].as_str(), kept["analysed"]["bpm"].as_u64()),
        (Some(56), Some("sidecar"), Some(112))
    );
    assert_eq!(kept["source"]["keyscale"], "analysed");

    let table = label(dir.path(), &[]);
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(
        text.lines().any(|l| l.starts_with("song-3-024.ogg") && l.contains("85 (") && l.contains("C major")),
        "{text}"
    );
    assert!(text.lines().any(|l| l.starts_with("song-3-000.ogg") && l.contains("56 (sidecar)")), "{text}");
}

/// `ostinato label` keeps its readings in the store (never in the songs' folder), a
/// run records them in run.toml and trains with them (the prompt says so), a sidecar's
/// value wins unless `--overwrite`, and sidecars are written only when asked, a
/// differing one replaced only with `--replace-sidecars`.
#[test]
fn labels_are_kept_trained_with_and_written_as_sidecars_only_when_asked() {
    let clips = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/data/labels");
    let tmp = tempfile::tempdir().unwrap();
    let (songs, store) = (tmp.path().join("songs"), tmp.path().join("labels"));
    std::fs::create_dir(&songs).unwrap();
    for name in ["song-3-000.ogg", "song-3-024.ogg"] {
        std::fs::copy(clips.join(name), songs.join(name)).unwrap();
    }
    std::fs::write(songs.join("song-3-000.json"), r#"{"bpm": 56}"#).unwrap();
    let listing = |dir: &Path| {
        let mut names: Vec<_> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    };
    let before = listing(&songs);
    let label = |more: &[&str]| {
        let out = ok(ostinato()
            .args(["label", songs.to_str().unwrap(), "--json", "--labels-dir", store.to_str().unwrap()])
            .args(more)
            .output()
            .unwrap());
        let rows: Vec<serde_json::Value> =
            String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        (rows, String::from_utf8(out.stderr).unwrap())
    };
    let row = |rows: &[serde_json::Value], name: &str| rows.iter().find(|r| r["file"] == name).unwrap().clone();
    label(&[]);
    assert_eq!(listing(&songs), before, "the songs' folder is only read");

    let out = ok(train(
        tmp.path(),
        &songs,
        "labelled",
        &["--max-steps", "1", "--json", "--labels-dir", store.to_str().unwrap()],
    )
    .output()
    .unwrap());
    drop(out);
    let run = tmp.path().join("runs/labelled");
    let config = RunConfig::from_toml_file(&run.join("run.toml")).unwrap();
    let given = |name: &str| config.data.labels.get(name).cloned().unwrap_or_default();
    assert_eq!(
        (given("song-3-024.ogg").bpm.as_deref(), given("song-3-024.ogg").keyscale.as_deref()),
        (Some("85"), Some("C major"))
    );
    assert_eq!(given("song-3-000.ogg").bpm, None, "the sidecar's tempo wins over a reading");
    let prompts: Vec<(String, String)> = read_events(&run.join("events.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(|e| match e {
            Event::DatasetFile { file, prompt, .. } => {
                Some((file.file_name()?.to_string_lossy().into_owned(), prompt?))
            }
            _ => None,
        })
        .collect();
    let prompt = |name: &str| prompts.iter().find(|(f, _)| f == name).map(|(_, p)| p.clone()).unwrap();
    assert!(prompt("song-3-024.ogg").contains("- bpm: 85\n- timesignature: 3\n- keyscale: C major\n"), "{prompts:?}");
    assert!(prompt("song-3-000.ogg").contains("- bpm: 56\n"), "{prompts:?}");

    let (rows, _) = label(&["--overwrite"]);
    let over = row(&rows, "song-3-000.ogg");
    assert_eq!((over["bpm"].as_u64(), over["source"]["bpm"].as_str()), (Some(112), Some("edited")));

    let (rows, stderr) = label(&["--write-sidecars"]);
    assert!(stderr.contains("1 sidecar file(s) already say something else and were kept"), "{stderr}");
    let outcomes = |r: &serde_json::Value| -> Vec<(String, String)> {
        r["sidecars"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                let name = Path::new(f["path"].as_str().unwrap()).file_name().unwrap().to_string_lossy().into_owned();
                (name, f["outcome"].as_str().unwrap().to_string())
            })
            .collect()
    };
    assert_eq!(outcomes(&row(&rows, "song-3-000.ogg")), [("song-3-000.json".to_string(), "kept".to_string())]);
    assert_eq!(outcomes(&row(&rows, "song-3-024.ogg")), [("song-3-024.json".to_string(), "written".to_string())]);
    assert_eq!(std::fs::read_to_string(songs.join("song-3-000.json")).unwrap(), r#"{"bpm": 56}"#);
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(songs.join("song-3-024.json")).unwrap()).unwrap();
    assert_eq!(written, serde_json::json!({"bpm": 85, "keyscale": "C major", "timesignature": "3"}));

    label(&["--write-sidecars", "--replace-sidecars"]);
    let replaced: serde_json::Value =
        serde_json::from_slice(&std::fs::read(songs.join("song-3-000.json")).unwrap()).unwrap();
    assert_eq!(replaced["bpm"], 112);
}

/// `--lr-schedule`, `--warmup-steps` and `--cycles` reach run.toml and the steps' rates;
/// an option the schedule does not have, or a nonsense value, is refused by name.
#[test]
fn lr_schedules_are_chosen_by_flag_and_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let args = ["--max-steps", "6", "--lr-schedule", "cosine-restarts", "--warmup-steps", "2"];
    ok(train(tmp.path(), &songs, "restarts", &[&args[..], &["--cycles", "2", "--quiet"]].concat()).output().unwrap());
    let run = tmp.path().join("runs/restarts");
    let config = RunConfig::from_toml_file(&run.join("run.toml")).unwrap();
    assert_eq!(
        config.lr_schedule,
        ostinato_engine::train::schedule::LrSchedule::CosineRestarts { warmup_steps: 2, cycles: 2 }
    );
    let rates: Vec<f64> = read_events(&run.join("events.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(|e| match e {
            Event::Step { lr, .. } => Some(lr),
            _ => None,
        })
        .collect();
    // (The helper trains at lr 1e-3.) Warmup 0, 0.5e-3; then two cycles over the 4
    // steps left, each from the peak.
    let want = [0.0, 5e-4, 1e-3, 5e-4, 1e-3, 5e-4];
    assert_eq!(rates.len(), want.len(), "{rates:?}");
    assert!(rates.iter().zip(want).all(|(r, w)| (r - w).abs() < 1e-9), "{rates:?}");

    let mut no_warmup = train(tmp.path(), &songs, "c", &["--lr-schedule", "constant", "--warmup-steps", "5"]);
    fails_with(&mut no_warmup, "the constant schedule has no warmup");
    let mut zero = train(tmp.path(), &songs, "z", &["--lr-schedule", "cosine-restarts", "--cycles", "0"]);
    fails_with(&mut zero, "lr_schedule.cycles");
    fails_with(&mut train(tmp.path(), &songs, "u", &["--lr-schedule", "step"]), "unknown schedule `step`");
}

/// `--targets self,mlp` trains adapters on the self-attention and the MLP, none on the
/// cross-attention: in run.toml, in the saved adapter and its PEFT config; a bad list
/// is refused naming the item.
#[test]
fn targets_choose_the_attentions_and_the_mlp() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    ok(train(tmp.path(), &songs, "targets", &["--max-steps", "1", "--targets", "self,mlp", "--quiet"])
        .output()
        .unwrap());
    let run = tmp.path().join("runs/targets");
    let config = RunConfig::from_toml_file(&run.join("run.toml")).unwrap();
    assert_eq!(config.lora.target_modules, ostinato_engine::lora::parse_targets("self,mlp").unwrap());
    let adapter = run.join("final/adapter");
    let tensors =
        candle_core::safetensors::load(adapter.join("adapter_model.safetensors"), &candle_core::Device::Cpu).unwrap();
    let has = |part: &str| tensors.keys().any(|k| k.contains(part));
    assert!(has(".self_attn.q_proj.lora_A") && has(".mlp.down_proj.lora_B"), "{:?}", tensors.keys());
    assert!(!has(".cross_attn."), "no cross-attention adapters: {:?}", tensors.keys());
    let peft: serde_json::Value =
        serde_json::from_slice(&std::fs::read(adapter.join("adapter_config.json")).unwrap()).unwrap();
    assert!(peft["target_modules"].as_array().unwrap().iter().any(|t| t == "mlp.up_proj"), "{peft}");

    fails_with(&mut train(tmp.path(), &songs, "bad", &["--targets", "self attn"]), "--targets: `self attn`");
}

/// `--optimizer prodigy` reaches run.toml with a constant schedule (lr as given: the
/// helper's 1e-3 comes after), a config file's `[optimizer]` table keeps its settings,
/// and a bad name or value is refused naming it.
#[test]
fn optimizers_are_chosen_by_flag_or_config_and_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    ok(train(tmp.path(), &songs, "prodigy", &["--max-steps", "2", "--optimizer", "prodigy", "--quiet"])
        .output()
        .unwrap());
    let config = RunConfig::from_toml_file(&tmp.path().join("runs/prodigy/run.toml")).unwrap();
    assert_eq!(config.optimizer, OptimizerConfig::named("prodigy").unwrap());
    assert_eq!(config.lr_schedule, ostinato_engine::train::schedule::LrSchedule::Constant);
    assert_eq!(config.lr, 1e-3);

    let file = tmp.path().join("adafactor.toml");
    std::fs::write(&file, "[optimizer]\nkind = \"adafactor\"\nbeta1 = 0.9\n").unwrap();
    let config_arg = ["--config", file.to_str().unwrap()];
    ok(train(tmp.path(), &songs, "adafactor", &[&config_arg[..], &["--max-steps", "1", "--quiet"]].concat())
        .output()
        .unwrap());
    let config = RunConfig::from_toml_file(&tmp.path().join("runs/adafactor/run.toml")).unwrap();
    let want = AdafactorConfig { beta1: Some(0.9), ..Default::default() };
    assert_eq!(config.optimizer, OptimizerConfig::Adafactor(want));

    fails_with(
        &mut train(tmp.path(), &songs, "lion", &["--optimizer", "lion"]),
        "--optimizer: unknown optimizer `lion`",
    );
    std::fs::write(&file, "[optimizer]\nkind = \"prodigy\"\nd0 = 0\n").unwrap();
    fails_with(&mut train(tmp.path(), &songs, "d0", &config_arg), "optimizer.d0");
}

/// `--adapter lokr` (with its factor, decompose-both and DoRA) and `--dora` reach
/// run.toml and the run's summary line; the final folder is the adapter's own file,
/// exported as such and refused in the other kind's format; bad combinations are named
/// by their run.toml field.
#[test]
fn adapters_are_chosen_by_flag_and_checked() {
    use ostinato_engine::lora::AdapterKind;
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let lokr = ["--max-steps", "2", "--adapter", "lokr", "--factor", "4", "--decompose-both", "--dora"];
    let out = ok(train(tmp.path(), &songs, "lokr", &lokr).output().unwrap());
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let run = tmp.path().join("runs/lokr");
    let config = RunConfig::from_toml_file(&run.join("run.toml")).unwrap();
    let l = &config.lora;
    assert_eq!(
        (l.kind, l.r, l.factor, l.decompose_both, l.use_dora, l.dropout),
        (AdapterKind::Lokr, 4, 4, true, true, 0.0)
    );
    assert!(stderr.contains("LoKr + DoRA r 4 alpha 8"), "the run's summary line: {stderr}");
    let weights = run.join("final/adapter/lokr_weights.safetensors");
    assert!(stdout.contains(&weights.display().to_string()), "{stdout}");
    let exported = tmp.path().join("exported");
    ok(ostinato()
        .args(["export", run.to_str().unwrap(), "--format", "lycoris", "--to"])
        .arg(&exported)
        .output()
        .unwrap());
    assert_eq!(std::fs::read(exported.join("lokr_weights.safetensors")).unwrap(), std::fs::read(&weights).unwrap());
    let peft = tmp.path().join("peft");
    let mut refused = ostinato();
    refused.args(["export", run.to_str().unwrap(), "--format", "peft", "--to"]).arg(&peft);
    fails_with(&mut refused, "a lokr adapter is exported as lycoris");

    ok(train(tmp.path(), &songs, "dora", &["--max-steps", "1", "--dora", "--quiet"]).output().unwrap());
    let dora = RunConfig::from_toml_file(&tmp.path().join("runs/dora/run.toml")).unwrap().lora;
    assert_eq!((dora.kind, dora.use_dora), (AdapterKind::Lora, true));
    let adapter_config =
        std::fs::read_to_string(tmp.path().join("runs/dora/final/adapter/adapter_config.json")).unwrap();
    assert!(adapter_config.contains("\"use_dora\": true"), "{adapter_config}");

    fails_with(&mut train(tmp.path(), &songs, "loha", &["--adapter", "loha"]), "--adapter: unknown adapter `loha`");
    fails_with(&mut train(tmp.path(), &songs, "f", &["--factor", "2"]), "lora.factor");
    fails_with(&mut train(tmp.path(), &songs, "d", &["--adapter", "lokr", "--dropout", "0.1"]), "lora.dropout");
}

/// `label --captions`: ACE-Step's LM (found where models are looked for, or named)
/// writes each song's caption, lyrics, language and genre into the label store; its
/// tempo, key and meter are shown and taken only with --lm-metas; a song it cannot
/// label keeps its labels; missing pieces are named.
#[test]
fn label_captions_keeps_the_lm_s_labels_and_its_metas_only_when_asked() {
    use ostinato_engine::data::Field;
    use ostinato_engine::label::store::LabelStore;
    let clips = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/data/labels");
    let tmp = tempfile::tempdir().unwrap();
    let (songs, store, checkpoints) = (tmp.path().join("songs"), tmp.path().join("labels"), tmp.path().join("ckpt"));
    std::fs::create_dir(&songs).unwrap();
    for name in ["song-3-000.ogg", "song-3-024.ogg"] {
        std::fs::copy(clips.join(name), songs.join(name)).unwrap();
    }
    // Silence: the audio's readings cannot tell, and the LM has nothing to describe.
    let silence = ostinato_engine::codec::StereoAudio::silence(48_000, 8 * 48_000);
    ostinato_engine::generate::wav::write_wav(&songs.join("silence.wav"), &silence).unwrap();
    ostinato_engine::label::understand::tiny::write_tiny_lm(&checkpoints.join("acestep-5Hz-lm-1.7B"), 3).unwrap();
    let label = |more: &[&str], found: &Path| {
        let mut cmd = ostinato();
        cmd.args(["label", songs.to_str().unwrap(), "--labels-dir", store.to_str().unwrap()])
            .args(more)
            .current_dir(tmp.path())
            .env("ACESTEP_CHECKPOINTS_DIR", found)
            .env("HF_HUB_CACHE", tmp.path().join("hub"))
            .env("XDG_DATA_HOME", tmp.path().join("data"))
            .env("OSTINATO_CONFIG_DIR", tmp.path().join("config"));
        cmd.output().unwrap()
    };
    let rows = |out: Output| -> Vec<serde_json::Value> {
        let out = ok(out);
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let saved = |name: &str| LabelStore::new(&store).find(&songs.join(name)).unwrap().saved;

    let first = rows(label(&["--captions", "--demo", "--json"], &checkpoints));
    for row in first.iter().filter(|r| r["file"] != "silence.wav") {
        let lm = &row["lm"];
        println!("{}: {}", row["file"], lm);
        let caption = lm["fields"]["caption"].as_str().unwrap_or_else(|| panic!("{row}"));
        assert!(!caption.trim().is_empty() && lm["tokens"].as_u64() > Some(0), "{row}");
        let kept = saved(row["file"].as_str().unwrap());
        assert_eq!(kept.understood.get(Field::Caption), Some(caption));
        assert_eq!(kept.understood.get(Field::Bpm), lm["fields"]["bpm"].as_str(), "the LM's tempo is kept to be shown");
        // The tempo stays the audio's reading.
        assert_eq!(row["bpm"], row["analysed"]["bpm"], "{row}");
        assert_eq!(kept.accepted.get(Field::Bpm), row["analysed"]["bpm"].as_u64().map(|b| b.to_string()).as_deref());
    }
    let silent = first.iter().find(|r| r["file"] == "silence.wav").unwrap();
    let why = silent["lm"]["error"].as_str().unwrap_or_else(|| panic!("{silent}"));
    assert!(why.contains("silence.wav") && why.contains("silent"), "{why}");
    assert!(saved("silence.wav").understood.is_empty(), "the song keeps the labels it had");

    // --lm-metas: the LM's tempo is taken over the reading.
    let again = rows(label(&["--captions", "--demo", "--json", "--lm-metas", "--seed", "5"], &checkpoints));
    let row = again.iter().find(|r| r["file"] == "song-3-000.ogg").unwrap();
    let lm_bpm = row["lm"]["fields"]["bpm"].as_str().expect("the tiny LM writes a tempo from the constraint's range");
    assert_eq!(row["bpm"].as_u64().map(|b| b.to_string()).as_deref(), Some(lm_bpm), "{row}");

    // The table shows the LM's lines under each song.
    let table = String::from_utf8(ok(label(&["--captions", "--demo"], &checkpoints)).stdout).unwrap();
    assert!(table.contains("    caption (ACE-Step's LM): "), "{table}");
    assert!(table.contains("(not taken: --lm-metas takes them)"), "{table}");

    // What is missing is named: the codes' model, the LM (with its download and size).
    fails_with(ostinato().args(["label", songs.to_str().unwrap(), "--captions"]), "--model DIR");
    let nowhere = tmp.path().join("nowhere");
    let out = label(&["--captions", "--demo"], &nowhere);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("ostinato models download lm-1.7b") && stderr.contains("3.7 GB"),
        "{stderr}"
    );
    let out = label(&["--captions", "--demo", "--lm", nowhere.to_str().unwrap()], &checkpoints);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("nowhere"), "{stderr}");
    fails_with(ostinato().args(["label", songs.to_str().unwrap(), "--lm-metas"]), "--captions");
}

/// A run's trigger word goes into its adapter's files, and `inspect` shows it there.
#[test]
fn inspect_shows_the_trigger_word_a_run_kept_in_its_adapter() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let extra = ["--max-steps", "1", "--trigger", "ostn style", "--trigger-position", "append"];
    ok(train(tmp.path(), &songs, "tagged", &extra).output().unwrap());
    let adapter = tmp.path().join("runs/tagged/final/adapter");
    let out = ok(ostinato().args(["inspect", adapter.to_str().unwrap()]).output().unwrap());
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(stdout.contains("trigger: ostn style (append)"), "{stdout}");
    assert!(stdout.contains("adapter: LoRA r 4 alpha 8"), "{stdout}");
    ok(train(tmp.path(), &songs, "plain", &["--max-steps", "1"]).output().unwrap());
    let plain = tmp.path().join("runs/plain/final/adapter");
    let out = ok(ostinato().args(["inspect", plain.to_str().unwrap()]).output().unwrap());
    assert!(String::from_utf8_lossy(&out.stdout).contains("trigger: none"));
}

/// `--preview-prompt` twice: both previewed at each preview step, into run.toml as the
/// run's prompts; `--preview-at-step-0 off` makes no base-model preview; a wrong field
/// is named before anything runs.
#[test]
fn preview_prompts_from_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = audio(tmp.path());
    let extra = [
        "--max-steps",
        "2",
        "--preview-every-steps",
        "2",
        "--trigger",
        "ostn",
        "--preview-prompt",
        "caption=[trigger] warm keys; seconds=1; seed=4",
        "--preview-prompt",
        "caption=drums; keyscale=A minor; seconds=0.5",
        "--preview-at-step-0",
        "off",
    ];
    ok(train(tmp.path(), &songs, "prompted", &extra).output().unwrap());
    let run = tmp.path().join("runs/prompted");
    let mut made: Vec<String> = std::fs::read_dir(run.join("previews"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    made.sort();
    assert_eq!(made, ["step-000002-prompt2.wav", "step-000002.wav"]);
    let toml = std::fs::read_to_string(run.join("run.toml")).unwrap();
    assert!(toml.contains("[[preview_prompts]]") && toml.contains("caption = \"[trigger] warm keys\""), "{toml}");
    assert!(toml.contains("preview_at_step_0 = false"), "{toml}");

    // The first prompt again with that run's adapter mixed in: its preview is another
    // song, the second prompt's the same bytes (training does not depend on previews).
    let other = run.join("final/adapter");
    let mixed_prompt = format!("caption=[trigger] warm keys; seconds=1; seed=4; adapter={}@1", other.display());
    let mut mixed = extra.to_vec();
    mixed[7] = &mixed_prompt;
    ok(train(tmp.path(), &songs, "mixed", &mixed).output().unwrap());
    let preview =
        |name: &str, file: &str| std::fs::read(tmp.path().join("runs").join(name).join("previews").join(file)).unwrap();
    assert_ne!(
        preview("mixed", "step-000002.wav"),
        preview("prompted", "step-000002.wav"),
        "the other adapter is heard"
    );
    assert_eq!(preview("mixed", "step-000002-prompt2.wav"), preview("prompted", "step-000002-prompt2.wav"));
    let toml = std::fs::read_to_string(tmp.path().join("runs/mixed/run.toml")).unwrap();
    assert!(toml.contains("[[preview_prompts.more_adapters]]") && toml.contains("scale = 1.0"), "{toml}");

    let bad = ["--preview-every-steps", "2", "--preview-prompt", "caption=x; bpm=500"];
    fails_with(&mut train(tmp.path(), &songs, "bad", &bad), "preview_prompts[0].bpm");
    fails_with(
        &mut train(tmp.path(), &songs, "bad", &["--preview-prompt", "tempo=3"]),
        "`tempo` is not a prompt field",
    );
}

/// The 5 Hz LM plans songs and previews on the tiny real-layout model
/// (engine/tests/fixtures/real) with the committed tiny LM: `generate --lm DIR` writes
/// the plan's codes and the DiT hears them; a run's `--preview-lm` previews are planned
/// (they differ from the same run's unplanned ones) by the LM found where models are
/// looked for, and with none found the run refuses to start, saying how to get one.
#[test]
fn songs_and_previews_planned_by_the_5hz_lm() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures");
    let model = fixtures.join("real/model/acestep-v15-turbo");
    let lm = fixtures.join("lm_tiny/acestep-5Hz-lm-tiny");
    let tmp = tempfile::tempdir().unwrap();
    let song = |out: &Path, extra: &[&str]| {
        let mut c = ostinato();
        c.args(["generate", "--model", model.to_str().unwrap(), "--caption", "plucked strings"])
            .args(["--duration", "2", "--seed", "4", "--json", "--out", out.to_str().unwrap()])
            .args(extra);
        c
    };
    let planned = tmp.path().join("planned.wav");
    let out = ok(song(&planned, &["--lm", lm.to_str().unwrap(), "--lm-temperature", "0"]).output().unwrap());
    let events: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let plan = events.iter().find(|e| e["type"] == "planned").unwrap_or_else(|| panic!("no plan: {events:?}"));
    println!("planned: {plan}");
    assert!(plan["codes"].as_u64().unwrap() > 0, "{plan}");
    assert!(events.iter().any(|e| e["type"] == "planning" && e["phase"] == "codes"), "{events:?}");
    assert_eq!(events.last().unwrap()["type"], "written");
    let unplanned = tmp.path().join("unplanned.wav");
    ok(song(&unplanned, &[]).output().unwrap());
    assert_ne!(std::fs::read(&planned).unwrap(), std::fs::read(&unplanned).unwrap(), "the DiT hears the plan");
    fails_with(
        ostinato()
            .args(["generate", "--demo", "--caption", "x", "--duration", "1", "--lm", lm.to_str().unwrap()])
            .args(["--out", tmp.path().join("demo.wav").to_str().unwrap()]),
        "demo model cannot take a plan",
    );

    // Previews: the LM is found in a folder added to the app's places (as the Model panel adds one).
    let songs = audio(tmp.path());
    let lms = tmp.path().join("lms");
    std::fs::create_dir_all(lms.join("acestep-5Hz-lm-0.6B")).unwrap();
    for f in std::fs::read_dir(&lm).unwrap().flatten() {
        std::fs::copy(f.path(), lms.join("acestep-5Hz-lm-0.6B").join(f.file_name())).unwrap();
    }
    let (with_lm, without_lm) = (tmp.path().join("config-lm"), tmp.path().join("config-none"));
    ostinato_engine::load::places::AddedFolders::add(&with_lm, &lms).unwrap();
    let run = |name: &str, config: &Path, extra: &[&str]| {
        let mut c = ostinato();
        c.args(["train", songs.to_str().unwrap(), "--model", model.to_str().unwrap(), "--name", name])
            .args(["--runs-dir", tmp.path().join("runs").to_str().unwrap()])
            .args(["--crop-seconds", "2", "--rank", "2", "--max-steps", "2", "--seed", "3"])
            .args(["--preview-every-steps", "2", "--preview-seconds", "1", "--preview-caption", "soft bells"])
            .args(extra)
            // Only the places this test makes: no LM of the machine's is found.
            .env("OSTINATO_CONFIG_DIR", config)
            .env("HOME", tmp.path())
            .env("XDG_CACHE_HOME", tmp.path().join("cache"))
            .env("XDG_DATA_HOME", tmp.path().join("data"))
            .env("HF_HOME", tmp.path().join("hf"))
            .env_remove("HF_HUB_CACHE")
            .env("ACESTEP_CHECKPOINTS_DIR", tmp.path().join("checkpoints"))
            .current_dir(tmp.path());
        c
    };
    ok(run("planned", &with_lm, &["--preview-lm"]).output().unwrap());
    ok(run("plain", &with_lm, &[]).output().unwrap());
    let preview =
        |name: &str, file: &str| std::fs::read(tmp.path().join("runs").join(name).join("previews").join(file)).unwrap();
    for file in ["base.wav", "step-000002.wav"] {
        assert_ne!(preview("planned", file), preview("plain", file), "{file}: planned previews differ");
    }
    let toml = std::fs::read_to_string(tmp.path().join("runs/planned/run.toml")).unwrap();
    assert!(toml.contains("preview_lm = true"), "{toml}");
    let stderr = fails_with(
        &mut run("no-lm", &without_lm, &["--preview-lm"]),
        "setting `preview_lm`: no complete 5 Hz LM found",
    );
    println!("without an LM: {stderr}");
    assert!(stderr.contains("ostinato models download lm-"), "{stderr}");
    assert!(!stderr.contains("preparing dataset"), "refused before the songs are prepared: {stderr}");
    assert!(!tmp.path().join("runs/no-lm").exists(), "and no run folder left behind");
}

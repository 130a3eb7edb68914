//! Runs end to end on the demo model: events, pause/resume/stop, crash-safe
//! checkpoints, bit-exact resume (also after SIGKILL), fallback on corrupt checkpoints.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use candle_core::{DType, Device};
use ostinato_engine::data::synth;
use ostinato_engine::data::wav::{write_wav, SampleFormat};
use ostinato_engine::events::{read_events, Event};
use ostinato_engine::generate::wav::write_wav as write_song_wav;
use ostinato_engine::generate::{GenerateEvent, GenerateSpec, Generator, MixedAdapter};
use ostinato_engine::lora::{AdapterKind, LoraAdapter};
use ostinato_engine::model::DitModel;
use ostinato_engine::train::ab::{generate_pair_for_run, new_pair_dir, run_pairs, AbVoice, PairRequest, Side};
use ostinato_engine::train::history::{summarise, RunStatus};
use ostinato_engine::train::songs::{generate_for_run, new_song_path, run_songs, SongUpdate};
use ostinato_engine::train::state::{kept_adapter_steps, kept_adapters, step_adapter_dir};
use ostinato_engine::train::{Run, RunConfig, RunEnd, RunHandle};
use ostinato_engine::Error;

const STEPS: u64 = 9;

/// Two demo clips cut to 2 s, batch 1: 2 steps an epoch, quick on the CPU.
fn config(dir: &Path, name: &str) -> RunConfig {
    let audio = dir.join("audio");
    if !audio.exists() {
        synth::write_demo(&audio).unwrap();
        // Keep two clips: fewer songs, quicker epochs.
        for entry in std::fs::read_dir(&audio).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let keep = ["pluck_arpeggio", "drum_groove"].iter().any(|p| name.starts_with(p));
            if !keep {
                std::fs::remove_file(path).unwrap();
            }
        }
    }
    let mut c = RunConfig {
        name: name.into(),
        runs_dir: dir.join("runs"),
        force_cpu: true,
        seed: 7,
        epochs: 100,
        max_steps: Some(STEPS),
        save_every_steps: Some(2),
        cache_dir: Some(dir.join("cache")),
        ..Default::default()
    };
    c.data.folder = audio;
    c.data.crop_seconds = Some(2.0);
    c.lora.r = 4;
    c.lora.alpha = 8.0;
    c.lr = 1e-3;
    c
}

fn adapter_bytes(run_dir: &Path) -> Vec<u8> {
    std::fs::read(LoraAdapter::weights_file(&run_dir.join("final/adapter"))).unwrap()
}

/// step -> `value(loss, lr)` of its step event, the latest entry winning (steps redone
/// after a crash replace earlier ones).
fn per_step(run_dir: &Path, value: fn(f64, f64) -> f64) -> BTreeMap<u64, f64> {
    read_events(&run_dir.join("events.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(|e| match e {
            Event::Step { step, loss, lr, .. } => Some((step, value(loss, lr))),
            _ => None,
        })
        .collect()
}

fn losses(run_dir: &Path) -> BTreeMap<u64, f64> {
    per_step(run_dir, |loss, _| loss)
}

fn wait_for_step(handle: &RunHandle, step: u64) {
    for event in handle.events().iter() {
        if matches!(event, Event::Step { step: s, .. } if s >= step) {
            return;
        }
        if let Event::Failed { reason, .. } = event {
            panic!("run failed: {reason}");
        }
    }
}

fn straight_run(dir: &Path) -> PathBuf {
    let handle = Run::start(config(dir, "straight")).unwrap();
    let run_dir = handle.run_dir().to_path_buf();
    assert!(matches!(handle.join().unwrap(), RunEnd::Finished { steps: STEPS, .. }));
    run_dir
}

#[test]
fn stop_resume_pause_resume_is_bit_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let straight = straight_run(tmp.path());

    // Stop at N/3, resume and pause at about 2N/3, resume to the end.
    let mut c = config(tmp.path(), "interrupted");
    c.stop_at_step = Some(STEPS / 3);
    let first = Run::start(c).unwrap();
    let run_dir = first.run_dir().to_path_buf();
    assert!(matches!(first.join().unwrap(), RunEnd::Stopped { steps: 3, .. }));

    let second = Run::resume(&run_dir).unwrap();
    wait_for_step(&second, 2 * STEPS / 3);
    second.pause();
    let paused_at = second
        .events()
        .iter()
        .find_map(|e| match e {
            Event::Paused { step } => Some(step),
            _ => None,
        })
        .expect("paused");
    std::thread::sleep(Duration::from_millis(200));
    assert!(second.events().try_recv().is_err(), "no step while paused");
    second.resume();
    assert!(matches!(second.join().unwrap(), RunEnd::Finished { steps: STEPS, .. }));
    println!("paused at step {paused_at}");

    assert_eq!(losses(&straight), losses(&run_dir), "identical loss sequence");
    assert_eq!(losses(&straight).len() as u64, STEPS);
    assert!(adapter_bytes(&straight) == adapter_bytes(&run_dir), "identical adapter bytes");
}

/// Trains `c` to its end (all `STEPS`); the run directory.
/// The run of `c` stopped at a third of its steps, then resumed to the end.
fn stopped_and_resumed(c: RunConfig) -> PathBuf {
    let first = Run::start(RunConfig { stop_at_step: Some(STEPS / 3), ..c }).unwrap();
    let run_dir = first.run_dir().to_path_buf();
    assert!(matches!(first.join().unwrap(), RunEnd::Stopped { steps: 3, .. }));
    assert!(matches!(Run::resume(&run_dir).unwrap().join().unwrap(), RunEnd::Finished { steps: STEPS, .. }));
    run_dir
}

fn finish(c: RunConfig) -> PathBuf {
    let handle = Run::start(c).unwrap();
    let run_dir = handle.run_dir().to_path_buf();
    assert!(matches!(handle.join().unwrap(), RunEnd::Finished { steps: STEPS, .. }));
    run_dir
}

/// Every step event says at which t each sample trained and its own loss; the t are
/// the run's turbo levels (in run_started), the losses average to the step's loss,
/// and the replayed log buckets them by noise level, first epoch against the latest.
#[test]
fn step_events_carry_each_samples_timestep_and_loss_and_replay_by_noise_level() {
    let tmp = tempfile::tempdir().unwrap();
    // Both 2 s clips in one batch: one step an epoch.
    let run_dir = finish(RunConfig { batch_size: 2, ..config(tmp.path(), "samples") });
    let events = read_events(&run_dir.join("events.jsonl")).unwrap();
    let levels = events.iter().find_map(|e| match e {
        Event::RunStarted { timestep_levels, .. } => timestep_levels.clone(),
        _ => None,
    });
    let levels = levels.expect("the demo draws turbo timesteps");
    assert_eq!(levels.len(), 8);
    let mut steps = 0;
    for event in &events {
        if let Event::Step { loss, samples, .. } = event {
            steps += 1;
            assert_eq!(samples.len(), 2, "{samples:?}");
            assert!(samples.iter().all(|s| levels.contains(&s.t)), "{samples:?} on {levels:?}");
            let mean = samples.iter().map(|s| s.loss as f64).sum::<f64>() / 2.0;
            assert!((mean - loss).abs() <= 1e-6 * loss, "{mean} vs {loss}");
        }
    }
    assert_eq!(steps, STEPS);
    let by_level = ostinato_engine::noise_levels::loss_by_noise_level(&events);
    assert!(by_level.fixed);
    let epochs: Vec<(u64, u64)> = by_level.epochs.iter().map(|e| (e.epoch, e.counts.iter().sum())).collect();
    assert_eq!(epochs, [(0, 2), (STEPS - 1, 2)]);
}

/// The demo carries a null condition: with CFG dropout on, a stopped and resumed run
/// is still bit-exact, and the draws change the run; at ratio 0 nothing changes.
#[test]
fn cfg_dropout_resumes_bit_exact_and_ratio_zero_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let plain = straight_run(tmp.path());
    let zero = finish(RunConfig { cfg_dropout: Some(0.0), ..config(tmp.path(), "zero") });
    assert_eq!(losses(&plain), losses(&zero), "ratio 0: the same losses");
    assert!(adapter_bytes(&plain) == adapter_bytes(&zero), "ratio 0: the same adapter bytes");

    let dropping = |name: &str| RunConfig { cfg_dropout: Some(0.5), ..config(tmp.path(), name) };
    let straight = finish(dropping("dropping"));
    assert_ne!(losses(&plain), losses(&straight), "half the samples saw the null condition");
    let started = read_events(&straight.join("events.jsonl")).unwrap().into_iter().find_map(|e| match e {
        Event::RunStarted { cfg_dropout, .. } => Some(cfg_dropout),
        _ => None,
    });
    assert_eq!(started, Some(0.5));

    let first = Run::start(RunConfig { stop_at_step: Some(STEPS / 3), ..dropping("interrupted") }).unwrap();
    let run_dir = first.run_dir().to_path_buf();
    assert!(matches!(first.join().unwrap(), RunEnd::Stopped { steps: 3, .. }));
    assert!(matches!(Run::resume(&run_dir).unwrap().join().unwrap(), RunEnd::Finished { steps: STEPS, .. }));
    assert_eq!(losses(&straight), losses(&run_dir), "identical loss sequence");
    assert!(adapter_bytes(&straight) == adapter_bytes(&run_dir), "identical adapter bytes");
}

/// step -> the step size the update took (Prodigy's `d * lr`).
fn step_sizes(run_dir: &Path) -> BTreeMap<u64, f64> {
    per_step(run_dir, |_, lr| lr)
}

/// Prodigy and Adafactor train through the run: run.toml records them, a stopped and
/// resumed run is bit-exact (their whole state is in the checkpoint), and Prodigy's
/// steps report its learnt step size, which grows from `d0` (1e-6) times lr 1.
#[test]
fn prodigy_and_adafactor_runs_resume_bit_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let adamw_run = straight_run(tmp.path());
    let adamw = losses(&adamw_run);
    for name in ["prodigy", "adafactor"] {
        let chosen = |run: &str| {
            let mut c = config(tmp.path(), &format!("{name}-{run}"));
            c.choose_optimizer(name).unwrap();
            c
        };
        let straight = finish(chosen("straight"));
        let toml = std::fs::read_to_string(straight.join("run.toml")).unwrap();
        assert!(toml.contains(&format!("kind = \"{name}\"")), "{toml}");
        assert_ne!(losses(&straight), adamw, "{name} trains differently from AdamW");

        let run_dir = stopped_and_resumed(chosen("interrupted"));
        assert_eq!(losses(&straight), losses(&run_dir), "{name}: identical loss sequence");
        assert_eq!(step_sizes(&straight), step_sizes(&run_dir), "{name}: identical step sizes");
        assert!(adapter_bytes(&straight) == adapter_bytes(&run_dir), "{name}: identical adapter bytes");

        let sizes: Vec<f64> = step_sizes(&straight).into_values().collect();
        println!("{name}: step sizes {sizes:?}");
        match name {
            "prodigy" => {
                assert_eq!(sizes[0], 1e-6, "the first step at d0 times lr 1");
                assert!(sizes.last().unwrap() > &sizes[0], "d grew: {sizes:?}");
            }
            _ => assert_eq!(step_sizes(&straight), step_sizes(&adamw_run), "Adafactor steps at the schedule's rate"),
        }
    }
}

/// LoKr and DoRA train through the run with gradient checkpointing (the demo's default):
/// run.toml records them, every trainable tensor moves, a stopped and resumed run is
/// bit-exact, the final folder is the adapter's own file (upstream's LoKr file, PEFT's
/// with the magnitude), and a song is made with it.
#[test]
fn lokr_and_dora_runs_resume_bit_exact_and_make_songs() {
    let tmp = tempfile::tempdir().unwrap();
    let plain = losses(&straight_run(tmp.path()));
    for (name, kind, dora) in
        [("lokr", AdapterKind::Lokr, false), ("lokr-dora", AdapterKind::Lokr, true), ("dora", AdapterKind::Lora, true)]
    {
        let chosen = |run: &str| {
            let mut c = config(tmp.path(), &format!("{name}-{run}"));
            c.lora.choose(kind);
            c.lora.use_dora = dora;
            c
        };
        let straight = finish(chosen("straight"));
        assert_eq!(RunConfig::from_toml_file(&straight.join("run.toml")).unwrap().lora, chosen("x").lora);
        assert_ne!(losses(&straight), plain, "{name} trains differently from LoRA");

        let run_dir = stopped_and_resumed(chosen("interrupted"));
        assert_eq!(losses(&straight), losses(&run_dir), "{name}: identical loss sequence");
        assert!(adapter_bytes(&straight) == adapter_bytes(&run_dir), "{name}: identical adapter bytes");

        let (cfg, weights) = chosen("x").model.load_decoder(DType::F32, &Device::Cpu).unwrap();
        let model = DitModel::new(&cfg, &weights).unwrap();
        let fresh = LoraAdapter::new(chosen("x").lora, &model, 7).unwrap();
        let trained = LoraAdapter::load(&straight.join("final/adapter"), &model).unwrap();
        for ((key, before), (_, after)) in fresh.named_tensors().iter().zip(trained.named_tensors()) {
            let moved = (before - &after).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(moved > 0.0, "{name}: `{key}` never trained");
        }
        let song = new_song_path(&straight, 3);
        let spec = GenerateSpec { caption: "a test".into(), duration_seconds: 1.0, seed: 3, ..Default::default() };
        let mut steps = 0;
        let end = generate_for_run(&straight, &spec, &song, &mut |e| {
            steps += matches!(e, GenerateEvent::Step { .. }) as usize
        })
        .unwrap_or_else(|e| panic!("{name}: no song: {e}"));
        assert!(song.is_file() && steps == 8, "{name}: {end:?} after {steps} steps");
        println!("{name}: {} trainable tensors moved; losses {:?}", trained.named_tensors().len(), losses(&straight));
    }
}

/// A song asked of a live run is made with the run's own model at a step boundary (the
/// first one, and while paused), reporting each sampling step; training stays bit-exact;
/// at strength 0 it is the base model exactly, as a generator loaded for the run makes
/// it; once the run has ended it refuses, and the run's saved adapter serves instead.
#[test]
fn songs_asked_of_a_live_run_leave_training_bit_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let plain = straight_run(tmp.path());
    let handle = Run::start(config(tmp.path(), "asked")).unwrap();
    let (control, run_dir) = (handle.control(), handle.run_dir().to_path_buf());
    let spec = GenerateSpec { caption: "a test".into(), duration_seconds: 1.0, seed: 5, ..Default::default() };
    let base = GenerateSpec { adapter_scale: 0.0, ..spec.clone() };
    let hear = |rx: std::sync::mpsc::Receiver<SongUpdate>| -> Vec<GenerateEvent> {
        rx.iter().map(|u| u.unwrap_or_else(|e| panic!("the song failed: {e}"))).collect()
    };

    // Asked before the first step: served at the first step boundary.
    let first = new_song_path(&run_dir, 5);
    let events = hear(control.generate(base.clone(), first.clone()).unwrap());
    assert!(matches!(events[0], GenerateEvent::Unplanned { .. }), "{events:?}");
    assert!(matches!(events[1], GenerateEvent::Started { steps: 8, seed: 5, .. }), "{events:?}");
    let steps: Vec<usize> = events
        .iter()
        .filter_map(|e| if let GenerateEvent::Step { step, .. } = e { Some(*step) } else { None })
        .collect();
    assert_eq!(steps, (1..=8).collect::<Vec<_>>());
    assert!(matches!(events[events.len() - 2], GenerateEvent::Decoding { .. }));
    assert!(matches!(&events[events.len() - 1], GenerateEvent::Written { path, .. } if path == &first));
    assert!(first.starts_with(run_dir.join("songs")) && first.is_file());

    // Asked while paused: served at once, the run still paused.
    wait_for_step(&handle, 4);
    control.pause();
    for event in handle.events().iter() {
        if matches!(event, Event::Paused { .. }) {
            break;
        }
    }
    let paused = new_song_path(&run_dir, 6);
    let events = hear(control.generate(GenerateSpec { seed: 6, ..spec.clone() }, paused.clone()).unwrap());
    assert!(matches!(events.last(), Some(GenerateEvent::Written { .. })) && paused.is_file());
    // Both are listed again with what they were asked with, oldest first.
    let listed: Vec<_> = run_songs(&run_dir).unwrap().into_iter().map(|s| (s.path, s.spec.unwrap())).collect();
    assert_eq!(listed, [(first.clone(), base.clone()), (paused.clone(), GenerateSpec { seed: 6, ..spec.clone() })]);
    control.resume();
    assert!(matches!(handle.join().unwrap(), RunEnd::Finished { steps: STEPS, .. }));
    assert_eq!(losses(&plain), losses(&run_dir), "songs change no loss");
    assert!(adapter_bytes(&plain) == adapter_bytes(&run_dir), "songs change no adapter byte");

    // Ended: refused. A generator loaded for the run makes the same base song.
    assert!(control.generate(spec.clone(), new_song_path(&run_dir, 7)).is_err());
    let again = tmp.path().join("again.wav");
    generate_for_run(&run_dir, &base, &again, &mut |_| {}).unwrap();
    assert!(std::fs::read(&again).unwrap() == std::fs::read(&first).unwrap(), "strength 0 is the base model");
    let adapted = tmp.path().join("adapted.wav");
    let written = generate_for_run(&run_dir, &spec, &adapted, &mut |_| {}).unwrap();
    assert!(matches!(written, GenerateEvent::Written { seconds, .. } if (seconds - 1.0).abs() < 0.05));
    assert!(std::fs::read(&adapted).unwrap() != std::fs::read(&first).unwrap(), "the trained adapter is heard");
}

/// Previews every 2 steps, 1 s each: the run's base preview and one every 2 steps,
/// float WAVs of 1 s; a stopped and resumed run makes the same previews once each and
/// trains bit-exactly as a run without previews.
#[test]
fn previews_are_written_and_leave_training_bit_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let previewing =
        |name: &str| RunConfig { preview_every_steps: Some(2), preview_seconds: Some(1.0), ..config(tmp.path(), name) };
    let plain = straight_run(tmp.path());
    let handle = Run::start(previewing("previewed")).unwrap();
    let straight = handle.run_dir().to_path_buf();
    assert!(matches!(handle.join().unwrap(), RunEnd::Finished { steps: STEPS, .. }));
    let first = Run::start(RunConfig { stop_at_step: Some(STEPS / 3), ..previewing("interrupted") }).unwrap();
    let run_dir = first.run_dir().to_path_buf();
    assert!(matches!(first.join().unwrap(), RunEnd::Stopped { steps: 3, .. }));
    assert!(matches!(Run::resume(&run_dir).unwrap().join().unwrap(), RunEnd::Finished { steps: STEPS, .. }));

    for dir in [&straight, &run_dir] {
        assert_eq!(losses(&plain), losses(dir), "previews change no loss");
        assert!(adapter_bytes(&plain) == adapter_bytes(dir), "previews change no adapter byte");
    }
    let files = ["base.wav", "step-000002.wav", "step-000004.wav", "step-000006.wav", "step-000008.wav"];
    for (dir, name) in [&straight, &run_dir].into_iter().flat_map(|d| files.map(|f| (d, f))) {
        let reader = hound::WavReader::open(dir.join("previews").join(name)).unwrap();
        let spec = reader.spec();
        assert_eq!(
            (spec.channels, spec.sample_rate, spec.sample_format),
            (2, 48_000, hound::SampleFormat::Float),
            "{name}"
        );
        assert!((reader.duration() as f64 / 48_000.0 - 1.0).abs() < 0.05, "{name}: {} samples", reader.duration());
    }
    let read = |dir: &Path, name: &str| std::fs::read(dir.join("previews").join(name)).unwrap();
    assert!(files.iter().all(|f| read(&straight, f) == read(&run_dir, f)), "the same previews after a resume");
    assert!(read(&straight, "base.wav") != read(&straight, "step-000008.wav"), "training changes the preview");

    let previews = |dir: &Path| -> Vec<Event> {
        read_events(&dir.join("events.jsonl"))
            .unwrap()
            .into_iter()
            .filter(|e| matches!(e, Event::Preview { .. }))
            .collect()
    };
    let made = previews(&straight);
    assert_eq!(made.len(), files.len());
    for (event, (step, name)) in made.iter().zip([0, 2, 4, 6, 8].into_iter().zip(files)) {
        let Event::Preview { step: s, prompt, path, caption, seed, seconds, took_s } = event else { unreachable!() };
        assert_eq!((*s, *prompt, path.as_path()), (step, 0, Path::new("previews").join(name).as_path()));
        assert!(caption.contains("instrumental"), "a training clip's caption: {caption}");
        assert_eq!((*seconds, *seed), (1.0, previewing("x").preview_seed()));
        assert!(*took_s > 0.0);
    }
    let steps_of = |events: Vec<Event>| {
        events
            .iter()
            .map(|e| match e {
                Event::Preview { step, .. } => *step,
                _ => 0,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(steps_of(previews(&run_dir)), steps_of(made), "each preview once across the resume");
}

/// The user's own prompts: each previewed at every preview step, into its own file, with
/// its seed and length and `[trigger]` as the run's trigger word; without the step-0
/// switch, no base-model preview.
#[test]
fn each_preview_prompt_is_made_at_every_preview_step() {
    use ostinato_engine::data::{TagMode, TriggerTag};
    use ostinato_engine::train::prompts::PreviewPrompt;
    let tmp = tempfile::tempdir().unwrap();
    let prompts: Vec<PreviewPrompt> =
        ["caption=[trigger] calm piano; seconds=1; seed=11", "caption=drums; bpm=120; seconds=0.5"]
            .iter()
            .map(|p| p.parse().unwrap())
            .collect();
    let mut c = RunConfig {
        preview_every_steps: Some(4),
        preview_prompts: prompts,
        max_steps: Some(4),
        ..config(tmp.path(), "prompts")
    };
    c.data.trigger = Some(TriggerTag { tag: "ostn".into(), mode: TagMode::Prepend });
    let with_base = Run::start(c.clone()).unwrap();
    let with_base_dir = with_base.run_dir().to_path_buf();
    with_base.join().unwrap();
    let handle = Run::start(RunConfig { name: "no-base".into(), preview_at_step_0: Some(false), ..c }).unwrap();
    let run_dir = handle.run_dir().to_path_buf();
    handle.join().unwrap();

    let made: Vec<(u64, usize, PathBuf, String, u64, f64)> = read_events(&run_dir.join("events.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(|e| match e {
            Event::Preview { step, prompt, path, caption, seed, seconds, .. } => {
                Some((step, prompt, path, caption, seed, seconds))
            }
            _ => None,
        })
        .collect();
    let default_seed = RunConfig { name: "x".into(), ..config(tmp.path(), "x") }.preview_seed();
    assert_eq!(
        made,
        [
            (4, 0, "previews/step-000004.wav".into(), "ostn calm piano".to_string(), 11, 1.0),
            (4, 1, "previews/step-000004-prompt2.wav".into(), "drums".to_string(), default_seed, 0.5),
        ]
    );
    for (_, _, path, ..) in &made {
        let reader = hound::WavReader::open(run_dir.join(path)).unwrap();
        println!("{}: {} samples", path.display(), reader.duration());
    }
    assert!(!run_dir.join("previews/base.wav").exists(), "no step-0 preview when switched off");
    for base in ["base.wav", "base-prompt2.wav"] {
        assert!(with_base_dir.join("previews").join(base).is_file(), "{base}: the base model by default");
    }
    let read = |dir: &Path, name: &str| std::fs::read(dir.join("previews").join(name)).unwrap();
    assert!(read(&run_dir, "step-000004.wav") != read(&run_dir, "step-000004-prompt2.wav"));
    assert!(
        read(&run_dir, "step-000004.wav") == read(&with_base_dir, "step-000004.wav"),
        "a preview is its prompt's alone"
    );
}

/// A stop while the base preview samples (a long one) ends the preview between two
/// sampler steps: the run stops at step 0, resumable, with no preview written.
#[test]
fn a_stop_during_a_preview_ends_it_unwritten() {
    let tmp = tempfile::tempdir().unwrap();
    let c = RunConfig { preview_every_steps: Some(1), preview_seconds: Some(300.0), ..config(tmp.path(), "stopped") };
    let handle = Run::start(c).unwrap();
    let run_dir = handle.run_dir().to_path_buf();
    assert!(handle.events().iter().any(|e| matches!(e, Event::RunStarted { .. })));
    handle.stop();
    assert!(matches!(handle.join().unwrap(), RunEnd::Stopped { steps: 0, adapter: None }));
    assert!(!run_dir.join("previews/base.wav").exists());
    let events = read_events(&run_dir.join("events.jsonl")).unwrap();
    assert!(!events.iter().any(|e| matches!(e, Event::Preview { .. } | Event::Warning { .. })), "{events:?}");
}

#[test]
fn same_seed_same_run_and_complete_event_log() {
    let tmp = tempfile::tempdir().unwrap();
    let a = straight_run(tmp.path());
    let handle = Run::start(config(tmp.path(), "again")).unwrap();
    let b = handle.run_dir().to_path_buf();
    handle.join().unwrap();
    assert_eq!(losses(&a), losses(&b));
    assert!(adapter_bytes(&a) == adapter_bytes(&b));

    let events = read_events(&a.join("events.jsonl")).unwrap();
    assert!(matches!(events.first(), Some(Event::DatasetProgress { .. })));
    let started = events.iter().find_map(|e| match e {
        Event::RunStarted { memory, trainable_params, dataset, .. } => {
            Some((memory.clone(), *trainable_params, dataset.clone()))
        }
        _ => None,
    });
    let (memory, trainable, dataset) = started.expect("run_started");
    assert!(memory.gradient_checkpointing && memory.block_input_grad_path && memory.latent_cache);
    assert!(trainable > 0);
    assert_eq!(dataset.usable, 2);
    assert!(matches!(events.last(), Some(Event::Finished { steps: STEPS, .. })));
    // Checkpoints: the newest 3 kept, none half-written.
    let ckpts: Vec<String> = std::fs::read_dir(a.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(ckpts.len(), 3, "{ckpts:?}");
    assert!(ckpts.iter().all(|n| n.starts_with("step-")), "{ckpts:?}");
}

#[test]
fn corrupt_newest_checkpoint_falls_back_with_a_warning_and_missing_files_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config(tmp.path(), "corrupt");
    c.stop_at_step = Some(6);
    let handle = Run::start(c).unwrap();
    let run_dir = handle.run_dir().to_path_buf();
    handle.join().unwrap();

    let newest = run_dir.join("checkpoints/step-000006");
    std::fs::write(newest.join("training_state.safetensors"), b"garbage").unwrap();
    let resumed = Run::resume_with(&run_dir, Some(6)).unwrap();
    let warning = resumed.events().iter().find_map(|e| match e {
        Event::Warning { message } => Some(message),
        _ => None,
    });
    let warning = warning.expect("a warning about the fallback");
    assert!(warning.contains("step-000006") && warning.contains("falling back"), "{warning}");
    assert!(matches!(resumed.join().unwrap(), RunEnd::Stopped { steps: 6, .. }));

    // Every checkpoint unreadable: an error naming the file, no silent fresh start.
    for dir in std::fs::read_dir(run_dir.join("checkpoints")).unwrap() {
        std::fs::remove_file(dir.unwrap().path().join("adapter/adapter_model.safetensors")).unwrap();
    }
    let err = Run::resume(&run_dir).unwrap().join().unwrap_err().to_string();
    assert!(err.contains("adapter_model.safetensors"), "{err}");
}

#[test]
fn f16_optimizer_moments_are_restored_as_f32() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config(tmp.path(), "half");
    c.stop_at_step = Some(2);
    let handle = Run::start(c).unwrap();
    let run_dir = handle.run_dir().to_path_buf();
    handle.join().unwrap();

    let state_file = run_dir.join("checkpoints/step-000002/training_state.safetensors");
    let tensors = candle_core::safetensors::load(&state_file, &Device::Cpu).unwrap();
    let halved: std::collections::HashMap<_, _> = tensors
        .into_iter()
        .map(|(k, t)| {
            let t =
                if k.starts_with("adamw.m") || k.starts_with("adamw.v") { t.to_dtype(DType::F16).unwrap() } else { t };
            (k, t)
        })
        .collect();
    candle_core::safetensors::save(&halved, &state_file).unwrap();

    let resumed = Run::resume_with(&run_dir, Some(4)).unwrap();
    resumed.join().unwrap();
    let next = candle_core::safetensors::load(
        run_dir.join("checkpoints/step-000004/training_state.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let moments: Vec<_> = next.iter().filter(|(k, _)| k.starts_with("adamw.m") || k.starts_with("adamw.v")).collect();
    assert!(!moments.is_empty());
    assert!(moments.iter().all(|(_, t)| t.dtype() == DType::F32), "moments are f32 again");
}

const KILL_STEPS: u64 = 30;

fn long_config(dir: &Path, name: &str) -> RunConfig {
    RunConfig { max_steps: Some(KILL_STEPS), ..config(dir, name) }
}

/// Run by `sigkill_mid_step_loses_only_uncheckpointed_steps` in a child process.
#[test]
#[ignore = "child process of the SIGKILL test"]
fn child_trains_until_killed() {
    let Some(dir) = std::env::var_os("OSTINATO_CHILD_DIR") else { return };
    Run::start(long_config(Path::new(&dir), "killed")).unwrap().join().unwrap();
}

#[test]
fn sigkill_mid_step_loses_only_uncheckpointed_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let handle = Run::start(long_config(tmp.path(), "straight")).unwrap();
    let straight = handle.run_dir().to_path_buf();
    handle.join().unwrap();

    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_trains_until_killed", "--ignored", "--nocapture"])
        .env("OSTINATO_CHILD_DIR", tmp.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let run_dir = tmp.path().join("runs/killed");
    let log = run_dir.join("events.jsonl");
    // Kill once checkpoints exist and training has moved past the newest one.
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    loop {
        assert!(std::time::Instant::now() < deadline, "child made no progress");
        let steps = if log.exists() { losses(&run_dir).len() as u64 } else { 0 };
        if steps >= 7 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL, most likely in the middle of a step
    child.wait().unwrap();
    let logged = losses(&run_dir).len() as u64;
    assert!(logged < KILL_STEPS, "killed before the end");

    let resumed = Run::resume(&run_dir).unwrap();
    let from = resumed
        .events()
        .iter()
        .find_map(|e| match e {
            Event::Step { step, .. } => Some(step),
            _ => None,
        })
        .expect("steps after resuming");
    assert!(matches!(resumed.join().unwrap(), RunEnd::Finished { steps: KILL_STEPS, .. }));
    println!("killed after {logged} logged steps; resumed at step {from}");
    // Checkpoints every 2 steps: at most the steps since the last one are redone.
    assert!(from + 2 >= logged && from <= logged + 1, "resumed at {from} after {logged} logged steps");
    assert_eq!(losses(&straight), losses(&run_dir), "identical loss sequence");
    assert!(adapter_bytes(&straight) == adapter_bytes(&run_dir), "identical adapter bytes");
}

#[test]
fn gradient_accumulation_flushes_the_remainder_at_epoch_end() {
    let tmp = tempfile::tempdir().unwrap();
    // Two songs, batch 1, accumulate 3: each epoch's single update flushes 2 batches.
    let c = RunConfig { grad_accum: 3, max_steps: None, epochs: 3, ..config(tmp.path(), "accum") };
    let handle = Run::start(c).unwrap();
    let run_dir = handle.run_dir().to_path_buf();
    assert!(matches!(handle.join().unwrap(), RunEnd::Finished { steps: 3, .. }));
    let events = read_events(&run_dir.join("events.jsonl")).unwrap();
    let steps_per_epoch: Vec<(u64, u64)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Step { step, epoch, samples_per_sec, .. } => {
                assert!(*samples_per_sec > 0.0);
                Some((*step, *epoch))
            }
            _ => None,
        })
        .collect();
    assert_eq!(steps_per_epoch, vec![(1, 0), (2, 1), (3, 2)]);
    let total = events.iter().find_map(|e| match e {
        Event::RunStarted { total_steps, .. } => Some(*total_steps),
        _ => None,
    });
    assert_eq!(total, Some(3));
}

#[test]
fn a_diverged_run_fails_after_the_configured_consecutive_skips() {
    let tmp = tempfile::tempdir().unwrap();
    // An absurd learning rate makes the first update blow the adapter up; every later
    // step is then non-finite and skipped, and the run gives up with a reason.
    let c = RunConfig { lr: 1e30, max_consecutive_skips: 3, ..config(tmp.path(), "diverged") };
    let handle = Run::start(c).unwrap();
    let run_dir = handle.run_dir().to_path_buf();
    let end = handle.join().unwrap();
    assert!(matches!(end, RunEnd::Failed { steps: 1, .. }), "{end:?}");
    let events = read_events(&run_dir.join("events.jsonl")).unwrap();
    let skipped = events.iter().filter(|e| matches!(e, Event::StepSkipped { .. })).count();
    assert_eq!(skipped, 3);
    let reason = events.iter().find_map(|e| match e {
        Event::Failed { reason, .. } => Some(reason.clone()),
        _ => None,
    });
    assert!(reason.expect("failed event").contains("3 steps in a row"));
}

/// A stop while the dataset is prepared ends the run before its first step, and
/// promptly: preparation gives up before the next file or encoder chunk.
#[test]
fn stop_during_dataset_preparation_ends_the_run_stopped_at_step_0() {
    let tmp = tempfile::tempdir().unwrap();
    let audio = tmp.path().join("long");
    std::fs::create_dir_all(&audio).unwrap();
    // Eight 20 s songs at the encoder's rate, encoded whole: a moment each.
    let tone: Vec<f32> = (0..48_000 * 20).map(|i| 0.5 * (i as f32 * 0.05).sin()).collect();
    for i in 0..8 {
        write_wav(&audio.join(format!("song{i}.wav")), 48_000, SampleFormat::Int(16), std::slice::from_ref(&tone))
            .unwrap();
    }
    let mut c = config(tmp.path(), "stopped-early");
    c.data.folder = audio;
    c.data.crop_seconds = None;
    let handle = Run::start(c).unwrap();
    let mut songs_started = 0;
    for event in handle.events().iter() {
        match event {
            // Per-song progress (the folder-wide ones name the folder).
            Event::DatasetProgress { file, .. } if file.extension().is_some() => {
                songs_started += 1;
                if songs_started == 1 {
                    handle.stop();
                }
            }
            Event::RunStarted { .. } | Event::Step { .. } => panic!("training started: {event:?}"),
            _ => {}
        }
    }
    // The stop may land just after the second song began, never later.
    assert!(songs_started <= 2, "{songs_started} songs were prepared after the stop");
    let run_dir = handle.run_dir().to_path_buf();
    assert!(matches!(handle.join().unwrap(), RunEnd::Stopped { steps: 0, .. }));
    let events = read_events(&run_dir.join("events.jsonl")).unwrap();
    assert!(matches!(events.last(), Some(Event::Stopped { step: 0, .. })), "{:?}", events.last());
    assert!(!run_dir.join("final").exists(), "no untrained final adapter");
}

/// What a run stopped before its first update leaves: `stopped`, resumable (from the
/// start), no adapter and no checkpoint of the untrained start.
fn assert_stopped_untrained(handle: RunHandle) -> PathBuf {
    let run_dir = handle.run_dir().to_path_buf();
    let end = handle.join().unwrap();
    assert_eq!(end, RunEnd::Stopped { adapter: None, steps: 0 });
    assert!(!run_dir.join("final").exists(), "no untrained final adapter");
    assert!(!run_dir.join("checkpoints").exists(), "no checkpoint of the start");
    let events = read_events(&run_dir.join("events.jsonl")).unwrap();
    assert_eq!(events.last(), Some(&Event::Stopped { step: 0, adapter_path: None }));
    let s = summarise(&run_dir);
    assert_eq!((s.status, s.resumable, s.adapter), (RunStatus::Stopped, true, None));
    run_dir
}

#[test]
fn a_stop_before_the_first_step_writes_no_adapter_and_stays_resumable() {
    let tmp = tempfile::tempdir().unwrap();
    let at_zero = RunConfig { stop_at_step: Some(0), ..config(tmp.path(), "at-zero") };
    let run_dir = assert_stopped_untrained(Run::start(at_zero).unwrap());
    // A stop request during set-up is seen at the first step boundary.
    let requested = Run::start(config(tmp.path(), "requested")).unwrap();
    requested.stop();
    assert_stopped_untrained(requested);

    let resumed = Run::resume_with(&run_dir, Some(2)).unwrap();
    assert!(matches!(resumed.join().unwrap(), RunEnd::Stopped { adapter: Some(_), steps: 2 }));
    assert_eq!(losses(&run_dir).len(), 2);
    assert!(run_dir.join("final/adapter/adapter_model.safetensors").is_file());
}

#[test]
fn a_failed_new_run_leaves_no_folder_and_a_resumed_run_keeps_its_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk");
    std::fs::create_dir(&junk).unwrap();
    std::fs::write(junk.join("song.wav"), "not audio at all").unwrap();
    let mut bad = config(tmp.path(), "named");
    bad.data.folder = junk.clone();
    let err = Run::start(bad).unwrap().join().unwrap_err().to_string();
    assert!(err.contains("no usable audio"), "{err}");
    assert!(!tmp.path().join("runs/named").exists(), "nothing left to block the name");

    let first = RunConfig { stop_at_step: Some(1), ..config(tmp.path(), "named") };
    let handle = Run::start(first).unwrap();
    let run_dir = handle.run_dir().to_path_buf();
    assert!(matches!(handle.join().unwrap(), RunEnd::Stopped { steps: 1, .. }));

    // The audio folder moved away: resume refuses at once, naming it, and changes nothing.
    let audio = tmp.path().join("audio").canonicalize().unwrap();
    let away = tmp.path().join("away");
    std::fs::rename(&audio, &away).unwrap();
    let err = Run::resume(&run_dir).err().expect("a missing audio folder is an error");
    assert!(matches!(&err, Error::InputFolder { path, .. } if *path == audio), "{err}");
    assert_eq!(summarise(&run_dir).status, RunStatus::Stopped);

    // A folder with nothing usable in its place: the resumed run fails, keeping its run.
    std::fs::rename(&junk, &audio).unwrap();
    assert!(Run::resume(&run_dir).unwrap().join().is_err());
    assert!(run_dir.join("checkpoints/step-000001").is_dir());
    let s = summarise(&run_dir);
    assert_eq!((s.status, s.resumable), (RunStatus::Failed, true));

    // The songs back: it resumes where it stopped.
    std::fs::rename(&audio, &junk).unwrap();
    std::fs::rename(&away, &audio).unwrap();
    let resumed = Run::resume_with(&run_dir, Some(2)).unwrap();
    assert!(matches!(resumed.join().unwrap(), RunEnd::Stopped { steps: 2, .. }));
    assert_eq!(losses(&run_dir).len(), 2);
}

/// A stop while the dataset is prepared (issue 34: the run's step-0 checkpoint held an
/// empty epoch order and every resume panicked) leaves a run that resumes, preparing
/// again, and trains as one never stopped.
#[test]
fn a_run_stopped_while_preparing_resumes_and_trains_as_one_never_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let handle = Run::start(config(tmp.path(), "prepared-twice")).unwrap();
    handle.stop(); // seen before the first song is prepared
    let run_dir = handle.run_dir().to_path_buf();
    assert_eq!(handle.join().unwrap(), RunEnd::Stopped { adapter: None, steps: 0 });
    let events = read_events(&run_dir.join("events.jsonl")).unwrap();
    assert!(!events.iter().any(|e| matches!(e, Event::RunStarted { .. })), "stopped while preparing: {events:?}");
    let s = summarise(&run_dir);
    assert_eq!((s.status, s.resumable), (RunStatus::Stopped, true));

    let resumed = Run::resume(&run_dir).unwrap();
    assert!(matches!(resumed.join().unwrap(), RunEnd::Finished { steps: STEPS, .. }));
    let straight = straight_run(tmp.path());
    assert_eq!(losses(&straight), losses(&run_dir), "identical loss sequence");
    assert!(adapter_bytes(&straight) == adapter_bytes(&run_dir), "identical adapter bytes");
}

/// A checkpoint goes on only with the clips it was trained on: a song added to the
/// folder is an error naming the folder, not a panic, and the run resumes once the
/// folder is as it was.
#[test]
fn a_checkpoint_of_other_clips_is_refused_naming_the_audio_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let c = RunConfig { stop_at_step: Some(1), ..config(tmp.path(), "grown") };
    let audio = c.data.folder.canonicalize().unwrap();
    let handle = Run::start(c).unwrap();
    let run_dir = handle.run_dir().to_path_buf();
    assert!(matches!(handle.join().unwrap(), RunEnd::Stopped { steps: 1, .. }));

    let extra = audio.join("extra.wav");
    let tone: Vec<f32> = (0..48_000 * 3).map(|i| 0.5 * (i as f32 * 0.03).sin()).collect();
    write_wav(&extra, 48_000, SampleFormat::Int(16), std::slice::from_ref(&tone)).unwrap();
    let err = Run::resume(&run_dir).unwrap().join().unwrap_err();
    assert!(matches!(&err, Error::BadFile { path, .. } if *path == audio), "{err}");
    assert!(err.to_string().contains("3 clips") && err.to_string().contains("trained on 2"), "{err}");

    std::fs::remove_file(&extra).unwrap();
    let resumed = Run::resume_with(&run_dir, Some(2)).unwrap();
    assert!(matches!(resumed.join().unwrap(), RunEnd::Stopped { steps: 2, .. }));
}

/// A run's name (its folder) is no part of what it trains: a copy and a renamed run
/// both resume bit-exact.
#[test]
fn a_copied_or_renamed_run_resumes_bit_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let straight = straight_run(tmp.path());
    let first = Run::start(RunConfig { stop_at_step: Some(3), ..config(tmp.path(), "original") }).unwrap();
    assert!(matches!(first.join().unwrap(), RunEnd::Stopped { steps: 3, .. }));
    let runs = tmp.path().join("runs");
    let copied =
        std::process::Command::new("cp").arg("-a").args([runs.join("original"), runs.join("copy")]).status().unwrap();
    assert!(copied.success());
    std::fs::rename(runs.join("original"), runs.join("renamed")).unwrap();
    for name in ["copy", "renamed"] {
        let run_dir = runs.join(name);
        let resumed = Run::resume(&run_dir).unwrap();
        assert!(matches!(resumed.join().unwrap(), RunEnd::Finished { steps: STEPS, .. }), "{name}");
        assert_eq!(RunConfig::from_toml_file(&run_dir.join("run.toml")).unwrap().name, name);
        assert_eq!(losses(&straight), losses(&run_dir), "{name}: identical loss sequence");
        assert!(adapter_bytes(&straight) == adapter_bytes(&run_dir), "{name}: identical adapter bytes");
    }
}

/// Run by `a_run_killed_before_its_first_checkpoint_resumes_from_the_start` in a child process.
#[test]
#[ignore = "child process of the kill-before-the-first-checkpoint test"]
fn child_trains_without_checkpoints_until_killed() {
    let Some(dir) = std::env::var_os("OSTINATO_CHILD_DIR") else { return };
    let c = RunConfig { save_every_steps: None, ..config(Path::new(&dir), "unsaved") };
    Run::start(c).unwrap().join().unwrap();
}

/// A run that dies before its first checkpoint (a kill, an abort, a second Ctrl-C)
/// does not block its name: it is resumable, and resumes from the start to the run a
/// never-interrupted one trains.
#[test]
fn a_run_killed_before_its_first_checkpoint_resumes_from_the_start() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_trains_without_checkpoints_until_killed", "--ignored", "--nocapture"])
        .env("OSTINATO_CHILD_DIR", tmp.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let run_dir = tmp.path().join("runs/unsaved");
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    while !run_dir.join("events.jsonl").exists() || losses(&run_dir).len() < 2 {
        assert!(std::time::Instant::now() < deadline, "child made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let logged = losses(&run_dir).len() as u64;
    assert!(logged < STEPS, "killed before the end");
    assert!(!run_dir.join("checkpoints").exists(), "killed before its first checkpoint");
    let s = summarise(&run_dir);
    assert_eq!((s.status, s.resumable), (RunStatus::Interrupted, true));
    // The name is the run's: a new run of that name is told to resume it, and that works.
    let err = Run::start(config(tmp.path(), "unsaved")).err().expect("the name is taken").to_string();
    assert!(err.contains("resume it"), "{err}");

    let resumed = Run::resume(&run_dir).unwrap();
    assert!(matches!(resumed.join().unwrap(), RunEnd::Finished { steps: STEPS, .. }));
    println!("killed after {logged} logged steps");
    let straight = straight_run(tmp.path());
    assert_eq!(losses(&straight), losses(&run_dir), "identical loss sequence");
    assert!(adapter_bytes(&straight) == adapter_bytes(&run_dir), "identical adapter bytes");
}

/// The steps checkpointed, in the order the log names them.
fn checkpoints_logged(run_dir: &Path) -> Vec<u64> {
    let events = read_events(&run_dir.join("events.jsonl")).unwrap();
    events
        .into_iter()
        .filter_map(|e| match e {
            Event::CheckpointSaved { step, .. } => Some(step),
            _ => None,
        })
        .collect()
}

/// A step boundary is checkpointed once, whatever asks for it there: the periodic
/// save and a stop, the finish, or the end of an epoch.
#[test]
fn each_checkpoint_is_written_and_logged_once() {
    let tmp = tempfile::tempdir().unwrap();
    // Saves every 3 steps: stopped at 6 and finished at 9, where it saves too.
    let c = RunConfig { save_every_steps: Some(3), stop_at_step: Some(6), ..config(tmp.path(), "saved-once") };
    let handle = Run::start(c).unwrap();
    let run_dir = handle.run_dir().to_path_buf();
    assert!(matches!(handle.join().unwrap(), RunEnd::Stopped { steps: 6, .. }));
    assert!(matches!(Run::resume(&run_dir).unwrap().join().unwrap(), RunEnd::Finished { steps: STEPS, .. }));
    assert_eq!(checkpoints_logged(&run_dir), [3, 6, 9]);

    // Three epochs of two steps, saved every 2 steps and every epoch: the last step ends
    // an epoch and the run.
    let c = RunConfig {
        epochs: 3,
        max_steps: None,
        save_every_steps: Some(2),
        save_every_epochs: Some(1),
        ..config(tmp.path(), "epochs")
    };
    let handle = Run::start(c).unwrap();
    let run_dir = handle.run_dir().to_path_buf();
    assert!(matches!(handle.join().unwrap(), RunEnd::Finished { steps: 6, .. }));
    assert_eq!(checkpoints_logged(&run_dir), [2, 4, 6]);
}

/// A new run whose event log cannot be opened fails leaving nothing that holds its name.
#[test]
fn a_new_run_whose_log_cannot_be_opened_leaves_its_name_free() {
    let tmp = tempfile::tempdir().unwrap();
    let c = config(tmp.path(), "unlogged");
    let run_dir = tmp.path().join("runs/unlogged");
    // A folder where the log goes: opening it fails.
    std::fs::create_dir_all(run_dir.join("events.jsonl")).unwrap();
    let err = Run::start(c.clone()).unwrap().join().unwrap_err().to_string();
    assert!(err.contains("events.jsonl"), "{err}");
    assert!(!run_dir.join("run.toml").exists(), "nothing holds the name");
    std::fs::remove_dir(run_dir.join("events.jsonl")).unwrap();
    let handle = Run::start(RunConfig { stop_at_step: Some(1), ..c }).unwrap();
    assert!(matches!(handle.join().unwrap(), RunEnd::Stopped { steps: 1, .. }));
}

/// `config` holding out the drum clip and validating every 2 steps; every checkpoint kept.
fn validated(dir: &Path, name: &str) -> RunConfig {
    RunConfig {
        val_files: vec!["drum_groove_128.wav".into()],
        val_every_steps: Some(2),
        keep_checkpoints: 100,
        ..config(dir, name)
    }
}

/// step -> (validation loss, best), as the log holds them.
fn validations(run_dir: &Path) -> BTreeMap<u64, (f64, bool)> {
    read_events(&run_dir.join("events.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(|e| match e {
            Event::Validation { step, loss, best } => Some((step, (loss, best))),
            _ => None,
        })
        .collect()
}

fn adapter_at(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join("adapter/adapter_model.safetensors")).unwrap()
}

/// Validation is deterministic, leaves training's random streams alone (a stopped and
/// resumed run matches an uninterrupted one bit for bit, validation values included),
/// and `best/adapter` is the checkpoint adapter of the best step.
#[test]
fn validation_is_deterministic_resumes_bit_exact_and_keeps_the_best_adapter() {
    let tmp = tempfile::tempdir().unwrap();
    let straight = finish(validated(tmp.path(), "straight"));
    let again = finish(validated(tmp.path(), "again"));
    let values = validations(&straight);
    assert_eq!(values.keys().copied().collect::<Vec<_>>(), [2, 4, 6, 8]);
    assert_eq!(values, validations(&again), "two runs, identical validation values");

    let first =
        Run::start(RunConfig { stop_at_step: Some(STEPS / 3), ..validated(tmp.path(), "interrupted") }).unwrap();
    let run_dir = first.run_dir().to_path_buf();
    assert!(matches!(first.join().unwrap(), RunEnd::Stopped { steps: 3, .. }));
    assert!(matches!(Run::resume(&run_dir).unwrap().join().unwrap(), RunEnd::Finished { steps: STEPS, .. }));
    assert_eq!(losses(&straight), losses(&run_dir), "identical loss sequence");
    assert_eq!(values, validations(&run_dir), "the same validation curve after resume");
    assert!(adapter_bytes(&straight) == adapter_bytes(&run_dir), "identical adapter bytes");

    let best = values.iter().filter(|(_, (_, best))| *best).map(|(step, _)| *step).next_back().unwrap();
    let lowest = values.iter().min_by(|a, b| a.1 .0.total_cmp(&b.1 .0)).map(|(step, _)| *step);
    assert_eq!(Some(best), lowest, "the last `best` is the lowest loss");
    let checkpoint = straight.join(format!("checkpoints/step-{best:06}"));
    assert!(adapter_at(&straight.join("best")) == adapter_at(&checkpoint), "best/adapter is step {best}'s");
    assert!(adapter_at(&run_dir.join("best")) == adapter_at(&checkpoint), "and survives resume");
}

/// With patience 1 and a learning rate too small to move the loss in f32, the second
/// validation does not improve: the run ends there as finished, with the reason.
#[test]
fn patience_finishes_early_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let c = RunConfig { patience: Some(1), val_every_steps: Some(1), lr: 1e-30, ..validated(tmp.path(), "patient") };
    let handle = Run::start(c).unwrap();
    let run_dir = handle.run_dir().to_path_buf();
    let RunEnd::Finished { steps, .. } = handle.join().unwrap() else { panic!("finished") };
    assert_eq!(steps, 2, "stopped early");
    let values = validations(&run_dir);
    assert_eq!(values.last_key_value().map(|(step, v)| (*step, v.1)), Some((steps, false)));
    let reason = read_events(&run_dir.join("events.jsonl")).unwrap().into_iter().find_map(|e| match e {
        Event::Finished { reason, .. } => reason,
        _ => None,
    });
    assert!(reason.as_deref().is_some_and(|r| r.contains("no better validation loss")), "{reason:?}");
    assert!(run_dir.join("best/adapter/adapter_model.safetensors").is_file());
}

#[test]
fn holding_out_every_clip_is_an_error_naming_the_setting() {
    let tmp = tempfile::tempdir().unwrap();
    let c = RunConfig {
        val_files: vec!["drum_groove_128.wav".into(), "pluck_arpeggio_c_major.wav".into()],
        ..validated(tmp.path(), "all")
    };
    let err = Run::start(c).unwrap().join().unwrap_err().to_string();
    assert!(err.contains("val_files") && err.contains("at least one"), "{err}");
}

/// The adapters a run writes (final and every checkpoint's) are readable by others and
/// carry diffusers' metadata; run_started carries the memory prediction.
#[cfg(unix)]
#[test]
fn a_runs_adapters_are_readable_by_others_and_carry_diffusers_metadata() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = finish(config(tmp.path(), "shared"));
    let mut dirs = vec![run_dir.join("final/adapter")];
    dirs.extend(std::fs::read_dir(run_dir.join("checkpoints")).unwrap().map(|e| e.unwrap().path().join("adapter")));
    assert!(dirs.len() > 1, "{dirs:?}");
    for dir in dirs {
        let weights = dir.join("adapter_model.safetensors");
        let mode = std::fs::metadata(&weights).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "{}", weights.display());
        let bytes = std::fs::read(&weights).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        let meta = meta.metadata().clone().unwrap();
        let lora: serde_json::Value = serde_json::from_str(&meta["lora_adapter_metadata"]).unwrap();
        assert_eq!(
            (lora["transformer.r"].as_u64(), lora["transformer.lora_alpha"].as_f64()),
            (Some(4), Some(8.0)),
            "{}",
            dir.display()
        );
    }
    let predicted = read_events(&run_dir.join("events.jsonl")).unwrap().into_iter().find_map(|e| match e {
        Event::RunStarted { memory, .. } => memory.predicted_peak_bytes,
        _ => None,
    });
    assert!(predicted.is_some_and(|p| p > 1 << 20), "{predicted:?}");
}

/// A song asked of a live run with another run's adapter mixed in is the song a
/// generator makes with both adapter folders (the run's as its pause checkpoint keeps
/// it); an A/B pair of the ended run (the base model against a kept step) is made at
/// one seed, kept and listed again.
#[test]
fn a_live_runs_song_mixes_other_adapters_and_pairs_are_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let other = straight_run(tmp.path()).join("final/adapter");
    let handle = Run::start(config(tmp.path(), "mixing")).unwrap();
    let (control, run_dir) = (handle.control(), handle.run_dir().to_path_buf());
    wait_for_step(&handle, 4);
    control.pause();
    let step = handle
        .events()
        .iter()
        .find_map(|e| if let Event::Paused { step } = e { Some(step) } else { None })
        .expect("paused");
    let spec = GenerateSpec {
        caption: "a test".into(),
        duration_seconds: 1.0,
        seed: 5,
        more_adapters: vec![MixedAdapter { path: other.clone(), scale: 0.7 }],
        ..Default::default()
    };
    let served = new_song_path(&run_dir, 5);
    for update in control.generate(spec.clone(), served.clone()).unwrap().iter() {
        update.unwrap_or_else(|e| panic!("the song failed: {e}"));
    }
    let config = RunConfig::from_toml_file(&run_dir.join("run.toml")).unwrap();
    let generator = Generator::load(&config.model).unwrap();
    let make = |spec: &GenerateSpec, out: &Path| {
        let latents = generator.latents(spec, &mut |_| {}).unwrap();
        write_song_wav(out, &generator.decode(&latents, &mut |_| {}).unwrap()).unwrap();
        std::fs::read(out).unwrap()
    };
    let own = Some(step_adapter_dir(&run_dir, step));
    let both = make(&GenerateSpec { adapter: own.clone(), ..spec.clone() }, &tmp.path().join("both.wav"));
    let alone =
        make(&GenerateSpec { adapter: own, more_adapters: Vec::new(), ..spec.clone() }, &tmp.path().join("alone.wav"));
    let served = std::fs::read(&served).unwrap();
    assert!(served == both, "the live run's mix is the generator's mix of both folders");
    assert!(served != alone, "the other run's adapter is heard");
    control.resume();
    assert!(matches!(handle.join().unwrap(), RunEnd::Finished { steps: STEPS, .. }));

    let kept = kept_adapter_steps(&run_dir).unwrap();
    // What can be listened with: the final adapter, then each kept checkpoint's, newest first.
    let listed = kept_adapters(&run_dir).unwrap();
    let named: Vec<(&str, Option<u64>, PathBuf)> = listed.into_iter().map(|a| (a.kind, a.step, a.path)).collect();
    let mut want = vec![("final", None, run_dir.join("final/adapter"))];
    want.extend(kept.iter().map(|s| ("step", Some(*s), step_adapter_dir(&run_dir, *s))));
    assert_eq!(named, want);
    let request = PairRequest {
        a: AbVoice::Base,
        b: AbVoice::Step { step: kept[0], scale: 1.0 },
        song: GenerateSpec { caption: "a test".into(), duration_seconds: 1.0, seed: 8, ..Default::default() },
    };
    let out = new_pair_dir(&run_dir, 8);
    let mut written = Vec::new();
    let pair = generate_pair_for_run(&run_dir, &request, &out, &mut |side, e| {
        if let GenerateEvent::Written { .. } = e {
            written.push(side)
        }
    })
    .unwrap();
    assert_eq!(written, [Side::A, Side::B]);
    assert_eq!(run_pairs(&run_dir).unwrap(), std::slice::from_ref(&pair), "kept steps {kept:?}");
    let (a, b) = (std::fs::read(pair.a.unwrap()).unwrap(), std::fs::read(pair.b.unwrap()).unwrap());
    let base = generate_for_run(
        &run_dir,
        &GenerateSpec { adapter_scale: 0.0, ..request.song.clone() },
        &tmp.path().join("base.wav"),
        &mut |_| {},
    );
    assert!(base.is_ok() && a == std::fs::read(tmp.path().join("base.wav")).unwrap(), "A is the base model");
    assert!(a != b, "B is the adapter of step {}", kept[0]);
}

use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ostinato_engine::events::Event;
use ostinato_engine::run_state::RunStatus;
use serde_json::{json, Value};

use super::current_run::CurrentRun;
use super::*;

/// Records what is sent, as the web view would get it (name, JSON payload).
#[derive(Default, Clone)]
struct Recorder(Arc<Mutex<Vec<(String, Value)>>>);
impl EventSink for Recorder {
    fn send(&self, message: Outgoing<'_>) {
        let payload = serde_json::to_value(message).unwrap();
        self.0.lock().unwrap().push((message.name().to_string(), payload));
    }
}

impl Recorder {
    fn sent(&self, name: &str) -> Vec<Value> {
        self.0.lock().unwrap().iter().filter(|(n, _)| n == name).map(|(_, v)| v.clone()).collect()
    }
}

/// A test double for the engine's run control: records calls. Events come from the
/// test through the channel.
struct Scripted(PathBuf, Arc<Mutex<Vec<&'static str>>>);
impl EngineRun for Scripted {
    fn pause(&self) -> Result<(), BridgeError> {
        self.1.lock().unwrap().push("pause");
        Ok(())
    }
    fn resume(&self) -> Result<(), BridgeError> {
        self.1.lock().unwrap().push("resume");
        Ok(())
    }
    fn stop(&self) -> Result<(), BridgeError> {
        self.1.lock().unwrap().push("stop");
        Ok(())
    }
    fn run_dir(&self) -> PathBuf {
        self.0.clone()
    }
    fn generate(
        &self,
        _spec: ostinato_engine::generate::GenerateSpec,
        _out: PathBuf,
    ) -> Result<mpsc::Receiver<ostinato_engine::train::songs::SongUpdate>, BridgeError> {
        self.1.lock().unwrap().push("generate");
        // The double never serves it: the channel closes, as when a run ends first.
        Ok(mpsc::channel().1)
    }
}

fn wait_for(mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(5), "timed out");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn step(step: u64, loss: f64) -> Event {
    Event::Step {
        step,
        epoch: 0,
        loss,
        lr: 1e-3,
        grad_norm: 1.0,
        samples_per_sec: 1.0,
        memory_now_bytes: 1 << 20,
        memory_peak_bytes: 2 << 20,
        elapsed_s: step as f64,
        eta_s: None,
        samples: Vec::new(),
    }
}

fn started() -> Event {
    serde_json::from_value(json!({"type": "run_started", "config": {}, "device": "cpu", "precision": "f32",
        "memory": {"gradient_checkpointing": true, "block_input_grad_path": true, "latent_cache": true},
        "trainable_params": 1, "total_params": 2, "total_steps": 9,
        "dataset": {"files": 1, "usable": 1, "skipped": 0, "cache_hits": 0, "cache_misses": 1, "total_seconds": 1.0}}))
    .unwrap()
}

/// The race the window met on CI: the engine paused before Pause's reply reached the
/// web view. Views now go out under the state's lock in the order they were made, and
/// the web view takes the last it got: the view sent for Pause comes before the one
/// sent for `paused`, which is the last.
#[test]
fn views_go_out_in_the_order_they_were_made() {
    let tmp = tempfile::tempdir().unwrap();
    let state = AppState::new(tmp.path().join("cfg"), tmp.path().join("runs"));
    let (tx, rx) = mpsc::channel();
    let rec = Recorder::default();
    state.adopt_run(Box::new(Scripted(tmp.path().join("runs/r1"), Arc::default())), rx, rec.clone());
    let reply = state.pause().unwrap();
    assert_eq!((reply.state.status, reply.requested), (RunStatus::Running, Some(Request::Pause)));
    tx.send(Event::Paused { step: 1 }).unwrap();
    wait_for(|| state.state().run.view.state.status == RunStatus::Paused);
    let views: Vec<(String, Value)> = rec
        .sent(RUN_EVENT)
        .iter()
        .map(|v| (v["status"].as_str().unwrap().to_string(), v["requested"].clone()))
        .collect();
    assert_eq!(
        views,
        [
            (String::from("running"), Value::Null),
            (String::from("running"), json!("pause")),
            (String::from("paused"), Value::Null)
        ]
    );
}

#[test]
fn forwards_events_and_tracks_status() {
    let tmp = tempfile::tempdir().unwrap();
    let state = AppState::new(tmp.path().join("cfg"), tmp.path().join("runs"));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let rec = Recorder::default();
    let view = state.adopt_run(Box::new(Scripted(tmp.path().join("runs/r1"), calls.clone())), rx, rec.clone());
    assert_eq!(view.state.status, RunStatus::Running);

    tx.send(started()).unwrap();
    tx.send(step(1, 0.9)).unwrap();
    wait_for(|| state.state().run.view.state.last_step.is_some());
    state.pause().unwrap();
    let pausing = |s: &StateView| (s.run.view.state.status, s.run.view.requested);
    assert_eq!(pausing(&state.state()), (RunStatus::Running, Some(Request::Pause)));
    // A step already in flight keeps the run "pausing".
    tx.send(step(2, 0.8)).unwrap();
    wait_for(|| state.state().run.view.state.steps == 2);
    assert_eq!(pausing(&state.state()), (RunStatus::Running, Some(Request::Pause)));
    tx.send(Event::Paused { step: 2 }).unwrap();
    wait_for(|| state.state().run.view.state.status == RunStatus::Paused);
    assert!(state.pause().is_err(), "pausing a paused run is an error");
    state.resume().unwrap();
    tx.send(Event::Resumed { step: 2 }).unwrap();
    wait_for(|| state.state().run.view.state.status == RunStatus::Running);
    state.stop().unwrap();
    assert_eq!(state.state().run.view.requested, Some(Request::Stop));
    tx.send(Event::Stopped { step: 2, adapter_path: None }).unwrap();
    drop(tx);
    wait_for(|| state.state().run.view.state.status == RunStatus::Stopped);
    assert_eq!(*calls.lock().unwrap(), ["pause", "resume", "stop"]);
    assert!(matches!(state.stop(), Err(BridgeError::NoActiveRun)));

    let s = state.state();
    assert_eq!(s.run.view.requested, None);
    assert_eq!(s.run.view.state.last_step.unwrap().step, 2);
    assert_eq!(s.run.view.state.started.unwrap().device, "cpu");
    assert_eq!(s.run.recent_events.len(), 6);
    wait_for(|| rec.sent(ENGINE_EVENT).len() == 6);
    // Each engine event went out once, typed: as the engine serializes it.
    let sent = rec.sent(ENGINE_EVENT);
    let types: Vec<_> = sent.iter().map(|v| v["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["run_started", "step", "step", "paused", "resumed", "stopped"]);
    assert_eq!(serde_json::from_value::<Event>(sent[2].clone()).unwrap(), step(2, 0.8));
    let last = rec.sent(RUN_EVENT).pop().unwrap();
    assert_eq!(
        (last["status"].clone(), last["active"].clone(), last["steps"].clone()),
        (json!("stopped"), json!(false), json!(2))
    );
    assert_eq!(last["last_step"]["loss"], 0.8);
}

#[test]
fn a_stream_that_just_ends_is_a_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let state = AppState::new(tmp.path().join("cfg"), tmp.path().join("runs"));
    let (tx, rx) = mpsc::channel();
    let rec = Recorder::default();
    state.adopt_run(Box::new(Scripted(tmp.path().into(), Default::default())), rx, rec.clone());
    tx.send(step(1, 0.5)).unwrap();
    drop(tx);
    wait_for(|| state.state().run.view.state.status == RunStatus::Failed);
    assert!(state.state().run.view.state.reason.unwrap().contains("stopped sending events"));
    wait_for(|| rec.sent(ENGINE_EVENT).last().is_some_and(|e| e["type"] == "failed"));
}

#[test]
fn the_dataset_line_follows_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let state = AppState::new(tmp.path().join("cfg"), tmp.path().join("runs"));
    let (tx, rx) = mpsc::channel();
    state.adopt_run(Box::new(Scripted(tmp.path().into(), Default::default())), rx, Recorder::default());
    let progress =
        |done| Event::DatasetProgress { done, total: 6, file: "a.wav".into(), seconds_done: None, seconds_total: None };
    tx.send(progress(3)).unwrap();
    wait_for(|| state.state().run.view.state.preparing.is_some_and(|p| p.done == 3));
    tx.send(progress(6)).unwrap();
    tx.send(started()).unwrap();
    wait_for(|| state.state().run.view.state.started.is_some());
    assert_eq!(state.state().run.view.state.preparing, None);
}

/// Charts are drawn from the run's state, with readouts, and re-drawn as it grows.
#[test]
fn charts_are_drawn_from_the_run_state() {
    let tmp = tempfile::tempdir().unwrap();
    let state = AppState::new(tmp.path().join("cfg"), tmp.path().join("runs"));
    let (tx, rx) = mpsc::channel();
    let rec = Recorder::default();
    state.adopt_run(Box::new(Scripted(tmp.path().into(), Default::default())), rx, rec.clone());
    tx.send(started()).unwrap();
    for i in 1..=5 {
        tx.send(step(i, 1.0 / i as f64)).unwrap();
    }
    drop(tx);
    wait_for(|| state.state().charts.is_some_and(|c| c.readouts["loss"].lines[0].points.len() == 5));
    let charts = state.charts(None).unwrap();
    assert!(charts.loss.contains("<svg"));
    assert_eq!(charts.readouts["loss"].lines[0].points[4], (5.0, 0.2));
    assert_eq!(charts.readouts.len(), 4);
    let sent = rec.sent(CHARTS_EVENT).pop().unwrap();
    assert_eq!(sent["readouts"]["loss"]["x_desc"], "step");
}

#[test]
fn recent_events_are_bounded() {
    let mut run = CurrentRun::idle();
    for i in 0..(RECENT_EVENTS as u64 + 10) {
        run.take(&step(i + 1, 0.5));
    }
    let snapshot = run.snapshot();
    assert_eq!(snapshot.recent_events.len(), RECENT_EVENTS);
    assert_eq!(snapshot.recent_events[0], step(11, 0.5));
    assert_eq!(run.state.series().len(), RECENT_EVENTS + 10);
}

/// A `step` line as the engine writes it.
fn step_line(step: u64, loss: f64) -> Value {
    json!({"v": 1, "type": "step", "step": step, "epoch": 0, "loss": loss, "lr": 1e-3, "grad_norm": 1.0,
        "samples_per_sec": 1.0, "memory_now_bytes": 0, "memory_peak_bytes": 0, "elapsed_s": 1.0, "eta_s": null})
}

#[test]
fn lists_runs_newest_first_with_the_current_one_active() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let now = std::time::SystemTime::now();
    // Updated `age` seconds ago; names sort the other way round, so the order is by time.
    let write = |id: &str, age: u64, lines: &[Value], tail: &str| {
        let d = runs.join(id);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("run.toml"), "").unwrap();
        let mut s: String = lines.iter().map(|l| format!("{l}\n")).collect();
        s.push_str(tail);
        let log = d.join("events.jsonl");
        std::fs::write(&log, s).unwrap();
        let f = std::fs::File::options().write(true).open(&log).unwrap();
        f.set_modified(now - Duration::from_secs(age)).unwrap();
    };
    // Paused, then the app was quit: resumable (as stopped).
    write("a-paused", 100, &[step_line(5, 0.5), json!({"v": 1, "type": "paused", "step": 5})], "");
    // Cut mid-line by a crash: the partial line is skipped and the run is interrupted.
    write("b-crashed", 200, &[step_line(7, 0.4)], "{\"v\":1,\"type\":\"st");
    write(
        "c-done",
        300,
        &[step_line(9, 0.3), json!({"v": 1, "type": "finished", "adapter_path": "x", "steps": 9, "final_loss": 0.3})],
        "",
    );
    // The unfinished runs, each with a checkpoint to resume from.
    for (id, step) in [("a-paused", 5), ("b-crashed", 7)] {
        std::fs::create_dir_all(runs.join(id).join(format!("checkpoints/step-{step:06}"))).unwrap();
    }
    // A folder with a log but no run.toml is not a run.
    let no_config = runs.join("d-no-config");
    std::fs::create_dir_all(&no_config).unwrap();
    std::fs::write(no_config.join("events.jsonl"), format!("{}\n", step_line(1, 0.1))).unwrap();

    let state = AppState::new(tmp.path().join("cfg"), runs.clone());
    let list = state.list_runs().unwrap();
    let got: Vec<_> =
        list.iter().map(|r| (r.summary.name.as_str(), r.summary.steps, r.summary.resumable, r.active)).collect();
    assert_eq!(got, [("a-paused", 5, true, false), ("b-crashed", 7, true, false), ("c-done", 9, false, false)]);
    let json = serde_json::to_value(&list).unwrap();
    let statuses: Vec<_> = json.as_array().unwrap().iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["stopped", "interrupted", "finished"]);
    assert_eq!(json[0]["last_loss"], 0.5);
    assert_eq!(json[0]["dir"], json!(runs.canonicalize().unwrap().join("a-paused")));
    assert_eq!(json[2]["adapter"], Value::Null);

    // The run the app is training now is active, and not resumable from the list.
    let (tx, rx) = mpsc::channel::<Event>();
    state.adopt_run(Box::new(Scripted(runs.join("b-crashed"), Default::default())), rx, Recorder::default());
    let list = state.list_runs().unwrap();
    let active: Vec<_> =
        list.iter().filter(|r| r.active).map(|r| (r.summary.name.as_str(), r.summary.resumable)).collect();
    assert_eq!(active, [("b-crashed", false)]);
    drop(tx);

    // Paths outside the runs dir are refused before the engine is asked.
    assert!(matches!(state.resume_run(tmp.path(), Recorder::default()), Err(BridgeError::Invalid(_))));
    std::fs::create_dir_all(runs.join("not-a-run")).unwrap();
    assert!(matches!(state.resume_run(&runs.join("not-a-run"), Recorder::default()), Err(BridgeError::Invalid(_))));
    // A run directory without run.toml: the engine says what is missing.
    wait_for(|| !state.state().run.view.active);
    match state.resume_run(&no_config, Recorder::default()) {
        Err(BridgeError::Engine(m)) => assert!(m.contains("run.toml"), "{m}"),
        other => panic!("{other:?}"),
    }
    // A past run's charts are replayed from its log.
    let charts = state.charts(Some(&runs.join("c-done"))).unwrap();
    assert!(charts.loss.contains("<svg"), "{}", charts.loss);
}

/// Generate asks the live run (the app's one, by its directory) and says it waits for
/// the run; a run that ends without serving it is generated from its saved files
/// instead (here there are none: the engine's error names the file).
#[test]
fn generate_asks_the_live_run_and_falls_back_when_it_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("runs/r1");
    std::fs::create_dir_all(&run_dir).unwrap();
    std::fs::write(run_dir.join("events.jsonl"), "").unwrap();
    let state = AppState::new(tmp.path().join("cfg"), tmp.path().join("runs"));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    state.adopt_run(Box::new(Scripted(run_dir.clone(), calls.clone())), rx, Recorder::default());
    tx.send(started()).unwrap();
    let choices: SongChoices =
        serde_json::from_value(json!({"caption": "c", "duration_seconds": 1.0, "seed": 1, "adapter_scale": 1.0}))
            .unwrap();
    let rec = Recorder::default();
    let id = state.generate(&run_dir, choices.clone(), rec.clone()).unwrap();
    wait_for(|| rec.sent(SONG_EVENT).len() == 2);
    let sent = rec.sent(SONG_EVENT);
    assert_eq!(sent[0], json!({"id": id, "stage": "waiting", "live": true}));
    assert_eq!(sent[1]["stage"], "failed");
    assert!(sent[1]["message"].as_str().unwrap().contains("run.toml"), "{}", sent[1]);
    assert_eq!(*calls.lock().unwrap(), ["generate"]);

    // Another folder is no run of this app.
    let err = state.generate(tmp.path(), choices, rec).unwrap_err();
    assert_eq!(err.kind(), "invalid");
}

/// Captioning holds ACE-Step's LM in memory: it waits while a run trains.
#[test]
fn captioning_waits_while_a_run_trains() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = tmp.path().join("songs");
    ostinato_engine::data::synth::write_demo(&songs).unwrap();
    ostinato_engine::label::understand::tiny::write_tiny_lm(&tmp.path().join("ckpt/acestep-5Hz-lm-1.7B"), 1).unwrap();
    let places = ostinato_engine::load::ModelPlaces {
        checkpoints: vec![tmp.path().join("ckpt")],
        downloads: tmp.path().join("models"),
        ..Default::default()
    };
    let state = AppState::with_model_places(tmp.path().join("cfg"), tmp.path().join("runs"), places);
    state.scan_dataset(&songs).unwrap();
    let (_tx, rx) = mpsc::channel();
    state.adopt_run(Box::new(Scripted(tmp.path().join("runs/r1"), Arc::default())), rx, Recorder::default());
    let rec = Recorder::default();
    let err = state.start_captions(None, None, rec.clone()).unwrap_err();
    assert_eq!(err.to_string(), "a run is training: caption songs once it has ended");
    assert!(!state.cancel_captions(), "no batch was started");
    assert!(rec.0.lock().unwrap().is_empty());
}

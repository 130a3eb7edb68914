//! Command-level tests through tauri's mock runtime: the real command handlers, the
//! real IPC (de)serialization, no window.

use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tauri::ipc::{CallbackFn, InvokeBody};
use tauri::test::{get_ipc_response, mock_builder, MockRuntime, INVOKE_KEY};
use tauri::webview::InvokeRequest;
use tauri::{App, Listener, WebviewWindow, WebviewWindowBuilder};

use ostinato_app::bridge::{ENGINE_EVENT, PAIR_EVENT, RUN_EVENT, SONG_EVENT};
use ostinato_app::AppState;

struct TestApp {
    app: App<MockRuntime>,
    window: WebviewWindow<MockRuntime>,
}

impl TestApp {
    fn new(dir: &Path) -> Self {
        Self::with_state(AppState::new(dir.join("config"), dir.join("runs")))
    }

    fn with_state(state: AppState) -> Self {
        let app = ostinato_app::app_builder(mock_builder(), state)
            .build(tauri::generate_context!(test = true))
            .expect("building the mock app");
        let window = WebviewWindowBuilder::new(&app, "main", Default::default()).build().expect("mock window");
        TestApp { app, window }
    }

    /// Invokes a command as the web view would; Ok(value) or Err(rejection).
    /// Records the payloads of the app's `names` events, as the web view gets them.
    fn record(&self, names: &[&'static str]) -> Arc<Mutex<Vec<(&'static str, Value)>>> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        for &name in names {
            let seen = seen.clone();
            self.app.listen_any(name, move |e| {
                seen.lock().unwrap().push((name, serde_json::from_str(e.payload()).expect("JSON payload")))
            });
        }
        seen
    }

    fn invoke(&self, cmd: &str, args: Value) -> Result<Value, Value> {
        get_ipc_response(
            &self.window,
            InvokeRequest {
                cmd: cmd.into(),
                callback: CallbackFn(0),
                error: CallbackFn(1),
                url: self.window.url().expect("the window has a URL"),
                body: InvokeBody::Json(args),
                headers: Default::default(),
                invoke_key: INVOKE_KEY.to_string(),
            },
        )
        .map(|body| body.deserialize::<Value>().expect("response is JSON"))
    }

    /// Invokes a command that answers with raw bytes (audio); Ok(bytes) or Err(rejection).
    fn invoke_bytes(&self, cmd: &str, args: Value) -> Result<Vec<u8>, Value> {
        get_ipc_response(
            &self.window,
            InvokeRequest {
                cmd: cmd.into(),
                callback: CallbackFn(0),
                error: CallbackFn(1),
                url: self.window.url().expect("the window has a URL"),
                body: InvokeBody::Json(args),
                headers: Default::default(),
                invoke_key: INVOKE_KEY.to_string(),
            },
        )
        .map(|body| match body {
            tauri::ipc::InvokeResponseBody::Raw(bytes) => bytes,
            other => panic!("{cmd} answered with JSON, not bytes: {other:?}"),
        })
    }
}

#[test]
fn get_state_gives_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::new(dir.path());
    let s = app.invoke("get_state", json!({})).unwrap();
    let run = &s["settings"]["run"];
    assert_eq!(run["lora"]["r"], 64);
    assert_eq!(run["lora"]["alpha"], 128.0);
    assert_eq!(run["lora"]["dropout"], 0.1);
    assert_eq!(run["lr"], 3e-4);
    assert_eq!(run["gradient_checkpointing"], true);
    assert_eq!(run["latent_cache"], true);
    assert_eq!(run["model"], json!({"kind": "demo"}));
    assert_eq!(s["run"]["status"], "idle");
    assert_eq!(s["run"]["recent_events"], json!([]));
    assert_eq!(s["dataset"], Value::Null);
    assert_eq!(s["runs_dir"], json!(dir.path().join("runs")));
}

#[test]
fn settings_persist_across_launches() {
    let dir = tempfile::tempdir().unwrap();
    {
        let app = TestApp::new(dir.path());
        let mut s = app.invoke("get_state", json!({})).unwrap()["settings"].clone();
        s["run"]["gradient_checkpointing"] = json!(false);
        s["run"]["lora"]["r"] = json!(16);
        s["run"]["precision"] = json!("bf16-weights");
        s["run"]["model"] = json!({"kind": "folder", "path": "/models/acestep-v15"});
        let saved = app.invoke("save_settings", json!({ "settings": s })).unwrap();
        assert_eq!(saved["run"]["lora"]["r"], 16);
    }
    let on_disk: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("config/settings.json")).unwrap()).unwrap();
    assert_eq!(on_disk["run"]["gradient_checkpointing"], false);

    let app = TestApp::new(dir.path());
    let s = app.invoke("get_state", json!({})).unwrap()["settings"].clone();
    assert_eq!(s["run"]["gradient_checkpointing"], false);
    assert_eq!(s["run"]["lora"]["r"], 16);
    assert_eq!(s["run"]["precision"], "bf16-weights");
    assert_eq!(s["run"]["model"]["path"], "/models/acestep-v15");

    let reset = app.invoke("reset_settings", json!({})).unwrap();
    assert_eq!(reset["run"]["gradient_checkpointing"], true);
    assert_eq!(reset["run"]["lora"]["r"], 64);
}

#[test]
fn invalid_settings_are_rejected_field_by_field_and_not_saved() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::new(dir.path());
    let mut s = app.invoke("get_state", json!({})).unwrap()["settings"].clone();
    s["run"]["lora"]["r"] = json!(0);
    s["run"]["lora"]["dropout"] = json!(1.5);
    s["run"]["lr"] = json!(-1.0);
    let err = app.invoke("save_settings", json!({ "settings": s })).unwrap_err();
    assert_eq!(err["kind"], "invalid_settings");
    assert!(err["fields"]["lora.r"].as_str().unwrap().contains("the rank must be at least 1"), "{err}");
    assert!(err["fields"]["lora.dropout"].is_string());
    assert!(err["fields"]["lr"].is_string());
    assert!(err["fields"].get("lora.alpha").is_none());
    assert!(!dir.path().join("config/settings.json").exists(), "nothing was written");
    assert_eq!(app.invoke("get_state", json!({})).unwrap()["settings"]["run"]["lora"]["r"], 64);

    // The run settings the engine owns are judged by it, each named on its field.
    for (field, value, named) in [
        ("cfg_dropout", json!(1.5), "cfg_dropout"),
        ("val_fraction", json!(0.3), "val_every_steps"),
        ("patience", json!(2), "patience"),
        ("preview_seconds", json!(0.0), "preview_seconds"),
        ("preview_every_steps", json!(0), "preview_every_steps"),
    ] {
        let mut s = app.invoke("get_state", json!({})).unwrap()["settings"].clone();
        s["run"][field] = value;
        let err = app.invoke("save_settings", json!({ "settings": s })).unwrap_err();
        assert_eq!(err["kind"], "invalid_settings", "{field}: {err}");
        assert!(err["fields"][named].as_str().is_some_and(|m| !m.is_empty()), "{field}: {err}");
    }
    assert!(!dir.path().join("config/settings.json").exists(), "nothing was written");
    let mut s = app.invoke("get_state", json!({})).unwrap()["settings"].clone();
    assert_eq!(
        (s["run"]["cfg_dropout"].clone(), s["run"]["val_fraction"].clone(), s["run"]["preview_caption"].clone()),
        (Value::Null, Value::Null, Value::Null),
        "the engine's defaults"
    );
    s["run"]["val_fraction"] = json!(0.3);
    s["run"]["val_every_steps"] = json!(5);
    s["run"]["patience"] = json!(2);
    assert_eq!(app.invoke("save_settings", json!({ "settings": s })).unwrap()["run"]["patience"], 2);
    app.invoke("reset_settings", json!({})).unwrap();

    // A value of the wrong type is refused by deserialization, with a message.
    let mut s = app.invoke("get_state", json!({})).unwrap()["settings"].clone();
    s["run"]["lora"]["r"] = json!("lots");
    let err = app.invoke("save_settings", json!({ "settings": s })).unwrap_err();
    assert!(err.to_string().contains("rank") || err.to_string().contains("invalid type"), "{err}");
}

/// The window's settings are the engine's `RunConfig`: its defaults, its types, saved and
/// read back as the config a run gets; a value the engine refuses is refused with the
/// engine's own reason under its run.toml path; choosing Prodigy brings what the engine
/// sets with it, as the CLI's `--optimizer` does.
#[test]
fn settings_are_the_engines_run_config_judged_by_the_engine() {
    use ostinato_app::settings::Settings;
    use ostinato_engine::device::Precision;
    use ostinato_engine::train::optim::OptimizerConfig;
    use ostinato_engine::train::schedule::LrSchedule;
    use ostinato_engine::train::RunConfig;

    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::new(dir.path());
    let state = app.invoke("get_state", json!({})).unwrap();
    assert_eq!(state["choices"]["optimizers"], json!(["adamw", "prodigy", "adafactor"]));
    let precisions: Vec<_> = Precision::ALL.iter().map(|p| p.name()).collect();
    let offered: Vec<_> = state["choices"]["precisions"].as_array().unwrap().iter().map(|c| c[0].clone()).collect();
    assert_eq!(json!(offered), json!(precisions), "the window offers the engine's precisions");
    let mut s = state["settings"].clone();
    let engine = RunConfig::default();
    assert_eq!(
        (s["run"]["save_every_steps"].clone(), s["run"]["epochs"].clone(), s["run"]["seed"].clone()),
        (json!(engine.save_every_steps), json!(engine.epochs), json!(engine.seed)),
        "the engine's defaults"
    );

    s["run"]["lora"]["r"] = json!(16);
    s["run"]["lr"] = json!(1e-4);
    s["run"]["save_every_steps"] = Value::Null;
    s["run"]["precision"] = json!("f16");
    s["run"]["model"] = json!({"kind": "folder", "path": "/models/acestep-v15"});
    app.invoke("save_settings", json!({ "settings": s })).unwrap();
    let saved: Settings =
        serde_json::from_slice(&std::fs::read(dir.path().join("config/settings.json")).unwrap()).unwrap();
    let config = saved.run_config(dir.path().join("runs"));
    assert_eq!((config.lora.r, config.lr, config.save_every_steps, config.precision), (16, 1e-4, None, Precision::F16));
    assert_eq!(config.model, ostinato_engine::load::source::ModelSource::Folder { path: "/models/acestep-v15".into() });

    let mut prodigy = app.invoke("get_state", json!({})).unwrap()["settings"].clone();
    prodigy["run"]["optimizer"] = json!({"kind": "prodigy"});
    let adopted: Settings =
        serde_json::from_value(app.invoke("save_settings", json!({ "settings": prodigy })).unwrap()).unwrap();
    assert_eq!(adopted.run.optimizer, OptimizerConfig::named("prodigy").unwrap());
    assert_eq!((adopted.run.lr, adopted.run.lr_schedule), (1.0, LrSchedule::Constant));

    for (field, value) in [("lora.r", json!(0)), ("lr", json!(-3.0)), ("seed", json!(1u64 << 60))] {
        let mut bad = app.invoke("get_state", json!({})).unwrap()["settings"].clone();
        let (table, key) = field.split_once('.').map_or((None, field), |(t, k)| (Some(t), k));
        match table {
            Some(t) => bad["run"][t][key] = value,
            None => bad["run"][key] = value,
        }
        let err = app.invoke("save_settings", json!({ "settings": bad })).unwrap_err();
        let config = serde_json::from_value::<Settings>(bad).unwrap().run_config(dir.path().join("runs"));
        let errors = config.validate().unwrap_err();
        let (_, reason) = errors.iter().find(|(f, _)| *f == field).unwrap();
        assert_eq!(err["fields"][field], json!(reason), "{field}: {err}");
    }
}

/// Points the latent cache (`XDG_CACHE_HOME`, one per process) into `dir` for as long as
/// the guard lives: the tests that train run one at a time, so none reads another's cache.
fn own_cache(dir: &Path) -> std::sync::MutexGuard<'static, ()> {
    static CACHE: Mutex<()> = Mutex::new(());
    let guard = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    std::env::set_var("XDG_CACHE_HOME", dir.join("cache"));
    guard
}

/// Two demo songs and one file that is not audio.
fn songs(dir: &Path) -> std::path::PathBuf {
    let songs = dir.join("songs");
    ostinato_engine::data::synth::write_demo(&songs).unwrap();
    for entry in std::fs::read_dir(&songs).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("pluck_arpeggio") && !name.starts_with("drum_groove") {
            std::fs::remove_file(path).unwrap();
        }
    }
    std::fs::write(songs.join("notes.wav"), "not audio").unwrap();
    songs
}

#[test]
fn scan_start_follow_and_export_a_demo_run() {
    let dir = tempfile::tempdir().unwrap();
    let _cache = own_cache(dir.path());
    let app = TestApp::new(dir.path());

    let err = app.invoke("scan_dataset", json!({"path": dir.path().join("nope")})).unwrap_err();
    assert_eq!(err["kind"], "invalid");
    assert!(err["message"].as_str().unwrap().starts_with("not a folder"));
    let err = app.invoke("start_run", json!({})).unwrap_err();
    assert_eq!(err["message"], "choose a dataset folder first");

    let songs = songs(dir.path());
    let view = app.invoke("scan_dataset", json!({"path": songs})).unwrap();
    assert_eq!(view["usable"], 2);
    assert_eq!(view["bad"], 1);
    let bad = view["files"].as_array().unwrap().iter().find(|f| f["status"] == "bad").unwrap();
    assert_eq!(bad["name"], "notes.wav");
    assert!(bad["problem"].as_str().unwrap().len() > 3, "{bad}");
    let good = view["files"].as_array().unwrap().iter().find(|f| f["status"] == "ok").unwrap();
    assert!(good["duration_s"].as_f64().unwrap() > 5.0);
    assert_eq!(good["has_caption"], true);

    let mut s = app.invoke("get_state", json!({})).unwrap()["settings"].clone();
    s["run"]["epochs"] = json!(1);
    s["run"]["lora"]["r"] = json!(4);
    s["run"]["lora"]["alpha"] = json!(8.0);
    // The run settings the engine takes as they are: CFG dropout, validation, previews.
    s["run"]["cfg_dropout"] = json!(0.25);
    s["run"]["val_fraction"] = json!(0.5);
    s["run"]["val_every_steps"] = json!(1);
    s["run"]["preview_every_steps"] = json!(100);
    s["run"]["preview_seconds"] = json!(1.0);
    s["run"]["preview_caption"] = json!("a test caption");
    app.invoke("save_settings", json!({ "settings": s })).unwrap();
    let sent = app.record(&[ENGINE_EVENT, RUN_EVENT]);
    app.invoke("start_run", json!({})).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let state = loop {
        let state = app.invoke("get_state", json!({})).unwrap();
        if state["run"]["status"] == "finished" {
            break state;
        }
        assert_ne!(state["run"]["status"], "failed", "{state}");
        assert!(std::time::Instant::now() < deadline, "the run did not finish: {state}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(state["run"]["recent_events"].as_array().unwrap().iter().any(|e| e["type"] == "step"));

    let runs = app.invoke("list_runs", json!({})).unwrap();
    assert_eq!(runs[0]["status"], "finished");
    assert_eq!(runs[0]["resumable"], false);
    assert!(runs[0]["adapter"].is_string(), "the final adapter: {runs}");
    let run_dir = runs[0]["dir"].clone();
    let config =
        ostinato_engine::train::RunConfig::from_toml_file(&Path::new(run_dir.as_str().unwrap()).join("run.toml"))
            .unwrap();
    assert_eq!((config.cfg_dropout, config.val_fraction, config.val_every_steps), (Some(0.25), Some(0.5), Some(1)));
    assert_eq!((config.preview_every_steps, config.preview_seconds), (Some(100), Some(1.0)));
    assert_eq!(config.preview_caption.as_deref(), Some("a test caption"));
    let events = state["run"]["recent_events"].as_array().unwrap();
    let started = events.iter().find(|e| e["type"] == "run_started").unwrap();
    assert_eq!(started["cfg_dropout"], 0.25);
    assert!(events.iter().any(|e| e["type"] == "validation"), "validation on the held-out song");
    assert!(
        events.iter().any(|e| e["type"] == "preview" && e["caption"] == "a test caption" && e["step"] == 0),
        "the base preview"
    );
    // Each engine event reached the web view once, typed, in the order of the run's log;
    // the run's views followed its preparation and ended with it.
    let sent = std::mem::take(&mut *sent.lock().unwrap());
    let forwarded: Vec<ostinato_engine::events::Event> = (sent.iter())
        .filter(|(name, _)| *name == ENGINE_EVENT)
        .map(|(_, e)| serde_json::from_value(e.clone()).expect("an engine event"))
        .collect();
    let log = ostinato_engine::events::read_events(&Path::new(run_dir.as_str().unwrap()).join("events.jsonl")).unwrap();
    assert_eq!(forwarded, log);
    let views: Vec<&Value> = sent.iter().filter(|(name, _)| *name == RUN_EVENT).map(|(_, v)| v).collect();
    assert!(
        views.iter().any(|v| v["preparing"]["total"].as_u64() > Some(0) && v["status"] == "running"),
        "preparation shown"
    );
    let last = views.last().unwrap();
    assert_eq!(
        (&last["status"], &last["active"], &last["preparing"]),
        (&json!("finished"), &json!(false), &Value::Null)
    );
    assert!(views.iter().all(|v| v.get("recent_events").is_none()), "views are light: no event history");

    let charts = app.invoke("run_charts", json!({"dir": run_dir})).unwrap();
    for chart in ["loss", "noise_levels", "throughput", "memory"] {
        assert!(charts[chart].as_str().unwrap().contains("<svg"), "{chart}");
    }
    assert!(charts["loss"].as_str().unwrap().contains("validation"), "the validation curve");
    assert!(charts["noise_levels"].as_str().unwrap().contains("epoch 1"), "the first epoch's losses by noise level");
    let written = app.invoke("export_run", json!({"dir": run_dir, "format": "comfyui", "to": dir.path()})).unwrap();
    let written = std::path::PathBuf::from(written.as_str().unwrap());
    assert!(written.is_file() && written.starts_with(dir.path()), "{}", written.display());
}

#[test]
fn history_lists_runs_and_refuses_paths_outside_the_runs_dir() {
    let dir = tempfile::tempdir().unwrap();
    let write_run = |name: &str, config: bool| {
        let run = dir.path().join("runs").join(name);
        std::fs::create_dir_all(&run).unwrap();
        if config {
            std::fs::write(run.join("run.toml"), "").unwrap();
        }
        std::fs::write(
            run.join("events.jsonl"),
            concat!(
                r#"{"v":1,"type":"step","step":12,"epoch":0,"loss":0.31,"lr":0.001,"grad_norm":1.0,"samples_per_sec":2.0,"#,
                r#""memory_now_bytes":1,"memory_peak_bytes":2,"elapsed_s":3.0,"eta_s":null}"#, "\n",
                r#"{"v":1,"type":"stopped","step":12,"adapter_path":"x"}"#, "\n",
            ),
        )
        .unwrap();
        // A stopped run, with the checkpoint it resumes from.
        std::fs::create_dir_all(run.join("checkpoints/step-000012")).unwrap();
        run
    };
    write_run("20261101-120000-demo", true);
    // A folder with a log but no run.toml is no run: not listed, and the engine names
    // what is missing when asked to resume or export it.
    let run = write_run("no-config", false);
    let app = TestApp::new(dir.path());
    let runs = app.invoke("list_runs", json!({})).unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 1);
    assert_eq!(runs[0]["name"], "20261101-120000-demo");
    assert_eq!(runs[0]["status"], "stopped");
    assert_eq!(runs[0]["steps"], 12);
    assert_eq!(runs[0]["last_loss"], 0.31);
    assert_eq!(runs[0]["resumable"], true);
    assert_eq!(runs[0]["active"], false);
    assert!(runs[0]["updated_unix"].as_u64().is_some(), "{runs}");

    let outside = dir.path().join("config");
    std::fs::create_dir_all(&outside).unwrap();
    for (cmd, args) in [
        ("resume_past_run", json!({"dir": outside})),
        ("run_charts", json!({"dir": "/etc"})),
        ("export_run", json!({"dir": outside, "format": "peft", "to": dir.path()})),
    ] {
        let err = app.invoke(cmd, args).unwrap_err();
        assert_eq!(err["kind"], "invalid", "{cmd}: {err}");
    }
    let err = app.invoke("resume_past_run", json!({"dir": run})).unwrap_err();
    assert_eq!(err["kind"], "engine");
    assert!(err["message"].as_str().unwrap().contains("run.toml"), "{err}");
    let err = app.invoke("export_run", json!({"dir": run, "format": "comfyui", "to": dir.path()})).unwrap_err();
    assert!(err["message"].as_str().unwrap().contains("run.toml"), "{err}");
    let err = app.invoke("export_run", json!({"dir": run, "format": "onnx", "to": dir.path()})).unwrap_err();
    assert!(err.to_string().contains("unknown variant"), "{err}");
}

/// Every command the UI may call is registered and granted exactly once.
#[test]
fn command_list_handler_and_capability_agree() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::new(dir.path());
    for cmd in ostinato_app::command_list::COMMANDS {
        // choose_folder opens a native dialog: its registration is checked by the
        // capability comparison below and by the end-to-end test's build.
        if *cmd == "choose_folder" {
            continue;
        }
        if let Err(e) = app.invoke(cmd, json!({})) {
            assert!(!e.to_string().contains("not found"), "{cmd} is not registered: {e}");
        }
    }
    assert!(app.invoke("no_such_command", json!({})).unwrap_err().to_string().contains("not found"));

    let cap: Value = serde_json::from_str(include_str!("../capabilities/default.json")).unwrap();
    let mut granted: Vec<String> =
        cap["permissions"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()).collect();
    granted.sort();
    let mut expected: Vec<String> = ostinato_app::command_list::COMMANDS
        .iter()
        .map(|c| format!("allow-{}", c.replace('_', "-")))
        .chain(["core:event:default".to_string()])
        .collect();
    expected.sort();
    assert_eq!(
        granted, expected,
        "capabilities/default.json must grant exactly the app's commands and event listening"
    );
}

/// Waits until training has begun (`run_started`): a Stop before it ends the run
/// during dataset preparation, before anything is trained.
fn wait_started(app: &TestApp) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while app.invoke("get_state", json!({})).unwrap()["run"]["started"].is_null() {
        assert!(std::time::Instant::now() < deadline, "the run never started training");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Waits for the run's status to become `want` (or fails on `failed`).
fn wait_status(app: &TestApp, want: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    loop {
        let state = app.invoke("get_state", json!({})).unwrap();
        if state["run"]["status"] == want {
            return state;
        }
        assert_ne!(state["run"]["status"], "failed", "{state}");
        assert!(std::time::Instant::now() < deadline, "no `{want}`: {state}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_stopped_run_resumes_after_the_app_is_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let _cache = own_cache(dir.path());
    let songs = songs(dir.path());
    let run_dir = {
        let app = TestApp::new(dir.path());
        app.invoke("scan_dataset", json!({"path": songs})).unwrap();
        let mut s = app.invoke("get_state", json!({})).unwrap()["settings"].clone();
        s["run"]["epochs"] = json!(50);
        s["run"]["lora"]["r"] = json!(4);
        app.invoke("save_settings", json!({ "settings": s })).unwrap();
        app.invoke("start_run", json!({})).unwrap();
        wait_started(&app);
        app.invoke("stop_run", json!({})).unwrap();
        wait_status(&app, "stopped");
        let runs = app.invoke("list_runs", json!({})).unwrap();
        assert_eq!(runs[0]["status"], "stopped");
        assert_eq!(runs[0]["resumable"], true);
        runs[0]["dir"].clone()
    };
    // The app was quit; a new one finds the run in History and resumes it.
    let app = TestApp::new(dir.path());
    app.invoke("resume_past_run", json!({"dir": run_dir})).unwrap();
    let state = app.invoke("get_state", json!({})).unwrap();
    assert!(
        matches!(state["run"]["status"].as_str(), Some("running" | "stopping" | "stopped" | "finished")),
        "{state}"
    );
    wait_started(&app);
    app.invoke("stop_run", json!({})).ok();
    wait_status(&app, "stopped");
    // The same run directory holds both sessions: started twice, stopped twice.
    let log = std::fs::read_to_string(std::path::Path::new(run_dir.as_str().unwrap()).join("events.jsonl")).unwrap();
    let count = |kind: &str| log.lines().filter(|l| l.contains(&format!("\"type\":\"{kind}\""))).count();
    assert_eq!((count("run_started"), count("stopped")), (2, 2), "{log}");
}

#[test]
fn stop_while_the_dataset_is_prepared_ends_the_run_untrained_and_resumable() {
    let dir = tempfile::tempdir().unwrap();
    let _cache = own_cache(dir.path());
    let songs = songs(dir.path());
    let app = TestApp::new(dir.path());
    app.invoke("scan_dataset", json!({"path": songs})).unwrap();
    app.invoke("start_run", json!({})).unwrap();
    // The window's Stop, at once: the engine is still preparing the songs.
    app.invoke("stop_run", json!({})).unwrap();
    wait_status(&app, "stopped");
    let runs = app.invoke("list_runs", json!({})).unwrap();
    assert_eq!(runs[0]["status"], "stopped", "{runs}");
    assert_eq!(runs[0]["steps"], 0, "{runs}");
    assert_eq!(runs[0]["resumable"], true, "{runs}");
    let run_dir = std::path::PathBuf::from(runs[0]["dir"].as_str().unwrap());
    assert!(!run_dir.join("final").exists(), "no untrained final adapter");
    let log = std::fs::read_to_string(run_dir.join("events.jsonl")).unwrap();
    assert!(!log.contains(r#""type":"step""#), "{log}");
}

/// Copies the engine's tiny real-layout model into `to`.
fn copy_tiny_model(to: &Path) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/real/model");
    for part in ["acestep-v15-turbo", "vae", "Qwen3-Embedding-0.6B"] {
        std::fs::create_dir_all(to.join(part)).unwrap();
        for f in std::fs::read_dir(from.join(part)).unwrap().flatten() {
            std::fs::copy(f.path(), to.join(part).join(f.file_name())).unwrap();
        }
    }
}

#[test]
fn the_model_picker_lists_hub_cache_and_added_models() {
    let dir = tempfile::tempdir().unwrap();
    // The hub cache's layout: models--org--name/snapshots/<commit>, refs/main.
    let repo = dir.path().join("hub/models--ACE-Step--Ace-Step1.5");
    copy_tiny_model(&repo.join("snapshots/abc123"));
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "abc123").unwrap();
    let places = ostinato_engine::load::ModelPlaces {
        hub_cache: Some(dir.path().join("hub")),
        downloads: dir.path().join("models"),
        ..Default::default()
    };
    let app =
        TestApp::with_state(AppState::with_model_places(dir.path().join("config"), dir.path().join("runs"), places));

    let list = app.invoke("list_models", json!({})).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    let m = &list[0];
    assert_eq!((&m["variant"], &m["complete"], &m["origin"]), (&json!("turbo"), &json!(true), &json!("hub_cache")));
    assert_eq!((&m["size"], &m["label"]), (&json!("other"), &json!("custom-size turbo")), "the tiny DiT's shape");
    assert_eq!(m["path"], json!(repo.join("snapshots/abc123/acestep-v15-turbo")));
    let fixture_bytes: u64 = ["acestep-v15-turbo", "vae", "Qwen3-Embedding-0.6B"]
        .iter()
        .flat_map(|p| std::fs::read_dir(repo.join("snapshots/abc123").join(p)).unwrap().flatten())
        .map(|f| f.metadata().unwrap().len())
        .sum();
    assert_eq!(m["bytes"], json!(fixture_bytes));

    // An added folder without its VAE weights: listed, incomplete, the file named.
    let other = dir.path().join("other");
    copy_tiny_model(&other);
    std::fs::remove_file(other.join("vae/diffusion_pytorch_model.safetensors")).unwrap();
    let list = app.invoke("add_model_folder", json!({ "path": other })).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 2, "{list}");
    let added = &list[1];
    assert_eq!((&added["origin"], &added["complete"]), (&json!("added"), &json!(false)));
    assert!(added["problems"].to_string().contains("vae/diffusion_pytorch_model.safetensors"), "{added}");
    // Remembered across launches (models.json in the config folder).
    let again = TestApp::with_state(AppState::with_model_places(
        dir.path().join("config"),
        dir.path().join("runs"),
        ostinato_engine::load::ModelPlaces::default(),
    ));
    assert_eq!(again.invoke("list_models", json!({})).unwrap().as_array().unwrap().len(), 1);

    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let err = app.invoke("add_model_folder", json!({ "path": empty })).unwrap_err();
    assert!(err["message"].as_str().unwrap().contains("no ACE-Step model"), "{err}");
    let list = app.invoke("remove_model_folder", json!({ "path": other })).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(app.invoke("cancel_download", json!({})).unwrap(), json!(false));
    let err = app.invoke("download_model", json!({ "variant": "xl" })).unwrap_err();
    assert!(err["message"].as_str().unwrap().contains("turbo, base, sft, xl-turbo, xl-base, xl-sft"), "{err}");
    let choices = app.invoke("get_state", json!({})).unwrap()["choices"]["model_variants"].clone();
    assert_eq!(choices, json!(["turbo", "base", "sft", "xl-turbo", "xl-base", "xl-sft"]), "the engine's names");
}

#[test]
fn memory_plan_predicts_the_peak_before_start_fitted_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::new(dir.path());
    let s = app.invoke("get_state", json!({})).unwrap()["settings"].clone();
    assert_eq!(s["fit_memory"], true, "fitting to the machine is the window's default");
    let plan = app.invoke("memory_plan", json!({})).unwrap();
    println!("{plan}");
    assert_eq!(plan["fits"], true);
    assert!(plan["summary"].as_str().unwrap().starts_with("predicted peak "), "{plan}");
    assert_eq!(plan["changes"], json!(["gradient checkpointing off"]), "the demo fits easily: the faster path");
    let mut s = s;
    s["fit_memory"] = json!(false);
    app.invoke("save_settings", json!({ "settings": s })).unwrap();
    let plan = app.invoke("memory_plan", json!({})).unwrap();
    assert_eq!((plan["fits"].clone(), plan["changes"].clone()), (json!(true), json!([])), "{plan}");
    assert_eq!(plan["model"], Value::Null, "the demo model is none of ACE-Step's variants");

    // A model folder: its variant as its config.json says, with the prediction.
    let model = dir.path().join("model");
    copy_tiny_model(&model);
    s["run"]["model"] = json!({"kind": "folder", "path": model.join("acestep-v15-turbo")});
    app.invoke("save_settings", json!({ "settings": s })).unwrap();
    let plan = app.invoke("memory_plan", json!({})).unwrap();
    assert_eq!(plan["model"], "custom-size turbo", "{plan}");
    assert!(plan["summary"].as_str().unwrap().starts_with("predicted peak "), "{plan}");
}

/// Waits for song `id`'s last stage (`written`, a pair's when its side B is, or
/// `failed`) and returns its stages.
fn song_stages(sent: &Mutex<Vec<(&'static str, Value)>>, id: &Value) -> Vec<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    loop {
        let stages: Vec<Value> =
            sent.lock().unwrap().iter().filter(|(_, p)| &p["id"] == id).map(|(_, p)| p.clone()).collect();
        if stages.last().is_some_and(|p| (p["stage"] == "written" && p["side"] != "a") || p["stage"] == "failed") {
            return stages;
        }
        assert!(std::time::Instant::now() < deadline, "song {id} did not end: {stages:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// An app with the demo songs scanned, its own latent cache (held until the app is
/// gone: bind the guard first), and its settings with rank 4 (quick runs) to change
/// before they are saved.
fn demo_songs_at_rank_4(dir: &Path) -> (std::sync::MutexGuard<'static, ()>, TestApp, Value) {
    let cache = own_cache(dir);
    let app = TestApp::new(dir);
    let songs = songs(dir);
    app.invoke("scan_dataset", json!({"path": songs})).unwrap();
    let mut s = app.invoke("get_state", json!({})).unwrap()["settings"].clone();
    s["run"]["lora"]["r"] = json!(4);
    (cache, app, s)
}

/// A demo run with previews: its previews are listed from its log, their bytes and
/// pictures come back; Generate makes a song under the run (from the live run, and from
/// the run once it has ended) with its progress; the dataset plays as it is and as the
/// model hears it. Paths outside the runs folder are refused, `..` and links included.
#[test]
fn previews_songs_and_dataset_audio_stay_inside_the_runs_folder() {
    let dir = tempfile::tempdir().unwrap();
    let (_cache, app, mut s) = demo_songs_at_rank_4(dir.path());
    s["run"]["lora"]["alpha"] = json!(8.0);
    for (field, value) in [
        ("epochs", json!(2)),
        ("preview_every_steps", json!(2)),
        ("preview_seconds", json!(0.5)),
        ("preview_caption", json!("plucks")),
    ] {
        s["run"][field] = value;
    }
    app.invoke("save_settings", json!({ "settings": s })).unwrap();
    let sent = app.record(&[SONG_EVENT]);
    let pairs_sent = app.record(&[PAIR_EVENT]);
    let view = app.invoke("start_run", json!({})).unwrap();
    let run_dir = view["run_dir"].as_str().unwrap().to_string();
    // Its log is there once it trains: a run dir is accepted from then on.
    wait_started(&app);
    // A pair loads a model of its own: refused while the run trains.
    let base_vs_base = json!({"a": {"kind": "base"}, "b": {"kind": "base"}, "song": {"caption": "plucks", "duration_seconds": 1.0, "seed": 3}});
    let err = app.invoke("generate_pair", json!({"dir": run_dir, "choices": base_vs_base})).unwrap_err();
    assert!(err["kind"] == "invalid" && err["message"].as_str().unwrap().contains("training"), "{err}");

    // Asked of the live run: it waits for the run's step boundary, then samples and decodes.
    let choices = json!({"caption": "plucks", "lyrics": "", "duration_seconds": 1.0, "seed": 3, "adapter_scale": 1.0});
    let live = app.invoke("generate_song", json!({"dir": run_dir, "choices": choices})).unwrap();
    let stages = song_stages(&sent, &live);
    assert_eq!(stages[0]["stage"], "waiting");
    assert_eq!(stages[0]["live"], true, "the run was live: {stages:?}");
    assert!(stages.iter().any(|p| p["stage"] == "sampling" && p["step"] == 8 && p["steps"] == 8), "{stages:?}");
    assert!(stages.iter().any(|p| p["stage"] == "decoding"), "{stages:?}");
    let written = stages.last().unwrap();
    assert_eq!(written["stage"], "written", "{stages:?}");
    let song = Path::new(written["path"].as_str().unwrap()).to_path_buf();
    assert!(song.is_file() && song.starts_with(Path::new(&run_dir).canonicalize().unwrap().join("songs")), "{song:?}");
    assert_eq!(app.invoke_bytes("audio_bytes", json!({"path": song})).unwrap(), std::fs::read(&song).unwrap());
    wait_status(&app, "finished");

    // Every preview, the base model's first, each file's bytes and picture.
    let previews = app.invoke("run_previews", json!({"dir": run_dir})).unwrap();
    let steps: Vec<u64> = previews.as_array().unwrap().iter().map(|p| p["step"].as_u64().unwrap()).collect();
    assert_eq!(steps[0], 0, "the base model's preview: {previews}");
    assert!(steps.len() >= 2 && steps[1..].iter().all(|s| s % 2 == 0 && *s > 0), "{previews}");
    for p in previews.as_array().unwrap() {
        assert_eq!((&p["caption"], &p["seconds"]), (&json!("plucks"), &json!(0.5)));
        assert!(p["took_s"].as_f64().unwrap() > 0.0);
        let path = Path::new(p["path"].as_str().unwrap());
        let bytes = app.invoke_bytes("audio_bytes", json!({"path": path})).unwrap();
        assert!(bytes.starts_with(b"RIFF") && bytes == std::fs::read(path).unwrap(), "{}", path.display());
        let picture = app.invoke("audio_picture", json!({"path": path})).unwrap();
        assert!(picture.as_str().unwrap().starts_with("<svg"), "{picture}");
    }

    // From the ended run: its saved adapter; a bad duration is the engine's to refuse.
    let ended = app.invoke("generate_song", json!({"dir": run_dir, "choices": choices})).unwrap();
    let stages = song_stages(&sent, &ended);
    assert_eq!((&stages[0]["stage"], &stages[0]["live"]), (&json!("waiting"), &json!(false)));
    assert_eq!(stages.last().unwrap()["stage"], "written", "{stages:?}");
    let mut bad = choices.clone();
    bad["duration_seconds"] = json!(0.0);
    let failed = app.invoke("generate_song", json!({"dir": run_dir, "choices": bad})).unwrap();
    let last = song_stages(&sent, &failed).pop().unwrap();
    assert_eq!(last["stage"], "failed");
    assert!(last["message"].as_str().unwrap().contains("duration"), "{last}");
    // Another adapter mixed in (here the run's own final one) with part strengths: made
    // and kept with them; strengths out of range are refused at once, by their field.
    let mut mixed = choices.clone();
    mixed["more_adapters"] = json!([{"path": Path::new(&run_dir).join("final/adapter"), "scale": 0.5}]);
    mixed["parts"] = json!({"self": 1.0, "cross": 0.5, "mlp": 0.0});
    let mix = app.invoke("generate_song", json!({"dir": run_dir, "choices": mixed})).unwrap();
    let mix_path = song_stages(&sent, &mix).pop().unwrap()["path"].as_str().unwrap().to_string();
    let kept: Value =
        serde_json::from_slice(&std::fs::read(Path::new(&mix_path).with_extension("json")).unwrap()).unwrap();
    assert_eq!((&kept["more_adapters"], &kept["parts"]), (&mixed["more_adapters"], &mixed["parts"]), "{kept}");
    for (field, bad) in [
        (
            "more_adapters[0].scale",
            json!({"more_adapters": [{"path": Path::new(&run_dir).join("final/adapter"), "scale": 9.0}]}),
        ),
        ("parts", json!({"parts": {"self": 1.0, "cross": -1.0, "mlp": 1.0}})),
    ] {
        let mut asked = choices.clone();
        asked.as_object_mut().unwrap().extend(bad.as_object().unwrap().clone());
        let err = app.invoke("generate_song", json!({"dir": run_dir, "choices": asked})).unwrap_err();
        assert_eq!(err["kind"], "invalid_settings", "{err}");
        println!("{field}: {}", err["fields"][field]);
        assert!(err["fields"][field].as_str().unwrap().contains("out of range"), "{err}");
    }
    // Only adapters of this app's runs are mixed in (as the pickers offer them).
    let mut outside = choices.clone();
    outside["more_adapters"] = json!([{"path": dir.path().join("config"), "scale": 1.0}]);
    let err = app.invoke("generate_song", json!({"dir": run_dir, "choices": outside})).unwrap_err();
    assert!(err["fields"]["more_adapters[0].path"].as_str().unwrap().contains("not an adapter folder"), "{err}");
    for file in [Path::new(&mix_path).to_path_buf(), Path::new(&mix_path).with_extension("json")] {
        std::fs::remove_file(file).unwrap();
    }
    // Listed again (as a later session lists them): the two made, oldest first, with what
    // they were asked; the failed one made nothing.
    let listed = app.invoke("run_songs", json!({"dir": run_dir})).unwrap();
    let paths: Vec<&str> = listed.as_array().unwrap().iter().map(|s| s["path"].as_str().unwrap()).collect();
    let ended_path = stages.last().unwrap()["path"].as_str().unwrap();
    assert_eq!(paths, [song.to_str().unwrap(), ended_path], "{listed}");
    for s in listed.as_array().unwrap() {
        let asked = (&s["caption"], &s["seed"], &s["seconds"], &s["adapter_scale"], &s["problem"]);
        assert_eq!(asked, (&json!("plucks"), &json!(3), &json!(1.0), &json!(1.0), &Value::Null), "{s}");
    }

    // A/B: every adapter the runs keep can be picked, the final one first; a pair of the
    // base model and a kept step is made at one seed, both sides kept and listed again
    // with their voices in words.
    let picks = app.invoke("adapter_choices", json!({})).unwrap();
    let picks = picks.as_array().unwrap();
    let run_name = Path::new(&run_dir).file_name().unwrap().to_str().unwrap();
    assert!(picks.iter().all(|p| p["run"] == run_name), "{picks:?}");
    assert_eq!((&picks[0]["kind"], &picks[0]["step"]), (&json!("final"), &Value::Null), "{picks:?}");
    let step = picks.iter().find(|p| p["kind"] == "step").unwrap_or_else(|| panic!("no kept step: {picks:?}"))["step"]
        .as_u64()
        .unwrap();
    let pair = json!({
        "a": {"kind": "base"},
        "b": {"kind": "step", "step": step, "scale": 1.0},
        "song": {"caption": "plucks", "duration_seconds": 1.0, "seed": 5},
    });
    let id = app.invoke("generate_pair", json!({"dir": run_dir, "choices": pair})).unwrap();
    let stages = song_stages(&pairs_sent, &id);
    let written: Vec<&Value> = stages.iter().filter(|p| p["stage"] == "written").collect();
    assert_eq!(written.iter().map(|p| p["side"].as_str().unwrap()).collect::<Vec<_>>(), ["a", "b"], "{stages:?}");
    assert_eq!((&stages[0]["side"], &stages[1]["stage"]), (&json!("a"), &json!("unplanned")), "{stages:?}");
    let listed = app.invoke("run_pairs", json!({"dir": run_dir})).unwrap();
    let kept = &listed.as_array().unwrap()[0];
    println!("kept pair: {kept}");
    assert_eq!((&kept["caption"], &kept["seed"], &kept["problem"]), (&json!("plucks"), &json!(5), &Value::Null));
    assert_eq!(
        (&kept["a"]["voice"], &kept["b"]["voice"]),
        (&json!("the base model"), &json!(format!("step {step} at 1")))
    );
    for (side, made) in ["a", "b"].iter().zip(&written) {
        assert_eq!(kept[side]["path"], made["path"]);
        let bytes = app.invoke_bytes("audio_bytes", json!({"path": made["path"]})).unwrap();
        assert!(bytes.starts_with(b"RIFF"), "side {side}");
    }
    for (choices, field) in [
        (base_vs_base.clone(), "b"),
        (
            json!({"a": {"kind": "base"}, "b": {"kind": "step", "step": 999, "scale": 1.0}, "song": pair["song"]}),
            "b.step",
        ),
        (
            json!({"a": {"kind": "adapter", "path": "/etc", "scale": 1.0}, "b": {"kind": "base"}, "song": pair["song"]}),
            "a.path",
        ),
    ] {
        let err = app.invoke("generate_pair", json!({"dir": run_dir, "choices": choices})).unwrap_err();
        println!("{field}: {}", err["fields"][field]);
        assert!(err["kind"] == "invalid_settings" && err["fields"][field].is_string(), "{field}: {err}");
    }

    // Outside the runs folder: refused, however it is spelled.
    let secret = dir.path().join("config/settings.json");
    assert!(secret.is_file());
    let link = Path::new(&run_dir).join("previews/link.wav");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    let dotdot = dir.path().join("runs/../config/settings.json");
    for path in [secret.clone(), dotdot, link, Path::new(&run_dir).join("previews/none.wav"), "/etc/passwd".into()] {
        for cmd in ["audio_bytes", "audio_picture"] {
            let err = app.invoke(cmd, json!({"path": path})).unwrap_err();
            assert_eq!(err["kind"], "invalid", "{cmd} {}: {err}", path.display());
        }
    }
    for cmd in ["run_previews", "run_songs", "run_pairs", "generate_song"] {
        let err = app.invoke(cmd, json!({"dir": dir.path().join("config"), "choices": choices})).unwrap_err();
        assert_eq!(err["kind"], "invalid", "{cmd}: {err}");
    }

    // The dataset: a usable song as it is and as the model hears it; nothing else.
    let as_is = app.invoke_bytes("dataset_audio", json!({"name": "drum_groove_128.wav", "heard": false}));
    let heard = app.invoke_bytes("dataset_audio", json!({"name": "drum_groove_128.wav", "heard": true}));
    for bytes in [as_is.unwrap(), heard.unwrap()] {
        let wav = hound::WavReader::new(std::io::Cursor::new(bytes)).unwrap();
        assert!(wav.duration() as f64 / wav.spec().sample_rate as f64 > 1.0);
    }
    for name in ["notes.wav", "../config/settings.json", "missing.wav"] {
        let err = app.invoke("dataset_audio", json!({"name": name, "heard": false})).unwrap_err();
        assert_eq!(err["kind"], "invalid", "{name}: {err}");
    }
}

/// The dataset editor's commands: a value the engine refuses is named and nothing is
/// kept; an edit is kept in the label store beside the runs (the songs' folder only
/// read), shown with its source on the next scan, and recorded by the next run.
#[test]
fn labels_edited_in_the_window_are_checked_kept_and_trained_with() {
    let dir = tempfile::tempdir().unwrap();
    let _cache = own_cache(dir.path());
    let app = TestApp::new(dir.path());
    let songs = songs(dir.path());
    let listing = || {
        let mut names: Vec<_> = std::fs::read_dir(&songs).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        names
    };
    let before = listing();
    let err = app.invoke("set_label", json!({"name": "x.wav", "field": "caption", "value": "x"})).unwrap_err();
    assert_eq!(err["message"], "scan a dataset folder first");
    let view = app.invoke("scan_dataset", json!({"path": songs})).unwrap();
    let song = "drum_groove_128.wav";
    let row = view["files"].as_array().unwrap().iter().find(|f| f["name"] == song).unwrap().clone();
    assert_eq!(row["labels"]["bpm"], json!({"value": "128", "source": "sidecar"}));
    assert_eq!(row["labels"]["lyrics"], json!({"value": null, "source": null}));

    for (field, value, says) in [
        ("bpm", "fast", "bpm: `fast` is not a number"),
        ("keyscale", "H minor", "keyscale: `H minor` is not a key"),
        ("tempo", "90", "`tempo` is not a label field"),
    ] {
        let err = app.invoke("set_label", json!({"name": song, "field": field, "value": value})).unwrap_err();
        assert_eq!(err["kind"], "invalid");
        assert!(err["message"].as_str().unwrap().contains(says), "{err}");
    }
    assert!(!dir.path().join("labels").exists(), "nothing refused is kept");
    let err = app.invoke("set_label", json!({"name": "notes.wav", "field": "caption", "value": "x"})).unwrap_err();
    assert!(err["message"].as_str().unwrap().contains("not a usable song of the dataset"), "{err}");

    let row = app.invoke("set_label", json!({"name": song, "field": "caption", "value": "window caption"})).unwrap();
    assert_eq!(row["labels"]["caption"], json!({"value": "window caption", "source": "edited"}));
    let row = app.invoke("set_label", json!({"name": song, "field": "timesignature", "value": "3/4"})).unwrap();
    assert_eq!(row["labels"]["timesignature"], json!({"value": "3", "source": "edited"}));
    let row = app.invoke("accept_labels", json!({"name": song, "values": {"language": "EN"}})).unwrap();
    assert_eq!(row["labels"]["language"], json!({"value": "en", "source": "analysed"}));
    let estimates = app.invoke("analyse_song", json!({"name": song})).unwrap();
    for field in ["bpm", "keyscale", "timesignature"] {
        let e = &estimates[field];
        assert!(e["value"].is_string() != e["cannot_tell"].is_string(), "{field}: {e}");
        // Below the engine's level of sure, a reading is offered as a guess.
        let sure = ostinato_engine::label::analysis::SURE;
        assert_eq!(e["guess"], json!(e["confidence"].as_f64().is_some_and(|c| c < sure)), "{field}: {e}");
    }
    let rescanned = app.invoke("scan_dataset", json!({"path": songs})).unwrap();
    let again = rescanned["files"].as_array().unwrap().iter().find(|f| f["name"] == song).unwrap();
    assert_eq!(again["labels"]["caption"]["source"], "edited");
    assert_eq!(listing(), before, "the songs' folder is only read");
    assert!(dir.path().join("labels/index.json").is_file());

    let mut s = app.invoke("get_state", json!({})).unwrap()["settings"].clone();
    (s["run"]["epochs"], s["run"]["lora"]["r"], s["fit_memory"], s["run"]["preview_every_steps"]) =
        (json!(1), json!(4), json!(false), json!(null));
    app.invoke("save_settings", json!({ "settings": s })).unwrap();
    app.invoke("start_run", json!({})).unwrap();
    wait_status(&app, "finished");
    let runs = app.invoke("list_runs", json!({})).unwrap();
    let run = Path::new(runs[0]["dir"].as_str().unwrap()).to_path_buf();
    let config = ostinato_engine::train::RunConfig::from_toml_file(&run.join("run.toml")).unwrap();
    let given = &config.data.labels[song];
    assert_eq!(
        (given.caption.as_deref(), given.timesignature.as_deref(), given.language.as_deref(), given.bpm.as_deref()),
        (Some("window caption"), Some("3"), Some("en"), None)
    );
}

#[path = "../../engine/tests/hub_server/mod.rs"]
mod hub_server;

/// What a download sends the web view, as JSON.
#[derive(Default, Clone)]
struct Collected(Arc<Mutex<Vec<Value>>>);

impl ostinato_app::bridge::EventSink for Collected {
    fn send(&self, message: ostinato_app::bridge::Outgoing<'_>) {
        if let ostinato_app::bridge::Outgoing::Download(v) = message {
            self.0.lock().unwrap().push(v.clone());
        }
    }
}

#[test]
fn the_model_panel_lists_and_downloads_5hz_lms() {
    let dir = tempfile::tempdir().unwrap();
    let lm = dir.path().join("lm-source");
    ostinato_engine::label::understand::tiny::write_tiny_lm(&lm, 5).unwrap();
    let places = ostinato_engine::load::ModelPlaces {
        hub_cache: Some(dir.path().join("hub")),
        downloads: dir.path().join("models"),
        ..Default::default()
    };
    let state = AppState::with_model_places(dir.path().join("config"), dir.path().join("runs"), places);
    let app = TestApp::with_state(state.clone());
    assert_eq!(app.invoke("list_lms", json!({})).unwrap(), json!([]));
    // Each LM is offered with its size in words, before the hub is asked.
    let choices = app.invoke("get_state", json!({})).unwrap()["choices"]["lm_variants"].clone();
    assert_eq!(choices[1], json!(["lm-1.7b", "lm-1.7b · about 3.7 GB"]), "{choices}");
    assert_eq!(choices.as_array().unwrap().len(), 3);

    // The download's plan (its bytes) comes before any file; the LM is then listed.
    let hub = hub_server::FakeHub::start();
    hub.add_folder("ACE-Step/acestep-5Hz-lm-0.6B", "5eed", &lm, "");
    let client = ostinato_engine::load::Hub::new(&hub.url, None, ostinato_engine::load::Patience::default());
    let sink = Collected::default();
    let variant = "lm-0.6b".parse().unwrap();
    state.models().start_download(variant, client, sink.clone()).unwrap();
    let start = std::time::Instant::now();
    while state.models().downloading() || sink.0.lock().unwrap().last().is_none_or(|e| e["type"] != "finished") {
        assert!(start.elapsed().as_secs() < 60, "{:?}", sink.0.lock().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let events = sink.0.lock().unwrap().clone();
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let planned = types.iter().position(|t| *t == "planned").unwrap();
    assert!(planned < types.iter().position(|t| *t == "file_started").unwrap(), "{types:?}");
    assert_eq!(events[planned]["variant"], "lm-0.6b");
    let folder = dir.path().join("hub/models--ACE-Step--acestep-5Hz-lm-0.6B/snapshots/5eed");
    assert_eq!(events.last().unwrap()["model"], json!(folder));
    let list = app.invoke("list_lms", json!({})).unwrap();
    assert_eq!(
        (&list[0]["name"], &list[0]["complete"], &list[0]["origin"], &list[0]["path"]),
        (&json!("lm-0.6b"), &json!(true), &json!("hub_cache"), &json!(folder))
    );
    assert_eq!(app.invoke("list_models", json!({})).unwrap(), json!([]), "an LM is no model to train");

    // A folder holding only an LM can be added; a name that is neither is refused with all.
    let mine = dir.path().join("mine");
    ostinato_engine::label::understand::tiny::write_tiny_lm(&mine.join("acestep-5Hz-lm-4B"), 6).unwrap();
    app.invoke("add_model_folder", json!({ "path": mine })).unwrap();
    let names: Vec<Value> =
        app.invoke("list_lms", json!({})).unwrap().as_array().unwrap().iter().map(|l| l["name"].clone()).collect();
    assert_eq!(names, [json!("lm-0.6b"), json!("lm-4b")]);
    let err = app.invoke("download_model", json!({ "variant": "lm-2b" })).unwrap_err();
    assert!(err["message"].as_str().unwrap().contains("lm-0.6b, lm-1.7b, lm-4b"), "{err}");
}

// ---- Captioning with ACE-Step's 5 Hz LM (the dataset editor's "Caption"). ----

/// A folder with two demo songs copied without their sidecars (so what the LM writes
/// shows); a tiny LM the app finds where ACE-Step keeps checkpoints; an app that looks
/// only there.
struct Captioning {
    dir: tempfile::TempDir,
    state: AppState,
    songs: std::path::PathBuf,
    lm: std::path::PathBuf,
}

const DEMO_SONG: &str = "pluck_arpeggio_c_major.wav";
/// A song that goes missing after the scan (a usable song the LM cannot hear).
const GONE_SONG: &str = "gone.wav";

impl Captioning {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let songs = dir.path().join("songs");
        std::fs::create_dir(&songs).unwrap();
        let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/demo");
        std::fs::copy(demo.join(DEMO_SONG), songs.join(DEMO_SONG)).unwrap();
        // Another song: the label store keeps labels by content, so a copy would share them.
        std::fs::copy(demo.join("music_box_f_major.wav"), songs.join(GONE_SONG)).unwrap();
        let lm = dir.path().join("checkpoints/acestep-5Hz-lm-0.6B");
        ostinato_engine::label::understand::tiny::write_tiny_lm(&lm, 3).unwrap();
        let places = ostinato_engine::load::ModelPlaces {
            checkpoints: vec![dir.path().join("checkpoints")],
            downloads: dir.path().join("models"),
            ..Default::default()
        };
        let state = AppState::with_model_places(dir.path().join("config"), dir.path().join("runs"), places);
        Captioning { dir, state, songs, lm }
    }

    /// What the label store keeps of a song.
    fn saved(&self, name: &str) -> ostinato_engine::label::store::Saved {
        ostinato_engine::label::store::LabelStore::new(self.dir.path().join("labels"))
            .find(&self.songs.join(name))
            .unwrap()
            .saved
    }
}

/// The caption events of a recording, by name.
fn caption_events(seen: &Mutex<Vec<(&'static str, Value)>>, name: &str) -> Vec<Value> {
    seen.lock().unwrap().iter().filter(|(n, _)| *n == name).map(|(_, v)| v.clone()).collect()
}

/// Waits (at most 5 minutes, for a loaded machine) for the batch's `caption-done`.
fn wait_caption_done(seen: &Mutex<Vec<(&'static str, Value)>>) -> Value {
    let start = std::time::Instant::now();
    loop {
        if let Some(done) = caption_events(seen, "caption-done").pop() {
            return done;
        }
        assert!(start.elapsed().as_secs() < 300, "no caption-done: {:?}", seen.lock().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Through the window's commands: the LM's caption, lyrics, language and genre of a
/// song are kept in the label store and shown with the source `lm`, its tempo, key and
/// meter only offered; a song that went missing since the scan gets the engine's
/// error, naming it, and keeps the labels it had; the batch's end counts both.
#[test]
fn songs_are_captioned_by_the_lm_and_a_song_that_fails_keeps_its_labels() {
    let setup = Captioning::new();
    let app = TestApp::with_state(setup.state.clone());
    let err = app.invoke("caption_songs", json!({})).unwrap_err();
    assert_eq!(err["message"], "scan a dataset folder first");
    app.invoke("scan_dataset", json!({"path": setup.songs})).unwrap();
    let lms = app.invoke("caption_lms", json!({})).unwrap();
    assert_eq!((&lms[0]["name"], &lms[0]["path"]), (&json!("lm-0.6b"), &json!(setup.lm)), "{lms}");
    let row = app.invoke("set_label", json!({"name": GONE_SONG, "field": "caption", "value": "a quiet room"}));
    assert_eq!(row.unwrap()["labels"]["caption"]["source"], "edited");
    let gone = setup.dir.path().join(GONE_SONG);
    std::fs::rename(setup.songs.join(GONE_SONG), &gone).unwrap();

    let seen = app.record(&["caption-progress", "caption-song", "caption-done"]);
    let started = app.invoke("caption_songs", json!({})).unwrap();
    assert_eq!(started, json!({"batch": 1, "lm": "lm-0.6b", "path": setup.lm, "songs": 2}));
    let done = wait_caption_done(&seen);
    assert_eq!(done, json!({"batch": 1, "songs": 2, "captioned": 1, "failed": 1, "cancelled": false, "error": null}));
    assert!(seen.lock().unwrap().iter().all(|(_, e)| e["batch"] == 1), "every event names its batch");

    // The song's stages, in order: the LM loads, the song is heard, then written.
    let stages: Vec<(Value, Value)> = caption_events(&seen, "caption-progress")
        .iter()
        .filter(|p| p["song"] == DEMO_SONG || p["song"].is_null())
        .map(|p| (p["song"].clone(), p["stage"].clone()))
        .collect();
    assert_eq!(stages.first(), Some(&(Value::Null, Value::Null)), "the LM loads first: {stages:?}");
    let heard = stages.iter().position(|(_, s)| s == "listening").expect("listening");
    let written = stages.iter().position(|(_, s)| s == "writing").expect("writing");
    assert!(heard < written, "{stages:?}");

    let outcomes = caption_events(&seen, "caption-song");
    let numbers: Vec<(Value, Value)> = outcomes.iter().map(|o| (o["number"].clone(), o["songs"].clone())).collect();
    assert_eq!(numbers, [(json!(1), json!(2)), (json!(2), json!(2))], "each song once, in order");
    let song = outcomes.iter().find(|o| o["song"] == DEMO_SONG).unwrap();
    assert_eq!(song["error"], Value::Null, "{song}");
    let kept = setup.saved(DEMO_SONG).understood;
    let caption = kept.get(ostinato_engine::data::Field::Caption).expect("the LM's caption kept");
    assert!(!caption.trim().is_empty());
    let labels = &song["row"]["labels"];
    assert_eq!(labels["caption"], json!({"value": caption, "source": "lm"}), "{song}");
    for field in ["lyrics", "language", "genre"] {
        let f: ostinato_engine::data::Field = field.parse().unwrap();
        if let Some(value) = kept.get(f) {
            assert_eq!(labels[field], json!({"value": value, "source": "lm"}), "{field}: {song}");
        }
    }
    // The LM's tempo, key and meter: offered as its guesses (the store keeps them to be
    // shown), never taken.
    let guesses = song["guesses"].as_object().unwrap();
    assert!(!guesses.is_empty(), "the tiny LM writes a tempo, a key and a meter: {song}");
    for (field, guess) in guesses {
        assert!(["bpm", "keyscale", "timesignature"].contains(&field.as_str()), "{field}");
        assert_eq!(kept.get(field.parse().unwrap()), guess.as_str(), "{field}");
        assert_eq!(labels[field], json!({"value": null, "source": null}), "{field} not taken: {song}");
    }

    let failed = outcomes.iter().find(|o| o["song"] == GONE_SONG).unwrap();
    assert_eq!(failed["row"], Value::Null, "{failed}");
    let why = failed["error"].as_str().unwrap_or_else(|| panic!("{failed}"));
    assert!(why.contains(&setup.songs.join(GONE_SONG).display().to_string()), "{why}");
    // Back in place, the song has the labels it had, nothing of the LM's.
    std::fs::rename(&gone, setup.songs.join(GONE_SONG)).unwrap();
    let saved = setup.saved(GONE_SONG);
    assert!(saved.understood.is_empty(), "nothing of the LM kept: {saved:?}");
    assert_eq!(saved.edited.get(ostinato_engine::data::Field::Caption), Some("a quiet room"));

    // What the window shows after a rescan: the same.
    let view = app.invoke("scan_dataset", json!({"path": setup.songs})).unwrap();
    let row = |name: &str| view["files"].as_array().unwrap().iter().find(|f| f["name"] == name).unwrap().clone();
    assert_eq!(row(DEMO_SONG)["labels"], *labels);
    assert_eq!(row(GONE_SONG)["labels"]["caption"], json!({"value": "a quiet room", "source": "edited"}));
    assert_eq!(app.invoke("cancel_captions", json!({})).unwrap(), json!(false), "nothing left to cancel");
}

/// Holds the captioning thread at the first event `hold` picks until the test opens
/// the gate; records every caption event as the web view would get it.
#[derive(Clone)]
struct Gated {
    seen: Arc<Mutex<Vec<(&'static str, Value)>>>,
    open: Arc<(Mutex<bool>, std::sync::Condvar)>,
    hold: fn(&Value) -> bool,
}

impl Gated {
    fn new(hold: fn(&Value) -> bool) -> Self {
        Gated { seen: Arc::default(), open: Arc::default(), hold }
    }

    /// Waits until the thread holds at the gate.
    fn wait_held(&self) {
        let start = std::time::Instant::now();
        while !self.seen.lock().unwrap().iter().any(|(_, v)| (self.hold)(v)) {
            assert!(start.elapsed().as_secs() < 300, "never held: {:?}", self.seen.lock().unwrap());
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    fn release(&self) {
        *self.open.0.lock().unwrap() = true;
        self.open.1.notify_all();
    }
}

impl ostinato_app::bridge::EventSink for Gated {
    fn send(&self, message: ostinato_app::bridge::Outgoing<'_>) {
        let ostinato_app::bridge::Outgoing::Caption(_) = message else { return };
        let value = serde_json::to_value(message).unwrap();
        let held = (self.hold)(&value);
        self.seen.lock().unwrap().push((message.name(), value));
        if held {
            let (open, opened) = &*self.open;
            let mut open = open.lock().unwrap();
            while !*open {
                open = opened.wait(open).unwrap();
            }
        }
    }
}

/// One batch at a time: a second start is refused while the first runs; Cancel while a
/// song is heard ends the batch with nothing kept of that song, and frees the slot for
/// the next batch. An LM that was not found is refused, and without any the message
/// says where to get one.
#[test]
fn captioning_is_one_batch_at_a_time_and_cancels() {
    let setup = Captioning::new();
    let state = &setup.state;
    state.scan_dataset(&setup.songs).unwrap();
    let song = || Some(vec![DEMO_SONG.to_string()]);
    let elsewhere = setup.dir.path().join("songs");
    let err = state.start_captions(song(), Some(&elsewhere), Gated::new(|_| false)).unwrap_err();
    assert!(err.to_string().contains("no complete 5 Hz LM found on this machine"), "{err}");

    let listening = Gated::new(|v| v["stage"] == "listening");
    state.start_captions(song(), None, listening.clone()).unwrap();
    listening.wait_held();
    let err = state.start_captions(song(), None, Gated::new(|_| false)).unwrap_err();
    assert_eq!(err.to_string(), "songs are being captioned: wait for them, or cancel first");
    assert!(state.cancel_captions());
    listening.release();
    let done = wait_caption_done(&listening.seen);
    assert_eq!(done, json!({"batch": 1, "songs": 1, "captioned": 0, "failed": 0, "cancelled": true, "error": null}));
    assert!(caption_events(&listening.seen, "caption-song").is_empty(), "no song's outcome after a cancel");
    assert!(setup.saved(DEMO_SONG).understood.is_empty(), "nothing kept of the cancelled song");

    // The slot is free again: the next batch runs to its end, with the LM named.
    let next = Gated::new(|_| false);
    let started = state.start_captions(song(), Some(&setup.lm), next.clone()).unwrap();
    assert_eq!((started.batch, started.songs), (2, 1));
    let done = wait_caption_done(&next.seen);
    assert_eq!((&done["captioned"], &done["cancelled"]), (&json!(1), &json!(false)), "{done}");
    assert!(setup.saved(DEMO_SONG).understood.get(ostinato_engine::data::Field::Caption).is_some());

    let bare = AppState::with_model_places(
        setup.dir.path().join("config2"),
        setup.dir.path().join("runs2"),
        ostinato_engine::load::ModelPlaces { downloads: setup.dir.path().join("none"), ..Default::default() },
    );
    bare.scan_dataset(&setup.songs).unwrap();
    let err = bare.start_captions(None, None, Gated::new(|_| false)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no complete 5 Hz LM found: download lm-1.7b (about 3.7 GB) in the Model panel to caption songs"
    );
}

/// The window's settings carry the run's own preview prompts and the step-0 switch to
/// the engine; the previews come back with their prompt, and the run's adapter names the
/// trigger word kept in its files. A wrong prompt field is named for its own input.
#[test]
fn preview_prompts_and_the_adapters_trigger_word_reach_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let (_cache, app, mut s) = demo_songs_at_rank_4(dir.path());
    s["run"]["max_steps"] = json!(2);
    s["run"]["preview_every_steps"] = json!(2);
    s["run"]["data"]["trigger"] = json!({"tag": "ostn", "mode": "append"});
    s["run"]["preview_prompts"] = json!([{"caption": "bad", "bpm": 999}]);
    let err = app.invoke("save_settings", json!({ "settings": s })).unwrap_err();
    assert!(err["fields"]["preview_prompts[0].bpm"].is_string(), "{err}");
    s["run"]["preview_prompts"] =
        json!([{"caption": "keys, [trigger]", "seconds": 0.5}, {"caption": "drums", "seconds": 0.5, "seed": 9}]);
    s["run"]["preview_at_step_0"] = json!(false);
    app.invoke("save_settings", json!({ "settings": s })).unwrap();
    let view = app.invoke("start_run", json!({})).unwrap();
    let run_dir = view["run_dir"].as_str().unwrap().to_string();
    wait_started(&app);
    wait_status(&app, "finished");
    let previews = app.invoke("run_previews", json!({"dir": run_dir})).unwrap();
    let seen: Vec<(u64, u64, String)> = previews
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["step"].as_u64().unwrap(), p["prompt"].as_u64().unwrap(), p["caption"].as_str().unwrap().into()))
        .collect();
    assert_eq!(seen, [(2, 0, "keys, ostn".to_string()), (2, 1, "drums".to_string())], "{previews}");
    let adapter = app.invoke("run_adapter", json!({"dir": run_dir})).unwrap();
    assert_eq!((&adapter["trigger"], &adapter["trigger_position"]), (&json!("ostn"), &json!("append")), "{adapter}");
    assert!(adapter["settings"].as_str().unwrap().starts_with("LoRA r 4"), "{adapter}");
}

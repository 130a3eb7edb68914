use super::*;

fn step(n: u64, loss: f64) -> Event {
    Event::Step {
        step: n,
        epoch: 0,
        loss,
        lr: 1e-4,
        grad_norm: 0.5,
        samples_per_sec: 2.0,
        memory_now_bytes: 1 << 20,
        memory_peak_bytes: 2 << 20,
        elapsed_s: n as f64,
        eta_s: None,
        samples: vec![SampleLoss { t: 0.75, loss: loss as f32 }],
    }
}

fn every_kind() -> Vec<Event> {
    vec![
        Event::RunStarted {
            config: serde_json::json!({"lr": 3e-4, "rank": 64}),
            device: "cpu".into(),
            precision: "f32".into(),
            memory: MemoryFeatures {
                gradient_checkpointing: true,
                block_input_grad_path: true,
                latent_cache: false,
                predicted_peak_bytes: Some(3 << 30),
                machine: None,
            },
            adapter: "LoRA r 64 alpha 128".into(),
            trainable_params: 1000,
            total_params: 100_000,
            cfg_dropout: 0.15,
            timestep_levels: Some(vec![1.0, 0.5, 0.3]),
            dataset: DatasetSummary {
                files: 3,
                usable: 2,
                skipped: 1,
                cache_hits: 1,
                cache_misses: 1,
                total_seconds: 61.5,
                seconds_in_files: Some(300.0),
            },
            total_steps: 40,
        },
        Event::DatasetProgress { done: 1, total: 3, file: "a.wav".into(), seconds_done: None, seconds_total: None },
        Event::DatasetProgress {
            done: 1,
            total: 3,
            file: "b.wav".into(),
            seconds_done: Some(10.0),
            seconds_total: Some(240.5),
        },
        Event::DatasetIssue { file: "b.mp3".into(), reason: "cannot decode".into(), kind: IssueKind::Skipped },
        Event::DatasetIssue {
            file: "a.json".into(),
            reason: "field \"bpm\" = \"fast\" is not a number: ignored; the song is used".into(),
            kind: IssueKind::Warning,
        },
        Event::DatasetFile {
            file: "a.wav".into(),
            seconds_used: 240.0,
            seconds_in_file: 505.0,
            note: Some("cut to 240 s".into()),
            prompt: Some("# Caption\nlofi\n".into()),
        },
        step(1, 0.9),
        Event::StepSkipped { step: 2, reason: "non-finite gradients".into(), consecutive: 1, loss_scale: 32768.0 },
        Event::EpochEnd { epoch: 0, step: 1, mean_loss: Some(0.9) },
        Event::CheckpointSaved { step: 1, path: "checkpoints/step-000001".into() },
        Event::Preview {
            step: 2,
            prompt: 1,
            path: "previews/step-000002.wav".into(),
            caption: "calm piano".into(),
            seed: 7,
            seconds: 1.0,
            took_s: 0.5,
        },
        Event::Paused { step: 1 },
        Event::Resumed { step: 1 },
        Event::Warning { message: "fell back to an older checkpoint".into() },
        Event::Finished { adapter_path: "final/adapter".into(), steps: 1, final_loss: Some(0.9), reason: None },
        Event::Validation { step: 1, loss: 0.8, best: true },
        Event::Stopped { step: 1, adapter_path: Some("final/adapter".into()) },
        Event::Stopped { step: 0, adapter_path: None },
        Event::Failed { step: 1, reason: "20 consecutive non-finite steps".into() },
    ]
}

#[test]
fn lines_are_tagged_and_versioned() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    EventLog::open(&path).unwrap().append(&step(3, 0.25)).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let value: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
    assert_eq!(value["v"], 1);
    assert_eq!(value["type"], "step");
    assert_eq!(value["step"], 3);
    assert_eq!(value["loss"], 0.25);
    assert!(text.ends_with('\n'));
}

#[test]
fn every_event_round_trips_through_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let events = every_kind();
    let mut log = EventLog::open(&path).unwrap();
    for e in &events[..5] {
        log.append(e).unwrap();
    }
    drop(log);
    // Reopening appends after what is there.
    let mut log = EventLog::open(&path).unwrap();
    for e in &events[5..] {
        log.append(e).unwrap();
    }
    assert_eq!(read_events(&path).unwrap(), events);
}

#[test]
fn torn_last_line_is_dropped_and_cut_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let mut log = EventLog::open(&path).unwrap();
    log.append(&step(1, 0.5)).unwrap();
    log.append(&step(2, 0.4)).unwrap();
    drop(log);
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(br#"{"v":1,"type":"step","step":3,"ep"#).unwrap();
    drop(f);
    assert_eq!(read_events(&path).unwrap(), [step(1, 0.5), step(2, 0.4)]);

    let mut log = EventLog::open(&path).unwrap();
    log.append(&step(3, 0.3)).unwrap();
    assert_eq!(read_events(&path).unwrap(), [step(1, 0.5), step(2, 0.4), step(3, 0.3)]);
}

#[test]
fn a_stop_without_an_adapter_reads_back_and_old_stops_keep_theirs() {
    let old = r#"{"v":1,"type":"stopped","step":3,"adapter_path":"runs/r/final/adapter"}"#;
    let parsed = parse_line(old.as_bytes()).unwrap();
    assert_eq!(parsed, Event::Stopped { step: 3, adapter_path: Some("runs/r/final/adapter".into()) });
    let untrained = Event::Stopped { step: 0, adapter_path: None };
    let line = to_json_line(&untrained);
    assert!(line.contains(r#""adapter_path":null"#), "{line}");
    assert_eq!(parse_line(line.as_bytes()).unwrap(), untrained);
    assert_eq!(parse_line(br#"{"v":1,"type":"stopped","step":0}"#).unwrap(), untrained);
}

#[test]
fn complete_last_line_without_newline_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    std::fs::write(&path, r#"{"v":1,"type":"paused","step":4}"#).unwrap();
    assert_eq!(read_events(&path).unwrap(), [Event::Paused { step: 4 }]);
}

#[test]
fn corrupt_middle_line_names_its_number() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let good = r#"{"v":1,"type":"paused","step":4}"#;
    std::fs::write(&path, format!("{good}\n{good}\n{{garbage\n{good}\n")).unwrap();
    let err = read_events(&path).unwrap_err();
    assert!(matches!(err, Error::EventLog { line: 3, .. }), "{err}");
    assert!(err.to_string().contains("events.jsonl:3"), "{err}");
}

#[test]
fn newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    std::fs::write(&path, "{\"v\":2,\"type\":\"paused\",\"step\":4}\n").unwrap();
    let err = read_events(&path).unwrap_err();
    assert!(err.to_string().contains("schema version 2"), "{err}");
}

/// Older logs: issues without a kind were skipped files; the summary had no
/// `seconds_in_files`; run_started had no `cfg_dropout` (they trained without) and
/// no `timestep_levels`; steps had no per-sample `samples`.
#[test]
fn older_dataset_events_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let issue = r#"{"v":1,"type":"dataset_issue","file":"b.mp3","reason":"cannot decode"}"#;
    let summary = r#"{"files":1,"usable":1,"skipped":0,"cache_hits":0,"cache_misses":1,"total_seconds":12.5}"#;
    let started = format!(
        r#"{{"v":1,"type":"run_started","config":{{}},"device":"cpu","precision":"f32","memory":{{"gradient_checkpointing":true,"block_input_grad_path":true,"latent_cache":true}},"trainable_params":1,"total_params":2,"dataset":{summary},"total_steps":3}}"#
    );
    let step = r#"{"v":1,"type":"step","step":1,"epoch":0,"loss":0.5,"lr":0.001,"grad_norm":1.0,"samples_per_sec":2.0,"memory_now_bytes":1,"memory_peak_bytes":2,"elapsed_s":3.0,"eta_s":null}"#;
    std::fs::write(&path, format!("{issue}\n{started}\n{step}\n")).unwrap();
    let events = read_events(&path).unwrap();
    assert!(matches!(&events[0], Event::DatasetIssue { kind: IssueKind::Skipped, .. }));
    assert!(matches!(
        &events[1],
        Event::RunStarted { dataset: DatasetSummary { seconds_in_files: None, total_seconds, .. }, .. } if *total_seconds == 12.5
    ));
    assert!(matches!(&events[1], Event::RunStarted { cfg_dropout, timestep_levels: None, .. } if *cfg_dropout == 0.0));
    assert!(matches!(&events[2], Event::Step { samples, loss, .. } if samples.is_empty() && *loss == 0.5));
    // And a new step line without samples is the old line.
    assert!(!to_json_line(&events[2]).contains("samples\""), "{}", to_json_line(&events[2]));
}

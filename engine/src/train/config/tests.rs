use super::*;

#[test]
fn toml_round_trip_and_unknown_keys_are_named() {
    let c = RunConfig { name: "r".into(), ..Default::default() };
    let back: RunConfig = toml::from_str(&c.to_toml()).unwrap();
    assert_eq!(back, c);
    let err = toml::from_str::<RunConfig>("name = \"x\"\nlearning_rate = 1.0\n").unwrap_err();
    assert!(err.to_string().contains("learning_rate"), "{err}");
}

#[test]
fn hash_ignores_where_to_stop() {
    let a = RunConfig { name: "r".into(), ..Default::default() };
    let b = RunConfig { stop_at_step: Some(5), ..a.clone() };
    let c = RunConfig { lr: 1e-3, ..a.clone() };
    assert_eq!(a.trajectory_hash(), b.trajectory_hash());
    assert_ne!(a.trajectory_hash(), c.trajectory_hash());
}

#[test]
fn the_hash_ignores_where_the_run_is_and_older_named_hashes_still_match() {
    let a = RunConfig { name: "r".into(), runs_dir: "/runs".into(), ..Default::default() };
    let moved = RunConfig { name: "copy".into(), runs_dir: "/elsewhere".into(), ..a.clone() };
    assert_eq!(a.trajectory_hash(), moved.trajectory_hash());
    assert!(moved.matches_trajectory(&a.trajectory_hash()));
    // What older checkpoints hold: the settings with the name, without the runs folder.
    let older = |c: &RunConfig| {
        let toml = RunConfig { runs_dir: PathBuf::new(), ..c.clone() }.to_toml();
        blake3::hash(toml.as_bytes()).to_hex()[..16].to_string()
    };
    assert!(a.matches_trajectory(&older(&a)));
    assert!(!a.matches_trajectory(&older(&RunConfig { lr: 1e-3, ..a.clone() })));
}

#[test]
fn preview_settings_are_checked_and_leave_the_hash_alone() {
    let a = RunConfig { name: "r".into(), ..Default::default() };
    for (c, field) in [
        (RunConfig { preview_every_steps: Some(0), ..a.clone() }, "preview_every_steps"),
        (RunConfig { preview_seconds: Some(0.0), ..a.clone() }, "preview_seconds"),
        (RunConfig { preview_seconds: Some(MAX_SECONDS + 1.0), ..a.clone() }, "preview_seconds"),
        (RunConfig { preview_seconds: Some(f64::NAN), ..a.clone() }, "preview_seconds"),
        (
            RunConfig { preview_prompts: vec!["caption=[trigger]".parse().unwrap()], ..a.clone() },
            "preview_prompts[0].caption",
        ),
    ] {
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains(field), "{err}");
    }
    let b = RunConfig {
        preview_every_steps: Some(2),
        preview_seconds: Some(1.0),
        preview_caption: Some("x".into()),
        preview_prompts: vec!["caption=y; bpm=90".parse().unwrap()],
        preview_at_step_0: Some(false),
        ..a.clone()
    };
    b.validate().unwrap();
    assert_eq!(a.trajectory_hash(), b.trajectory_hash());
    let back: RunConfig = toml::from_str(&b.to_toml()).unwrap();
    assert_eq!(back, b);
}

#[test]
fn cfg_dropout_outside_zero_to_one_is_named() {
    for ratio in [-0.1, 1.5, f64::NAN] {
        let c = RunConfig { name: "r".into(), cfg_dropout: Some(ratio), ..Default::default() };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("cfg_dropout"), "{err}");
    }
    for ratio in [None, Some(0.0), Some(0.15), Some(1.0)] {
        RunConfig { name: "r".into(), cfg_dropout: ratio, ..Default::default() }.validate().unwrap();
    }
}

#[test]
fn validation_settings_are_checked_and_named() {
    let base = RunConfig { name: "r".into(), ..Default::default() };
    let cases = [
        (
            RunConfig {
                val_files: vec!["a.wav".into()],
                val_fraction: Some(0.2),
                val_every_steps: Some(1),
                ..base.clone()
            },
            "val_fraction",
        ),
        (RunConfig { val_fraction: Some(1.0), val_every_steps: Some(1), ..base.clone() }, "val_fraction"),
        (RunConfig { val_fraction: Some(0.2), ..base.clone() }, "val_every_steps"),
        (RunConfig { val_every_steps: Some(2), ..base.clone() }, "val_every_steps"),
        (RunConfig { val_fraction: Some(0.2), val_every_steps: Some(0), ..base.clone() }, "val_every_steps"),
        (RunConfig { patience: Some(2), ..base.clone() }, "patience"),
    ];
    for (c, field) in cases {
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains(field), "{err}");
    }
    RunConfig { val_fraction: Some(0.25), val_every_steps: Some(2), patience: Some(3), ..base.clone() }
        .validate()
        .unwrap();
    // Runs without validation write no new keys: their trajectory hash is unchanged.
    assert!(!base.to_toml().contains("val_"), "{}", base.to_toml());
}

/// The fields `c.validate()` names, in order.
fn named(c: &RunConfig) -> Vec<String> {
    match c.validate() {
        Ok(()) => Vec::new(),
        Err(e) => e.iter().map(|(field, _)| field.to_string()).collect(),
    }
}

#[test]
fn a_run_name_must_be_a_plain_folder_name() {
    for name in ["", "a/b", "a\\b", ".hidden"] {
        assert_eq!(named(&RunConfig { name: name.into(), ..Default::default() }), ["name"], "{name:?}");
    }
    assert!(named(&RunConfig { name: "run-1".into(), ..Default::default() }).is_empty());
}

#[test]
fn counts_of_zero_are_named() {
    let a = RunConfig { name: "r".into(), ..Default::default() };
    let cases = [
        (RunConfig { batch_size: 0, ..a.clone() }, "batch_size"),
        (RunConfig { grad_accum: 0, ..a.clone() }, "grad_accum"),
        (RunConfig { keep_checkpoints: 0, ..a.clone() }, "keep_checkpoints"),
        (RunConfig { epochs: 0, ..a.clone() }, "epochs"),
        (RunConfig { max_steps: Some(0), ..a.clone() }, "max_steps"),
        (RunConfig { save_every_steps: Some(0), ..a.clone() }, "save_every_steps"),
        (RunConfig { save_every_epochs: Some(0), ..a.clone() }, "save_every_epochs"),
    ];
    for (c, field) in cases {
        let err = c.validate().unwrap_err();
        assert_eq!(named(&c), [field]);
        assert_eq!(err.to_string(), format!("setting `{field}`: must be at least 1"));
    }
}

#[test]
fn numbers_out_of_their_range_are_named() {
    let a = RunConfig { name: "r".into(), ..Default::default() };
    let cases = [
        (RunConfig { lr: 0.0, ..a.clone() }, "lr"),
        (RunConfig { lr: f64::NAN, ..a.clone() }, "lr"),
        (RunConfig { max_grad_norm: -1.0, ..a.clone() }, "max_grad_norm"),
        (RunConfig { seed: MAX_SEED + 1, ..a.clone() }, "seed"),
    ];
    for (c, field) in cases {
        assert_eq!(named(&c), [field], "{c:?}");
    }
    // No ceiling on lr: a diverging run is the non-finite guard's to stop.
    for c in [RunConfig { lr: 1e30, ..a.clone() }, RunConfig { seed: MAX_SEED, ..a.clone() }] {
        c.validate().unwrap();
    }
}

#[test]
fn lora_data_and_model_settings_are_named_by_their_path() {
    let a = RunConfig { name: "r".into(), ..Default::default() };
    let with = |f: &dyn Fn(&mut RunConfig)| {
        let mut c = a.clone();
        f(&mut c);
        named(&c)
    };
    assert_eq!(with(&|c| c.lora.r = 0), ["lora.r"]);
    assert_eq!(with(&|c| c.lora.alpha = 0.0), ["lora.alpha"]);
    assert_eq!(with(&|c| c.lora.dropout = 1.0), ["lora.dropout"]);
    assert_eq!(with(&|c| c.data.max_duration_seconds = 0.1), ["data.max_duration_seconds"]);
    assert_eq!(with(&|c| c.data.crop_seconds = Some(f64::NAN)), ["data.crop_seconds"]);
    let bad_tempo = crate::data::Labels { bpm: Some("fast".into()), ..Default::default() };
    let labelled = |c: &mut RunConfig| drop(c.data.labels.insert("a b.wav".into(), bad_tempo.clone()));
    assert_eq!(with(&labelled), ["data.labels.\"a b.wav\".bpm"]);
    assert_eq!(with(&|c| c.model = ModelSource::Folder { path: PathBuf::new() }), ["model"]);
    assert!(with(&|c| c.lora.r = 10_000_000).is_empty(), "no ceiling: the memory plan judges a large rank");
}

#[test]
fn every_bad_field_is_named_at_once() {
    let mut c = RunConfig { name: String::new(), batch_size: 0, lr: -1.0, patience: Some(1), ..Default::default() };
    c.lora.dropout = 2.0;
    assert_eq!(named(&c), ["name", "batch_size", "lr", "patience", "lora.dropout"]);
    let message = c.validate().unwrap_err().to_string();
    assert!(message.starts_with("setting `name`: ") && message.contains("; setting `lora.dropout`: "), "{message}");
}

#[test]
fn default_names_read_as_the_utc_time_with_a_hex_suffix() {
    let before = time::OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
    let name = default_run_name();
    let after = time::OffsetDateTime::now_utc();
    let num = |r: std::ops::Range<usize>| name[r].parse::<u8>().unwrap();
    assert_eq!((&name[4..5], &name[7..8], &name[10..11], &name[17..18]), ("-", "-", "_", "-"), "{name}");
    let year = name[0..4].parse::<i32>().unwrap();
    let date = time::Date::from_calendar_date(year, time::Month::try_from(num(5..7)).unwrap(), num(8..10)).unwrap();
    let at = date.with_hms(num(11..13), num(13..15), num(15..17)).unwrap().assume_utc();
    assert!(before <= at && at <= after, "{name}: {before} .. {after}");
    assert!(name.len() == 24 && name[18..].chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')), "{name}");
}

#[test]
fn default_names_sort_by_time_and_do_not_clash_within_a_second() {
    let names: Vec<String> = (0..100).map(|_| default_run_name()).collect();
    let (a, b) = (&names[0], &names[1]);
    assert_eq!(a.len(), "2026-12-02_034512-3f9a1c".len(), "{a}");
    assert!(a[..17] <= b[..17], "{a} {b}");
    let distinct: std::collections::HashSet<_> = names.iter().collect();
    assert_eq!(distinct.len(), names.len(), "{names:?}");
    let c = RunConfig { name: a.clone(), ..Default::default() };
    c.validate().unwrap();
}

#[test]
fn paths_become_absolute_and_a_missing_folder_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let songs = tmp.path().join("songs");
    std::fs::create_dir(&songs).unwrap();
    let mut c = RunConfig { runs_dir: "runs".into(), cache_dir: Some("cache".into()), ..Default::default() };
    c.data.folder = songs.join("../songs");
    c.resolve_paths().unwrap();
    let cwd = std::env::current_dir().unwrap();
    assert_eq!((c.runs_dir.clone(), c.cache_dir.clone()), (cwd.join("runs"), Some(cwd.join("cache"))));
    assert_eq!(c.data.folder, songs.canonicalize().unwrap());
    c.check_input_folders().unwrap();

    std::fs::rename(&songs, tmp.path().join("moved")).unwrap();
    let err = c.check_input_folders().unwrap_err().to_string();
    assert!(err.starts_with(&format!("audio folder {} cannot be read", c.data.folder.display())), "{err}");
    c.model = ModelSource::Folder { path: tmp.path().join("moved/model") };
    c.data.folder = tmp.path().join("moved");
    let err = c.resolve_paths().unwrap_err().to_string();
    assert!(err.contains("model folder") && err.contains("moved/model"), "{err}");
}

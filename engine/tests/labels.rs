//! Tempo, key and meter read from songs with known answers: short General MIDI renders
//! (drums, bass, chords, melody) made by `bench/labels/make_set.py --ogg`, answers in
//! their answers.json. Accuracy over a set of 144 songs beside librosa and essentia is
//! measured by `bench/labels/compare.py` (bench/NOTES.md); these clips hold the
//! analysis to it. And what cannot be told is said, not guessed.

use std::path::Path;

use ostinato_engine::label::analysis::{analyse_file, MIN_RHYTHM_SECONDS};
use serde_json::Value;

#[test]
fn known_answer_clips_are_read_right() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/labels");
    let answers: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("answers.json")).unwrap()).unwrap();
    assert!(answers.len() >= 6, "the clip set is in the repo");
    let mut wrong = Vec::new();
    for a in &answers {
        let file = a["file"].as_str().unwrap();
        let analysis = analyse_file(&dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let (bpm, key, meter) =
            (a["bpm"].as_f64().unwrap(), a["keyscale"].as_str().unwrap(), a["timesignature"].as_u64().unwrap());
        let got_bpm = analysis.bpm.as_ref().map(|e| e.value);
        let got_key = analysis.keyscale.as_ref().map(|e| e.value.clone());
        let got_meter = analysis.timesignature.as_ref().map(|e| e.value);
        let bpm_error = got_bpm.map(|b| (f64::from(b) / bpm - 1.0).abs());
        println!(
            "{file} ({}): bpm {bpm} -> {got_bpm:?} (error {:.1}%), key {key} -> {got_key:?}, meter {meter} -> {got_meter:?}",
            if a["drums"].as_bool().unwrap() { "drums" } else { "no drums" },
            100.0 * bpm_error.unwrap_or(f64::NAN)
        );
        // Keys are compared as pitch classes: the clips' answers spell C# where we write Db.
        let same_key = got_key.as_deref().is_ok_and(|k| same_pitch_class_key(k, key));
        if !(bpm_error.is_ok_and(|e| e <= 0.04) && same_key && got_meter == Ok(meter as u32)) {
            wrong.push(file);
        }
        let seconds = a["seconds"].as_f64().unwrap();
        assert!((analysis.duration - seconds).abs() < 0.05, "{file}: duration {} of {seconds} s", analysis.duration);
    }
    assert!(wrong.is_empty(), "misread: {wrong:?}");
}

fn same_pitch_class_key(a: &str, b: &str) -> bool {
    const CLASSES: [(&str, u8); 17] = [
        ("C", 0),
        ("C#", 1),
        ("Db", 1),
        ("D", 2),
        ("D#", 3),
        ("Eb", 3),
        ("E", 4),
        ("F", 5),
        ("F#", 6),
        ("Gb", 6),
        ("G", 7),
        ("G#", 8),
        ("Ab", 8),
        ("A", 9),
        ("A#", 10),
        ("Bb", 10),
        ("B", 11),
    ];
    let parse = |k: &str| {
        let (tonic, mode) = k.split_once(' ')?;
        Some((CLASSES.iter().find(|(n, _)| *n == tonic)?.1, mode.to_string()))
    };
    parse(a).is_some() && parse(a) == parse(b)
}

#[test]
fn silence_and_a_short_clip_are_cannot_tell_not_guesses() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, seconds: f64, tone: bool| {
        let rate = 44_100u32;
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: rate,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let path = dir.path().join(name);
        let mut w = hound::WavWriter::create(&path, spec).unwrap();
        for i in 0..(seconds * f64::from(rate)) as u32 {
            let t = f64::from(i) / f64::from(rate);
            let chord = [261.63, 329.63, 392.0].iter().map(|f| (std::f64::consts::TAU * f * t).sin()).sum::<f64>();
            w.write_sample(if tone { (3000.0 * chord) as i16 } else { 0 }).unwrap();
        }
        w.finalize().unwrap();
        path
    };
    let silent = analyse_file(&write("silent.wav", 10.0, false)).unwrap();
    for why in [silent.bpm.unwrap_err(), silent.keyscale.unwrap_err(), silent.timesignature.unwrap_err()] {
        assert_eq!(why, "silent");
    }
    assert!((silent.duration - 10.0).abs() < 1e-6);

    // Four seconds of a C major chord: a key, but no tempo or meter from so little.
    let short = analyse_file(&write("short.wav", 4.0, true)).unwrap();
    println!("short clip: {short:?}");
    assert!(short.bpm.unwrap_err().contains(&format!("need {MIN_RHYTHM_SECONDS} s")));
    assert!(short.timesignature.is_err());
    assert_eq!(short.keyscale.unwrap().value, "C major");

    // A held chord, long enough: a key, but no beat to tell a tempo by.
    let held = analyse_file(&write("held.wav", 12.0, true)).unwrap();
    println!("held chord: {held:?}");
    assert!(held.bpm.is_err(), "a held chord has no tempo: {:?}", held.bpm);
    assert!(held.timesignature.is_err());
}

#[cfg(unix)]
#[test]
fn a_named_pipe_is_an_error_not_a_wait() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("song.wav");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let err = analyse_file(&fifo).unwrap_err();
    assert!(err.contains("not a regular file") || err.contains("cannot open"), "{err}");
}

#[test]
fn the_bench_preset_reads_a_four_minute_song() {
    let report = ostinato_engine::bench::label::run_label(0, 1).unwrap();
    print!("{}", report.table());
    assert_eq!(report.song_seconds, 240.0);
    assert_eq!(report.runs_s.len(), 1);
    // The demo synthesizer's first clip: 120 BPM, in 4.
    assert_eq!(report.bpm, Some(120));
    assert_eq!(report.timesignature, Some(4));
}

//! `label`: each song's tempo, key, time signature and length, from its sidecars and
//! its audio (the sidecars' values kept, the audio's shown beside them), as a table or
//! JSON lines.

use std::io::IsTerminal;
use std::path::Path;

use ostinato_engine::data::inspect_folder;
use ostinato_engine::label::analysis::{analyse_file, Reading};
use ostinato_engine::label::{Label, SongLabels, Source};
use serde_json::{json, Value};

pub fn label(audio_dir: &Path, json_lines: bool) -> anyhow::Result<()> {
    let folder = inspect_folder(audio_dir)?;
    let total = folder.songs.len();
    let name_of = |path: &Path| path.strip_prefix(audio_dir).unwrap_or(path).display().to_string();
    if !json_lines {
        println!("{:<40} {:>20} {:>24} {:>16} {:>9}", "file", "bpm", "key", "meter", "duration");
    }
    // On a terminal a line that counts the songs; in a log, the results are the progress.
    let counting = std::io::stderr().is_terminal();
    for (done, song) in folder.songs.iter().enumerate() {
        let name = name_of(&song.path);
        if counting {
            eprint!("\ranalysing {}/{total}: {name}\x1b[K", done + 1);
        }
        match analyse_file(&song.path).map(|a| SongLabels::resolve(&song.meta, a)) {
            Ok(labels) if json_lines => println!("{}", as_json(&name, &labels)),
            Ok(l) => println!(
                "{name:<40} {:>20} {:>24} {:>16} {:>8.1}s",
                shown(&l.bpm),
                shown(&l.keyscale),
                shown(&l.timesignature),
                l.duration
            ),
            Err(why) if json_lines => println!("{}", json!({"file": name, "skipped": why})),
            Err(why) => println!("{name:<40} skipped: {why}"),
        }
    }
    if counting && total > 0 {
        eprintln!();
    }
    for (path, why) in &folder.skipped {
        match json_lines {
            true => println!("{}", json!({"file": name_of(path), "skipped": why})),
            false => println!("{:<40} skipped: {why}", name_of(path)),
        }
    }
    Ok(())
}

/// "90 (sidecar)", "120 (87%)" for a reading, "?" when unknown.
fn shown<T: std::fmt::Display>(label: &Label<T>) -> String {
    match (&label.value, &label.analysed) {
        (None, _) => "?".into(),
        (Some(v), _) if label.source == Some(Source::Sidecar) => format!("{v} (sidecar)"),
        (Some(v), Ok(read)) => format!("{v} ({:.0}%)", 100.0 * read.confidence),
        (Some(v), Err(_)) => v.to_string(),
    }
}

fn as_json(name: &str, l: &SongLabels) -> Value {
    fn read<T: serde::Serialize>(r: &Reading<T>) -> Value {
        r.as_ref().map_or(Value::Null, |e| json!(e.value))
    }
    fn confidence<T>(r: &Reading<T>) -> Value {
        r.as_ref().map_or(Value::Null, |e| json!(e.confidence))
    }
    fn why<T>(r: &Reading<T>) -> Value {
        r.as_ref().err().map_or(Value::Null, |w| json!(w))
    }
    json!({
        "file": name,
        "bpm": l.bpm.value,
        "keyscale": l.keyscale.value,
        "timesignature": l.timesignature.value,
        "duration": l.duration,
        "source": {"bpm": l.bpm.source, "keyscale": l.keyscale.source, "timesignature": l.timesignature.source},
        "analysed": {"bpm": read(&l.bpm.analysed), "keyscale": read(&l.keyscale.analysed), "timesignature": read(&l.timesignature.analysed)},
        "confidence": {
            "bpm": confidence(&l.bpm.analysed),
            "keyscale": confidence(&l.keyscale.analysed),
            "timesignature": confidence(&l.timesignature.analysed),
        },
        "cannot_tell": {"bpm": why(&l.bpm.analysed), "keyscale": why(&l.keyscale.analysed), "timesignature": why(&l.timesignature.analysed)},
    })
}

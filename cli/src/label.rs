//! `label`: what the audio says of each song (tempo, key, meter, length), as a table
//! or JSON lines.

use std::path::Path;

use ostinato_engine::data::inspect_folder;
use ostinato_engine::label::analysis::{analyse_file, Analysis, Reading};
use serde_json::{json, Value};

pub fn label(audio_dir: &Path, json_lines: bool) -> anyhow::Result<()> {
    let folder = inspect_folder(audio_dir)?;
    let total = folder.songs.len();
    if !json_lines {
        println!("{:<40} {:>9} {:>13} {:>5} {:>9}", "file", "bpm", "key", "meter", "duration");
    }
    for (done, song) in folder.songs.iter().enumerate() {
        let name = song.path.strip_prefix(audio_dir).unwrap_or(&song.path).display().to_string();
        eprint!("\ranalysing {}/{total}: {name}\x1b[K", done + 1);
        match analyse_file(&song.path) {
            Ok(a) if json_lines => println!("{}", as_json(&name, &a)),
            Ok(a) => println!(
                "{name:<40} {:>9} {:>13} {:>5} {:>8.1}s",
                shown(&a.bpm),
                shown(&a.keyscale),
                shown(&a.timesignature),
                a.duration
            ),
            Err(why) if json_lines => println!("{}", json!({"file": name, "error": why})),
            Err(why) => println!("{name:<40} skipped: {why}"),
        }
    }
    eprintln!();
    Ok(())
}

fn shown<T: std::fmt::Display>(r: &Reading<T>) -> String {
    match r {
        Ok(e) => format!("{} ({:.0}%)", e.value, 100.0 * e.confidence),
        Err(_) => "?".into(),
    }
}

fn as_json(name: &str, a: &Analysis) -> Value {
    fn value<T: serde::Serialize>(r: &Reading<T>) -> Value {
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
        "bpm": value(&a.bpm),
        "keyscale": value(&a.keyscale),
        "timesignature": value(&a.timesignature),
        "duration": a.duration,
        "confidence": {"bpm": confidence(&a.bpm), "keyscale": confidence(&a.keyscale), "timesignature": confidence(&a.timesignature)},
        "cannot_tell": {"bpm": why(&a.bpm), "keyscale": why(&a.keyscale), "timesignature": why(&a.timesignature)},
    })
}

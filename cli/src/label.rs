//! `label`: each song's tempo, key, time signature and length read from its audio and
//! kept in the label store (a sidecar's value shown, not replaced, unless
//! `--overwrite`), printed as a table or JSON lines; `--write-sidecars` writes every
//! song's labels beside it as ACE-Step sidecars; `--captions` has ACE-Step's LM write
//! each song's caption, lyrics, language and genre too (`captions`).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::Context;
use ostinato_engine::data::{Field, Labels};
use ostinato_engine::label::analysis::{analyse_file, Analysis, Reading};
use ostinato_engine::label::sidecars::{write_sidecars, Outcome, SidecarFile};
use ostinato_engine::label::store::{Found, LabelStore};
use ostinato_engine::label::{reading, readings, resolve, stored_songs, Resolved, Source, ANALYSED};
use serde_json::{json, Value};

use crate::captions::{captioned_json, print_captioned, CaptionArgs, Captioner};
use crate::train::{cancel_on_ctrl_c, INTERRUPTED};

/// What `ostinato label` was asked to do.
pub struct LabelArgs {
    pub json: bool,
    pub overwrite: bool,
    pub write_sidecars: bool,
    pub replace_sidecars: bool,
    pub labels_dir: Option<PathBuf>,
    /// `--captions`: ACE-Step's LM labels the songs too.
    pub captions: Option<CaptionArgs>,
}

/// Labels the songs of `audio_dir`; the exit code (INTERRUPTED after a Ctrl-C).
pub fn label(audio_dir: &Path, args: LabelArgs) -> anyhow::Result<i32> {
    let store = match &args.labels_dir {
        Some(dir) => LabelStore::new(dir),
        None => LabelStore::open_default(),
    };
    let folder = stored_songs(&store, audio_dir)?;
    let captioner = match args.captions {
        Some(captions) => Some(Captioner::load(captions, cancel_on_ctrl_c()?)?),
        None => None,
    };
    let total = folder.songs.len();
    let name_of = |path: &Path| path.strip_prefix(audio_dir).unwrap_or(path).display().to_string();
    if !args.json {
        println!("{:<40} {:>20} {:>24} {:>16} {:>9}", "file", "bpm", "key", "meter", "duration");
    }
    // On a terminal a line that counts the songs; in a log, the results are the progress.
    let counting = std::io::stderr().is_terminal();
    let mut kept = 0;
    for (done, song) in folder.songs.into_iter().enumerate() {
        let name = name_of(&song.file.path);
        if counting {
            eprint!("\ranalysing {}/{total}: {name}\x1b[K", done + 1);
        }
        let analysed = song.found.and_then(|found| Ok((analyse_file(&song.file.path)?, found)));
        let (analysis, mut found) = match analysed {
            Ok(read) => read,
            Err(why) if args.json => {
                println!("{}", json!({"file": name, "skipped": why}));
                continue;
            }
            Err(why) => {
                println!("{name:<40} skipped: {why}");
                continue;
            }
        };
        keep_readings(&store, &song.file.path, &mut found, &analysis, args.overwrite)?;
        let captioned = match &captioner {
            Some(c) => match c.caption(&store, &song.file.path, &mut found, &name) {
                Err(e) if matches!(e.downcast_ref(), Some(ostinato_engine::Error::Cancelled)) => {
                    eprintln!("stopped: the songs labelled so far keep their labels; {name} keeps the ones it had");
                    return Ok(INTERRUPTED);
                }
                done => Some(done?),
            },
            None => None,
        };
        let fields = resolve(&song.file.sidecars, &found.saved);
        let written = match args.write_sidecars {
            true => write_sidecars(&song.file.path, &fields, args.replace_sidecars)?,
            false => Vec::new(),
        };
        kept += written.iter().filter(|f| f.outcome == Outcome::Kept).count();
        if args.json {
            let mut row = as_json(&name, &fields, &analysis, found.stale, &written);
            if let Some(lm) = &captioned {
                row["lm"] = captioned_json(lm);
            }
            println!("{row}");
        } else {
            print_row(&name, &fields, &analysis, found.stale, &written);
            if let (Some(lm), Some(c)) = (&captioned, &captioner) {
                print_captioned(lm, c.takes_metas());
            }
        }
    }
    if counting && total > 0 {
        eprintln!();
    }
    for (path, why) in &folder.skipped {
        match args.json {
            true => println!("{}", json!({"file": name_of(path), "skipped": why})),
            false => println!("{:<40} skipped: {why}", name_of(path)),
        }
    }
    if kept > 0 {
        eprintln!("{kept} sidecar file(s) already say something else and were kept; --replace-sidecars replaces them");
    }
    Ok(0)
}

/// Keeps the analysis's readings in the store: accepted (below the sidecars), or
/// with `overwrite` as edits (over them).
fn keep_readings(
    store: &LabelStore,
    path: &Path,
    found: &mut Found,
    analysis: &Analysis,
    overwrite: bool,
) -> anyhow::Result<()> {
    let read = readings(analysis);
    let mut saved = found.saved.clone();
    let target: &mut Labels = if overwrite { &mut saved.edited } else { &mut saved.accepted };
    for field in ANALYSED {
        if let Some(value) = read.get(field) {
            target.put(field, Some(value.to_string()));
        }
    }
    if saved != found.saved || found.stale {
        store
            .save(path, &found.hash, &saved)
            .with_context(|| format!("cannot keep the labels of {}", path.display()))?;
        found.saved = saved;
        found.stale = false;
    }
    Ok(())
}

/// The reading of one of the analysed fields.
fn read(analysis: &Analysis, field: Field) -> Reading<String> {
    reading(analysis, field).expect("the analysis reads every field in ANALYSED")
}

fn print_row(
    name: &str,
    fields: &BTreeMap<Field, Resolved>,
    analysis: &Analysis,
    stale: bool,
    written: &[SidecarFile],
) {
    let [bpm, key, meter] = ANALYSED.map(|f| shown(&fields[&f], &read(analysis, f)));
    let note = if stale { "  (audio changed since labelled)" } else { "" };
    println!("{name:<40} {bpm:>20} {key:>24} {meter:>16} {:>8.1}s{note}", analysis.duration);
    for file in written.iter().filter(|f| f.outcome != Outcome::Unchanged) {
        println!("    {}: {}", file.outcome.name(), file.path.display());
    }
}

/// "90 (sidecar)", "96 (edited)", "120 (87%)" for a reading, "?" when unknown.
fn shown(field: &Resolved, read: &Reading<String>) -> String {
    match (&field.value, field.source, read) {
        (None, _, _) => "?".into(),
        (Some(v), Some(Source::Sidecar), _) => format!("{v} (sidecar)"),
        (Some(v), Some(Source::Edited), _) => format!("{v} (edited)"),
        (Some(v), _, Ok(r)) if r.value == *v => format!("{v} ({:.0}%)", 100.0 * r.confidence),
        (Some(v), _, _) => v.to_string(),
    }
}

fn as_json(
    name: &str,
    fields: &BTreeMap<Field, Resolved>,
    analysis: &Analysis,
    stale: bool,
    written: &[SidecarFile],
) -> Value {
    let per_field = |f: &dyn Fn(Field) -> Value| -> Value {
        ANALYSED.iter().map(|field| (field.name().to_string(), f(*field))).collect::<serde_json::Map<_, _>>().into()
    };
    let bpm = fields[&Field::Bpm].value.as_deref().and_then(|b| b.parse::<u32>().ok());
    let mut row = json!({
        "file": name,
        "bpm": bpm,
        "keyscale": fields[&Field::Keyscale].value,
        "timesignature": fields[&Field::Timesignature].value,
        "duration": analysis.duration,
        "source": per_field(&|f| json!(fields[&f].source)),
        "analysed": per_field(&|f| match (f, read(analysis, f)) {
            (Field::Bpm, Ok(r)) => json!(r.value.parse::<u32>().ok()),
            (_, Ok(r)) => json!(r.value),
            (_, Err(_)) => Value::Null,
        }),
        "confidence": per_field(&|f| read(analysis, f).map_or(Value::Null, |r| json!(r.confidence))),
        "cannot_tell": per_field(&|f| read(analysis, f).err().map_or(Value::Null, |w| json!(w))),
        "stale": stale,
    });
    if !written.is_empty() {
        row["sidecars"] = json!(written);
    }
    row
}

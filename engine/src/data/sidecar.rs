//! Captions, lyrics and metas from the files beside a song, as ACE-Step reads them.
//!
//! From least to most specific (later wins, field by field): a row for the file in a
//! CSV in its folder (filename, caption, bpm, key, ...), `<stem>.json`, a legacy
//! `<stem>.txt` (lyrics), `<stem>.lyrics.txt`, `<stem>.caption.txt`. A sidecar that
//! cannot be read, or a value in one that does not fit its field, is reported and
//! ignored (the other fields still count); the song still trains. Text that is not
//! UTF-8 is read with its bad bytes replaced, and reported too.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::regular::{open_regular, read_regular};
use super::{TagMode, TriggerTag};
use crate::codec::{SongMeta, INSTRUMENTAL};

#[derive(Debug, Default, Clone, PartialEq)]
struct Fields {
    caption: Option<String>,
    lyrics: Option<String>,
    bpm: Option<u32>,
    keyscale: Option<String>,
    timesignature: Option<String>,
    language: Option<String>,
    genre: Option<String>,
}

impl Fields {
    /// `self`'s fields, falling back to `base`'s.
    fn over(self, base: Fields) -> Fields {
        Fields {
            caption: self.caption.or(base.caption),
            lyrics: self.lyrics.or(base.lyrics),
            bpm: self.bpm.or(base.bpm),
            keyscale: self.keyscale.or(base.keyscale),
            timesignature: self.timesignature.or(base.timesignature),
            language: self.language.or(base.language),
            genre: self.genre.or(base.genre),
        }
    }

    /// The text field called `name` (lower-case); None for bpm and unknown names.
    fn text_field(&mut self, name: &str) -> Option<&mut Option<String>> {
        Some(match name {
            "caption" => &mut self.caption,
            "lyrics" => &mut self.lyrics,
            "keyscale" | "key" | "key_scale" => &mut self.keyscale,
            "timesignature" | "time_signature" => &mut self.timesignature,
            "language" => &mut self.language,
            "genre" => &mut self.genre,
            _ => return None,
        })
    }

    /// Sets a field from a text value by (lower-case) name; unknown names are ignored.
    /// A value that does not fit its field leaves it unset, and the error says so.
    fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let value = value.trim();
        if value.is_empty() {
            return Ok(());
        }
        if name == "bpm" {
            let bpm = parse_bpm(value).map_err(|why| format!("field \"{name}\" = \"{value}\" {why}: ignored"))?;
            self.bpm = Some(bpm);
        } else if let Some(field) = self.text_field(name) {
            *field = Some(value.to_string());
        }
        Ok(())
    }

    /// Sets a field from a JSON value: text, or a number where one makes sense (a
    /// tempo, a time signature written `4`). Any other value of a known field is an
    /// error; unknown names are ignored.
    fn set_json(&mut self, name: &str, value: &Value) -> Result<(), String> {
        let known = name == "bpm" || self.text_field(name).is_some();
        let takes_number = matches!(name, "bpm" | "timesignature" | "time_signature");
        match value {
            Value::String(s) => self.set(name, s),
            Value::Number(n) if takes_number => self.set(name, &n.to_string()),
            Value::Null => Ok(()),
            other if known => Err(format!("field \"{name}\" = {other} is not text: ignored")),
            _ => Ok(()),
        }
    }
}

/// A tempo, or why the text is not one.
fn parse_bpm(s: &str) -> Result<u32, &'static str> {
    match s.parse::<f64>() {
        Ok(b) if b > 0.0 && b < 1000.0 => Ok(b.round() as u32),
        Ok(_) => Err("is not a tempo (0 to 1000)"),
        Err(_) => Err("is not a number"),
    }
}

/// Reads sidecars, remembering each folder's CSV rows.
#[derive(Debug, Default)]
pub struct Sidecars {
    csv_rows: HashMap<PathBuf, HashMap<String, Fields>>,
}

type Issues = Vec<(PathBuf, String)>;

impl Sidecars {
    pub fn new() -> Self {
        Self::default()
    }

    /// The song's metadata (duration left at 0: the decoder knows it). Problems with
    /// sidecars are appended to `issues`.
    pub fn read(&mut self, audio: &Path, issues: &mut Issues) -> SongMeta {
        let dir = audio.parent().unwrap_or(Path::new("")).to_path_buf();
        let rows = self.csv_rows.entry(dir.clone()).or_insert_with(|| read_csvs(&dir, issues));
        let name = audio.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let stem = audio.file_stem().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut f = rows.get(&name).or_else(|| rows.get(&stem)).cloned().unwrap_or_default();

        let beside = |suffix: &str| {
            let mut s = OsString::from(audio.file_stem().unwrap_or_default());
            s.push(suffix);
            dir.join(s)
        };
        let json = beside(".json");
        if let Some(bytes) = read_sidecar(&json, issues) {
            match json_fields(&bytes) {
                Ok((j, problems)) => {
                    f = j.over(f);
                    issues.extend(problems.into_iter().map(|p| (json.clone(), p)));
                }
                Err(e) => issues.push((json, format!("{e}: file ignored"))),
            }
        }
        for (suffix, field) in [(".txt", "lyrics"), (".lyrics.txt", "lyrics"), (".caption.txt", "caption")] {
            let path = beside(suffix);
            if let Some(bytes) = read_sidecar(&path, issues) {
                let text = Some(utf8_text(&bytes, &path, field, issues).trim().to_string()).filter(|t| !t.is_empty());
                if field == "caption" {
                    f.caption = text.or(f.caption);
                } else {
                    f.lyrics = text.or(f.lyrics);
                }
            }
        }
        SongMeta {
            caption: f.caption.unwrap_or_default(),
            lyrics: f.lyrics.unwrap_or_else(|| INSTRUMENTAL.to_string()),
            bpm: f.bpm,
            keyscale: f.keyscale,
            timesignature: f.timesignature,
            language: f.language,
            genre: f.genre,
            duration_seconds: 0.0,
        }
    }
}

/// A sidecar's bytes, or None when there is none (unreadable ones, and pipes or
/// devices named like one, are reported).
fn read_sidecar(path: &Path, issues: &mut Issues) -> Option<Vec<u8>> {
    match read_regular(path) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            issues.push((path.to_path_buf(), format!("cannot read sidecar ({e}): ignored")));
            None
        }
    }
}

/// A text sidecar's `field`, with bad UTF-8 replaced (and reported: a caption in
/// Latin-1 is still mostly the caption).
fn utf8_text(bytes: &[u8], path: &Path, field: &str, issues: &mut Issues) -> String {
    if let Err(e) = std::str::from_utf8(bytes) {
        let at = e.valid_up_to();
        let why =
            format!("field \"{field}\" is not UTF-8 text (a bad byte at {at}): read with it replaced by \u{FFFD}");
        issues.push((path.to_path_buf(), why));
    }
    String::from_utf8_lossy(bytes).into_owned()
}

/// The fields of a JSON sidecar, and why any of them was ignored. (JSON text must be
/// UTF-8: bad bytes make the whole file invalid.)
fn json_fields(bytes: &[u8]) -> Result<(Fields, Vec<String>), String> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON ({e})"))?;
    let obj = value.as_object().ok_or("JSON sidecar is not an object")?;
    let mut f = Fields::default();
    let problems = obj.iter().filter_map(|(k, v)| f.set_json(&k.to_ascii_lowercase(), v).err()).collect();
    Ok((f, problems))
}

/// Rows of every CSV in `dir` with a filename column, keyed by that file name.
fn read_csvs(dir: &Path, issues: &mut Issues) -> HashMap<String, Fields> {
    let mut rows = HashMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return rows;
    };
    let mut csvs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv")))
        .collect();
    csvs.sort();
    for path in csvs {
        match read_csv(&path, &mut rows) {
            Ok(problems) => issues.extend(problems.into_iter().map(|p| (path.clone(), p))),
            Err(e) => issues.push((path, format!("{e}: file ignored"))),
        }
    }
    rows
}

/// Adds a CSV's rows to `rows`; the values it ignored, and why.
fn read_csv(path: &Path, rows: &mut HashMap<String, Fields>) -> Result<Vec<String>, String> {
    let file = open_regular(path).map_err(|e| format!("cannot read CSV: {e}"))?;
    let mut reader = csv::ReaderBuilder::new().flexible(true).from_reader(file);
    let headers: Vec<String> = reader
        .headers()
        .map_err(|e| format!("invalid CSV: {e}"))?
        .iter()
        .map(|h| h.trim().to_ascii_lowercase())
        .collect();
    let Some(file_col) = headers.iter().position(|h| h == "filename" || h == "file") else {
        return Ok(Vec::new()); // some other CSV: not ours
    };
    let mut problems = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|e| format!("invalid CSV: {e}"))?;
        // A short row (the reader is flexible) has no file name: no song to apply it to.
        let Some(name) = record.get(file_col).map(str::trim) else {
            continue;
        };
        let mut f = Fields::default();
        for (h, v) in headers.iter().zip(record.iter()) {
            if let Err(e) = f.set(h, v) {
                problems.push(format!("row for `{name}`: {e}"));
            }
        }
        rows.insert(name.to_string(), f);
    }
    Ok(problems)
}

/// Joins a trigger tag to a caption.
pub fn apply_trigger(caption: &str, trigger: Option<&TriggerTag>) -> String {
    let Some(t) = trigger.filter(|t| !t.tag.trim().is_empty()) else {
        return caption.to_string();
    };
    let tag = t.tag.trim();
    match t.mode {
        _ if caption.is_empty() => tag.to_string(),
        TagMode::Replace => tag.to_string(),
        TagMode::Prepend => format!("{tag}, {caption}"),
        TagMode::Append => format!("{caption}, {tag}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn read(audio: &Path) -> (SongMeta, Issues) {
        let mut issues = Vec::new();
        let m = Sidecars::new().read(audio, &mut issues);
        (m, issues)
    }

    #[test]
    fn no_sidecars_means_instrumental_and_no_caption() {
        let dir = tempfile::tempdir().unwrap();
        let (m, issues) = read(&dir.path().join("song.wav"));
        assert_eq!(m, SongMeta::default());
        assert_eq!(m.lyrics, "[Instrumental]");
        assert!(issues.is_empty());
    }

    #[test]
    fn caption_and_lyrics_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::write(d.join("song.caption.txt"), "  dreamy synth pop \n").unwrap();
        fs::write(d.join("song.lyrics.txt"), "[verse]\nla la\n").unwrap();
        fs::write(d.join("song.txt"), "legacy lyrics").unwrap();
        let (m, _) = read(&d.join("song.wav"));
        assert_eq!(m.caption, "dreamy synth pop");
        assert_eq!(m.lyrics, "[verse]\nla la");
    }

    #[test]
    fn legacy_txt_is_lyrics() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("song.txt"), "old style lyrics").unwrap();
        let (m, _) = read(&dir.path().join("song.mp3"));
        assert_eq!(m.lyrics, "old style lyrics");
        assert_eq!(m.caption, "");
    }

    #[test]
    fn json_sidecar_and_file_precedence() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::write(
            d.join("song.json"),
            r#"{"caption": "from json", "lyrics": "json words", "bpm": 121.6,
                "keyscale": "C minor", "timesignature": "4", "language": "en",
                "genre": "house", "other": [1, 2]}"#,
        )
        .unwrap();
        fs::write(d.join("song.caption.txt"), "from caption file").unwrap();
        let (m, issues) = read(&d.join("song.wav"));
        assert!(issues.is_empty(), "{issues:?}");
        assert_eq!(m.caption, "from caption file");
        assert_eq!(m.lyrics, "json words");
        assert_eq!(m.bpm, Some(122));
        assert_eq!(m.keyscale.as_deref(), Some("C minor"));
        assert_eq!(m.timesignature.as_deref(), Some("4"));
        assert_eq!(m.language.as_deref(), Some("en"));
        assert_eq!(m.genre.as_deref(), Some("house"));
    }

    #[test]
    fn csv_rows_by_file_name_or_stem() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::write(
            d.join("meta.csv"),
            "Filename,Caption,BPM,Key\none.wav,\"first, song\",90,D major\ntwo,second song,128,\n",
        )
        .unwrap();
        fs::write(d.join("two.json"), r#"{"bpm": "100"}"#).unwrap();
        let mut sc = Sidecars::new();
        let mut issues = Vec::new();
        let one = sc.read(&d.join("one.wav"), &mut issues);
        let two = sc.read(&d.join("two.flac"), &mut issues);
        let three = sc.read(&d.join("three.wav"), &mut issues);
        assert!(issues.is_empty(), "{issues:?}");
        assert_eq!(
            (one.caption.as_str(), one.bpm, one.keyscale.as_deref()),
            ("first, song", Some(90), Some("D major"))
        );
        assert_eq!((two.caption.as_str(), two.bpm, two.keyscale), ("second song", Some(100), None));
        assert_eq!(three, SongMeta::default());
    }

    #[test]
    fn bad_sidecars_are_reported_and_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::write(d.join("a.json"), "{not json").unwrap();
        fs::write(d.join("b.json"), r#"{"bpm": "fast"}"#).unwrap();
        fs::write(d.join("b.caption.txt"), b"caf\xe9 latin-1 caption").unwrap();
        let mut sc = Sidecars::new();
        let mut issues = Vec::new();
        let a = sc.read(&d.join("a.wav"), &mut issues);
        let b = sc.read(&d.join("b.wav"), &mut issues);
        assert_eq!(a, SongMeta::default());
        assert_eq!(b.caption, "caf\u{FFFD} latin-1 caption");
        assert_eq!(issues.len(), 3, "{issues:?}");
        assert!(issues[0].0.ends_with("a.json") && issues[0].1.contains("invalid JSON"));
        assert!(issues[1].0.ends_with("b.json") && issues[1].1.contains("fast"));
        assert!(issues[2].0.ends_with("b.caption.txt") && issues[2].1.contains("not UTF-8"));
    }

    #[test]
    fn a_bad_value_loses_only_its_field() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::write(d.join("a.json"), r#"{"bpm": "fast", "caption": "slow intro", "genre": "ambient"}"#).unwrap();
        fs::write(d.join("meta.csv"), "file,caption,bpm\nb.wav,second,-3\nc.wav,third,90\n").unwrap();
        let mut sc = Sidecars::new();
        let mut issues = Vec::new();
        let a = sc.read(&d.join("a.wav"), &mut issues);
        let b = sc.read(&d.join("b.wav"), &mut issues);
        let c = sc.read(&d.join("c.wav"), &mut issues);
        assert_eq!((a.caption.as_str(), a.genre.as_deref(), a.bpm), ("slow intro", Some("ambient"), None));
        assert_eq!((b.caption.as_str(), b.bpm), ("second", None));
        assert_eq!((c.caption.as_str(), c.bpm), ("third", Some(90)));
        let reasons: Vec<&str> = issues.iter().map(|(_, r)| r.as_str()).collect();
        assert_eq!(
            reasons,
            [
                r#"row for `b.wav`: field "bpm" = "-3" is not a tempo (0 to 1000): ignored"#,
                r#"field "bpm" = "fast" is not a number: ignored"#,
            ]
        );
    }

    /// Text that is not UTF-8, a JSON value that is not text: each a warning that
    /// names the sidecar and the field. A caption read with its bad bytes replaced
    /// is still the caption; a number is no caption at all.
    #[test]
    fn text_that_is_not_text_is_a_warning_naming_file_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::write(d.join("a.caption.txt"), b"caf\xe9 jazz").unwrap();
        fs::write(d.join("a.lyrics.txt"), b"la \xff la").unwrap();
        fs::write(d.join("a.json"), r#"{"caption": 12, "genre": ["jazz"], "bpm": 90, "timesignature": 3, "x": 1}"#)
            .unwrap();
        fs::write(d.join("b.json"), r#"{"caption": 12, "lyrics": true}"#).unwrap();
        let mut sc = Sidecars::new();
        let mut issues = Vec::new();
        let a = sc.read(&d.join("a.wav"), &mut issues);
        let b = sc.read(&d.join("b.wav"), &mut issues);
        assert_eq!((a.caption.as_str(), a.lyrics.as_str()), ("caf\u{FFFD} jazz", "la \u{FFFD} la"));
        assert_eq!((a.bpm, a.timesignature.as_deref(), a.genre), (Some(90), Some("3"), None));
        assert_eq!((b.caption.as_str(), b.lyrics.as_str()), ("", INSTRUMENTAL));
        let said: Vec<(String, &str)> =
            issues.iter().map(|(f, r)| (f.file_name().unwrap().to_string_lossy().into_owned(), r.as_str())).collect();
        let want = [
            ("a.json", r#"field "caption" = 12 is not text: ignored"#),
            ("a.json", r#"field "genre" = ["jazz"] is not text: ignored"#),
            ("a.lyrics.txt", "field \"lyrics\" is not UTF-8 text (a bad byte at 3): read with it replaced by \u{FFFD}"),
            (
                "a.caption.txt",
                "field \"caption\" is not UTF-8 text (a bad byte at 3): read with it replaced by \u{FFFD}",
            ),
            ("b.json", r#"field "caption" = 12 is not text: ignored"#),
            ("b.json", r#"field "lyrics" = true is not text: ignored"#),
        ];
        assert_eq!(said, want.map(|(f, r)| (f.to_string(), r)));
    }

    #[test]
    fn trigger_tag_modes() {
        let tag = |mode| TriggerTag { tag: "ostn style".into(), mode };
        assert_eq!(apply_trigger("lofi beat", Some(&tag(TagMode::Prepend))), "ostn style, lofi beat");
        assert_eq!(apply_trigger("lofi beat", Some(&tag(TagMode::Append))), "lofi beat, ostn style");
        assert_eq!(apply_trigger("lofi beat", Some(&tag(TagMode::Replace))), "ostn style");
        assert_eq!(apply_trigger("", Some(&tag(TagMode::Append))), "ostn style");
        assert_eq!(apply_trigger("lofi beat", None), "lofi beat");
        let blank = TriggerTag { tag: " ".into(), mode: TagMode::Replace };
        assert_eq!(apply_trigger("lofi beat", Some(&blank)), "lofi beat");
    }
}

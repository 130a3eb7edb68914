//! The dataset scan the Dataset panel shows: every audio file of a folder checked as
//! training would check it, without encoding anything.

use std::path::Path;

use ostinato_engine::data::{audio, scan::scan_folder, sidecar::Sidecars};

use super::engine::engine_err;
use super::{BridgeError, DatasetView, FileRow};
use crate::settings::Settings;

/// Every audio file under `dir` with its duration, sidecars and, for a bad one,
/// what is wrong: the checks training applies, without encoding anything.
pub fn scan(dir: &Path, _settings: &Settings) -> Result<DatasetView, BridgeError> {
    let outcome = scan_folder(dir).map_err(engine_err)?;
    let mut sidecars = Sidecars::new();
    let mut sidecar_issues = Vec::new();
    let name = |p: &Path| p.strip_prefix(dir).unwrap_or(p).display().to_string();
    let mut files = Vec::new();
    for path in &outcome.audio {
        let meta = sidecars.read(path, &mut sidecar_issues);
        let checked = audio::decode(path).and_then(|a| audio::check_usable(&a).map(|_| a.duration_seconds()));
        files.push(FileRow {
            name: name(path),
            duration_s: checked.as_ref().ok().copied(),
            has_caption: !meta.caption.trim().is_empty(),
            has_lyrics: meta.lyrics.trim() != "[Instrumental]" && !meta.lyrics.trim().is_empty(),
            status: if checked.is_ok() { "ok" } else { "bad" }.into(),
            problem: checked.err(),
        });
    }
    for (path, reason) in &outcome.skipped {
        files.push(FileRow {
            name: name(path),
            duration_s: None,
            has_caption: false,
            has_lyrics: false,
            status: "bad".into(),
            problem: Some(reason.clone()),
        });
    }
    let usable = files.iter().filter(|f| f.status == "ok").count();
    Ok(DatasetView {
        path: dir.to_path_buf(),
        total_duration_s: files.iter().filter_map(|f| f.duration_s).sum(),
        usable,
        bad: files.len() - usable,
        files,
    })
}

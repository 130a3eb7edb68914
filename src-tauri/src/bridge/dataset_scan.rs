//! The dataset scan the Dataset panel shows: every audio file of a folder checked as
//! training would check it, without encoding anything.

use std::path::Path;

use ostinato_engine::data::{inspect_folder, DataSpec};

use super::engine::engine_err;
use super::{BridgeError, DatasetView, FileRow};

/// Every audio file under `dir` with its duration, sidecars and, for a bad one,
/// what is wrong: the engine's check of a folder, the one training applies,
/// without encoding anything.
pub fn scan(dir: &Path) -> Result<DatasetView, BridgeError> {
    let folder = inspect_folder(dir).map_err(engine_err)?;
    let name = |p: &Path| p.strip_prefix(dir).unwrap_or(p).display().to_string();
    let spec = DataSpec::new(dir);
    let mut files = Vec::new();
    for song in &folder.songs {
        let checked = song.check(&spec).map(|d| d.seconds_in_file());
        files.push(FileRow {
            name: name(&song.path),
            duration_s: checked.as_ref().ok().copied(),
            has_caption: song.meta.has_caption(),
            has_lyrics: song.meta.has_lyrics(),
            status: if checked.is_ok() { "ok" } else { "bad" }.into(),
            problem: checked.err(),
        });
    }
    for (path, reason) in &folder.skipped {
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

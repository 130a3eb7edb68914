//! Weights split across files, as transformers' `save_pretrained` writes a big model
//! (ACE-Step's XL DiTs: `model.safetensors.index.json` and `model-0000N-of-00004.safetensors`):
//! the index's `weight_map` names the file of each tensor, beside the index.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::{Error, Result};

/// The index file transformers writes beside the shards of `model.safetensors`.
pub const INDEX_SUFFIX: &str = ".index.json";

#[derive(Deserialize)]
struct Index {
    weight_map: BTreeMap<String, String>,
}

/// Whether `path` is a shard index rather than a safetensors file.
pub fn is_index(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n.to_string_lossy().ends_with(INDEX_SUFFIX))
}

/// The safetensors files `path` stands for: itself, or for an index the files its
/// `weight_map` names (each once, in order), each of which must be there. An index
/// naming a file outside its folder, or none, is refused by name.
pub fn weight_files(path: &Path) -> Result<Vec<PathBuf>> {
    if !is_index(path) {
        return Ok(vec![path.to_path_buf()]);
    }
    let bad = |reason: String| Error::BadFile { path: path.to_path_buf(), reason };
    let index: Index = crate::error::read_json(path)?;
    let dir = path.parent().unwrap_or(Path::new(""));
    let names: BTreeSet<&String> = index.weight_map.values().collect();
    if names.is_empty() {
        return Err(bad("its weight_map names no file".into()));
    }
    names
        .into_iter()
        .map(|name| {
            if Path::new(name).file_name() != Some(name.as_ref()) {
                return Err(bad(format!("weight_map names `{name}`, which is not a file beside the index")));
            }
            let file = dir.join(name);
            if !file.is_file() {
                return Err(bad(format!("its shard {} is missing", file.display())));
            }
            Ok(file)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(dir: &Path, map: serde_json::Value) -> PathBuf {
        let path = dir.join("model.safetensors.index.json");
        std::fs::write(&path, serde_json::json!({"metadata": {}, "weight_map": map}).to_string()).unwrap();
        path
    }

    #[test]
    fn an_index_stands_for_each_shard_it_names_once() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("model.safetensors");
        assert_eq!(weight_files(&plain).unwrap(), [plain]);

        let shards = ["model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors"];
        let path = index(dir.path(), serde_json::json!({"a": shards[0], "b": shards[1], "c": shards[0]}));
        let err = weight_files(&path).unwrap_err().to_string();
        assert!(err.contains("model.safetensors.index.json") && err.contains("model-00001-of-00002"), "{err}");
        for s in shards {
            std::fs::write(dir.path().join(s), b"").unwrap();
        }
        assert_eq!(weight_files(&path).unwrap(), [dir.path().join(shards[1]), dir.path().join(shards[0])]);

        let outside = index(dir.path(), serde_json::json!({"a": "../model.safetensors"}));
        let err = weight_files(&outside).unwrap_err().to_string();
        assert!(err.contains("not a file beside the index"), "{err}");
        let empty = index(dir.path(), serde_json::json!({}));
        assert!(weight_files(&empty).unwrap_err().to_string().contains("names no file"));
    }
}

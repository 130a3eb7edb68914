//! A model's weights as one safetensors file or as shards an index lists
//! (`model.safetensors.index.json`: transformers' `save_pretrained` layout for big
//! models, as ACE-Step 1.5 XL's repositories ship theirs, in four shards).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::{Error, Result};

/// How an index's name ends (`model.safetensors.index.json`).
pub const INDEX_SUFFIX: &str = ".safetensors.index.json";

#[derive(Deserialize)]
struct Index {
    weight_map: std::collections::BTreeMap<String, String>,
}

pub fn is_index(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(INDEX_SUFFIX))
}

/// The weights in `dir` under the single-file name `file` (`model.safetensors`): that
/// file, else its index beside it when there is one (the file's path when neither is,
/// for the error that names it).
pub fn weights_in(dir: &Path, file: &str) -> PathBuf {
    let single = dir.join(file);
    let index = dir.join(format!("{}.index.json", file));
    if !single.exists() && index.is_file() {
        index
    } else {
        single
    }
}

/// The files holding the weights `path` names: itself, or each shard its index lists
/// (in the index's folder, in name order), every one a file. An error names the index
/// and what is wrong with it.
pub fn weight_files(path: &Path) -> Result<Vec<PathBuf>> {
    if !is_index(path) {
        return Ok(vec![path.to_path_buf()]);
    }
    let bad = |reason: String| Error::BadFile { path: path.to_path_buf(), reason };
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let index: Index = serde_json::from_str(&text).map_err(|cause| Error::Json { path: path.to_path_buf(), cause })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut names: Vec<&String> = index.weight_map.values().collect();
    names.sort();
    names.dedup();
    if names.is_empty() {
        return Err(bad("its weight_map lists no tensors".into()));
    }
    names
        .into_iter()
        .map(|name| {
            let shard = Path::new(name);
            // A shard is a file beside the index: no folders, no way out of it.
            if shard.components().count() != 1 || shard.file_name().is_none() {
                return Err(bad(format!("shard `{name}` is not a file name beside the index")));
            }
            let file = dir.join(shard);
            if !file.is_file() {
                return Err(bad(format!("shard `{name}` is missing")));
            }
            Ok(file)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_names_its_shards_and_what_is_wrong_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let index = dir.path().join("model.safetensors.index.json");
        let write =
            |map: &str| std::fs::write(&index, format!(r#"{{"metadata": {{}}, "weight_map": {map}}}"#)).unwrap();
        assert_eq!(weights_in(dir.path(), "model.safetensors"), dir.path().join("model.safetensors"));

        write(
            r#"{"a": "model-00002-of-00002.safetensors", "b": "model-00001-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"}"#,
        );
        assert_eq!(weights_in(dir.path(), "model.safetensors"), index);
        let err = weight_files(&index).unwrap_err().to_string();
        assert!(
            err.contains("model.safetensors.index.json")
                && err.contains("model-00001-of-00002.safetensors` is missing"),
            "{err}"
        );
        for i in 1..=2 {
            std::fs::write(dir.path().join(format!("model-0000{i}-of-00002.safetensors")), b"").unwrap();
        }
        let names: Vec<_> = weight_files(&index).unwrap().iter().map(|p| p.file_name().unwrap().to_owned()).collect();
        assert_eq!(names, ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]);

        write(r#"{"a": "../elsewhere.safetensors"}"#);
        let err = weight_files(&index).unwrap_err().to_string();
        assert!(err.contains("not a file name beside the index"), "{err}");
        write("{}");
        assert!(weight_files(&index).unwrap_err().to_string().contains("lists no tensors"));
        std::fs::write(&index, "{").unwrap();
        assert!(weight_files(&index).unwrap_err().to_string().contains("model.safetensors.index.json"));

        // A single file is itself.
        let single = dir.path().join("model.safetensors");
        std::fs::write(&single, b"").unwrap();
        assert_eq!(weights_in(dir.path(), "model.safetensors"), single);
        assert_eq!(weight_files(&single).unwrap(), [single]);
    }
}

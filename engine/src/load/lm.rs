//! A 5 Hz LM folder (ACE-Step's `acestep-5Hz-lm-*`, what labels songs in "understand"
//! mode) as downloaded:
//!
//! ```text
//! <lm>/config.json               Qwen3ForCausalLM (model_type qwen3)
//! <lm>/model.safetensors         or model.safetensors.index.json and its shards
//! <lm>/tokenizer.json, tokenizer_config.json   (and vocab.json, merges.txt, ... kept as they come)
//! ```
//!
//! `LmFolder::open` checks the files and reads the config and the weights' headers,
//! never the weights; every problem is named by its file. `lms_in` finds LM folders
//! in the places models are looked for.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::catalog::LmVariant;
use super::layout::{hf_snapshot, subfolders};
use crate::tensor_io::shards::weights_in;
use crate::tensor_io::TensorFile;
use crate::{Error, Result};

/// The name every LM folder's starts with.
pub const LM_PREFIX: &str = "acestep-5Hz-lm-";
pub const LM_ARCHITECTURE: &str = "Qwen3ForCausalLM";
pub const LM_MODEL_TYPE: &str = "qwen3";
const LM_WEIGHTS: &str = "model.safetensors";
const EMBEDDING: &str = "model.embed_tokens.weight";
const TOKENIZER_FILES: [&str; 2] = ["tokenizer.json", "tokenizer_config.json"];

/// An LM folder that opened: its sizes from config.json and its parameters from the
/// weights' headers.
#[derive(Debug, Clone, PartialEq)]
pub struct LmFolder {
    pub dir: PathBuf,
    pub hidden_size: usize,
    pub layers: usize,
    pub vocab_size: usize,
    /// Tensors in the weights' headers.
    pub tensors: usize,
    /// Elements of every tensor in the weights (tied embeddings counted once).
    pub parameters: u64,
}

impl LmFolder {
    pub fn open(dir: &Path) -> Result<Self> {
        let fail = |problems: Vec<String>| Error::ModelFolder { path: dir.to_path_buf(), problems };
        if !dir.is_dir() {
            let why = if dir.exists() { "is a file, not an LM folder" } else { "does not exist" };
            return Err(fail(vec![why.into()]));
        }
        let mut problems = Vec::new();
        let sizes = read_config(&dir.join("config.json"), &mut problems);
        for name in TOKENIZER_FILES {
            if !dir.join(name).is_file() {
                problems.push(format!("{}: missing (the LM's tokenizer)", dir.join(name).display()));
            }
        }
        let counted = count_parameters(&weights_in(dir, LM_WEIGHTS), sizes, &mut problems);
        match (sizes, counted) {
            (Some([hidden_size, layers, vocab_size]), Some((tensors, parameters))) if problems.is_empty() => {
                Ok(Self { dir: dir.to_path_buf(), hidden_size, layers, vocab_size, tensors, parameters })
            }
            _ => Err(fail(problems)),
        }
    }

    /// The catalog's variant, when the folder (or its hub repository) is named as one.
    pub fn variant(&self) -> Option<LmVariant> {
        lm_variant_of(&self.dir)
    }
}

/// `[hidden_size, num_hidden_layers, vocab_size]` of a Qwen3 causal LM's config.json.
fn read_config(path: &Path, problems: &mut Vec<String>) -> Option<[usize; 3]> {
    let text = std::fs::read_to_string(path).map_err(|e| problems.push(format!("{}: {e}", path.display()))).ok()?;
    let json: Value = serde_json::from_str(&text)
        .map_err(|e| problems.push(format!("{}: invalid JSON: {e}", path.display())))
        .ok()?;
    let architectures: Vec<&str> =
        json["architectures"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let model_type = json["model_type"].as_str();
    if !architectures.contains(&LM_ARCHITECTURE) || model_type != Some(LM_MODEL_TYPE) {
        problems.push(format!(
            "{}: architectures {architectures:?}, model_type {model_type:?}: expected [\"{LM_ARCHITECTURE}\"] and \"{LM_MODEL_TYPE}\" (a 5 Hz LM)",
            path.display()
        ));
        return None;
    }
    let mut size = |key: &str| match json[key].as_u64() {
        Some(n) if n > 0 => Some(n as usize),
        _ => {
            problems.push(format!("{}: `{key}` is missing or not a positive integer", path.display()));
            None
        }
    };
    let sizes = [size("hidden_size"), size("num_hidden_layers"), size("vocab_size")];
    Some([sizes[0]?, sizes[1]?, sizes[2]?])
}

/// The tensors and their elements in the weights' headers (the shards an index lists),
/// after checking the token embedding against the config's `[vocab_size, hidden_size]`.
fn count_parameters(weights: &Path, sizes: Option<[usize; 3]>, problems: &mut Vec<String>) -> Option<(usize, u64)> {
    let file = TensorFile::open_for_check(weights).map_err(|e| problems.push(e.to_string())).ok()?;
    let keys = file.keys();
    match (file.shape(EMBEDDING), sizes) {
        (None, _) => problems.push(format!("{}: no {EMBEDDING} (not a language model's weights)", weights.display())),
        (Some(shape), Some([hidden, _, vocab])) if shape != [vocab, hidden] => problems.push(format!(
            "{}: {EMBEDDING} has shape {shape:?}, config.json says [{vocab}, {hidden}]",
            weights.display()
        )),
        _ => {}
    }
    Some((keys.len(), keys.iter().filter_map(|k| file.shape(k)).map(|s| s.iter().product::<usize>() as u64).sum()))
}

/// The LM folders in `dir`: itself, its `acestep-5Hz-lm-*` folders, a hub
/// repository's snapshot, or those of every hub repository in a hub cache. Folders named
/// as LMs are found even when broken, so their problems can be told; in a hub cache only
/// ACE-Step's LM folders count (other Qwen3 LMs cached there are no 5 Hz LMs).
pub fn lms_in(dir: &Path) -> Vec<PathBuf> {
    if is_lm_dir(dir) || has_prefix(dir, LM_PREFIX) {
        return vec![dir.to_path_buf()];
    }
    if dir.join("snapshots").is_dir() {
        let Some(snapshot) = hf_snapshot(dir) else { return Vec::new() };
        // An LM's own repository (`models--ACE-Step--acestep-5Hz-lm-0.6B`): the
        // snapshot is the LM folder, whatever state it is in.
        if dir.file_name().is_some_and(|n| is_lm_repo(&n.to_string_lossy())) {
            return vec![snapshot];
        }
        return subfolders(&snapshot).into_iter().filter(|sub| has_prefix(sub, LM_PREFIX)).collect();
    }
    subfolders(dir)
        .into_iter()
        .filter(|sub| has_prefix(sub, LM_PREFIX) || has_prefix(sub, "models--"))
        .flat_map(|sub| lms_in(&sub))
        .collect()
}

fn has_prefix(dir: &Path, prefix: &str) -> bool {
    dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix))
}

/// `models--<org>--acestep-5Hz-lm-*`.
fn is_lm_repo(repo_dir_name: &str) -> bool {
    repo_dir_name.starts_with("models--") && repo_dir_name.rsplit("--").next().is_some_and(|n| n.starts_with(LM_PREFIX))
}

/// A folder whose config.json names a Qwen3 causal LM.
pub fn is_lm_dir(dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join("config.json")) else { return false };
    let Ok(json) = serde_json::from_str::<Value>(&text) else { return false };
    json["architectures"].as_array().is_some_and(|a| a.iter().any(|v| v == LM_ARCHITECTURE))
}

/// The catalog's variant of an LM folder: by its name, or for a hub snapshot
/// (`models--ACE-Step--<folder>/snapshots/<commit>`) by its repository's.
pub fn lm_variant_of(dir: &Path) -> Option<LmVariant> {
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    if let Some(v) = name(dir).and_then(|n| LmVariant::of_folder(&n)) {
        return Some(v);
    }
    let snapshots = dir.parent()?;
    if name(snapshots)? != "snapshots" {
        return None;
    }
    let repo = name(snapshots.parent()?)?;
    LmVariant::of_folder(repo.rsplit("--").next()?)
}

//! Tensor files. Named tensors from memory-mapped safetensors files, for the
//! inference-only parts of the real model (VAE, Qwen3, condition encoder): every
//! lookup checks the shape and names the file and key at fault; tensors come back as
//! f32. A file is one safetensors file or a sharded model's index (`shards`).
//! Safetensors written whole or not at all. `torch_pt` reads torch's `.pt` files.
//!
//! A file opened for checking reads headers only: each lookup records what is missing
//! or mis-shaped and hands back a stand-in without storage, so a module's own loader
//! lists every problem of its file at no memory cost.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use crate::{Error, Result};

pub mod shards;
mod source;
pub mod torch_pt;

pub use source::{RandomTensors, TensorSource};

pub struct TensorFile {
    /// The safetensors files, one unless the weights are sharded.
    files: Vec<MmapedSafetensors>,
    /// Each file's path, and which of them holds each tensor.
    file_paths: Vec<PathBuf>,
    holder: HashMap<String, usize>,
    /// The path the user gave: the file, or the shards' index.
    path: PathBuf,
    device: Device,
    /// `Some` when opened for checking: the lookups made and the problems found.
    check: Option<RefCell<ShapeCheck>>,
}

#[derive(Default)]
struct ShapeCheck {
    lookups: usize,
    problems: Vec<String>,
}

impl TensorFile {
    /// Opens a safetensors file, or every shard of the index at `path`.
    pub fn open(path: &Path, device: &Device) -> Result<Self> {
        if !path.is_file() {
            return Err(Error::io(path, std::io::Error::new(std::io::ErrorKind::NotFound, "weights file not found")));
        }
        let file_paths = shards::weight_files(path)?;
        let mut files = Vec::with_capacity(file_paths.len());
        let mut holder = HashMap::new();
        for (i, file) in file_paths.iter().enumerate() {
            // SAFETY: the file is only read, as every safetensors reader does.
            let st = unsafe { MmapedSafetensors::new(file) }
                .map_err(|e| Error::BadFile { path: file.clone(), reason: format!("cannot read safetensors: {e}") })?;
            for (key, _) in st.tensors() {
                if let Some(first) = holder.insert(key.clone(), i) {
                    return Err(Error::BadFile {
                        path: file.clone(),
                        reason: format!("tensor `{key}` is also in {}", file_paths[first].display()),
                    });
                }
            }
            files.push(st);
        }
        Ok(Self { files, file_paths, holder, path: path.to_path_buf(), device: device.clone(), check: None })
    }

    /// Opens `path` for checking only (see the module doc): lookups never fail on a
    /// missing or mis-shaped tensor and load nothing; `checked` tells what they found.
    pub fn open_for_check(path: &Path) -> Result<Self> {
        let mut file = Self::open(path, &Device::Cpu)?;
        file.check = Some(RefCell::default());
        Ok(file)
    }

    /// For a file opened for checking: the tensors looked up, and every problem found.
    pub fn checked(&self) -> (usize, Vec<String>) {
        self.check.as_ref().map_or((0, Vec::new()), |c| {
            let c = c.borrow();
            (c.lookups, c.problems.clone())
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Every file the tensors are read from (the shards of an index).
    pub fn file_paths(&self) -> &[PathBuf] {
        &self.file_paths
    }

    pub fn keys(&self) -> Vec<String> {
        self.files.iter().flat_map(|f| f.tensors().into_iter().map(|(k, _)| k)).collect()
    }

    pub fn contains(&self, key: &str) -> bool {
        self.holder.contains_key(key)
    }

    fn view(&self, key: &str) -> Option<safetensors::tensor::TensorView<'_>> {
        self.files[*self.holder.get(key)?].get(key).ok()
    }

    /// An error about `key`, naming the file that holds it (the path given when none does).
    fn error(&self, key: &str, reason: impl Into<String>) -> Error {
        let path = self.holder.get(key).map_or(&self.path, |&i| &self.file_paths[i]);
        Error::ModelFile { path: path.clone(), key: key.to_string(), reason: reason.into() }
    }

    /// The first of `keys` present, as f32, checked against `shape`.
    pub fn get_any(&self, keys: &[&str], shape: &[usize]) -> Result<Tensor> {
        self.get_any_in(keys, shape, DType::F32)
    }

    /// `key` as `dtype`, converted from the stored dtype directly (a bf16 checkpoint
    /// read into bf16 is never widened on the way).
    pub fn get_in(&self, key: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.get_any_in(&[key], shape, dtype)
    }

    fn get_any_in(&self, keys: &[&str], shape: &[usize], dtype: DType) -> Result<Tensor> {
        if let Some(check) = &self.check {
            let mut check = check.borrow_mut();
            check.lookups += 1;
            match keys.iter().find_map(|k| Some((k, self.shape(k)?))) {
                None => check.problems.push(format!("missing tensor `{}` (expected shape {shape:?})", keys[0])),
                Some((key, found)) if found != shape => {
                    check.problems.push(format!("tensor `{key}` has shape {found:?}, expected {shape:?}"))
                }
                Some(_) => {}
            }
            // A stand-in of the right shape over a single element.
            return Ok(Tensor::zeros((), dtype, &Device::Cpu)?.broadcast_as(shape)?);
        }
        let key = keys
            .iter()
            .find(|k| self.contains(k))
            .ok_or_else(|| self.error(keys[0], format!("missing (expected shape {shape:?})")))?;
        let t = self.files[self.holder[*key]].load(key, &self.device).map_err(|e| self.error(key, e.to_string()))?;
        if t.dims() != shape {
            return Err(self.error(key, format!("shape {:?}, expected {shape:?}", t.dims())));
        }
        Ok(t.to_dtype(dtype)?)
    }

    pub fn get(&self, key: &str, shape: &[usize]) -> Result<Tensor> {
        self.get_any(&[key], shape)
    }

    /// The shape of `key` without loading it.
    pub fn shape(&self, key: &str) -> Option<Vec<usize>> {
        self.view(key).map(|v| v.shape().to_vec())
    }
}

/// Writes `tensors` as a safetensors file; a failure (a full disk) names the file
/// with the system's cause.
pub fn save_tensors(tensors: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    save_tensors_with_metadata(tensors, None, path)
}

/// As [`save_tensors`], with `metadata` in the header's `__metadata__` (where PyTorch
/// writers put `format: pt` and diffusers its `lora_adapter_metadata`).
pub fn save_tensors_with_metadata(
    tensors: &HashMap<String, Tensor>,
    metadata: Option<HashMap<String, String>>,
    path: &Path,
) -> Result<()> {
    write_safetensors(tensors.iter(), metadata, path)
}

/// Serialises any safetensors views (candle tensors, or byte views of another file)
/// to `path`, readable by others as a file `std::fs::write` makes: safetensors writes
/// a private temporary file (0600) and renames it into place.
pub fn write_safetensors<S, V>(
    tensors: impl IntoIterator<Item = (S, V)>,
    metadata: Option<HashMap<String, String>>,
    path: &Path,
) -> Result<()>
where
    S: AsRef<str> + Ord + std::fmt::Display,
    V: safetensors::View,
{
    // Written beside the target, its header made canonical, then renamed into place.
    let tmp = path.with_file_name(format!(".{}.writing", path.file_name().unwrap_or_default().to_string_lossy()));
    let written = safetensors::serialize_to_file(tensors, metadata, &tmp)
        .map_err(|e| match e {
            safetensors::SafeTensorError::IoError(cause) => Error::io(path, cause),
            e => Error::BadFile { path: path.to_path_buf(), reason: format!("cannot write: {e}") },
        })
        .and_then(|()| sort_header(&tmp))
        .and_then(|()| make_readable(&tmp))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Rewrites a safetensors header with its keys sorted, in place and at the same length:
/// safetensors writes `__metadata__` from a `HashMap`, whose order changes from one
/// map to the next, and the same adapter must be the same bytes.
fn sort_header(path: &Path) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let io = |e| Error::io(path, e);
    let mut file = std::fs::OpenOptions::new().read(true).write(true).open(path).map_err(io)?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(io)?;
    let mut header = vec![0u8; u64::from_le_bytes(len) as usize];
    file.read_exact(&mut header).map_err(io)?;
    let bad = |why: String| Error::BadFile { path: path.to_path_buf(), reason: why };
    let text = std::str::from_utf8(&header).map_err(|e| bad(format!("header is not UTF-8: {e}")))?;
    let value: serde_json::Value =
        serde_json::from_str(text.trim_end()).map_err(|e| bad(format!("header is not JSON: {e}")))?;
    let sorted = serde_json::to_string(&sorted_keys(value)).map_err(|e| bad(e.to_string()))?;
    if sorted.len() != text.trim_end().len() {
        return Err(bad("the sorted header changed length".into()));
    }
    file.seek(SeekFrom::Start(8)).map_err(io)?;
    file.write_all(sorted.as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)
}

fn sorted_keys(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let sorted: std::collections::BTreeMap<_, _> = map.into_iter().map(|(k, v)| (k, sorted_keys(v))).collect();
            serde_json::Value::Object(sorted.into_iter().collect())
        }
        other => other,
    }
}

/// The `__metadata__` of a safetensors file's header (empty when it has none), read
/// without the tensors; a header longer than the file or not JSON is named as such.
pub fn header_metadata(path: &Path) -> Result<HashMap<String, String>> {
    use std::io::Read;
    let io = |e| Error::io(path, e);
    let bad = |why: String| Error::BadFile { path: path.to_path_buf(), reason: why };
    if !path.is_file() {
        return Err(bad("not a file".into()));
    }
    let mut file = std::fs::File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|_| bad("too short for a safetensors header".into()))?;
    let len = u64::from_le_bytes(len);
    if len > size.saturating_sub(8) {
        return Err(bad(format!("header of {len} bytes in a file of {size}")));
    }
    let mut header = vec![0u8; len as usize];
    file.read_exact(&mut header).map_err(io)?;
    let value: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| bad(format!("header is not JSON: {e}")))?;
    match value.get("__metadata__") {
        None => Ok(HashMap::new()),
        Some(m) => serde_json::from_value(m.clone()).map_err(|e| bad(format!("__metadata__: {e}"))),
    }
}

/// Mode 0644 on Unix: the owner writes, everyone reads (elsewhere: unchanged).
pub fn make_readable(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).map_err(|e| Error::io(path, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_is_named_with_its_cause_once() {
        let t = HashMap::from([("x".to_string(), Tensor::zeros(1024, DType::F32, &Device::Cpu).unwrap())]);
        // A folder that does not exist fails the write as a full disk does: an OS error.
        // (The real full disk, a small tmpfs, is the CLI's test.)
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gone/x.safetensors");
        let err = save_tensors(&t, &path).unwrap_err();
        let text = anyhow_like(&err);
        println!("{text}");
        assert!(text.starts_with(&format!("{}: ", path.display())), "{text}");
        assert_eq!(text.matches("os error").count(), 1, "{text}");
    }

    /// Metadata goes into the header from a `HashMap`: its keys are sorted on the way,
    /// so the same tensors and metadata are the same bytes every time.
    #[test]
    fn the_same_tensors_and_metadata_are_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let t = HashMap::from([
            ("b".to_string(), Tensor::ones(3, DType::F32, &Device::Cpu).unwrap()),
            ("a".to_string(), Tensor::zeros(2, DType::F32, &Device::Cpu).unwrap()),
        ]);
        let metadata = || (0..8).map(|i| (format!("key{i}"), format!("value {i}"))).collect::<HashMap<_, _>>();
        let files: Vec<Vec<u8>> = (0..4)
            .map(|i| {
                let path = dir.path().join(format!("{i}.safetensors"));
                save_tensors_with_metadata(&t, Some(metadata()), &path).unwrap();
                std::fs::read(path).unwrap()
            })
            .collect();
        assert!(files.iter().all(|f| f == &files[0]), "four saves, one byte string");
        let (_, header) = safetensors::SafeTensors::read_metadata(&files[0]).unwrap();
        assert_eq!(header.metadata().as_ref().and_then(|m| m.get("key7")).map(String::as_str), Some("value 7"));
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left.len(), 4, "no temporary file left: {left:?}");
    }

    /// The error and its sources, joined as `anyhow`'s `{:#}` prints them.
    fn anyhow_like(e: &(dyn std::error::Error + 'static)) -> String {
        let mut parts = vec![e.to_string()];
        let mut source = e.source();
        while let Some(s) = source {
            parts.push(s.to_string());
            source = s.source();
        }
        parts.join(": ")
    }
}

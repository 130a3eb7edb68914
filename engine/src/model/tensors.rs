//! Named tensors from memory-mapped safetensors files, for the inference-only parts
//! of the real model (VAE encoder, Qwen3, condition encoder). Every lookup checks the
//! shape and names the file and key at fault; tensors come back as f32.

use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use crate::{Error, Result};

pub struct TensorFile {
    st: MmapedSafetensors,
    path: PathBuf,
    device: Device,
}

impl TensorFile {
    pub fn open(path: &Path, device: &Device) -> Result<Self> {
        if !path.is_file() {
            return Err(Error::io(
                path,
                std::io::Error::new(std::io::ErrorKind::NotFound, "weights file not found"),
            ));
        }
        // SAFETY: the file is only read, as every safetensors reader does.
        let st = unsafe { MmapedSafetensors::new(path) }.map_err(|e| Error::BadFile {
            path: path.to_path_buf(),
            reason: format!("cannot read safetensors: {e}"),
        })?;
        Ok(Self {
            st,
            path: path.to_path_buf(),
            device: device.clone(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn keys(&self) -> Vec<String> {
        self.st.tensors().into_iter().map(|(k, _)| k).collect()
    }

    pub fn contains(&self, key: &str) -> bool {
        self.st.get(key).is_ok()
    }

    fn error(&self, key: &str, reason: impl Into<String>) -> Error {
        Error::ModelFile {
            path: self.path.clone(),
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    /// The first of `keys` present, as f32, checked against `shape`.
    pub fn get_any(&self, keys: &[&str], shape: &[usize]) -> Result<Tensor> {
        let key = keys
            .iter()
            .find(|k| self.contains(k))
            .ok_or_else(|| self.error(keys[0], format!("missing (expected shape {shape:?})")))?;
        let t = self
            .st
            .load(key, &self.device)
            .map_err(|e| self.error(key, e.to_string()))?;
        if t.dims() != shape {
            return Err(self.error(key, format!("shape {:?}, expected {shape:?}", t.dims())));
        }
        Ok(t.to_dtype(DType::F32)?)
    }

    pub fn get(&self, key: &str, shape: &[usize]) -> Result<Tensor> {
        self.get_any(&[key], shape)
    }

    /// The shape of `key` without loading it.
    pub fn shape(&self, key: &str) -> Option<Vec<usize>> {
        self.st.get(key).ok().map(|v| v.shape().to_vec())
    }
}

/// Whether `keys` use diffusers' attention names (`to_q`, `norm_q`, `to_out.0`).
pub fn uses_diffusers_names(keys: &[String]) -> bool {
    keys.iter()
        .any(|k| k.contains(".to_q.") || k.contains(".norm_q."))
}

/// An original attention key (`self_attn.q_proj.weight`) in diffusers' naming.
pub fn diffusers_name(key: &str) -> String {
    key.replace(".q_proj.", ".to_q.")
        .replace(".k_proj.", ".to_k.")
        .replace(".v_proj.", ".to_v.")
        .replace(".o_proj.", ".to_out.0.")
        .replace(".q_norm.", ".norm_q.")
        .replace(".k_norm.", ".norm_k.")
}

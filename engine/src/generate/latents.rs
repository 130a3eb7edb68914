//! Latents on disk: what `generate --latents-out` writes and `decode` reads.

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::{Error, Result};

/// The latents `[T, C]` in a safetensors file: its `latents` tensor (what `generate
/// --latents-out` writes) or `target_latents` (a preprocessed sample).
pub fn read_latents(path: &Path, channels: usize) -> Result<Tensor> {
    let bad = |reason: String| Error::BadFile { path: path.to_path_buf(), reason };
    let tensors =
        candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| bad(format!("cannot read safetensors: {e}")))?;
    let (key, t) = ["latents", "target_latents"]
        .iter()
        .find_map(|k| tensors.get(*k).map(|t| (*k, t)))
        .ok_or_else(|| bad("no `latents` or `target_latents` tensor".into()))?;
    match t.dims() {
        &[frames, c] if c == channels && frames > 0 => {}
        d => return Err(bad(format!("`{key}` has shape {d:?}, expected [frames, {channels}]"))),
    }
    match crate::finite::problem(t)? {
        None => Ok(t.to_dtype(DType::F32)?),
        Some(problem) => Err(bad(format!("`{key}`: {problem}"))),
    }
}

/// Writes latents `[T, C]` as a safetensors file with one `latents` tensor, atomically.
pub fn write_latents(path: &Path, latents: &Tensor) -> Result<()> {
    let t = latents.to_dtype(DType::F32)?.to_device(&Device::Cpu)?.contiguous()?;
    let bytes = safetensors::serialize([("latents", &t)], None).map_err(|e| Error::BadFile {
        path: path.to_path_buf(),
        reason: format!("cannot serialise the latents: {e}"),
    })?;
    crate::atomic::write_atomically(path, &bytes)
}

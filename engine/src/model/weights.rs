//! Decoder weights: loading from memory-mapped safetensors files, key naming
//! (original ACE-Step checkpoint names or diffusers names, detected), and checking
//! every tensor's presence and shape against the config.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use super::DitConfig;
use crate::{Error, Result};

/// The DiT's weights under their original names without the `decoder.` prefix
/// (`layers.0.self_attn.q_proj.weight`, `proj_in.1.weight`, ...).
pub struct DecoderWeights {
    tensors: HashMap<String, Tensor>,
}

/// Every tensor the DiT needs, with its shape, in the original naming.
pub fn expected_shapes(cfg: &DitConfig) -> BTreeMap<String, Vec<usize>> {
    let h = cfg.hidden_size;
    let (q_out, kv_out) = (
        cfg.num_attention_heads * cfg.head_dim,
        cfg.num_key_value_heads * cfg.head_dim,
    );
    let mut s = BTreeMap::new();
    let mut put = |k: String, shape: &[usize]| {
        s.insert(k, shape.to_vec());
    };
    put("proj_in.1.weight".into(), &[h, cfg.in_channels, cfg.patch_size]);
    put("proj_in.1.bias".into(), &[h]);
    put("proj_out.1.weight".into(), &[h, cfg.audio_acoustic_hidden_dim, cfg.patch_size]);
    put("proj_out.1.bias".into(), &[cfg.audio_acoustic_hidden_dim]);
    put("condition_embedder.weight".into(), &[h, cfg.encoder_hidden_size]);
    put("condition_embedder.bias".into(), &[h]);
    put("scale_shift_table".into(), &[1, 2, h]);
    put("norm_out.weight".into(), &[h]);
    for t in ["time_embed", "time_embed_r"] {
        put(format!("{t}.linear_1.weight"), &[h, super::TIMESTEP_CHANNELS]);
        put(format!("{t}.linear_1.bias"), &[h]);
        put(format!("{t}.linear_2.weight"), &[h, h]);
        put(format!("{t}.linear_2.bias"), &[h]);
        put(format!("{t}.time_proj.weight"), &[6 * h, h]);
        put(format!("{t}.time_proj.bias"), &[6 * h]);
    }
    for i in 0..cfg.num_hidden_layers {
        let l = format!("layers.{i}");
        for attn in ["self_attn", "cross_attn"] {
            put(format!("{l}.{attn}.q_proj.weight"), &[q_out, h]);
            put(format!("{l}.{attn}.k_proj.weight"), &[kv_out, h]);
            put(format!("{l}.{attn}.v_proj.weight"), &[kv_out, h]);
            put(format!("{l}.{attn}.o_proj.weight"), &[h, q_out]);
            put(format!("{l}.{attn}.q_norm.weight"), &[cfg.head_dim]);
            put(format!("{l}.{attn}.k_norm.weight"), &[cfg.head_dim]);
            put(format!("{l}.{attn}_norm.weight"), &[h]);
        }
        put(format!("{l}.mlp_norm.weight"), &[h]);
        put(format!("{l}.mlp.gate_proj.weight"), &[cfg.intermediate_size, h]);
        put(format!("{l}.mlp.up_proj.weight"), &[cfg.intermediate_size, h]);
        put(format!("{l}.mlp.down_proj.weight"), &[h, cfg.intermediate_size]);
        put(format!("{l}.scale_shift_table"), &[1, 6, h]);
    }
    s
}

/// diffusers' `AceStepTransformer1DModel` names -> the original checkpoint's.
fn from_diffusers_name(key: &str) -> String {
    let key = if let Some(rest) = key.strip_prefix("proj_in_conv.") {
        format!("proj_in.1.{rest}")
    } else if let Some(rest) = key.strip_prefix("proj_out_conv.") {
        format!("proj_out.1.{rest}")
    } else {
        key.to_string()
    };
    key.replace(".to_out.0.", ".o_proj.")
        .replace(".to_q.", ".q_proj.")
        .replace(".to_k.", ".k_proj.")
        .replace(".to_v.", ".v_proj.")
        .replace(".norm_q.", ".q_norm.")
        .replace(".norm_k.", ".k_norm.")
}

fn is_diffusers_naming(keys: &[&str]) -> bool {
    keys.iter()
        .any(|k| k.starts_with("proj_in_conv.") || k.contains(".to_q.") || k.contains(".norm_q."))
}

impl DecoderWeights {
    /// Loads the decoder from one or more safetensors files, memory-mapped.
    ///
    /// When any key carries the `decoder.` prefix (ACE-Step's full `model.safetensors`,
    /// which also holds the condition encoder and tokenizer parts), only those keys are
    /// the DiT's; otherwise every key must be one. Tensors are converted to `dtype`.
    pub fn load(paths: &[&Path], cfg: &DitConfig, dtype: DType, device: &Device) -> Result<Self> {
        for p in paths {
            if !p.is_file() {
                return Err(Error::io(
                    *p,
                    std::io::Error::new(std::io::ErrorKind::NotFound, "weights file not found"),
                ));
            }
        }
        // SAFETY: the files are only read; a file changed on disk while mapped is the
        // caller's problem exactly as with any reader of safetensors checkpoints.
        let st = unsafe { MmapedSafetensors::multi(paths) }.map_err(|e| Error::BadFile {
            path: paths.first().map(|p| p.to_path_buf()).unwrap_or_default(),
            reason: format!("cannot read safetensors: {e}"),
        })?;
        let views = st.tensors();
        let all: Vec<&str> = views.iter().map(|(k, _)| k.as_str()).collect();
        let prefixed = all.iter().any(|k| k.starts_with("decoder."));
        let own: Vec<&str> = if prefixed {
            all.iter().filter_map(|k| k.strip_prefix("decoder.")).collect()
        } else {
            all.clone()
        };
        let diffusers = is_diffusers_naming(&own);
        let mut found: HashMap<String, (String, Vec<usize>)> = HashMap::new();
        for (file_key, view) in &views {
            let Some(own_key) = (if prefixed { file_key.strip_prefix("decoder.") } else { Some(file_key.as_str()) }) else {
                continue;
            };
            let name = if diffusers { from_diffusers_name(own_key) } else { own_key.to_string() };
            found.insert(name, (file_key.clone(), view.shape().to_vec()));
        }

        let expected = expected_shapes(cfg);
        let unexpected: Vec<String> = found
            .iter()
            .filter(|(name, _)| !expected.contains_key(*name))
            .map(|(_, (file_key, _))| file_key.clone())
            .collect();
        if !unexpected.is_empty() {
            let mut unexpected = unexpected;
            unexpected.sort();
            return Err(Error::UnexpectedTensors(unexpected));
        }
        let mut tensors = HashMap::with_capacity(expected.len());
        for (name, shape) in &expected {
            let (file_key, found_shape) = found.get(name).ok_or_else(|| Error::MissingTensor {
                key: name.clone(),
                expected: shape.clone(),
            })?;
            if found_shape != shape {
                return Err(Error::ShapeMismatch {
                    key: file_key.clone(),
                    expected: shape.clone(),
                    found: found_shape.clone(),
                });
            }
            let t = st.load(file_key, device)?.to_dtype(dtype)?;
            // The tensor now owns a copy: drop the mapped pages it was read from, so the
            // peak stays near one copy of the file rather than two.
            if let Ok(view) = st.get(file_key) {
                release_pages(view.data());
            }
            tensors.insert(name.clone(), t);
        }
        Ok(Self { tensors })
    }

    /// Wraps tensors already in memory (the demo model, tests), checking them likewise.
    pub fn from_tensors(tensors: HashMap<String, Tensor>, cfg: &DitConfig) -> Result<Self> {
        let expected = expected_shapes(cfg);
        for (name, shape) in &expected {
            let t = tensors.get(name).ok_or_else(|| Error::MissingTensor {
                key: name.clone(),
                expected: shape.clone(),
            })?;
            if t.dims() != shape.as_slice() {
                return Err(Error::ShapeMismatch {
                    key: name.clone(),
                    expected: shape.clone(),
                    found: t.dims().to_vec(),
                });
            }
        }
        let mut extra: Vec<String> = tensors.keys().filter(|k| !expected.contains_key(*k)).cloned().collect();
        if !extra.is_empty() {
            extra.sort();
            return Err(Error::UnexpectedTensors(extra));
        }
        Ok(Self { tensors })
    }

    /// The tensor under its original name (without `decoder.`); shapes were checked at load.
    pub fn get(&self, name: &str) -> Result<Tensor> {
        self.tensors.get(name).cloned().ok_or_else(|| Error::MissingTensor {
            key: name.to_string(),
            expected: vec![],
        })
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Tensor)> {
        self.tensors.iter()
    }
}

/// Tells the kernel the mapped pages under `data` are not needed any more. The mapping
/// is a read-only file mapping, so the pages are clean: a later access reads them
/// from the file again. Pages shared with a neighbouring tensor are simply re-read.
fn release_pages(data: &[u8]) {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
        let start = data.as_ptr() as usize / page * page;
        let end = (data.as_ptr() as usize + data.len()).div_ceil(page) * page;
        if end > start {
            // SAFETY: the range lies within the live read-only mapping `data` points into
            // (rounded to its pages); MADV_DONTNEED on clean file pages only drops them.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
            }
        }
    }
    #[cfg(not(unix))]
    let _ = data;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffusers_names_map_to_original() {
        assert_eq!(from_diffusers_name("proj_in_conv.weight"), "proj_in.1.weight");
        assert_eq!(from_diffusers_name("proj_out_conv.bias"), "proj_out.1.bias");
        assert_eq!(
            from_diffusers_name("layers.3.cross_attn.to_out.0.weight"),
            "layers.3.cross_attn.o_proj.weight"
        );
        assert_eq!(
            from_diffusers_name("layers.0.self_attn.norm_k.weight"),
            "layers.0.self_attn.k_norm.weight"
        );
        assert_eq!(from_diffusers_name("layers.0.mlp.up_proj.weight"), "layers.0.mlp.up_proj.weight");
    }
}

//! Decoder weights: loading from memory-mapped safetensors files, key naming
//! (original ACE-Step checkpoint names or diffusers names, detected), and checking
//! every tensor's presence and shape against the config.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use super::DitConfig;
use crate::tensor_io::shards::weight_files;
use crate::{Error, Result};

/// The DiT's weights under their original names without the `decoder.` prefix
/// (`layers.0.self_attn.q_proj.weight`, `proj_in.1.weight`, ...).
pub struct DecoderWeights {
    tensors: HashMap<String, Tensor>,
}

/// Every tensor the DiT needs, with its shape, in the original naming.
pub fn expected_shapes(cfg: &DitConfig) -> BTreeMap<String, Vec<usize>> {
    let h = cfg.hidden_size;
    let (q_out, kv_out) = (cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim);
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

/// The `(module, in, out)` of every linear module of the DiT's layers (the modules a
/// LoRA can adapt), named as in the checkpoint (`layers.0.self_attn.q_proj`).
pub fn layer_linears(cfg: &DitConfig) -> Vec<(String, usize, usize)> {
    expected_shapes(cfg)
        .into_iter()
        .filter(|(k, s)| k.starts_with("layers.") && s.len() == 2)
        .filter_map(|(k, s)| Some((k.strip_suffix(".weight")?.to_string(), s[1], s[0])))
        .collect()
}

/// Matches a weights file's header (key, shape) to the DiT `cfg` describes: original
/// name -> the key in the file, and every tensor missing, mis-shaped or unexpected.
/// When any key carries the `decoder.` prefix (ACE-Step's full `model.safetensors`,
/// which also holds the condition encoder and tokenizer parts), only those keys are
/// the DiT's; otherwise every key must be one.
pub fn match_header(header: &[(String, Vec<usize>)], cfg: &DitConfig) -> (HashMap<String, String>, Vec<String>) {
    let prefixed = header.iter().any(|(k, _)| k.starts_with("decoder."));
    let own: Vec<(&str, &str, &[usize])> = header
        .iter()
        .filter_map(|(k, shape)| {
            let own = if prefixed { k.strip_prefix("decoder.")? } else { k.as_str() };
            Some((k.as_str(), own, shape.as_slice()))
        })
        .collect();
    let diffusers = is_diffusers_naming(&own.iter().map(|(_, o, _)| *o).collect::<Vec<_>>());
    let expected = expected_shapes(cfg);
    let (mut names, mut problems, mut unexpected) = (HashMap::new(), Vec::new(), Vec::new());
    for (file_key, own_key, shape) in own {
        let name = if diffusers { from_diffusers_name(own_key) } else { own_key.to_string() };
        match expected.get(&name) {
            None => unexpected.push(file_key.to_string()),
            Some(want) if want.as_slice() != shape => {
                problems.push(format!("tensor `{file_key}` has shape {shape:?}, expected {want:?}"))
            }
            Some(_) => {}
        }
        names.insert(name, file_key.to_string());
    }
    let prefix = if prefixed { "decoder." } else { "" };
    for (name, shape) in &expected {
        if !names.contains_key(name) {
            problems.push(format!("missing tensor `{prefix}{name}` (expected shape {shape:?})"));
        }
    }
    if !unexpected.is_empty() {
        unexpected.sort();
        problems.push(format!("tensors not used by the DiT: {}", unexpected.join(", ")));
    }
    (names, problems)
}

/// Whether `keys` use diffusers' attention names (`to_q`, `norm_q`, `to_out.0`).
pub fn uses_diffusers_names(keys: &[String]) -> bool {
    keys.iter().any(|k| k.contains(".to_q.") || k.contains(".norm_q."))
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
    keys.iter().any(|k| k.starts_with("proj_in_conv.") || k.contains(".to_q.") || k.contains(".norm_q."))
}

impl DecoderWeights {
    /// Loads the decoder from one or more safetensors files, memory-mapped, after
    /// checking every tensor (`match_header`); tensors are converted to `dtype`.
    pub fn load(paths: &[&Path], cfg: &DitConfig, dtype: DType, device: &Device) -> Result<Self> {
        for p in paths {
            if !p.is_file() {
                return Err(Error::io(*p, std::io::Error::new(std::io::ErrorKind::NotFound, "weights file not found")));
            }
        }
        // A sharded model's index stands for its shards.
        let files: Vec<PathBuf> =
            paths.iter().map(|p| weight_files(p)).collect::<Result<Vec<_>>>()?.into_iter().flatten().collect();
        // SAFETY: the files are only read; a file changed on disk while mapped is the
        // caller's problem exactly as with any reader of safetensors checkpoints.
        let st = unsafe { MmapedSafetensors::multi(&files) }.map_err(|e| Error::BadFile {
            path: paths.first().map(|p| p.to_path_buf()).unwrap_or_default(),
            reason: format!("cannot read safetensors: {e}"),
        })?;
        let header: Vec<(String, Vec<usize>)> =
            st.tensors().into_iter().map(|(k, v)| (k, v.shape().to_vec())).collect();
        let (names, problems) = match_header(&header, cfg);
        if !problems.is_empty() {
            return Err(Error::Weights {
                path: paths.first().map(|p| p.to_path_buf()).unwrap_or_default(),
                config: None,
                problems,
            });
        }
        let expected = expected_shapes(cfg);
        let mut tensors = HashMap::with_capacity(expected.len());
        for name in expected.keys() {
            let file_key = &names[name];
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
            let t =
                tensors.get(name).ok_or_else(|| Error::MissingTensor { key: name.clone(), expected: shape.clone() })?;
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
        self.tensors.get(name).cloned().ok_or_else(|| Error::MissingTensor { key: name.to_string(), expected: vec![] })
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
        assert_eq!(from_diffusers_name("layers.3.cross_attn.to_out.0.weight"), "layers.3.cross_attn.o_proj.weight");
        assert_eq!(from_diffusers_name("layers.0.self_attn.norm_k.weight"), "layers.0.self_attn.k_norm.weight");
        assert_eq!(from_diffusers_name("layers.0.mlp.up_proj.weight"), "layers.0.mlp.up_proj.weight");
    }
}

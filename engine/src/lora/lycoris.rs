//! LoKr's file as upstream ACE-Step writes it (`lokr_weights.safetensors`): LyCORIS's
//! keys relative to the decoder (`lycoris_layers_0_cross_attn_k_proj.lokr_w1`, `.alpha`,
//! `.dora_scale`) and the header its loader reads: `algo`, `format` and `lokr_config`
//! (upstream's `LoKRConfig.to_dict()`).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use super::lokr::{lycoris_name, Layout};
use super::{AdapterKind, LoraAdapter, LoraConfig};
use crate::model::DitModel;
use crate::tensor_io::{header_metadata, save_tensors_with_metadata};
use crate::{Error, Result};

pub const WEIGHTS_FILE: &str = "lokr_weights.safetensors";

/// Writes `dir/lokr_weights.safetensors`.
pub fn save(adapter: &LoraAdapter, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for (key, t) in adapter.named_tensors() {
        let (module, param) = split_key(&key);
        tensors.insert(format!("{}.{param}", lycoris_name(module)), t);
    }
    for (module, (inp, out)) in adapter.module_features() {
        let alpha = Layout::of(&adapter.config, inp, out).alpha(&adapter.config) as f32;
        tensors.insert(format!("{}.alpha", lycoris_name(&module)), Tensor::new(alpha, &Device::Cpu)?);
    }
    let c = &adapter.config;
    let lokr_config = serde_json::json!({
        "linear_dim": c.r,
        "linear_alpha": c.alpha,
        "factor": c.factor,
        "decompose_both": c.decompose_both,
        "use_tucker": false,
        "use_scalar": false,
        "weight_decompose": c.use_dora,
        "target_modules": c.target_modules,
        "full_matrix": false,
        "bypass_mode": false,
        "rs_lora": false,
        "unbalanced_factorization": false,
    });
    let metadata = HashMap::from([
        ("algo".to_string(), "lokr".to_string()),
        ("format".to_string(), "lycoris".to_string()),
        ("lokr_config".to_string(), lokr_config.to_string()),
    ]);
    save_tensors_with_metadata(&tensors, Some(metadata), &dir.join(WEIGHTS_FILE))
}

/// Reads `dir/lokr_weights.safetensors`, its settings from the header's `lokr_config`.
pub fn load(dir: &Path, model: &DitModel) -> Result<LoraAdapter> {
    let path = dir.join(WEIGHTS_FILE);
    let bad = |reason: String| Error::Adapter { path: path.clone(), reason };
    let header = header_metadata(&path)?;
    if let Some(algo) = header.get("algo").filter(|a| *a != "lokr") {
        return Err(bad(format!("algo is `{algo}`; only LoKr (`lokr`) is read")));
    }
    let text = header.get("lokr_config").ok_or_else(|| bad("no `lokr_config` in the header".into()))?;
    let config = config_from_json(text).map_err(|why| bad(format!("lokr_config: {why}")))?;
    let raw = candle_core::safetensors::load(&path, &Device::Cpu)
        .map_err(|e| bad(format!("cannot read safetensors: {e}")))?;
    let modules: HashMap<String, (String, (usize, usize))> = model
        .adaptable_linears()
        .into_iter()
        .filter_map(|(name, w)| w.dims2().ok().map(|(out, inp)| (lycoris_name(&name), (name, (inp, out)))))
        .collect();
    let mut tensors = HashMap::new();
    for (key, t) in raw {
        let (prefix, param) = split_key(&key);
        let Some((module, (inp, out))) = modules.get(prefix) else {
            return Err(bad(format!("tensor `{key}` names no linear layer of this model")));
        };
        if param != "alpha" {
            tensors.insert(format!("{module}.{param}"), t);
            continue;
        }
        let expected = Layout::of(&config, *inp, *out).alpha(&config);
        let found = t.to_dtype(candle_core::DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
        if found.len() != 1 || (found[0] - expected).abs() > 1e-6 * expected.abs().max(1.0) {
            return Err(bad(format!("tensor `{key}` is {found:?}; lokr_config's linear_alpha gives {expected}")));
        }
    }
    LoraAdapter::from_tensors(config, model, &tensors, &path)
}

/// `layers.0.self_attn.q_proj.lokr_w1` -> (`layers.0.self_attn.q_proj`, `lokr_w1`).
fn split_key(key: &str) -> (&str, &str) {
    key.rsplit_once('.').unwrap_or((key, ""))
}

fn config_from_json(text: &str) -> std::result::Result<LoraConfig, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let get = |field: &str| v.get(field).ok_or_else(|| format!("missing `{field}`"));
    let flag = |field: &str| v.get(field).and_then(|f| f.as_bool()).unwrap_or(false);
    for unsupported in ["use_tucker", "use_scalar", "full_matrix", "rs_lora", "unbalanced_factorization"] {
        if flag(unsupported) {
            return Err(format!("`{unsupported}` is not supported"));
        }
    }
    let number = |field: &str| get(field)?.as_f64().ok_or_else(|| format!("`{field}` must be a number"));
    let target_modules = get("target_modules")?
        .as_array()
        .and_then(|items| items.iter().map(|t| t.as_str().map(String::from)).collect::<Option<Vec<_>>>())
        .ok_or("`target_modules` must be a list of names")?;
    let r = get("linear_dim")?.as_u64().ok_or("`linear_dim` must be a whole number")? as usize;
    Ok(LoraConfig {
        kind: AdapterKind::Lokr,
        r,
        alpha: number("linear_alpha")?,
        dropout: 0.0,
        target_modules,
        use_rslora: false,
        use_dora: flag("weight_decompose"),
        factor: get("factor")?.as_i64().ok_or("`factor` must be a whole number")?,
        decompose_both: flag("decompose_both"),
    })
}

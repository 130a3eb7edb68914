//! LoKr's file as upstream ACE-Step writes it (`lokr_weights.safetensors`): LyCORIS's
//! keys relative to the decoder (`lycoris_layers_0_cross_attn_k_proj.lokr_w1`, `.alpha`,
//! `.dora_scale`) and the header its loader reads: `algo`, `format` and `lokr_config`
//! (upstream's `LoKRConfig.to_dict()`).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{Device, Tensor};

use super::lokr::{lycoris_name, Layout};
use super::{trigger, AdapterKind, AdapterSummary, LoraAdapter, LoraConfig};
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
    let mut metadata = HashMap::from([
        ("algo".to_string(), "lokr".to_string()),
        ("format".to_string(), "lycoris".to_string()),
        ("lokr_config".to_string(), lokr_config.to_string()),
    ]);
    metadata.extend(trigger::fields(adapter.trigger.as_ref()).into_iter().map(|(k, v)| (k.to_string(), v)));
    save_tensors_with_metadata(&tensors, Some(metadata), &dir.join(WEIGHTS_FILE))
}

/// Reads `dir/lokr_weights.safetensors`, its settings from the header's `lokr_config`.
pub fn load(dir: &Path, model: &DitModel) -> Result<LoraAdapter> {
    let path = dir.join(WEIGHTS_FILE);
    let bad = |reason: String| Error::Adapter { path: path.clone(), reason };
    let AdapterSummary { config, trigger } = describe(dir)?;
    let raw = candle_core::safetensors::load(&path, &Device::Cpu)
        .map_err(|e| bad(format!("cannot read safetensors: {e}")))?;
    let modules: HashMap<String, (String, (usize, usize))> = model
        .adaptable_linears()
        .into_iter()
        .filter_map(|(name, w)| w.dims2().ok().map(|(out, inp)| (lycoris_name(&name), (name, (inp, out)))))
        .collect();
    let mut by_module: BTreeMap<String, Vec<(String, Tensor)>> = BTreeMap::new();
    for (key, t) in raw {
        let (prefix, param) = split_key(&key);
        by_module.entry(prefix.to_string()).or_default().push((param.to_string(), t));
    }
    let mut tensors = HashMap::new();
    for (prefix, params) in by_module {
        let Some((module, (inp, out))) = modules.get(&prefix).filter(|(name, _)| config.targets(name)) else {
            // Upstream's LyCORIS call wraps every linear layer and convolution of the
            // decoder and trains only the targets: the others are saved as made, a zero
            // change, and are passed over. One that changes anything is refused.
            if changes_nothing(&params)? {
                continue;
            }
            return Err(bad(format!(
                "`{prefix}` changes a layer this model does not adapt with targets {:?}",
                config.target_modules
            )));
        };
        for (param, t) in params {
            if param != "alpha" {
                tensors.insert(format!("{module}.{param}"), t);
                continue;
            }
            let expected = Layout::of(&config, *inp, *out).alpha(&config);
            let found = t.to_dtype(candle_core::DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
            if found.len() != 1 || (found[0] - expected).abs() > 1e-6 * expected.abs().max(1.0) {
                return Err(bad(format!(
                    "tensor `{prefix}.alpha` is {found:?}; lokr_config's linear_alpha gives {expected}"
                )));
            }
        }
    }
    Ok(LoraAdapter::from_tensors(config, model, &tensors, &path)?.with_trigger(trigger))
}

/// The settings and trigger word of `dir/lokr_weights.safetensors`, from its header.
pub fn describe(dir: &Path) -> Result<AdapterSummary> {
    let path = dir.join(WEIGHTS_FILE);
    let bad = |reason: String| Error::Adapter { path: path.clone(), reason };
    let header = header_metadata(&path)?;
    if let Some(algo) = header.get("algo").filter(|a| *a != "lokr") {
        return Err(bad(format!("algo is `{algo}`; only LoKr (`lokr`) is read")));
    }
    let text = header.get("lokr_config").ok_or_else(|| bad("no `lokr_config` in the header".into()))?;
    let config = config_from_json(text).map_err(|why| bad(format!("lokr_config: {why}")))?;
    let field = |key: &str| header.get(key).map(String::as_str);
    let trigger = trigger::read(field(trigger::WORD_KEY), field(trigger::POSITION_KEY), &path)?;
    Ok(AdapterSummary { config, trigger })
}

/// Whether a module's LoKr tensors make no change: its `w2` (or `w2`'s up factor) or
/// `w1` all zero, as LyCORIS makes a module it never trains.
fn changes_nothing(params: &[(String, Tensor)]) -> Result<bool> {
    for (param, t) in params {
        if ["lokr_w1", "lokr_w2", "lokr_w2_b"].contains(&param.as_str())
            && t.abs()?.flatten_all()?.max(0)?.to_dtype(candle_core::DType::F32)?.to_scalar::<f32>()? == 0.0
        {
            return Ok(true);
        }
    }
    Ok(false)
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;

    /// An upstream file holds a module for every linear layer and convolution of the
    /// decoder, the untrained ones a zero change: read, they are passed over; a module
    /// that changes a layer the settings do not adapt is refused, named.
    #[test]
    fn upstreams_untrained_modules_are_passed_over_and_a_trained_stray_is_refused() {
        let (cfg, weights) = crate::load::source::ModelSource::Demo.load_decoder(DType::F32, &Device::Cpu).unwrap();
        let model = DitModel::new(&cfg, &weights).unwrap();
        let config = LoraConfig { kind: AdapterKind::Lokr, r: 4, alpha: 8.0, dropout: 0.0, ..Default::default() };
        let fresh = LoraAdapter::new(config.clone(), &model, 1).unwrap();
        let trained: HashMap<String, Tensor> =
            fresh.named_tensors().into_iter().map(|(k, t)| (k, t.randn_like(0.0, 0.1).unwrap())).collect();
        let adapter = LoraAdapter::from_tensors(config, &model, &trained, Path::new("test")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        save(&adapter, dir.path()).unwrap();
        let path = dir.path().join(WEIGHTS_FILE);
        let header = header_metadata(&path).unwrap();
        let mut file = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
        let ones = |shape: &[usize]| Tensor::ones(shape, DType::F32, &Device::Cpu).unwrap();
        let zeros = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &Device::Cpu).unwrap();
        // An MLP projection and the patch convolution, as upstream's call wraps them.
        for (module, w2) in
            [("lycoris_layers_0_mlp_up_proj", zeros(&[16, 32])), ("lycoris_proj_in_1", zeros(&[16, 12, 2]))]
        {
            file.insert(format!("{module}.lokr_w1"), ones(&[16, 16]));
            file.insert(format!("{module}.lokr_w2"), w2);
            file.insert(format!("{module}.alpha"), Tensor::new(4f32, &Device::Cpu).unwrap());
        }
        crate::tensor_io::save_tensors_with_metadata(&file, Some(header.clone()), &path).unwrap();
        let back = load(dir.path(), &model).unwrap();
        assert_eq!(back.module_names().count(), adapter.module_names().count());

        file.insert("lycoris_layers_0_mlp_up_proj.lokr_w2".into(), ones(&[16, 32]));
        crate::tensor_io::save_tensors_with_metadata(&file, Some(header), &path).unwrap();
        let err = load(dir.path(), &model).err().expect("a trained module outside the targets").to_string();
        assert!(err.contains("`lycoris_layers_0_mlp_up_proj` changes a layer this model does not adapt"), "{err}");
    }
}

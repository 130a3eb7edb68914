//! PEFT's adapter directory (`adapter_config.json` + `adapter_model.safetensors`), as
//! ACE-Step's `PeftModel.from_pretrained(decoder, dir)` and diffusers load it, for LoRA
//! and DoRA (`use_dora`: the magnitude saved as `<module>.lora_magnitude_vector`).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{Device, Tensor};

use super::{trigger, AdapterKind, AdapterSummary, LoraAdapter, LoraConfig};
use crate::model::weights::diffusers_name;
use crate::model::DitModel;
use crate::tensor_io::save_tensors_with_metadata;
use crate::{Error, Result};

/// PEFT's key prefix for a model wrapped by `get_peft_model` (ACE-Step's decoder).
const PEFT_PREFIX: &str = "base_model.model.";
/// The header key diffusers reads its LoRA config from, and the prefix of its keys
/// (diffusers' `LORA_ADAPTER_METADATA_KEY` and the ACE-Step pipeline's `transformer_name`).
pub const LORA_METADATA_KEY: &str = "lora_adapter_metadata";
const DIFFUSERS_PREFIX: &str = "transformer";
pub const CONFIG_FILE: &str = "adapter_config.json";
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// Reads a PEFT adapter directory.
pub fn load(dir: &Path, model: &DitModel) -> Result<LoraAdapter> {
    let AdapterSummary { config, trigger } = describe(dir)?;
    let weights_path = dir.join(WEIGHTS_FILE);
    if !weights_path.is_file() {
        return Err(Error::Adapter { path: weights_path, reason: "file not found".into() });
    }
    let raw = candle_core::safetensors::load(&weights_path, &Device::Cpu)
        .map_err(|e| Error::Adapter { path: weights_path.clone(), reason: format!("cannot read safetensors: {e}") })?;
    let tensors = raw.into_iter().map(|(k, t)| (k.strip_prefix(PEFT_PREFIX).unwrap_or(&k).to_string(), t)).collect();
    Ok(LoraAdapter::from_tensors(config, model, &tensors, &weights_path)?.with_trigger(trigger))
}

/// The settings and trigger word of the PEFT directory `dir`, from its config.
pub fn describe(dir: &Path) -> Result<AdapterSummary> {
    let path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Adapter { path: path.clone(), reason: format!("invalid JSON: {e}") })?;
    Ok(AdapterSummary { config: config_from_json(&v, &path)?, trigger: trigger::from_json(&v, &path)? })
}

/// Writes a PEFT adapter directory that ACE-Step, diffusers and PEFT load.
pub fn save(adapter: &LoraAdapter, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let config_path = dir.join(CONFIG_FILE);
    let json = serde_json::to_string_pretty(&config_json(adapter)).expect("config serialises");
    std::fs::write(&config_path, json).map_err(|e| Error::io(&config_path, e))?;
    let tensors: HashMap<String, Tensor> =
        adapter.named_tensors().into_iter().map(|(k, t)| (format!("{PEFT_PREFIX}{k}"), t)).collect();
    save_tensors_with_metadata(&tensors, Some(header_metadata(adapter)), &dir.join(WEIGHTS_FILE))
}

/// The safetensors header PEFT and diffusers write: `format: pt`, and diffusers'
/// `lora_adapter_metadata` (its ACE-Step loader takes alpha, rank, rsLoRA and DoRA only
/// from there and otherwise applies the adapter at alpha = r): the LoRA config
/// under `transformer.`-prefixed keys with diffusers' module names, as JSON with
/// sorted keys and two-space indent, as `json.dumps(.., indent=2, sort_keys=True)`.
/// Its dropout is 0: diffusers injects the LoRA layers in training mode into a
/// model the user already put in eval mode, so a dropout there would run at
/// inference (two identical forwards differ, and neither matches the merged weights).
/// The trigger word goes beside them, under its own keys.
fn header_metadata(adapter: &LoraAdapter) -> HashMap<String, String> {
    let c = &adapter.config;
    let mut targets: Vec<String> = c.target_modules.iter().map(|t| diffusers_target(t)).collect();
    targets.sort();
    let fields = [
        ("alpha_pattern", serde_json::json!({})),
        ("bias", "none".into()),
        ("fan_in_fan_out", false.into()),
        ("init_lora_weights", true.into()),
        ("lora_alpha", c.alpha.into()),
        ("lora_dropout", 0.0.into()),
        ("peft_type", "LORA".into()),
        ("r", c.r.into()),
        ("rank_pattern", serde_json::json!({})),
        ("target_modules", targets.into()),
        ("use_dora", c.use_dora.into()),
        ("use_rslora", c.use_rslora.into()),
    ];
    let packed: BTreeMap<String, serde_json::Value> =
        fields.into_iter().map(|(k, v)| (format!("{DIFFUSERS_PREFIX}.{k}"), v)).collect();
    let json = serde_json::to_string_pretty(&packed).expect("metadata serialises");
    let mut header = HashMap::from([("format".to_string(), "pt".to_string()), (LORA_METADATA_KEY.to_string(), json)]);
    header.extend(trigger::fields(adapter.trigger.as_ref()).into_iter().map(|(k, v)| (k.to_string(), v)));
    header
}

fn config_json(adapter: &LoraAdapter) -> serde_json::Value {
    let c = &adapter.config;
    let mut json = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "FEATURE_EXTRACTION",
        "r": c.r,
        "lora_alpha": c.alpha,
        // The training setting stays here: PEFT loads it with `inference_mode`
        // (dropout off), ACE-Step and PEFT users who train on keep it, and
        // `load` reads it back.
        "lora_dropout": c.dropout,
        "target_modules": c.target_modules,
        "bias": "none",
        "use_rslora": c.use_rslora,
        "use_dora": c.use_dora,
        "fan_in_fan_out": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "modules_to_save": null,
        "base_model_name_or_path": null,
        "rank_pattern": {},
        "alpha_pattern": {},
    });
    for (key, value) in trigger::fields(adapter.trigger.as_ref()) {
        json[key] = value.into();
    }
    json
}

/// A target-module suffix under diffusers' names (`q_proj` -> `to_q`, `self_attn.o_proj`
/// -> `self_attn.to_out.0`); names diffusers shares (`mlp.up_proj`) stay as they are.
fn diffusers_target(target: &str) -> String {
    diffusers_name(&format!(".{target}.")).trim_matches('.').to_string()
}

fn config_from_json(v: &serde_json::Value, path: &Path) -> Result<LoraConfig> {
    let bad = |reason: String| Error::Adapter { path: path.to_path_buf(), reason };
    if v["peft_type"].as_str() != Some("LORA") {
        return Err(bad(format!("peft_type is {}, expected \"LORA\"", v["peft_type"])));
    }
    if v.get("bias").and_then(|b| b.as_str()).is_some_and(|b| b != "none") {
        return Err(bad(format!("bias = {} is not supported (only \"none\")", v["bias"])));
    }
    for pattern in ["rank_pattern", "alpha_pattern"] {
        if v[pattern].as_object().is_some_and(|o| !o.is_empty()) {
            return Err(bad(format!("{pattern} is not supported")));
        }
    }
    let target_modules = match &v["target_modules"] {
        serde_json::Value::Array(items) => items
            .iter()
            .map(|t| t.as_str().map(String::from).ok_or_else(|| bad("target_modules must be strings".into())))
            .collect::<Result<Vec<_>>>()?,
        other => return Err(bad(format!("target_modules must be a list of names, found {other}"))),
    };
    let r = v["r"].as_u64().ok_or_else(|| bad("missing integer `r`".into()))? as usize;
    Ok(LoraConfig {
        kind: AdapterKind::Lora,
        r,
        alpha: v["lora_alpha"].as_f64().unwrap_or(8.0),
        dropout: v["lora_dropout"].as_f64().unwrap_or(0.0),
        target_modules,
        use_rslora: v["use_rslora"].as_bool().unwrap_or(false),
        use_dora: v["use_dora"].as_bool().unwrap_or(false),
        ..LoraConfig::default()
    })
}

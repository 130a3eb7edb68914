//! Exporting a run's adapter: the PEFT directory (ACE-Step, diffusers, PEFT), a
//! ComfyUI single file, or the decoder with the adapter merged into its weights.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::lora::LoraAdapter;
use crate::model::tensors::save_tensors;
use crate::model::{DecoderWeights, DitModel};
use crate::train::{state, RunConfig};
use crate::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExportFormat {
    /// `adapter_config.json` + `adapter_model.safetensors`, as PEFT saves them.
    Peft,
    /// One safetensors file with `lora_down` / `lora_up` / `alpha` per module.
    Comfyui,
    /// The decoder's weights (original naming) with `scaling * B A` added.
    Merged,
}

impl std::str::FromStr for ExportFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "peft" => Ok(Self::Peft),
            "comfyui" => Ok(Self::Comfyui),
            "merged" => Ok(Self::Merged),
            other => Err(format!("unknown export format `{other}` (expected peft, comfyui or merged)")),
        }
    }
}

/// Which of a run's adapters to export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WhichAdapter {
    /// `final/`, else the newest checkpoint's (a run stopped early).
    #[default]
    Final,
    /// `best/`: the lowest validation loss.
    Best,
    /// The checkpoint of this step.
    Step(u64),
}

impl std::str::FromStr for WhichAdapter {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let step = s.strip_prefix("step-").map(|n| n.parse::<u64>());
        match (s, step) {
            ("final", _) => Ok(Self::Final),
            ("best", _) => Ok(Self::Best),
            (_, Some(Ok(n))) => Ok(Self::Step(n)),
            _ => Err(format!("unknown adapter `{s}` (expected best, final or step-N)")),
        }
    }
}

/// Writes the run's final adapter to `to` (see [`export_run_adapter`]).
pub fn export_run(run_dir: &Path, format: ExportFormat, to: &Path) -> Result<PathBuf> {
    export_run_adapter(run_dir, WhichAdapter::Final, format, to)
}

/// Writes the run's `which` adapter to `to`: a directory for PEFT, a `.safetensors`
/// file otherwise.
pub fn export_run_adapter(run_dir: &Path, which: WhichAdapter, format: ExportFormat, to: &Path) -> Result<PathBuf> {
    let config = RunConfig::from_toml_file(&run_dir.join("run.toml"))?;
    let adapter_dir = adapter_dir(run_dir, which)?;
    let (cfg, weights) = config.model.load_decoder(DType::F32, &Device::Cpu)?;
    let model = DitModel::new(&cfg, &weights)?;
    let adapter = LoraAdapter::load_peft(&adapter_dir, &model)?;
    match format {
        ExportFormat::Peft => adapter.save_peft(to)?,
        ExportFormat::Comfyui => write_comfyui(&adapter, to)?,
        ExportFormat::Merged => write_merged(&weights, &adapter, to)?,
    }
    Ok(to.to_path_buf())
}

/// ComfyUI's LoRA file for the ACE-Step decoder: `diffusion_model.decoder.<module>.
/// {lora_down, lora_up}.weight` and `.alpha`, where ComfyUI scales by alpha / rank
/// (so rsLoRA's alpha / sqrt(r) is written as alpha * sqrt(r)).
pub fn write_comfyui(adapter: &LoraAdapter, path: &Path) -> Result<()> {
    let c = &adapter.config;
    let alpha = (c.scaling() * c.r as f64) as f32;
    let mut out = HashMap::new();
    for (key, t) in adapter.named_tensors() {
        let (module, which) = key.rsplit_once(".lora_").expect("adapter keys name lora_A/lora_B");
        let prefix = format!("diffusion_model.decoder.{module}");
        let name = if which == "A.weight" { "lora_down" } else { "lora_up" };
        out.insert(format!("{prefix}.{name}.weight"), t);
        out.insert(format!("{prefix}.alpha"), Tensor::new(alpha, &Device::Cpu)?);
    }
    save(&out, path)
}

/// The whole decoder with the adapter merged, under `decoder.` + the original names.
pub fn write_merged(weights: &DecoderWeights, adapter: &LoraAdapter, path: &Path) -> Result<()> {
    let mut out = HashMap::new();
    for (name, t) in weights.iter() {
        let merged = match name.strip_suffix(".weight") {
            Some(module) => adapter.merged_weight(module, t)?,
            None => None,
        };
        out.insert(format!("decoder.{name}"), merged.unwrap_or_else(|| t.clone()));
    }
    save(&out, path)
}

/// The directory of the run's `which` adapter; an error naming what is missing.
fn adapter_dir(run_dir: &Path, which: WhichAdapter) -> Result<PathBuf> {
    let missing = |reason: String| Error::BadFile { path: run_dir.to_path_buf(), reason };
    match which {
        WhichAdapter::Final if run_dir.join("final/adapter").is_dir() => Ok(run_dir.join("final/adapter")),
        WhichAdapter::Final => state::list_checkpoints(run_dir)?
            .into_iter()
            .next()
            .map(|newest| newest.join("adapter"))
            .ok_or_else(|| missing("the run has no adapter yet (no final/ and no checkpoint)".into())),
        WhichAdapter::Best => Some(run_dir.join("best/adapter"))
            .filter(|d| d.is_dir())
            .ok_or_else(|| missing("the run has no best adapter (it is written by validation: --val-files or --val-fraction)".into())),
        WhichAdapter::Step(step) => state::list_checkpoints(run_dir)?
            .into_iter()
            .find(|d| d.file_name().is_some_and(|n| n == format!("step-{step:06}").as_str()))
            .map(|d| d.join("adapter"))
            .ok_or_else(|| missing(format!("the run has no checkpoint of step {step} (older ones are pruned: keep_checkpoints)"))),
    }
}

fn save(tensors: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    save_tensors(tensors, path)
}

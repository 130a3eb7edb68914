//! Exporting a run's adapter: the PEFT directory (ACE-Step, diffusers, PEFT), a
//! ComfyUI single file, or the decoder with the adapter merged into its weights.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::load::folder::{ModelFolder, DIT_WEIGHTS};
use crate::load::source::ModelSource;
use crate::lora::lokr::Layout;
use crate::lora::{row_norms, trigger, AdapterKind, LoraAdapter};
use crate::model::{DecoderWeights, DitModel};
use crate::tensor_io::shards::{weight_files, weights_in};
use crate::tensor_io::{save_tensors_with_metadata, write_safetensors};
use crate::train::songs::latest_adapter;
use crate::train::{state, RunConfig};
use crate::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExportFormat {
    /// The adapter's own folder: PEFT's for LoRA, upstream ACE-Step's LoKr file for LoKr.
    Adapter,
    /// `adapter_config.json` + `adapter_model.safetensors`, as PEFT saves them (LoRA).
    Peft,
    /// `lokr_weights.safetensors`, as upstream ACE-Step saves a LoKr through LyCORIS.
    Lycoris,
    /// One safetensors file under ComfyUI's generic keys: `lora_down` / `lora_up` (LoKr:
    /// `lokr_w1` ...) / `alpha` (/ `dora_scale`) per module.
    Comfyui,
    /// The decoder's weights (original naming) with `scaling * B A` added.
    Merged,
    /// A drop-in copy of the model's DiT folder: every tensor of its model.safetensors,
    /// the decoder's adapted weights merged, each in the source dtype, beside the
    /// folder's other files (config.json, silence_latent.pt, ...).
    MergedModel,
}

impl std::str::FromStr for ExportFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "adapter" => Ok(Self::Adapter),
            "peft" => Ok(Self::Peft),
            "lycoris" => Ok(Self::Lycoris),
            "comfyui" => Ok(Self::Comfyui),
            "merged" => Ok(Self::Merged),
            "merged-model" => Ok(Self::MergedModel),
            other => Err(format!(
                "unknown export format `{other}` (expected adapter, peft, lycoris, comfyui, merged or merged-model)"
            )),
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

/// Writes the run's `which` adapter to `to`: a directory for the adapter's own formats
/// (adapter, peft, lycoris) and the merged model, a `.safetensors` file otherwise.
pub fn export_run_adapter(run_dir: &Path, which: WhichAdapter, format: ExportFormat, to: &Path) -> Result<PathBuf> {
    let config = RunConfig::from_toml_file(&run_dir.join("run.toml"))?;
    let adapter_dir = adapter_dir(run_dir, which)?;
    let (cfg, weights) = config.model.load_decoder(DType::F32, &Device::Cpu)?;
    let model = DitModel::new(&cfg, &weights)?;
    let adapter = LoraAdapter::load(&adapter_dir, &model)?;
    match format {
        ExportFormat::Adapter => adapter.save(to)?,
        ExportFormat::Peft | ExportFormat::Lycoris => {
            let own = if adapter.config.kind == AdapterKind::Lokr { ExportFormat::Lycoris } else { ExportFormat::Peft };
            if format != own {
                let kind = adapter.config.kind.name();
                return Err(Error::setting(
                    "format",
                    format!("a {kind} adapter is exported as {own:?} (or adapter, comfyui, merged)").to_lowercase(),
                ));
            }
            adapter.save(to)?
        }
        ExportFormat::Comfyui => write_comfyui(&adapter, &weights, to)?,
        ExportFormat::Merged => write_merged(&weights, &adapter, to)?,
        ExportFormat::MergedModel => match &config.model {
            ModelSource::Folder { path } => write_merged_model(&ModelFolder::open(path, None)?.dit_dir, &adapter, to)?,
            ModelSource::Demo => {
                return Err(Error::setting(
                    "format",
                    "merged-model needs a model folder; the built-in demo model has none",
                ))
            }
        },
    }
    Ok(to.to_path_buf())
}

/// ComfyUI's adapter file for the ACE-Step decoder under its generic keys,
/// `diffusion_model.decoder.<module>.` + `{lora_down, lora_up}.weight` (LoRA) or
/// LyCORIS's `lokr_w1` ... (LoKr), `.alpha`, and DoRA's `.dora_scale` `[out, 1]`.
/// ComfyUI scales LoRA by alpha / rank (so rsLoRA's alpha / sqrt(r) is written as
/// alpha * sqrt(r)) and LoKr as LyCORIS does. Its DoRA divides by the row norms of the
/// base weight `W`, where PEFT and LyCORIS divide by those of `W + delta`: the magnitude
/// is written pre-multiplied by their ratio, so ComfyUI applies the trained weights.
pub fn write_comfyui(adapter: &LoraAdapter, weights: &DecoderWeights, path: &Path) -> Result<()> {
    let c = &adapter.config;
    let mut out = HashMap::new();
    let tensors: HashMap<String, Tensor> = adapter.named_tensors().into_iter().collect();
    for (module, (inp, out_features)) in adapter.module_features() {
        let prefix = format!("diffusion_model.decoder.{module}");
        let alpha = match c.kind {
            AdapterKind::Lora => c.scaling() * c.r as f64,
            AdapterKind::Lokr => Layout::of(c, inp, out_features).alpha(c),
        };
        out.insert(format!("{prefix}.alpha"), Tensor::new(alpha as f32, &Device::Cpu)?);
        for (key, t) in &tensors {
            let Some(param) = key.strip_prefix(&module).and_then(|p| p.strip_prefix('.')) else {
                continue;
            };
            let (name, t) = match param {
                "lora_A.weight" => ("lora_down.weight", t.clone()),
                "lora_B.weight" => ("lora_up.weight", t.clone()),
                "lora_magnitude_vector" | "dora_scale" => {
                    ("dora_scale", comfyui_dora_scale(adapter, weights, &module)?)
                }
                lokr => (lokr, t.clone()),
            };
            out.insert(format!("{prefix}.{name}"), t);
        }
    }
    let header = trigger::fields(adapter.trigger.as_ref()).into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    save(&out, Some(header), path)
}

/// DoRA's magnitude as ComfyUI needs it: the trainer's factor `m / |W + delta|` times
/// ComfyUI's divisor `|W| + eps` (f32), `[out, 1]`.
fn comfyui_dora_scale(adapter: &LoraAdapter, weights: &DecoderWeights, module: &str) -> Result<Tensor> {
    let w = weights.get(&format!("{module}.weight"))?.to_dtype(DType::F32)?;
    let factor = adapter.dora_factor(module, &w)?.expect("a DoRA module");
    Ok(factor.mul(&(row_norms(&w)? + f32::EPSILON as f64)?)?)
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
    save(&out, None, path)
}

/// The DiT folder `dit_dir` (`acestep-v15-*`) with the adapter merged, written to the
/// new folder `to`: its model.safetensors holds every tensor of the source's (the
/// condition encoder, the null condition, the decoder; one file where the source's
/// were shards) in the source's dtype, the
/// adapted decoder weights as `W + scaling * B A` (computed in f32); every other file
/// is copied. Put it beside `vae/` and `Qwen3-Embedding-0.6B/` and ACE-Step, or
/// `--model`, opens it as a model. Written under a temporary name and renamed; the
/// source folder is only read.
pub fn write_merged_model(dit_dir: &Path, adapter: &LoraAdapter, to: &Path) -> Result<()> {
    let refuse = |reason: String| Error::BadFile { path: to.to_path_buf(), reason };
    if to.exists() {
        return Err(refuse("already exists: the merged model is written to a new folder".into()));
    }
    let target = std::path::absolute(to).map_err(|e| Error::io(to, e))?;
    let source = dit_dir.canonicalize().map_err(|e| Error::io(dit_dir, e))?;
    let parent = target.parent().ok_or_else(|| refuse("has no parent folder".into()))?;
    std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    if parent.canonicalize().map_err(|e| Error::io(parent, e))?.starts_with(&source) {
        return Err(refuse(format!("is inside the source model folder {}, which is never written", source.display())));
    }
    let name = target.file_name().and_then(|n| n.to_str()).unwrap_or("merged");
    let temp = parent.join(format!(".{name}.partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&temp);
    let written = fill_merged_model(&source, adapter, &temp)
        .and_then(|()| std::fs::rename(&temp, &target).map_err(|e| Error::io(&target, e)));
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&temp);
    }
    written
}

fn fill_merged_model(source: &Path, adapter: &LoraAdapter, out: &Path) -> Result<()> {
    std::fs::create_dir(out).map_err(|e| Error::io(out, e))?;
    // One model.safetensors replaces the source's, or its shards and their index.
    let weights_path = weights_in(source, DIT_WEIGHTS);
    let weight_files = weight_files(&weights_path)?;
    for entry in std::fs::read_dir(source).map_err(|e| Error::io(source, e))? {
        let path = entry.map_err(|e| Error::io(source, e))?.path();
        let replaced = path == weights_path || weight_files.contains(&path);
        if path.is_file() && !replaced {
            let copy = out.join(path.file_name().expect("a file has a name"));
            std::fs::copy(&path, &copy).map_err(|e| Error::io(&path, e))?;
        }
    }
    let files = weight_files
        .iter()
        .map(|path| {
            // SAFETY: the file is only read, as every safetensors reader does.
            unsafe { candle_core::safetensors::MmapedSafetensors::new(path) }
                .map_err(|e| Error::BadFile { path: path.clone(), reason: format!("cannot read safetensors: {e}") })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut merged = 0;
    let mut tensors = Vec::new();
    for (file, file_path) in files.iter().zip(&weight_files) {
        for (key, view) in file.tensors() {
            let module = key.strip_prefix("decoder.").and_then(|k| k.strip_suffix(".weight"));
            let base = || {
                file.load(&key, &Device::Cpu).map_err(|e| Error::ModelFile {
                    path: file_path.clone(),
                    key: key.clone(),
                    reason: e.to_string(),
                })
            };
            let entry = match module {
                Some(module) if adapter.adapts(module) => {
                    merged += 1;
                    let weight = adapter.merged_weight(module, &base()?)?.expect("the adapter adapts this module");
                    WeightEntry::Merged(weight)
                }
                _ => WeightEntry::Source(view),
            };
            tensors.push((key, entry));
        }
    }
    if merged != adapter.module_names().count() {
        return Err(Error::BadFile {
            path: weights_path,
            reason: format!(
                "holds {merged} of the adapter's {} modules under `decoder.` (original names)",
                adapter.module_names().count()
            ),
        });
    }
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors(tensors.iter().map(|(k, e)| (k.as_str(), e)), Some(metadata), &out.join(DIT_WEIGHTS))
}

/// A tensor of the merged model's file: the source's bytes, or a merged weight.
enum WeightEntry<'a> {
    Source(safetensors::tensor::TensorView<'a>),
    Merged(Tensor),
}

impl safetensors::View for &WeightEntry<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        match self {
            WeightEntry::Source(v) => v.dtype(),
            WeightEntry::Merged(t) => safetensors::View::dtype(&t),
        }
    }

    fn shape(&self) -> &[usize] {
        match self {
            WeightEntry::Source(v) => v.shape(),
            WeightEntry::Merged(t) => t.dims(),
        }
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        match self {
            WeightEntry::Source(v) => std::borrow::Cow::Borrowed(v.data()),
            WeightEntry::Merged(t) => std::borrow::Cow::Owned(safetensors::View::data(&t).into_owned()),
        }
    }

    fn data_len(&self) -> usize {
        match self {
            WeightEntry::Source(v) => v.data().len(),
            WeightEntry::Merged(t) => safetensors::View::data_len(&t),
        }
    }
}

/// The directory of the run's `which` adapter; an error naming what is missing.
fn adapter_dir(run_dir: &Path, which: WhichAdapter) -> Result<PathBuf> {
    let missing = |reason: String| Error::BadFile { path: run_dir.to_path_buf(), reason };
    match which {
        WhichAdapter::Final => latest_adapter(run_dir)?
            .ok_or_else(|| missing("the run has no adapter yet (no final/ and no checkpoint)".into())),
        WhichAdapter::Best => Some(run_dir.join("best/adapter")).filter(|d| d.is_dir()).ok_or_else(|| {
            missing("the run has no best adapter (it is written by validation: --val-files or --val-fraction)".into())
        }),
        WhichAdapter::Step(step) => {
            Some(state::step_adapter_dir(run_dir, step)).filter(|d| d.is_dir()).ok_or_else(|| {
                missing(format!("the run has no checkpoint of step {step} (older ones are pruned: keep_checkpoints)"))
            })
        }
    }
}

fn save(tensors: &HashMap<String, Tensor>, header: Option<HashMap<String, String>>, path: &Path) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    save_tensors_with_metadata(tensors, header, path)
}

//! `runs` (and their charts), `export` and `inspect`: read what the engine wrote or can tell, and print it.

use std::path::{Path, PathBuf};

use anyhow::bail;
use ostinato_engine::bench::vae::run_vae;
use ostinato_engine::bench::{generation, label, lm, plan, run_spec, text, trace, AnyPreset, Preset};
use ostinato_engine::charts::write_run_charts;
use ostinato_engine::data::preprocessed::preprocess as preprocess_folder;
use ostinato_engine::data::{DataEvent, DataSpec};
use ostinato_engine::device::{self, Precision};
use ostinato_engine::export::{export_run_adapter, ExportFormat, WhichAdapter};
use ostinato_engine::load::folder::ModelFolder;
use ostinato_engine::load::folder::{LYRIC_TOKENS, TEXT_TOKENS};
use ostinato_engine::load::footprint::{self, Workload};
use ostinato_engine::load::source::ModelSource;
use ostinato_engine::lora::{AdapterKind, AdapterSummary, LoraAdapter, LoraConfig};
use ostinato_engine::model::KernelPolicy;
use ostinato_engine::train::config::default_runs_dir;
use ostinato_engine::train::fit::lora_parameters;
use ostinato_engine::train::history::{list_runs, RunStatus};
use ostinato_engine::train::optim::OptimizerConfig;

use crate::progress::{cut_line, dataset_progress, file_name, issue_line};

pub fn runs(runs_dir: Option<PathBuf>, json: bool) -> anyhow::Result<()> {
    let dir = runs_dir.unwrap_or_else(default_runs_dir);
    let runs = list_runs(&dir)?;
    if json {
        println!("{}", serde_json::to_string(&runs)?);
        return Ok(());
    }
    if runs.is_empty() {
        println!("no runs in {}", dir.display());
        return Ok(());
    }
    println!("{:<28} {:<12} {:>11} {:>10} {:>16}  adapter", "run", "status", "steps", "last loss", "best (step)");
    for r in runs {
        let steps = match r.total_steps {
            Some(t) => format!("{}/{t}", r.steps),
            None => r.steps.to_string(),
        };
        let loss = r.last_loss.map(|l| format!("{l:.4}")).unwrap_or_else(|| "-".into());
        let best = match (r.best_loss, r.best_step) {
            (Some(l), Some(s)) => format!("{l:.4} ({s})"),
            _ => "-".into(),
        };
        let adapter = r.adapter.map(|p| p.display().to_string()).unwrap_or_else(|| "-".into());
        let status = serde_json::to_value(r.status)?.as_str().unwrap_or_default().to_string();
        println!("{:<28} {:<12} {steps:>11} {loss:>10} {best:>16}  {adapter}", r.name, status);
        if r.status == RunStatus::Damaged {
            println!("  {}", r.reason.unwrap_or_default());
        }
    }
    Ok(())
}

/// Writes a run's charts into `<run>/charts/` and prints each file.
pub fn charts(run_dir: &Path) -> anyhow::Result<()> {
    if !run_dir.join("run.toml").is_file() {
        bail!("{} is not a run directory (no run.toml)", run_dir.display());
    }
    for path in write_run_charts(run_dir, &run_dir.join("charts"))? {
        println!("{}", path.display());
    }
    Ok(())
}

pub fn export(run_dir: &Path, which: WhichAdapter, format: ExportFormat, to: &Path) -> anyhow::Result<()> {
    if !run_dir.join("run.toml").is_file() {
        bail!("{} is not a run directory (no run.toml)", run_dir.display());
    }
    let written = export_run_adapter(run_dir, which, format, to)?;
    println!("{}", written.display());
    Ok(())
}

/// An adapter folder's settings, targets and trigger word, from its config or header.
fn inspect_adapter(dir: &Path) -> anyhow::Result<()> {
    let AdapterSummary { config, trigger } = LoraAdapter::describe(dir)?;
    println!("{}", LoraAdapter::weights_file(dir).display());
    println!("adapter: {}{}", config.describe(), if config.use_rslora { " (rsLoRA)" } else { "" });
    println!("targets: {}", config.target_modules.join(", "));
    match trigger {
        Some(t) => println!("trigger: {} ({})", t.tag, t.mode.name()),
        None => println!("trigger: none (trained without a trigger word)"),
    }
    Ok(())
}

/// An adapter folder: its settings and trigger word. A model folder: checks every
/// weight file's tensors against its config.json (headers only), and prints what it
/// holds and what training it would need.
pub fn inspect(model_dir: &Path) -> anyhow::Result<()> {
    if LoraAdapter::is_adapter_dir(model_dir) {
        return inspect_adapter(model_dir);
    }
    let folder = ModelFolder::open(model_dir, None)?;
    let tensors = folder.check_weights()?;
    let cfg = &folder.dit;
    println!("{}", folder.dit_config_path().display());
    println!(
        "DiT ({}): {} layers, hidden {}, MLP {}, {} heads / {} KV heads of {}, patch {}, sliding window {}",
        folder.kind.label(),
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.patch_size,
        cfg.sliding_window
    );
    println!(
        "VAE: {} latent channels, {} samples a frame; text encoder: {} layers, hidden {}",
        folder.vae.latent_channels(),
        folder.vae.hop(),
        folder.text.num_hidden_layers,
        folder.text.hidden_size
    );
    println!("weights: all {tensors} tensors present with the shapes their config.json gives");
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    // A 4-minute song (25 latent frames a second), bf16 weights and activations, rank 64.
    let lora = LoraConfig::default();
    let workload = Workload {
        frames: 240 * 25,
        batch: 1,
        encoder_len: TEXT_TOKENS + LYRIC_TOKENS + 1,
        lora_parameters: lora_parameters(cfg, &lora),
        rebuilt_weight_bytes: 0,
        optimizer_state_per_parameter: OptimizerConfig::default().state_per_parameter(),
        dtype_bytes: 2,
        layer_weights_dtype_bytes: 2,
        cpu_kernels: false,
    };
    let f = footprint::estimate(cfg, &workload);
    println!("parameters: {} (DiT), {} trainable at LoRA rank 64 on q/k/v/o", f.dit_parameters, f.lora_parameters);
    println!("estimated training memory for a 4-minute song (bf16 weights, batch 1):");
    println!("  with gradient checkpointing:    {:.1} GiB", gib(f.total(true)));
    println!("  without gradient checkpointing: {:.1} GiB", gib(f.total(false)));
    Ok(())
}

pub fn preprocess(
    audio_dir: &Path,
    model: Option<PathBuf>,
    out: &Path,
    crop_seconds: Option<f64>,
) -> anyhow::Result<()> {
    if !audio_dir.is_dir() {
        bail!("audio folder {} does not exist or is not a folder", audio_dir.display());
    }
    let source = model.map_or(ModelSource::Demo, |path| ModelSource::Folder { path });
    let (encoder, conditioner, _) = source.encoders(&candle_core::Device::Cpu)?;
    let spec = DataSpec { folder: audio_dir.to_path_buf(), crop_seconds, ..DataSpec::default() };
    // A bar on a terminal (hidden otherwise), the notes printed above it.
    let bar = indicatif::ProgressBar::new(1000);
    bar.set_style(indicatif::ProgressStyle::with_template("{bar:30} {msg}").expect("valid template"));
    let written = preprocess_folder(&spec, encoder.as_ref(), conditioner.as_ref(), out, &mut |e| match e {
        DataEvent::Issue(i) => bar.suspend(|| eprintln!("{}", issue_line(&i.file, &i.reason, i.kind))),
        DataEvent::Used(u) => {
            if let Some(line) = cut_line(&u.file, u.note.as_deref(), u.seconds_in_file) {
                bar.suspend(|| eprintln!("{line}"));
            }
        }
        DataEvent::Progress { done, total, file, seconds, .. } => {
            let name = file.as_deref().map(file_name).unwrap_or_default();
            let (line, fraction) = dataset_progress(done as u64, total as u64, &name, seconds);
            bar.set_position((fraction * 1000.0) as u64);
            bar.set_message(line);
        }
    })?;
    bar.finish_and_clear();
    println!("{} samples written to {}", written.len(), out.display());
    Ok(())
}

/// One `ostinato bench` configuration.
pub struct BenchRequest {
    pub preset: AnyPreset,
    pub checkpointing: bool,
    /// The DiT's kernels (training presets only).
    pub kernels: KernelPolicy,
    pub layers: Option<usize>,
    /// The adapter a DiT training preset trains.
    pub adapter: AdapterKind,
    pub dora: bool,
    pub precision: Precision,
    pub warmup: usize,
    pub steps: usize,
    pub cpu: bool,
    /// Trace one step instead of timing.
    pub trace: bool,
}

/// Errs where `preset` does not take the DiT presets' flags and they were changed.
fn ensure_dit_only(req: &BenchRequest, preset: &str) -> anyhow::Result<()> {
    anyhow::ensure!(req.layers.is_none(), "--layers applies to the DiT presets, not {preset}");
    anyhow::ensure!(
        (req.adapter, req.dora, req.precision) == (AdapterKind::Lora, false, Precision::Auto),
        "--adapter, --dora and --precision apply to the DiT training presets, not {preset}"
    );
    ensure_default_kernels(req, preset)
}

/// Errs where `preset` does not take the kernel flags and they were changed.
fn ensure_default_kernels(req: &BenchRequest, preset: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        req.kernels == KernelPolicy::cpu(),
        "--cpu-kernels, --sliding and --attention-scores apply to the DiT training presets, not {preset}"
    );
    Ok(())
}

pub fn bench(req: &BenchRequest, json: bool) -> anyhow::Result<()> {
    let selected = device::select(req.cpu)?;
    if !json {
        eprintln!("device: {} ({})", selected.name, selected.reason);
    }
    let preset = match req.preset {
        AnyPreset::Dit(p) => p,
        AnyPreset::Vae(p) => {
            ensure_dit_only(req, p.name())?;
            let report = run_vae(p, req.warmup, req.steps, &selected.device)?;
            match json {
                true => println!("{}", serde_json::to_string(&report)?),
                false => print!("{}", report.table()),
            }
            return Ok(());
        }
        AnyPreset::Label => {
            ensure_dit_only(req, label::LABEL_240S)?;
            let report = label::run_label(req.warmup, req.steps)?;
            match json {
                true => println!("{}", serde_json::to_string(&report)?),
                false => print!("{}", report.table()),
            }
            return Ok(());
        }
        AnyPreset::Lm(p) => {
            anyhow::ensure!(
                (req.layers, req.adapter, req.dora) == (None, AdapterKind::Lora, false),
                "--layers, --adapter and --dora apply to the DiT presets, not {}",
                p.name()
            );
            ensure_default_kernels(req, p.name())?;
            let report = lm::run_lm(p, req.precision, req.warmup, req.steps, &selected.device)?;
            match json {
                true => println!("{}", serde_json::to_string(&report)?),
                false => print!("{}", report.table()),
            }
            return Ok(());
        }
        AnyPreset::Plan => {
            anyhow::ensure!(
                (req.layers, req.adapter, req.dora) == (None, AdapterKind::Lora, false),
                "--layers, --adapter and --dora apply to the DiT presets, not {}",
                plan::PLAN_PRESET
            );
            ensure_default_kernels(req, plan::PLAN_PRESET)?;
            let report = plan::run_plan(req.precision, req.warmup, req.steps, &selected.device)?;
            match json {
                true => println!("{}", serde_json::to_string(&report)?),
                false => print!("{}", report.table()),
            }
            return Ok(());
        }
        AnyPreset::Text => {
            ensure_dit_only(req, text::TEXT_ENCODE)?;
            let report = text::run_text(req.warmup, req.steps, &selected.device)?;
            match json {
                true => println!("{}", serde_json::to_string(&report)?),
                false => print!("{}", report.table()),
            }
            return Ok(());
        }
    };
    let (mut spec, mut name) = match req.layers {
        Some(n) => (preset.spec().with_layers(n), format!("{preset} ({n} layers)")),
        None => (preset.spec(), preset.to_string()),
    };
    if (req.adapter, req.dora) != (AdapterKind::Lora, false) {
        spec.lora.choose(req.adapter);
        spec.lora.use_dora = req.dora;
        name = format!("{name}, {}", spec.lora.describe());
    }
    match preset {
        Preset::FullGenerate30s => {
            ensure_default_kernels(req, preset.name())?;
            let report = generation::run_generation(&name, &spec)?;
            println!("{}", if json { serde_json::to_string(&report)? } else { serde_json::to_string_pretty(&report)? });
        }
        Preset::FullTrainPreview30s => {
            ensure_default_kernels(req, preset.name())?;
            let report =
                generation::run_training_preview(&name, &spec, req.checkpointing, req.steps, Preset::PREVIEW_FRAMES)?;
            println!("{}", if json { serde_json::to_string(&report)? } else { serde_json::to_string_pretty(&report)? });
        }
        _ if req.trace => {
            anyhow::ensure!(
                (req.kernels, req.precision) == (KernelPolicy::cpu(), Precision::Auto),
                "--trace runs the step as a GPU does (bf16, no CPU kernels): leave --cpu-kernels, --sliding, \
                 --attention-scores and --precision as they are"
            );
            let report = trace::trace_step(&name, &spec, req.checkpointing, &OptimizerConfig::default())?;
            match json {
                true => println!("{}", serde_json::to_string(&report)?),
                false => print!("{}", report.table()),
            }
        }
        _ => {
            let (device, kernels) = (&selected.device, req.kernels);
            let report =
                run_spec(&name, &spec, req.checkpointing, kernels, req.warmup, req.steps, device, req.precision)?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                print!("{}", report.table());
            }
        }
    }
    Ok(())
}

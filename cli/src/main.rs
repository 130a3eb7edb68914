//! `ostinato`: train, resume, list, export, generate, decode, benchmark, inspect and
//! find or download models from the command line. Parsing, wiring and reporting only; the engine does the work.

mod args;
mod captions;
mod generate;
mod label;
mod models;
mod progress;
mod report;
mod train;

use std::path::PathBuf;

use args::{on_off, parse_with, CaptionFlags, GenerateArgs, ModelArg, TrainArgs};
use clap::{Parser, Subcommand};
use ostinato_engine::bench::AnyPreset;
use ostinato_engine::device::Precision;
use ostinato_engine::export::{ExportFormat, WhichAdapter};
use ostinato_engine::generate::GenerateSpec;
use ostinato_engine::lora::AdapterKind;
use ostinato_engine::model::{AttentionScores, KernelPolicy, SlidingAttention};
use ostinato_engine::runtime;
use progress::Mode;

#[derive(Parser)]
#[command(name = "ostinato", version, about = "Train LoRA adapters for ACE-Step 1.5 from a folder of songs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a new adapter on a folder of audio.
    // Negative numbers are values (`--lr -1`), for the engine to judge.
    #[command(allow_negative_numbers = true)]
    Train(Box<TrainArgs>),
    /// Continue a paused, stopped or interrupted run.
    Resume {
        run_dir: PathBuf,
        /// Print engine events as JSON lines instead of a progress bar.
        #[arg(long)]
        json: bool,
        /// Print only the result (no progress bar or log lines).
        #[arg(long, conflicts_with = "json")]
        quiet: bool,
        /// Stop (resumably) once this many optimizer steps are applied.
        #[arg(long)]
        stop_at_step: Option<u64>,
    },
    /// List runs with their status, or write one run's charts.
    Runs {
        #[arg(long)]
        runs_dir: Option<PathBuf>,
        #[arg(long)]
        json: bool,
        /// Write this run's charts (loss with validation, loss by noise level,
        /// throughput, memory) as PNG and SVG into its charts/ folder, replayed from
        /// its events.jsonl.
        #[arg(long, value_name = "RUN_DIR", conflicts_with_all = ["runs_dir", "json"])]
        charts: Option<PathBuf>,
    },
    /// Export a run's adapter.
    Export {
        run_dir: PathBuf,
        /// adapter (the adapter's own folder: PEFT's for LoRA, lycoris's for LoKr), peft
        /// (a LoRA's folder for ACE-Step, diffusers and PEFT), lycoris (a LoKr's
        /// lokr_weights.safetensors folder, as upstream ACE-Step writes it), comfyui
        /// (one file for ComfyUI) or merged (the decoder with the adapter merged).
        #[arg(long, value_parser = parse_with::<ExportFormat>)]
        format: ExportFormat,
        /// Output directory (adapter, peft, lycoris, merged --full) or .safetensors file (comfyui, merged).
        #[arg(long)]
        to: PathBuf,
        /// best (lowest validation loss), final (else the newest checkpoint) or step-N.
        #[arg(long, default_value = "final", value_parser = parse_with::<WhichAdapter>)]
        which: WhichAdapter,
        /// With `--format merged`: a drop-in copy of the model's DiT folder (all of
        /// model.safetensors in its dtype, the decoder merged, and the other files).
        #[arg(long)]
        full: bool,
    },
    /// Time full training steps on fixed shapes with random weights (one configuration
    /// per invocation: peak memory is the process's). Runs on the device `train` would
    /// pick, in its default precision.
    Bench {
        /// A DiT training-step preset, vae-{encode,decode}-{30s,240s} (the real-size VAE
        /// with random weights), text-encode (one song's Qwen3 + condition encoder at
        /// the real sizes) or label-240s (tempo, key and meter read from a 4-minute
        /// song); warm-up and steps then count passes or songs.
        #[arg(long, default_value = "small-30s", value_parser = parse_with::<AnyPreset>)]
        preset: AnyPreset,
        #[arg(long, default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
        gradient_checkpointing: bool,
        /// Change the preset's number of layers.
        #[arg(long)]
        layers: Option<usize>,
        /// The adapter the DiT training presets train: lora (the default) or lokr, at
        /// the preset's rank 16.
        #[arg(long, value_name = "KIND", default_value = "lora", value_parser = parse_with::<AdapterKind>)]
        adapter: AdapterKind,
        /// With DoRA (DiT training presets).
        #[arg(long)]
        dora: bool,
        /// The DiT training presets' precision, as `train --precision` takes it
        /// (default: the device's); the LM presets' (auto: bf16 weights, f32 compute on
        /// the CPU).
        #[arg(long, default_value = "auto", value_parser = parse_with::<Precision>)]
        precision: Precision,
        #[arg(long, default_value_t = 2)]
        warmup: usize,
        #[arg(long, default_value_t = 5)]
        steps: usize,
        /// Bench the CPU even where a GPU backend is available.
        #[arg(long)]
        cpu: bool,
        /// The engine's CPU kernels (fused row ops, head split and merge, the one-node
        /// MLP, attention's host kernels); off runs the ops Metal and CUDA run. DiT
        /// training presets only, as the two below.
        #[arg(long, default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
        cpu_kernels: bool,
        /// Sliding-window layers: banded query blocks where they pay off, or the masked
        /// full square.
        #[arg(long, default_value = "banded", value_parser = parse_with::<SlidingAttention>)]
        sliding: SlidingAttention,
        /// What attention keeps for its backward: nothing past a size (recompute), or
        /// its scores (keep).
        #[arg(long, default_value = "recompute", value_parser = parse_with::<AttentionScores>)]
        attention_scores: AttentionScores,
        /// Instead of timing: trace one training step as a GPU runs it (bf16, no CPU
        /// kernels, on the CPU): its candle ops per layer, each product's dtype and
        /// size, and what it reads back to the host (DiT training presets).
        #[arg(long)]
        trace: bool,
        #[arg(long)]
        json: bool,
    },
    /// Read each song's tempo, key, time signature and length from its audio and keep
    /// them for training in Ostinato's label store (the songs' folder is not touched);
    /// a value a sidecar already gives is shown beside the reading, not replaced. With
    /// --captions, ACE-Step's 5 Hz LM listens to each song and writes its caption,
    /// lyrics, language and genre too.
    Label {
        audio_dir: PathBuf,
        /// One JSON object per song instead of a table.
        #[arg(long)]
        json: bool,
        /// Keep the readings over the sidecars' values (and over earlier edits).
        #[arg(long)]
        overwrite: bool,
        /// Write each song's labels (caption, lyrics, bpm, key, time signature,
        /// language) beside it as ACE-Step sidecars; a sidecar that says something
        /// else is kept unless --replace-sidecars.
        #[arg(long)]
        write_sidecars: bool,
        /// With --write-sidecars: replace sidecars that say something else.
        #[arg(long, requires = "write_sidecars")]
        replace_sidecars: bool,
        /// The label store's folder (default: `labels` in the platform data folder).
        #[arg(long)]
        labels_dir: Option<PathBuf>,
        #[command(flatten)]
        captions: CaptionFlags,
    },
    /// Print a model folder's config, parameter counts and a training-memory estimate,
    /// or an adapter folder's settings and trigger word.
    Inspect { model_dir: PathBuf },
    /// Find, add, download and verify ACE-Step 1.5 models.
    #[command(subcommand)]
    Models(models::ModelsCommand),
    /// Encode a folder of songs once into ACE-Step's preprocessed tensors, which
    /// `train` accepts in place of audio.
    Preprocess {
        audio_dir: PathBuf,
        /// An ACE-Step 1.5 model folder (default: the built-in demo model).
        #[arg(long)]
        model: Option<PathBuf>,
        #[arg(long)]
        out: PathBuf,
        /// Write each song's centre window this many seconds long.
        #[arg(long)]
        crop_seconds: Option<f64>,
    },
    /// Make a song from a caption (and lyrics), optionally with a trained adapter:
    /// a 48 kHz stereo 32-bit float WAV.
    Generate(Box<GenerateArgs>),
    /// Turn latents [frames, 64] (`latents` or `target_latents` in a .safetensors file,
    /// as `generate --latents-out` and `preprocess` write them) into a WAV.
    Decode {
        latents: PathBuf,
        #[command(flatten)]
        model: ModelArg,
        #[arg(long)]
        out: PathBuf,
    },
}

#[global_allocator]
static GLOBAL: runtime::Allocator = runtime::ALLOCATOR;

fn main() {
    runtime::configure();
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", causes_once(&e));
            1
        }
    };
    std::process::exit(code);
}

/// The error and its causes, each said once: an engine error's message already holds
/// its cause (`path: No such file or directory`), which the chain would repeat.
fn causes_once(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1).map(ToString::to_string) {
        if !text.contains(&cause) {
            text = format!("{text}: {cause}");
        }
    }
    text
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Train(args) => train::train(*args),
        Command::Resume { run_dir, json, quiet, stop_at_step } => {
            train::resume(&run_dir, Mode::choose(json, quiet), stop_at_step)
        }
        Command::Runs { charts: Some(run_dir), .. } => report::charts(&run_dir).map(|_| 0),
        Command::Runs { runs_dir, json, charts: None } => report::runs(runs_dir, json).map(|_| 0),
        Command::Export { run_dir, format, to, which, full } => {
            let format = match (format, full) {
                (ExportFormat::Merged, true) => ExportFormat::MergedModel,
                (_, true) => anyhow::bail!("--full goes with --format merged"),
                (format, false) => format,
            };
            report::export(&run_dir, which, format, &to).map(|_| 0)
        }
        Command::Bench {
            preset,
            gradient_checkpointing,
            layers,
            adapter,
            dora,
            precision,
            warmup,
            steps,
            cpu,
            cpu_kernels,
            sliding,
            attention_scores,
            trace,
            json,
        } => {
            let kernels = KernelPolicy { cpu_kernels, sliding, scores: attention_scores };
            let spec = report::BenchRequest {
                preset,
                checkpointing: gradient_checkpointing,
                kernels,
                layers,
                adapter,
                dora,
                precision,
                warmup,
                steps,
                cpu,
                trace,
            };
            report::bench(&spec, json).map(|_| 0)
        }
        Command::Label { audio_dir, json, overwrite, write_sidecars, replace_sidecars, labels_dir, captions } => {
            let captions = captions.args()?;
            let args = label::LabelArgs { json, overwrite, write_sidecars, replace_sidecars, labels_dir, captions };
            label::label(&audio_dir, args)
        }
        Command::Inspect { model_dir } => report::inspect(&model_dir).map(|_| 0),
        Command::Models(command) => models::run(command),
        Command::Preprocess { audio_dir, model, out, crop_seconds } => {
            report::preprocess(&audio_dir, model, &out, crop_seconds).map(|_| 0)
        }
        Command::Generate(a) => {
            let spec = GenerateSpec {
                caption: a.caption,
                lyrics: a.lyrics,
                language: a.language,
                bpm: a.bpm,
                keyscale: a.key,
                timesignature: a.time_signature,
                duration_seconds: a.duration,
                seed: a.seed,
                steps: a.steps,
                shift: a.shift,
                guidance: a.guidance,
                parts: a.parts.unwrap_or_default(),
                lm: a.lm.map(|dir| a.lm_sampling.settings(dir)),
                ..GenerateSpec::default()
            }
            .with_adapters(a.adapters, &a.adapter_scales)?;
            generate::generate(&spec, &a.model.source(), &a.out, a.latents_out.as_deref(), a.json).map(|_| 0)
        }
        Command::Decode { latents, model, out } => generate::decode(&latents, &model.source(), &out).map(|_| 0),
    }
}

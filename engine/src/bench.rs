//! `ostinato bench`: full training steps on fixed shapes with random weights, timed
//! and measured for memory.
//!
//! One call of [`run_spec`] measures ONE configuration: the peak RSS it reports is the
//! process's (getrusage is process-wide and never goes down), so a second configuration
//! in the same process would inherit the first one's peak. Run each configuration in its
//! own process (`bench/interleave.py` alternates invocations A B A B).
//!
//! A step is the training run's own (`train::step::Trainer`, [`trainer`]): turbo
//! timesteps and noise (flow matching), forward + backward (plain or checkpointed),
//! the non-finite guard, clipping the global norm to 1, the AdamW update.

pub mod flops;
pub mod generation;
pub mod label;
pub mod lm;
pub mod peak;
pub mod plan;
mod presets;
pub mod text;
pub mod trace;
pub mod vae;

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::device::Precision;
use crate::load::footprint::{self, Workload};
use crate::lora::{LoraAdapter, LoraConfig};
use crate::model::timesteps::TimestepSampling;
use crate::model::{DecoderWeights, DitConfig, DitModel, KernelPolicy, LayerType};
use crate::train::fit::{lora_parameters, rebuilt_weight_bytes};
use crate::train::flow::Batch;
use crate::train::loss_scale::{LossScaler, SkipCounter};
use crate::train::optim::{Optimizer, OptimizerConfig};
use crate::train::schedule::{LrSchedule, LrScheduler};
use crate::train::step::{StepOutcome, StepSettings, Trainer};
use crate::{heap, metrics};
use crate::{Error, Result};

pub use presets::AnyPreset;

/// The shapes a bench runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// hidden 512, MLP 1536, 8 layers, 8/4 heads of 64, T = 750 (30 s), encoder 128.
    Small30s,
    /// `small-30s` at T = 6000 (a 4-minute song).
    Small240s,
    /// One ACE-Step-size layer (hidden 2048, MLP 6144, 16/8 heads of 128), T = 750,
    /// encoder 256. Layer 0 is a sliding-window layer, as in the real model.
    FullLayer,
    /// Two ACE-Step-size layers (one sliding, one full) at T = 6000: the per-layer
    /// figures the 24-layer memory estimate is derived from.
    FullPair240s,
    /// A 30 s song with the whole ACE-Step-size DiT (24 layers), encoder 256: 8 turbo
    /// steps, then the full-size VAE decode ([`generation::run_generation`]).
    FullGenerate30s,
    /// Training the whole ACE-Step-size DiT at T = 750 with a 10 s preview in between:
    /// what the preview adds to the training peak ([`generation::run_training_preview`]).
    FullTrainPreview30s,
    /// The whole 2B DiT (24 layers) training on a 4-minute song (T = 6000), encoder 256.
    Full240s,
    /// The whole XL (4B) DiT: 32 layers of hidden 2560, MLP 9728, 32/8 heads of 128,
    /// over a 2048-wide condition; T = 750, encoder 256.
    Xl30s,
    /// `xl-30s` on a 4-minute song (T = 6000).
    Xl240s,
}

impl Preset {
    pub const ALL: [Preset; 9] = [
        Preset::Small30s,
        Preset::Small240s,
        Preset::FullLayer,
        Preset::FullPair240s,
        Preset::FullGenerate30s,
        Preset::FullTrainPreview30s,
        Preset::Full240s,
        Preset::Xl30s,
        Preset::Xl240s,
    ];
    /// The preview `full-train-preview-30s` makes: 10 s, the default preview length.
    pub const PREVIEW_FRAMES: usize = 250;

    pub fn name(self) -> &'static str {
        match self {
            Preset::Small30s => "small-30s",
            Preset::Small240s => "small-240s",
            Preset::FullLayer => "full-layer",
            Preset::FullPair240s => "full-pair-240s",
            Preset::FullGenerate30s => "full-generate-30s",
            Preset::FullTrainPreview30s => "full-train-preview-30s",
            Preset::Full240s => "full-240s",
            Preset::Xl30s => "xl-30s",
            Preset::Xl240s => "xl-240s",
        }
    }

    pub fn spec(self) -> BenchSpec {
        let spec =
            |config, frames, encoder_len| BenchSpec { config, frames, encoder_len, batch: 1, lora: bench_lora() };
        let two_b = |layers| dit_config(2048, 2048, 6144, layers, 16, 8, 128);
        let xl = dit_config(2560, 2048, 9728, 32, 32, 8, 128);
        match self {
            Preset::Small30s => spec(dit_config(512, 512, 1536, 8, 8, 4, 64), 750, 128),
            Preset::Small240s => spec(dit_config(512, 512, 1536, 8, 8, 4, 64), 6000, 128),
            Preset::FullLayer => spec(two_b(1), 750, 256),
            Preset::FullPair240s => spec(two_b(2), 6000, 256),
            Preset::FullGenerate30s | Preset::FullTrainPreview30s => spec(two_b(24), 750, 256),
            Preset::Full240s => spec(two_b(24), 6000, 256),
            Preset::Xl30s => spec(xl, 750, 256),
            Preset::Xl240s => spec(xl, 6000, 256),
        }
    }
}

impl std::str::FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Preset::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<_> = Preset::ALL.iter().map(|p| p.name()).collect();
            format!("unknown preset `{s}` (expected one of {})", names.join(", "))
        })
    }
}

impl std::fmt::Display for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// LoRA r 16, alpha 32 on q/k/v/o (self- and cross-attention), no dropout (the
/// PyTorch reference runs the same).
fn bench_lora() -> LoraConfig {
    LoraConfig { r: 16, alpha: 32.0, dropout: 0.0, ..Default::default() }
}

/// An ACE-Step 1.5 DiT config of the given size over a condition `encoder` wide:
/// patch 2, 192 input / 64 latent channels, sliding window 128 on even layers, as the
/// real model.
fn dit_config(
    hidden: usize,
    encoder: usize,
    intermediate: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
) -> DitConfig {
    DitConfig {
        hidden_size: hidden,
        intermediate_size: intermediate,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        in_channels: 192,
        audio_acoustic_hidden_dim: 64,
        encoder_hidden_size: encoder,
        patch_size: 2,
        sliding_window: 128,
        use_sliding_window: true,
        layer_types: (0..layers)
            .map(|i| if i % 2 == 0 { LayerType::SlidingAttention } else { LayerType::FullAttention })
            .collect(),
        rope_theta: 1_000_000.0,
        rms_norm_eps: 1e-6,
    }
}

/// The shapes of one bench configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchSpec {
    pub config: DitConfig,
    /// Latent frames T (25 per second).
    pub frames: usize,
    /// Encoder sequence length L.
    pub encoder_len: usize,
    pub batch: usize,
    pub lora: LoraConfig,
}

impl BenchSpec {
    /// The same shapes with `layers` layers (sliding on even layers, as the real model).
    pub fn with_layers(mut self, layers: usize) -> Self {
        let c = &self.config;
        self.config = dit_config(
            c.hidden_size,
            c.encoder_hidden_size,
            c.intermediate_size,
            layers,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
        );
        self
    }
}

/// What [`run_spec`] measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchReport {
    pub preset: String,
    pub gradient_checkpointing: bool,
    /// The model's kernels (`--cpu-kernels`, `--sliding`, `--attention-scores`).
    pub kernels: KernelPolicy,
    pub device: String,
    pub dtype: String,
    pub frames: usize,
    pub patches: usize,
    pub layers: usize,
    pub batch: usize,
    pub warmup: usize,
    pub steps: usize,
    /// Seconds of each timed step (after warm-up), in order.
    pub step_times_s: Vec<f64>,
    pub median_s_per_step: f64,
    pub samples_per_sec: f64,
    /// The process's peak resident set size (getrusage).
    pub peak_rss_bytes: u64,
    /// Resident set size once the model, adapter, optimizer and batch exist, before
    /// the first step.
    pub model_rss_bytes: u64,
    /// `peak_rss_bytes - model_rss_bytes`: what the steps added at their peak.
    pub activation_bytes: u64,
    /// The most heap bytes live at once during the steps minus those live before the
    /// first: what the steps needed, without what the allocator kept. None unless the
    /// binary counts its heap ([`crate::heap::Counting`]).
    pub activation_heap_bytes: Option<u64>,
    /// The most heap bytes live at once from before the model was built to the last
    /// step, less those live before: the run's whole heap peak (what the footprint
    /// estimate predicts). None unless the binary counts its heap.
    pub peak_heap_bytes: Option<u64>,
    /// What the footprint estimate predicts for that peak (`load::footprint`).
    pub predicted_peak_bytes: u64,
    pub base_parameters: usize,
    pub lora_parameters: usize,
    /// What a step must compute, by part, counted from the shapes ([`flops`]).
    pub flops: flops::StepFlops,
    /// That count over the median step time.
    pub tflops_per_s: f64,
    /// On CUDA, the driver's counts over the whole run (model, batch and steps): the
    /// most the pool's tensors used, and the most the pool held.
    pub gpu_used_peak_bytes: Option<u64>,
    pub gpu_reserved_peak_bytes: Option<u64>,
    /// On CUDA, device memory in use before the model (the context, cuBLAS, other processes).
    pub gpu_outside_pool_bytes: Option<u64>,
    /// On a GPU: its bf16 product rate, measured in the same call (`peak`).
    pub bf16_product: Option<peak::ProductRate>,
    /// On a GPU: `tflops_per_s` as a fraction of `bf16_product`'s rate.
    pub bf16_fraction: Option<f64>,
    pub first_loss: f32,
    pub last_loss: f32,
}

/// Builds the model of `spec` (seeded random weights, running `kernels`), adapter,
/// optimizer and batch on `device`, runs `warmup` untimed then `steps` timed training
/// steps. `name` labels the report (a preset's name, or one with its layer count changed).
#[allow(clippy::too_many_arguments)]
pub fn run_spec(
    name: &str,
    spec: &BenchSpec,
    checkpointing: bool,
    kernels: KernelPolicy,
    warmup: usize,
    steps: usize,
    device: &Device,
    precision: Precision,
) -> Result<BenchReport> {
    if steps == 0 {
        return Err(Error::setting("steps", "bench needs at least one timed step"));
    }
    let cfg = &spec.config;

    // 1. Model, adapter, optimizer, one batch: the resident baseline.
    let heap_start = heap::live_bytes();
    heap::reset_peak();
    let outside_pool =
        metrics::machine_memory(device).filter(|_| device.is_cuda()).map(|m| m.total_bytes - m.available_bytes);
    metrics::reset_gpu_peaks(device);
    let dtype = precision.dtype(device);
    let weights = DecoderWeights::random(cfg, 0xBE_0C4, 0.02, precision.weights_dtype(device), device)?;
    let model = DitModel::new(cfg, &weights)?.computing_in(dtype)?.with_kernels(kernels);
    drop(weights);
    let base_parameters = footprint::dit_parameters(cfg) as usize;
    let mut trainer = trainer(spec, model, checkpointing)?;
    let lora_parameters = trainer.adapter.num_parameters();
    let batch = random_batch(spec, device)?;
    let baseline = metrics::process_rss_bytes().unwrap_or(0);
    let setup_peak = heap::peak_bytes();
    let heap_baseline = heap::live_bytes();
    heap::reset_peak();

    // 2. Training steps on the batch.
    let mut times = Vec::with_capacity(steps);
    let (mut first_loss, mut last_loss) = (f32::NAN, f32::NAN);
    for i in 0..warmup + steps {
        let start = Instant::now();
        let loss = train_step(&mut trainer, &batch)? as f32;
        device.synchronize()?;
        let elapsed = start.elapsed().as_secs_f64();
        if i == 0 {
            first_loss = loss;
        }
        last_loss = loss;
        if i >= warmup {
            times.push(elapsed);
        }
    }

    let gpu_peaks = metrics::gpu_peaks(device);
    let median = median(&times);
    let flops = flops::step_flops(spec, checkpointing);
    let tflops_per_s = flops.total() / median / 1e12;
    let bf16_product = match device.is_cpu() {
        true => None,
        false => Some(peak::bf16_product_rate(device, peak::GPU_PRODUCT, 3)?),
    };
    let peak = metrics::peak_rss_bytes().unwrap_or(0);
    let steps_peak = heap::peak_bytes();
    let activation_heap_bytes = heap_baseline.zip(steps_peak).map(|(base, peak)| peak.saturating_sub(base));
    let peak_heap_bytes = heap_start.zip(setup_peak.max(steps_peak)).map(|(start, peak)| peak.saturating_sub(start));
    Ok(BenchReport {
        preset: name.to_string(),
        gradient_checkpointing: checkpointing,
        kernels,
        device: device_name(device).to_string(),
        dtype: precision.describe(device),
        frames: spec.frames,
        patches: spec.frames.div_ceil(cfg.patch_size),
        layers: cfg.num_hidden_layers,
        batch: spec.batch,
        warmup,
        steps,
        step_times_s: times,
        median_s_per_step: median,
        samples_per_sec: spec.batch as f64 / median,
        peak_rss_bytes: peak,
        model_rss_bytes: baseline,
        activation_bytes: peak.saturating_sub(baseline),
        activation_heap_bytes,
        peak_heap_bytes,
        predicted_peak_bytes: predicted_peak(spec, checkpointing, kernels.host(device, dtype), precision, device),
        base_parameters,
        lora_parameters,
        gpu_used_peak_bytes: gpu_peaks.map(|p| p.0),
        gpu_reserved_peak_bytes: gpu_peaks.map(|p| p.1),
        gpu_outside_pool_bytes: outside_pool,
        tflops_per_s,
        bf16_fraction: bf16_product.map(|p| tflops_per_s / p.tflops_per_s),
        bf16_product,
        flops,
        first_loss,
        last_loss,
    })
}

/// The training run's step on the bench's `model` (`train::step::Trainer`): LoRA
/// `spec.lora` from a fixed seed, AdamW at a constant 1e-4, gradients clipped to norm 1,
/// ACE-Step's turbo timesteps, no loss scaling.
pub(crate) fn trainer(spec: &BenchSpec, model: DitModel, checkpointing: bool) -> Result<Trainer> {
    // B = 0 would train nothing; PEFT's init (B = 0) is fine, gradients reach A next step.
    let adapter = LoraAdapter::new(spec.lora.clone(), &model, 7)?;
    Ok(Trainer {
        optimizer: Optimizer::new(adapter.vars(), &OptimizerConfig::default())?,
        lr: LrScheduler::new(LrSchedule::Constant, 1e-4, 1),
        scaler: LossScaler::disabled(),
        skips: SkipCounter::new(1),
        settings: StepSettings {
            checkpointing,
            max_grad_norm: 1.0,
            timesteps: TimestepSampling::Turbo { shift: 3.0 },
            seed: 11,
            cfg_dropout: None,
        },
        attempts: 0,
        adapter,
        model,
    })
}

/// One step of `trainer` on `batch`: its loss, or an error where the step was skipped.
pub(crate) fn train_step(trainer: &mut Trainer, batch: &Batch) -> Result<f64> {
    match trainer.step(std::slice::from_ref(batch))? {
        StepOutcome::Applied { loss, .. } => Ok(loss),
        StepOutcome::Skipped { reason, .. } => {
            Err(candle_core::Error::Msg(format!("bench step {} skipped: {reason}", trainer.attempts)).into())
        }
    }
}

/// The footprint estimate's peak for `spec`, with or without the CPU kernels.
pub fn predicted_peak(
    spec: &BenchSpec,
    checkpointing: bool,
    cpu_kernels: bool,
    precision: Precision,
    device: &Device,
) -> u64 {
    let dtype = precision.dtype(device);
    let workload = Workload {
        frames: spec.frames,
        batch: spec.batch,
        encoder_len: spec.encoder_len,
        lora_parameters: lora_parameters(&spec.config, &spec.lora),
        rebuilt_weight_bytes: rebuilt_weight_bytes(&spec.config, &spec.lora),
        optimizer_state_per_parameter: OptimizerConfig::default().state_per_parameter(),
        dtype_bytes: dtype.size_in_bytes() as u64,
        layer_weights_dtype_bytes: precision.weights_dtype(device).size_in_bytes() as u64,
        cpu_kernels,
    };
    footprint::estimate(&spec.config, &workload).total(checkpointing)
}

fn device_name(device: &Device) -> &'static str {
    match device {
        Device::Cpu => "cpu",
        Device::Cuda(_) => "cuda",
        Device::Metal(_) => "metal",
    }
}

fn random_batch(spec: &BenchSpec, device: &Device) -> Result<Batch> {
    let (b, t, l) = (spec.batch, spec.frames, spec.encoder_len);
    let cfg = &spec.config;
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut randn = |shape: (usize, usize, usize)| -> Result<Tensor> {
        use rand_distr::{Distribution, StandardNormal};
        let n = shape.0 * shape.1 * shape.2;
        let v: Vec<f32> = (0..n).map(|_| StandardNormal.sample(&mut rng)).collect();
        Ok(Tensor::from_vec(v, shape, device)?)
    };
    Batch::new(
        randn((b, t, cfg.audio_acoustic_hidden_dim))?,
        Tensor::ones((b, t), DType::F32, device)?,
        randn((b, l, cfg.encoder_hidden_size))?,
        randn((b, t, cfg.context_channels()))?,
    )
}

/// The median of `xs` (mean of the middle two for an even count); NaN when empty.
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl BenchReport {
    /// A small human-readable table.
    pub fn table(&self) -> String {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        format!(
            "preset                  {}\n\
             gradient checkpointing  {}\n\
             kernels                 {}\n\
             device / dtype          {} / {}\n\
             shape                   {} layers, T = {} frames ({} patches), batch {}\n\
             parameters              {} base, {} adapter\n\
             median s/step           {:.4} (over {} steps after {} warm-up)\n\
             samples/s               {:.3}\n\
             arithmetic (counted)    {}\n\
             achieved                {:.2} TFLOP/s{}\n\
             peak RSS                {:.1} MiB\n\
             model RSS               {:.1} MiB\n\
             activation memory       {:.1} MiB (RSS), {} (live heap)\n\
             peak heap               {} (predicted {:.1} MiB)\n\
             {}\
             loss first / last       {:.5} / {:.5}\n",
            self.preset,
            if self.gradient_checkpointing { "on" } else { "off" },
            self.kernels,
            self.device,
            self.dtype,
            self.layers,
            self.frames,
            self.patches,
            self.batch,
            self.base_parameters,
            self.lora_parameters,
            self.median_s_per_step,
            self.steps,
            self.warmup,
            self.samples_per_sec,
            self.flops,
            self.tflops_per_s,
            match (self.bf16_product, self.bf16_fraction) {
                (Some(p), Some(f)) => format!(
                    ", {:.1}% of this device's bf16 product ({:.1} TFLOP/s at {n}^3)",
                    100.0 * f,
                    p.tflops_per_s,
                    n = p.n
                ),
                _ => String::new(),
            },
            mib(self.peak_rss_bytes),
            mib(self.model_rss_bytes),
            mib(self.activation_bytes),
            self.activation_heap_bytes.map_or("not counted".into(), |b| format!("{:.1} MiB", mib(b))),
            self.peak_heap_bytes.map_or("not counted".into(), |b| format!("{:.1} MiB", mib(b))),
            mib(self.predicted_peak_bytes),
            match (self.gpu_used_peak_bytes, self.gpu_reserved_peak_bytes, self.gpu_outside_pool_bytes) {
                (Some(used), Some(held), outside) => format!(
                    "GPU memory (driver)     {:.1} MiB used at most, {:.1} MiB held by the pool, {} outside it\n",
                    mib(used),
                    mib(held),
                    outside.map_or("?".into(), |b| format!("{:.1} MiB", mib(b)))
                ),
                _ => String::new(),
            },
            self.first_loss,
            self.last_loss,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_and_median() {
        for p in Preset::ALL {
            assert_eq!(p.name().parse::<Preset>().unwrap(), p);
        }
        assert!("huge".parse::<Preset>().is_err());
        assert_eq!("vae-decode-240s".parse::<AnyPreset>().unwrap(), AnyPreset::Vae(vae::VaePreset::Decode240s));
        assert_eq!("small-30s".parse::<AnyPreset>().unwrap(), AnyPreset::Dit(Preset::Small30s));
        assert_eq!("text-encode".parse::<AnyPreset>().unwrap(), AnyPreset::Text);
        assert_eq!("label-240s".parse::<AnyPreset>().unwrap(), AnyPreset::Label);
        let unknown = "huge".parse::<AnyPreset>().unwrap_err();
        assert!(unknown.contains("vae-encode-30s") && unknown.contains("text-encode"), "{unknown}");
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let s = Preset::Small240s.spec();
        assert_eq!((s.frames, s.config.num_hidden_layers, s.config.sliding_window), (6000, 8, 128));
    }
}

//! Fitting a run to the machine. The engine's one rule, which the CLI and the app
//! call: a run's predicted peak (the footprint estimate at its longest sample) against
//! the memory its device offers. A run predicted past it does not start, with the
//! reason and what to change; `fit auto` first chooses gradient checkpointing, batch,
//! precision and crop length so that it fits.

use candle_core::DType;
use serde::{Deserialize, Serialize};

use super::RunConfig;
use crate::device::{self, Backend, Precision};
use crate::load::footprint::{self, Footprint, Workload};
use crate::load::source::ModelShape;
use crate::lora::{parameters_per_layer, AdapterKind, LoraConfig};
use crate::metrics::{machine_memory, MachineMemory};
use crate::{Error, Result};

/// Whether the engine chooses the memory settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fit {
    /// The settings as given (still refused when predicted not to fit).
    #[default]
    Off,
    /// Gradient checkpointing, batch, precision and crop chosen to fit.
    Auto,
}

impl std::str::FromStr for Fit {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "off" => Ok(Self::Off),
            "auto" => Ok(Self::Auto),
            other => Err(format!("unknown fit `{other}` (expected auto or off)")),
        }
    }
}

/// A run's predicted peak against its machine, and the settings it is for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryPlan {
    pub predicted_peak_bytes: u64,
    /// `None` where the platform gives no figure (nothing is refused then).
    pub machine: Option<MachineMemory>,
    pub footprint: Footprint,
    /// The DiT's companions: VAE encoder, text and condition encoders.
    pub encoders_bytes: u64,
    /// Seconds of the longest sample the settings allow.
    pub longest_seconds: f64,
    pub gradient_checkpointing: bool,
    pub precision: Precision,
    pub batch_size: usize,
    pub grad_accum: usize,
    pub crop_seconds: Option<f64>,
    /// What `fit auto` changed, in words; empty when nothing.
    pub changes: Vec<String>,
}

/// Memory a run leaves to the rest of the process and the allocator: a tenth of the
/// prediction, at least 256 MiB.
fn headroom(predicted: u64) -> u64 {
    (predicted / 10).max(256 << 20)
}

/// Gigabytes with the digits that matter: 23.1, 0.8, 0.025.
fn gb(bytes: u64) -> String {
    match bytes as f64 / 1e9 {
        g if g >= 0.1 => format!("{g:.1}"),
        g => format!("{g:.3}"),
    }
}

/// "predicted peak 3.1 of 19.8 GB (RAM available)", as every front end shows it.
pub fn summary(predicted_peak_bytes: u64, machine: Option<&MachineMemory>) -> String {
    match machine {
        Some(m) => {
            format!("predicted peak {} of {} GB ({})", gb(predicted_peak_bytes), gb(m.available_bytes), m.source)
        }
        None => format!("predicted peak {} GB (this machine's memory is unknown)", gb(predicted_peak_bytes)),
    }
}

impl MemoryPlan {
    /// Whether the prediction, with headroom, is within the machine's memory (true
    /// when the machine's memory is unknown).
    pub fn fits(&self) -> bool {
        self.machine
            .as_ref()
            .is_none_or(|m| self.predicted_peak_bytes + headroom(self.predicted_peak_bytes) <= m.available_bytes)
    }

    /// "predicted peak 3.1 of 19.8 GB (RAM available)".
    pub fn summary(&self) -> String {
        summary(self.predicted_peak_bytes, self.machine.as_ref())
    }

    /// The error for a plan that does not fit: what takes the memory, and what to change.
    fn refusal(&self) -> Error {
        let f = &self.footprint;
        let act =
            self.predicted_peak_bytes - f.weights_bytes - f.trainable_state_bytes - self.encoders_bytes - f.batch_bytes;
        let parts = [
            (f.trainable_state_bytes, format!(
                "the adapter's {:.2} billion trainable parameters with their gradients and optimizer state take {} GB; lower the rank (lora.r, --rank)",
                f.lora_parameters as f64 / 1e9,
                gb(f.trainable_state_bytes + 4 * f.lora_parameters)
            )),
            (act, format!(
                "activations for {:.0} s samples at batch {} take {} GB; {}",
                self.longest_seconds,
                self.batch_size,
                gb(act),
                if self.gradient_checkpointing {
                    "shorten the samples (--crop-seconds) or the batch, or use --fit auto"
                } else {
                    "turn gradient checkpointing on, shorten the samples (--crop-seconds), or use --fit auto"
                }
            )),
            (f.weights_bytes + self.encoders_bytes, format!(
                "the model's weights take {} GB; {}a machine with more memory",
                gb(f.weights_bytes + self.encoders_bytes),
                if f.weights_bytes == 4 * f.dit_parameters {
                    "hold them in bf16 (--precision bf16-weights on the CPU, bf16 on a GPU) or use "
                } else {
                    "use "
                }
            )),
        ];
        let (_, why) = parts.into_iter().max_by_key(|(bytes, _)| *bytes).expect("three parts");
        let needed = self.predicted_peak_bytes + headroom(self.predicted_peak_bytes);
        Error::WontFit { summary: self.summary(), needed_gb: needed as f64 / 1e9, why }
    }
}

/// The plan for `config` on the device it would train on, with the memory that
/// device offers now.
pub fn plan(config: &RunConfig) -> Result<MemoryPlan> {
    let selected = device::select(config.force_cpu)?;
    let machine = machine_memory(&selected.device);
    Ok(plan_for(config, &config.model.shape()?, Backend::of(&selected.device), machine))
}

/// The plan for `config` with `model` on `backend` offering `machine`.
pub fn plan_for(
    config: &RunConfig,
    model: &ModelShape,
    backend: Backend,
    machine: Option<MachineMemory>,
) -> MemoryPlan {
    let longest_seconds =
        config.data.crop_seconds.unwrap_or(config.data.max_duration_seconds).min(config.data.max_duration_seconds);
    let dtype = config.precision.dtype_on(backend);
    let workload = Workload {
        frames: (longest_seconds * model.frames_per_second).ceil() as usize,
        batch: config.batch_size,
        encoder_len: model.encoder_len,
        lora_parameters: lora_parameters(&model.dit, &config.lora),
        rebuilt_weight_bytes: rebuilt_weight_bytes(&model.dit, &config.lora),
        optimizer_state_per_parameter: config.optimizer.state_per_parameter(),
        dtype_bytes: dtype.size_in_bytes() as u64,
        layer_weights_dtype_bytes: config.precision.weights_dtype_on(backend).size_in_bytes() as u64,
        cpu_kernels: backend.cpu_kernels(dtype),
    };
    let footprint = footprint::estimate(&model.dit, &workload);
    MemoryPlan {
        predicted_peak_bytes: footprint.total(config.gradient_checkpointing) + model.encoders_bytes,
        machine,
        footprint,
        encoders_bytes: model.encoders_bytes,
        longest_seconds,
        gradient_checkpointing: config.gradient_checkpointing,
        precision: config.precision,
        batch_size: config.batch_size,
        grad_accum: config.grad_accum,
        crop_seconds: config.data.crop_seconds,
        changes: Vec::new(),
    }
}

/// Trainable elements the adapter `lora` adds to the DiT `cfg` describes.
pub fn lora_parameters(cfg: &crate::model::DitConfig, lora: &LoraConfig) -> u64 {
    adapted_layers(cfg, lora).map(|(inp, out)| parameters_per_layer(lora, inp, out) as u64).sum()
}

/// Bytes of f32 weights one DiT layer's adapter builds whole in a step and keeps for its
/// backward, in copies of its adapted layers' weights, as measured (`ostinato bench
/// --adapter`, tests/footprint.rs): LoKr's Kronecker product and adapted weight (2),
/// DoRA's norms and rescaled weight besides (4), PEFT's DoRA about one (its norm is a
/// constant in backward); LoRA's delta never exists whole in training.
pub fn rebuilt_weight_bytes(cfg: &crate::model::DitConfig, lora: &LoraConfig) -> u64 {
    let copies = match (lora.kind, lora.use_dora) {
        (AdapterKind::Lora, false) => 0,
        (AdapterKind::Lora, true) => 1,
        (AdapterKind::Lokr, false) => 2,
        (AdapterKind::Lokr, true) => 4,
    };
    let layers = cfg.num_hidden_layers.max(1) as u64;
    adapted_layers(cfg, lora).map(|(inp, out)| copies * 4 * (inp * out) as u64).sum::<u64>() / layers
}

/// `(in, out)` of every layer `lora` adapts.
fn adapted_layers<'a>(
    cfg: &crate::model::DitConfig,
    lora: &'a LoraConfig,
) -> impl Iterator<Item = (usize, usize)> + 'a {
    crate::model::weights::layer_linears(cfg)
        .into_iter()
        .filter(|(name, _, _)| lora.targets(name))
        .map(|(_, inp, out)| (inp, out))
}

/// Errs with the reason and a suggestion when `plan` does not fit.
pub fn check(plan: &MemoryPlan) -> Result<()> {
    if plan.fits() {
        Ok(())
    } else {
        Err(plan.refusal())
    }
}

/// Crop lengths `fit auto` tries, longest first, when whole songs do not fit.
const CROPS: [f64; 6] = [120.0, 60.0, 30.0, 20.0, 10.0, 5.0];

/// Chooses the memory settings of `config` for its machine and returns the plan:
/// gradient checkpointing off when the plain path fits in half the memory (it is
/// faster), else on; then, while the run does not fit, a smaller batch (more
/// accumulation keeps the effective batch), bf16 weights, shorter crops. Errs as
/// [`check`] when nothing fits.
pub fn fit_auto(config: &mut RunConfig) -> Result<MemoryPlan> {
    let selected = device::select(config.force_cpu)?;
    let machine = machine_memory(&selected.device);
    let model = config.model.shape()?;
    fit_auto_for(config, &model, Backend::of(&selected.device), machine)
}

/// [`fit_auto`] with the model, device and memory given.
pub fn fit_auto_for(
    config: &mut RunConfig,
    model: &ModelShape,
    backend: Backend,
    machine: Option<MachineMemory>,
) -> Result<MemoryPlan> {
    let Some(memory) = machine.clone() else {
        return Ok(plan_for(config, model, backend, None));
    };
    let before = config.clone();
    let plan = |c: &RunConfig| plan_for(c, model, backend, machine.clone());
    let plain = RunConfig { gradient_checkpointing: false, ..config.clone() };
    config.gradient_checkpointing = plan(&plain).predicted_peak_bytes * 2 > memory.available_bytes;
    while !plan(config).fits() && config.batch_size > 1 {
        let effective = config.batch_size * config.grad_accum;
        config.batch_size = config.batch_size.div_ceil(2);
        config.grad_accum = effective.div_ceil(config.batch_size);
    }
    let shorten = |config: &mut RunConfig| {
        let longest = config.data.crop_seconds.unwrap_or(config.data.max_duration_seconds);
        for crop in CROPS.into_iter().filter(|&c| c < longest) {
            if plan(config).fits() {
                break;
            }
            config.data.crop_seconds = Some(crop);
        }
    };
    let crop = config.data.crop_seconds;
    if !plan(config).fits() && config.precision.weights_dtype_on(backend) == DType::F32 {
        // Half the weights: held in bf16 and computed in f32 on the CPU (whose bf16
        // arithmetic is slow), computed in bf16 on a GPU.
        config.precision = if backend == Backend::Cpu { Precision::Bf16Weights } else { Precision::Bf16 };
    }
    shorten(config);
    if !plan(config).fits() && config.precision == Precision::Bf16Weights {
        // Not even the shortest crop: bf16 compute halves the activations too, at the
        // CPU's bf16 speed; crops again from where they were.
        config.precision = Precision::Bf16;
        config.data.crop_seconds = crop;
        shorten(config);
    }
    let mut result = plan(config);
    result.changes = changes(&before, config);
    check(&result)?;
    Ok(result)
}

/// What differs between `before` and `after` in the settings `fit auto` chooses.
fn changes(before: &RunConfig, after: &RunConfig) -> Vec<String> {
    let on_off = |b: bool| if b { "on" } else { "off" };
    let mut out = Vec::new();
    if before.gradient_checkpointing != after.gradient_checkpointing {
        out.push(format!("gradient checkpointing {}", on_off(after.gradient_checkpointing)));
    }
    if before.batch_size != after.batch_size {
        out.push(format!(
            "batch {} x {} accumulated (was {} x {})",
            after.batch_size, after.grad_accum, before.batch_size, before.grad_accum
        ));
    }
    if before.precision != after.precision {
        out.push(format!("precision {}", after.precision));
    }
    if before.data.crop_seconds != after.data.crop_seconds {
        out.push(format!("crops of {} s", after.data.crop_seconds.unwrap_or_default()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::source::ModelSource;

    const GB: u64 = 1_000_000_000;

    fn machine(gb: u64) -> Option<MachineMemory> {
        Some(MachineMemory { available_bytes: gb * GB, total_bytes: gb * GB, source: "test".into() })
    }

    /// ACE-Step 1.5's DiT (24 layers of the bench's full size), without reading a folder.
    fn ace_step() -> ModelShape {
        let dit = crate::bench::Preset::FullPair240s.spec().with_layers(24).config;
        ModelShape { dit, frames_per_second: 25.0, encoder_len: 769, encoders_bytes: 3 * GB }
    }

    fn config() -> RunConfig {
        RunConfig { name: "r".into(), model: ModelSource::Demo, ..Default::default() }
    }

    /// ACE-Step 1.5 XL's DiT (the `xl-240s` bench preset's), its encoders as the 2B's.
    fn ace_step_xl() -> ModelShape {
        ModelShape { dit: crate::bench::Preset::Xl240s.spec().config, ..ace_step() }
    }

    /// A 4-minute song, rank 64, on the CPU: f32 XL weights alone take 16.7 GB; with
    /// the encoders a run keeps (3 GB here) and the headroom, 24 GB trains the whole song
    /// with checkpointing and bf16-held weights, 16 GB the same on crops.
    #[test]
    fn fit_auto_fits_xl_with_bf16_held_weights() {
        let base = RunConfig { gradient_checkpointing: false, ..config() };
        let f32_weights = plan_for(&base, &ace_step_xl(), Backend::Cpu, machine(24)).footprint.weights_bytes;
        assert!(f32_weights > 16 * GB, "{f32_weights}");
        for (gb, whole) in [(24, true), (16, false)] {
            let mut c = base.clone();
            c.data.max_duration_seconds = 240.0;
            let p = fit_auto_for(&mut c, &ace_step_xl(), Backend::Cpu, machine(gb)).unwrap();
            println!("XL, 240 s, {gb} GB: {} -> {:?}", p.summary(), p.changes);
            assert!(p.fits() && c.gradient_checkpointing && c.precision == Precision::Bf16Weights, "{:?}", p.changes);
            assert_eq!(c.data.crop_seconds.is_none(), whole, "{:?}", p.changes);
        }
    }

    /// A 16 GB and a 24 GB NVIDIA card as `fit auto` meets them: CUDA's free memory,
    /// with the context made (less 0.9 GB, the most the H200 held beyond the predicted
    /// tensors, context included: bench/NOTES.md). The 2B trains a whole 4-minute song
    /// on either with checkpointing in bf16; XL does on 24 GB and crops on 16 GB.
    #[test]
    fn fit_auto_fits_16_and_24_gb_cards() {
        let card = |gb: u64| {
            let free = gb * GB - 900_000_000;
            Some(MachineMemory { available_bytes: free, total_bytes: gb * GB, source: "CUDA free memory".into() })
        };
        for (model, name, whole_on_16) in [(ace_step(), "2B", true), (ace_step_xl(), "XL", false)] {
            for gb in [16, 24] {
                let mut c = RunConfig { gradient_checkpointing: false, ..config() };
                c.data.max_duration_seconds = 240.0;
                let p = fit_auto_for(&mut c, &model, Backend::Cuda, card(gb)).unwrap();
                println!("{name}, 240 s, a {gb} GB card: {} -> {:?}", p.summary(), p.changes);
                assert!(p.fits() && c.gradient_checkpointing && c.precision.dtype_on(Backend::Cuda) == DType::BF16);
                let whole = gb == 24 || whole_on_16;
                assert_eq!(c.data.crop_seconds.is_none(), whole, "{name} on {gb} GB: {:?}", p.changes);
            }
        }
    }

    #[test]
    fn a_huge_rank_is_refused_with_the_reason() {
        // The demo model at rank 100000: the run the OOM killer ended at 23 GB.
        let c = RunConfig { lora: LoraConfig { r: 100_000, ..Default::default() }, ..config() };
        let p = plan_for(&c, &ModelSource::Demo.shape().unwrap(), Backend::Cpu, machine(24));
        println!("{} ({} LoRA elements)", p.summary(), p.footprint.lora_parameters);
        assert!(p.footprint.lora_parameters > 1_400_000_000, "{}", p.footprint.lora_parameters);
        let err = check(&p).unwrap_err().to_string();
        println!("{err}");
        assert!(err.contains("1.43 billion trainable parameters") && err.contains("--rank"), "{err}");
        assert!(err.contains(" of 24.0 GB"), "{err}");
    }

    #[test]
    fn long_samples_without_checkpointing_are_refused_naming_checkpointing() {
        let c = RunConfig { gradient_checkpointing: false, ..config() };
        let err = check(&plan_for(&c, &ace_step(), Backend::Cpu, machine(16))).unwrap_err().to_string();
        println!("{err}");
        assert!(err.contains("gradient checkpointing on") && err.contains("240 s"), "{err}");
        // Unknown memory refuses nothing.
        check(&plan_for(&c, &ace_step(), Backend::Cpu, None)).unwrap();
    }

    #[test]
    fn fit_auto_chooses_more_as_memory_shrinks() {
        let mut chosen = Vec::new();
        for gb in [256, 64, 16, 12, 8] {
            let mut c = RunConfig { batch_size: 4, gradient_checkpointing: false, ..config() };
            let p = fit_auto_for(&mut c, &ace_step(), Backend::Cpu, machine(gb)).unwrap();
            println!("{gb} GB: {} -> {:?}", p.summary(), p.changes);
            assert!(p.fits());
            assert_eq!(c.batch_size * c.grad_accum, 4, "the effective batch is kept");
            assert_eq!(
                p.predicted_peak_bytes,
                plan_for(&c, &ace_step(), Backend::Cpu, machine(gb)).predicted_peak_bytes
            );
            chosen.push((c.gradient_checkpointing, c.batch_size, c.precision, c.data.crop_seconds));
        }
        // Plenty: as given, without checkpointing; less: checkpointing, then smaller
        // batches, bf16-held weights (computed in f32 on the CPU); least: bf16 compute
        // and crops.
        assert_eq!(chosen[0], (false, 4, Precision::Auto, None));
        assert!(chosen[1].0);
        assert_eq!(chosen[3], (true, 1, Precision::Bf16Weights, None), "{chosen:?}");
        let last = chosen.last().unwrap();
        assert!(last.1 == 1 && last.2 == Precision::Bf16 && last.3.is_some(), "{chosen:?}");
        let mut c = config();
        let err = fit_auto_for(&mut c, &ace_step(), Backend::Cpu, machine(2)).unwrap_err().to_string();
        println!("{err}");
        assert!(err.contains("weights take") && err.contains("more memory") && !err.contains("--precision"), "{err}");
    }
}

//! The Mac (Metal) and CUDA path, checked on the CPU: the DiT under the kernel policy
//! those devices get ([`KernelPolicy::gpu`]) runs candle ops and the ops with Metal and
//! CUDA forwards only. Every CPU-only op errs in its forward under that policy (the
//! list, and what replaces each: `model::policy`), so these tests fail wherever a GPU
//! would meet one. The training step matches the PyTorch references at parity.rs's
//! tolerances, and the CPU policy's step where the references are short (banded and
//! recomputed attention, LoRA dropout, an adapted MLP). The model folder's encoders
//! under the same policy: `real_model.rs`, `*_under_the_gpu_policy_*`.

mod common;

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use common::{dit_fixtures, max_abs_diff, max_rel_diff, Fixture};
use ostinato_engine::lora::{LoraAdapter, LoraConfig, LoraMode};
use ostinato_engine::model::timesteps::TimestepSampling;
use ostinato_engine::model::{DecoderWeights, DitModel, KernelPolicy};
use ostinato_engine::train::flow::{Batch, FlowBatch};
use ostinato_engine::train::grads;
use ostinato_engine::train::loss_scale::{LossScaler, SkipCounter};
use ostinato_engine::train::optim::{Optimizer, OptimizerConfig};
use ostinato_engine::train::schedule::{LrSchedule, LrScheduler};
use ostinato_engine::train::step::{StepOutcome, StepSettings, Trainer};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const GPU: KernelPolicy = KernelPolicy::gpu();
/// parity.rs's tolerances against the PyTorch references.
const FORWARD_TOL: f32 = 1e-5;
const LOSS_REL_TOL: f32 = 1e-5;
const GRAD_REL_TOL: f32 = 1e-4;

fn fixture_model(f: &Fixture, kernels: KernelPolicy) -> (DitModel, LoraAdapter) {
    let cfg = f.config();
    let w = DecoderWeights::load(&[f.weights.as_path()], &cfg, DType::F32, &Device::Cpu).unwrap();
    let model = DitModel::new(&cfg, &w).unwrap().with_kernels(kernels);
    let adapter = LoraAdapter::from_tensors(f.lora_config(), &model, &f.group("lora."), &f.weights).unwrap();
    (model, adapter)
}

/// The step's forward + backward (`grads::compute`, what `Trainer::step` runs on each
/// batch), plain and checkpointed, on the fixture's own noisy input and target (every
/// frame valid: the step's loss is the fixture's MSE), against the reference's output,
/// loss and LoRA gradients.
#[test]
fn training_step_under_the_gpu_policy_matches_the_fixtures() {
    for f in dit_fixtures() {
        let (model, adapter) = fixture_model(&f, GPU);
        let out = model.forward(&f.inputs(), Some(&adapter.ctx(LoraMode::Eval, false))).unwrap();
        let out_err = max_abs_diff(&out, f.t("out.lora"));
        assert!(out_err <= FORWARD_TOL, "{}: out.lora error {out_err:e}", f.name);
        let inputs = f.inputs();
        let (b, t, _) = inputs.hidden_states.dims3().unwrap();
        let frame_mask = Tensor::ones((b, t), DType::F32, &Device::Cpu).unwrap();
        let flow = FlowBatch { inputs, target: f.t("in.target").clone(), frame_mask, frames: vec![t as f32; b] };
        let reference_loss = f.t("out.loss").flatten_all().unwrap().to_vec1::<f32>().unwrap()[0];
        for checkpointing in [false, true] {
            let what = format!("{} (gpu policy, checkpointing {checkpointing})", f.name);
            let g = grads::compute(&model, &adapter, &flow, LoraMode::Eval, checkpointing, 1.0)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let loss = g.loss.mean().unwrap();
            let loss_err = (loss - reference_loss).abs() / reference_loss.abs();
            assert!(loss_err <= LOSS_REL_TOL, "{what}: loss {loss} vs {reference_loss} ({loss_err:e})");
            let mut worst = 0f32;
            for ((key, _), grad) in adapter.named_tensors().iter().zip(&g.grads) {
                let rel = max_rel_diff(grad, f.t(&format!("grad.{key}")));
                assert!(rel <= GRAD_REL_TOL, "{what}: gradient of {key}: relative error {rel:e}");
                worst = worst.max(rel);
            }
            println!("{what}: out.lora {out_err:.2e}, loss {loss_err:.2e}, worst gradient {worst:.2e} (relative)");
        }
    }
}

/// `Trainer::step` itself (noise, timesteps, guard, clipping, AdamW) on each fixture's
/// batch: the same loss and gradient norm under the GPU policy as under the CPU's.
#[test]
fn trainer_steps_under_the_gpu_policy_match_the_cpu_policys() {
    for f in dit_fixtures() {
        let inputs = f.inputs();
        let (b, t, _) = inputs.hidden_states.dims3().unwrap();
        let batch = Batch::new(
            f.t("in.target").clone(),
            Tensor::ones((b, t), DType::F32, &Device::Cpu).unwrap(),
            inputs.encoder_hidden_states,
            inputs.context_latents,
        )
        .unwrap();
        for checkpointing in [false, true] {
            let run = |kernels| {
                let (model, adapter) = fixture_model(&f, kernels);
                let mut trainer = trainer(model, adapter, checkpointing);
                (0..2).map(|_| trainer.step(std::slice::from_ref(&batch)).unwrap()).collect::<Vec<_>>()
            };
            let (gpu, cpu) = (run(GPU), run(KernelPolicy::cpu()));
            for (step, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
                let what = format!("{} step {step}, checkpointing {checkpointing}", f.name);
                let (
                    StepOutcome::Applied { loss: gl, grad_norm: gn, .. },
                    StepOutcome::Applied { loss: cl, grad_norm: cn, .. },
                ) = (g, c)
                else {
                    panic!("{what}: {g:?} / {c:?}");
                };
                let (loss_err, norm_err) = ((gl - cl).abs() / cl.abs(), (gn - cn).abs() / cn.abs());
                println!("{what}: gpu vs cpu policy, loss {loss_err:.2e}, gradient norm {norm_err:.2e} (relative)");
                assert!(loss_err <= LOSS_REL_TOL as f64, "{what}: loss {gl} vs {cl}");
                assert!(norm_err <= GRAD_REL_TOL as f64, "{what}: gradient norm {gn} vs {cn}");
            }
        }
    }
}

fn trainer(model: DitModel, adapter: LoraAdapter, checkpointing: bool) -> Trainer {
    Trainer {
        optimizer: Optimizer::new(adapter.vars(), &OptimizerConfig::default()).unwrap(),
        lr: LrScheduler::new(LrSchedule::Constant, 1e-3, 10),
        scaler: LossScaler::disabled(),
        skips: SkipCounter::new(1),
        settings: StepSettings {
            checkpointing,
            max_grad_norm: 1.0,
            timesteps: TimestepSampling::Turbo { shift: 3.0 },
            seed: 5,
            cfg_dropout: None,
        },
        attempts: 0,
        adapter,
        model,
    }
}

/// 800 patches with window 4: under the GPU policy the sliding layers run banded blocks
/// and full attention (2.6M scores) the recompute op's candle-op forward and backward,
/// paths the fixtures are too short for; LoRA dropout and an adapted MLP projection
/// take the adapter's op and the composed MLP. Plain and checkpointed gradients against
/// the CPU policy's.
#[test]
fn long_random_model_under_the_gpu_policy_gives_the_cpu_policys_gradients() {
    let cfg = common::small_config(4);
    let dev = Device::Cpu;
    let w = DecoderWeights::random(&cfg, 3, 0.05, DType::F32, &dev).unwrap();
    let targets = ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"].map(String::from).to_vec();
    let lora = LoraConfig { r: 4, alpha: 8.0, dropout: 0.1, target_modules: targets, ..Default::default() };
    let (b, t) = (1, 1600);
    let batch = Batch::new(
        Tensor::randn(0f32, 1., (b, t, 64), &dev).unwrap(),
        Tensor::ones((b, t), DType::F32, &dev).unwrap(),
        Tensor::randn(0f32, 1., (b, 7, 64), &dev).unwrap(),
        Tensor::randn(0f32, 1., (b, t, 128), &dev).unwrap(),
    )
    .unwrap();
    let flow = FlowBatch::new(&batch, &[0.75], &mut ChaCha8Rng::seed_from_u64(9)).unwrap();
    let mode = LoraMode::Train { dropout_seed: 77 };
    // Non-zero B, so every LoRA tensor's gradient is informative; the same for both.
    let fresh = LoraAdapter::new(lora.clone(), &DitModel::new(&cfg, &w).unwrap(), 11).unwrap();
    let filled: HashMap<String, Tensor> =
        fresh.named_tensors().into_iter().map(|(k, t)| (k, t.randn_like(0.0, 0.05).unwrap())).collect();
    for checkpointing in [false, true] {
        let gradients = |kernels| {
            let model = DitModel::new(&cfg, &w).unwrap().with_kernels(kernels);
            let adapter = LoraAdapter::from_tensors(lora.clone(), &model, &filled, Path::new("test")).unwrap();
            grads::compute(&model, &adapter, &flow, mode, checkpointing, 1.0).unwrap()
        };
        let (gpu, cpu) = (gradients(GPU), gradients(KernelPolicy::cpu()));
        let (gpu_loss, cpu_loss) = (gpu.loss.mean().unwrap(), cpu.loss.mean().unwrap());
        let loss_err = (gpu_loss - cpu_loss).abs() / cpu_loss.abs();
        assert!(loss_err <= LOSS_REL_TOL, "checkpointing {checkpointing}: loss {gpu_loss} vs {cpu_loss}");
        let worst = gpu.grads.iter().zip(&cpu.grads).map(|(g, c)| max_rel_diff(g, c)).fold(0f32, f32::max);
        println!("800 patches, checkpointing {checkpointing}: gpu vs cpu policy, loss {loss_err:.2e}, worst gradient {worst:.2e}");
        assert!(worst <= GRAD_REL_TOL, "checkpointing {checkpointing}: gradients differ by {worst:e} (relative)");
    }
}

//! Gradient checkpointing (block recompute) gives the same LoRA gradients as the
//! plain path: on every fixture model and on a randomly built 8-layer model with dropout,
//! with the LoRA on attention only (the recompute skips each MLP's down projection),
//! on an MLP projection too (the whole layer is recomputed), and with CFG dropout.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{dit_fixtures, max_rel_diff};
use ostinato_engine::lora::{LoraAdapter, LoraConfig, LoraMode};
use ostinato_engine::model::{DecoderWeights, DitModel};
use ostinato_engine::train::cfg_dropout::CfgDropout;
use ostinato_engine::train::flow::{Batch, FlowBatch};
use ostinato_engine::train::grads;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const REL_TOL: f32 = 1e-6;

fn assert_same_gradients(name: &str, model: &DitModel, adapter: &LoraAdapter, batch: &FlowBatch, mode: LoraMode) {
    let plain = grads::compute(model, adapter, batch, mode, false, 1.0).unwrap();
    let ckpt = grads::compute(model, adapter, batch, mode, true, 1.0).unwrap();
    let (plain_loss, ckpt_loss) = (plain.loss.mean().unwrap(), ckpt.loss.mean().unwrap());
    let loss_rel = ((plain_loss - ckpt_loss) / plain_loss).abs();
    assert!(loss_rel <= REL_TOL, "{name}: loss {plain_loss} vs {ckpt_loss} (relative {loss_rel:e})");
    let mut worst = 0f32;
    for (i, (a, b)) in plain.grads.iter().zip(&ckpt.grads).enumerate() {
        let rel = max_rel_diff(b, a);
        worst = worst.max(rel);
        assert!(rel <= REL_TOL, "{name}: gradient {i} differs by {rel:e} (relative)");
    }
    println!("{name}: checkpointed vs plain, worst relative gradient difference {worst:.3e}");
}

#[test]
fn fixture_models_same_gradients_with_and_without_checkpointing() {
    for f in dit_fixtures() {
        let cfg = f.config();
        let w = DecoderWeights::load(&[f.weights.as_path()], &cfg, DType::F32, &Device::Cpu).unwrap();
        let model = DitModel::new(&cfg, &w).unwrap();
        let adapter = LoraAdapter::from_tensors(f.lora_config(), &model, &f.group("lora."), &f.weights).unwrap();
        let inputs = f.inputs();
        let (b, t, _) = inputs.hidden_states.dims3().unwrap();
        let batch = Batch::new(
            f.t("in.target").clone(),
            Tensor::ones((b, t), DType::F32, &Device::Cpu).unwrap(),
            inputs.encoder_hidden_states,
            inputs.context_latents,
        )
        .unwrap();
        // The fixture's own timesteps: one per sample, whatever its batch size.
        let t = f.t("in.timestep").to_vec1::<f32>().unwrap();
        let flow = FlowBatch::new(&batch, &t, &mut ChaCha8Rng::seed_from_u64(5)).unwrap();
        assert_same_gradients(&f.name, &model, &adapter, &flow, LoraMode::Eval);
    }
}

#[test]
fn random_eight_layer_model_same_gradients_with_dropout_and_padding() {
    random_eight_layer_model("random-8-layer", &["q_proj", "k_proj", "v_proj", "o_proj"], (2, 23), &[]);
}

/// 800 positions: full attention runs through the recompute path (2.6M scores), so the
/// recompute takes the output the first pass kept.
#[test]
fn long_random_model_same_gradients() {
    random_eight_layer_model(
        "random-8-layer, 800 positions",
        &["q_proj", "k_proj", "v_proj", "o_proj"],
        (1, 1600),
        &[],
    );
}

#[test]
fn random_eight_layer_model_with_an_adapted_mlp_same_gradients() {
    random_eight_layer_model("random-8-layer, LoRA on down_proj", &["q_proj", "down_proj"], (2, 23), &[]);
}

/// The first sample sees the null condition, the second its own.
#[test]
fn random_eight_layer_model_same_gradients_with_cfg_dropout() {
    random_eight_layer_model(
        "random-8-layer, CFG dropout",
        &["q_proj", "k_proj", "v_proj", "o_proj"],
        (2, 23),
        &[true, false],
    );
}

/// `(batch, frames)`: the last item's last 6 frames are padding; `dropped` samples
/// see a null condition (CFG dropout), none when empty.
fn random_eight_layer_model(name: &str, targets: &[&str], (b, t): (usize, usize), dropped: &[bool]) {
    let cfg = common::small_config(8);
    let dev = Device::Cpu;
    let w = DecoderWeights::random(&cfg, 3, 0.05, DType::F32, &dev).unwrap();
    let model = DitModel::new(&cfg, &w).unwrap();
    let target_modules = targets.iter().map(|t| t.to_string()).collect();
    let lora = LoraConfig { r: 4, alpha: 8.0, dropout: 0.1, target_modules, ..Default::default() };
    let mut adapter = LoraAdapter::new(lora, &model, 11).unwrap();
    // Non-zero B so every LoRA tensor's gradient is informative.
    let filled: std::collections::HashMap<String, Tensor> =
        adapter.named_tensors().into_iter().map(|(k, t)| (k, t.randn_like(0.0, 0.05).unwrap())).collect();
    adapter = LoraAdapter::from_tensors(adapter.config.clone(), &model, &filled, std::path::Path::new("test")).unwrap();
    let mask: Vec<f32> = (0..b * t).map(|i| if i >= b * t - 6 { 0.0 } else { 1.0 }).collect();
    let batch = Batch::new(
        Tensor::randn(0f32, 1., (b, t, 64), &dev).unwrap(),
        Tensor::from_vec(mask, (b, t), &dev).unwrap(),
        Tensor::randn(0f32, 1., (b, 7, 64), &dev).unwrap(),
        Tensor::randn(0f32, 1., (b, t, 128), &dev).unwrap(),
    )
    .unwrap();
    let mut flow = FlowBatch::new(&batch, &[0.75, 0.5][..b], &mut ChaCha8Rng::seed_from_u64(9)).unwrap();
    let null = Tensor::randn(0f32, 1., (1, 1, 64), &dev).unwrap();
    let cond = &flow.inputs.encoder_hidden_states;
    flow.inputs.encoder_hidden_states = CfgDropout::new(0.15, null).apply(cond, dropped).unwrap();
    assert_same_gradients(name, &model, &adapter, &flow, LoraMode::Train { dropout_seed: 77 });
}

/// Weights held in bf16 and computed in f32 (`Precision::Bf16Weights`) give, in both
/// paths, exactly what f32 weights of the same values give: widening is exact, and each
/// layer is widened while it runs.
#[test]
fn bf16_held_weights_train_as_their_f32_values_in_both_paths() {
    let cfg = common::small_config(4);
    let dev = Device::Cpu;
    let held = DecoderWeights::random(&cfg, 3, 0.05, DType::BF16, &dev).unwrap();
    let widened: std::collections::HashMap<String, Tensor> =
        held.iter().map(|(k, t)| (k.to_string(), t.to_dtype(DType::F32).unwrap())).collect();
    let bf16_held = DitModel::new(&cfg, &held).unwrap().computing_in(DType::F32).unwrap();
    let f32_model = DitModel::new(&cfg, &DecoderWeights::from_tensors(widened, &cfg).unwrap()).unwrap();
    assert_eq!(bf16_held.dtype(), DType::F32);
    assert_eq!(bf16_held.layers()[0].linears()[0].weight().dtype(), DType::BF16, "the layers stay in bf16");

    let lora = LoraConfig { r: 4, alpha: 8.0, ..Default::default() };
    let adapter = LoraAdapter::new(lora, &f32_model, 11).unwrap();
    let filled: std::collections::HashMap<String, Tensor> =
        adapter.named_tensors().into_iter().map(|(k, t)| (k, t.randn_like(0.0, 0.05).unwrap())).collect();
    let adapter =
        LoraAdapter::from_tensors(adapter.config.clone(), &f32_model, &filled, std::path::Path::new("t")).unwrap();
    let (b, t) = (2, 23);
    let batch = Batch::new(
        Tensor::randn(0f32, 1., (b, t, 64), &dev).unwrap(),
        Tensor::ones((b, t), DType::F32, &dev).unwrap(),
        Tensor::randn(0f32, 1., (b, 7, 64), &dev).unwrap(),
        Tensor::randn(0f32, 1., (b, t, 128), &dev).unwrap(),
    )
    .unwrap();
    let flow = FlowBatch::new(&batch, &[0.75, 0.5], &mut ChaCha8Rng::seed_from_u64(9)).unwrap();
    for checkpointing in [false, true] {
        let a = grads::compute(&bf16_held, &adapter, &flow, LoraMode::Eval, checkpointing, 1.0).unwrap();
        let b = grads::compute(&f32_model, &adapter, &flow, LoraMode::Eval, checkpointing, 1.0).unwrap();
        let loss = a.loss.mean().unwrap();
        assert_eq!(loss, b.loss.mean().unwrap(), "checkpointing {checkpointing}");
        for (i, (x, y)) in a.grads.iter().zip(&b.grads).enumerate() {
            assert_eq!(common::max_abs_diff(x, y), 0.0, "checkpointing {checkpointing}: gradient {i}");
        }
        println!("bf16-held weights, checkpointing {checkpointing}: loss {} as f32 weights, gradients equal", loss);
    }
}

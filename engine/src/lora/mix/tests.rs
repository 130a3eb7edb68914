//! Mixed adapters against the weights they stand for: each adapter's change merged into
//! the base weights at its strength, summed, and the plain DiT run on them.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

use super::AdapterMix;
use crate::load::source::ModelSource;
use crate::lora::{parse_targets, AdapterKind, LoraAdapter, LoraConfig, LoraMode, PartStrengths};
use crate::model::weights::DecoderWeights;
use crate::model::{DitConfig, DitInputs, DitModel, LinearAdapter};
use crate::Result;

fn demo() -> Result<(DitConfig, DecoderWeights, DitModel)> {
    let (cfg, weights) = ModelSource::Demo.load_decoder(DType::F32, &Device::Cpu)?;
    let model = DitModel::new(&cfg, &weights)?;
    Ok((cfg, weights, model))
}

fn inputs(cfg: &DitConfig) -> Result<DitInputs> {
    let dev = Device::Cpu;
    let (frames, acoustic) = (12, cfg.audio_acoustic_hidden_dim);
    let t = Tensor::new(&[0.6f32], &dev)?;
    Ok(DitInputs {
        hidden_states: Tensor::randn(0f32, 1.0, (1, frames, acoustic), &dev)?,
        context_latents: Tensor::randn(0f32, 1.0, (1, frames, cfg.in_channels - acoustic), &dev)?,
        encoder_hidden_states: Tensor::randn(0f32, 1.0, (1, 5, cfg.encoder_hidden_size), &dev)?,
        timestep: t.clone(),
        timestep_r: t,
    })
}

/// A LoRA on every part, a DoRA on self-attention and the MLP, a LoKr on both
/// attentions: each moved off its start.
fn three_kinds(model: &DitModel) -> Result<Vec<(LoraAdapter, HashMap<String, Tensor>)>> {
    let config = |kind, use_dora, targets: &str| LoraConfig {
        kind,
        r: 4,
        alpha: 8.0,
        dropout: 0.0,
        use_dora,
        target_modules: parse_targets(targets).expect("valid targets"),
        ..Default::default()
    };
    [
        config(AdapterKind::Lora, false, "self,cross,mlp"),
        config(AdapterKind::Lora, true, "self,mlp"),
        config(AdapterKind::Lokr, false, "self,cross"),
    ]
    .iter()
    .enumerate()
    .map(|(i, c)| crate::lora::tests::moved(c, model, i as u64))
    .collect()
}

/// The base weights with each adapter's change (its merged weight less the base) added
/// at its strength times its part's.
fn merged(
    cfg: &DitConfig,
    base: &DecoderWeights,
    mix: &[(&LoraAdapter, f64)],
    parts: PartStrengths,
) -> Result<DitModel> {
    let mut out = HashMap::new();
    for (name, w) in base.iter() {
        let mut sum = w.clone();
        if let Some(module) = name.strip_suffix(".weight") {
            for (adapter, strength) in mix {
                if let Some(adapted) = adapter.merged_weight(module, w)? {
                    sum = (sum + ((adapted - w)? * (strength * parts.of(module)))?)?;
                }
            }
        }
        out.insert(name.clone(), sum);
    }
    DitModel::new(cfg, &DecoderWeights::from_tensors(out, cfg)?)
}

fn mixed<'a>(mix: &[(&'a LoraAdapter, f64)], parts: PartStrengths) -> AdapterMix<'a> {
    let ctxs = mix.iter().map(|(a, s)| a.ctx(LoraMode::Eval, false).with_strength(*s).with_parts(parts)).collect();
    AdapterMix::new(ctxs).expect("adapters")
}

fn run(model: &DitModel, inputs: &DitInputs, lora: Option<&dyn LinearAdapter>) -> Result<Vec<f32>> {
    model.forward(inputs, lora)?.flatten_all()?.to_vec1().map_err(Into::into)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn adapters_of_every_kind_at_their_strengths_equal_their_merged_weights() -> Result<()> {
    let (cfg, weights, model) = demo()?;
    let adapters = three_kinds(&model)?;
    let inputs = inputs(&cfg)?;
    let base = run(&model, &inputs, None)?;
    let parts = "cross=0.5,mlp=1.5".parse::<PartStrengths>().expect("parts");
    for strengths in [[1.0, 1.0, 1.0], [0.7, 1.3, 0.4], [2.0, 0.25, 1.0]] {
        let mix: Vec<(&LoraAdapter, f64)> = adapters.iter().map(|(a, _)| a).zip(strengths).collect();
        for parts in [PartStrengths::default(), parts] {
            let ours = run(&model, &inputs, Some(&mixed(&mix, parts)))?;
            let theirs = run(&merged(&cfg, &weights, &mix, parts)?, &inputs, None)?;
            let (err, effect) = (max_diff(&ours, &theirs), max_diff(&theirs, &base));
            let scale = theirs.iter().fold(0f32, |m, v| m.max(v.abs()));
            println!("LoRA, DoRA, LoKr at {strengths:?}, parts {parts}: max abs {err:.3e}, change {effect:.3e}, outputs up to {scale:.2}");
            assert!(err <= 1e-4 * scale.max(1.0), "the mix is not the merged weights");
            assert!(effect > 100.0 * err, "the adapters change the output well past the error");
        }
    }
    Ok(())
}

#[test]
fn an_adapter_at_strength_0_leaves_the_others_exactly_as_alone() -> Result<()> {
    let (cfg, _, model) = demo()?;
    let adapters = three_kinds(&model)?;
    let inputs = inputs(&cfg)?;
    let (a, b, c) = (&adapters[0].0, &adapters[1].0, &adapters[2].0);
    let whole = PartStrengths::default();
    let alone = run(&model, &inputs, Some(&mixed(&[(a, 0.8)], whole)))?;
    let single = a.ctx(LoraMode::Eval, false).with_strength(0.8);
    assert_eq!(alone, run(&model, &inputs, Some(&single))?, "one adapter in a mix is that adapter alone");
    let with_zeros = run(&model, &inputs, Some(&mixed(&[(b, 0.0), (a, 0.8), (c, 0.0)], whole)))?;
    assert_eq!(with_zeros, alone);
    let with_both = run(&model, &inputs, Some(&mixed(&[(a, 0.8), (c, 0.5)], whole)))?;
    assert_ne!(with_both, alone, "the second adapter at 0.5 changes the song");
    Ok(())
}

#[test]
fn a_part_at_strength_0_removes_exactly_that_parts_change() -> Result<()> {
    let (cfg, _, model) = demo()?;
    let inputs = inputs(&cfg)?;
    let base = run(&model, &inputs, None)?;
    let (adapter, tensors) = &three_kinds(&model)?[0];
    let no_cross = "cross=0".parse::<PartStrengths>().expect("parts");
    let ours = run(&model, &inputs, Some(&mixed(&[(adapter, 0.9)], no_cross)))?;
    // The same adapter trained without cross-attention: the same tensors, less its.
    let config = LoraConfig { target_modules: parse_targets("self,mlp").expect("targets"), ..adapter.config.clone() };
    let kept: HashMap<String, Tensor> =
        tensors.iter().filter(|(k, _)| !k.contains("cross_attn")).map(|(k, t)| (k.clone(), t.clone())).collect();
    let without = LoraAdapter::from_tensors(config, &model, &kept, std::path::Path::new("test"))?;
    let theirs = run(&model, &inputs, Some(&without.ctx(LoraMode::Eval, false).with_strength(0.9)))?;
    assert_eq!(ours, theirs, "cross=0 is the adapter without its cross-attention");
    let none = "self=0,cross=0,mlp=0".parse::<PartStrengths>().expect("parts");
    assert_eq!(run(&model, &inputs, Some(&mixed(&[(adapter, 0.9)], none)))?, base, "every part at 0 is the base model");
    assert_ne!(ours, base);
    Ok(())
}

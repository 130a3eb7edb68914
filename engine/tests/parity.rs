//! Exact parity with ACE-Step's PyTorch DiT on every fixture in the fixture directory:
//! forward (base, every intermediate, LoRA), loss, LoRA gradients, PEFT adapter I/O.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use common::{dit_fixtures, max_abs_diff, max_rel_diff, Fixture};
use ostinato_engine::lora::{LoraAdapter, LoraMode};
use ostinato_engine::model::{ops, DecoderWeights, DitModel};

const FORWARD_TOL: f32 = 1e-5;
const LOSS_REL_TOL: f32 = 1e-5;
const GRAD_REL_TOL: f32 = 1e-4;

fn load_model(f: &Fixture) -> DitModel {
    let cfg = f.config();
    let w = DecoderWeights::load(&[f.weights.as_path()], &cfg, DType::F32, &Device::Cpu)
        .unwrap_or_else(|e| panic!("{}: {e}", f.name));
    DitModel::new(&cfg, &w).unwrap()
}

fn fixture_adapter(f: &Fixture, model: &DitModel) -> LoraAdapter {
    LoraAdapter::from_tensors(f.lora_config(), model, &f.group("lora."), &f.weights)
        .unwrap_or_else(|e| panic!("{}: {e}", f.name))
}

#[test]
fn base_forward_and_intermediates_match_reference() {
    for f in dit_fixtures() {
        let model = load_model(&f);
        let inputs = f.inputs();
        let out = model.forward(&inputs, None).unwrap();
        let err = max_abs_diff(&out, f.t("out.base"));
        println!("{}: out.base max abs error {err:.3e}", f.name);
        assert!(err <= FORWARD_TOL, "{}: out.base error {err:e} > {FORWARD_TOL:e}", f.name);

        let trace = model.trace(&inputs).unwrap();
        let mut checked = 0;
        for (name, t) in &trace {
            if let Some(reference) = f.tensors.get(name) {
                let err = max_abs_diff(t, reference);
                println!("{}: {name} max abs error {err:.3e}", f.name);
                assert!(err <= FORWARD_TOL, "{}: {name} error {err:e}", f.name);
                checked += 1;
            }
        }
        let in_fixture = f.tensors.keys().filter(|k| k.starts_with("dbg.")).count();
        assert_eq!(checked, in_fixture, "{}: every dbg.* tensor must be checked", f.name);
    }
}

#[test]
fn lora_forward_loss_and_gradients_match_reference() {
    for f in dit_fixtures() {
        let model = load_model(&f);
        let adapter = fixture_adapter(&f, &model);
        let expected_modules = f.json["lora"]["num_lora_modules"].as_u64().map(|n| n as usize);
        if let Some(n) = expected_modules {
            assert_eq!(adapter.module_names().count(), n, "{}: adapted modules", f.name);
        }
        let listed: Option<Vec<String>> = serde_json::from_value(f.json["lora"]["lora_modules"].clone()).ok();
        if let Some(listed) = listed {
            let ours: Vec<String> = adapter.module_names().cloned().collect();
            assert_eq!(ours, listed, "{}: adapted module names", f.name);
        }

        let ctx = adapter.ctx(LoraMode::Eval, true);
        let out = model.forward(&f.inputs(), Some(&ctx)).unwrap();
        let err = max_abs_diff(&out, f.t("out.lora"));
        println!("{}: out.lora max abs error {err:.3e}", f.name);
        assert!(err <= FORWARD_TOL, "{}: out.lora error {err:e}", f.name);

        let loss = (&out - f.t("in.target")).unwrap().sqr().unwrap().mean_all().unwrap();
        let (ours, theirs) =
            (loss.to_scalar::<f32>().unwrap(), f.t("out.loss").flatten_all().unwrap().to_vec1::<f32>().unwrap()[0]);
        let rel = (ours - theirs).abs() / theirs.abs();
        println!("{}: loss {ours} vs {theirs}, relative error {rel:.3e}", f.name);
        assert!(rel <= LOSS_REL_TOL, "{}: loss relative error {rel:e}", f.name);

        let grads = loss.backward().unwrap();
        let mut worst = (0f32, String::new());
        for (key, var) in adapter.named_tensors() {
            let g = grads.get(&var).unwrap_or_else(|| panic!("{}: no gradient for {key}", f.name));
            let rel = max_rel_diff(g, f.t(&format!("grad.{key}")));
            if rel > worst.0 {
                worst = (rel, key.clone());
            }
            assert!(rel <= GRAD_REL_TOL, "{}: gradient of {key}: relative error {rel:e}", f.name);
        }
        println!("{}: worst LoRA gradient relative error {:.3e} ({})", f.name, worst.0, worst.1);
    }
}

#[test]
fn every_lora_tensor_and_nothing_frozen_gets_a_gradient() {
    for f in dit_fixtures() {
        let model = load_model(&f);
        let adapter = fixture_adapter(&f, &model);
        let ctx = adapter.ctx(LoraMode::Eval, true);
        let out = model.forward(&f.inputs(), Some(&ctx)).unwrap();
        let diff = ops::sub(&out, f.t("in.target")).unwrap();
        let grads = diff.sqr().unwrap().mean_all().unwrap().backward().unwrap();

        let vars = adapter.vars();
        for v in &vars {
            let g = grads.get(v).expect("every LoRA tensor has a gradient");
            let values = g.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert!(values.iter().all(|x| x.is_finite()), "{}: non-finite gradient", f.name);
            assert!(values.iter().any(|x| *x != 0.0), "{}: all-zero gradient", f.name);
        }
        // Backward leaves gradients for leaves only; anything but a LoRA tensor there
        // means a frozen weight (or a constant) had its gradient computed.
        let lora_ids: HashSet<_> = vars.iter().map(|v| v.id()).collect();
        let stray = grads.get_ids().filter(|id| !lora_ids.contains(id)).count();
        assert_eq!(stray, 0, "{}: {stray} non-LoRA tensors received gradients", f.name);
    }
}

#[test]
fn peft_adapter_directory_reproduces_lora_output_and_round_trips() {
    for f in dit_fixtures() {
        let dir = f.weights.with_file_name(format!("{}_peft_adapter", f.name));
        if !dir.is_dir() {
            println!("{}: no PEFT adapter directory beside it", f.name);
            continue;
        }
        let model = load_model(&f);
        // A model already carrying (and trained with) an adapter: loading another
        // replaces it; nothing of the first stacks on the second.
        let first = LoraAdapter::new(f.lora_config(), &model, 99).unwrap();
        model.forward(&f.inputs(), Some(&first.ctx(LoraMode::Eval, true))).unwrap();
        let adapter = LoraAdapter::load(&dir, &model).unwrap();
        let out = model.forward(&f.inputs(), Some(&adapter.ctx(LoraMode::Eval, false))).unwrap();
        let err = max_abs_diff(&out, f.t("out.lora"));
        println!("{}: PEFT adapter out.lora max abs error {err:.3e}", f.name);
        assert!(err <= FORWARD_TOL);
        let base = model.forward(&f.inputs(), None).unwrap();
        assert!(max_abs_diff(&base, f.t("out.base")) <= FORWARD_TOL, "base weights untouched");

        let saved = tempfile::tempdir().unwrap();
        adapter.save(saved.path()).unwrap();
        let original = candle_core::safetensors::load(dir.join("adapter_model.safetensors"), &Device::Cpu).unwrap();
        let written =
            candle_core::safetensors::load(saved.path().join("adapter_model.safetensors"), &Device::Cpu).unwrap();
        assert_eq!(sorted_keys(&original), sorted_keys(&written));
        for (k, t) in &original {
            assert_eq!(max_abs_diff(t, &written[k]), 0.0, "{k} changed on a round trip");
        }
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(saved.path().join("adapter_config.json")).unwrap()).unwrap();
        assert_eq!(config["peft_type"], "LORA");
        assert_eq!(config["task_type"], "FEATURE_EXTRACTION");
        assert_eq!(config["bias"], "none");
    }
}

fn sorted_keys(m: &HashMap<String, Tensor>) -> Vec<String> {
    let mut k: Vec<String> = m.keys().cloned().collect();
    k.sort();
    k
}

fn to_diffusers(name: &str) -> String {
    let n = name.replace("proj_in.1.", "proj_in_conv.").replace("proj_out.1.", "proj_out_conv.");
    n.replace(".q_proj.", ".to_q.")
        .replace(".k_proj.", ".to_k.")
        .replace(".v_proj.", ".to_v.")
        .replace(".o_proj.", ".to_out.0.")
        .replace(".q_norm.", ".norm_q.")
        .replace(".k_norm.", ".norm_k.")
}

#[test]
fn diffusers_naming_and_unprefixed_files_load_identically() {
    for f in dit_fixtures() {
        let cfg = f.config();
        let dir = tempfile::tempdir().unwrap();
        let decoder = f.group("decoder.");
        let renamed: HashMap<String, Tensor> = decoder.iter().map(|(k, t)| (to_diffusers(k), t.clone())).collect();
        // Split across two files, as sharded checkpoints are.
        let (first, second): (HashMap<_, _>, HashMap<_, _>) =
            renamed.into_iter().partition(|(k, _)| k.starts_with("layers.0") || !k.starts_with("layers."));
        let (a, b) = (dir.path().join("a.safetensors"), dir.path().join("b.safetensors"));
        candle_core::safetensors::save(&first, &a).unwrap();
        candle_core::safetensors::save(&second, &b).unwrap();
        let w = DecoderWeights::load(&[a.as_path(), b.as_path()], &cfg, DType::F32, &Device::Cpu).unwrap();
        let out = DitModel::new(&cfg, &w).unwrap().forward(&f.inputs(), None).unwrap();
        let err = max_abs_diff(&out, f.t("out.base"));
        println!("{}: diffusers-named, sharded: out.base max abs error {err:.3e}", f.name);
        assert!(err <= FORWARD_TOL);
    }
}

#[test]
fn missing_unexpected_and_misshapen_tensors_are_named() {
    let f = dit_fixtures().remove(0);
    let cfg = f.config();
    let dir = tempfile::tempdir().unwrap();
    let write = |tensors: &HashMap<String, Tensor>| {
        let p = dir.path().join("w.safetensors");
        candle_core::safetensors::save(tensors, &p).unwrap();
        let err = DecoderWeights::load(&[p.as_path()], &cfg, DType::F32, &Device::Cpu).err().expect("load fails");
        err.to_string()
    };
    let mut t = f.group("decoder.");
    t.remove("layers.1.mlp.up_proj.weight");
    let msg = write(&t);
    assert!(msg.contains("layers.1.mlp.up_proj.weight") && msg.contains("missing"), "{msg}");

    let mut t = f.group("decoder.");
    t.insert("layers.0.self_attn.q_proj.weight".into(), Tensor::zeros((3, 5), DType::F32, &Device::Cpu).unwrap());
    let msg = write(&t);
    assert!(msg.contains("layers.0.self_attn.q_proj.weight") && msg.contains("[3, 5]"), "{msg}");

    let mut t = f.group("decoder.");
    t.insert("layers.0.extra.weight".into(), Tensor::zeros(2, DType::F32, &Device::Cpu).unwrap());
    let msg = write(&t);
    assert!(msg.contains("layers.0.extra.weight"), "{msg}");

    let missing = DecoderWeights::load(&[Path::new("/nonexistent/model.safetensors")], &cfg, DType::F32, &Device::Cpu);
    assert!(missing.err().unwrap().to_string().contains("/nonexistent/model.safetensors"));
}

#[test]
fn bf16_weights_convert_at_load_and_stay_close() {
    let f = dit_fixtures().remove(0);
    let cfg = f.config();
    let w = DecoderWeights::load(&[f.weights.as_path()], &cfg, DType::BF16, &Device::Cpu).unwrap();
    let model = DitModel::new(&cfg, &w).unwrap();
    assert_eq!(model.dtype(), DType::BF16);
    let out = model.forward(&f.inputs(), None).unwrap();
    assert_eq!(out.dtype(), DType::BF16);
    let rel = max_rel_diff(&out, f.t("out.base"));
    println!("{}: bf16 forward relative error {rel:.3e}", f.name);
    assert!(rel < 0.05, "bf16 forward relative error {rel}");
}

#[test]
fn merged_weights_forward_equals_lora_forward_and_comfyui_file_is_complete() {
    use ostinato_engine::export::{write_comfyui, write_merged};
    for f in dit_fixtures() {
        let cfg = f.config();
        let weights = DecoderWeights::load(&[f.weights.as_path()], &cfg, DType::F32, &Device::Cpu).unwrap();
        let model = DitModel::new(&cfg, &weights).unwrap();
        let adapter = fixture_adapter(&f, &model);
        let dir = tempfile::tempdir().unwrap();

        let merged_path = dir.path().join("merged.safetensors");
        write_merged(&weights, &adapter, &merged_path).unwrap();
        let merged = DecoderWeights::load(&[merged_path.as_path()], &cfg, DType::F32, &Device::Cpu).unwrap();
        let out = DitModel::new(&cfg, &merged).unwrap().forward(&f.inputs(), None).unwrap();
        let err = max_abs_diff(&out, f.t("out.lora"));
        println!("{}: merged model vs out.lora max abs error {err:.3e}", f.name);
        assert!(err <= FORWARD_TOL);

        let comfy_path = dir.path().join("comfy.safetensors");
        write_comfyui(&adapter, &weights, &comfy_path).unwrap();
        let comfy = candle_core::safetensors::load(&comfy_path, &Device::Cpu).unwrap();
        let modules = adapter.module_names().count();
        assert_eq!(comfy.len(), 3 * modules);
        let m = "layers.0.self_attn.q_proj";
        let down = &comfy[&format!("diffusion_model.decoder.{m}.lora_down.weight")];
        assert_eq!(max_abs_diff(down, f.t(&format!("lora.{m}.lora_A.weight"))), 0.0);
        let alpha = comfy[&format!("diffusion_model.decoder.{m}.alpha")].to_scalar::<f32>().unwrap();
        assert_eq!(alpha as f64 / adapter.config.r as f64, adapter.config.scaling());
    }
}

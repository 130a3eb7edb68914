//! LoKr and DoRA against the libraries upstream trains them with: every case of every
//! `adapters_*` fixture (LyCORIS's LoKr, PEFT's DoRA on the tiny DiT, made by
//! `scripts/make-adapter-fixtures`): forward, loss, every adapter gradient, the merged
//! weights, strength 0, and the adapter's own file read back.

mod common;

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use common::{adapter_fixtures, max_abs_diff, max_rel_diff, Fixture};
use ostinato_engine::lora::{AdapterKind, LoraAdapter, LoraConfig, LoraMode};
use ostinato_engine::model::{DecoderWeights, DitModel};

const FORWARD_TOL: f32 = 1e-5;
const LOSS_REL_TOL: f32 = 1e-5;
const GRAD_REL_TOL: f32 = 1e-4;

/// The adapter settings a fixture case was made with (upstream's LoKr names, PEFT's).
fn case_config(spec: &serde_json::Value) -> LoraConfig {
    let c = &spec["config"];
    let targets = serde_json::from_value(c["target_modules"].clone()).expect("targets");
    match spec["kind"].as_str() {
        Some("lokr") => LoraConfig {
            kind: AdapterKind::Lokr,
            r: c["linear_dim"].as_u64().expect("linear_dim") as usize,
            alpha: c["linear_alpha"].as_f64().expect("linear_alpha"),
            dropout: 0.0,
            target_modules: targets,
            use_dora: c["weight_decompose"].as_bool().expect("weight_decompose"),
            factor: c["factor"].as_i64().expect("factor"),
            decompose_both: c["decompose_both"].as_bool().expect("decompose_both"),
            ..LoraConfig::default()
        },
        Some("lora") => LoraConfig {
            r: c["r"].as_u64().expect("r") as usize,
            alpha: c["alpha"].as_f64().expect("alpha"),
            dropout: 0.0,
            target_modules: targets,
            use_dora: c["use_dora"].as_bool().expect("use_dora"),
            ..LoraConfig::default()
        },
        other => panic!("unknown case kind {other:?}"),
    }
}

fn load_model(f: &Fixture) -> DitModel {
    let w = DecoderWeights::load(&[f.weights.as_path()], &f.config(), DType::F32, &Device::Cpu).unwrap();
    DitModel::new(&f.config(), &w).unwrap()
}

/// Each case of `f`: its name, settings and adapter tensors (`<module>.<param>`).
fn cases(f: &Fixture, model: &DitModel) -> Vec<(String, LoraAdapter)> {
    let cases = f.json["cases"].as_object().expect("cases");
    assert!(!cases.is_empty(), "{}: no cases", f.name);
    cases
        .iter()
        .map(|(case, spec)| {
            let tensors: HashMap<String, Tensor> =
                f.group(&format!("{case}.")).into_iter().filter(|(k, _)| k.starts_with("layers.")).collect();
            let adapter = LoraAdapter::from_tensors(case_config(spec), model, &tensors, &f.weights)
                .unwrap_or_else(|e| panic!("{}/{case}: {e}", f.name));
            let listed: Vec<String> = serde_json::from_value(spec["modules"].clone()).expect("modules");
            assert_eq!(adapter.module_names().cloned().collect::<Vec<_>>(), listed, "{}/{case}: modules", f.name);
            (case.clone(), adapter)
        })
        .collect()
}

#[test]
fn lokr_and_dora_forward_loss_and_gradients_match_lycoris_and_peft() {
    for f in adapter_fixtures() {
        let model = load_model(&f);
        for (case, adapter) in cases(&f, &model) {
            let name = format!("{}/{case}", f.name);
            let out = model.forward(&f.inputs(), Some(&adapter.ctx(LoraMode::Eval, true))).unwrap();
            let err = max_abs_diff(&out, f.t(&format!("{case}.out")));
            println!("{name}: output max abs error {err:.3e}");
            assert!(err <= FORWARD_TOL, "{name}: output error {err:e}");

            let loss = (&out - f.t("in.target")).unwrap().sqr().unwrap().mean_all().unwrap();
            let ours = loss.to_scalar::<f32>().unwrap();
            let theirs = f.t(&format!("{case}.loss")).flatten_all().unwrap().to_vec1::<f32>().unwrap()[0];
            let rel = (ours - theirs).abs() / theirs.abs();
            println!("{name}: loss {ours} vs {theirs}, relative error {rel:.3e}");
            assert!(rel <= LOSS_REL_TOL, "{name}: loss relative error {rel:e}");

            let grads = loss.backward().unwrap();
            let mut worst = (0f32, String::new());
            let named = adapter.named_tensors();
            for ((key, _), var) in named.iter().zip(adapter.vars()) {
                let g = grads.get(&var).unwrap_or_else(|| panic!("{name}: no gradient for {key}"));
                let rel = max_rel_diff(g, f.t(&format!("{case}.grad.{key}")));
                if rel > worst.0 {
                    worst = (rel, key.clone());
                }
                assert!(rel <= GRAD_REL_TOL, "{name}: gradient of {key}: relative error {rel:e}");
            }
            let in_fixture = f.group(&format!("{case}.grad.")).len();
            assert_eq!(named.len(), in_fixture, "{name}: every reference gradient is checked");
            println!("{name}: {} gradients, worst relative error {:.3e} ({})", named.len(), worst.0, worst.1);
        }
    }
}

#[test]
fn lokr_and_dora_merged_weights_match_the_libraries_and_strength_zero_is_the_base() {
    for f in adapter_fixtures() {
        let model = load_model(&f);
        let base_out = model.forward(&f.inputs(), None).unwrap();
        for (case, adapter) in cases(&f, &model) {
            let name = format!("{}/{case}", f.name);
            let merged = f.group(&format!("{case}.merged."));
            assert!(!merged.is_empty(), "{name}: no merged weights in the fixture");
            for (key, reference) in &merged {
                let module = key.strip_suffix(".weight").expect("merged weights end in .weight");
                let base = f.t(&format!("decoder.{key}"));
                let ours = adapter.merged_weight(module, base).unwrap().expect("an adapted module");
                let err = max_abs_diff(&ours, reference);
                println!("{name}: merged {module} max abs error {err:.3e}");
                assert!(err <= FORWARD_TOL, "{name}: merged {module} error {err:e}");
            }
            let off = adapter.ctx(LoraMode::Eval, false).with_strength(0.0);
            let err = max_abs_diff(&model.forward(&f.inputs(), Some(&off)).unwrap(), &base_out);
            println!("{name}: strength 0 vs no adapter max abs {err:.3e}");
            assert!(err <= 1e-6, "{name}: strength 0 must add nothing ({err:e})");
        }
    }
}

#[test]
fn lokr_and_dora_files_are_written_as_upstream_reads_them_and_read_back_exactly() {
    for f in adapter_fixtures() {
        let model = load_model(&f);
        for (case, adapter) in cases(&f, &model) {
            let name = format!("{}/{case}", f.name);
            let dir = tempfile::tempdir().unwrap();
            adapter.save(dir.path()).unwrap();
            let (file, metadata) = match adapter.config.kind {
                AdapterKind::Lokr => ("lokr_weights.safetensors", &["algo", "format", "lokr_config"][..]),
                AdapterKind::Lora => ("adapter_model.safetensors", &["format", "lora_adapter_metadata"][..]),
            };
            let bytes = std::fs::read(dir.path().join(file)).unwrap();
            let saved = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
            let header = header.metadata().clone().unwrap_or_default();
            assert!(metadata.iter().all(|k| header.contains_key(*k)), "{name}: header {header:?}");
            let keys: Vec<String> = saved.names().into_iter().map(String::from).collect();
            // The keys the library saved for one module, ACE-Step's module names for
            // diffusers' (LyCORIS's keys are relative to the decoder, `.alpha` beside each).
            let one: Vec<String> = serde_json::from_value(f.json["cases"][&case]["saved_keys"].clone()).unwrap();
            let expected: Vec<String> = one.iter().map(|k| k.replace("to_k", "k_proj")).collect();
            for key in &expected {
                assert!(keys.contains(key), "{name}: `{key}` not written (have {} keys)", keys.len());
            }
            match adapter.config.kind {
                AdapterKind::Lokr => {
                    let config: serde_json::Value = serde_json::from_str(&header["lokr_config"]).unwrap();
                    assert_eq!(header["algo"], "lokr");
                    assert_eq!(config["linear_dim"], f.json["cases"][&case]["config"]["linear_dim"], "{name}");
                    let alpha = saved.tensor("lycoris_layers_0_cross_attn_k_proj.alpha").unwrap();
                    let alpha = f32::from_le_bytes(alpha.data().try_into().unwrap());
                    assert_eq!(alpha as f64, f.json["cases"][&case]["alpha_buffer"].as_f64().unwrap(), "{name}: alpha");
                }
                AdapterKind::Lora => {
                    let meta: serde_json::Value = serde_json::from_str(&header["lora_adapter_metadata"]).unwrap();
                    assert_eq!(meta["transformer.use_dora"], true, "{name}: diffusers reads DoRA from here");
                }
            }
            let back = LoraAdapter::load(dir.path(), &model).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(back.config, adapter.config, "{name}: settings read back");
            let same = |a: &LoraAdapter| model.forward(&f.inputs(), Some(&a.ctx(LoraMode::Eval, false))).unwrap();
            assert_eq!(max_abs_diff(&same(&back), &same(&adapter)), 0.0, "{name}: read back bit for bit");
            println!("{name}: {file}: {} tensors, read back bit for bit", keys.len());
        }
    }
}

/// ComfyUI's merge of a weight from our ComfyUI file, as its `weight_adapter` code does
/// it (lora.py, lokr.py, base.py's `weight_decompose` with `dora_scale` on the output
/// axis): `W + alpha / rank * up down` or `W + alpha / dim * kron(w1, w2)` (scale 1 when
/// no half is a product), then `* dora_scale / (|W| + eps)` per row with DoRA.
fn comfyui_merge(file: &HashMap<String, Tensor>, module: &str, w: &Tensor) -> Tensor {
    let key = |k: &str| format!("diffusion_model.decoder.{module}.{k}");
    let get = |k: &str| file.get(&key(k)).cloned();
    let alpha = get("alpha").expect("alpha").to_scalar::<f32>().unwrap() as f64;
    let product = |a: &str, b: &str| get(a).map(|a| a.matmul(&get(b).unwrap()).unwrap());
    let diff = match get("lora_up.weight") {
        Some(up) => {
            let down = get("lora_down.weight").unwrap();
            (up.matmul(&down).unwrap() * (alpha / down.dims()[0] as f64)).unwrap()
        }
        None => {
            let (w1, w2) = (
                get("lokr_w1").or_else(|| product("lokr_w1_a", "lokr_w1_b")).unwrap(),
                get("lokr_w2").or_else(|| product("lokr_w2_a", "lokr_w2_b")).unwrap(),
            );
            let dim = get("lokr_w2_b").or_else(|| get("lokr_w1_b")).map(|b| b.dims()[0] as f64);
            let ((a, c), (b, d)) = (w1.dims2().unwrap(), w2.dims2().unwrap());
            let kron = w1.reshape((a, 1, c, 1)).unwrap().broadcast_mul(&w2.reshape((1, b, 1, d)).unwrap()).unwrap();
            (kron.reshape((a * b, c * d)).unwrap() * dim.map_or(1.0, |dim| alpha / dim)).unwrap()
        }
    };
    let calc = (w + diff).unwrap();
    match get("dora_scale") {
        None => calc,
        Some(scale) => {
            let norm = (w.sqr().unwrap().sum_keepdim(1).unwrap().sqrt().unwrap() + f32::EPSILON as f64).unwrap();
            calc.broadcast_mul(&scale.div(&norm).unwrap()).unwrap()
        }
    }
}

#[test]
fn comfyui_files_merge_to_the_libraries_weights_under_comfyuis_rules() {
    use ostinato_engine::export::write_comfyui;
    for f in adapter_fixtures() {
        let model = load_model(&f);
        let weights = DecoderWeights::load(&[f.weights.as_path()], &f.config(), DType::F32, &Device::Cpu).unwrap();
        for (case, adapter) in cases(&f, &model) {
            let name = format!("{}/{case}", f.name);
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("comfy.safetensors");
            write_comfyui(&adapter, &weights, &path).unwrap();
            let file = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
            // Every key is one ComfyUI reads for an adapted module of the decoder.
            let known = ["lora_down.weight", "lora_up.weight", "alpha", "dora_scale", "lokr_w1", "lokr_w1_a"];
            let known = [&known[..], &["lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b"]].concat();
            for key in file.keys() {
                let rest = key.strip_prefix("diffusion_model.decoder.").unwrap_or_else(|| panic!("{name}: `{key}`"));
                let read = adapter.module_names().any(|m| {
                    rest.strip_prefix(m.as_str()).and_then(|p| p.strip_prefix('.')).is_some_and(|p| known.contains(&p))
                });
                assert!(read, "{name}: ComfyUI reads no `{key}`");
            }
            for (key, reference) in f.group(&format!("{case}.merged.")) {
                let module = key.strip_suffix(".weight").unwrap();
                let err = max_abs_diff(&comfyui_merge(&file, module, f.t(&format!("decoder.{key}"))), &reference);
                println!("{name}: ComfyUI's merge of {module} vs the library's, max abs {err:.3e}");
                assert!(err <= FORWARD_TOL, "{name}: {module}: {err:e}");
            }
        }
    }
}

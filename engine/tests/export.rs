//! Exports that load everywhere at their trained strength: the PEFT file's header
//! carries diffusers' `lora_adapter_metadata` and `format: pt`, every file is readable
//! by others, and the merged model folder opens as a model and holds base + delta in
//! the source dtype.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use ostinato_engine::export::write_merged_model;
use ostinato_engine::load::folder::ModelFolder;
use ostinato_engine::lora::{LoraAdapter, LoraConfig, LORA_METADATA_KEY};
use ostinato_engine::model::DitModel;
use ostinato_engine::tensor_io::save_tensors;

fn real_model() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/real/model"))
}

/// An adapter on the real fixture model with non-zero A and B (a fresh one has B = 0).
fn adapter(model: &DitModel, config: LoraConfig) -> LoraAdapter {
    let fresh = LoraAdapter::new(config.clone(), model, 3).unwrap();
    let tensors: HashMap<String, Tensor> = fresh
        .named_tensors()
        .into_iter()
        .enumerate()
        .map(|(i, (k, t))| (k, Tensor::randn_like(&t, 0.0, 0.05 * (1 + i % 3) as f64).unwrap()))
        .collect();
    LoraAdapter::from_tensors(config, model, &tensors, Path::new("test")).unwrap()
}

fn header(path: &Path) -> HashMap<String, String> {
    let bytes = std::fs::read(path).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    meta.metadata().clone().unwrap_or_default()
}

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn open_model() -> (ModelFolder, DitModel) {
    let folder = ModelFolder::open(real_model(), None).unwrap();
    let weights = folder.load_decoder(DType::F32, &Device::Cpu).unwrap();
    let model = DitModel::new(&folder.dit, &weights).unwrap();
    (folder, model)
}

#[test]
fn peft_header_carries_diffusers_metadata_and_format_pt() {
    let (_, model) = open_model();
    for (r, alpha, rslora) in [(4, 12.0, false), (8, 4.0, true)] {
        let config = LoraConfig {
            r,
            alpha,
            use_rslora: rslora,
            target_modules: ["q_proj", "k_proj", "v_proj", "o_proj", "self_attn.q_proj"].map(String::from).to_vec(),
            ..Default::default()
        };
        let a = adapter(&model, config);
        let dir = tempfile::tempdir().unwrap();
        a.save(dir.path()).unwrap();
        let file = dir.path().join("adapter_model.safetensors");
        let meta = header(&file);
        assert_eq!(meta.get("format").map(String::as_str), Some("pt"), "{meta:?}");
        let raw = &meta[LORA_METADATA_KEY];
        println!("r {r}, alpha {alpha}, rsLoRA {rslora}: {raw}");
        let lora: serde_json::Value = serde_json::from_str(raw).unwrap();
        assert_eq!(lora["transformer.r"], r);
        assert_eq!(lora["transformer.lora_alpha"], alpha);
        assert_eq!(lora["transformer.use_rslora"], rslora);
        assert_eq!(lora["transformer.peft_type"], "LORA");
        let targets: Vec<&str> =
            lora["transformer.target_modules"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
        assert_eq!(targets, ["self_attn.to_q", "to_k", "to_out.0", "to_q", "to_v"]);
        // Every key under diffusers' `transformer.` prefix, sorted, two-space indent.
        let keys: Vec<&String> = lora.as_object().unwrap().keys().collect();
        assert!(keys.iter().all(|k| k.starts_with("transformer.")), "{keys:?}");
        assert!(raw.starts_with("{\n  \"transformer.alpha_pattern\": {},\n"), "{raw}");
        // The adapter reads back the same (PEFT's loader ignores the header).
        let back = LoraAdapter::load(dir.path(), &model).unwrap();
        assert_eq!(back.config.scaling(), a.config.scaling());
    }
}

/// diffusers' loader puts its LoRA layers in training mode into an eval-mode model, so
/// the header's dropout would run at inference: it says 0. adapter_config.json (PEFT,
/// loaded in inference mode) keeps the training setting.
#[test]
fn the_diffusers_metadata_has_no_dropout_and_the_peft_config_keeps_it() {
    let (_, model) = open_model();
    let config = LoraConfig { r: 4, alpha: 8.0, dropout: 0.1, ..Default::default() };
    let a = adapter(&model, config);
    let dir = tempfile::tempdir().unwrap();
    a.save(dir.path()).unwrap();
    let meta = header(&dir.path().join("adapter_model.safetensors"));
    let lora: serde_json::Value = serde_json::from_str(&meta[LORA_METADATA_KEY]).unwrap();
    assert_eq!(lora["transformer.lora_dropout"].as_f64(), Some(0.0), "{lora}");
    let peft: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(peft["lora_dropout"].as_f64(), Some(0.1), "{peft}");
    assert_eq!(LoraAdapter::load(dir.path(), &model).unwrap().config.dropout, 0.1);
}

#[cfg(unix)]
#[test]
fn every_exported_file_is_readable_by_others() {
    use ostinato_engine::export::{write_comfyui, write_merged};
    let (folder, model) = open_model();
    let a = adapter(&model, LoraConfig { r: 4, alpha: 8.0, ..Default::default() });
    let dir = tempfile::tempdir().unwrap();
    let peft = dir.path().join("peft");
    a.save(&peft).unwrap();
    let comfy = dir.path().join("comfy.safetensors");
    let weights = folder.load_decoder(DType::F32, &Device::Cpu).unwrap();
    write_comfyui(&a, &weights, &comfy).unwrap();
    let merged = dir.path().join("merged.safetensors");
    write_merged(&weights, &a, &merged).unwrap();
    let model_dir = dir.path().join("acestep-v15-mine");
    write_merged_model(&folder.dit_dir, &a, &model_dir).unwrap();
    let mut files = vec![peft.join("adapter_model.safetensors"), comfy, merged, model_dir.clone()];
    files.extend(std::fs::read_dir(&model_dir).unwrap().map(|e| e.unwrap().path()));
    for f in &files {
        let m = mode(f);
        println!("{:o} {}", m, f.display());
        assert_eq!(m & 0o044, 0o044, "{} is {m:o}: others cannot read it", f.display());
    }
    assert_eq!(mode(&peft.join("adapter_model.safetensors")), 0o644);
}

/// The fixture model folder copied, its DiT weights converted to `dtype`.
fn model_copy(dtype: DType) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(real_model(), dir.path());
    let weights = dir.path().join("acestep-v15-turbo/model.safetensors");
    let tensors = candle_core::safetensors::load(&weights, &Device::Cpu).unwrap();
    let converted = tensors.into_iter().map(|(k, t)| (k, t.to_dtype(dtype).unwrap())).collect();
    save_tensors(&converted, &weights).unwrap();
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let target = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &target)
        } else {
            std::fs::copy(&p, &target).unwrap();
        }
    }
}

#[test]
fn merged_model_opens_as_a_model_and_holds_base_plus_delta_in_the_source_dtype() {
    let root = model_copy(DType::BF16);
    let source = ModelFolder::open(root.path(), None).unwrap();
    let model = DitModel::new(&source.dit, &source.load_decoder(DType::F32, &Device::Cpu).unwrap()).unwrap();
    let base = candle_core::safetensors::load(source.dit_weights(), &Device::Cpu).unwrap();
    for (name, r, alpha, rslora) in [("acestep-v15-alpha", 4, 12.0, false), ("acestep-v15-rslora", 8, 4.0, true)] {
        let a = adapter(&model, LoraConfig { r, alpha, use_rslora: rslora, ..Default::default() });
        let out = root.path().join(name);
        write_merged_model(&source.dit_dir, &a, &out).unwrap();

        let opened = ModelFolder::open(root.path(), Some(name)).unwrap();
        assert_eq!(opened.dit_dir, out.canonicalize().unwrap());
        for file in ["config.json", "silence_latent.pt"] {
            assert_eq!(
                std::fs::read(out.join(file)).unwrap(),
                std::fs::read(source.dit_dir.join(file)).unwrap(),
                "{file}"
            );
        }
        let merged = candle_core::safetensors::load(opened.dit_weights(), &Device::Cpu).unwrap();
        assert_eq!(merged.len(), base.len());
        let scaling = if rslora { alpha / (r as f64).sqrt() } else { alpha / r as f64 };
        let tensors: HashMap<String, Tensor> = a.named_tensors().into_iter().collect();
        let (mut adapted, mut worst) = (0, 0f32);
        for (key, b) in &base {
            let m = &merged[key];
            assert_eq!(m.dtype(), DType::BF16, "{key}");
            let module = key.strip_prefix("decoder.").and_then(|k| k.strip_suffix(".weight"));
            match module.filter(|m| a.adapts(m)) {
                Some(module) => {
                    adapted += 1;
                    let (la, lb) =
                        (&tensors[&format!("{module}.lora_A.weight")], &tensors[&format!("{module}.lora_B.weight")]);
                    let expected =
                        (b.to_dtype(DType::F32).unwrap() + (lb.matmul(la).unwrap() * scaling).unwrap()).unwrap();
                    let rounded = expected.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap();
                    let err = max_abs(&m.to_dtype(DType::F32).unwrap(), &rounded);
                    worst = worst.max(err);
                    assert_eq!(err, 0.0, "{key}: merged differs from bf16(base + scaling B A)");
                    assert!(max_abs(&rounded, &b.to_dtype(DType::F32).unwrap()) > 0.0, "{key}: the delta is not there");
                }
                None => assert_eq!(
                    max_abs(&m.to_dtype(DType::F32).unwrap(), &b.to_dtype(DType::F32).unwrap()),
                    0.0,
                    "{key}"
                ),
            }
        }
        println!("{name}: {adapted} merged weights, max abs error against bf16(base + {scaling} B A) {worst:e}");
        assert_eq!(adapted, a.module_names().count());
        // The merged folder trains and loads as any model folder: its decoder has the weights.
        let w = opened.load_decoder(DType::F32, &Device::Cpu).unwrap();
        DitModel::new(&opened.dit, &w).unwrap();
    }
}

#[test]
fn merged_model_never_writes_into_the_source_or_over_a_folder() {
    let root = model_copy(DType::F32);
    let source = ModelFolder::open(root.path(), None).unwrap();
    let model = DitModel::new(&source.dit, &source.load_decoder(DType::F32, &Device::Cpu).unwrap()).unwrap();
    let a = adapter(&model, LoraConfig { r: 4, alpha: 8.0, ..Default::default() });
    let before = std::fs::read_dir(&source.dit_dir).unwrap().count();
    let inside = write_merged_model(&source.dit_dir, &a, &source.dit_dir.join("merged")).unwrap_err().to_string();
    assert!(inside.contains("inside the source model folder"), "{inside}");
    assert_eq!(std::fs::read_dir(&source.dit_dir).unwrap().count(), before);
    let taken = write_merged_model(&source.dit_dir, &a, &root.path().join("vae")).unwrap_err().to_string();
    assert!(taken.contains("already exists"), "{taken}");
    let leftovers: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains("partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

fn max_abs(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

/// The trigger word goes with the adapter: in adapter_config.json and the header of the
/// PEFT file, in the LoKr file's header and in the ComfyUI file's, and it reads back.
#[test]
fn the_trigger_word_is_kept_in_every_adapter_file_and_reads_back() {
    use ostinato_engine::data::{TagMode, TriggerTag};
    use ostinato_engine::export::write_comfyui;
    use ostinato_engine::lora::AdapterKind;
    let (folder, model) = open_model();
    let weights = folder.load_decoder(DType::F32, &Device::Cpu).unwrap();
    let trigger = TriggerTag { tag: "ostn style".into(), mode: TagMode::Append };
    for kind in [AdapterKind::Lora, AdapterKind::Lokr] {
        let config = LoraConfig { kind, r: 4, alpha: 8.0, dropout: 0.0, ..Default::default() };
        let a = adapter(&model, config).with_trigger(Some(trigger.clone()));
        let dir = tempfile::tempdir().unwrap();
        a.save(dir.path()).unwrap();
        let weights_file = LoraAdapter::weights_file(dir.path());
        let saved = header(&weights_file);
        assert_eq!(saved.get("trigger_word").map(String::as_str), Some("ostn style"), "{kind:?}: {saved:?}");
        assert_eq!(saved.get("tag_position").map(String::as_str), Some("append"), "{kind:?}");
        if kind == AdapterKind::Lora {
            let config: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.path().join("adapter_config.json")).unwrap()).unwrap();
            assert_eq!(
                (config["trigger_word"].as_str(), config["tag_position"].as_str()),
                (Some("ostn style"), Some("append"))
            );
        }
        assert_eq!(LoraAdapter::load(dir.path(), &model).unwrap().trigger.as_ref(), Some(&trigger), "{kind:?}");
        let summary = LoraAdapter::describe(dir.path()).unwrap();
        assert_eq!((summary.config.kind, summary.trigger.as_ref()), (kind, Some(&trigger)));
        let comfy = dir.path().join("comfy.safetensors");
        write_comfyui(&a, &weights, &comfy).unwrap();
        assert_eq!(header(&comfy).get("trigger_word").map(String::as_str), Some("ostn style"), "{kind:?}");
        println!("{kind:?}: trigger `{}` ({}) in its files and in ComfyUI's", trigger.tag, trigger.mode.name());
    }
    // An adapter without one writes no trigger keys.
    let plain = adapter(&model, LoraConfig { r: 4, alpha: 8.0, ..Default::default() });
    let dir = tempfile::tempdir().unwrap();
    plain.save(dir.path()).unwrap();
    assert!(!header(&dir.path().join("adapter_model.safetensors")).contains_key("trigger_word"));
    assert_eq!(LoraAdapter::describe(dir.path()).unwrap().trigger, None);
}

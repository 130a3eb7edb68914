//! The training step's shape as a GPU runs it, checked on the CPU (`bench::trace`):
//! no large product in f32 under bf16 compute, nothing read back to the host but the
//! loss and the gradient norm, and no more candle ops per layer than the step makes
//! today. One test: the trace is process-wide.

use std::path::Path;

use ostinato_engine::bench::trace::{trace_step, StepTrace};
use ostinato_engine::bench::{BenchSpec, Preset};
use ostinato_engine::lora::AdapterKind;
use ostinato_engine::train::optim::OptimizerConfig;

/// Candle ops (tensors made) one layer adds to a step with AdamW, at most, with
/// checkpointing off and on: what the step makes since RMSNorm, softmax and RoPE became
/// one node each without the CPU kernels (1479 and 1790.5 before; 1623 and 1934.5
/// before AdamW updated runs of parameters as one vector), so a change that adds ops to
/// a layer fails here and must say why.
const MAX_OPS_PER_LAYER: [(bool, f64); 2] = [(false, 1165.0), (true, 1362.5)];

/// small-30s at two layers on a 44 s clip: at its 550 patches every linear and
/// attention's products are above `trace::LARGE_FLOPS`, and self-attention's 2.4M
/// scores past `attention::RECOMPUTE_ELEMENTS`, so its backward recomputes them.
fn spec() -> BenchSpec {
    BenchSpec { frames: 1100, ..Preset::Small30s.spec().with_layers(2) }
}

fn optimizer(name: &str) -> OptimizerConfig {
    OptimizerConfig::named(name).expect("a known optimizer")
}

fn check(trace: &StepTrace, reads: &[&str], wrong: &mut Vec<String>) {
    println!("{}", trace.table());
    if !trace.large_f32_products.is_empty() {
        wrong.push(format!("{}: large products in f32 under bf16: {:?}", trace.preset, trace.large_f32_products));
    }
    let read: Vec<&str> = trace.reads.iter().map(|r| r.what).collect();
    if read != reads {
        wrong.push(format!("{} ({}): read back {read:?}, expected {reads:?}", trace.preset, trace.optimizer));
    }
}

#[test]
fn the_step_as_a_gpu_runs_it_keeps_its_products_in_bf16_reads_back_only_loss_and_norm_and_no_more_ops() {
    let mut wrong = Vec::new();
    for (checkpointing, max_ops) in MAX_OPS_PER_LAYER {
        let trace = trace_step("small-30s, 2 layers", &spec(), checkpointing, &optimizer("adamw")).unwrap();
        check(&trace, &["loss", "gradient norm"], &mut wrong);
        if trace.ops_per_layer > max_ops {
            wrong.push(format!(
                "checkpointing {checkpointing}: {} candle ops a layer, above the {max_ops} the step made",
                trace.ops_per_layer
            ));
        }
        if trace.bf16_product_flops <= trace.f32_product_flops {
            wrong.push(format!("checkpointing {checkpointing}: most product FLOPs are not bf16"));
        }
    }
    let adafactor = trace_step("small-30s, adafactor", &spec(), true, &optimizer("adafactor")).unwrap();
    check(&adafactor, &["loss", "gradient norm"], &mut wrong);
    // Prodigy's step size is the package's `.item()`s: two sums a tensor, read together.
    let prodigy = trace_step("small-30s, prodigy", &spec(), true, &optimizer("prodigy")).unwrap();
    check(&prodigy, &["loss", "gradient norm", "prodigy estimate"], &mut wrong);
    for (kind, dora) in [(AdapterKind::Lora, true), (AdapterKind::Lokr, false)] {
        let mut spec = spec();
        spec.lora.choose(kind);
        spec.lora.use_dora = dora;
        let name = spec.lora.describe();
        let trace = trace_step(&name, &spec, true, &optimizer("adamw")).unwrap();
        check(&trace, &["loss", "gradient norm"], &mut wrong);
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The step's code reads back and multiplies only through `trace`, so the trace above
/// sees every read-back and every product: a `to_vec`, `to_scalar` or `matmul` of
/// candle's elsewhere in the model, the adapters or the step fails here.
#[test]
fn every_product_and_read_back_of_the_step_goes_through_the_trace() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    collect(&src.join("model"), &mut files);
    // The adapters as the step runs them; not their files on disk (peft, lycoris).
    collect(&src.join("lora"), &mut files);
    files.retain(|f| !f.ends_with("lora/peft.rs") && !f.ends_with("lora/lycoris.rs"));
    let step = [
        "step",
        "grads",
        "flow",
        "loss_scale",
        "cfg_dropout",
        "optim/mod",
        "optim/adamw",
        "optim/adafactor",
        "optim/prodigy",
    ];
    for file in step {
        files.push(src.join("train").join(format!("{file}.rs")));
    }
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        // Test code reads back freely: it is cut off at its module.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (n, line) in code.lines().enumerate() {
            let line = line.split("//").next().unwrap_or_default();
            for call in [".to_vec0", ".to_vec1", ".to_vec2", ".to_vec3", ".to_scalar", ".matmul(", "broadcast_matmul("]
            {
                // A storage's `matmul` (BackendStorage, recorded by `trace::product`) takes four arguments.
                let storage_product = call == ".matmul(" && line.contains("bmnk") || line.contains("(batch, m, n, k)");
                if line.contains(call) && !storage_product {
                    found.push(format!("{}:{}: {}", file.strip_prefix(&src).unwrap().display(), n + 1, line.trim()));
                }
            }
        }
    }
    println!("{} files of the step checked", files.len());
    assert!(found.is_empty(), "outside `trace`:\n{}", found.join("\n"));
}

fn collect(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("tests.rs") {
            files.push(path);
        }
    }
}

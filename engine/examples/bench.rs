//! The bench with measurement-only switches the CLI does not offer (mimalloc, CUDA):
//!
//! ```text
//! cargo run --release -p ostinato-engine --example bench -- --preset small-30s \
//!     [--gradient-checkpointing on|off] [--json] [--warmup N] [--steps N] [--device cpu|cuda]
//! ```
//!
//! One invocation measures one configuration (peak RSS is per process).
//! Build with `--features mimalloc` to use mimalloc as the global allocator.

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use ostinato_engine::bench::{run_bench_on, Preset};

/// mimalloc v3's `mi_option_purge_delay` (mimalloc.h): -1 = never return freed pages to
/// the OS. Training allocates and frees the same large activations every step; with the
/// default 10 ms delay they were re-faulted (and zeroed by the kernel) each time:
/// 0.80x step time at small-240s (bench/NOTES.md).
#[cfg(feature = "mimalloc")]
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() {
    #[cfg(feature = "mimalloc")]
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a process-wide allocator option; no allocation is in flight.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
    // candle's elementwise pool spin-waits between ops; on 2 cores shared with other work
    // one elementwise thread measured 1.3-2x faster per step (bench/NOTES.md). GEMMs and
    // the fused ops still use rayon's threads. An explicit setting wins.
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let mut preset: Option<Preset> = None;
    let (mut ckpt, mut json, mut warmup, mut steps) = (false, false, 2usize, 5usize);
    let mut device_name = "cpu".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--preset" => preset = Some(value("--preset")?.parse()?),
            "--gradient-checkpointing" => {
                ckpt = match value("--gradient-checkpointing")?.as_str() {
                    "on" => true,
                    "off" => false,
                    v => return Err(format!("--gradient-checkpointing takes on|off, not `{v}`")),
                }
            }
            "--json" => json = true,
            "--warmup" => warmup = value("--warmup")?.parse().map_err(|e| format!("--warmup: {e}"))?,
            "--steps" => steps = value("--steps")?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--device" => device_name = value("--device")?,
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    let preset = preset.ok_or("--preset NAME is required")?;
    let (device, dtype) = match device_name.as_str() {
        "cpu" => (candle_core::Device::Cpu, candle_core::DType::F32),
        "cuda" => (
            candle_core::Device::new_cuda(0).map_err(|e| format!("cuda: {e}"))?,
            candle_core::DType::BF16,
        ),
        d => return Err(format!("unknown device `{d}`")),
    };
    let report = run_bench_on(preset, ckpt, warmup, steps, &device, dtype).map_err(|e| e.to_string())?;
    if json {
        println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

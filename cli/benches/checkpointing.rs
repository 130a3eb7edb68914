//! Gradient checkpointing's price and saving: median step time and peak memory with it
//! off and on, at 4, 8 and 16 layers of the `small-30s` shapes.
//!
//! ```text
//! cargo bench -p ostinato-cli --bench checkpointing [-- --preset NAME --steps N --warmup N]
//! ```
//!
//! Each configuration runs in its own `ostinato bench` process (peak RSS is per
//! process); off and on alternate for each layer count so both see the same load.

use std::process::Command;

use serde_json::Value;

const LAYERS: [usize; 3] = [4, 8, 16];

fn main() {
    let mut preset = "small-30s".to_string();
    let (mut steps, mut warmup) = ("5".to_string(), "1".to_string());
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--preset" => preset = args.next().expect("--preset NAME"),
            "--steps" => steps = args.next().expect("--steps N"),
            "--warmup" => warmup = args.next().expect("--warmup N"),
            // `cargo bench` passes `--bench` to every bench target.
            "--bench" => {}
            other => panic!("unknown argument `{other}`"),
        }
    }

    let mib = |v: &Value| v.as_f64().expect("a byte count") / (1024.0 * 1024.0);
    println!("{preset}: median s/step and peak memory, gradient checkpointing off vs on");
    println!(
        "{:>6} | {:>9} {:>9} {:>6} | {:>10} {:>10} | {:>9} {:>9} {:>7}",
        "layers", "off s", "on s", "on/off", "off peak", "on peak", "off act", "on act", "off/on"
    );
    for layers in LAYERS {
        let off = bench(&preset, layers, false, &steps, &warmup);
        let on = bench(&preset, layers, true, &steps, &warmup);
        let (t_off, t_on) = (off["median_s_per_step"].as_f64().unwrap(), on["median_s_per_step"].as_f64().unwrap());
        let (a_off, a_on) = (mib(&off["activation_heap_bytes"]), mib(&on["activation_heap_bytes"]));
        println!(
            "{layers:>6} | {t_off:>9.3} {t_on:>9.3} {:>5.2}x | {:>6.0} MiB {:>6.0} MiB | {a_off:>5.0} MiB {a_on:>5.0} MiB {:>6.2}x",
            t_on / t_off,
            mib(&off["peak_rss_bytes"]),
            mib(&on["peak_rss_bytes"]),
            a_off / a_on,
        );
    }
    println!("(act = the most live heap bytes during the steps minus those live once model, adapter,");
    println!(" optimizer and batch exist; peak = the process's peak RSS)");
}

fn bench(preset: &str, layers: usize, checkpointing: bool, steps: &str, warmup: &str) -> Value {
    let layers = layers.to_string();
    let ckpt = if checkpointing { "on" } else { "off" };
    let out = Command::new(env!("CARGO_BIN_EXE_ostinato"))
        .args(["bench", "--cpu", "--json", "--preset", preset, "--layers", &layers])
        .args(["--gradient-checkpointing", ckpt, "--steps", steps, "--warmup", warmup])
        .output()
        .expect("run ostinato bench");
    assert!(out.status.success(), "ostinato bench failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("ostinato bench --json prints one JSON object")
}

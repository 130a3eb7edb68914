//! Memory cost of loading the full-size DiT in bf16 (a benchmark, not a test).
//!
//! Writes a synthetic checkpoint with the real model's shapes (24 layers, hidden 2048:
//! ~4.5 GB) by streaming it to disk, then loads it with `DecoderWeights::load` and
//! reports resident memory (VmRSS now, VmHWM peak) against the file size.
//!
//! cargo run --release -p ostinato-engine --example dit_load_memory -- [DIR] [--keep]
//! The file is deleted afterwards unless `--keep`.

use std::io::Write;
use std::path::PathBuf;

use candle_core::{DType, Device};
use ostinato_engine::model::weights::expected_shapes;
use ostinato_engine::model::{DecoderWeights, DitConfig};

fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn full_config() -> DitConfig {
    DitConfig::from_value(&serde_json::json!({
        "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "in_channels": 192, "audio_acoustic_hidden_dim": 64, "patch_size": 2,
        "sliding_window": 128, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6
    }))
    .expect("config")
}

/// Streams a bf16 safetensors file with `decoder.`-prefixed keys; returns its size.
fn write_checkpoint(path: &std::path::Path, cfg: &DitConfig) -> std::io::Result<u64> {
    let shapes = expected_shapes(cfg);
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape) in &shapes {
        let bytes = 2 * shape.iter().product::<usize>();
        header.insert(
            format!("decoder.{name}"),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut h = serde_json::to_vec(&header)?;
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut f = std::io::BufWriter::with_capacity(1 << 22, std::fs::File::create(path)?);
    f.write_all(&(h.len() as u64).to_le_bytes())?;
    f.write_all(&h)?;
    // Small finite bf16 values (0x3C00.. ~ 0.0078), varied so pages are not all alike.
    let chunk: Vec<u8> = (0..1 << 20).flat_map(|i: u32| (0x3C00u16 + (i % 97) as u16).to_le_bytes()).collect();
    let mut left = offset;
    while left > 0 {
        let n = left.min(chunk.len());
        f.write_all(&chunk[..n])?;
        left -= n;
    }
    f.flush()?;
    Ok((8 + h.len() + offset) as u64)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let keep = args.iter().any(|a| a == "--keep");
    let dir = args.iter().find(|a| !a.starts_with("--")).map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let path = dir.join("ostinato-dit-full-bf16.safetensors");
    let cfg = full_config();

    let size = if path.is_file() {
        std::fs::metadata(&path).expect("stat").len()
    } else {
        let t = std::time::Instant::now();
        let s = write_checkpoint(&path, &cfg).expect("write checkpoint");
        println!("wrote {} ({:.2} GB) in {:.1?}", path.display(), s as f64 / 1e9, t.elapsed());
        s
    };

    let before = status_kb("VmRSS:");
    let t = std::time::Instant::now();
    let w = DecoderWeights::load(&[&path], &cfg, DType::BF16, &Device::Cpu).expect("load");
    let elapsed = t.elapsed();
    let (now, peak) = (status_kb("VmRSS:"), status_kb("VmHWM:"));
    let gb = |kb: u64| kb as f64 * 1024.0 / 1e9;
    let params: usize = w.iter().map(|(_, t)| t.elem_count()).sum();
    println!(
        "loaded {:.2} B params in {elapsed:.1?}: file {:.2} GB, RSS before {:.2} GB, after {:.2} GB \
         (+{:.2} GB = {:.2}x file), peak {:.2} GB ({:.2}x file)",
        params as f64 / 1e9,
        size as f64 / 1e9,
        gb(before),
        gb(now),
        gb(now - before),
        (now - before) as f64 * 1024.0 / size as f64,
        gb(peak),
        peak as f64 * 1024.0 / size as f64,
    );
    drop(w);
    if !keep {
        let _ = std::fs::remove_file(&path);
    }
}

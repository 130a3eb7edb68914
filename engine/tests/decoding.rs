//! Latents to audio: the VAE decoder against diffusers' `AutoencoderOobleck.decode` on
//! the tiny random VAE of `tests/fixtures/real/` (fixture made by
//! `scripts/make-real-fixtures --generation`), its chunked decode of long songs, and
//! latents files.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use ostinato_engine::codec::{LatentDecoder, VaeDecoder};
use ostinato_engine::generate::sampler::noise;
use ostinato_engine::generate::{read_latents, write_latents};

fn real_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real")
}

fn tiny_vae() -> VaeDecoder {
    VaeDecoder::from_dir(&real_dir().join("model/vae"), &Device::Cpu).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

fn peak(t: &Tensor) -> f32 {
    t.abs().unwrap().max_all().unwrap().to_scalar().unwrap()
}

#[test]
fn vae_decoder_matches_diffusers() {
    let f = candle_core::safetensors::load(real_dir().join("vae_decode.safetensors"), &Device::Cpu).unwrap();
    let vae = tiny_vae();
    let audio = vae.decoder().decode(&f["in.latents"], 750).unwrap();
    let err = max_diff(&audio, &f["out.audio"]);
    println!(
        "vae decode {:?} -> {:?}: max abs err {err:.2e} (|audio| max {:.3})",
        f["in.latents"].dims(),
        audio.dims(),
        peak(&f["out.audio"])
    );
    assert!(err <= 1e-4, "decoder err {err}");

    // Through the trait: stereo at 48 kHz, T * 1920 samples, values unchanged.
    let stereo = vae.decode(&f["in.latents"]).unwrap();
    assert_eq!((stereo.sample_rate, stereo.frames()), (48_000, 13 * 1920));
    let want: Vec<f32> = f["out.audio"].get(1).unwrap().to_vec1().unwrap();
    let worst = stereo.right.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= 1e-4);
}

/// Seeded latents `[frames, 8]` of the tiny VAE.
fn random_latents(frames: usize, seed: u64) -> Tensor {
    noise(seed, frames, 8, &Device::Cpu).unwrap().squeeze(0).unwrap()
}

#[test]
fn receptive_field_bounds_what_a_frame_changes() {
    let vae = tiny_vae();
    let cfg = vae.decoder().config();
    let (rf, hop) = (cfg.decoder_receptive_field(), cfg.hop());
    // The tiny VAE has ACE-Step's ratios (2, 4, 4, 6, 10), so ACE-Step's receptive field.
    assert_eq!(rf, 11);
    let z = random_latents(40, 1);
    let p = 20;
    let bump = Tensor::zeros((40, 8), DType::F32, &Device::Cpu)
        .unwrap()
        .slice_assign(&[p..p + 1, 0..8], &Tensor::ones((1, 8), DType::F32, &Device::Cpu).unwrap())
        .unwrap();
    let (a, b) = (vae.decoder().decode(&z, 1000).unwrap(), vae.decoder().decode(&(&z + bump).unwrap(), 1000).unwrap());
    let changed: Vec<f32> = (&a - &b).unwrap().abs().unwrap().max(0).unwrap().to_vec1().unwrap();
    let first = changed.iter().position(|&d| d > 0.0).unwrap();
    let last = changed.iter().rposition(|&d| d > 0.0).unwrap();
    let (reach_before, reach_after) =
        ((p * hop - first) as f64 / hop as f64, (last + 1 - (p + 1) * hop) as f64 / hop as f64);
    println!("a change of frame {p} reaches {reach_before:.2} frames before and {reach_after:.2} after (bound {rf})");
    assert!(reach_before <= rf as f64 && reach_after <= rf as f64);
    assert!(reach_before > 1.0 && reach_after > 1.0, "the bound is exercised");
}

#[test]
fn chunked_decode_equals_the_whole_song() {
    let vae = tiny_vae();
    // Up to 750 frames a song is decoded whole: chunked == unchunked exactly.
    let z = random_latents(750, 2);
    let whole = vae.decoder().decode(&z, 100_000).unwrap();
    assert_eq!(max_diff(&vae.decoder().decode(&z, 750).unwrap(), &whole), 0.0);
    // Small chunks at 750 frames: the seams are within float rounding.
    let err = max_diff(&vae.decoder().decode(&z, 97).unwrap(), &whole);
    println!("750 frames in chunks of 97 vs whole: max abs err {err:.2e} (|audio| max {:.3})", peak(&whole));
    assert!(err <= 1e-4);

    // A long song (2000 frames, 80 s) in the default tiles (250 frames): the stated seam
    // error bound is 1e-5 (the overlap covers the receptive field).
    let z = random_latents(2000, 3);
    let whole = vae.decoder().decode(&z, 100_000).unwrap();
    let chunked = vae.decode(&z).unwrap();
    let left = Tensor::from_vec(chunked.left.clone(), whole.dim(1).unwrap(), &Device::Cpu).unwrap();
    let err = max_diff(&left, &whole.get(0).unwrap());
    println!("2000 frames in default tiles vs whole: seam max abs err {err:.2e} (|audio| max {:.3})", peak(&whole));
    assert!(err <= 1e-5, "seam error {err}");
}

#[test]
fn latents_files_round_trip_and_wrong_shapes_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let z = random_latents(5, 4);
    let p = dir.path().join("z.safetensors");
    write_latents(&p, &z).unwrap();
    assert_eq!(max_diff(&read_latents(&p, 8).unwrap(), &z), 0.0);
    let err = read_latents(&p, 64).unwrap_err().to_string();
    println!("{err}");
    assert!(err.contains("z.safetensors") && err.contains("[5, 8]") && err.contains("[frames, 64]"), "{err}");
    let other = dir.path().join("other.safetensors");
    let tensors: std::collections::HashMap<String, Tensor> = [("x".to_string(), z)].into_iter().collect();
    candle_core::safetensors::save(&tensors, &other).unwrap();
    assert!(read_latents(&other, 8).unwrap_err().to_string().contains("no `latents` or `target_latents`"));
}

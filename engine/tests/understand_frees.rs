//! ACE-Step's LM is held only while labelling: once its labeller is dropped, the heap is
//! back where it was before the LM was loaded. Its own test binary, since the bytes are
//! counted by a global allocator that every thread of the process shares.

mod common;

use std::alloc::System;
use std::path::Path;

use candle_core::Device;
use ostinato_engine::cancel::Cancel;
use ostinato_engine::heap::{self, Counting};
use ostinato_engine::label::understand::labeller::{LmLabeller, UnderstandSettings};
use ostinato_engine::label::understand::tiny::write_tiny_lm;
use ostinato_engine::load::source::ModelSource;

#[global_allocator]
static ALLOC: Counting<System> = Counting::new(System);

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// Bytes live on the heap now.
fn live() -> u64 {
    heap::live_bytes().expect("this binary counts its heap")
}

/// Loads the LM in `lm_dir`, labels `song` and drops it all: the bytes it held at most
/// (loaded, labelling) and those live after, from before it was loaded.
fn label_once(lm_dir: &Path, song: &Path) -> (u64, u64, u64) {
    let before = live();
    heap::reset_peak();
    let labeller = LmLabeller::load(lm_dir, &ModelSource::Demo, &Device::Cpu, UnderstandSettings::default()).unwrap();
    let loaded = live() - before;
    drop(labeller.understand(song, &Cancel::never(), &mut |_| {}).unwrap());
    let peak = heap::peak_bytes().unwrap() - before;
    drop(labeller);
    (loaded, peak, live().saturating_sub(before))
}

/// The first labelling may leave the process's own lazily made state (thread pools,
/// per-thread matmul scratch, a global regex's cache): a few MiB at most, where the LM,
/// its tokenizer and the song's encoders are far more (the tiny LM's vocabulary alone
/// is 217k rows). A second one, on the same thread, leaves nothing new.
const FIRST_KEEPS_AT_MOST: u64 = 4 << 20;
const AGAIN_KEEPS_AT_MOST: u64 = 16 << 10;

#[test]
fn the_lm_is_freed_with_its_labeller() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_lm(dir.path(), 7).unwrap();
    let song = common::demo_song();
    let (loaded, peak, kept) = label_once(dir.path(), &song);
    println!("first: {:.1} MiB loaded, peak {:.1} MiB, {:.3} MiB kept", mib(loaded), mib(peak), mib(kept));
    assert!(loaded > 8 * FIRST_KEEPS_AT_MOST, "the loaded LM is counted: {:.1} MiB", mib(loaded));
    assert!(kept <= FIRST_KEEPS_AT_MOST, "{:.3} MiB still live once the labeller is dropped", mib(kept));
    let (_, _, again) = label_once(dir.path(), &song);
    println!("again: {:.3} MiB kept", mib(again));
    assert!(again <= AGAIN_KEEPS_AT_MOST, "{:.3} MiB more kept by a second labelling", mib(again));
}

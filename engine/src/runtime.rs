//! How a binary that trains sets up its process: the allocator it installs and the
//! thread pools it asks candle for. The CLI and the app both call [`configure`] first
//! thing in `main` and install [`ALLOCATOR`], so a run trains at the same speed
//! whichever front end started it.
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: ostinato_engine::runtime::Allocator = ostinato_engine::runtime::ALLOCATOR;
//! ```

use crate::heap;

/// mimalloc, with live heap bytes counted for the bench's activation memory. A step
/// frees and reallocates the same large activations; glibc's malloc handed them back
/// to the OS and re-faulted (and zeroed) them every step: 1.96x the step time of
/// mimalloc at small-30s (bench/NOTES.md, 8).
pub type Allocator = heap::Counting<mimalloc::MiMalloc>;

pub const ALLOCATOR: Allocator = heap::Counting::new(mimalloc::MiMalloc);

/// mimalloc v3's `mi_option_purge_delay` (mimalloc.h).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Call before any training thread exists. An explicit environment setting wins for
/// each knob.
pub fn configure() {
    // With the default 10 ms delay mimalloc still returned freed activations to the OS
    // between steps at long sequences (0.80x step time at small-240s when it never does).
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a process-wide allocator option; mimalloc reads it at each purge.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
    // candle's elementwise pool spin-waits between ops; on a few shared cores one
    // elementwise thread measured 1.3-2x faster per step (bench/NOTES.md, 1). GEMMs
    // keep rayon's threads.
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    // Without it candle counts the physical cores anew for every GEMM, parsing
    // /proc/cpuinfo on Linux: ~1300 times a step at small-30s (bench/NOTES.md, 26).
    // Counted once here, the same count also sizes rayon's pool, which would otherwise
    // take every logical CPU while candle splits each GEMM by physical cores.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", candle_core::utils::get_num_threads().to_string());
    }
}

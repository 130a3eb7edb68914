//! Live heap bytes and their peak, counted by a global-allocator wrapper a binary opts
//! into. The bench uses it for activation memory: RSS also holds pages an allocator
//! keeps after a free (glibc's fragmented arenas, mimalloc's retained segments), so
//! the RSS peak mixes what a step needs with how the allocator behaved.
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: ostinato_engine::heap::Counting<std::alloc::System> =
//!     ostinato_engine::heap::Counting::new(std::alloc::System);
//! ```

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// Wraps an allocator and counts the bytes it has handed out and not taken back.
pub struct Counting<A> {
    inner: A,
}

impl<A> Counting<A> {
    pub const fn new(inner: A) -> Self {
        Self { inner }
    }
}

fn grew(bytes: usize) {
    let now = LIVE.fetch_add(bytes, Relaxed) + bytes;
    PEAK.fetch_max(now, Relaxed);
}

// SAFETY: every call is forwarded unchanged to `inner`; only counters are added.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = self.inner.alloc(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = self.inner.alloc_zeroed(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.inner.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = self.inner.realloc(ptr, layout, new_size);
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Relaxed);
            grew(new_size);
        }
        p
    }
}

/// Whether a [`Counting`] allocator has counted anything (a Rust program allocates
/// before `main`, so an installed one always has).
fn installed() -> bool {
    PEAK.load(Relaxed) > 0
}

/// Heap bytes live now, or None when the binary did not install [`Counting`].
pub fn live_bytes() -> Option<u64> {
    installed().then(|| LIVE.load(Relaxed) as u64)
}

/// The most heap bytes live at once since the last [`reset_peak`] (or the start).
pub fn peak_bytes() -> Option<u64> {
    installed().then(|| PEAK.load(Relaxed) as u64)
}

/// Starts a new peak from what is live now.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Relaxed), Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_live_bytes_and_peak() {
        // The test binary's allocator is not wrapped: drive a private instance.
        let a = Counting::new(std::alloc::System);
        let (big, small) = (Layout::from_size_align(1 << 20, 8).unwrap(), Layout::from_size_align(4096, 8).unwrap());
        let before = LIVE.load(Relaxed);
        reset_peak();
        unsafe {
            let p = a.alloc(big);
            let q = a.alloc_zeroed(small);
            assert_eq!(LIVE.load(Relaxed) - before, (1 << 20) + 4096);
            a.dealloc(p, big);
            let q = a.realloc(q, small, 8192);
            assert_eq!(LIVE.load(Relaxed) - before, 8192);
            a.dealloc(q, Layout::from_size_align(8192, 8).unwrap());
        }
        assert_eq!(LIVE.load(Relaxed), before);
        assert!(PEAK.load(Relaxed) >= before + (1 << 20) + 4096);
        assert!(live_bytes().is_some(), "installed once a Counting allocator is used");
    }
}

//! An output buffer several threads write at once, each only its own positions.

use std::marker::PhantomData;

/// An output the threads write at once, each only at positions no other thread
/// touches (its own columns).
pub(crate) struct Shared<'a> {
    ptr: *mut f32,
    len: usize,
    _out: PhantomData<&'a mut [f32]>,
}

// SAFETY: `Shared` hands out writes only through `part`, whose callers guarantee
// that no two threads write the same position.
unsafe impl Sync for Shared<'_> {}

impl<'a> Shared<'a> {
    pub fn new(out: &'a mut [f32]) -> Self {
        Self { ptr: out.as_mut_ptr(), len: out.len(), _out: PhantomData }
    }

    /// `out[start..start + n]` for one thread to write.
    ///
    /// # Safety
    /// No other thread reads or writes those positions while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn part(&self, start: usize, n: usize) -> &mut [f32] {
        assert!(start + n <= self.len, "write past a shared output");
        std::slice::from_raw_parts_mut(self.ptr.add(start), n)
    }
}

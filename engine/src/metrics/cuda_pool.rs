//! A CUDA device's memory as its driver counts it: cudarc allocates every tensor from
//! the device's default stream-ordered pool (`cuMemAllocAsync`), whose attributes give
//! what its tensors use now and at most, and what the pool has held from the device at
//! most (freed blocks it keeps included). Exact, unlike nvidia-smi's sampled total.

use candle_core::cuda_backend::cudarc::driver::sys;
use candle_core::CudaDevice;
use serde::{Deserialize, Serialize};

/// The pool's counts, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolMemory {
    pub used_now_bytes: u64,
    /// Since the last [`reset_peaks`].
    pub used_peak_bytes: u64,
    pub reserved_peak_bytes: u64,
}

fn default_pool(device: &CudaDevice) -> Result<sys::CUmemoryPool, String> {
    let ctx = device.cuda_stream().context().clone();
    ctx.bind_to_thread().map_err(|e| e.to_string())?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer and the device handle comes from a live context.
    unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }.result().map_err(|e| e.to_string())?;
    Ok(pool)
}

fn attribute(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute) -> Result<u64, String> {
    let mut value: u64 = 0;
    // SAFETY: these attributes are cuuint64_t, which `value` holds.
    unsafe { sys::cuMemPoolGetAttribute(pool, attr, (&mut value as *mut u64).cast()) }
        .result()
        .map_err(|e| e.to_string())?;
    Ok(value)
}

/// The pool's counts now.
pub fn pool_memory(device: &CudaDevice) -> Result<PoolMemory, String> {
    use sys::CUmemPool_attribute::*;
    let pool = default_pool(device)?;
    Ok(PoolMemory {
        used_now_bytes: attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
        used_peak_bytes: attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
        reserved_peak_bytes: attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
    })
}

/// Starts the peaks afresh (the driver takes only zero for them).
pub fn reset_peaks(device: &CudaDevice) -> Result<(), String> {
    use sys::CUmemPool_attribute::*;
    let pool = default_pool(device)?;
    for attr in [CU_MEMPOOL_ATTR_USED_MEM_HIGH, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH] {
        let mut zero: u64 = 0;
        // SAFETY: as `attribute`; the driver reads the cuuint64_t.
        unsafe { sys::cuMemPoolSetAttribute(pool, attr, (&mut zero as *mut u64).cast()) }
            .result()
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

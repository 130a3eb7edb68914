//! What a step event reports besides the loss: memory in use, throughput and ETA,
//! and the smoothed loss the UI draws.

#[cfg(feature = "cuda")]
pub mod cuda_pool;

use std::collections::VecDeque;

use candle_core::Device;

/// Memory in use, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemorySample {
    pub now_bytes: u64,
    pub peak_bytes: u64,
}

/// Where memory is measured: the process on CPU, the device's allocator on a GPU.
pub enum MemoryProbe {
    /// Process resident set size.
    Process,
    /// The CUDA device's memory pool, as its driver counts it.
    #[cfg(feature = "cuda")]
    Cuda(candle_core::CudaDevice),
    /// Metal buffers allocated by candle's device, which has no peak counter: the
    /// peak is the highest value sampled.
    #[cfg(target_os = "macos")]
    Metal { device: candle_core::MetalDevice, peak_bytes: u64 },
}

impl MemoryProbe {
    /// The probe that measures what training on `device` uses.
    pub fn for_device(device: &Device) -> Self {
        match device {
            #[cfg(target_os = "macos")]
            Device::Metal(device) => MemoryProbe::Metal { device: device.clone(), peak_bytes: 0 },
            #[cfg(feature = "cuda")]
            Device::Cuda(device) => MemoryProbe::Cuda(device.clone()),
            _ => MemoryProbe::Process,
        }
    }

    /// Memory in use now and at peak; zeros where the platform offers no probe.
    pub fn sample(&mut self) -> MemorySample {
        match self {
            MemoryProbe::Process => {
                let now_bytes = process_rss_bytes().unwrap_or(0);
                let peak_bytes = peak_rss_bytes().unwrap_or(0).max(now_bytes);
                MemorySample { now_bytes, peak_bytes }
            }
            #[cfg(feature = "cuda")]
            MemoryProbe::Cuda(device) => match cuda_pool::pool_memory(device) {
                Ok(m) => MemorySample { now_bytes: m.used_now_bytes, peak_bytes: m.used_peak_bytes },
                Err(_) => MemorySample::default(),
            },
            #[cfg(target_os = "macos")]
            MemoryProbe::Metal { device, peak_bytes } => {
                let now_bytes = device.current_allocated_size() as u64;
                *peak_bytes = (*peak_bytes).max(now_bytes);
                MemorySample { now_bytes, peak_bytes: *peak_bytes }
            }
        }
    }
}

/// A CUDA device's pool peaks since [`reset_gpu_peaks`]: what its tensors used at most
/// and what the pool held at most, as the driver counts them; None off CUDA.
pub fn gpu_peaks(device: &Device) -> Option<(u64, u64)> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(cuda) => cuda_pool::pool_memory(cuda).ok().map(|m| (m.used_peak_bytes, m.reserved_peak_bytes)),
        _ => None,
    }
}

/// Starts [`gpu_peaks`] afresh; nothing off CUDA.
pub fn reset_gpu_peaks(device: &Device) {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        // A pool that cannot be reset reports its peaks since the process began.
        let _ = cuda_pool::reset_peaks(cuda);
    }
    #[cfg(not(feature = "cuda"))]
    let _ = device;
}

/// The process's resident set size now.
#[cfg(target_os = "linux")]
pub fn process_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The process's resident set size now.
#[cfg(target_os = "macos")]
pub fn process_rss_bytes() -> Option<u64> {
    // SAFETY: proc_pidinfo writes at most `size` bytes into the zeroed struct.
    let mut info: libc::proc_taskinfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::proc_taskinfo>() as libc::c_int;
    let written = unsafe {
        libc::proc_pidinfo(
            libc::getpid(),
            libc::PROC_PIDTASKINFO,
            0,
            (&mut info as *mut libc::proc_taskinfo).cast(),
            size,
        )
    };
    (written == size).then_some(info.pti_resident_size)
}

/// The process's resident set size now (no probe on this platform).
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub fn process_rss_bytes() -> Option<u64> {
    None
}

/// The highest resident set size of the process so far.
#[cfg(unix)]
pub fn peak_rss_bytes() -> Option<u64> {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return None;
    }
    let max_rss = u64::try_from(usage.ru_maxrss).ok()?;
    // macOS reports bytes; Linux and the BSDs report KiB.
    Some(if cfg!(target_os = "macos") { max_rss } else { max_rss * 1024 })
}

/// CPU seconds (user + system) the process has used, all threads together: on a
/// loaded machine, work per CPU second says what wall time cannot.
#[cfg(unix)]
pub fn process_cpu_seconds() -> Option<f64> {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return None;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Some(secs(usage.ru_utime) + secs(usage.ru_stime))
}

/// CPU seconds of the process (no probe on this platform).
#[cfg(not(unix))]
pub fn process_cpu_seconds() -> Option<f64> {
    None
}

/// The highest resident set size of the process so far (no probe on this platform).
#[cfg(not(unix))]
pub fn peak_rss_bytes() -> Option<u64> {
    None
}

/// The memory a run on a device may use, and where the figure comes from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MachineMemory {
    /// Bytes a run can take now: RAM available (within a cgroup's limit), Metal's
    /// recommended working set, free CUDA memory.
    pub available_bytes: u64,
    /// The device's whole memory.
    pub total_bytes: u64,
    /// What was read, for people ("RAM available", "Metal recommended working set", ...).
    pub source: String,
}

/// What the device `device` offers a run; `None` where the platform gives no figure.
pub fn machine_memory(device: &Device) -> Option<MachineMemory> {
    match device {
        // Only compiled on macOS; not compile-checked on the Linux machines.
        #[cfg(target_os = "macos")]
        Device::Metal(metal) => {
            let set = metal.device().recommended_max_working_set_size() as u64;
            Some(MachineMemory {
                available_bytes: set,
                total_bytes: set,
                source: "Metal recommended working set".into(),
            })
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(cuda) => {
            let (free, total) = cuda.cuda_stream().context().mem_get_info().ok()?;
            Some(MachineMemory {
                available_bytes: free as u64,
                total_bytes: total as u64,
                source: "CUDA free memory".into(),
            })
        }
        _ => ram(),
    }
}

/// RAM available to this process: `MemAvailable`, within the cgroup's memory limit.
#[cfg(target_os = "linux")]
fn ram() -> Option<MachineMemory> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = info.lines().find(|l| l.starts_with(name))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    };
    let (mut available, mut total) = (field("MemAvailable:")?, field("MemTotal:")?);
    let cgroup =
        |name: &str| std::fs::read_to_string(format!("/sys/fs/cgroup/{name}")).ok()?.trim().parse::<u64>().ok();
    let mut source = "RAM available".to_string();
    if let Some(limit) = cgroup("memory.max") {
        let free = limit.saturating_sub(cgroup("memory.current").unwrap_or(0));
        if free < available {
            (available, total, source) = (free, total.min(limit), "memory available to this cgroup".into());
        }
    }
    Some(MachineMemory { available_bytes: available, total_bytes: total, source })
}

/// Physical memory (macOS pages other programs out before a run's memory runs short).
#[cfg(target_os = "macos")]
fn ram() -> Option<MachineMemory> {
    let mut bytes: u64 = 0;
    let mut size = std::mem::size_of::<u64>();
    // SAFETY: hw.memsize is a u64; sysctlbyname writes at most `size` bytes into it.
    let ok = unsafe {
        libc::sysctlbyname(c"hw.memsize".as_ptr(), (&mut bytes as *mut u64).cast(), &mut size, std::ptr::null_mut(), 0)
    } == 0;
    ok.then(|| MachineMemory { available_bytes: bytes, total_bytes: bytes, source: "RAM".into() })
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn ram() -> Option<MachineMemory> {
    None
}

/// Throughput over the last few steps, and the ETA it implies. Fed with step
/// durations rather than reading a clock, so pauses never count and tests are exact.
#[derive(Debug, Clone)]
pub struct RateMeter {
    /// (samples, seconds) of the most recent steps.
    window: VecDeque<(u64, f64)>,
    capacity: usize,
}

impl RateMeter {
    /// A meter averaging over the last `window` steps.
    pub fn new(window: usize) -> Self {
        Self { window: VecDeque::with_capacity(window.max(1)), capacity: window.max(1) }
    }

    /// Records a step that trained `samples` samples in `seconds`.
    pub fn record(&mut self, samples: u64, seconds: f64) {
        if self.window.len() == self.capacity {
            self.window.pop_front();
        }
        self.window.push_back((samples, seconds));
    }

    fn seconds(&self) -> f64 {
        self.window.iter().map(|&(_, s)| s).sum()
    }

    /// Samples per second over the window; 0 before any measurable step.
    pub fn samples_per_sec(&self) -> f64 {
        let samples: u64 = self.window.iter().map(|&(n, _)| n).sum();
        match self.seconds() {
            s if s > 0.0 => samples as f64 / s,
            _ => 0.0,
        }
    }

    /// Seconds left for `remaining_steps` at the window's mean step time; `None`
    /// before any step was recorded.
    pub fn eta_s(&self, remaining_steps: u64) -> Option<f64> {
        if self.window.is_empty() {
            return None;
        }
        Some(self.seconds() / self.window.len() as f64 * remaining_steps as f64)
    }
}

impl Default for RateMeter {
    fn default() -> Self {
        Self::new(20)
    }
}

/// Exponential moving average of the loss with bias correction (as TensorBoard
/// smooths), so the first values are not dragged toward zero.
#[derive(Debug, Clone)]
pub struct LossSmoother {
    beta: f64,
    ema: f64,
    count: i32,
}

impl LossSmoother {
    /// `beta` in [0, 1): the weight of history (0.9 averages over roughly 10 steps).
    pub fn new(beta: f64) -> Self {
        Self { beta: beta.clamp(0.0, 0.999_999), ema: 0.0, count: 0 }
    }

    /// Adds a loss value and returns the smoothed loss.
    pub fn push(&mut self, loss: f64) -> f64 {
        self.ema = self.beta * self.ema + (1.0 - self.beta) * loss;
        self.count = self.count.saturating_add(1);
        self.ema / (1.0 - self.beta.powi(self.count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_memory_is_measured() {
        let mut probe = MemoryProbe::for_device(&Device::Cpu);
        let before = probe.sample();
        assert!(before.now_bytes > 1 << 20, "{before:?}");
        assert!(before.peak_bytes >= before.now_bytes);
        // Hold 64 MiB of touched pages: both readings must include it, in bytes
        // (KiB read as bytes would be far too small, KiB scaled twice far too large).
        let block = vec![1u8; 64 << 20];
        std::hint::black_box(&block);
        let during = probe.sample();
        assert!(during.now_bytes >= 64 << 20, "{during:?}");
        assert!(during.peak_bytes >= during.now_bytes, "{during:?}");
        assert!(during.peak_bytes < 16 << 30, "{during:?}");
    }

    #[test]
    fn machine_memory_is_read() {
        let m = machine_memory(&Device::Cpu).expect("RAM is readable on Linux and macOS");
        println!("{m:?}");
        assert!(m.available_bytes > 16 << 20 && m.available_bytes <= m.total_bytes, "{m:?}");
        assert!(!m.source.is_empty());
    }

    #[test]
    fn rate_over_window() {
        let mut m = RateMeter::new(2);
        assert_eq!(m.samples_per_sec(), 0.0);
        assert_eq!(m.eta_s(10), None);
        m.record(4, 1.0);
        assert_eq!(m.samples_per_sec(), 4.0);
        m.record(4, 3.0);
        assert_eq!(m.samples_per_sec(), 2.0);
        assert_eq!(m.eta_s(10), Some(20.0));
        m.record(2, 1.0); // the first step leaves the window
        assert_eq!(m.samples_per_sec(), 1.5);
        assert_eq!(m.eta_s(0), Some(0.0));
    }

    #[test]
    fn smoother_is_bias_corrected() {
        let mut s = LossSmoother::new(0.9);
        assert!((s.push(2.0) - 2.0).abs() < 1e-12, "first value unbiased");
        assert!((s.push(2.0) - 2.0).abs() < 1e-12);
        let mut last = 0.0;
        for _ in 0..200 {
            last = s.push(1.0);
        }
        assert!((last - 1.0).abs() < 1e-6);
        let mut none = LossSmoother::new(0.0);
        none.push(5.0);
        assert_eq!(none.push(3.0), 3.0);
    }
}

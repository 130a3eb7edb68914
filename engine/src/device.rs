//! Device choice and precision policy.
//!
//! Base weights are stored and computed in the compute dtype: f32 on CPU (bf16/f16 are
//! not faster there), bf16 on CUDA and on Metal (which trains from macOS 14:
//! [`metal_trains`]); `bf16-weights` holds the frozen layers in
//! bf16 and computes in f32, each layer's weights widened while it runs (half the
//! weights' memory on the CPU at f32's speed and accuracy of the arithmetic). LoRA
//! parameters, optimizer state and the loss stay f32 whatever the compute dtype.

use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};

use crate::Result;

/// The compute dtype a run asks for; `Auto` follows the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    Auto,
    F32,
    Bf16,
    F16,
    /// Frozen weights held in bf16, computed in f32 layer by layer.
    #[serde(rename = "bf16-weights")]
    Bf16Weights,
}

impl Precision {
    pub const ALL: [Precision; 5] =
        [Precision::Auto, Precision::F32, Precision::Bf16, Precision::F16, Precision::Bf16Weights];

    /// Each value's name and what it means, as the window offers them, in `ALL`'s order.
    pub const CHOICES: [(&'static str, &'static str); 5] = [
        ("auto", "Auto (recommended for this device)"),
        ("f32", "f32 — exact, most memory"),
        ("bf16", "bf16 — half the memory (GPU)"),
        ("f16", "f16 — half memory, loss scaling (GPU)"),
        ("bf16-weights", "bf16 weights, f32 arithmetic (CPU)"),
    ];

    /// The name run.toml and `--precision` use.
    pub fn name(self) -> &'static str {
        Self::CHOICES[self as usize].0
    }

    /// The dtype the model computes in.
    pub fn dtype(self, device: &Device) -> DType {
        self.dtype_on(Backend::of(device))
    }

    /// The dtype the model computes in on `backend`.
    pub fn dtype_on(self, backend: Backend) -> DType {
        match self {
            Precision::Auto => match backend {
                Backend::Cpu => DType::F32,
                Backend::Metal | Backend::Cuda => DType::BF16,
            },
            Precision::F32 | Precision::Bf16Weights => DType::F32,
            Precision::Bf16 => DType::BF16,
            Precision::F16 => DType::F16,
        }
    }

    /// The dtype the base weights are held in.
    pub fn weights_dtype(self, device: &Device) -> DType {
        self.weights_dtype_on(Backend::of(device))
    }

    /// The dtype the base weights are held in on `backend`.
    pub fn weights_dtype_on(self, backend: Backend) -> DType {
        match self {
            Precision::Bf16Weights => DType::BF16,
            other => other.dtype_on(backend),
        }
    }

    /// What a run computes in: "f32", "bf16", "f16", or "f32, weights held in bf16".
    pub fn describe(self, device: &Device) -> String {
        let name = |d: DType| format!("{d:?}").to_lowercase();
        match (self.dtype(device), self.weights_dtype(device)) {
            (compute, held) if compute == held => name(compute),
            (compute, held) => format!("{}, weights held in {}", name(compute), name(held)),
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Precision::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<_> = Precision::ALL.iter().map(|p| p.name()).collect();
            format!("unknown precision `{s}` (expected one of {})", names.join(", "))
        })
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a device computes on, as far as dtypes and memory go: a plan can be made for a
/// device this machine does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    Metal,
    Cuda,
}

impl Backend {
    pub fn of(device: &Device) -> Self {
        match device {
            Device::Cpu => Backend::Cpu,
            Device::Metal(_) => Backend::Metal,
            Device::Cuda(_) => Backend::Cuda,
        }
    }

    /// Whether the engine's CPU kernels run tensors of `dtype` here (`KernelPolicy::host`).
    pub fn cpu_kernels(self, dtype: DType) -> bool {
        self == Backend::Cpu && dtype == DType::F32
    }
}

/// Whether a Mac's GPU can train here, or why not. Candle's Metal kernels are built
/// from source when a device is made, and its matrix-vector library (every product
/// with one row, as the timestep embedding's at batch 1) declares bf16 kernels without
/// the `__HAVE_BFLOAT__` guard the other libraries have: Metal before 3.1 (macOS 14)
/// cannot build it, its f16 and f32 kernels included. So Metal trains from macOS 14,
/// the app's minimum, and the CLI on an older Mac (or one whose version cannot be
/// read) trains on the CPU, saying why.
pub fn metal_trains(macos: Option<(u32, u32)>) -> std::result::Result<(), String> {
    match macos {
        Some((major, _)) if major >= 14 => Ok(()),
        found => Err(format!(
            "Metal training needs macOS 14 or later (this Mac: {})",
            found.map_or("version unknown".into(), |(major, minor)| format!("macOS {major}.{minor}"))
        )),
    }
}

/// The running macOS's version (major, minor), from `kern.osproductversion`; None
/// elsewhere or where it cannot be read.
pub fn macos_version() -> Option<(u32, u32)> {
    #[cfg(target_os = "macos")]
    {
        let mut buf = [0u8; 32];
        let mut len = buf.len();
        // SAFETY: the name is NUL-terminated, `buf` holds `len` bytes and sysctl writes
        // at most that many; no new value is set.
        let rc = unsafe {
            libc::sysctlbyname(
                c"kern.osproductversion".as_ptr(),
                buf.as_mut_ptr().cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        if rc != 0 {
            return None;
        }
        parse_version(std::str::from_utf8(&buf[..len.min(buf.len())]).ok()?)
    }
    #[cfg(not(target_os = "macos"))]
    None
}

/// "14.4.1" -> (14, 4); "15" -> (15, 0).
pub fn parse_version(s: &str) -> Option<(u32, u32)> {
    let mut parts = s.trim_end_matches('\0').trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = match parts.next() {
        Some(m) => m.parse().ok()?,
        None => 0,
    };
    Some((major, minor))
}

/// The device a run trains on, with the reason it was chosen.
pub struct Selected {
    pub device: Device,
    /// "cpu", "metal" or "cuda".
    pub name: &'static str,
    pub reason: String,
}

/// Metal on macOS 14 and later ([`metal_trains`]), CUDA when built with the `cuda`
/// feature, else the CPU (with the reason); `force_cpu` for tests and benchmarks that
/// must compare like with like.
pub fn select(force_cpu: bool) -> Result<Selected> {
    if force_cpu {
        return Ok(cpu("CPU requested".into()));
    }
    #[cfg(target_os = "macos")]
    {
        if let Err(why) = metal_trains(macos_version()) {
            return Ok(cpu(format!("{why}, using CPU")));
        }
        match Device::new_metal(0) {
            Ok(device) => return Ok(Selected { device, name: "metal", reason: "Metal GPU".into() }),
            Err(e) => return Ok(cpu(format!("Metal unavailable ({e}), using CPU"))),
        }
    }
    #[cfg(feature = "cuda")]
    {
        match Device::new_cuda(0) {
            Ok(device) => return Ok(Selected { device, name: "cuda", reason: "CUDA GPU 0".into() }),
            Err(e) => return Ok(cpu(format!("CUDA unavailable ({e}), using CPU"))),
        }
    }
    #[allow(unreachable_code)]
    Ok(cpu("no GPU backend in this build (Metal is macOS-only; CUDA needs the `cuda` feature), using CPU".into()))
}

fn cpu(reason: String) -> Selected {
    Selected { device: Device::Cpu, name: "cpu", reason }
}

/// Runs one training step inside an Objective-C autorelease pool on macOS, so that
/// Metal's per-command-buffer objects are freed every step instead of accumulating
/// (candle's known Metal memory growth); elsewhere it just runs `f`.
pub fn in_step_scope<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(target_os = "macos")]
    {
        objc2::rc::autoreleasepool(|_| f())
    }
    #[cfg(not(target_os = "macos"))]
    {
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_policy_is_f32_unless_asked() {
        let dev = Device::Cpu;
        assert_eq!(Precision::Auto.dtype(&dev), DType::F32);
        assert_eq!(Precision::Bf16.dtype(&dev), DType::BF16);
        assert_eq!("f16".parse::<Precision>().unwrap(), Precision::F16);
        assert!("fp8".parse::<Precision>().is_err());
    }

    #[test]
    fn one_name_per_value_in_run_toml_the_cli_and_the_window() {
        for (p, (name, _)) in Precision::ALL.into_iter().zip(Precision::CHOICES) {
            assert_eq!((p.name(), serde_json::to_value(p).unwrap()), (name, serde_json::json!(name)));
            assert_eq!(name.parse::<Precision>(), Ok(p));
        }
    }

    #[test]
    fn a_mac_trains_on_its_gpu_from_macos_14_in_bf16() {
        for old in [Some((12, 7)), Some((13, 6)), None] {
            let why = metal_trains(old).unwrap_err();
            assert!(why.contains("macOS 14 or later") && why.contains("this Mac: "), "{why}");
        }
        assert!(metal_trains(Some((13, 6))).unwrap_err().contains("macOS 13.6"));
        assert_eq!(metal_trains(Some((14, 0))), Ok(()));
        assert_eq!(metal_trains(Some((26, 1))), Ok(()));
        assert_eq!(parse_version("14.4.1"), Some((14, 4)));
        assert_eq!(parse_version("15\0"), Some((15, 0)));
        assert_eq!(parse_version("beta"), None);
        #[cfg(not(target_os = "macos"))]
        assert_eq!(macos_version(), None);
        assert_eq!(Precision::Auto.dtype_on(Backend::Metal), DType::BF16);
        assert_eq!(Precision::Auto.dtype_on(Backend::Cuda), DType::BF16);
        assert_eq!(Precision::Bf16Weights.weights_dtype_on(Backend::Metal), DType::BF16);
    }

    #[test]
    fn selection_reports_a_reason() {
        let s = select(true).unwrap();
        assert_eq!(s.name, "cpu");
        assert!(!s.reason.is_empty());
        #[cfg(not(any(target_os = "macos", feature = "cuda")))]
        assert!(select(false).unwrap().reason.contains("using CPU"));
    }
}

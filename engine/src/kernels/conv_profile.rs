//! Where the VAE's convolution time goes: while a bench has it on, each call of the
//! CPU conv kernels adds its wall time and FLOPs to a row per geometry (kind, channels,
//! taps, stride, dilation). Off, a call costs one atomic load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

static ON: AtomicBool = AtomicBool::new(false);
static ROWS: Mutex<Vec<LayerTime>> = Mutex::new(Vec::new());

/// The summed calls of one conv geometry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerTime {
    /// `conv`, `residual unit` (k7 conv, snake, 1x1 conv) or `transposed`.
    pub kind: String,
    pub cin: usize,
    pub cout: usize,
    pub k: usize,
    pub stride: usize,
    pub dilation: usize,
    pub calls: usize,
    /// Output samples over all calls.
    pub samples: usize,
    pub seconds: f64,
    /// Multiply-adds x 2.
    pub gflop: f64,
}

impl LayerTime {
    pub fn gflop_per_s(&self) -> f64 {
        self.gflop / self.seconds.max(1e-12)
    }
}

/// Starts collecting (dropping what was collected before).
pub fn start() {
    ROWS.lock().unwrap_or_else(|e| e.into_inner()).clear();
    ON.store(true, Ordering::SeqCst);
}

/// Stops collecting and returns the rows, slowest first.
pub fn stop() -> Vec<LayerTime> {
    ON.store(false, Ordering::SeqCst);
    let mut rows = std::mem::take(&mut *ROWS.lock().unwrap_or_else(|e| e.into_inner()));
    rows.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    rows
}

/// A call's start time while collecting.
pub(crate) fn clock() -> Option<Instant> {
    ON.load(Ordering::Relaxed).then(Instant::now)
}

/// Adds a call begun at `since` (from [`clock`]) producing `samples` output samples;
/// `geometry` = (cin, cout, k, stride, dilation), `macs_per_sample` its multiply-adds
/// per output sample.
pub(crate) fn record(
    since: Option<Instant>,
    kind: &str,
    geometry: (usize, usize, usize, usize, usize),
    samples: usize,
    macs_per_sample: usize,
) {
    let Some(since) = since else { return };
    let seconds = since.elapsed().as_secs_f64();
    let (cin, cout, k, stride, dilation) = geometry;
    let gflop = 2.0 * macs_per_sample as f64 * samples as f64 / 1e9;
    let mut rows = ROWS.lock().unwrap_or_else(|e| e.into_inner());
    let same = |r: &&mut LayerTime| {
        r.kind == kind && (r.cin, r.cout, r.k, r.stride, r.dilation) == (cin, cout, k, stride, dilation)
    };
    match rows.iter_mut().find(same) {
        Some(r) => {
            r.calls += 1;
            r.samples += samples;
            r.seconds += seconds;
            r.gflop += gflop;
        }
        None => rows.push(LayerTime {
            kind: kind.into(),
            cin,
            cout,
            k,
            stride,
            dilation,
            calls: 1,
            samples,
            seconds,
            gflop,
        }),
    }
}

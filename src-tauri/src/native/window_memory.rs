//! The window's size and position, remembered between launches in `window.json` beside
//! the settings: recorded as the window moves and resizes (written once it has been
//! still for [`QUIET`], and at exit; atomically), restored when the window opens, onto a
//! screen that is still there.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How long the window must be still before its geometry is written.
pub const QUIET: Duration = Duration::from_millis(400);

/// The window's inner size and outer position in physical pixels (what tauri's
/// `set_size` and `set_position` take); `maximized` over the size it returns to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    pub x: i32,
    pub y: i32,
    pub width: u32,
    pub height: u32,
    pub maximized: bool,
}

/// A screen's area, physical pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Screen {
    pub x: i32,
    pub y: i32,
    pub width: u32,
    pub height: u32,
}

impl Screen {
    fn contains(&self, x: i64, y: i64) -> bool {
        let (sx, sy) = (i64::from(self.x), i64::from(self.y));
        x >= sx && y >= sy && x < sx + i64::from(self.width) && y < sy + i64::from(self.height)
    }
}

pub fn path(config_dir: &Path) -> PathBuf {
    config_dir.join("window.json")
}

/// The remembered geometry; none when there is no file or it cannot be read (then the
/// window opens at its configured size).
pub fn load(config_dir: &Path) -> Option<Geometry> {
    let bytes = std::fs::read(path(config_dir)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Writes the geometry atomically (a crash mid-write leaves the old file).
pub fn save(config_dir: &Path, geometry: &Geometry) -> Result<(), String> {
    let json = serde_json::to_vec_pretty(geometry).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(config_dir).map_err(|e| format!("{}: {e}", config_dir.display()))?;
    ostinato_engine::atomic::write_atomically(&path(config_dir), &json).map_err(|e| e.to_string())
}

/// Where the remembered window goes on these `screens`: its size, at least `min` and at
/// most the largest screen; its position only if the middle of its top edge lies on a
/// screen (a window remembered on a screen since unplugged opens where the OS puts it).
pub fn placement(saved: Geometry, screens: &[Screen], min: (u32, u32)) -> (Geometry, bool) {
    let max = screens.iter().fold((0, 0), |m, s| (m.0.max(s.width), m.1.max(s.height)));
    let fit = |v: u32, lo: u32, hi: u32| if hi > 0 { v.min(hi).max(lo) } else { v.max(lo) };
    let width = fit(saved.width, min.0, max.0);
    let height = fit(saved.height, min.1, max.1);
    let top_middle = (i64::from(saved.x) + i64::from(width) / 2, i64::from(saved.y) + 8);
    let on_screen = screens.iter().any(|s| s.contains(top_middle.0, top_middle.1));
    (Geometry { width, height, ..saved }, on_screen)
}

/// Records the window's geometry as it changes and writes it once it has been still.
#[derive(Clone)]
pub struct Recorder {
    pending: Arc<Pending>,
    wake: Sender<()>,
}

struct Pending {
    config_dir: PathBuf,
    state: Mutex<Recorded>,
}

#[derive(Default)]
struct Recorded {
    /// What is not yet written.
    unwritten: Option<Geometry>,
    /// The latest geometry while not maximized: the one a maximized window returns to.
    normal: Option<Geometry>,
}

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the pending geometry, if any. Under the lock: writers never interleave.
    fn flush(&self) {
        let mut g = self.lock();
        if let Some(geometry) = g.unwritten.take() {
            if let Err(e) = save(&self.config_dir, &geometry) {
                eprintln!("ostinato: could not remember the window's size: {e}");
            }
        }
    }
}

impl Recorder {
    pub fn new(config_dir: PathBuf) -> std::io::Result<Self> {
        let pending = Arc::new(Pending { config_dir, state: Mutex::new(Recorded::default()) });
        let (wake, woken) = channel::<()>();
        let writer = pending.clone();
        std::thread::Builder::new().name("ostinato-window".into()).spawn(move || {
            while woken.recv().is_ok() {
                // Wait for the window to be still; the app closing ends the wait too.
                let ended = loop {
                    match woken.recv_timeout(QUIET) {
                        Ok(()) => continue,
                        Err(RecvTimeoutError::Timeout) => break false,
                        Err(RecvTimeoutError::Disconnected) => break true,
                    }
                };
                writer.flush();
                if ended {
                    return;
                }
            }
        })?;
        Ok(Recorder { pending, wake })
    }

    /// The window was put back where `geometry` says (not yet written: it came from the file).
    pub fn restored(&self, geometry: Geometry) {
        self.pending.lock().normal = Some(Geometry { maximized: false, ..geometry });
    }

    /// The window moved or resized to `now`: written once it has been still. A maximized
    /// window keeps the size and place it had before, to return to.
    pub fn changed(&self, now: Geometry) {
        {
            let mut g = self.pending.lock();
            if now.maximized {
                g.unwritten = Some(Geometry { maximized: true, ..g.normal.unwrap_or(now) });
            } else {
                (g.normal, g.unwritten) = (Some(now), Some(now));
            }
        }
        let _ = self.wake.send(());
    }

    /// Writes what is pending now (the app is closing).
    pub fn flush(&self) {
        self.pending.flush();
    }
}

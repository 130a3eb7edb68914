//! Follows the run's views on a thread of its own: keeps the machine awake while the run
//! trains and posts the OS notification its end is due (see notice.rs). The bridge hands
//! every view to [`run_changed`]; the OS calls happen here, never under the bridge's lock.

use std::sync::mpsc::{channel, Sender};

use ostinato_engine::run_state::RunStatus;
use tauri::{AppHandle, Manager, Runtime};

use super::awake::{Acquire, KeepAwake, SystemAwake};
use super::notice::{notice, Notice, RunFacts};
use crate::bridge::RunView;

/// The watcher's inbox (managed by the app).
pub struct RunWatch(Sender<RunFacts>);

/// What a notification needs of a view: a few fields, not its series.
pub fn facts(view: &RunView) -> RunFacts {
    RunFacts {
        status: view.state.status,
        steps: view.state.steps,
        name: view.run_dir.as_deref().and_then(|d| d.file_name()).map(|n| n.to_string_lossy().into_owned()),
        reason: view.state.reason.clone(),
    }
}

/// Hands a run view to the watcher, if the app has one (tests' mock apps do not).
pub fn run_changed<R: Runtime>(app: &AppHandle<R>, view: &RunView) {
    if let Some(watch) = app.try_state::<RunWatch>() {
        let _ = watch.0.send(facts(view));
    }
}

/// Starts the watcher of `app`'s runs: the OS's wake lock, the OS's notifications.
pub fn start<R: Runtime>(app: &AppHandle<R>) -> std::io::Result<RunWatch> {
    start_with(app, SystemAwake, show)
}

/// As [`start`], with the wake lock taken by `acquire` and notices posted by `post`.
pub fn start_with<R: Runtime>(
    app: &AppHandle<R>,
    acquire: impl Acquire + 'static,
    post: impl Fn(&AppHandle<R>, &Notice) + Send + 'static,
) -> std::io::Result<RunWatch> {
    let (tx, rx) = channel::<RunFacts>();
    let app = app.clone();
    std::thread::Builder::new().name("ostinato-watch".into()).spawn(move || {
        let mut awake = KeepAwake::new(acquire);
        let mut before = RunStatus::Idle;
        for now in rx {
            awake.follow(now.status);
            // Focus is asked of the window only when the run has just ended.
            if before.is_active() && !now.status.is_active() {
                if let Some(n) = notice(before, &now, window_focused(&app)) {
                    post(&app, &n);
                }
            }
            before = now.status;
        }
    })?;
    Ok(RunWatch(tx))
}

fn window_focused<R: Runtime>(app: &AppHandle<R>) -> bool {
    app.webview_windows().values().any(|w| w.is_focused().unwrap_or(false))
}

/// Posts `n` to the OS (notify-rust: the notification server over D-Bus on Linux, the
/// notification center on a Mac, toasts on Windows). A machine without one loses it.
fn show<R: Runtime>(app: &AppHandle<R>, n: &Notice) {
    let mut notification = notify_rust::Notification::new();
    notification.summary(&n.title).body(&n.body).appname(&app.package_info().name).auto_icon();
    // Unbundled (dev) builds have no identity of their own on a Mac or Windows: they
    // borrow the terminal's there, as tauri's notification plugin does.
    #[cfg(target_os = "macos")]
    let _ = notify_rust::set_application(if tauri::is_dev() {
        "com.apple.Terminal"
    } else {
        app.config().identifier.as_str()
    });
    #[cfg(windows)]
    if !tauri::is_dev() {
        notification.app_id(&app.config().identifier);
    }
    if let Err(e) = notification.show() {
        eprintln!("ostinato: could not post the notification {:?}: {e}", n.title);
    }
}

//! A native app's manners, as one tauri plugin: the menu bar (menu.rs; shortcut labels
//! per platform in shortcuts.rs), the machine kept awake while a run trains (awake.rs)
//! and an OS notification when a run ends unseen (notice.rs), both following the run's
//! views (watch.rs), and the window's size and position remembered (window_memory.rs).
//! A plugin, so it composes with the app's builder instead of claiming its `setup`.

pub mod awake;
pub mod menu;
pub mod notice;
pub mod shortcuts;
pub mod watch;
pub mod window_memory;

use tauri::plugin::{Builder, TauriPlugin};
use tauri::{Manager, PhysicalPosition, PhysicalSize, Runtime, WebviewWindow, WindowEvent};

pub use watch::run_changed;
use window_memory::{Geometry, Recorder, Screen};

/// The plugin the app installs (lib.rs's `run`).
pub fn plugin<R: Runtime>() -> TauriPlugin<R> {
    Builder::new("ostinato-native")
        .setup(|app, _| {
            app.set_menu(menu::build(app)?)?;
            app.on_menu_event(|app, event| menu::on_menu(app, event.id().as_ref()));
            app.manage(watch::start(app)?);
            app.manage(Recorder::new(crate::settings::default_config_dir())?);
            Ok(())
        })
        .on_webview_ready(|webview| {
            if let Some(window) = webview.app_handle().get_webview_window(webview.label()) {
                remember(&window);
            }
        })
        .on_event(|app, event| {
            if let tauri::RunEvent::Exit = event {
                if let Some(rec) = app.try_state::<Recorder>() {
                    rec.flush();
                }
            }
        })
        .build()
}

/// Puts the window where it was last time, shows it, and records where it goes from now.
fn remember<R: Runtime>(window: &WebviewWindow<R>) {
    let rec = window.try_state::<Recorder>().map(|r| r.inner().clone());
    let saved = window_memory::load(&crate::settings::default_config_dir());
    if let (Some(rec), Some(saved)) = (&rec, saved) {
        match restore(window, saved) {
            Ok(g) => rec.restored(g),
            Err(e) => eprintln!("ostinato: could not restore the window's size: {e}"),
        }
    }
    // The window starts hidden (tauri.conf.json), so it never shows at the wrong size;
    // it is shown whatever happened above.
    let _ = window.show();
    let Some(rec) = rec else { return };
    let w = window.clone();
    window.on_window_event(move |event| match event {
        WindowEvent::Moved(_) | WindowEvent::Resized(_) => {
            if let Some(g) = geometry(&w) {
                rec.changed(g);
            }
        }
        WindowEvent::CloseRequested { .. } | WindowEvent::Destroyed => rec.flush(),
        _ => {}
    });
}

/// The window's geometry now; none while minimized (nothing to remember then).
fn geometry<R: Runtime>(w: &WebviewWindow<R>) -> Option<Geometry> {
    if w.is_minimized().ok()? {
        return None;
    }
    let (pos, size) = (w.outer_position().ok()?, w.inner_size().ok()?);
    Some(Geometry { x: pos.x, y: pos.y, width: size.width, height: size.height, maximized: w.is_maximized().ok()? })
}

/// Applies the saved geometry as [`window_memory::placement`] fits it to the screens.
fn restore<R: Runtime>(window: &WebviewWindow<R>, saved: Geometry) -> tauri::Result<Geometry> {
    let screens: Vec<Screen> = window
        .available_monitors()?
        .iter()
        .map(|m| Screen { x: m.position().x, y: m.position().y, width: m.size().width, height: m.size().height })
        .collect();
    let scale = window.scale_factor()?;
    let min = window.config().app.windows.iter().find(|c| c.label == window.label()).map_or((0, 0), |c| {
        let px = |v: Option<f64>| (v.unwrap_or(0.0) * scale).round() as u32;
        (px(c.min_width), px(c.min_height))
    });
    let (g, on_screen) = window_memory::placement(saved, &screens, min);
    window.set_size(PhysicalSize::new(g.width, g.height))?;
    if on_screen {
        window.set_position(PhysicalPosition::new(g.x, g.y))?;
    }
    if g.maximized {
        window.maximize()?;
    }
    Ok(g)
}

//! The native menu: what it holds (a plain description, [`spec`], that tests read), the
//! tauri menu built from it, and what each item does. Run > Pause, Resume and Stop call
//! the bridge as the page's buttons do; the items that need the page (Settings, opening
//! folders, Start, which first saves the form's pending edits) ask it with a
//! [`MENU_EVENT`].

use serde::Serialize;
use tauri::menu::{AboutMetadata, Menu, MenuItem, PredefinedMenuItem, Submenu as TauriSubmenu};
use tauri::{AppHandle, Emitter, Manager, Runtime};

use super::shortcuts::{label, Platform};
use crate::bridge::{AppState, BridgeError, RunView};

/// Item ids. The page knows the ones it is asked to act on by [`PageAction`].
pub const SETTINGS: &str = "app.settings";
pub const QUIT: &str = "app.quit";
pub const OPEN_DATASET: &str = "file.open_dataset";
pub const OPEN_MODEL: &str = "file.open_model";
pub const START: &str = "run.start";
pub const PAUSE: &str = "run.pause";
pub const RESUME: &str = "run.resume";
pub const STOP: &str = "run.stop";

/// The event a menu item sends the page (payload: [`PageAction`]).
pub const MENU_EVENT: &str = "menu";

/// The platform's standard items, which the OS (or the web view) implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standard {
    About,
    Services,
    Hide,
    HideOthers,
    ShowAll,
    Quit,
    Undo,
    Redo,
    Cut,
    Copy,
    Paste,
    SelectAll,
    Minimize,
    Zoom,
    Fullscreen,
    CloseWindow,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Item { id: &'static str, text: &'static str, accelerator: &'static str },
    Standard(Standard),
    Separator,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submenu {
    pub title: String,
    pub entries: Vec<Entry>,
}

fn item(id: &'static str, text: &'static str, accelerator: &'static str) -> Entry {
    Entry::Item { id, text, accelerator }
}

/// The menu bar on `platform`. A Mac gets its standard app menu (Services, Hide, the
/// system's Quit), Undo/Redo and a Window menu (⌘M, ⌘W); GTK renders those disabled, so
/// elsewhere Quit is the app's own item and Edit keeps what the web view's fields do.
pub fn spec(app_name: &str, platform: Platform) -> Vec<Submenu> {
    use Entry::{Separator, Standard as S};
    let mac = platform == Platform::Mac;
    let mut app = vec![S(Standard::About), Separator, item(SETTINGS, "Settings…", "CmdOrCtrl+,"), Separator];
    if mac {
        app.extend([
            S(Standard::Services),
            Separator,
            S(Standard::Hide),
            S(Standard::HideOthers),
            S(Standard::ShowAll),
            Separator,
            S(Standard::Quit),
        ]);
    } else {
        app.push(item(QUIT, "Quit", "CmdOrCtrl+Q"));
    }
    let mut edit = if mac { vec![S(Standard::Undo), S(Standard::Redo), Separator] } else { vec![] };
    edit.extend([S(Standard::Cut), S(Standard::Copy), S(Standard::Paste), S(Standard::SelectAll)]);
    let sub = |title: &str, entries| Submenu { title: title.to_string(), entries };
    let mut bar = vec![
        sub(app_name, app),
        sub(
            "File",
            vec![
                item(OPEN_DATASET, "Open Dataset Folder…", "CmdOrCtrl+O"),
                item(OPEN_MODEL, "Open Model Folder…", "CmdOrCtrl+Shift+O"),
            ],
        ),
        sub("Edit", edit),
        sub(
            "Run",
            vec![
                item(START, "Start", "CmdOrCtrl+Enter"),
                item(PAUSE, "Pause", "CmdOrCtrl+P"),
                item(RESUME, "Resume", "CmdOrCtrl+R"),
                Separator,
                item(STOP, "Stop", "CmdOrCtrl+."),
            ],
        ),
    ];
    if mac {
        let window = [Standard::Minimize, Standard::Zoom, Standard::Fullscreen, Standard::CloseWindow];
        bar.push(sub("Window", window.into_iter().map(S).collect()));
    }
    bar
}

/// The app's own items' shortcut labels on `platform`, by item id (the page shows them).
pub fn shortcut_labels(platform: Platform) -> std::collections::BTreeMap<&'static str, String> {
    spec("", platform)
        .into_iter()
        .flat_map(|s| s.entries)
        .filter_map(|e| match e {
            Entry::Item { id, accelerator, .. } => Some((id, label(accelerator, platform))),
            _ => None,
        })
        .collect()
}

/// What About shows: the app's name and version.
pub fn about_metadata(name: &str, version: &str) -> AboutMetadata<'static> {
    AboutMetadata { name: Some(name.to_string()), version: Some(version.to_string()), ..Default::default() }
}

/// The tauri menu of [`spec`] for this platform.
pub fn build<R: Runtime>(app: &AppHandle<R>) -> tauri::Result<Menu<R>> {
    let info = app.package_info();
    let about = about_metadata(&info.name, &info.version.to_string());
    let menu = Menu::new(app)?;
    for sub in spec(&info.name, Platform::current()) {
        let submenu = TauriSubmenu::new(app, &sub.title, true)?;
        for entry in &sub.entries {
            match entry {
                Entry::Item { id, text, accelerator } => {
                    submenu.append(&MenuItem::with_id(app, *id, *text, true, Some(*accelerator))?)?
                }
                Entry::Separator => submenu.append(&PredefinedMenuItem::separator(app)?)?,
                Entry::Standard(s) => submenu.append(&standard(app, *s, &about)?)?,
            }
        }
        menu.append(&submenu)?;
    }
    Ok(menu)
}

fn standard<R: Runtime>(
    app: &AppHandle<R>,
    s: Standard,
    about: &AboutMetadata,
) -> tauri::Result<PredefinedMenuItem<R>> {
    match s {
        Standard::About => {
            let text = format!("About {}", about.name.as_deref().unwrap_or_default());
            PredefinedMenuItem::about(app, Some(text.as_str()), Some(about.clone()))
        }
        Standard::Services => PredefinedMenuItem::services(app, None),
        Standard::Hide => PredefinedMenuItem::hide(app, None),
        Standard::HideOthers => PredefinedMenuItem::hide_others(app, None),
        Standard::ShowAll => PredefinedMenuItem::show_all(app, None),
        Standard::Quit => PredefinedMenuItem::quit(app, None),
        Standard::Undo => PredefinedMenuItem::undo(app, None),
        Standard::Redo => PredefinedMenuItem::redo(app, None),
        Standard::Cut => PredefinedMenuItem::cut(app, None),
        Standard::Copy => PredefinedMenuItem::copy(app, None),
        Standard::Paste => PredefinedMenuItem::paste(app, None),
        Standard::SelectAll => PredefinedMenuItem::select_all(app, None),
        Standard::Minimize => PredefinedMenuItem::minimize(app, None),
        Standard::Zoom => PredefinedMenuItem::maximize(app, None),
        Standard::Fullscreen => PredefinedMenuItem::fullscreen(app, None),
        Standard::CloseWindow => PredefinedMenuItem::close_window(app, None),
    }
}

/// What the page is asked to do (the `menu` event's payload, `{"action": "start"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum PageAction {
    Settings,
    OpenDataset,
    OpenModel,
    Start,
    /// A menu command the bridge refused, in words.
    Error {
        message: String,
    },
}

/// What an item does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Page(PageAction),
    Pause,
    Resume,
    Stop,
    Quit,
}

/// The action of the app's own item `id` (the standard items act by themselves).
pub fn action(id: &str) -> Option<Action> {
    Some(match id {
        SETTINGS => Action::Page(PageAction::Settings),
        OPEN_DATASET => Action::Page(PageAction::OpenDataset),
        OPEN_MODEL => Action::Page(PageAction::OpenModel),
        START => Action::Page(PageAction::Start),
        PAUSE => Action::Pause,
        RESUME => Action::Resume,
        STOP => Action::Stop,
        QUIT => Action::Quit,
        _ => return None,
    })
}

/// Pause, resume or stop the current run: the calls the page's buttons make.
pub fn control(state: &AppState, action: &Action) -> Option<Result<RunView, BridgeError>> {
    match action {
        Action::Pause => Some(state.pause()),
        Action::Resume => Some(state.resume()),
        Action::Stop => Some(state.stop()),
        Action::Page(_) | Action::Quit => None,
    }
}

/// Acts on a click of item `id` (or its shortcut). A refused run command is told to the
/// page, which shows it as it shows a button's.
pub fn on_menu<R: Runtime>(app: &AppHandle<R>, id: &str) {
    let Some(action) = action(id) else { return };
    let to_page = match action {
        Action::Page(page) => Some(page),
        Action::Quit => {
            app.exit(0);
            None
        }
        run => match app.try_state::<AppState>().and_then(|s| control(&s, &run)) {
            Some(Err(e)) => Some(PageAction::Error { message: e.to_string() }),
            _ => None,
        },
    };
    if let Some(message) = to_page {
        if let Err(e) = app.emit(MENU_EVENT, &message) {
            eprintln!("ostinato: could not send the menu's {message:?} to the page: {e}");
        }
    }
}

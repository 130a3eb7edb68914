//! Shortcut labels in the platform's own words: `CmdOrCtrl+Shift+O` is `⇧⌘O` on a Mac
//! and `Ctrl+Shift+O` elsewhere. The menu's accelerators are the one source; the page
//! shows these labels next to its buttons.

/// Which convention a label follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    Mac,
    Other,
}

impl Platform {
    /// The platform this build runs on.
    pub fn current() -> Self {
        if cfg!(target_os = "macos") {
            Platform::Mac
        } else {
            Platform::Other
        }
    }
}

/// The label of an accelerator (`"CmdOrCtrl+Enter"`, `"CmdOrCtrl+Shift+O"`, `"CmdOrCtrl+,"`)
/// on `platform`. A Mac writes modifiers as symbols in its fixed order (⌃⌥⇧⌘) and no
/// separators; elsewhere they are words joined by `+`, Ctrl first.
pub fn label(accelerator: &str, platform: Platform) -> String {
    let mut parts: Vec<&str> = accelerator.split('+').collect();
    // "CmdOrCtrl++" names the plus key: its last two parts are empty.
    let key = match parts.pop() {
        Some("") => {
            parts.pop();
            "+"
        }
        Some(k) => k,
        None => "",
    };
    // (Mac order, Mac symbol, word elsewhere)
    let mut mods: Vec<(u8, &str, &str)> = parts
        .iter()
        .map(|m| match m.to_ascii_lowercase().as_str() {
            "cmdorctrl" | "commandorcontrol" => (3, "⌘", "Ctrl"),
            "cmd" | "command" | "super" | "meta" => (3, "⌘", "Super"),
            "ctrl" | "control" => (0, "⌃", "Ctrl"),
            "alt" | "option" => (1, "⌥", "Alt"),
            "shift" => (2, "⇧", "Shift"),
            _ => (4, *m, *m),
        })
        .collect();
    let key = key_label(key, platform);
    match platform {
        Platform::Mac => {
            mods.sort_by_key(|m| m.0);
            mods.iter().map(|m| m.1).chain(std::iter::once(key.as_str())).collect()
        }
        Platform::Other => {
            // Ctrl, Alt, Shift, Super: the order Windows and GNOME write them in.
            mods.sort_by_key(|m| match m.2 {
                "Ctrl" => 0,
                "Alt" => 1,
                "Shift" => 2,
                _ => 3,
            });
            mods.iter().map(|m| m.2).chain(std::iter::once(key.as_str())).collect::<Vec<_>>().join("+")
        }
    }
}

/// A key's name as the platform writes it: single characters upper-case, named keys in
/// words or (on a Mac) their symbols.
fn key_label(key: &str, platform: Platform) -> String {
    let mac = platform == Platform::Mac;
    match key.to_ascii_lowercase().as_str() {
        "enter" | "return" => if mac { "↩" } else { "Enter" }.into(),
        "backspace" => if mac { "⌫" } else { "Backspace" }.into(),
        "delete" => if mac { "⌦" } else { "Delete" }.into(),
        "escape" | "esc" => if mac { "⎋" } else { "Esc" }.into(),
        "tab" => if mac { "⇥" } else { "Tab" }.into(),
        "space" => "Space".into(),
        "period" => ".".into(),
        "comma" => ",".into(),
        _ if key.chars().count() == 1 => key.to_uppercase(),
        _ => key.to_string(),
    }
}

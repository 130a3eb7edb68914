fn main() {
    // Declaring the app's commands makes tauri generate one permission per command
    // (`allow-<command>`), so capabilities/default.json can grant exactly these.
    tauri_build::try_build(
        tauri_build::Attributes::new()
            .app_manifest(tauri_build::AppManifest::new().commands(ostinato_commands::COMMANDS)),
    )
    .expect("tauri-build failed");
}

#[path = "src/command_list.rs"]
mod ostinato_commands;

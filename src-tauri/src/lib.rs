//! Ostinato's desktop shell: tauri commands and the engine-event bridge. Thin by design:
//! the training engine computes, this crate forwards (see bridge/).

pub mod bridge;
pub mod command_list;
pub mod commands;
pub mod models;
pub mod native;
pub mod settings;

pub use bridge::AppState;

use bridge::{EventSink, Outgoing};

/// The app handle is the bridge's event sink: each message goes to the web view, and
/// each run view to the native manners too (the wake lock, the notice). Wired here, so
/// the bridge knows nothing of the native plugin that uses it.
impl<R: tauri::Runtime> EventSink for tauri::AppHandle<R> {
    fn send(&self, message: Outgoing<'_>) {
        use tauri::Emitter;
        if let Outgoing::Run(view) = message {
            native::run_changed(self, view);
        }
        if let Err(e) = self.emit(message.name(), message) {
            eprintln!("ostinato: could not emit {}: {e}", message.name());
        }
    }
}

/// Adds the app's state and commands to a builder (the real one, or tauri's mock one in
/// tests). `Builder::setup` does not run under the mock runtime, so nothing here needs it.
pub fn app_builder<R: tauri::Runtime>(builder: tauri::Builder<R>, state: AppState) -> tauri::Builder<R> {
    builder.manage(state).invoke_handler(tauri::generate_handler![
        commands::get_state,
        commands::set_appearance,
        commands::save_settings,
        commands::reset_settings,
        commands::choose_folder,
        commands::scan_dataset,
        commands::set_label,
        commands::accept_labels,
        commands::analyse_song,
        commands::caption_lms,
        commands::caption_songs,
        commands::cancel_captions,
        commands::write_sidecars,
        commands::memory_plan,
        commands::start_run,
        commands::pause_run,
        commands::resume_run,
        commands::stop_run,
        commands::list_runs,
        commands::resume_past_run,
        commands::run_charts,
        commands::export_run,
        commands::list_models,
        commands::list_lms,
        commands::add_model_folder,
        commands::remove_model_folder,
        commands::download_model,
        commands::cancel_download,
        commands::shortcuts,
        commands::listen::run_previews,
        commands::listen::run_adapter,
        commands::listen::run_songs,
        commands::listen::audio_bytes,
        commands::listen::audio_picture,
        commands::listen::generate_song,
        commands::listen::dataset_audio,
        commands::listen::adapter_choices,
        commands::listen::generate_pair,
        commands::listen::run_pairs,
    ])
}

/// The app's entry point (main.rs calls only this).
pub fn run() {
    app_builder(tauri::Builder::default(), AppState::from_env())
        .plugin(native::plugin())
        .run(tauri::generate_context!())
        .expect("error while running Ostinato");
}

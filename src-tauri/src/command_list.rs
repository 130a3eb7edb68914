//! The app's IPC commands, by name. Shared by build.rs (which generates one
//! `allow-<name>` permission each) and the invoke handler; a test checks they agree.
pub const COMMANDS: &[&str] = &[
    "get_state",
    "set_appearance",
    "save_settings",
    "reset_settings",
    "choose_folder",
    "scan_dataset",
    "memory_plan",
    "start_run",
    "pause_run",
    "resume_run",
    "stop_run",
    "list_runs",
    "resume_past_run",
    "run_charts",
    "export_run",
    "list_models",
    "add_model_folder",
    "remove_model_folder",
    "download_model",
    "cancel_download",
];

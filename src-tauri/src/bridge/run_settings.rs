//! The app's settings as the engine's run configuration: the saved template, on the
//! request's dataset.

use ostinato_engine::train::RunConfig;

use super::StartRequest;

/// The run the saved settings start: the settings' config, on the request's dataset.
pub(super) fn run_config(req: &StartRequest) -> RunConfig {
    let mut c = req.settings.run_config(req.runs_dir.clone());
    c.data.folder = req.dataset_dir.clone();
    c
}

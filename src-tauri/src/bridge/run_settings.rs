//! What a run is started with: the saved settings, the dataset and the app's folders,
//! and that as the engine's run configuration.

use std::path::PathBuf;

use ostinato_engine::train::RunConfig;

use crate::settings::Settings;

/// What `engine::start` gets: the validated settings and where things are.
#[derive(Debug, Clone)]
pub struct StartRequest {
    pub settings: Settings,
    pub dataset_dir: PathBuf,
    pub runs_dir: PathBuf,
    /// The label store whose labels the run records and trains with.
    pub labels_dir: PathBuf,
}

/// The run the saved settings start: the settings' config, on the request's dataset.
pub(super) fn run_config(req: &StartRequest) -> RunConfig {
    let mut c = req.settings.run_config(req.runs_dir.clone());
    c.data.folder = req.dataset_dir.clone();
    c
}

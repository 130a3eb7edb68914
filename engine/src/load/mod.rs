//! Model sources: ACE-Step 1.5 models found on disk (ACE-Step's `checkpoints/`, the
//! Hugging Face cache, folders the user added) and downloaded from the hub into its
//! cache. The model folder itself is read by `model::folder::ModelFolder`.

pub mod catalog;
pub mod discover;
pub mod download;
pub mod hub;
pub mod places;
pub mod verify;

pub use catalog::DitVariant;
pub use discover::{find_models, FoundModel, Origin};
pub use download::{DownloadEvent, Downloader};
pub use hub::{Hub, HubCache};
pub use places::{AddedFolders, ModelPlaces};
pub use verify::{verify_model, Verified};

//! Loading, above the model and the codecs: where a run's model comes from (`source`:
//! a model folder or the built-in demo model) and what comes with it; ACE-Step 1.5
//! models found on disk (ACE-Step's `checkpoints/`, the Hugging Face cache, folders the
//! user added) and downloaded from the hub into its cache (`patience`: how long that
//! waits and retries); where model folders sit on disk (`layout`) and the model folder
//! itself (`folder`); what a model is (`kind`: 2B or XL, turbo, base or SFT); the
//! memory footprint a model will need (`footprint`);
//! and the 5 Hz LM folders that label songs (`lm`), found and downloaded the same way.

pub mod catalog;
pub mod demo;
pub mod discover;
pub mod download;
pub mod folder;
pub mod footprint;
pub mod hub;
pub mod kind;
mod layout;
pub mod lm;
pub mod patience;
pub mod places;
pub mod source;
pub mod verify;

pub use catalog::{DitVariant, Downloadable, LmVariant};
pub use discover::{find_lms, find_models, preferred_lm, FoundLm, FoundModel, Origin};
pub use download::{DownloadEvent, Downloader};
pub use hub::{Hub, HubCache};
pub use kind::{Flavor, ModelKind, ModelSize};
pub use lm::LmFolder;
pub use patience::Patience;
pub use places::{AddedFolders, ModelPlaces};
pub use verify::{verify_lm, verify_model, Verified};

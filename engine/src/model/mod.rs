//! The ACE-Step 1.5 DiT ("decoder" in the checkpoint).

pub mod config;

pub use config::{DitConfig, LayerType};

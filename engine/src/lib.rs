//! Ostinato's training engine: the ACE-Step 1.5 DiT in candle, LoRA adapters,
//! the training step and runs. No UI dependencies; front ends consume `Event`s.

pub mod data;
pub mod error;
pub mod model;

pub use error::{Error, Result};

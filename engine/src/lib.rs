//! Ostinato's training engine: the ACE-Step 1.5 DiT in candle, LoRA adapters,
//! the training step and runs. No UI dependencies; front ends consume `Event`s.

pub mod atomic;
pub mod bench;
pub mod cancel;
pub mod charts;
pub mod codec;
pub mod data;
pub mod device;
pub mod error;
pub mod events;
pub mod export;
pub mod finite;
pub mod generate;
pub mod heap;
pub(crate) mod kernels;
pub mod label;
pub mod load;
pub mod lora;
pub mod metrics;
pub mod model;
pub mod noise_levels;
pub mod run_state;
pub mod runtime;
pub mod tensor_io;
pub mod trace;
pub mod train;

pub use error::{Error, Result};

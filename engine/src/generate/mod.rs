//! Generation: text (and an optional adapter) to music with the loaded DiT.
//!
//! `sampler` runs the flow-matching ODE (turbo; base/SFT with APG guidance).

pub mod sampler;

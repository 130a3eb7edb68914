//! Generation: text (and an optional adapter) to music with the loaded DiT.
//!
//! `sampler` runs the flow-matching ODE (turbo; base/SFT with APG guidance), `decode`
//! turns latents into audio (the VAE decoder, or the demo's weight-free mel decoder in
//! `mel`), `wav` writes the result, and `song` ties them together for the front ends.

pub mod decode;
pub mod mel;
pub mod sampler;
pub mod song;
pub mod wav;

pub use decode::{decoder_for, read_latents, LatentDecoder};
pub use song::{GenerateEvent, GenerateSpec, Generator, SongModel};

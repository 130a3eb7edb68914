//! Generation: text (and an optional adapter) to music with the loaded DiT.
//!
//! `sampler` runs the flow-matching ODE (turbo; base/SFT with APG guidance), the
//! model source's decoder (`codec`) turns latents into audio, `wav` writes the result,
//! `latents` reads and writes latents files, `plan` has the 5 Hz LM write a song's
//! metadata and audio codes, `planned` fills a song's spec from it, and `song` ties them together for the front ends.

pub mod latents;
pub mod plan;
pub mod planned;
pub mod sampler;
pub mod song;
pub mod wav;

pub use latents::{read_latents, write_latents};
pub use song::{decode_latents, GenerateEvent, GenerateSpec, Generator, MixedAdapter, SongModel};

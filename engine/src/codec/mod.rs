//! Audio <-> latents and text -> condition: the DiT's inference-only companions. A
//! model folder's VAE (encoder and decoder), Qwen3 with its tokenizer and the
//! condition encoder; the built-in demo model's weight-free pair (mel encoder and
//! decoder) and its hashed conditioner. Each side sits behind one trait:
//! [`LatentEncoder`], [`LatentDecoder`], [`Conditioner`].

pub mod audio;
pub mod audio_codes;
pub mod audio_hints;
pub mod causal_lm;
pub mod condition;
pub mod condition_encoder;
pub mod decode;
pub mod encode;
pub mod mel_decoder;
pub mod qwen3;
pub mod tokenizer;
pub mod transformer;
pub mod vae;

pub use audio::StereoAudio;
pub use causal_lm::{CausalLm, KvCache};
pub use condition::{Conditioner, Conditioning, HashConditioner, SongMeta, INSTRUMENTAL};
pub use decode::{LatentDecoder, VaeDecoder};
pub use encode::{LatentEncoder, MelEncoder};
pub use mel_decoder::MelDecoder;

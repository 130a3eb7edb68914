//! CPU kernels behind the model's and the codecs' ops (f32 on the host): GEMM over
//! strided views, the linears' product, vectorised row kernels, attention's recompute
//! path, direct 1-D convolutions (with their register tile and per-geometry profile),
//! and the handover of tensors the custom ops hold themselves. Other devices keep
//! candle's ops.

pub(crate) mod attention_host;
pub(crate) mod cached_attention;
pub(crate) mod conv1d;
pub(crate) mod conv_profile;
pub(crate) mod conv_tile;
pub(crate) mod cpu_gemm;
pub(crate) mod handover;
pub(crate) mod linear;
pub(crate) mod matvec;
pub(crate) mod shared_out;
pub(crate) mod simd;

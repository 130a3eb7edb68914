//! CPU kernels behind the model's ops (f32 on the host). Other devices keep candle's ops.

pub(crate) mod conv1d;

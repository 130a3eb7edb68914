//! Where the inference-only loaders (VAE, Qwen3, condition encoder) take their named
//! tensors from: a checkpoint ([`TensorFile`]), or [`RandomTensors`], seeded random
//! values of whatever shapes they ask for, which the benches use to run the real
//! model's sizes without its checkpoint.

use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

use super::TensorFile;
use crate::Result;

pub trait TensorSource {
    /// Where the tensors are made.
    fn device(&self) -> &Device;
    /// The keys held (none for a source that makes any key asked for).
    fn keys(&self) -> Vec<String>;
    fn contains(&self, key: &str) -> bool;
    /// The first of `keys` present, as f32, checked against `shape`.
    fn get_any(&self, keys: &[&str], shape: &[usize]) -> Result<Tensor>;
    fn get(&self, key: &str, shape: &[usize]) -> Result<Tensor> {
        self.get_any(&[key], shape)
    }
    /// `key` as `dtype` (held weights narrower than f32 without an f32 copy where the
    /// source can avoid it).
    fn get_in(&self, key: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        Ok(self.get(key, shape)?.to_dtype(dtype)?)
    }
}

impl TensorSource for TensorFile {
    fn device(&self) -> &Device {
        TensorFile::device(self)
    }

    fn keys(&self) -> Vec<String> {
        TensorFile::keys(self)
    }

    fn contains(&self, key: &str) -> bool {
        TensorFile::contains(self, key)
    }

    fn get_any(&self, keys: &[&str], shape: &[usize]) -> Result<Tensor> {
        TensorFile::get_any(self, keys, shape)
    }

    fn get_in(&self, key: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        TensorFile::get_in(self, key, shape, dtype)
    }
}

/// Seeded random tensors under the first name asked for: `*.weight` scaled by
/// 1 / sqrt(the product of all but its first dimension) (a linear's or conv's fan-in),
/// anything else by 0.1. A tensor's values depend on the seed and its name only. It
/// holds no key, so loaders take their plain names (no weight-norm pairs, no prefixes).
pub struct RandomTensors {
    pub seed: u64,
    pub device: Device,
}

impl TensorSource for RandomTensors {
    fn device(&self) -> &Device {
        &self.device
    }

    fn keys(&self) -> Vec<String> {
        Vec::new()
    }

    fn contains(&self, _key: &str) -> bool {
        false
    }

    fn get_any(&self, keys: &[&str], shape: &[usize]) -> Result<Tensor> {
        self.get_in(keys[0], shape, DType::F32)
    }

    /// Rounded to bf16 value by value, without an f32 copy of the whole tensor (the
    /// LM's embedding at its real size is 0.9-1.8 GB in f32).
    fn get_in(&self, key: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let name_hash = u64::from_le_bytes(blake3::hash(key.as_bytes()).as_bytes()[..8].try_into().expect("8 bytes"));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.seed ^ name_hash);
        let scale = match key.ends_with(".weight") {
            true => 1.0 / (shape[1..].iter().product::<usize>() as f32).sqrt(),
            false => 0.1,
        };
        let n = shape.iter().product();
        let mut sample = move || scale * <StandardNormal as Distribution<f32>>::sample(&StandardNormal, &mut rng);
        let t = match dtype {
            DType::BF16 => {
                Tensor::from_vec((0..n).map(|_| half::bf16::from_f32(sample())).collect(), shape, &self.device)?
            }
            _ => Tensor::from_vec((0..n).map(|_| sample()).collect::<Vec<f32>>(), shape, &self.device)?
                .to_dtype(dtype)?,
        };
        Ok(t)
    }
}

//! An optimizer's checkpointed state: numbers and tensors by key, written as
//! safetensors and read back with each key named when it is missing or does not fit.
//! Counters are one-element i64 tensors and real numbers one-element f64 ones (on the
//! CPU), so that a resumed run continues with exactly the values it stopped with.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, Var};

use crate::{Error, Result};

/// A counter as a state tensor.
pub fn count(key: impl Into<String>, n: u64) -> Result<(String, Tensor)> {
    let key = key.into();
    let n = i64::try_from(n).map_err(|_| bad(&key, format!("{n} does not fit in i64")))?;
    Ok((key, Tensor::new(&[n], &Device::Cpu)?))
}

/// A real number as a state tensor.
pub fn number(key: impl Into<String>, x: f64) -> Result<(String, Tensor)> {
    Ok((key.into(), Tensor::new(&[x], &Device::Cpu)?))
}

fn bad(key: &str, reason: String) -> Error {
    Error::TrainingState { key: key.to_string(), reason }
}

/// State read back from a checkpoint (other keys are ignored).
pub struct Saved<'a>(pub &'a HashMap<String, Tensor>);

impl Saved<'_> {
    pub fn get(&self, key: &str) -> Result<&Tensor> {
        self.0.get(key).ok_or_else(|| bad(key, "missing".into()))
    }

    pub fn has(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    fn one(&self, key: &str, dtype: DType) -> Result<Tensor> {
        let t = self.get(key)?.flatten_all()?;
        match t.elem_count() {
            1 => Ok(t.to_dtype(dtype)?.squeeze(0)?),
            n => Err(bad(key, format!("expected one value, found {n}"))),
        }
    }

    pub fn count(&self, key: &str) -> Result<u64> {
        let n = self.one(key, DType::I64)?.to_scalar::<i64>()?;
        u64::try_from(n).map_err(|_| bad(key, format!("negative count {n}")))
    }

    pub fn number(&self, key: &str) -> Result<f64> {
        let x = self.one(key, DType::F64)?.to_scalar::<f64>()?;
        match x.is_finite() {
            true => Ok(x),
            false => Err(bad(key, format!("{x} is not a finite number"))),
        }
    }

    /// A tensor of `dims` in f32 on `device` (stored in any float dtype).
    pub fn tensor(&self, key: &str, dims: &[usize], device: &Device) -> Result<Tensor> {
        let t = self.get(key)?;
        if t.dims() != dims {
            return Err(bad(key, format!("shape {:?}, expected {dims:?}", t.dims())));
        }
        Ok(t.to_device(device)?.to_dtype(DType::F32)?)
    }

    /// A tensor shaped like the parameter `var`.
    pub fn like(&self, key: &str, var: &Var) -> Result<Tensor> {
        self.tensor(key, var.dims(), var.device())
    }
}

/// f32 zeros shaped like `var`, on its device.
pub fn zeros_like(var: &Var) -> Result<Tensor> {
    Ok(Tensor::zeros(var.shape(), DType::F32, var.device())?)
}

/// `var`'s value in f32 (detached).
pub fn value_f32(var: &Var) -> Result<Tensor> {
    Ok(var.as_tensor().detach().to_dtype(DType::F32)?)
}

/// Writes an f32 value back in `var`'s dtype.
pub fn set(var: &Var, value: &Tensor) -> Result<()> {
    Ok(var.set(&value.to_dtype(var.dtype())?)?)
}

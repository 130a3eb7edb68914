//! Several adapters in one forward pass, each at its own strength: their changes to a
//! layer summed on the base weight, as PEFT sums its active adapters and ComfyUI adds
//! one patch after another (a DoRA adapter's change is its rescaled weight less the
//! base, as PEFT's DoRA computes it beside other adapters).

use candle_core::Tensor;

use super::LoraCtx;
use crate::model::{ops, LinearAdapter};
use crate::Result;

/// The adapters a forward pass applies together.
pub struct AdapterMix<'a> {
    adapters: Vec<LoraCtx<'a>>,
}

impl<'a> AdapterMix<'a> {
    /// The mix of `adapters`; None when there are none (the base model).
    pub fn new(adapters: Vec<LoraCtx<'a>>) -> Option<Self> {
        (!adapters.is_empty()).then_some(Self { adapters })
    }
}

impl LinearAdapter for AdapterMix<'_> {
    fn adapts(&self, name: &str) -> bool {
        self.adapters.iter().any(|a| a.adapts(name))
    }

    /// One adapter changing the module applies as it does alone; several add their
    /// changes `y_i - W x` to `W x`.
    fn linear(&self, name: &str, x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
        let changing: Vec<&LoraCtx> = self.adapters.iter().filter(|a| a.adapts(name)).collect();
        match changing.as_slice() {
            [] => Ok(None),
            [one] => one.linear(name, x, w),
            several => {
                let base = ops::linear(x, w, None)?;
                let mut y = base.clone();
                for adapter in several {
                    let adapted = adapter.linear(name, x, w)?.expect("an adapter that adapts the module applies");
                    y = ops::add(&y, &(adapted - &base)?)?;
                }
                Ok(Some(y))
            }
        }
    }
}

#[cfg(test)]
mod tests;

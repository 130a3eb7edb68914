//! Pieces the custom ops share for tensors they hold themselves (constants, and
//! results computed without a graph) rather than receive as inputs.

use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CudaStorage, Error, MetalStorage, Result, Shape, Storage, Tensor};

/// Picks a held tensor's storage on the backend `S` an op's forward runs on.
pub type Pick<S> = fn(&Storage) -> Option<&S>;

pub fn on_cpu(s: &Storage) -> Option<&CpuStorage> {
    match s {
        Storage::Cpu(s) => Some(s),
        _ => None,
    }
}

pub fn on_cuda(s: &Storage) -> Option<&CudaStorage> {
    match s {
        Storage::Cuda(s) => Some(s),
        _ => None,
    }
}

pub fn on_metal(s: &Storage) -> Option<&MetalStorage> {
    match s {
        Storage::Metal(s) => Some(s),
        _ => None,
    }
}

/// `guard`'s storage on the backend of `pick`, or an error naming `op`.
pub fn storage_on<'a, S>(guard: &'a Storage, pick: Pick<S>, op: &str) -> Result<&'a S> {
    pick(guard).ok_or_else(|| Error::Msg(format!("{op}: a held tensor is on another device than the inputs")))
}

/// A result computed without a graph, handed to the op that attaches its backward:
/// the op's forward takes it (a copy of its storage) once, so the graph does not
/// hold it twice.
pub struct Handover {
    result: Mutex<Option<Tensor>>,
    op: &'static str,
}

impl Handover {
    pub fn new(result: Tensor, op: &'static str) -> Self {
        Self { result: Mutex::new(Some(result)), op }
    }

    pub fn take<S: BackendStorage>(&self, pick: Pick<S>) -> Result<(S, Shape)> {
        let result = self.result.lock().expect("handover lock").take();
        let result = result.ok_or_else(|| Error::Msg(format!("{}: forward ran twice", self.op)))?;
        let (guard, layout) = result.storage_and_layout();
        Ok((storage_on(&guard, pick, self.op)?.try_clone(layout)?, layout.shape().clone()))
    }
}

/// The three forwards of a `CustomOp1` whose result is the [`Handover`] in its field
/// `$field`: the op only attaches a backward to a result computed without a graph.
macro_rules! handed_over_forwards {
    ($field:ident) => {
        fn cpu_fwd(
            &self,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
        ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
            self.$field.take($crate::kernels::handover::on_cpu)
        }

        fn cuda_fwd(
            &self,
            _: &candle_core::CudaStorage,
            _: &candle_core::Layout,
        ) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> {
            self.$field.take($crate::kernels::handover::on_cuda)
        }

        fn metal_fwd(
            &self,
            _: &candle_core::MetalStorage,
            _: &candle_core::Layout,
        ) -> candle_core::Result<(candle_core::MetalStorage, candle_core::Shape)> {
            self.$field.take($crate::kernels::handover::on_metal)
        }
    };
}
pub(crate) use handed_over_forwards;

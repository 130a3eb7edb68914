//! Training: the flow-matching objective, gradients (plain or checkpointed).

pub mod flow;
pub mod grads;

//! The training step's mechanisms, each in its own module.

pub mod loss_scale;
pub mod optim;
pub mod schedule;

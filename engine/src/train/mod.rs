//! Training: the objective, gradients (plain or checkpointed), and the step's
//! mechanisms (optimizer, schedules, loss scaling), each in its own module.

pub mod cfg_dropout;
pub mod config;
pub mod fit;
pub mod flow;
pub mod grads;
pub mod loss_scale;
pub mod optim;
mod preview;
pub mod run;
pub mod schedule;
pub mod songs;
pub mod state;
pub mod step;
pub mod validation;

pub use config::RunConfig;
pub use run::{Run, RunControl, RunEnd, RunHandle};
pub mod history;
pub mod lock;

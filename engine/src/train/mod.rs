//! Training: the objective, gradients (plain or checkpointed), and the step's
//! mechanisms (optimizer, schedules, loss scaling), each in its own module.

pub mod ab;
pub mod cfg_dropout;
mod checkpoints;
pub mod config;
mod control;
pub mod fit;
pub mod flow;
pub mod grads;
mod handle;
mod listening;
pub mod loss_scale;
pub mod optim;
mod preview;
pub mod prompts;
mod run;
mod run_dir;
pub mod schedule;
mod serving;
mod sink;
pub mod songs;
pub mod state;
pub mod step;
pub mod validation;

pub use config::RunConfig;
pub use control::RunControl;
pub use handle::{Run, RunHandle};
pub use run::RunEnd;
pub mod history;
pub mod lock;

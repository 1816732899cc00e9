//! The runtime: the [`Manager`] (submit, wait, cancel, resume, execute one attempt, close
//! with drain), [`Executor`]s, the per-attempt runtime ([`AttemptContext`]: heartbeats,
//! started marker, progress, controls) and the polling [`Worker`].

mod attempt;
mod control;
mod error;
mod executor;
mod manager;
mod worker;

pub use attempt::{AttemptContext, Progress};
pub use control::{Control, ControlSlot, DEFAULT_TIMEOUT_REASON};
pub use error::RuntimeError;
pub use executor::{
    ExecutionError, ExecutionResult, Executor, ExecutorRegistry, ExecutorRegistryError,
    ValidationError,
};
pub use manager::{
    truncate_utf8, IdGenerator, Manager, ManagerConfig, SubmitRequest, TaskOutcome, MAX_ERROR_BYTES,
};
pub use worker::{Worker, WorkerConfig};

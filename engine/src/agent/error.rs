//! The durable agent's errors.

use crate::runtime::RuntimeError;
use crate::store::StoreError;

/// Why an agent run could not be submitted, read or continued.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// A run needs at least one message to start from.
    #[error("an agent run needs at least one message")]
    EmptyConversation,
    /// The step limit is 0 or over the bound.
    #[error("max_steps must be 1 to {max}, not {max_steps}")]
    InvalidMaxSteps {
        /// What was asked.
        max_steps: u32,
        /// The bound.
        max: u32,
    },
    /// The payload is of a version this build does not read.
    #[error("unsupported agent payload version {0}")]
    UnsupportedVersion(u32),
    /// The payload is not an agent payload.
    #[error("invalid agent payload: {0}")]
    InvalidPayload(String),
    /// A journaled entry of the run does not decode.
    #[error("invalid agent {what} entry: {reason}")]
    InvalidEntry {
        /// Which kind of entry.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// The journaled entries do not make a run (a turn out of order, a result of a call
    /// that was never asked for, …).
    #[error("the agent's journal does not fold: {0}")]
    Fold(String),
    /// The task is not an agent run.
    #[error("task {task_id:?} is not an agent run (executor {executor_key:?})")]
    NotAnAgent {
        /// The task.
        task_id: String,
        /// Its executor key.
        executor_key: String,
    },
    /// The run is not interactive: it ends at its final answer and takes no close.
    #[error("agent run {0:?} is not interactive")]
    NotInteractive(String),
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The runtime refused or failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

//! The runtime's error type.

use super::executor::ValidationError;
use crate::store::StoreError;

/// Errors of the manager, workers and attempts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No executor is registered under the key.
    #[error("executor {0:?} is unavailable")]
    ExecutorUnavailable(String),
    /// The executor refused the spec.
    #[error("validate spec: {0}")]
    InvalidSpec(#[source] ValidationError),
    /// The executor refused to run the task.
    #[error("validate execution: {0}")]
    InvalidExecution(#[source] ValidationError),
    /// A task-id kind is not `[A-Za-z0-9_-]{0,64}`.
    #[error("invalid task id kind {0:?}")]
    InvalidKind(String),
    /// This manager is already executing the task; nothing was touched.
    #[error("task {0:?} is already executing in this manager")]
    AlreadyExecuting(String),
    /// The manager has shut down. Do not retry this.
    #[error("the background task manager has shut down; do not retry this")]
    Closed,
    /// Close was called with active attempts and no deadline; the manager stays open.
    #[error("close needs a deadline while attempts are active")]
    CloseDeadlineRequired,
    /// Attempts were still active after the close deadline and the cancellations.
    #[error("attempts still active after the close deadline")]
    CloseTimedOut,
    /// A drain found no safe checkpoint; nothing was committed and the lease will expire.
    #[error("drain checkpoint unavailable")]
    DrainCheckpointUnavailable,
    /// The attempt lost its lease; nothing more it writes is applied.
    #[error("lease lost: {0}")]
    LeaseLost(String),
    /// An attempt that finished during close failed with this error.
    #[error("an attempt failed: {0}")]
    AttemptFailed(String),
}

impl RuntimeError {
    /// Whether this is the journal's storage failing for a while: a
    /// [`dtask_journal::Error::Storage`] behind the store's error
    /// ([`StoreError::journal_error`], a write's or a read's) — a full disk, an I/O error, a
    /// PostgreSQL database out of reach. A write it refused was not made (on PostgreSQL it
    /// may have been, when the connection failed at the commit: a claim made so is settled
    /// by its lease); the same call can be made again. Not a journal that **stopped** after
    /// a failed sync ([`dtask_journal::Error::Stopped`]), which only a reopen ends. A
    /// [`super::Worker`] tries a claim or a listing refused so again at its next poll.
    #[must_use]
    pub fn is_storage_outage(&self) -> bool {
        matches!(
            self,
            Self::Store(e) if matches!(e.journal_error(), Some(dtask_journal::Error::Storage(_)))
        )
    }

    /// Whether a worker may ignore this dispatch error: a lost race, a task that moved on,
    /// or one another node delayed after this one listed it.
    #[must_use]
    pub fn is_benign(&self) -> bool {
        matches!(
            self,
            Self::AlreadyExecuting(_)
                | Self::Store(
                    StoreError::VersionConflict { .. }
                        | StoreError::IllegalTransition { .. }
                        | StoreError::AlreadyTerminal(_)
                        | StoreError::NotFound(_)
                        | StoreError::NotDue { .. }
                )
        )
    }
}

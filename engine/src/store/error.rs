//! The task store's error type.

use dtask_journal::Timestamp;
use dtask_replay::{Status, TaskState};

/// Errors of the task store. Every named error of the reference store is a variant to match.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A request is malformed (a required field is empty, a size bound is exceeded). Checked
    /// before anything is looked up; nothing was written.
    #[error("invalid request: {field}: {reason}")]
    Invalid {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// What was asked for does not exist: [`NotFound`] says what, and its id.
    #[error("not found: {0}")]
    NotFound(NotFound),
    /// A task with this id exists already.
    #[error("task {0:?} already exists")]
    AlreadyExists(String),
    /// The expected version is stale.
    #[error("version conflict: expected {expected}, task is at {actual}")]
    VersionConflict {
        /// The caller's expected version.
        expected: u64,
        /// The task's version.
        actual: u64,
    },
    /// No active attempt: not running, lease expired, wrong attempt, or cancel intent; or an
    /// expired outbox receipt.
    #[error("lease lost: {0}")]
    LeaseLost(&'static str),
    /// The operation is not allowed in the task's status.
    #[error("illegal transition: {operation} in status {status}")]
    IllegalTransition {
        /// The task's status.
        status: Status,
        /// The operation.
        operation: &'static str,
    },
    /// An execution result that mixes variants or lacks a required part.
    #[error("invalid execution result: {0}")]
    InvalidExecutionResult(String),
    /// The task is terminal.
    #[error("task {0:?} is already terminal")]
    AlreadyTerminal(String),
    /// The pending task is delayed: it may not be claimed before `until`.
    #[error("task {task:?} is not due before {until}")]
    NotDue {
        /// The task.
        task: String,
        /// Its not-before time.
        until: Timestamp,
    },
    /// A malformed cursor, or one that does not match the request.
    #[error("invalid cursor: {0}")]
    InvalidCursor(String),
    /// A progress update's event id was replayed with different bytes.
    #[error("task event id {0:?} was recorded with different content")]
    EventIdConflict(String),
    /// The task has no notification route.
    #[error("notification unavailable: {0}")]
    NotificationUnavailable(&'static str),
    /// An application notification's event id was replayed with a different kind or data.
    #[error("notification event id {0:?} was recorded with different content")]
    NotificationEventIdConflict(String),
    /// The task's mailbox is sealed (the task has ended): it takes no new input, and no
    /// child can be created under it.
    #[error("the mailbox of task {0:?} is sealed")]
    MailboxSealed(String),
    /// The caller's mailbox generation is not the current one: its ownership was lost.
    #[error("ownership lost: generation {expected} expected, the mailbox is at {actual}")]
    OwnershipLost {
        /// The generation the caller presented.
        expected: u64,
        /// The mailbox's generation.
        actual: u64,
    },
    /// The caller's consumed cursor is stale.
    #[error("cursor conflict: consumed cursor {expected} expected, the mailbox is at {actual}")]
    CursorConflict {
        /// The cursor the caller presented.
        expected: u64,
        /// The mailbox's consumed cursor.
        actual: u64,
    },
    /// An input's event id was replayed with a different kind, data or delivery.
    #[error("input event id {0:?} was recorded with different content")]
    InputConflict(String),
    /// An `*IfNoInputs` transition found input newer than the caller's cursor: the task was
    /// sent back to pending instead (this is written: the snapshot is the task after it).
    #[error("inputs pending: task {:?} went back to pending to read newer input", .0.spec.id)]
    InputsPending(Box<TaskState>),
    /// A part of a progress event whose final part is recorded.
    #[error("task event {0:?} is closed: its final part is recorded")]
    EventClosed(String),
    /// A progress-event part was replayed with different bytes or final flag.
    #[error(
        "task event part {part_id:?} of event {event_id:?} was recorded with different content"
    )]
    PartConflict {
        /// The event.
        event_id: String,
        /// The part.
        part_id: String,
    },
    /// A new progress update of a task that has recorded the store's limit of updates
    /// ([`crate::StoreConfig::max_updates`]); nothing was written.
    #[error("task {task:?} has recorded its limit of {limit} progress updates")]
    UpdateLimit {
        /// The task.
        task: String,
        /// The limit.
        limit: u64,
    },
    /// The store was closed.
    #[error("the task store is closed")]
    Closed,
    /// The journal failed; nothing was written.
    #[error(transparent)]
    Journal(#[from] dtask_journal::Error),
    /// A stored task stream does not fold: the journal is damaged or was written by a faulty
    /// engine.
    #[error(transparent)]
    Replay(dtask_replay::ReplayError),
    /// The task was purged: its records were deleted ([`crate::TaskStore::purge`]); only its
    /// tombstone is left, and its id stays taken.
    #[error("task {task:?} was purged")]
    Purged {
        /// The task.
        task: String,
    },
}

impl From<dtask_replay::ReplayError> for StoreError {
    /// A stream that is a purge's tombstone is [`StoreError::Purged`]; anything else
    /// [`StoreError::Replay`].
    fn from(error: dtask_replay::ReplayError) -> Self {
        match error {
            dtask_replay::ReplayError::Rejected {
                task,
                error: dtask_replay::FoldError::Purged { .. },
                ..
            } => Self::Purged { task },
            error => Self::Replay(error),
        }
    }
}

/// What a [`StoreError::NotFound`] did not find.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotFound {
    /// No task has this id.
    #[error("task {0:?}")]
    Task(String),
    /// No progress update is recorded at this position of the task's stream.
    #[error("update of task {task:?} at position {position}")]
    Update {
        /// The task.
        task: String,
        /// The position looked at.
        position: u64,
    },
    /// No notification record is at this position of the task's stream.
    #[error("notification record of task {task:?} at position {position}")]
    NotificationRecord {
        /// The task.
        task: String,
        /// The position looked at.
        position: u64,
    },
    /// The notification is not queued (it was acknowledged).
    #[error("notification {0:?}")]
    Notification(String),
    /// No delivery holds this receipt (unknown, or superseded by a later delivery).
    #[error("receipt {0:?}")]
    Receipt(String),
    /// No mailbox has this id (no task: every task has one).
    #[error("mailbox {0:?}")]
    Mailbox(String),
    /// No input has this sequence in the task's mailbox.
    #[error("input {sequence} of task {task:?}")]
    Input {
        /// The task.
        task: String,
        /// The sequence looked for.
        sequence: u64,
    },
}

impl StoreError {
    /// The journal's error behind this one, whether a write failed
    /// ([`StoreError::Journal`]) or a read while refolding a task
    /// ([`StoreError::Replay`] of [`dtask_replay::ReplayError::Journal`]).
    #[must_use]
    pub fn journal_error(&self) -> Option<&dtask_journal::Error> {
        match self {
            Self::Journal(e) | Self::Replay(dtask_replay::ReplayError::Journal(e)) => Some(e),
            _ => None,
        }
    }

    pub(crate) fn task_not_found(id: &str) -> Self {
        Self::NotFound(NotFound::Task(id.to_owned()))
    }

    pub(crate) fn update_not_found(task: &str, position: u64) -> Self {
        Self::NotFound(NotFound::Update {
            task: task.to_owned(),
            position,
        })
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field,
            reason: reason.into(),
        }
    }
}

/// A store result.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

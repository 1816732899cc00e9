//! The requests of the store's writes: plain data, which `decide` turns into events.

use dtask_journal::{Delivery, LeasePolicy, MetadataEntry, Publication, TaskSpec, Timestamp};

/// A request to create a task.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CreateRequest {
    /// The spec (id and executor key required).
    pub spec: TaskSpec,
    /// The lease-expiry policy.
    pub policy: Option<LeasePolicy>,
    /// The initial checkpoint.
    pub checkpoint: Vec<u8>,
    /// The initial context snapshot.
    pub context_snapshot: Vec<u8>,
    /// When the task becomes visible: `on_create` (the default) or `deferred` (until
    /// [`crate::TaskStore::publish`]); `on_background` is refused at creation.
    pub publication: Publication,
    /// The running attempt creating this task as its child: the authority of a nested task
    /// (see [`ExecutionContext`]). `None` for a root task.
    pub parent: Option<ExecutionContext>,
    /// The root session of a root task's tree (a nested task inherits its parent's).
    pub root_session_id: String,
    /// How many times the task may be recovered after a lease expiry before the next one
    /// fails it (a `recovery_limit` record with the creation); `None`: no limit.
    pub max_recoveries: Option<u64>,
    /// The earliest time the task may be claimed (a `not_before` record with the creation):
    /// a delayed run. `None`, or a time not after the creation: at once.
    pub not_before: Option<Timestamp>,
}

/// The authority of a running attempt, which it presents to create child tasks: the
/// reference's execution context with a manager owner.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecutionContext {
    /// The parent task.
    pub task_id: String,
    /// The parent's running attempt.
    pub attempt: u64,
    /// The parent's mailbox generation, as the attempt saw it.
    pub generation: u64,
}

/// An input to send to a task's mailbox.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InputRequest {
    /// The sender's idempotency key (required, at most 1024 bytes).
    pub event_id: String,
    /// The input kind (required, at most 128 bytes).
    pub kind: String,
    /// The input bytes.
    pub data: Vec<u8>,
    /// How it is delivered.
    pub delivery: Delivery,
}

/// A request to move a mailbox's consumed cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdvanceCursor {
    /// The running attempt (the fence).
    pub attempt: u64,
    /// The mailbox generation the attempt saw.
    pub expected_generation: u64,
    /// The consumed cursor the attempt saw.
    pub expected_cursor: u64,
    /// The new consumed cursor (at least `expected_cursor`, at most the newest sequence).
    pub cursor: u64,
}

/// A progress update to append.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UpdateRequest {
    /// The emitting attempt (the fence; must be the running attempt).
    pub attempt: u64,
    /// The idempotency key, unique within the task.
    pub event_id: String,
    /// A free kind tag.
    pub kind: String,
    /// The update bytes (non-empty).
    pub data: Vec<u8>,
    /// Key/value metadata.
    pub metadata: Vec<MetadataEntry>,
    /// The part of a multi-part event; empty for a single-record update (the reference's
    /// shorthand for one final part).
    pub part_id: String,
    /// Whether this is the event's final part (parts only).
    pub last: bool,
}

/// An application notification of a running attempt.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NotificationRequest {
    /// The idempotency key (required, at most 1024 bytes).
    pub event_id: String,
    /// The kind (required, at most 64 bytes, not a lifecycle kind, no reserved prefix).
    pub kind: String,
    /// The data (at most 256 KiB; empty and absent are the same).
    pub data: Vec<u8>,
    /// How its consumer should take it (G3): [`Delivery::Queued`] (the default) or
    /// [`Delivery::Preempt`]. A nested task's notification becomes an input of its parent's
    /// mailbox with this delivery; a root task's is delivered from the outbox with it
    /// ([`crate::Notification::delivery`]).
    pub delivery: Delivery,
}

impl NotificationRequest {
    /// A queued notification of `kind` with `data`, idempotent by `event_id`.
    ///
    /// ```
    /// use dtask_engine::NotificationRequest;
    /// use dtask_journal::Delivery;
    /// let note = NotificationRequest::new("found-1", "finding", b"src/lib.rs".to_vec());
    /// assert_eq!(note.delivery, Delivery::Queued);
    /// assert_eq!(note.preempt().delivery, Delivery::Preempt);
    /// ```
    #[must_use]
    pub fn new(event_id: impl Into<String>, kind: impl Into<String>, data: Vec<u8>) -> Self {
        Self {
            event_id: event_id.into(),
            kind: kind.into(),
            data,
            delivery: Delivery::Queued,
        }
    }

    /// The same notification, sent to preempt: its consumer should interrupt what it is
    /// doing to read it ([`Delivery::Preempt`]; advisory, the order stays FIFO).
    #[must_use]
    pub const fn preempt(mut self) -> Self {
        self.delivery = Delivery::Preempt;
        self
    }
}

pub use dtask_journal::{application_notification_id, application_notification_source};

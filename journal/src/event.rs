//! The journal's vocabulary: every record a task stream can hold (schema v7).
//!
//! A task's stream is an ordered list of [`Event`]s. *Lifecycle* events change the task's
//! status or durable fields and each raises the task's version by exactly one; *non-lifecycle*
//! events (progress updates and notification bookkeeping) leave the version unchanged. The
//! fold that turns a stream into a task state lives in `dtask-replay`; this module only names
//! the facts.
//!
//! Every time a fact depends on is a field of the event ([`Timestamp`]), so folding a stream
//! never reads a clock.
//!
//! Schema changes go through a new record format version with an explicit upcast (bincode is
//! not self-describing): never reorder, remove or change the type of a variant or field here
//! without bumping [`crate::RECORD_FORMAT_VERSION`]. New variants are appended at the end of
//! [`Event`]: bincode writes a variant's index, so every record of an older schema decodes
//! unchanged. Schema v2 added the mailbox, nested tasks, publication and multi-part progress
//! events (from `CreatedV2` on), schema v3 ([`EVENT_SCHEMA_VERSION`]) the lineage of a rerun
//! (`RerunOf`, `RerunAs`), a task's recovery limit (`RecoveryLimit`) and its earliest claim
//! time (`NotBefore`), schema v4 the tombstone of a purged stream (`Purged`) and an operator's
//! hold (`Hold`, `HoldLifted`), schema v5 a trim of a stream's progress (`UpdateTrimmed`,
//! `ProgressTrimmed`), schema v6 a nested task's application notification to its parent
//! (`ParentNotified`), schema v7 the delivery of an application notification sent to
//! preempt (`NotificationEnqueuedV2`, `ParentNotifiedV2`); a stream written by an older
//! engine holds none of them and folds exactly as before.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// The event schema this build writes: 7 (v1; v2's mailbox, nested tasks, publication and
/// multi-part progress events; v3's rerun lineage, recovery limit and delayed runs; v4's
/// purge tombstone and holds; v5's trimmed progress; v6's application notifications of
/// nested tasks; v7's preemptive notifications). Every record of an older schema is a
/// record of this one.
pub const EVENT_SCHEMA_VERSION: u32 = 7;

/// Milliseconds since the UNIX epoch, as recorded in an event.
///
/// The clock is read when a command is decided, never when an event is folded.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The timestamp as milliseconds since the UNIX epoch.
    #[must_use]
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// This timestamp plus `millis` milliseconds (saturating).
    #[must_use]
    pub const fn plus_millis(self, millis: u64) -> Self {
        Self(self.0.saturating_add(millis))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// What happens to a running task whose lease expires (fixed at creation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeasePolicy {
    /// The task goes back to pending and the next claim starts attempt n+1.
    Retry,
    /// The task fails ("execution lease expired and retry is disabled"), or is canceled when
    /// cancellation had been requested.
    Fail,
}

impl LeasePolicy {
    /// The lower-case name used in exports and the CLI.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::Fail => "fail",
        }
    }
}

/// How an input is delivered to the task's executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Read in FIFO order at the executor's next boundary.
    #[default]
    Queued,
    /// The executor should interrupt what it is doing to read it (advisory: the order is
    /// still FIFO).
    Preempt,
}

impl Delivery {
    /// The lower-case name used in exports and the CLI.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Preempt => "preempt",
        }
    }
}

/// When a task becomes visible to its parent (or session): its lifecycle notifications are
/// held back while it is deferred.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Publication {
    /// Invisible until published: no lifecycle notification is sent.
    Deferred,
    /// Visible from creation (`task_created` is sent).
    #[default]
    OnCreate,
    /// Published after creation (`task_backgrounded` was sent).
    OnBackground,
}

impl Publication {
    /// The lower-case name used in exports and the CLI.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Deferred => "deferred",
            Self::OnCreate => "on_create",
            Self::OnBackground => "on_background",
        }
    }
}

/// The immutable, serialized intent of a task, fixed by `Created`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TaskSpec {
    /// The task id; unique in a journal, never empty, no NUL byte.
    pub id: String,
    /// Routing key to the executor that runs the task.
    pub executor_key: String,
    /// A free tag (for example `background_tool`); not used for routing.
    pub kind: String,
    /// Opaque bytes that only the executor reads.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// Human-readable description.
    pub description: String,
    /// Optional path of a derived (non-authoritative) transcript.
    pub output_file: String,
    /// The session that notifications are routed to; empty for none.
    pub session_id: String,
    /// Whether waiting-input and terminal notifications are sent to the session.
    pub notify_session: bool,
}

impl TaskSpec {
    /// A spec with `id` and `executor_key` and every other field empty.
    #[must_use]
    pub fn new(id: impl Into<String>, executor_key: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            executor_key: executor_key.into(),
            ..Self::default()
        }
    }
}

/// How a lazily or sweeper-detected lease expiry was resolved; which one follows from the
/// task's [`LeasePolicy`] and whether cancellation had been requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpiryResolution {
    /// Retry policy: back to pending with the same attempt count (cancel intent kept).
    Retry,
    /// Fail policy without cancel intent: failed with the lease-expired error.
    Failed,
    /// Fail policy with cancel intent: canceled with the cancel reason.
    Canceled,
}

impl ExpiryResolution {
    /// Whether the resolution ends the task.
    #[must_use]
    pub const fn is_terminal(self) -> bool {
        !matches!(self, Self::Retry)
    }
}

/// One key/value entry of an update's metadata.
pub type MetadataEntry = (String, String);

/// Decodes a creation event's spec straight into its shared allocation: serde's own
/// decoding of an `Arc` goes through a `Box` first, two allocations where this takes one.
fn shared_spec<'de, D: serde::Deserializer<'de>>(decoder: D) -> Result<Arc<TaskSpec>, D::Error> {
    TaskSpec::deserialize(decoder).map(Arc::new)
}

/// One record of a task stream.
///
/// Variants up to and including `Canceled` are lifecycle events (each raises the version by
/// one); the rest are non-lifecycle records. The variant order is part of the on-disk format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// T1: the task was created, pending, version 1, attempt 0.
    Created {
        /// The immutable spec, shared with the state a fold of the event makes (the
        /// encoding is the spec's own).
        #[serde(deserialize_with = "shared_spec")]
        spec: Arc<TaskSpec>,
        /// What a lease expiry does to this task.
        policy: LeasePolicy,
        /// The initial checkpoint (empty for none).
        #[serde(with = "serde_bytes")]
        checkpoint: Vec<u8>,
        /// An opaque, manager-owned context capture (empty for none).
        #[serde(with = "serde_bytes")]
        context_snapshot: Vec<u8>,
        /// Creation time.
        at: Timestamp,
    },
    /// T2: a worker claimed the pending task; `attempt` is the new attempt number.
    AttemptStarted {
        /// The new attempt number (the previous one plus one).
        attempt: u64,
        /// When the lease runs out unless renewed.
        lease_deadline: Timestamp,
        /// Claim time.
        at: Timestamp,
    },
    /// T3: the running attempt renewed its lease.
    Heartbeat {
        /// The renewed lease deadline.
        lease_deadline: Timestamp,
        /// Heartbeat time.
        at: Timestamp,
    },
    /// T4: the started marker — the tool's side effect has begun and this checkpoint says how to
    /// recover it instead of starting it again.
    StartCommitted {
        /// The managed checkpoint (non-empty).
        #[serde(with = "serde_bytes")]
        checkpoint: Vec<u8>,
        /// Commit time.
        at: Timestamp,
    },
    /// T5: the first transcript (output file) failure of the task.
    TranscriptFailed {
        /// The error text (non-empty, bounded).
        error: String,
        /// Report time.
        at: Timestamp,
    },
    /// T8: the attempt ended waiting for input; the checkpoint carries the input request.
    WaitingInput {
        /// The replacement checkpoint (non-empty).
        #[serde(with = "serde_bytes")]
        checkpoint: Vec<u8>,
        /// Transition time.
        at: Timestamp,
    },
    /// T9: the attempt ended suspended.
    Suspended {
        /// The replacement checkpoint (non-empty).
        #[serde(with = "serde_bytes")]
        checkpoint: Vec<u8>,
        /// Transition time.
        at: Timestamp,
    },
    /// T10: the attempt yielded; the task is pending again.
    Yielded {
        /// A replacement checkpoint; empty keeps the stored one.
        #[serde(with = "serde_bytes")]
        checkpoint: Vec<u8>,
        /// Transition time.
        at: Timestamp,
    },
    /// T17: input was given to a task waiting for it; the task is pending with a pending resume.
    InputProvided {
        /// The resume data handed to the next attempt.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        /// A replacement context snapshot, when one was captured.
        #[serde(with = "serde_bytes")]
        context_snapshot: Option<Vec<u8>>,
        /// Transition time.
        at: Timestamp,
    },
    /// T18: a suspended task was released to pending.
    Released {
        /// A replacement context snapshot, when supplied (empty clears it).
        #[serde(with = "serde_bytes")]
        context_snapshot: Option<Vec<u8>>,
        /// Transition time.
        at: Timestamp,
    },
    /// T12–T14: the first cancel request. What it does depends on the status it finds: a
    /// running task keeps running with its lease extended to `lease_deadline`; a retried
    /// pending task stays pending; any other non-terminal task is canceled directly
    /// (`direct` is then true).
    CancelRequested {
        /// The cancel reason (may be empty: the default reason applies at cancellation).
        reason: String,
        /// The extended lease deadline when the task was running.
        lease_deadline: Option<Timestamp>,
        /// Whether this request canceled the task directly (T14).
        direct: bool,
        /// Request time.
        at: Timestamp,
    },
    /// T19–T22: the running attempt's lease ran out and was resolved.
    LeaseExpired {
        /// How the expiry was resolved.
        resolution: ExpiryResolution,
        /// The deadline that passed.
        deadline: Timestamp,
        /// When the expiry was detected and written down (after `deadline`).
        at: Timestamp,
    },
    /// T6: the attempt completed the task with result data.
    Completed {
        /// The result data.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        /// Transition time.
        at: Timestamp,
    },
    /// T7: the attempt failed the task.
    Failed {
        /// The error text (non-empty, bounded).
        error: String,
        /// Transition time.
        at: Timestamp,
    },
    /// T11: the attempt acknowledged cancellation; the task is canceled.
    Canceled {
        /// The reason recorded as the task's result error.
        reason: String,
        /// Transition time.
        at: Timestamp,
    },
    /// A progress update of a running attempt (non-lifecycle; deduplicated by `event_id`).
    UpdateAppended {
        /// The attempt that emitted it (the fence).
        attempt: u64,
        /// The caller's idempotency key, unique within the task.
        event_id: String,
        /// A free kind tag.
        kind: String,
        /// The update bytes.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        /// Key/value metadata, in emission order.
        metadata: Vec<MetadataEntry>,
        /// Append time.
        at: Timestamp,
    },
    /// A notification was queued in the outbox (non-lifecycle). Lifecycle notifications are
    /// written in the same batch as the transition that caused them.
    NotificationEnqueued {
        /// The notification id (`<task>:<version>:<kind>` for lifecycle ones).
        id: String,
        /// The application event id, empty for lifecycle notifications.
        event_id: String,
        /// The notification kind.
        kind: String,
        /// The notification data (empty for lifecycle notifications).
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        /// The task version when queued.
        version: u64,
        /// Queue time.
        at: Timestamp,
    },
    /// A queued notification was acknowledged and leaves the outbox (non-lifecycle).
    NotificationAcked {
        /// The acknowledged notification id.
        id: String,
        /// The global sequence of the record that enqueued it (its outbox key).
        enqueued_seq: u64,
        /// Acknowledgement time.
        at: Timestamp,
    },
    // ---- schema v2 ----
    /// T1 of schema v2: the task was created with a publication other than `on_create`, or
    /// under a parent. (A root task published on create is written as `Created`, the v1
    /// bytes.)
    CreatedV2 {
        /// The immutable spec, shared with the state a fold of the event makes (the
        /// encoding is the spec's own).
        #[serde(deserialize_with = "shared_spec")]
        spec: Arc<TaskSpec>,
        /// What a lease expiry does to this task.
        policy: LeasePolicy,
        /// The initial checkpoint (empty for none).
        #[serde(with = "serde_bytes")]
        checkpoint: Vec<u8>,
        /// An opaque, manager-owned context capture (empty for none).
        #[serde(with = "serde_bytes")]
        context_snapshot: Vec<u8>,
        /// When the task becomes visible (`deferred` or `on_create`).
        publication: Publication,
        /// The parent task, empty for a root task.
        parent_task_id: String,
        /// The root session of the task tree (a nested task inherits its parent's).
        root_session_id: String,
        /// Creation time.
        at: Timestamp,
    },
    /// A child task was created by this task's running attempt (non-lifecycle), in the same
    /// atomic append as the child's creation. The attempt and mailbox generation are the
    /// authority the child was created under.
    ChildCreated {
        /// The child's id.
        child_id: String,
        /// The attempt that created it (the running one).
        attempt: u64,
        /// The mailbox generation the attempt saw.
        generation: u64,
        /// Creation time.
        at: Timestamp,
    },
    /// An input reached the task's mailbox (non-lifecycle): the next sequence number, FIFO.
    /// Deduplicated by `event_id` for the life of the task.
    InputSent {
        /// The mailbox sequence (1, 2, 3, …).
        sequence: u64,
        /// The sender's idempotency key.
        event_id: String,
        /// The input kind.
        kind: String,
        /// The input bytes.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        /// How it is delivered.
        delivery: Delivery,
        /// Send time.
        at: Timestamp,
    },
    /// T17': input reached a task waiting for it; the task is pending again (lifecycle,
    /// written right after the `InputSent` that woke it).
    InputWoke {
        /// The sequence of the input that woke it.
        sequence: u64,
        /// Transition time.
        at: Timestamp,
    },
    /// The running attempt moved the consumed cursor forward (non-lifecycle).
    CursorAdvanced {
        /// The new consumed cursor (a sequence number).
        cursor: u64,
        /// The attempt that consumed (the running one).
        attempt: u64,
        /// Time.
        at: Timestamp,
    },
    /// T24: the running attempt consumed inputs up to `cursor` and committed a checkpoint at
    /// that boundary.
    InputCommitted {
        /// The new consumed cursor.
        cursor: u64,
        /// The checkpoint (non-empty).
        #[serde(with = "serde_bytes")]
        checkpoint: Vec<u8>,
        /// Time.
        at: Timestamp,
    },
    /// An `*IfNoInputs` transition found input newer than `cursor`: the consumed cursor is set
    /// to `cursor` and the task is pending again, so the next attempt reads the new input.
    InputsPending {
        /// The consumed cursor.
        cursor: u64,
        /// A replacement checkpoint; empty keeps the stored one.
        #[serde(with = "serde_bytes")]
        checkpoint: Vec<u8>,
        /// Transition time.
        at: Timestamp,
    },
    /// A deferred task was published: `on_background` from now on (non-lifecycle).
    Published {
        /// Publish time.
        at: Timestamp,
    },
    /// One part of a multi-part progress event of a running attempt (non-lifecycle);
    /// deduplicated by (`event_id`, `part_id`). Readers see the event as complete once its
    /// `last` part is recorded; no part may follow it.
    PartAppended {
        /// The attempt that emitted it (the fence).
        attempt: u64,
        /// The logical event.
        event_id: String,
        /// The part, unique within the event.
        part_id: String,
        /// Whether this is the event's final part.
        last: bool,
        /// A free kind tag.
        kind: String,
        /// The part's bytes (may be empty for a metadata-only part).
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        /// Key/value metadata, in emission order.
        metadata: Vec<MetadataEntry>,
        /// Append time.
        at: Timestamp,
    },
    /// A lifecycle notification of this nested task could not be put into its parent's
    /// mailbox (non-lifecycle); the transition that caused it went ahead.
    ParentNotificationFailed {
        /// The notification kind.
        kind: String,
        /// Why.
        error: String,
        /// Time.
        at: Timestamp,
    },
    // ---- schema v3 ----
    /// This task is a rerun of `task`, a finished root task (non-lifecycle): written right
    /// after this task's creation, in the same atomic append as `task`'s [`Event::RerunAs`].
    /// The rerun was created from `task`'s creation record (spec, policy, initial checkpoint
    /// and context snapshot) under its own id.
    RerunOf {
        /// The task rerun.
        task: String,
        /// Time.
        at: Timestamp,
    },
    /// This finished task was rerun as the new task `task` (non-lifecycle; after the terminal
    /// record, in the same atomic append as `task`'s creation and [`Event::RerunOf`]).
    RerunAs {
        /// The new task.
        task: String,
        /// Time.
        at: Timestamp,
    },
    /// How many times the task may be recovered after losing its worker (a lease expiry
    /// under the retry policy) before the next expiry fails it (non-lifecycle; written with
    /// the creation, before any attempt). A task without one is recovered without limit.
    RecoveryLimit {
        /// The most recoveries (0: the first expiry fails the task).
        max_recoveries: u64,
        /// Time.
        at: Timestamp,
    },
    /// The pending task may not be claimed before `until` (non-lifecycle; written with the
    /// creation or with the `Yielded` that made the task pending): a durable timer. The next
    /// `AttemptStarted` clears it.
    NotBefore {
        /// The earliest claim time.
        until: Timestamp,
        /// Time.
        at: Timestamp,
    },
    // ---- schema v4 ----
    /// The tombstone of a purged stream: the finished task's `records` records were
    /// deleted, with their commit entries, in the same atomic write that put this record in
    /// the first one's place, at position 0 — the only record the stream keeps (no record
    /// may follow it). It chains from `last_digest`, the digest of the last record deleted,
    /// not from the genesis digest, and `sequences` sums the deleted records' global sequences
    /// ([`crate::PairHash::of_sequences`]), so that an audit accounts for every sequence
    /// missing from the commit order. The task's id stays taken.
    Purged {
        /// How many records were deleted (positions `0 .. records`).
        records: u64,
        /// The order-independent sum of the deleted records' sequences (two lanes).
        sequences: [u64; 2],
        /// The chain digest of the last record deleted, which this record chains from.
        last_digest: [u8; 32],
        /// Time.
        at: Timestamp,
    },
    /// An operator's hold on the task (non-lifecycle): while it stands the task is not
    /// purged, whatever its age. Written in any status, before or after the end; at most one
    /// stands at a time.
    Hold {
        /// Why (an operator's words: a case number, an investigation).
        reason: String,
        /// Time.
        at: Timestamp,
    },
    /// The task's hold lifted (non-lifecycle): it may be purged again.
    HoldLifted {
        /// Time.
        at: Timestamp,
    },
    // ---- schema v5 ----
    /// A progress update whose bytes were trimmed ([`crate::Journal::trim_progress`]): the
    /// record of an [`Event::UpdateAppended`] (`part_id` empty) or an
    /// [`Event::PartAppended`], rewritten in its place with everything the fold and the
    /// deduplication by event id need — attempt, event id, part, kind, time — and without its
    /// data and metadata. It folds exactly as the update it stands for, so a trimmed stream
    /// folds to the same state. Written only by a trim (or an import restoring one), never
    /// appended.
    UpdateTrimmed {
        /// The attempt that emitted it (the fence).
        attempt: u64,
        /// The idempotency key.
        event_id: String,
        /// The part of a multi-part event; empty for a single-record update.
        part_id: String,
        /// Whether the part was its event's final one (`true` for a single-record update).
        last: bool,
        /// The kind tag.
        kind: String,
        /// The size of the record it replaced, in bytes.
        bytes: u64,
        /// When the update was appended.
        at: Timestamp,
    },
    /// A trim of the stream's progress (non-lifecycle): `records` update records before this
    /// one were rewritten as [`Event::UpdateTrimmed`] in the same atomic write that appended
    /// this record, and every record from the first of them on was framed again (same
    /// positions, same sequences), so the stream's hash chain stays whole. `digest_before`
    /// is the chain digest of the stream's last record before the trim: the end a reader may
    /// have recorded. Written only by a trim (or an import restoring one).
    ProgressTrimmed {
        /// How many update records were trimmed.
        records: u64,
        /// The bytes the trim saved (the records' sizes before, less after).
        bytes: u64,
        /// The chain digest of the stream's last record before the trim.
        digest_before: [u8; 32],
        /// Time.
        at: Timestamp,
    },
    // ---- schema v6 ----
    /// An application notification of this nested task's running attempt, put into its
    /// parent's mailbox (non-lifecycle): written in the same atomic append as the parent's
    /// [`Event::InputSent`], whose event id is the notification's id
    /// ([`application_notification_id`]) and whose kind and data are these. Deduplicated task-wide by `event_id`, as a root task's
    /// [`Event::NotificationEnqueued`] is.
    ParentNotified {
        /// The attempt that sent it (the fence).
        attempt: u64,
        /// The caller's idempotency key, unique among the task's notifications.
        event_id: String,
        /// The notification kind (the input's kind).
        kind: String,
        /// The notification data (the input's data).
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        /// Time.
        at: Timestamp,
    },
    // ---- schema v7 ----
    /// A root task's application notification sent for preemptive delivery
    /// ([`Delivery::Preempt`]): [`Event::NotificationEnqueued`] with its delivery, written
    /// instead of it for such a notification (a queued one is still written as
    /// [`Event::NotificationEnqueued`], byte for byte as before).
    NotificationEnqueuedV2 {
        /// The notification id ([`application_notification_id`]).
        id: String,
        /// The application event id.
        event_id: String,
        /// The notification kind.
        kind: String,
        /// The notification data.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        /// How its consumer should take it.
        delivery: Delivery,
        /// The task version when queued.
        version: u64,
        /// Queue time.
        at: Timestamp,
    },
    /// A nested task's application notification sent for preemptive delivery:
    /// [`Event::ParentNotified`] with its delivery (the parent's [`Event::InputSent`] in the
    /// same append carries the same), written instead of it for such a notification.
    ParentNotifiedV2 {
        /// The attempt that sent it (the fence).
        attempt: u64,
        /// The caller's idempotency key, unique among the task's notifications.
        event_id: String,
        /// The notification kind (the input's kind).
        kind: String,
        /// The notification data (the input's data).
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        /// How the parent's executor should take it (the input's delivery).
        delivery: Delivery,
        /// Time.
        at: Timestamp,
    },
}

/// A queued notification's fields, borrowed from its record
/// ([`Event::queued_notification`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuedNotification<'a> {
    /// The notification id.
    pub id: &'a str,
    /// The application event id, empty for a lifecycle notification.
    pub event_id: &'a str,
    /// The kind.
    pub kind: &'a str,
    /// The data (empty for a lifecycle notification).
    pub data: &'a [u8],
    /// How its consumer should take it (queued unless sent to preempt).
    pub delivery: Delivery,
    /// The task version when it was queued.
    pub version: u64,
    /// When it was queued.
    pub at: Timestamp,
}

/// The id of an application notification: depends only on (task, event id). A nested
/// task's application notification reaches its parent's mailbox as an input with this event
/// id; [`application_notification_source`] reads the task and event id back.
///
/// ```
/// use dtask_journal::{application_notification_id, application_notification_source};
/// let id = application_notification_id("review/c1", "found-1");
/// assert_eq!(id, "dtask.custom:cmV2aWV3L2Mx:Zm91bmQtMQ:application-event");
/// assert_eq!(
///     application_notification_source(&id),
///     Some(("review/c1".to_owned(), "found-1".to_owned()))
/// );
/// assert_eq!(application_notification_source("c1:3:completed"), None);
/// ```
#[must_use]
pub fn application_notification_id(task: &str, event_id: &str) -> String {
    format!(
        "{APPLICATION_ID_PREFIX}{}:{}{APPLICATION_ID_SUFFIX}",
        URL_SAFE_NO_PAD.encode(task),
        URL_SAFE_NO_PAD.encode(event_id)
    )
}

/// What every application notification id starts with.
const APPLICATION_ID_PREFIX: &str = "dtask.custom:";
/// What every application notification id ends with.
const APPLICATION_ID_SUFFIX: &str = ":application-event";

/// The task and event id an application notification id names
/// ([`application_notification_id`]), or `None` for any other id (a lifecycle
/// notification's, an input's own).
#[must_use]
pub fn application_notification_source(id: &str) -> Option<(String, String)> {
    let inner = id
        .strip_prefix(APPLICATION_ID_PREFIX)?
        .strip_suffix(APPLICATION_ID_SUFFIX)?;
    let (task, event_id) = inner.split_once(':')?;
    let decode = |part: &str| {
        URL_SAFE_NO_PAD
            .decode(part)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
    };
    Some((decode(task)?, decode(event_id)?))
}

/// The discriminant of an [`Event`], for filters, statistics and display.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum EventType {
    Created,
    AttemptStarted,
    Heartbeat,
    StartCommitted,
    TranscriptFailed,
    WaitingInput,
    Suspended,
    Yielded,
    InputProvided,
    Released,
    CancelRequested,
    LeaseExpired,
    Completed,
    Failed,
    Canceled,
    UpdateAppended,
    NotificationEnqueued,
    NotificationAcked,
    CreatedV2,
    ChildCreated,
    InputSent,
    InputWoke,
    CursorAdvanced,
    InputCommitted,
    InputsPending,
    Published,
    PartAppended,
    ParentNotificationFailed,
    RerunOf,
    RerunAs,
    RecoveryLimit,
    NotBefore,
    Purged,
    Hold,
    HoldLifted,
    UpdateTrimmed,
    ProgressTrimmed,
    ParentNotified,
    NotificationEnqueuedV2,
    ParentNotifiedV2,
}

impl EventType {
    /// Every event type, in schema order.
    pub const ALL: [Self; 40] = [
        Self::Created,
        Self::AttemptStarted,
        Self::Heartbeat,
        Self::StartCommitted,
        Self::TranscriptFailed,
        Self::WaitingInput,
        Self::Suspended,
        Self::Yielded,
        Self::InputProvided,
        Self::Released,
        Self::CancelRequested,
        Self::LeaseExpired,
        Self::Completed,
        Self::Failed,
        Self::Canceled,
        Self::UpdateAppended,
        Self::NotificationEnqueued,
        Self::NotificationAcked,
        Self::CreatedV2,
        Self::ChildCreated,
        Self::InputSent,
        Self::InputWoke,
        Self::CursorAdvanced,
        Self::InputCommitted,
        Self::InputsPending,
        Self::Published,
        Self::PartAppended,
        Self::ParentNotificationFailed,
        Self::RerunOf,
        Self::RerunAs,
        Self::RecoveryLimit,
        Self::NotBefore,
        Self::Purged,
        Self::Hold,
        Self::HoldLifted,
        Self::UpdateTrimmed,
        Self::ProgressTrimmed,
        Self::ParentNotified,
        Self::NotificationEnqueuedV2,
        Self::ParentNotifiedV2,
    ];

    /// The `snake_case` name used in exports and the CLI.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::AttemptStarted => "attempt_started",
            Self::Heartbeat => "heartbeat",
            Self::StartCommitted => "start_committed",
            Self::TranscriptFailed => "transcript_failed",
            Self::WaitingInput => "waiting_input",
            Self::Suspended => "suspended",
            Self::Yielded => "yielded",
            Self::InputProvided => "input_provided",
            Self::Released => "released",
            Self::CancelRequested => "cancel_requested",
            Self::LeaseExpired => "lease_expired",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
            Self::UpdateAppended => "update_appended",
            Self::NotificationEnqueued => "notification_enqueued",
            Self::NotificationAcked => "notification_acked",
            Self::CreatedV2 => "created_v2",
            Self::ChildCreated => "child_created",
            Self::InputSent => "input_sent",
            Self::InputWoke => "input_woke",
            Self::CursorAdvanced => "cursor_advanced",
            Self::InputCommitted => "input_committed",
            Self::InputsPending => "inputs_pending",
            Self::Published => "published",
            Self::PartAppended => "part_appended",
            Self::ParentNotificationFailed => "parent_notification_failed",
            Self::RerunOf => "rerun_of",
            Self::RerunAs => "rerun_as",
            Self::RecoveryLimit => "recovery_limit",
            Self::NotBefore => "not_before",
            Self::Purged => "purged",
            Self::Hold => "hold",
            Self::HoldLifted => "hold_lifted",
            Self::UpdateTrimmed => "update_trimmed",
            Self::ProgressTrimmed => "progress_trimmed",
            Self::ParentNotified => "parent_notified",
            Self::NotificationEnqueuedV2 => "notification_enqueued_v2",
            Self::ParentNotifiedV2 => "parent_notified_v2",
        }
    }

    /// Whether events of this type raise the task version (lifecycle events).
    #[must_use]
    pub const fn is_lifecycle(self) -> bool {
        !matches!(
            self,
            Self::UpdateAppended
                | Self::NotificationEnqueued
                | Self::NotificationAcked
                | Self::ChildCreated
                | Self::InputSent
                | Self::CursorAdvanced
                | Self::Published
                | Self::PartAppended
                | Self::ParentNotificationFailed
                | Self::RerunOf
                | Self::RerunAs
                | Self::RecoveryLimit
                | Self::NotBefore
                | Self::Purged
                | Self::Hold
                | Self::HoldLifted
                | Self::UpdateTrimmed
                | Self::ProgressTrimmed
                | Self::ParentNotified
                | Self::NotificationEnqueuedV2
                | Self::ParentNotifiedV2
        )
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Event {
    /// The `created` event of `spec` under `policy` at `at`, with no initial checkpoint and no
    /// context snapshot.
    ///
    /// ```
    /// use dtask_journal::{Event, LeasePolicy, TaskSpec, Timestamp};
    /// let created = Event::created(TaskSpec::new("t", "shell"), LeasePolicy::Retry, Timestamp(1));
    /// assert_eq!(created.event_type().as_str(), "created");
    /// ```
    #[must_use]
    pub fn created(spec: impl Into<Arc<TaskSpec>>, policy: LeasePolicy, at: Timestamp) -> Self {
        Self::Created {
            spec: spec.into(),
            policy,
            checkpoint: Vec::new(),
            context_snapshot: Vec::new(),
            at,
        }
    }

    /// The spec of a creation event (`Created`, `CreatedV2`), `None` for any other.
    #[must_use]
    pub fn spec(&self) -> Option<&TaskSpec> {
        match self {
            Self::Created { spec, .. } | Self::CreatedV2 { spec, .. } => Some(spec),
            _ => None,
        }
    }

    /// The delivery of a notification or an input: [`Delivery::Queued`] for
    /// [`Event::NotificationEnqueued`] and [`Event::ParentNotified`] (schema v6 and older
    /// had no other), the recorded one for their v2 forms and [`Event::InputSent`], `None`
    /// for any other event.
    ///
    /// ```
    /// use dtask_journal::{Delivery, Event, Timestamp};
    /// let sent = Event::ParentNotifiedV2 {
    ///     attempt: 1,
    ///     event_id: "stop".into(),
    ///     kind: "urgent".into(),
    ///     data: Vec::new(),
    ///     delivery: Delivery::Preempt,
    ///     at: Timestamp(1),
    /// };
    /// assert_eq!(sent.delivery(), Some(Delivery::Preempt));
    /// assert_eq!(Event::Published { at: Timestamp(1) }.delivery(), None);
    /// ```
    #[must_use]
    pub const fn delivery(&self) -> Option<Delivery> {
        match self {
            Self::NotificationEnqueued { .. } | Self::ParentNotified { .. } => {
                Some(Delivery::Queued)
            }
            Self::NotificationEnqueuedV2 { delivery, .. }
            | Self::ParentNotifiedV2 { delivery, .. }
            | Self::InputSent { delivery, .. } => Some(*delivery),
            _ => None,
        }
    }

    /// The fields of a queued notification — a [`Event::NotificationEnqueued`] or its v2
    /// form, as the outbox indexes them — with its delivery; `None` for any other event.
    ///
    /// ```
    /// use dtask_journal::{Delivery, Event, Timestamp};
    /// let queued = Event::NotificationEnqueued {
    ///     id: "t:1:task_created".into(),
    ///     event_id: String::new(),
    ///     kind: "task_created".into(),
    ///     data: Vec::new(),
    ///     version: 1,
    ///     at: Timestamp(7),
    /// };
    /// let n = queued.queued_notification().unwrap();
    /// assert_eq!((n.kind, n.delivery, n.version), ("task_created", Delivery::Queued, 1));
    /// ```
    #[must_use]
    pub fn queued_notification(&self) -> Option<QueuedNotification<'_>> {
        match self {
            Self::NotificationEnqueued {
                id,
                event_id,
                kind,
                data,
                version,
                at,
            }
            | Self::NotificationEnqueuedV2 {
                id,
                event_id,
                kind,
                data,
                version,
                at,
                ..
            } => Some(QueuedNotification {
                id,
                event_id,
                kind,
                data,
                delivery: self.delivery().unwrap_or_default(),
                version: *version,
                at: *at,
            }),
            _ => None,
        }
    }

    /// The event's type.
    #[must_use]
    pub const fn event_type(&self) -> EventType {
        match self {
            Self::Created { .. } => EventType::Created,
            Self::AttemptStarted { .. } => EventType::AttemptStarted,
            Self::Heartbeat { .. } => EventType::Heartbeat,
            Self::StartCommitted { .. } => EventType::StartCommitted,
            Self::TranscriptFailed { .. } => EventType::TranscriptFailed,
            Self::WaitingInput { .. } => EventType::WaitingInput,
            Self::Suspended { .. } => EventType::Suspended,
            Self::Yielded { .. } => EventType::Yielded,
            Self::InputProvided { .. } => EventType::InputProvided,
            Self::Released { .. } => EventType::Released,
            Self::CancelRequested { .. } => EventType::CancelRequested,
            Self::LeaseExpired { .. } => EventType::LeaseExpired,
            Self::Completed { .. } => EventType::Completed,
            Self::Failed { .. } => EventType::Failed,
            Self::Canceled { .. } => EventType::Canceled,
            Self::UpdateAppended { .. } => EventType::UpdateAppended,
            Self::NotificationEnqueued { .. } => EventType::NotificationEnqueued,
            Self::NotificationAcked { .. } => EventType::NotificationAcked,
            Self::CreatedV2 { .. } => EventType::CreatedV2,
            Self::ChildCreated { .. } => EventType::ChildCreated,
            Self::InputSent { .. } => EventType::InputSent,
            Self::InputWoke { .. } => EventType::InputWoke,
            Self::CursorAdvanced { .. } => EventType::CursorAdvanced,
            Self::InputCommitted { .. } => EventType::InputCommitted,
            Self::InputsPending { .. } => EventType::InputsPending,
            Self::Published { .. } => EventType::Published,
            Self::PartAppended { .. } => EventType::PartAppended,
            Self::ParentNotificationFailed { .. } => EventType::ParentNotificationFailed,
            Self::RerunOf { .. } => EventType::RerunOf,
            Self::RerunAs { .. } => EventType::RerunAs,
            Self::RecoveryLimit { .. } => EventType::RecoveryLimit,
            Self::NotBefore { .. } => EventType::NotBefore,
            Self::Purged { .. } => EventType::Purged,
            Self::Hold { .. } => EventType::Hold,
            Self::HoldLifted { .. } => EventType::HoldLifted,
            Self::UpdateTrimmed { .. } => EventType::UpdateTrimmed,
            Self::ProgressTrimmed { .. } => EventType::ProgressTrimmed,
            Self::ParentNotified { .. } => EventType::ParentNotified,
            Self::NotificationEnqueuedV2 { .. } => EventType::NotificationEnqueuedV2,
            Self::ParentNotifiedV2 { .. } => EventType::ParentNotifiedV2,
        }
    }

    /// When the event happened.
    #[must_use]
    pub const fn at(&self) -> Timestamp {
        match self {
            Self::Created { at, .. }
            | Self::AttemptStarted { at, .. }
            | Self::Heartbeat { at, .. }
            | Self::StartCommitted { at, .. }
            | Self::TranscriptFailed { at, .. }
            | Self::WaitingInput { at, .. }
            | Self::Suspended { at, .. }
            | Self::Yielded { at, .. }
            | Self::InputProvided { at, .. }
            | Self::Released { at, .. }
            | Self::CancelRequested { at, .. }
            | Self::LeaseExpired { at, .. }
            | Self::Completed { at, .. }
            | Self::Failed { at, .. }
            | Self::Canceled { at, .. }
            | Self::UpdateAppended { at, .. }
            | Self::NotificationEnqueued { at, .. }
            | Self::NotificationAcked { at, .. }
            | Self::CreatedV2 { at, .. }
            | Self::ChildCreated { at, .. }
            | Self::InputSent { at, .. }
            | Self::InputWoke { at, .. }
            | Self::CursorAdvanced { at, .. }
            | Self::InputCommitted { at, .. }
            | Self::InputsPending { at, .. }
            | Self::Published { at }
            | Self::PartAppended { at, .. }
            | Self::ParentNotificationFailed { at, .. }
            | Self::RerunOf { at, .. }
            | Self::RerunAs { at, .. }
            | Self::RecoveryLimit { at, .. }
            | Self::NotBefore { at, .. }
            | Self::Purged { at, .. }
            | Self::Hold { at, .. }
            | Self::HoldLifted { at }
            | Self::UpdateTrimmed { at, .. }
            | Self::ProgressTrimmed { at, .. }
            | Self::ParentNotified { at, .. }
            | Self::NotificationEnqueuedV2 { at, .. }
            | Self::ParentNotifiedV2 { at, .. } => *at,
        }
    }

    /// Whether the event raises the task version.
    #[must_use]
    pub const fn is_lifecycle(&self) -> bool {
        self.event_type().is_lifecycle()
    }

    /// Whether the event ends the task (completed, failed or canceled).
    #[must_use]
    pub const fn is_terminal(&self) -> bool {
        match self {
            Self::Completed { .. } | Self::Failed { .. } | Self::Canceled { .. } => true,
            Self::CancelRequested { direct, .. } => *direct,
            Self::LeaseExpired { resolution, .. } => resolution.is_terminal(),
            _ => false,
        }
    }

    /// The length of the event's largest opaque byte value (payload, checkpoint, data,
    /// context snapshot), which the journal bounds by its value limit.
    #[must_use]
    pub fn largest_value_len(&self) -> usize {
        match self {
            Self::Created {
                spec,
                checkpoint,
                context_snapshot,
                ..
            }
            | Self::CreatedV2 {
                spec,
                checkpoint,
                context_snapshot,
                ..
            } => spec
                .payload
                .len()
                .max(checkpoint.len())
                .max(context_snapshot.len()),
            Self::StartCommitted { checkpoint, .. }
            | Self::WaitingInput { checkpoint, .. }
            | Self::Suspended { checkpoint, .. }
            | Self::Yielded { checkpoint, .. }
            | Self::InputCommitted { checkpoint, .. }
            | Self::InputsPending { checkpoint, .. } => checkpoint.len(),
            Self::InputProvided {
                data,
                context_snapshot,
                ..
            } => data
                .len()
                .max(context_snapshot.as_ref().map_or(0, Vec::len)),
            Self::Released {
                context_snapshot, ..
            } => context_snapshot.as_ref().map_or(0, Vec::len),
            Self::Completed { data, .. }
            | Self::UpdateAppended { data, .. }
            | Self::NotificationEnqueued { data, .. }
            | Self::InputSent { data, .. }
            | Self::PartAppended { data, .. }
            | Self::ParentNotified { data, .. }
            | Self::NotificationEnqueuedV2 { data, .. }
            | Self::ParentNotifiedV2 { data, .. } => data.len(),
            Self::AttemptStarted { .. }
            | Self::Heartbeat { .. }
            | Self::TranscriptFailed { .. }
            | Self::CancelRequested { .. }
            | Self::LeaseExpired { .. }
            | Self::Failed { .. }
            | Self::Canceled { .. }
            | Self::NotificationAcked { .. }
            | Self::ChildCreated { .. }
            | Self::InputWoke { .. }
            | Self::CursorAdvanced { .. }
            | Self::Published { .. }
            | Self::ParentNotificationFailed { .. }
            | Self::RerunOf { .. }
            | Self::RerunAs { .. }
            | Self::RecoveryLimit { .. }
            | Self::NotBefore { .. }
            | Self::Purged { .. }
            | Self::Hold { .. }
            | Self::HoldLifted { .. }
            | Self::UpdateTrimmed { .. }
            | Self::ProgressTrimmed { .. } => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_split_matches_schema_order() {
        let lifecycle: Vec<_> = EventType::ALL.iter().filter(|t| t.is_lifecycle()).collect();
        assert_eq!(lifecycle.len(), 19);
        assert_eq!(*lifecycle[14], EventType::Canceled);
        assert_eq!(
            lifecycle[15..],
            [
                &EventType::CreatedV2,
                &EventType::InputWoke,
                &EventType::InputCommitted,
                &EventType::InputsPending
            ]
        );
    }

    #[test]
    fn terminal_events() {
        let at = Timestamp(1);
        assert!(Event::Completed { data: vec![], at }.is_terminal());
        assert!(!Event::LeaseExpired {
            resolution: ExpiryResolution::Retry,
            deadline: at,
            at
        }
        .is_terminal());
        assert!(Event::CancelRequested {
            reason: String::new(),
            lease_deadline: None,
            direct: true,
            at
        }
        .is_terminal());
    }
}

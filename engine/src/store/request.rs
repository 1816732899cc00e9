//! The requests of the store's writes: plain data, which `decide` turns into events.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use dtask_journal::{LeasePolicy, MetadataEntry, TaskSpec};

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
}

/// The id of an application notification: depends only on (task, event id).
#[must_use]
pub fn application_notification_id(task: &str, event_id: &str) -> String {
    format!(
        "dtask.custom:{}:{}:application-event",
        URL_SAFE_NO_PAD.encode(task),
        URL_SAFE_NO_PAD.encode(event_id)
    )
}

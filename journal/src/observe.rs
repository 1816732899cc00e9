//! What the write path tells an observer: a hook for metrics, off unless someone installs it.
//!
//! The journal keeps no metrics of its own; a service (or `dtask serve`) installs a
//! [`WriteObserver`] with [`crate::Journal::observe`] and records what it is told — batch
//! sizes, write and sync latencies, each append's latency from submission to
//! acknowledgement, the writer's queue depth. Without an observer the write path does not
//! even read the clock for it.
//!
//! Observers are called on the writer's and the syncer's threads, on the path of every
//! append: they must be cheap (atomic counters, a histogram bucket) and must not block.

use std::fmt;
use std::time::Duration;

/// One batch the writer wrote (before its sync) — or, when every append of it was refused for
/// a stale position, the batch it would have written (`appends` 0, nothing written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchWritten {
    /// Appends accepted into the batch (refused ones — stale positions — not counted).
    pub appends: usize,
    /// Appends refused in the batch for a stale expected position.
    pub conflicts: usize,
    /// Records written.
    pub records: usize,
    /// Bytes of the records written (framing and payload).
    pub bytes: usize,
    /// Appends still queued behind the batch when it was formed.
    pub queued: usize,
    /// Time of the backend's write (the OS's buffers and the memtable, no sync).
    pub write: Duration,
}

/// One sync of the write-ahead log, covering one or more written batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Synced {
    /// Batches the sync made durable.
    pub batches: usize,
    /// Time of the sync.
    pub sync: Duration,
    /// Whether it succeeded (a failed sync stops the journal).
    pub ok: bool,
}

/// A batch whose write failed: each of its appends failed with the write's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchFailed {
    /// Appends of the batch.
    pub appends: usize,
    /// Whether the write failed for a full disk ([`crate::Error::is_no_space`]): nothing of
    /// the batch was written, and the journal writes again once there is room.
    pub no_space: bool,
}

/// Receives what the write path does. Every method has an empty default.
pub trait WriteObserver: Send + Sync + fmt::Debug {
    /// A batch was written.
    fn batch_written(&self, batch: &BatchWritten) {
        let _ = batch;
    }

    /// A batch's write failed.
    fn batch_failed(&self, failed: &BatchFailed) {
        let _ = failed;
    }

    /// The write-ahead log was synced (or, with buffered durability, the batch was
    /// acknowledged without one: `sync` is zero).
    fn synced(&self, sync: &Synced) {
        let _ = sync;
    }

    /// An append was acknowledged as durable, `latency` after it was submitted.
    fn acknowledged(&self, latency: Duration) {
        let _ = latency;
    }
}

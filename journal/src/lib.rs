//! # dtask-journal
//!
//! What a dtask journal holds on disk, and how it gets there.
//!
//! - [`Event`]: the vocabulary — every state transition of a task and the non-lifecycle
//!   records (progress updates, notification bookkeeping), schema v7.
//! - [`Record`]: a verified record — its framing (format version, bincode payload, per-task
//!   hash chain — SHA-256, or BLAKE3 in journals made before format 5 — CRC-32) is checked on every read; the layouts of records and keys are
//!   in `docs/journal-format.md`.
//! - [`Journal`]: open (writer, read-only, follower), append with an expected position
//!   (atomic, group-committed, durable per [`Durability`]), read a task's stream, list tasks,
//!   read everything in global commit order.
//! - Index readers for audits and followers: [`Journal::commits`] (records in global commit
//!   order), [`Journal::live_tasks`], [`Journal::outbox`], and the tail marker ([`Tail`])
//!   checked at every writable open.
//! - [`probe`]: what a synced append promises where a journal lies (the file system, the
//!   device's write cache, the cost of a sync), as `dtask probe` tells it.
//! - [`export`]: the export format (JSON lines that rebuild a journal bit-exact) as serde
//!   types, to write and read exports.
//!
//! ```
//! use dtask_journal::{Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp};
//! # fn main() -> Result<(), dtask_journal::Error> {
//! let dir = tempfile::tempdir().expect("tempdir");
//! let journal = Journal::open(dir.path(), JournalOptions::default())?;
//! let spec = TaskSpec { id: "job-1".into(), executor_key: "shell".into(), ..TaskSpec::default() };
//! journal.append("job-1", 0, &[Event::created(spec, LeasePolicy::Retry, Timestamp(1))])?;
//! journal.append("job-1", 1, &[Event::Completed { data: b"ok".to_vec(), at: Timestamp(2) }])?;
//! let types: Vec<_> = journal
//!     .read_stream("job-1", 0)
//!     .map(|r| r.map(|rec| rec.event.event_type().as_str()))
//!     .collect::<Result<_, _>>()?;
//! assert_eq!(types, ["created", "completed"]);
//! # Ok(()) }
//! ```

mod backend;
mod bulk;
#[cfg(test)]
mod byte_fields;
mod commits;
mod error;
mod event;
pub mod export;
pub mod failpoints;
mod format;
mod head;
mod journal;
mod memtable_hint;
mod merge;
// The storage internals below are public for dtask's own crates (the fold's bulk readers, the
// audit) and for tests that damage a journal on purpose; they are not part of the API a
// service builds on, so they stay out of the docs and may change in any release.
#[doc(hidden)]
pub mod keys;
pub mod observe;
mod options;
pub mod postgres;
pub mod probe;
#[doc(hidden)]
mod purge;
pub mod record;
mod storage;
mod stream;
mod tail;
mod trim;
mod writer;

/// A private PostgreSQL cluster for unit tests that need a server of their own settings.
#[cfg(test)]
#[path = "../tests/cluster/mod.rs"]
mod test_cluster;

#[doc(hidden)]
pub use backend::{
    prefix_end, Backend, BatchOp, CommitFlush, Cursor, KeyValue, LastRecord, Range, RawIter,
    RocksBackend, Source, WriteLock, WRITTEN_SINCE_MAX,
};
#[doc(hidden)]
pub use bulk::{RawRecords, RawStream, Records, StreamScanner};
#[doc(hidden)]
pub use commits::{CommitBatches, RawCommits, RecordFetcher, Sealed};
pub use commits::{Committed, OutboxEntry};
pub use error::{
    CorruptionKind, Error, Limit, PurgeRefusal, Result, StorageError, StorageErrorKind, TrimRefusal,
};
pub use event::{
    application_notification_id, application_notification_source, Delivery, Event, EventType,
    ExpiryResolution, LeasePolicy, MetadataEntry, Publication, QueuedNotification, TaskSpec,
    Timestamp, EVENT_SCHEMA_VERSION,
};
pub use format::{JOURNAL_FORMAT_VERSION, OLDEST_JOURNAL_FORMAT_VERSION};
pub use head::Head;
pub use journal::{Frozen, Journal, LiveRepair, PendingAppend, WriteState};
pub use keys::Space;
pub use observe::WriteObserver;
pub use options::{Durability, JournalOptions};
pub use purge::PurgedStream;
pub use record::{
    Digest, Record, RecordFormat, OLDEST_RECORD_FORMAT_VERSION, RECORD_FORMAT_VERSION,
};
pub use storage::{SpaceStats, StorageStats};
pub use stream::StreamReader;
pub use tail::{Inconsistency, LiveSummary, PairHash, Tail, TaskPairs};
pub use trim::TrimmedStream;
pub use writer::Appended;

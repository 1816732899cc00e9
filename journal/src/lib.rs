//! # dtask-journal
//!
//! What a dtask journal holds on disk, and how it gets there.
//!
//! - [`Event`]: the vocabulary — every state transition of a task and the non-lifecycle
//!   records (progress updates, notification bookkeeping), schema v1.
//! - [`record`]: record framing — format version, bincode payload, per-task BLAKE3 hash chain,
//!   CRC-32 — verified on every read.
//! - [`keys`]: every key layout, in one file.
//! - [`Journal`]: open (writer, read-only, follower), append with an expected position
//!   (atomic, group-committed, durable per [`Durability`]), read a task's stream, list tasks,
//!   read everything in global commit order.
//! - [`Backend`]: the storage seam; [`RocksBackend`] is the embedded default.
//! - [`export`]: the export format (JSON lines that rebuild a journal bit-exact) as serde
//!   types, to write and read exports.
//!
//! ```
//! use dtask_journal::{Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp};
//! # fn main() -> Result<(), dtask_journal::Error> {
//! let dir = tempfile::tempdir().expect("tempdir");
//! let journal = Journal::open(dir.path(), JournalOptions::default())?;
//! let spec = TaskSpec { id: "job-1".into(), executor_key: "shell".into(), ..TaskSpec::default() };
//! journal.append("job-1", 0, &[Event::Created {
//!     spec, policy: LeasePolicy::Retry, checkpoint: vec![], context_snapshot: vec![],
//!     at: Timestamp(1),
//! }])?;
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
mod error;
mod event;
pub mod export;
pub mod failpoints;
mod head;
mod journal;
pub mod keys;
mod options;
pub mod record;
mod tail;
mod writer;

pub use backend::{prefix_end, Backend, BatchOp, Cursor, KeyValue, Range, RawIter, RocksBackend};
pub use bulk::{RawRecords, RawStream, Records, StreamScanner};
pub use error::{CorruptionKind, Error, Limit, Result};
pub use event::{
    Event, EventType, ExpiryResolution, LeasePolicy, MetadataEntry, TaskSpec, Timestamp,
};
pub use head::Head;
pub use journal::{
    CommitBatches, Committed, Journal, LiveRepair, RawCommits, RecordFetcher, StreamReader,
    JOURNAL_FORMAT_VERSION, OLDEST_JOURNAL_FORMAT_VERSION,
};
pub use options::{Durability, JournalOptions};
pub use record::{Digest, Record, FORMAT_VERSION};
pub use tail::{Inconsistency, LiveSummary, PairHash, Tail};
pub use writer::Appended;

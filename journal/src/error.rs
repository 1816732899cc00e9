//! The journal's error type.

use std::fmt;

use std::sync::Arc;

/// What is wrong with a damaged record or stream.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CorruptionKind {
    /// The record is shorter than its framing says (cut short).
    Truncated {
        /// The bytes actually present.
        len: usize,
    },
    /// The stored CRC-32 does not match the record's bytes (a flipped or edited byte).
    Checksum {
        /// The CRC stored in the record.
        stored: u32,
        /// The CRC of the bytes present.
        computed: u32,
    },
    /// The record's format version is not one this build reads.
    UnknownVersion(u8),
    /// The record stores another position than the key it was found under (swapped or moved).
    Misplaced {
        /// The position stored in the record.
        found: u64,
    },
    /// The record does not chain from its predecessor: an earlier record was edited, removed
    /// or reordered, or the record belongs to another task.
    Chain,
    /// No record exists at this position although later ones say it should: a record was
    /// deleted. (A deleted *last* record leaves no gap in the stream; the audit finds it
    /// through the `commits` index, which still names it.)
    Missing,
    /// The payload is not a valid event of this format version.
    Decode(String),
    /// A key does not follow the journal's key layout.
    Key(String),
    /// A number read from disk (a position, a global sequence) is outside the range a
    /// journal can hold ([`crate::keys::MAX_SEQUENCE`]): forged or damaged. It is refused
    /// before it sizes anything or enters arithmetic.
    OutOfRange {
        /// What the number is (`position`, `sequence`).
        what: &'static str,
        /// The number found.
        value: u64,
    },
}

impl fmt::Display for CorruptionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { len } => write!(f, "record truncated ({len} bytes present)"),
            Self::Checksum { stored, computed } => write!(
                f,
                "checksum mismatch (stored {stored:08x}, computed {computed:08x})"
            ),
            Self::UnknownVersion(v) => write!(f, "unknown record format version {v}"),
            Self::Misplaced { found } => {
                write!(
                    f,
                    "record of position {found} found here (swapped or moved)"
                )
            }
            Self::Chain => f.write_str(
                "hash chain broken (an earlier record was edited, removed or reordered)",
            ),
            Self::Missing => f.write_str("record missing (deleted)"),
            Self::Decode(msg) => write!(f, "payload does not decode: {msg}"),
            Self::Key(msg) => write!(f, "malformed key: {msg}"),
            Self::OutOfRange { what, value } => write!(
                f,
                "{what} {value} is out of range (a journal holds 1 to {})",
                crate::keys::MAX_SEQUENCE
            ),
        }
    }
}

/// Which limit a refused value broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Limit {
    /// A single opaque value (payload, checkpoint, data) over `max_value_bytes`.
    Value,
    /// A whole encoded record over `max_record_bytes`.
    Record,
    /// A task id over `max_task_id_bytes`.
    TaskId,
    /// More events in one append than `max_events_per_append`.
    EventsPerAppend,
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Value => "value bytes",
            Self::Record => "record bytes",
            Self::TaskId => "task id bytes",
            Self::EventsPerAppend => "events per append",
        })
    }
}

/// Why a stream cannot be purged ([`Error::NotPurgeable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum PurgeRefusal {
    /// The journal has no stream of the task.
    #[error("the journal has no such task")]
    Unknown,
    /// The task has no terminal record yet.
    #[error("it has not ended")]
    NotEnded,
    /// The stream was purged before.
    #[error("it was purged before")]
    AlreadyPurged,
    /// A notification of the task is queued, not yet acknowledged.
    #[error("a notification of it is still queued")]
    QueuedNotification,
    /// An operator's hold stands on the task ([`crate::Event::Hold`]).
    #[error("it is on hold")]
    OnHold,
    /// A purge tombstone ([`crate::Event::Purged`]) is written by a purge only, never
    /// appended.
    #[error("a purge record is written by a purge, not appended")]
    AppendedTombstone,
}

/// Why a stream's progress cannot be trimmed ([`Error::NotTrimmable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum TrimRefusal {
    /// The journal has no stream of the task.
    #[error("the journal has no such task")]
    Unknown,
    /// The stream was purged: nothing of it is left to trim.
    #[error("it was purged")]
    Purged,
    /// An operator's hold stands on the task ([`crate::Event::Hold`]): it is kept whole.
    #[error("it is on hold")]
    OnHold,
    /// A trim's records ([`crate::Event::UpdateTrimmed`], [`crate::Event::ProgressTrimmed`])
    /// are written by a trim only (or an import restoring one), never appended.
    #[error("a trim's records are written by a trim, not appended")]
    AppendedTrim,
}

/// Errors of the journal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A stored record or key is damaged; names the task and position.
    #[error("corruption in task {task:?} at position {position}: {kind}")]
    Corruption {
        /// The task whose stream is damaged (empty when the key itself is unreadable).
        task: String,
        /// The position of the damaged record.
        position: u64,
        /// What is wrong.
        kind: CorruptionKind,
    },
    /// An index entry or a metadata value does not parse: it was not written by a journal.
    /// Unlike [`Error::Corruption`], there is no record to name: `key` is the entry's key.
    #[error("a malformed entry in the `{}` space: {kind}", space.name())]
    MalformedEntry {
        /// The space (column family) of the entry.
        space: crate::keys::Space,
        /// The entry's key.
        key: Vec<u8>,
        /// What is wrong.
        kind: CorruptionKind,
    },
    /// The expected position of an append is stale: another append got there first. Nothing
    /// was written.
    #[error(
        "append conflict on task {task:?}: expected position {expected}, stream is at {actual}"
    )]
    Conflict {
        /// The task.
        task: String,
        /// The position the caller expected.
        expected: u64,
        /// The stream's actual next position.
        actual: u64,
    },
    /// A value or id exceeds a configured limit. Nothing was written.
    #[error("{limit} limit exceeded: {size} > {max}")]
    TooLarge {
        /// Which limit.
        limit: Limit,
        /// The offending size.
        size: usize,
        /// The configured maximum.
        max: usize,
    },
    /// A task id is empty or contains a NUL byte. Nothing was written.
    #[error("invalid task id {0:?}: must be non-empty and contain no NUL byte")]
    InvalidTaskId(String),
    /// An append carried no events.
    #[error("an append needs at least one event")]
    EmptyAppend,
    /// A linked append names one stream twice. Nothing was written.
    #[error("a linked append names the stream of task {0:?} twice")]
    DuplicateStream(String),
    /// A stream cannot be purged ([`crate::Journal::purge`]), or a purge tombstone was
    /// appended as an ordinary record. Nothing was written.
    #[error("task {task:?} cannot be purged: {why}")]
    NotPurgeable {
        /// The task.
        task: String,
        /// Why.
        why: PurgeRefusal,
    },
    /// A stream's progress cannot be trimmed ([`crate::Journal::trim_progress`]), or a
    /// trim's record was appended as an ordinary one. Nothing was written.
    #[error("the progress of task {task:?} cannot be trimmed: {why}")]
    NotTrimmable {
        /// The task.
        task: String,
        /// Why.
        why: TrimRefusal,
    },
    /// An append asked for a global sequence that was given out already
    /// ([`crate::Journal::submit_at_seq`]). Nothing was written.
    #[error("sequence {asked} was given out already (the next is {next})")]
    SequenceTaken {
        /// The sequence asked for.
        asked: u64,
        /// The next sequence the journal gives out.
        next: u64,
    },
    /// The append would take a global sequence past the last one there is
    /// ([`crate::keys::MAX_SEQUENCE`]): an import's records ending near it, say. Nothing was
    /// written.
    #[error("the journal's sequences are used up: the append would take sequence {last}, past the last one ({max})", max = crate::keys::MAX_SEQUENCE)]
    SequencesExhausted {
        /// The sequence the append's last record would have taken.
        last: u64,
    },
    /// A `created` event names another task than the stream it was appended to. Nothing was
    /// written.
    #[error("a `created` event for task {found:?} cannot open the stream of task {task:?}")]
    WrongTask {
        /// The stream appended to.
        task: String,
        /// The task the event's spec names.
        found: String,
    },
    /// The journal disagrees with itself (its indexes, its streams and its tail marker), so
    /// it is not opened for writing: an engine would build on the damage. Nothing was
    /// written. `dtask verify` names every problem; the read-only commands still work.
    #[error("the journal is inconsistent: {0}; run `dtask verify` for every problem")]
    Inconsistent(crate::tail::Inconsistency),
    /// The database was written by a newer (or unknown) format version.
    #[error(
        "journal format version {found} is not supported (this build reads up to {supported})"
    )]
    UnsupportedFormat {
        /// The version found in the database.
        found: u32,
        /// The newest version this build supports.
        supported: u32,
    },
    /// A follower's journal was upgraded to a newer format by its writer while the follower
    /// had it open ([`crate::Journal::catch_up`]): what it reads may lie where the format it
    /// opened does not look (format 4's finished streams). Open the follower again.
    #[error(
        "the journal was upgraded from format {opened} to {now} while this follower had it \
         open: open it again"
    )]
    FormatChanged {
        /// The format the follower opened.
        opened: u32,
        /// The format stored now.
        now: u32,
    },
    /// A journal location that cannot be used (a malformed PostgreSQL URL).
    #[error("invalid journal location: {0}")]
    InvalidLocation(String),
    /// The PostgreSQL database holds a journal schema newer than this build knows.
    #[error(
        "the journal's PostgreSQL schema is version {found}, newer than this build supports \
         ({supported}): upgrade dtask"
    )]
    UnsupportedSchema {
        /// The version found in the database.
        found: u32,
        /// The newest version this build supports.
        supported: u32,
    },
    /// The path holds a database that is not a dtask journal (no format version).
    #[error("not a dtask journal: {0}")]
    NotAJournal(String),
    /// Another process (or another open in this one) holds the journal's writer lock, so it
    /// cannot be opened for writing. Read-only and follower opens take no lock and still work.
    #[error(
        "the journal at {} is in use: another process has it open for writing (it can still be \
         opened read-only)",
        path.display()
    )]
    InUse {
        /// The journal directory that is held.
        path: std::path::PathBuf,
    },
    /// The journal was opened read-only or as a secondary.
    #[error("the journal is open read-only")]
    ReadOnly,
    /// The journal's writer has shut down (closed, or failed earlier).
    #[error("the journal is closed")]
    Closed,
    /// A sync of the write-ahead log failed, so what it covered may or may not be on stable
    /// storage. The journal refuses every append from then on: reopen it (recovery reads
    /// what really reached the disk). Appends refused with this error may or may not be
    /// durable; appends refused before the failure are not affected.
    #[error("the journal stopped after a failed sync and must be reopened: {0}")]
    Stopped(String),
    /// The storage backend failed (I/O, RocksDB, PostgreSQL). The append, if any, was not
    /// written; [`StorageError::kind`] tells a full disk ([`Error::is_no_space`]) from the
    /// rest.
    #[error("storage error: {0}")]
    Storage(StorageError),
    /// An event could not be encoded.
    #[error("encoding error: {0}")]
    Encode(String),
}

/// A failure of the storage backend: what failed, what kind of failure it is
/// ([`StorageError::kind`]), and the backend's own error when there is one
/// ([`std::error::Error::source`]).
#[derive(Debug, Clone)]
pub struct StorageError {
    message: String,
    kind: StorageErrorKind,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

/// What kind of failure a [`StorageError`] is: what an operator does about it differs.
///
/// ```
/// use dtask_journal::{StorageError, StorageErrorKind};
/// let full = StorageError::no_space("No space left on device");
/// assert_eq!(full.kind(), StorageErrorKind::NoSpace);
/// assert_eq!(StorageError::new("I/O error").kind(), StorageErrorKind::Other);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StorageErrorKind {
    /// The disk is full: RocksDB's `No space left on device`, or PostgreSQL's `disk_full`
    /// (SQLSTATE 53100). The append that met it was not written and took no sequence; the
    /// journal writes again by itself once there is room (on RocksDB, free space of at least
    /// one memtable, checked every few seconds), and reads go on meanwhile. See
    /// `docs/ARCHITECTURE.md`, "A full disk".
    NoSpace,
    /// Any other failure of the storage.
    Other,
}

/// How RocksDB's status for a full disk begins (its `IOError` with the `kNoSpace` subcode,
/// whether the write met `ENOSPC` itself or the database refuses writes since one did).
const ROCKSDB_NO_SPACE: &str = "IO error: No space left on device";

impl StorageError {
    /// A failure described by `message` alone.
    #[must_use]
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            kind: StorageErrorKind::Other,
            source: None,
        }
    }

    /// A full disk, described by `message` ([`StorageErrorKind::NoSpace`]).
    #[must_use]
    pub fn no_space(message: impl Into<String>) -> Self {
        Self {
            kind: StorageErrorKind::NoSpace,
            ..Self::new(message)
        }
    }

    /// A failure caused by `source`, described by its message.
    #[must_use]
    pub fn caused_by(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self {
            message: source.to_string(),
            kind: StorageErrorKind::Other,
            source: Some(Arc::new(source)),
        }
    }

    /// A failure RocksDB reported, of the kind its status names.
    fn of_rocksdb(e: rocksdb::Error) -> Self {
        let no_space =
            e.kind() == rocksdb::ErrorKind::IOError && e.as_ref().starts_with(ROCKSDB_NO_SPACE);
        Self {
            kind: if no_space {
                StorageErrorKind::NoSpace
            } else {
                StorageErrorKind::Other
            },
            ..Self::caused_by(e)
        }
    }

    /// What failed.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }

    /// What kind of failure this is.
    #[must_use]
    pub const fn kind(&self) -> StorageErrorKind {
        self.kind
    }
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StorageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<String> for StorageError {
    fn from(message: String) -> Self {
        Self::new(message)
    }
}

impl From<&str> for StorageError {
    fn from(message: &str) -> Self {
        Self::new(message)
    }
}

impl Error {
    /// A storage failure described by `message`.
    #[must_use]
    pub fn storage(message: impl Into<String>) -> Self {
        Self::Storage(StorageError::new(message))
    }

    /// A malformed entry of `space` under `key`.
    #[must_use]
    pub fn malformed(space: crate::keys::Space, key: &[u8], kind: CorruptionKind) -> Self {
        Self::MalformedEntry {
            space,
            key: key.to_vec(),
            kind,
        }
    }

    /// Whether the storage is full ([`StorageErrorKind::NoSpace`]): nothing was written, and
    /// the same append can be made again once there is room.
    #[must_use]
    pub const fn is_no_space(&self) -> bool {
        matches!(self, Self::Storage(e) if matches!(e.kind, StorageErrorKind::NoSpace))
    }

    /// Whether this is damage (a corrupt record or a malformed entry) rather than a failure to
    /// read: a damage-tolerant reader reports it and goes on.
    #[must_use]
    pub const fn is_damage(&self) -> bool {
        matches!(self, Self::Corruption { .. } | Self::MalformedEntry { .. })
    }

    /// Builds a corruption error.
    #[must_use]
    pub fn corruption(task: &str, position: u64, kind: CorruptionKind) -> Self {
        Self::Corruption {
            task: task.to_owned(),
            position,
            kind,
        }
    }
}

impl From<rocksdb::Error> for Error {
    fn from(e: rocksdb::Error) -> Self {
        Self::Storage(StorageError::of_rocksdb(e))
    }
}

/// A journal result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! The journal's format on disk: the version stamped in its `meta` space, the record framing
//! it names and the tail marker — how an open reads and checks them, and how a writer's open
//! stamps a new journal or upgrades an older one in place.

use crate::backend::{Backend, BatchOp, OpBytes, Range};
use crate::error::{CorruptionKind, Error, Result};
use crate::head::Head;
use crate::keys::{self, Space};
use crate::record::{self, RecordFormat};
use crate::tail::{Inconsistency, LiveSummary, Tail};

/// The journal format version stored in the `meta` space and checked at open.
///
/// Format 2 is format 1 without the `heads` space (a head is read off the task's last record);
/// format 3 adds the tail marker ([`Tail`]), rewritten by every batch; format 4 keeps, on
/// RocksDB, the records of finished streams in a column family of their own
/// ([`keys::FINISHED_EVENTS`]), out of the way of recovery's reads; format 5 names its record
/// framing in the `meta` space ([`keys::META_RECORD_FORMAT`]): a journal created as format 5
/// writes [`RecordFormat::NEWEST`] (SHA-256 chain digests) unless told otherwise, one
/// upgraded from an older format keeps [`RecordFormat::BLAKE3`], which all older journals
/// wrote; format 6 may hold purged streams ([`crate::Journal::purge`]: a stream that starts
/// with a tombstone, and sequences the commit order lacks), which a build of an older format
/// would take for damage — the version is what makes such a build refuse the journal;
/// format 7 may hold trimmed progress ([`crate::Journal::trim_progress`]: records of event
/// types an older build cannot decode), refused by older builds for the same reason, and
/// format 8 a nested task's application notifications to its parent
/// ([`crate::Event::ParentNotified`]) likewise, and format 9 notifications sent to preempt
/// ([`crate::Event::NotificationEnqueuedV2`], [`crate::Event::ParentNotifiedV2`]). Every
/// other key is the same in all nine. An older journal is read as it is, and upgraded
/// in place when opened for writing (format 3 to 4 moves nothing: a finished stream of an
/// older format moves when a record is next written to it; format 4 to 5 stores the record
/// framing it already has; formats 5 to 6, 6 to 7, 7 to 8 and 8 to 9 change nothing but the
/// version).
pub const JOURNAL_FORMAT_VERSION: u32 = 9;

/// The first format that names its record framing in `meta`.
const RECORD_FORMAT_VERSION_NAMED: u32 = 5;

/// The first format with a tail marker.
pub(crate) const TAIL_FORMAT_VERSION: u32 = 3;

/// The oldest journal format this build reads.
pub const OLDEST_JOURNAL_FORMAT_VERSION: u32 = 1;

/// The batch op storing this build's format version.
pub(crate) fn version_stamp() -> BatchOp {
    BatchOp::Put {
        space: Space::Meta,
        key: keys::META_FORMAT_VERSION.into(),
        value: OpBytes::from_slice(&JOURNAL_FORMAT_VERSION.to_be_bytes()),
    }
}

/// The batch op naming the journal's record framing.
pub(crate) fn record_format_put(format: RecordFormat) -> BatchOp {
    BatchOp::Put {
        space: Space::Meta,
        key: keys::META_RECORD_FORMAT.into(),
        value: OpBytes::from_slice(&[format.version()]),
    }
}

/// The batch op storing `tail`: an open's, and every batch's of the writer (the marker held
/// in place in the op, no allocation).
pub(crate) fn tail_put(tail: &Tail) -> BatchOp {
    BatchOp::Put {
        space: Space::Meta,
        key: keys::META_TAIL.into(),
        value: OpBytes::from_slice(&tail.encoded()),
    }
}

/// Makes a writable backend a journal of this build's format: a new one (no version and no
/// data — perhaps created by a process that died before it stamped the version) gets the
/// version, an empty tail marker and the record framing `format` in one write; one of an older
/// format is upgraded in place: the tail marker, summed up from the journal as it is (formats
/// 1 and 2), the framing its records have (BLAKE3) and the new version, in one write. The
/// `heads` space of format 1 is dropped by [`Journal::open`](crate::Journal::open) afterwards (a crash in between
/// leaves a journal of this format with a stale `heads`, which a format-1 build refuses and
/// the next writable open drops).
pub(crate) fn prepare_writable(backend: &dyn Backend, format: RecordFormat) -> Result<()> {
    let from = match stored_version(backend)? {
        Some(v) if v >= TAIL_FORMAT_VERSION => {
            check_version(v)?;
            if v < JOURNAL_FORMAT_VERSION {
                // A refusal writes nothing: an embedded journal whose commit index does not
                // end where its tail marker says is refused before it is stamped (stamped,
                // the build it came from would refuse it too).
                if !backend.is_shared() {
                    checked_tail(backend)?;
                }
                // Format 3 to 4: the writer's open made the `finished` column family. Format 4
                // to 5: the framing the records have is named. Formats 5 to 6, 6 to 7, 7 to 8
                // and 8 to 9: the version alone (a purge may write tombstones from now on, a
                // trim trimmed updates, a nested task notifications to its parent, a task
                // notifications sent to preempt).
                let mut ops = vec![version_stamp()];
                if v < RECORD_FORMAT_VERSION_NAMED {
                    ops.push(record_format_put(RecordFormat::BLAKE3));
                }
                backend.write(ops, crate::Durability::Sync)?;
                tracing::info!(
                    from = v,
                    to = JOURNAL_FORMAT_VERSION,
                    "journal format upgraded"
                );
            }
            return Ok(());
        }
        Some(v) => {
            check_version(v)?;
            v
        }
        None if is_empty(backend)? => {
            let ops = vec![
                version_stamp(),
                tail_put(&Tail::default()),
                record_format_put(format),
            ];
            return backend.write(ops, crate::Durability::Sync);
        }
        None => return Err(Error::NotAJournal("no format version".into())),
    };
    let tail = summarize(backend)?;
    backend.write(
        vec![
            tail_put(&tail),
            record_format_put(RecordFormat::BLAKE3),
            version_stamp(),
        ],
        crate::Durability::Sync,
    )?;
    tracing::info!(
        from,
        to = JOURNAL_FORMAT_VERSION,
        live = tail.live.tasks,
        "journal format upgraded"
    );
    Ok(())
}

/// Whether the backend holds no journal data at all.
pub(crate) fn is_empty(backend: &dyn Backend) -> Result<bool> {
    for space in Space::ALL {
        if let Some(item) = backend.scan(space, Range::default()).next() {
            item?;
            return Ok(false);
        }
    }
    Ok(true)
}

/// The tail marker of the journal as it is: its last commit entry (checked against the
/// record it names) and the heads of the tasks of its `live` index (one reverse seek each).
pub(crate) fn summarize(backend: &dyn Backend) -> Result<Tail> {
    let last_seq = checked_commit_tail(backend)?;
    let mut live = LiveSummary::default();
    for item in backend.scan(Space::Live, Range::default()) {
        let (key, _) = item?;
        let task =
            keys::parse_task_key(&key).map_err(|kind| Error::malformed(Space::Live, &key, kind))?;
        if let Some(head) = Head::read(backend, task)? {
            live.add(task, &head);
        }
    }
    Ok(Tail { last_seq, live })
}

/// The stored tail marker, `None` when there is none.
pub(crate) fn read_tail(backend: &dyn Backend) -> Result<Option<Tail>> {
    backend
        .get(Space::Meta, keys::META_TAIL)?
        .map(|bytes| {
            Tail::decode(&bytes)
                .map_err(|kind| Error::malformed(Space::Meta, keys::META_TAIL, kind))
        })
        .transpose()
}

/// The tail marker of a writable journal, checked against its commit index: the marker's last
/// sequence is the last entry's, and that entry names a record carrying it.
pub(crate) fn checked_tail(backend: &dyn Backend) -> Result<Tail> {
    let tail = match backend.get(Space::Meta, keys::META_TAIL)? {
        Some(bytes) => {
            Tail::decode(&bytes).map_err(|kind| Inconsistency::Marker(kind).into_error())?
        }
        None => return Err(Inconsistency::Marker(CorruptionKind::Missing).into_error()),
    };
    let index = checked_commit_tail(backend)?;
    if index != tail.last_seq {
        return Err(Inconsistency::CommitTail {
            index,
            marker: tail.last_seq,
        }
        .into_error());
    }
    Ok(tail)
}

/// The last sequence of the commit index (0 when empty), checked: a well-formed entry that
/// names a record carrying its sequence.
pub(crate) fn checked_commit_tail(backend: &dyn Backend) -> Result<u64> {
    let Some(item) = backend
        .scan(Space::Commits, Range::default().reversed())
        .next()
    else {
        return Ok(0);
    };
    let (key, value) = item?;
    let target =
        |seq: u64, detail: String| Inconsistency::CommitTarget { seq, detail }.into_error();
    let seq =
        keys::parse_seq_key(&key).map_err(|kind| target(0, format!("is malformed: {kind}")))?;
    let (task, position) = keys::parse_event_key(&value)
        .map_err(|kind| target(seq, format!("is malformed: {kind}")))?;
    let Some(bytes) = backend.get(Space::Events, &value)? else {
        return Err(target(
            seq,
            format!("names task {task:?} position {position}, which has no record"),
        ));
    };
    match record::parse(&bytes) {
        Ok(frame) if frame.seq == seq && frame.position == position => Ok(seq),
        Ok(frame) => Err(target(
            seq,
            format!(
                "names task {task:?} position {position}, whose record carries sequence {} at \
                 position {}",
                frame.seq, frame.position
            ),
        )),
        Err(kind) => Err(target(
            seq,
            format!("names task {task:?} position {position}, whose record is damaged: {kind}"),
        )),
    }
}

/// The format version stored in `backend` (this build's for an empty one, which the next
/// write stamps).
pub(crate) fn stored_format(backend: &dyn Backend) -> Result<u32> {
    Ok(stored_version(backend)?.unwrap_or(JOURNAL_FORMAT_VERSION))
}

/// The format version stored in `backend`, if any.
pub(crate) fn stored_version(backend: &dyn Backend) -> Result<Option<u32>> {
    let Some(bytes) = backend.get(Space::Meta, keys::META_FORMAT_VERSION)? else {
        return Ok(None);
    };
    let bytes: [u8; 4] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| Error::NotAJournal("malformed format version".into()))?;
    Ok(Some(u32::from_be_bytes(bytes)))
}

/// The record framing `backend` names: [`RecordFormat::BLAKE3`] when it names none (a journal
/// of a format before 5, or an empty one).
///
/// # Errors
/// [`Error::NotAJournal`] for a value that is not a framing this build reads (only a newer
/// journal format could bring a new framing, and the format version says so first).
pub(crate) fn stored_record_format(backend: &dyn Backend) -> Result<RecordFormat> {
    let Some(bytes) = backend.get(Space::Meta, keys::META_RECORD_FORMAT)? else {
        return Ok(RecordFormat::BLAKE3);
    };
    match bytes.as_slice() {
        [version] => RecordFormat::from_version(*version)
            .ok_or_else(|| Error::NotAJournal(format!("unknown record format version {version}"))),
        _ => Err(Error::NotAJournal("malformed record format".into())),
    }
}

pub(crate) fn check_version(found: u32) -> Result<()> {
    if (OLDEST_JOURNAL_FORMAT_VERSION..=JOURNAL_FORMAT_VERSION).contains(&found) {
        Ok(())
    } else {
        Err(Error::UnsupportedFormat {
            found,
            supported: JOURNAL_FORMAT_VERSION,
        })
    }
}

//! The task head: where a task's stream ends.
//!
//! Format 2 keeps no index of heads: a head is read off the task's last record (its key gives
//! the position, its frame the global sequence and chain digest) and the `live` index (a task
//! with records that is not live has a terminal event; notifications may follow that event,
//! so the last record alone does not say). The writer keeps the heads of the tasks it appends
//! to in memory and reads a head from the journal only on a miss. (Format 1 rewrote a `heads`
//! entry in every append, a second randomly placed key per record; see
//! `docs/journal-format.md`.)

use crate::backend::{prefix_end, Backend, KeyValue, Range};
use crate::error::{CorruptionKind, Error, Result};
use crate::keys::{self, Space};
use crate::record::{self, Digest};

/// Where a task's stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Head {
    /// The number of records in the stream (the next append's position).
    pub next_position: u64,
    /// The global sequence of the last record (0 for an empty stream).
    pub last_seq: u64,
    /// The chain digest of the last record.
    pub last_digest: Digest,
    /// Whether a terminal event has been appended.
    pub terminal: bool,
}

impl Head {
    /// The head of `task`'s stream whose last record is `bytes` stored under `key`, with
    /// `terminal` as the `live` index says.
    ///
    /// # Errors
    /// [`Error::Corruption`] when the key or the record is damaged.
    fn of_last_record(task: &str, key: &[u8], bytes: &[u8], terminal: bool) -> Result<Self> {
        let position =
            keys::position_in(task, key).map_err(|kind| Error::corruption(task, 0, kind))?;
        let frame = record::parse(bytes).map_err(|kind| Error::corruption(task, position, kind))?;
        if frame.position != position {
            let found = frame.position;
            return Err(Error::corruption(
                task,
                position,
                CorruptionKind::Misplaced { found },
            ));
        }
        Ok(Self {
            next_position: position + 1,
            last_seq: frame.seq,
            last_digest: frame.digest,
            terminal,
        })
    }

    /// Reads `task`'s head off its last record and the `live` index; `None` when the task has
    /// no record.
    ///
    /// # Errors
    /// [`Error::Corruption`] when the last record is damaged, [`Error::Storage`] on I/O failure.
    pub(crate) fn read(backend: &dyn Backend, task: &str) -> Result<Option<Self>> {
        let Some((key, value)) = last_record(backend, task)? else {
            return Ok(None);
        };
        let live = backend.get(Space::Live, &keys::task_key(task))?.is_some();
        Self::of_last_record(task, &key, &value, !live).map(Some)
    }
}

/// The heads of `tasks` (`None` for a task without records), read at once where the backend
/// can ([`Backend::last_records`]), else one by one.
///
/// # Errors
/// As for [`Head::read`].
pub(crate) fn read_many(backend: &dyn Backend, tasks: &[String]) -> Result<Vec<Option<Head>>> {
    let Some(found) = backend.last_records(tasks) else {
        return tasks.iter().map(|task| Head::read(backend, task)).collect();
    };
    tasks
        .iter()
        .zip(found?)
        .map(|(task, last)| of_last(task, last))
        .collect()
}

/// The head of `task` whose last record and liveness are `last` (`None` for a task without
/// records), as [`Backend::last_records`] reads them.
///
/// # Errors
/// [`Error::Corruption`] when the key or the record is damaged.
pub(crate) fn of_last(task: &str, last: crate::backend::LastRecord) -> Result<Option<Head>> {
    match last {
        None => Ok(None),
        Some(((key, value), live)) => Head::of_last_record(task, &key, &value, !live).map(Some),
    }
}

/// The key and bytes of `task`'s last record (one reverse seek), `None` when it has none.
///
/// # Errors
/// [`Error::Storage`] on I/O failure.
pub(crate) fn last_record(backend: &dyn Backend, task: &str) -> Result<Option<KeyValue>> {
    last_record_upto(backend, task, u64::MAX)
}

/// The key and bytes of `task`'s last record whose global sequence is at most `visible`, as
/// a reader that stops at the durable watermark sees the stream. A record that does not parse
/// counts whatever its sequence: damage is shown, not stepped over. `None` when the task has
/// no such record.
///
/// # Errors
/// [`Error::Storage`] on I/O failure.
pub(crate) fn last_record_upto(
    backend: &dyn Backend,
    task: &str,
    visible: u64,
) -> Result<Option<KeyValue>> {
    let prefix = keys::task_prefix(task);
    let range = Range {
        lower: prefix.clone(),
        upper: prefix_end(&prefix),
        reverse: true,
    };
    for item in backend.scan(Space::Events, range) {
        let (key, value) = item?;
        let written_after =
            visible != u64::MAX && record::parse(&value).is_ok_and(|frame| frame.seq > visible);
        if !written_after {
            return Ok(Some((key, value)));
        }
    }
    Ok(None)
}

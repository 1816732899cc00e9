//! The global commit order read back: batches of the `commits` index
//! ([`Journal::commit_batches`](crate::Journal::commit_batches)) resolved to the records they
//! name, each checked against its entry, and the readers' durable watermark over entries keyed
//! by sequence.

use crate::backend::{Backend, KeyValue, Range};
use crate::error::{CorruptionKind, Error, Result};
use crate::keys::{self, Space};
use crate::record::{self, Digest, Record};
use crate::stream::located;

/// Whether an entry keyed by a sequence (`commits`, `outbox`) is at or below the durable
/// watermark; errors and malformed keys pass, to be reported by the caller.
pub(crate) fn below(item: &Result<crate::backend::KeyValue>, durable: u64) -> bool {
    match item {
        Ok((key, _)) => keys::parse_seq_key(key).map_or(true, |seq| seq <= durable),
        Err(_) => true,
    }
}

/// Whether the `commits` entry `key`, read from an older view of the index, is gone now: its
/// record purged since (a purge deletes a stream's entries with its records).
pub(crate) fn purged_since(backend: &dyn Backend, key: &[u8]) -> bool {
    matches!(backend.get(Space::Commits, key), Ok(None))
}

/// The sequence of the last commit-index entry at or below `visible` (`u64::MAX`: every
/// entry).
pub(crate) fn last_seq(backend: &dyn Backend, visible: u64) -> Result<u64> {
    let range = Range {
        upper: visible
            .checked_add(1)
            .map(|above| keys::seq_key(above).to_vec()),
        ..Range::default()
    }
    .reversed();
    match backend.scan(Space::Commits, range).next() {
        None => Ok(0),
        Some(item) => {
            let (key, _) = item?;
            keys::parse_seq_key(&key).map_err(|kind| Error::malformed(Space::Commits, &key, kind))
        }
    }
}

/// Batches of the global commit order; see [`Journal::commit_batches`](crate::Journal::commit_batches).
pub struct CommitBatches<'a> {
    cursor: Box<dyn crate::backend::Cursor + 'a>,
    size: usize,
    /// The durable watermark: entries above it are not read.
    until: u64,
    done: bool,
}

impl<'a> CommitBatches<'a> {
    /// Batches of up to `size` entries (at least one) read with `cursor`, placed at the first
    /// entry wanted, ending after the entry of sequence `until`.
    pub(crate) fn new(
        cursor: Box<dyn crate::backend::Cursor + 'a>,
        size: usize,
        until: u64,
    ) -> Self {
        Self {
            cursor,
            size: size.max(1),
            until,
            done: false,
        }
    }
}

impl std::fmt::Debug for CommitBatches<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommitBatches")
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// A batch of consecutive `commits` entries, not yet resolved to records; see
/// [`Journal::commit_batches`](crate::Journal::commit_batches). It can be sent to another thread and resolved there with
/// [`RawCommits::into_committed`].
#[derive(Debug)]
pub struct RawCommits {
    /// Sequence keys and event keys, back to back.
    data: Vec<u8>,
    /// Per entry, in sequence order: where its sequence key ends (= where its event key
    /// starts) and where its event key ends in `data`.
    entries: Vec<(usize, usize)>,
    /// The error that ended the index after these entries.
    failed: Option<Error>,
}

impl RawCommits {
    /// The number of entries.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the batch is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entry `i`: (sequence key, event key).
    fn entry(&self, i: usize) -> (&[u8], &[u8]) {
        let start = if i == 0 { 0 } else { self.entries[i - 1].1 };
        let (split, end) = self.entries[i];
        (&self.data[start..split], &self.data[split..end])
    }

    /// The entries' records, checked and decoded, as [`Journal::commits`](crate::Journal::commits) yields them. The
    /// records are fetched in key order with the fetcher's cursor, which steps from one to the
    /// next when they are near (as records committed together usually are) — or, where the
    /// backend stores each record's sequence beside it (PostgreSQL), in one read of the
    /// batch's range of sequences.
    pub fn into_committed(
        self,
        fetcher: &mut RecordFetcher<'_>,
    ) -> impl Iterator<Item = Result<Committed>> {
        self.resolve_with(fetcher, committed)
    }

    /// The entries' records checked as by [`RawCommits::into_committed`] (CRC, position,
    /// sequence) but not decoded: where each sits and how it is sealed, what a comparison
    /// of two journals record by record needs (`dtask import` reads its records back so).
    pub fn into_sealed(
        self,
        fetcher: &mut RecordFetcher<'_>,
    ) -> impl Iterator<Item = Result<Sealed>> {
        self.resolve_with(fetcher, |task, frame| {
            Ok(Sealed {
                task: task.to_owned(),
                position: frame.position,
                seq: frame.seq,
                digest: frame.digest,
                crc: frame.crc,
            })
        })
    }

    /// Resolves every entry to its record's frame, checked, and makes of it what `make` does.
    fn resolve_with<T>(
        self,
        fetcher: &mut RecordFetcher<'_>,
        make: impl Fn(&str, record::Frame<'_>) -> Result<T>,
    ) -> impl Iterator<Item = Result<T>> {
        let make = |key: &[u8], event_key: &[u8], record: Result<Option<&[u8]>>| {
            let (task, frame) = resolve(key, event_key, record)?;
            make(task, frame)
        };
        let in_range = self
            .seq_range()
            .and_then(|(first, last)| fetcher.backend.records_by_seq(first, last));
        let resolved = match in_range {
            Some(records) => self.resolve_in_range(records, make),
            None => self.resolve_by_key(&mut fetcher.events, make),
        };
        resolved.into_iter().chain(self.failed.map(Err))
    }

    /// The sequences of the first and the last entry (`None` for an empty batch, or one whose
    /// first or last key is malformed: the entries are then resolved by key, and each
    /// malformed one reported).
    fn seq_range(&self) -> Option<(u64, u64)> {
        let last = self.entries.len().checked_sub(1)?;
        let first = keys::parse_seq_key(self.entry(0).0).ok()?;
        let last = keys::parse_seq_key(self.entry(last).0).ok()?;
        (first <= last).then_some((first, last))
    }

    /// Resolves every entry from `records`, the records of the batch's range of sequences,
    /// by the event key each entry names: an entry whose record is not among them names a
    /// missing record. A failed read fails the batch.
    fn resolve_in_range<T>(
        &self,
        records: Result<Vec<KeyValue>>,
        make: impl Fn(&[u8], &[u8], Result<Option<&[u8]>>) -> Result<T>,
    ) -> Vec<Result<T>> {
        let records = match records {
            Ok(records) => records,
            Err(e) => return vec![Err(e)],
        };
        let by_key: std::collections::HashMap<&[u8], &[u8]> = records
            .iter()
            .map(|(key, value)| (&**key, &**value))
            .collect();
        (0..self.entries.len())
            .map(|i| {
                let (key, event_key) = self.entry(i);
                make(key, event_key, Ok(by_key.get(event_key).copied()))
            })
            .collect()
    }

    /// Resolves every entry by its event key with `events`, in key order.
    fn resolve_by_key<T>(
        &self,
        events: &mut crate::bulk::Positioned<'_>,
        make: impl Fn(&[u8], &[u8], Result<Option<&[u8]>>) -> Result<T>,
    ) -> Vec<Result<T>> {
        let mut order: Vec<usize> = (0..self.entries.len()).collect();
        order.sort_unstable_by(|&a, &b| self.entry(a).1.cmp(self.entry(b).1));
        let mut resolved: Vec<Option<Result<T>>> = self.entries.iter().map(|_| None).collect();
        for &i in &order {
            let (key, event_key) = self.entry(i);
            events.reach(event_key);
            let found = match events.status() {
                Err(e) => Err(e),
                Ok(()) => Ok(events
                    .key()
                    .filter(|found| *found == event_key)
                    .and_then(|_| events.value())),
            };
            resolved[i] = Some(make(key, event_key, found));
        }
        resolved.into_iter().flatten().collect()
    }
}

/// A cursor over the records for [`RawCommits::into_committed`]; one per thread, reused from
/// batch to batch of a journal that does not change while read (it reads the records as
/// they were when it was made). See [`Journal::record_fetcher`](crate::Journal::record_fetcher).
pub struct RecordFetcher<'a> {
    backend: &'a dyn Backend,
    events: crate::bulk::Positioned<'a>,
}

impl<'a> RecordFetcher<'a> {
    /// A fetcher of `backend`'s records, stepping through its `events` space with `events`.
    pub(crate) fn new(backend: &'a dyn Backend, events: crate::bulk::Positioned<'a>) -> Self {
        Self { backend, events }
    }
}

impl std::fmt::Debug for RecordFetcher<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordFetcher").finish_non_exhaustive()
    }
}

/// The record of `task` in `frame`, decoded.
pub(crate) fn committed(task: &str, frame: record::Frame<'_>) -> Result<Committed> {
    let position = frame.position;
    Ok(Committed {
        task: task.to_owned(),
        record: frame
            .into_record()
            .map_err(|kind| Error::corruption(task, position, kind))?,
    })
}

/// Checks one `commits` entry against the record it names (`record`: the bytes found);
/// returns the record's task and frame.
pub(crate) fn resolve<'b>(
    key: &[u8],
    event_key: &'b [u8],
    record: Result<Option<&'b [u8]>>,
) -> Result<(&'b str, record::Frame<'b>)> {
    let seq =
        keys::parse_seq_key(key).map_err(|kind| Error::malformed(Space::Commits, key, kind))?;
    let (task, position) = keys::parse_event_key(event_key)
        .map_err(|kind| Error::malformed(Space::Commits, key, kind))?;
    let bytes =
        record?.ok_or_else(|| Error::corruption(task, position, CorruptionKind::Missing))?;
    let frame = located(bytes, task, position)?;
    if frame.seq != seq {
        return Err(Error::corruption(
            task,
            position,
            CorruptionKind::Key(format!(
                "commit index says sequence {seq}, record says {}",
                frame.seq
            )),
        ));
    }
    Ok((task, frame))
}

impl Iterator for CommitBatches<'_> {
    type Item = RawCommits;

    fn next(&mut self) -> Option<RawCommits> {
        if self.done {
            return None;
        }
        let mut entries = Vec::with_capacity(self.size);
        let mut data = Vec::with_capacity(self.size * 40);
        while entries.len() < self.size {
            let (Some(key), Some(value)) = (self.cursor.key(), self.cursor.value()) else {
                self.done = true;
                break;
            };
            if keys::parse_seq_key(key).is_ok_and(|seq| seq > self.until) {
                self.done = true;
                break;
            }
            data.extend_from_slice(key);
            let split = data.len();
            data.extend_from_slice(value);
            entries.push((split, data.len()));
            self.cursor.next();
        }
        let failed = if self.done {
            self.cursor.status().err()
        } else {
            None
        };
        if entries.is_empty() && failed.is_none() {
            return None;
        }
        Some(RawCommits {
            data,
            entries,
            failed,
        })
    }
}

/// Where a committed record sits and how it is sealed, its event not decoded: what
/// [`RawCommits::into_sealed`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// The task.
    pub task: String,
    /// Its position in the task's stream.
    pub position: u64,
    /// Its global commit sequence.
    pub seq: u64,
    /// Its chain digest.
    pub digest: Digest,
    /// Its CRC-32.
    pub crc: u32,
}

/// An entry of the outbox's index: where a queued, unacknowledged notification's enqueue
/// record is ([`Journal::outbox_entries`](crate::Journal::outbox_entries)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEntry {
    /// The enqueue record's global commit sequence (the entry's key).
    pub seq: u64,
    /// The task the notification belongs to.
    pub task: String,
    /// The enqueue record's position in the task's stream.
    pub position: u64,
}

/// A record with the task it belongs to (from the global commit order or the outbox).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The task.
    pub task: String,
    /// The record.
    pub record: Record,
}

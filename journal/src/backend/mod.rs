//! The storage behind the journal: an ordered key-value store with atomic batches.
//!
//! [`Backend`] is the seam for a second storage engine; [`RocksBackend`] (module `rocks`) is
//! the embedded default and the PostgreSQL backend ([`crate::postgres`]) the shared one. Only
//! the backends and [`crate::Journal`] see raw bytes; callers see typed records.

mod rocks;

pub use rocks::RocksBackend;
pub(crate) use rocks::{
    perf_counters_off, remove_frozen_copies, OpenMode, Tuning, FROZEN_COPY_NAME,
};

use crate::error::{Error, Result};
use crate::keys::Space;
use crate::options::Durability;
use crate::storage::StorageStats;
use std::sync::Arc;

/// How many bytes an [`OpBytes`] holds in place: every commit-index key, and an event key (the
/// task id, a separator and eight bytes of position) for a task id of up to 55 bytes — the
/// engine's generated ids (`kind_` and 32 hex digits) for a kind of up to 22 bytes.
pub const OP_INLINE_BYTES: usize = 64;

/// The key or value of a [`BatchOp`]: up to [`OP_INLINE_BYTES`] held in place, longer ones
/// on the heap. The writer puts two keys and an index value a record; held in place they cost
/// no allocation of their own (three a record on the writer's thread when they were vectors),
/// and a record's bytes, longer, move in from their vector without a copy
/// (`OpBytes::from_vec`, or `.into()`).
pub type OpBytes = smallvec::SmallVec<[u8; OP_INLINE_BYTES]>;

/// One write of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOp {
    /// Insert or replace `key` in `space`.
    Put {
        /// The space.
        space: Space,
        /// The key.
        key: OpBytes,
        /// The value.
        value: OpBytes,
    },
    /// Remove `key` from `space`.
    Delete {
        /// The space.
        space: Space,
        /// The key.
        key: OpBytes,
    },
    /// `task`'s stream has a terminal record. A backend that can keep finished streams apart
    /// (RocksDB, [`crate::keys::FINISHED_EVENTS`]), when `apart`, moves the records of it
    /// stored so far there and stores there every record of it this batch puts in
    /// [`Space::Events`]; without `apart`, it stores them where the stream lies. Others ignore
    /// it. The writer adds it to a batch that writes a record of such a stream — the terminal
    /// one of a stream written whole in the batch when finished streams are kept apart
    /// ([`crate::JournalOptions::keep_finished_apart`]), any after the terminal one always —
    /// and, with them kept apart, makes a batch of these alone for the streams finished by a
    /// later append, when the journal idles or closes; so after each batch a stream lies
    /// wholly in one place.
    Retire {
        /// The task.
        task: String,
        /// How many of its records may be stored before this batch (positions below this;
        /// those this batch puts are not).
        stored: u64,
        /// Move the stream to the finished ones.
        apart: bool,
    },
    /// `task`'s records at positions below `below` are deleted wherever the stream lies,
    /// before the record of it this batch puts in [`Space::Events`] (its purge tombstone, at
    /// position 0) is put — with the finished streams when `apart` (or when the stream lies
    /// there already): what a purge writes ([`crate::Journal::purge`]), with the deletions
    /// of the records' commit entries. A backend deletes only where the records are, each
    /// key once.
    Purge {
        /// The task.
        task: String,
        /// The first position kept.
        below: u64,
        /// Put the tombstone with the finished streams.
        apart: bool,
    },
    /// The record stored at event key `key` is replaced by `value` (the same position and
    /// sequence, framed again: what a trim of a stream's progress writes,
    /// [`crate::Journal::trim_progress`]) wherever the stream lies — as a put of
    /// [`Space::Events`] would be, with the finished streams when the batch retires the
    /// stream there. The record's commit entry stays as it is.
    Replace {
        /// The event key.
        key: OpBytes,
        /// The record.
        value: OpBytes,
    },
}

/// When a shared store's commit of a batch ([`Backend::write_expecting`],
/// [`Backend::write_locked`]) is made durable, with [`Durability::Sync`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitFlush {
    /// By the next [`Backend::sync`]: the commit returns before the store's flush, so that
    /// the writer goes on with the next batch while the syncer makes this one durable.
    AtSync,
    /// At the commit itself: a lone batch, which the writer would sync at once — one round
    /// trip instead of two; the sync after it has nothing left to do.
    AtCommit,
}

/// What a shared store's writer lock found ([`Backend::lock_for_write`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteLock {
    /// The tail marker's bytes as stored (`None` before the first batch).
    pub tail: Option<Vec<u8>>,
    /// The tasks with a record of a sequence above the one asked about, listed in the same
    /// round trip as the lock; `None` when there were more than [`WRITTEN_SINCE_MAX`] such
    /// records, which the store does not read past: the writer then forgets every head it
    /// holds (it reads each again when next needed), rather than read everything written
    /// since, under the lock, for which heads to forget.
    pub written_since: Option<Vec<String>>,
    /// The last records, as committed, of the tasks whose heads the writer lacks, read in
    /// the same round trip as the lock; `None` when the store did not read them: the writer
    /// then reads them itself.
    pub heads: Option<Vec<(String, LastRecord)>>,
}

/// The most records whose tasks [`WriteLock::written_since`] lists; past it the writer
/// forgets every head instead.
pub const WRITTEN_SINCE_MAX: usize = 4096;

/// A raw key-value pair read from a backend.
pub type KeyValue = (Box<[u8]>, Box<[u8]>);

/// A task's last record (key and bytes) and whether it is live; `None` without records.
pub type LastRecord = Option<(KeyValue, bool)>;

/// An iterator over raw pairs; a storage error ends it.
pub type RawIter<'a> = Box<dyn Iterator<Item = Result<KeyValue>> + 'a>;

/// A key range of one space: `lower` inclusive, `upper` exclusive (unbounded when `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Range {
    /// The first key (inclusive).
    pub lower: Vec<u8>,
    /// The end (exclusive); `None` runs to the end of the space.
    pub upper: Option<Vec<u8>>,
    /// Iterate from the end of the range backwards.
    pub reverse: bool,
}

impl Range {
    /// Every key starting with `prefix`, forwards.
    #[must_use]
    pub fn prefix(prefix: &[u8]) -> Self {
        Self {
            lower: prefix.to_vec(),
            upper: prefix_end(prefix),
            reverse: false,
        }
    }

    /// Every key at or after `lower`, forwards.
    #[must_use]
    pub fn from(lower: &[u8]) -> Self {
        Self {
            lower: lower.to_vec(),
            upper: None,
            reverse: false,
        }
    }

    /// This range, iterated backwards.
    #[must_use]
    pub fn reversed(mut self) -> Self {
        self.reverse = true;
        self
    }
}

/// The smallest key greater than every key starting with `prefix` (`None` when there is none).
#[must_use]
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// A positioned, forward-only cursor over one space, for bulk reads without a copy per entry.
///
/// After [`Cursor::seek`] the cursor stands at the first key at or after the one sought;
/// [`Cursor::next`] moves to the following key. [`Cursor::key`] is `None` past the end (or
/// after a storage error, which [`Cursor::status`] then returns).
pub trait Cursor {
    /// Moves to the first key at or after `key`.
    fn seek(&mut self, key: &[u8]);
    /// Moves to the next key; a no-op past the end.
    fn next(&mut self);
    /// The current key, `None` past the end.
    fn key(&self) -> Option<&[u8]>;
    /// The current value, `None` past the end.
    fn value(&self) -> Option<&[u8]>;
    /// The storage error that ended the cursor, if any.
    ///
    /// # Errors
    /// [`Error::Storage`] when reading failed.
    fn status(&self) -> Result<()>;

    /// Where the current entry lies when the cursor reads a space kept in two places (the
    /// `events` space of a RocksDB journal of format 4): [`Source::First`] (`events`),
    /// [`Source::Second`] (`finished`) or [`Source::Both`] (the same key in each: damage).
    /// [`Source::First`] by default.
    fn source(&self) -> Source {
        Source::First
    }
}

/// Where a [`Cursor`]'s entry lies in a space kept in two places ([`Cursor::source`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The first place (for the `events` space, the `events` column family).
    First,
    /// The second place (the `finished` column family).
    Second,
    /// Both: the same key in each.
    Both,
}

/// A [`Cursor`] over [`Backend::scan`], for backends without a native one: each seek starts
/// a new scan.
struct ScanCursor<'a, B: Backend + ?Sized> {
    backend: &'a B,
    space: Space,
    iter: Option<RawIter<'a>>,
    current: Option<KeyValue>,
    error: Option<Error>,
}

impl<B: Backend + ?Sized> ScanCursor<'_, B> {
    fn pull(&mut self) {
        self.current = None;
        match self.iter.as_mut().and_then(Iterator::next) {
            Some(Ok(kv)) => self.current = Some(kv),
            Some(Err(e)) => {
                self.error = Some(e);
                self.iter = None;
            }
            None => self.iter = None,
        }
    }
}

impl<B: Backend + ?Sized> Cursor for ScanCursor<'_, B> {
    fn seek(&mut self, key: &[u8]) {
        self.error = None;
        self.iter = Some(self.backend.scan(self.space, Range::from(key)));
        self.pull();
    }

    fn next(&mut self) {
        if self.current.is_some() {
            self.pull();
        }
    }

    fn key(&self) -> Option<&[u8]> {
        self.current.as_ref().map(|(k, _)| &**k)
    }

    fn value(&self) -> Option<&[u8]> {
        self.current.as_ref().map(|(_, v)| &**v)
    }

    fn status(&self) -> Result<()> {
        match &self.error {
            None => Ok(()),
            Some(Error::Storage(storage)) => Err(Error::Storage(storage.clone())),
            Some(e) => Err(Error::storage(e.to_string())),
        }
    }
}

/// An ordered key-value store with atomic, optionally synced batches.
pub trait Backend: Send + Sync + 'static {
    /// Writes every op atomically: all or nothing. With [`Durability::Sync`] the call returns
    /// only after the batch is on stable storage.
    ///
    /// # Errors
    /// [`Error::Storage`] when nothing was written.
    fn write(&self, ops: Vec<BatchOp>, durability: Durability) -> Result<()>;

    /// Makes every write that returned before this call durable (syncs the write-ahead log).
    /// Safe to call while other writes go on.
    ///
    /// # Errors
    /// [`Error::Storage`] when the sync failed: what it covered may or may not be durable.
    fn sync(&self) -> Result<()>;

    /// [`Backend::sync`] for the writer's batches up to the one whose last sequence is
    /// `last_seq` (the syncer's, waiting for it): it makes every write that returned before
    /// this call durable all the same, and a failure answers for those batches. A store that
    /// notes what each write leaves to make durable (PostgreSQL's) keeps, when the sync fails,
    /// what it took of later batches' writes — returned, not yet handed to the syncer — for
    /// their own sync, rather than letting them be acknowledged unchecked. By default
    /// [`Backend::sync`].
    ///
    /// # Errors
    /// As [`Backend::sync`].
    fn sync_through(&self, last_seq: u64) -> Result<()> {
        let _ = last_seq;
        self.sync()
    }

    /// The most record bytes the writer takes into one batch: it stops taking appends into a
    /// batch once the next would bring its records past this many, and leaves that one for
    /// the next batch (an append larger than this is a batch alone). Unbounded by default; a
    /// store that receives a batch as one message of bounded size (PostgreSQL's) sets one.
    fn max_batch_bytes(&self) -> usize {
        usize::MAX
    }

    /// Whether a failed [`Backend::sync`] must stop the journal (the default): it must when
    /// a sync tried again could report success for data already dropped, as a retried
    /// `fsync` can. A store whose sync finds what it makes durable before it says so
    /// (PostgreSQL's) fails the appends the sync covered — their outcome unknown, as after
    /// a failed write — and the journal goes on.
    fn sync_failure_is_final(&self) -> bool {
        true
    }

    /// Reads one key.
    ///
    /// # Errors
    /// [`Error::Storage`] on I/O failure.
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// Iterates a range of one space in key order (or reverse key order).
    fn scan(&self, space: Space, range: Range) -> RawIter<'_>;

    /// A forward [`Cursor`] over one space for bulk reads (not positioned until its first
    /// seek). The default runs on [`Backend::scan`].
    fn cursor(&self, space: Space) -> Box<dyn Cursor + '_> {
        Box::new(ScanCursor {
            backend: self,
            space,
            iter: None,
            current: None,
            error: None,
        })
    }

    /// A [`Cursor`] for reads that seek more than they scan (blocks read stay cached). The
    /// default is [`Backend::cursor`].
    fn lookup_cursor(&self, space: Space) -> Box<dyn Cursor + '_> {
        self.cursor(space)
    }

    /// The records whose global sequences lie in `first..=last`, as `(event key, record)`
    /// pairs in sequence order, in one read — for a backend that stores each record's
    /// sequence beside it, where the records of a stretch of the commit order are one range
    /// (PostgreSQL); `None` (the default) where they are found by the keys the `commits`
    /// index names ([`crate::RecordFetcher`] then seeks them with a cursor). A read-only
    /// open returns only durable records, as its other reads do.
    fn records_by_seq(&self, first: u64, last: u64) -> Option<Result<Vec<KeyValue>>> {
        let _ = (first, last);
        None
    }

    /// A bulk [`Cursor`] over the records of the streams without a terminal record alone —
    /// what recovery reads — for a backend that keeps finished streams apart
    /// ([`BatchOp::Retire`]); `None` (the default) where [`Backend::cursor`] of
    /// [`Space::Events`] is as fast. A stream is there whole, or not at all.
    fn live_records_cursor(&self) -> Option<Box<dyn Cursor + '_>> {
        None
    }

    /// A bulk [`Cursor`] over the records not moved to the finished ones — every stream
    /// without a terminal record, and the finished streams left among them — for a backend
    /// that keeps finished streams apart; `None` (the default) elsewhere. The writer's sweep
    /// reads it to find the finished streams to move.
    fn unmoved_records_cursor(&self) -> Option<Box<dyn Cursor + '_>> {
        None
    }

    /// Catches a secondary instance up with its primary; a no-op elsewhere.
    ///
    /// # Errors
    /// [`Error::Storage`] on failure.
    fn catch_up(&self) -> Result<()> {
        Ok(())
    }

    /// Whether writes are refused (read-only or secondary).
    fn read_only(&self) -> bool;

    /// Whether this is a secondary instance, whose view moves only when it catches up
    /// ([`Backend::catch_up`]). `false` by default.
    fn is_secondary(&self) -> bool {
        false
    }

    /// Writes a consistent copy of the store as it stands now, every write that returned
    /// before the call in it, into a new temporary directory beside the store's files (so
    /// that the copy can link them rather than copy them), then makes every write in the copy
    /// durable in the store itself ([`Backend::sync`]). `None` (the default) for a store that
    /// makes no such copy: one whose view does not move under its readers (a read-only open)
    /// or that keeps its data elsewhere.
    ///
    /// # Errors
    /// [`Error::Storage`] when the copy or the sync failed (the store is unchanged).
    fn frozen_copy(&self) -> Result<Option<tempfile::TempDir>> {
        Ok(None)
    }

    /// A read-only backend over a snapshot of the store as it stands now, every write in it
    /// durable: the frozen view of a store that reads snapshots itself (PostgreSQL's). `None`
    /// (the default) for the others ([`Backend::frozen_copy`]).
    ///
    /// # Errors
    /// [`Error::Storage`] when the snapshot cannot be taken.
    fn frozen_view(&self) -> Result<Option<Arc<dyn Backend>>> {
        Ok(None)
    }

    /// Starts turning on automatic compactions, and returns without waiting for it. A
    /// writable open of an existing journal leaves them off, so that the reads of recovery
    /// have the machine to themselves (a compaction due at open — level-0 files left by the
    /// last run — would otherwise take a core from the fold); the writer calls this before
    /// its first write, which does not wait (RocksDB rewrites and re-reads its options file
    /// for each column family whose options change: ~10 ms each). [`Backend::settle`] waits
    /// for it. Idempotent; a no-op by default.
    ///
    /// # Errors
    /// [`Error::Storage`] when it cannot be started.
    fn start_compactions(&self) -> Result<()> {
        Ok(())
    }

    /// Compacts the whole store now, on the calling thread: what deletions (a purge's) left
    /// behind is dropped and its space given back. `Ok(false)` where the store reclaims
    /// space itself (the default; PostgreSQL's autovacuum).
    ///
    /// # Errors
    /// [`Error::Storage`] on failure.
    fn compact(&self) -> Result<bool> {
        Ok(false)
    }

    /// Persists in-memory tables so a later open has no log to replay; a no-op by default.
    ///
    /// # Errors
    /// [`Error::Storage`] on failure.
    fn flush(&self) -> Result<()> {
        Ok(())
    }

    /// Starts [`Backend::flush`] in the background and returns at once: what the in-memory
    /// tables hold is written to table files by the store's own threads, and their memory
    /// (and the log files they kept) is released when that is done. A no-op by default.
    ///
    /// # Errors
    /// [`Error::Storage`] when the store refuses to start it.
    fn flush_in_background(&self) -> Result<()> {
        Ok(())
    }

    /// Runs the compactions the store has due and waits for them, for at most `timeout`
    /// (which must not be zero): what a clean close does so that the next open reads a
    /// settled journal. Returns whether everything due was done within `timeout`; a no-op
    /// (done) by default.
    ///
    /// # Errors
    /// [`Error::Storage`] on failure.
    fn settle(&self, timeout: std::time::Duration) -> Result<bool> {
        let _ = timeout;
        Ok(true)
    }

    /// Up to `max` keys stored outside the journal's spaces (for RocksDB, in its default
    /// column family, which the journal never writes): what the audit reports as unknown.
    /// None by default.
    ///
    /// # Errors
    /// [`Error::Storage`] on failure.
    fn foreign_keys(&self, max: usize) -> Result<Vec<Vec<u8>>> {
        let _ = max;
        Ok(Vec::new())
    }

    /// Whether format 1's `heads` space ([`crate::keys::LEGACY_HEADS`]) is present.
    fn has_legacy_heads(&self) -> bool {
        false
    }

    /// Where the store is, for messages (a directory, or a database without credentials).
    fn describe(&self) -> String {
        "a custom backend".to_owned()
    }

    /// The version of the store's own schema, where it has one (a database's tables:
    /// [`crate::postgres::SCHEMA_VERSION`] once a writer's open migrated them); `None` (the
    /// default) for a store without one.
    fn schema_version(&self) -> Option<u32> {
        None
    }

    /// How many rows a scan reads in one snapshot of the store: a scan of more reads the
    /// rest in later ones, where what another process wrote in between may no longer follow
    /// what the earlier ones read — a stream trimmed (framed again) or purged (deleted) by
    /// another node between two of PostgreSQL's pages, each its own query. A reader of a
    /// stream that read past this many rows checks that it did not change under it
    /// ([`crate::StreamReader`]). `usize::MAX` (the default): every scan reads one
    /// snapshot (a RocksDB iterator, a frozen view).
    fn scan_snapshot_rows(&self) -> usize {
        usize::MAX
    }

    /// Whether other processes write this store too (a shared database). Then everything a
    /// read sees is committed and durable (no watermark of this process's applies), the
    /// writer takes the store's writer lock for each batch ([`Backend::lock_for_write`]),
    /// and the open does not check the tail marker against the commit index (other writers
    /// move both between two reads; `verify` checks them).
    fn is_shared(&self) -> bool {
        false
    }

    /// The directory the store lies in, for a store of files (`None` for a database server).
    fn dir(&self) -> Option<&std::path::Path> {
        None
    }

    /// Begins a batch of a writer that shares the store with others: takes the store's writer
    /// lock (held until [`Backend::write_locked`] commits the batch or
    /// [`Backend::unlock_write`] gives it up) and returns what it found
    /// ([`WriteLock`]): the tail marker's bytes as stored now, so that the writer builds on
    /// what the last writer, of any process, committed; the tasks written after sequence
    /// `since` (the last this writer knows of), whose heads it must forget; and the heads of
    /// the batch's tasks it `lacks` (a new task's, one it never wrote). `None` for a store
    /// whose only writer is this process (the default): its tail in memory is the truth.
    /// Only the journal's writer thread calls it.
    ///
    /// # Errors
    /// [`Error::Storage`] when the lock or the read failed (nothing is held then).
    fn lock_for_write(&self, since: u64, lacks: &[String]) -> Result<Option<WriteLock>> {
        let _ = (since, lacks);
        Ok(None)
    }

    /// Writes `ops` under the writer lock [`Backend::lock_for_write`] took, atomically, and
    /// gives the lock up; made durable as `flush` says. The default is [`Backend::write`]
    /// (buffered: the writer syncs).
    ///
    /// # Errors
    /// As for [`Backend::write`]; the lock is given up either way.
    fn write_locked(&self, ops: Vec<BatchOp>, flush: CommitFlush) -> Result<()> {
        let _ = flush;
        self.write(ops, Durability::Buffered)
    }

    /// Writes `ops` on a shared store in one step that takes the writer lock, checks that the
    /// stored tail marker is still `expected` (the one this writer wrote last) and commits:
    /// what a writer that believes it committed the last batch does, in one round trip.
    /// `Ok(false)`, with nothing written, when another writer committed in between or a record
    /// of the batch is already there; the writer then takes the careful way
    /// ([`Backend::lock_for_write`]). Made durable as `flush` says. The default always
    /// answers `Ok(false)`.
    ///
    /// # Errors
    /// As for [`Backend::write`].
    fn write_expecting(
        &self,
        ops: Vec<BatchOp>,
        expected: &[u8],
        flush: CommitFlush,
    ) -> Result<bool> {
        let _ = (ops, expected, flush);
        Ok(false)
    }

    /// Gives up the writer lock taken by [`Backend::lock_for_write`] without writing.
    fn unlock_write(&self) {}

    /// The last record (key and bytes) of each of `tasks`, and whether the task is in the
    /// `live` index — what their heads are read off ([`crate::Head`]) — in one read, for a
    /// store where each read is a round trip; `None` (the default) where reading them one by
    /// one costs nothing more. An inner `None` is a task without records.
    fn last_records(&self, tasks: &[String]) -> Option<Result<Vec<LastRecord>>> {
        let _ = tasks;
        None
    }

    /// For a shared store: a watermark of the last sequence any process committed, moved as
    /// their commits are announced. `None` (the default) where this process is the only
    /// writer and its own durable watermark says it all.
    fn watch_commits(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// For a writable open of a shared store whose reads may see commits not yet durable: a
    /// read-only store over the same connections whose reads return only what the store has
    /// made durable (what [`crate::Journal::durable_view`] reads). `None` (the default)
    /// where this store's reads are bounded already: an embedded store's readers stop at the
    /// durable watermark, and a read-only open checks its reads itself.
    fn durable_reader(&self) -> Option<Arc<dyn Backend>> {
        None
    }

    /// The storage engine's own figures ([`StorageStats`]); `None` (the default) for a store
    /// that reports none.
    ///
    /// # Errors
    /// [`Error::Storage`] when the store refuses to answer.
    fn storage_stats(&self) -> Result<Option<StorageStats>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_handles_carry() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
    }
}

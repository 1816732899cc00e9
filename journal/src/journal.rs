//! The journal: open, append, read.

use crate::backend::{Backend, BatchOp, OpBytes, OpenMode, Range, RocksBackend, Tuning};
use crate::bulk::StreamScanner;
use crate::commits::{
    below, committed, last_seq, purged_since, resolve, CommitBatches, Committed, OutboxEntry,
    RecordFetcher,
};
use crate::error::{CorruptionKind, Error, Limit, Result};
use crate::event::Event;
use crate::format::{
    check_version, checked_tail, is_empty, prepare_writable, read_tail, record_format_put,
    stored_format, stored_record_format, stored_version, tail_put, version_stamp,
    JOURNAL_FORMAT_VERSION,
};
use crate::head::Head;
use crate::keys::{self, Space};
use crate::observe::WriteObserver;
use crate::options::JournalOptions;
use crate::record::{self, RecordFormat};
use crate::stream::{read_unchained, StreamReader};
use crate::tail::{Inconsistency, LiveSummary, Tail};
use crate::writer::{
    AppendJob, Appended, EncodedEvent, EncodedEvents, IndexEffect, JobTask, LinkedPart, Recipient,
    Shared, Writer,
};
use std::path::Path;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;
use tokio::sync::{oneshot, watch};

/// An append-only journal of task streams on an embedded RocksDB.
///
/// Cheap to clone: clones share one database and one group-commit writer. The writer thread
/// stops when the last clone is dropped, after acknowledging everything queued.
///
/// ```
/// use dtask_journal::{Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let journal = Journal::open(dir.path(), JournalOptions::default())?;
/// let created = Event::Created {
///     spec: TaskSpec { id: "t1".into(), executor_key: "shell".into(), ..TaskSpec::default() }.into(),
///     policy: LeasePolicy::Retry,
///     checkpoint: vec![],
///     context_snapshot: vec![],
///     at: Timestamp(1_700_000_000_000),
/// };
/// let appended = journal.append("t1", 0, &[created.clone()])?;
/// assert_eq!(appended.next_position, 1);
/// // A second append that expects position 0 lost the race: nothing is written.
/// assert!(journal.append("t1", 0, &[created]).is_err());
/// let records = journal.read_stream("t1", 0).collect::<Result<Vec<_>, _>>()?;
/// assert_eq!(records.len(), 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Journal {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Arc<dyn Backend>,
    options: JournalOptions,
    /// The journal format version stored in the journal (after any upgrade at open).
    format: u32,
    /// The framing of the journal's records.
    record_format: RecordFormat,
    /// The tail marker as read at open (a writable journal's, checked against its commit
    /// index), for [`Journal::check_live`].
    opened_tail: Option<Tail>,
    /// The durable watermark (and whether the journal stopped), shared with the writer.
    shared: Arc<Shared>,
    sender: Mutex<Option<Sender<AppendJob>>>,
    /// The writer's state, for an append that finds the journal idle to write itself
    /// ([`JournalOptions::inline_lone_appends`]); `None` for a reader.
    inline: Option<Arc<Mutex<Writer>>>,
    /// The writer's state, for [`Journal::move_finished_now`]; `None` for a reader.
    state: Option<Arc<Mutex<Writer>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// How many [`Frozen`] views of a follower hold its view still: [`Journal::catch_up`]
    /// does nothing until they are gone. Held by a catch-up while it runs, so that a view
    /// is made between two catch-ups, never during one.
    frozen: Mutex<usize>,
}

impl Inner {
    /// The count of frozen views of a follower ([`Inner::frozen`]), locked.
    fn frozen_views(&self) -> std::sync::MutexGuard<'_, usize> {
        self.frozen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(mut sender) = self.sender.lock() {
            sender.take();
        }
        if let Ok(mut writer) = self.writer.lock() {
            if let Some(handle) = writer.take() {
                let _ = handle.join();
                // Flush on close so the next open (often a read-only inspector) has no
                // write-ahead log to replay. Best effort: the log is durable either way.
                if let Err(error) = self.backend.flush() {
                    tracing::warn!(%error, "flushing the journal at close failed");
                }
                // Settle (see `JournalOptions::settle_on_close`): the compactions due are
                // done now, not in the next run's first seconds beside its workers.
                let timeout = self.options.settle_on_close;
                if !timeout.is_zero() {
                    match self.backend.settle(timeout) {
                        Ok(true) => {}
                        Ok(false) => tracing::info!(
                            ?timeout,
                            "the journal closed with compactions still due"
                        ),
                        Err(error) => {
                            tracing::warn!(%error, "settling the journal at close failed");
                        }
                    }
                }
            }
        }
    }
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("options", &self.inner.options)
            .field("read_only", &self.inner.backend.read_only())
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// Opens (creating if missing) the journal at `path` for writing. A journal of an older
    /// format ([`OLDEST_JOURNAL_FORMAT_VERSION`](crate::OLDEST_JOURNAL_FORMAT_VERSION) or later) is upgraded in place. The open checks
    /// the journal's end against its tail marker before anything is written (see [`Tail`]).
    /// A directory whose synced appends would not survive a power failure (a file system in
    /// memory, write barriers off: [`crate::probe`]) is opened all the same, with a warning
    /// logged when the journal is to sync.
    ///
    /// # Errors
    /// [`Error::UnsupportedFormat`] for a journal of a newer format, [`Error::NotAJournal`] for a
    /// non-empty database without a format version, [`Error::InUse`] when another open holds
    /// the journal for writing, [`Error::Inconsistent`] when the commit index does not end
    /// where the tail marker says, [`Error::Storage`] when RocksDB fails otherwise.
    pub fn open(path: impl AsRef<Path>, options: JournalOptions) -> Result<Self> {
        let backend = Self::open_embedded(path.as_ref(), &options)?;
        Self::with_backend(Arc::new(backend), options)
    }

    /// [`Journal::open`], its RocksDB backend handed to `wrap` first: the journal runs over
    /// the backend `wrap` returns. The open is the same in everything else (the probe's
    /// warning, the lock, the upgrade of an older format, the check of the tail).
    ///
    /// This is what a crash or fault-injection harness uses to make reads, writes or syncs
    /// fail on demand over a real journal: `wrap` puts a [`Backend`] of its own around the
    /// real one, which it holds, and changes only the calls it means to fail. Such a wrapper
    /// must delegate every method of [`Backend`] it does not change to the real backend, the
    /// provided ones included: RocksDB's backend implements most of them itself (bulk
    /// cursors, the moves of finished streams, flushes, frozen copies…), and a provided
    /// method left to its default would quietly read or write otherwise than the journal
    /// does.
    ///
    /// ```
    /// use dtask_journal::{Journal, JournalOptions};
    /// # fn main() -> Result<(), dtask_journal::Error> {
    /// let dir = tempfile::tempdir().expect("tempdir");
    /// // The identity wrapper: the journal as `Journal::open` makes it.
    /// let journal = Journal::open_wrapped(dir.path(), JournalOptions::default(), |real| real)?;
    /// assert_eq!(journal.last_seq()?, 0);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`Journal::open`]; and as for [`Journal::with_backend`] over the backend `wrap`
    /// returns.
    pub fn open_wrapped(
        path: impl AsRef<Path>,
        options: JournalOptions,
        wrap: impl FnOnce(Arc<dyn Backend>) -> Arc<dyn Backend>,
    ) -> Result<Self> {
        let backend = Self::open_embedded(path.as_ref(), &options)?;
        Self::with_backend(wrap(Arc::new(backend)), options)
    }

    /// The RocksDB backend of a writable open of the journal at `path` ([`Journal::open`]),
    /// prepared for writing: the probe's warning logged, the lock taken, frozen copies left
    /// by an earlier process removed, an older format upgraded.
    fn open_embedded(path: &Path, options: &JournalOptions) -> Result<RocksBackend> {
        if options.durability == crate::Durability::Sync {
            crate::probe::warn_if_lost(path);
        }
        let mut backend = RocksBackend::open_tuned(
            path,
            OpenMode::Primary,
            Tuning {
                mmap_reads: options.mmap_reads,
                live_apart: options.keep_finished_apart,
                direct_table_io: options.direct_table_io,
            },
        )?;
        // The lock is this open's: no other process holds a frozen copy of this journal.
        crate::backend::remove_frozen_copies(path);
        prepare_writable(&backend, options.record_format)?;
        backend.drop_legacy_heads()?;
        Ok(backend)
    }

    /// Opens the journal at `path` read-only: a consistent view as of the open, no lock taken,
    /// so it works while another process writes the journal.
    ///
    /// One exception: an open made while the writer closes — its last flush under way — can
    /// see that flush half done and fail with [`Error::NotAJournal`]. Open again once the
    /// writer has closed; beside a live writer, [`Journal::open_follower`] keeps up instead.
    ///
    /// # Errors
    /// As for [`Journal::open`]; appends on the result fail with [`Error::ReadOnly`].
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self> {
        let backend = RocksBackend::open(path.as_ref(), OpenMode::ReadOnly)?;
        Self::checked_reader(backend)
    }

    /// Opens the journal at `path` as a follower of a live writer (a RocksDB secondary).
    /// `scratch` is a directory of the follower's own (its info log). Call
    /// [`Journal::catch_up`] to see what the writer committed since.
    ///
    /// # Errors
    /// As for [`Journal::open_read_only`].
    pub fn open_follower(path: impl AsRef<Path>, scratch: impl AsRef<Path>) -> Result<Self> {
        let backend = RocksBackend::open(path.as_ref(), OpenMode::Secondary(scratch.as_ref()))?;
        Self::checked_reader(backend)
    }

    /// Opens (creating the schema if missing) the journal in the PostgreSQL database at `url`
    /// (`postgres://user@host:port/db`, with `?schema=NAME` for a schema other than `dtask`)
    /// for writing. Any number of processes may open one database so: the database decides
    /// every append's expected position and orders their commits (see
    /// [`crate::postgres`]). With [`crate::Durability::Buffered`] commits do not wait for the
    /// database's log flush (`synchronous_commit = off`).
    ///
    /// # Errors
    /// [`Error::InvalidLocation`] for a malformed URL; [`Error::Storage`] naming host, port
    /// and cause when the database cannot be reached; [`Error::UnsupportedSchema`] or
    /// [`Error::UnsupportedFormat`] for a newer journal.
    pub fn open_postgres(url: &str, options: JournalOptions) -> Result<Self> {
        let location = crate::postgres::PgLocation::parse(url)?;
        let seed = [
            version_stamp(),
            tail_put(&Tail::default()),
            record_format_put(options.record_format),
        ]
        .into_iter()
        .filter_map(|op| match op {
            BatchOp::Put { key, value, .. } => Some((key.into_vec(), value.into_vec())),
            BatchOp::Delete { .. }
            | BatchOp::Retire { .. }
            | BatchOp::Purge { .. }
            | BatchOp::Replace { .. } => None,
        })
        .collect();
        if options.durability == crate::Durability::Sync {
            crate::postgres::probe::warn_if_lost(&location);
        }
        let backend = crate::postgres::PgBackend::open(location, false, options.durability, seed)?;
        Self::with_backend(Arc::new(backend), options)
    }

    /// Opens the journal in the PostgreSQL database at `url` read-only: it sees what every
    /// writer has committed, at each read — once the database has made it durable. A writer's
    /// commit returns before the database's flush (its sync follows), so a read that returns
    /// rows newer than the reader knows durable looks at the database's log (one more round
    /// trip) and waits for its flush when commits are not yet flushed: nothing this reader
    /// shows can be taken back by a crash of the database. On a hot standby nothing waits (a
    /// standby holds only what its primary flushed).
    ///
    /// # Errors
    /// As for [`Journal::open_postgres`]; [`Error::NotAJournal`] when the database holds no
    /// journal.
    pub fn open_postgres_read_only(url: &str) -> Result<Self> {
        let location = crate::postgres::PgLocation::parse(url)?;
        let backend =
            crate::postgres::PgBackend::open(location, true, crate::Durability::Sync, Vec::new())?;
        match stored_version(&backend)? {
            Some(v) => check_version(v)?,
            None => return Err(Error::NotAJournal("no format version".into())),
        }
        Self::with_backend(Arc::new(backend), JournalOptions::default())
    }

    /// Where the journal is, for messages: its directory, or the database's host, port,
    /// database and schema (never a password).
    #[must_use]
    pub fn location(&self) -> String {
        self.inner.backend.describe()
    }

    /// The sequence up to which this process's readers read: the durable watermark on an
    /// embedded journal; everything on a shared database, where whatever a read sees is
    /// committed (and, read-only, durable: [`Journal::open_postgres_read_only`]).
    fn visible(&self) -> u64 {
        if self.inner.backend.is_shared() {
            u64::MAX
        } else {
            self.inner.shared.durable()
        }
    }

    fn checked_reader(backend: RocksBackend) -> Result<Self> {
        match stored_version(&backend)? {
            Some(v) => check_version(v)?,
            // A journal whose creator died before it stamped the version holds nothing:
            // read it as the empty journal it is.
            None if is_empty(&backend)? => {}
            None => return Err(Error::NotAJournal("no format version".into())),
        }
        Self::with_backend(Arc::new(backend), JournalOptions::default())
    }

    /// Builds a journal over any [`Backend`] (which must already hold a compatible format
    /// version or be empty). A writable backend of an older format is upgraded in place, and
    /// its tail is checked as [`Journal::open`] checks it.
    ///
    /// # Errors
    /// [`Error::Storage`] if the commit index cannot be read; [`Error::Inconsistent`] when a
    /// writable journal's commit index does not end where its tail marker says.
    pub fn with_backend(backend: Arc<dyn Backend>, options: JournalOptions) -> Result<Self> {
        if !backend.read_only() {
            prepare_writable(backend.as_ref(), options.record_format)?;
        }
        let format = stored_format(backend.as_ref())?;
        let record_format = stored_record_format(backend.as_ref())?;
        let (sender, writer, inline, state, shared, opened_tail) = if backend.read_only() {
            // A reader sees everything in the database: its writer (if any) is another
            // process, whose durability this one cannot know.
            let tail = read_tail(backend.as_ref()).ok().flatten();
            (
                None,
                None,
                None,
                None,
                Arc::new(Shared::new(u64::MAX)),
                tail,
            )
        } else {
            let tail = if backend.is_shared() {
                // Other processes move the tail and the commit index between any two reads;
                // the writer reads the tail under the writer lock at each batch instead.
                read_tail(backend.as_ref())?.unwrap_or_default()
            } else {
                checked_tail(backend.as_ref())?
            };
            let shared = Arc::new(Shared::new(tail.last_seq));
            let (tx, rx) = mpsc::channel();
            let writer = Writer::new(
                Arc::clone(&backend),
                options.durability,
                options.max_batch_appends,
                tail,
                Arc::clone(&shared),
            )
            .keep_finished_apart(options.keep_finished_apart)
            .record_format(record_format)
            .close_budget(options.settle_on_close);
            let (writer, handle) = writer
                .spawn(rx)
                .map_err(|e| Error::Storage(crate::error::StorageError::caused_by(e)))?;
            let inline =
                (options.inline_lone_appends && !backend.is_shared()).then(|| Arc::clone(&writer));
            (
                Some(tx),
                Some(handle),
                inline,
                Some(writer),
                shared,
                Some(tail),
            )
        };
        Ok(Self {
            inner: Arc::new(Inner {
                backend,
                options,
                format,
                record_format,
                opened_tail,
                shared,
                sender: Mutex::new(sender),
                inline,
                state,
                writer: Mutex::new(writer),
                frozen: Mutex::new(0),
            }),
        })
    }

    /// The journal's format version, as stored in it: [`JOURNAL_FORMAT_VERSION`] for a journal
    /// open for writing (an older one is upgraded at open), possibly older for a reader.
    #[must_use]
    pub fn format_version(&self) -> u32 {
        self.inner.format
    }

    /// The version of the database schema the journal lives in, for a journal on PostgreSQL
    /// ([`crate::postgres::SCHEMA_VERSION`] once a writer's open migrated it; a reader's open
    /// leaves an older one as it is); `None` for an embedded journal.
    #[must_use]
    pub fn schema_version(&self) -> Option<u32> {
        self.inner.backend.schema_version()
    }

    /// The framing the journal's records are written in, as its `meta` space names it
    /// ([`RecordFormat::BLAKE3`] for a journal of a format before 5).
    #[must_use]
    pub fn record_format(&self) -> RecordFormat {
        self.inner.record_format
    }

    /// The options the journal was opened with.
    #[must_use]
    pub fn options(&self) -> &JournalOptions {
        &self.inner.options
    }

    /// Whether appends are refused.
    #[must_use]
    pub fn is_read_only(&self) -> bool {
        self.inner.backend.read_only()
    }

    /// A handle that reads this journal and shows only durable records: what a service
    /// shows to the outside (an HTTP API, a stream of commits, an audit) reads through it,
    /// so that nothing it shows can be taken back by a crash.
    ///
    /// On an embedded journal, or one opened read-only, it is this handle: the readers of a
    /// writable embedded journal stop at the durable watermark ([`Journal::durable_seq`]), and
    /// a read-only PostgreSQL open checks its reads itself
    /// ([`Journal::open_postgres_read_only`]). A writable open of a PostgreSQL journal reads
    /// whatever is committed — its engine's reads need no more: whatever it writes because of
    /// a row it read commits after that row and is made durable by the same flush — and other
    /// nodes' commits, and its own, are visible there a moment before the database flushes
    /// them. Its view is read-only, over the same connections, and checks its reads as a
    /// read-only open does; the rows this node's own syncs made durable cost it nothing more.
    /// Appends through such a view are refused ([`Error::ReadOnly`]).
    ///
    /// ```
    /// use dtask_journal::{Journal, JournalOptions};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let journal = Journal::open(dir.path(), JournalOptions::default())?;
    /// let view = journal.durable_view();
    /// // Embedded: the same journal, whose readers stop at the durable watermark.
    /// assert!(!view.is_read_only());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn durable_view(&self) -> Self {
        let Some(backend) = self.inner.backend.durable_reader() else {
            return self.clone();
        };
        Self {
            inner: Arc::new(Inner {
                backend,
                options: self.inner.options.clone(),
                format: self.inner.format,
                record_format: self.inner.record_format,
                opened_tail: None,
                shared: Arc::new(Shared::new(u64::MAX)),
                sender: Mutex::new(None),
                inline: None,
                state: None,
                writer: Mutex::new(None),
                frozen: Mutex::new(0),
            }),
        }
    }

    /// Whether other processes may write this journal too (a PostgreSQL journal): a reader's
    /// view moves under it, and a store over it follows the commits
    /// (`TaskStore::spawn_follower`).
    #[must_use]
    pub fn is_shared(&self) -> bool {
        self.inner.backend.is_shared()
    }

    /// The directory of an embedded journal (the one it was opened at; a frozen view's, its
    /// copy), or `None` for a PostgreSQL journal — what [`crate::probe::Placement::examine`]
    /// looks at.
    #[must_use]
    pub fn dir(&self) -> Option<&Path> {
        self.inner.backend.dir()
    }

    /// Checks a task id: valid, and within the limit.
    fn check_task_id(&self, task: &str) -> Result<()> {
        if !keys::is_valid_task_id(task) {
            return Err(Error::InvalidTaskId(task.to_owned()));
        }
        let max = self.inner.options.max_task_id_bytes;
        if task.len() > max {
            return Err(Error::TooLarge {
                limit: Limit::TaskId,
                size: task.len(),
                max,
            });
        }
        Ok(())
    }

    fn prepare(&self, task: &str, events: &[Event]) -> Result<EncodedEvents> {
        self.prepare_as(task, events, false)
    }

    /// [`Journal::prepare`], taking a trim's records ([`Event::UpdateTrimmed`],
    /// [`Event::ProgressTrimmed`]) when `restoring` (an import writing a stream as a trim
    /// left it): an ordinary append may not.
    fn prepare_as(&self, task: &str, events: &[Event], restoring: bool) -> Result<EncodedEvents> {
        let opts = &self.inner.options;
        self.check_task_id(task)?;
        if events.is_empty() {
            return Err(Error::EmptyAppend);
        }
        if events.len() > opts.max_events_per_append {
            return Err(Error::TooLarge {
                limit: Limit::EventsPerAppend,
                size: events.len(),
                max: opts.max_events_per_append,
            });
        }
        events
            .iter()
            .map(|event| {
                let value = event.largest_value_len();
                if value > opts.max_value_bytes {
                    return Err(Error::TooLarge {
                        limit: Limit::Value,
                        size: value,
                        max: opts.max_value_bytes,
                    });
                }
                let payload = record::Unframed::encode(event).map_err(Error::Encode)?;
                let max_record = opts.max_record_bytes.min(record::MAX_PAYLOAD_BYTES);
                if payload.payload().len() > max_record {
                    return Err(Error::TooLarge {
                        limit: Limit::Record,
                        size: payload.payload().len(),
                        max: max_record,
                    });
                }
                match event {
                    Event::Purged { .. } => {
                        return Err(Error::NotPurgeable {
                            task: task.to_owned(),
                            why: crate::PurgeRefusal::AppendedTombstone,
                        })
                    }
                    Event::UpdateTrimmed { .. } | Event::ProgressTrimmed { .. } if !restoring => {
                        return Err(Error::NotTrimmable {
                            task: task.to_owned(),
                            why: crate::TrimRefusal::AppendedTrim,
                        })
                    }
                    _ => {}
                }
                let effect = match event.spec() {
                    Some(spec) if spec.id != task => {
                        return Err(Error::WrongTask {
                            task: task.to_owned(),
                            found: spec.id.clone(),
                        })
                    }
                    Some(_) => IndexEffect::Created,
                    None => match event {
                        Event::NotificationEnqueued { .. }
                        | Event::NotificationEnqueuedV2 { .. } => IndexEffect::Enqueue,
                        Event::NotificationAcked { enqueued_seq, .. } => {
                            IndexEffect::Ack(*enqueued_seq)
                        }
                        e if e.is_terminal() => IndexEffect::Terminal,
                        _ => IndexEffect::None,
                    },
                };
                Ok(EncodedEvent { payload, effect })
            })
            .collect()
    }

    /// Checks and encodes an append and hands it to the writer thread — or, when the journal
    /// is idle and `may_block()` (asked only then), writes and syncs it on this thread
    /// ([`JournalOptions::inline_lone_appends`]). The receiver gets the outcome, sent from a
    /// task on `runtime` when one is named (the multi-threaded runtime the receiver is
    /// awaited on: see `acknowledge` in the writer's module).
    pub(crate) fn submit(
        &self,
        task: &str,
        expected_position: u64,
        events: &[Event],
        linked: &[(&str, u64, &[Event])],
        may_block: fn() -> bool,
        runtime: Option<tokio::runtime::Handle>,
    ) -> Result<oneshot::Receiver<Result<Appended>>> {
        let encoded = self.prepare(task, events)?;
        let mut parts = Vec::with_capacity(linked.len());
        for (i, (other, expected, events)) in linked.iter().enumerate() {
            if *other == task || linked[..i].iter().any(|(t, ..)| t == other) {
                return Err(Error::DuplicateStream((*other).to_owned()));
            }
            parts.push(LinkedPart {
                task: JobTask::new(other),
                expected: *expected,
                events: self.prepare(other, events)?,
            });
        }
        self.enqueue(
            (JobTask::new(task), expected_position, encoded),
            parts,
            may_block,
            runtime,
            None,
        )
    }

    /// Hands a checked and encoded append — its first part and the `linked` ones — to the
    /// writer thread, or writes it on this thread (see [`Journal::submit`]).
    pub(crate) fn enqueue(
        &self,
        (task, expected, events): (JobTask, u64, EncodedEvents),
        linked: Vec<LinkedPart>,
        may_block: fn() -> bool,
        runtime: Option<tokio::runtime::Handle>,
        at_seq: Option<u64>,
    ) -> Result<oneshot::Receiver<Result<Appended>>> {
        let (reply, rx) = oneshot::channel();
        let job = AppendJob {
            task,
            expected,
            events,
            linked,
            to: Recipient {
                reply,
                submitted: self.inner.shared.observer().map(|_| Instant::now()),
                runtime,
            },
            at_seq,
        };
        // A busy journal is seen without touching the writer's lock, which the writer
        // thread holds while it writes a batch.
        let job = match &self.inner.inline {
            Some(writer) if !self.inner.shared.busy() => {
                match Writer::try_inline(writer, job, may_block) {
                    None => return Ok(rx),
                    Some(job) => job,
                }
            }
            _ => job,
        };
        let sender = self.inner.sender.lock().map_err(|_| Error::Closed)?;
        match sender.as_ref() {
            None if self.is_read_only() => Err(Error::ReadOnly),
            None => Err(Error::Closed),
            Some(tx) => {
                self.inner.shared.queue();
                tx.send(job).map(|()| rx).map_err(|_| {
                    self.inner.shared.unqueue();
                    Error::Closed
                })
            }
        }
    }

    /// Appends `events` to `task`'s stream at `expected_position` (the stream's current length)
    /// atomically, and returns once they are durable (per [`crate::Durability`]).
    ///
    /// Appends of many callers are group-committed: one batch, one sync. An append that finds
    /// the journal idle is written and synced on the calling thread
    /// ([`JournalOptions::inline_lone_appends`]).
    ///
    /// # Errors
    /// [`Error::Conflict`] when the stream is not at `expected_position` (nothing written);
    /// [`Error::TooLarge`], [`Error::InvalidTaskId`], [`Error::EmptyAppend`] for bad input
    /// (nothing written); [`Error::Storage`] when the batch failed (nothing written);
    /// [`Error::Stopped`] once a sync failed (the append may or may not be durable; every
    /// later append gets it too until the journal is reopened).
    ///
    /// # Panics
    /// Must not be called from inside an asynchronous runtime's worker (it blocks); use
    /// [`Journal::append_async`] there.
    pub fn append(&self, task: &str, expected_position: u64, events: &[Event]) -> Result<Appended> {
        self.submit(task, expected_position, events, &[], || true, None)?
            .blocking_recv()
            .map_err(|_| Error::Closed)?
    }

    /// [`Journal::append`] for asynchronous callers: awaits durability without blocking a
    /// runtime thread — except that, on a multi-threaded tokio runtime, an append that finds
    /// the journal idle is written and synced on the caller's worker, blocking it for one
    /// sync ([`JournalOptions::inline_lone_appends`], which turns this off).
    ///
    /// # Errors
    /// As for [`Journal::append`].
    pub async fn append_async(
        &self,
        task: &str,
        expected_position: u64,
        events: &[Event],
    ) -> Result<Appended> {
        self.submit_async(task, expected_position, events, &[])
            .await?
            .await
            .map_err(|_| Error::Closed)?
    }

    /// Appends `events` to `task`'s stream at `expected_position` and each of `linked` —
    /// (other task, its expected position, its events) — to its own stream, **atomically**:
    /// every part is written in one batch, or none is. What a nested task's creation (with
    /// its parent's record of it) and a child's notification into its parent's mailbox
    /// need. Returns the first part's [`Appended`].
    ///
    /// # Errors
    /// As for [`Journal::append`]; [`Error::Conflict`] names the first part whose stream was
    /// not at its expected position; [`Error::DuplicateStream`] when a stream appears twice.
    pub async fn append_linked_async(
        &self,
        task: &str,
        expected_position: u64,
        events: &[Event],
        linked: &[(&str, u64, &[Event])],
    ) -> Result<Appended> {
        self.submit_async(task, expected_position, events, linked)
            .await?
            .await
            .map_err(|_| Error::Closed)?
    }

    /// [`Journal::append_linked_async`] in two steps: this submits the append (`linked` may
    /// be empty) and returns its [`PendingAppend`], which resolves to the outcome. Once
    /// submitted, an append is written whatever becomes of its caller: dropping the pending
    /// append forgets the outcome, not the append. A caller that keeps state derived from
    /// the journal and may be dropped mid-call (a future under `timeout` or `select!`) keeps
    /// the pending append when it is, to learn the outcome before it trusts that state again.
    ///
    /// ```
    /// use dtask_journal::{Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let journal = Journal::open(dir.path(), JournalOptions::default())?;
    /// let created = Event::Created {
    ///     spec: TaskSpec { id: "t1".into(), executor_key: "shell".into(), ..TaskSpec::default() }.into(),
    ///     policy: LeasePolicy::Retry,
    ///     checkpoint: vec![],
    ///     context_snapshot: vec![],
    ///     at: Timestamp(1_700_000_000_000),
    /// };
    /// let pending = journal.submit_linked_async("t1", 0, &[created], &[]).await?;
    /// // Submitted: written even if `pending` were dropped now.
    /// let appended = pending.await?;
    /// assert_eq!(appended.next_position, 1);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Those of [`Journal::append_linked_async`] found before the append is submitted (bad
    /// input, a closed or read-only journal); the rest come from the pending append.
    pub async fn submit_linked_async(
        &self,
        task: &str,
        expected_position: u64,
        events: &[Event],
        linked: &[(&str, u64, &[Event])],
    ) -> Result<PendingAppend> {
        let reply = self
            .submit_async(task, expected_position, events, linked)
            .await?;
        Ok(PendingAppend { reply })
    }

    /// [`Journal::submit_linked_async`] of one stream (submitted without waiting, from any
    /// thread) whose first record takes global
    /// sequence `first_seq` — at least the next one; the sequences between are never given
    /// out — for an import rebuilding a journal bit-exact, the holes its purges left
    /// included. `events` may be a purged task's tombstone alone ([`Event::Purged`]) at
    /// position 0 of an empty stream: it is written as the purge wrote it (chained from the
    /// digest it names), which no other append may do; and they may hold a trim's records
    /// ([`Event::UpdateTrimmed`], [`Event::ProgressTrimmed`]), which no other append may.
    ///
    /// # Errors
    /// [`Error::SequenceTaken`] when `first_seq` was given out already (or is out of range);
    /// otherwise as for [`Journal::submit_linked_async`].
    pub fn submit_at_seq(
        &self,
        task: &str,
        expected_position: u64,
        events: &[Event],
        first_seq: u64,
    ) -> Result<PendingAppend> {
        let encoded = match events {
            [tombstone @ Event::Purged { last_digest, .. }] if expected_position == 0 => {
                self.check_task_id(task)?;
                let payload = record::Unframed::encode(tombstone).map_err(Error::Encode)?;
                EncodedEvents::from_iter([EncodedEvent {
                    payload,
                    effect: IndexEffect::Purge {
                        seqs: Box::default(),
                        chain_from: record::Digest(*last_digest),
                    },
                }])
            }
            events => self.prepare_as(task, events, true)?,
        };
        let reply = self.enqueue(
            (JobTask::new(task), expected_position, encoded),
            Vec::new(),
            never,
            None,
            Some(first_seq),
        )?;
        Ok(PendingAppend { reply })
    }

    /// [`Journal::submit`] for asynchronous callers. One that finds the journal idle (where
    /// it could write inline) yields once first, counted as intending to ([`Shared::intend`]
    /// in the writer's module): appends made together by one task — polled one after the
    /// other on one thread — then see each other and go to the writer thread as one batch,
    /// instead of each writing and syncing inline in turn. A lone append still writes
    /// inline, one yield later.
    async fn submit_async(
        &self,
        task: &str,
        expected_position: u64,
        events: &[Event],
        linked: &[(&str, u64, &[Event])],
    ) -> Result<oneshot::Receiver<Result<Appended>>> {
        let runtime = multi_threaded_runtime();
        if self.inner.inline.is_none() || self.inner.shared.busy() || runtime.is_none() {
            return self.submit(
                task,
                expected_position,
                events,
                linked,
                may_block_async,
                runtime,
            );
        }
        let intent = self.inner.shared.intend();
        tokio::task::yield_now().await;
        let may_block = if intent.alone() {
            may_block_async
        } else {
            never
        };
        // The intent is counted until the job is submitted, so that those deciding after
        // this one still see it.
        let submitted = self.submit(task, expected_position, events, linked, may_block, runtime);
        drop(intent);
        submitted
    }

    /// Moves the finished streams whose move waits, now; returns how many moved.
    ///
    /// With [`JournalOptions::keep_finished_apart`] (the default), a stream finished by a
    /// record appended after its first batch is not moved in the batch of its terminal
    /// record, on the busy path, but later: once the journal has had no append for 20 ms,
    /// and at a clean close. The first idle moments after an open's first write (not during
    /// the recovery's fold, which reads what the sweep walks) also sweep the records
    /// not moved for finished streams left among the live ones (by a crash, which loses the
    /// moves waiting, by a run with the option off, or by an older format). This finishes
    /// that sweep and makes every move waiting now — before a backup or a restart of a
    /// journal that never idles, or at a quiet moment a service knows of — on the calling
    /// thread, holding the writer as a batch does. Zero for a reader, without the option,
    /// or on a store shared with other processes.
    ///
    /// ```
    /// use dtask_journal::{Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let options = JournalOptions::default().with_keep_finished_apart(true);
    /// let journal = Journal::open(dir.path(), options)?;
    /// let created = Event::Created {
    ///     spec: TaskSpec { id: "t1".into(), executor_key: "shell".into(), ..TaskSpec::default() }.into(),
    ///     policy: LeasePolicy::Retry,
    ///     checkpoint: vec![],
    ///     context_snapshot: vec![],
    ///     at: Timestamp(1_700_000_000_000),
    /// };
    /// journal.append("t1", 0, &[created])?;
    /// let completed = Event::Completed { data: b"ok".to_vec(), at: Timestamp(1_700_000_000_001) };
    /// journal.append("t1", 1, &[completed])?;
    /// // Finished by its second append: its move waits for an idle moment, or for this
    /// // (which finds nothing left if the journal idled first).
    /// let moved = journal.move_finished_now()?;
    /// assert!(moved <= 1);
    /// assert_eq!(journal.read_stream("t1", 0).count(), 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Storage`] when the write failed: the moves still waiting are given up (those
    /// streams stay with the live ones, read alike); [`Error::Stopped`] once a sync failed.
    pub fn move_finished_now(&self) -> Result<usize> {
        let Some(state) = &self.inner.state else {
            return Ok(0);
        };
        if let Some(why) = self.inner.shared.stopped() {
            return Err(why);
        }
        let mut writer = state
            .lock()
            .map_err(|_| Error::Stopped("a thread panicked while writing to the journal".into()))?;
        writer.move_all()
    }

    /// Runs `f` on the writer's state (tests set its knobs: the moves' limit, the idle
    /// mover); `None` on a reader.
    #[cfg(test)]
    pub(crate) fn with_writer<R>(&self, f: impl FnOnce(&mut Writer) -> R) -> Option<R> {
        let mut writer = self.inner.state.as_ref()?.lock().ok()?;
        Some(f(&mut writer))
    }

    /// Installs `observer`, told of every batch written, every sync and every append's latency
    /// from then on (see [`crate::observe`]); `false`, and nothing changed, when one is
    /// installed already. A read-only journal has nothing to tell.
    pub fn observe(&self, observer: Arc<dyn WriteObserver>) -> bool {
        self.inner.shared.observe(observer)
    }

    /// A receiver of the durable watermark ([`Journal::durable_seq`]): it changes each time a
    /// sync makes more records durable, so a reader of the commits (a server's stream, a
    /// tail, another node's store) can wait for new records instead of polling. On a
    /// PostgreSQL journal it is the last sequence committed by **any** process (announced
    /// with `NOTIFY`, read again every second). It never changes on a read-only or follower
    /// RocksDB journal, whose records another process writes.
    pub fn watch_durable(&self) -> watch::Receiver<u64> {
        self.inner
            .backend
            .watch_commits()
            .unwrap_or_else(|| self.inner.shared.watch_durable())
    }

    /// The head of `task`'s stream (read off its last record), or `None` for an unknown task.
    /// It includes records not yet durable, if any.
    ///
    /// # Errors
    /// [`Error::Corruption`] when the last record is damaged, [`Error::Storage`] on I/O
    /// failure.
    pub fn head(&self, task: &str) -> Result<Option<Head>> {
        Head::read(self.inner.backend.as_ref(), task)
    }

    /// Hands the writer the heads of tasks, read off this journal since it was opened (by
    /// recovery's fold, say), so that the first append to each does not read its head again:
    /// a cold head costs the writer thread a reverse seek, which after a restart would slow
    /// every live task's first append. Returns `false` (and takes nothing) once the writer
    /// has begun its first batch, when a head read earlier may be stale; a read-only journal
    /// takes nothing either. At most 2^20 heads are taken.
    ///
    /// A head handed over must be exact (the last record's position + 1, its sequence and
    /// digest): the writer trusts it.
    pub fn prime_heads<'a>(&self, heads: impl IntoIterator<Item = (&'a str, Head)>) -> bool {
        !self.is_read_only() && self.inner.shared.prime(heads)
    }

    /// The number of records of `task`'s stream (one past the position of its last key), or
    /// `None` for an unknown task. Unlike [`Journal::head`] it reads only the last key, so a
    /// damaged last record still counts: what inspection tools need to know a task exists and
    /// how far its stream goes. It counts what [`Journal::read_stream`] reads: on a journal
    /// open for writing, records written and not yet durable are not counted (a task all of
    /// whose records are still being synced is unknown until the sync).
    ///
    /// # Errors
    /// [`Error::Corruption`] when the last key is not one of the task's, [`Error::Storage`] on
    /// I/O failure.
    pub fn stream_len(&self, task: &str) -> Result<Option<u64>> {
        let last =
            crate::head::last_record_upto(self.inner.backend.as_ref(), task, self.visible())?;
        let Some((key, _)) = last else {
            return Ok(None);
        };
        let position =
            keys::position_in(task, &key).map_err(|kind| Error::corruption(task, 0, kind))?;
        Ok(Some(position + 1))
    }

    /// Whether `task` has any record (written, durable or not): a point lookup of its first
    /// record, cheaper than [`Journal::stream_len`]'s seek to its last.
    ///
    /// # Errors
    /// [`Error::Storage`] on I/O failure.
    pub fn contains_task(&self, task: &str) -> Result<bool> {
        // The key held in place (no allocation for an id of up to 55 bytes).
        Ok(self
            .inner
            .backend
            .get(Space::Events, &keys::event_op_key(task, 0))?
            .is_some())
    }

    /// Reads `task`'s stream from position `from`, verifying every record's CRC, position and
    /// hash chain. A damaged record yields an error naming its
    /// task and position; iteration then continues with the next record, so a reader can
    /// report every problem. Nothing is ever skipped silently. On a journal open for writing
    /// the stream ends at the durable watermark ([`Journal::durable_seq`]): records written
    /// but not yet synced are not read.
    #[must_use]
    pub fn read_stream(&self, task: &str, from: u64) -> StreamReader<'_> {
        StreamReader::new(self.inner.backend.as_ref(), task, from, self.visible())
    }

    /// The storage under the journal, for the crate's own modules that read it raw.
    pub(crate) fn storage(&self) -> &dyn Backend {
        self.inner.backend.as_ref()
    }

    /// The durable watermark: the global sequence up to which every record is durable (per
    /// [`crate::Durability`]). Of a journal open for writing, the readers of this process
    /// ([`Journal::read_stream`], [`Journal::commits`], [`Journal::commit_batches`],
    /// [`Journal::outbox`]) see no record above it, so they never act on one that a crash
    /// of the machine could take back. `u64::MAX` for a read-only journal or a follower:
    /// they see what the database holds.
    #[must_use]
    pub fn durable_seq(&self) -> u64 {
        self.inner.shared.durable()
    }

    /// What the journal's writer can do now, for a service's health checks (`dtask serve`'s
    /// `/healthz` fails on [`WriteState::Stopped`], its `/readyz` on any state but
    /// [`WriteState::Writing`] and [`WriteState::ReadOnly`]). It costs two atomic loads.
    ///
    /// ```
    /// use dtask_journal::{Journal, JournalOptions, WriteState};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let journal = Journal::open(dir.path(), JournalOptions::default())?;
    /// assert_eq!(journal.write_state(), WriteState::Writing);
    /// drop(journal);
    /// let reader = Journal::open_read_only(dir.path())?;
    /// assert_eq!(reader.write_state(), WriteState::ReadOnly);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn write_state(&self) -> WriteState {
        if self.is_read_only() {
            return WriteState::ReadOnly;
        }
        match self.inner.shared.stopped() {
            Some(Error::Stopped(why)) => return WriteState::Stopped(why),
            Some(other) => return WriteState::Stopped(other.to_string()),
            None => {}
        }
        match self.inner.shared.write_failure() {
            crate::writer::FAILED_NO_SPACE => WriteState::DiskFull,
            crate::writer::FAILED_OTHERWISE => WriteState::Failing,
            _ => WriteState::Writing,
        }
    }

    /// Lists every task with its head, in task-id order. A task whose last record is damaged
    /// comes as an [`Error::Corruption`] naming it, and the listing goes on.
    pub fn tasks(&self) -> impl Iterator<Item = Result<(String, Head)>> + '_ {
        let backend = self.inner.backend.as_ref();
        self.task_ids().map(move |task| {
            let task = task?;
            match Head::read(backend, &task)? {
                Some(head) => Ok((task, head)),
                // Gone between the listing and the read: not possible in an append-only
                // journal; reported rather than skipped.
                None => Err(Error::corruption(&task, 0, CorruptionKind::Missing)),
            }
        })
    }

    /// Lists the id of every task with at least one record, in task-id order: one seek per
    /// task. A key that names no task comes as an [`Error::Corruption`], and the listing goes
    /// on after it. On a journal open for writing it lists, too, a task whose records are all
    /// written and not yet durable, which [`Journal::read_stream`] does not read yet: a
    /// reader that shows tasks steps over one whose stream reads empty (as the server's list
    /// and counts do).
    pub fn task_ids(&self) -> impl Iterator<Item = Result<String>> + '_ {
        self.task_ids_from(None)
    }

    /// [`Journal::task_ids`] from the first id after `after` (every id when `None`): one seek,
    /// whatever the number of ids before it — what a paginated listing resumes from.
    ///
    /// On a shared store (PostgreSQL) the cursor steps from one task to the next over up to
    /// a first page of records rather than seeking past them: a seek there is a query, a
    /// step reads the page already fetched (listing 16k tasks of ~10 records took a fourth of
    /// the time). On RocksDB, where a seek is cheaper than ten steps, it seeks.
    pub fn task_ids_from(&self, after: Option<&str>) -> impl Iterator<Item = Result<String>> + '_ {
        let backend = &self.inner.backend;
        let skip_limit = if backend.is_shared() { 64 } else { 0 };
        let mut cursor =
            crate::bulk::Positioned::with_skip_limit(backend.cursor(Space::Events), skip_limit);
        let mut done = false;
        match after {
            None => cursor.reach(&[]),
            Some(after) => match crate::backend::prefix_end(&keys::task_prefix(after)) {
                Some(next) => cursor.reach(&next),
                None => done = true,
            },
        }
        std::iter::from_fn(move || {
            if done {
                return None;
            }
            let Some(key) = cursor.key() else {
                done = true;
                return cursor.status().err().map(Err);
            };
            let task = match keys::parse_event_key(key) {
                Ok((task, _)) => task.to_owned(),
                Err(kind) => {
                    let problem = Error::corruption(&String::from_utf8_lossy(key), 0, kind);
                    let mut after = key.to_vec();
                    after.push(0);
                    cursor.reach(&after);
                    return Some(Err(problem));
                }
            };
            match crate::backend::prefix_end(&keys::task_prefix(&task)) {
                Some(next) => cursor.reach(&next),
                None => done = true,
            }
            Some(Ok(task))
        })
    }

    /// How many live tasks the tail marker counted when this journal was opened: what a
    /// recovery can size its tables by before it has listed them. `None` for a journal
    /// without a marker (a reader of one whose writer never wrote one), or a shared
    /// (PostgreSQL) journal, whose marker other processes move. A hint only: the open's
    /// consistency check ([`Journal::check_live`]) is what holds the marker against the
    /// tasks found.
    #[must_use]
    pub fn live_tasks_at_open(&self) -> Option<u64> {
        if self.inner.backend.is_shared() {
            return None;
        }
        self.inner.opened_tail.map(|tail| tail.live.tasks)
    }

    /// Lists the tasks without a terminal event, in task-id order. An entry whose key names
    /// no task comes as an [`Error::MalformedEntry`], one that carries bytes as an
    /// [`Error::Corruption`], and the listing goes on after either.
    ///
    /// One forward pass of a bulk cursor, the ids read off the cursor's own buffers: a
    /// recovery lists every live task while its fold threads fold the ones listed, and a
    /// scan that boxed each key and value took a tenth of a core from them.
    pub fn live_tasks(&self) -> impl Iterator<Item = Result<String>> + '_ {
        let mut cursor = self.inner.backend.cursor(Space::Live);
        let (mut started, mut done) = (false, false);
        std::iter::from_fn(move || {
            if done {
                return None;
            }
            if started {
                cursor.next();
            } else {
                cursor.seek(&[]);
                started = true;
            }
            let Some(key) = cursor.key() else {
                done = true;
                return cursor.status().err().map(Err);
            };
            let task = match keys::parse_task_key(key) {
                Ok(task) => task,
                Err(kind) => return Some(Err(Error::malformed(Space::Live, key, kind))),
            };
            let carried = cursor.value().map_or(0, <[u8]>::len);
            if carried != 0 {
                // The index keeps no value: bytes here were not written by a journal.
                return Some(Err(Error::corruption(
                    task,
                    0,
                    CorruptionKind::Key(format!(
                        "the live entry carries {carried} bytes; the index keeps none"
                    )),
                )));
            }
            Some(Ok(task.to_owned()))
        })
    }

    /// Reads every record in global commit order, starting at sequence `from_seq`. Records are
    /// CRC- and position-checked; chains are checked by [`Journal::read_stream`].
    ///
    /// The index is read as it stood when the reading began, each record as it stands when
    /// its entry is reached: an entry whose record a purge deleted in between (its entry gone
    /// with it, the task's tombstone later in the order) is passed over, not reported as
    /// damage.
    pub fn commits(&self, from_seq: u64) -> impl Iterator<Item = Result<Committed>> + '_ {
        let backend = self.inner.backend.as_ref();
        let durable = self.visible();
        backend
            .scan(Space::Commits, Range::from(&keys::seq_key(from_seq)))
            .take_while(move |item| below(item, durable))
            .filter_map(move |item| {
                let (key, value) = match item {
                    Ok(entry) => entry,
                    Err(e) => return Some(Err(e)),
                };
                // The entry's value is the key of the record it names.
                let record = match backend.get(Space::Events, &value) {
                    Ok(record) => record,
                    Err(e) => return Some(Err(e)),
                };
                match resolve(&key, &value, Ok(record.as_deref())) {
                    Ok((task, frame)) => Some(committed(task, frame)),
                    Err(e) if e.is_damage() && purged_since(backend, &key) => None,
                    Err(e) => Some(Err(e)),
                }
            })
    }

    /// [`Journal::commits`] from `from_seq` in batches of up to `size` entries of the commit
    /// index. A batch is resolved to its records by [`RawCommits::into_committed`](crate::RawCommits::into_committed) (possibly
    /// on another thread), which fetches them in key order instead of one lookup per entry;
    /// the items are exactly those of [`Journal::commits`] on a journal that does not change
    /// while it is read (a read-only open, [`Journal::frozen`]'s view, an export's source).
    /// On a journal being written, a fetcher reads the records as they were when it was
    /// made (a record appended since names a missing one), and an entry purged meanwhile is
    /// reported, not passed over: follow a live journal with [`Journal::commits`].
    #[must_use]
    pub fn commit_batches(&self, from_seq: u64, size: usize) -> CommitBatches<'_> {
        let mut cursor = self.inner.backend.cursor(Space::Commits);
        cursor.seek(&keys::seq_key(from_seq));
        CommitBatches::new(cursor, size, self.visible())
    }

    /// A fetcher of records for [`RawCommits::into_committed`](crate::RawCommits::into_committed):
    /// it reads the records as they were when it was made (see [`Journal::commit_batches`]).
    #[must_use]
    pub fn record_fetcher(&self) -> RecordFetcher<'_> {
        RecordFetcher::new(
            self.inner.backend.as_ref(),
            crate::bulk::Positioned::new(self.inner.backend.lookup_cursor(Space::Events)),
        )
    }

    /// The queued, unacknowledged notifications in insertion order.
    pub fn outbox(&self) -> impl Iterator<Item = Result<Committed>> + '_ {
        let backend = self.inner.backend.as_ref();
        let durable = self.visible();
        backend
            .scan(Space::Outbox, Range::default())
            .take_while(move |item| below(item, durable))
            .map(move |item| {
                let (key, value) = item?;
                let (task, position) = keys::parse_event_key(&value)
                    .map_err(|kind| Error::malformed(Space::Outbox, &key, kind))?;
                Ok(Committed {
                    task: task.to_owned(),
                    record: read_unchained(backend, task, position)?,
                })
            })
    }

    /// The outbox's index entries whose enqueue sequence is above `after`, in insertion
    /// order: where each queued notification's record is, no record read. Sequences are
    /// given in commit order (on a shared journal too: under its writer lock), so a reader
    /// that remembers the last one it saw reads only what was queued since.
    pub fn outbox_entries(&self, after: u64) -> impl Iterator<Item = Result<OutboxEntry>> + '_ {
        let durable = self.visible();
        // No commit has the sequence u64::MAX (the sequences start at 1 and count up).
        let range = Range {
            lower: keys::seq_key(after.saturating_add(1)).to_vec(),
            ..Range::default()
        };
        self.inner
            .backend
            .scan(Space::Outbox, range)
            .take_while(move |item| below(item, durable))
            .map(|item| {
                let (key, value) = item?;
                let seq = keys::parse_seq_key(&key)
                    .map_err(|kind| Error::malformed(Space::Outbox, &key, kind))?;
                let (task, position) = keys::parse_event_key(&value)
                    .map_err(|kind| Error::malformed(Space::Outbox, &key, kind))?;
                Ok(OutboxEntry {
                    seq,
                    task: task.to_owned(),
                    position,
                })
            })
    }

    /// The notification queued by the enqueue record of sequence `seq`, read, while it is
    /// still in the outbox; `None` once it has been acknowledged (or was never queued).
    ///
    /// # Errors
    /// [`Error::Storage`] on I/O failure, [`Error::Corruption`] when the entry names a record
    /// that does not read back.
    pub fn queued(&self, seq: u64) -> Result<Option<Committed>> {
        if seq > self.visible() {
            return Ok(None);
        }
        let key = keys::seq_key(seq);
        let Some(value) = self.inner.backend.get(Space::Outbox, &key)? else {
            return Ok(None);
        };
        let (task, position) = keys::parse_event_key(&value)
            .map_err(|kind| Error::malformed(Space::Outbox, &key, kind))?;
        Ok(Some(Committed {
            task: task.to_owned(),
            record: read_unchained(self.inner.backend.as_ref(), task, position)?,
        }))
    }

    /// How many notifications are queued and unacknowledged (the outbox's backlog): its
    /// index entries counted, no record read.
    ///
    /// # Errors
    /// [`Error::Storage`] on I/O failure.
    pub fn outbox_len(&self) -> Result<u64> {
        let durable = self.visible();
        let mut n = 0;
        for item in self
            .inner
            .backend
            .scan(Space::Outbox, Range::default())
            .take_while(move |item| below(item, durable))
        {
            item?;
            n += 1;
        }
        Ok(n)
    }

    /// Tells the journal that its recovery has read what it needed, so that the memory the
    /// open's replay of the write-ahead log holds can go. Returns at once.
    ///
    /// After a crash, an embedded journal's open replays the log the crash left into its
    /// in-memory tables and leaves it there (writing it out first would make the open
    /// slower, with the recovery waiting): up to the log's 64 MiB cap. This starts writing
    /// those tables out to table files in the background; their memory and the log files are
    /// released when that is done (without it, only once the first appends fill the
    /// tables). `dtask_engine`'s `TaskStore::open` calls it once its recovery's fold is
    /// over; a service that recovers from the journal by itself calls it when it has read
    /// what it needed. Nothing read changes, and every record stays durable throughout.
    ///
    /// A no-op on a read-only journal, a follower, a PostgreSQL journal, and a journal with
    /// nothing in memory (after a clean close, the open replays nothing).
    ///
    /// ```
    /// # use dtask_journal::{Journal, JournalOptions};
    /// # let dir = tempfile::tempdir()?;
    /// let journal = Journal::open(dir.path(), JournalOptions::default())?;
    /// // … recovery: the live tasks folded …
    /// journal.release_replayed_log()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Storage`] when the store refuses to start the flush (a journal whose
    /// background work already failed).
    pub fn release_replayed_log(&self) -> Result<()> {
        self.inner.backend.flush_in_background()
    }

    /// Compacts the journal's storage now, on the calling thread (for a large journal, many
    /// seconds of both cores): the space of deleted records — a purge's — is given back at
    /// once instead of as compactions come due. `false` where the storage reclaims space by
    /// itself (PostgreSQL) or for a reader.
    ///
    /// # Errors
    /// [`Error::Storage`] on failure.
    pub fn compact_now(&self) -> Result<bool> {
        if self.is_read_only() {
            return Ok(false);
        }
        self.inner.backend.compact()
    }

    /// What the storage engine reports of itself now ([`crate::StorageStats`]): each column
    /// family's memtables, table files and compaction work owed, and whether writes are being
    /// slowed or stopped. `None` for a store that reports none (PostgreSQL). A writer, a
    /// read-only journal and a follower all answer (the latter two with no background work of
    /// their own: their memtables hold what they replayed from the log).
    ///
    /// # Errors
    /// [`Error::Storage`] when the store refuses to answer.
    pub fn storage_stats(&self) -> Result<Option<crate::StorageStats>> {
        self.inner.backend.storage_stats()
    }

    /// The global sequence of the last committed record (0 for an empty journal), as this
    /// journal's readers see it: on a journal open for writing, records written and not yet
    /// durable are not counted ([`Journal::durable_seq`]), so that a reader going on after
    /// it with [`Journal::commits`] misses no record.
    ///
    /// # Errors
    /// [`Error::Storage`] on I/O failure.
    pub fn last_seq(&self) -> Result<u64> {
        last_seq(self.inner.backend.as_ref(), self.visible())
    }

    /// Catches a follower up with its writer (see [`Journal::open_follower`]); a no-op for a
    /// writer or a read-only journal.
    ///
    /// # Errors
    /// [`Error::Storage`] when RocksDB cannot catch up; [`Error::FormatChanged`] when the
    /// writer upgraded the journal's format since the follower opened it, and
    /// [`Error::UnsupportedFormat`] when it is now newer than this build reads (one point
    /// read per catch-up).
    ///
    /// While a [`Frozen`] view of this follower is held, it does nothing: the view stays as
    /// it was when the frozen view was made.
    pub fn catch_up(&self) -> Result<()> {
        let frozen = self.inner.frozen_views();
        if *frozen > 0 {
            return Ok(());
        }
        self.inner.backend.catch_up()?;
        drop(frozen);
        // A journal opened at an older format may have been upgraded under this reader; a
        // follower is asked whatever format it opened: a writer of a newer build may have
        // upgraded the journal past this build's (new event types, a new meaning of old
        // bytes), and a follower that read on would fail at each new record or misread it.
        if self.inner.format < JOURNAL_FORMAT_VERSION || self.inner.backend.is_secondary() {
            let now = stored_format(self.inner.backend.as_ref())?;
            if now > JOURNAL_FORMAT_VERSION {
                return Err(Error::UnsupportedFormat {
                    found: now,
                    supported: JOURNAL_FORMAT_VERSION,
                });
            }
            if now != self.inner.format {
                return Err(Error::FormatChanged {
                    opened: self.inner.format,
                    now,
                });
            }
        }
        Ok(())
    }

    /// A view of this journal that does not move while it is held: what a reader that makes
    /// several passes over the journal — an audit, over the streams and then the indexes —
    /// reads while the journal is written, so that every pass sees the same moment.
    ///
    /// - A journal open for writing (embedded): a read-only copy of it as it stands now,
    ///   every record written before the call in it and made durable before this returns
    ///   (one sync). The copy links the journal's table files and copies its log, in a
    ///   temporary directory inside the journal's, removed when the view is dropped (or, after
    ///   a crash, at the journal's next open for writing).
    /// - A follower ([`Journal::open_follower`]): the follower itself, whose
    ///   [`Journal::catch_up`] does nothing while the view is held.
    /// - A PostgreSQL journal: a read-only view over one connection of its own, in a
    ///   `REPEATABLE READ` transaction whose snapshot every read of the view reads, its rows
    ///   made durable before this returns; should the connection break, every later read of
    ///   the view fails.
    /// - A journal opened read-only (embedded), whose view never moves: itself.
    ///
    /// ```
    /// use dtask_journal::{Event, Journal, JournalOptions, Timestamp};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let journal = Journal::open(dir.path(), JournalOptions::default())?;
    /// let frozen = journal.frozen()?;
    /// journal.append("t", 0, &[Event::Heartbeat { lease_deadline: Timestamp(1), at: Timestamp(0) }])?;
    /// // The view stands where it was made.
    /// assert_eq!(frozen.journal().last_seq()?, 0);
    /// assert_eq!(journal.last_seq()?, 1);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Storage`] when the copy, its sync or its open failed.
    pub fn frozen(&self) -> Result<Frozen> {
        let backend = self.inner.backend.as_ref();
        if backend.is_secondary() {
            *self.inner.frozen_views() += 1;
            return Ok(Frozen {
                journal: self.clone(),
                holds_follower: true,
                _copy: None,
            });
        }
        if let Some(view) = backend.frozen_view()? {
            return Ok(Frozen {
                journal: Self::with_backend(view, self.inner.options.clone())?,
                holds_follower: false,
                _copy: None,
            });
        }
        match backend.frozen_copy()? {
            Some(dir) => Ok(Frozen {
                journal: Self::open_read_only(dir.path().join(crate::backend::FROZEN_COPY_NAME))?,
                holds_follower: false,
                _copy: Some(dir),
            }),
            None => Ok(Frozen {
                journal: self.clone(),
                holds_follower: false,
                _copy: None,
            }),
        }
    }

    /// A reader of many task streams in one forward pass over the journal (see
    /// [`StreamScanner`]): the bulk counterpart of [`Journal::read_stream`], for recovery and
    /// audits. It reads every record stored, durable or not yet (an audit holds the streams
    /// against the heads, which count both); [`Journal::visible_stream_scanner`] reads what
    /// `read_stream` reads.
    #[must_use]
    pub fn stream_scanner(&self) -> StreamScanner<'_> {
        StreamScanner::new(self.inner.backend.as_ref(), u64::MAX)
    }

    /// A [`Journal::stream_scanner`] whose streams end where [`Journal::read_stream`]'s do:
    /// of a journal open for writing, before the first record above the durable watermark
    /// ([`Journal::durable_seq`]), which this process's readers do not see yet. For listings
    /// and counts that fold every task as a reader shows it.
    #[must_use]
    pub fn visible_stream_scanner(&self) -> StreamScanner<'_> {
        StreamScanner::new(self.inner.backend.as_ref(), self.visible())
    }

    /// Visits the entries of the `commits` index in key order, for index checks that need no
    /// record: each entry's sequence (`None` when its key is malformed) and the event key it
    /// names, as stored (opaque bytes, to be hashed with [`crate::PairHash::add`] and compared with
    /// the records' pairs from [`crate::TaskPairs`]).
    ///
    /// # Errors
    /// [`Error::Storage`] when the index cannot be read.
    pub fn for_each_commit_entry(&self, visit: &mut dyn FnMut(Option<u64>, &[u8])) -> Result<()> {
        let mut cursor = self.inner.backend.cursor(Space::Commits);
        cursor.seek(&[]);
        while let (Some(key), Some(value)) = (cursor.key(), cursor.value()) {
            visit(keys::parse_seq_key(key).ok(), value);
            cursor.next();
        }
        cursor.status()
    }

    /// The tail marker as stored now ([`Tail`]); `None` for a journal of a format before 3.
    ///
    /// # Errors
    /// [`Error::Corruption`] when the marker is unreadable, [`Error::Storage`] on I/O failure.
    pub fn read_tail(&self) -> Result<Option<Tail>> {
        read_tail(self.inner.backend.as_ref())
    }

    /// Checks the live tasks a recovery found — every task of the `live` index with records,
    /// summed up with their heads ([`LiveSummary::add`]) — against the tail marker: the one
    /// read when the journal was opened or, when it was appended to since, the one its last
    /// batch wrote. Call it with no append in flight: the marker moves with every batch.
    ///
    /// # Errors
    /// [`Error::Inconsistent`] ([`Inconsistency::LiveTasks`]) when they differ: a `live`
    /// entry was lost or added, or a live task's last record was lost or added.
    ///
    /// On a shared database (PostgreSQL) the check is skipped: other processes move the
    /// marker while the recovery reads; `verify` checks it.
    pub fn check_live(&self, found: &LiveSummary) -> Result<()> {
        if self.inner.backend.is_shared() {
            return Ok(());
        }
        let Some(opened) = self.inner.opened_tail else {
            return Ok(());
        };
        // Appended to since the open (a service that wrote before it recovered its tasks):
        // the marker as the last batch left it, which the streams read now agree with.
        let tail = if self.durable_seq() > opened.last_seq {
            self.read_tail()?.unwrap_or(opened)
        } else {
            opened
        };
        if tail.live == *found {
            return Ok(());
        }
        Err(Inconsistency::LiveTasks {
            marker: tail.live.tasks,
            found: found.tasks,
            digest_differs: tail.live.digest != found.digest,
        }
        .into_error())
    }

    /// Rewrites the `live` index to list exactly `live` — the tasks without a terminal event
    /// and their heads, as a fold of every stream found them — when they sum up to the tail
    /// marker read at open: the marker was written with the records, so if the streams agree
    /// with it and the index does not, the index is what was damaged, and it is derived from
    /// the streams. Anything else is refused, nothing written. Only before the first append.
    ///
    /// # Errors
    /// [`Error::Inconsistent`] when `live` does not sum up to the marker (the streams
    /// themselves lost or gained records: not repaired here); [`Error::ReadOnly`];
    /// [`Error::Storage`] after the first append or on I/O failure.
    pub fn repair_live_index(&self, live: &[(String, Head)]) -> Result<LiveRepair> {
        let backend = self.inner.backend.as_ref();
        if backend.read_only() {
            return Err(Error::ReadOnly);
        }
        let found = LiveSummary::of(live.iter().map(|(task, head)| (task.as_str(), head)));
        self.check_live(&found)?;
        if !self.inner.shared.prime(std::iter::empty()) {
            return Err(Error::storage(
                "the live index can only be repaired before the first append",
            ));
        }
        let mut listed = std::collections::BTreeSet::new();
        for item in backend.scan(Space::Live, Range::default()) {
            let (key, _) = item?;
            listed.insert(key.into_vec());
        }
        let mut repair = LiveRepair::default();
        let mut ops = Vec::new();
        for (task, _) in live {
            let key = keys::task_key(task);
            if !listed.remove(&key) {
                repair.added.push(task.clone());
                ops.push(BatchOp::Put {
                    space: Space::Live,
                    key: key.into(),
                    value: OpBytes::new(),
                });
            }
        }
        for key in listed {
            repair
                .removed
                .push(String::from_utf8_lossy(&key).into_owned());
            ops.push(BatchOp::Delete {
                space: Space::Live,
                key: key.into(),
            });
        }
        if !ops.is_empty() {
            backend.write(ops, crate::Durability::Sync)?;
        }
        Ok(repair)
    }

    /// Up to `max` keys the journal's layout has no place for: in the `meta` space, any but
    /// [`keys::META_KEYS`]; in the store's own spaces outside the journal's (RocksDB's default
    /// column family). Each as (space name, key).
    ///
    /// # Errors
    /// [`Error::Storage`] on I/O failure.
    pub fn foreign_keys(&self, max: usize) -> Result<Vec<(&'static str, Vec<u8>)>> {
        let backend = self.inner.backend.as_ref();
        let mut found = Vec::new();
        for item in backend.scan(Space::Meta, Range::default()) {
            let (key, _) = item?;
            if found.len() < max && !keys::META_KEYS.contains(&&*key) {
                found.push((Space::Meta.name(), key.to_vec()));
            }
        }
        let rest = max - found.len();
        found.extend(
            backend
                .foreign_keys(rest)?
                .into_iter()
                .map(|key| ("default", key)),
        );
        Ok(found)
    }

    /// Whether format 1's `heads` space is still present (a format-1 journal not yet opened
    /// for writing, or an upgrade cut short).
    #[must_use]
    pub fn has_legacy_heads(&self) -> bool {
        self.inner.backend.has_legacy_heads()
    }

    /// The raw bytes of one record, for tools that inspect damage.
    ///
    /// # Errors
    /// [`Error::Storage`] on I/O failure.
    pub fn raw_record(&self, task: &str, position: u64) -> Result<Option<Vec<u8>>> {
        self.inner
            .backend
            .get(Space::Events, &keys::event_key(task, position))
    }
}

/// Whether an asynchronous caller's thread may block for one sync: only a worker of a
/// multi-threaded tokio runtime, whose other workers can take over its queued tasks
/// meanwhile — not a current-thread runtime, which would stall, nor an unknown executor.
/// Asked only when the journal is idle: it takes a reference to the runtime.
fn may_block_async() -> bool {
    multi_threaded_runtime().is_some()
}

/// The runtime of the calling thread, if it is a multi-threaded one.
fn multi_threaded_runtime() -> Option<tokio::runtime::Handle> {
    tokio::runtime::Handle::try_current()
        .ok()
        .filter(|handle| handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Refuses to block: the job goes to the writer thread.
pub(crate) fn never() -> bool {
    false
}

/// What a journal's writer can do now ([`Journal::write_state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteState {
    /// Its last batch was written, or none has been tried.
    Writing,
    /// Its last batch failed for want of room ([`Error::is_no_space`]) and none has been
    /// written since. Nothing of a refused batch is written; appends succeed again once there
    /// is room (a RocksDB journal resumes by itself).
    DiskFull,
    /// Its last batch failed for another reason (an I/O error, a database out of reach) and
    /// none has been written since: each refused append's error says why. The next batch is
    /// tried as usual.
    Failing,
    /// It stopped after a failed sync ([`Error::Stopped`], with why): what the sync covered
    /// may or may not be on stable storage, every append is refused, and only reopening the
    /// journal (a restart of the process) reads what really reached the disk.
    Stopped(String),
    /// It was opened read-only or as a follower: it writes nothing.
    ReadOnly,
}

/// A view of a journal that does not move while it is held ([`Journal::frozen`]).
#[derive(Debug)]
pub struct Frozen {
    /// The view (dropped before the copy it reads is removed).
    journal: Journal,
    /// Whether this view holds a follower still.
    holds_follower: bool,
    /// The temporary directory of the copy, if the view is one.
    _copy: Option<tempfile::TempDir>,
}

impl Frozen {
    /// The journal as it stood when the view was made.
    #[must_use]
    pub fn journal(&self) -> &Journal {
        &self.journal
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if self.holds_follower {
            *self.journal.inner.frozen_views() -= 1;
        }
    }
}

/// What [`Journal::repair_live_index`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveRepair {
    /// Tasks without a terminal event that the `live` index had lost.
    pub added: Vec<String>,
    /// Entries that named no live task (a terminal task, no task, a malformed key).
    pub removed: Vec<String>,
}

impl LiveRepair {
    /// Whether nothing was changed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

/// An append submitted to the journal's writer ([`Journal::submit_linked_async`]): a future
/// of its outcome. The append does not depend on it: dropped, only the outcome is lost.
#[derive(Debug)]
#[must_use = "the append is written either way; its outcome is only known by awaiting this"]
pub struct PendingAppend {
    reply: oneshot::Receiver<Result<Appended>>,
}

impl std::future::Future for PendingAppend {
    type Output = Result<Appended>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.reply)
            .poll(cx)
            .map(|reply| reply.map_err(|_| Error::Closed)?)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod storage_tests {
    //! How the journal sets RocksDB up: compactions wait for the first append; after
    //! flushes, a follower and a crash image see exactly what was written (log files are not
    //! reused: see `backend::db_options`).
    use super::*;
    use crate::event::Timestamp;
    use crate::record::Record;

    const TASKS: usize = 8;

    fn update(i: u64, bytes: usize) -> Event {
        Event::UpdateAppended {
            attempt: 1,
            event_id: format!("e{i}"),
            kind: "progress".into(),
            data: vec![u8::try_from(i % 251).unwrap(); bytes],
            metadata: vec![],
            at: Timestamp(i),
        }
    }

    /// The directory as a process crash leaves it (no write is in progress meanwhile).
    fn crash_image(from: &Path, to: &Path) {
        for entry in std::fs::read_dir(from).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
            }
        }
    }

    fn assert_streams(journal: &Journal, lengths: &[u64]) {
        for (t, &length) in lengths.iter().enumerate() {
            let task = format!("t{t}");
            let records: Vec<Record> = journal
                .read_stream(&task, 0)
                .collect::<Result<_>>()
                .unwrap();
            assert_eq!(records.len() as u64, length, "{task}");
            for (position, record) in records.iter().enumerate() {
                assert_eq!(record.position, position as u64, "{task}");
            }
        }
    }

    fn level0_files(backend: &RocksBackend) -> u64 {
        backend.level0_files(Space::Events).unwrap()
    }

    /// A writable journal opens with compactions off, so that recovery's reads are not
    /// slowed by a compaction due at open; the first append turns them on.
    #[test]
    fn compactions_wait_for_the_first_append() {
        let dir = tempfile::tempdir().unwrap();
        // A new journal opens with them on (nothing to compact yet): made, then reopened.
        drop(RocksBackend::open(dir.path(), OpenMode::Primary).unwrap());
        {
            // Six level-0 files, more than the four that make a compaction due.
            let backend = RocksBackend::open(dir.path(), OpenMode::Primary).unwrap();
            backend
                .write(
                    vec![version_stamp(), tail_put(&Tail::default())],
                    crate::Durability::Sync,
                )
                .unwrap();
            for round in 0..6u64 {
                backend
                    .write(
                        vec![crate::backend::BatchOp::Put {
                            space: Space::Events,
                            key: keys::event_key("t", round).into(),
                            value: vec![1; 100].into(),
                        }],
                        crate::Durability::Buffered,
                    )
                    .unwrap();
                backend.flush().unwrap();
            }
            assert_eq!(level0_files(&backend), 6);
        }
        let backend = Arc::new(RocksBackend::open(dir.path(), OpenMode::Primary).unwrap());
        let journal = Journal::with_backend(backend.clone(), JournalOptions::default()).unwrap();
        // Reads (what recovery does) leave them alone.
        assert_eq!(journal.live_tasks().count(), 0);
        assert_eq!(
            level0_files(&backend),
            6,
            "no compaction before the first append"
        );
        journal.append("u", 0, &[update(0, 10)]).unwrap();
        backend.wait_for_compactions().unwrap();
        assert!(
            level0_files(&backend) < 4,
            "the first append turns compactions on"
        );
    }

    #[test]
    fn after_flushes_a_follower_and_a_crash_image_see_every_record() {
        let dir = tempfile::tempdir().unwrap();
        // Created (with its format version) by `open`, then reopened on a backend the test
        // keeps a handle of.
        drop(Journal::open(dir.path(), JournalOptions::default()).unwrap());
        let backend = Arc::new(RocksBackend::open(dir.path(), OpenMode::Primary).unwrap());
        let journal = Journal::with_backend(backend.clone(), JournalOptions::default()).unwrap();
        let mut lengths = vec![0u64; TASKS];
        let mut append = |journal: &Journal, rounds: usize, bytes: usize| {
            for _ in 0..rounds {
                for (t, length) in lengths.iter_mut().enumerate() {
                    journal
                        .append(&format!("t{t}"), *length, &[update(*length, bytes)])
                        .unwrap();
                    *length += 1;
                }
            }
        };
        // Large records, and a flush after each round: every flush switches to a new log.
        for _ in 0..6 {
            append(&journal, 20, 2_000);
            backend.flush().unwrap();
        }
        // A few small records in the current log (were it a reused file, its tail would hold
        // large old ones).
        append(&journal, 2, 10);
        // Files copied one by one are a crash image only while none changes: no compaction
        // may run meanwhile.
        backend.wait_for_compactions().unwrap();
        let image = tempfile::tempdir().unwrap();
        crash_image(dir.path(), image.path());
        let lengths = lengths.clone();

        let scratch = tempfile::tempdir().unwrap();
        let follower = Journal::open_follower(dir.path(), scratch.path()).unwrap();
        assert_streams(&follower, &lengths);
        drop(follower);
        drop(journal);

        let recovered = Journal::open(image.path(), JournalOptions::default()).unwrap();
        assert_streams(&recovered, &lengths);
        assert_eq!(recovered.last_seq().unwrap(), lengths.iter().sum::<u64>());
        // And the recovered journal goes on from there.
        recovered.append("t0", lengths[0], &[update(0, 1)]).unwrap();
    }
}

//! The journal on PostgreSQL: the same records, byte for byte, in a database that many dtask
//! processes on many machines share.
//!
//! [`PgBackend`] is a [`Backend`]: the journal's key spaces are tables whose primary keys keep
//! the keys' order (module `rows`), so every reader of the journal — streams, the commit order,
//! the live index, the outbox, the audit's bulk readers — works on it unchanged, and the
//! framing, the chain digest and the CRC are the embedded journal's. What differs is who
//! decides: the database. Each batch of the group-commit writer is one transaction that
//! first takes the journal's writer lock, an advisory lock of the transaction
//! ([`Backend::lock_for_write`]), reads the tail
//! marker the last writer of any process committed and the tasks written since this
//! writer's last batch (in the same round trip), checks every append's expected position
//! against the heads as committed, and writes the records, the indexes and the new tail (one
//! call of the function `dtask_write_batch`, module `write`) — then commits. The lock is
//! held until that commit, so the global sequences are handed out in commit order, without
//! gaps: a reader of the commit order that has seen sequence `n` has seen every record
//! before it (see `docs/postgres.md`).
//!
//! The writer's commits do not wait for the database's flush: [`PgBackend::sync`], on the
//! syncer's connection, makes them durable after (`write::flush`: on a session opened since
//! the commit, the server may have restarted, and it finds the last record committed again
//! first), and only then are the appends acknowledged — the write and the
//! sync of the embedded journal, as two stages (docs/ARCHITECTURE.md, "Why a PostgreSQL
//! batch is flushed after its commit").
//!
//! Connections run on threads of their own (module `conn`); the schema is created and migrated by
//! the first open ([`schema`]).

pub mod admin;
mod conn;
mod durable;
mod listen;
mod location;
pub mod probe;
mod read;
pub(crate) mod rows;
pub mod schema;
mod tls;
mod unflushed;
pub(crate) mod write;

use crate::backend::{
    Backend, BatchOp, CommitFlush, KeyValue, LastRecord, Range, RawIter, WriteLock,
    WRITTEN_SINCE_MAX,
};
use crate::error::{Error, Result};
use crate::keys::Space;
use crate::options::Durability;
use conn::{Conn, Reopen, Target};
use read::{Scan, LAST_SEQ};
use rows::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio_postgres::types::Type;
use unflushed::{Mark, Unflushed};
use write::{write_and_commit, Flush};

pub use location::PgLocation;
pub use schema::SCHEMA_VERSION;

/// Reader connections per open journal.
const READERS: usize = 4;

/// The PostgreSQL backend.
pub struct PgBackend {
    location: PgLocation,
    readers: Vec<Conn>,
    next_reader: AtomicUsize,
    /// The connection of the writer's locked batches (`None` read-only). Its session does not
    /// wait for the flush at commit ([`PgBackend::sync`] does).
    writer: Option<Conn>,
    /// The connection of [`PgBackend::sync`] (`None` read-only).
    syncer: Option<Conn>,
    /// Whether an acknowledged append must be durable ([`Durability::Sync`]).
    synchronous: bool,
    /// The last records of the writer's commits no sync has made durable yet (module
    /// `unflushed`).
    unflushed: std::sync::Mutex<Unflushed>,
    /// How many calls of the writer's connection failed: a commit after one may be on a new
    /// session, and its mark covers none before it ([`Mark::session`]).
    writer_failures: AtomicU64,
    /// Whether the writer's connection holds the writer lock (a batch is open).
    locked: AtomicBool,
    /// Whether a call of the writer's failed where the writer does not hear of it (the
    /// rollback of [`Backend::unlock_write`]): its next call fails instead, so that the writer
    /// hears of every failure of its connection (see [`Reopen::Loudly`]).
    unheard: AtomicBool,
    /// Opened read-only, or the durable reader of a writable open ([`PgBackend::twin`]): its
    /// reads return only rows the database has made durable (module `durable`).
    read_only: bool,
    /// The last sequence known durable: what a read-only open's reads check against (module
    /// `durable`); shared by a writable open with its twin, whose syncs move it.
    durable_seq: Arc<std::sync::atomic::AtomicU64>,
    /// A frozen view ([`Backend::frozen_view`]): its one reader reads one snapshot, whose
    /// rows were all made durable when it was taken.
    frozen: bool,
    /// The schema's version as the open found it, or made it ([`schema::migrate`]).
    schema_version: u32,
    /// How connections are opened (for the listener, started on first use).
    target: Target,
    listener: Arc<std::sync::OnceLock<Option<listen::Listener>>>,
}

impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackend")
            .field("location", &self.location.display)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

impl PgBackend {
    /// Connects, creating or migrating the schema unless `read_only` (a new schema gets the
    /// `seed` rows of `dtask_meta` in the same transaction).
    ///
    /// # Errors
    /// [`Error::Storage`] naming the server and the cause when it cannot be reached;
    /// [`Error::UnsupportedSchema`] for a newer schema; [`Error::NotAJournal`] read-only on a
    /// database without a journal.
    pub(crate) fn open(
        location: PgLocation,
        read_only: bool,
        durability: Durability,
        seed: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<Self> {
        let target = Target::of(&location, durability == Durability::Sync);
        let reading = Target {
            custom_plans: true,
            ..target.clone()
        };
        let first = Conn::open(reading.clone(), "reader-0")?;
        let schema_version = schema::migrate(&first, &location.schema, read_only, seed)?;
        let mut readers = vec![first];
        for i in 1..READERS {
            readers.push(Conn::open(reading.clone(), &format!("reader-{i}"))?);
        }
        let (writer, syncer) = if read_only {
            (None, None)
        } else {
            // The writer's commits return without waiting for the flush; the syncer's wait.
            // The writer's session holds the writer lock between its round trips: the server
            // ends it once it sits idle in a transaction for longer than a batch ever does.
            let unflushed = Target {
                synchronous: false,
                idle_in_transaction: Some(LOCK_IDLE_MAX),
                ..target.clone()
            };
            (
                Some(Conn::open_here(unflushed, "writer", Reopen::Loudly)?),
                Some(Conn::open_here(target.clone(), "syncer", Reopen::Quietly)?),
            )
        };
        Ok(Self {
            location,
            readers,
            next_reader: AtomicUsize::new(0),
            writer,
            syncer,
            synchronous: durability == Durability::Sync,
            unflushed: std::sync::Mutex::default(),
            writer_failures: AtomicU64::new(0),
            locked: AtomicBool::new(false),
            unheard: AtomicBool::new(false),
            read_only,
            durable_seq: Arc::default(),
            frozen: false,
            schema_version,
            target,
            listener: Arc::default(),
        })
    }

    /// The durable reader of this writable open ([`Backend::durable_reader`]): read-only,
    /// over the same reader connections and listener, its reads checked as a read-only
    /// open's (module `durable`). It shares the last sequence known durable with this open,
    /// whose syncs move it: the rows this node made durable cost its reads nothing more.
    fn twin(&self) -> Self {
        Self {
            location: self.location.clone(),
            readers: self.readers.clone(),
            next_reader: AtomicUsize::new(0),
            writer: None,
            syncer: None,
            synchronous: self.synchronous,
            unflushed: std::sync::Mutex::default(),
            writer_failures: AtomicU64::new(0),
            locked: AtomicBool::new(false),
            unheard: AtomicBool::new(false),
            read_only: true,
            durable_seq: Arc::clone(&self.durable_seq),
            frozen: false,
            schema_version: self.schema_version,
            target: self.target.clone(),
            listener: Arc::clone(&self.listener),
        }
    }

    /// A read-only view of the journal as it stands now: one connection of its own in a
    /// `REPEATABLE READ READ ONLY` transaction, whose snapshot every read of the view reads;
    /// the rows in it made durable before this returns. The connection is never opened again:
    /// once it breaks, every read fails.
    fn frozen(&self) -> Result<Self> {
        let reading = Target {
            custom_plans: true,
            ..self.target.clone()
        };
        let conn = Conn::open_with(reading, "frozen", Reopen::Never)?;
        conn.call(|client| {
            Box::pin(async move {
                // The snapshot is taken by the transaction's first statement.
                client
                    .batch_execute(
                        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT 1 FROM dtask_schema LIMIT 1",
                    )
                    .await
            })
        })?;
        // Every commit the snapshot sees was made before this: made durable now, on another
        // session (module `durable`).
        let seq = self
            .reader()
            .call(|client| Box::pin(async move { durable::last_seq(&client, LAST_SEQ).await }))?;
        Ok(Self {
            readers: vec![conn],
            durable_seq: Arc::new(std::sync::atomic::AtomicU64::new(seq)),
            frozen: true,
            ..self.twin()
        })
    }

    /// Where the journal is.
    #[must_use]
    pub fn location(&self) -> &PgLocation {
        &self.location
    }
}

/// How long the writer's session may sit idle in the transaction that holds the writer lock
/// before the server ends the session (`idle_in_transaction_session_timeout`), releasing the
/// lock: a node that froze, or lost the network, with the lock held stops every node's
/// writes for at most this long. A batch holds the lock idle only between its round trips
/// (the lock with the reads, perhaps a read of the heads it lacks, the write and commit) and
/// its framing, far less; one that takes longer fails with a storage error, as after a lost
/// connection, and the next batch reads the tail again. Statements themselves are not
/// bounded (the server's `statement_timeout` is off for every session of the journal).
pub(crate) const LOCK_IDLE_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// The most record bytes the writer puts in one batch ([`Backend::max_batch_bytes`]): a
/// batch's records travel in one parameter of one call, and the server refuses a message of
/// more than 1 GB — which would fail every append of the batch. A batch of this size is far
/// past the point where a larger one saves anything; the appends past it wait for the next.
const MAX_BATCH_BYTES: usize = 64 << 20;

/// How long [`PgBackend::sync`] tries its round trip again before it gives up: long enough
/// to ride out a restart of the database (a connection the server dropped fails one call and
/// is open again for the next; while the server is down, none opens). Its commits were
/// acknowledged by the server, and a restart that flushed them (PostgreSQL's fast and smart
/// shutdowns write the whole log) keeps them: they are found again, flushed and acknowledged,
/// instead of failing appends whose records are there.
const FLUSH_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// The longest pause between two tries of [`PgBackend::sync`] (the first ones follow each
/// other at once, then 10 ms, doubling up to this).
const FLUSH_PAUSE_MAX: std::time::Duration = std::time::Duration::from_millis(500);

/// How a batch of the writer's commits.
struct Commit {
    /// Its last record, for the sync to find again (`None`: it waits for the flush at
    /// commit, or nothing waits for a flush).
    mark: Option<Mark>,
    /// Its `NOTIFY`'s payload, sent at commit when no sync sends it.
    notice: Option<String>,
    /// Whether its commit waits for the flush.
    flush: Flush,
}

impl PgBackend {
    /// How the batch of `ops` commits. With [`Durability::Sync`] a batch with records to be
    /// made durable [`CommitFlush::AtSync`] does not wait for the flush: [`PgBackend::sync`]
    /// makes it durable, finding its last record again, and announces it; any other waits at
    /// commit. Otherwise every commit is as the session's, and announced at commit.
    fn commit_of(&self, ops: &[BatchOp], flush: CommitFlush) -> Result<Commit> {
        let mark = if self.synchronous && flush == CommitFlush::AtSync {
            last_record(ops)?.map(|mark| Mark {
                // Read before the commit is sent: a session open before it.
                syncer_session: self.syncer.as_ref().map_or(0, Conn::session),
                ..mark
            })
        } else {
            None
        };
        Ok(match mark {
            Some(mark) => Commit {
                mark: Some(mark),
                notice: None,
                flush: Flush::AsTheSession,
            },
            None => Commit {
                mark: None,
                notice: self.notice(ops),
                flush: if self.synchronous {
                    Flush::AtCommit
                } else {
                    Flush::AsTheSession
                },
            },
        })
    }

    /// The writer's connection, failing once if a call of it failed unheard.
    fn writer(&self) -> Result<&Conn> {
        let writer = self.writer.as_ref().ok_or(Error::ReadOnly)?;
        if self.unheard.swap(false, Ordering::AcqRel) {
            return Err(Error::storage(
                "the writer's connection to PostgreSQL failed; this call was not sent",
            ));
        }
        Ok(writer)
    }

    /// Runs `work` on the writer's connection, counting a failure: the connection may be
    /// open again on a new session after it ([`Reopen::Loudly`]).
    fn call_writer<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(
                Arc<conn::Session>,
            ) -> conn::BoxFuture<std::result::Result<T, tokio_postgres::Error>>
            + Send
            + 'static,
    {
        let answer = self.writer().and_then(|writer| writer.call(work));
        if answer.is_err() {
            self.writer_failures.fetch_add(1, Ordering::AcqRel);
        }
        answer
    }

    /// Notes `mark`, the last record of a batch just committed on the writer's session, as
    /// not yet flushed.
    fn note_unflushed(&self, mark: Option<Mark>) {
        if let Some(mut mark) = mark {
            mark.session = self.writer_failures.load(Ordering::Acquire);
            self.unflushed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .note(mark);
        }
    }

    /// Makes the commit of `mark` durable, and every commit the server wrote before it, over
    /// `syncer`; then announces its sequence. On the syncer's session that was open before
    /// the commit ([`Mark::syncer_session`]) the server has not restarted since, and the
    /// commit is there whatever another node did to its record since (trimmed, purged); on a
    /// later session, only if its record is still there as committed. Tried again for up to
    /// [`FLUSH_PATIENCE`] while the round trip fails.
    ///
    /// # Errors
    /// [`Error::Storage`] when the record is gone from a server that may have restarted
    /// since the commit (it lost it), or when no round trip went through in time.
    fn flush(&self, syncer: &Conn, mark: &Arc<Mark>) -> Result<()> {
        let payload = listen::payload(&self.location.schema, mark.seq);
        let deadline = std::time::Instant::now() + FLUSH_PATIENCE;
        let mut pause = std::time::Duration::ZERO;
        let mut failed = None;
        loop {
            if failed.is_some() {
                if std::time::Instant::now() + pause > deadline {
                    break;
                }
                std::thread::sleep(pause);
                pause = (pause * 2)
                    .max(std::time::Duration::from_millis(10))
                    .min(FLUSH_PAUSE_MAX);
            }
            let (sent, payload) = (Arc::clone(mark), payload.clone());
            let found = syncer.call(move |client| {
                Box::pin(async move {
                    // The same session since before the commit: the server ran through, if
                    // the server process answering is still the one it began with.
                    let backend =
                        (client.id() == sent.syncer_session).then(|| client.backend_pid());
                    let record = (sent.task.as_str(), sent.position, sent.record.as_slice());
                    write::flush(&client, record, backend, &payload).await
                })
            });
            match found {
                Ok(true) => {
                    // Every commit up to the mark's is flushed with it (sequences are
                    // committed in order).
                    self.durable_seq.fetch_max(mark.seq, Ordering::AcqRel);
                    if let Some(e) = failed {
                        tracing::info!(
                            failed = %e,
                            "the journal's flush on PostgreSQL at {} went through after it failed",
                            self.location.display
                        );
                    }
                    return Ok(());
                }
                Ok(false) => {
                    return Err(Error::storage(format!(
                        "the record of {} at {} (sequence {}), committed and not yet flushed, \
                         is gone from PostgreSQL at {} (a connection was lost since the \
                         commit): the server lost what it had not flushed, unless another node \
                         trimmed or purged the task meanwhile",
                        mark.task, mark.position, mark.seq, self.location.display
                    )))
                }
                Err(e) => {
                    if failed.is_none() {
                        tracing::warn!(
                            error = %e,
                            "the journal's flush on PostgreSQL at {} failed; trying again for up \
                             to {} s",
                            self.location.display,
                            FLUSH_PATIENCE.as_secs()
                        );
                    }
                    failed = Some(e);
                }
            }
        }
        let why = failed.map_or_else(|| "no flush was tried".to_owned(), |e| e.to_string());
        Err(Error::storage(format!(
            "cannot flush the journal's commits on PostgreSQL at {} (tried for {} s): {why}",
            self.location.display,
            FLUSH_PATIENCE.as_secs()
        )))
    }

    /// The payload of the `NOTIFY` of a batch that moves the tail (other processes' listeners
    /// hear of it when it commits): `None` for a batch that does not.
    fn notice(&self, ops: &[BatchOp]) -> Option<String> {
        let last_seq = ops.iter().find_map(|op| match op {
            BatchOp::Put {
                space: Space::Meta,
                key,
                value,
            } if key.as_slice() == crate::keys::META_TAIL => {
                crate::tail::Tail::decode(value).ok().map(|t| t.last_seq)
            }
            _ => None,
        })?;
        Some(listen::payload(&self.location.schema, last_seq))
    }
}

/// The record of `ops` with the highest sequence, as a [`Mark`].
fn last_record(ops: &[BatchOp]) -> Result<Option<Mark>> {
    let mut last: Option<(u64, &[u8], &[u8])> = None;
    for op in ops {
        if let BatchOp::Put {
            space: Space::Events,
            key,
            value,
        } = op
        {
            let seq = crate::record::seq_of(value)
                .ok_or_else(|| Error::storage("a record without a sequence"))?;
            if last.is_none_or(|(most, _, _)| seq > most) {
                last = Some((seq, key.as_slice(), value.as_slice()));
            }
        }
    }
    last.map(|(seq, key, record)| {
        let (task, position) = rows::event_row(key)?;
        Ok(Mark {
            task,
            position,
            seq,
            record: record.to_vec(),
            // Set when the batch has committed (`note_unflushed`).
            session: 0,
            // Set before it is sent (`commit_of`).
            syncer_session: 0,
        })
    })
    .transpose()
}

/// The heads' lookup: each task of `$1`, in order, with its last record and whether it is
/// live. Planned each time (sent unnamed): a plan cached while `dtask_live` was small would
/// scan it whole once it has grown.
const HEADS: &str = "SELECT t.task, r.position, r.record, l.task IS NOT NULL \
     FROM unnest($1::text[]) WITH ORDINALITY AS t(task, i) \
     LEFT JOIN LATERAL (SELECT position, record FROM dtask_records \
         WHERE task = t.task ORDER BY position DESC LIMIT 1) r ON true \
     LEFT JOIN dtask_live l ON l.task = t.task \
     ORDER BY t.i";

/// A task and its last record as a row of the heads' lookup reads them: task, position and
/// record (both null for a task without records), and whether the task is live.
fn last_record_of(row: &tokio_postgres::Row) -> Result<(String, LastRecord)> {
    let err = |e: tokio_postgres::Error| conn::storage(&e);
    let task: String = row.try_get(0).map_err(err)?;
    let position: Option<i64> = row.try_get(1).map_err(err)?;
    let record: Option<Vec<u8>> = row.try_get(2).map_err(err)?;
    let live: bool = row.try_get(3).map_err(err)?;
    let last = position.zip(record).map(|(position, record)| {
        (
            (
                rows::event_key(&task, position).into_boxed_slice(),
                record.into_boxed_slice(),
            ),
            live,
        )
    });
    Ok((task, last))
}

impl Backend for PgBackend {
    fn write(&self, ops: Vec<BatchOp>, durability: Durability) -> Result<()> {
        let _ = durability;
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        // A write outside the writer's batches (the format stamp, a repair) takes the writer
        // lock too: no writer of another process runs beside it.
        let notice = self.notice(&ops);
        let params = write::batch_call(ops, None, Flush::AsTheSession, notice)?;
        self.reader()
            .call(move |client| Box::pin(async move { write::call(&client, &params).await }))
    }

    fn write_expecting(
        &self,
        ops: Vec<BatchOp>,
        expected: &[u8],
        flush: CommitFlush,
    ) -> Result<bool> {
        // The call is a transaction of its own only outside one: a locked batch left open
        // (its write never sent) ends here, rather than holding this call uncommitted.
        self.unlock_write();
        let commit = self.commit_of(&ops, flush)?;
        let params = write::batch_call(ops, Some(expected.to_vec()), commit.flush, commit.notice)?;
        let written = self.call_writer(move |client| {
            Box::pin(async move { write::write_expecting(&client, params).await })
        })?;
        if written {
            self.note_unflushed(commit.mark);
        }
        Ok(written)
    }

    fn write_locked(&self, ops: Vec<BatchOp>, flush: CommitFlush) -> Result<()> {
        self.locked.store(false, Ordering::Release);
        let commit = self.commit_of(&ops, flush)?;
        let params = write::batch_call(ops, None, commit.flush, commit.notice)?;
        self.call_writer(move |client| {
            Box::pin(async move { write_and_commit(&client, params).await })
        })?;
        self.note_unflushed(commit.mark);
        Ok(())
    }

    /// Makes durable every batch the writer committed so far ([`Backend::sync_through`] with
    /// no batch of the syncer's in particular: a failure answers for all of them).
    fn sync(&self) -> Result<()> {
        self.sync_through(u64::MAX)
    }

    /// Makes durable every batch the writer committed so far, for the syncer's batches up to
    /// sequence `last_seq`: their commits returned without waiting for the database's flush,
    /// and this waits for it, for the last commit of each session — after finding its last
    /// record still there, unless the syncer's session has been open since before that commit
    /// (module `unflushed`, `write::flush`); then announces them to other processes. A
    /// failed round trip is tried again, for up to [`FLUSH_PATIENCE`] (on a connection opened
    /// again, if the server dropped it; while the server restarts, with pauses): what it
    /// finds, it makes durable. A record not found means the server lost what it had
    /// acknowledged and not flushed (or, after a restart, that another node trimmed or
    /// purged its task meanwhile): an error for the appends waiting (the journal goes on:
    /// [`Backend::sync_failure_is_final`]). What a failed sync took of
    /// batches after `last_seq` — committed, not yet handed to the syncer — is given back for
    /// their own sync, so that their appends are acknowledged only once a sync finds them.
    fn sync_through(&self, last_seq: u64) -> Result<()> {
        let Some(syncer) = &self.syncer else {
            return Ok(());
        };
        let taken = self
            .unflushed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        for (i, mark) in taken.iter().enumerate() {
            if let Err(e) = self.flush(syncer, mark) {
                self.unflushed
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .give_back(taken, i, last_seq);
                return Err(e);
            }
        }
        Ok(())
    }

    fn max_batch_bytes(&self) -> usize {
        MAX_BATCH_BYTES
    }

    fn sync_failure_is_final(&self) -> bool {
        // A sync makes durable only what it finds, and the writer builds on nothing it
        // knew before a new session of its connection (`Reopen::Loudly`), which a restart
        // of the database that lost commits makes it open.
        false
    }

    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let lower = rows::lower(space, key)?;
        let asked = self.ask_page(space, Some(&lower), None, false, 1)?;
        let page = self.take_page(space, asked)?;
        Ok(page
            .into_iter()
            .next()
            .filter(|(k, _)| **k == *key)
            .map(|(_, v)| v.into_vec()))
    }

    fn scan(&self, space: Space, range: Range) -> RawIter<'_> {
        let bounds = (|| -> Result<(Option<Bound>, Option<Bound>)> {
            let lower = if range.lower.is_empty() {
                None
            } else {
                Some(rows::lower(space, &range.lower)?)
            };
            let upper = match &range.upper {
                None => None,
                Some(upper) => Some(rows::upper(space, upper)?),
            };
            Ok((lower, upper))
        })();
        match bounds {
            Err(e) => Box::new(std::iter::once(Err(e))),
            Ok((lower, upper)) => Box::new(Scan::new(self, space, lower, upper, range.reverse)),
        }
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn records_by_seq(&self, first: u64, last: u64) -> Option<Result<Vec<KeyValue>>> {
        Some(self.records_in_seq_range(first, last))
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn scan_snapshot_rows(&self) -> usize {
        if self.frozen {
            // Every read of one snapshot.
            usize::MAX
        } else {
            // The first page; each page after it is a query of its own.
            read::FIRST_PAGE
                .unsigned_abs()
                .try_into()
                .unwrap_or(usize::MAX)
        }
    }

    fn describe(&self) -> String {
        format!("postgres {}", self.location.display)
    }

    fn schema_version(&self) -> Option<u32> {
        Some(self.schema_version)
    }

    fn lock_for_write(&self, since: u64, lacks: &[String]) -> Result<Option<WriteLock>> {
        let since = i64::try_from(since).unwrap_or(i64::MAX);
        // One record more than listed, to tell a full list from a cut one.
        let most = i64::try_from(WRITTEN_SINCE_MAX + 1).unwrap_or(i64::MAX);
        let lacking = lacks.to_vec();
        let (locked, heads) = self.call_writer(move |client| {
            Box::pin(async move {
                let run = async {
                    // Prepared first (once per connection), then sent together; the tail, the
                    // tasks written since `since` and the heads the writer needs are read once
                    // the lock is held. The last two are planned each time (ranges and
                    // lookups of growing tables).
                    let lock = client.statement(write::WRITER_LOCK, &[]).await?;
                    let read = client
                        .statement(
                            "SELECT value FROM dtask_meta WHERE name = $1",
                            &[Type::BYTEA],
                        )
                        .await?;
                    let (begun, locked, tail, written, heads) = futures_util::future::join5(
                        client.batch_execute("BEGIN"),
                        client.query(&lock, &[]),
                        client.query(&read, &[&crate::keys::META_TAIL]),
                        // The tasks of the first records after `since`, up to `most`
                        // of them (by the sequences' index: a node idle for long does not
                        // read everything written since, under the lock), and how many.
                        client.query_typed(
                            "SELECT array_agg(DISTINCT task), count(*) FROM \
                             (SELECT task FROM dtask_records WHERE seq > $1 \
                              ORDER BY seq LIMIT $2) written",
                            &[(&since, Type::INT8), (&most, Type::INT8)],
                        ),
                        // The heads of the batch's tasks the writer lacks (a held head
                        // another writer moved is forgotten, by the list above, and read
                        // before the batch is staged).
                        async {
                            if lacking.is_empty() {
                                return Ok(Vec::new());
                            }
                            client
                                .query_typed(HEADS, &[(&lacking, Type::TEXT_ARRAY)])
                                .await
                        },
                    )
                    .await;
                    begun?;
                    locked?;
                    let tail = tail?;
                    let written = written?;
                    let heads = heads?;
                    let mut tasks = None;
                    if let Some(row) = written.first() {
                        let listed: Option<Vec<String>> = row.try_get(0)?;
                        let records: i64 = row.try_get(1)?;
                        if usize::try_from(records).is_ok_and(|n| n <= WRITTEN_SINCE_MAX) {
                            tasks = Some(listed.unwrap_or_default());
                        }
                    }
                    let locked = WriteLock {
                        tail: tail.first().map(|row| row.get::<_, Vec<u8>>(0)),
                        written_since: tasks,
                        heads: None,
                    };
                    Ok::<_, tokio_postgres::Error>((locked, heads))
                };
                match run.await {
                    Ok(locked) => Ok(locked),
                    Err(e) => {
                        let _ = client.batch_execute("ROLLBACK").await;
                        Err(e)
                    }
                }
            })
        })?;
        self.locked.store(true, Ordering::Release);
        let heads = heads.iter().map(last_record_of).collect::<Result<Vec<_>>>();
        match heads {
            Ok(heads) => Ok(Some(WriteLock {
                heads: Some(heads),
                ..locked
            })),
            Err(e) => {
                self.unlock_write();
                Err(e)
            }
        }
    }

    fn last_records(&self, tasks: &[String]) -> Option<Result<Vec<LastRecord>>> {
        let names = tasks.to_vec();
        let heads = || -> Result<Vec<LastRecord>> {
            let rows = self.reader().call(move |client| {
                Box::pin(async move {
                    client
                        .query_typed(HEADS, &[(&names, Type::TEXT_ARRAY)])
                        .await
                })
            })?;
            let heads = rows
                .iter()
                .map(|row| last_record_of(row).map(|(_, last)| last))
                .collect::<Result<Vec<_>>>()?;
            // A head is the last record as committed: durable if the records are.
            let records = heads
                .iter()
                .flatten()
                .map(|((_, record), _)| crate::record::seq_of(record));
            if self.read_only && !self.known_durable(Some(records)) {
                self.make_reads_durable()?;
            }
            Ok(heads)
        };
        Some(heads())
    }

    fn frozen_view(&self) -> Result<Option<Arc<dyn Backend>>> {
        if self.frozen {
            // Already one snapshot: a view of it is itself.
            return Ok(None);
        }
        Ok(Some(Arc::new(self.frozen()?)))
    }

    fn durable_reader(&self) -> Option<Arc<dyn Backend>> {
        (!self.read_only).then(|| Arc::new(self.twin()) as Arc<dyn Backend>)
    }

    fn watch_commits(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.listener
            .get_or_init(|| listen::start(self.target.clone()).ok())
            .as_ref()
            .map(|l| l.watermark.clone())
    }

    fn unlock_write(&self) {
        if self.locked.swap(false, Ordering::AcqRel) {
            if let Some(writer) = &self.writer {
                let rolled_back = writer
                    .call(|client| Box::pin(async move { client.batch_execute("ROLLBACK").await }));
                if rolled_back.is_err() {
                    self.unheard.store(true, Ordering::Release);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys;
    use crate::tail::Tail;

    /// A backend on a fresh schema of the test database (`DTASK_TEST_PG_URL`), or `None`; a
    /// second call with the same `test` opens the same schema again (another node).
    fn backend(test: &str) -> Option<(PgBackend, String)> {
        backend_with(test, "")
    }

    /// [`backend`] with the URL parameters `parameters` besides (`&name=value…`).
    fn backend_with(test: &str, parameters: &str) -> Option<(PgBackend, String)> {
        let Ok(base) = std::env::var("DTASK_TEST_PG_URL") else {
            eprintln!("SKIPPED {test}: DTASK_TEST_PG_URL is not set (./dev test sets it)");
            return None;
        };
        let schema = format!("u{}_{test}", std::process::id());
        let url = PgLocation::url_with_schema(&base, &schema) + parameters;
        let seed = vec![(keys::META_TAIL.to_vec(), Tail::default().encode())];
        let location = PgLocation::parse(&url).unwrap();
        Some((
            PgBackend::open(location, false, Durability::Sync, seed).unwrap(),
            schema,
        ))
    }

    /// The ops of a batch that writes task `t`'s record at `position` with sequence `seq`.
    fn batch(position: u64, seq: u64) -> (Vec<BatchOp>, Vec<u8>) {
        batch_of("t", position, seq)
    }

    /// Task `task`'s record at `position` with sequence `seq`.
    fn record_of(task: &str, position: u64, seq: u64) -> Vec<u8> {
        let (record, _) = crate::record::frame(
            task,
            position,
            seq,
            b"payload",
            &crate::record::Digest::default(),
        )
        .unwrap();
        record
    }

    fn batch_of(task: &str, position: u64, seq: u64) -> (Vec<BatchOp>, Vec<u8>) {
        let record = record_of(task, position, seq);
        let tail = Tail {
            last_seq: seq,
            ..Tail::default()
        };
        let ops = vec![
            BatchOp::Put {
                space: Space::Events,
                key: keys::event_key(task, position).into(),
                value: record.into(),
            },
            BatchOp::Put {
                space: Space::Meta,
                key: keys::META_TAIL.into(),
                value: tail.encode().into(),
            },
        ];
        (ops, tail.encode())
    }

    /// Deletes task `t`'s record at `position` behind the writer's back, as a restart of a
    /// server that had not flushed it would lose it — and ends the syncer's session, as that
    /// restart would end every session.
    fn lose(pg: &PgBackend, position: u64) {
        let gone = BatchOp::Delete {
            space: Space::Events,
            key: keys::event_key("t", position).into(),
        };
        pg.write(vec![gone], Durability::Sync).unwrap();
        super::conn::tests::terminate(backend_pid(pg.syncer.as_ref().unwrap()));
    }

    /// The process id of the server's backend of `conn`'s session.
    fn backend_pid(conn: &Conn) -> i32 {
        conn.call(|client| {
            Box::pin(async move {
                let row = client.query_one("SELECT pg_backend_pid()", &[]).await?;
                Ok(row.get::<_, i32>(0))
            })
        })
        .unwrap()
    }

    /// Runs `sql` on a connection of its own.
    fn admin(sql: &'static str, schema: String) {
        let base = std::env::var("DTASK_TEST_PG_URL").unwrap();
        let location = PgLocation::parse(&base).unwrap();
        let target = Target::admin(&location);
        Conn::open(target, "admin")
            .unwrap()
            .call(move |client| {
                Box::pin(async move { client.execute(sql, &[&format!("dtask:{schema}")]).await })
            })
            .unwrap();
    }

    #[test]
    fn a_sync_refuses_a_batch_whose_record_the_server_no_longer_has() {
        let Some((pg, _)) = backend("flushfinds") else {
            return;
        };
        let (ops, first_tail) = batch(0, 1);
        assert!(pg
            .write_expecting(ops, &Tail::default().encode(), CommitFlush::AtSync)
            .unwrap());
        // Found again, made durable.
        pg.sync().unwrap();
        // Nothing left to flush: no round trip, no error.
        pg.sync().unwrap();

        // The next batch's record disappears before its sync, as a restart of a server that
        // had not flushed it would make it: the sync finds it gone and says so.
        let (ops, second_tail) = batch(1, 2);
        assert!(pg
            .write_expecting(ops, &first_tail, CommitFlush::AtSync)
            .unwrap());
        lose(&pg, 1);
        let refused = pg.sync().unwrap_err();
        assert!(
            matches!(&refused, Error::Storage(_)) && refused.to_string().contains("is gone"),
            "{refused}"
        );

        // A batch flushed at its own commit leaves the sync nothing to find.
        let (ops, _) = batch(1, 3);
        assert!(pg
            .write_expecting(ops, &second_tail, CommitFlush::AtCommit)
            .unwrap());
        lose(&pg, 1);
        pg.sync().unwrap();
    }

    /// Another node trims the task of a batch committed and not yet synced — its last record
    /// framed again, same position and sequence, new bytes — or purges it (the record
    /// deleted): the sync, on the session it had open before the commit (the server has not
    /// restarted since), makes the batch durable rather than take it for lost.
    #[test]
    fn a_sync_makes_durable_a_batch_whose_record_another_node_trimmed_or_purged_since() {
        let (Some((pg, _)), Some((other, _))) = (backend("flushtrim"), backend("flushtrim")) else {
            return;
        };
        let (ops, first_tail) = batch(0, 1);
        assert!(pg
            .write_expecting(ops, &Tail::default().encode(), CommitFlush::AtSync)
            .unwrap());
        // Framed again by the other node: same position and sequence, other bytes.
        let (reframed, _) = crate::record::frame(
            "t",
            0,
            1,
            b"framed again",
            &crate::record::Digest::default(),
        )
        .unwrap();
        let trim = BatchOp::Replace {
            key: keys::event_key("t", 0).into(),
            value: reframed.into(),
        };
        other.write(vec![trim], Durability::Sync).unwrap();
        pg.sync().unwrap();
        assert_eq!(pg.durable_seq.load(Ordering::Acquire), 1);

        let (ops, _) = batch(1, 2);
        assert!(pg
            .write_expecting(ops, &first_tail, CommitFlush::AtSync)
            .unwrap());
        let purge = BatchOp::Purge {
            task: "t".to_owned(),
            below: 2,
            apart: false,
        };
        other.write(vec![purge], Durability::Sync).unwrap();
        assert_eq!(
            other.get(Space::Events, &keys::event_key("t", 1)).unwrap(),
            None
        );
        pg.sync().unwrap();
        assert_eq!(pg.durable_seq.load(Ordering::Acquire), 2);
    }

    /// The syncer's sync of batch 1 may take batch 2's mark: the writer committed batch 2
    /// before handing it over. When that sync fails on it — the server lost batch 2 — the
    /// failure answers for batch 1 alone: batch 2's own sync looks for its record again, and
    /// fails too, rather than finding nothing to do and acknowledging it.
    #[test]
    fn a_failed_sync_leaves_a_later_batchs_record_for_that_batchs_own_sync() {
        let Some((pg, _)) = backend("flushlater") else {
            return;
        };
        let (ops, first_tail) = batch(0, 1);
        assert!(pg
            .write_expecting(ops, &Tail::default().encode(), CommitFlush::AtSync)
            .unwrap());
        let (ops, _) = batch(1, 2);
        assert!(pg
            .write_expecting(ops, &first_tail, CommitFlush::AtSync)
            .unwrap());
        lose(&pg, 1);
        // Batch 1's sync finds batch 2's record gone.
        let refused = pg.sync_through(1).unwrap_err();
        assert!(refused.to_string().contains("is gone"), "{refused}");
        // Batch 2's sync looks again: gone.
        let refused = pg.sync_through(2).unwrap_err();
        assert!(refused.to_string().contains("is gone"), "{refused}");
        // That failure answered for batch 2: nothing is left to find.
        pg.sync_through(2).unwrap();
    }

    /// A commit the writer made on a new session of its connection — after the server
    /// restarted, say — does not vouch for the commits of the session before (the restart
    /// may have lost them): a sync looks for the last record of each.
    #[test]
    fn a_commit_on_a_new_session_does_not_vouch_for_one_on_the_session_before() {
        let Some((pg, _)) = backend("flushsessions") else {
            return;
        };
        let writer = pg.writer.as_ref().unwrap();
        let (ops, first_tail) = batch(0, 1);
        assert!(pg
            .write_expecting(ops, &Tail::default().encode(), CommitFlush::AtSync)
            .unwrap());
        super::conn::tests::terminate(backend_pid(writer));
        // The writer's connection fails (once or twice), then commits batch 2 on a new
        // session.
        let mut errors = Vec::new();
        loop {
            let (ops, _) = batch(1, 2);
            match pg.write_expecting(ops, &first_tail, CommitFlush::AtSync) {
                Ok(written) => {
                    assert!(written);
                    break;
                }
                Err(e) => errors.push(e.to_string()),
            }
            assert!(errors.len() < 3, "{errors:?}");
        }
        assert!(!errors.is_empty());
        // Batch 1's record is gone, as a restart that had not flushed it would lose it:
        // batch 2's record, there, does not make the sync say otherwise.
        lose(&pg, 0);
        let refused = pg.sync_through(2).unwrap_err();
        assert!(
            refused.to_string().contains("of t at 0 (sequence 1)"),
            "{refused}"
        );
    }

    /// A one-round-trip batch is its own transaction: one sent while a locked batch was left
    /// open (its write never sent) ends that one first instead of running inside it,
    /// uncommitted, with the lock held.
    #[test]
    fn a_batch_call_after_a_lock_left_open_commits_and_frees_the_lock() {
        let Some((pg, _)) = backend("leftopen") else {
            return;
        };
        let (ops, first_tail) = batch(0, 1);
        assert!(pg
            .write_expecting(ops, &Tail::default().encode(), CommitFlush::AtCommit)
            .unwrap());
        assert!(pg.lock_for_write(1, &[]).unwrap().is_some());
        let (ops, _) = batch(1, 2);
        assert!(pg
            .write_expecting(ops, &first_tail, CommitFlush::AtCommit)
            .unwrap());
        // Committed: another session sees it.
        let twin = pg.durable_reader().expect("a writable open has one");
        assert!(twin
            .get(Space::Events, &keys::event_key("t", 1))
            .unwrap()
            .is_some());
        // And the lock is free: the writer takes it again, and gives it up.
        assert!(pg.lock_for_write(2, &[]).unwrap().is_some());
        pg.unlock_write();
    }

    #[test]
    fn the_durable_reader_learns_from_the_writers_syncs_and_reads_only() {
        let Some((pg, _)) = backend("twin") else {
            return;
        };
        let twin = pg.durable_reader().expect("a writable open has one");
        assert!(twin.read_only() && twin.is_shared());
        assert!(twin.durable_reader().is_none());
        let (ops, first_tail) = batch(0, 1);
        assert!(pg
            .write_expecting(ops, &Tail::default().encode(), CommitFlush::AtSync)
            .unwrap());
        // Committed, not yet synced: the twin knows nothing durable; its read of the record
        // makes it durable and learns so (module `durable`).
        assert_eq!(pg.durable_seq.load(Ordering::Acquire), 0);
        assert!(twin
            .get(Space::Events, &keys::event_key("t", 0))
            .unwrap()
            .is_some());
        assert_eq!(pg.durable_seq.load(Ordering::Acquire), 1);
        // The writer's sync tells the twin what it made durable.
        let (ops, _) = batch(1, 2);
        assert!(pg
            .write_expecting(ops, &first_tail, CommitFlush::AtSync)
            .unwrap());
        pg.sync().unwrap();
        assert_eq!(pg.durable_seq.load(Ordering::Acquire), 2);
        let (ops, _) = batch(2, 3);
        assert!(matches!(
            twin.write(ops, Durability::Sync),
            Err(Error::ReadOnly)
        ));
    }

    /// The statements prepared in `conn`'s session.
    fn prepared_in(conn: &Conn) -> i64 {
        conn.call(|client| {
            Box::pin(async move {
                // Unnamed, so as not to count itself.
                let rows = client
                    .query_typed("SELECT count(*) FROM pg_prepared_statements", &[])
                    .await?;
                Ok(rows[0].get::<_, i64>(0))
            })
        })
        .unwrap()
    }

    #[test]
    fn a_range_of_sequences_reads_its_records_in_commit_order() {
        let Some((pg, _)) = backend("by_seq") else {
            return;
        };
        let mut tail = Tail::default().encode();
        for (task, position, seq) in [("b", 0, 1), ("a", 0, 2), ("b", 1, 3), ("a", 1, 4)] {
            let (ops, next) = batch_of(task, position, seq);
            assert!(pg
                .write_expecting(ops, &tail, CommitFlush::AtCommit)
                .unwrap());
            tail = next;
        }
        let read = |first, last| -> Vec<(Vec<u8>, Option<u64>)> {
            pg.records_by_seq(first, last)
                .unwrap()
                .unwrap()
                .into_iter()
                .map(|(key, value)| (key.to_vec(), crate::record::seq_of(&value)))
                .collect()
        };
        assert_eq!(
            read(2, 3),
            [
                (keys::event_key("a", 0), Some(2)),
                (keys::event_key("b", 1), Some(3))
            ]
        );
        assert_eq!(read(1, 4).len(), 4);
        assert!(read(5, 9).is_empty());
    }

    /// How many pages scans asked for ahead ([`Scan::ask_ahead`]), in this process.
    pub(super) static ASKED_AHEAD: AtomicUsize = AtomicUsize::new(0);

    #[test]
    fn a_long_scan_reads_its_pages_ahead_and_misses_nothing() {
        let Some((pg, _)) = backend("scan_ahead") else {
            return;
        };
        // 6,000 records of three tasks in one batch: a scan's pages grow to full size (64,
        // 256, 1,024 rows, then 4,096, each asked for while the one before is used).
        let mut ops = Vec::new();
        let mut expected = Vec::new();
        let mut seq = 0;
        for task in ["a", "b", "c"] {
            for position in 0..2_000 {
                seq += 1;
                let record = record_of(task, position, seq);
                let key = keys::event_key(task, position);
                expected.push((key.clone(), record.clone()));
                ops.push(BatchOp::Put {
                    space: Space::Events,
                    key: key.into(),
                    value: record.into(),
                });
            }
        }
        let tail = Tail {
            last_seq: seq,
            ..Tail::default()
        };
        ops.push(BatchOp::Put {
            space: Space::Meta,
            key: keys::META_TAIL.into(),
            value: tail.encode().into(),
        });
        assert!(pg
            .write_expecting(ops, &Tail::default().encode(), CommitFlush::AtCommit)
            .unwrap());
        let read = |range: Range| -> Vec<(Vec<u8>, Vec<u8>)> {
            pg.scan(Space::Events, range)
                .map(|pair| {
                    let (key, value) = pair.unwrap();
                    (key.to_vec(), value.to_vec())
                })
                .collect()
        };
        let asked_before = ASKED_AHEAD.load(Ordering::Relaxed);
        assert_eq!(read(Range::default()), expected);
        assert!(
            ASKED_AHEAD.load(Ordering::Relaxed) > asked_before,
            "a page was asked for ahead"
        );
        let mut backwards = expected.clone();
        backwards.reverse();
        let reverse = Range {
            reverse: true,
            ..Range::default()
        };
        assert_eq!(read(reverse), backwards);
        // From a bound, to a bound.
        let (from, to) = (&expected[1_500].0, &expected[5_800].0);
        let range = Range {
            lower: from.clone(),
            upper: Some(to.clone()),
            reverse: false,
        };
        assert_eq!(read(range), &expected[1_500..5_800]);
        // A scan dropped with a page asked ahead (after its 1,024-row page) leaves the
        // readers in order: the reads after it find what they ask for.
        for _ in 0..READERS {
            let mut scan = pg.scan(Space::Events, Range::default());
            assert_eq!(scan.by_ref().take(400).count(), 400);
            drop(scan);
            let (key, value) = &expected[2_007];
            assert_eq!(
                pg.get(Space::Events, key).unwrap().as_deref(),
                Some(&value[..])
            );
        }
        assert_eq!(read(Range::from(&expected[5_990].0)), &expected[5_990..]);
    }

    #[test]
    fn a_page_of_one_shape_is_prepared_once_per_reader() {
        let Some((pg, _)) = backend("pages") else {
            return;
        };
        let mut tail = Tail::default().encode();
        for position in 0..3 {
            let (ops, next) = batch(position, position + 1);
            assert!(pg
                .write_expecting(ops, &tail, CommitFlush::AtCommit)
                .unwrap());
            tail = next;
        }
        let prepared = || pg.readers.iter().map(prepared_in).sum::<i64>();
        let before = prepared();
        // Every reader serves gets of one record (one shape of page), twice over.
        let rounds = 2 * pg.readers.len();
        for _ in 0..rounds {
            for position in 0..3 {
                let found = pg
                    .get(Space::Events, &keys::event_key("t", position))
                    .unwrap();
                assert!(found.is_some(), "record {position}");
            }
            assert!(pg
                .get(Space::Events, &keys::event_key("t", 3))
                .unwrap()
                .is_none());
        }
        let readers = i64::try_from(pg.readers.len()).unwrap();
        assert_eq!(prepared() - before, readers, "one statement a reader");
        // A scan's pages are of other shapes (an upper bound, larger pages), prepared once
        // more each, and read the same rows again.
        for _ in 0..rounds {
            let stream: Vec<_> = pg
                .scan(Space::Events, Range::prefix(&keys::task_prefix("t")))
                .collect::<Result<_>>()
                .unwrap();
            assert_eq!(stream.len(), 3);
        }
        let after_scans = prepared();
        for _ in 0..rounds {
            assert_eq!(
                pg.scan(Space::Events, Range::prefix(&keys::task_prefix("t")))
                    .count(),
                3
            );
        }
        assert_eq!(prepared(), after_scans, "no page prepared twice");
    }

    #[test]
    fn a_transaction_the_lock_opened_is_not_continued_on_a_new_connection() {
        let Some((pg, schema)) = backend("lockcut") else {
            return;
        };
        assert!(pg.lock_for_write(0, &[]).unwrap().is_some());
        // The server ends the session that holds the lock (the only one in a transaction).
        admin(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity \
             WHERE application_name = $1 AND state = 'idle in transaction'",
            schema,
        );
        // The batch is not sent on a new session, outside the lock and any transaction.
        let (ops, _) = batch(0, 1);
        assert!(pg.write_locked(ops, CommitFlush::AtSync).is_err());
        assert_eq!(
            pg.get(Space::Events, &keys::event_key("t", 0)).unwrap(),
            None
        );
        // The writer goes on with its next batch, on the new session.
        assert!(pg.lock_for_write(0, &[]).unwrap().is_some());
        let (ops, _) = batch(0, 1);
        pg.write_locked(ops, CommitFlush::AtSync).unwrap();
        pg.sync().unwrap();
        assert!(pg
            .get(Space::Events, &keys::event_key("t", 0))
            .unwrap()
            .is_some());
    }

    /// A setting of `conn`'s session, as `SHOW` reads it.
    fn setting(conn: &Conn, name: &'static str) -> String {
        conn.call(move |client| {
            Box::pin(async move {
                let row = client.query_one(&format!("SHOW {name}"), &[]).await?;
                Ok(row.get::<_, String>(0))
            })
        })
        .unwrap()
    }

    /// Every session of the journal reads committed rows, whatever the default the database,
    /// the role or the URL gives (here the URL's `options`: serializable), and only the
    /// writer's is ended by the server when it sits idle in a transaction.
    #[test]
    fn every_session_reads_committed_and_only_the_writers_has_an_idle_bound() {
        let Some((pg, _)) = backend_with(
            "sessions",
            "&options=-c%20default_transaction_isolation%3Dserializable",
        ) else {
            return;
        };
        let (writer, syncer) = (pg.writer.as_ref().unwrap(), pg.syncer.as_ref().unwrap());
        for conn in pg.readers.iter().chain([writer, syncer]) {
            assert_eq!(
                setting(conn, "default_transaction_isolation"),
                "read committed"
            );
        }
        assert_eq!(
            setting(writer, "idle_in_transaction_session_timeout"),
            format!("{}s", LOCK_IDLE_MAX.as_secs())
        );
        for conn in pg.readers.iter().chain([syncer]) {
            assert_eq!(setting(conn, "idle_in_transaction_session_timeout"), "0");
        }
    }

    /// A writer that stalls with the writer lock held — idle in the transaction that took it,
    /// as a node that froze or lost the network is — has its session ended by the server
    /// after the writer's idle bound (shortened here), which frees the lock: another node's
    /// writer, waiting for it, writes; the stalled one's batch fails, nothing of it written,
    /// and its next batch builds on the other's.
    #[test]
    fn a_writer_lock_left_idle_is_freed_by_the_server_and_both_writers_go_on() {
        let (Some((stalled, _)), Some((other, _))) = (backend("idlelock"), backend("idlelock"))
        else {
            return;
        };
        let set = |pg: &PgBackend, sql: &'static str| {
            pg.writer
                .as_ref()
                .unwrap()
                .call(move |client| Box::pin(async move { client.batch_execute(sql).await }))
                .unwrap();
        };
        set(&stalled, "SET idle_in_transaction_session_timeout TO '1s'");
        // Should the lock never come free, the test fails rather than hangs.
        set(&other, "SET lock_timeout TO '60s'");
        assert!(stalled.lock_for_write(0, &[]).unwrap().is_some());
        // Waits until the server ends the stalled writer's session.
        let locked = other.lock_for_write(0, &[]).unwrap().unwrap();
        assert_eq!(locked.tail, Some(Tail::default().encode()));
        let (ops, other_tail) = batch_of("other", 0, 1);
        other.write_locked(ops, CommitFlush::AtCommit).unwrap();

        let (ops, _) = batch_of("stalled", 0, 1);
        let failed = stalled
            .write_locked(ops, CommitFlush::AtCommit)
            .unwrap_err();
        assert!(matches!(failed, Error::Storage(_)), "{failed}");
        assert_eq!(
            other
                .get(Space::Events, &keys::event_key("stalled", 0))
                .unwrap(),
            None
        );
        // The stalled writer's connection fails once more (its new session), then it takes
        // the lock again and reads the other's tail.
        let mut errors = Vec::new();
        let locked = loop {
            match stalled.lock_for_write(0, &[]) {
                Ok(locked) => break locked.unwrap(),
                Err(e) => errors.push(e.to_string()),
            }
            assert!(errors.len() < 3, "{errors:?}");
        };
        assert_eq!(locked.tail, Some(other_tail));
        let (ops, _) = batch_of("stalled", 0, 2);
        stalled.write_locked(ops, CommitFlush::AtSync).unwrap();
        stalled.sync().unwrap();
        assert!(other
            .get(Space::Events, &keys::event_key("stalled", 0))
            .unwrap()
            .is_some());
    }

    /// The lock lists the tasks of the records written after the writer's last sequence —
    /// of at most [`WRITTEN_SINCE_MAX`] of them, read by the sequences' index: past that it
    /// says the list is cut (the writer forgets every head) rather than read every record
    /// written since, under the lock, however few tasks they are of.
    #[test]
    fn the_lock_lists_the_tasks_of_a_bounded_number_of_records_written_since() {
        let Some((pg, _)) = backend("writtensince") else {
            return;
        };
        let mut tail = Tail::default().encode();
        for (task, seq) in [("a", 1), ("b", 2)] {
            let (ops, next) = batch_of(task, 0, seq);
            assert!(pg
                .write_expecting(ops, &tail, CommitFlush::AtCommit)
                .unwrap());
            tail = next;
        }
        let listed = |since: u64| {
            let locked = pg.lock_for_write(since, &[]).unwrap().unwrap();
            pg.unlock_write();
            locked.written_since.map(|mut tasks| {
                tasks.sort();
                tasks
            })
        };
        assert_eq!(listed(0), Some(vec!["a".to_owned(), "b".to_owned()]));
        assert_eq!(listed(1), Some(vec!["b".to_owned()]));
        assert_eq!(listed(2), Some(vec![]));
        // One task's records, more of them than the lock reads.
        let records = u64::try_from(WRITTEN_SINCE_MAX).unwrap() + 1;
        let mut ops = Vec::new();
        for position in 0..records {
            ops.push(BatchOp::Put {
                space: Space::Events,
                key: keys::event_key("t", position).into(),
                value: record_of("t", position, 3 + position).into(),
            });
        }
        let last = Tail {
            last_seq: 2 + records,
            ..Tail::default()
        };
        ops.push(BatchOp::Put {
            space: Space::Meta,
            key: keys::META_TAIL.into(),
            value: last.encode().into(),
        });
        assert!(pg
            .write_expecting(ops, &tail, CommitFlush::AtCommit)
            .unwrap());
        assert_eq!(listed(2), None, "cut");
        assert_eq!(listed(3), Some(vec!["t".to_owned()]), "as many as it lists");
    }

    #[test]
    fn the_lock_reads_the_heads_the_writer_lacks() {
        let Some((pg, _)) = backend("lockheads") else {
            return;
        };
        let (ops, _) = batch_of("t", 0, 1);
        assert!(pg
            .write_expecting(ops, &Tail::default().encode(), CommitFlush::AtCommit)
            .unwrap());
        let read = |lacking: &[&str]| {
            let lacking: Vec<String> = lacking.iter().map(|t| (*t).to_owned()).collect();
            let locked = pg.lock_for_write(1, &lacking).unwrap().unwrap();
            pg.unlock_write();
            locked
                .heads
                .unwrap()
                .into_iter()
                .map(|(task, last)| {
                    let head = crate::head::of_last(&task, last).unwrap();
                    (task, head.map(|h| (h.next_position, h.last_seq)))
                })
                .collect::<Vec<_>>()
        };
        // Each head asked for, in order, with or without records; none asked, none read.
        assert_eq!(
            read(&["new", "t"]),
            vec![("new".to_owned(), None), ("t".to_owned(), Some((1, 1)))]
        );
        assert_eq!(read(&[]), vec![]);
    }
}

//! One PostgreSQL connection, on a thread of its own or driven on its caller's, called from
//! synchronous code.
//!
//! The journal's readers and writer are synchronous (RocksDB's calls block; so do these), and
//! they are called from threads of an asynchronous runtime as well as from plain ones. A
//! connection of `tokio-postgres` needs a runtime to drive it, and blocking on one runtime
//! from inside another panics. So each connection lives on its own thread, with a
//! single-threaded runtime of its own: a call hands it a job over an unbounded channel (which
//! never blocks the sender) and waits for the answer on a standard channel (which may block
//! any thread). Queries a job issues together are pipelined on the connection.
//!
//! A connection that broke (the server restarted, the network dropped) is opened again at
//! the next job; the job that found it broken fails with [`Error::Storage`] naming the cause.
//!
//! The writer's and the syncer's connections are each called by one plain thread of the
//! journal's (the writer's, the syncer's), never from a runtime: they are driven on that
//! thread instead ([`Conn::open_here`]), by a single-threaded runtime of their own, without
//! the hand-off to a connection thread and back — two thread wake-ups less on the way of
//! every batch and every flush.
//!
//! The writer's call (`dtask_write_batch`), the lock and the tail's read are prepared once
//! per connection ([`Session::statement`]): sent unnamed, each was parsed and planned anew by
//! the server for every batch (prepared, one node makes 1.2–1.4× the durable steps:
//! docs/performance-history.md). So are the readers' pages, once per shape of page (the
//! space, which bounds, the order, the page's size: a few dozen texts at most), parsed once
//! and planned at each execution for its parameters ([`Target::custom_plans`]). Statements
//! that find rows by a parameter array stay unnamed.

use super::tls::Tls;
use super::PgLocation;
use crate::error::{Error, Result, StorageError};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::types::Type;
use tokio_postgres::Socket;
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

/// What a job runs: given the client, a future of its answer.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

type Job = Box<dyn FnOnce(std::result::Result<Arc<Session>, String>) -> BoxFuture<()> + Send>;

/// An open connection: its client (which a session dereferences to) and the statements
/// prepared on it. A connection opened again is a new session, with nothing prepared.
pub(crate) struct Session {
    client: Client,
    /// The statements prepared so far, by their text.
    prepared: Mutex<HashMap<String, tokio_postgres::Statement>>,
    /// This session among every session this process opened ([`Session::id`]).
    id: u64,
    /// The server process that answered the session's setup (`pg_backend_pid()`): a
    /// pooler between may hand the same connection to another one later.
    backend_pid: i32,
}

/// The id the next session opened gets: ids are never given twice in a process.
static SESSIONS: AtomicU64 = AtomicU64::new(1);

impl std::ops::Deref for Session {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Session {
    /// This session's id, unique in the process: a call answered on a session of the id
    /// [`Conn::session`] returned earlier ran on the same connection — on the same server
    /// process, which has lived since (a restart, even a crash's, ends every session), when
    /// no pooler stands between: whether it did, the server says ([`Session::backend_pid`]).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The server process that answered the session's setup.
    pub(crate) fn backend_pid(&self) -> i32 {
        self.backend_pid
    }

    /// `sql` prepared on this connection with parameters of `types`: a round trip the first
    /// time, none after. Await every statement a pipeline needs before sending any of it: a
    /// preparation sent from inside the pipeline would let the statements after it overtake
    /// the one it prepares.
    ///
    /// # Errors
    /// The server's error when it cannot prepare `sql`.
    pub(crate) async fn statement(
        &self,
        sql: &str,
        types: &[Type],
    ) -> std::result::Result<tokio_postgres::Statement, tokio_postgres::Error> {
        let known = self
            .prepared
            .lock()
            .ok()
            .and_then(|prepared| prepared.get(sql).cloned());
        if let Some(statement) = known {
            return Ok(statement);
        }
        let statement = self.client.prepare_typed(sql, types).await?;
        if let Ok(mut prepared) = self.prepared.lock() {
            prepared.insert(sql.to_owned(), statement.clone());
        }
        Ok(statement)
    }
}

/// How a connection is opened: the server's address and the session's settings.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The parsed connection settings.
    pub config: Config,
    /// The schema the journal's tables are in (`search_path`).
    pub schema: String,
    /// What the server is called in errors (host and port, no password).
    pub display: String,
    /// Whether commits wait for the write-ahead log's flush (`synchronous_commit`).
    pub synchronous: bool,
    /// Whether the session plans each execution of a prepared statement for its parameters
    /// (`plan_cache_mode = force_custom_plan`): the readers', whose pages are prepared once
    /// and used as the tables grow. A generic plan made while a table was small (a scan of it
    /// whole and a sort) would stay in the session's cache; parsed once, planned each time,
    /// a page costs what an unprepared one did less its parsing.
    pub custom_plans: bool,
    /// How connections are secured (module `tls`).
    pub tls: Tls,
    /// How long the server lets the session sit idle inside a transaction before it ends the
    /// session (`idle_in_transaction_session_timeout`): the writer's, whose transaction holds
    /// the journal's writer lock between its round trips ([`super::LOCK_IDLE_MAX`]). `None`:
    /// as the server says (a frozen view's snapshot is one transaction, idle between reads).
    pub idle_in_transaction: Option<std::time::Duration>,
}

impl Target {
    /// The connections of the journal at `location`, whose commits wait for the flush if
    /// `synchronous`.
    pub(crate) fn of(location: &PgLocation, synchronous: bool) -> Self {
        Self {
            config: location.config.clone(),
            schema: location.schema.clone(),
            display: location.display.clone(),
            synchronous,
            custom_plans: false,
            tls: location.tls.clone(),
            idle_in_transaction: None,
        }
    }

    /// An administrator's connection to the database of `location`, outside the journal's
    /// schema.
    pub(crate) fn admin(location: &PgLocation) -> Self {
        Self {
            schema: "public".to_owned(),
            ..Self::of(location, true)
        }
    }

    /// Opens a connection (not yet set up: see `connect`); its driver is the second half.
    pub(crate) async fn connect(
        &self,
    ) -> std::result::Result<
        (
            Client,
            tokio_postgres::Connection<
                Socket,
                <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream,
            >,
        ),
        tokio_postgres::Error,
    > {
        self.config.connect(self.tls.connector()).await
    }
}

/// What a connection does with the call that finds it broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reopen {
    /// Opens it again and runs the call on the new session: a reader's call, which depends
    /// on nothing the old session held.
    Quietly,
    /// Opens it again but fails the call: the writer's. Its calls depend on the session
    /// they were made on — the transaction a lock opened, and the commits that the server
    /// acknowledged before flushing them, which a restart of the server may have taken
    /// back — so the writer must hear of every new session, and builds on nothing it knew
    /// before it (see `PgBackend`).
    Loudly,
    /// Never opens it again: every call after it broke fails. A session whose calls depend on
    /// a transaction it holds for its whole life — a frozen view's snapshot
    /// (`Backend::frozen_view`), which a new session would not have.
    Never,
}

/// A connection's handle. Cheap to clone; the connection (and its thread, if it has one)
/// ends when every handle is gone.
#[derive(Debug, Clone)]
pub(crate) struct Conn {
    how: Driven,
    /// The id of its session, the last one opened ([`Conn::session`]).
    session: Arc<AtomicU64>,
}

/// Where a connection is driven.
#[derive(Debug, Clone)]
enum Driven {
    /// On a thread of its own, which runs the jobs sent to it.
    Apart(mpsc::UnboundedSender<Job>),
    /// On the thread that calls it ([`Conn::open_here`]).
    Here(Arc<Mutex<Here>>),
}

/// A connection driven on the thread that calls it: its runtime (which runs the
/// connection's task while a call waits) and its session.
struct Here {
    /// Always there but in its drop, which shuts it down without waiting (a handle may be
    /// dropped on a thread of an asynchronous runtime, where a runtime cannot be dropped).
    runtime: Option<tokio::runtime::Runtime>,
    client: std::result::Result<Arc<Session>, String>,
    target: Target,
    reopen: Reopen,
    /// Where the id of its session is published ([`Conn::session`]).
    session: Arc<AtomicU64>,
}

impl std::fmt::Debug for Here {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Here")
            .field("target", &self.target.display)
            .finish_non_exhaustive()
    }
}

impl Drop for Here {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Why a call on a connection that is not opened again fails ([`Reopen::Never`]).
fn lost(target: &Target) -> String {
    format!(
        "the connection to PostgreSQL at {} was lost, and with it the snapshot it read",
        target.display
    )
}

/// Why a call on a connection opened again is not sent ([`Reopen::Loudly`]).
fn reopened(target: &Target) -> String {
    format!(
        "the connection to PostgreSQL at {} was lost and is open again; this call was not sent",
        target.display
    )
}

impl Conn {
    /// Starts the connection's thread and opens the connection; a reader's (see
    /// [`Conn::open_with`]).
    ///
    /// # Errors
    /// [`Error::Storage`] naming the server and the cause when it cannot be reached.
    pub(crate) fn open(target: Target, name: &str) -> Result<Self> {
        Self::open_with(target, name, Reopen::Quietly)
    }

    /// Starts the connection's thread and opens the connection, to be opened again as
    /// `reopen` says when a call finds it broken.
    ///
    /// # Errors
    /// [`Error::Storage`] naming the server and the cause when it cannot be reached.
    pub(crate) fn open_with(target: Target, name: &str, reopen: Reopen) -> Result<Self> {
        let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let session = Arc::new(AtomicU64::new(0));
        let published = Arc::clone(&session);
        std::thread::Builder::new()
            .name(format!("dtask-pg-{name}"))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = ready_tx.send(Err(Error::storage(format!(
                            "cannot start a runtime for a database connection: {e}"
                        ))));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let mut client = match connect(&target).await {
                        Ok(client) => {
                            published.store(client.id, Ordering::Release);
                            let _ = ready_tx.send(Ok(()));
                            Ok(client)
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    while let Some(job) = queue.recv().await {
                        if client.as_ref().is_err() || client.as_ref().is_ok_and(|c| c.is_closed())
                        {
                            if reopen == Reopen::Never {
                                job(Err(lost(&target))).await;
                                continue;
                            }
                            client = connect(&target).await.map_err(|e| e.to_string());
                            if let Ok(opened) = &client {
                                published.store(opened.id, Ordering::Release);
                            }
                            if reopen == Reopen::Loudly && client.is_ok() {
                                job(Err(reopened(&target))).await;
                                continue;
                            }
                        }
                        job(client.clone()).await;
                    }
                });
            })
            .map_err(|e| Error::Storage(StorageError::caused_by(e)))?;
        ready_rx
            .recv()
            .map_err(|_| Error::storage("the database connection's thread ended"))??;
        Ok(Self {
            how: Driven::Apart(jobs),
            session,
        })
    }

    /// Opens a connection driven on the thread that calls it, to be opened again as `reopen`
    /// says: for a connection only plain threads call (never one running an asynchronous
    /// runtime, where blocking on another runtime panics), one at a time. The open itself
    /// may be called anywhere: it connects on a thread of its own.
    ///
    /// # Errors
    /// [`Error::Storage`] naming the server and the cause when it cannot be reached, or when
    /// no runtime can be made.
    pub(crate) fn open_here(target: Target, name: &str, reopen: Reopen) -> Result<Self> {
        let session = Arc::new(AtomicU64::new(0));
        let published = Arc::clone(&session);
        let opening = std::thread::Builder::new()
            .name(format!("dtask-pg-{name}"))
            .spawn(move || -> Result<Here> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| {
                        Error::storage(format!(
                            "cannot start a runtime for a database connection: {e}"
                        ))
                    })?;
                let client = runtime.block_on(connect(&target))?;
                published.store(client.id, Ordering::Release);
                Ok(Here {
                    runtime: Some(runtime),
                    client: Ok(client),
                    target,
                    reopen,
                    session: published,
                })
            })
            .map_err(|e| Error::Storage(StorageError::caused_by(e)))?;
        let here = opening
            .join()
            .map_err(|_| Error::storage("the database connection's thread ended"))??;
        Ok(Self {
            how: Driven::Here(Arc::new(Mutex::new(here))),
            session,
        })
    }

    /// The id of the connection's session, the last one it opened ([`Session::id`]), read
    /// without a call: a session the connection has open, or had until a call finds it
    /// broken and opens another. Read before a commit on another connection, it names a
    /// session that was open before that commit.
    pub(crate) fn session(&self) -> u64 {
        self.session.load(Ordering::Acquire)
    }

    /// Runs `work` on the connection and waits for its answer.
    ///
    /// # Errors
    /// [`Error::Storage`] when the connection is down or the work failed.
    pub(crate) fn call<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Session>) -> BoxFuture<std::result::Result<T, tokio_postgres::Error>>
            + Send
            + 'static,
    {
        self.submit(work)?.wait()
    }

    /// Sends `work` to the connection and returns at once, with its answer to wait for: the
    /// caller works on while the server does (a connection driven on the caller's thread
    /// runs it now). Work sent to one connection runs in the order sent; an answer dropped
    /// unread is dropped when it comes.
    ///
    /// # Errors
    /// [`Error::Storage`] when the connection's thread has ended; the work's own failure
    /// comes from [`Answer::wait`].
    pub(crate) fn submit<T, F>(&self, work: F) -> Result<Answer<T>>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Session>) -> BoxFuture<std::result::Result<T, tokio_postgres::Error>>
            + Send
            + 'static,
    {
        let jobs = match &self.how {
            Driven::Apart(jobs) => jobs,
            Driven::Here(here) => {
                let mut here = here
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                return Ok(Answer(Coming::Ready(here.call(work))));
            }
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let job: Job = Box::new(move |client| {
            Box::pin(async move {
                let answer = match client {
                    Ok(client) => work(client).await.map_err(|e| storage(&e)),
                    Err(why) => Err(Error::storage(why)),
                };
                let _ = tx.send(answer);
            })
        });
        jobs.send(job)
            .map_err(|_| Error::storage("the database connection's thread ended"))?;
        Ok(Answer(Coming::Sent(rx)))
    }
}

/// The answer to work sent to a connection ([`Conn::submit`]).
pub(crate) struct Answer<T>(Coming<T>);

/// Where an [`Answer`] is.
enum Coming<T> {
    /// On its way from the connection's thread.
    Sent(std::sync::mpsc::Receiver<Result<T>>),
    /// Here already: the connection ran the work on the caller's thread.
    Ready(Result<T>),
}

impl<T> Answer<T> {
    /// Waits for the answer.
    ///
    /// # Errors
    /// [`Error::Storage`] when the connection is down or the work failed.
    pub(crate) fn wait(self) -> Result<T> {
        match self.0 {
            Coming::Sent(answer) => answer
                .recv()
                .map_err(|_| Error::storage("the database connection's thread ended"))?,
            Coming::Ready(answer) => answer,
        }
    }
}

impl Here {
    /// Runs `work` on the connection, on this thread: as a connection thread runs a job,
    /// opening the connection again first if it broke.
    fn call<T, F>(&mut self, work: F) -> Result<T>
    where
        F: FnOnce(Arc<Session>) -> BoxFuture<std::result::Result<T, tokio_postgres::Error>>,
    {
        let Self {
            runtime,
            client,
            target,
            reopen,
            session,
        } = self;
        let Some(runtime) = runtime.as_ref() else {
            return Err(Error::storage("the database connection is closed"));
        };
        runtime.block_on(async move {
            // The connection's task runs only while a call waits: let it read what the
            // server sent since the last call, so that a connection the server closed is
            // seen closed here, as a connection thread sees it. (The first yield lets the
            // runtime look at the socket, which readies the connection's task; the second
            // lets that task run.) Should it still be missed, the call fails on the broken
            // connection, and the next one opens it again.
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
            if client.as_ref().is_err() || client.as_ref().is_ok_and(|c| c.is_closed()) {
                if *reopen == Reopen::Never {
                    return Err(Error::storage(lost(target)));
                }
                *client = connect(target).await.map_err(|e| e.to_string());
                if let Ok(opened) = client {
                    session.store(opened.id, Ordering::Release);
                }
                if *reopen == Reopen::Loudly && client.is_ok() {
                    return Err(Error::storage(reopened(target)));
                }
            }
            match client {
                Ok(client) => work(Arc::clone(client)).await.map_err(|e| storage(&e)),
                Err(why) => Err(Error::storage(why.clone())),
            }
        })
    }
}

/// A database error as the journal's storage error, with the server's message.
pub(crate) fn storage(e: &tokio_postgres::Error) -> Error {
    let message = format!("postgres: {}", describe(e));
    Error::Storage(
        if e.code() == Some(&tokio_postgres::error::SqlState::DISK_FULL) {
            StorageError::no_space(message)
        } else {
            StorageError::new(message)
        },
    )
}

/// What went wrong, whole: the server's message and code, or the client's error with the
/// causes under it (a TLS handshake's failure names the certificate's fault only there).
fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {} ({})", db.severity(), db.message(), db.code().code());
    }
    let mut message = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(inner) = cause {
        message.push_str(": ");
        message.push_str(&inner.to_string());
        cause = inner.source();
    }
    message
}

/// Opens a connection and sets the session up.
async fn connect(target: &Target) -> Result<Arc<Session>> {
    let (client, connection) = target.connect().await.map_err(|e| {
        Error::Storage(StorageError::new(format!(
            "cannot connect to PostgreSQL at {}: {}",
            target.display,
            describe(&e)
        )))
    })?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "a PostgreSQL connection of the journal ended");
        }
    });
    // Whatever the database's or the role's defaults: the writer lock's design needs READ
    // COMMITTED — a batch that waited for the lock reads, in a snapshot taken after it, the
    // tail the writer before it committed (in the lock's transaction, and in each statement
    // of `dtask_write_batch`); under REPEATABLE READ or SERIALIZABLE the snapshot would be
    // the one taken before the wait, and the batch would build on a stale tail.
    let setup = format!(
        "SET search_path TO {}; SET synchronous_commit TO {}; SET statement_timeout TO 0; \
         SET default_transaction_isolation TO 'read committed'{}{}",
        quote_ident(&target.schema),
        if target.synchronous { "on" } else { "off" },
        if target.custom_plans {
            "; SET plan_cache_mode TO force_custom_plan"
        } else {
            ""
        },
        target
            .idle_in_transaction
            .map(|idle| format!(
                "; SET idle_in_transaction_session_timeout TO {}",
                idle.as_millis().max(1)
            ))
            .unwrap_or_default()
    );
    client
        .batch_execute(&setup)
        .await
        .map_err(|e| storage(&e))?;
    let backend_pid = client
        .query_typed("SELECT pg_backend_pid()", &[])
        .await
        .map_err(|e| storage(&e))?
        .first()
        .and_then(|row| row.try_get::<_, i32>(0).ok())
        .unwrap_or(0);
    Ok(Arc::new(Session {
        client,
        prepared: Mutex::new(HashMap::new()),
        id: SESSIONS.fetch_add(1, Ordering::Relaxed),
        backend_pid,
    }))
}

/// `name` as a quoted SQL identifier.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
pub(in crate::postgres) mod tests {
    use super::*;

    /// How to reach the test database (`DTASK_TEST_PG_URL`), or `None` when it is not set.
    fn test_target(test: &str) -> Option<Target> {
        let Ok(url) = std::env::var("DTASK_TEST_PG_URL") else {
            eprintln!("SKIPPED {test}: DTASK_TEST_PG_URL is not set (./dev test sets it)");
            return None;
        };
        let location = crate::postgres::PgLocation::parse(&url).unwrap();
        Some(Target::admin(&location))
    }

    /// A connection to the test database on a thread of its own.
    fn test_conn(test: &str) -> Option<Conn> {
        Some(Conn::open(test_target(test)?, test).unwrap())
    }

    /// Two connections to the test database, one on a thread of its own and one driven here
    /// ([`Conn::open_here`]).
    fn test_conns(test: &str, reopen: Reopen) -> Option<Vec<Conn>> {
        let target = test_target(test)?;
        Some(vec![
            Conn::open_with(target.clone(), test, reopen).unwrap(),
            Conn::open_here(target, test, reopen).unwrap(),
        ])
    }

    /// The statements prepared in the connection's session, and its backend's process id.
    fn session_state(conn: &Conn) -> (i64, i32) {
        conn.call(|client| {
            Box::pin(async move {
                // Unnamed, so as not to count itself.
                let rows = client
                    .query_typed(
                        "SELECT (SELECT count(*) FROM pg_prepared_statements), pg_backend_pid()",
                        &[],
                    )
                    .await?;
                Ok((rows[0].get(0), rows[0].get(1)))
            })
        })
        .unwrap()
    }

    fn run_statement(conn: &Conn, n: i64) -> i64 {
        conn.call(move |client| {
            Box::pin(async move {
                let statement = client
                    .statement("SELECT $1::int8 + 1", &[Type::INT8])
                    .await?;
                let row = client.query_one(&statement, &[&n]).await?;
                Ok(row.get::<_, i64>(0))
            })
        })
        .unwrap()
    }

    /// PostgreSQL's `disk_full` (SQLSTATE 53100), as the server raises it, is a storage
    /// error of kind `NoSpace`; another server error is a storage error of another kind.
    #[test]
    fn the_servers_disk_full_is_a_no_space_storage_error() {
        let Some(conn) = test_conn("disk-full") else {
            return;
        };
        let raise = |code: &'static str| {
            conn.call(move |client| {
                Box::pin(async move {
                    let raise = format!(
                        "DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '{code}'; END $$"
                    );
                    client.batch_execute(&raise).await
                })
            })
            .unwrap_err()
        };
        let full = raise("disk_full");
        assert!(full.is_no_space(), "{full}");
        assert!(full.to_string().contains("53100"), "{full}");
        let other = raise("io_error");
        assert!(
            matches!(&other, Error::Storage(e) if !other.is_no_space() && e.message().contains("58030")),
            "{other}"
        );
    }

    #[test]
    fn a_statement_is_prepared_once_per_connection_and_again_on_a_new_one() {
        let Some(conns) = test_conns("prepared-once", Reopen::Quietly) else {
            return;
        };
        for conn in conns {
            prepared_once_and_again(&conn);
        }
    }

    fn prepared_once_and_again(conn: &Conn) {
        let (before, pid) = session_state(conn);
        for n in 0..5 {
            assert_eq!(run_statement(conn, n), n + 1);
        }
        let (after, same_pid) = session_state(conn);
        assert_eq!(same_pid, pid);
        assert_eq!(after, before + 1, "prepared once for five runs");

        // The server ends the session: the next job finds the connection broken and fails,
        // the one after opens a new session, where the statement is prepared anew.
        terminate(pid);
        let mut reopened = None;
        for _ in 0..3 {
            let attempt = conn.call(move |client| {
                Box::pin(async move {
                    let statement = client
                        .statement("SELECT $1::int8 + 1", &[Type::INT8])
                        .await?;
                    let row = client.query_one(&statement, &[&41_i64]).await?;
                    Ok(row.get::<_, i64>(0))
                })
            });
            if let Ok(answer) = attempt {
                reopened = Some(answer);
                break;
            }
        }
        assert_eq!(
            reopened,
            Some(42),
            "the new session prepared the statement anew"
        );
        let (fresh, new_pid) = session_state(conn);
        assert_ne!(new_pid, pid);
        assert_eq!(fresh, 1, "only what the new session prepared");
    }

    /// Has the server end the session of backend `pid` (the tests of the journal over
    /// these connections use it too).
    pub(in crate::postgres) fn terminate(pid: i32) {
        test_conn("killer")
            .unwrap()
            .call(move |client| {
                Box::pin(async move {
                    // Returns once the backend is gone (or after 10 s).
                    client
                        .execute("SELECT pg_terminate_backend($1, 10000)", &[&pid])
                        .await
                })
            })
            .unwrap();
    }

    #[test]
    fn a_writers_connection_fails_the_first_call_on_a_new_session() {
        let Some(conns) = test_conns("loud", Reopen::Loudly) else {
            return;
        };
        for conn in conns {
            fails_first_on_a_new_session(&conn);
        }
    }

    fn fails_first_on_a_new_session(conn: &Conn) {
        let (_, pid) = session_state(conn);
        terminate(pid);
        // A call may first fail on the broken session; then one fails on the new session,
        // unsent and saying so; the next is answered there.
        let mut errors = Vec::new();
        let answered = loop {
            match conn.call(|client| {
                Box::pin(async move {
                    let row = client.query_one("SELECT pg_backend_pid()", &[]).await?;
                    Ok(row.get::<_, i32>(0))
                })
            }) {
                Ok(pid) => break pid,
                Err(e) => errors.push(e.to_string()),
            }
            assert!(errors.len() < 3, "{errors:?}");
        };
        assert_ne!(answered, pid);
        assert!(
            errors.iter().any(|e| e.contains("this call was not sent")),
            "{errors:?}"
        );
    }
}

//! One PostgreSQL connection on a thread of its own, called from synchronous code.
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

use crate::error::{Error, Result, StorageError};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_postgres::{Client, Config, NoTls};

/// What a job runs: given the client, a future of its answer.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

type Job = Box<dyn FnOnce(std::result::Result<Arc<Client>, String>) -> BoxFuture<()> + Send>;

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
}

/// A connection's handle. Cheap to clone; the thread ends when every handle is gone.
#[derive(Debug, Clone)]
pub(crate) struct Conn {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Conn {
    /// Starts the connection's thread and opens the connection.
    ///
    /// # Errors
    /// [`Error::Storage`] naming the server and the cause when it cannot be reached.
    pub(crate) fn open(target: Target, name: &str) -> Result<Self> {
        let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
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
                            client = connect(&target).await.map_err(|e| e.to_string());
                        }
                        job(client.clone()).await;
                    }
                });
            })
            .map_err(|e| Error::Storage(StorageError::caused_by(e)))?;
        ready_rx
            .recv()
            .map_err(|_| Error::storage("the database connection's thread ended"))??;
        Ok(Self { jobs })
    }

    /// Runs `work` on the connection and waits for its answer.
    ///
    /// # Errors
    /// [`Error::Storage`] when the connection is down or the work failed.
    pub(crate) fn call<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Client>) -> BoxFuture<std::result::Result<T, tokio_postgres::Error>>
            + Send
            + 'static,
    {
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
        self.jobs
            .send(job)
            .map_err(|_| Error::storage("the database connection's thread ended"))?;
        rx.recv()
            .map_err(|_| Error::storage("the database connection's thread ended"))?
    }
}

/// A database error as the journal's storage error, with the server's message.
pub(crate) fn storage(e: &tokio_postgres::Error) -> Error {
    let message = match e.as_db_error() {
        Some(db) => format!("{}: {} ({})", db.severity(), db.message(), db.code().code()),
        None => e.to_string(),
    };
    Error::Storage(StorageError::new(format!("postgres: {message}")))
}

/// Opens a connection and sets the session up.
async fn connect(target: &Target) -> Result<Arc<Client>> {
    let (client, connection) = target.config.connect(NoTls).await.map_err(|e| {
        Error::Storage(StorageError::new(format!(
            "cannot connect to PostgreSQL at {}: {e}",
            target.display
        )))
    })?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "a PostgreSQL connection of the journal ended");
        }
    });
    let setup = format!(
        "SET search_path TO {}; SET synchronous_commit TO {}; SET statement_timeout TO 0",
        quote_ident(&target.schema),
        if target.synchronous { "on" } else { "off" }
    );
    client
        .batch_execute(&setup)
        .await
        .map_err(|e| storage(&e))?;
    Ok(Arc::new(client))
}

/// `name` as a quoted SQL identifier.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

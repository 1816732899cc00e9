//! `dtask serve`: an HTTP API over a journal, a live web view of its tasks, and metrics.
//!
//! A [`Server`] reads a journal in one of two modes:
//!
//! - **owner** ([`Server::owner`]): it holds the engine's [`TaskStore`] (and optionally a
//!   [`Manager`]) and serves the control endpoints (submit, cancel, resume, release) as well
//!   as the inspection ones;
//! - **follower** ([`Server::follower`]): it follows a journal another process writes (a
//!   RocksDB secondary, as `dtask tail --follow`), inspection only.
//!
//! Modules, one concern each: `api` (handlers), [`model`] (bodies and their schemas), `read`
//! (journal reads), `control` (writes), `extract` (request parsing), [`error`] (error
//! bodies), `sse` (the commit pump and the streams), `projection` (counts), `metrics`, `auth`
//! (the token), `health` (liveness and readiness), [`openapi`] and `web` (the page). The endpoints are described in
//! `docs/server.md`.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use dtask::server::{Server, ServerConfig};
//! use dtask::{Journal, JournalOptions, StoreConfig, SystemClock, TaskStore};
//! let journal = Journal::open("/var/lib/svc/journal", JournalOptions::default())?;
//! let store = TaskStore::open(journal, SystemClock, StoreConfig::default())?;
//! let server = Server::owner(store, None, ServerConfig::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7700").await?;
//! server.serve(listener, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

mod api;
mod auth;
mod control;
pub mod error;
mod extract;
mod health;
mod metrics;
pub mod model;
pub mod openapi;
mod projection;
mod read;
mod sse;
mod web;

pub use error::{ApiError, ServerError};
pub use metrics::WriteMetrics;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use dtask_engine::{Manager, TaskStore};
use dtask_journal::Journal;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// Settings of a [`Server`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// The bearer token every request must carry; required to listen off loopback.
    pub token: Option<String>,
    /// The largest request body, in bytes. Default: 2 MiB (a task's payload may be 1 MiB).
    pub body_limit: usize,
    /// How often a follower's pump looks for new commits when it found none (an owner's pump
    /// is woken by the journal's durable watermark, and uses it only as a safety net).
    /// Default: 100 ms.
    pub poll_interval: Duration,
    /// The most streams open at once. Default: 256.
    pub max_streams: usize,
    /// Committed records kept for streams that fall behind before they go back to the
    /// journal. Default: 1024.
    pub stream_buffer: usize,
    /// How long after the last count of the journal a trim has the counts of `/api/stats`
    /// and `/metrics` made again: a trim rewrites records in place, which the counts kept
    /// from the commits do not follow (record types and bytes stand for the trimmed records
    /// as they were until then). Default: 30 s.
    pub recount_after_trim: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            token: None,
            body_limit: 2 << 20,
            poll_interval: Duration::from_millis(100),
            max_streams: 256,
            stream_buffer: 1024,
            recount_after_trim: Duration::from_secs(30),
        }
    }
}

impl ServerConfig {
    /// Sets [`ServerConfig::token`].
    #[must_use]
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Sets [`ServerConfig::poll_interval`].
    #[must_use]
    pub fn with_poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }

    /// Sets [`ServerConfig::recount_after_trim`].
    #[must_use]
    pub fn with_recount_after_trim(mut self, after: Duration) -> Self {
        self.recount_after_trim = after;
        self
    }

    /// Sets [`ServerConfig::body_limit`].
    #[must_use]
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// Sets [`ServerConfig::stream_buffer`].
    #[must_use]
    pub fn with_stream_buffer(mut self, records: usize) -> Self {
        self.stream_buffer = records;
        self
    }
}

/// What every handler shares.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The journal read (in owner mode the store's journal's durable view).
    pub journal: Journal,
    /// The writer, in owner mode.
    pub owner: Option<control::Owner>,
    /// Whether the journal is a follower.
    pub follower: bool,
    /// The counts.
    pub projection: Arc<projection::Projection>,
    /// The streams' broadcast.
    pub hub: Arc<sse::Hub>,
    /// The metrics.
    pub metrics: Arc<metrics::Metrics>,
    /// Turns true when the server stops (ends the streams).
    pub stop: watch::Receiver<bool>,
    /// One audit at a time.
    pub verify_gate: Arc<Semaphore>,
    /// Whether the pump's last read of the journal's commits failed.
    pub read_failing: Arc<AtomicBool>,
    /// What a synced append promises where an embedded journal lies (examined once, when
    /// the server is made); `None` on PostgreSQL.
    pub sync_promise: Option<dtask_journal::probe::Verdict>,
}

/// The HTTP server over a journal.
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
    config: ServerConfig,
    stop: watch::Sender<bool>,
}

impl Server {
    fn new(
        journal: Journal,
        owner: Option<control::Owner>,
        follower: bool,
        config: ServerConfig,
    ) -> Self {
        let (stop, stopped) = watch::channel(false);
        let sync_promise = journal
            .dir()
            .and_then(|dir| dtask_journal::probe::Placement::examine(dir).ok())
            .map(|placement| placement.verdict(None));
        let metrics = metrics::Metrics::new();
        if let Some(verdict) = &sync_promise {
            metrics.set_sync_promise(verdict.promise.as_str());
        }
        let shared = Arc::new(Shared {
            journal,
            owner,
            follower,
            projection: Arc::default(),
            hub: Arc::new(sse::Hub::new(config.stream_buffer, config.max_streams)),
            metrics: Arc::new(metrics),
            stop: stopped,
            verify_gate: Arc::new(Semaphore::new(1)),
            read_failing: Arc::default(),
            sync_promise,
        });
        Self {
            shared,
            config,
            stop,
        }
    }

    /// A server that owns the journal through `store` (and `manager`, when given: submits
    /// are then checked against its executors, and cancels reach its running attempts).
    ///
    /// Its reads, streams and counts go through the store's journal's durable view
    /// ([`Journal::durable_view`]): on an embedded journal the journal itself, on a shared
    /// PostgreSQL journal a read-only view that shows only what the database has flushed, so
    /// that nothing the server shows can be taken back by a crash of the database.
    ///
    /// The server installs its metrics' observer on the store's journal
    /// ([`Journal::observe`]) unless another one is installed already.
    pub fn owner(store: TaskStore, manager: Option<Manager>, config: ServerConfig) -> Self {
        let journal = store.journal().durable_view();
        let writer = store.journal().clone();
        let server = Self::new(
            journal,
            Some(control::Owner { store, manager }),
            false,
            config,
        );
        writer.observe(server.shared.metrics.write_observer());
        server
    }

    /// A read-only server following `journal`, opened with [`Journal::open_follower`] (it is
    /// caught up as the server polls) or [`Journal::open_read_only`] (a fixed view).
    pub fn follower(journal: Journal, config: ServerConfig) -> Self {
        Self::new(journal, None, true, config)
    }

    /// Checks that the server may listen on `addr`: off loopback, a token is required.
    ///
    /// # Errors
    /// [`ServerError::TokenRequired`], [`ServerError::WeakToken`].
    pub fn check_listen(addr: SocketAddr, token: Option<&str>) -> Result<(), ServerError> {
        match token {
            Some(t) if t.len() < auth::MIN_TOKEN_LEN => Err(ServerError::WeakToken {
                min: auth::MIN_TOKEN_LEN,
            }),
            Some(_) => Ok(()),
            None if addr.ip().is_loopback() => Ok(()),
            None => Err(ServerError::TokenRequired(addr)),
        }
    }

    /// The routes, with the token check, the body limit and the metrics around them.
    pub fn router(&self) -> Router {
        let token = self
            .config
            .token
            .as_deref()
            .map(|t| Arc::new(auth::Token::new(t)));
        Router::new()
            .route("/", get(web::index))
            .route("/assets/app.js", get(web::script))
            .route("/assets/style.css", get(web::style))
            .route("/favicon.ico", get(web::favicon))
            .route("/api/tasks", get(api::list_tasks).post(api::submit))
            .route(
                "/api/tasks/{id}",
                get(api::get_task).delete(api::purge_task),
            )
            .route("/api/tasks/{id}/records", get(api::get_records))
            .route("/api/tasks/{id}/state", get(api::get_state))
            .route("/api/tasks/{id}/updates", get(api::get_updates))
            .route("/api/tasks/{id}/conversation", get(api::get_conversation))
            .route("/api/tasks/{id}/stream", get(api::task_stream))
            .route("/api/tasks/{id}/cancel", post(api::cancel))
            .route("/api/tasks/{id}/resume", post(api::resume))
            .route("/api/tasks/{id}/inputs", post(api::send_input))
            .route("/api/tasks/{id}/messages", post(api::send_message))
            .route("/api/tasks/{id}/close", post(api::close_run))
            .route("/api/tasks/{id}/release", post(api::release))
            .route("/api/tasks/{id}/rerun", post(api::rerun))
            .route(
                "/api/tasks/{id}/hold",
                post(api::hold_task).delete(api::lift_hold),
            )
            .route("/api/tasks/{id}/trim", post(api::trim_task))
            .route(
                "/api/notifications/receive",
                post(api::receive_notifications),
            )
            .route("/api/notifications/ack", post(api::ack_notification))
            .route("/api/verify", post(api::verify))
            .route("/api/stats", get(api::stats))
            .route("/api/stream", get(api::stream))
            .route("/metrics", get(api::metrics))
            .route("/openapi.json", get(api::openapi))
            .route("/healthz", get(health::live))
            .route("/readyz", get(health::ready))
            .fallback(api::not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .with_state(Arc::clone(&self.shared))
            .layer(DefaultBodyLimit::max(self.config.body_limit))
            .layer(axum::middleware::from_fn_with_state(
                token.clone(),
                auth::require,
            ))
            .layer(axum::middleware::from_fn_with_state(
                token,
                auth::same_origin,
            ))
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(&self.shared.metrics),
                metrics::track,
            ))
    }

    /// Serves on `listener` until `shutdown` completes, then stops the streams and the pump
    /// and lets the requests under way finish.
    ///
    /// # Errors
    /// [`ServerError::TokenRequired`] off loopback without a token; I/O errors.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let addr = listener.local_addr().map_err(|source| ServerError::Io {
            context: "reading the listen address",
            source,
        })?;
        Self::check_listen(addr, self.config.token.as_deref())?;
        let router = self.router();
        let pump = sse::Pump {
            journal: self.shared.journal.clone(),
            follower: self.shared.follower,
            projection: Arc::clone(&self.shared.projection),
            hub: Arc::clone(&self.shared.hub),
            metrics: Arc::clone(&self.shared.metrics),
            read_failing: Arc::clone(&self.shared.read_failing),
            interval: self.config.poll_interval,
            recount_after_trim: self.config.recount_after_trim,
        };
        let pump = tokio::spawn(pump.run(self.stop.subscribe()));
        let stop = self.stop;
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                shutdown.await;
                // Ends the streams (which would otherwise hold the graceful shutdown) and the
                // pump.
                stop.send_replace(true);
            })
            .await;
        // The pump ends once it sees the stop; a panic in it is not this server's result.
        let _ = pump.await;
        served.map_err(|source| ServerError::Io {
            context: "serving",
            source,
        })
    }
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this endpoint does not take that method",
    )
}

//! Shared helpers of the store's integration tests: a real journal in a temporary directory,
//! a manual clock, and reopening (drop everything, open again on the same directory).
//!
//! With `DTASK_TEST_BACKEND=postgres` (and `DTASK_TEST_PG_URL`) the journal is on
//! PostgreSQL instead, in a schema of each store's own: `./dev test` runs the guarantee
//! suite, the G3 scenarios, the races, the model and the durable agent both ways.

#![allow(dead_code, clippy::unwrap_used, clippy::missing_panics_doc)]

use dtask_engine::{
    Command, CreateRequest, ManualClock, Notification, StoreConfig, StoreError, TaskStore,
};
use dtask_journal::{Durability, Journal, JournalOptions, LeasePolicy, TaskSpec};
use dtask_replay::TaskState;
use std::time::Duration;
use tempfile::TempDir;

/// The clock reading every test starts at (milliseconds).
pub const T0: u64 = 1_700_000_000_000;

/// The default lease, in milliseconds.
pub const LEASE_MS: u64 = 30_000;

/// The executor key of tasks created by the helpers.
pub const KEY: &str = "exec";

/// The PostgreSQL URL of a fresh schema when the tests run on PostgreSQL.
fn postgres_location() -> Option<String> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    if std::env::var("DTASK_TEST_BACKEND").as_deref() != Ok("postgres") {
        return None;
    }
    let base = std::env::var("DTASK_TEST_PG_URL")
        .expect("DTASK_TEST_BACKEND=postgres needs DTASK_TEST_PG_URL (./dev test sets both)");
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let sep = if base.contains('?') { '&' } else { '?' };
    Some(format!("{base}{sep}schema=e{}_{n}", std::process::id()))
}

/// A store over a journal in its own temporary directory (or PostgreSQL schema), with a
/// manual clock.
pub struct Env {
    pub dir: TempDir,
    /// The PostgreSQL journal's URL, when the tests run on PostgreSQL.
    pub postgres: Option<String>,
    pub clock: ManualClock,
    pub config: StoreConfig,
    pub durability: Durability,
    store: Option<TaskStore>,
}

impl Env {
    /// A fresh store (buffered durability, default config).
    pub fn new() -> Self {
        Self::with(StoreConfig::default(), Durability::Buffered)
    }

    /// A fresh store with `config` and `durability`.
    pub fn with(config: StoreConfig, durability: Durability) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let postgres = postgres_location();
        let clock = ManualClock::new(T0);
        let store = open_at(dir.path(), postgres.as_deref(), &clock, &config, durability);
        Self {
            dir,
            postgres,
            clock,
            config,
            durability,
            store: Some(store),
        }
    }

    /// A fresh store with `config` (buffered durability) whose journal writes every batch on
    /// its writer thread, with a [`Gate`] on that thread (disarmed). A reopen opens the
    /// journal without it.
    pub fn gated(config: StoreConfig) -> (Self, Gate) {
        let dir = tempfile::tempdir().unwrap();
        let postgres = postgres_location();
        let clock = ManualClock::new(T0);
        let durability = Durability::Buffered;
        let options = JournalOptions::default()
            .with_durability(durability)
            .with_inline_lone_appends(false);
        let journal = open_journal(dir.path(), postgres.as_deref(), options);
        let gate = Gate::new();
        assert!(journal.observe(gate.observer.clone()));
        let store = TaskStore::open(journal, clock.clone(), config.clone()).unwrap();
        let env = Self {
            dir,
            postgres,
            clock,
            config,
            durability,
            store: Some(store),
        };
        (env, gate)
    }

    /// The store.
    pub fn store(&self) -> &TaskStore {
        self.store.as_ref().unwrap()
    }

    /// Drops the store and its journal, then opens both again on the same directory with the
    /// same clock.
    pub fn reopen(&mut self) {
        drop(self.store.take());
        self.store = Some(open_at(
            self.dir.path(),
            self.postgres.as_deref(),
            &self.clock,
            &self.config,
            self.durability,
        ));
    }

    /// Drops the store and its journal (closing the journal), keeping the directory.
    pub fn close(&mut self) {
        drop(self.store.take());
    }

    /// Moves the clock forward by `ms` milliseconds.
    pub fn advance(&self, ms: u64) {
        self.clock.advance(Duration::from_millis(ms));
    }
}

impl Default for Env {
    fn default() -> Self {
        Self::new()
    }
}

/// Opens a store on `dir`.
pub fn open(
    dir: &std::path::Path,
    clock: &ManualClock,
    config: &StoreConfig,
    durability: Durability,
) -> TaskStore {
    open_at(dir, None, clock, config, durability)
}

/// Opens a store on the PostgreSQL journal at `postgres`, or else on `dir`.
pub fn open_at(
    dir: &std::path::Path,
    postgres: Option<&str>,
    clock: &ManualClock,
    config: &StoreConfig,
    durability: Durability,
) -> TaskStore {
    let options = JournalOptions::default().with_durability(durability);
    let journal = open_journal(dir, postgres, options);
    TaskStore::open(journal, clock.clone(), config.clone()).unwrap()
}

/// Opens the journal at `postgres` with `options`, or else on `dir`.
fn open_journal(dir: &std::path::Path, postgres: Option<&str>, options: JournalOptions) -> Journal {
    match postgres {
        Some(url) => Journal::open_postgres(url, options).unwrap(),
        None => Journal::open(dir, options).unwrap(),
    }
}

/// Holds a journal's writer thread, once armed, after it has written its next batch and
/// before that batch is synced and made visible: its records are written and not yet read by
/// anyone, and every append submitted meanwhile waits behind it, not written at all, until
/// the test lets the writer go ([`Env::gated`]).
pub struct Gate {
    observer: std::sync::Arc<HoldNextBatch>,
    held: std::sync::mpsc::Receiver<()>,
    release: std::sync::mpsc::SyncSender<()>,
}

impl Gate {
    fn new() -> Self {
        let (held_tx, held) = std::sync::mpsc::sync_channel(1);
        let (release, release_rx) = std::sync::mpsc::sync_channel(1);
        let observer = std::sync::Arc::new(HoldNextBatch {
            armed: std::sync::atomic::AtomicBool::new(false),
            held: std::sync::Mutex::new(held_tx),
            release: std::sync::Mutex::new(release_rx),
        });
        Self {
            observer,
            held,
            release,
        }
    }

    /// Holds the next batch written.
    pub fn arm(&self) {
        self.observer
            .armed
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Waits until the writer holds a batch, yielding meanwhile (so that what this runtime
    /// runs — a write in a task of its own — gets to submit it); fails after a minute, a
    /// deadlock guard.
    pub async fn until_held(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            match self.held.try_recv() {
                Ok(()) => return,
                Err(std::sync::mpsc::TryRecvError::Empty) => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the writer never held a batch"
                    );
                    tokio::task::yield_now().await;
                }
                Err(std::sync::mpsc::TryRecvError::Disconnected) => panic!("the gate is gone"),
            }
        }
    }

    /// Lets the held batch, and the writer, go.
    pub fn release(&self) {
        self.release.send(()).unwrap();
    }
}

/// The [`Gate`]'s observer of the writer.
#[derive(Debug)]
struct HoldNextBatch {
    armed: std::sync::atomic::AtomicBool,
    held: std::sync::Mutex<std::sync::mpsc::SyncSender<()>>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl dtask_journal::WriteObserver for HoldNextBatch {
    fn batch_written(&self, _: &dtask_journal::observe::BatchWritten) {
        if self.armed.swap(false, std::sync::atomic::Ordering::AcqRel) {
            // A gate dropped (its test failed) lets the writer go.
            let _ = self.held.lock().unwrap().send(());
            let _ = self.release.lock().unwrap().recv();
        }
    }
}

/// A spec with `id` and the default executor key.
pub fn spec(id: &str) -> TaskSpec {
    TaskSpec {
        id: id.to_owned(),
        executor_key: KEY.to_owned(),
        kind: "background_tool".to_owned(),
        payload: format!("payload of {id}").into_bytes(),
        description: format!("task {id}"),
        ..TaskSpec::default()
    }
}

/// A spec routed to a session, with session notifications on or off.
pub fn session_spec(id: &str, notify: bool) -> TaskSpec {
    TaskSpec {
        session_id: "session-1".to_owned(),
        notify_session: notify,
        ..spec(id)
    }
}

/// A create request of `spec` under `policy`.
pub fn request(spec: TaskSpec, policy: LeasePolicy) -> CreateRequest {
    CreateRequest {
        spec,
        policy: Some(policy),
        ..CreateRequest::default()
    }
}

/// A child of `parent`'s running attempt.
pub fn child_request(id: &str, parent: &str, attempt: u64, notify: bool) -> CreateRequest {
    CreateRequest {
        spec: TaskSpec {
            notify_session: notify,
            ..spec(id)
        },
        policy: Some(LeasePolicy::Retry),
        parent: Some(dtask_engine::ExecutionContext {
            task_id: parent.to_owned(),
            attempt,
            generation: 1,
        }),
        ..CreateRequest::default()
    }
}

/// Creates a plain task.
pub async fn create(store: &TaskStore, id: &str, policy: LeasePolicy) -> TaskState {
    store.create(request(spec(id), policy)).await.unwrap()
}

/// Creates a plain task and claims it.
pub async fn running(store: &TaskStore, id: &str, policy: LeasePolicy) -> TaskState {
    let t = create(store, id, policy).await;
    store.execute(id, t.version, Command::Start).await.unwrap()
}

/// Executes `command` at the task's current version.
pub async fn exec(store: &TaskStore, id: &str, command: Command) -> Result<TaskState, StoreError> {
    let v = store.get(id).await?.version;
    store.execute(id, v, command).await
}

/// Executes `command` at the task's current version and expects success.
pub async fn ok(store: &TaskStore, id: &str, command: Command) -> TaskState {
    exec(store, id, command).await.unwrap()
}

/// The checkpoint command arguments.
pub fn cp(bytes: &str) -> Vec<u8> {
    bytes.as_bytes().to_vec()
}

/// A stable name of an error variant, for comparing outcomes.
pub fn kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::Invalid { .. } => "Invalid",
        StoreError::NotFound(_) => "NotFound",
        StoreError::AlreadyExists(_) => "AlreadyExists",
        StoreError::VersionConflict { .. } => "VersionConflict",
        StoreError::LeaseLost(_) => "LeaseLost",
        StoreError::IllegalTransition { .. } => "IllegalTransition",
        StoreError::InvalidExecutionResult(_) => "InvalidExecutionResult",
        StoreError::AlreadyTerminal(_) => "AlreadyTerminal",
        StoreError::NotDue { .. } => "NotDue",
        StoreError::InvalidCursor(_) => "InvalidCursor",
        StoreError::EventIdConflict(_) => "EventIdConflict",
        StoreError::NotificationUnavailable(_) => "NotificationUnavailable",
        StoreError::NotificationEventIdConflict(_) => "NotificationEventIdConflict",
        StoreError::MailboxSealed(_) => "MailboxSealed",
        StoreError::OwnershipLost { .. } => "OwnershipLost",
        StoreError::CursorConflict { .. } => "CursorConflict",
        StoreError::InputConflict(_) => "InputConflict",
        StoreError::InputsPending(_) => "InputsPending",
        StoreError::EventClosed(_) => "EventClosed",
        StoreError::PartConflict { .. } => "PartConflict",
        StoreError::Closed => "Closed",
        StoreError::Journal(_) => "Journal",
        StoreError::Replay(_) => "Replay",
        _ => "Other",
    }
}

/// The name of a result's outcome: "Ok" or the error variant.
pub fn outcome<T>(r: &Result<T, StoreError>) -> &'static str {
    match r {
        Ok(_) => "Ok",
        Err(e) => kind(e),
    }
}

/// Asserts that `result` failed with an error matching `pattern` (a typed variant, e.g.
/// `StoreError::LeaseLost(_)`).
#[allow(unused_macros)]
macro_rules! assert_err {
    ($result:expr, $pattern:pat) => {
        match $result {
            Ok(v) => panic!("expected {}, got Ok({v:?})", stringify!($pattern)),
            Err(e) => assert!(
                matches!(e, $pattern),
                "expected {}, got: {e:?}",
                stringify!($pattern)
            ),
        }
    };
}
#[allow(unused_imports)]
pub(crate) use assert_err;

/// Receives everything deliverable with a long lease.
pub async fn receive_all(store: &TaskStore) -> Vec<Notification> {
    store
        .receive_notifications(1000, Duration::from_secs(600))
        .await
        .unwrap()
}

/// Receives and acknowledges everything deliverable; returns the notification ids in order.
pub async fn drain(store: &TaskStore) -> Vec<String> {
    let got = receive_all(store).await;
    for n in &got {
        store.ack_notification(&n.receipt).await.unwrap();
    }
    got.into_iter().map(|n| n.id).collect()
}

/// The executor keys used by listings.
pub fn keys() -> Vec<String> {
    vec![KEY.to_owned()]
}

//! The polling worker: claims pending tasks of its executor keys and runs them.

use super::error::RuntimeError;
use super::manager::Manager;
use dtask_journal::Timestamp;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Worker settings.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerConfig {
    /// The executor keys to claim tasks of (non-empty, each non-empty).
    pub executor_keys: Vec<String>,
    /// How often to look for pending tasks when not woken earlier. Default: 1 s.
    pub poll_interval: Duration,
    /// The most attempts running at once. Default: 1.
    pub max_concurrent: usize,
    /// Tasks never claimed (attempt 0) are skipped until this long after creation; the
    /// worker looks again when the first it skipped becomes claimable (not only at its next
    /// poll). Default: 0.
    pub initial_pickup_delay: Duration,
}

impl WorkerConfig {
    /// A worker for `keys` with the defaults.
    #[must_use]
    pub fn new(keys: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            executor_keys: keys.into_iter().map(Into::into).collect(),
            poll_interval: Duration::from_secs(1),
            max_concurrent: 1,
            initial_pickup_delay: Duration::ZERO,
        }
    }

    /// Sets [`WorkerConfig::max_concurrent`] (at least 1).
    #[must_use]
    pub fn with_max_concurrent(mut self, n: usize) -> Self {
        self.max_concurrent = n.max(1);
        self
    }

    /// Sets [`WorkerConfig::poll_interval`].
    #[must_use]
    pub fn with_poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }

    /// Sets [`WorkerConfig::initial_pickup_delay`].
    #[must_use]
    pub fn with_initial_pickup_delay(mut self, delay: Duration) -> Self {
        self.initial_pickup_delay = delay;
        self
    }
}

/// Claims and runs pending tasks until told to stop.
#[derive(Debug)]
pub struct Worker {
    manager: Manager,
    config: WorkerConfig,
}

impl Worker {
    /// A worker on `manager`.
    ///
    /// # Errors
    /// [`RuntimeError::Store`] with an invalid-request error for an empty key set or key.
    pub fn new(manager: Manager, config: WorkerConfig) -> Result<Self, RuntimeError> {
        if config.executor_keys.is_empty() || config.executor_keys.iter().any(String::is_empty) {
            return Err(RuntimeError::Store(crate::store::StoreError::Invalid {
                field: "executor keys",
                reason: "must be non-empty, each key non-empty".into(),
            }));
        }
        Ok(Self { manager, config })
    }

    /// Runs until `shutdown` resolves: pages through pending tasks, skips those already in
    /// flight here, runs each under the concurrency limit. Wakes early when a task becomes
    /// pending in this process; keeps polling for tasks other processes create. Lost races are
    /// benign. So is the journal's storage failing for a while — a full disk, a PostgreSQL
    /// database out of reach ([`RuntimeError::is_storage_outage`]): a claim or a listing it
    /// refused is tried again at the next poll. On shutdown it stops claiming, waits for its
    /// attempts and returns.
    ///
    /// # Errors
    /// The first dispatch or listing error that is neither (after waiting for running
    /// attempts): among them a journal that stopped after a failed sync, which only a reopen
    /// of the journal ends.
    #[allow(
        clippy::too_many_lines,
        reason = "the worker's one loop: list, claim, wait, read best in one place"
    )]
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), RuntimeError> {
        let store = self.manager.store().clone();
        let mut pending_signal = store.pending_signal();
        let slots = Arc::new(Semaphore::new(self.config.max_concurrent));
        let in_flight: Arc<Mutex<HashSet<String>>> = Arc::default();
        // Tasks this process's executors refused, by version: passed over (`note_refusal`).
        let refused: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
        let mut attempts = JoinSet::new();
        let delay = u64::try_from(self.config.initial_pickup_delay.as_millis()).unwrap_or(u64::MAX);
        tokio::pin!(shutdown);
        let mut failure = None;
        let mut outage = Outage::default();
        'poll: loop {
            let mut cursor: Option<String> = None;
            // When the youngest task skipped for the pickup delay becomes claimable.
            let mut young_due: Option<Timestamp> = None;
            loop {
                let page = match store
                    .list_pending(&self.config.executor_keys, cursor.as_deref(), 100)
                    .await
                {
                    Ok(page) => {
                        outage.listed();
                        page
                    }
                    Err(e) => {
                        let e = RuntimeError::Store(e);
                        if !e.is_storage_outage() {
                            failure = Some(e);
                            break 'poll;
                        }
                        // Tried again at the next poll.
                        outage.met(&e, true);
                        break;
                    }
                };
                for task in page.tasks {
                    let id = task.spec.id.clone();
                    let claimable_at = task.created_at.plus_millis(delay);
                    if task.attempt == 0 && claimable_at > store.now() {
                        young_due = Some(young_due.map_or(claimable_at, |t| t.min(claimable_at)));
                        continue;
                    }
                    if refused.lock().get(&id) == Some(&task.version) {
                        continue;
                    }
                    if !in_flight.lock().insert(id.clone()) {
                        continue;
                    }
                    let permit = tokio::select! {
                        permit = Arc::clone(&slots).acquire_owned() => permit,
                        () = &mut shutdown => {
                            in_flight.lock().remove(&id);
                            break 'poll;
                        }
                    };
                    let Ok(permit) = permit else { break 'poll };
                    let manager = self.manager.clone();
                    let in_flight = Arc::clone(&in_flight);
                    let (refused, version) = (Arc::clone(&refused), task.version);
                    attempts.spawn(async move {
                        let result = manager.execute(&id).await;
                        in_flight.lock().remove(&id);
                        drop(permit);
                        note_refusal(result.map(drop), &refused, id, version)
                    });
                }
                while let Some(done) = attempts.try_join_next() {
                    if let Some(e) = outage.filter(done) {
                        failure = Some(e);
                        break 'poll;
                    }
                }
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            // A delayed task, or one skipped for the pickup delay, comes due without a
            // signal: look again then, if that is sooner than the next poll.
            let due = store.next_due().into_iter().chain(young_due).min();
            let wait = due.map_or(self.config.poll_interval, |due| {
                let ms = due.0.saturating_sub(store.now().0);
                self.config.poll_interval.min(Duration::from_millis(ms))
            });
            let mut waited = Duration::ZERO;
            tokio::select! {
                () = &mut shutdown => break,
                _ = pending_signal.changed() => {}
                () = tokio::time::sleep(wait) => waited = wait,
                Some(done) = attempts.join_next() => {
                    if let Some(e) = outage.filter(done) {
                        failure = Some(e);
                        break;
                    }
                }
            }
            if !self.outage_pause(&outage, waited, shutdown.as_mut()).await {
                break;
            }
        }
        while let Some(done) = attempts.join_next().await {
            if let (None, Some(e)) = (&failure, outage.filter(done)) {
                failure = Some(e);
            }
        }
        failure.map_or(Ok(()), Err)
    }
}

/// The journal's storage failing for a while, as the worker meets it: logged when it begins
/// and when it ends (the journal logs each failed write itself).
#[derive(Debug, Default)]
struct Outage {
    /// Whether the last claim or listing failed so.
    on: bool,
    /// Whether it was a listing (a claim's outage is over only when a claim succeeds: the
    /// listing of an embedded store is read from memory, and succeeds meanwhile).
    by_listing: bool,
}

impl Outage {
    /// Notes that a claim or (`listing`) a listing failed with `error`, a storage outage.
    fn met(&mut self, error: &RuntimeError, listing: bool) {
        self.by_listing = listing;
        if std::mem::replace(&mut self.on, true) {
            tracing::debug!(%error, "the worker's claim or listing failed again: it tries again at its next poll");
        } else {
            tracing::warn!(%error, "the journal's storage fails: the worker tries again at each poll");
        }
    }

    /// Notes that a listing succeeded: the end of an outage a listing met.
    fn listed(&mut self) {
        if self.by_listing {
            self.over();
        }
    }

    /// Notes that the storage answers again.
    fn over(&mut self) {
        if std::mem::take(&mut self.on) {
            tracing::info!("the journal's storage answers again: the worker claims again");
        }
    }

    /// The failure of a dispatched attempt that ended as `done`, unless it is a storage
    /// outage (then noted, and `None`); a claim that went through ends an outage.
    fn filter(
        &mut self,
        done: Result<Result<(), RuntimeError>, tokio::task::JoinError>,
    ) -> Option<RuntimeError> {
        if matches!(done, Ok(Ok(()))) {
            self.over();
        }
        match dispatch_failure(done) {
            Some(e) if e.is_storage_outage() => {
                self.met(&e, false);
                None
            }
            other => other,
        }
    }
}

impl Worker {
    /// While the storage fails, the next look is a poll interval away, whatever woke this
    /// one: a claim refused at once (a full disk refuses every write straight away) ended
    /// its attempt and woke the worker, which listed the same task from memory and claimed
    /// it again — a tight loop of failing writes and their log lines. (Nothing more when the
    /// poll `waited` a whole interval already, or the storage answers.) `false` when
    /// `shutdown` came first.
    async fn outage_pause(
        &self,
        outage: &Outage,
        waited: Duration,
        shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> bool {
        if !outage.on || waited >= self.config.poll_interval {
            return true;
        }
        tokio::select! {
            () = shutdown => false,
            () = tokio::time::sleep(self.config.poll_interval) => true,
        }
    }
}

/// An attempt's `result`, but for a refusal of the task by this process's executor
/// (`InvalidSpec`, `InvalidExecution`: a tool this process does not register, say): logged
/// and noted in `refused` with the `version` refused — the task left pending for a process
/// that runs it, and passed over here until it changes — and not the worker's failure.
fn note_refusal(
    result: Result<(), RuntimeError>,
    refused: &Mutex<HashMap<String, u64>>,
    id: String,
    version: u64,
) -> Result<(), RuntimeError> {
    match result {
        Err(e @ (RuntimeError::InvalidSpec(_) | RuntimeError::InvalidExecution(_))) => {
            tracing::warn!(
                task = %id,
                error = %e,
                "this process's executor refuses the task: it is left pending for a process \
                 that runs it"
            );
            let mut refused = refused.lock();
            if refused.len() >= MAX_REFUSED {
                refused.clear();
            }
            refused.insert(id, version);
            Ok(())
        }
        result => result,
    }
}

/// The refused tasks a worker remembers at most (past them it forgets them all, and meets
/// each again once).
const MAX_REFUSED: usize = 100_000;

fn dispatch_failure(
    done: Result<Result<(), RuntimeError>, tokio::task::JoinError>,
) -> Option<RuntimeError> {
    match done {
        // An attempt that could not commit (drain, invalid result, lost lease) leaves its
        // task to lease expiry; that is the engine working, not a worker failure.
        Ok(
            Ok(())
            | Err(
                RuntimeError::DrainCheckpointUnavailable
                | RuntimeError::LeaseLost(_)
                | RuntimeError::Store(crate::store::StoreError::InvalidExecutionResult(_)),
            ),
        ) => None,
        Ok(Err(e)) if e.is_benign() => None,
        Ok(Err(e)) => Some(e),
        Err(join) => Some(RuntimeError::AttemptFailed(join.to_string())),
    }
}

//! The manager: submit, wait, cancel, resume, execute one attempt, close with drain.

use super::attempt::AttemptContext;
use super::control::Control;
use super::error::RuntimeError;
use super::executor::{ExecutionError, ExecutionResult, Executor, ExecutorRegistry};
use crate::store::{Command, CreateRequest, ExecutionContext, StoreError, TaskStore};
use dtask_journal::TaskSpec;
use dtask_replay::{Status, TaskState};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tracing::Instrument;

/// The longest executor error text kept in a failed task.
pub const MAX_ERROR_BYTES: usize = 4096;

/// How many times cancel and release retry a version conflict.
const CAS_TRIES: usize = 8;

/// A generator of task ids, given the kind prefix.
pub type IdGenerator = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// Manager settings.
#[derive(Clone)]
#[non_exhaustive]
pub struct ManagerConfig {
    /// How often a running attempt renews its lease; keep it well below the store's lease
    /// duration. Default: 10 s.
    pub heartbeat_interval: Duration,
    /// A custom task-id generator; `None` gives `<kind or "task">_<UUID v7>`.
    pub id_generator: Option<IdGenerator>,
    /// How long a cancel that ended its task with no attempt left to stop its work waits
    /// for the executor's hook ([`Executor::canceled_between_attempts`]: a managed tool's
    /// operation stopped, an agent run's calls canceled) before the request (or the
    /// attempt's end) returns; the hook goes on after. Default: 10 s.
    pub cancel_hook_wait: Duration,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(10),
            id_generator: None,
            cancel_hook_wait: Duration::from_secs(10),
        }
    }
}

impl std::fmt::Debug for ManagerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagerConfig")
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("id_generator", &self.id_generator.is_some())
            .field("cancel_hook_wait", &self.cancel_hook_wait)
            .finish()
    }
}

impl ManagerConfig {
    /// Sets [`ManagerConfig::heartbeat_interval`].
    #[must_use]
    pub fn with_heartbeat_interval(mut self, every: Duration) -> Self {
        self.heartbeat_interval = every;
        self
    }

    /// Sets [`ManagerConfig::cancel_hook_wait`].
    #[must_use]
    pub fn with_cancel_hook_wait(mut self, wait: Duration) -> Self {
        self.cancel_hook_wait = wait;
        self
    }

    /// Sets [`ManagerConfig::id_generator`].
    #[must_use]
    pub fn with_id_generator(mut self, generator: IdGenerator) -> Self {
        self.id_generator = Some(generator);
        self
    }
}

/// A request to submit a task.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubmitRequest {
    /// The spec; its id must be allocated before (see [`Manager::allocate_task_id`]).
    pub spec: TaskSpec,
    /// The initial checkpoint, written in the same atomic create.
    pub initial_checkpoint: Vec<u8>,
    /// An opaque context snapshot restored before each attempt.
    pub context_snapshot: Vec<u8>,
    /// The running attempt this task is a child of
    /// ([`AttemptContext::execution_context`]); `None` for a root task.
    pub parent: Option<ExecutionContext>,
    /// The earliest time a worker may claim the task (a delayed run); `None`: at once.
    /// Refused by [`Manager::run_now`], which runs the task at once.
    pub not_before: Option<dtask_journal::Timestamp>,
}

/// What [`Manager::wait`] observed of a whole task: its terminal outcome, or its wait for
/// input. One attempt's result is an [`ExecutionResult`] instead (an attempt may also yield or
/// suspend, which waiting never reports).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskOutcome {
    /// Completed with result data.
    Completed(Vec<u8>),
    /// Failed with an error.
    Failed(String),
    /// Canceled with a reason.
    Canceled(String),
    /// Waiting for input (not terminal): answer with [`Manager::resume`].
    Interrupted(Box<TaskState>),
}

struct Active {
    attempt: Option<AttemptContext>,
    supports_drain: bool,
    /// The attempt is committing its result: its outcome may be visible to waiters already,
    /// and the entry goes away as soon as the commit returns.
    ending: bool,
}

/// What a [`Manager`] shares between its clones (and, weakly, with its attempts).
pub(super) struct ManagerInner {
    store: TaskStore,
    registry: ExecutorRegistry,
    config: ManagerConfig,
    closed: AtomicBool,
    drain_reason: Mutex<Option<String>>,
    /// Set when a close's deadline has passed: the reason an attempt that cannot drain,
    /// ready only now (its claim was under way), is canceled with.
    cancel_reason: Mutex<Option<String>>,
    active: Mutex<HashMap<String, Active>>,
    idle: Notify,
    ready: Notify,
    first_error: Mutex<Option<String>>,
    /// The store's follower of a shared journal, stopped with the manager (held for its
    /// drop).
    _follower: Option<Follower>,
}

/// A background task aborted when dropped.
struct Follower(tokio::task::JoinHandle<()>);

impl Drop for Follower {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs tasks of registered executors on a [`TaskStore`]. Cheap to clone.
#[derive(Clone)]
pub struct Manager {
    inner: Arc<ManagerInner>,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("executors", &self.inner.registry)
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

/// Truncates `text` to at most `max` bytes on a character boundary.
#[must_use]
pub fn truncate_utf8(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        format!("executor panicked: {s}")
    } else if let Some(s) = payload.downcast_ref::<String>() {
        format!("executor panicked: {s}")
    } else {
        "executor panicked".to_owned()
    }
}

impl Manager {
    /// A manager over `store` routing to `registry`'s executors.
    #[must_use]
    ///
    /// On a shared journal (PostgreSQL) the manager also starts the store's follower
    /// ([`TaskStore::spawn_follower`], when called inside a Tokio runtime), so that tasks
    /// created by other processes reach this one's executors.
    pub fn new(store: TaskStore, registry: ExecutorRegistry, config: ManagerConfig) -> Self {
        let follower = (store.journal().is_shared()
            && tokio::runtime::Handle::try_current().is_ok())
        .then(|| Follower(store.spawn_follower()));
        Self {
            inner: Arc::new(ManagerInner {
                _follower: follower,
                store,
                registry,
                config,
                closed: AtomicBool::new(false),
                drain_reason: Mutex::new(None),
                cancel_reason: Mutex::new(None),
                active: Mutex::new(HashMap::new()),
                idle: Notify::new(),
                ready: Notify::new(),
                first_error: Mutex::new(None),
            }),
        }
    }

    pub(super) fn from_inner(inner: Arc<ManagerInner>) -> Self {
        Self { inner }
    }

    /// The store.
    #[must_use]
    pub fn store(&self) -> &TaskStore {
        &self.inner.store
    }

    /// The executor registry.
    #[must_use]
    pub fn registry(&self) -> &ExecutorRegistry {
        &self.inner.registry
    }

    /// Whether [`Manager::close`] was called.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    /// The ids of the attempts running in this manager.
    #[must_use]
    pub fn active_tasks(&self) -> Vec<String> {
        let mut ids: Vec<_> = self.inner.active.lock().keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Allocates a task id: `<kind or "task">_<UUID v7>` (time-ordered), or the configured
    /// generator's. `kind` must be empty or at most 64 bytes of `[A-Za-z0-9_-]`.
    ///
    /// # Errors
    /// [`RuntimeError::InvalidKind`], [`RuntimeError::Closed`], or an empty generated id.
    pub fn allocate_task_id(&self, kind: &str) -> Result<String, RuntimeError> {
        let valid = kind.len() <= 64
            && kind
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(RuntimeError::InvalidKind(kind.to_owned()));
        }
        if self.is_closed() {
            return Err(RuntimeError::Closed);
        }
        let id = if let Some(generate) = &self.inner.config.id_generator {
            generate(kind)
        } else {
            let prefix = if kind.is_empty() { "task" } else { kind };
            format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
        };
        if id.is_empty() {
            return Err(RuntimeError::InvalidKind(
                "the id generator returned an empty id".into(),
            ));
        }
        Ok(id)
    }

    /// Submits a task: validates it, checks its executor, and creates it in one atomic write
    /// with the executor's lease policy.
    ///
    /// # Errors
    /// [`RuntimeError::Closed`] after close, [`RuntimeError::ExecutorUnavailable`],
    /// [`RuntimeError::InvalidSpec`], and the store's errors; nothing is created on error.
    pub async fn submit(&self, request: SubmitRequest) -> Result<TaskState, RuntimeError> {
        let (create, _) = self.admit(request, "submit")?;
        Ok(self.inner.store.create(create).await?)
    }

    /// Checks a request to start a task (a pre-allocated id, an open manager, an executor
    /// that accepts the spec) and turns it into the store's request, with the executor's
    /// lease policy.
    fn admit(
        &self,
        request: SubmitRequest,
        operation: &str,
    ) -> Result<(CreateRequest, Arc<dyn Executor>), RuntimeError> {
        if request.spec.id.is_empty() {
            return Err(RuntimeError::Store(StoreError::Invalid {
                field: "task id",
                reason: format!("{operation} requires a pre-allocated task id"),
            }));
        }
        if self.is_closed() {
            return Err(RuntimeError::Closed);
        }
        let executor = self.executor(&request.spec.executor_key)?;
        executor
            .validate_spec(&request.spec)
            .map_err(RuntimeError::InvalidSpec)?;
        let max_recoveries = executor.max_recoveries(&request.spec);
        let create = CreateRequest {
            spec: request.spec,
            policy: Some(executor.lease_policy()),
            max_recoveries,
            checkpoint: request.initial_checkpoint,
            context_snapshot: request.context_snapshot,
            parent: request.parent,
            not_before: request.not_before,
            ..CreateRequest::default()
        };
        Ok((create, executor))
    }

    fn executor(&self, key: &str) -> Result<Arc<dyn Executor>, RuntimeError> {
        self.inner
            .registry
            .get(key)
            .ok_or_else(|| RuntimeError::ExecutorUnavailable(key.to_owned()))
    }

    /// The task's snapshot.
    ///
    /// # Errors
    /// The store's errors.
    pub async fn get(&self, id: &str) -> Result<TaskState, RuntimeError> {
        Ok(self.inner.store.get(id).await?)
    }

    /// Waits for a terminal outcome, or for the task to wait for input
    /// ([`TaskOutcome::Interrupted`]).
    /// Never returns an unknown outcome: errors are errors.
    ///
    /// # Errors
    /// The store's errors.
    pub async fn wait(&self, id: &str) -> Result<TaskOutcome, RuntimeError> {
        let mut state = self.inner.store.get(id).await?;
        loop {
            match state.status {
                Status::Completed => return Ok(TaskOutcome::Completed(state.result_data)),
                Status::Failed => return Ok(TaskOutcome::Failed(state.result_error)),
                Status::Canceled => return Ok(TaskOutcome::Canceled(state.result_error)),
                Status::WaitingInput => return Ok(TaskOutcome::Interrupted(Box::new(state))),
                Status::Pending | Status::Running | Status::Suspended => {
                    state = self
                        .inner
                        .store
                        .wait_for_task_version(id, state.version)
                        .await?;
                }
            }
        }
    }

    /// Requests cancellation. The first reason wins. A running attempt in this manager gets a
    /// Stop control; for a fail-policy task with a local attempt this returns once the task has
    /// ended, for recoverable work as soon as the intent is durable.
    ///
    /// A task that has ended — before the request, or by itself while it was being
    /// canceled — is returned as it ended, without error: the caller wanted it to stop, and
    /// it stopped. (The store keeps its typed [`StoreError::AlreadyTerminal`]; this is the
    /// manager's decision.) Whether the request was recorded shows in the returned state's
    /// `cancel_requested_at`.
    ///
    /// # Errors
    /// Version conflicts after retries, [`StoreError::IllegalTransition`] when a local
    /// fail-policy attempt ended without ending the task.
    pub async fn request_cancel(&self, id: &str, reason: &str) -> Result<TaskState, RuntimeError> {
        let (state, local_fail_policy) = self.cancel_durably(id, reason).await?;
        if !local_fail_policy {
            return Ok(state);
        }
        self.wait_attempt_done(id).await;
        let after = self.inner.store.get(id).await?;
        match after.status {
            s if s.is_terminal() => Ok(after),
            s => Err(StoreError::IllegalTransition {
                status: s,
                operation: "request_cancel",
            }
            .into()),
        }
    }

    /// The part of [`Manager::request_cancel`] that does not wait for the attempt to end:
    /// the request written, the local attempt (if any) told to stop; the state, and whether
    /// the task is a fail-policy one with a local attempt (whose end `request_cancel` waits
    /// for).
    async fn cancel_durably(
        &self,
        id: &str,
        reason: &str,
    ) -> Result<(TaskState, bool), RuntimeError> {
        if reason.len() > MAX_ERROR_BYTES {
            return Err(RuntimeError::Store(StoreError::Invalid {
                field: "reason",
                reason: "over 4096 bytes".into(),
            }));
        }
        let mut last = None;
        let mut state = None;
        for _ in 0..CAS_TRIES {
            let current = self.inner.store.get(id).await?;
            if current.is_terminal() {
                return Ok((current, false));
            }
            let command = Command::RequestCancel {
                reason: reason.to_owned(),
            };
            match self.inner.store.execute(id, current.version, command).await {
                Ok(s) => {
                    state = Some(s);
                    break;
                }
                Err(e @ StoreError::VersionConflict { .. }) => last = Some(e),
                Err(StoreError::AlreadyTerminal(_)) => {
                    return Ok((self.inner.store.get(id).await?, false))
                }
                Err(e) => return Err(e.into()),
            }
        }
        let Some(state) = state else {
            return Err(last.map_or(RuntimeError::Closed, RuntimeError::Store));
        };
        if state.status == Status::Canceled {
            // Not terminal before the request: this request ended it.
            self.canceled_between_attempts(&state).await;
            return Ok((state, false));
        }
        if state.status != Status::Running || state.cancel_requested_at.is_none() {
            return Ok((state, false));
        }
        let Some(attempt) = self.ready_attempt(id).await else {
            return Ok((state, false));
        };
        attempt.accept_cancellation().await;
        let fail_policy = state.policy == dtask_journal::LeasePolicy::Fail;
        Ok((state, fail_policy))
    }

    /// Tells the executor of `task`, which a cancel just ended with no attempt left to stop
    /// its work ([`Executor::canceled_between_attempts`]) — in a task of its own, which a
    /// caller that stops waiting does not cut short. The caller waits for it
    /// [`ManagerConfig::cancel_hook_wait`] at most (the cancel is durable already; a tool
    /// slow to stop goes on stopping after).
    async fn canceled_between_attempts(&self, task: &TaskState) {
        let Ok(executor) = self.executor(&task.spec.executor_key) else {
            return;
        };
        let canceled = task.clone();
        let manager = self.clone();
        let told = tokio::spawn(async move {
            executor
                .canceled_between_attempts(&manager, &canceled)
                .await;
        });
        match tokio::time::timeout(self.inner.config.cancel_hook_wait, told).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(task = %task.spec.id, error = %e, "the executor's cancel hook failed");
            }
            Err(_) => tracing::info!(
                task = %task.spec.id,
                "the executor's cancel hook goes on after the cancel request returned"
            ),
        }
    }

    /// The local attempt of `id` once it is ready (its claim completed), or `None` when this
    /// manager runs no attempt of it.
    async fn ready_attempt(&self, id: &str) -> Option<AttemptContext> {
        loop {
            let ready = self.inner.ready.notified();
            let gone = self.inner.idle.notified();
            match self.inner.active.lock().get(id) {
                None => return None,
                Some(Active {
                    attempt: Some(attempt),
                    ..
                }) => return Some(attempt.clone()),
                Some(_) => {}
            }
            tokio::select! {
                () = ready => {}
                () = gone => {}
            }
        }
    }

    async fn wait_attempt_done(&self, id: &str) {
        loop {
            let notified = self.inner.idle.notified();
            if !self.inner.active.lock().contains_key(id) {
                return;
            }
            notified.await;
        }
    }

    /// Reruns the finished root task `id` as a new task ([`TaskStore::rerun`]: the same spec
    /// under the new id, with the original's policy), after checking that this manager is
    /// open and runs the task's executor — with the original's creation checkpoint when the
    /// executor keeps it ([`Executor::rerun_keeps_checkpoint`]).
    ///
    /// # Errors
    /// [`RuntimeError::Closed`] after close, [`RuntimeError::ExecutorUnavailable`], and the
    /// store's errors ([`TaskStore::rerun`]); nothing is written on error.
    pub async fn rerun(&self, id: &str, new_id: Option<String>) -> Result<TaskState, RuntimeError> {
        if self.is_closed() {
            return Err(RuntimeError::Closed);
        }
        let original = self.inner.store.get(id).await?;
        let executor = self.executor(&original.spec.executor_key)?;
        Ok(self
            .inner
            .store
            .rerun_with(id, new_id, executor.rerun_keeps_checkpoint())
            .await?)
    }

    /// Gives input to a task waiting for it (transition T17 of docs/semantics.md).
    /// `expected_version` ties the input to that exact wait.
    ///
    /// # Errors
    /// [`StoreError::IllegalTransition`], [`StoreError::VersionConflict`].
    pub async fn resume(
        &self,
        id: &str,
        expected_version: u64,
        data: Vec<u8>,
    ) -> Result<TaskState, RuntimeError> {
        let command = Command::Resume {
            data,
            context_snapshot: None,
        };
        Ok(self
            .inner
            .store
            .execute(id, expected_version, command)
            .await?)
    }

    /// Releases a suspended task to pending (transition T18 of docs/semantics.md), retrying
    /// version conflicts.
    ///
    /// # Errors
    /// [`StoreError::IllegalTransition`] when the task is not suspended.
    pub async fn release_suspension(
        &self,
        id: &str,
        context_snapshot: Option<Vec<u8>>,
    ) -> Result<TaskState, RuntimeError> {
        let mut last = None;
        for _ in 0..CAS_TRIES {
            let current = self.inner.store.get(id).await?;
            if current.status != Status::Suspended {
                return Err(StoreError::IllegalTransition {
                    status: current.status,
                    operation: "release_suspension",
                }
                .into());
            }
            let command = Command::ReleaseSuspension {
                context_snapshot: context_snapshot.clone(),
            };
            match self.inner.store.execute(id, current.version, command).await {
                Ok(s) => return Ok(s),
                Err(e @ StoreError::VersionConflict { .. }) => last = Some(e),
                Err(e) => return Err(e.into()),
            }
        }
        Err(last.map_or(RuntimeError::Closed, RuntimeError::Store))
    }

    /// Sends a control to the attempt of `id` running in this manager, waiting until the
    /// attempt is ready (its claim completed). Returns whether it was accepted (see
    /// [`super::ControlSlot::send`]); `false` when this manager runs no attempt of `id`.
    pub async fn send_control(&self, id: &str, control: Control) -> bool {
        match self.ready_attempt(id).await {
            Some(attempt) => attempt.controls().send(control),
            None => false,
        }
    }

    /// Executes one attempt of `id`: claim, heartbeat, run the executor, commit its result.
    ///
    /// # Errors
    /// [`RuntimeError::AlreadyExecuting`] (nothing touched), a lost claim race
    /// ([`StoreError::VersionConflict`] / [`StoreError::IllegalTransition`]),
    /// [`RuntimeError::DrainCheckpointUnavailable`] and invalid results (nothing committed),
    /// a lost lease at commit.
    pub async fn execute(&self, id: &str) -> Result<TaskState, RuntimeError> {
        if id.is_empty() {
            return Err(RuntimeError::Store(StoreError::Invalid {
                field: "task id",
                reason: "must not be empty".into(),
            }));
        }
        if self.is_closed() {
            return Err(RuntimeError::Closed);
        }
        if !self.begin_active(id).await {
            return Err(RuntimeError::AlreadyExecuting(id.to_owned()));
        }
        let manager = self.clone();
        let id = id.to_owned();
        self.detached(async move {
            let result = manager.execute_registered(&id).await;
            manager.end_active(&id, &result);
            result
        })
        .await
    }

    /// Runs an execution begun with [`Manager::begin_active`] to its end in a task of its
    /// own, and awaits it: a caller that stops waiting (a dropped future, a timeout, an
    /// aborted worker) leaves the attempt running to its commit and its end, where it
    /// used to be cut short in between — its heartbeats renewing the lease for ever, its
    /// outcome never committed, the task marked executing here until the process ended.
    async fn detached(
        &self,
        execution: impl Future<Output = Result<TaskState, RuntimeError>> + Send + 'static,
    ) -> Result<TaskState, RuntimeError> {
        match tokio::spawn(execution).await {
            Ok(result) => result,
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            // The runtime is shutting down.
            Err(_) => Err(RuntimeError::Closed),
        }
    }

    /// Marks `id` as executing here; `false` when it already is.
    ///
    /// An execution of `id` that is committing its result is waited for, not refused: its
    /// outcome may already be visible (a caller's `wait` returned it), and a caller that saw
    /// it and executes the task again — after `resume`, say — must not be told that an
    /// execution which has ended is still running. The wait lasts one commit.
    async fn begin_active(&self, id: &str) -> bool {
        loop {
            {
                let mut active = self.inner.active.lock();
                match active.get(id) {
                    None => {
                        active.insert(
                            id.to_owned(),
                            Active {
                                attempt: None,
                                supports_drain: false,
                                ending: false,
                            },
                        );
                        return true;
                    }
                    Some(entry) if !entry.ending => return false,
                    Some(_) => {}
                }
            }
            self.wait_attempt_done(id).await;
        }
    }

    /// Marks the execution of `id` as committing its result (see [`Manager::begin_active`]).
    fn begin_ending(&self, id: &str) {
        if let Some(entry) = self.inner.active.lock().get_mut(id) {
            entry.ending = true;
        }
    }

    /// Ends what [`Manager::begin_active`] began, keeping the first unexpected error.
    fn end_active(&self, id: &str, result: &Result<TaskState, RuntimeError>) {
        self.inner.active.lock().remove(id);
        self.inner.idle.notify_waiters();
        if let Err(e) = result {
            if !e.is_benign() && !matches!(e, RuntimeError::DrainCheckpointUnavailable) {
                self.inner
                    .first_error
                    .lock()
                    .get_or_insert_with(|| e.to_string());
            }
        }
    }

    async fn execute_registered(&self, id: &str) -> Result<TaskState, RuntimeError> {
        let store = &self.inner.store;
        let task = store.get(id).await?;
        let executor = self.runnable(&task)?;
        let claimed = store.execute(id, task.version, Command::Start).await?;
        self.run_attempt(id, executor, claimed).await
    }

    /// The executor that would run an attempt of `task` here, or why this manager refuses
    /// to (`ExecutorUnavailable`, `InvalidSpec`, `InvalidExecution`: checked before a claim,
    /// nothing written).
    pub(crate) fn runnable(&self, task: &TaskState) -> Result<Arc<dyn Executor>, RuntimeError> {
        let executor = self.executor(&task.spec.executor_key)?;
        executor
            .validate_spec(&task.spec)
            .map_err(RuntimeError::InvalidSpec)?;
        executor
            .validate_execution(task)
            .map_err(RuntimeError::InvalidExecution)?;
        Ok(executor)
    }

    /// Creates a task already claimed by this manager and runs its first attempt here, at
    /// once: one synced append (creation and claim together) where `submit` and a worker's
    /// claim take two, and no wait for a worker. For a caller that starts a task and waits
    /// for it in the same process — how durable-execution services usually run a workflow.
    /// The task is a task like any other: its lease policy is its executor's, and if this
    /// process dies, its lease runs out and a worker takes attempt 2.
    ///
    /// # Errors
    /// As for [`Manager::submit`] (nothing is created), and then as for
    /// [`Manager::execute`]; [`StoreError::Invalid`] for a request with a `parent`.
    pub async fn run_now(&self, request: SubmitRequest) -> Result<TaskState, RuntimeError> {
        let (create, executor) = self.admit(request, "run_now")?;
        let id = create.spec.id.clone();
        if !self.begin_active(&id).await {
            return Err(RuntimeError::AlreadyExecuting(id));
        }
        let manager = self.clone();
        self.detached(async move {
            let result = async {
                let claimed = manager.inner.store.create_claimed(create).await?;
                manager.run_attempt(&id, executor, claimed).await
            }
            .await;
            manager.end_active(&id, &result);
            result
        })
        .await
    }

    /// Runs the attempt `claimed` (just started) of `id` with `executor`: heartbeats, the
    /// executor in its own task, the commit of its result.
    async fn run_attempt(
        &self,
        id: &str,
        executor: Arc<dyn Executor>,
        claimed: TaskState,
    ) -> Result<TaskState, RuntimeError> {
        let store = &self.inner.store;
        let span = tracing::info_span!("attempt", task = %id, attempt = claimed.attempt);
        async {
            let attempt = AttemptContext::new(store.clone(), &claimed, Arc::downgrade(&self.inner));
            {
                let mut active = self.inner.active.lock();
                if let Some(entry) = active.get_mut(id) {
                    entry.attempt = Some(attempt.clone());
                    entry.supports_drain = executor.supports_drain();
                }
            }
            self.inner.ready.notify_waiters();
            if claimed.cancel_requested_at.is_some() {
                attempt.accept_cancellation().await;
            }
            let cancel = self.inner.cancel_reason.lock().clone();
            if executor.supports_drain() {
                if let Some(reason) = self.inner.drain_reason.lock().clone() {
                    attempt.controls().send(Control::Drain(reason));
                }
            } else if let Some(reason) = cancel {
                // Claimed past a close's deadline, and it cannot drain: canceled as the
                // close canceled the others (not waited for).
                if let Err(e) = self.cancel_durably(id, &reason).await {
                    tracing::warn!(task = %id, error = %e, "cancel at close failed");
                }
            }
            let heartbeat = tokio::spawn(
                attempt
                    .clone()
                    .heartbeat_loop(self.inner.config.heartbeat_interval),
            );
            let run = {
                let attempt = attempt.clone();
                let executor = Arc::clone(&executor);
                let snapshot = claimed;
                tokio::spawn(async move { executor.execute(attempt, snapshot).await })
            };
            let outcome = run.await;
            attempt.halt_heartbeats();
            heartbeat.abort();
            let result = match outcome {
                Ok(Ok(result)) => result,
                Ok(Err(ExecutionError::DrainCheckpointUnavailable)) => {
                    return Err(RuntimeError::DrainCheckpointUnavailable)
                }
                Ok(Err(ExecutionError::Failed(message))) => {
                    ExecutionResult::Failed(truncate_utf8(message, MAX_ERROR_BYTES))
                }
                Err(join) if join.is_panic() => {
                    let message = panic_message(&*join.into_panic());
                    ExecutionResult::Failed(truncate_utf8(message, MAX_ERROR_BYTES))
                }
                Err(_) => ExecutionResult::Failed("executor task was aborted".into()),
            };
            self.begin_ending(id);
            // A result that hands the task on (to a next attempt, an input, a release) leaves
            // work outside the attempt for whoever goes on with it — a managed tool's
            // operation, an agent run's calls; the cancel that replaces it leaves none.
            let hands_on = !matches!(
                result,
                ExecutionResult::Completed(_)
                    | ExecutionResult::CompletedIfNoInputs { .. }
                    | ExecutionResult::Failed(_)
                    | ExecutionResult::Canceled(_)
            );
            let committed = commit(&attempt, result).await;
            if let Ok(state) = &committed {
                if hands_on && state.status == Status::Canceled {
                    self.canceled_between_attempts(state).await;
                }
            }
            committed
        }
        .instrument(span)
        .await
    }

    /// Closes the manager: submit and execute refuse from now on; reads and cancellation keep
    /// working. Drainable attempts get a Drain control; at `deadline` the others are canceled
    /// durably. A deadline is required while attempts are active.
    ///
    /// # Errors
    /// [`RuntimeError::CloseDeadlineRequired`] (the manager stays open),
    /// [`RuntimeError::CloseTimedOut`] when attempts are still active after the deadline, or
    /// the first error of an attempt that finished with one.
    pub async fn close(
        &self,
        deadline: Option<tokio::time::Instant>,
        reason: &str,
    ) -> Result<(), RuntimeError> {
        if reason.len() > MAX_ERROR_BYTES {
            return Err(RuntimeError::Store(StoreError::Invalid {
                field: "reason",
                reason: "over 4096 bytes".into(),
            }));
        }
        if deadline.is_none() && !self.inner.active.lock().is_empty() {
            return Err(RuntimeError::CloseDeadlineRequired);
        }
        self.inner.closed.store(true, Ordering::SeqCst);
        *self.inner.drain_reason.lock() = Some(reason.to_owned());
        let drainable: Vec<AttemptContext> = self
            .inner
            .active
            .lock()
            .values()
            .filter(|a| a.supports_drain)
            .filter_map(|a| a.attempt.clone())
            .collect();
        for attempt in drainable {
            attempt.controls().send(Control::Drain(reason.to_owned()));
        }
        crate::failpoints::point!(crate::failpoints::DRAIN, |message| Err(
            RuntimeError::AttemptFailed(message)
        ));
        let drained = match deadline {
            None => true,
            Some(deadline) => tokio::time::timeout_at(deadline, self.wait_idle())
                .await
                .is_ok(),
        };
        if !drained {
            *self.inner.cancel_reason.lock() = Some(reason.to_owned());
            // The attempts that cannot drain, all at once; an attempt still being claimed
            // (its executor not known yet) is told to drain when it is ready, if it can, and
            // canceled then if it cannot.
            // Canceled, not waited for: one slow to stop must not hold the close past its
            // deadline (the settle below says whether they stopped).
            let stubborn: Vec<String> = self
                .inner
                .active
                .lock()
                .iter()
                .filter(|(_, a)| a.attempt.is_some() && !a.supports_drain)
                .map(|(id, _)| id.clone())
                .collect();
            let cancels = stubborn.iter().map(|id| self.cancel_durably(id, reason));
            for (id, canceled) in stubborn
                .iter()
                .zip(futures::future::join_all(cancels).await)
            {
                match canceled {
                    Ok(_) | Err(RuntimeError::Store(StoreError::AlreadyTerminal(_))) => {}
                    Err(e) => tracing::warn!(task = %id, error = %e, "cancel at close failed"),
                }
            }
            let settled = tokio::time::timeout(Duration::from_millis(10), self.wait_idle())
                .await
                .is_ok();
            if !settled {
                return Err(RuntimeError::CloseTimedOut);
            }
        }
        match self.inner.first_error.lock().take() {
            Some(e) => Err(RuntimeError::AttemptFailed(e)),
            None => Ok(()),
        }
    }

    async fn wait_idle(&self) {
        loop {
            let notified = self.inner.idle.notified();
            if self.inner.active.lock().is_empty() {
                return;
            }
            notified.await;
        }
    }
}

/// Commits an executor result through the attempt runtime (docs/runtime.md, "One attempt",
/// step 7): an accepted cancellation replaces the result; an invalid result poisons the runtime
/// and commits nothing; a full disk is waited out while the lease lives
/// ([`AttemptContext::versioned_waiting_for_room`]); a version conflict is reconciled (cancel
/// intent → commit as canceled, else lease lost).
async fn commit(
    attempt: &AttemptContext,
    result: ExecutionResult,
) -> Result<TaskState, RuntimeError> {
    if let Some(why) = attempt.poisoned() {
        return Err(RuntimeError::LeaseLost(why));
    }
    let result = within_limits(result, attempt.store().config());
    let command = match attempt.cancellation() {
        Some(reason) => Command::AckCancel { reason },
        None => match result {
            ExecutionResult::Completed(data) => Command::Complete { data },
            ExecutionResult::CompletedIfNoInputs { cursor, data } => {
                Command::CompleteIfNoInputs { cursor, data }
            }
            ExecutionResult::Failed(error) if error.is_empty() => {
                attempt.poison("invalid execution result");
                return Err(
                    StoreError::InvalidExecutionResult("a failure needs an error".into()).into(),
                );
            }
            ExecutionResult::Failed(error) => Command::Fail { error },
            ExecutionResult::Canceled(reason) => Command::AckCancel { reason },
            ExecutionResult::WaitingInput(checkpoint)
            | ExecutionResult::Suspended(checkpoint)
            | ExecutionResult::WaitingInputIfNoInputs { checkpoint, .. }
            | ExecutionResult::SuspendedIfNoInputs { checkpoint, .. }
                if checkpoint.is_empty() =>
            {
                attempt.poison("invalid execution result");
                return Err(StoreError::InvalidExecutionResult(
                    "waiting for input and suspending need a checkpoint".into(),
                )
                .into());
            }
            ExecutionResult::WaitingInput(checkpoint) => Command::WaitInput { checkpoint },
            ExecutionResult::Suspended(checkpoint) => Command::Suspend { checkpoint },
            ExecutionResult::WaitingInputIfNoInputs { cursor, checkpoint } => {
                Command::WaitInputIfNoInputs { cursor, checkpoint }
            }
            ExecutionResult::SuspendedIfNoInputs { cursor, checkpoint } => {
                Command::SuspendIfNoInputs { cursor, checkpoint }
            }
            ExecutionResult::Yield(checkpoint) => Command::Yield { checkpoint },
            ExecutionResult::YieldFor(checkpoint, delay) => Command::YieldUntil {
                checkpoint,
                until: attempt
                    .store()
                    .now()
                    .plus_millis(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)),
            },
        },
    };
    match attempt.versioned_waiting_for_room(command).await {
        Ok(state) => Ok(state),
        // Input came in after the executor's cursor: the task is pending again (written).
        Err(StoreError::InputsPending(state)) => Ok(*state),
        Err(StoreError::VersionConflict { .. } | StoreError::LeaseLost(_)) => {
            if attempt.accept_cancellation().await {
                let reason = attempt.cancellation().unwrap_or_default();
                match attempt.versioned(Command::AckCancel { reason }).await {
                    Ok(state) => Ok(state),
                    // The acknowledgement came too late (the lease the request set ran out
                    // meanwhile): the attempt has lost the task, which its expiry resolves —
                    // the engine working, not a failure to end a worker with.
                    Err(StoreError::VersionConflict { .. } | StoreError::LeaseLost(_)) => {
                        attempt.poison("cancellation acknowledged too late");
                        Err(RuntimeError::LeaseLost(
                            "cancellation acknowledged too late".into(),
                        ))
                    }
                    Err(e) => Err(e.into()),
                }
            } else {
                attempt.poison("lease lost at commit");
                Err(RuntimeError::LeaseLost("lease lost at commit".into()))
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// `result` as the store can take it: an error or a cancel reason cut to the store's limit
/// (as an executor's error is), and a result's data or a checkpoint over the limit of a
/// value replaced by a failure that says so. Committed, the task ends; the store's refusal
/// would have left it running until its lease ran out, to be run again and refused again,
/// for ever.
fn within_limits(result: ExecutionResult, config: &crate::store::StoreConfig) -> ExecutionResult {
    let max = config.max_value_bytes;
    let over = |what: &str, len: usize| {
        ExecutionResult::Failed(format!(
            "the {what} has {len} bytes, over the store's limit of a value ({max} bytes): it \
             was not kept"
        ))
    };
    match result {
        ExecutionResult::Completed(data) | ExecutionResult::CompletedIfNoInputs { data, .. }
            if data.len() > max =>
        {
            over("result", data.len())
        }
        ExecutionResult::Failed(error) => {
            ExecutionResult::Failed(truncate_utf8(error, config.max_error_bytes))
        }
        ExecutionResult::Canceled(reason) => {
            ExecutionResult::Canceled(truncate_utf8(reason, config.max_error_bytes))
        }
        ExecutionResult::WaitingInput(checkpoint)
        | ExecutionResult::Suspended(checkpoint)
        | ExecutionResult::Yield(checkpoint)
        | ExecutionResult::YieldFor(checkpoint, _)
        | ExecutionResult::WaitingInputIfNoInputs { checkpoint, .. }
        | ExecutionResult::SuspendedIfNoInputs { checkpoint, .. }
            if checkpoint.len() > max =>
        {
            over("checkpoint", checkpoint.len())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::StoreConfig;
    use dtask_journal::{Durability, Journal, JournalOptions};
    use std::future::Future;
    use std::task::{Context, Waker};

    fn manager(dir: &std::path::Path) -> Manager {
        let journal = Journal::open(
            dir,
            JournalOptions::default().with_durability(Durability::Buffered),
        )
        .unwrap();
        let store =
            TaskStore::open(journal, ManualClock::new(1_000), StoreConfig::default()).unwrap();
        Manager::new(store, ExecutorRegistry::new(), ManagerConfig::default())
    }

    fn register(manager: &Manager, id: &str, ending: bool) {
        manager.inner.active.lock().insert(
            id.to_owned(),
            Active {
                attempt: None,
                supports_drain: false,
                ending,
            },
        );
    }

    #[tokio::test]
    async fn an_execution_still_running_refuses_another() {
        let dir = tempfile::tempdir().unwrap();
        let manager = manager(dir.path());
        register(&manager, "t", false);
        let refused = manager.execute("t").await;
        assert!(
            matches!(&refused, Err(RuntimeError::AlreadyExecuting(id)) if id == "t"),
            "{refused:?}"
        );
        assert!(manager.inner.active.lock().contains_key("t"), "left alone");
    }

    /// An execution committing its result (its outcome perhaps seen by a waiter already) is
    /// waited for, and the next execution goes ahead once it has ended.
    #[tokio::test]
    async fn an_execution_committing_its_result_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let manager = manager(dir.path());
        register(&manager, "t", true);
        let mut next = Box::pin(manager.execute("t"));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(
            next.as_mut().poll(&mut cx).is_pending(),
            "waits, not refused"
        );
        // What `end_active` does when the commit has returned.
        manager.inner.active.lock().remove("t");
        manager.inner.idle.notify_waiters();
        // The next execution went ahead: the store was asked for the task (there is none).
        let result = next.await;
        assert!(
            matches!(&result, Err(RuntimeError::Store(StoreError::NotFound(_)))),
            "{result:?}"
        );
        assert!(!manager.inner.active.lock().contains_key("t"), "ended");
    }
}

//! The attempt runtime: what an executor holds while it runs one attempt.
//!
//! It tracks the version the attempt last wrote (heartbeats and the started marker advance
//! it), serializes every versioned write with the heartbeat loop, carries the control channel,
//! and is *poisoned* by a definitive loss of authority: afterwards every operation returns the
//! poison error and the final commit writes nothing.

use super::control::{Control, ControlSlot};
use super::manager::{Manager, ManagerInner};
use crate::store::{
    Command, ExecutionContext, NotificationRequest, StoreError, TaskStore, UpdateRecord,
    UpdateRequest,
};
use dtask_journal::MetadataEntry;
use dtask_replay::{Status, TaskState};
use parking_lot::Mutex;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Mutex as AsyncMutex;

/// The first pause before an outcome refused for a full disk is committed again
/// ([`AttemptContext::versioned_waiting_for_room`]).
const ROOM_PAUSE_FIRST: Duration = Duration::from_millis(50);

/// The longest pause between two tries of an outcome refused for a full disk.
const ROOM_PAUSE_MAX: Duration = Duration::from_secs(1);

/// A progress update emitted by an attempt.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Progress {
    /// The idempotency key; empty gets a random one (then replays cannot be deduplicated).
    pub event_id: String,
    /// A free kind tag.
    pub kind: String,
    /// The update bytes (non-empty).
    pub data: Vec<u8>,
    /// Key/value metadata.
    pub metadata: Vec<MetadataEntry>,
}

#[derive(Debug)]
struct Shared {
    store: TaskStore,
    task_id: String,
    attempt: u64,
    /// The mailbox generation the attempt was claimed under.
    generation: u64,
    /// The manager running the attempt (weak: the manager holds its attempts).
    manager: Weak<ManagerInner>,
    /// The version the attempt last observed; held across every versioned write.
    version: AsyncMutex<u64>,
    controls: ControlSlot,
    /// The accepted cancellation's reason, once accepted.
    cancel: Mutex<Option<String>>,
    /// The error that poisoned the runtime.
    poison: Mutex<Option<String>>,
    /// Whether heartbeats should stop (cancellation accepted or poisoned).
    heartbeats_stopped: Mutex<bool>,
}

/// The handle an executor receives for one attempt. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AttemptContext {
    shared: Arc<Shared>,
}

impl AttemptContext {
    pub(super) fn new(store: TaskStore, claimed: &TaskState, manager: Weak<ManagerInner>) -> Self {
        Self {
            shared: Arc::new(Shared {
                store,
                task_id: claimed.spec.id.clone(),
                attempt: claimed.attempt,
                generation: claimed.mailbox.generation,
                manager,
                version: AsyncMutex::new(claimed.version),
                controls: ControlSlot::default(),
                cancel: Mutex::new(None),
                poison: Mutex::new(None),
                heartbeats_stopped: Mutex::new(false),
            }),
        }
    }

    /// The task id.
    #[must_use]
    pub fn task_id(&self) -> &str {
        &self.shared.task_id
    }

    /// The attempt number (the fence of this attempt's writes).
    #[must_use]
    pub fn attempt(&self) -> u64 {
        self.shared.attempt
    }

    /// The store (for reads).
    #[must_use]
    pub fn store(&self) -> &TaskStore {
        &self.shared.store
    }

    /// The authority of this attempt to create child tasks
    /// ([`CreateRequest::parent`](crate::CreateRequest::parent),
    /// [`SubmitRequest::parent`](super::SubmitRequest::parent)).
    #[must_use]
    pub fn execution_context(&self) -> ExecutionContext {
        ExecutionContext {
            task_id: self.shared.task_id.clone(),
            attempt: self.shared.attempt,
            generation: self.shared.generation,
        }
    }

    /// The manager running this attempt, for nested work (submitting, executing or
    /// canceling child tasks); `None` once that manager is gone.
    #[must_use]
    pub fn manager(&self) -> Option<Manager> {
        self.shared.manager.upgrade().map(Manager::from_inner)
    }

    /// The control channel of this attempt.
    #[must_use]
    pub fn controls(&self) -> &ControlSlot {
        &self.shared.controls
    }

    /// Waits for the next control.
    pub async fn next_control(&self) -> Control {
        self.shared.controls.recv().await
    }

    /// The accepted cancellation's reason, if cancellation was accepted.
    #[must_use]
    pub fn cancellation(&self) -> Option<String> {
        self.shared.cancel.lock().clone()
    }

    /// The poison error, if the attempt lost its authority.
    #[must_use]
    pub fn poisoned(&self) -> Option<String> {
        self.shared.poison.lock().clone()
    }

    fn check_poison(&self) -> Result<(), StoreError> {
        match self.poisoned() {
            Some(_) => Err(StoreError::LeaseLost("the attempt lost its lease")),
            None => Ok(()),
        }
    }

    pub(crate) fn poison(&self, why: &str) {
        let mut poison = self.shared.poison.lock();
        if poison.is_none() {
            *poison = Some(why.to_owned());
            tracing::warn!(task = %self.shared.task_id, attempt = self.shared.attempt, why, "attempt poisoned");
        }
        drop(poison);
        self.stop_heartbeats();
        self.shared
            .controls
            .send(Control::Stop(format!("lease lost: {why}")));
    }

    fn stop_heartbeats(&self) {
        *self.shared.heartbeats_stopped.lock() = true;
    }

    fn heartbeats_stopped(&self) -> bool {
        *self.shared.heartbeats_stopped.lock()
    }

    /// Accepts the durable cancellation of this attempt: adopts the version the cancel
    /// request wrote, stops heartbeats and queues a Stop control with the durable reason.
    /// Idempotent. Returns whether cancellation is accepted.
    pub(crate) async fn accept_cancellation(&self) -> bool {
        let mut version = self.shared.version.lock().await;
        if self.cancellation().is_some() {
            return true;
        }
        let Ok(task) = self.shared.store.get(&self.shared.task_id).await else {
            return false;
        };
        let ours = task.status == Status::Running && task.attempt == self.shared.attempt;
        if !ours || task.cancel_requested_at.is_none() {
            return false;
        }
        *version = task.version;
        let reason = dtask_replay::cancel_error(&task.cancel_reason, "");
        *self.shared.cancel.lock() = Some(reason.clone());
        self.stop_heartbeats();
        self.shared.controls.send(Control::Stop(reason));
        true
    }

    /// After a refused write: the refusal is benign only when cancel intent arrived for this
    /// very attempt — just now (version + 1), or before, and the attempt already accepted it
    /// (an attempt claimed with cancel intent already durable: its writes are refused, but it
    /// must still acknowledge the cancellation). Then cancellation is accepted. Otherwise the
    /// runtime is poisoned.
    async fn reconcile(&self, seen: u64) -> bool {
        if let Ok(task) = self.shared.store.get(&self.shared.task_id).await {
            let intent = task.status == Status::Running
                && task.attempt == self.shared.attempt
                && task.cancel_requested_at.is_some()
                && (task.version == seen + 1 || self.cancellation().is_some());
            if intent {
                return self.accept_cancellation().await;
            }
        }
        self.poison("version conflict");
        false
    }

    /// Runs a versioned command at the attempt's version, adopting the new version.
    pub(crate) async fn versioned(&self, command: Command) -> Result<TaskState, StoreError> {
        self.versioned_then(&command, TaskState::clone).await
    }

    /// [`AttemptContext::versioned`], waiting out a full disk: while the journal refuses the
    /// command for lack of room ([`dtask_journal::Error::is_no_space`], nothing written) and
    /// this attempt is still the task's running one with a live lease, the same command is
    /// made again after a pause (doubling, up to a second). An outcome the tool has produced
    /// is so not lost to a full disk that clears within the lease — lost, the task would be
    /// run again when its lease expired, its side effects with it. Each try takes a copy of
    /// the command (the store moves a command's bytes into its event, and a refused event is
    /// gone): one copy of the outcome a commit.
    pub(crate) async fn versioned_waiting_for_room(
        &self,
        command: Command,
    ) -> Result<TaskState, StoreError> {
        let mut pause = ROOM_PAUSE_FIRST;
        let mut warned = false;
        loop {
            match self.versioned_then(&command, TaskState::clone).await {
                Err(StoreError::Journal(e)) if e.is_no_space() && self.still_ours().await => {
                    if !std::mem::replace(&mut warned, true) {
                        tracing::warn!(
                            task = %self.shared.task_id,
                            error = %e,
                            "the journal's disk is full: the attempt's outcome waits for room"
                        );
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(ROOM_PAUSE_MAX);
                }
                other => return other,
            }
        }
    }

    /// [`AttemptContext::versioned`], handing the new snapshot to `then` rather than copying
    /// it out.
    ///
    /// A version conflict is looked into before it is returned: when the task is still this
    /// attempt's — running it, with a live lease and no cancel intent — the newer version is
    /// this attempt's own write whose answer it never saw (a heartbeat aborted or failed
    /// after its append had gone to the journal; only the running attempt writes its task's
    /// lifecycle while it runs), so the attempt adopts it and makes the command once more.
    /// Without that, the outcome of an executor whose heartbeat raced its commit was refused
    /// as a lost lease and thrown away, and the task run again after its lease ran out.
    async fn versioned_then<R>(
        &self,
        command: &Command,
        then: impl Fn(&TaskState) -> R,
    ) -> Result<R, StoreError> {
        self.check_poison()?;
        let mut version = self.shared.version.lock().await;
        let store = &self.shared.store;
        let first = store
            .execute_then(&self.shared.task_id, *version, command.clone(), |state| {
                (state.version, then(state))
            })
            .await;
        let (new_version, out) = match first {
            Err(StoreError::VersionConflict { .. }) => {
                let Ok(task) = store.get(&self.shared.task_id).await else {
                    return first.map(|(_, out)| out);
                };
                let ours = task.version > *version
                    && task
                        .check_active(Some(self.shared.attempt), store.now(), false)
                        .is_ok();
                if !ours {
                    return first.map(|(_, out)| out);
                }
                *version = task.version;
                store
                    .execute_then(&self.shared.task_id, *version, command.clone(), |state| {
                        (state.version, then(state))
                    })
                    .await?
            }
            other => other?,
        };
        *version = new_version;
        Ok(out)
    }

    /// Writes the started marker (transition T4 of docs/semantics.md): the tool's side effect
    /// has begun and `checkpoint` says how to recover it. Must be durable before the attempt
    /// first waits on its run.
    ///
    /// # Errors
    /// The store's error; a lost lease poisons the attempt.
    pub async fn commit_start(&self, checkpoint: Vec<u8>) -> Result<(), StoreError> {
        self.versioned_or_poison(Command::CommitStart { checkpoint })
            .await
    }

    /// The inputs of the task's mailbox after sequence `after`, with the mailbox's counters
    /// (see [`TaskStore::list_inputs`]).
    ///
    /// # Errors
    /// The store's error.
    pub async fn inputs(&self, after: u64) -> Result<crate::store::InputPage, StoreError> {
        self.shared
            .store
            .list_inputs(&self.shared.task_id, after, 0)
            .await
    }

    /// Waits until the task's mailbox holds an input after sequence `after` (or is sealed),
    /// then lists them (see [`TaskStore::wait_inputs`]).
    ///
    /// # Errors
    /// The store's error.
    pub async fn wait_inputs(&self, after: u64) -> Result<crate::store::InputPage, StoreError> {
        self.shared
            .store
            .wait_inputs(&self.shared.task_id, after, 0)
            .await
    }

    /// Records that this attempt consumed the mailbox's inputs from `expected_cursor` up to
    /// `cursor`, with the checkpoint that reflects them (transition T24, `CommitInput`).
    ///
    /// # Errors
    /// The store's error (a stale cursor is [`StoreError::CursorConflict`]); a lost lease
    /// poisons the attempt.
    pub async fn commit_input(
        &self,
        expected_cursor: u64,
        cursor: u64,
        checkpoint: Vec<u8>,
    ) -> Result<(), StoreError> {
        self.versioned_or_poison(Command::CommitInput {
            expected_cursor,
            cursor,
            checkpoint,
        })
        .await
    }

    /// Records that this attempt consumed the mailbox's inputs from `expected_cursor` up to
    /// `cursor`, without a checkpoint (see [`TaskStore::advance_cursor`]): for an executor
    /// whose journaled updates already hold what it took from them. The version does not
    /// change.
    ///
    /// # Errors
    /// The store's error (a stale cursor is [`StoreError::CursorConflict`], an attempt no
    /// longer the running one [`StoreError::LeaseLost`]).
    pub async fn advance_cursor(
        &self,
        expected_cursor: u64,
        cursor: u64,
    ) -> Result<(), StoreError> {
        self.check_poison()?;
        self.shared
            .store
            .advance_cursor(
                &self.shared.task_id,
                crate::store::AdvanceCursor {
                    attempt: self.shared.attempt,
                    expected_generation: self.shared.generation,
                    expected_cursor,
                    cursor,
                },
            )
            .await
            .map(|_| ())
    }

    /// Records the task's first transcript (output file) failure (transition T5 of
    /// docs/semantics.md).
    ///
    /// # Errors
    /// The store's error.
    pub async fn report_transcript_failure(&self, error: String) -> Result<(), StoreError> {
        self.versioned_or_poison(Command::ReportTranscriptFailure { error })
            .await
    }

    /// Runs a versioned command whose new snapshot the attempt does not need; a lost lease or
    /// a stale version reconciles the attempt with the store.
    async fn versioned_or_poison(&self, command: Command) -> Result<(), StoreError> {
        match self.versioned_then(&command, |_| ()).await {
            Err(e @ (StoreError::LeaseLost(_) | StoreError::VersionConflict { .. })) => {
                let seen = *self.shared.version.lock().await;
                self.reconcile(seen).await;
                Err(e)
            }
            other => other,
        }
    }

    /// Appends a progress update fenced by this attempt; returns the record and whether it was
    /// a first emission (`false` for a byte-identical replay of its event id).
    ///
    /// # Errors
    /// The store's error ([`StoreError::EventIdConflict`] for a replay with other bytes).
    pub async fn emit_progress(
        &self,
        progress: Progress,
    ) -> Result<(UpdateRecord, bool), StoreError> {
        self.check_poison()?;
        let event_id = if progress.event_id.is_empty() {
            uuid::Uuid::new_v4().to_string()
        } else {
            progress.event_id
        };
        self.shared
            .store
            .append_update(
                &self.shared.task_id,
                UpdateRequest {
                    attempt: self.shared.attempt,
                    event_id,
                    kind: progress.kind,
                    data: progress.data,
                    metadata: progress.metadata,
                    ..UpdateRequest::default()
                },
            )
            .await
    }

    /// Sends an application notification from this attempt (the reference's `NotifyParent`
    /// capability, bound to the attempt): into the parent's mailbox for a nested task, to
    /// the task's session for a root one ([`TaskStore::enqueue_notification`]). A replay of
    /// `event_id` with the same kind and data succeeds without sending it again.
    ///
    /// # Errors
    /// The store's error: [`StoreError::Invalid`] for a bad request,
    /// [`StoreError::NotificationUnavailable`] with no route (a root task without a session,
    /// a nested task still deferred), [`StoreError::NotificationEventIdConflict`] for a replay
    /// with other content, [`StoreError::MailboxSealed`] when the parent has ended,
    /// [`StoreError::LeaseLost`] once the attempt is no longer the task's.
    pub async fn notify(
        &self,
        event_id: impl Into<String>,
        kind: impl Into<String>,
        data: Vec<u8>,
    ) -> Result<(), StoreError> {
        self.notify_with(NotificationRequest::new(event_id, kind, data))
            .await
    }

    /// Sends `request` as [`AttemptContext::notify`] does, with its delivery: a notification
    /// sent to preempt ([`NotificationRequest::preempt`]) reaches a parent's mailbox as a
    /// preemptive input, a session's consumer with [`crate::Notification::delivery`]
    /// `Preempt`. A replay must name the same delivery too.
    ///
    /// # Errors
    /// As [`AttemptContext::notify`].
    pub async fn notify_with(&self, request: NotificationRequest) -> Result<(), StoreError> {
        self.check_poison()?;
        self.shared
            .store
            .enqueue_notification(&self.shared.task_id, self.shared.attempt, request)
            .await
    }

    /// Heartbeats every `every` until stopped; the first definitive error poisons the attempt.
    pub(crate) async fn heartbeat_loop(self, every: Duration) {
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            if self.heartbeats_stopped() || self.poisoned().is_some() {
                return;
            }
            let seen = *self.shared.version.lock().await;
            match self.versioned_then(&Command::Heartbeat, |_| ()).await {
                Ok(()) => {}
                Err(StoreError::VersionConflict { .. }) => {
                    if self.still_ours().await {
                        // An earlier heartbeat committed but its answer was lost.
                        continue;
                    }
                    self.reconcile(seen).await;
                    return;
                }
                Err(StoreError::LeaseLost(_)) => {
                    // Cancel intent makes heartbeats fail with LeaseLost: accept it if so.
                    if !self.accept_cancellation().await {
                        self.poison("heartbeat refused");
                    }
                    return;
                }
                Err(e) => {
                    tracing::warn!(task = %self.shared.task_id, error = %e, "heartbeat failed");
                    if self.still_ours().await {
                        // Committed with its answer lost, or not written at all: either way
                        // the attempt still runs, and the next tick renews the lease.
                        continue;
                    }
                    self.poison("heartbeat failed");
                    return;
                }
            }
        }
    }

    /// After a heartbeat whose answer was lost or refused as stale: re-reads the task and,
    /// when this attempt is still the running one without cancel intent and with a live
    /// lease, adopts the task's version (only this attempt writes to its running task, so
    /// a newer version is its own lost heartbeat) and says to carry on.
    async fn still_ours(&self) -> bool {
        let Ok(task) = self.shared.store.get(&self.shared.task_id).await else {
            return false;
        };
        let ours = task
            .check_active(Some(self.shared.attempt), self.shared.store.now(), false)
            .is_ok();
        if ours {
            let mut version = self.shared.version.lock().await;
            *version = (*version).max(task.version);
        }
        ours
    }

    pub(crate) fn halt_heartbeats(&self) {
        self.stop_heartbeats();
    }
}

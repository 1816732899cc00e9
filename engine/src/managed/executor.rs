//! The two managed-tool executors (plain and recoverable): one background attempt of a tool
//! call — choose resume / recover / start, persist updates, obey controls, map the outcome.

use super::codec::{
    ManagedCheckpoint, ToolPayload, PLAIN_EXECUTOR_KEY, RECOVERABLE_EXECUTOR_KEY, TASK_KIND,
};
use super::error::{RuleViolation, ToolRunError};
use super::live::LiveTable;
use super::observe::{
    check_outcome, observe, CheckedOutcome, MaterializerFeed, Observed, UpdateFailure, UpdateSink,
};
use super::registry::{Registration, ToolRegistry};
use super::tool::{RecoverRequest, ResumeRequest, Run, RunInput, StartRequest, Update};
use crate::runtime::{
    AttemptContext, Control, ExecutionError, ExecutionResult, Executor, Progress, ValidationError,
};
use crate::store::StoreError;
use async_trait::async_trait;
use dtask_journal::{LeasePolicy, TaskSpec};
use dtask_replay::TaskState;
use std::fmt::Write as _;
use std::sync::Arc;

/// The executor of one class of managed tools.
#[derive(Debug, Clone)]
pub(crate) struct ManagedExecutor {
    registry: Arc<ToolRegistry>,
    recoverable: bool,
    live: Arc<LiveTable>,
}

impl ManagedExecutor {
    /// The executor of plain (`recoverable: false`: `dtask.dev/background-tool`, lease policy
    /// fail, no drain) or recoverable tools (`dtask.dev/recoverable-background-tool`, lease
    /// policy retry, drain by yield), sharing `live` with the calls of the same tools.
    pub(crate) fn new(
        registry: Arc<ToolRegistry>,
        recoverable: bool,
        live: Arc<LiveTable>,
    ) -> Self {
        Self {
            registry,
            recoverable,
            live,
        }
    }

    fn registration(
        &self,
        spec: &TaskSpec,
    ) -> Result<(ToolPayload, Arc<Registration>), ValidationError> {
        if spec.kind != TASK_KIND {
            return Err(ValidationError::new(format!(
                "task kind {:?} is not {TASK_KIND}",
                spec.kind
            )));
        }
        let payload = ToolPayload::decode(&spec.payload)
            .map_err(|e| ValidationError::with_source(e.to_string(), e))?;
        let registration = self
            .registry
            .resolve(self.key(), &payload.tool_name)
            .ok_or_else(|| {
                ValidationError::new(format!("tool {:?} is unavailable", payload.tool_name))
            })?;
        Ok((payload, registration))
    }
}

fn fail(message: impl Into<String>) -> ExecutionError {
    ExecutionError::failed(message)
}

impl From<UpdateFailure> for ExecutionError {
    fn from(failure: UpdateFailure) -> Self {
        fail(failure.to_string())
    }
}

#[async_trait]
impl Executor for ManagedExecutor {
    fn rerun_keeps_checkpoint(&self) -> bool {
        // A managed task's creation checkpoint is a hand-off's started marker: a rerun
        // recovered (or, for a plain tool, failed on) the original's run.
        super::codec::rerun_keeps_checkpoint(self.key())
    }

    fn key(&self) -> &str {
        if self.recoverable {
            RECOVERABLE_EXECUTOR_KEY
        } else {
            PLAIN_EXECUTOR_KEY
        }
    }

    fn lease_policy(&self) -> LeasePolicy {
        if self.recoverable {
            LeasePolicy::Retry
        } else {
            LeasePolicy::Fail
        }
    }

    fn supports_drain(&self) -> bool {
        self.recoverable
    }

    fn max_recoveries(&self, spec: &TaskSpec) -> Option<u64> {
        self.registration(spec)
            .ok()
            .and_then(|(_, registration)| registration.max_recoveries)
    }

    fn validate_spec(&self, spec: &TaskSpec) -> Result<(), ValidationError> {
        let (payload, registration) = self.registration(spec)?;
        if registration.is_recoverable() != self.recoverable {
            return Err(ValidationError::new(
                "the tool's class does not match the executor",
            ));
        }
        registration
            .tool
            .validate_arguments(&payload.arguments)
            .map_err(|e| ValidationError::with_source(e.to_string(), e))
    }

    async fn execute(
        &self,
        attempt: AttemptContext,
        task: TaskState,
    ) -> Result<ExecutionResult, ExecutionError> {
        let (payload, registration) = self
            .registration(&task.spec)
            .map_err(|e| fail(e.to_string()))?;
        let checkpoint =
            ManagedCheckpoint::decode(&task.checkpoint).map_err(|e| fail(e.to_string()))?;
        let obtained = self
            .obtain_run(&attempt, &task, &payload, &registration, &checkpoint)
            .await;
        // The start window of an explicit-background caller closes at the start boundary.
        self.live.signal_started(&task.spec.id);
        let (run, tool_checkpoint) = match obtained? {
            Obtained::Run(run, tool_checkpoint) => (run, tool_checkpoint),
            Obtained::StillWaiting => {
                return Ok(ExecutionResult::WaitingInput(task.checkpoint.clone()))
            }
        };
        if let Some(reason) = attempt.cancellation() {
            run.stop()
                .await
                .map_err(|e| fail(format!("stop recovered canceled operation: {e}")))?;
            return Ok(ExecutionResult::Canceled(reason));
        }
        let mut sink = JournalSink::new(&attempt, &task, &registration, &self.live);
        let observing = observe(
            &run,
            run.updates(),
            self.recoverable,
            &mut sink,
            attempt.next_control(),
        );
        // A recoverable tool's run receives the inputs sent to its task while it runs; each
        // one it takes is recorded as consumed (with the started marker as the checkpoint).
        // The forwarder is a task of its own, stopped between inputs (never inside a write).
        let forwarder = self.recoverable.then(|| {
            let (stop, stopped) = tokio::sync::watch::channel(false);
            let forward = forward_inputs(attempt.clone(), Arc::clone(&run), stopped);
            (stop, tokio::spawn(forward))
        });
        let observed = observing.await;
        if let Some((stop, forwarder)) = forwarder {
            let _ = stop.send(true);
            if let Ok(Err(e)) = forwarder.await {
                tracing::warn!(task = %task.spec.id, error = %e, "inputs not forwarded to the run");
            }
        }
        let observed = match observed {
            Ok(observed) => observed,
            Err(e) => return self.observation_failed(e, &attempt, &run).await,
        };
        match observed {
            Observed::Outcome(outcome) => {
                match check_outcome(outcome, &registration, tool_checkpoint) {
                    Ok(CheckedOutcome::Completed(data)) => Ok(ExecutionResult::Completed(data)),
                    Ok(CheckedOutcome::Failed(error)) => Ok(ExecutionResult::Failed(error)),
                    Ok(CheckedOutcome::Canceled(reason)) => Ok(ExecutionResult::Canceled(reason)),
                    Ok(CheckedOutcome::WaitingInput { checkpoint, .. }) => {
                        Ok(ExecutionResult::WaitingInput(checkpoint))
                    }
                    Ok(CheckedOutcome::CheckBackIn { checkpoint, after }) => {
                        Ok(ExecutionResult::YieldFor(checkpoint, after))
                    }
                    Err(e @ (RuleViolation::NotResumable | RuleViolation::NotRecoverable)) => {
                        Err(fail(e.to_string()))
                    }
                    Err(e) => Err(fail(format!("invalid outcome: {e}"))),
                }
            }
            Observed::Event(control) => self.obey(control, &run).await,
        }
    }

    /// A task canceled with no attempt to acknowledge it may hold a live operation all the
    /// same: the run a hand-off left in this process for attempt 1, or — its started marker
    /// durable, the foreground having handed the run off or asked to be looked at again
    /// later, or an attempt having left it running for the next (a drain, a check-back) —
    /// an operation of a recoverable tool, recovered here to be stopped (what the next
    /// claim of a pending task with cancel intent does). Either is stopped; a failure is
    /// logged.
    async fn canceled_between_attempts(
        &self,
        _manager: &crate::runtime::Manager,
        task: &TaskState,
    ) {
        let run = match self.live.take_adopted(&task.spec.id) {
            Some(run) => Some(run),
            None => self.recover_canceled(task).await,
        };
        if let Some(run) = run {
            if let Err(e) = run.stop().await {
                tracing::warn!(task = %task.spec.id, error = %e, "the canceled task's operation was not stopped");
            }
        }
    }
}

impl ManagedExecutor {
    /// The operation of a canceled task whose started marker is durable (without an input
    /// request: a waiting task's run has ended), recovered — for a recoverable tool, as the
    /// attempt after the task's last would have.
    async fn recover_canceled(&self, task: &TaskState) -> Option<Arc<dyn Run>> {
        let checkpoint = ManagedCheckpoint::decode(&task.checkpoint).ok()?;
        if !checkpoint.started || checkpoint.request.is_some() {
            return None;
        }
        let (payload, registration) = self.registration(&task.spec).ok()?;
        let recovered = registration
            .tool
            .as_recoverable()?
            .recover(RecoverRequest {
                task_id: task.spec.id.clone(),
                arguments: payload.arguments,
                attempt: task.attempt + 1,
                checkpoint: checkpoint.tool_checkpoint,
            })
            .await;
        match recovered {
            Ok(run) => Some(run),
            Err(e) => {
                tracing::warn!(task = %task.spec.id, error = %e, "the canceled task's operation could not be recovered to be stopped");
                None
            }
        }
    }
}

/// Offers the run every input of its task's mailbox after the consumed cursor, in order, as
/// they arrive, and records each one it takes as consumed (`CommitInput`). Returns when the
/// run takes no input (the rest stays in the mailbox); never returns otherwise.
///
/// Stops when `stop` turns true, but only between inputs: an input's delivery and the record
/// of its consumption are never cut apart by the stop. A failure stops the forwarding (the
/// attempt goes on; the inputs not recorded stay in the mailbox).
async fn forward_inputs(
    attempt: AttemptContext,
    run: Arc<dyn Run>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), ExecutionError> {
    let store_error = |what: &str, e: StoreError| fail(format!("{what}: {e}"));
    let mut consumed = attempt
        .store()
        .get(attempt.task_id())
        .await
        .map_err(|e| store_error("read the mailbox", e))?
        .mailbox
        .consumed;
    loop {
        let page = tokio::select! {
            page = attempt.wait_inputs(consumed) => {
                page.map_err(|e| store_error("read the mailbox", e))?
            }
            _ = stop.wait_for(|stopped| *stopped) => return Ok(()),
        };
        if page.sealed {
            return Ok(());
        }
        for input in page.inputs {
            if *stop.borrow() {
                return Ok(());
            }
            let offered = RunInput {
                sequence: input.sequence,
                event_id: input.event_id,
                kind: input.kind,
                data: input.data,
            };
            let taken = run
                .deliver_input(&offered)
                .await
                .map_err(|e| fail(format!("deliver input {}: {e}", offered.sequence)))?;
            if !taken {
                return Ok(());
            }
            let checkpoint = attempt
                .store()
                .get(attempt.task_id())
                .await
                .map_err(|e| store_error("read the checkpoint", e))?
                .checkpoint;
            if checkpoint.is_empty() {
                return Ok(());
            }
            attempt
                .commit_input(consumed, offered.sequence, checkpoint)
                .await
                .map_err(|e| store_error("record the input as read", e))?;
            consumed = offered.sequence;
        }
    }
}

enum Obtained {
    /// A live run and the tool checkpoint it started from.
    Run(Arc<dyn Run>, Vec<u8>),
    /// A resume was rejected: the task keeps waiting on the same request.
    StillWaiting,
}

impl ManagedExecutor {
    /// The attempt decision: the run adopted from the foreground (first attempt, in this
    /// process) → resume (input request present) → recover (started marker) → start (with the
    /// started marker committed before the first wait).
    async fn obtain_run(
        &self,
        attempt: &AttemptContext,
        task: &TaskState,
        payload: &ToolPayload,
        registration: &Registration,
        checkpoint: &ManagedCheckpoint,
    ) -> Result<Obtained, ExecutionError> {
        let tool = &registration.tool;
        if checkpoint.request.is_none() && attempt.attempt() == 1 {
            if let Some(run) = self.live.take_adopted(&task.spec.id) {
                // Its started marker was persisted as the initial checkpoint.
                return Ok(Obtained::Run(run, checkpoint.tool_checkpoint.clone()));
            }
        }
        if let Some(request) = &checkpoint.request {
            let resumable = tool
                .as_resumable()
                .ok_or_else(|| fail("waiting task implementation is not resumable"))?;
            let resumed = resumable
                .resume(ResumeRequest {
                    task_id: task.spec.id.clone(),
                    arguments: payload.arguments.clone(),
                    attempt: attempt.attempt(),
                    request_id: request.id.clone(),
                    data: task.pending_resume.clone().unwrap_or_default(),
                    checkpoint: checkpoint.tool_checkpoint.clone(),
                })
                .await;
            return match resumed {
                Ok(run) => Ok(Obtained::Run(run, checkpoint.tool_checkpoint.clone())),
                Err(ToolRunError::InputRejected(_)) => Ok(Obtained::StillWaiting),
                Err(e) => Err(fail(format!("resume: {e}"))),
            };
        }
        if checkpoint.started && tool.as_recoverable().is_none() {
            // Only a hand-off gives a plain tool's task a started marker: the adopted run was
            // lost with its process (it crashed before attempt 1 took the run). A plain tool
            // cannot be recovered, and starting it again would repeat what the run already did.
            return Err(fail(
                "the handed-off run was lost with its process: a plain tool cannot be recovered, \
                 and is not started again",
            ));
        }
        if let (Some(recoverable), true) = (tool.as_recoverable(), checkpoint.started) {
            let run = recoverable
                .recover(RecoverRequest {
                    task_id: task.spec.id.clone(),
                    arguments: payload.arguments.clone(),
                    attempt: attempt.attempt(),
                    checkpoint: checkpoint.tool_checkpoint.clone(),
                })
                .await
                .map_err(|e| fail(format!("recover: {e}")))?;
            return Ok(Obtained::Run(run, checkpoint.tool_checkpoint.clone()));
        }
        let started = tool
            .start(StartRequest {
                task_id: task.spec.id.clone(),
                arguments: payload.arguments.clone(),
                attempt: attempt.attempt(),
            })
            .await
            .map_err(|e| fail(format!("start: {e}")))?;
        crate::failpoints::point!(crate::failpoints::BEFORE_COMMIT_START, |m| Err(fail(m)));
        // With cancel intent from before the claim the store refuses the marker; the run (which
        // an earlier attempt may have started) is stopped right after, so none is needed.
        if self.recoverable && attempt.cancellation().is_none() {
            let marker = ManagedCheckpoint::started(started.checkpoint.clone());
            let committed = match marker.encode() {
                Ok(bytes) => attempt.commit_start(bytes).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = committed {
                let mut message = format!("commit external start: {e}");
                if let Err(stop) = started.run.stop().await {
                    let _ = write!(message, "; stop operation: {stop}");
                }
                return Err(fail(message));
            }
            crate::failpoints::point!(crate::failpoints::AFTER_COMMIT_START);
        } else if !started.checkpoint.is_empty() {
            let _ = started.run.stop().await;
            return Err(fail("plain tool cannot return a checkpoint"));
        }
        Ok(Obtained::Run(started.run, started.checkpoint))
    }
}

impl ManagedExecutor {
    /// The observation failed (an update that could not be kept, say). With cancel intent
    /// for this attempt — the store refuses every write of the attempt once cancellation is
    /// requested, so an update that races the request fails here before its Stop control is
    /// seen — the run is stopped and the attempt ends canceled: the task ends canceled
    /// either way, and its operation must not run on behind it. Otherwise the failure.
    async fn observation_failed(
        &self,
        failure: ExecutionError,
        attempt: &AttemptContext,
        run: &Arc<dyn Run>,
    ) -> Result<ExecutionResult, ExecutionError> {
        if attempt.cancellation().is_none() && !attempt.accept_cancellation().await {
            return Err(failure);
        }
        let reason = attempt.cancellation().unwrap_or_default();
        self.obey(Control::Stop(reason), run).await
    }

    /// A control ended the observation: Stop stops the run and cancels, Timeout stops it and
    /// fails, Drain yields (recoverable tools; the run keeps going and the next attempt
    /// recovers it) or fails (plain tools).
    async fn obey(
        &self,
        control: Control,
        run: &Arc<dyn Run>,
    ) -> Result<ExecutionResult, ExecutionError> {
        match control {
            Control::Stop(reason) => {
                run.stop()
                    .await
                    .map_err(|e| fail(format!("stop operation: {e}")))?;
                Ok(ExecutionResult::Canceled(reason))
            }
            Control::Timeout(reason) => {
                let mut message = reason;
                if let Err(e) = run.stop().await {
                    let _ = write!(message, "; stop operation: {e}");
                }
                Ok(ExecutionResult::Failed(message))
            }
            Control::Drain(_) if self.recoverable => Ok(ExecutionResult::Yield(Vec::new())),
            Control::Drain(_) => Err(fail("plain tool cannot drain")),
        }
    }
}

/// Records the updates of one background attempt: persisted as journal update events
/// (deduplicated by event id there), first emissions offered to a live caller, and fed to the
/// materializer, whose first failure is recorded as the task's transcript failure.
struct JournalSink<'a> {
    attempt: &'a AttemptContext,
    live: &'a LiveTable,
    feed: MaterializerFeed,
}

impl<'a> JournalSink<'a> {
    fn new(
        attempt: &'a AttemptContext,
        task: &TaskState,
        registration: &Registration,
        live: &'a LiveTable,
    ) -> Self {
        let mut feed = MaterializerFeed::new(registration, &task.spec.id, &task.spec.output_file);
        if !task.output_file_error.is_empty() {
            feed.stop();
        }
        Self {
            attempt,
            live,
            feed,
        }
    }
}

impl UpdateSink for JournalSink<'_> {
    type Error = ExecutionError;

    async fn accept(&mut self, update: Update) -> Result<(), ExecutionError> {
        let Update {
            event_id,
            kind,
            data,
            metadata,
        } = update;
        let caller_id = self.feed.is_on().then(|| event_id.clone());
        let (record, first) = self
            .attempt
            .emit_progress(Progress {
                event_id,
                kind,
                data,
                metadata: metadata.into_iter().collect(),
            })
            .await
            .map_err(|e: StoreError| fail(format!("persist update: {e}")))?;
        crate::failpoints::point!(crate::failpoints::AFTER_UPDATE_PERSISTED, |m| Err(fail(m)));
        if first {
            // A live caller sees first emissions only, with the persisted (maybe generated)
            // id; a first emission's record holds the update's own kind, bytes and metadata.
            self.live.offer(&record.task_id, || Update {
                event_id: record.event_id.clone(),
                kind: record.kind.clone(),
                data: record.data.clone(),
                metadata: record.metadata.iter().cloned().collect(),
            });
        }
        if let Some(caller_id) = caller_id {
            if let Err(e) = self.feed.append(&caller_id, &record.data).await {
                self.feed.stop();
                self.attempt
                    .report_transcript_failure(e.to_string())
                    .await
                    .map_err(|_| fail("report transcript materialization failure"))?;
            }
        }
        Ok(())
    }
}

//! The two managed-tool executors (plain and recoverable): one background attempt of a tool
//! call — choose resume / recover / start, persist updates, obey controls, map the outcome.

use super::codec::{
    ManagedCheckpoint, ToolPayload, PLAIN_EXECUTOR_KEY, RECOVERABLE_EXECUTOR_KEY, TASK_KIND,
};
use super::live::LiveTable;
use super::registry::{Registration, ToolRegistry};
use super::tool::{
    RecoverRequest, ResumeRequest, Run, StartRequest, ToolOutcome, ToolRunError, Update,
};
use crate::runtime::{
    AttemptContext, Control, ExecutionError, ExecutionResult, Executor, Progress, ValidationError,
};
use crate::store::StoreError;
use async_trait::async_trait;
use dtask_journal::{LeasePolicy, TaskSpec};
use dtask_replay::TaskState;
use futures::StreamExt;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

/// How long the update stream may stay open after the run's outcome.
pub const UPDATE_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The executor of one class of managed tools.
#[derive(Debug, Clone)]
pub struct ManagedExecutor {
    registry: Arc<ToolRegistry>,
    recoverable: bool,
    live: Arc<LiveTable>,
}

impl ManagedExecutor {
    /// The executor of plain tools (`dtask.dev/background-tool`: lease policy fail, no drain).
    #[must_use]
    pub fn plain(registry: Arc<ToolRegistry>) -> Self {
        Self::new(registry, false, Arc::default())
    }

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

    /// The executor of recoverable tools (`dtask.dev/recoverable-background-tool`: lease
    /// policy retry, drain by yield).
    #[must_use]
    pub fn recoverable(registry: Arc<ToolRegistry>) -> Self {
        Self::new(registry, true, Arc::default())
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

#[async_trait]
impl Executor for ManagedExecutor {
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
            .map_err(ValidationError::new)
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
        let mut sink =
            UpdateSink::new(&attempt, &task, &registration, self.recoverable, &self.live);
        let outcome = observe(&attempt, &run, &mut sink, self.recoverable).await?;
        match outcome {
            Observed::Outcome(outcome) => map_outcome(outcome, &registration, tool_checkpoint),
            Observed::Control(result) => Ok(result),
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
        } else if !started.checkpoint.is_empty() {
            let _ = started.run.stop().await;
            return Err(fail("plain tool cannot return a checkpoint"));
        }
        Ok(Obtained::Run(started.run, started.checkpoint))
    }
}

enum Observed {
    Outcome(ToolOutcome),
    Control(ExecutionResult),
}

/// Runs the attempt: waits for the outcome while persisting updates and obeying controls.
async fn observe(
    attempt: &AttemptContext,
    run: &Arc<dyn Run>,
    sink: &mut UpdateSink<'_>,
    recoverable: bool,
) -> Result<Observed, ExecutionError> {
    let mut updates = run.updates();
    let waiter = Arc::clone(run);
    let wait = async move { waiter.wait().await };
    tokio::pin!(wait);
    loop {
        tokio::select! {
            outcome = &mut wait => {
                let outcome = outcome.map_err(|e| fail(e.to_string()));
                if let Some(stream) = updates.as_mut() {
                    let drained = tokio::time::timeout(UPDATE_DRAIN_TIMEOUT, async {
                        while let Some(update) = stream.next().await {
                            sink.persist(update).await?;
                        }
                        Ok::<(), ExecutionError>(())
                    })
                    .await;
                    match drained {
                        Ok(result) => result?,
                        Err(_) => return Err(fail("update stream did not close after terminal outcome")),
                    }
                }
                return Ok(Observed::Outcome(match outcome {
                    Ok(o) => o,
                    Err(ExecutionError::Failed(e)) => ToolOutcome::Failed(e),
                    Err(e) => return Err(e),
                }));
            }
            update = next_update(&mut updates) => {
                match update {
                    Some(update) => sink.persist(update).await?,
                    None => updates = None,
                }
            }
            control = attempt.next_control() => {
                match control {
                    Control::Stop(reason) => {
                        run.stop().await.map_err(|e| fail(format!("stop operation: {e}")))?;
                        return Ok(Observed::Control(ExecutionResult::Canceled(reason)));
                    }
                    Control::Timeout(reason) => {
                        let mut message = reason;
                        if let Err(e) = run.stop().await {
                            let _ = write!(message, "; stop operation: {e}");
                        }
                        return Ok(Observed::Control(ExecutionResult::Failed(message)));
                    }
                    Control::Drain(_) if recoverable => {
                        // The run keeps going; the next attempt recovers it.
                        return Ok(Observed::Control(ExecutionResult::Yield(Vec::new())));
                    }
                    Control::Drain(_) => return Err(fail("plain tool cannot drain")),
                }
            }
        }
    }
}

async fn next_update(
    updates: &mut Option<super::tool::UpdateStream>,
) -> Option<Result<Update, String>> {
    match updates.as_mut() {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

/// Persists updates of one attempt and feeds the materializer.
struct UpdateSink<'a> {
    attempt: &'a AttemptContext,
    live: &'a LiveTable,
    registration: &'a Registration,
    recoverable: bool,
    output_file: String,
    materialize: bool,
}

impl<'a> UpdateSink<'a> {
    fn new(
        attempt: &'a AttemptContext,
        task: &TaskState,
        registration: &'a Registration,
        recoverable: bool,
        live: &'a LiveTable,
    ) -> Self {
        let materialize = registration.materializer.is_some()
            && !task.spec.output_file.is_empty()
            && task.output_file_error.is_empty();
        Self {
            attempt,
            live,
            registration,
            recoverable,
            output_file: task.spec.output_file.clone(),
            materialize,
        }
    }

    async fn persist(&mut self, update: Result<Update, String>) -> Result<(), ExecutionError> {
        let update = update.map_err(|e| fail(format!("update stream: {e}")))?;
        update.validate().map_err(|e| fail(e.to_string()))?;
        if self.recoverable && update.event_id.is_empty() {
            return Err(fail("recoverable update event id is required"));
        }
        let caller_id = !update.event_id.is_empty();
        let (record, first) = self
            .attempt
            .emit_progress(Progress {
                event_id: update.event_id.clone(),
                kind: update.kind.clone(),
                data: update.data.clone(),
                metadata: update.metadata.clone().into_iter().collect(),
            })
            .await
            .map_err(|e: StoreError| fail(format!("persist update: {e}")))?;
        crate::failpoints::point!(crate::failpoints::AFTER_UPDATE_PERSISTED, |m| Err(fail(m)));
        if first {
            // A live caller sees first emissions only, with the persisted (maybe generated) id.
            let shown = Update {
                event_id: record.event_id.clone(),
                ..update
            };
            self.live.offer(&record.task_id, &shown);
        }
        if self.materialize && caller_id {
            if let Some(materializer) = &self.registration.materializer {
                let appended = materializer
                    .append_output(
                        &record.task_id,
                        &record.event_id,
                        &self.output_file,
                        &record.data,
                    )
                    .await;
                if let Err(e) = appended {
                    self.materialize = false;
                    self.attempt
                        .report_transcript_failure(e)
                        .await
                        .map_err(|_| fail("report transcript materialization failure"))?;
                }
            }
        }
        Ok(())
    }
}

/// Checks a tool outcome (a failure needs an error; only a resumable tool waits for input, within
/// the managed checkpoint's bounds) and maps it to the attempt's result.
fn map_outcome(
    outcome: ToolOutcome,
    registration: &Registration,
    tool_checkpoint: Vec<u8>,
) -> Result<ExecutionResult, ExecutionError> {
    match outcome {
        ToolOutcome::Completed(data) => Ok(ExecutionResult::Completed(data)),
        ToolOutcome::Failed(error) if error.is_empty() => {
            Err(fail("invalid outcome: a failure needs an error"))
        }
        ToolOutcome::Failed(error) => Ok(ExecutionResult::Failed(error)),
        ToolOutcome::Canceled(reason) => Ok(ExecutionResult::Canceled(reason)),
        ToolOutcome::WaitingInput {
            request,
            checkpoint,
        } => {
            if registration.tool.as_resumable().is_none() {
                return Err(fail("waiting input requires a resumable tool"));
            }
            let bytes = ManagedCheckpoint::waiting(request, checkpoint, tool_checkpoint)
                .encode()
                .map_err(|e| fail(format!("invalid outcome: {e}")))?;
            Ok(ExecutionResult::WaitingInput(bytes))
        }
    }
}

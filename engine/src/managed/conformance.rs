//! The recovery conformance kit: checks that a recoverable tool survives the engine dying at
//! any point, against the tool's real backend.
//!
//! Three independent tool instances play three engine processes: **A** starts the operation
//! (attempt 1); **B** starts it again for the same task, as a worker that died after the
//! external start but before the started marker was durable would — the start must be
//! idempotent: same logical operation, same checkpoint; **C** recovers it (attempt 2) from
//! A's checkpoint — the recovered history must keep every update A's operation had, with the
//! same event ids and bytes, in the same order.
//!
//! A case with an answer ([`ConformanceCase::with_answer`]) goes on through the input path of
//! a resumable tool: C's recovered run must come to wait for input; **D** resumes the same
//! operation (attempt 3) with the answer and the waiting checkpoint; **E** resumes it again
//! with the same request id and answer (attempt 4), as the engine does when it died after the
//! resume but before the outcome was durable — the replay must be accepted, and both resumes
//! must keep the logical operation and its history. Finally the latest run is stopped.
//!
//! ```no_run
//! use async_trait::async_trait;
//! use dtask_engine::managed::conformance::{
//!     check_recovery_conformance, ConformanceBackend, ConformanceCase, OperationSnapshot,
//! };
//! use dtask_engine::managed::tools::ShellTool;
//! use dtask_engine::managed::{BackgroundTool, ToolFailure};
//! use std::sync::Arc;
//!
//! struct Shell(std::path::PathBuf);
//!
//! #[async_trait]
//! impl ConformanceBackend for Shell {
//!     fn new_tool(&self) -> Option<Arc<dyn BackgroundTool>> {
//!         Some(Arc::new(ShellTool::new(&self.0)))
//!     }
//!     async fn snapshot(&self, task_id: &str) -> Result<OperationSnapshot, ToolFailure> {
//!         ShellTool::new(&self.0).snapshot(task_id)
//!     }
//! }
//!
//! # async fn demo() {
//! let case = ConformanceCase::new("task-1", r#"{"command":"echo one; echo two"}"#);
//! check_recovery_conformance(&Shell("runs".into()), &case).await.unwrap();
//! # }
//! ```

use super::error::ToolFailure;
use super::tool::{
    BackgroundTool, RecoverRequest, ResumeRequest, Run, RunOutcome, StartRequest, StartResult,
    Update,
};
use async_trait::async_trait;
use std::sync::Arc;

/// What the tool's backend holds for one task: the logical operation and its update history.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OperationSnapshot {
    /// The identity of the external operation (a job id, a process id, …); non-empty.
    pub operation_id: String,
    /// The updates the operation has emitted so far, oldest first.
    pub updates: Vec<Update>,
}

/// The tool under test and a view of its backend.
#[async_trait]
pub trait ConformanceBackend: Send + Sync {
    /// A fresh, independent tool instance (as a new engine process would build it); `None`
    /// fails the check.
    fn new_tool(&self) -> Option<Arc<dyn BackgroundTool>>;

    /// What the backend holds for `task_id` now.
    ///
    /// # Errors
    /// Why the backend cannot be read.
    async fn snapshot(&self, task_id: &str) -> Result<OperationSnapshot, ToolFailure>;
}

/// One conformance case: the task id and the arguments of the operation to start, and for a
/// resumable tool the answer to its input request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConformanceCase {
    /// The task id (the start's idempotency key).
    pub task_id: String,
    /// The JSON arguments.
    pub arguments: String,
    /// The answer (JSON bytes) to give the recovered run's input request; `None` skips the
    /// resume scenarios.
    pub answer: Option<Vec<u8>>,
}

impl ConformanceCase {
    /// A case.
    pub fn new(task_id: impl Into<String>, arguments: impl Into<String>) -> Self {
        Self {
            task_id: task_id.into(),
            arguments: arguments.into(),
            answer: None,
        }
    }

    /// The case with the resume scenarios: the tool must be resumable, its recovered run must
    /// wait for input, and `answer` must be one it accepts.
    #[must_use]
    pub fn with_answer(mut self, answer: impl Into<Vec<u8>>) -> Self {
        self.answer = Some(answer.into());
        self
    }
}

/// Why a tool is not recovery-conformant (or the check could not run).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConformanceError {
    /// The case is incomplete.
    #[error("complete recovery conformance config is required")]
    Config,
    /// The backend gave no tool instance.
    #[error("recovery factory returned nil")]
    NilTool,
    /// The tool refused the case's arguments.
    #[error("validate conformance arguments: {0}")]
    ValidateArguments(String),
    /// The tool is not recoverable.
    #[error("the tool is not recoverable")]
    NotRecoverable,
    /// The first start failed.
    #[error("first start: {0}")]
    FirstStart(String),
    /// The backend could not be read.
    #[error("snapshot after {stage}: {message}")]
    Snapshot {
        /// After which step.
        stage: &'static str,
        /// The backend's error.
        message: String,
    },
    /// A snapshot had no operation id.
    #[error("snapshot after {0} has an empty operation id")]
    EmptyOperationId(&'static str),
    /// The duplicate start failed.
    #[error("duplicate start: {0}")]
    DuplicateStart(String),
    /// The duplicate start returned other checkpoint bytes.
    #[error("duplicate start changed checkpoint")]
    DuplicateStartChangedCheckpoint,
    /// The duplicate start (or the recovery) created another logical operation.
    #[error("logical operation changed: {before:?} became {after:?}")]
    LogicalOperationChanged {
        /// The operation after the first start.
        before: String,
        /// The operation afterwards.
        after: String,
    },
    /// Recovery failed.
    #[error("recover: {0}")]
    Recover(String),
    /// The history after recovery is shorter than before.
    #[error("recovered operation lost records: {before} before, {after} after")]
    LostRecords {
        /// Updates before.
        before: usize,
        /// Updates after.
        after: usize,
    },
    /// An update of the history changed its event id or bytes, or has no event id.
    #[error("recovered operation did not preserve event identity and bytes at update {index}")]
    EventIdentity {
        /// The update's index in the history.
        index: usize,
    },
    /// Stopping the recovered (or, with an answer, the last resumed) run failed.
    #[error("stop recovered operation: {0}")]
    StopRecovered(String),
    /// The case has an answer but the tool is not resumable.
    #[error("the tool is not resumable")]
    NotResumable,
    /// With an answer, the recovered run did not come to wait for input.
    #[error("recovered run did not wait for input: {0}")]
    NotWaiting(String),
    /// The resume with the answer failed or was rejected.
    #[error("resume: {0}")]
    Resume(String),
    /// The replayed resume (same request id and answer, a later attempt) failed or was
    /// rejected: resume is not idempotent.
    #[error("replayed resume: {0}")]
    ReplayedResume(String),
}

/// Runs the conformance check of `case` against `backend`.
///
/// # Errors
/// The first violation found, as a [`ConformanceError`].
pub async fn check_recovery_conformance(
    backend: &dyn ConformanceBackend,
    case: &ConformanceCase,
) -> Result<(), ConformanceError> {
    if case.task_id.is_empty() || case.arguments.is_empty() {
        return Err(ConformanceError::Config);
    }
    let a = backend.new_tool().ok_or(ConformanceError::NilTool)?;
    a.validate_arguments(&case.arguments)
        .map_err(|e| ConformanceError::ValidateArguments(e.to_string()))?;
    if a.as_recoverable().is_none() {
        return Err(ConformanceError::NotRecoverable);
    }
    if case.answer.is_some() && a.as_resumable().is_none() {
        return Err(ConformanceError::NotResumable);
    }
    let first = start(&*a, case)
        .await
        .map_err(ConformanceError::FirstStart)?;
    let before = snapshot(backend, case, "first start").await?;

    let b = backend.new_tool().ok_or(ConformanceError::NilTool)?;
    let duplicate = start(&*b, case)
        .await
        .map_err(ConformanceError::DuplicateStart)?;
    if duplicate.checkpoint != first.checkpoint {
        return Err(ConformanceError::DuplicateStartChangedCheckpoint);
    }
    let after_duplicate = snapshot(backend, case, "duplicate start").await?;
    same_operation(&before, &after_duplicate)?;

    let c = backend.new_tool().ok_or(ConformanceError::NilTool)?;
    let recoverable = c.as_recoverable().ok_or(ConformanceError::NotRecoverable)?;
    let recovered = recoverable
        .recover(RecoverRequest {
            task_id: case.task_id.clone(),
            arguments: case.arguments.clone(),
            attempt: 2,
            checkpoint: first.checkpoint.clone(),
        })
        .await
        .map_err(|e| ConformanceError::Recover(e.to_string()))?;
    let after = snapshot(backend, case, "recover").await?;
    same_operation(&before, &after)?;
    compare_histories(&before.updates, &after.updates)?;
    let last = match &case.answer {
        None => recovered,
        Some(answer) => {
            resume_scenarios(backend, case, answer, &first.checkpoint, recovered, &after).await?
        }
    };
    last.stop()
        .await
        .map_err(|e| ConformanceError::StopRecovered(e.to_string()))
}

/// The input path: the recovered run waits; D resumes with the answer; E replays the same
/// resume. Returns the replayed run.
async fn resume_scenarios(
    backend: &dyn ConformanceBackend,
    case: &ConformanceCase,
    answer: &[u8],
    start_checkpoint: &[u8],
    recovered: Arc<dyn Run>,
    after_recover: &OperationSnapshot,
) -> Result<Arc<dyn Run>, ConformanceError> {
    let (request, replacement) = match recovered.wait().await {
        Ok(RunOutcome::WaitingInput {
            request,
            checkpoint,
        }) => (request, checkpoint),
        Ok(other) => return Err(ConformanceError::NotWaiting(format!("{other:?}"))),
        Err(e) => return Err(ConformanceError::NotWaiting(e.to_string())),
    };
    // The checkpoint the engine persists at the waiting boundary.
    let checkpoint = if replacement.is_empty() {
        start_checkpoint.to_vec()
    } else {
        replacement
    };
    let waiting = snapshot(backend, case, "wait for input").await?;
    same_operation(after_recover, &waiting)?;
    compare_histories(&after_recover.updates, &waiting.updates)?;
    let resume = |attempt| ResumeRequest {
        task_id: case.task_id.clone(),
        arguments: case.arguments.clone(),
        attempt,
        request_id: request.id.clone(),
        data: answer.to_vec(),
        checkpoint: checkpoint.clone(),
    };

    let d = backend.new_tool().ok_or(ConformanceError::NilTool)?;
    let resumable = d.as_resumable().ok_or(ConformanceError::NotResumable)?;
    resumable
        .resume(resume(3))
        .await
        .map_err(|e| ConformanceError::Resume(e.to_string()))?;
    let resumed = snapshot(backend, case, "resume").await?;
    same_operation(after_recover, &resumed)?;
    compare_histories(&waiting.updates, &resumed.updates)?;

    let e = backend.new_tool().ok_or(ConformanceError::NilTool)?;
    let resumable = e.as_resumable().ok_or(ConformanceError::NotResumable)?;
    let replayed = resumable
        .resume(resume(4))
        .await
        .map_err(|e| ConformanceError::ReplayedResume(e.to_string()))?;
    let after_replay = snapshot(backend, case, "replayed resume").await?;
    same_operation(after_recover, &after_replay)?;
    compare_histories(&resumed.updates, &after_replay.updates)?;
    Ok(replayed)
}

async fn start(tool: &dyn BackgroundTool, case: &ConformanceCase) -> Result<StartResult, String> {
    tool.start(StartRequest {
        task_id: case.task_id.clone(),
        arguments: case.arguments.clone(),
        attempt: 1,
    })
    .await
    .map_err(|e| e.to_string())
}

async fn snapshot(
    backend: &dyn ConformanceBackend,
    case: &ConformanceCase,
    stage: &'static str,
) -> Result<OperationSnapshot, ConformanceError> {
    let snapshot =
        backend
            .snapshot(&case.task_id)
            .await
            .map_err(|e| ConformanceError::Snapshot {
                stage,
                message: e.to_string(),
            })?;
    if snapshot.operation_id.is_empty() {
        return Err(ConformanceError::EmptyOperationId(stage));
    }
    Ok(snapshot)
}

fn same_operation(
    before: &OperationSnapshot,
    after: &OperationSnapshot,
) -> Result<(), ConformanceError> {
    if before.operation_id == after.operation_id {
        Ok(())
    } else {
        Err(ConformanceError::LogicalOperationChanged {
            before: before.operation_id.clone(),
            after: after.operation_id.clone(),
        })
    }
}

/// The recovered history keeps every earlier update (same event id, same bytes, same
/// order); a longer history is fine.
///
/// # Errors
/// [`ConformanceError::LostRecords`] or [`ConformanceError::EventIdentity`].
pub fn compare_histories(before: &[Update], after: &[Update]) -> Result<(), ConformanceError> {
    if after.len() < before.len() {
        return Err(ConformanceError::LostRecords {
            before: before.len(),
            after: after.len(),
        });
    }
    for (index, (old, new)) in before.iter().zip(after).enumerate() {
        if old.event_id.is_empty()
            || new.event_id.is_empty()
            || old.event_id != new.event_id
            || old.data != new.data
        {
            return Err(ConformanceError::EventIdentity { index });
        }
    }
    Ok(())
}

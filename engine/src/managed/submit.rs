//! Submitting tool calls as background tasks, and reading what a waiting task asks.

use super::codec::{
    CodecError, InputRequest, ManagedCheckpoint, ToolPayload, MAX_ARGUMENTS_BYTES,
    RECOVERABLE_EXECUTOR_KEY, TASK_KIND,
};
use super::executor::ManagedExecutor;
use super::live::LiveTable;
use super::registry::{Registration, ToolRegistry};
use crate::runtime::{
    ExecutorRegistry, ExecutorRegistryError, Manager, RuntimeError, SubmitRequest,
};
use dtask_journal::TaskSpec;
use dtask_replay::{Status, TaskState};
use std::sync::Arc;

/// Errors of the managed-tool layer's direct API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManagedError {
    /// No tool is registered under the name.
    #[error("tool {0:?} is not registered")]
    UnknownTool(String),
    /// The arguments are empty, too large or refused by the tool.
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// The output materializer could not reserve a path.
    #[error("reserve output: {0}")]
    ReserveOutput(String),
    /// The task is not a managed-tool task waiting for input.
    #[error("no input request: {0}")]
    NoInputRequest(String),
    /// A stored payload or checkpoint does not decode.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// A managed tool was configured wrongly.
    #[error("invalid managed tool configuration: {0}")]
    Config(String),
    /// The input preparer refused the call (its message, as is); nothing was created.
    #[error("{0}")]
    Prepare(String),
    /// The tool broke a foreground rule (a plain tool's start checkpoint) or its hand-off
    /// adoption failed; nothing was persisted. A failing start or resume is not this error but
    /// a failed `foreground_result`.
    #[error("{0}")]
    Tool(String),
    /// The foreground attempt ran out of time and was not handed to the background; the run
    /// was stopped and the task id was never persisted.
    #[error("foreground task {task_id:?} timed out after {timeout:?}")]
    ForegroundTimeout {
        /// The effective foreground timeout.
        timeout: std::time::Duration,
        /// The id the call was given.
        task_id: String,
    },
    /// The tool reported an outcome the rules forbid (or, in a stream, an update stream
    /// failure or an event id conflict).
    #[error("invalid outcome: {0}")]
    InvalidOutcome(String),
    /// A foreground stream's update broke a bound (its kind, event id, data or metadata); the
    /// run was stopped.
    #[error(transparent)]
    InvalidUpdate(#[from] super::tool::UpdateError),
    /// The result renderer failed or returned nothing.
    #[error("{0}")]
    Render(String),
    /// A resume was given an interrupt state this tool did not produce.
    #[error("invalid foreground interrupt state: {0}")]
    InvalidInterruptState(String),
    /// The call needs an answer: resume it with the interrupt's state (streams end with this).
    #[error("the call is waiting for input")]
    Interrupted(Box<super::foreground::Interrupt>),
    /// The caller went away (a stream's consumer closed it); the run was stopped.
    #[error("the caller abandoned the call")]
    Abandoned,
    /// A record broke the envelope's rules.
    #[error(transparent)]
    Envelope(#[from] super::envelope::EnvelopeError),
    /// The runtime refused or failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// A tool call to run as a background task.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolCall {
    /// The registered tool's name.
    pub tool_name: String,
    /// The JSON arguments.
    pub arguments: String,
    /// The model's tool-call id, if any.
    pub tool_call_id: Option<String>,
    /// The session notifications are routed to (empty for none).
    pub session_id: String,
    /// An explicit task description (default: the registration's).
    pub description: Option<String>,
    /// Whether waiting-input and terminal notifications go to the session.
    pub notify_session: bool,
}

/// The managed tools of a process: their registry and the two executors that run them.
#[derive(Debug, Clone)]
pub struct ManagedTools {
    registry: Arc<ToolRegistry>,
    live: Arc<LiveTable>,
}

impl ManagedTools {
    /// Managed tools over `registry`.
    #[must_use]
    pub fn new(registry: ToolRegistry) -> Self {
        Self {
            registry: Arc::new(registry),
            live: Arc::default(),
        }
    }

    /// The tool registry.
    #[must_use]
    pub fn registry(&self) -> &ToolRegistry {
        &self.registry
    }

    /// Registers the plain and recoverable executors into a runtime registry.
    ///
    /// # Errors
    /// [`ExecutorRegistryError::Duplicate`] when an executor key is registered there already.
    pub fn register_executors(
        &self,
        runtime: &mut ExecutorRegistry,
    ) -> Result<(), ExecutorRegistryError> {
        runtime.register(self.executor(false))?;
        runtime.register(self.executor(true))
    }

    /// The plain (`false`) or recoverable (`true`) executor of these tools; it shares this
    /// value's process-local table of adopted runs and live projections.
    #[must_use]
    pub fn executor(&self, recoverable: bool) -> ManagedExecutor {
        ManagedExecutor::new(
            Arc::clone(&self.registry),
            recoverable,
            Arc::clone(&self.live),
        )
    }

    pub(crate) fn live(&self) -> &Arc<LiveTable> {
        &self.live
    }

    /// Submits a tool call as a background task (pending, version 1). Arguments are checked
    /// before any id is allocated or output reserved.
    ///
    /// # Errors
    /// [`ManagedError::UnknownTool`], [`ManagedError::InvalidArguments`],
    /// [`ManagedError::ReserveOutput`], and the runtime's errors.
    pub async fn submit(
        &self,
        manager: &Manager,
        call: ToolCall,
    ) -> Result<TaskState, ManagedError> {
        let registration = self
            .registry
            .resolve_any(&call.tool_name)
            .ok_or_else(|| ManagedError::UnknownTool(call.tool_name.clone()))?;
        check_arguments(&registration, &call.arguments)?;
        let id = manager.allocate_task_id(TASK_KIND)?;
        let output_file = reserve_output(&registration, &id).await?;
        let spec = build_spec(&registration, id, &call, output_file);
        Ok(manager
            .submit(SubmitRequest {
                spec,
                ..SubmitRequest::default()
            })
            .await?)
    }
}

/// Reserves the output path of a task when the tool has a materializer.
pub(crate) async fn reserve_output(
    registration: &Registration,
    task_id: &str,
) -> Result<String, ManagedError> {
    let Some(materializer) = &registration.materializer else {
        return Ok(String::new());
    };
    let path = materializer
        .reserve_output(task_id)
        .await
        .map_err(ManagedError::ReserveOutput)?;
    if path.is_empty() {
        return Err(ManagedError::ReserveOutput(
            "output materializer returned an empty path".into(),
        ));
    }
    Ok(path)
}

/// The spec of a managed-tool call.
pub(crate) fn build_spec(
    registration: &Registration,
    id: String,
    call: &ToolCall,
    output_file: String,
) -> TaskSpec {
    let payload = ToolPayload::new(
        &call.tool_name,
        call.tool_call_id.as_deref(),
        &call.arguments,
    );
    TaskSpec {
        id,
        executor_key: registration.executor_key().to_owned(),
        kind: TASK_KIND.to_owned(),
        payload: payload.encode(),
        description: call
            .description
            .clone()
            .unwrap_or_else(|| registration.description(&call.arguments)),
        output_file,
        notify_session: call.notify_session && !call.session_id.is_empty(),
        session_id: call.session_id.clone(),
    }
}

/// Checks a call's arguments: non-empty, within bounds, accepted by the tool.
pub(crate) fn check_arguments(
    registration: &Registration,
    arguments: &str,
) -> Result<(), ManagedError> {
    check_bounds(arguments)?;
    registration
        .tool
        .validate_arguments(arguments)
        .map_err(|e| ManagedError::InvalidArguments(format!("validate arguments: {e}")))
}

/// Checks that arguments are non-empty and at most [`MAX_ARGUMENTS_BYTES`].
pub(crate) fn check_bounds(arguments: &str) -> Result<(), ManagedError> {
    if arguments.is_empty() {
        return Err(ManagedError::InvalidArguments(
            "arguments are required".into(),
        ));
    }
    if arguments.len() > MAX_ARGUMENTS_BYTES {
        return Err(ManagedError::InvalidArguments(
            "arguments exceed configured bounds".into(),
        ));
    }
    Ok(())
}

/// What a waiting managed-tool task asks for (an owned copy).
///
/// # Errors
/// [`ManagedError::NoInputRequest`] unless the task is a recoverable managed-tool task waiting
/// for input with a request in its checkpoint.
pub fn read_input_request(task: &TaskState) -> Result<InputRequest, ManagedError> {
    if task.status != Status::WaitingInput
        || task.spec.executor_key != RECOVERABLE_EXECUTOR_KEY
        || task.spec.kind != TASK_KIND
    {
        return Err(ManagedError::NoInputRequest(format!(
            "task {:?} is {} under {:?}",
            task.spec.id, task.status, task.spec.executor_key
        )));
    }
    ManagedCheckpoint::decode(&task.checkpoint)?
        .request
        .ok_or_else(|| ManagedError::NoInputRequest("the checkpoint has no request".into()))
}

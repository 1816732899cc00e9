//! Submitting tool calls as background tasks, and reading what a waiting task asks.

use super::codec::{
    CodecError, InputRequest, ManagedCheckpoint, ToolPayload, MAX_ARGUMENTS_BYTES,
    RECOVERABLE_EXECUTOR_KEY, TASK_KIND,
};
use super::executor::ManagedExecutor;
use super::registry::ToolRegistry;
use crate::runtime::{Manager, Registry, RuntimeError, SubmitRequest};
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
}

impl ManagedTools {
    /// Managed tools over `registry`.
    #[must_use]
    pub fn new(registry: ToolRegistry) -> Self {
        Self {
            registry: Arc::new(registry),
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
    /// The executor key already registered there.
    pub fn register_executors(&self, runtime: &mut Registry) -> Result<(), String> {
        runtime.register(ManagedExecutor::plain(Arc::clone(&self.registry)))?;
        runtime.register(ManagedExecutor::recoverable(Arc::clone(&self.registry)))
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
        if call.arguments.is_empty() {
            return Err(ManagedError::InvalidArguments(
                "arguments are required".into(),
            ));
        }
        if call.arguments.len() > MAX_ARGUMENTS_BYTES {
            return Err(ManagedError::InvalidArguments(
                "arguments exceed configured bounds".into(),
            ));
        }
        registration
            .tool
            .validate_arguments(&call.arguments)
            .map_err(|e| ManagedError::InvalidArguments(format!("validate arguments: {e}")))?;
        let id = manager.allocate_task_id(TASK_KIND)?;
        let output_file = match &registration.materializer {
            Some(m) => {
                let path = m
                    .reserve_output(&id)
                    .await
                    .map_err(ManagedError::ReserveOutput)?;
                if path.is_empty() {
                    return Err(ManagedError::ReserveOutput(
                        "output materializer returned an empty path".into(),
                    ));
                }
                path
            }
            None => String::new(),
        };
        let payload = ToolPayload::new(
            &call.tool_name,
            call.tool_call_id.as_deref(),
            &call.arguments,
        );
        let spec = TaskSpec {
            id,
            executor_key: registration.executor_key().to_owned(),
            kind: TASK_KIND.to_owned(),
            payload: payload.encode(),
            description: call
                .description
                .unwrap_or_else(|| registration.description(&call.arguments)),
            output_file,
            notify_session: call.notify_session && !call.session_id.is_empty(),
            session_id: call.session_id,
        };
        Ok(manager
            .submit(SubmitRequest {
                spec,
                ..SubmitRequest::default()
            })
            .await?)
    }
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

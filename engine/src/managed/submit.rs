//! Submitting tool calls as background tasks: [`ManagedTools`] (the registry and the two
//! executors of a process) and the checks and spec every call goes through.

use super::codec::{ToolPayload, MAX_ARGUMENTS_BYTES, TASK_KIND};
use super::error::{ArgumentsError, ManagedError};
use super::executor::ManagedExecutor;
use super::live::LiveTable;
use super::registry::{Registration, ToolRegistry};
use crate::runtime::{ExecutorRegistry, ExecutorRegistryError, Manager, SubmitRequest};
use crate::store::ExecutionContext;
use dtask_journal::TaskSpec;
use dtask_replay::TaskState;
use std::sync::Arc;

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
    fn executor(&self, recoverable: bool) -> ManagedExecutor {
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
        self.submit_as(manager, call, None, None).await
    }

    /// Submits a tool call as the child task `id` of the running attempt `parent` (see
    /// docs/semantics.md, "Nested tasks"): checked like [`ManagedTools::submit`], then
    /// created in one atomic append with the parent's record of it. The id is the caller's,
    /// so that a caller recovering from a crash finds the child it created before.
    ///
    /// # Errors
    /// As for [`ManagedTools::submit`]; the store's `AlreadyExists` when `id` is taken, and
    /// its authority errors (`LeaseLost`, `OwnershipLost`, `MailboxSealed`) when `parent` is
    /// not the running attempt.
    pub async fn submit_child(
        &self,
        manager: &Manager,
        call: ToolCall,
        id: String,
        parent: ExecutionContext,
    ) -> Result<TaskState, ManagedError> {
        self.submit_as(manager, call, Some(id), Some(parent)).await
    }

    async fn submit_as(
        &self,
        manager: &Manager,
        call: ToolCall,
        id: Option<String>,
        parent: Option<ExecutionContext>,
    ) -> Result<TaskState, ManagedError> {
        let registration = self
            .registry
            .resolve_any(&call.tool_name)
            .ok_or_else(|| ManagedError::UnknownTool(call.tool_name.clone()))?;
        check_arguments(&registration, &call.arguments)?;
        let id = match id {
            Some(id) => id,
            None => manager.allocate_task_id(TASK_KIND)?,
        };
        let output_file = reserve_output(&registration, &id).await?;
        let spec = build_spec(&registration, id, &call, output_file);
        Ok(manager
            .submit(SubmitRequest {
                spec,
                parent,
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
        .map_err(|source| ManagedError::ReserveOutput {
            task_id: task_id.to_owned(),
            source,
        })?;
    if path.is_empty() {
        return Err(ManagedError::EmptyOutputPath {
            task_id: task_id.to_owned(),
        });
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
        .map_err(|e| ManagedError::InvalidArguments(ArgumentsError::Refused(e)))
}

/// Checks that arguments are non-empty and at most [`MAX_ARGUMENTS_BYTES`].
pub(crate) fn check_bounds(arguments: &str) -> Result<(), ManagedError> {
    if arguments.is_empty() {
        return Err(ManagedError::InvalidArguments(ArgumentsError::Empty));
    }
    if arguments.len() > MAX_ARGUMENTS_BYTES {
        return Err(ManagedError::InvalidArguments(ArgumentsError::TooLarge {
            len: arguments.len(),
            max: MAX_ARGUMENTS_BYTES,
        }));
    }
    Ok(())
}

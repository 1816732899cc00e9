//! The model-facing managed tool: one tool call, run in the foreground first (attempt 0,
//! nothing persisted), handed to the background when its foreground time runs out and the
//! policy allows, or launched in the background straight away.
//!
//! The call's answer is a [`ToolResult`] whose first part is one envelope record
//! ([`ResponseEvent`]): `foreground_result` when the call finished in the foreground (no task
//! was published), `launch_result` with the task id when a background task carries on. A
//! foreground wait for input becomes an explicit [`CallOutcome::Interrupted`] that the caller
//! answers with [`ManagedTool::resume`].
//!
//! This module holds the call itself: the tool, its configuration, the call and stream API,
//! the input preparer. The foreground attempt is in `foreground.rs`, the hand-off to the
//! background in `handoff.rs`, the explicit-background launch in `launch.rs`.

use super::codec::{MAX_ARGUMENTS_BYTES, TASK_KIND};
use super::envelope::{ResponseEvent, ResultStatus};
use super::error::ManagedError;
use super::interrupt::{Interrupt, InterruptStage, InterruptState};
use super::live::PROJECTION_BUFFER;
use super::registry::Registration;
use super::result::ToolResult;
use super::submit::{
    build_spec, check_arguments, check_bounds, reserve_output, ManagedTools, ToolCall,
};
use super::tool::{PrepareRequest, Prepared, PreparerResume};
use crate::runtime::Manager;
use crate::tool::{StreamingTool, Tool, ToolError, ToolInfo, ToolOutputStream};
use async_trait::async_trait;
use dtask_journal::TaskSpec;
use dtask_replay::{Status, TaskState};
use futures::stream::BoxStream;
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The foreground observation time when nothing else is configured: 120 s.
pub const DEFAULT_FOREGROUND_TIMEOUT: Duration = Duration::from_secs(120);

/// What the auto-background policy is told about a call whose foreground time ran out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateInfo {
    /// The id the call was given (persisted only if the policy says yes).
    pub task_id: String,
    /// The task kind.
    pub kind: String,
    /// The task description.
    pub description: String,
    /// The reserved output path, if any.
    pub output_file: String,
    /// How long the foreground attempt ran.
    pub elapsed: Duration,
}

/// A per-call foreground timeout derived from the arguments (`None`: no override).
pub type TimeoutFn = Arc<dyn Fn(&str) -> Option<Duration> + Send + Sync>;
/// Whether a call goes to the background at once, from its arguments.
pub type BackgroundFn = Arc<dyn Fn(&str) -> bool + Send + Sync>;
/// Whether a call whose foreground time ran out is handed to the background.
pub type AutoBackgroundFn = Arc<dyn Fn(&CandidateInfo) -> bool + Send + Sync>;

/// How a [`ManagedTool`] runs its calls.
#[derive(Clone, Default)]
pub struct ManagedToolConfig {
    /// The foreground observation time (`None`: [`DEFAULT_FOREGROUND_TIMEOUT`]; zero: no
    /// timer, and therefore no hand-off). Also bounds an explicit-background start window.
    pub foreground_timeout: Option<Duration>,
    /// A per-call override of the foreground time, evaluated once per call.
    pub invocation_timeout: Option<TimeoutFn>,
    /// Explicit background: true launches the call as a background task at once (takes
    /// precedence over any foreground timer).
    pub run_in_background: Option<BackgroundFn>,
    /// Evaluated when the foreground time runs out: true hands the live run to a background
    /// task (the tool must implement [`ForegroundHandoffTool`](super::ForegroundHandoffTool));
    /// false or unset stops it and fails the call with [`ManagedError::ForegroundTimeout`].
    pub should_auto_background: Option<AutoBackgroundFn>,
}

impl std::fmt::Debug for ManagedToolConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedToolConfig")
            .field("foreground_timeout", &self.foreground_timeout)
            .field("invocation_timeout", &self.invocation_timeout.is_some())
            .field("run_in_background", &self.run_in_background.is_some())
            .field(
                "should_auto_background",
                &self.should_auto_background.is_some(),
            )
            .finish()
    }
}

impl ManagedToolConfig {
    /// Sets the foreground time (zero: no timer).
    #[must_use]
    pub fn with_foreground_timeout(mut self, timeout: Duration) -> Self {
        self.foreground_timeout = Some(timeout);
        self
    }

    /// Sets the per-call foreground time override.
    #[must_use]
    pub fn with_invocation_timeout(
        mut self,
        f: impl Fn(&str) -> Option<Duration> + Send + Sync + 'static,
    ) -> Self {
        self.invocation_timeout = Some(Arc::new(f));
        self
    }

    /// Sets the explicit-background policy.
    #[must_use]
    pub fn with_run_in_background(
        mut self,
        f: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.run_in_background = Some(Arc::new(f));
        self
    }

    /// Sets the hand-off policy.
    #[must_use]
    pub fn with_auto_background(
        mut self,
        f: impl Fn(&CandidateInfo) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.should_auto_background = Some(Arc::new(f));
        self
    }
}

/// Per-call options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallOptions {
    /// The model's tool-call id (recorded in the task payload).
    pub tool_call_id: Option<String>,
    /// The session lifecycle notifications go to (empty: none).
    pub session_id: String,
    /// This call's foreground time (takes precedence over the configured ones; zero: no
    /// timer).
    pub foreground_timeout: Option<Duration>,
}

/// How a [`ManagedTool`] call ended for its caller: the answer for the model, or a question
/// back. The tool's run ends with a [`RunOutcome`](super::RunOutcome), and a background task
/// that carries the call with a [`TaskOutcome`](crate::TaskOutcome) that the answer only
/// reports.
#[derive(Debug, Clone, PartialEq)]
pub enum CallOutcome {
    /// The call has its answer for the model.
    Done(ToolResult),
    /// The call waits for an answer; nothing was persisted. Answer with
    /// [`ManagedTool::resume`].
    Interrupted(Interrupt),
}

/// A stream of a call's results: `update` records (first emissions only), then exactly one
/// final result — or an error ([`ManagedError::Interrupted`] when the call waits for input).
pub type ManagedStream = BoxStream<'static, Result<ToolResult, ManagedError>>;

/// Where a streaming call sends its records.
pub(super) type Records = mpsc::Sender<Result<ToolResult, ManagedError>>;

/// A registered managed tool as the model sees it (implements [`Tool`] and
/// [`StreamingTool`]). Build it over the [`ManagedTools`] whose executors run in `manager`.
#[derive(Clone)]
pub struct ManagedTool {
    pub(super) tools: ManagedTools,
    pub(super) manager: Manager,
    pub(super) registration: Arc<Registration>,
    pub(super) config: ManagedToolConfig,
}

impl std::fmt::Debug for ManagedTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedTool")
            .field("name", &self.registration.info.name)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ManagedTool {
    /// The managed tool `tool_name` of `tools`, running its background tasks in `manager`.
    ///
    /// # Errors
    /// [`ManagedError::UnknownTool`]; [`ManagedError::HandoffUnsupported`] when a hand-off
    /// policy is set for a tool that cannot adopt its foreground run.
    pub fn new(
        tools: &ManagedTools,
        manager: Manager,
        tool_name: &str,
        config: ManagedToolConfig,
    ) -> Result<Self, ManagedError> {
        let registration = tools
            .registry()
            .resolve_any(tool_name)
            .ok_or_else(|| ManagedError::UnknownTool(tool_name.to_owned()))?;
        if config.should_auto_background.is_some() && registration.tool.as_handoff().is_none() {
            return Err(ManagedError::HandoffUnsupported {
                tool: tool_name.to_owned(),
            });
        }
        Ok(Self {
            tools: tools.clone(),
            manager,
            registration,
            config,
        })
    }

    /// The tool's info, its description extended with how to read the answers.
    #[must_use]
    pub fn info(&self) -> ToolInfo {
        let mut info = self.registration.info.clone();
        info.description.push_str(
            " Answers are JSON records: a foreground_result when the call finished at once; a \
             launch_result with a task_id when it goes on as a background task.",
        );
        info
    }

    /// Calls the tool with JSON `arguments`. A foreground start that fails is not an error
    /// but the model-visible failed `foreground_result` (as in [`ManagedTool::call_stream`]).
    ///
    /// # Errors
    /// Bad arguments, the preparer's error, a plain tool's start checkpoint, an invalid
    /// outcome, a render failure, [`ManagedError::ForegroundTimeout`], and the runtime's
    /// errors.
    pub async fn call(
        &self,
        arguments: &str,
        options: &CallOptions,
    ) -> Result<CallOutcome, ManagedError> {
        self.drive(arguments, options, None).await
    }

    /// Answers an interrupted call with `answer` (JSON bytes).
    ///
    /// # Errors
    /// [`ManagedError::InvalidInterruptState`], and what [`ManagedTool::call`] returns.
    pub async fn resume(
        &self,
        state: &InterruptState,
        answer: &[u8],
        options: &CallOptions,
    ) -> Result<CallOutcome, ManagedError> {
        self.drive_resume(state, answer, options, None).await
    }

    /// Calls the tool and streams its records: first-emission `update` records, then the
    /// final result. Dropping the stream stops a foreground run.
    #[must_use]
    pub fn call_stream(&self, arguments: &str, options: &CallOptions) -> ManagedStream {
        let this = self.clone();
        let arguments = arguments.to_owned();
        let options = options.clone();
        Self::spawn_stream(move |records| async move {
            this.drive(&arguments, &options, Some(records)).await
        })
    }

    /// Resumes an interrupted call, streaming as [`ManagedTool::call_stream`].
    #[must_use]
    pub fn resume_stream(
        &self,
        state: &InterruptState,
        answer: &[u8],
        options: &CallOptions,
    ) -> ManagedStream {
        let this = self.clone();
        let state = state.clone();
        let answer = answer.to_vec();
        let options = options.clone();
        Self::spawn_stream(move |records| async move {
            this.drive_resume(&state, &answer, &options, Some(records))
                .await
        })
    }

    fn spawn_stream<F, Fut>(f: F) -> ManagedStream
    where
        F: FnOnce(Records) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<CallOutcome, ManagedError>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(PROJECTION_BUFFER);
        tokio::spawn(async move {
            let last = match f(tx.clone()).await {
                Ok(CallOutcome::Done(result)) => Ok(result),
                Ok(CallOutcome::Interrupted(interrupt)) => {
                    Err(ManagedError::Interrupted(Box::new(interrupt)))
                }
                Err(e) => Err(e),
            };
            let _ = tx.send(last).await;
        });
        futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        })
        .boxed()
    }

    async fn drive(
        &self,
        arguments: &str,
        options: &CallOptions,
        records: Option<Records>,
    ) -> Result<CallOutcome, ManagedError> {
        match self.prepare(arguments, None).await? {
            Ok(prepared) => self.begin(prepared, options, records).await,
            Err(interrupt) => Ok(CallOutcome::Interrupted(interrupt)),
        }
    }

    pub(super) fn tool_call(&self, arguments: &str, options: &CallOptions) -> ToolCall {
        ToolCall {
            tool_name: self.registration.info.name.clone(),
            arguments: arguments.to_owned(),
            tool_call_id: options.tool_call_id.clone(),
            session_id: options.session_id.clone(),
            description: None,
            notify_session: !options.session_id.is_empty(),
        }
    }

    /// Runs the input preparer (if any) and checks the final arguments: `Err(interrupt)`
    /// when the preparer asks first.
    pub(super) async fn prepare(
        &self,
        arguments: &str,
        resume: Option<PreparerResume>,
    ) -> Result<Result<String, Interrupt>, ManagedError> {
        check_bounds(arguments)?;
        let prepared = match self.registration.tool.as_input_preparer() {
            None => arguments.to_owned(),
            Some(preparer) => {
                let request = PrepareRequest {
                    arguments: arguments.to_owned(),
                    resume,
                };
                match preparer
                    .prepare_input(request)
                    .await
                    .map_err(ManagedError::Prepare)?
                {
                    Prepared::Arguments(args) if args.is_empty() => {
                        return Err(ManagedError::EmptyPreparedArguments)
                    }
                    Prepared::Arguments(args) if args.len() > MAX_ARGUMENTS_BYTES => {
                        return Err(ManagedError::PreparedArgumentsTooLarge {
                            len: args.len(),
                            max: MAX_ARGUMENTS_BYTES,
                        })
                    }
                    Prepared::Arguments(args) => args,
                    Prepared::Interrupt { info, state } => {
                        return Ok(Err(Interrupt {
                            info,
                            state: InterruptState {
                                tool_name: self.registration.info.name.clone(),
                                stage: InterruptStage::Prepare {
                                    arguments: arguments.to_owned(),
                                    state,
                                },
                            },
                        }))
                    }
                }
            }
        };
        check_arguments(&self.registration, &prepared)?;
        Ok(Ok(prepared))
    }

    /// Gives the call its task id and output path, then launches it in the background or
    /// starts its foreground attempt.
    pub(super) async fn begin(
        &self,
        arguments: String,
        options: &CallOptions,
        records: Option<Records>,
    ) -> Result<CallOutcome, ManagedError> {
        let background = self
            .config
            .run_in_background
            .as_ref()
            .is_some_and(|f| f(&arguments));
        let id = self.manager.allocate_task_id(TASK_KIND)?;
        let output_file = reserve_output(&self.registration, &id).await?;
        let spec = build_spec(
            &self.registration,
            id,
            &self.tool_call(&arguments, options),
            output_file,
        );
        if background {
            return self.launch_background(spec, records.as_ref()).await;
        }
        self.start_foreground(spec, arguments, options, records)
            .await
    }

    /// The call's foreground time: the call's own, else the per-call override, else the
    /// configured one, else [`DEFAULT_FOREGROUND_TIMEOUT`]; `None` for zero (no timer).
    pub(super) fn foreground_timeout(
        &self,
        arguments: &str,
        options: &CallOptions,
    ) -> Option<Duration> {
        let timeout = options
            .foreground_timeout
            .or_else(|| {
                self.config
                    .invocation_timeout
                    .as_ref()
                    .and_then(|f| f(arguments))
            })
            .or(self.config.foreground_timeout)
            .unwrap_or(DEFAULT_FOREGROUND_TIMEOUT);
        Some(timeout).filter(|t| !t.is_zero())
    }

    /// A completed result, rendered when the registration has a renderer.
    pub(super) fn completed(
        &self,
        spec: &TaskSpec,
        data: &[u8],
        envelope: ResponseEvent,
    ) -> Result<ToolResult, ManagedError> {
        let Some(render) = &self.registration.render else {
            return Ok(ToolResult::record(envelope));
        };
        let parts = render(spec, data)
            .map_err(ManagedError::Render)?
            .ok_or(ManagedError::RenderedNothing)?;
        Ok(ToolResult {
            envelope: envelope.without_output(),
            parts,
        })
    }

    /// The launch result of a task snapshot.
    pub(super) fn launch_result(&self, task: &TaskState) -> Result<ToolResult, ManagedError> {
        let envelope = ResponseEvent::launch_result(task)?;
        if task.status == Status::Completed {
            return self.completed(&task.spec, &task.result_data, envelope);
        }
        Ok(ToolResult::record(envelope))
    }
}

fn tool_error(name: &str, error: ManagedError) -> ToolError {
    match error {
        ManagedError::Interrupted(interrupt) => ToolError::Interrupted {
            tool: name.to_owned(),
            info: interrupt.info,
            state: interrupt.state.encode(),
        },
        ManagedError::InvalidArguments(error) => {
            ToolError::invalid_arguments(name, ".", error.to_string())
        }
        other => ToolError::failed(name, other),
    }
}

#[async_trait]
impl Tool for ManagedTool {
    fn info(&self) -> ToolInfo {
        ManagedTool::info(self)
    }

    /// The envelope record (one line); rich parts are available through
    /// [`ManagedTool::call`]. An interrupted call is [`ToolError::Interrupted`]. No
    /// arguments are the empty object, as for every tool a model calls
    /// ([`crate::tool::effective_arguments`]; [`ManagedTool::call`] itself requires them).
    async fn invoke(&self, arguments: &str) -> Result<String, ToolError> {
        let name = &self.registration.info.name;
        let arguments = crate::tool::effective_arguments(arguments);
        match self.call(arguments, &CallOptions::default()).await {
            Ok(CallOutcome::Done(result)) => Ok(result.text()),
            Ok(CallOutcome::Interrupted(interrupt)) => Err(tool_error(
                name,
                ManagedError::Interrupted(Box::new(interrupt)),
            )),
            Err(e) => Err(tool_error(name, e)),
        }
    }
}

#[async_trait]
impl StreamingTool for ManagedTool {
    fn info(&self) -> ToolInfo {
        ManagedTool::info(self)
    }

    /// One chunk per record (a JSON line each). No arguments are the empty object, as for
    /// [`Tool::invoke`].
    async fn invoke_stream(&self, arguments: &str) -> Result<ToolOutputStream, ToolError> {
        let name = self.registration.info.name.clone();
        let arguments = crate::tool::effective_arguments(arguments);
        let stream = self.call_stream(arguments, &CallOptions::default());
        Ok(stream
            .map(move |item| match item {
                Ok(result) => Ok(result.text()),
                Err(e) => Err(tool_error(&name, e)),
            })
            .boxed())
    }
}

/// A model-visible failed foreground result (nothing was persisted).
pub(super) fn failed_foreground(description: &str, error: &str) -> CallOutcome {
    CallOutcome::Done(ToolResult::record(ResponseEvent::foreground_result(
        description,
        ResultStatus::Failed {
            error: error.to_owned(),
        },
    )))
}

//! The model-facing managed tool: one tool call, run in the foreground first (attempt 0,
//! nothing persisted), handed to the background when its foreground time runs out and the
//! policy allows, or launched in the background straight away.
//!
//! The call's answer is a [`ToolResult`] whose first part is one envelope record
//! ([`ResponseEvent`]): `foreground_result` when the call finished in the foreground (no task
//! was published), `launch_result` with the task id when a background task carries on. A
//! foreground wait for input becomes an explicit [`CallOutcome::Interrupted`] that the caller
//! answers with [`ManagedTool::resume`].

use super::codec::{InputRequest, ManagedCheckpoint, MAX_ARGUMENTS_BYTES, TASK_KIND};
use super::envelope::ResponseEvent;
use super::executor::UPDATE_DRAIN_TIMEOUT;
use super::live::PROJECTION_BUFFER;
use super::registry::Registration;
use super::result::ToolResult;
use super::submit::{
    build_spec, check_arguments, check_bounds, reserve_output, ManagedError, ManagedTools, ToolCall,
};
use super::tool::{
    AdoptRequest, ForegroundHandoffTool, PrepareRequest, Prepared, PreparerResume, ResumeRequest,
    Run, StartRequest, ToolOutcome, ToolRunError, Update, UpdateError, UpdateStream,
};
use crate::runtime::{Manager, SubmitRequest};
use crate::tool::{StreamingTool, Tool, ToolError, ToolInfo, ToolOutputStream};
use async_trait::async_trait;
use dtask_journal::TaskSpec;
use dtask_replay::{Status, TaskState};
use futures::stream::BoxStream;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
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
    /// task (the tool must implement [`ForegroundHandoffTool`]); false or unset stops it and
    /// fails the call with [`ManagedError::ForegroundTimeout`].
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

/// How a call ended.
#[derive(Debug, Clone, PartialEq)]
pub enum CallOutcome {
    /// The call has its answer for the model.
    Done(ToolResult),
    /// The call waits for an answer; nothing was persisted. Answer with
    /// [`ManagedTool::resume`].
    Interrupted(Interrupt),
}

/// A call waiting for an answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interrupt {
    /// What is asked (the input request's data, or the input preparer's info).
    pub info: serde_json::Value,
    /// What to resume with (serializable: keep it wherever the conversation is kept).
    pub state: InterruptState,
}

/// The state of an interrupted call. Treat it as opaque; [`InterruptState::encode`] and
/// [`InterruptState::decode`] carry it as JSON text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterruptState {
    /// The tool that was called.
    pub tool_name: String,
    /// Where the call stopped.
    pub stage: InterruptStage,
}

/// Where an interrupted call stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "stage", rename_all = "snake_case")]
#[non_exhaustive]
pub enum InterruptStage {
    /// The input preparer asked before anything was created.
    Prepare {
        /// The model's arguments.
        arguments: String,
        /// The preparer's state (base64 in JSON).
        #[serde(with = "base64_bytes")]
        state: Vec<u8>,
    },
    /// The foreground run (attempt 0) waits for input.
    Foreground {
        /// The id the call was given (not persisted).
        task_id: String,
        /// The call's final arguments.
        arguments: String,
        /// The question.
        request: InputRequest,
        /// The tool checkpoint to resume from (base64 in JSON).
        #[serde(with = "base64_bytes")]
        tool_checkpoint: Vec<u8>,
        /// The reserved output path, if any.
        output_file: String,
    },
}

mod base64_bytes {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

impl InterruptState {
    /// The state as JSON text.
    #[must_use]
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A state from JSON text.
    ///
    /// # Errors
    /// [`ManagedError::InvalidInterruptState`] when the text is not a state.
    pub fn decode(text: &str) -> Result<Self, ManagedError> {
        serde_json::from_str(text).map_err(|e| ManagedError::InvalidInterruptState(e.to_string()))
    }
}

/// A stream of a call's results: `update` records (first emissions only), then exactly one
/// final result — or an error ([`ManagedError::Interrupted`] when the call waits for input).
pub type ManagedStream = BoxStream<'static, Result<ToolResult, ManagedError>>;

type Sink = mpsc::Sender<Result<ToolResult, ManagedError>>;

/// A registered managed tool as the model sees it (implements [`Tool`] and
/// [`StreamingTool`]). Build it over the [`ManagedTools`] whose executors run in `manager`.
#[derive(Clone)]
pub struct ManagedTool {
    tools: ManagedTools,
    manager: Manager,
    registration: Arc<Registration>,
    config: ManagedToolConfig,
}

impl std::fmt::Debug for ManagedTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedTool")
            .field("name", &self.registration.info.name)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The live foreground attempt of one call.
struct Foreground {
    spec: TaskSpec,
    arguments: String,
    run: Arc<dyn Run>,
    tool_checkpoint: Vec<u8>,
    started: tokio::time::Instant,
}

/// Stops a run if the call is dropped while it owns it (a caller that goes away).
struct StopOnDrop(Option<Arc<dyn Run>>);

impl StopOnDrop {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(run) = self.0.take() {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = run.stop().await;
                });
            }
        }
    }
}

impl ManagedTool {
    /// The managed tool `tool_name` of `tools`, running its background tasks in `manager`.
    ///
    /// # Errors
    /// [`ManagedError::UnknownTool`]; [`ManagedError::Config`] when a hand-off policy is set
    /// for a tool that cannot adopt its foreground run.
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
            return Err(ManagedError::Config(format!(
                "tool {tool_name:?} does not support foreground handoff"
            )));
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
        Self::spawn_stream(
            move |sink| async move { this.drive(&arguments, &options, Some(sink)).await },
        )
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
        Self::spawn_stream(move |sink| async move {
            this.drive_resume(&state, &answer, &options, Some(sink))
                .await
        })
    }

    fn spawn_stream<F, Fut>(f: F) -> ManagedStream
    where
        F: FnOnce(Sink) -> Fut + Send + 'static,
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
        sink: Option<Sink>,
    ) -> Result<CallOutcome, ManagedError> {
        match self.prepare(arguments, None).await? {
            Ok(prepared) => self.launch(prepared, options, sink).await,
            Err(interrupt) => Ok(CallOutcome::Interrupted(interrupt)),
        }
    }

    async fn drive_resume(
        &self,
        state: &InterruptState,
        answer: &[u8],
        options: &CallOptions,
        sink: Option<Sink>,
    ) -> Result<CallOutcome, ManagedError> {
        if state.tool_name != self.registration.info.name {
            return Err(ManagedError::InvalidInterruptState(format!(
                "the state belongs to tool {:?}",
                state.tool_name
            )));
        }
        match &state.stage {
            InterruptStage::Prepare {
                arguments,
                state: preparer_state,
            } => {
                let resume = PreparerResume {
                    state: preparer_state.clone(),
                    answer: answer.to_vec(),
                };
                match self.prepare(arguments, Some(resume)).await? {
                    Ok(prepared) => self.launch(prepared, options, sink).await,
                    Err(interrupt) => Ok(CallOutcome::Interrupted(interrupt)),
                }
            }
            InterruptStage::Foreground {
                task_id,
                arguments,
                request,
                tool_checkpoint,
                output_file,
            } => {
                if task_id.is_empty() || arguments.is_empty() || request.id.is_empty() {
                    return Err(ManagedError::InvalidInterruptState(
                        "task id, arguments and request id are required".into(),
                    ));
                }
                let resumable = self.registration.tool.as_resumable().ok_or_else(|| {
                    ManagedError::InvalidInterruptState("the tool is not resumable".into())
                })?;
                let resumed = resumable
                    .resume(ResumeRequest {
                        task_id: task_id.clone(),
                        arguments: arguments.clone(),
                        attempt: 0,
                        request_id: request.id.clone(),
                        data: answer.to_vec(),
                        checkpoint: tool_checkpoint.clone(),
                    })
                    .await;
                let run = match resumed {
                    Ok(run) => run,
                    Err(ToolRunError::InputRejected(_)) => {
                        return Ok(CallOutcome::Interrupted(Interrupt {
                            info: request.data.clone().unwrap_or_default(),
                            state: state.clone(),
                        }))
                    }
                    Err(e) => {
                        return Ok(failed_foreground(
                            &self.registration.description(arguments),
                            &e.to_string(),
                        ))
                    }
                };
                let spec = build_spec(
                    &self.registration,
                    task_id.clone(),
                    &self.tool_call(arguments, options),
                    output_file.clone(),
                );
                let foreground = Foreground {
                    spec,
                    arguments: arguments.clone(),
                    run,
                    tool_checkpoint: tool_checkpoint.clone(),
                    started: tokio::time::Instant::now(),
                };
                self.observe(foreground, options, sink.as_ref()).await
            }
        }
    }

    fn tool_call(&self, arguments: &str, options: &CallOptions) -> ToolCall {
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
    async fn prepare(
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
                        return Err(ManagedError::Prepare(
                            "input preparer returned empty arguments".into(),
                        ))
                    }
                    Prepared::Arguments(args) if args.len() > MAX_ARGUMENTS_BYTES => {
                        return Err(ManagedError::Prepare(
                            "prepared arguments exceed configured bounds".into(),
                        ))
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

    async fn launch(
        &self,
        arguments: String,
        options: &CallOptions,
        sink: Option<Sink>,
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
            return self.background(spec, sink.as_ref()).await;
        }
        let started = self
            .registration
            .tool
            .start(StartRequest {
                task_id: spec.id.clone(),
                arguments: arguments.clone(),
                attempt: 0,
            })
            .await;
        // A start error of attempt 0 is a model-visible failure, the same record for a call
        // and a stream.
        let started = match started {
            Ok(started) => started,
            Err(e) => return Ok(failed_foreground(&spec.description, &e.to_string())),
        };
        if !self.registration.is_recoverable() && !started.checkpoint.is_empty() {
            let _ = started.run.stop().await;
            return Err(ManagedError::Tool(
                "plain tool cannot return a checkpoint".into(),
            ));
        }
        let foreground = Foreground {
            spec,
            arguments,
            run: started.run,
            tool_checkpoint: started.checkpoint,
            started: tokio::time::Instant::now(),
        };
        self.observe(foreground, options, sink.as_ref()).await
    }

    fn foreground_timeout(&self, arguments: &str, options: &CallOptions) -> Option<Duration> {
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

    /// Observes the foreground attempt until its outcome, its timer, or the caller's end.
    async fn observe(
        &self,
        fg: Foreground,
        options: &CallOptions,
        sink: Option<&Sink>,
    ) -> Result<CallOutcome, ManagedError> {
        let timeout = self.foreground_timeout(&fg.arguments, options);
        let mut guard = StopOnDrop(Some(Arc::clone(&fg.run)));
        // A streaming caller that may hand off leaves the run's single update stream to the
        // background attempt that adopts it.
        let leave_updates = sink.is_some() && self.config.should_auto_background.is_some();
        let mut updates = if leave_updates {
            None
        } else {
            fg.run.updates()
        };
        let mut seen: HashMap<String, Vec<u8>> = HashMap::new();
        let mut materialize =
            self.registration.materializer.is_some() && !fg.spec.output_file.is_empty();
        let waiter = Arc::clone(&fg.run);
        let wait = async move { waiter.wait().await };
        tokio::pin!(wait);
        let timer = async {
            match timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(timer);
        loop {
            tokio::select! {
                outcome = &mut wait => {
                    if let Some(stream) = updates.as_mut() {
                        let drained = tokio::time::timeout(UPDATE_DRAIN_TIMEOUT, async {
                            while let Some(update) = stream.next().await {
                                self.foreground_update(&fg, update, &mut seen, &mut materialize, sink).await?;
                            }
                            Ok::<(), UpdateFailure>(())
                        })
                        .await;
                        let failure = match drained {
                            Ok(Ok(())) => None,
                            Ok(Err(e)) => Some(e),
                            Err(_) => Some(UpdateFailure::Other("update stream did not close after terminal outcome".to_owned())),
                        };
                        if let Some(failure) = failure {
                            guard.disarm();
                            return self.update_failure(&fg, failure, sink).await;
                        }
                    }
                    guard.disarm();
                    let outcome = outcome.unwrap_or_else(|e| ToolOutcome::Failed(e.to_string()));
                    return self.finish(&fg, outcome);
                }
                update = next_update(&mut updates) => match update {
                    None => updates = None,
                    Some(update) => {
                        if let Err(failure) = self.foreground_update(&fg, update, &mut seen, &mut materialize, sink).await {
                            guard.disarm();
                            return self.update_failure(&fg, failure, sink).await;
                        }
                    }
                },
                () = &mut timer => {
                    guard.disarm();
                    drop(updates);
                    return self.timed_out(fg, timeout.unwrap_or_default()).await;
                }
                () = closed(sink) => {
                    guard.disarm();
                    let _ = fg.run.stop().await;
                    return Err(ManagedError::Abandoned);
                }
            }
        }
    }

    /// An invalid update or update-stream failure in the foreground: the run is stopped;
    /// a call answers with a failed result, a stream ends with the error
    /// ([`ManagedError::InvalidUpdate`] for a broken bound, else
    /// [`ManagedError::InvalidOutcome`]).
    async fn update_failure(
        &self,
        fg: &Foreground,
        failure: UpdateFailure,
        sink: Option<&Sink>,
    ) -> Result<CallOutcome, ManagedError> {
        let _ = fg.run.stop().await;
        let message = failure.to_string();
        if sink.is_some() {
            return Err(match failure {
                UpdateFailure::Bounds(e) => ManagedError::InvalidUpdate(e),
                UpdateFailure::Other(message) => ManagedError::InvalidOutcome(message),
            });
        }
        Ok(failed_foreground(&fg.spec.description, &message))
    }

    /// One foreground update: checked, deduplicated in memory (nothing is persisted),
    /// materialized and projected on its first sighting.
    async fn foreground_update(
        &self,
        fg: &Foreground,
        update: Result<Update, String>,
        seen: &mut HashMap<String, Vec<u8>>,
        materialize: &mut bool,
        sink: Option<&Sink>,
    ) -> Result<(), UpdateFailure> {
        let update = update.map_err(|e| UpdateFailure::Other(format!("update stream: {e}")))?;
        update.validate().map_err(UpdateFailure::Bounds)?;
        if self.registration.is_recoverable() && update.event_id.is_empty() {
            return Err(UpdateFailure::Other(
                "recoverable update event id is required".into(),
            ));
        }
        if !update.event_id.is_empty() {
            match seen.get(&update.event_id) {
                Some(data) if *data == update.data => return Ok(()),
                Some(_) => {
                    return Err(UpdateFailure::Other(format!(
                        "task event id conflict: event {:?} was emitted with other bytes",
                        update.event_id
                    )))
                }
                None => {
                    seen.insert(update.event_id.clone(), update.data.clone());
                }
            }
            if *materialize {
                if let Some(m) = &self.registration.materializer {
                    m.append_output(
                        &fg.spec.id,
                        &update.event_id,
                        &fg.spec.output_file,
                        &update.data,
                    )
                    .await
                    .map_err(|e| UpdateFailure::Other(format!("materialize output: {e}")))?;
                }
            }
        }
        if let Some(sink) = sink {
            let _ = sink
                .send(Ok(ToolResult::record(ResponseEvent::update(&update))))
                .await;
        }
        Ok(())
    }

    /// The foreground outcome: an interrupt, or the foreground result.
    fn finish(&self, fg: &Foreground, outcome: ToolOutcome) -> Result<CallOutcome, ManagedError> {
        let description = &fg.spec.description;
        let record = |status, error: &str| {
            Ok(CallOutcome::Done(ToolResult::record(
                ResponseEvent::foreground_result(status, description, b"", error),
            )))
        };
        match outcome {
            ToolOutcome::WaitingInput {
                request,
                checkpoint,
            } => {
                if self.registration.tool.as_resumable().is_none() {
                    return record(
                        Status::Failed,
                        "foreground waiting-input requires a resumable tool",
                    );
                }
                let waiting = ManagedCheckpoint::waiting(
                    request.clone(),
                    checkpoint,
                    fg.tool_checkpoint.clone(),
                );
                // The same bounds as a durable wait.
                waiting
                    .encode()
                    .map_err(|e| ManagedError::InvalidOutcome(e.to_string()))?;
                let tool_checkpoint = waiting.tool_checkpoint;
                Ok(CallOutcome::Interrupted(Interrupt {
                    info: request.data.clone().unwrap_or_default(),
                    state: InterruptState {
                        tool_name: self.registration.info.name.clone(),
                        stage: InterruptStage::Foreground {
                            task_id: fg.spec.id.clone(),
                            arguments: fg.arguments.clone(),
                            request,
                            tool_checkpoint,
                            output_file: fg.spec.output_file.clone(),
                        },
                    },
                }))
            }
            ToolOutcome::Failed(error) if error.is_empty() => Err(ManagedError::InvalidOutcome(
                "a failure needs an error".into(),
            )),
            ToolOutcome::Failed(error) => record(Status::Failed, &error),
            ToolOutcome::Canceled(reason) => record(Status::Canceled, &reason),
            ToolOutcome::Completed(data) => Ok(CallOutcome::Done(self.completed(
                &fg.spec,
                &data,
                ResponseEvent::foreground_result(Status::Completed, description, &data, ""),
            )?)),
        }
    }

    /// A completed result, rendered when the registration has a renderer.
    fn completed(
        &self,
        spec: &TaskSpec,
        data: &[u8],
        mut envelope: ResponseEvent,
    ) -> Result<ToolResult, ManagedError> {
        let Some(render) = &self.registration.render else {
            return Ok(ToolResult::record(envelope));
        };
        let parts = render(spec, data)
            .map_err(|e| ManagedError::Render(format!("render completed result: {e}")))?
            .ok_or_else(|| ManagedError::Render("result renderer returned nil".into()))?;
        envelope.output = None;
        envelope.validate()?;
        Ok(ToolResult { envelope, parts })
    }

    /// The launch result of a task snapshot.
    fn launch_result(&self, task: &TaskState) -> Result<ToolResult, ManagedError> {
        let envelope = ResponseEvent::launch_result(task);
        if task.status == Status::Completed {
            return self.completed(&task.spec, &task.result_data, envelope);
        }
        envelope.validate()?;
        Ok(ToolResult::record(envelope))
    }

    /// The foreground time ran out: hand the run off when the policy allows, else stop it.
    async fn timed_out(
        &self,
        fg: Foreground,
        timeout: Duration,
    ) -> Result<CallOutcome, ManagedError> {
        if let (Some(policy), Some(handoff)) = (
            &self.config.should_auto_background,
            self.registration.tool.as_handoff(),
        ) {
            let candidate = CandidateInfo {
                task_id: fg.spec.id.clone(),
                kind: fg.spec.kind.clone(),
                description: fg.spec.description.clone(),
                output_file: fg.spec.output_file.clone(),
                elapsed: fg.started.elapsed(),
            };
            if policy(&candidate) {
                match self.hand_off(&fg, handoff).await {
                    Ok(task) => return Ok(CallOutcome::Done(self.launch_result(&task)?)),
                    Err(e) => tracing::debug!(task = %fg.spec.id, error = %e, "hand-off not taken"),
                }
            }
        }
        let _ = fg.run.stop().await;
        Err(ManagedError::ForegroundTimeout {
            timeout,
            task_id: fg.spec.id,
        })
    }

    /// Adopt → started marker → adopted-run table → submit with the marker as the initial
    /// checkpoint → the first attempt, detached from the caller.
    async fn hand_off(
        &self,
        fg: &Foreground,
        handoff: &dyn ForegroundHandoffTool,
    ) -> Result<TaskState, ManagedError> {
        let adopted = handoff
            .adopt(AdoptRequest {
                task_id: fg.spec.id.clone(),
                arguments: fg.arguments.clone(),
                run: Arc::clone(&fg.run),
                tool_checkpoint: fg.tool_checkpoint.clone(),
            })
            .await
            .map_err(|e| ManagedError::Tool(format!("adopt: {e}")))?;
        let marker = match ManagedCheckpoint::started(adopted.tool_checkpoint).encode() {
            Ok(marker) => marker,
            Err(e) => {
                let _ = adopted.run.stop().await;
                return Err(e.into());
            }
        };
        let live = self.tools.live();
        if !live.adopt(&fg.spec.id, Arc::clone(&adopted.run)) {
            let _ = adopted.run.stop().await;
            return Err(ManagedError::Config(
                "the task has an adopted run already".into(),
            ));
        }
        let submitted = self
            .manager
            .submit(SubmitRequest {
                spec: fg.spec.clone(),
                initial_checkpoint: marker,
                context_snapshot: Vec::new(),
            })
            .await;
        match submitted {
            Ok(task) => {
                drop(self.dispatch(&task.spec.id));
                Ok(task)
            }
            Err(e) => {
                if let Some(run) = live.take_adopted(&fg.spec.id) {
                    let _ = run.stop().await;
                }
                Err(e.into())
            }
        }
    }

    /// Runs the task's next attempt in this process, detached from the caller. A worker of
    /// this process may claim it first; either way the attempt sees this process's tables.
    fn dispatch(&self, task_id: &str) -> tokio::task::JoinHandle<bool> {
        let manager = self.manager.clone();
        let id = task_id.to_owned();
        tokio::spawn(async move {
            match manager.execute(&id).await {
                Ok(_) => true,
                Err(e) => {
                    tracing::debug!(task = %id, error = %e, "dispatch of a managed task");
                    false
                }
            }
        })
    }

    /// Explicit background: submit, dispatch, and hold a start window open — until the start
    /// boundary (a call) or the attempt's end (a stream, which forwards first emissions
    /// meanwhile), bounded by the foreground time — then answer with the task's launch result.
    async fn background(
        &self,
        spec: TaskSpec,
        sink: Option<&Sink>,
    ) -> Result<CallOutcome, ManagedError> {
        let live = self.tools.live();
        let id = spec.id.clone();
        let mut projection = None;
        if sink.is_some() {
            let (tx, rx) = mpsc::channel(PROJECTION_BUFFER);
            if !live.project(&id, tx) {
                return Err(ManagedError::Config(
                    "the task has a live projection already".into(),
                ));
            }
            projection = Some(rx);
        }
        let mut window = live.open_window(&id);
        let submitted = match self
            .manager
            .submit(SubmitRequest {
                spec,
                ..SubmitRequest::default()
            })
            .await
        {
            Ok(task) => task,
            Err(e) => {
                live.detach(&id);
                live.close_window(&id);
                return Err(e.into());
            }
        };
        let mut attempt = self.dispatch(&id);
        let mut attempt_done = false;
        let limit = self
            .config
            .foreground_timeout
            .unwrap_or(DEFAULT_FOREGROUND_TIMEOUT);
        let timer = async {
            if limit.is_zero() {
                std::future::pending::<()>().await;
            } else {
                tokio::time::sleep(limit).await;
            }
        };
        tokio::pin!(timer);
        match (sink, projection.as_mut()) {
            (Some(sink), Some(rx)) => {
                let end = self.manager.wait(&id);
                tokio::pin!(end);
                loop {
                    tokio::select! {
                        update = rx.recv() => match update {
                            Some(update) => {
                                let _ = sink.send(Ok(ToolResult::record(ResponseEvent::update(&update)))).await;
                            }
                            None => break,
                        },
                        _ = &mut end => break,
                        ran = &mut attempt, if !attempt_done => {
                            attempt_done = true;
                            // An attempt of this dispatch ended (a yield, say); a lost race
                            // means another attempt of this process runs it: keep watching.
                            if ran.unwrap_or(false) {
                                break;
                            }
                        }
                        () = &mut timer => break,
                        () = sink.closed() => break,
                    }
                }
                live.detach(&id);
                while let Ok(update) = rx.try_recv() {
                    let _ = sink
                        .send(Ok(ToolResult::record(ResponseEvent::update(&update))))
                        .await;
                }
            }
            _ => {
                tokio::select! {
                    _ = window.wait_for(|started| *started) => {}
                    // The dispatched attempt ended before its start boundary (it failed, or
                    // another attempt of this process runs the task).
                    _ = &mut attempt => {}
                    () = &mut timer => {}
                }
            }
        }
        live.close_window(&id);
        let task = self.manager.get(&id).await.unwrap_or(submitted);
        Ok(CallOutcome::Done(self.launch_result(&task)?))
    }
}

/// Why a foreground update ended the call.
#[derive(Debug, thiserror::Error)]
enum UpdateFailure {
    /// The update broke a bound.
    #[error(transparent)]
    Bounds(UpdateError),
    /// The stream failed, an event id conflicted, the materializer failed, ….
    #[error("{0}")]
    Other(String),
}

/// A model-visible failed foreground result (nothing was persisted).
fn failed_foreground(description: &str, error: &str) -> CallOutcome {
    CallOutcome::Done(ToolResult::record(ResponseEvent::foreground_result(
        Status::Failed,
        description,
        b"",
        error,
    )))
}

async fn next_update(updates: &mut Option<UpdateStream>) -> Option<Result<Update, String>> {
    match updates.as_mut() {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

async fn closed(sink: Option<&Sink>) {
    match sink {
        Some(sink) => sink.closed().await,
        None => std::future::pending().await,
    }
}

fn tool_error(name: &str, error: ManagedError) -> ToolError {
    match error {
        ManagedError::Interrupted(interrupt) => ToolError::Interrupted {
            tool: name.to_owned(),
            info: interrupt.info,
            state: interrupt.state.encode(),
        },
        ManagedError::InvalidArguments(message) => ToolError::invalid_arguments(name, ".", message),
        other => ToolError::failed(name, other),
    }
}

#[async_trait]
impl Tool for ManagedTool {
    fn info(&self) -> ToolInfo {
        ManagedTool::info(self)
    }

    /// The envelope record (one line); rich parts are available through
    /// [`ManagedTool::call`]. An interrupted call is [`ToolError::Interrupted`].
    async fn invoke(&self, arguments: &str) -> Result<String, ToolError> {
        let name = &self.registration.info.name;
        match self.call(arguments, &CallOptions::default()).await {
            Ok(CallOutcome::Done(result)) => result.text().map_err(|e| ToolError::failed(name, e)),
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

    /// One chunk per record (a JSON line each).
    async fn invoke_stream(&self, arguments: &str) -> Result<ToolOutputStream, ToolError> {
        let name = self.registration.info.name.clone();
        let stream = self.call_stream(arguments, &CallOptions::default());
        Ok(stream
            .map(move |item| match item {
                Ok(result) => result.text().map_err(|e| ToolError::failed(&name, e)),
                Err(e) => Err(tool_error(&name, e)),
            })
            .boxed())
    }
}

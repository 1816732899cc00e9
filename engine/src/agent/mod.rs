//! Durable agents: an agent's run (model → tools → model …) as a task whose journal is its
//! transcript, so that a crash between two model turns loses nothing and repeats nothing.
//!
//! * A run is a task of executor [`AGENT_EXECUTOR_KEY`] (lease policy retry, drain by
//!   yield). Its payload ([`AgentPayload`]) holds the opening conversation and the step
//!   limit.
//! * Each model answer is journaled as an update ([`TurnEntry`], event id `turn-<n>`)
//!   **before** any of its tool calls runs. A later attempt folds the journal
//!   ([`Transcript`]) and never sends a journaled turn to the model again.
//! * Each tool call runs as a managed tool, in a **child task** of the run with an id fixed
//!   by its place ([`call_task_id`]): a later attempt finds the task an earlier one created
//!   instead of creating another, waits for it if it runs, and reads its result if it ended —
//!   a completed call is never run again, and a running one is recovered as its tool's kind
//!   says (recoverable tools recover, plain tools fail on a lost lease). Each result is
//!   journaled ([`ToolResultEntry`], event id `result-<n>.<i>`) once its task ended.
//! * The step limit, cancellation (a Stop ends the model call and cancels the running tool
//!   calls), a drain (the attempt yields; its tool calls go on) and a tool waiting for input
//!   (the run waits until someone answers the tool's task) behave as for any task.
//! * A message sent to a running run ([`send_message`]: an input of kind [`MESSAGE_KIND`] in
//!   its mailbox) is taken before the next model call, once every call of the turn before
//!   has its result, and journaled ([`MessageEntry`], event id `message-<sequence>`): the
//!   model sees it as a user message from then on. One sent to preempt also drops a model
//!   call in flight, which is asked again with the message; tool calls run on (the model
//!   needs their results). A message sent while the run finishes is not lost: below its
//!   step limit the run completes only if its mailbox holds nothing unread, else it asks the
//!   model again (at the limit no model call could answer it: the run ends as it is).
//! * An interactive run (`AgentRequest::new(..).interactive()`) is a conversation that goes on:
//!   after each final answer it waits for the next message (`waiting_input`) rather than
//!   complete, until [`close_run`] ends it with its last answer.
//!
//! ```no_run
//! use std::sync::Arc;
//! use dtask_engine::agent::{AgentRequest, DurableAgent};
//! use dtask_engine::managed::{ManagedTools, ToolRegistry};
//! use dtask_engine::tool::{Message, OpenAiChatModel, OpenAiConfig};
//! use dtask_engine::{ExecutorRegistry, Manager, ManagerConfig, TaskStore};
//!
//! # async fn run(store: TaskStore) -> Result<(), Box<dyn std::error::Error>> {
//! let model = OpenAiChatModel::new(OpenAiConfig::from_env("gpt-4o-mini"))?;
//! let agent = DurableAgent::new(Arc::new(model), ManagedTools::new(ToolRegistry::new()));
//! let mut executors = ExecutorRegistry::new();
//! agent.register_executors(&mut executors)?;
//! let manager = Manager::new(store, executors, ManagerConfig::default());
//! let run = agent
//!     .submit(&manager, AgentRequest::new(vec![Message::user("Say hello.")]))
//!     .await?;
//! // A Worker for AGENT_EXECUTOR_KEY runs it (and runs it on after a crash).
//! # let _ = run; Ok(()) }
//! ```
//!
//! The guide is docs/tools.md, "Durable agents".

mod codec;
mod error;
mod executor;
mod transcript;

pub use codec::{
    call_task_id, cut_arguments, AgentAnswer, AgentPayload, CallStatus, MessageEntry,
    ToolResultEntry, TurnEntry, AGENT_EXECUTOR_KEY, AGENT_TASK_KIND, CLOSE_KIND, MAX_AGENT_STEPS,
    MESSAGE_KIND, TOOL_RESULT_KIND, TURN_KIND,
};
pub use error::AgentError;
pub use transcript::{Call, Next, Transcript, Turn};

use crate::managed::ManagedTools;
use crate::runtime::{ExecutorRegistry, ExecutorRegistryError, Manager, SubmitRequest};
use crate::store::{InputRecord, InputRequest, StoreError, TaskStore};
use crate::tool::{ChatModel, Execution, Message, DEFAULT_MAX_STEPS};
use dtask_journal::{Delivery, TaskSpec};
use dtask_replay::TaskState;
use executor::AgentExecutor;
use std::sync::Arc;
use std::time::Duration;

/// How often a run re-reads a tool call's task it waits for, besides being woken by its
/// changes (to notice leases that ran out and changes made by other processes).
pub const DEFAULT_TOOL_POLL: Duration = Duration::from_secs(1);

/// A chat model and the managed tools it may call, run as durable agent runs.
#[derive(Clone)]
pub struct DurableAgent {
    model: Arc<dyn ChatModel>,
    tools: ManagedTools,
    max_steps: u32,
    poll_interval: Duration,
    execution: Execution,
}

impl std::fmt::Debug for DurableAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableAgent")
            .field("tools", &self.tools)
            .field("max_steps", &self.max_steps)
            .field("poll_interval", &self.poll_interval)
            .field("execution", &self.execution)
            .finish_non_exhaustive()
    }
}

/// A request to start an agent run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct AgentRequest {
    /// The opening conversation (at least one message).
    pub messages: Vec<Message>,
    /// The run's step limit (default: the agent's).
    pub max_steps: Option<u32>,
    /// The run's task id (default: a new `agent_<uuid>`). With a fixed id, submitting again
    /// after a crash is refused with `AlreadyExists` and the run goes on as it was.
    pub task_id: Option<String>,
    /// The task's description (default: the start of the last user message).
    pub description: Option<String>,
    /// The session the run notifies (default: none): its lifecycle notifications — created,
    /// and then completed, failed or canceled — go to that session's outbox, for a consumer
    /// in another process (`POST /api/notifications/receive` of `dtask serve`).
    pub session: Option<String>,
    /// Whether the run is a conversation that goes on (default: no): after each final
    /// answer it waits for the next message ([`send_message`]; status `waiting_input`,
    /// [`Manager::wait`] answers `Interrupted`) instead of completing, until it is closed
    /// ([`close_run`]). Its step limit counts the model calls of the whole conversation.
    pub interactive: bool,
}

impl AgentRequest {
    /// A request to run from `messages`.
    #[must_use]
    pub fn new(messages: Vec<Message>) -> Self {
        Self {
            messages,
            ..Self::default()
        }
    }

    /// Sets the step limit.
    #[must_use]
    pub fn with_max_steps(mut self, max_steps: u32) -> Self {
        self.max_steps = Some(max_steps);
        self
    }

    /// Sets the task id.
    #[must_use]
    pub fn with_task_id(mut self, id: impl Into<String>) -> Self {
        self.task_id = Some(id.into());
        self
    }

    /// Makes the run interactive (the field `interactive`).
    #[must_use]
    pub fn interactive(mut self) -> Self {
        self.interactive = true;
        self
    }

    /// Sets the session the run notifies ([`AgentRequest::session`]).
    #[must_use]
    pub fn with_session(mut self, session: impl Into<String>) -> Self {
        self.session = Some(session.into());
        self
    }
}

/// A message for a running agent run, sent with [`send_message`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct AgentMessage {
    /// The text the model is to see as a user message.
    pub content: String,
    /// [`Delivery::Queued`] (the default): taken before the next model call.
    /// [`Delivery::Preempt`]: also drops a model call in flight, asked again with it.
    pub delivery: Delivery,
    /// The sender's idempotency key (default: a new UUID). Sending the same message with
    /// the same key again sends it once.
    pub event_id: Option<String>,
}

impl AgentMessage {
    /// A queued message of `content`.
    #[must_use]
    pub fn new(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            ..Self::default()
        }
    }

    /// Sends it to preempt: a model call in flight is dropped and asked again with it.
    #[must_use]
    pub fn preempt(mut self) -> Self {
        self.delivery = Delivery::Preempt;
        self
    }

    /// Sets the idempotency key.
    #[must_use]
    pub fn with_event_id(mut self, id: impl Into<String>) -> Self {
        self.event_id = Some(id.into());
        self
    }
}

/// Sends `message` to the agent run `run`: an input of kind [`MESSAGE_KIND`] in its
/// mailbox, which the run takes before its next model call. Returns the input and whether
/// it is new (`false`: the same event id sent before, with the same content). Any process
/// may send: over HTTP it is `POST /api/tasks/{id}/messages` of `dtask serve`.
///
/// # Errors
/// [`AgentError::NotAnAgent`]; the store's errors: `NotFound`, `MailboxSealed` once the run
/// has ended, `InputConflict` for an event id sent before with other content, `Invalid`.
pub async fn send_message(
    store: &TaskStore,
    run: &str,
    message: AgentMessage,
) -> Result<(InputRecord, bool), AgentError> {
    let task = store.get(run).await?;
    if task.spec.executor_key != AGENT_EXECUTOR_KEY {
        return Err(AgentError::NotAnAgent {
            task_id: run.to_owned(),
            executor_key: task.spec.executor_key.clone(),
        });
    }
    let event_id = message
        .event_id
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    if event_id == CLOSE_KIND {
        // The close's own id ([`close_run`]): a message under it would make every close
        // a conflict with it.
        return Err(AgentError::Store(StoreError::Invalid {
            field: "event_id",
            reason: format!("{CLOSE_KIND:?} is the close's id"),
        }));
    }
    Ok(store
        .send_input(
            run,
            InputRequest {
                event_id,
                kind: MESSAGE_KIND.to_owned(),
                data: message.content.into_bytes(),
                delivery: message.delivery,
            },
        )
        .await?)
}

/// Closes the interactive run `run`: an input of kind [`CLOSE_KIND`] (event id
/// `agent.close`, so closing twice closes once; a message must not take that id). Once it has answered every message sent before, the run
/// completes with its last answer; messages sent after the close are not answered. Returns
/// the input and whether it is new.
///
/// # Errors
/// [`AgentError::NotAnAgent`], [`AgentError::NotInteractive`]; the store's errors
/// (`MailboxSealed` once the run has ended).
pub async fn close_run(store: &TaskStore, run: &str) -> Result<(InputRecord, bool), AgentError> {
    let task = store.get(run).await?;
    if task.spec.executor_key != AGENT_EXECUTOR_KEY {
        return Err(AgentError::NotAnAgent {
            task_id: run.to_owned(),
            executor_key: task.spec.executor_key.clone(),
        });
    }
    if !AgentPayload::decode(&task.spec.payload)?.interactive {
        return Err(AgentError::NotInteractive(run.to_owned()));
    }
    Ok(store
        .send_input(
            run,
            InputRequest {
                event_id: CLOSE_KIND.to_owned(),
                kind: CLOSE_KIND.to_owned(),
                data: Vec::new(),
                delivery: Delivery::Queued,
            },
        )
        .await?)
}

impl DurableAgent {
    /// An agent of `model` over `tools`, with the default step limit (10 model calls).
    #[must_use]
    pub fn new(model: Arc<dyn ChatModel>, tools: ManagedTools) -> Self {
        Self {
            model,
            tools,
            max_steps: u32::try_from(DEFAULT_MAX_STEPS).unwrap_or(10),
            poll_interval: DEFAULT_TOOL_POLL,
            execution: Execution::Concurrent,
        }
    }

    /// Sets how the tool calls of one answer run: all at once ([`Execution::Concurrent`],
    /// the default) or one after the other in call order ([`Execution::Sequential`]).
    #[must_use]
    pub fn with_execution(mut self, execution: Execution) -> Self {
        self.execution = execution;
        self
    }

    /// Sets the default step limit of runs (clamped to 1 ..= [`MAX_AGENT_STEPS`]).
    #[must_use]
    pub fn with_max_steps(mut self, max_steps: u32) -> Self {
        self.max_steps = max_steps.clamp(1, MAX_AGENT_STEPS);
        self
    }

    /// Sets how often a run re-reads a tool call's task ([`DEFAULT_TOOL_POLL`]).
    #[must_use]
    pub fn with_poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every.max(Duration::from_millis(1));
        self
    }

    /// The managed tools.
    #[must_use]
    pub fn tools(&self) -> &ManagedTools {
        &self.tools
    }

    /// Registers the agent's executor and its tools' two executors.
    ///
    /// # Errors
    /// [`ExecutorRegistryError::Duplicate`] when one of the keys is registered already.
    pub fn register_executors(
        &self,
        registry: &mut ExecutorRegistry,
    ) -> Result<(), ExecutorRegistryError> {
        registry.register(AgentExecutor {
            model: Arc::clone(&self.model),
            tools: self.tools.clone(),
            infos: self.tools.registry().infos(),
            poll_interval: self.poll_interval,
            execution: self.execution,
        })?;
        self.tools.register_executors(registry)
    }

    /// Creates a run (pending, version 1); a worker of [`AGENT_EXECUTOR_KEY`] runs it.
    ///
    /// # Errors
    /// [`AgentError::EmptyConversation`], [`AgentError::InvalidMaxSteps`] (nothing
    /// created), the store's `AlreadyExists` for a taken id, and the runtime's errors.
    pub async fn submit(
        &self,
        manager: &Manager,
        request: AgentRequest,
    ) -> Result<TaskState, AgentError> {
        let mut payload = AgentPayload::new(
            request.messages,
            request.max_steps.unwrap_or(self.max_steps),
        )?;
        if request.interactive {
            payload = payload.into_interactive();
        }
        let id = match request.task_id {
            Some(id) => id,
            None => manager.allocate_task_id(AGENT_TASK_KIND)?,
        };
        // Each tool call's task is named after the run (`<run>.t<turn>.c<index>`): a run
        // whose calls could not be named is refused now, not at its first tool call.
        let longest = codec::call_task_id(&id, payload.max_steps, u32::MAX).len();
        let max = manager.store().config().max_id_bytes;
        if longest > max {
            return Err(AgentError::Store(StoreError::Invalid {
                field: "task id",
                reason: format!(
                    "a run's id leaves room for its tool calls' ids (`<run>.t<turn>.c<index>`, \
                     up to {longest} bytes here; the most is {max})"
                ),
            }));
        }
        let description = request
            .description
            .unwrap_or_else(|| describe(&payload.messages));
        let spec = TaskSpec {
            id,
            executor_key: AGENT_EXECUTOR_KEY.to_owned(),
            kind: AGENT_TASK_KIND.to_owned(),
            payload: payload.encode(),
            description,
            notify_session: request.session.is_some(),
            session_id: request.session.unwrap_or_default(),
            ..TaskSpec::default()
        };
        Ok(manager
            .submit(SubmitRequest {
                spec,
                ..SubmitRequest::default()
            })
            .await?)
    }
}

/// A run's description: the start of its last user message.
fn describe(messages: &[Message]) -> String {
    let text = messages
        .iter()
        .rev()
        .find(|m| matches!(m, Message::User { .. }))
        .and_then(Message::content)
        .unwrap_or("agent run");
    let mut description: String = text.chars().take(80).collect();
    if text.chars().count() > 80 {
        description.push('…');
    }
    description
}

/// The transcript of run `id` as the store has it now.
///
/// # Errors
/// [`AgentError::NotAnAgent`], the store's errors, and those of [`Transcript::fold`].
pub async fn read_transcript(store: &TaskStore, id: &str) -> Result<Transcript, AgentError> {
    let task = store.get(id).await?;
    if task.spec.executor_key != AGENT_EXECUTOR_KEY {
        return Err(AgentError::NotAnAgent {
            task_id: id.to_owned(),
            executor_key: task.spec.executor_key.clone(),
        });
    }
    let payload = AgentPayload::decode(&task.spec.payload)?;
    let mut transcript = Transcript::new(id, payload);
    let mut cursor: Option<String> = None;
    loop {
        let page = store.list_updates(id, cursor.as_deref(), 0, false).await?;
        for update in &page.updates {
            transcript.apply(&update.kind, &update.data)?;
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(transcript),
        }
    }
}

/// Whether `e` says a run with that id exists already (a second submit after a crash).
#[must_use]
pub fn is_already_submitted(e: &AgentError) -> bool {
    matches!(
        e,
        AgentError::Store(StoreError::AlreadyExists(_))
            | AgentError::Runtime(crate::runtime::RuntimeError::Store(
                StoreError::AlreadyExists(_)
            ))
    )
}

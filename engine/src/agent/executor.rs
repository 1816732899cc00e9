//! The executor of agent runs: one attempt folds the run's journal and carries on from
//! there — asks the model for the next turn, runs the turn's tool calls as child tasks, and
//! journals each answer and each result before it goes on.

use super::codec::{
    call_task_id, cut_arguments, AgentAnswer, AgentPayload, CallStatus, MessageEntry,
    ToolResultEntry, TurnEntry, AGENT_EXECUTOR_KEY, CLOSE_KIND, MESSAGE_KIND, TOOL_RESULT_KIND,
    TURN_KIND,
};
use super::error::AgentError;
use super::read_transcript;
use super::transcript::{Next, Transcript};
use crate::failpoints::point;
use crate::managed::{ManagedError, ManagedTools, ToolCall as ManagedCall};
use crate::runtime::{
    AttemptContext, Control, ExecutionError, ExecutionResult, Executor, Manager, Progress,
};
use crate::store::{NotFound, StoreError};
use crate::tool::{ChatModel, Execution, ToolInfo};
use async_trait::async_trait;
use dtask_journal::{Delivery, LeasePolicy, TaskSpec};
use dtask_replay::{Status, TaskState};
use futures::stream::{FuturesUnordered, StreamExt};
use std::sync::Arc;
use std::time::Duration;

/// Runs the attempts of agent runs (key [`AGENT_EXECUTOR_KEY`]).
pub(crate) struct AgentExecutor {
    pub(crate) model: Arc<dyn ChatModel>,
    pub(crate) tools: ManagedTools,
    pub(crate) infos: Vec<ToolInfo>,
    pub(crate) poll_interval: Duration,
    pub(crate) execution: Execution,
}

/// How the tool phase of a turn ended.
enum Flow {
    /// Every call has its result: ask the model again.
    Continue,
    /// A control ended the attempt with this result.
    Stop(ExecutionResult),
}

/// How long a run waits to go on after the journal's storage failed under it the first
/// time; each failure in a row doubles it, up to [`OUTAGE_PAUSE_MAX`].
const OUTAGE_PAUSE: Duration = Duration::from_secs(1);
/// The longest pause after a failure of the journal's storage.
const OUTAGE_PAUSE_MAX: Duration = Duration::from_secs(60);
/// Failures of the journal's storage in a row, the run not getting on between them, after
/// which the run fails: a fault that does not pass (a permission, a schema) must not ask
/// the model for the same turn forever.
const MAX_OUTAGES: u32 = 10;

/// What an attempt that met a failure of the journal's storage leaves in the checkpoint:
/// how many attempts in a row met one, and how far the run had got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Outages {
    /// Attempts in a row that met one.
    outages: u32,
    /// The run's journaled entries (turns, results, messages) when the last one met it.
    entries: usize,
}

impl Outages {
    /// The count this attempt continues: the checkpoint's, if the run has not got on since.
    fn continued(checkpoint: &[u8], entries: usize) -> u32 {
        serde_json::from_slice::<Self>(checkpoint)
            .ok()
            .filter(|o| o.entries == entries)
            .map_or(0, |o| o.outages)
    }

    /// The pause before the next attempt after `outages` in a row.
    fn pause(outages: u32) -> Duration {
        OUTAGE_PAUSE
            .saturating_mul(1 << outages.saturating_sub(1).min(6))
            .min(OUTAGE_PAUSE_MAX)
    }
}

/// Why an attempt stops short of a result of its own.
#[derive(Debug)]
enum Halt {
    /// The run fails with this error.
    Failed(String),
    /// The journal's storage failed for a while (a database out of reach, an I/O error, a
    /// full disk): the attempt yields, and the next carries on from the journal.
    Outage(String),
    /// The manager is closing (it refused a tool call's task): the attempt yields, as at a
    /// drain, and the next carries on from the journal.
    Closing,
}

fn failed(error: impl std::fmt::Display) -> Halt {
    Halt::Failed(error.to_string())
}

/// A store's refusal or failure, `context` saying what was being done.
fn store_failed(context: &str, e: &StoreError) -> Halt {
    let message = format!("{context}: {e}");
    if matches!(e.journal_error(), Some(dtask_journal::Error::Storage(_))) {
        Halt::Outage(message)
    } else {
        Halt::Failed(message)
    }
}

/// [`store_failed`] for the agent's own errors (a store's underneath, or a fold's).
fn agent_failed(context: &str, e: &AgentError) -> Halt {
    match e {
        AgentError::Store(store) => store_failed(context, store),
        AgentError::Runtime(crate::runtime::RuntimeError::Store(store)) => {
            store_failed(context, store)
        }
        other => failed(format!("{context}: {other}")),
    }
}

#[async_trait]
impl Executor for AgentExecutor {
    fn key(&self) -> &str {
        AGENT_EXECUTOR_KEY
    }

    fn lease_policy(&self) -> LeasePolicy {
        // Everything an attempt did is in the journal: a lost worker's run continues.
        LeasePolicy::Retry
    }

    fn supports_drain(&self) -> bool {
        true
    }

    fn validate_spec(&self, spec: &TaskSpec) -> Result<(), crate::runtime::ValidationError> {
        AgentPayload::decode(&spec.payload)
            .map(|_| ())
            .map_err(|e| crate::runtime::ValidationError::new(e.to_string()))
    }

    async fn execute(
        &self,
        attempt: AttemptContext,
        task: TaskState,
    ) -> Result<ExecutionResult, ExecutionError> {
        let (mut entries, mut transcript) = (None, None);
        let outcome = self
            .run(&attempt, &task, &mut entries, &mut transcript)
            .await;
        let result = match outcome {
            Ok(result) => Ok(result),
            Err(Halt::Closing) => Ok(ExecutionResult::Yield(Vec::new())),
            Err(Halt::Failed(message)) => Err(ExecutionError::Failed(message)),
            Err(Halt::Outage(message)) => outage(&attempt, &task, entries, &message),
        };
        // An attempt that ends the run ends its tool calls still running with it, however
        // it ends — canceled (also when the cancel came between attempts: the next attempt
        // finds it before anything runs), failed (a store's refusal mid-batch, the model,
        // the step limit, the storage failing too often), timed out. One that yields leaves
        // them to the next attempt, which waits for them; and one that has lost the run to
        // another attempt (its lease ran out) leaves them to that attempt.
        let ended = match &result {
            Ok(ExecutionResult::Canceled(reason) | ExecutionResult::Failed(reason))
            | Err(ExecutionError::Failed(reason)) => Some(reason.as_str()),
            _ => None,
        };
        if let (Some(reason), Some(transcript), Some(manager)) =
            (ended, &transcript, attempt.manager())
        {
            if holds_the_run(&attempt).await {
                cancel_unfinished(&manager, attempt.task_id(), transcript, reason).await;
            }
        }
        result
    }

    /// A run whose attempt yielded as a cancel came (a drain, an outage: its calls left to
    /// the next attempt) ended canceled, its yield replaced by the cancel's
    /// acknowledgement: no attempt will end its calls, so they are canceled here. (A run
    /// canceled at the request — pending and never claimed, waiting for its next message —
    /// has no call running.)
    async fn canceled_between_attempts(&self, manager: &Manager, task: &TaskState) {
        let run = task.spec.id.as_str();
        match read_transcript(manager.store(), run).await {
            Ok(transcript) => {
                cancel_unfinished(manager, run, &transcript, &task.result_error).await;
            }
            Err(e) => {
                tracing::warn!(task = %run, error = %e, "the canceled run's calls could not be read to be canceled");
            }
        }
    }
}

/// What an attempt whose journal's storage failed does: it yields, and the next goes on
/// from the journal once the storage is back (if the yield itself cannot be written, the
/// lease runs out, with the same effect) — unless this has happened too often in a row, the
/// run not getting on (`entries`: how many entries the run's journal held when read).
fn outage(
    attempt: &AttemptContext,
    task: &TaskState,
    entries: Option<usize>,
    message: &str,
) -> Result<ExecutionResult, ExecutionError> {
    let entries = entries.unwrap_or(usize::MAX);
    let outages = Outages::continued(&task.checkpoint, entries) + 1;
    if outages >= MAX_OUTAGES {
        return Err(ExecutionError::Failed(format!(
            "the journal's storage failed {outages} times in a row: {message}"
        )));
    }
    tracing::warn!(
        task = %attempt.task_id(),
        error = %message,
        outages,
        "the journal's storage failed under an agent run: it yields"
    );
    let checkpoint = serde_json::to_vec(&Outages { outages, entries })
        .map_err(|e| ExecutionError::Failed(e.to_string()))?;
    Ok(ExecutionResult::YieldFor(
        checkpoint,
        Outages::pause(outages),
    ))
}

/// Whether `attempt` still holds its run: not poisoned, and the run running at this
/// attempt (its cancel pending, perhaps). An attempt whose lease ran out, the run taken on
/// by the next, must not end the calls that attempt goes on waiting for.
async fn holds_the_run(attempt: &AttemptContext) -> bool {
    if attempt.poisoned().is_some() {
        return false;
    }
    attempt
        .store()
        .get(attempt.task_id())
        .await
        .is_ok_and(|state| state.status == Status::Running && state.attempt == attempt.attempt())
}

impl AgentExecutor {
    /// One attempt of the run: fold its journal and carry on from there.
    /// `entries` is set to how many entries the run's journal held when it was read, and
    /// `held` to the transcript, as the attempt leaves it.
    async fn run(
        &self,
        attempt: &AttemptContext,
        task: &TaskState,
        entries: &mut Option<usize>,
        held: &mut Option<Transcript>,
    ) -> Result<ExecutionResult, Halt> {
        let manager = attempt
            .manager()
            .ok_or_else(|| failed("the manager running the agent is gone"))?;
        let read = read_transcript(attempt.store(), attempt.task_id())
            .await
            .map_err(|e| agent_failed("read the run's journal", &e))?;
        *entries = Some(read.entries());
        let transcript = held.insert(read);
        let mut cursor = task.mailbox.consumed;
        let interactive = transcript.payload().interactive;
        loop {
            if let Some(reason) = attempt.cancellation() {
                return Ok(ExecutionResult::Canceled(reason));
            }
            let closing = transcript.takes_messages()
                && self.take_messages(attempt, transcript, &mut cursor).await?;
            match transcript.next() {
                Next::Finish(answer) => {
                    return Ok(finish(
                        &answer,
                        interactive,
                        closing,
                        transcript.takes_messages(),
                        cursor,
                    ))
                }
                Next::StepLimit { max_steps } => {
                    return Ok(ExecutionResult::Failed(format!(
                        "step limit reached: the model still asked for tools after {max_steps} \
                         model calls"
                    )))
                }
                Next::CallModel { turn } => {
                    if let Some(stop) = self.call_model(attempt, transcript, turn, cursor).await? {
                        return Ok(stop);
                    }
                }
                Next::RunTools { turn, pending } => {
                    let flow = self
                        .run_tools(attempt, &manager, transcript, turn, pending)
                        .await?;
                    if let Flow::Stop(result) = flow {
                        return Ok(result);
                    }
                }
            }
        }
    }
}

impl AgentExecutor {
    /// Takes the inputs of the run's mailbox after `cursor`: journals each message
    /// ([`MESSAGE_KIND`]) the transcript has not taken yet as a [`MessageEntry`] after the
    /// last turn, skips inputs of other kinds (a child's notifications, say), then moves
    /// the consumed cursor past them all. A crash between the two finds the messages in the
    /// journal and moves the cursor then: each message is taken once. An interactive run
    /// stops at an input of kind [`CLOSE_KIND`], leaving it unread: returns `true`, and the
    /// run ends once it has answered what came before (a crash meanwhile finds it again).
    async fn take_messages(
        &self,
        attempt: &AttemptContext,
        transcript: &mut Transcript,
        cursor: &mut u64,
    ) -> Result<bool, Halt> {
        let after_turn = transcript.turns().last().map_or(0, |t| t.number);
        let interactive = transcript.payload().interactive;
        let mut closing = false;
        let mut last = *cursor;
        'pages: loop {
            let page = attempt
                .inputs(last)
                .await
                .map_err(|e| store_failed("read the run's inputs", &e))?;
            if page.inputs.is_empty() {
                break;
            }
            for input in page.inputs {
                if interactive && input.kind == CLOSE_KIND {
                    closing = true;
                    break 'pages;
                }
                if input.kind == MESSAGE_KIND && input.sequence > transcript.last_message_sequence()
                {
                    let entry = MessageEntry::new(
                        input.sequence,
                        after_turn,
                        String::from_utf8_lossy(&input.data),
                    )
                    .within(attempt.store().config().max_value_bytes);
                    journal(attempt, MESSAGE_KIND, entry.event_id(), &entry).await?;
                    point!(crate::failpoints::AGENT_AFTER_MESSAGE, |m| Err(failed(m)));
                    transcript.push_message(entry).map_err(failed)?;
                }
                last = input.sequence;
            }
        }
        if last > *cursor {
            attempt
                .advance_cursor(*cursor, last)
                .await
                .map_err(|e| store_failed("consume the run's inputs", &e))?;
            *cursor = last;
        }
        Ok(closing)
    }

    /// Asks the model for turn `turn` and journals its answer; a control that arrives first
    /// ends the attempt (the answer, if it comes later, is not used: the next attempt asks
    /// again), and a message sent to preempt ([`Delivery::Preempt`]) after `cursor` drops
    /// the call (its answer is not used: the loop takes the message and asks again).
    async fn call_model(
        &self,
        attempt: &AttemptContext,
        transcript: &mut Transcript,
        turn: u32,
        cursor: u64,
    ) -> Result<Option<ExecutionResult>, Halt> {
        let messages = transcript.messages();
        let reply = tokio::select! {
            reply = self.model.reply(&messages, &self.infos) => reply,
            control = attempt.next_control() => return Ok(Some(on_control(control))),
            () = preempted(attempt, cursor, transcript.payload().interactive, self.poll_interval) => {
                return Ok(None)
            }
        };
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => {
                return Ok(Some(ExecutionResult::Failed(format!(
                    "the model failed: {e}"
                ))))
            }
        };
        let entry = TurnEntry::new(turn, reply.message, reply.usage)
            .within(attempt.store().config().max_value_bytes);
        journal(attempt, TURN_KIND, entry.event_id(), &entry).await?;
        point!(crate::failpoints::AGENT_AFTER_TURN, |m| Err(failed(m)));
        transcript.push_turn(entry).map_err(failed)?;
        Ok(None)
    }

    /// Runs the calls `pending` of turn `turn` — each a child task of this run — all at once
    /// or one after the other, and journals each result as its task ends.
    async fn run_tools(
        &self,
        attempt: &AttemptContext,
        manager: &Manager,
        transcript: &mut Transcript,
        turn: u32,
        pending: Vec<u32>,
    ) -> Result<Flow, Halt> {
        let batches: Vec<Vec<u32>> = if self.execution == Execution::Sequential {
            pending.into_iter().map(|index| vec![index]).collect()
        } else {
            vec![pending]
        };
        for batch in batches {
            let flow = self
                .run_batch(attempt, manager, transcript, turn, batch)
                .await?;
            if let Flow::Stop(result) = flow {
                return Ok(Flow::Stop(result));
            }
        }
        Ok(Flow::Continue)
    }

    /// Runs the calls `batch` of turn `turn` at the same time: creates (or finds) each
    /// call's task, then waits for them, journaling each result as its task ends.
    async fn run_batch(
        &self,
        attempt: &AttemptContext,
        manager: &Manager,
        transcript: &mut Transcript,
        turn: u32,
        batch: Vec<u32>,
    ) -> Result<Flow, Halt> {
        let calls = transcript
            .turns()
            .last()
            .map(|t| t.calls.clone())
            .unwrap_or_default();
        let mut running = FuturesUnordered::new();
        for index in batch {
            let Some(call) = calls.get(index as usize) else {
                continue;
            };
            match self.ensure_child(attempt, manager, turn, call).await? {
                Err(refusal) => {
                    let entry = ToolResultEntry {
                        version: 1,
                        turn,
                        index,
                        tool_call_id: call.call.id.clone(),
                        task_id: None,
                        status: CallStatus::Refused,
                        content: format!("Error: {refusal}"),
                    };
                    self.record(attempt, transcript, entry).await?;
                }
                Ok(task_id) => {
                    running.push(watch(manager.clone(), task_id, index, self.poll_interval));
                }
            }
        }
        loop {
            if running.is_empty() {
                return Ok(Flow::Continue);
            }
            tokio::select! {
                ended = running.next() => {
                    let Some(ended) = ended else { continue };
                    let (index, state) =
                        ended.map_err(|e| agent_failed("watch a tool call's task", &e))?;
                    point!(crate::failpoints::AGENT_AFTER_TOOL_ENDED, |m| Err(failed(m)));
                    let Some(call) = calls.get(index as usize) else { continue };
                    let (status, content) = match state.status {
                        Status::Completed => (
                            CallStatus::Completed,
                            String::from_utf8_lossy(&state.result_data).into_owned(),
                        ),
                        Status::Canceled => {
                            (CallStatus::Canceled, format!("Canceled: {}", state.result_error))
                        }
                        _ => (CallStatus::Failed, format!("Error: {}", state.result_error)),
                    };
                    let entry = ToolResultEntry {
                        version: 1,
                        turn,
                        index,
                        tool_call_id: call.call.id.clone(),
                        task_id: Some(call.task_id.clone()),
                        status,
                        content,
                    };
                    self.record(attempt, transcript, entry).await?;
                }
                control = attempt.next_control() => {
                    // The watches go first: one of them may be queued on a child's slot
                    // lock, and a queued lock that is handed to a future nobody polls is
                    // never released — canceling that child once the attempt ends would
                    // wait for it forever. (Stop and Timeout end the run, and its tools
                    // with it; a drain leaves them running: the next attempt waits for them.)
                    drop(running);
                    return Ok(Flow::Stop(on_control(control)));
                }
            }
        }
    }

    /// Journals a call's result and adds it to the transcript.
    async fn record(
        &self,
        attempt: &AttemptContext,
        transcript: &mut Transcript,
        entry: ToolResultEntry,
    ) -> Result<(), Halt> {
        // A tool's output may take more than an update once in JSON: it is cut, with a note
        // the model reads, rather than failing the run.
        let entry = entry.within(attempt.store().config().max_value_bytes);
        journal(attempt, TOOL_RESULT_KIND, entry.event_id(), &entry).await?;
        point!(crate::failpoints::AGENT_AFTER_TOOL_RESULT, |m| Err(failed(
            m
        )));
        transcript.push_result(entry).map_err(failed)
    }

    /// The call's child task: the one an earlier attempt created, or a new one. `Err` is a
    /// refusal to hand the model (an unknown tool, arguments the tool refuses).
    async fn ensure_child(
        &self,
        attempt: &AttemptContext,
        manager: &Manager,
        turn: u32,
        call: &super::transcript::Call,
    ) -> Result<Result<String, String>, Halt> {
        if let Some(len) = cut_arguments(&call.call.function.arguments) {
            return Ok(Err(format!(
                "the call's arguments had {len} bytes: too many for the run's journal, which \
                 takes {} bytes an entry",
                attempt.store().config().max_value_bytes
            )));
        }
        let id = call_task_id(attempt.task_id(), turn, call.index);
        match attempt.store().get(&id).await {
            Ok(found) if is_call_of(&found, attempt.task_id()) => return Ok(Ok(id)),
            // A task of the call's id that this run did not create (a caller chose the id
            // for a task of its own): never taken over, waited for or canceled as the call's.
            Ok(_) => {
                return Ok(Err(format!(
                    "the id {id} of the call's task is another task's"
                )))
            }
            Err(StoreError::NotFound(NotFound::Task(_))) => {}
            Err(e) => return Err(store_failed("read a tool call's task", &e)),
        }
        let submitted = self
            .tools
            .submit_child(
                manager,
                ManagedCall {
                    tool_name: call.call.function.name.clone(),
                    // No arguments are an empty object, as the tools node reads them (a
                    // streamed call of a tool without parameters sends none).
                    arguments: crate::tool::effective_arguments(&call.call.function.arguments)
                        .to_owned(),
                    tool_call_id: Some(call.call.id.clone()),
                    ..ManagedCall::default()
                },
                id.clone(),
                attempt.execution_context(),
            )
            .await;
        match submitted {
            Ok(_) => {}
            // Created meanwhile: by an earlier attempt of this run (whose write this one did
            // not read), or by a caller for a task of its own.
            Err(ManagedError::Runtime(crate::runtime::RuntimeError::Store(
                StoreError::AlreadyExists(_),
            ))) => match attempt.store().get(&id).await {
                Ok(found) if is_call_of(&found, attempt.task_id()) => {}
                Ok(_) => {
                    return Ok(Err(format!(
                        "the id {id} of the call's task is another task's"
                    )))
                }
                Err(e) => return Err(store_failed("read a tool call's task", &e)),
            },
            Err(e @ (ManagedError::UnknownTool(_) | ManagedError::InvalidArguments(_))) => {
                return Ok(Err(e.to_string()))
            }
            Err(ManagedError::Runtime(crate::runtime::RuntimeError::Store(e))) => {
                return Err(store_failed(&format!("create the task of call {id}"), &e))
            }
            Err(ManagedError::Runtime(crate::runtime::RuntimeError::Closed)) => {
                return Err(Halt::Closing)
            }
            Err(e) => return Err(failed(format!("create the task of call {id}: {e}"))),
        }
        point!(crate::failpoints::AGENT_AFTER_TOOL_CREATED, |m| Err(
            failed(m)
        ));
        Ok(Ok(id))
    }
}

/// What a run at its final answer ends its attempt with, having read its mailbox up to
/// `cursor` (the consumed cursor), `closing` when an interactive run found its close, and
/// `takes_messages` when a model call could still answer one (below the step limit).
///
/// An interactive run waits for its next message — unless one came in since the messages
/// were taken: then it goes back to pending and the next attempt takes it. Another run
/// completes only if nothing came in since: a message sent meanwhile sends it back to
/// pending likewise. At the step limit no message can be answered, and a closed run ends
/// with the inputs after its close unread: the run ends as it is.
fn finish(
    answer: &AgentAnswer,
    interactive: bool,
    closing: bool,
    takes_messages: bool,
    cursor: u64,
) -> ExecutionResult {
    if closing || !takes_messages {
        ExecutionResult::Completed(answer.encode())
    } else if interactive {
        ExecutionResult::WaitingInputIfNoInputs {
            cursor,
            checkpoint: waiting_checkpoint(answer.steps),
        }
    } else {
        ExecutionResult::CompletedIfNoInputs {
            cursor,
            data: answer.encode(),
        }
    }
}

/// The checkpoint of an interactive run waiting for its next message (what a reader of the
/// task sees; the run itself goes on from its journal).
fn waiting_checkpoint(turns: u32) -> Vec<u8> {
    serde_json::json!({ "waiting_for": MESSAGE_KIND, "after_turn": turns })
        .to_string()
        .into_bytes()
}

/// What a control makes of the attempt: Stop cancels, Timeout fails, Drain yields (the
/// journal holds everything the next attempt needs).
fn on_control(control: Control) -> ExecutionResult {
    match control {
        Control::Stop(reason) => ExecutionResult::Canceled(reason),
        Control::Timeout(reason) => ExecutionResult::Failed(reason),
        Control::Drain(_) => ExecutionResult::Yield(Vec::new()),
    }
}

/// Returns once the run's mailbox holds a message sent to preempt after `after`; never on
/// a sealed mailbox, a closed store, or an interactive run's close before it (the model call
/// it races goes on). Woken by each new
/// input of this process, and reads again every `poll` for inputs other nodes sent (and
/// after a failed read).
async fn preempted(attempt: &AttemptContext, mut after: u64, interactive: bool, poll: Duration) {
    loop {
        let read = match tokio::time::timeout(poll, attempt.wait_inputs(after)).await {
            Ok(read) => read,
            Err(_) => attempt.inputs(after).await,
        };
        let page = match read {
            Ok(page) => page,
            // Closed: nothing more will come. Another failure may pass (a database away
            // for a moment): read again after a poll.
            Err(crate::store::StoreError::Closed) => return std::future::pending().await,
            Err(_) => {
                tokio::time::sleep(poll).await;
                continue;
            }
        };
        if page.sealed {
            return std::future::pending().await;
        }
        for input in &page.inputs {
            if interactive && input.kind == CLOSE_KIND {
                // The run ends once it has answered what came before the close: a message
                // after it is never taken, so it must not drop the call either.
                return std::future::pending().await;
            }
            if input.kind == MESSAGE_KIND && input.delivery == Delivery::Preempt {
                return;
            }
            after = input.sequence;
        }
    }
}

/// Appends one entry of the run, fenced by the attempt and deduplicated by its event id.
async fn journal<T: serde::Serialize>(
    attempt: &AttemptContext,
    kind: &str,
    event_id: String,
    entry: &T,
) -> Result<(), Halt> {
    let data = serde_json::to_vec(entry).map_err(failed)?;
    attempt
        .emit_progress(Progress {
            event_id,
            kind: kind.to_owned(),
            data,
            metadata: Vec::new(),
        })
        .await
        .map_err(|e| store_failed(&format!("journal {kind}"), &e))?;
    Ok(())
}

/// Waits until the call's task has ended, executing it here whenever it is pending (an
/// attempt elsewhere may take it first: that race is benign). A task waiting for input
/// waits for whoever answers it. A task this process refuses to run (its tool no longer
/// registered, its arguments refused by a stricter check) ends the call: the run is the
/// process meant to run its calls, and would otherwise wait for it for ever — the task is
/// canceled, and its state is returned failed with the refusal, for the transcript.
async fn watch(
    manager: Manager,
    id: String,
    index: u32,
    poll: Duration,
) -> Result<(u32, TaskState), AgentError> {
    let store = manager.store().clone();
    loop {
        let state = store.get(&id).await?;
        match state.status {
            Status::Completed | Status::Failed | Status::Canceled => return Ok((index, state)),
            Status::Pending => {
                if let Err(refusal) = manager.runnable(&state) {
                    if let Err(e) = manager.request_cancel(&id, &refusal.to_string()).await {
                        tracing::warn!(task = %id, error = %e, "could not cancel a refused call");
                    }
                    let mut ended = store.get(&id).await.unwrap_or(state);
                    if ended.status != Status::Completed {
                        ended.status = Status::Failed;
                        ended.result_error = refusal.to_string();
                    }
                    return Ok((index, ended));
                }
                let manager = manager.clone();
                let child = id.clone();
                tokio::spawn(async move {
                    if let Err(e) = manager.execute(&child).await {
                        if !e.is_benign() {
                            tracing::warn!(task = %child, error = %e, "tool call attempt failed");
                        }
                    }
                });
            }
            Status::Running | Status::WaitingInput | Status::Suspended => {}
        }
        // A change wakes the wait at once; the poll catches leases that run out and
        // changes made by other processes.
        let _ = tokio::time::timeout(poll, store.wait_for_task_version(&id, state.version)).await;
    }
}

/// Whether `task` is a call's task of the run `run`: created by one of its attempts, as
/// its child. (A call's id is fixed by its place in the run, so a caller may have taken it
/// for a task of its own.)
fn is_call_of(task: &TaskState, run: &str) -> bool {
    task.parent_task_id == run
}

/// Asks every child that has not ended to stop.
/// Cancels the tasks of the last turn's calls of the run `run` that have no result yet (a
/// call whose task was never created, or whose id another task holds, is passed over),
/// `reason` saying why the run ended.
///
/// A call's task that is pending after an attempt of its own (its lease ran out, it was
/// drained, it checks back later) only records the intent: its next claim stops what the
/// earlier attempt left running (a managed tool's operation). The run is the process meant
/// to run its calls, so that claim is made here, as [`watch`] would have made it — unless
/// the task is delayed (it checks back later): its claim waits for its time.
async fn cancel_unfinished(manager: &Manager, run: &str, transcript: &Transcript, reason: &str) {
    let reason = if reason.is_empty() {
        "the agent run ended"
    } else {
        reason
    };
    let Some(turn) = transcript.turns().last() else {
        return;
    };
    for call in turn.calls.iter().filter(|c| c.result.is_none()) {
        match manager.store().get(&call.task_id).await {
            Ok(task) if is_call_of(&task, run) => {}
            Ok(_) | Err(StoreError::NotFound(NotFound::Task(_))) => continue,
            Err(e) => {
                tracing::warn!(task = %call.task_id, error = %e, "could not read a tool call's task");
                continue;
            }
        }
        match manager.request_cancel(&call.task_id, reason).await {
            Ok(state) if state.status == Status::Pending && state.cancel_requested_at.is_some() => {
                acknowledge_here(manager, &state);
            }
            Ok(_)
            | Err(crate::runtime::RuntimeError::Store(StoreError::NotFound(NotFound::Task(_)))) => {
            }
            Err(e) => {
                tracing::warn!(task = %call.task_id, error = %e, "could not cancel a tool call");
            }
        }
    }
}

/// Claims `task`, pending with a cancel intent, in a task of its own: its attempt
/// acknowledges the cancel (and stops what an earlier attempt left running). An attempt
/// elsewhere may take it first: that race is benign; a task this process refuses to run is
/// left to a process that can, a delayed one to its time, and none is claimed by a
/// manager that is closing.
fn acknowledge_here(manager: &Manager, task: &TaskState) {
    let delayed = task.delayed_past(manager.store().now()).is_some();
    if delayed || manager.is_closed() || manager.runnable(task).is_err() {
        return;
    }
    let manager = manager.clone();
    let child = task.spec.id.clone();
    tokio::spawn(async move {
        if let Err(e) = manager.execute(&child).await {
            if !e.is_benign() {
                tracing::warn!(task = %child, error = %e, "a canceled tool call's attempt failed");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::{AssistantMessage, Usage};

    /// Failures of the journal's storage are counted in a row while the run does not get
    /// on, with a pause that doubles up to a minute.
    #[test]
    fn outages_in_a_row_are_counted_while_the_run_does_not_get_on() {
        let left = serde_json::to_vec(&Outages {
            outages: 3,
            entries: 5,
        })
        .unwrap();
        assert_eq!(Outages::continued(&left, 5), 3);
        assert_eq!(
            Outages::continued(&left, 6),
            0,
            "the run got on: count again"
        );
        assert_eq!(Outages::continued(b"", 5), 0);
        assert_eq!(
            Outages::continued(br#"{"waiting_for":"agent.message"}"#, 5),
            0
        );
        let pauses: Vec<u64> = (1..=9).map(|n| Outages::pause(n).as_secs()).collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    /// How a run at its final answer ends: the race with a message sent meanwhile is the
    /// store's to decide (`engine/tests/runtime.rs` proves the `*IfNoInputs` results), so
    /// the run must hand it the cursor it read to, unless no message could be answered.
    #[test]
    fn a_final_answer_ends_the_attempt_so_that_no_message_is_left_unread() {
        let answer = AgentAnswer::new(AssistantMessage::text("5"), 2, Usage::default());
        let data = answer.encode();
        assert_eq!(
            finish(&answer, false, false, true, 7),
            ExecutionResult::CompletedIfNoInputs {
                cursor: 7,
                data: data.clone()
            }
        );
        let ExecutionResult::WaitingInputIfNoInputs { cursor, checkpoint } =
            finish(&answer, true, false, true, 7)
        else {
            panic!("an interactive run waits for its next message");
        };
        assert_eq!(cursor, 7);
        let checkpoint: serde_json::Value = serde_json::from_slice(&checkpoint).unwrap();
        assert_eq!(
            checkpoint,
            serde_json::json!({"waiting_for": "agent.message", "after_turn": 2})
        );
        // Closed, or at the step limit: the run ends as it is.
        for (interactive, closing, takes) in [
            (true, true, true),
            (false, false, false),
            (true, false, false),
        ] {
            assert_eq!(
                finish(&answer, interactive, closing, takes, 7),
                ExecutionResult::Completed(data.clone())
            );
        }
    }
}

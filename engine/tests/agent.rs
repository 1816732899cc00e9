//! Durable agents in one process, on a real journal: a run journals each model answer before
//! its tool calls, runs each call as a child task, continues from the journal in a new
//! attempt without asking the model or running a tool again, tells the model about unknown
//! tools, stops at its step limit, is canceled with its model call and its tools, and waits
//! for a person to answer a tool. The same run killed with SIGKILL at every step boundary is
//! `agent_crash.rs`.
#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    clippy::too_many_lines
)]

mod common;
#[path = "support/ledger.rs"]
mod ledger;

use async_trait::async_trait;
use common::Env;
use dtask_engine::agent::{
    close_run, read_transcript, send_message, AgentAnswer, AgentError, AgentMessage, AgentRequest,
    CallStatus, DurableAgent, AGENT_EXECUTOR_KEY, MESSAGE_KIND,
};
use dtask_engine::managed::tools::ApprovalTool;
use dtask_engine::managed::{ManagedTools, Registration, ToolRegistry};
use dtask_engine::tool::{
    AssistantMessage, ChatModel, Message, ScriptedModel, ToolCall, ToolError, ToolInfo,
};
use dtask_engine::{
    Command, ExecutorRegistry, Manager, ManagerConfig, StoreError, TaskOutcome, UpdateRequest,
};
use dtask_replay::Status;
use ledger::{read_ledger, LedgerTool};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn add(id: &str, a: i64, b: i64) -> ToolCall {
    ToolCall::function(id, "add", format!(r#"{{"a":{a},"b":{b}}}"#))
}

fn tools(ledger: &Path) -> ManagedTools {
    let mut registry = ToolRegistry::new();
    registry.register(LedgerTool::registration(ledger)).unwrap();
    registry
        .register(Registration::new(
            ToolInfo::new("approve", "Ask a person", ApprovalTool::parameters()),
            ApprovalTool,
        ))
        .unwrap();
    ManagedTools::new(registry)
}

fn manager(env: &Env, agent: &DurableAgent) -> Manager {
    let mut executors = ExecutorRegistry::new();
    agent.register_executors(&mut executors).unwrap();
    Manager::new(
        env.store().clone(),
        executors,
        ManagerConfig::default().with_heartbeat_interval(Duration::from_secs(3600)),
    )
}

fn agent(model: Arc<dyn ChatModel>, ledger: &Path) -> DurableAgent {
    DurableAgent::new(model, tools(ledger)).with_poll_interval(Duration::from_millis(20))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_journals_each_answer_and_runs_each_call_as_a_child_task() {
    let env = Env::new();
    let ledger = env.dir.path().join("ledger");
    let model = Arc::new(ScriptedModel::new([
        AssistantMessage::with_tool_calls(vec![add("c1", 2, 3), add("c2", 4, 5)]),
        AssistantMessage::text("5 and 9"),
    ]));
    let agent = agent(model.clone(), &ledger);
    let manager = manager(&env, &agent);
    let run = agent
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("2+3 and 4+5?")]).with_task_id("run-1"),
        )
        .await
        .unwrap();
    assert_eq!(run.spec.executor_key, AGENT_EXECUTOR_KEY);
    assert_eq!(run.spec.description, "2+3 and 4+5?");
    let done = manager.execute("run-1").await.unwrap();
    assert_eq!(done.status, Status::Completed, "{done:?}");
    let answer = AgentAnswer::decode(&done.result_data).unwrap();
    assert_eq!(answer.answer.content.as_deref(), Some("5 and 9"));
    assert_eq!(answer.steps, 2);

    // The model saw the tool results, in call order.
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].messages[2], Message::tool("c1", "5"));
    assert_eq!(requests[1].messages[3], Message::tool("c2", "9"));
    assert_eq!(requests[0].tool_names, ["add", "approve"]);

    // Each call is a child task of the run, named by its place, run once.
    for (index, sum) in [(0, "5"), (1, "9")] {
        let child = env
            .store()
            .get(&format!("run-1.t1.c{index}"))
            .await
            .unwrap();
        assert_eq!(child.parent_task_id, "run-1");
        assert_eq!(child.status, Status::Completed);
        assert_eq!(child.result_data, sum.as_bytes());
    }
    let mut lines = read_ledger(&ledger);
    lines.sort();
    assert_eq!(lines, ["run-1.t1.c0", "run-1.t1.c1"]);

    // The journal holds the answer before the results, and the fold reads it back.
    let page = env
        .store()
        .list_updates("run-1", None, 0, false)
        .await
        .unwrap();
    let kinds: Vec<_> = page.updates.iter().map(|u| u.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "agent.turn",
            "agent.tool_result",
            "agent.tool_result",
            "agent.turn"
        ]
    );
    let transcript = read_transcript(env.store(), "run-1").await.unwrap();
    assert_eq!(transcript.turns().len(), 2);
    assert_eq!(
        transcript.turns()[0].calls[1]
            .result
            .as_ref()
            .unwrap()
            .status,
        CallStatus::Completed
    );
    assert_eq!(transcript.messages().len(), 5);

    // A second submit of the same id is refused; nothing changes.
    let again = agent
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("again")]).with_task_id("run-1"),
        )
        .await
        .unwrap_err();
    assert!(
        dtask_engine::agent::is_already_submitted(&again),
        "{again:?}"
    );
}

/// Attempt 1 journaled the model's answer and ran one of its two calls, then its process
/// was lost; attempt 2 (after the lease ran out) asks the model only for the next turn and
/// runs only the call that had not run.
/// What attempt 1 of run `run` leaves behind, written with the store's own commands: the
/// run claimed, turn 1 (`first`, whose call 0 is `add(1, 1)` with id `c1`) journaled, and
/// call 0's task created. Returns the run's running state.
async fn left_by_attempt_one(
    env: &Env,
    agent: &DurableAgent,
    manager: &Manager,
    run: &str,
    first: AssistantMessage,
) -> dtask_replay::TaskState {
    let store = env.store();
    let task = store.get(run).await.unwrap();
    let running = store
        .execute(run, task.version, Command::Start)
        .await
        .unwrap();
    let turn = dtask_engine::agent::TurnEntry::new(1, first, None);
    store
        .append_update(
            run,
            UpdateRequest {
                attempt: running.attempt,
                event_id: turn.event_id(),
                kind: dtask_engine::agent::TURN_KIND.into(),
                data: serde_json::to_vec(&turn).unwrap(),
                ..UpdateRequest::default()
            },
        )
        .await
        .unwrap();
    agent
        .tools()
        .submit_child(
            manager,
            dtask_engine::managed::ToolCall {
                tool_name: "add".into(),
                arguments: r#"{"a":1,"b":1}"#.into(),
                tool_call_id: Some("c1".into()),
                ..Default::default()
            },
            format!("{run}.t1.c0"),
            dtask_engine::ExecutionContext {
                task_id: run.into(),
                attempt: running.attempt,
                generation: running.mailbox.generation,
            },
        )
        .await
        .unwrap();
    running
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_attempt_continues_from_the_journal_without_repeating_anything() {
    let env = Env::new();
    let ledger = env.dir.path().join("ledger");
    let first = AssistantMessage::with_tool_calls(vec![add("c1", 1, 1), add("c2", 2, 2)]);
    // The model has only the final answer left: asking it for turn 1 again would fail.
    let model = Arc::new(ScriptedModel::new([AssistantMessage::text("2 and 4")]));
    let agent = agent(model.clone(), &ledger);
    let manager = manager(&env, &agent);
    agent
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("1+1, 2+2?")]).with_task_id("run"),
        )
        .await
        .unwrap();

    // What attempt 1 left behind, written with the store's own commands.
    left_by_attempt_one(&env, &agent, &manager, "run", first).await;
    assert_eq!(
        manager.execute("run.t1.c0").await.unwrap().status,
        Status::Completed
    );
    assert_eq!(read_ledger(&ledger), ["run.t1.c0"]);

    // The lease runs out; attempt 2 carries on.
    env.clock.advance(Duration::from_secs(31));
    let done = manager.execute("run").await.unwrap();
    assert_eq!(done.status, Status::Completed, "{done:?}");
    assert_eq!(done.attempt, 2);
    let requests = model.requests();
    assert_eq!(requests.len(), 1, "turn 1 was asked again");
    assert_eq!(
        requests[0].messages[2..],
        [Message::tool("c1", "2"), Message::tool("c2", "4")]
    );
    let mut lines = read_ledger(&ledger);
    lines.sort();
    assert_eq!(lines, ["run.t1.c0", "run.t1.c1"], "a call ran twice");
}

/// A call left pending by an attempt, whose tool the process running the next attempt no
/// longer registers, ends the call failed with the refusal (its task canceled), and the run
/// goes on: the run is the process meant to run its calls, and would otherwise wait for it
/// for ever (a worker leaves a task it refuses for another process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_tool_is_no_longer_registered_ends_failed_and_the_run_goes_on() {
    let env = Env::new();
    let ledger = env.dir.path().join("ledger");
    let model = Arc::new(ScriptedModel::new([AssistantMessage::text("unused")]));
    let before = agent(model, &ledger);
    let manager = manager(&env, &before);
    before
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("1+1?")]).with_task_id("run"),
        )
        .await
        .unwrap();
    left_by_attempt_one(
        &env,
        &before,
        &manager,
        "run",
        AssistantMessage::with_tool_calls(vec![add("c1", 1, 1)]),
    )
    .await;
    // Restarted without the tool "add".
    let model = Arc::new(ScriptedModel::new([AssistantMessage::text(
        "no adding today",
    )]));
    let mut registry = ToolRegistry::new();
    registry
        .register(Registration::new(
            ToolInfo::new("approve", "Ask a person", ApprovalTool::parameters()),
            ApprovalTool,
        ))
        .unwrap();
    let after = DurableAgent::new(model.clone(), ManagedTools::new(registry))
        .with_poll_interval(Duration::from_millis(20));
    let manager = self::manager(&env, &after);
    env.clock.advance(Duration::from_secs(31));
    let done = tokio::time::timeout(Duration::from_secs(60), manager.execute("run"))
        .await
        .expect("the run waited for a call it cannot run")
        .unwrap();
    assert_eq!(done.status, Status::Completed, "{done:?}");
    let requests = model.requests();
    let told = &requests[0].messages[2];
    assert!(
        format!("{told:?}").contains("unavailable"),
        "the model was told: {told:?}"
    );
    assert!(read_ledger(&ledger).is_empty(), "the call ran");
    let child = env.store().get("run.t1.c0").await.unwrap();
    assert_eq!(child.status, Status::Canceled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_canceled_between_attempts_cancels_its_unfinished_tool_calls() {
    let env = Env::new();
    let ledger = env.dir.path().join("ledger");
    let model = Arc::new(ScriptedModel::new([AssistantMessage::text("unused")]));
    let agent = agent(model.clone(), &ledger);
    let manager = manager(&env, &agent);
    agent
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("1+1?")]).with_task_id("run"),
        )
        .await
        .unwrap();

    // Attempt 1 journaled a turn and created its call's task, then its worker was lost.
    left_by_attempt_one(
        &env,
        &agent,
        &manager,
        "run",
        AssistantMessage::with_tool_calls(vec![add("c1", 1, 1)]),
    )
    .await;
    // The lease runs out and the run is canceled while pending: only the intent is
    // recorded. Attempt 2 finds it before running anything, and ends the call with the run.
    env.clock.advance(Duration::from_secs(31));
    manager.request_cancel("run", "enough").await.unwrap();
    let done = manager.execute("run").await.unwrap();
    assert_eq!(done.status, Status::Canceled, "{done:?}");
    let child = env.store().get("run.t1.c0").await.unwrap();
    assert_eq!(
        child.status,
        Status::Canceled,
        "the call outlived its run: {child:?}"
    );
    assert!(read_ledger(&ledger).is_empty(), "the call ran");
    assert!(model.requests().is_empty());
}

/// A run canceled while its call's task is pending after an attempt of its own (its lease
/// ran out, its operation started): the call's cancel can only record the intent, which the
/// task's next claim acknowledges, stopping the operation. The run is the process meant to
/// run its calls, so it makes that claim — no worker may be there to make it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_canceled_stops_a_call_left_pending_by_an_attempt_of_its_own() {
    let env = Env::new();
    let ledger = env.dir.path().join("ledger");
    let model = Arc::new(ScriptedModel::new([AssistantMessage::text("unused")]));
    let agent = agent(model.clone(), &ledger);
    let manager = manager(&env, &agent);
    agent
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("1+1?")]).with_task_id("run"),
        )
        .await
        .unwrap();
    left_by_attempt_one(
        &env,
        &agent,
        &manager,
        "run",
        AssistantMessage::with_tool_calls(vec![add("c1", 1, 1)]),
    )
    .await;
    // The call's attempt 1 started its operation (the marker durable), then its worker was
    // lost with the run's.
    let store = env.store();
    let child = store.get("run.t1.c0").await.unwrap();
    let claimed = store
        .execute("run.t1.c0", child.version, Command::Start)
        .await
        .unwrap();
    let marker = dtask_engine::managed::codec::ManagedCheckpoint::started(b"started".to_vec())
        .encode()
        .unwrap();
    store
        .execute(
            "run.t1.c0",
            claimed.version,
            Command::CommitStart { checkpoint: marker },
        )
        .await
        .unwrap();
    env.clock.advance(Duration::from_secs(31));
    manager.request_cancel("run", "enough").await.unwrap();
    let done = manager.execute("run").await.unwrap();
    assert_eq!(done.status, Status::Canceled, "{done:?}");
    // A guard against a wait for ever, no measure.
    let child = tokio::time::timeout(
        Duration::from_secs(60),
        wait_for(&env, "run.t1.c0", |s| s.status.is_terminal()),
    )
    .await
    .expect("the call's cancel intent was never acknowledged: its operation runs on");
    assert_eq!(
        (child.status, child.attempt, child.result_error.as_str()),
        (Status::Canceled, 2, "enough")
    );
    assert!(
        read_ledger(&ledger).is_empty(),
        "the call was started again"
    );
    assert!(model.requests().is_empty());
}

/// A task that a caller created under the id a run's call would take is not the call's:
/// the run never waits for it, takes its result or cancels it; the model is told the call
/// could not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_of_another_holding_a_calls_id_is_never_taken_for_the_call() {
    let env = Env::new();
    let ledger = env.dir.path().join("ledger");
    let model = Arc::new(ScriptedModel::new([
        AssistantMessage::with_tool_calls(vec![add("c1", 1, 1), add("c2", 2, 2)]),
        AssistantMessage::text("only 4"),
    ]));
    let agent = agent(model.clone(), &ledger);
    let manager = manager(&env, &agent);
    // Someone else's task, named as the run's first call would be, left pending.
    env.store()
        .create(common::request(
            common::spec("run.t1.c0"),
            dtask_journal::LeasePolicy::Retry,
        ))
        .await
        .unwrap();
    agent
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("1+1, 2+2?")]).with_task_id("run"),
        )
        .await
        .unwrap();
    let done = tokio::time::timeout(Duration::from_secs(60), manager.execute("run"))
        .await
        .expect("the run waited for a task that is not its call's")
        .unwrap();
    assert_eq!(done.status, Status::Completed, "{done:?}");
    let told = &model.requests()[1].messages[2];
    assert!(
        format!("{told:?}").contains("another task's"),
        "the model was told: {told:?}"
    );
    let transcript = read_transcript(env.store(), "run").await.unwrap();
    let statuses: Vec<_> = transcript.turns()[0]
        .calls
        .iter()
        .map(|c| c.result.as_ref().map(|r| r.status))
        .collect();
    assert_eq!(
        statuses,
        [Some(CallStatus::Refused), Some(CallStatus::Completed)]
    );
    let other = env.store().get("run.t1.c0").await.unwrap();
    assert_eq!(
        (other.status, other.attempt),
        (Status::Pending, 0),
        "the other task was run or canceled"
    );
    assert_eq!(read_ledger(&ledger), ["run.t1.c1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_tools_and_refused_arguments_are_told_to_the_model() {
    let env = Env::new();
    let ledger = env.dir.path().join("ledger");
    let model = Arc::new(ScriptedModel::new([
        AssistantMessage::with_tool_calls(vec![
            ToolCall::function("c1", "nope", "{}"),
            ToolCall::function("c2", "add", r#"{"a":"x"}"#),
        ]),
        AssistantMessage::text("sorry"),
    ]));
    let agent = agent(model.clone(), &ledger);
    let manager = manager(&env, &agent);
    agent
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("?")]).with_task_id("r"),
        )
        .await
        .unwrap();
    assert_eq!(
        manager.execute("r").await.unwrap().status,
        Status::Completed
    );
    let told = &model.requests()[1].messages;
    assert_eq!(
        told[2].content(),
        Some("Error: tool \"nope\" is not registered")
    );
    assert!(
        told[3]
            .content()
            .unwrap()
            .starts_with("Error: invalid arguments"),
        "{told:?}"
    );
    let transcript = read_transcript(env.store(), "r").await.unwrap();
    let calls = &transcript.turns()[0].calls;
    assert!(calls
        .iter()
        .all(|c| c.result.as_ref().unwrap().status == CallStatus::Refused
            && c.result.as_ref().unwrap().task_id.is_none()));
    assert!(matches!(
        env.store().get("r.t1.c0").await,
        Err(dtask_engine::StoreError::NotFound(_))
    ));
    assert!(read_ledger(&ledger).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_step_limit_fails_the_run_after_its_last_tools_ran() {
    let env = Env::new();
    let ledger = env.dir.path().join("ledger");
    let model = Arc::new(ScriptedModel::new([
        AssistantMessage::with_tool_calls(vec![add("c1", 1, 2)]),
        AssistantMessage::with_tool_calls(vec![add("c2", 3, 4)]),
        AssistantMessage::text("never asked"),
    ]));
    let agent = agent(model.clone(), &ledger);
    let manager = manager(&env, &agent);
    agent
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("?")])
                .with_task_id("r")
                .with_max_steps(2),
        )
        .await
        .unwrap();
    let done = manager.execute("r").await.unwrap();
    assert_eq!(done.status, Status::Failed);
    assert!(done.result_error.contains("step limit"), "{done:?}");
    assert_eq!(model.requests().len(), 2);
    assert_eq!(read_ledger(&ledger).len(), 2);
}

/// A model that never answers.
struct Silent;

#[async_trait]
impl ChatModel for Silent {
    async fn generate(
        &self,
        _messages: &[Message],
        _tools: &[ToolInfo],
    ) -> Result<AssistantMessage, ToolError> {
        std::future::pending().await
    }
}

/// Submits run `r` asking `question` and runs its attempt on a task of its own.
async fn spawn_run(
    agent: &DurableAgent,
    manager: &Manager,
    question: &str,
) -> tokio::task::JoinHandle<Result<dtask_replay::TaskState, dtask_engine::RuntimeError>> {
    agent
        .submit(
            manager,
            AgentRequest::new(vec![Message::user(question)]).with_task_id("r"),
        )
        .await
        .unwrap();
    let manager = manager.clone();
    tokio::spawn(async move { manager.execute("r").await })
}

async fn wait_for(
    env: &Env,
    id: &str,
    what: impl Fn(&dtask_replay::TaskState) -> bool,
) -> dtask_replay::TaskState {
    loop {
        if let Ok(state) = env.store().get(id).await {
            if what(&state) {
                return state;
            }
            let _ = tokio::time::timeout(
                Duration::from_millis(50),
                env.store().wait_for_task_version(id, state.version),
            )
            .await;
        } else {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_the_model_call() {
    let env = Env::new();
    let agent = agent(Arc::new(Silent), &env.dir.path().join("ledger"));
    let manager = manager(&env, &agent);
    let run = spawn_run(&agent, &manager, "?").await;
    wait_for(&env, "r", |s| s.status == Status::Running).await;
    manager.request_cancel("r", "enough").await.unwrap();
    let done = run.await.unwrap().unwrap();
    assert_eq!(done.status, Status::Canceled);
    assert_eq!(done.result_error, "enough");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_the_running_tool_calls() {
    let env = Env::new();
    let ledger = env.dir.path().join("ledger");
    let model = Arc::new(ScriptedModel::new([AssistantMessage::with_tool_calls(
        vec![ToolCall::function(
            "c1",
            "add",
            r#"{"a":1,"b":1,"hold":true}"#,
        )],
    )]));
    let agent = agent(model, &ledger);
    let manager = manager(&env, &agent);
    let run = spawn_run(&agent, &manager, "?").await;
    wait_for(&env, "r.t1.c0", |s| {
        s.status == Status::Running && !s.checkpoint.is_empty()
    })
    .await;
    manager.request_cancel("r", "enough").await.unwrap();
    let done = run.await.unwrap().unwrap();
    assert_eq!(done.status, Status::Canceled);
    let child = wait_for(&env, "r.t1.c0", |s| s.status.is_terminal()).await;
    assert_eq!(child.status, Status::Canceled, "{child:?}");
    assert_eq!(read_ledger(&ledger).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_waiting_for_input_holds_the_run_until_a_person_answers() {
    let env = Env::new();
    let model = Arc::new(ScriptedModel::new([
        AssistantMessage::with_tool_calls(vec![ToolCall::function(
            "c1",
            "approve",
            r#"{"question":"Deploy?"}"#,
        )]),
        AssistantMessage::text("deployed"),
    ]));
    let agent = agent(model.clone(), &env.dir.path().join("ledger"));
    let manager = manager(&env, &agent);
    let run = spawn_run(&agent, &manager, "deploy").await;
    let waiting = wait_for(&env, "r.t1.c0", |s| s.status == Status::WaitingInput).await;
    assert_eq!(env.store().get("r").await.unwrap().status, Status::Running);
    manager
        .resume("r.t1.c0", waiting.version, b"\"yes\"".to_vec())
        .await
        .unwrap();
    let done = run.await.unwrap().unwrap();
    assert_eq!(done.status, Status::Completed, "{done:?}");
    assert_eq!(
        model.requests()[1].messages[2],
        Message::tool("c1", r#"{"approved":true}"#)
    );
    assert!(matches!(
        manager.wait("r").await.unwrap(),
        TaskOutcome::Completed(_)
    ));
}

/// What [`Steered`] does on one call before it answers.
enum Act {
    /// Answers at once.
    Answer,
    /// Sends this message to run `r`, lets the run's other futures go, then answers.
    Send(AgentMessage),
    /// Never answers (the call must be dropped).
    Hang,
    /// Lets the run's other futures go (a watch for preemption among them), then answers.
    Yield,
}

/// A scripted model that sends messages to the run it answers, or hangs, call by call.
struct Steered {
    store: dtask_engine::TaskStore,
    script: std::sync::Mutex<std::collections::VecDeque<(Act, AssistantMessage)>>,
    requests: std::sync::Mutex<Vec<Vec<Message>>>,
    called: tokio::sync::Notify,
}

impl Steered {
    fn new(env: &Env, script: Vec<(Act, AssistantMessage)>) -> Self {
        Self {
            store: env.store().clone(),
            script: std::sync::Mutex::new(script.into()),
            requests: std::sync::Mutex::new(Vec::new()),
            called: tokio::sync::Notify::new(),
        }
    }

    fn requests(&self) -> Vec<Vec<Message>> {
        self.requests.lock().unwrap().clone()
    }
}

#[async_trait]
impl ChatModel for Steered {
    async fn generate(
        &self,
        messages: &[Message],
        _tools: &[ToolInfo],
    ) -> Result<AssistantMessage, ToolError> {
        self.requests.lock().unwrap().push(messages.to_vec());
        self.called.notify_one();
        let (act, answer) = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .expect("a call the script has no answer for");
        match act {
            Act::Answer => {}
            Act::Send(message) => {
                send_message(&self.store, "r", message).await.unwrap();
                for _ in 0..20 {
                    tokio::task::yield_now().await;
                }
            }
            Act::Hang => std::future::pending::<()>().await,
            Act::Yield => {
                for _ in 0..20 {
                    tokio::task::yield_now().await;
                }
            }
        }
        Ok(answer)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_sent_to_a_run_reach_the_model_before_its_next_call() {
    let env = Env::new();
    let ledger = env.dir.path().join("ledger");
    let model = Arc::new(Steered::new(
        &env,
        vec![
            (
                Act::Send(AgentMessage::new("in euros, please").with_event_id("m1")),
                AssistantMessage::with_tool_calls(vec![add("c1", 2, 3)]),
            ),
            (
                Act::Send(AgentMessage::new("and in yen?")),
                AssistantMessage::text("5 EUR"),
            ),
            (Act::Answer, AssistantMessage::text("750 JPY")),
        ],
    ));
    let agent = agent(model.clone(), &ledger);
    let manager = manager(&env, &agent);
    let run = spawn_run(&agent, &manager, "2+3?").await;
    let done = run.await.unwrap().unwrap();
    assert_eq!(done.status, Status::Completed, "{done:?}");
    let answer = AgentAnswer::decode(&done.result_data).unwrap();
    assert_eq!(answer.answer.content.as_deref(), Some("750 JPY"));
    assert_eq!(answer.steps, 3);

    // A queued message waits for the call in flight and for the turn's tool results, then
    // reaches the next call; one sent while the model gave its final answer is answered.
    let requests = model.requests();
    assert_eq!(
        requests.len(),
        3,
        "no call was dropped for a queued message"
    );
    assert_eq!(
        requests[1][1..],
        [
            Message::Assistant(AssistantMessage::with_tool_calls(vec![add("c1", 2, 3)])),
            Message::tool("c1", "5"),
            Message::user("in euros, please"),
        ]
    );
    assert_eq!(
        requests[2][4..],
        [
            Message::Assistant(AssistantMessage::text("5 EUR")),
            Message::user("and in yen?"),
        ]
    );

    // Each message is journaled where the run took it, and every input is consumed.
    let page = env.store().list_updates("r", None, 0, false).await.unwrap();
    let kinds: Vec<_> = page.updates.iter().map(|u| u.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "agent.turn",
            "agent.tool_result",
            "agent.message",
            "agent.turn",
            "agent.message",
            "agent.turn"
        ]
    );
    let transcript = read_transcript(env.store(), "r").await.unwrap();
    let taken: Vec<_> = transcript
        .sent_messages()
        .iter()
        .map(|m| (m.after_turn, m.content.as_str()))
        .collect();
    assert_eq!(taken, [(1, "in euros, please"), (2, "and in yen?")]);
    assert_eq!(transcript.messages(), {
        let mut all = requests[2].clone();
        all.push(Message::Assistant(AssistantMessage::text("750 JPY")));
        all
    });
    assert_eq!(done.mailbox.consumed, done.mailbox.latest);

    // Once the run has ended: the same message again is the one sent, a new one is refused;
    // a task that is not a run refuses messages.
    let (again, new) = send_message(
        env.store(),
        "r",
        AgentMessage::new("in euros, please").with_event_id("m1"),
    )
    .await
    .unwrap();
    assert!(!new);
    assert_eq!(again.kind, MESSAGE_KIND);
    assert!(matches!(
        send_message(env.store(), "r", AgentMessage::new("more?")).await,
        Err(AgentError::Store(StoreError::MailboxSealed(_)))
    ));
    assert!(matches!(
        send_message(env.store(), "r.t1.c0", AgentMessage::new("hi")).await,
        Err(AgentError::NotAnAgent { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_sent_to_preempt_drops_the_model_call_in_flight() {
    let env = Env::new();
    let model = Arc::new(Steered::new(
        &env,
        vec![
            (Act::Hang, AssistantMessage::text("never")),
            (Act::Answer, AssistantMessage::text("stopped")),
        ],
    ));
    let agent = agent(model.clone(), &env.dir.path().join("ledger"));
    let manager = manager(&env, &agent);
    let run = spawn_run(&agent, &manager, "count to a million").await;
    model.called.notified().await;
    let (input, new) = send_message(
        env.store(),
        "r",
        AgentMessage::new("stop counting").preempt(),
    )
    .await
    .unwrap();
    assert!(new);
    assert_eq!(input.delivery, dtask_journal::Delivery::Preempt);
    // Bounded, so that a run that never drops the call fails the test rather than hang it.
    let done = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the call in flight was not dropped")
        .unwrap()
        .unwrap();
    assert_eq!(done.status, Status::Completed, "{done:?}");
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[1],
        [
            Message::user("count to a million"),
            Message::user("stop counting")
        ]
    );
    // The dropped call journaled nothing: the answer is turn 1.
    let transcript = read_transcript(env.store(), "r").await.unwrap();
    assert_eq!(transcript.turns().len(), 1);
    assert_eq!(transcript.sent_messages()[0].after_turn, 0);
    assert_eq!(
        AgentAnswer::decode(&done.result_data).unwrap().steps,
        1,
        "a dropped call is not a step"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_a_session_notifies_it_of_its_end() {
    let env = Env::new();
    let model = Arc::new(ScriptedModel::new([AssistantMessage::text("hello")]));
    let agent = agent(model, &env.dir.path().join("ledger"));
    let manager = manager(&env, &agent);
    let run = agent
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("hi")])
                .with_task_id("r")
                .with_session("chat-7"),
        )
        .await
        .unwrap();
    assert_eq!(run.spec.session_id, "chat-7");
    assert!(run.spec.notify_session);
    let done = manager.execute("r").await.unwrap();
    assert_eq!(done.status, Status::Completed);
    let notes = env
        .store()
        .receive_session_notifications("chat-7", 10, Duration::from_secs(60))
        .await
        .unwrap();
    let kinds: Vec<_> = notes
        .iter()
        .map(|n| (n.task_id.as_str(), n.kind.as_str()))
        .collect();
    assert_eq!(kinds, [("r", "task_created"), ("r", "completed")]);
    // Another session's consumer gets none of them.
    assert!(env
        .store()
        .receive_session_notifications("chat-8", 10, Duration::from_secs(60))
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_run_waits_for_each_next_message_and_ends_when_closed() {
    let env = Env::new();
    let ledger = env.dir.path().join("ledger");
    let model = Arc::new(ScriptedModel::new([
        AssistantMessage::text("hello"),
        AssistantMessage::with_tool_calls(vec![add("c1", 2, 3)]),
        AssistantMessage::text("5"),
        AssistantMessage::text("bye"),
    ]));
    let agent = agent(model.clone(), &ledger);
    let manager = manager(&env, &agent);
    agent
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("hi")])
                .with_task_id("r")
                .interactive(),
        )
        .await
        .unwrap();

    // After its answer the run waits for the next message; waiting for it is interrupted.
    let waiting = manager.execute("r").await.unwrap();
    assert_eq!(waiting.status, Status::WaitingInput, "{waiting:?}");
    assert!(matches!(
        manager.wait("r").await.unwrap(),
        TaskOutcome::Interrupted(_)
    ));
    let transcript = read_transcript(env.store(), "r").await.unwrap();
    let said = transcript.latest_answer().unwrap();
    assert_eq!(said.answer.content.as_deref(), Some("hello"));

    // A message wakes it: it runs the tools the model asks for, answers, and waits again.
    send_message(env.store(), "r", AgentMessage::new("2+3?"))
        .await
        .unwrap();
    assert_eq!(env.store().get("r").await.unwrap().status, Status::Pending);
    let waiting = manager.execute("r").await.unwrap();
    assert_eq!(waiting.status, Status::WaitingInput, "{waiting:?}");
    let transcript = read_transcript(env.store(), "r").await.unwrap();
    assert_eq!(
        transcript
            .latest_answer()
            .unwrap()
            .answer
            .content
            .as_deref(),
        Some("5")
    );
    assert_eq!(read_ledger(&ledger), ["r.t2.c0"]);

    // A message and the close together: the message is answered, then the run completes
    // with that answer; a message after the close is not answered.
    send_message(env.store(), "r", AgentMessage::new("thanks"))
        .await
        .unwrap();
    let (_, new) = close_run(env.store(), "r").await.unwrap();
    assert!(new);
    let (_, again) = close_run(env.store(), "r").await.unwrap();
    assert!(!again, "closing twice closes once");
    send_message(env.store(), "r", AgentMessage::new("one more thing"))
        .await
        .unwrap();
    let done = manager.execute("r").await.unwrap();
    assert_eq!(done.status, Status::Completed, "{done:?}");
    let answer = AgentAnswer::decode(&done.result_data).unwrap();
    assert_eq!(answer.answer.content.as_deref(), Some("bye"));
    assert_eq!(answer.steps, 4);
    let requests = model.requests();
    assert_eq!(requests.len(), 4);
    assert_eq!(requests[3].messages.last(), Some(&Message::user("thanks")));
    let transcript = read_transcript(env.store(), "r").await.unwrap();
    let taken: Vec<_> = transcript
        .sent_messages()
        .iter()
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(taken, ["2+3?", "thanks"]);
    assert!(matches!(close_run(env.store(), "r").await, Ok((_, false))));

    // A run that is not interactive takes no close.
    let model = Arc::new(ScriptedModel::new([AssistantMessage::text("ok")]));
    let plain = DurableAgent::new(model, tools(&ledger));
    plain
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("hi")]).with_task_id("plain"),
        )
        .await
        .unwrap();
    assert!(matches!(
        close_run(env.store(), "plain").await,
        Err(AgentError::NotInteractive(_))
    ));
}

/// A message as large as an input may be, whose JSON is larger than an update may be (its
/// quotes escaped), is cut to fit rather than fail the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_too_large_for_an_update_is_cut_and_the_run_goes_on() {
    let env = Env::with(
        dtask_engine::StoreConfig::default().with_max_value_bytes(4096),
        dtask_journal::Durability::Buffered,
    );
    let model = Arc::new(ScriptedModel::new([AssistantMessage::text("read it")]));
    let agent = agent(model.clone(), &env.dir.path().join("ledger"));
    let manager = manager(&env, &agent);
    agent
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("hi")]).with_task_id("r"),
        )
        .await
        .unwrap();
    send_message(env.store(), "r", AgentMessage::new("\"".repeat(4096)))
        .await
        .unwrap();
    let done = manager.execute("r").await.unwrap();
    assert_eq!(done.status, Status::Completed, "{done:?}");
    let seen = model.requests()[0].messages[1]
        .content()
        .unwrap()
        .to_owned();
    assert!(
        seen.ends_with(" […message cut: its text had 4096 bytes]"),
        "{seen}"
    );
    assert!(seen.starts_with(&"\"".repeat(1000)));
    let page = env.store().list_updates("r", None, 0, false).await.unwrap();
    assert!(page.updates[0].data.len() <= 4096);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_tool_calls_could_not_be_named_is_refused_at_submit() {
    let env = Env::new();
    let agent = agent(
        Arc::new(ScriptedModel::new([AssistantMessage::text("unused")])),
        &env.dir.path().join("ledger"),
    );
    let manager = manager(&env, &agent);
    // 1,020 bytes: a valid task id, but `<run>.t1.c0` would not be.
    let long = "r".repeat(1020);
    let refused = agent
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("hi")]).with_task_id(long.clone()),
        )
        .await;
    assert!(
        matches!(
            refused,
            Err(AgentError::Store(StoreError::Invalid {
                field: "task id",
                ..
            }))
        ),
        "{refused:?}"
    );
    assert!(env.store().get(&long).await.is_err(), "nothing was created");
    // One that leaves room is taken.
    let fits = "r".repeat(990);
    agent
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("hi")]).with_task_id(fits),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_result_too_large_for_an_update_is_cut_and_the_run_goes_on() {
    let env = Env::with(
        dtask_engine::StoreConfig::default().with_max_value_bytes(4096),
        dtask_journal::Durability::Buffered,
    );
    let model = Arc::new(ScriptedModel::new([
        AssistantMessage::with_tool_calls(vec![ToolCall::function(
            "c1",
            "add",
            r#"{"a":1,"b":1,"quotes":4000}"#,
        )]),
        AssistantMessage::text("read it"),
    ]));
    let agent = agent(model.clone(), &env.dir.path().join("ledger"));
    let manager = manager(&env, &agent);
    let run = spawn_run(&agent, &manager, "?").await;
    let done = run.await.unwrap().unwrap();
    assert_eq!(done.status, Status::Completed, "{done:?}");
    // The output fits a task's result (4,001 bytes), not an update once in JSON: the model
    // reads it cut, with a note.
    let seen = model.requests()[1].messages[2]
        .content()
        .unwrap()
        .to_owned();
    assert!(
        seen.starts_with("2\"\"") && seen.ends_with(" […result cut: its text had 4001 bytes]"),
        "{seen}"
    );
}

/// A model answer too large for an update once in JSON (a tool call writing a large file:
/// its arguments escaped twice) does not fail the run: the largest call's arguments are cut
/// from the journaled turn, that call is refused (its tool never run) and the model told
/// why; the other calls run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_answer_too_large_for_an_update_has_its_largest_call_refused() {
    let env = Env::with(
        dtask_engine::StoreConfig::default().with_max_value_bytes(4096),
        dtask_journal::Durability::Buffered,
    );
    let ledger = env.dir.path().join("ledger");
    let large = format!(r#"{{"a":1,"b":1,"note":"{}"}}"#, "\\\"".repeat(1500));
    let model = Arc::new(ScriptedModel::new([
        AssistantMessage::with_tool_calls(vec![
            ToolCall::function("c1", "add", large.clone()),
            add("c2", 2, 2),
        ]),
        AssistantMessage::text("4 only"),
    ]));
    let agent = agent(model.clone(), &ledger);
    let manager = manager(&env, &agent);
    let run = spawn_run(&agent, &manager, "?").await;
    let done = run.await.unwrap().unwrap();
    assert_eq!(done.status, Status::Completed, "{done:?}");
    let transcript = read_transcript(env.store(), "r").await.unwrap();
    let calls = &transcript.turns()[0].calls;
    assert_eq!(
        dtask_engine::agent::cut_arguments(&calls[0].call.function.arguments),
        Some(large.len())
    );
    let results: Vec<_> = calls
        .iter()
        .map(|c| c.result.as_ref().map(|r| r.status))
        .collect();
    assert_eq!(
        results,
        [Some(CallStatus::Refused), Some(CallStatus::Completed)]
    );
    let told = format!("{:?}", model.requests()[1].messages[2]);
    assert!(told.contains("too many for the run's journal"), "{told}");
    assert_eq!(read_ledger(&ledger), ["r.t1.c1"], "the cut call ran");
}

/// An interactive run with a session tells it of each answer: a `waiting_input`
/// notification each time it waits for the next message, for a front end in another
/// process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_run_tells_its_session_of_each_answer() {
    let env = Env::new();
    let model = Arc::new(ScriptedModel::new([
        AssistantMessage::text("hello"),
        AssistantMessage::text("fine"),
    ]));
    let agent = agent(model, &env.dir.path().join("ledger"));
    let manager = manager(&env, &agent);
    agent
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("hi")])
                .with_task_id("r")
                .with_session("chat-9")
                .interactive(),
        )
        .await
        .unwrap();
    let lease = Duration::from_secs(60);
    let kinds = |notes: Vec<dtask_engine::Notification>| -> Vec<String> {
        notes.into_iter().map(|n| n.kind).collect()
    };
    manager.execute("r").await.unwrap();
    let notes = env
        .store()
        .receive_session_notifications("chat-9", 10, lease)
        .await
        .unwrap();
    for n in &notes {
        env.store().ack_notification(&n.receipt).await.unwrap();
    }
    assert_eq!(kinds(notes), ["task_created", "waiting_input"]);
    send_message(env.store(), "r", AgentMessage::new("how are you?"))
        .await
        .unwrap();
    manager.execute("r").await.unwrap();
    let notes = env
        .store()
        .receive_session_notifications("chat-9", 10, lease)
        .await
        .unwrap();
    assert_eq!(kinds(notes), ["waiting_input"]);
}

/// A model whose first call waits until the test lets it answer; every call answers
/// "hello".
#[derive(Default)]
struct Gated {
    calls: std::sync::atomic::AtomicUsize,
    called: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

#[async_trait]
impl ChatModel for Gated {
    async fn generate(
        &self,
        _messages: &[Message],
        _tools: &[ToolInfo],
    ) -> Result<AssistantMessage, ToolError> {
        self.called.notify_one();
        if self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            self.release.notified().await;
        }
        Ok(AssistantMessage::text("hello"))
    }
}

/// On the PostgreSQL journal: the database drops the journal's connections while the model
/// answers, so the write of the answer fails. The run yields rather than fail — a moment
/// of the storage is not the run's end — and its next attempt asks the model again and
/// completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_journal_fails_for_a_moment_yields_and_goes_on() {
    let env = Env::new();
    let Some(url) = env.postgres.clone() else {
        eprintln!(
            "SKIPPED a_run_whose_journal_fails_for_a_moment_yields_and_goes_on: it runs on the \
             PostgreSQL journal (DTASK_TEST_BACKEND=postgres, as ./dev test runs this suite)"
        );
        return;
    };
    let schema = url.rsplit_once("schema=").unwrap().1.to_owned();
    let model = Arc::new(Gated::default());
    let agent = agent(model.clone(), &env.dir.path().join("ledger"));
    let manager = manager(&env, &agent);
    let run = spawn_run(&agent, &manager, "hi").await;
    model.called.notified().await;

    // The server ends every connection of this journal (as a restart would), then the
    // model answers.
    let base = std::env::var("DTASK_TEST_PG_URL").unwrap();
    let (admin, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let ended = admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&format!("dtask:{schema}")],
        )
        .await
        .unwrap();
    assert!(ended > 0, "no connection of the journal to end");
    // The store's reads open their connections again (a read on a connection the server
    // closed fails once, the next opens it again); the writer's stays broken until its
    // next append, the model's answer.
    let mut healthy = 0;
    for _ in 0..1_000 {
        if healthy == 8 {
            break;
        }
        healthy = if env.store().refresh().await.is_ok() {
            healthy + 1
        } else {
            0
        };
    }
    assert_eq!(healthy, 8, "the reads never came back");
    model.release.notify_one();
    let yielded = run.await.unwrap().unwrap();
    assert_eq!(yielded.status, Status::Pending, "{yielded:?}");
    assert!(yielded.not_before.is_some(), "{yielded:?}");
    assert!(read_transcript(env.store(), "r")
        .await
        .unwrap()
        .turns()
        .is_empty());

    // Its pause over, the next attempt asks again and completes.
    env.clock.advance(Duration::from_secs(1));
    let done = manager.execute("r").await.unwrap();
    assert_eq!(done.status, Status::Completed, "{done:?}");
    assert_eq!(model.calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(done.attempt, 2);
}

/// A message sent to preempt after an interactive run's close is never taken, so it must
/// not drop the model call that answers what came before the close: the run completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempt_message_after_the_close_does_not_keep_the_run_from_ending() {
    let env = Env::new();
    let model = Arc::new(Steered::new(
        &env,
        vec![
            (Act::Answer, AssistantMessage::text("hello")),
            (Act::Yield, AssistantMessage::text("you are welcome")),
        ],
    ));
    let agent = agent(model.clone(), &env.dir.path().join("ledger"));
    let manager = manager(&env, &agent);
    agent
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("hi")])
                .with_task_id("r")
                .interactive(),
        )
        .await
        .unwrap();
    let waiting = manager.execute("r").await.unwrap();
    assert_eq!(waiting.status, Status::WaitingInput);
    send_message(env.store(), "r", AgentMessage::new("thanks"))
        .await
        .unwrap();
    close_run(env.store(), "r").await.unwrap();
    send_message(
        env.store(),
        "r",
        AgentMessage::new("wait, one more").preempt(),
    )
    .await
    .unwrap();
    let done = tokio::time::timeout(Duration::from_secs(60), manager.execute("r"))
        .await
        .expect("the run ends")
        .unwrap();
    assert_eq!(done.status, Status::Completed, "{done:?}");
    let requests = model.requests();
    assert_eq!(requests.len(), 2, "the call was not dropped");
    assert_eq!(requests[1].last(), Some(&Message::user("thanks")));
}

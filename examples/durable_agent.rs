//! A durable agent: the run is a task, each model answer a journaled step, each tool call a
//! child task. Kill the process while it runs (Ctrl-C, or `kill -9`) and start it again with
//! the same directory: the same run finishes, without asking the model again for an answer
//! it gave or running a finished tool call again.
//!
//! Run: `cargo run --example durable_agent -- [DIR]` (default `./durable-agent`).
//! With `OPENAI_BASE_URL` set (and `OPENAI_API_KEY`, `OPENAI_MODEL` as your endpoint needs;
//! vLLM, llama.cpp's server and Ollama speak the same API) it talks to that model; without,
//! to a scripted model that answers the same way every time.
//! While the first tool calls run, the example sends the run a message (as a person would
//! steer an agent): the model sees it before its next call.
//! Afterwards `cargo run -- show durable-agent-run --journal DIR/journal` shows the run as a
//! conversation.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use dtask::engine::agent::{
    call_task_id, is_already_submitted, read_transcript, send_message, AgentAnswer, AgentError,
    AgentMessage, AgentRequest, DurableAgent, AGENT_EXECUTOR_KEY,
};
use dtask::engine::async_trait;
use dtask::engine::managed::{
    BackgroundTool, ManagedTools, RecoverRequest, RecoverableTool, Registration, Run, RunOutcome,
    StartRequest, StartResult, ToolFailure, ToolRegistry, ToolRunError,
};
use dtask::engine::tool::{
    AssistantMessage, ChatModel, Message, OpenAiChatModel, OpenAiConfig, ToolCall, ToolError,
    ToolInfo,
};
use dtask::engine::{
    Clock, ExecutorRegistry, Manager, ManagerConfig, StoreConfig, SystemClock, TaskOutcome,
    TaskStore, Worker, WorkerConfig,
};
use dtask::journal::{Journal, JournalOptions};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;

/// The run's task id: starting again finds it.
const RUN: &str = "durable-agent-run";

/// How long an `add` takes, so that there is time to kill the process while it runs.
const ADD_MILLIS: u64 = 3_000;

#[derive(Deserialize)]
struct Add {
    a: i64,
    b: i64,
}

/// A recoverable tool: `add {a, b}` answers after a few seconds. Its started marker holds
/// when it will be done, so a recovered call waits only for what is left.
struct SlowAdd;

struct AddRun {
    sum: i64,
    done_at: u64,
}

#[async_trait]
impl Run for AddRun {
    async fn wait(&self) -> Result<RunOutcome, ToolRunError> {
        let left = self.done_at.saturating_sub(SystemClock.now().0);
        tokio::time::sleep(Duration::from_millis(left)).await;
        Ok(RunOutcome::Completed(self.sum.to_string().into_bytes()))
    }

    async fn stop(&self) -> Result<(), ToolRunError> {
        Ok(())
    }
}

fn parse(arguments: &str) -> Result<Add, ToolFailure> {
    serde_json::from_str(arguments).map_err(|e| ToolFailure::new(format!("bad arguments: {e}")))
}

#[async_trait]
impl BackgroundTool for SlowAdd {
    fn validate_arguments(&self, arguments: &str) -> Result<(), ToolFailure> {
        parse(arguments).map(drop)
    }

    async fn start(&self, request: StartRequest) -> Result<StartResult, ToolRunError> {
        let add = parse(&request.arguments)?;
        let done_at = SystemClock.now().0 + ADD_MILLIS;
        println!(
            "  tool: add({}, {}) started as {}",
            add.a, add.b, request.task_id
        );
        Ok(StartResult {
            run: Arc::new(AddRun {
                sum: add.a + add.b,
                done_at,
            }),
            checkpoint: done_at.to_string().into_bytes(),
        })
    }

    fn as_recoverable(&self) -> Option<&dyn RecoverableTool> {
        Some(self)
    }
}

#[async_trait]
impl RecoverableTool for SlowAdd {
    async fn recover(&self, request: RecoverRequest) -> Result<Arc<dyn Run>, ToolRunError> {
        let add = parse(&request.arguments)?;
        let done_at = String::from_utf8_lossy(&request.checkpoint)
            .parse()
            .map_err(|_| ToolRunError::failed("unreadable checkpoint"))?;
        println!("  tool: {} recovered, not started again", request.task_id);
        Ok(Arc::new(AddRun {
            sum: add.a + add.b,
            done_at,
        }))
    }
}

/// A model that answers by turn, the same way every time: two additions, one more, then the
/// answer (in words too, if a user message asks for words).
struct ScriptedByTurn;

#[async_trait]
impl ChatModel for ScriptedByTurn {
    async fn generate(
        &self,
        messages: &[Message],
        _tools: &[ToolInfo],
    ) -> Result<AssistantMessage, ToolError> {
        let turn = messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant(_)))
            .count();
        let add = |id: &str, a: i64, b: i64| {
            ToolCall::function(id, "add", format!(r#"{{"a":{a},"b":{b}}}"#))
        };
        let in_words = messages.iter().any(|m| {
            matches!(m, Message::User { .. }) && m.content().is_some_and(|c| c.contains("words"))
        });
        Ok(match turn {
            0 => AssistantMessage::with_tool_calls(vec![add("c1", 19, 23), add("c2", 100, 7)]),
            1 => AssistantMessage::with_tool_calls(vec![add("c3", 42, 107)]),
            _ if in_words => AssistantMessage::text(
                "19 + 23 = 42, 100 + 7 = 107, and together 149 (one hundred forty-nine).",
            ),
            _ => AssistantMessage::text("19 + 23 = 42, 100 + 7 = 107, and together 149."),
        })
    }
}

/// Once the first tool call runs, a person asks for more. The message waits for the
/// turn's tool results and reaches the model's next call; its event id makes a second
/// start's send the same message.
async fn steer(manager: &Manager) {
    let first_call = call_task_id(RUN, 1, 0);
    while manager.store().get(&first_call).await.is_err() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let message = AgentMessage::new("Say the sum in words, too.").with_event_id("follow-up");
    match send_message(manager.store(), RUN, message).await {
        Ok((_, true)) => println!("message sent: Say the sum in words, too."),
        Ok((_, false)) => println!("message: sent before"),
        Err(AgentError::Store(dtask::engine::StoreError::MailboxSealed(_))) => {
            println!("message: the run had ended");
        }
        Err(e) => panic!("send the message: {e}"),
    }
}

#[tokio::main]
async fn main() {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "durable-agent".to_owned());
    let journal = Journal::open(
        std::path::Path::new(&dir).join("journal"),
        JournalOptions::default(),
    )
    .expect("open the journal (is another run of this example still going?)");
    // A short lease, so that a restart soon takes over the run of a killed process.
    let store = TaskStore::open(
        journal,
        SystemClock,
        StoreConfig::default().with_lease_duration(Duration::from_secs(4)),
    )
    .unwrap();

    let model: Arc<dyn ChatModel> = if std::env::var("OPENAI_BASE_URL").is_ok() {
        let name = std::env::var("OPENAI_MODEL").unwrap_or_else(|_| "gpt-4o-mini".to_owned());
        println!(
            "model: {name} at {}",
            std::env::var("OPENAI_BASE_URL").unwrap()
        );
        Arc::new(OpenAiChatModel::new(OpenAiConfig::from_env(name)).unwrap())
    } else {
        println!("model: scripted (set OPENAI_BASE_URL for a real one)");
        Arc::new(ScriptedByTurn)
    };
    let mut tools = ToolRegistry::new();
    tools
        .register(Registration::new(
            ToolInfo::new(
                "add",
                "Add two integers (takes a few seconds)",
                serde_json::json!({
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"]
                }),
            ),
            SlowAdd,
        ))
        .unwrap();
    let agent = DurableAgent::new(model, ManagedTools::new(tools)).with_max_steps(6);
    let mut executors = ExecutorRegistry::new();
    agent.register_executors(&mut executors).unwrap();
    let manager = Manager::new(
        store,
        executors,
        ManagerConfig::default().with_heartbeat_interval(Duration::from_secs(1)),
    );

    let request = AgentRequest::new(vec![
        Message::system("Use the add tool for every addition."),
        Message::user("What are 19 + 23 and 100 + 7, and what is their sum?"),
    ])
    .with_task_id(RUN);
    match agent.submit(&manager, request).await {
        Ok(_) => println!("run {RUN}: started"),
        Err(e) if is_already_submitted(&e) => {
            println!("run {RUN}: found in the journal, carrying on");
        }
        Err(e) => panic!("submit: {e}"),
    }

    // A worker runs the run (and, after a crash, takes it over once its lease ran out).
    let worker = Worker::new(
        manager.clone(),
        WorkerConfig::new([AGENT_EXECUTOR_KEY]).with_poll_interval(Duration::from_millis(500)),
    )
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    steer(&manager).await;
    let outcome = manager.wait(RUN).await.unwrap();
    let _ = stop.send(());
    worker.await.unwrap().unwrap();

    let transcript = read_transcript(manager.store(), RUN).await.unwrap();
    println!("\ntranscript:");
    for message in transcript.messages() {
        match &message {
            Message::Assistant(a) if a.has_tool_calls() => {
                for call in &a.tool_calls {
                    println!(
                        "  assistant → {}({})",
                        call.function.name, call.function.arguments
                    );
                }
            }
            other => println!("  {:<9}   {}", other.role(), other.content().unwrap_or("")),
        }
    }
    match outcome {
        TaskOutcome::Completed(data) => {
            let answer = AgentAnswer::decode(&data).unwrap();
            println!(
                "\ndone in {} model calls ({} tokens)",
                answer.steps, answer.usage.total_tokens
            );
        }
        other => println!("\nthe run ended: {other:?}"),
    }
    println!("inspect it: cargo run -- show {RUN} --journal {dir}/journal");
}

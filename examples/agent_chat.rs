//! A conversation as one durable task: an interactive agent run that, after each answer,
//! waits for the next message. Each line read from standard input is sent to the run as a
//! message; the end of input (Ctrl-D) closes it. Kill the process at any point and start it
//! again with the same directory: the conversation goes on where it was, nothing the model
//! answered asked again.
//!
//! Run: `cargo run --example agent_chat -- [DIR]` (default `./agent-chat`), then type.
//! With `OPENAI_BASE_URL` set (and `OPENAI_API_KEY`, `OPENAI_MODEL` as your endpoint needs)
//! it talks to that model; without, to a model that repeats what it was told.
//! Afterwards `cargo run -- show agent-chat-run --journal DIR/journal` shows the conversation.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use dtask::engine::agent::{
    close_run, is_already_submitted, read_transcript, send_message, AgentAnswer, AgentMessage,
    AgentRequest, DurableAgent, AGENT_EXECUTOR_KEY,
};
use dtask::engine::async_trait;
use dtask::engine::managed::{ManagedTools, ToolRegistry};
use dtask::engine::tool::{
    AssistantMessage, ChatModel, Message, OpenAiChatModel, OpenAiConfig, ToolError, ToolInfo,
};
use dtask::engine::{
    ExecutorRegistry, Manager, ManagerConfig, StoreConfig, SystemClock, TaskOutcome, TaskStore,
    Worker, WorkerConfig,
};
use dtask::journal::{Journal, JournalOptions};
use std::io::BufRead;
use std::sync::Arc;
use std::time::Duration;

/// The run's task id: starting again finds it.
const RUN: &str = "agent-chat-run";

/// A model that repeats the last thing it was told, counting the turns.
struct Parrot;

#[async_trait]
impl ChatModel for Parrot {
    async fn generate(
        &self,
        messages: &[Message],
        _tools: &[ToolInfo],
    ) -> Result<AssistantMessage, ToolError> {
        let turn = messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant(_)))
            .count()
            + 1;
        let said = messages
            .iter()
            .rev()
            .find(|m| matches!(m, Message::User { .. }))
            .and_then(Message::content)
            .unwrap_or("");
        Ok(AssistantMessage::text(format!("({turn}) you said: {said}")))
    }
}

/// Waits until the run has answered: it waits for the next message, or it has ended.
async fn answered(manager: &Manager) -> TaskOutcome {
    manager.wait(RUN).await.unwrap()
}

/// The agent and a manager over the journal in `dir`.
fn open(dir: &str) -> (DurableAgent, Manager) {
    let journal = Journal::open(
        std::path::Path::new(dir).join("journal"),
        JournalOptions::default(),
    )
    .expect("open the journal (is another run of this example still going?)");
    let store = TaskStore::open(
        journal,
        SystemClock,
        StoreConfig::default().with_lease_duration(Duration::from_secs(4)),
    )
    .unwrap();
    let model: Arc<dyn ChatModel> = if std::env::var("OPENAI_BASE_URL").is_ok() {
        let name = std::env::var("OPENAI_MODEL").unwrap_or_else(|_| "gpt-4o-mini".to_owned());
        Arc::new(OpenAiChatModel::new(OpenAiConfig::from_env(name)).unwrap())
    } else {
        Arc::new(Parrot)
    };
    let agent =
        DurableAgent::new(model, ManagedTools::new(ToolRegistry::new())).with_max_steps(100);
    let mut executors = ExecutorRegistry::new();
    agent.register_executors(&mut executors).unwrap();
    let manager = Manager::new(
        store,
        executors,
        ManagerConfig::default().with_heartbeat_interval(Duration::from_secs(1)),
    );
    (agent, manager)
}

#[tokio::main]
async fn main() {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "agent-chat".to_owned());
    let (agent, manager) = open(&dir);

    let request = AgentRequest::new(vec![
        Message::system("You are a helpful assistant. Keep answers short."),
        Message::user("Hello!"),
    ])
    .with_task_id(RUN)
    .interactive();
    match agent.submit(&manager, request).await {
        Ok(_) => println!("conversation {RUN}: started"),
        Err(e) if is_already_submitted(&e) => {
            println!("conversation {RUN}: found in the journal, going on");
        }
        Err(e) => panic!("submit: {e}"),
    }
    let worker = Worker::new(
        manager.clone(),
        WorkerConfig::new([AGENT_EXECUTOR_KEY]).with_poll_interval(Duration::from_millis(200)),
    )
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));

    // Each answer, then the next line as the next message; the end of input closes the run.
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut asked = 0usize;
    loop {
        match answered(&manager).await {
            TaskOutcome::Interrupted(_) => {
                let transcript = read_transcript(manager.store(), RUN).await.unwrap();
                if let Some(said) = transcript.latest_answer() {
                    println!("agent> {}", said.answer.content.unwrap_or_default());
                }
            }
            TaskOutcome::Completed(data) => {
                let answer = AgentAnswer::decode(&data).unwrap();
                println!(
                    "conversation closed after {} model calls; its last answer: {}",
                    answer.steps,
                    answer.answer.content.unwrap_or_default()
                );
                break;
            }
            other => {
                println!("the conversation ended: {other:?}");
                break;
            }
        }
        // A message wakes the run (it is pending from its append on): the wait above sees
        // its next answer.
        if let Some(line) = lines.recv().await {
            asked += 1;
            println!("you> {line}");
            send_message(manager.store(), RUN, AgentMessage::new(line))
                .await
                .unwrap();
        } else {
            println!("(end of input: closing the conversation)");
            close_run(manager.store(), RUN).await.unwrap();
        }
    }
    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    println!("messages sent this time: {asked}");
    println!("inspect it: cargo run -- show {RUN} --journal {dir}/journal");
}

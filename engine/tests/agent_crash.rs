//! A durable agent killed with SIGKILL at every step boundary (built with the `failpoints`
//! feature; without it this test says so and passes).
//!
//! The parent (this binary without arguments) serves an OpenAI-compatible model on loopback
//! that answers by turn — turn 1 asks for two `add` calls, turn 2 for one more, turn 3
//! answers — and counts the requests of each turn. A child process (`--child DIR URL HOURS
//! MODE`, MODE `plain` or `interactive`)
//! runs the agent on a RocksDB journal in DIR with `OpenAiChatModel`, tool calls one after
//! the other, and a recoverable `add` tool that writes each *start* to a side-effect ledger.
//!
//! First one run without a kill gives the reference transcript. Then, for every fail point
//! at a step boundary and every time the run reaches it (after a model answer is journaled,
//! after a call's task is created, after a call's started marker is durable, after a call's
//! task ended, after its result is journaled — the last one is just before the final
//! answer; and after the message the child sends the run is journaled, before the run's
//! mailbox cursor moves past it), a fresh run is killed there with SIGKILL and started again
//! (its clock hours later, so the dead process's leases have run out) — each scenario twice:
//! a plain run, and an interactive one closed before it starts, whose close stays unread
//! until its final answer. Every run must finish with the reference transcript — the
//! message in it once — the model server must have seen each turn exactly once, and the
//! ledger must show each call's side effect exactly once.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::missing_panics_doc,
    clippy::too_many_lines
)]

#[path = "support/ledger.rs"]
mod ledger;

use axum::routing::post;
use dtask_engine::agent::{
    close_run, is_already_submitted, read_transcript, send_message, AgentAnswer, AgentMessage,
    AgentRequest, DurableAgent, AGENT_EXECUTOR_KEY,
};
use dtask_engine::failpoints;
use dtask_engine::managed::{ManagedTools, ToolRegistry};
use dtask_engine::tool::{Execution, Message, OpenAiChatModel, OpenAiConfig};
use dtask_engine::{
    Clock, ExecutorRegistry, Manager, ManagerConfig, StoreConfig, SystemClock, TaskOutcome,
    TaskStore, Worker, WorkerConfig,
};
use dtask_journal::{Journal, JournalOptions, Timestamp};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command as Process;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The run's task id.
const RUN: &str = "run";

/// The wall clock, `hours` ahead: each restart lives past the leases of the runs before.
struct Ahead(u64);

impl Clock for Ahead {
    fn now(&self) -> Timestamp {
        Timestamp(SystemClock.now().0 + self.0 * 3_600_000)
    }
}

fn child(dir: &Path, url: &str, hours: u64, interactive: bool) {
    failpoints::configure_from_env().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let journal = Journal::open(dir.join("journal"), JournalOptions::default()).unwrap();
        let store = TaskStore::open(journal, Ahead(hours), StoreConfig::default()).unwrap();
        let model = OpenAiChatModel::new(
            OpenAiConfig::new(url, "counting-model")
                .with_streaming(false)
                .with_retries(0, Duration::ZERO, Duration::ZERO),
        )
        .unwrap();
        let mut tools = ToolRegistry::new();
        tools
            .register(ledger::LedgerTool::registration(&dir.join("ledger")))
            .unwrap();
        let agent = DurableAgent::new(Arc::new(model), ManagedTools::new(tools))
            .with_execution(Execution::Sequential)
            .with_poll_interval(Duration::from_millis(50));
        let mut executors = ExecutorRegistry::new();
        agent.register_executors(&mut executors).unwrap();
        let manager = Manager::new(store, executors, ManagerConfig::default());
        let mut request = AgentRequest::new(vec![
            Message::system("You add numbers with the add tool."),
            Message::user("What are 1+2, 3+4 and 5+6?"),
        ])
        .with_task_id(RUN);
        if interactive {
            request = request.interactive();
        }
        match agent.submit(&manager, request).await {
            Ok(_) => {}
            Err(e) if is_already_submitted(&e) => {}
            Err(e) => panic!("submit: {e}"),
        }
        // Sent again by every restart: its event id makes it one message.
        send_message(
            manager.store(),
            RUN,
            AgentMessage::new("Show each sum.").with_event_id("m1"),
        )
        .await
        .unwrap();
        if interactive {
            // Closed at once: the run answers the message, then completes (the close is
            // found again by every attempt until then).
            close_run(manager.store(), RUN).await.unwrap();
        }
        let worker = Worker::new(
            manager.clone(),
            WorkerConfig::new([AGENT_EXECUTOR_KEY]).with_poll_interval(Duration::from_millis(50)),
        )
        .unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let worker = tokio::spawn(worker.run(async {
            let _ = stopped.await;
        }));
        let outcome = manager.wait(RUN).await.unwrap();
        let _ = stop.send(());
        worker.await.unwrap().unwrap();
        let TaskOutcome::Completed(data) = outcome else {
            panic!("the run did not complete: {outcome:?}");
        };
        let answer = AgentAnswer::decode(&data).unwrap();
        println!("{}", answer.answer.content.unwrap_or_default());
    });
}

/// The model: answers by turn (the number of assistant messages it is sent), counting.
#[derive(Default)]
struct Counting {
    turns: Mutex<BTreeMap<usize, usize>>,
}

fn call(id: &str, a: i64, b: i64) -> Value {
    json!({"id": id, "type": "function",
           "function": {"name": "add", "arguments": format!(r#"{{"a":{a},"b":{b}}}"#)}})
}

fn answer(turn: usize) -> Value {
    let message = match turn {
        0 => json!({"role": "assistant", "content": null,
                    "tool_calls": [call("c1", 1, 2), call("c2", 3, 4)]}),
        1 => json!({"role": "assistant", "content": null, "tool_calls": [call("c3", 5, 6)]}),
        _ => json!({"role": "assistant", "content": "The sums are 3, 7 and 11."}),
    };
    json!({
        "id": format!("cmpl-{turn}"),
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10 * (turn + 1), "completion_tokens": 5, "total_tokens": 10 * (turn + 1) + 5}
    })
}

fn serve(counting: Arc<Counting>) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async move {
            let app = axum::Router::new().route(
                "/v1/chat/completions",
                post(move |body: axum::Json<Value>| {
                    let counting = Arc::clone(&counting);
                    async move {
                        let turn = body["messages"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .filter(|m| m["role"] == "assistant")
                            .count();
                        *counting.turns.lock().unwrap().entry(turn).or_default() += 1;
                        axum::Json(answer(turn))
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(format!("http://{}/v1", listener.local_addr().unwrap()))
                .unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

/// One process of a scenario; `Ok(true)` when it finished, `Ok(false)` when it was killed.
fn run_once(
    dir: &Path,
    url: &str,
    hours: u64,
    interactive: bool,
    fail_point: Option<&str>,
) -> Result<bool, String> {
    let mut process = Process::new(std::env::current_exe().unwrap());
    process.args([
        "--child",
        dir.to_str().unwrap(),
        url,
        &hours.to_string(),
        if interactive { "interactive" } else { "plain" },
    ]);
    process.env_remove(failpoints::ENV);
    if let Some(point) = fail_point {
        process.env(failpoints::ENV, point);
    }
    let mut child = process.spawn().unwrap();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return match (status.success(), status.signal()) {
                (true, _) => Ok(true),
                (false, Some(9)) if fail_point.is_some() => Ok(false),
                _ => Err(format!(
                    "the child ended with {status} (fail point {fail_point:?})"
                )),
            };
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("the child hung (fail point {fail_point:?})"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What a finished run left: its conversation and the ledger's lines, sorted.
fn outcome(dir: &Path) -> (Vec<Message>, Vec<String>) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let messages = runtime.block_on(async {
        let journal = Journal::open(dir.join("journal"), JournalOptions::default()).unwrap();
        let store = TaskStore::open(journal, Ahead(10_000), StoreConfig::default()).unwrap();
        read_transcript(&store, RUN).await.unwrap().messages()
    });
    let mut ledger = ledger::read_ledger(&dir.join("ledger"));
    ledger.sort();
    (messages, ledger)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        child(
            Path::new(&args[2]),
            &args[3],
            args[4].parse().unwrap(),
            args[5] == "interactive",
        );
        return;
    }
    if !failpoints::ENABLED {
        println!("agent_crash: skipped (build with the `failpoints` feature to run it)");
        return;
    }
    let counting = Arc::new(Counting::default());
    let url = serve(Arc::clone(&counting));

    let reference = tempfile::tempdir().unwrap();
    assert_eq!(run_once(reference.path(), &url, 0, false, None), Ok(true));
    let (expected, ledger) = outcome(reference.path());
    assert_eq!(
        ledger,
        ["run.t1.c0", "run.t1.c1", "run.t2.c0"],
        "the uninterrupted run's side effects"
    );
    assert_eq!(expected.len(), 2 + 1 + 3 + 2 + 1, "{expected:?}");
    assert_eq!(expected[2], Message::user("Show each sum."));

    // (fail point, how many times a run reaches it)
    let boundaries = [
        (failpoints::AGENT_AFTER_TURN, 3),
        (failpoints::AGENT_AFTER_TOOL_CREATED, 3),
        (failpoints::AFTER_COMMIT_START, 3),
        (failpoints::AGENT_AFTER_TOOL_ENDED, 3),
        (failpoints::AGENT_AFTER_TOOL_RESULT, 3),
        (failpoints::AGENT_AFTER_MESSAGE, 1),
    ];
    let mut failures = Vec::new();
    let mut scenarios = 0;
    // Each boundary twice: a plain run, and an interactive one closed from the start (the
    // close unread until the run's final answer, found again by every attempt).
    for (interactive, (point, hits)) in [false, true]
        .into_iter()
        .flat_map(|i| boundaries.into_iter().map(move |b| (i, b)))
    {
        for skip in 0..hits {
            scenarios += 1;
            counting.turns.lock().unwrap().clear();
            let dir = tempfile::tempdir().unwrap();
            let spec = format!("{point}=kill@{skip}");
            let name = format!(
                "{point}@{skip}{}",
                if interactive { " (interactive)" } else { "" }
            );
            match run_once(dir.path(), &url, 1, interactive, Some(&spec)) {
                Ok(false) => {}
                Ok(true) => {
                    failures.push(format!("{name}: the fail point never fired"));
                    continue;
                }
                Err(e) => {
                    failures.push(format!("{name}: {e}"));
                    continue;
                }
            }
            if let Err(e) = run_once(dir.path(), &url, 2, interactive, None).and_then(|finished| {
                finished
                    .then_some(())
                    .ok_or_else(|| "the restart did not finish".to_owned())
            }) {
                failures.push(format!("{name}: {e}"));
                continue;
            }
            let (messages, ledger) = outcome(dir.path());
            if messages != expected {
                failures.push(format!("{name}: another transcript: {messages:?}"));
            }
            if ledger != ["run.t1.c0", "run.t1.c1", "run.t2.c0"] {
                failures.push(format!("{name}: side effects {ledger:?}"));
            }
            let turns = counting.turns.lock().unwrap().clone();
            if turns != BTreeMap::from([(0, 1), (1, 1), (2, 1)]) {
                failures.push(format!("{name}: model requests by turn {turns:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!(
        "agent_crash: {scenarios} runs (plain and interactive) killed at a step boundary and \
         restarted; every one finished with the same transcript, each turn asked once, each \
         call run once"
    );
}

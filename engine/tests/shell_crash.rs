//! End to end with real processes: a child engine process runs a recoverable shell task that
//! prints a line every 50 ms; once some lines are durable updates, the child is killed with
//! SIGKILL. This process then opens the same journal and recovers the task: the command was
//! started exactly once (its counter file has one line), the task completes with its whole
//! output, and the stored updates have no duplicate event ids.
//!
//! Runs without the libtest harness: the same binary is the parent (no arguments) and the
//! child (`--child DIR`).
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use dtask_engine::managed::tools::ShellTool;
use dtask_engine::managed::{ManagedTools, Registration, ToolCall, ToolRegistry};
use dtask_engine::tool::ToolInfo;
use dtask_engine::{
    Clock, ExecutorRegistry, Manager, ManagerConfig, ManualClock, StoreConfig, SystemClock,
    TaskOutcome, TaskStore, Worker, WorkerConfig,
};
use dtask_journal::{Journal, JournalOptions};
use dtask_replay::Status;
use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const LINES: usize = 40;

fn tools(dir: &Path) -> ManagedTools {
    let mut registry = ToolRegistry::new();
    registry
        .register(Registration::new(
            ToolInfo::without_parameters("shell", "run a shell command"),
            ShellTool::new(dir.join("runs")),
        ))
        .unwrap();
    ManagedTools::new(registry)
}

fn command(dir: &Path) -> String {
    let counter = dir.join("counter");
    format!(
        "echo started >> '{}'; for i in $(seq 1 {LINES}); do echo line $i; sleep 0.05; done",
        counter.display()
    )
}

/// The engine that dies: submits the shell task, runs a worker, tells the parent once five
/// lines are durable, then waits to be killed.
fn child(dir: &Path) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let journal = Journal::open(dir.join("journal"), JournalOptions::default()).unwrap();
        let store = TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap();
        let tools = tools(dir);
        let mut registry = ExecutorRegistry::new();
        tools.register_executors(&mut registry).unwrap();
        let manager = Manager::new(store.clone(), registry, ManagerConfig::default());
        let arguments = serde_json::json!({ "command": command(dir) }).to_string();
        let task = tools
            .submit(
                &manager,
                ToolCall {
                    tool_name: "shell".into(),
                    arguments,
                    ..ToolCall::default()
                },
            )
            .await
            .unwrap();
        std::fs::write(dir.join("task"), &task.spec.id).unwrap();
        let worker = Worker::new(manager, WorkerConfig::new(tools_keys())).unwrap();
        tokio::spawn(worker.run(std::future::pending()));
        loop {
            let page = store
                .list_updates(&task.spec.id, None, 0, false)
                .await
                .unwrap();
            if page.updates.len() >= 5 {
                std::fs::write(dir.join("ready"), b"").unwrap();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}

fn tools_keys() -> [&'static str; 2] {
    [
        dtask_engine::managed::PLAIN_EXECUTOR_KEY,
        dtask_engine::managed::RECOVERABLE_EXECUTOR_KEY,
    ]
}

fn run() -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--child", dir.path().to_str().unwrap()])
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !dir.path().join("ready").exists() {
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the child never got five lines durable".into());
        }
        if let Some(status) = child.try_wait().unwrap() {
            return Err(format!("the child exited early: {status}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap(); // SIGKILL, mid-run
    child.wait().unwrap();
    let id = std::fs::read_to_string(dir.path().join("task")).unwrap();

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let journal = Journal::open(dir.path().join("journal"), JournalOptions::default())
            .map_err(|e| e.to_string())?;
        // The dead engine's lease has certainly run out on this clock.
        let clock = ManualClock::new(SystemClock.now().as_millis() + 3_600_000);
        let store = TaskStore::open(journal, clock, StoreConfig::default()).unwrap();
        let before = store.get(&id).await.unwrap();
        if before.status != Status::Pending || !before.is_started() {
            return Err(format!("expected a pending, started task: {before:?}"));
        }
        let tools = tools(dir.path());
        let mut registry = ExecutorRegistry::new();
        tools.register_executors(&mut registry).unwrap();
        let manager = Manager::new(store.clone(), registry, ManagerConfig::default());
        manager.execute(&id).await.map_err(|e| e.to_string())?;
        let outcome = manager.wait(&id).await.unwrap();
        let TaskOutcome::Completed(output) = outcome else {
            return Err(format!("the task did not complete: {outcome:?}"));
        };
        let text = String::from_utf8_lossy(&output);
        let expected: Vec<String> = (1..=LINES).map(|i| format!("line {i}")).collect();
        if text.lines().collect::<Vec<_>>() != expected {
            return Err(format!("incomplete output: {text:?}"));
        }
        let counter = std::fs::read_to_string(dir.path().join("counter")).unwrap();
        if counter.lines().count() != 1 {
            return Err(format!(
                "the command started {} times",
                counter.lines().count()
            ));
        }
        let updates = store
            .list_updates(&id, None, 0, false)
            .await
            .unwrap()
            .updates;
        let ids: HashSet<_> = updates.iter().map(|u| u.event_id.clone()).collect();
        if ids.len() != updates.len() || updates.len() != LINES {
            return Err(format!(
                "{} updates, {} distinct event ids, {LINES} lines",
                updates.len(),
                ids.len()
            ));
        }
        let attempts: HashSet<_> = updates.iter().map(|u| u.attempt).collect();
        if attempts != HashSet::from([1, 2]) {
            return Err(format!("updates came from attempts {attempts:?}"));
        }
        let task = store.get(&id).await.unwrap();
        if task.attempt != 2 {
            return Err(format!("completed at attempt {}", task.attempt));
        }
        Ok(())
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        child(Path::new(&args[2]));
        return;
    }
    if args.iter().any(|a| a == "--list") {
        return;
    }
    match run() {
        Ok(()) => println!("test shell_crash::sigkill_mid_run_recovers_exactly_once ... ok"),
        Err(e) => {
            println!("test shell_crash::sigkill_mid_run_recovers_exactly_once ... FAILED: {e}");
            std::process::exit(1);
        }
    }
}

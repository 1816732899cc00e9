//! The model-facing managed tool, three ways: a shell command that finishes in the foreground,
//! one that outlives its foreground time and is handed to a background task (the same
//! process, not a second run), and an approval that interrupts the call until answered.
//!
//! Run: `cargo run --example managed_tool`
#![allow(clippy::unwrap_used, missing_docs)]

use dtask::engine::managed::tools::{ApprovalTool, ShellTool};
use dtask::engine::managed::{
    CallOptions, CallOutcome, ManagedTool, ManagedToolConfig, ManagedTools, Registration,
    ToolRegistry,
};
use dtask::engine::tool::ToolInfo;
use dtask::engine::{
    ExecutorRegistry, Manager, ManagerConfig, StoreConfig, SystemClock, TaskOutcome, TaskStore,
};
use dtask::journal::{Journal, JournalOptions};
use std::time::Duration;

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path().join("journal"), JournalOptions::default()).unwrap();
    let store = TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap();

    // The tools, and the executors that run their background tasks.
    let mut registry = ToolRegistry::new();
    registry
        .register(Registration::new(
            ToolInfo::new("shell", "Run a shell command", ShellTool::parameters()),
            ShellTool::new(dir.path().join("runs")),
        ))
        .unwrap();
    registry
        .register(Registration::new(
            ToolInfo::new("approve", "Ask a person", ApprovalTool::parameters()),
            ApprovalTool,
        ))
        .unwrap();
    let tools = ManagedTools::new(registry);
    let mut executors = ExecutorRegistry::new();
    tools.register_executors(&mut executors).unwrap();
    let manager = Manager::new(store, executors, ManagerConfig::default());

    // Shell calls get one second in the foreground, then move to the background.
    let shell = ManagedTool::new(
        &tools,
        manager.clone(),
        "shell",
        ManagedToolConfig::default()
            .with_foreground_timeout(Duration::from_secs(1))
            .with_auto_background(|_| true),
    )
    .unwrap();
    let opts = CallOptions::default();

    let quick = shell
        .call(r#"{"command":"echo hello"}"#, &opts)
        .await
        .unwrap();
    let CallOutcome::Done(quick) = quick else {
        unreachable!()
    };
    print!("quick call   -> {}", quick.text());

    let slow = shell
        .call(r#"{"command":"sleep 2; echo done"}"#, &opts)
        .await
        .unwrap();
    let CallOutcome::Done(slow) = slow else {
        unreachable!()
    };
    print!("slow call    -> {}", slow.text());
    let id = slow.envelope.task_id().unwrap().to_owned();
    let outcome = manager.wait(&id).await.unwrap();
    let TaskOutcome::Completed(output) = outcome else {
        panic!("{outcome:?}")
    };
    println!(
        "  background task {id} completed: {:?}",
        String::from_utf8_lossy(&output).trim()
    );

    let approve = ManagedTool::new(
        &tools,
        manager.clone(),
        "approve",
        ManagedToolConfig::default(),
    )
    .unwrap();
    let asked = approve
        .call(r#"{"question":"Deploy to production?"}"#, &opts)
        .await
        .unwrap();
    let CallOutcome::Interrupted(interrupt) = asked else {
        unreachable!()
    };
    println!("approval     -> interrupted, asks {}", interrupt.info);
    // The state is plain JSON: keep it with the conversation, answer later.
    let answered = approve
        .resume(&interrupt.state, br#""yes""#, &opts)
        .await
        .unwrap();
    let CallOutcome::Done(answered) = answered else {
        unreachable!()
    };
    print!("  answered   -> {}", answered.text());

    manager
        .close(
            Some(tokio::time::Instant::now() + Duration::from_secs(5)),
            "shutting down",
        )
        .await
        .unwrap();
}

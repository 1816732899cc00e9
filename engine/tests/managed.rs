//! The managed-tool layer's background path on a real journal: the recoverable shell tool, the
//! resumable approval tool, and recovery after a drain (recover, not start).
#![allow(clippy::unwrap_used)]

use dtask_engine::managed::codec::ManagedCheckpoint;
use dtask_engine::managed::tools::{ApprovalTool, ShellTool};
use dtask_engine::managed::{
    read_input_request, ManagedTools, ProgressReader, Registration, ResponseEvent, ToolCall,
    ToolRegistry,
};
use dtask_engine::tool::ToolInfo;
use dtask_engine::{
    ExecutorRegistry, Manager, ManagerConfig, StoreConfig, SystemClock, TaskOutcome, TaskStore,
};
use dtask_journal::{Durability, Journal, JournalOptions};
use dtask_replay::Status;
use std::path::Path;

fn tools(root: &Path) -> ManagedTools {
    let mut registry = ToolRegistry::new();
    registry
        .register(
            Registration::new(
                ToolInfo::without_parameters("shell", "run a shell command"),
                ShellTool::new(root.join("runs")),
            )
            .with_max_recoveries(3),
        )
        .unwrap();
    registry
        .register(Registration::new(
            ToolInfo::without_parameters("approval", "ask a human"),
            ApprovalTool,
        ))
        .unwrap();
    ManagedTools::new(registry)
}

fn manager(store: &TaskStore, tools: &ManagedTools) -> Manager {
    let mut runtime = ExecutorRegistry::new();
    tools.register_executors(&mut runtime).unwrap();
    Manager::new(store.clone(), runtime, ManagerConfig::default())
}

fn store(dir: &Path) -> TaskStore {
    let journal = Journal::open(
        dir.join("journal"),
        JournalOptions::default().with_durability(Durability::Buffered),
    )
    .unwrap();
    TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap()
}

fn call(tool: &str, arguments: &str) -> ToolCall {
    ToolCall {
        tool_name: tool.into(),
        arguments: arguments.into(),
        ..ToolCall::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_task_runs_to_completion_with_its_lines_as_updates() {
    let dir = tempfile::tempdir().unwrap();
    let tools = tools(dir.path());
    let store = store(dir.path());
    let manager = manager(&store, &tools);
    let task = tools
        .submit(
            &manager,
            call("shell", r#"{"command":"printf 'a\\nb\\nc\\n'"}"#),
        )
        .await
        .unwrap();
    assert_eq!(task.max_recoveries, Some(3), "the registration's limit");
    let state = manager.execute(&task.spec.id).await.unwrap();
    assert_eq!(state.status, Status::Completed, "{state:?}");
    assert_eq!(state.result_data, b"a\nb\nc\n");
    let marker = ManagedCheckpoint::decode(&state.checkpoint).unwrap();
    assert!(marker.started, "the started marker was committed");
    let updates = store
        .list_updates(&task.spec.id, None, 0, false)
        .await
        .unwrap();
    let lines: Vec<_> = updates
        .updates
        .iter()
        .map(|u| (u.event_id.as_str(), u.data.as_slice()))
        .collect();
    assert_eq!(
        lines,
        vec![("line:0", &b"a"[..]), ("line:1", b"b"), ("line:2", b"c")]
    );
    let progress = ProgressReader::new(store.clone(), 2)
        .read(&task.spec.id)
        .await
        .unwrap();
    assert_eq!(progress, "Recent progress:\n[stdout] b\n[stdout] c");
    // Trimmed to its last line: the reader shows the others as such, in their places.
    assert_eq!(
        store.trim_progress(&task.spec.id, 1).await.unwrap().records,
        2
    );
    let progress = ProgressReader::new(store.clone(), 3)
        .read(&task.spec.id)
        .await
        .unwrap();
    assert_eq!(
        progress,
        "Recent progress:\n[stdout] (trimmed)\n[stdout] (trimmed)\n[stdout] c"
    );
    let envelope = ResponseEvent::launch_result(&state).unwrap().encode();
    assert!(
        envelope.starts_with("{\"type\":\"launch_result\",\"task_id\":"),
        "{envelope}"
    );
    assert!(envelope.contains("\"status\":\"completed\""), "{envelope}");
    assert!(
        envelope.contains("\"output\":\"a\\nb\\nc\\n\""),
        "{envelope}"
    );
}

/// A shell command printing more lines than the store's limit of updates: its task fails,
/// naming the limit, with the updates it could record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_past_the_update_limit_fails_its_task_with_what_it_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let tools = tools(dir.path());
    let journal = Journal::open(
        dir.path().join("journal"),
        JournalOptions::default().with_durability(Durability::Buffered),
    )
    .unwrap();
    let store = TaskStore::open(
        journal,
        SystemClock,
        StoreConfig::default().with_max_updates(3),
    )
    .unwrap();
    let manager = manager(&store, &tools);
    let task = tools
        .submit(&manager, call("shell", r#"{"command":"seq 1 10"}"#))
        .await
        .unwrap();
    let state = manager.execute(&task.spec.id).await.unwrap();
    assert_eq!(state.status, Status::Failed, "{state:?}");
    assert!(
        state
            .result_error
            .contains("has recorded its limit of 3 progress updates"),
        "{}",
        state.result_error
    );
    assert_eq!(state.updates, 3);
    assert_eq!(store.counts().updates_over_limit, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_and_unknown_tools_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tools = tools(dir.path());
    let store = store(dir.path());
    let manager = manager(&store, &tools);
    assert!(tools
        .submit(&manager, call("shell", r#"{"cmd":1}"#))
        .await
        .is_err());
    assert!(tools.submit(&manager, call("shell", "")).await.is_err());
    assert!(tools.submit(&manager, call("nope", "{}")).await.is_err());
    assert_eq!(store.journal().tasks().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_waits_rejects_bad_answers_and_completes_on_yes() {
    let dir = tempfile::tempdir().unwrap();
    let tools = tools(dir.path());
    let store = store(dir.path());
    let manager = manager(&store, &tools);
    let task = tools
        .submit(&manager, call("approval", r#"{"question":"deploy?"}"#))
        .await
        .unwrap();
    let id = task.spec.id.clone();
    assert_eq!(task.max_recoveries, None, "no limit registered");
    let waiting = manager.execute(&id).await.unwrap();
    assert_eq!(waiting.status, Status::WaitingInput);
    let request = read_input_request(&waiting).unwrap();
    assert_eq!(request.id, "approval");
    assert_eq!(
        request.data,
        Some(serde_json::json!({"question": "deploy?"}))
    );

    manager
        .resume(&id, waiting.version, br#""maybe""#.to_vec())
        .await
        .unwrap();
    let still = manager.execute(&id).await.unwrap();
    assert_eq!(
        still.status,
        Status::WaitingInput,
        "rejected input keeps waiting"
    );
    assert_eq!(still.checkpoint, waiting.checkpoint, "on the same request");
    assert_eq!(still.attempt, 2);

    manager
        .resume(&id, still.version, br#""yes""#.to_vec())
        .await
        .unwrap();
    manager.execute(&id).await.unwrap();
    assert_eq!(
        manager.wait(&id).await.unwrap(),
        TaskOutcome::Completed(br#"{"approved":true}"#.to_vec())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_shell_task_is_recovered_not_started_again() {
    let dir = tempfile::tempdir().unwrap();
    let tools = tools(dir.path());
    let store = store(dir.path());
    let counter = dir.path().join("counter");
    let command = format!(
        "echo started >> {}; echo one; sleep 1; echo two",
        counter.display()
    );
    let arguments = serde_json::json!({ "command": command }).to_string();
    let first = manager(&store, &tools);
    let task = tools
        .submit(&first, call("shell", &arguments))
        .await
        .unwrap();
    let id = task.spec.id.clone();
    let run = tokio::spawn({
        let first = first.clone();
        let id = id.clone();
        async move { first.execute(&id).await }
    });
    // Wait until the started marker is durable, then close with drain: the recoverable tool
    // yields without stopping its command.
    loop {
        let t = store.get(&id).await.unwrap();
        if !t.checkpoint.is_empty() {
            break;
        }
        tokio::task::yield_now().await;
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    first.close(Some(deadline), "restart").await.unwrap();
    let yielded = run.await.unwrap().unwrap();
    assert_eq!(yielded.status, Status::Pending);

    let second = manager(&store, &tools);
    let done = second.execute(&id).await.unwrap();
    assert_eq!(done.status, Status::Completed, "{done:?}");
    assert_eq!(done.attempt, 2);
    assert_eq!(done.result_data, b"one\ntwo\n");
    let starts = std::fs::read_to_string(&counter).unwrap();
    assert_eq!(starts.lines().count(), 1, "the command ran exactly once");
    let updates = store
        .list_updates(&id, None, 0, false)
        .await
        .unwrap()
        .updates;
    let ids: Vec<_> = updates.iter().map(|u| u.event_id.as_str()).collect();
    assert_eq!(
        ids,
        vec!["line:0", "line:1"],
        "replayed lines were deduplicated"
    );
}

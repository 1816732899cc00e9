//! A parent task that fans out to nested tasks and hears back through its mailbox: a
//! `review` attempt creates one `scan` child per file, then reads its mailbox — each
//! child's findings arrive as application notifications (`AttemptContext::notify`; a
//! blocker is sent to preempt, `AttemptContext::notify_with`, and arrives as a preemptive
//! input), each child's end as a lifecycle notice — and completes once every child has
//! ended. Each notification is one atomic append to the child's stream and the parent's; the
//! input's id names the child that sent it.
//!
//! Run: `cargo run --example nested_tasks`
#![allow(clippy::unwrap_used, missing_docs)]

use dtask::engine::{
    application_notification_source, async_trait, AttemptContext, ExecutionError, ExecutionResult,
    Executor, ExecutorRegistry, Manager, ManagerConfig, NotificationRequest, StoreConfig,
    SubmitRequest, SystemClock, TaskOutcome, TaskStore, Worker, WorkerConfig,
};
use dtask::journal::{Delivery, Journal, JournalOptions, LeasePolicy, TaskSpec};
use dtask::replay::TaskState;

/// The files the review looks at, one child each.
const FILES: [&str; 3] = ["src/lib.rs", "src/main.rs", "src/store.rs"];

fn failed(e: impl std::fmt::Display) -> ExecutionError {
    ExecutionError::failed(e.to_string())
}

/// A child: "scans" the file its payload names and reports what it found to its parent.
struct Scan;

#[async_trait]
impl Executor for Scan {
    fn key(&self) -> &'static str {
        "scan"
    }

    fn lease_policy(&self) -> LeasePolicy {
        LeasePolicy::Retry
    }

    async fn execute(
        &self,
        attempt: AttemptContext,
        task: TaskState,
    ) -> Result<ExecutionResult, ExecutionError> {
        let file = String::from_utf8_lossy(&task.spec.payload).into_owned();
        let todos = file.len() % 3;
        for n in 0..todos {
            // The event id makes a retried attempt's notification a no-op, not a duplicate.
            attempt
                .notify(
                    format!("todo-{n}"),
                    "finding",
                    format!("{file}: TODO #{n}").into_bytes(),
                )
                .await
                .map_err(failed)?;
        }
        if file.ends_with("store.rs") {
            // A blocker: the parent should read it before anything else it is doing.
            let blocker = format!("{file}: unsafe block without a SAFETY comment");
            attempt
                .notify_with(
                    NotificationRequest::new("blocker", "finding", blocker.into_bytes()).preempt(),
                )
                .await
                .map_err(failed)?;
        }
        Ok(ExecutionResult::Completed(
            format!("{todos} finding(s)").into_bytes(),
        ))
    }
}

/// The parent: one child per file, then its mailbox until every child has ended.
struct Review;

#[async_trait]
impl Executor for Review {
    fn key(&self) -> &'static str {
        "review"
    }

    fn lease_policy(&self) -> LeasePolicy {
        LeasePolicy::Retry
    }

    async fn execute(
        &self,
        attempt: AttemptContext,
        task: TaskState,
    ) -> Result<ExecutionResult, ExecutionError> {
        let manager = attempt.manager().ok_or_else(|| failed("no manager"))?;
        for file in FILES {
            let id = manager.allocate_task_id("scan").map_err(failed)?;
            manager
                .submit(SubmitRequest {
                    spec: TaskSpec {
                        id,
                        executor_key: "scan".into(),
                        payload: file.as_bytes().to_vec(),
                        // The child's end reaches the parent's mailbox too.
                        notify_session: true,
                        ..TaskSpec::default()
                    },
                    parent: Some(attempt.execution_context()),
                    ..SubmitRequest::default()
                })
                .await
                .map_err(failed)?;
        }
        let (mut after, mut ended, mut findings) = (task.mailbox.consumed, 0, Vec::new());
        while ended < FILES.len() {
            let page = attempt.wait_inputs(after).await.map_err(failed)?;
            for input in page.inputs {
                after = input.sequence;
                match input.kind.as_str() {
                    "finding" => {
                        let (child, _) = application_notification_source(&input.event_id)
                            .ok_or_else(|| failed("a finding from nowhere"))?;
                        let text = String::from_utf8_lossy(&input.data).into_owned();
                        let urgent = if input.delivery == Delivery::Preempt {
                            "URGENT: "
                        } else {
                            ""
                        };
                        findings.push(format!("{urgent}{text} (from {child})"));
                    }
                    "completed" | "failed" | "canceled" => ended += 1,
                    _ => {}
                }
            }
        }
        findings.sort();
        Ok(ExecutionResult::Completed(findings.join("\n").into_bytes()))
    }
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let store = TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap();
    let mut registry = ExecutorRegistry::new();
    registry.register(Review).unwrap();
    registry.register(Scan).unwrap();
    let manager = Manager::new(store, registry, ManagerConfig::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = Worker::new(
        manager.clone(),
        WorkerConfig::new(["review", "scan"]).with_max_concurrent(4),
    )
    .unwrap();
    let worker = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));

    let id = manager.allocate_task_id("review").unwrap();
    manager
        .submit(SubmitRequest {
            spec: TaskSpec {
                id: id.clone(),
                executor_key: "review".into(),
                ..TaskSpec::default()
            },
            ..SubmitRequest::default()
        })
        .await
        .unwrap();
    match manager.wait(&id).await.unwrap() {
        TaskOutcome::Completed(data) => {
            println!("review completed with findings:");
            for line in String::from_utf8_lossy(&data).lines() {
                println!("  {}", line.split(" (from").next().unwrap_or(line));
            }
        }
        other => println!("review ended otherwise: {other:?}"),
    }
    let children = manager.store().list_children(&id, None, 100).await.unwrap();
    let ended = children
        .tasks
        .iter()
        .filter(|t| t.status.is_terminal())
        .count();
    println!("{} children, {ended} ended", children.tasks.len());
    let _ = stop.send(());
    worker.await.unwrap().unwrap();
}

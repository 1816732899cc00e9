//! A manager with one executor, a worker, and five tasks: one completes, one asks for input
//! and completes once answered, one is canceled while it runs, one polls a job that is not
//! done yet (it yields for a while — a durable timer — and finishes on its next attempt), and
//! one fails for a passing reason and is rerun (a new task, linked to the one that failed).
//!
//! Run: `cargo run --example runtime_quickstart`
#![allow(clippy::unwrap_used, missing_docs)]

use dtask::engine::{
    async_trait, AttemptContext, Control, ExecutionError, ExecutionResult, Executor,
    ExecutorRegistry, Manager, ManagerConfig, Progress, StoreConfig, SubmitRequest, SystemClock,
    TaskOutcome, TaskStore, Worker, WorkerConfig,
};
use dtask::journal::{Journal, JournalOptions, LeasePolicy, TaskSpec};
use dtask::replay::TaskState;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the flaky task's outage is over (it fails the first time only).
static OUTAGE_OVER: AtomicBool = AtomicBool::new(false);

/// A tool that echoes its payload, asks for approval when the payload says so, and stops when
/// told to.
struct Echo;

#[async_trait]
impl Executor for Echo {
    fn key(&self) -> &'static str {
        "echo"
    }

    fn lease_policy(&self) -> LeasePolicy {
        LeasePolicy::Retry
    }

    async fn execute(
        &self,
        attempt: AttemptContext,
        task: TaskState,
    ) -> Result<ExecutionResult, ExecutionError> {
        let payload = String::from_utf8_lossy(&task.spec.payload).into_owned();
        attempt
            .emit_progress(Progress {
                event_id: format!("{}:started", attempt.attempt()),
                kind: "progress".into(),
                data: b"working".to_vec(),
                metadata: vec![],
            })
            .await
            .map_err(|e| ExecutionError::failed(e.to_string()))?;
        match (payload.as_str(), task.pending_resume) {
            ("needs approval", None) => Ok(ExecutionResult::WaitingInput(b"approve?".to_vec())),
            ("needs approval", Some(answer)) => Ok(ExecutionResult::Completed(answer)),
            // A remote job that is not done at the first look: come back in 200 ms, without
            // holding a worker meanwhile.
            ("poll", _) if attempt.attempt() == 1 => Ok(ExecutionResult::YieldFor(
                b"job queued".to_vec(),
                std::time::Duration::from_millis(200),
            )),
            ("poll", _) => Ok(ExecutionResult::Completed(
                format!("job done, seen on attempt {}", attempt.attempt()).into_bytes(),
            )),
            ("flaky", _) if !OUTAGE_OVER.swap(true, Ordering::SeqCst) => {
                Ok(ExecutionResult::Failed("the service was down".into()))
            }
            ("runs forever", _) => match attempt.next_control().await {
                Control::Stop(reason) => Ok(ExecutionResult::Canceled(reason)),
                other => Ok(ExecutionResult::Failed(other.reason().to_owned())),
            },
            _ => Ok(ExecutionResult::Completed(payload.into_bytes())),
        }
    }
}

/// An outcome for people: result data as text when it is UTF-8.
fn describe(outcome: &TaskOutcome) -> String {
    match outcome {
        TaskOutcome::Completed(data) => match std::str::from_utf8(data) {
            Ok(text) => format!("completed: {text:?}"),
            Err(_) => format!("completed: {} bytes", data.len()),
        },
        TaskOutcome::Failed(error) => format!("failed: {error}"),
        TaskOutcome::Canceled(reason) => format!("canceled: {reason}"),
        TaskOutcome::Interrupted(state) => format!("waiting for input (version {})", state.version),
    }
}

async fn submit(manager: &Manager, payload: &str) -> String {
    let id = manager.allocate_task_id("echo").unwrap();
    manager
        .submit(SubmitRequest {
            spec: TaskSpec {
                id: id.clone(),
                executor_key: "echo".into(),
                payload: payload.as_bytes().to_vec(),
                description: payload.into(),
                ..TaskSpec::default()
            },
            ..SubmitRequest::default()
        })
        .await
        .unwrap();
    id
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let store = TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap();
    let mut registry = ExecutorRegistry::new();
    registry.register(Echo).unwrap();
    let manager = Manager::new(store, registry, ManagerConfig::default());

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = Worker::new(
        manager.clone(),
        WorkerConfig::new(["echo"]).with_max_concurrent(4),
    )
    .unwrap();
    let worker = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));

    let hello = submit(&manager, "hello").await;
    println!(
        "{hello}: {}",
        describe(&manager.wait(&hello).await.unwrap())
    );

    let approval = submit(&manager, "needs approval").await;
    if let TaskOutcome::Interrupted(state) = manager.wait(&approval).await.unwrap() {
        println!(
            "{approval}: waiting for input ({:?})",
            String::from_utf8_lossy(&state.checkpoint)
        );
        manager
            .resume(&approval, state.version, b"approved".to_vec())
            .await
            .unwrap();
    }
    println!(
        "{approval}: {}",
        describe(&manager.wait(&approval).await.unwrap())
    );

    let forever = submit(&manager, "runs forever").await;
    while manager.get(&forever).await.unwrap().attempt == 0 {
        tokio::task::yield_now().await;
    }
    manager
        .request_cancel(&forever, "user gave up")
        .await
        .unwrap();
    println!(
        "{forever}: {}",
        describe(&manager.wait(&forever).await.unwrap())
    );

    let poll = submit(&manager, "poll").await;
    println!("{poll}: {}", describe(&manager.wait(&poll).await.unwrap()));

    // A failure that a later run would not meet: rerun the task. The rerun is a new task from
    // the same spec; each names the other.
    let flaky = submit(&manager, "flaky").await;
    println!(
        "{flaky}: {}",
        describe(&manager.wait(&flaky).await.unwrap())
    );
    let rerun = manager.rerun(&flaky, None).await.unwrap();
    println!(
        "{}: rerun of {}: {}",
        rerun.id(),
        rerun.rerun_of().unwrap_or("-"),
        describe(&manager.wait(rerun.id()).await.unwrap())
    );
    println!(
        "{flaky}: rerun as {}",
        manager.get(&flaky).await.unwrap().rerun_as().join(", ")
    );

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
}

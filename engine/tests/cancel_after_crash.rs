//! A recoverable task whose cancellation was requested while its engine died: the lease
//! expires (retry policy: the task goes back to pending with the intent kept), and the next
//! attempt — claimed with the intent already durable — must acknowledge the cancellation even
//! though its started-marker write is refused. (Found by `dtask torture`: the refused write
//! used to poison the attempt, nothing was committed, the lease expired again, forever.)
#![allow(clippy::unwrap_used)]

use dtask_engine::{
    async_trait, AttemptContext, Command, ExecutionError, ExecutionResult, Executor,
    ExecutorRegistry, Manager, ManagerConfig, ManualClock, StoreConfig, SubmitRequest, TaskStore,
};
use dtask_journal::{Journal, JournalOptions, LeasePolicy, TaskSpec};
use dtask_replay::{Status, TaskState};
use std::time::Duration;

const KEY: &str = "marker-first";

/// Writes its started marker first, like the managed executors, then completes.
struct MarkerFirst;

#[async_trait]
impl Executor for MarkerFirst {
    fn key(&self) -> &str {
        KEY
    }
    fn lease_policy(&self) -> LeasePolicy {
        LeasePolicy::Retry
    }
    async fn execute(
        &self,
        attempt: AttemptContext,
        _task: TaskState,
    ) -> Result<ExecutionResult, ExecutionError> {
        attempt
            .commit_start(b"started".to_vec())
            .await
            .map_err(|e| ExecutionError::failed(format!("commit start: {e}")))?;
        Ok(ExecutionResult::Completed(b"done".to_vec()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_claimed_with_cancel_intent_acknowledges_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let store = TaskStore::open(journal, clock.clone(), StoreConfig::default()).unwrap();
    let mut registry = ExecutorRegistry::new();
    registry.register(MarkerFirst).unwrap();
    let manager = Manager::new(store.clone(), registry, ManagerConfig::default());
    let task = manager
        .submit(SubmitRequest {
            spec: TaskSpec {
                id: "victim".into(),
                executor_key: KEY.into(),
                ..TaskSpec::default()
            },
            ..SubmitRequest::default()
        })
        .await
        .unwrap();
    // Attempt 1 is claimed by an engine that then dies; the cancellation arrives meanwhile.
    let running = store
        .execute("victim", task.version, Command::Start)
        .await
        .unwrap();
    store
        .execute(
            "victim",
            running.version,
            Command::RequestCancel {
                reason: "the user changed their mind".into(),
            },
        )
        .await
        .unwrap();
    clock.advance(Duration::from_secs(3600));
    let pending = store.get("victim").await.unwrap();
    assert_eq!(pending.status, Status::Pending, "{pending:?}");
    assert!(pending.cancel_requested_at.is_some(), "the intent is kept");

    let state = manager.execute("victim").await.unwrap();
    assert_eq!(state.status, Status::Canceled, "{state:?}");
    assert_eq!(state.attempt, 2);
    assert_eq!(state.result_error, "the user changed their mind");
}

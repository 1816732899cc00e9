//! The runtime against its guarantees (docs/runtime.md; the tests keep the reference's
//! guarantee numbers 105–120, as docs/semantics.md explains), on a real journal.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use async_trait::async_trait;
use dtask_engine::{
    AttemptContext, Control, ExecutionError, ExecutionResult, Executor, ExecutorRegistry, Manager,
    ManagerConfig, ManualClock, Progress, RuntimeError, StoreConfig, StoreError, SubmitRequest,
    TaskOutcome, TaskStore, Worker, WorkerConfig,
};
use dtask_journal::{Durability, Journal, JournalOptions, LeasePolicy, TaskSpec};
use dtask_replay::{Status, TaskState};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

type Body = Arc<
    dyn Fn(
            AttemptContext,
            TaskState,
        ) -> Pin<Box<dyn Future<Output = Result<ExecutionResult, ExecutionError>> + Send>>
        + Send
        + Sync,
>;

struct FnExecutor {
    key: String,
    policy: LeasePolicy,
    drain: bool,
    body: Body,
}

#[async_trait]
impl Executor for FnExecutor {
    fn key(&self) -> &str {
        &self.key
    }
    fn lease_policy(&self) -> LeasePolicy {
        self.policy
    }
    fn supports_drain(&self) -> bool {
        self.drain
    }
    async fn execute(
        &self,
        attempt: AttemptContext,
        task: TaskState,
    ) -> Result<ExecutionResult, ExecutionError> {
        (self.body)(attempt, task).await
    }
}

fn executor<F, Fut>(key: &str, policy: LeasePolicy, drain: bool, f: F) -> FnExecutor
where
    F: Fn(AttemptContext, TaskState) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<ExecutionResult, ExecutionError>> + Send + 'static,
{
    FnExecutor {
        key: key.into(),
        policy,
        drain,
        body: Arc::new(move |a, t| Box::pin(f(a, t))),
    }
}

struct Env {
    _dir: tempfile::TempDir,
    clock: ManualClock,
    manager: Manager,
}

fn env(executors: Vec<FnExecutor>) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(
        dir.path(),
        JournalOptions::default().with_durability(Durability::Buffered),
    )
    .unwrap();
    let clock = ManualClock::new(1_000_000);
    let store = TaskStore::open(journal, clock.clone(), StoreConfig::default()).unwrap();
    let mut registry = ExecutorRegistry::new();
    for e in executors {
        registry.register(e).unwrap();
    }
    let manager = Manager::new(
        store,
        registry,
        ManagerConfig::default().with_heartbeat_interval(Duration::from_secs(3600)),
    );
    Env {
        _dir: dir,
        clock,
        manager,
    }
}

async fn submit(manager: &Manager, key: &str) -> String {
    let id = manager.allocate_task_id("test").unwrap();
    manager
        .submit(SubmitRequest {
            spec: TaskSpec {
                id: id.clone(),
                executor_key: key.into(),
                ..TaskSpec::default()
            },
            ..SubmitRequest::default()
        })
        .await
        .unwrap();
    id
}

fn completes(key: &str) -> FnExecutor {
    executor(key, LeasePolicy::Retry, false, |_, _| async {
        Ok(ExecutionResult::Completed(b"done".to_vec()))
    })
}

/// An executor that waits for a control and answers it as the reference tools do.
fn waits_for_control(key: &str, policy: LeasePolicy, drain: bool) -> FnExecutor {
    executor(key, policy, drain, |attempt, _| async move {
        match attempt.next_control().await {
            Control::Stop(reason) => Ok(ExecutionResult::Canceled(reason)),
            Control::Timeout(reason) => Ok(ExecutionResult::Failed(reason)),
            Control::Drain(_) => Ok(ExecutionResult::Yield(b"drained".to_vec())),
        }
    })
}

/// An executor that completes with `data` once the test lets it go (one permit of the
/// returned gate), ignoring its controls meanwhile.
fn completes_when_let_go(
    policy: LeasePolicy,
    data: &'static [u8],
) -> (Arc<tokio::sync::Semaphore>, FnExecutor) {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let held = Arc::clone(&gate);
    let executor = executor("k", policy, false, move |_, _| {
        let gate = Arc::clone(&held);
        async move {
            gate.acquire().await.unwrap().forget();
            Ok(ExecutionResult::Completed(data.to_vec()))
        }
    });
    (gate, executor)
}

/// Runs one attempt of `id` in the background.
fn spawn_execute(
    manager: &Manager,
    id: &str,
) -> tokio::task::JoinHandle<Result<TaskState, RuntimeError>> {
    let (manager, id) = (manager.clone(), id.to_owned());
    tokio::spawn(async move { manager.execute(&id).await })
}

async fn until_running(manager: &Manager, id: &str) {
    while !manager.active_tasks().contains(&id.to_string())
        || manager.get(id).await.unwrap().status != Status::Running
    {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn g105_submit_with_unregistered_executor_or_empty_id_creates_nothing() {
    let env = env(vec![completes("known")]);
    let err = env
        .manager
        .submit(SubmitRequest {
            spec: TaskSpec {
                id: "t1".into(),
                executor_key: "unknown".into(),
                ..TaskSpec::default()
            },
            ..SubmitRequest::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, RuntimeError::ExecutorUnavailable(ref k) if k == "unknown"));
    let err = env
        .manager
        .submit(SubmitRequest {
            spec: TaskSpec {
                executor_key: "known".into(),
                ..TaskSpec::default()
            },
            ..SubmitRequest::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        RuntimeError::Store(StoreError::Invalid { .. })
    ));
    assert!(matches!(
        env.manager.get("t1").await,
        Err(RuntimeError::Store(StoreError::NotFound(_)))
    ));
    assert_eq!(env.manager.store().journal().tasks().count(), 0);
}

#[tokio::test]
async fn g106_submit_after_close_fails_but_get_and_cancel_work() {
    let env = env(vec![completes("k")]);
    let id = submit(&env.manager, "k").await;
    env.manager.close(None, "bye").await.unwrap();
    let err = env
        .manager
        .submit(SubmitRequest {
            spec: TaskSpec {
                id: "late".into(),
                executor_key: "k".into(),
                ..TaskSpec::default()
            },
            ..SubmitRequest::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Closed));
    assert!(err.to_string().contains("do not retry"));
    assert!(matches!(
        env.manager.allocate_task_id(""),
        Err(RuntimeError::Closed)
    ));
    assert_eq!(env.manager.get(&id).await.unwrap().status, Status::Pending);
    let canceled = env.manager.request_cancel(&id, "closing").await.unwrap();
    assert_eq!(canceled.status, Status::Canceled);
    assert_eq!(canceled.result_error, "closing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g108_close_with_active_attempts_needs_a_deadline_and_stays_open() {
    let env = env(vec![waits_for_control("k", LeasePolicy::Retry, true)]);
    let id = submit(&env.manager, "k").await;
    let run = spawn_execute(&env.manager, &id);
    until_running(&env.manager, &id).await;
    assert!(matches!(
        env.manager.close(None, "bye").await,
        Err(RuntimeError::CloseDeadlineRequired)
    ));
    assert!(!env.manager.is_closed());
    assert!(
        env.manager
            .send_control(&id, Control::Stop("done".into()))
            .await
    );
    let state = run.await.unwrap().unwrap();
    assert_eq!(state.status, Status::Canceled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g109_close_drains_drainable_and_cancels_the_others_at_the_deadline() {
    let env = env(vec![
        waits_for_control("drainable", LeasePolicy::Retry, true),
        waits_for_control("stubborn", LeasePolicy::Fail, false),
    ]);
    let a = submit(&env.manager, "drainable").await;
    let b = submit(&env.manager, "stubborn").await;
    let runs: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .map(|id| {
            let m = env.manager.clone();
            tokio::spawn(async move { m.execute(&id).await })
        })
        .collect();
    until_running(&env.manager, &a).await;
    until_running(&env.manager, &b).await;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
    env.manager
        .close(Some(deadline), "shutting down")
        .await
        .unwrap();
    for r in runs {
        r.await.unwrap().unwrap();
    }
    let drained = env.manager.get(&a).await.unwrap();
    assert_eq!(
        drained.status,
        Status::Pending,
        "the drainable task yielded"
    );
    assert_eq!(drained.checkpoint, b"drained");
    let canceled = env.manager.get(&b).await.unwrap();
    assert_eq!(canceled.status, Status::Canceled);
    assert_eq!(canceled.result_error, "shutting down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g110_execute_of_a_task_already_executing_fails_without_touching_the_store() {
    let env = env(vec![waits_for_control("k", LeasePolicy::Retry, false)]);
    let id = submit(&env.manager, "k").await;
    let run = spawn_execute(&env.manager, &id);
    until_running(&env.manager, &id).await;
    let before = env.manager.get(&id).await.unwrap();
    let err = env.manager.execute(&id).await.unwrap_err();
    assert!(matches!(err, RuntimeError::AlreadyExecuting(_)));
    assert_eq!(env.manager.get(&id).await.unwrap(), before);
    assert!(
        env.manager
            .send_control(&id, Control::Stop("x".into()))
            .await
    );
    run.await.unwrap().unwrap();
}

#[tokio::test]
async fn g111_an_executor_panic_fails_the_task_with_the_panic_message() {
    let env = env(vec![executor(
        "k",
        LeasePolicy::Retry,
        false,
        |_, _| async { panic!("disk on fire") },
    )]);
    let id = submit(&env.manager, "k").await;
    let state = env.manager.execute(&id).await.unwrap();
    assert_eq!(state.status, Status::Failed);
    assert!(
        state.result_error.contains("disk on fire"),
        "{}",
        state.result_error
    );
}

#[tokio::test]
async fn g113_an_executor_error_is_a_failure_truncated_to_4096_bytes() {
    let env = env(vec![executor(
        "k",
        LeasePolicy::Retry,
        false,
        |_, _| async { Err(ExecutionError::failed("é".repeat(3000))) },
    )]);
    let id = submit(&env.manager, "k").await;
    let state = env.manager.execute(&id).await.unwrap();
    assert_eq!(state.status, Status::Failed);
    assert!(state.result_error.len() <= 4096);
    assert!(state.result_error.len() >= 4094);
    assert!(state.result_error.chars().all(|c| c == 'é'));
}

/// A result the store cannot take ends the task, where the store's refusal would leave it
/// running until its lease ran out, to be run and refused again for ever: data over the
/// limit of a value fails it, saying so; a failure's error is cut to the limit.
#[tokio::test]
async fn a_result_over_the_stores_limits_ends_the_task_instead_of_being_refused() {
    let env = env(vec![
        executor("big", LeasePolicy::Retry, false, |_, _| async {
            Ok(ExecutionResult::Completed(vec![b'x'; (1 << 20) + 1]))
        }),
        executor("long", LeasePolicy::Retry, false, |_, _| async {
            Ok(ExecutionResult::Failed("é".repeat(3000)))
        }),
    ]);
    let id = submit(&env.manager, "big").await;
    let state = env.manager.execute(&id).await.unwrap();
    assert_eq!(state.status, Status::Failed, "{state:?}");
    assert!(
        state
            .result_error
            .contains("the result has 1048577 bytes, over the store's limit"),
        "{}",
        state.result_error
    );
    let id = submit(&env.manager, "long").await;
    let state = env.manager.execute(&id).await.unwrap();
    assert_eq!(state.status, Status::Failed);
    assert!(state.result_error.len() <= 4096 && state.result_error.len() >= 4094);
}

#[tokio::test]
async fn g114_an_invalid_result_commits_nothing_and_the_lease_is_left_to_expire() {
    let env = env(vec![executor(
        "k",
        LeasePolicy::Retry,
        false,
        |_, _| async { Ok(ExecutionResult::WaitingInput(Vec::new())) },
    )]);
    let id = submit(&env.manager, "k").await;
    let err = env.manager.execute(&id).await.unwrap_err();
    assert!(matches!(
        err,
        RuntimeError::Store(StoreError::InvalidExecutionResult(_))
    ));
    let state = env.manager.get(&id).await.unwrap();
    assert_eq!(state.status, Status::Running, "nothing committed");
    assert_eq!(state.version, 2);
    env.clock.advance(Duration::from_secs(31));
    let state = env.manager.get(&id).await.unwrap();
    assert_eq!(state.status, Status::Pending, "retry policy after expiry");
    assert_eq!(state.attempt, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g115_once_cancellation_is_accepted_any_result_is_committed_as_canceled() {
    let env = env(vec![executor(
        "k",
        LeasePolicy::Retry,
        false,
        |attempt, _| async move {
            let _ = attempt.next_control().await;
            Ok(ExecutionResult::Completed(b"ignored the stop".to_vec()))
        },
    )]);
    let id = submit(&env.manager, "k").await;
    let run = spawn_execute(&env.manager, &id);
    until_running(&env.manager, &id).await;
    let pending = env.manager.request_cancel(&id, "user stop").await.unwrap();
    assert_eq!(
        pending.status,
        Status::Running,
        "retry work returns once intent is durable"
    );
    let state = run.await.unwrap().unwrap();
    assert_eq!(state.status, Status::Canceled);
    assert_eq!(state.result_error, "user stop");
    assert!(state.result_data.is_empty());
}

#[tokio::test]
async fn g116_drain_checkpoint_unavailable_commits_nothing_then_pending_after_expiry() {
    let env = env(vec![executor(
        "k",
        LeasePolicy::Retry,
        true,
        |_, _| async { Err(ExecutionError::DrainCheckpointUnavailable) },
    )]);
    let id = submit(&env.manager, "k").await;
    assert!(matches!(
        env.manager.execute(&id).await,
        Err(RuntimeError::DrainCheckpointUnavailable)
    ));
    assert_eq!(env.manager.get(&id).await.unwrap().status, Status::Running);
    env.clock.advance(Duration::from_secs(31));
    assert_eq!(env.manager.get(&id).await.unwrap().status, Status::Pending);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g117_wait_returns_interrupted_for_waiting_input_and_outcomes_for_terminal_states() {
    let env = env(vec![executor(
        "k",
        LeasePolicy::Retry,
        false,
        |_, task| async move {
            match task.pending_resume {
                None => Ok(ExecutionResult::WaitingInput(b"approve?".to_vec())),
                Some(answer) => Ok(ExecutionResult::Completed(answer)),
            }
        },
    )]);
    let id = submit(&env.manager, "k").await;
    let waiter = tokio::spawn({
        let m = env.manager.clone();
        let id = id.clone();
        async move { m.wait(&id).await }
    });
    env.manager.execute(&id).await.unwrap();
    let TaskOutcome::Interrupted(state) = waiter.await.unwrap().unwrap() else {
        panic!("expected an interruption");
    };
    assert_eq!(state.checkpoint, b"approve?");
    env.manager
        .resume(&id, state.version, b"yes".to_vec())
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let m = env.manager.clone();
        let id = id.clone();
        async move { m.wait(&id).await }
    });
    env.manager.execute(&id).await.unwrap();
    assert_eq!(
        waiter.await.unwrap().unwrap(),
        TaskOutcome::Completed(b"yes".to_vec())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g118_a_higher_priority_control_replaces_a_lower_one() {
    let seen = Arc::new(std::sync::Mutex::new(None));
    let record = Arc::clone(&seen);
    let (go_tx, go_rx) = tokio::sync::watch::channel(false);
    let env = env(vec![executor(
        "k",
        LeasePolicy::Retry,
        false,
        move |attempt, _| {
            let record = Arc::clone(&record);
            let mut go = go_rx.clone();
            async move {
                // Wait until the test queued its controls, then read what won.
                let _ = go.wait_for(|g| *g).await;
                *record.lock().unwrap() = attempt.controls().try_recv();
                Ok(ExecutionResult::Completed(vec![]))
            }
        },
    )]);
    let id = submit(&env.manager, "k").await;
    let run = spawn_execute(&env.manager, &id);
    until_running(&env.manager, &id).await;
    assert!(
        env.manager
            .send_control(&id, Control::Drain("d".into()))
            .await
    );
    assert!(
        env.manager
            .send_control(&id, Control::Timeout("t".into()))
            .await
    );
    assert!(
        !env.manager
            .send_control(&id, Control::Drain("d2".into()))
            .await
    );
    go_tx.send(true).unwrap();
    run.await.unwrap().unwrap();
    assert_eq!(*seen.lock().unwrap(), Some(Control::Timeout("t".into())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g119_two_workers_never_execute_the_same_attempt() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let env = env(vec![executor(
        "k",
        LeasePolicy::Retry,
        false,
        move |attempt, _| {
            let counter = Arc::clone(&counter);
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                attempt
                    .emit_progress(Progress {
                        event_id: "ran".into(),
                        kind: "progress".into(),
                        data: b"1".to_vec(),
                        metadata: vec![],
                    })
                    .await
                    .unwrap();
                Ok(ExecutionResult::Completed(vec![]))
            }
        },
    )]);
    let mut ids = Vec::new();
    for _ in 0..40 {
        ids.push(submit(&env.manager, "k").await);
    }
    // Two managers (two workers) over one store: each runs its own attempts.
    let other = Manager::new(
        env.manager.store().clone(),
        env.manager.registry().clone(),
        ManagerConfig::default(),
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let workers: Vec<_> = [env.manager.clone(), other]
        .into_iter()
        .map(|m| {
            let mut stop = stop_rx.clone();
            tokio::spawn(async move {
                Worker::new(m, WorkerConfig::new(["k"]).with_max_concurrent(4))
                    .unwrap()
                    .run(async move {
                        let _ = stop.wait_for(|s| *s).await;
                    })
                    .await
            })
        })
        .collect();
    for id in &ids {
        let outcome = env.manager.wait(id).await.unwrap();
        assert_eq!(outcome, TaskOutcome::Completed(vec![]));
    }
    stop_tx.send(true).unwrap();
    for w in workers {
        w.await.unwrap().unwrap();
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        ids.len(),
        "each task ran exactly once"
    );
    for id in &ids {
        assert_eq!(env.manager.get(id).await.unwrap().attempt, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_is_woken_by_a_new_pending_task_without_waiting_a_poll_interval() {
    let env = env(vec![completes("k")]);
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let worker = Worker::new(
        env.manager.clone(),
        WorkerConfig::new(["k"]).with_poll_interval(Duration::from_secs(3600)),
    )
    .unwrap();
    let handle = tokio::spawn(worker.run(async move {
        let _ = stop_rx.wait_for(|s| *s).await;
    }));
    tokio::task::yield_now().await;
    let id = submit(&env.manager, "k").await;
    let outcome = tokio::time::timeout(Duration::from_secs(60), env.manager.wait(&id))
        .await
        .expect("woken without the hour-long poll")
        .unwrap();
    assert_eq!(outcome, TaskOutcome::Completed(b"done".to_vec()));
    stop_tx.send(true).unwrap();
    handle.await.unwrap().unwrap();
}

/// An executor that yields for `delay` on its first attempt (a tool polling a remote job
/// that is not done yet) and completes on the next.
fn polls_once(key: &str, delay: Duration) -> FnExecutor {
    executor(
        key,
        LeasePolicy::Retry,
        false,
        move |attempt, _| async move {
            if attempt.attempt() == 1 {
                Ok(ExecutionResult::YieldFor(b"job-42 queued".to_vec(), delay))
            } else {
                Ok(ExecutionResult::Completed(b"job-42 done".to_vec()))
            }
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_yield_for_a_while_is_a_durable_timer_that_wakes_the_worker_when_due() {
    // The system clock: the worker sleeps until the task is due by the store's clock.
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let store =
        TaskStore::open(journal, dtask_engine::SystemClock, StoreConfig::default()).unwrap();
    let mut registry = ExecutorRegistry::new();
    registry
        .register(polls_once("k", Duration::from_millis(300)))
        .unwrap();
    let manager = Manager::new(store.clone(), registry, ManagerConfig::default());
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    // An hour between polls: only the timer's own wake-up runs the task again in time (the
    // worker looks once more when the first attempt ends, well before the task is due).
    let worker = Worker::new(
        manager.clone(),
        WorkerConfig::new(["k"]).with_poll_interval(Duration::from_secs(3600)),
    )
    .unwrap();
    let handle = tokio::spawn(worker.run(async move {
        let _ = stop_rx.wait_for(|s| *s).await;
    }));
    let id = submit(&manager, "k").await;
    // Created (1), claimed (2), yielded (3): pending, delayed by 300 ms of the store's clock.
    let yielded = store.wait_for_task_version(&id, 2).await.unwrap();
    assert_eq!(yielded.checkpoint, b"job-42 queued");
    let due = yielded.not_before.expect("delayed");
    assert!(due > yielded.created_at);
    let outcome = tokio::time::timeout(Duration::from_secs(60), manager.wait(&id))
        .await
        .expect("woken at the due time, not after the hour-long poll")
        .unwrap();
    assert_eq!(outcome, TaskOutcome::Completed(b"job-42 done".to_vec()));
    let done = store.get(&id).await.unwrap();
    assert_eq!(done.attempt, 2);
    assert!(done.updated_at >= due, "not run again before its time");
    stop_tx.send(true).unwrap();
    handle.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_a_pickup_delay_claims_a_new_task_when_the_delay_ends() {
    // The system clock: the worker skips the task while it is younger than the delay, then
    // sleeps until it is old enough by the store's clock — not until its next poll.
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let store =
        TaskStore::open(journal, dtask_engine::SystemClock, StoreConfig::default()).unwrap();
    let mut registry = ExecutorRegistry::new();
    registry.register(completes("k")).unwrap();
    let manager = Manager::new(store.clone(), registry, ManagerConfig::default());
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let delay = Duration::from_millis(300);
    let worker = Worker::new(
        manager.clone(),
        WorkerConfig::new(["k"])
            .with_poll_interval(Duration::from_secs(3600))
            .with_initial_pickup_delay(delay),
    )
    .unwrap();
    let handle = tokio::spawn(worker.run(async move {
        let _ = stop_rx.wait_for(|s| *s).await;
    }));
    let id = submit(&manager, "k").await;
    let outcome = tokio::time::timeout(Duration::from_secs(60), manager.wait(&id))
        .await
        .expect("claimed when the delay ended, not after the hour-long poll")
        .unwrap();
    assert_eq!(outcome, TaskOutcome::Completed(b"done".to_vec()));
    let done = store.get(&id).await.unwrap();
    assert_eq!(done.attempt, 1);
    assert!(
        done.updated_at >= done.created_at.plus_millis(300),
        "not claimed before the delay ended"
    );
    stop_tx.send(true).unwrap();
    handle.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_policy_cancel_returns_after_the_local_attempt_is_canceled() {
    let env = env(vec![waits_for_control("k", LeasePolicy::Fail, false)]);
    let id = submit(&env.manager, "k").await;
    let run = spawn_execute(&env.manager, &id);
    until_running(&env.manager, &id).await;
    let state = env.manager.request_cancel(&id, "stop it").await.unwrap();
    assert_eq!(state.status, Status::Canceled, "g047");
    assert_eq!(state.result_error, "stop it");
    run.await.unwrap().unwrap();
}

#[tokio::test]
async fn task_ids_are_kind_prefixed_and_time_ordered() {
    let env = env(vec![completes("k")]);
    let a = env.manager.allocate_task_id("shell").unwrap();
    let b = env.manager.allocate_task_id("shell").unwrap();
    assert!(a.starts_with("shell_") && a < b, "{a} {b}");
    assert!(env
        .manager
        .allocate_task_id("")
        .unwrap()
        .starts_with("task_"));
    assert!(matches!(
        env.manager.allocate_task_id("bad kind!"),
        Err(RuntimeError::InvalidKind(_))
    ));
}

/// A heartbeat that committed but whose answer was lost leaves the runtime one version
/// behind: its next heartbeat is refused as stale. The runtime re-reads the task and, its
/// attempt still being the running one, carries on (it used to poison the attempt).
#[tokio::test]
async fn heartbeat_with_a_lost_answer_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(
        dir.path(),
        JournalOptions::default().with_durability(Durability::Buffered),
    )
    .unwrap();
    let store =
        TaskStore::open(journal, ManualClock::new(1_000_000), StoreConfig::default()).unwrap();
    let mut registry = ExecutorRegistry::new();
    registry
        .register(waits_for_control("k", LeasePolicy::Retry, false))
        .unwrap();
    let manager = Manager::new(
        store.clone(),
        registry,
        ManagerConfig::default().with_heartbeat_interval(Duration::from_millis(5)),
    );
    let id = submit(&manager, "k").await;
    let run = spawn_execute(&manager, &id);
    until_running(&manager, &id).await;
    // The runtime's heartbeat, committed behind its back: as if its answer had been lost.
    let running = store.get(&id).await.unwrap();
    let lost = store
        .execute(&id, running.version, dtask_engine::Command::Heartbeat)
        .await
        .unwrap();
    // The runtime's next heartbeats are written at the adopted version.
    let renewed = tokio::time::timeout(
        Duration::from_secs(60),
        store.wait_for_task_version(&id, lost.version + 1),
    )
    .await
    .expect("the runtime stopped heartbeating")
    .unwrap();
    assert_eq!(renewed.status, Status::Running);
    assert_eq!(renewed.attempt, 1);
    manager.request_cancel(&id, "enough").await.unwrap();
    let ended = run.await.unwrap().unwrap();
    assert_eq!(ended.status, Status::Canceled);
    assert_eq!(ended.result_error, "enough");
}

/// A cancel requested through the manager on a task that has finished by itself succeeds
/// and returns the terminal state, with no cancel request recorded.
#[tokio::test]
async fn cancel_of_a_finished_task_returns_its_terminal_state() {
    let env = env(vec![completes("k")]);
    let id = submit(&env.manager, "k").await;
    let done = env.manager.execute(&id).await.unwrap();
    assert_eq!(done.status, Status::Completed);
    let state = env.manager.request_cancel(&id, "too late").await.unwrap();
    assert_eq!(state.status, Status::Completed);
    assert_eq!(state.cancel_requested_at, None);
    assert_eq!(state.version, done.version);
    // The store keeps its typed answer.
    let err = env
        .manager
        .store()
        .execute(
            &id,
            done.version,
            dtask_engine::Command::RequestCancel {
                reason: String::new(),
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::AlreadyTerminal(_)));
}

#[tokio::test]
async fn a_rerun_runs_again_under_its_own_id_and_needs_the_executor() {
    let env = env(vec![completes("k")]);
    let id = submit(&env.manager, "k").await;
    env.manager.execute(&id).await.unwrap();
    let rerun = env.manager.rerun(&id, None).await.unwrap();
    assert_eq!(rerun.rerun_of(), Some(id.as_str()));
    let done = env.manager.execute(rerun.id()).await.unwrap();
    assert_eq!(done.status, Status::Completed);
    assert_eq!(done.attempt, 1);
    assert_eq!(
        env.manager.get(&id).await.unwrap().rerun_as(),
        [rerun.id().to_owned()]
    );

    // A task whose executor this manager does not run: refused, nothing written.
    let stray = TaskSpec {
        id: "stray".into(),
        executor_key: "gone".into(),
        ..TaskSpec::default()
    };
    let store = env.manager.store();
    store
        .create(dtask_engine::CreateRequest {
            spec: stray,
            policy: Some(LeasePolicy::Retry),
            ..dtask_engine::CreateRequest::default()
        })
        .await
        .unwrap();
    let canceled = store
        .execute(
            "stray",
            1,
            dtask_engine::Command::RequestCancel {
                reason: String::new(),
            },
        )
        .await
        .unwrap();
    assert!(matches!(
        env.manager.rerun("stray", None).await,
        Err(RuntimeError::ExecutorUnavailable(key)) if key == "gone"
    ));
    assert_eq!(store.get("stray").await.unwrap(), canceled);
}

/// Counts acknowledged appends.
#[derive(Debug, Default)]
struct Appends(AtomicUsize);

impl dtask_journal::observe::WriteObserver for Appends {
    fn acknowledged(&self, _latency: Duration) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn spec(id: &str, key: &str) -> TaskSpec {
    TaskSpec {
        id: id.into(),
        executor_key: key.into(),
        ..TaskSpec::default()
    }
}

#[tokio::test]
async fn run_now_creates_the_task_claimed_in_one_append_and_runs_it_here() {
    let env = env(vec![completes("exec")]);
    let appends = Arc::new(Appends::default());
    assert!(env.manager.store().journal().observe(appends.clone()));
    let done = env
        .manager
        .run_now(SubmitRequest {
            spec: spec("now", "exec"),
            ..SubmitRequest::default()
        })
        .await
        .unwrap();
    assert_eq!(done.status, Status::Completed);
    assert_eq!(done.attempt, 1);
    assert_eq!(done.result_data, b"done");
    // Creation and claim in one append, the completion in another: two, where submit and a
    // claim and the completion take three.
    assert_eq!(appends.0.load(Ordering::SeqCst), 2);
    let submitted = submit(&env.manager, "exec").await;
    env.manager.execute(&submitted).await.unwrap();
    assert_eq!(appends.0.load(Ordering::SeqCst), 5);

    // The same id again: refused, nothing written.
    let again = env
        .manager
        .run_now(SubmitRequest {
            spec: spec("now", "exec"),
            ..SubmitRequest::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(again, RuntimeError::Store(StoreError::AlreadyExists(_))),
        "{again:?}"
    );
    assert_eq!(appends.0.load(Ordering::SeqCst), 5);
    // An unknown executor: nothing created.
    let unknown = env
        .manager
        .run_now(SubmitRequest {
            spec: spec("other", "nobody"),
            ..SubmitRequest::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(unknown, RuntimeError::ExecutorUnavailable(_)));
    assert!(env.manager.get("other").await.is_err());
}

/// A task created claimed whose process is lost is a task like any other: its lease runs
/// out and the next attempt runs it; it was never pending, so no worker saw it before.
#[tokio::test]
async fn a_task_created_claimed_is_recovered_when_its_lease_runs_out() {
    let env = env(vec![completes("exec")]);
    let store = env.manager.store();
    let claimed = store
        .create_claimed(dtask_engine::CreateRequest {
            spec: spec("lost", "exec"),
            policy: Some(LeasePolicy::Retry),
            ..dtask_engine::CreateRequest::default()
        })
        .await
        .unwrap();
    assert_eq!(claimed.status, Status::Running);
    assert_eq!(claimed.attempt, 1);
    // The snapshot is the fold of what was written: the same as a replay of the stream.
    let replayed = dtask_replay::load_task(store.journal(), "lost")
        .unwrap()
        .unwrap();
    assert_eq!(replayed.state, claimed);
    assert!(store
        .list_pending(&["exec".to_owned()], None, 10)
        .await
        .unwrap()
        .tasks
        .is_empty());
    env.clock.advance(Duration::from_secs(31));
    let done = env.manager.execute("lost").await.unwrap();
    assert_eq!(done.status, Status::Completed);
    assert_eq!(done.attempt, 2);
    // A nested or deferred task cannot be created claimed.
    let nested = store
        .create_claimed(dtask_engine::CreateRequest {
            spec: spec("child", "exec"),
            policy: Some(LeasePolicy::Retry),
            parent: Some(dtask_engine::ExecutionContext {
                task_id: "lost".into(),
                attempt: 2,
                generation: 1,
            }),
            ..dtask_engine::CreateRequest::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(
        nested,
        StoreError::Invalid {
            field: "parent",
            ..
        }
    ));
}

/// A nested task's attempt notifies its parent (`AttemptContext::notify`): the notification
/// is an input of the parent's mailbox, which names the child and the event id; a replay
/// inside the attempt sends nothing more.
#[tokio::test]
async fn a_nested_tasks_attempt_notifies_its_parent_through_its_mailbox() {
    let notifies = executor(
        "child",
        LeasePolicy::Retry,
        false,
        |attempt, _| async move {
            attempt
                .notify("found-1", "finding", b"src/a.rs".to_vec())
                .await
                .unwrap();
            attempt
                .notify("found-1", "finding", b"src/a.rs".to_vec())
                .await
                .unwrap();
            Ok(ExecutionResult::Completed(b"done".to_vec()))
        },
    );
    let env = env(vec![notifies]);
    let store = env.manager.store();
    let parent = store
        .create(dtask_engine::CreateRequest {
            spec: spec("p", "parent"),
            policy: Some(LeasePolicy::Retry),
            ..dtask_engine::CreateRequest::default()
        })
        .await
        .unwrap();
    store
        .execute("p", parent.version, dtask_engine::Command::Start)
        .await
        .unwrap();
    store
        .create(dtask_engine::CreateRequest {
            spec: spec("p/c", "child"),
            policy: Some(LeasePolicy::Retry),
            parent: Some(dtask_engine::ExecutionContext {
                task_id: "p".into(),
                attempt: 1,
                generation: 1,
            }),
            ..dtask_engine::CreateRequest::default()
        })
        .await
        .unwrap();
    let done = env.manager.execute("p/c").await.unwrap();
    assert_eq!(done.status, Status::Completed);
    let inputs = store.list_inputs("p", 0, 10).await.unwrap().inputs;
    let found: Vec<_> = inputs.iter().filter(|i| i.kind == "finding").collect();
    assert_eq!(found.len(), 1, "{inputs:?}");
    assert_eq!(found[0].data, b"src/a.rs");
    assert_eq!(
        dtask_engine::application_notification_source(&found[0].event_id),
        Some(("p/c".to_owned(), "found-1".to_owned()))
    );
}

/// Sends the running task of `attempt` an input (as another party would, while it runs).
async fn send_to_self(attempt: &AttemptContext, event_id: &str, kind: &str, data: &[u8]) {
    attempt
        .store()
        .send_input(
            attempt.task_id(),
            dtask_engine::InputRequest {
                event_id: event_id.into(),
                kind: kind.into(),
                data: data.to_vec(),
                ..dtask_engine::InputRequest::default()
            },
        )
        .await
        .unwrap();
}

/// `CompletedIfNoInputs`: an input newer than the executor's cursor sends the task back to
/// pending (nothing completed, the attempt's commit not an error); the next attempt, which
/// consumes it, completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completing_if_no_inputs_goes_back_to_pending_for_an_unread_input() {
    let reads = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&reads);
    let reader = executor("reader", LeasePolicy::Retry, false, move |attempt, task| {
        let seen = Arc::clone(&seen);
        async move {
            let cursor = task.mailbox.consumed;
            let page = attempt.inputs(cursor).await.unwrap();
            let newest = page.inputs.last().map_or(cursor, |i| i.sequence);
            if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                // An input arrives after the executor read the mailbox.
                send_to_self(&attempt, "late", "note", b"read me").await;
            }
            attempt.advance_cursor(cursor, newest).await.unwrap();
            Ok(ExecutionResult::CompletedIfNoInputs {
                cursor: newest,
                data: format!("read {newest}").into_bytes(),
            })
        }
    });
    let env = env(vec![reader]);
    let id = submit(&env.manager, "reader").await;
    let first = env.manager.execute(&id).await.unwrap();
    assert_eq!(first.status, Status::Pending, "{first:?}");
    assert_eq!((first.mailbox.consumed, first.mailbox.latest), (0, 1));
    assert!(first.result_data.is_empty());
    let second = env.manager.execute(&id).await.unwrap();
    assert_eq!(second.status, Status::Completed, "{second:?}");
    assert_eq!(second.result_data, b"read 1");
    assert_eq!(second.mailbox.consumed, 1);
    assert_eq!(reads.load(Ordering::SeqCst), 2);
    // A stale cursor is refused, not taken for "no inputs".
    let stale = executor(
        "stale",
        LeasePolicy::Retry,
        false,
        |attempt, _| async move {
            send_to_self(&attempt, "one", "note", b"x").await;
            attempt.advance_cursor(0, 1).await.unwrap();
            Ok(ExecutionResult::CompletedIfNoInputs {
                cursor: 0,
                data: Vec::new(),
            })
        },
    );
    let env = self::env(vec![stale]);
    let id = submit(&env.manager, "stale").await;
    let refused = env.manager.execute(&id).await;
    assert!(
        matches!(
            refused,
            Err(RuntimeError::Store(StoreError::CursorConflict {
                expected: 0,
                actual: 1
            }))
        ),
        "{refused:?}"
    );
    assert_eq!(env.manager.get(&id).await.unwrap().status, Status::Running);
}

/// `WaitingInputIfNoInputs` and `SuspendedIfNoInputs`: an input that came in after the
/// executor read the mailbox sends the task back to pending instead of leaving it waiting
/// (or suspended) with the input unread; read, the wait is taken with the cursor consumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_or_suspending_if_no_inputs_goes_back_to_pending_for_an_unread_input() {
    for suspend in [false, true] {
        let attempts = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&attempts);
        let asker = executor("asker", LeasePolicy::Retry, false, move |attempt, task| {
            let seen = Arc::clone(&seen);
            async move {
                let cursor = task.mailbox.consumed;
                let page = attempt.inputs(cursor).await.unwrap();
                let newest = page.inputs.last().map_or(cursor, |i| i.sequence);
                if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                    send_to_self(&attempt, "early answer", "answer", b"yes").await;
                }
                let checkpoint = format!("asked after {newest}").into_bytes();
                Ok(if suspend {
                    attempt.advance_cursor(cursor, newest).await.unwrap();
                    ExecutionResult::SuspendedIfNoInputs {
                        cursor: newest,
                        checkpoint,
                    }
                } else {
                    ExecutionResult::WaitingInputIfNoInputs {
                        cursor: newest,
                        checkpoint,
                    }
                })
            }
        });
        let env = env(vec![asker]);
        let id = submit(&env.manager, "asker").await;
        let first = env.manager.execute(&id).await.unwrap();
        assert_eq!(
            first.status,
            Status::Pending,
            "suspend {suspend}: {first:?}"
        );
        assert_eq!((first.mailbox.consumed, first.mailbox.latest), (0, 1));
        assert_eq!(first.checkpoint, b"asked after 0");
        let second = env.manager.execute(&id).await.unwrap();
        let waiting = if suspend {
            Status::Suspended
        } else {
            Status::WaitingInput
        };
        assert_eq!(second.status, waiting, "suspend {suspend}: {second:?}");
        assert_eq!(second.mailbox.consumed, 1);
        assert_eq!(second.checkpoint, b"asked after 1");
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
    }
    // An empty checkpoint is an invalid result: nothing committed.
    let empty = executor("empty", LeasePolicy::Retry, false, |_, _| async {
        Ok(ExecutionResult::WaitingInputIfNoInputs {
            cursor: 0,
            checkpoint: Vec::new(),
        })
    });
    let env = env(vec![empty]);
    let id = submit(&env.manager, "empty").await;
    let refused = env.manager.execute(&id).await;
    assert!(
        matches!(
            refused,
            Err(RuntimeError::Store(StoreError::InvalidExecutionResult(_)))
        ),
        "{refused:?}"
    );
    assert_eq!(env.manager.get(&id).await.unwrap().status, Status::Running);
}

/// A heartbeat whose append reached the journal but whose answer the attempt never saw (it
/// was aborted when the executor returned, or failed with its outcome unknown) leaves the
/// attempt one version behind. Its next write — the started marker, the outcome — is not a
/// lost lease: the task is still the attempt's, so the attempt adopts the version and writes
/// again. (The outcome was refused and thrown away, and the task run again after its lease.)
#[tokio::test]
async fn a_write_after_a_heartbeat_the_attempt_never_saw_is_made_again() {
    let gates = Arc::new([
        tokio::sync::Semaphore::new(0),
        tokio::sync::Semaphore::new(0),
    ]);
    let held = Arc::clone(&gates);
    let env = env(vec![executor(
        "k",
        LeasePolicy::Retry,
        false,
        move |attempt, _| {
            let gates = Arc::clone(&held);
            async move {
                gates[0].acquire().await.unwrap().forget();
                attempt
                    .commit_start(b"started".to_vec())
                    .await
                    .map_err(|e| ExecutionError::Failed(format!("commit start: {e}")))?;
                gates[1].acquire().await.unwrap().forget();
                Ok(ExecutionResult::Completed(b"done".to_vec()))
            }
        },
    )]);
    let store = env.manager.store().clone();
    let id = submit(&env.manager, "k").await;
    let run = spawn_execute(&env.manager, &id);
    until_running(&env.manager, &id).await;
    for gate in gates.iter() {
        // The attempt's heartbeat, committed behind its back.
        let running = store.get(&id).await.unwrap();
        store
            .execute(&id, running.version, dtask_engine::Command::Heartbeat)
            .await
            .unwrap();
        gate.add_permits(1);
    }
    let done = run.await.unwrap().unwrap();
    assert_eq!(done.status, Status::Completed);
    assert_eq!(done.result_data, b"done");
    assert_eq!(done.checkpoint, b"started");
    assert_eq!(done.attempt, 1);
}

/// A caller that stops waiting for `execute` (its future dropped: a timeout, an aborted
/// worker) does not cut the attempt short: the executor's outcome is committed, and the
/// manager lets go of the task. (The attempt was abandoned between the executor and its
/// commit: the heartbeats renewed the lease for ever and the task stayed "executing here".)
#[tokio::test]
async fn an_execution_whose_caller_stops_waiting_runs_to_its_commit() {
    let (gate, executor) = completes_when_let_go(LeasePolicy::Retry, b"done");
    let env = env(vec![executor]);
    let id = submit(&env.manager, "k").await;
    let run = spawn_execute(&env.manager, &id);
    until_running(&env.manager, &id).await;
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    gate.add_permits(1);
    let outcome = tokio::time::timeout(Duration::from_secs(60), env.manager.wait(&id))
        .await
        .expect("the outcome was never committed")
        .unwrap();
    assert_eq!(outcome, TaskOutcome::Completed(b"done".to_vec()));
    while env.manager.active_tasks().contains(&id) {
        tokio::task::yield_now().await;
    }
    // Nothing of the attempt is left behind: the manager closes at once.
    env.manager.close(None, "done").await.unwrap();
}

/// At its deadline, close cancels the attempts that cannot drain and does not wait for one
/// slow to stop: it answers `CloseTimedOut` (it waited for a fail-policy attempt to end, for
/// as long as its executor took — for ever, for one that ignores Stop).
#[tokio::test]
async fn close_does_not_wait_past_its_deadline_for_an_attempt_slow_to_stop() {
    let (gate, executor) = completes_when_let_go(LeasePolicy::Fail, b"late");
    let env = env(vec![executor]);
    let id = submit(&env.manager, "k").await;
    let run = spawn_execute(&env.manager, &id);
    until_running(&env.manager, &id).await;
    let closed = tokio::time::timeout(
        Duration::from_secs(60),
        env.manager.close(
            Some(tokio::time::Instant::now() + Duration::from_millis(20)),
            "shutting down",
        ),
    )
    .await
    .expect("close waited past its deadline");
    assert!(
        matches!(closed, Err(RuntimeError::CloseTimedOut)),
        "{closed:?}"
    );
    let task = env.manager.store().get(&id).await.unwrap();
    assert!(
        task.cancel_requested_at.is_some(),
        "the attempt was told to stop"
    );
    gate.add_permits(1);
    let ended = run.await.unwrap().unwrap();
    assert_eq!(ended.status, Status::Canceled);
}

/// A cancellation the executor acknowledges only after the lease the request set ran out is
/// a lost lease — the expiry resolves the task — not an error that ends the worker running
/// the attempt.
#[tokio::test]
async fn a_cancellation_acknowledged_after_the_lease_ran_out_is_a_lost_lease() {
    let (gate, executor) = completes_when_let_go(LeasePolicy::Retry, b"late");
    let env = env(vec![executor]);
    let id = submit(&env.manager, "k").await;
    let run = spawn_execute(&env.manager, &id);
    until_running(&env.manager, &id).await;
    env.manager.request_cancel(&id, "stop").await.unwrap();
    env.clock.advance(Duration::from_secs(3_600));
    gate.add_permits(1);
    let ended = run.await.unwrap();
    // What a worker takes for the engine working (`Store(LeaseLost)` ended its run).
    assert!(
        matches!(ended, Err(RuntimeError::LeaseLost(_))),
        "{ended:?}"
    );
}

/// An executor whose hook for a direct cancel never returns (a tool that does not stop).
struct NeverStops;

#[async_trait]
impl Executor for NeverStops {
    fn key(&self) -> &'static str {
        "never-stops"
    }

    fn lease_policy(&self) -> LeasePolicy {
        LeasePolicy::Retry
    }

    async fn execute(
        &self,
        _attempt: AttemptContext,
        _task: TaskState,
    ) -> Result<ExecutionResult, ExecutionError> {
        Ok(ExecutionResult::Completed(Vec::new()))
    }

    async fn canceled_between_attempts(&self, _manager: &Manager, _task: &TaskState) {
        std::future::pending::<()>().await;
    }
}

/// A cancel request that ends its task at once waits for the executor's hook a bounded
/// while: the cancel is durable, and a tool that never stops does not hold the caller.
#[tokio::test]
async fn a_direct_cancel_does_not_wait_for_ever_on_the_executors_hook() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(
        dir.path(),
        JournalOptions::default().with_durability(Durability::Buffered),
    )
    .unwrap();
    let store =
        TaskStore::open(journal, ManualClock::new(1_000_000), StoreConfig::default()).unwrap();
    let mut registry = ExecutorRegistry::new();
    registry.register(NeverStops).unwrap();
    let manager = Manager::new(
        store,
        registry,
        ManagerConfig::default().with_cancel_hook_wait(Duration::ZERO),
    );
    let id = submit(&manager, "never-stops").await;
    // A guard against a wait for ever, no measure.
    let canceled =
        tokio::time::timeout(Duration::from_secs(60), manager.request_cancel(&id, "stop"))
            .await
            .expect("the cancel request waited for the hook for ever")
            .unwrap();
    assert_eq!(canceled.status, Status::Canceled);
}

/// An executor whose attempts wait for a control and then hand the task on (a yield, as an
/// attempt told to stop while it was yielding would) or end it canceled; records the tasks
/// its hook for a cancel between attempts is told of.
struct HandsOn {
    cancels_itself: bool,
    told: Arc<parking_lot::Mutex<Vec<(String, Status, String)>>>,
}

#[async_trait]
impl Executor for HandsOn {
    fn key(&self) -> &'static str {
        "hands-on"
    }

    fn lease_policy(&self) -> LeasePolicy {
        LeasePolicy::Retry
    }

    async fn execute(
        &self,
        attempt: AttemptContext,
        _task: TaskState,
    ) -> Result<ExecutionResult, ExecutionError> {
        let control = attempt.next_control().await;
        if self.cancels_itself {
            return Ok(ExecutionResult::Canceled(format!("{control:?}")));
        }
        Ok(ExecutionResult::Yield(
            b"left for the next attempt".to_vec(),
        ))
    }

    async fn canceled_between_attempts(&self, _manager: &Manager, task: &TaskState) {
        self.told
            .lock()
            .push((task.spec.id.clone(), task.status, task.result_error.clone()));
    }
}

/// An attempt that hands its task on (a yield: work left running for the next attempt) as a
/// cancel comes ends the task canceled — the cancel replaces its result — and no attempt
/// will come to stop that work: the executor's hook is told, as for a direct cancel. An
/// attempt that ends the task itself is not: it stopped its own work.
#[tokio::test]
async fn a_yield_replaced_by_a_cancel_tells_the_executor_and_a_cancel_of_its_own_does_not() {
    for cancels_itself in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(
            dir.path(),
            JournalOptions::default().with_durability(Durability::Buffered),
        )
        .unwrap();
        let store =
            TaskStore::open(journal, ManualClock::new(1_000_000), StoreConfig::default()).unwrap();
        let told = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mut registry = ExecutorRegistry::new();
        registry
            .register(HandsOn {
                cancels_itself,
                told: Arc::clone(&told),
            })
            .unwrap();
        let manager = Manager::new(store, registry, ManagerConfig::default());
        let id = submit(&manager, "hands-on").await;
        let run = spawn_execute(&manager, &id);
        until_running(&manager, &id).await;
        manager.request_cancel(&id, "operator").await.unwrap();
        let ended = run.await.unwrap().unwrap();
        assert_eq!(
            ended.status,
            Status::Canceled,
            "the cancel replaced the yield"
        );
        let told = told.lock().clone();
        if cancels_itself {
            assert!(told.is_empty(), "{told:?}");
        } else {
            assert_eq!(told, [(id, Status::Canceled, "operator".to_owned())]);
        }
    }
}

//! Worker loss with real processes: a child process runs a worker and is killed with SIGKILL
//! while an attempt runs; a new process (this one) opens the same journal and recovers the
//! task according to its lease policy. And a poison task — one whose every attempt takes its
//! process down — under a recovery limit: child after child claims it and is killed, until
//! the limit fails it instead of letting it kill workers forever. Runs without the libtest
//! harness: the same binary is the parent (no arguments) and the child (`--child DIR
//! SCENARIO [ROUND]`).
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use async_trait::async_trait;
use dtask_engine::{
    AttemptContext, ExecutionError, ExecutionResult, Executor, ExecutorRegistry, Manager,
    ManagerConfig, ManualClock, Progress, StoreConfig, SubmitRequest, SystemClock, TaskOutcome,
    TaskStore, Worker, WorkerConfig,
};
use dtask_journal::{Journal, JournalOptions, LeasePolicy, TaskSpec};
use dtask_replay::{recovery_limit_error, Status, TaskState, LEASE_EXPIRED_ERROR};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const KEY: &str = "loss";

/// The child's executor: writes the started marker, one update, optionally requests its own
/// cancellation, tells the parent it runs, then hangs until killed.
struct Hang {
    policy: LeasePolicy,
    cancel: bool,
    marker: PathBuf,
}

#[async_trait]
impl Executor for Hang {
    fn key(&self) -> &str {
        KEY
    }
    fn lease_policy(&self) -> LeasePolicy {
        self.policy
    }
    async fn execute(
        &self,
        attempt: AttemptContext,
        _task: TaskState,
    ) -> Result<ExecutionResult, ExecutionError> {
        attempt.commit_start(b"started".to_vec()).await.unwrap();
        attempt
            .emit_progress(Progress {
                event_id: "e1".into(),
                kind: "progress".into(),
                data: b"half".to_vec(),
                metadata: vec![],
            })
            .await
            .unwrap();
        if self.cancel {
            let store = attempt.store();
            let v = store.get(attempt.task_id()).await.unwrap().version;
            store
                .execute(
                    attempt.task_id(),
                    v,
                    dtask_engine::Command::RequestCancel {
                        reason: "operator".into(),
                    },
                )
                .await
                .unwrap();
        }
        std::fs::write(&self.marker, b"running").unwrap();
        std::future::pending().await
    }
}

/// The recovering process's executor: completes at once and reports what it found.
struct Finish;

#[async_trait]
impl Executor for Finish {
    fn key(&self) -> &str {
        KEY
    }
    fn lease_policy(&self) -> LeasePolicy {
        LeasePolicy::Retry
    }
    async fn execute(
        &self,
        _attempt: AttemptContext,
        task: TaskState,
    ) -> Result<ExecutionResult, ExecutionError> {
        Ok(ExecutionResult::Completed(
            format!(
                "attempt {} from {}",
                task.attempt,
                String::from_utf8_lossy(&task.checkpoint)
            )
            .into_bytes(),
        ))
    }
}

/// The poison scenario's recovery limit.
const POISON_RECOVERIES: u64 = 2;

/// The poison task's executor: tells the parent which round claimed it, then hangs until
/// killed (as if the tool took the process down); its tasks may be recovered
/// [`POISON_RECOVERIES`] times.
struct Poison {
    marker: PathBuf,
}

#[async_trait]
impl Executor for Poison {
    fn key(&self) -> &str {
        KEY
    }
    fn lease_policy(&self) -> LeasePolicy {
        LeasePolicy::Retry
    }
    fn max_recoveries(&self, _spec: &TaskSpec) -> Option<u64> {
        Some(POISON_RECOVERIES)
    }
    async fn execute(
        &self,
        attempt: AttemptContext,
        _task: TaskState,
    ) -> Result<ExecutionResult, ExecutionError> {
        std::fs::write(&self.marker, attempt.attempt().to_string()).unwrap();
        std::future::pending().await
    }
}

/// One round of the poison scenario: a process whose clock is `round` hours ahead (so every
/// earlier round's lease has run out) opens the journal, submits the task in round 0, reads
/// it (resolving the last round's expiry) and, while it is not finished, runs a worker until
/// it is killed. Exits 0 once it finds the task finished.
fn poison_child(dir: &Path, round: u64) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let journal = Journal::open(dir.join("journal"), JournalOptions::default()).unwrap();
        let clock = ManualClock::new(SystemClock.now_millis() + round * 3_600_000);
        let store = TaskStore::open(journal, clock, StoreConfig::default()).unwrap();
        let mut registry = ExecutorRegistry::new();
        registry
            .register(Poison {
                marker: dir.join(format!("running-{round}")),
            })
            .unwrap();
        let manager = Manager::new(store, registry, ManagerConfig::default());
        if round == 0 {
            submit(&manager, "poison").await;
        }
        if manager.get("poison").await.unwrap().is_terminal() {
            return;
        }
        work(manager).await;
    });
}

/// Submits task `id` to the scenarios' executor.
async fn submit(manager: &Manager, id: &str) {
    manager
        .submit(SubmitRequest {
            spec: TaskSpec {
                id: id.into(),
                executor_key: KEY.into(),
                ..TaskSpec::default()
            },
            ..SubmitRequest::default()
        })
        .await
        .unwrap();
}

/// Runs a worker of the scenarios' executor until the process is killed.
async fn work(manager: Manager) {
    Worker::new(manager, WorkerConfig::new([KEY]))
        .unwrap()
        .run(std::future::pending())
        .await
        .unwrap();
}

/// The poison scenario: rounds of children, each killed once it runs the task, until one
/// finds the task failed by its recovery limit.
fn poison() -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let mut rounds = 0;
    loop {
        if rounds > POISON_RECOVERIES + 2 {
            return Err(format!("still not failed after {rounds} rounds"));
        }
        let marker = dir.path().join(format!("running-{rounds}"));
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--child", dir.path().to_str().unwrap(), "poison"])
            .arg(rounds.to_string())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let finished = loop {
            if marker.exists() {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                break false;
            }
            if let Some(status) = child.try_wait().unwrap() {
                if !status.success() {
                    return Err(format!("round {rounds}: the child failed: {status}"));
                }
                break true;
            }
            if started.elapsed() > Duration::from_secs(120) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("round {rounds}: the child neither ran nor ended"));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        if finished {
            break;
        }
        let attempt = std::fs::read_to_string(&marker).unwrap();
        if attempt != (rounds + 1).to_string() {
            return Err(format!("round {rounds} ran attempt {attempt}"));
        }
        rounds += 1;
    }
    if rounds != POISON_RECOVERIES + 1 {
        return Err(format!(
            "the task ran in {rounds} processes, not {}",
            POISON_RECOVERIES + 1
        ));
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let journal = Journal::open_read_only(dir.path().join("journal")).unwrap();
        let task = dtask_replay::load_task(&journal, "poison")
            .map_err(|e| e.to_string())?
            .ok_or("no task")?
            .state;
        let expected = (
            Status::Failed,
            POISON_RECOVERIES + 1,
            POISON_RECOVERIES,
            Some(POISON_RECOVERIES),
        );
        let found = (
            task.status,
            task.attempt,
            task.recoveries,
            task.max_recoveries,
        );
        if found != expected || task.result_error != recovery_limit_error(POISON_RECOVERIES) {
            return Err(format!("poison: {task:?}"));
        }
        Ok(())
    })
}

fn policy_of(scenario: &str) -> (LeasePolicy, bool) {
    match scenario {
        "retry" => (LeasePolicy::Retry, false),
        "fail" => (LeasePolicy::Fail, false),
        _ => (LeasePolicy::Fail, true),
    }
}

fn child(dir: &Path, scenario: &str) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let journal = Journal::open(dir.join("journal"), JournalOptions::default()).unwrap();
        let store = TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap();
        let (policy, cancel) = policy_of(scenario);
        let mut registry = ExecutorRegistry::new();
        registry
            .register(Hang {
                policy,
                cancel,
                marker: dir.join("running"),
            })
            .unwrap();
        let manager = Manager::new(store, registry, ManagerConfig::default());
        submit(&manager, "victim").await;
        work(manager).await;
    });
}

fn scenario(scenario: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--child", dir.path().to_str().unwrap(), scenario])
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !dir.path().join("running").exists() {
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the child never started its attempt".into());
        }
        if let Some(status) = child.try_wait().unwrap() {
            return Err(format!("the child exited early: {status}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let journal = Journal::open(dir.path().join("journal"), JournalOptions::default())
            .map_err(|e| e.to_string())?;
        // The child's lease (30 s from its clock) has certainly run out on this clock.
        let clock = ManualClock::new(SystemClock.now_millis() + 3_600_000);
        let store = TaskStore::open(journal, clock, StoreConfig::default()).unwrap();
        let mut registry = ExecutorRegistry::new();
        registry.register(Finish).unwrap();
        let manager = Manager::new(store, registry, ManagerConfig::default());
        let task = manager.get("victim").await.unwrap();
        let expect = |ok: bool, what: &str| {
            if ok {
                Ok(())
            } else {
                Err(format!("{scenario}: {what}: {task:?}"))
            }
        };
        match scenario {
            "retry" => {
                expect(
                    task.status == Status::Pending && task.attempt == 1,
                    "pending after expiry",
                )?;
                expect(task.checkpoint == b"started", "the started marker survived")?;
                let state = manager.execute("victim").await.unwrap();
                let outcome = manager.wait("victim").await.unwrap();
                if outcome != TaskOutcome::Completed(b"attempt 2 from started".to_vec())
                    || state.attempt != 2
                {
                    return Err(format!("retry: attempt 2 did not complete: {outcome:?}"));
                }
                let updates = manager
                    .store()
                    .list_updates("victim", None, 0, false)
                    .await
                    .unwrap();
                expect(
                    updates.updates.len() == 1,
                    "the update of attempt 1 is kept",
                )?;
            }
            "fail" => {
                expect(task.status == Status::Failed, "failed")?;
                expect(
                    task.result_error == LEASE_EXPIRED_ERROR,
                    "lease-expired error",
                )?;
            }
            _ => {
                expect(task.status == Status::Canceled, "canceled")?;
                expect(task.result_error == "operator", "the cancel reason")?;
            }
        }
        Ok(())
    })
}

trait NowMillis {
    fn now_millis(&self) -> u64;
}

impl NowMillis for SystemClock {
    fn now_millis(&self) -> u64 {
        dtask_engine::Clock::now(self).as_millis()
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        if args[3] == "poison" {
            poison_child(Path::new(&args[2]), args[4].parse().unwrap());
        } else {
            child(Path::new(&args[2]), &args[3]);
        }
        return;
    }
    // libtest flags such as --list or --nocapture are accepted and ignored.
    if args.iter().any(|a| a == "--list") {
        return;
    }
    let mut failed = 0;
    let scenarios = ["retry", "fail", "fail_with_cancel", "poison"];
    for name in scenarios {
        let outcome = if name == "poison" {
            poison()
        } else {
            scenario(name)
        };
        match outcome {
            Ok(()) => println!("test worker_loss::{name} ... ok"),
            Err(e) => {
                failed += 1;
                println!("test worker_loss::{name} ... FAILED: {e}");
            }
        }
    }
    println!(
        "worker_loss: {} passed, {failed} failed",
        scenarios.len() - failed
    );
    if failed > 0 {
        std::process::exit(1);
    }
}

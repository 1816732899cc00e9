//! The peers' workload as a bench of the project (the workload Restate and DBOS publish their
//! figures for): a task of N = 10 durable steps — a step is a progress update the executor appends
//! and waits for, synced — run by C = 1, 16, 64 concurrent callers, each starting a task and
//! waiting for its outcome, then the next; and a 1-step task at C = 1. Through the whole engine:
//! the `Manager`, an executor, the store, the journal (`Durability::Sync`). The main rows start
//! each task with `Manager::run_now` (created already claimed, run by the caller's manager at once:
//! how a service runs a task it starts and waits for); the rows marked "submit + worker" submit it
//! pending and let a `Worker` claim it (one synced append more).
//!
//! It prints steps/s, tasks/s and the task latency p50/p99, and measures one fsync of the same
//! disk in the same run (a 4 KiB append and `fdatasync`, p50), so that a step at C = 1 can be
//! set beside it. Targets (each on its own line, `met` / `not met`): ≥ 60k durable steps/s at
//! C = 64; at C = 1 a step costs ≤ 1.5× one fsync; a 1-step task at C = 1 has p50 ≤ 0.8 ms.
//!
//! A second set of rows runs the same tasks through a managed tool (a plain background tool whose
//! run emits the 10 updates), submitted with `ManagedTools::submit`.
//!
//! Run: `cargo bench --bench workflow` (`-- --secs 5`, `-- --callers 64`, `-- --steps 10`;
//! `-- --backlog 100000`: each row beside that many pending tasks of an executor no worker
//! runs).
#![allow(
    clippy::unwrap_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    missing_docs
)]

mod common;
use clap::Parser;
use dtask::engine::managed::{
    BackgroundTool, ManagedTools, Registration, Run, RunOutcome, StartRequest, StartResult,
    ToolCall, ToolFailure, ToolRegistry, ToolRunError, Update, UpdateStream,
};
use dtask::engine::tool::ToolInfo;
use dtask::engine::{
    async_trait, AttemptContext, ExecutionError, ExecutionResult, Executor, ExecutorRegistry,
    Manager, ManagerConfig, Progress, StoreConfig, SubmitRequest, SystemClock, TaskOutcome,
    TaskStore, Worker, WorkerConfig,
};
use dtask::journal::{Journal, JournalOptions, LeasePolicy, TaskSpec};
use dtask::replay::TaskState;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The peers' workload: tasks of N durable steps at C concurrent callers (see the module docs).
#[derive(Parser)]
struct Args {
    /// Seconds per row.
    #[arg(long, default_value_t = 3.0)]
    secs: f64,
    /// One row only (callers).
    #[arg(long)]
    callers: Option<usize>,
    /// Steps per task.
    #[arg(long, default_value_t = 10)]
    steps: u32,
    /// Hand every append to the journal's writer thread, even when the journal is idle
    /// (`JournalOptions::inline_lone_appends` off).
    #[arg(long)]
    no_inline: bool,
    /// Leave finished streams among the live ones (`JournalOptions::keep_finished_apart`
    /// off).
    #[arg(long)]
    finished_in_place: bool,
    /// Before each row, queue this many pending tasks of an executor no worker runs (a
    /// backlog the rows' workers are not to pay for).
    #[arg(long, default_value_t = 0)]
    backlog: usize,
    #[command(flatten)]
    journal: common::JournalFlags,
    #[command(flatten)]
    _cargo: common::CargoBench,
}

/// Appends `payload` progress updates (the steps), each waited for, then completes.
struct Steps;

#[async_trait]
impl Executor for Steps {
    fn key(&self) -> &'static str {
        "steps"
    }

    fn lease_policy(&self) -> LeasePolicy {
        LeasePolicy::Retry
    }

    async fn execute(
        &self,
        attempt: AttemptContext,
        task: TaskState,
    ) -> Result<ExecutionResult, ExecutionError> {
        let steps: u32 = std::str::from_utf8(&task.spec.payload)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10);
        for step in 0..steps {
            attempt
                .emit_progress(Progress {
                    event_id: format!("step-{step}"),
                    kind: "step".into(),
                    data: b"step result".to_vec(),
                    metadata: vec![],
                })
                .await
                .map_err(|e| ExecutionError::failed(e.to_string()))?;
        }
        Ok(ExecutionResult::Completed(b"done".to_vec()))
    }
}

/// A plain managed tool whose run emits `{"steps": N}` updates (each journaled, synced, before
/// the next is taken) and completes.
#[derive(Debug)]
struct StepsTool;

#[derive(Debug)]
struct StepsRun {
    steps: u32,
}

#[async_trait]
impl Run for StepsRun {
    async fn wait(&self) -> Result<RunOutcome, ToolRunError> {
        // The outcome comes at once; the updates are drained (and journaled) after it.
        Ok(RunOutcome::Completed(b"done".to_vec()))
    }

    async fn stop(&self) -> Result<(), ToolRunError> {
        Ok(())
    }

    fn updates(&self) -> Option<UpdateStream> {
        let updates = (0..self.steps).map(|step| {
            Ok::<_, ToolFailure>(Update {
                event_id: format!("step-{step}"),
                kind: "step".into(),
                data: b"step result".to_vec(),
                metadata: std::collections::BTreeMap::new(),
            })
        });
        Some(Box::pin(futures::stream::iter(updates)))
    }
}

fn steps_of(arguments: &str) -> Result<u32, ToolFailure> {
    serde_json::from_str::<serde_json::Value>(arguments)
        .ok()
        .and_then(|v| v["steps"].as_u64())
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| "\"steps\" must be a number".into())
}

#[async_trait]
impl BackgroundTool for StepsTool {
    fn validate_arguments(&self, arguments: &str) -> Result<(), ToolFailure> {
        steps_of(arguments).map(drop)
    }

    async fn start(&self, request: StartRequest) -> Result<StartResult, ToolRunError> {
        Ok(StartResult {
            run: Arc::new(StepsRun {
                steps: steps_of(&request.arguments)?,
            }),
            checkpoint: Vec::new(),
        })
    }
}

/// How the steps are run: an executor appending them (started with `run_now`, or submitted
/// for a worker), or a managed tool's run emitting them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Through {
    RunNow,
    Executor,
    ManagedTool,
}

/// One row: tasks of `steps` steps by `callers` callers for `secs`, each started with
/// `run_now`; the task latencies.
fn row(callers: usize, steps: u32, secs: f64) -> (f64, Vec<Duration>) {
    row_through(Through::RunNow, callers, steps, secs)
}

fn steps_spec(id: String, steps: u32) -> TaskSpec {
    TaskSpec {
        id,
        executor_key: "steps".into(),
        payload: steps.to_string().into_bytes(),
        ..TaskSpec::default()
    }
}

fn row_through(through: Through, callers: usize, steps: u32, secs: f64) -> (f64, Vec<Duration>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    runtime.block_on(async {
        let journal = Journal::open(dir.path(), journal_options()).unwrap();
        let store = TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap();
        queue_backlog(&store).await;
        let mut registry = ExecutorRegistry::new();
        registry.register(Steps).unwrap();
        let mut tools = ToolRegistry::new();
        tools
            .register(Registration::new(
                ToolInfo::without_parameters("steps", "emit steps"),
                StepsTool,
            ))
            .unwrap();
        let tools = Arc::new(ManagedTools::new(tools));
        tools.register_executors(&mut registry).unwrap();
        let manager = Manager::new(store, registry, ManagerConfig::default());
        let worker = Worker::new(
            manager.clone(),
            WorkerConfig::new([
                "steps",
                dtask::engine::managed::PLAIN_EXECUTOR_KEY,
                dtask::engine::managed::RECOVERABLE_EXECUTOR_KEY,
            ])
            .with_max_concurrent(callers.max(1) * 2),
        )
        .unwrap();
        let (stop_worker, stopped) = tokio::sync::oneshot::channel::<()>();
        let worker = tokio::spawn(worker.run(async {
            let _ = stopped.await;
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let latencies = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let tasks: Vec<_> = (0..callers)
            .map(|_| {
                let manager = manager.clone();
                let tools = Arc::clone(&tools);
                let stop = Arc::clone(&stop);
                let latencies = Arc::clone(&latencies);
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let t = Instant::now();
                        let id = match through {
                            Through::RunNow => {
                                let id = manager.allocate_task_id("steps").unwrap();
                                let done = manager
                                    .run_now(SubmitRequest {
                                        spec: steps_spec(id, steps),
                                        ..SubmitRequest::default()
                                    })
                                    .await
                                    .unwrap();
                                assert_eq!(done.status, dtask::Status::Completed);
                                latencies.lock().unwrap().push(t.elapsed());
                                continue;
                            }
                            Through::Executor => {
                                let id = manager.allocate_task_id("steps").unwrap();
                                manager
                                    .submit(SubmitRequest {
                                        spec: steps_spec(id.clone(), steps),
                                        ..SubmitRequest::default()
                                    })
                                    .await
                                    .unwrap();
                                id
                            }
                            Through::ManagedTool => {
                                let call = ToolCall {
                                    tool_name: "steps".into(),
                                    arguments: format!("{{\"steps\":{steps}}}"),
                                    ..ToolCall::default()
                                };
                                tools.submit(&manager, call).await.unwrap().spec.id.clone()
                            }
                        };
                        let outcome = manager.wait(&id).await.unwrap();
                        assert!(matches!(outcome, TaskOutcome::Completed(_)));
                        latencies.lock().unwrap().push(t.elapsed());
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        stop.store(true, Ordering::Relaxed);
        let elapsed = started.elapsed().as_secs_f64();
        for t in tasks {
            t.await.unwrap();
        }
        let _ = stop_worker.send(());
        let _ = worker.await;
        let latencies = std::mem::take(&mut *latencies.lock().unwrap());
        (latencies.len() as f64 / elapsed, latencies)
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// One fsync of this disk: the median of a second of 4 KiB appends, each synced.
fn fsync_p50() -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let mut file = std::fs::File::create(dir.path().join("fsync")).unwrap();
    let block = vec![7u8; 4096];
    let mut times = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(1) {
        let t = Instant::now();
        file.write_all(&block).unwrap();
        file.sync_data().unwrap();
        times.push(t.elapsed());
    }
    times.sort();
    percentile(&times, 0.5)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The rows submitted for a worker and through a managed tool, at C = 1 and 64; their steps/s
/// at C = 64.
fn other_rows(args: &Args) -> (Option<f64>, Option<f64>) {
    let mut managed_64 = None;
    let mut worker_64 = None;
    for (through, label) in [
        (Through::Executor, "(submit + worker)"),
        (Through::ManagedTool, "(managed tool)"),
    ] {
        for callers in [1, 64] {
            if args.callers.is_some_and(|c| c != callers) {
                continue;
            }
            let (tasks, mut latencies) = row_through(through, callers, args.steps, args.secs);
            latencies.sort();
            let steps = tasks * f64::from(args.steps);
            println!(
                "{callers:>3} {:>6} {steps:>12.0} {tasks:>10.0} {:>10.3} {:>10.3} {:>12.3}  {label}",
                args.steps,
                ms(percentile(&latencies, 0.5)),
                ms(percentile(&latencies, 0.99)),
                ms(percentile(&latencies, 0.5)) / f64::from(args.steps)
            );
            if callers == 64 {
                match through {
                    Through::ManagedTool => managed_64 = Some(steps),
                    _ => worker_64 = Some(steps),
                }
            }
        }
    }
    (worker_64, managed_64)
}

/// `--backlog`.
static BACKLOG: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Queues `--backlog` pending tasks of the executor `elsewhere`, which no worker here runs.
async fn queue_backlog(store: &TaskStore) {
    use futures::StreamExt as _;
    let n = BACKLOG.load(Ordering::Relaxed);
    futures::stream::iter(0..n)
        .map(|i| {
            let store = store.clone();
            async move {
                let spec = TaskSpec {
                    id: format!("backlog-{i:07}"),
                    executor_key: "elsewhere".into(),
                    ..TaskSpec::default()
                };
                store
                    .create(dtask::engine::CreateRequest {
                        spec,
                        policy: Some(LeasePolicy::Retry),
                        ..dtask::engine::CreateRequest::default()
                    })
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(256)
        .collect::<Vec<()>>()
        .await;
}

/// `--no-inline`.
static NO_INLINE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Not `--finished-in-place`.
static APART: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// The journal's options as the flags set them.
fn journal_options() -> JournalOptions {
    common::journal_options()
        .with_inline_lone_appends(!NO_INLINE.load(std::sync::atomic::Ordering::Relaxed))
        .with_keep_finished_apart(APART.load(std::sync::atomic::Ordering::Relaxed))
}

fn main() {
    let args = Args::parse();
    NO_INLINE.store(args.no_inline, std::sync::atomic::Ordering::Relaxed);
    BACKLOG.store(args.backlog, Ordering::Relaxed);
    args.journal.apply();
    APART.store(
        !args.finished_in_place,
        std::sync::atomic::Ordering::Relaxed,
    );
    let fsync = fsync_p50();
    println!(
        "workflow: tasks of {} steps (progress updates the executor waits for, synced) started with \
         Manager::run_now, or submitted for a worker; {} s per row; one fsync here: {:.3} ms (p50)",
        args.steps,
        args.secs,
        ms(fsync)
    );
    println!(
        "{:>3} {:>6} {:>12} {:>10} {:>10} {:>10} {:>12}",
        "C", "steps", "steps/s", "tasks/s", "p50 ms", "p99 ms", "ms per step"
    );
    let rows: Vec<usize> = args.callers.map_or_else(|| vec![1, 16, 64], |c| vec![c]);
    let mut at_64 = None;
    let mut step_at_1 = None;
    for callers in rows {
        let (tasks, mut latencies) = row(callers, args.steps, args.secs);
        latencies.sort();
        let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
        let steps = tasks * f64::from(args.steps);
        let per_step = ms(p50) / f64::from(args.steps);
        println!(
            "{callers:>3} {:>6} {steps:>12.0} {tasks:>10.0} {:>10.3} {:>10.3} {per_step:>12.3}",
            args.steps,
            ms(p50),
            ms(p99)
        );
        if callers == 64 {
            at_64 = Some(steps);
        }
        if callers == 1 {
            step_at_1 = Some(per_step);
        }
    }
    let (worker_64, managed_64) = other_rows(&args);
    let mut one_p50 = Duration::ZERO;
    for (through, label) in [
        (Through::RunNow, ""),
        (Through::Executor, "  (submit + worker)"),
    ] {
        let (one_tasks, mut one) = row_through(through, 1, 1, args.secs.min(2.0));
        one.sort();
        let p50 = percentile(&one, 0.5);
        if through == Through::RunNow {
            one_p50 = p50;
        }
        println!(
            "  1      1 {:>12.0} {one_tasks:>10.0} {:>10.3} {:>10.3}{label}",
            one_tasks,
            ms(p50),
            ms(percentile(&one, 0.99))
        );
    }
    if let Some(steps) = at_64 {
        println!(
            "target: ≥ 60k durable steps/s at C = 64 ({steps:.0}): {}",
            common::verdict(steps >= 60_000.0)
        );
    }
    if let Some(steps) = worker_64 {
        println!("info: submitted for a worker at C = 64: {steps:.0} durable steps/s");
    }
    if let Some(steps) = managed_64 {
        println!("info: through a managed tool at C = 64: {steps:.0} durable steps/s");
    }
    if let Some(per_step) = step_at_1 {
        println!(
            "target: a step at C = 1 ≤ 1.5× one fsync ({per_step:.3} ms against {:.3} ms, {:.2}×): {}",
            ms(fsync),
            per_step / ms(fsync),
            common::verdict(per_step <= 1.5 * ms(fsync))
        );
    }
    println!(
        "target: a 1-step task at C = 1, p50 ≤ 0.8 ms ({:.3} ms): {}",
        ms(one_p50),
        common::verdict(one_p50 <= Duration::from_micros(800))
    );
}

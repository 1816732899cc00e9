//! The engine process the torture driver kills: a Manager, a Worker and the managed tools on
//! the torture journal, running a mixed workload until it is killed (or drains, or — in the
//! finish run — until every task is terminal).
//!
//! Everything the child was acknowledged is written to the acknowledgement log *after* the
//! acknowledgement, one line each: `created`, `cancel`, `resume`, `purged`, `trimmed` (by the workload)
//! and `update` (by the output materializer, which only ever sees persisted updates). The
//! checker then proves that each of them is in the journal. Now and then the workload purges
//! a task of its run that ended: its records go, its tombstone stays; and trims a task's
//! progress (`trimmed`), running or ended, to its last update. The store caps running tasks'
//! progress too ([`PROGRESS_CAP`]): a long tick task is trimmed by its own updates as it runs.

use super::rng::Rng;
use super::Layout;
use crate::cli::{CliError, Result};
use dtask_engine::async_trait;
use dtask_engine::managed::tools::{ApprovalTool, ShellTool};
use dtask_engine::managed::{
    BackgroundTool, ManagedTools, OutputMaterializer, RecoverRequest, RecoverableTool,
    Registration, Run, RunOutcome, StartRequest, StartResult, ToolCall, ToolFailure, ToolRegistry,
    ToolRunError, Update, UpdateStream,
};
use dtask_engine::tool::ToolInfo;
use dtask_engine::{
    ExecutorRegistry, Manager, ManagerConfig, StoreConfig, SystemClock, TaskStore, Worker,
    WorkerConfig,
};
use dtask_replay::Status;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The tool names of the workload.
pub const SHELL: &str = "shell";
/// The plain tool (not recoverable: a lost lease fails its task).
pub const TICK: &str = "tick";
/// The resumable tool (answered later by the workload).
pub const APPROVAL: &str = "approval";
/// The recoverable tool that checks back later: a durable timer between its looks.
pub const POLL: &str = "poll";
/// How many times a poll task looks before its job is done (and how many timers it waits on).
pub const POLLS: u64 = 3;

/// The exit code of a finish run that timed out with tasks still live.
pub const UNFINISHED: i32 = 3;

/// Purges the oldest task of `created` that ended (looking at a few), logging the purge once
/// it is durable. Its notifications are consumed first, as a session's consumer would
/// (received and acknowledged): a task whose notification is still queued may not go.
async fn purge_one(
    store: &TaskStore,
    created: &mut std::collections::VecDeque<(String, String)>,
    acks: &Acks,
) {
    for _ in 0..created.len().min(4) {
        let Some((id, token)) = created.pop_front() else {
            return;
        };
        match store.get(&id).await {
            Ok(task) if task.is_terminal() => {
                if let Ok(queued) = store
                    .receive_notifications(256, Duration::from_secs(30))
                    .await
                {
                    for notification in queued {
                        let _ = store.ack_notification(&notification.receipt).await;
                    }
                }
                match store.purge(&id).await {
                    Ok(_) => acks.log(&["purged", &id, &token]),
                    Err(e) => eprintln!("torture-child: purge {id} refused: {e}"),
                }
                return;
            }
            // Not ended yet: looked at again later.
            Ok(_) => created.push_back((id, token)),
            Err(_) => {}
        }
    }
}

/// Arguments of the hidden `dtask torture-child` (started by `dtask torture`).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The torture directory.
    #[arg(long)]
    pub dir: PathBuf,
    /// The run's seed.
    #[arg(long)]
    pub seed: u64,
    /// The run's number (part of every token).
    #[arg(long)]
    pub run: u64,
    /// The lease duration, in milliseconds.
    #[arg(long)]
    pub lease_ms: u64,
    /// How many tasks to submit.
    #[arg(long, default_value_t = 4)]
    pub tasks: u64,
    /// Drain (close the manager) after this many milliseconds.
    #[arg(long)]
    pub drain_after_ms: Option<u64>,
    /// Submit nothing; answer every waiting task; exit once every task is terminal.
    #[arg(long)]
    pub finish: bool,
    /// How long a finish run may take, in seconds.
    #[arg(long, default_value_t = 120)]
    pub finish_timeout_secs: u64,
    /// The command of shell tasks (the side effect, which appends the token to the ledger).
    #[arg(long)]
    pub shell_command: String,
    /// The journal's PostgreSQL URL, when it is not in DIR/journal.
    #[arg(long)]
    pub postgres: Option<String>,
}

/// The append-only acknowledgement log.
#[derive(Debug)]
struct Acks(Mutex<std::fs::File>);

impl Acks {
    fn open(path: &Path) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(CliError::io(format!("opening {}", path.display())))?;
        Ok(Self(Mutex::new(file)))
    }

    /// Appends one line in a single write (an `O_APPEND` write of a short line is atomic).
    fn log(&self, fields: &[&str]) {
        let line = format!("{}\n", fields.join("\t"));
        let mut file = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(e) = file.write_all(line.as_bytes()) {
            eprintln!("torture-child: cannot log an acknowledgement: {e}");
        }
    }
}

/// The output materializer of the shell and tick tools: one transcript file per task,
/// idempotent by event id; every update it sees is logged as acknowledged.
#[derive(Debug)]
struct Transcripts {
    root: PathBuf,
    acks: Arc<Acks>,
}

#[async_trait]
impl OutputMaterializer for Transcripts {
    async fn reserve_output(&self, task_id: &str) -> std::result::Result<String, ToolFailure> {
        Ok(self.root.join(task_id).display().to_string())
    }

    async fn append_output(
        &self,
        task_id: &str,
        event_id: &str,
        path: &str,
        data: &[u8],
    ) -> std::result::Result<(), ToolFailure> {
        self.acks.log(&["update", task_id, event_id]);
        let existing = std::fs::read_to_string(path).unwrap_or_default();
        let prefix = format!("{event_id}\t");
        if existing.lines().any(|line| line.starts_with(&prefix)) {
            return Ok(());
        }
        let line = format!(
            "{event_id}\t{}\n",
            String::from_utf8_lossy(data).escape_default()
        );
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(|e| ToolFailure::with_source(e.to_string(), e))
    }
}

/// A recoverable tool polling a job that is done at its [`POLLS`]-th look: each look emits
/// one update and, until then, checks back after a short while (a durable timer: the task is
/// pending meanwhile, its next attempt recovers the tool from the look's number).
#[derive(Debug)]
struct PollTool;

/// One look of a poll task: the look's number and how long to wait after it.
#[derive(Debug)]
struct PollRun {
    look: u64,
    wait: Duration,
}

#[async_trait]
impl Run for PollRun {
    async fn wait(&self) -> std::result::Result<RunOutcome, ToolRunError> {
        Ok(if self.look + 1 >= POLLS {
            RunOutcome::Completed(format!("polled {POLLS} times").into_bytes())
        } else {
            RunOutcome::CheckBackIn {
                checkpoint: (self.look + 1).to_string().into_bytes(),
                after: self.wait,
            }
        })
    }

    async fn stop(&self) -> std::result::Result<(), ToolRunError> {
        Ok(())
    }

    fn updates(&self) -> Option<UpdateStream> {
        let update = Update {
            event_id: format!("poll:{}", self.look),
            kind: "poll".into(),
            data: format!("look {}", self.look).into_bytes(),
            metadata: std::collections::BTreeMap::new(),
        };
        Some(Box::pin(futures::stream::iter([Ok(update)])))
    }
}

/// A poll call's wait between looks: `{"wait_ms": N}`, N in 1..=10000.
fn poll_wait(arguments: &str) -> std::result::Result<Duration, ToolFailure> {
    let value: serde_json::Value =
        serde_json::from_str(arguments).map_err(|e| ToolFailure::with_source(e.to_string(), e))?;
    value
        .get("wait_ms")
        .and_then(serde_json::Value::as_u64)
        .filter(|n| (1..=10_000).contains(n))
        .map(Duration::from_millis)
        .ok_or_else(|| "\"wait_ms\" must be a number from 1 to 10000".into())
}

#[async_trait]
impl BackgroundTool for PollTool {
    fn validate_arguments(&self, arguments: &str) -> std::result::Result<(), ToolFailure> {
        poll_wait(arguments).map(drop)
    }

    async fn start(&self, request: StartRequest) -> std::result::Result<StartResult, ToolRunError> {
        Ok(StartResult {
            run: Arc::new(PollRun {
                look: 0,
                wait: poll_wait(&request.arguments)?,
            }),
            checkpoint: b"0".to_vec(),
        })
    }

    fn as_recoverable(&self) -> Option<&dyn RecoverableTool> {
        Some(self)
    }
}

#[async_trait]
impl RecoverableTool for PollTool {
    async fn recover(
        &self,
        request: RecoverRequest,
    ) -> std::result::Result<Arc<dyn Run>, ToolRunError> {
        let look = String::from_utf8_lossy(&request.checkpoint)
            .parse()
            .map_err(|_| ToolRunError::failed("a poll checkpoint is a look's number"))?;
        Ok(Arc::new(PollRun {
            look,
            wait: poll_wait(&request.arguments)?,
        }))
    }
}

/// A plain tool: emits `ticks` updates with event ids, then completes.
#[derive(Debug)]
struct TickTool;

/// The arguments of a tick call: `{"ticks": N}` with N in 1..=100.
fn tick_arguments(arguments: &str) -> std::result::Result<u64, ToolFailure> {
    let value: serde_json::Value =
        serde_json::from_str(arguments).map_err(|e| ToolFailure::with_source(e.to_string(), e))?;
    value
        .get("ticks")
        .and_then(serde_json::Value::as_u64)
        .filter(|n| (1..=100).contains(n))
        .ok_or_else(|| "\"ticks\" must be a number from 1 to 100".into())
}

/// The store's progress cap in every run, `(over, keep)`: the longer tick tasks are trimmed
/// while they run, by the update that takes them over it.
const PROGRESS_CAP: (u64, u64) = (8, 3);

/// How long a tick takes.
const TICK_EVERY: Duration = Duration::from_millis(25);

#[derive(Debug)]
struct TickRun {
    ticks: u64,
}

#[async_trait]
impl Run for TickRun {
    async fn wait(&self) -> std::result::Result<RunOutcome, ToolRunError> {
        tokio::time::sleep(TICK_EVERY * u32::try_from(self.ticks).unwrap_or(u32::MAX)).await;
        Ok(RunOutcome::Completed(
            format!("{} ticks", self.ticks).into_bytes(),
        ))
    }

    async fn stop(&self) -> std::result::Result<(), ToolRunError> {
        Ok(())
    }

    fn updates(&self) -> Option<UpdateStream> {
        let ticks = self.ticks;
        let stream = futures::stream::unfold(0, move |i| async move {
            if i >= ticks {
                return None;
            }
            tokio::time::sleep(TICK_EVERY).await;
            let update = Update {
                event_id: format!("tick:{i}"),
                kind: "tick".into(),
                data: format!("tick {i}").into_bytes(),
                metadata: std::collections::BTreeMap::new(),
            };
            Some((Ok::<_, ToolFailure>(update), i + 1))
        });
        Some(Box::pin(stream))
    }
}

#[async_trait]
impl BackgroundTool for TickTool {
    fn validate_arguments(&self, arguments: &str) -> std::result::Result<(), ToolFailure> {
        tick_arguments(arguments).map(drop)
    }

    async fn start(&self, request: StartRequest) -> std::result::Result<StartResult, ToolRunError> {
        let ticks = tick_arguments(&request.arguments)?;
        Ok(StartResult {
            run: Arc::new(TickRun { ticks }),
            checkpoint: Vec::new(),
        })
    }
}

fn tools(layout: &Layout, acks: &Arc<Acks>) -> Result<ManagedTools> {
    let transcripts: Arc<dyn OutputMaterializer> = Arc::new(Transcripts {
        root: layout.transcripts(),
        acks: Arc::clone(acks),
    });
    let mut registry = ToolRegistry::new();
    let registrations = [
        Registration::new(
            ToolInfo::new(
                SHELL,
                "run a shell command (recoverable)",
                ShellTool::parameters(),
            ),
            ShellTool::new(layout.runs()),
        )
        .with_materializer(Arc::clone(&transcripts)),
        Registration::new(
            ToolInfo::without_parameters(TICK, "tick a few times (plain)"),
            TickTool,
        )
        .with_materializer(Arc::clone(&transcripts)),
        Registration::new(
            ToolInfo::without_parameters(POLL, "poll a job, checking back later (recoverable)"),
            PollTool,
        )
        .with_materializer(transcripts),
        Registration::new(
            ToolInfo::new(
                APPROVAL,
                "ask and wait for the answer (resumable)",
                ApprovalTool::parameters(),
            ),
            ApprovalTool,
        ),
    ];
    for registration in registrations {
        registry
            .register(registration)
            .map_err(|e| CliError::Usage(e.to_string()))?;
    }
    Ok(ManagedTools::new(registry))
}

/// Quotes `text` for `sh`.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The tool call of one new task.
fn call(rng: &mut Rng, token: &str, layout: &Layout, shell_command: &str) -> ToolCall {
    let (tool, arguments) = match rng.range(0, 10) {
        0..=4 => {
            let command = format!(
                "export DTASK_TORTURE_TOKEN={} DTASK_TORTURE_LEDGER={}; {shell_command}",
                quote(token),
                quote(&layout.ledger().display().to_string()),
            );
            (
                SHELL,
                serde_json::json!({ "command": command, "token": token }),
            )
        }
        5..=6 => (
            TICK,
            // One in four ticks long enough to go over the progress cap (more than 8).
            serde_json::json!({
                "ticks": if rng.chance(25) { rng.range(12, 24) } else { rng.range(1, 6) },
                "token": token
            }),
        ),
        7..=8 => (
            POLL,
            serde_json::json!({ "wait_ms": rng.range(20, 200), "token": token }),
        ),
        _ => (
            APPROVAL,
            serde_json::json!({ "question": format!("go ahead with {token}?"), "token": token }),
        ),
    };
    ToolCall {
        tool_name: tool.into(),
        arguments: arguments.to_string(),
        session_id: "torture".into(),
        notify_session: true,
        ..ToolCall::default()
    }
}

/// Runs `dtask torture-child`.
pub fn run(args: &Args) -> Result<()> {
    let armed = dtask_engine::failpoints::configure_from_env()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    for spec in &armed {
        eprintln!("torture-child: armed fail point {spec}");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(CliError::io("starting the runtime"))?;
    let code = runtime.block_on(workload(args))?;
    // Drop the runtime before exiting: the journal flushes when its last handle goes.
    drop(runtime);
    if code == 0 {
        Ok(())
    } else {
        std::process::exit(code)
    }
}

#[allow(clippy::too_many_lines, reason = "the workload reads best as one loop")]
async fn workload(args: &Args) -> Result<i32> {
    let layout = Layout::new(&args.dir, args.postgres.as_deref());
    let acks = Arc::new(Acks::open(&layout.acks())?);
    let lease = Duration::from_millis(args.lease_ms.max(50));
    // Odd runs keep finished streams apart, even ones do not (see `Layout::open_writer`).
    let journal = layout.open_writer(args.run % 2 == 1)?;
    let store = TaskStore::open(
        journal,
        SystemClock,
        // A tick task past 8 whole updates is trimmed to its last 3 as it runs.
        StoreConfig::default()
            .with_lease_duration(lease)
            .with_progress_cap(PROGRESS_CAP.0, PROGRESS_CAP.1),
    )?;
    let tools = tools(&layout, &acks)?;
    let mut runtime = ExecutorRegistry::new();
    tools
        .register_executors(&mut runtime)
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let manager = Manager::new(
        store.clone(),
        runtime,
        ManagerConfig::default().with_heartbeat_interval(lease / 4),
    );
    let sweeper = store.spawn_sweeper(lease / 4);
    let worker = Worker::new(
        manager.clone(),
        WorkerConfig::new([
            dtask_engine::managed::PLAIN_EXECUTOR_KEY,
            dtask_engine::managed::RECOVERABLE_EXECUTOR_KEY,
        ])
        .with_max_concurrent(8)
        .with_poll_interval(Duration::from_millis(50)),
    )
    .map_err(|e| CliError::Usage(e.to_string()))?;
    let (stop_worker, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(worker.run(async move {
        let _ = stopped.await;
    }));
    eprintln!("torture-child: run {} up", args.run);

    let mut rng = Rng::new(args.seed);
    let started = Instant::now();
    let finish_by = started + Duration::from_secs(args.finish_timeout_secs);
    let mut submitted = 0;
    // The tasks this run created, oldest first, with their tokens: purged once ended.
    let mut created: std::collections::VecDeque<(String, String)> =
        std::collections::VecDeque::new();
    let mut code = 0;
    loop {
        if args.finish {
            if store.journal().live_tasks().next().is_none() {
                break;
            }
            if Instant::now() > finish_by {
                let live: Vec<String> = store.journal().live_tasks().flatten().collect();
                eprintln!("torture-child: still live at the deadline: {live:?}");
                code = UNFINISHED;
                break;
            }
        } else {
            if submitted < args.tasks {
                let token = format!("r{}-t{submitted}", args.run);
                let call = call(&mut rng, &token, &layout, &args.shell_command);
                let tool = call.tool_name.clone();
                match tools.submit(&manager, call).await {
                    Ok(task) => {
                        acks.log(&["created", &task.spec.id, &tool, &token]);
                        created.push_back((task.spec.id.clone(), token.clone()));
                    }
                    Err(e) => eprintln!("torture-child: submit failed: {e}"),
                }
                submitted += 1;
            }
            if let Some(after) = args.drain_after_ms {
                if started.elapsed() >= Duration::from_millis(after) {
                    break;
                }
            }
        }
        // Answer waiting tasks, cancel now and then.
        let live: Vec<String> = store.journal().live_tasks().flatten().collect();
        for id in &live {
            let Ok(task) = store.get(id).await else {
                continue;
            };
            if task.status == Status::WaitingInput && (args.finish || rng.chance(30)) {
                match manager.resume(id, task.version, br#""yes""#.to_vec()).await {
                    Ok(_) => acks.log(&["resume", id]),
                    Err(e) => eprintln!("torture-child: resume {id} failed: {e}"),
                }
            }
        }
        if !args.finish && !live.is_empty() && rng.chance(8) {
            let pick = usize::try_from(rng.range(0, live.len() as u64 - 1)).unwrap_or(0);
            let id = live[pick].clone();
            let manager = manager.clone();
            let acks = Arc::clone(&acks);
            tokio::spawn(async move {
                // A task that finished by itself answers with its terminal state: only a
                // recorded cancel request is an acknowledged cancellation.
                if let Ok(state) = manager.request_cancel(&id, "torture").await {
                    if state.cancel_requested_at.is_some() {
                        acks.log(&["cancel", &id]);
                    }
                }
            });
        }
        if !args.finish && rng.chance(15) {
            purge_one(&store, &mut created, &acks).await;
        }
        if !args.finish && !created.is_empty() && rng.chance(10) {
            // A task of the run, running or ended, trimmed to its last update.
            let pick = usize::try_from(rng.range(0, created.len() as u64 - 1)).unwrap_or(0);
            if let Some((id, _)) = created.get(pick) {
                match store.trim_progress(id, 1).await {
                    Ok(trimmed) => {
                        if let Some((position, _)) = trimmed.marker {
                            acks.log(&["trimmed", id, &position.to_string()]);
                        }
                    }
                    Err(e) => eprintln!("torture-child: trim {id} refused: {e}"),
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.range(10, 40))).await;
    }
    let deadline = tokio::time::Instant::now() + lease * 4;
    if let Err(e) = manager.close(Some(deadline), "torture drain").await {
        eprintln!("torture-child: close: {e}");
    }
    let _ = stop_worker.send(());
    match worker.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("torture-child: worker: {e}"),
        Err(e) => eprintln!("torture-child: worker task: {e}"),
    }
    sweeper.abort();
    eprintln!("torture-child: run {} done ({code})", args.run);
    Ok(code)
}

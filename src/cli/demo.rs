//! `dtask demo [DIR]`: a sample workload on an embedded journal, run through
//! `dtask_engine::TaskStore` directly, then a narrative, a summary and the audit.
//!
//! Three fake tools: `shell` (runs a command, streams output), `approval` (asks for input and
//! waits), `fetch` (downloads, reports progress). The workload claims tasks, commits started
//! markers, appends progress updates with event ids, crashes mid-attempt (drops the store and
//! the journal), reopens and recovers, answers a waiting task, cancels one, and drains the
//! notification outbox. Then a conversation with a running agent task: a person sends it input
//! while it runs, it consumes the input and starts a nested sub-agent task whose completion
//! arrives in its mailbox. Last, the model-facing managed tool runs the real shell tool on the
//! same journal: one call answered in the foreground, one handed to a background task.

use super::fmt::{self, Table};
use super::location::At;
use super::{CliError, Global, Out, Result};
use dtask_engine::{
    Command, CreateRequest, StoreConfig, StoreError, SystemClock, TaskStore, UpdateRequest,
};
use dtask_journal::{Delivery, JournalOptions, LeasePolicy, TaskSpec};
use dtask_replay::TaskState;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `dtask demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where to create the journal (must not exist or be empty): a directory, or a PostgreSQL
    /// URL (`postgres://…`, a schema without a journal); kept afterwards. Default: a temporary
    /// directory, deleted at exit.
    #[arg(value_name = "DIR|URL")]
    dir: Option<PathBuf>,
}

/// The session that the demo's notifications are routed to.
const SESSION: &str = "agent-session-1";

/// The narrative, printed as it happens (or collected for `--json`).
struct Log {
    json: bool,
    /// The narrative's first failed write: it is not printed further.
    unwritten: Option<std::io::Error>,
    steps: Vec<Value>,
    /// The managed tool as the model is told about it (an OpenAI `tools` entry).
    managed_tool: Option<Value>,
}

impl Log {
    fn say(&mut self, task: &str, text: impl Into<String>) {
        use std::io::Write as _;
        let text = text.into();
        if !self.json && self.unwritten.is_none() {
            let mut stdout = std::io::stdout().lock();
            let written = if task.is_empty() {
                writeln!(stdout, "{text}")
            } else {
                writeln!(stdout, "  {task:<10} {text}")
            };
            // A closed pipe (`dtask demo | head`) or a full disk: the workload runs on to
            // its end (a kept journal is left whole), and the error is the demo's answer.
            self.unwritten = written.err();
        }
        self.steps.push(json!({ "task": task, "text": text }));
    }
}

fn spec(id: &str, tool: &str, payload: &Value, description: &str) -> CreateRequest {
    CreateRequest {
        spec: TaskSpec {
            id: id.into(),
            executor_key: tool.into(),
            kind: "tool_call".into(),
            payload: payload.to_string().into_bytes(),
            description: description.into(),
            output_file: String::new(),
            session_id: SESSION.into(),
            notify_session: true,
        },
        policy: Some(LeasePolicy::Retry),
        ..CreateRequest::default()
    }
}

fn update(attempt: u64, event_id: &str, kind: &str, data: &str) -> UpdateRequest {
    UpdateRequest {
        attempt,
        event_id: event_id.into(),
        kind: kind.into(),
        data: data.as_bytes().to_vec(),
        metadata: vec![("source".into(), "demo".into())],
        ..UpdateRequest::default()
    }
}

fn open(at: &At) -> Result<TaskStore> {
    let journal = at.open_writer(JournalOptions::default())?;
    Ok(TaskStore::open(
        journal,
        SystemClock,
        StoreConfig::default(),
    )?)
}

/// Runs a claimed attempt's `Start` and returns the running state.
async fn claim(store: &TaskStore, id: &str) -> Result<TaskState> {
    let state = store.get(id).await?;
    Ok(store.execute(id, state.version, Command::Start).await?)
}

#[allow(
    clippy::too_many_lines,
    reason = "the workload reads best as one story"
)]
async fn workload(at: &At, log: &mut Log) -> Result<()> {
    let mut store = open(at)?;
    let shell = |cmd: &str| json!({ "tool_name": "shell", "command": cmd });
    let fetch = |url: &str| json!({ "tool_name": "fetch", "url": url });
    let requests = [
        spec(
            "shell-1",
            "shell",
            &shell("cargo test"),
            "run the test suite",
        ),
        spec(
            "approve-1",
            "approval",
            &json!({ "tool_name": "approval", "question": "deploy v2 to production?" }),
            "ask the operator before deploying",
        ),
        spec(
            "fetch-1",
            "fetch",
            &fetch("https://example.com/dataset.csv"),
            "download the dataset",
        ),
        spec(
            "fetch-2",
            "fetch",
            &fetch("https://example.com/huge.iso"),
            "download an image",
        ),
        spec(
            "shell-2",
            "shell",
            &shell("cargo bench"),
            "run the benchmarks later",
        ),
    ];
    for request in requests {
        let id = request.spec.id.clone();
        let tool = request.spec.executor_key.clone();
        store.create(request).await?;
        log.say(
            &id,
            format!("created: a call of the `{tool}` tool, pending"),
        );
    }

    // shell-1: claim, started marker, progress, heartbeat, done.
    let t = claim(&store, "shell-1").await?;
    let t = store
        .execute(
            "shell-1",
            t.version,
            Command::CommitStart {
                checkpoint: br#"{"pid":4242,"cmd":"cargo test"}"#.to_vec(),
            },
        )
        .await?;
    log.say(
        "shell-1",
        "attempt 1 claimed; started marker committed (pid 4242)",
    );
    for (i, line) in ["running 42 tests", "test result: ok. 42 passed"]
        .iter()
        .enumerate()
    {
        let id = format!("shell-1/stdout/{}", i + 1);
        store
            .append_update("shell-1", update(t.attempt, &id, "stdout", line))
            .await?;
    }
    let t = store
        .execute("shell-1", t.version, Command::Heartbeat)
        .await?;
    let t = store
        .execute(
            "shell-1",
            t.version,
            Command::Complete {
                data: b"exit status 0".to_vec(),
            },
        )
        .await?;
    log.say(
        "shell-1",
        format!(
            "2 stdout updates, a heartbeat, then {} (version {})",
            t.status, t.version
        ),
    );

    // approve-1, attempt 1: ask and wait.
    let t = claim(&store, "approve-1").await?;
    let t = store
        .execute(
            "approve-1",
            t.version,
            Command::CommitStart {
                checkpoint: br#"{"ticket":"APR-7"}"#.to_vec(),
            },
        )
        .await?;
    let t = store
        .execute(
            "approve-1",
            t.version,
            Command::WaitInput {
                checkpoint: br#"{"ticket":"APR-7","question":"deploy v2 to production?"}"#.to_vec(),
            },
        )
        .await?;
    log.say(
        "approve-1",
        format!(
            "attempt 1 opened ticket APR-7 and asks the operator: {}",
            t.status
        ),
    );

    // fetch-1: claim, started marker, progress... then the process dies.
    let t = claim(&store, "fetch-1").await?;
    let t = store
        .execute(
            "fetch-1",
            t.version,
            Command::CommitStart {
                checkpoint: br#"{"download_id":"dl-91","resume_offset":0}"#.to_vec(),
            },
        )
        .await?;
    let first = update(
        t.attempt,
        "fetch-1/progress/1",
        "progress",
        "40% (4 MiB of 10 MiB)",
    );
    store.append_update("fetch-1", first.clone()).await?;
    log.say(
        "fetch-1",
        "attempt 1 claimed; started marker (download dl-91); progress update fetch-1/progress/1: 40%",
    );
    let before = store.get_task("fetch-1").await?;
    drop(store);
    log.say(
        "",
        "  ** crash ** the task store and the journal are dropped mid-attempt (nothing is flushed \
         beyond what was acknowledged)",
    );
    store = open(at)?;
    let after = store.get_task("fetch-1").await?;
    if after != before {
        return Err(CliError::Problems(
            "fetch-1 did not fold back to its state before the crash".into(),
        ));
    }
    let live = store.journal().live_tasks().count();
    log.say(
        "",
        format!(
            "  reopened: {} folded back from the journal; fetch-1 is identical to before the \
             crash ({}, version {}, attempt {}, {})",
            fmt::count(live as u64, "live task"),
            after.state.status,
            after.state.version,
            after.state.attempt,
            fmt::count(after.state.position, "record")
        ),
    );
    log.say(
        "fetch-1",
        "the started marker is durable: the worker recovers download dl-91 instead of starting it again",
    );
    let (original, fresh) = store.append_update("fetch-1", first).await?;
    log.say(
        "fetch-1",
        format!(
            "update fetch-1/progress/1 re-sent after recovery: {} (record at position {})",
            if fresh {
                "appended AGAIN"
            } else {
                "deduplicated"
            },
            original.position
        ),
    );
    if fresh {
        return Err(CliError::Problems(
            "a replayed update was appended twice".into(),
        ));
    }
    store
        .append_update(
            "fetch-1",
            update(
                after.state.attempt,
                "fetch-1/progress/2",
                "progress",
                "100% (10 MiB)",
            ),
        )
        .await?;
    let t = store
        .execute("fetch-1", after.state.version, Command::Heartbeat)
        .await?;
    let t = store
        .execute(
            "fetch-1",
            t.version,
            Command::Complete {
                data: b"/data/dataset.csv (10 MiB, sha256 9f2c...)".to_vec(),
            },
        )
        .await?;
    log.say(
        "fetch-1",
        format!("progress 100%, then {} on attempt {}", t.status, t.attempt),
    );

    // approve-1: the operator answers; attempt 2 picks the answer up.
    let t = store.get("approve-1").await?;
    let t = store
        .execute(
            "approve-1",
            t.version,
            Command::Resume {
                data: b"yes, go ahead".to_vec(),
                context_snapshot: None,
            },
        )
        .await?;
    log.say(
        "approve-1",
        format!("the operator answers \"yes, go ahead\": {}", t.status),
    );
    let t = store
        .execute("approve-1", t.version, Command::Start)
        .await?;
    let answer = t
        .pending_resume
        .as_deref()
        .map_or_else(|| "-".to_owned(), fmt::bytes);
    let t = store
        .execute(
            "approve-1",
            t.version,
            Command::Complete {
                data: b"approved: deploying v2".to_vec(),
            },
        )
        .await?;
    log.say(
        "approve-1",
        format!("attempt 2 receives the answer {answer} and is {}", t.status),
    );

    // fetch-2: canceled while running.
    let t = claim(&store, "fetch-2").await?;
    let t = store
        .execute(
            "fetch-2",
            t.version,
            Command::CommitStart {
                checkpoint: br#"{"download_id":"dl-92"}"#.to_vec(),
            },
        )
        .await?;
    let t2 = store
        .execute(
            "fetch-2",
            t.version,
            Command::RequestCancel {
                reason: "the user changed their mind".into(),
            },
        )
        .await?;
    let refused = match store
        .execute("fetch-2", t2.version, Command::Heartbeat)
        .await
    {
        Err(e @ StoreError::LeaseLost(_)) => e.to_string(),
        Err(e) => return Err(e.into()),
        Ok(_) => {
            return Err(CliError::Problems(
                "a canceled attempt kept its lease".into(),
            ))
        }
    };
    let t = store
        .execute(
            "fetch-2",
            t2.version,
            Command::AckCancel {
                reason: String::new(),
            },
        )
        .await?;
    log.say(
        "fetch-2",
        format!(
            "cancel requested while running; the worker's heartbeat is refused ({refused}); it \
             stops and acknowledges: {} ({:?})",
            t.status, t.result_error
        ),
    );
    log.say("shell-2", "left pending: no worker claims it in this demo");

    // The outbox: deliver and acknowledge every notification.
    let delivered = store
        .receive_notifications(100, Duration::from_secs(30))
        .await?;
    let kinds: Vec<String> = delivered
        .iter()
        .map(|n| format!("{}:{}", n.task_id, n.kind))
        .collect();
    for n in &delivered {
        store.ack_notification(&n.receipt).await?;
    }
    log.say(
        "",
        format!(
            "  outbox: {} delivered to {SESSION} and acknowledged ({})",
            fmt::count(delivered.len() as u64, "notification"),
            kinds.join(", ")
        ),
    );
    conversation_scene(&store, log).await?;
    managed_scene(&store, log).await
}

/// A conversation with a running task: input sent while it runs, consumed at a checkpoint, a
/// nested task started under the running attempt, and its completion arriving as input.
#[allow(clippy::too_many_lines, reason = "the scene reads best as one story")]
async fn conversation_scene(store: &TaskStore, log: &mut Log) -> Result<()> {
    use dtask_engine::{ExecutionContext, InputRequest};
    log.say(
        "",
        "
  a conversation with a running task (mailbox and a nested task):",
    );
    let say = |text: &str| InputRequest {
        event_id: format!("user-{}", text.len()),
        kind: "user_message".into(),
        data: text.as_bytes().to_vec(),
        delivery: dtask_journal::Delivery::Queued,
    };
    let agent = json!({ "tool_name": "agent", "goal": "migrate the staging database" });
    store
        .create(spec(
            "agent-1",
            "agent",
            &agent,
            "a sub-agent with its own tools",
        ))
        .await?;
    let running = claim(store, "agent-1").await?;
    for text in ["use the staging replica", "and keep a backup"] {
        let (input, _) = store.send_input("agent-1", say(text)).await?;
        log.say(
            "agent-1",
            format!(
                "input {} arrives while it runs: {text:?} (still {})",
                input.sequence,
                store.get("agent-1").await?.status
            ),
        );
    }
    let page = store.list_inputs("agent-1", 0, 10).await?;
    let running = store
        .execute(
            "agent-1",
            running.version,
            Command::CommitInput {
                expected_cursor: page.consumed,
                cursor: page.latest,
                checkpoint: br#"{"plan":"backup, then migrate the replica"}"#.to_vec(),
            },
        )
        .await?;
    log.say(
        "agent-1",
        format!(
            "reads {} and commits a checkpoint that consumed them (cursor {})",
            fmt::count(page.inputs.len() as u64, "input"),
            running.mailbox.consumed
        ),
    );
    let backup = json!({ "tool_name": "shell", "command": "pg_dump staging > backup.sql" });
    let mut child = spec("agent-1/backup", "shell", &backup, "back up the replica");
    child.spec.session_id = String::new();
    child.parent = Some(ExecutionContext {
        task_id: "agent-1".into(),
        attempt: running.attempt,
        generation: running.mailbox.generation,
    });
    store.create(child).await?;
    let c = claim(store, "agent-1/backup").await?;
    // The child tells its parent how far it got: an input of the parent's mailbox.
    store
        .enqueue_notification(
            "agent-1/backup",
            c.attempt,
            dtask_engine::NotificationRequest::new(
                "dumped",
                "backup_progress",
                br#"{"tables":12}"#.to_vec(),
            ),
        )
        .await?;
    // A warning the parent should read before anything else: sent to preempt.
    store
        .enqueue_notification(
            "agent-1/backup",
            c.attempt,
            dtask_engine::NotificationRequest::new(
                "disk-low",
                "backup_warning",
                br#"{"free":"9%"}"#.to_vec(),
            )
            .preempt(),
        )
        .await?;
    store
        .execute(
            "agent-1/backup",
            c.version,
            Command::Complete {
                data: br#"{"bytes":1048576}"#.to_vec(),
            },
        )
        .await?;
    let page = store
        .list_inputs("agent-1", running.mailbox.consumed, 10)
        .await?;
    let kinds: Vec<String> = page
        .inputs
        .iter()
        .map(|i| {
            let preempt = if i.delivery == Delivery::Preempt {
                " (preempt)"
            } else {
                ""
            };
            format!(
                "{} of {}{preempt}",
                i.kind,
                String::from_utf8_lossy(&i.data)
            )
        })
        .collect();
    log.say(
        "agent-1",
        format!(
            "started nested task agent-1/backup under attempt {}; its notifications and its \
             lifecycle arrive in the mailbox: {}",
            running.attempt,
            kinds.join(", ")
        ),
    );
    let done = store
        .execute(
            "agent-1",
            running.version,
            Command::CompleteIfNoInputs {
                cursor: running.mailbox.consumed,
                data: b"{}".to_vec(),
            },
        )
        .await;
    let state = match done {
        Err(dtask_engine::StoreError::InputsPending(state)) => *state,
        Err(e) => return Err(e.into()),
        Ok(_) => {
            return Err(CliError::Problems(
                "a completion ignored unread input".into(),
            ))
        }
    };
    log.say(
        "agent-1",
        format!(
            "tries to complete with unread input: refused, {} again for its next attempt",
            state.status
        ),
    );
    let again = claim(store, "agent-1").await?;
    let latest = again.mailbox.latest;
    let again = store
        .execute(
            "agent-1",
            again.version,
            Command::CommitInput {
                expected_cursor: again.mailbox.consumed,
                cursor: latest,
                checkpoint: br#"{"plan":"migrate the replica","backup":"done"}"#.to_vec(),
            },
        )
        .await?;
    let done = store
        .execute(
            "agent-1",
            again.version,
            Command::CompleteIfNoInputs {
                cursor: latest,
                data: br#"{"migrated":true}"#.to_vec(),
            },
        )
        .await?;
    log.say(
        "agent-1",
        format!(
            "attempt {} reads them and completes: {} (mailbox sealed, generation {})",
            done.attempt, done.status, done.mailbox.generation
        ),
    );
    Ok(())
}

/// The model-facing managed tool on the same journal, with the real shell tool: a quick call
/// answered in the foreground (nothing journaled), and a slow one handed to a background task
/// when its foreground time runs out — the same process, adopted, not started again.
async fn managed_scene(store: &TaskStore, log: &mut Log) -> Result<()> {
    use dtask_engine::managed::tools::ShellTool;
    use dtask_engine::managed::{
        CallOptions, CallOutcome, ManagedTool, ManagedToolConfig, ManagedTools, Registration,
        ToolRegistry,
    };
    let fail = |e: &dyn std::fmt::Display| CliError::Demo(e.to_string());
    let runs = tempfile::tempdir().map_err(CliError::io("creating a temporary directory"))?;
    let mut registry = ToolRegistry::new();
    registry
        .register(Registration::new(
            dtask_engine::tool::ToolInfo::new("sh", "Run a shell command", ShellTool::parameters()),
            ShellTool::new(runs.path()),
        ))
        .map_err(|e| fail(&e))?;
    let tools = ManagedTools::new(registry);
    let mut executors = dtask_engine::ExecutorRegistry::new();
    tools
        .register_executors(&mut executors)
        .map_err(|e| fail(&e))?;
    let manager = dtask_engine::Manager::new(
        store.clone(),
        executors,
        dtask_engine::ManagerConfig::default(),
    );
    let shell = ManagedTool::new(
        &tools,
        manager.clone(),
        "sh",
        ManagedToolConfig::default()
            .with_foreground_timeout(Duration::from_millis(300))
            .with_auto_background(|_| true),
    )
    .map_err(|e| fail(&e))?;
    let info = shell.info();
    let required: Vec<&str> = info.parameters["required"]
        .as_array()
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    log.say(
        "",
        format!(
            "\n  managed tool `sh` (the model is told it requires: {}; foreground first, 300 ms, \
             then background):",
            required.join(", ")
        ),
    );
    log.managed_tool = Some(info.to_openai_tool());
    let opts = CallOptions::default();
    for (label, command) in [
        ("quick", "echo hello"),
        ("slow", "for i in 1 2 3; do echo step $i; sleep 0.2; done"),
    ] {
        let args = json!({ "command": command }).to_string();
        let CallOutcome::Done(result) = shell.call(&args, &opts).await.map_err(|e| fail(&e))?
        else {
            return Err(fail(&"the shell tool never asks for input"));
        };
        let record = result.text();
        log.say(label, format!("-> {}", record.trim_end()));
        if let Some(id) = result.envelope.task_id() {
            manager.wait(id).await.map_err(|e| fail(&e))?;
            let task = store.get(id).await?;
            log.say(
                label,
                format!(
                    "the background task adopted the running command (no second start): {} at \
                     attempt {} with {}",
                    task.status,
                    task.attempt,
                    fmt::count(task.updates, "update")
                ),
            );
        }
    }
    manager
        .close(
            Some(tokio::time::Instant::now() + Duration::from_secs(5)),
            "demo over",
        )
        .await
        .map_err(|e| fail(&e))
}

/// Runs `dtask demo`.
pub fn run(global: &Global, args: &Args) -> Result<()> {
    if global.journal_flag {
        return Err(CliError::Usage(
            "demo does not take --journal: it makes a new journal, at DIR|URL when given \
             (`dtask demo DIR`), else in a temporary directory"
                .into(),
        ));
    }
    let started = std::time::Instant::now();
    let temp;
    let at = if let Some(dir) = &args.dir {
        let at = At::of(dir);
        if !at.is_new()? {
            return Err(CliError::Usage(format!(
                "{} is not empty: the demo needs a new journal",
                at.display()
            )));
        }
        at
    } else {
        temp = tempfile::tempdir().map_err(CliError::io("creating a temporary directory"))?;
        At::Dir(temp.path().join("journal"))
    };
    let mut log = Log {
        json: global.json,
        unwritten: None,
        steps: Vec::new(),
        managed_tool: None,
    };
    log.say(
        "",
        format!(
            "dtask demo: a sample workload on {} journal at {}{}\n",
            if at.dir().is_some() {
                "an embedded"
            } else {
                "a shared"
            },
            at.display(),
            if args.dir.is_some() {
                ""
            } else {
                " (temporary; pass a DIR to keep it)"
            }
        ),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(CliError::io("starting the runtime"))?;
    runtime.block_on(workload(&at, &mut log))?;
    drop(runtime);
    if let Some(e) = log.unwritten.take() {
        return Err(CliError::io("writing output")(e));
    }
    report(global, args, &at, &log, started)
}

/// Prints the summary table and the audit of the demo's journal.
fn report(
    global: &Global,
    args: &Args,
    at: &At,
    log: &Log,
    started: std::time::Instant,
) -> Result<()> {
    let journal = at.open_reader()?;
    let mut rows = Vec::new();
    for folded in dtask_replay::FoldViews::new(&journal, None) {
        let folded = folded?;
        if let Some(task) = folded.task {
            rows.push((task.state, folded.records));
        }
    }
    let audit = dtask_replay::audit_journal(&journal, &mut |_| {})?;
    let elapsed = started.elapsed();
    let mut out = Out::new();
    if global.json {
        let tasks: Vec<Value> = rows
            .iter()
            .map(|(s, records)| {
                json!({
                    "id": s.spec.id,
                    "tool": fmt::tool_name(&s.spec.payload),
                    "status": s.status.as_str(),
                    "attempt": s.attempt,
                    "version": s.version,
                    "updates": s.updates,
                    "records": records,
                })
            })
            .collect();
        out.json(&json!({
            "journal": at.display(),
            "kept": args.dir.is_some(),
            "steps": log.steps,
            "managed_tool": log.managed_tool,
            "tasks": tasks,
            "audit": audit,
        }))?;
    } else {
        let mut table = Table::new(&[
            "TASK", "TOOL", "STATUS", "ATTEMPTS", "VERSION", "UPDATES", "RECORDS", "RESULT",
        ]);
        for (s, records) in &rows {
            let result = if s.status == dtask_replay::Status::Completed {
                fmt::bytes(&s.result_data)
            } else if s.result_error.is_empty() {
                "-".to_owned()
            } else {
                format!("{:?}", s.result_error)
            };
            table.row(vec![
                s.spec.id.clone(),
                fmt::tool_name(&s.spec.payload).unwrap_or_default(),
                s.status.as_str().to_owned(),
                s.attempt.to_string(),
                s.version.to_string(),
                s.updates.to_string(),
                records.to_string(),
                result,
            ]);
        }
        out.line("")?;
        out.text(table.render(0))?;
        out.line("")?;
        for p in &audit.problems {
            out.line(format!("PROBLEM {p}"))?;
        }
        out.line(format!(
            "audit: {} ({}, {}, {}, last sequence {}; CRCs, hash chains, \
             legality of every stream, live/commit/outbox indexes)",
            if audit.is_clean() {
                "clean"
            } else {
                "PROBLEMS FOUND"
            },
            fmt::count(audit.tasks, "task"),
            fmt::count(audit.records, "record"),
            fmt::size(audit.bytes),
            audit.last_seq
        ))?;
        out.line(format!("done in {:.2} s", elapsed.as_secs_f64()))?;
        if let Some(dir) = &args.dir {
            // A URL's credentials are not printed (nor is it, then: it is the one given).
            let journal = match at {
                At::Dir(_) => shell_quoted(&dir.display().to_string()),
                At::Postgres(_) => "\"$URL\"".to_owned(),
            };
            out.line(format!(
                "\ninspect it: dtask --journal {journal} tasks | show fetch-1 | events fetch-1 | verify"
            ))?;
        }
    }
    out.flush()?;
    if audit.is_clean() {
        Ok(())
    } else {
        Err(CliError::Problems(
            "the demo's journal does not audit clean".into(),
        ))
    }
}

/// `text` as one word of a POSIX shell: as it is when it holds only characters no shell
/// reads specially, else in single quotes.
fn shell_quoted(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+,:=@%".contains(c));
    if plain {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

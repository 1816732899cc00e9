//! A recoverable shell tool: the command runs detached (its own session), with its output and
//! exit status in files under a directory named by the task id. `start` is idempotent by task
//! id (a second start reattaches; the command runs at most once even when the engine dies
//! inside `start`), and `recover` reattaches after the engine died; output
//! lines become updates whose event ids are their line numbers, so a recovered run replays
//! them and the journal drops the duplicates.

use crate::managed::conformance::OperationSnapshot;
use crate::managed::error::{ToolFailure, ToolRunError};
use crate::managed::tool::{
    AdoptRequest, AdoptResult, BackgroundTool, ForegroundHandoffTool, RecoverRequest,
    RecoverableTool, Run, RunOutcome, StartRequest, StartResult, Update, UpdateStream,
};
use async_trait::async_trait;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How often a shell run polls its files.
const POLL: Duration = Duration::from_millis(20);

/// How long a start waits for the spawned script to publish its pid.
const PID_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Deserialize)]
struct Arguments {
    command: String,
}

/// The recoverable shell tool. Arguments: `{"command": "<sh command>"}`.
#[derive(Debug, Clone)]
pub struct ShellTool {
    root: PathBuf,
}

impl ShellTool {
    /// A shell tool keeping its runs under `root` (one directory per task).
    #[must_use]
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The JSON Schema of the tool's arguments, for its [`ToolInfo`](crate::tool::ToolInfo):
    /// an object with a required string `command`.
    ///
    /// ```
    /// use dtask_engine::managed::tools::ShellTool;
    /// use dtask_engine::tool::ToolInfo;
    ///
    /// let info = ToolInfo::new("shell", "Run a shell command", ShellTool::parameters());
    /// assert_eq!(info.parameters["required"], serde_json::json!(["command"]));
    /// ```
    #[must_use]
    pub fn parameters() -> serde_json::Value {
        serde_json::json!({
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "description": "The command to run, with `sh -c` (must not be empty)."
                }
            },
            "required": ["command"]
        })
    }

    /// The directory of a task's run (its `pid`, `out` and `status` files).
    #[must_use]
    pub fn dir(&self, task_id: &str) -> PathBuf {
        self.root.join(sanitize(task_id))
    }

    /// What the backend holds for a task: the process id as the operation id, and the output
    /// lines so far as updates (for the recovery conformance kit).
    ///
    /// # Errors
    /// When the task has no run.
    pub fn snapshot(&self, task_id: &str) -> Result<OperationSnapshot, ToolFailure> {
        let dir = self.dir(task_id);
        let pid = std::fs::read_to_string(dir.join("pid")).map_err(io_failure)?;
        let out = std::fs::read(dir.join("out")).unwrap_or_default();
        let mut updates = Vec::new();
        let mut offset = 0;
        while let Some(end) = out
            .get(offset..)
            .and_then(|r| r.iter().position(|b| *b == b'\n'))
        {
            updates.push(line_update(
                updates.len() as u64,
                out.get(offset..offset + end).unwrap_or_default(),
            ));
            offset += end + 1;
        }
        Ok(OperationSnapshot {
            operation_id: pid.trim().to_owned(),
            updates,
        })
    }

    fn parse(arguments: &str) -> Result<Arguments, ToolFailure> {
        let args: Arguments = serde_json::from_str(arguments)
            .map_err(|e| ToolFailure::with_source(e.to_string(), e))?;
        if args.command.trim().is_empty() {
            return Err("command must not be empty".into());
        }
        Ok(args)
    }
}

fn sanitize(task_id: &str) -> String {
    task_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Output line `n` (from 0) as an update: event id `line:<n>`, kind `stdout`.
fn line_update(n: u64, text: &[u8]) -> Update {
    Update {
        event_id: format!("line:{n}"),
        kind: "stdout".into(),
        data: text.to_vec(),
        metadata: std::collections::BTreeMap::new(),
    }
}

/// An I/O error as a tool failure (its text is the message).
fn io_failure(e: std::io::Error) -> ToolFailure {
    ToolFailure::with_source(e.to_string(), e)
}

fn failed(e: std::io::Error) -> ToolRunError {
    io_failure(e).into()
}

#[async_trait]
impl BackgroundTool for ShellTool {
    fn validate_arguments(&self, arguments: &str) -> Result<(), ToolFailure> {
        Self::parse(arguments).map(drop)
    }

    async fn start(&self, request: StartRequest) -> Result<StartResult, ToolRunError> {
        let args = Self::parse(&request.arguments)?;
        let dir = self.dir(&request.task_id);
        let pid_file = dir.join("pid");
        if !pid_file.exists() {
            std::fs::create_dir_all(&dir).map_err(failed)?;
            // The command runs at most once per task: the script claims the directory (mkdir
            // is atomic) before it runs the command, and publishes its own pid (its session's
            // process group). A start that finds the claim taken — an earlier engine spawned
            // the script and died before the pid was published — spawns a no-op and waits for
            // the pid. The exit status is recorded atomically once the command ends.
            let script = format!(
                "mkdir claimed 2>/dev/null || exit 0; echo $$ > pid.tmp; mv pid.tmp pid; \
                 ({}) > out 2>&1; echo $? > status.tmp; mv status.tmp status",
                args.command
            );
            let child = std::process::Command::new("setsid")
                .args(["sh", "-c", &script])
                .current_dir(&dir)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .map_err(failed)?;
            // Reap the child in the background so it does not linger as a zombie while this
            // process lives; a dead engine leaves it to init.
            std::thread::spawn(move || {
                let mut child = child;
                let _ = child.wait();
            });
            crate::failpoints::point!(crate::failpoints::TOOL_START, |m| Err(
                ToolRunError::failed(m)
            ));
            let deadline = std::time::Instant::now() + PID_TIMEOUT;
            while !pid_file.exists() {
                if std::time::Instant::now() > deadline {
                    return Err(ToolRunError::failed("the command did not publish its pid"));
                }
                tokio::time::sleep(POLL).await;
            }
        }
        let pid = std::fs::read_to_string(&pid_file).map_err(failed)?;
        Ok(StartResult {
            run: Arc::new(ShellRun { dir }),
            checkpoint: format!("{{\"pid\":{}}}", pid.trim()).into_bytes(),
        })
    }

    fn as_recoverable(&self) -> Option<&dyn RecoverableTool> {
        Some(self)
    }

    fn as_handoff(&self) -> Option<&dyn ForegroundHandoffTool> {
        Some(self)
    }
}

#[async_trait]
impl ForegroundHandoffTool for ShellTool {
    /// The background task observes the same detached process, through a fresh run whose
    /// update stream starts from the first line (duplicates are dropped by event id).
    async fn adopt(&self, request: AdoptRequest) -> Result<AdoptResult, ToolRunError> {
        Self::parse(&request.arguments)?;
        Ok(AdoptResult {
            run: Arc::new(ShellRun {
                dir: self.dir(&request.task_id),
            }),
            tool_checkpoint: request.tool_checkpoint,
        })
    }
}

#[async_trait]
impl RecoverableTool for ShellTool {
    async fn recover(&self, request: RecoverRequest) -> Result<Arc<dyn Run>, ToolRunError> {
        let dir = self.dir(&request.task_id);
        if !dir.join("pid").exists() {
            return Err(ToolRunError::failed("no run to recover"));
        }
        Ok(Arc::new(ShellRun { dir }))
    }
}

/// A detached shell command, observed through its files.
#[derive(Debug)]
struct ShellRun {
    dir: PathBuf,
}

impl ShellRun {
    /// The command's process group (its session): the pid it published, never 0 or 1.
    fn group(&self) -> Result<rustix::process::Pid, ToolRunError> {
        let pid = std::fs::read_to_string(self.dir.join("pid")).map_err(failed)?;
        pid.trim()
            .parse::<i32>()
            .ok()
            .filter(|pid| *pid > 1)
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| ToolRunError::failed(format!("bad pid file: {:?}", pid.trim())))
    }

    /// Whether any process of the command's group is alive.
    fn group_alive(&self) -> Result<bool, ToolRunError> {
        match rustix::process::test_kill_process_group(self.group()?) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::SRCH) => Ok(false),
            Err(e) => Err(ToolRunError::failed(format!("look for the command: {e}"))),
        }
    }
}

fn read_status(dir: &Path) -> Option<i32> {
    std::fs::read_to_string(dir.join("status"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

#[async_trait]
impl Run for ShellRun {
    async fn wait(&self) -> Result<RunOutcome, ToolRunError> {
        loop {
            let stopped = self.dir.join("stopped").exists();
            if let Some(code) = read_status(&self.dir) {
                if stopped {
                    return Ok(RunOutcome::Canceled("stopped".into()));
                }
                let output = std::fs::read(self.dir.join("out")).unwrap_or_default();
                return Ok(if code == 0 {
                    RunOutcome::Completed(output)
                } else {
                    RunOutcome::Failed(format!("command exited with status {code}"))
                });
            }
            // A stopped command dies with the shell that would have written its status.
            if stopped && !self.group_alive()? {
                return Ok(RunOutcome::Canceled("stopped".into()));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn stop(&self) -> Result<(), ToolRunError> {
        if read_status(&self.dir).is_some() {
            return Ok(());
        }
        std::fs::write(self.dir.join("stopped"), b"").map_err(failed)?;
        // The command runs in its own session: signal its whole process group, directly
        // (with some `kill` builds a `kill -TERM -PGID` command line signals every process).
        match rustix::process::kill_process_group(self.group()?, rustix::process::Signal::TERM) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
            Err(e) => Err(ToolRunError::failed(format!("signal the command: {e}"))),
        }
    }

    fn updates(&self) -> Option<UpdateStream> {
        let dir = self.dir.clone();
        let stream = futures::stream::unfold(
            (dir, 0usize, 0u64, false),
            |(dir, offset, line, done)| async move {
                if done {
                    return None;
                }
                loop {
                    let finished = read_status(&dir).is_some();
                    let bytes = std::fs::read(dir.join("out")).unwrap_or_default();
                    let rest = bytes.get(offset..).unwrap_or_default();
                    if let Some(end) = rest.iter().position(|b| *b == b'\n') {
                        let update = line_update(line, rest.get(..end).unwrap_or_default());
                        return Some((Ok(update), (dir, offset + end + 1, line + 1, false)));
                    }
                    if finished {
                        if rest.is_empty() {
                            return None;
                        }
                        // A last line without a newline.
                        let update = line_update(line, rest);
                        return Some((Ok(update), (dir, bytes.len(), line + 1, true)));
                    }
                    tokio::time::sleep(POLL).await;
                }
            },
        );
        Some(Box::pin(stream))
    }
}

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
/// How long a stopped command has to end after SIGTERM before its group is killed.
const KILL_GRACE: Duration = Duration::from_secs(5);
/// The most bytes of the output in one update: a longer line is sent in parts of this
/// size, each an update of its own (the managed layer's bound of an update's data). The
/// output file is read this much at a time.
const PART: usize = crate::managed::MAX_UPDATE_DATA_BYTES;

#[derive(Debug, Deserialize)]
struct Arguments {
    command: String,
}

/// The recoverable shell tool. Arguments: `{"command": "<sh command>"}`.
#[derive(Debug, Clone)]
pub struct ShellTool {
    root: PathBuf,
    max_result: usize,
}

impl ShellTool {
    /// The most bytes of a completed command's result by default: 1 MiB, the store's default
    /// limit of a value (`StoreConfig::max_value_bytes`).
    pub const DEFAULT_MAX_RESULT_BYTES: usize = 1 << 20;

    /// A shell tool keeping its runs under `root` (one directory per task), its results at
    /// most [`ShellTool::DEFAULT_MAX_RESULT_BYTES`].
    #[must_use]
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            max_result: Self::DEFAULT_MAX_RESULT_BYTES,
        }
    }

    /// Sets the most bytes of a completed command's result: a longer output is not read
    /// whole — the result is its end (from the first line that begins within it, when one
    /// does), after a line saying how many bytes before it were not kept. Keep it within the
    /// store's limit of a value (`StoreConfig::max_value_bytes`), which fails a larger result.
    /// Every line of the output is an update either way.
    #[must_use]
    pub fn with_max_result_bytes(mut self, bytes: usize) -> Self {
        self.max_result = bytes;
        self
    }

    /// A run observing the command in `dir`.
    fn run(&self, dir: PathBuf) -> Arc<ShellRun> {
        Arc::new(ShellRun {
            dir,
            max_result: self.max_result,
        })
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

    /// The directory of a task's run (its `pid`, `out` and `status` files): the task id
    /// with every byte but ASCII letters, digits, `-` and `_` written `%XX` — one id, one
    /// directory (ids that differ only where a lossy name would replace characters, such as
    /// `job.1` and `job_1`, do not share a run). A name longer than 200 bytes (a file
    /// name's limit is 255) is cut into directories, each but the last ending in `+`, which
    /// the encoding never writes as it is.
    ///
    /// A run started by an earlier version, under the name that replaced each such byte by
    /// `_`, is found there only by a recovery whose checkpoint names that run's process (see
    /// [`RecoverableTool::recover`]): the lossy name may be another task's (`job_1`'s is
    /// `job.1`'s lossy name), so it is never taken on the name alone.
    #[must_use]
    pub fn dir(&self, task_id: &str) -> PathBuf {
        let encoded = encode(task_id);
        let mut dir = self.root.clone();
        let mut rest = encoded.as_str();
        while rest.len() > NAME_PART {
            // The encoding is ASCII: any byte is a character boundary.
            let (head, tail) = rest.split_at(NAME_PART - 1);
            dir.push(format!("{head}+"));
            rest = tail;
        }
        dir.push(rest);
        dir
    }

    /// The directory of the run a recovery reattaches to: the task's own ([`ShellTool::dir`]),
    /// else the directory an earlier version gave it under its lossy name — only when that
    /// directory's process is the one the task's started marker names (`checkpoint`,
    /// `{"pid":…}`): the proof that the run there is this task's and not another's whose id
    /// has the same lossy name.
    fn recovery_dir(&self, task_id: &str, checkpoint: &[u8]) -> Option<PathBuf> {
        let dir = self.dir(task_id);
        if dir.join("pid").exists() {
            return Some(dir);
        }
        let earlier = self.root.join(sanitize(task_id));
        let marker: serde_json::Value = serde_json::from_slice(checkpoint).ok()?;
        let pid = marker.get("pid")?.as_i64()?;
        let found = std::fs::read_to_string(earlier.join("pid")).ok()?;
        (earlier != dir && found.trim().parse::<i64>().ok() == Some(pid)).then_some(earlier)
    }

    /// What the backend holds for a task: the process id as the operation id, and the output
    /// lines so far as updates (for the recovery conformance kit).
    ///
    /// # Errors
    /// When the task has no run.
    pub fn snapshot(&self, task_id: &str) -> Result<OperationSnapshot, ToolFailure> {
        let dir = self.dir(task_id);
        let pid = std::fs::read_to_string(dir.join("pid")).map_err(io_failure)?;
        // The updates the run's stream makes of the output so far (whole lines, long ones
        // in parts).
        let mut tail = Tail {
            dir: dir.clone(),
            read: 0,
            pending: Vec::new(),
            n: 0,
            done: false,
        };
        let mut updates = Vec::new();
        while tail.read_more() {
            while let Some(data) = tail.next_part() {
                updates.push(line_update(tail.n, &data));
                tail.n += 1;
            }
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

/// The most bytes of one component of a run's directory.
const NAME_PART: usize = 200;

/// `task_id` as a file name: ASCII letters, digits, `-` and `_` as they are, every other byte
/// `%XX` (injective).
fn encode(task_id: &str) -> String {
    use std::fmt::Write as _;
    let mut name = String::with_capacity(task_id.len());
    for byte in task_id.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' {
            name.push(char::from(byte));
        } else {
            // Writing to a `String` cannot fail.
            let _ = write!(name, "%{byte:02X}");
        }
    }
    name
}

/// The name an earlier version gave a task's run: every character but ASCII letters,
/// digits, `-` and `_` replaced by `_` (two ids could share it, and a task whose id has none
/// of them has it as its own name).
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
                 (\n{}\n) > out 2>&1; echo $? > status.tmp; mv status.tmp status",
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
            run: self.run(dir),
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
            run: self.run(self.dir(&request.task_id)),
            tool_checkpoint: request.tool_checkpoint,
        })
    }
}

#[async_trait]
impl RecoverableTool for ShellTool {
    async fn recover(&self, request: RecoverRequest) -> Result<Arc<dyn Run>, ToolRunError> {
        let dir = self
            .recovery_dir(&request.task_id, &request.checkpoint)
            .ok_or_else(|| ToolRunError::failed("no run to recover"))?;
        Ok(self.run(dir))
    }
}

/// A detached shell command, observed through its files.
#[derive(Debug)]
struct ShellRun {
    dir: PathBuf,
    /// The most bytes of the result ([`ShellTool::with_max_result_bytes`]).
    max_result: usize,
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

/// The command's output as its updates read it: what was read of the file past the
/// updates made so far, the file read on from where it was (not from its start at each line).
struct Tail {
    dir: PathBuf,
    /// Bytes of the file read so far.
    read: u64,
    /// Read, and not yet in an update.
    pending: Vec<u8>,
    /// The updates made so far (the next one's number: `line:<n>`).
    n: u64,
    /// The last update is made.
    done: bool,
}

impl Tail {
    /// The next update's data, if `pending` holds one: a whole line (without its newline),
    /// or the first [`PART`] bytes of a longer one.
    fn next_part(&mut self) -> Option<Vec<u8>> {
        let newline = self.pending.iter().take(PART + 1).position(|b| *b == b'\n');
        match newline {
            Some(end) => {
                let mut line: Vec<u8> = self.pending.drain(..=end).collect();
                line.pop();
                Some(line)
            }
            None if self.pending.len() >= PART => Some(self.pending.drain(..PART).collect()),
            None => None,
        }
    }

    /// Reads what the file holds past what was read, at most [`PART`] bytes of it (a
    /// command that wrote gigabytes is not read whole into memory); whether anything was.
    fn read_more(&mut self) -> bool {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut file) = std::fs::File::open(self.dir.join("out")) else {
            return false;
        };
        if file.seek(SeekFrom::Start(self.read)).is_err() {
            return false;
        }
        let before = self.pending.len();
        let _ = file.take(PART as u64).read_to_end(&mut self.pending);
        let got = self.pending.len() - before;
        self.read += got as u64;
        got > 0
    }
}

/// The result of a command that wrote `out`: the whole output when it has at most `max`
/// bytes; else its end — from the first line that begins within the last bytes kept, when
/// one does — after a line saying how many bytes before it were not kept, `max` bytes at
/// most in all. Only what is kept is read.
fn read_result(out: &Path, max: usize) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(out)?;
    let len = file.metadata()?.len();
    let max_len = u64::try_from(max).unwrap_or(u64::MAX);
    if len <= max_len {
        let mut output = Vec::new();
        file.take(max_len).read_to_end(&mut output)?;
        return Ok(output);
    }
    let note = |cut: u64| format!("[{cut} earlier bytes of the output were not kept]\n");
    // The longest note there can be, the one that counts every byte (none when even it has
    // no room: the end alone).
    let longest = note(len).len();
    let room = if longest < max { max - longest } else { max };
    let keep = u64::try_from(room).unwrap_or(u64::MAX);
    file.seek(SeekFrom::Start(len - keep))?;
    let mut end = Vec::with_capacity(room);
    file.take(keep).read_to_end(&mut end)?;
    if longest >= max {
        return Ok(end);
    }
    // Whole lines, when a line begins within the end.
    if let Some(newline) = end.iter().position(|b| *b == b'\n') {
        if newline + 1 < end.len() {
            end.drain(..=newline);
        }
    }
    let mut result = note(len - end.len() as u64).into_bytes();
    result.append(&mut end);
    Ok(result)
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
                return Ok(if code == 0 {
                    let output = read_result(&self.dir.join("out"), self.max_result);
                    RunOutcome::Completed(output.unwrap_or_default())
                } else {
                    RunOutcome::Failed(format!("command exited with status {code}"))
                });
            }
            if !self.group_alive()? {
                // A stopped command dies with the shell that would have written its status.
                if stopped {
                    return Ok(RunOutcome::Canceled("stopped".into()));
                }
                // The shell writes the status before it ends: gone without one (killed with
                // its group — a reboot, a service manager stopping the engine's whole
                // group), the command's outcome is unknown.
                if read_status(&self.dir).is_none() {
                    return Ok(RunOutcome::Failed(
                        "the command ended without an exit status (its process group was \
                         killed)"
                            .into(),
                    ));
                }
                continue;
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
        let group = self.group()?;
        match rustix::process::kill_process_group(group, rustix::process::Signal::TERM) {
            Ok(()) => {}
            Err(rustix::io::Errno::SRCH) => return Ok(()),
            Err(e) => return Err(ToolRunError::failed(format!("signal the command: {e}"))),
        }
        // A process that ignores or outlives SIGTERM is killed once the grace is over: a
        // stopped command does not run on, unseen, behind a canceled task.
        tokio::spawn(async move {
            tokio::time::sleep(KILL_GRACE).await;
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        });
        Ok(())
    }

    fn updates(&self) -> Option<UpdateStream> {
        let tail = Tail {
            dir: self.dir.clone(),
            read: 0,
            pending: Vec::new(),
            n: 0,
            done: false,
        };
        let stream = futures::stream::unfold(tail, |mut tail| async move {
            if tail.done {
                return None;
            }
            loop {
                if let Some(data) = tail.next_part() {
                    let update = line_update(tail.n, &data);
                    tail.n += 1;
                    return Some((Ok(update), tail));
                }
                // Whether the command has ended, asked before the read: then the read has
                // all of its output.
                let finished = read_status(&tail.dir).is_some();
                if tail.read_more() {
                    continue;
                }
                if finished {
                    if tail.pending.is_empty() {
                        return None;
                    }
                    // A last line without a newline.
                    let update = line_update(tail.n, &std::mem::take(&mut tail.pending));
                    tail.done = true;
                    return Some((Ok(update), tail));
                }
                tokio::time::sleep(POLL).await;
            }
        });
        Some(Box::pin(stream))
    }
}

#[cfg(test)]
mod tests {
    use super::{read_result, ShellTool};
    use std::path::Path;

    #[test]
    fn a_result_over_the_limit_is_the_outputs_end_from_a_whole_line() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let output = format!("{}\nsecond line\nthird\n", "a".repeat(100));
        std::fs::write(&out, &output).unwrap();
        // Within the limit: whole.
        assert_eq!(read_result(&out, 119).unwrap(), output.as_bytes());
        // Over it: the end from the first line that begins within it, with the note.
        let result = read_result(&out, 80).unwrap();
        assert_eq!(
            String::from_utf8(result).unwrap(),
            "[101 earlier bytes of the output were not kept]\nsecond line\nthird\n"
        );
        // No room for the note: the last bytes alone.
        assert_eq!(read_result(&out, 4).unwrap(), b"ird\n");
        // The tool's setter bounds its runs' results.
        let tool = ShellTool::new("/runs").with_max_result_bytes(64);
        assert_eq!(tool.max_result, 64);
    }

    #[test]
    fn each_task_id_has_a_directory_of_its_own_within_file_name_limits() {
        let tool = ShellTool::new("/runs");
        let ids = ["job.1", "job_1", "job%2E1", "a/b", "ä", "job-1"];
        let dirs: std::collections::BTreeSet<_> = ids.iter().map(|id| tool.dir(id)).collect();
        assert_eq!(dirs.len(), ids.len(), "{dirs:?}");
        assert_eq!(tool.dir("job.1"), Path::new("/runs/job%2E1"));
        assert_eq!(tool.dir("job_1"), Path::new("/runs/job_1"));
        // A long id: components of at most 200 bytes, none `.` or `..`, each but the last
        // ending in `+`; an id one byte longer does not land inside it.
        let long = "x".repeat(1000);
        let dir = tool.dir(&long);
        let parts: Vec<String> = dir
            .strip_prefix("/runs")
            .unwrap()
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        assert!(
            parts.len() > 1 && parts.iter().all(|p| p.len() <= 200),
            "{parts:?}"
        );
        assert!(parts[..parts.len() - 1].iter().all(|p| p.ends_with('+')));
        assert!(!parts.last().unwrap().contains('+'));
        let longer = tool.dir(&format!("{long}x"));
        assert!(!longer.starts_with(&dir), "{longer:?} inside {dir:?}");
    }
}

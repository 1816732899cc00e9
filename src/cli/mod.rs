//! The subcommands of `dtask`, one module each, and what they share: the argument parser, the
//! error type and exit codes, opening a journal read-only, output and progress bars.

mod codec;
mod demo;
mod events;
mod export;
mod fmt;
mod hold;
mod import;
mod interrupt;
mod location;
mod migrate;
mod outbox;
mod probe;
mod purge;
mod replay;
mod serve;
mod show;
mod stats;
mod tail;
mod tasks;
mod torture;
mod trim;
mod verify;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use dtask_journal::{Error as JournalError, Journal, Record};
use dtask_replay::FoldView;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// Inspect, verify, export and import dtask journals; run the demo workload.
#[derive(Debug, Parser)]
#[command(
    name = "dtask",
    version,
    about = "Inspect, verify, export and import dtask journals; run the demo workload and the crash torture",
    long_about = None
)]
pub struct Cli {
    /// The journal: a directory, or a PostgreSQL database (`postgres://user@host:port/db`,
    /// `?schema=NAME` for a schema other than `dtask`). The inspection commands open it
    /// read-only and never take the writer's lock.
    #[arg(long, global = true, env = "DTASK_JOURNAL", value_name = "DIR|URL")]
    journal: Option<PathBuf>,
    /// Print one JSON document (JSON lines for streams) instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// The subcommand.
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// List tasks (status is folded from each task's stream).
    Tasks(tasks::Args),
    /// Show one task: its folded state and a timeline of attempts, checkpoints, waits,
    /// updates, notifications and outcome.
    Show(show::Args),
    /// List a task's raw records: position, global sequence, time, type, CRC, chain digest.
    Events(events::Args),
    /// Export the journal (or some tasks) as versioned JSON lines in global commit order.
    Export(export::Args),
    /// Rebuild a fresh journal from a full export, verified bit-exact (same digests).
    Import(import::Args),
    /// Audit the journal: CRCs, hash chains, legality of every stream, indexes.
    Verify(verify::Args),
    /// Show a task as it was after a given position (time travel).
    Replay(replay::Args),
    /// Tasks by status and executor, records by type, bytes, largest tasks.
    Stats(stats::Args),
    /// The notifications queued and not yet acknowledged (the outbox), oldest first: task,
    /// session, kind, delivery.
    Outbox(outbox::Args),
    /// What a synced append promises where the journal lies: the file system, the device's
    /// write cache and the cost of a synced write (on PostgreSQL the server's settings and a
    /// flushed commit's cost); exit 1 when a synced record would not survive a power failure.
    Probe(probe::Args),
    /// Bring the journal's format (and a PostgreSQL journal's schema) up to this build's;
    /// `--check` only says whether anything is pending (exit 1 when it is).
    Migrate(migrate::Args),
    /// Place an operator's hold on a task (`--reason`), or lift it (`--lift`): a held task
    /// is not purged.
    Hold(hold::Args),
    /// Delete finished tasks' records (by name, or those that ended before a time), one
    /// tombstone kept a task; in atomic batches, resumable; `--dry-run` only counts.
    Purge(purge::Args),
    /// Drop the bytes of tasks' older progress updates (by name, or of those that ended
    /// before a time), every record and the hash chain kept; `--dry-run` only counts.
    Trim(trim::Args),
    /// Print the last records in global order, or follow a live journal.
    Tail(tail::Args),
    /// Run a sample workload on an embedded journal and show what happened.
    Demo(demo::Args),
    /// Serve an HTTP API, a live web view of the tasks and metrics (owner of the journal, or
    /// `--read-only` follower of one another process writes).
    Serve(serve::Args),
    /// Crash-recovery torture: kill a child engine at random moments (or at a fail point),
    /// restart it, repeat; then check that every invariant held.
    Torture(torture::Args),
    /// The child engine process of `dtask torture` (internal).
    #[command(hide = true)]
    TortureChild(torture::child::Args),
}

/// Errors of the command-line tool, each with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad arguments or input (exit 2).
    #[error("{0}")]
    Usage(String),
    /// An I/O error (exit 2).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// The journal could not be opened or read (exit 2; exit 1 for damage).
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// An audit could not run to its end (exit 2; damage is a finding, not this).
    #[error(transparent)]
    Audit(#[from] dtask_replay::AuditError),
    /// The task store failed (demo; exit 2).
    #[error(transparent)]
    Store(#[from] dtask_engine::StoreError),
    /// The demo's managed-tool scene failed (exit 2).
    #[error("demo: {0}")]
    Demo(String),
    /// JSON could not be written or read (exit 2).
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The HTTP server could not start or failed (exit 2).
    #[error(transparent)]
    Server(#[from] dtask::server::ServerError),
    /// The command ran and found problems, already reported (exit 1).
    #[error("{0}")]
    Problems(String),
    /// SIGINT or SIGTERM stopped the command, which undid what it had begun (exit 130).
    #[error("interrupted: {0}")]
    Interrupted(String),
}

impl CliError {
    /// The process exit code: 1 for problems found in a journal, 2 for usage and I/O errors,
    /// 130 when a signal stopped the command.
    fn exit_code(&self) -> u8 {
        match self {
            Self::Problems(_) => 1,
            Self::Journal(e) if e.is_damage() => 1,
            Self::Interrupted(_) => 130,
            _ => 2,
        }
    }

    fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Self::Io { context, source }
    }

    fn is_broken_pipe(&self) -> bool {
        matches!(self, Self::Io { source, .. } if source.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

/// A CLI result.
pub type Result<T, E = CliError> = std::result::Result<T, E>;

/// Options every subcommand sees.
#[derive(Debug, Clone)]
pub struct Global {
    /// `--journal` (or `DTASK_JOURNAL`).
    pub journal: Option<PathBuf>,
    /// Whether `--journal` was given on the command line (not only through the environment).
    pub journal_flag: bool,
    /// `--json`.
    pub json: bool,
}

impl Global {
    /// Where the journal is, required.
    fn at(&self) -> Result<location::At> {
        self.journal
            .as_deref()
            .map(location::At::of)
            .ok_or_else(|| {
                CliError::Usage(
                    "no journal given: pass --journal <DIR or postgres://…> (or set DTASK_JOURNAL)"
                        .into(),
                )
            })
    }

    /// Opens the journal read-only (no lock: works while a process writes it).
    fn open(&self) -> Result<Journal> {
        self.at()?.open_reader()
    }
}

/// Parses the arguments, runs the subcommand and maps the outcome to an exit code.
pub fn run() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let global = Global {
        journal: cli.journal,
        journal_flag: matches.value_source("journal") == Some(ValueSource::CommandLine),
        json: cli.json,
    };
    let outcome = match cli.command {
        Command::Tasks(args) => tasks::run(&global, &args),
        Command::Show(args) => show::run(&global, &args),
        Command::Events(args) => events::run(&global, &args),
        Command::Export(args) => export::run(&global, &args),
        Command::Import(args) => import::run(&global, &args),
        Command::Verify(args) => verify::run(&global, &args),
        Command::Replay(args) => replay::run(&global, &args),
        Command::Stats(args) => stats::run(&global, &args),
        Command::Outbox(args) => outbox::run(&global, &args),
        Command::Probe(args) => probe::run(&global, &args),
        Command::Migrate(args) => migrate::run(&global, &args),
        Command::Purge(args) => purge::run(&global, &args),
        Command::Hold(args) => hold::run(&global, &args),
        Command::Trim(args) => trim::run(&global, &args),
        Command::Tail(args) => tail::run(&global, &args),
        Command::Demo(args) => demo::run(&global, &args),
        Command::Serve(args) => serve::run(&global, &args),
        Command::Torture(args) => torture::run(&global, &args),
        Command::TortureChild(args) => torture::child::run(&args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_broken_pipe() => ExitCode::SUCCESS,
        Err(e) => {
            if !matches!(e, CliError::Problems(ref m) if m.is_empty()) {
                eprintln!("dtask: {e}");
            }
            if let CliError::Journal(JournalError::InUse { .. }) = e {
                eprintln!(
                    "dtask: the read-only commands (tasks, show, events, replay, stats, tail, \
                     verify, export, serve --read-only) work on it while it is held"
                );
            }
            ExitCode::from(e.exit_code())
        }
    }
}

/// Standard output, buffered; write errors (a closed pipe) surface as [`CliError::Io`].
pub struct Out {
    inner: std::io::BufWriter<std::io::StdoutLock<'static>>,
}

impl Out {
    /// Locks standard output.
    pub fn new() -> Self {
        Self {
            inner: std::io::BufWriter::new(std::io::stdout().lock()),
        }
    }

    /// Writes `text` and a newline.
    pub fn line(&mut self, text: impl AsRef<str>) -> Result<()> {
        writeln!(self.inner, "{}", text.as_ref()).map_err(CliError::io("writing output"))
    }

    /// Writes `text` as is.
    pub fn text(&mut self, text: impl AsRef<str>) -> Result<()> {
        self.inner
            .write_all(text.as_ref().as_bytes())
            .map_err(CliError::io("writing output"))
    }

    /// Writes a JSON document (pretty) and a newline, and flushes: a command's document is
    /// its whole answer, and one that could not be written is an error (exit 2), not
    /// output lost when the buffer is dropped.
    pub fn json(&mut self, value: &serde_json::Value) -> Result<()> {
        serde_json::to_writer_pretty(&mut self.inner, value)?;
        self.line("")?;
        self.flush()
    }

    /// Writes one JSON line.
    pub fn json_line(&mut self, value: &serde_json::Value) -> Result<()> {
        serde_json::to_writer(&mut self.inner, value)?;
        self.line("")
    }

    /// Flushes buffered output.
    pub fn flush(&mut self) -> Result<()> {
        self.inner.flush().map_err(CliError::io("writing output"))
    }
}

/// A progress bar on standard error, shown only when standard error is a terminal.
pub fn progress(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{msg} {bar:40} {pos}/{len} records ({per_sec}, {eta} left)")
    {
        bar.set_style(style);
    }
    bar.set_message(what.to_owned());
    bar
}

/// Reads and folds `task` for display, tolerating damage (the fold stops at the first
/// damaged or illegal record, and what stopped it is kept), handing every intact record to
/// `on_record`.
///
/// # Errors
/// Journal errors other than damage (I/O).
pub fn fold_task(
    journal: &Journal,
    task: &str,
    on_record: impl FnMut(&Record),
) -> Result<FoldView> {
    Ok(FoldView::read(journal, task, on_record)?)
}

/// Checks that the journal knows `task`; returns the length of its stream (a damaged last
/// record counts).
fn require_task(journal: &Journal, task: &str) -> Result<u64> {
    journal
        .stream_len(task)?
        .ok_or_else(|| CliError::Usage(format!("no task {task:?} in the journal")))
}

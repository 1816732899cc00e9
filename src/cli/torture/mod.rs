//! `dtask torture`: the crash-recovery torture driver (`docs/crash-testing.md`).
//!
//! With a seed, it starts a child engine process (`dtask torture-child`, this same binary)
//! that runs a mixed workload on a journal — recoverable shell tasks whose side effect appends
//! a token to a ledger file, plain tasks emitting updates with event ids, recoverable tasks
//! that poll and wait on durable timers between looks, resumable tasks answered later,
//! cancellations — and kills it with SIGKILL at a random moment (or lets it
//! abort at a chosen fail point), then starts the next one on the same journal, until the
//! requested number of crashes. After each crash it checks that nothing durable went missing.
//! A last child then lets everything finish, and the checker proves the invariants
//! ([`check::check`]). It prints a summary (`--json` for one document), progress on standard
//! error, and on failure a command that reproduces the run.

pub mod check;
pub mod child;
mod rng;

use super::fmt::count;
use super::{CliError, Global, Out, Result};
use dtask_engine::failpoints::{self, FailAction, FailPointSpec};
use rng::Rng;
use serde_json::json;
use std::fmt::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The side effect of a shell task by default: append the token to the ledger, then print a
/// few lines (updates with event ids) over a few tens of milliseconds.
pub const DEFAULT_SHELL_COMMAND: &str =
    "echo \"$DTASK_TORTURE_TOKEN\" >> \"$DTASK_TORTURE_LEDGER\"; \
     for i in 1 2 3 4; do echo \"line $i\"; sleep 0.03; done";

/// Arguments of `dtask torture`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The seed of the kill schedule and the workload (default: from the clock; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// How many crashes to inflict: SIGKILLs at random moments; with `--fail-point`, how many
    /// times the point must fire (runs that do not reach it are killed as usual).
    #[arg(long, default_value_t = 20)]
    pub kills: u64,
    /// Where to keep the journal, the ledger and the logs (must not exist or be empty).
    /// Default: a temporary directory, removed after a clean run and kept after a failure.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Also arm this fail point in every child (see `docs/crash-testing.md` for the names).
    #[arg(long, value_name = "NAME")]
    pub fail_point: Option<String>,
    /// What the fail point does: panic, error or abort.
    #[arg(long, default_value = "abort", value_name = "ACTION")]
    pub fail_action: String,
    /// The earliest moment of a kill after a child starts, in milliseconds.
    #[arg(long, default_value_t = 150)]
    pub min_ms: u64,
    /// The latest moment of a kill after a child starts, in milliseconds.
    #[arg(long, default_value_t = 900)]
    pub max_ms: u64,
    /// The lease duration of the children's store, in milliseconds.
    #[arg(long, default_value_t = 400)]
    pub lease_ms: u64,
    /// How many tasks each child submits.
    #[arg(long, default_value_t = 3)]
    pub tasks_per_run: u64,
    /// The side effect of shell tasks: a `sh` command that must append
    /// `$DTASK_TORTURE_TOKEN` to the file `$DTASK_TORTURE_LEDGER` once per run (point this at
    /// your own tool).
    #[arg(long, default_value = DEFAULT_SHELL_COMMAND, value_name = "CMD")]
    pub shell_command: String,
    /// How long the last child may take to bring every task to a terminal state, in seconds.
    #[arg(long, default_value_t = 120)]
    pub finish_timeout_secs: u64,
    /// Put the journal on PostgreSQL (`postgres://…?schema=NAME`, a schema without tasks)
    /// instead of DIR/journal.
    #[arg(long, value_name = "URL")]
    pub postgres: Option<String>,
    /// How many engine processes run at once on the journal (more than one needs
    /// `--postgres`): each is killed at random and replaced; their tasks are taken over by the
    /// others once their leases expire.
    #[arg(long, default_value_t = 1)]
    pub nodes: u64,
}

/// The files of a torture directory, and where its journal is.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
    postgres: Option<String>,
}

impl Layout {
    /// The layout under `root`, its journal in `root/journal` or, with `postgres`, in that
    /// database.
    pub fn new(root: &Path, postgres: Option<&str>) -> Self {
        Self {
            root: root.to_path_buf(),
            postgres: postgres.map(str::to_owned),
        }
    }

    /// The journal's directory (when it is not on PostgreSQL).
    pub fn journal(&self) -> PathBuf {
        self.root.join("journal")
    }

    /// The journal's PostgreSQL URL, if it is there.
    pub fn postgres(&self) -> Option<&str> {
        self.postgres.as_deref()
    }

    /// Opens the journal for writing, keeping finished streams apart or not
    /// ([`dtask_journal::JournalOptions::keep_finished_apart`]; the child runs alternate, so
    /// that kills land while streams move and streams stay whole across the switches).
    ///
    /// # Errors
    /// Journal errors.
    pub fn open_writer(&self, keep_finished_apart: bool) -> Result<dtask_journal::Journal> {
        let options =
            dtask_journal::JournalOptions::default().with_keep_finished_apart(keep_finished_apart);
        Ok(match &self.postgres {
            Some(url) => dtask_journal::Journal::open_postgres(url, options)?,
            None => dtask_journal::Journal::open(self.journal(), options)?,
        })
    }

    /// The shell tool's runs.
    pub fn runs(&self) -> PathBuf {
        self.root.join("runs")
    }

    /// The transcripts written by the output materializer.
    pub fn transcripts(&self) -> PathBuf {
        self.root.join("transcripts")
    }

    /// The acknowledgement log.
    pub fn acks(&self) -> PathBuf {
        self.root.join("acks.log")
    }

    /// The external ledger of side effects.
    pub fn ledger(&self) -> PathBuf {
        self.root.join("ledger")
    }

    /// The children's standard error, one file per run.
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }

    fn create(&self) -> Result<()> {
        for dir in [self.runs(), self.transcripts(), self.logs()] {
            std::fs::create_dir_all(&dir)
                .map_err(CliError::io(format!("creating {}", dir.display())))?;
        }
        Ok(())
    }
}

/// How a child run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Killed with SIGKILL by the driver.
    Killed,
    /// Aborted itself (a fail point with `abort`).
    Aborted,
    /// Panicked to death (a fail point with `panic` on the workload's own thread).
    Panicked,
    /// Drained and exited cleanly.
    Drained,
    /// Anything else: a violation.
    Failed(Option<i32>),
}

/// Counters of the crash loop.
#[derive(Debug, Default)]
struct Tally {
    runs: u64,
    sigkills: u64,
    aborts: u64,
    panics: u64,
    drains: u64,
    hits: u64,
    violations: Vec<String>,
}

impl Tally {
    fn crashes(&self) -> u64 {
        self.sigkills + self.aborts + self.panics
    }
}

/// The most hits a fail point lets pass before firing (chosen per run).
fn max_skip(point: &str) -> u64 {
    match point {
        failpoints::JOURNAL_BEFORE_WRITE
        | failpoints::JOURNAL_SYNC
        | failpoints::JOURNAL_AFTER_WRITE
        | failpoints::STORE_AFTER_APPEND => 12,
        failpoints::AFTER_UPDATE_PERSISTED => 6,
        failpoints::TOOL_START | failpoints::BEFORE_COMMIT_START => 2,
        _ => 0,
    }
}

fn validate(args: &Args) -> Result<Option<(String, FailAction)>> {
    if args.min_ms > args.max_ms {
        return Err(CliError::Usage(format!(
            "--min-ms {} is above --max-ms {}",
            args.min_ms, args.max_ms
        )));
    }
    if args.nodes == 0 || args.nodes > 16 {
        return Err(CliError::Usage("--nodes must be 1 to 16".into()));
    }
    if args.nodes > 1 && args.postgres.is_none() {
        return Err(CliError::Usage(
            "--nodes above 1 needs --postgres: an embedded journal has one writer process".into(),
        ));
    }
    if args.nodes > 1 && args.fail_point.is_some() {
        return Err(CliError::Usage(
            "--fail-point runs one node at a time: drop --nodes".into(),
        ));
    }
    if args.lease_ms < 50 {
        return Err(CliError::Usage("--lease-ms must be at least 50".into()));
    }
    let action: FailAction = args
        .fail_action
        .parse()
        .map_err(|e: failpoints::FailPointError| CliError::Usage(e.to_string()))?;
    let Some(point) = &args.fail_point else {
        return Ok(None);
    };
    if !failpoints::POINTS.contains(&point.as_str()) {
        return Err(CliError::Usage(format!(
            "unknown fail point {point:?}; the fail points are: {}",
            failpoints::POINTS.join(", ")
        )));
    }
    if !failpoints::ENABLED {
        return Err(CliError::Usage(
            failpoints::FailPointError::Disabled.to_string(),
        ));
    }
    Ok(Some((point.clone(), action)))
}

/// The command line that reproduces a run.
fn reproduce(args: &Args, seed: u64) -> String {
    let mut command = format!(
        "dtask torture --seed {seed} --kills {} --min-ms {} --max-ms {} --lease-ms {} --tasks-per-run {}",
        args.kills, args.min_ms, args.max_ms, args.lease_ms, args.tasks_per_run
    );
    if let Some(point) = &args.fail_point {
        let _ = write!(
            command,
            " --fail-point {point} --fail-action {}",
            args.fail_action
        );
    }
    if let Some(url) = &args.postgres {
        let _ = write!(command, " --postgres '{url}' --nodes {}", args.nodes);
    }
    if args.shell_command != DEFAULT_SHELL_COMMAND {
        let _ = write!(
            command,
            " --shell-command '{}'",
            args.shell_command.replace('\'', r"'\''")
        );
    }
    command
}

/// Starts one child run.
fn spawn(
    layout: &Layout,
    args: &Args,
    run: u64,
    seed: u64,
    drain_after: Option<u64>,
    fail: Option<&FailPointSpec>,
    finish: bool,
) -> Result<Child> {
    let exe = std::env::current_exe().map_err(CliError::io("finding this executable"))?;
    let log_path = layout.logs().join(format!("run-{run}.log"));
    let log = std::fs::File::create(&log_path)
        .map_err(CliError::io(format!("creating {}", log_path.display())))?;
    let mut command = std::process::Command::new(exe);
    command
        .arg("torture-child")
        .arg("--dir")
        .arg(&layout.root)
        .args(["--seed", &seed.to_string()])
        .args(["--run", &run.to_string()])
        .args(["--lease-ms", &args.lease_ms.to_string()])
        .args(["--tasks", &args.tasks_per_run.to_string()])
        .args([
            "--finish-timeout-secs",
            &args.finish_timeout_secs.to_string(),
        ])
        .args(["--shell-command", &args.shell_command])
        .args(
            layout
                .postgres()
                .map(|url| ["--postgres", url])
                .into_iter()
                .flatten(),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .env_remove(failpoints::ENV);
    if let Some(after) = drain_after {
        command.args(["--drain-after-ms", &after.to_string()]);
    }
    if finish {
        command.arg("--finish");
    }
    if let Some(spec) = fail {
        command.env(failpoints::ENV, spec.to_string());
    }
    command
        .spawn()
        .map_err(CliError::io("starting a child engine"))
}

/// Waits for `child` until `deadline`; `None` when it is still running then.
fn wait_until(child: &mut Child, deadline: Instant) -> Result<Option<ExitStatus>> {
    wait_for(child, deadline, || false)
}

/// Waits until `child` exits (its status), or until `deadline` passes or `done` says so
/// (`None`).
fn wait_for(
    child: &mut Child,
    deadline: Instant,
    mut done: impl FnMut() -> bool,
) -> Result<Option<ExitStatus>> {
    loop {
        if let Some(status) = child
            .try_wait()
            .map_err(CliError::io("waiting for a child engine"))?
        {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline || done() {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How long [`wait_until_up`] waits for a child engine's open before the run's time starts
/// anyway.
const UP_PATIENCE: Duration = Duration::from_secs(60);

/// Waits until child engine `run` says in its `log` that it is up (its store open, its
/// workload about to start), or has exited: its exit status then.
fn wait_until_up(child: &mut Child, log: &Path, run: u64) -> Result<Option<ExitStatus>> {
    let up = format!("torture-child: run {run} up");
    wait_for(child, Instant::now() + UP_PATIENCE, || {
        std::fs::read_to_string(log).is_ok_and(|said| said.lines().any(|line| line == up))
    })
}

/// Whether a child's `status` says SIGKILL ended it.
fn killed_by_sigkill(status: Option<ExitStatus>) -> bool {
    const SIGKILL: i32 = 9;
    status.and_then(|s| s.signal()) == Some(SIGKILL)
}

fn ending(status: ExitStatus) -> Ending {
    const SIGABRT: i32 = 6;
    const PANIC_EXIT: i32 = 101;
    match (status.code(), status.signal()) {
        (Some(0), _) => Ending::Drained,
        (Some(PANIC_EXIT), _) => Ending::Panicked,
        (_, Some(SIGABRT)) => Ending::Aborted,
        (code, _) => Ending::Failed(code),
    }
}

fn count_hits(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|line| line.starts_with(failpoints::HIT_PREFIX))
        .count() as u64
}

/// Compares the journal's heads with the last snapshot, then replaces the snapshot. A journal
/// that no child has created yet has no heads: nothing was acknowledged.
///
/// The heads and the streams they are checked against are read from one frozen view of the
/// journal: with several nodes the others keep writing while one's end is checked, and a
/// task purged between the read of its head and the read of its stream would otherwise look
/// like a stream that lost its records.
///
/// The acknowledgements logged since the last check are checked too, read before the
/// journal is opened (see [`check::AckLog`]).
fn check_heads(
    layout: &Layout,
    before: &mut check::Heads,
    acks: &mut check::AckLog,
    tally: &mut Tally,
) -> Result<()> {
    let lines = acks.read_new(layout)?;
    let Some(journal) = check::open_if_created(layout)? else {
        tally.violations.extend(
            before
                .keys()
                .map(|task| format!("task {task} vanished after a crash (no journal)")),
        );
        tally.violations.extend(
            lines
                .iter()
                .map(|line| format!("acknowledged {line:?} with no journal after a crash")),
        );
        before.clear();
        return Ok(());
    };
    let frozen = journal.frozen()?;
    let journal = frozen.journal();
    let now = check::heads(journal)?;
    tally
        .violations
        .extend(check::heads_grew(journal, before, &now));
    tally
        .violations
        .extend(check::acks_durable(journal, &lines));
    *before = now;
    Ok(())
}

/// The crash loop: child runs until `args.kills` crashes.
#[allow(
    clippy::too_many_lines,
    reason = "one run of the loop reads best in one place"
)]
fn crash_loop(
    layout: &Layout,
    args: &Args,
    seed: u64,
    fail: Option<&(String, FailAction)>,
) -> Result<Tally> {
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    let mut heads = check::Heads::new();
    let mut acks = check::AckLog::default();
    // Without a fail point every run ends in a crash (or a clean drain); with one, `kills`
    // counts the firings of the point, and runs that do not reach it are killed as usual.
    let enough = |tally: &Tally| match fail {
        None => tally.crashes() >= args.kills,
        Some(_) => tally.hits >= args.kills,
    };
    let max_runs = if fail.is_some() {
        args.kills * 10 + 10
    } else {
        args.kills * 3 + 10
    };
    while !enough(&tally) && tally.runs < max_runs {
        tally.runs += 1;
        let run = tally.runs;
        let delay = rng.range(args.min_ms, args.max_ms);
        let drains_here = fail.is_some_and(|(p, _)| p == failpoints::DRAIN);
        let drain_after =
            (drains_here || rng.chance(15)).then(|| rng.range(args.min_ms / 2, delay));
        let spec = fail.map(|(name, action)| FailPointSpec {
            name: name.clone(),
            action: *action,
            skip: rng.range(0, max_skip(name)),
        });
        let mut started = Instant::now();
        let mut child = spawn(
            layout,
            args,
            run,
            Rng::derive(seed, run),
            drain_after,
            spec.as_ref(),
            false,
        )?;
        let log = layout.logs().join(format!("run-{run}.log"));
        // With a fail point, a run's time counts from when its engine is up: the point is
        // in the workload, and on a loaded machine the open alone could take a short run's
        // whole time (a kill during the open is what runs without a fail point are for).
        if fail.is_some() && wait_until_up(&mut child, &log, run)?.is_none() {
            started = Instant::now();
        }
        // A drain may take a few leases to settle: give it that long before killing. With a
        // fail point, every other run lives a few leases longer, so that what the run before
        // left behind (expiring leases, pending recoveries) reaches the point.
        let patience = if drain_after.is_some() {
            Duration::from_millis(delay + args.lease_ms * 6)
        } else if fail.is_some() && run % 2 == 0 {
            Duration::from_millis(delay + args.lease_ms * 3)
        } else {
            Duration::from_millis(delay)
        };
        let mut end_status = None;
        let end = if let Some(status) = wait_until(&mut child, started + patience)? {
            end_status = Some(status);
            ending(status)
        } else {
            let _ = child.kill();
            child
                .wait()
                .map_err(CliError::io("waiting for a child engine"))?;
            Ending::Killed
        };
        let elapsed = started.elapsed().as_millis();
        let hits = count_hits(&log);
        tally.hits += hits;
        // A point whose action is `kill` ends its process with SIGKILL: a crash, as the
        // driver's own kills are.
        let end = match end {
            Ending::Failed(_) if hits > 0 && killed_by_sigkill(end_status) => Ending::Killed,
            end => end,
        };
        match end {
            Ending::Killed => tally.sigkills += 1,
            Ending::Aborted => tally.aborts += 1,
            Ending::Panicked => tally.panics += 1,
            Ending::Drained => tally.drains += 1,
            Ending::Failed(code) => tally.violations.push(format!(
                "child run {run} exited with {code:?} (see {})",
                log.display()
            )),
        }
        check_heads(layout, &mut heads, &mut acks, &mut tally)?;
        eprintln!(
            "torture: run {run}: {} after {elapsed} ms; crashes {}/{}{}",
            match end {
                Ending::Killed => "SIGKILL",
                Ending::Aborted => "aborted at the fail point",
                Ending::Panicked => "panicked",
                Ending::Drained => "drained and exited",
                Ending::Failed(_) => "FAILED",
            },
            tally.crashes(),
            args.kills,
            if tally.violations.is_empty() {
                String::new()
            } else {
                format!("; {}", count(tally.violations.len() as u64, "violation"))
            }
        );
    }
    if !enough(&tally) {
        tally.violations.push(format!(
            "only {} and {} in {}",
            count(tally.crashes(), "crash"),
            count(tally.hits, "fail-point firing"),
            count(tally.runs, "run")
        ));
    }
    finish(layout, args, seed, &mut tally, &mut heads, &mut acks)?;
    Ok(tally)
}

/// The finish run: no fail point, no kill; everything must reach a terminal state.
fn finish(
    layout: &Layout,
    args: &Args,
    seed: u64,
    tally: &mut Tally,
    heads: &mut check::Heads,
    acks: &mut check::AckLog,
) -> Result<()> {
    let run = tally.runs + 1;
    let mut child = spawn(layout, args, run, Rng::derive(seed, run), None, None, true)?;
    let deadline = Instant::now() + Duration::from_secs(args.finish_timeout_secs + 30);
    match wait_until(&mut child, deadline)? {
        Some(status) if status.success() => {}
        Some(status) => tally.violations.push(format!(
            "the finish run ended with {status} (see {})",
            layout.logs().join(format!("run-{run}.log")).display()
        )),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            tally
                .violations
                .push("the finish run did not end in time".into());
        }
    }
    check_heads(layout, heads, acks, tally)
}

/// The crash loop with `args.nodes` children at once on one shared journal: whenever one
/// ends (killed at its random moment, or drained), another starts, until `args.kills`
/// crashes; the last ones standing are killed too, then a finish run completes everything.
fn crash_loop_nodes(layout: &Layout, args: &Args, seed: u64) -> Result<Tally> {
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    let mut heads = check::Heads::new();
    let mut acks = check::AckLog::default();
    let nodes = usize::try_from(args.nodes).unwrap_or(1);
    let mut running: Vec<Option<(Child, u64, Instant)>> = (0..nodes).map(|_| None).collect();
    let max_runs = args.kills * 3 + 10;
    loop {
        let enough = tally.crashes() >= args.kills || tally.runs >= max_runs;
        for slot in &mut running {
            if slot.is_none() && !enough {
                tally.runs += 1;
                let run = tally.runs;
                let delay = rng.range(args.min_ms, args.max_ms);
                let child = spawn(layout, args, run, Rng::derive(seed, run), None, None, false)?;
                *slot = Some((child, run, Instant::now() + Duration::from_millis(delay)));
            }
        }
        if enough && running.iter().all(Option::is_none) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
        for slot in &mut running {
            let Some((child, run, deadline)) = slot.as_mut() else {
                continue;
            };
            let status = child
                .try_wait()
                .map_err(CliError::io("waiting for a child engine"))?;
            let end = match status {
                Some(status) => ending(status),
                None if Instant::now() >= *deadline || enough => {
                    let _ = child.kill();
                    child
                        .wait()
                        .map_err(CliError::io("waiting for a child engine"))?;
                    Ending::Killed
                }
                None => continue,
            };
            let run = *run;
            match end {
                Ending::Killed => tally.sigkills += 1,
                Ending::Drained => tally.drains += 1,
                Ending::Aborted => tally.aborts += 1,
                Ending::Panicked => tally.panics += 1,
                Ending::Failed(code) => tally.violations.push(format!(
                    "child run {run} exited with {code:?} (see {})",
                    layout.logs().join(format!("run-{run}.log")).display()
                )),
            }
            *slot = None;
            check_heads(layout, &mut heads, &mut acks, &mut tally)?;
            eprintln!(
                "torture: run {run} ({} nodes): {}; crashes {}/{}",
                nodes,
                if end == Ending::Killed {
                    "SIGKILL"
                } else {
                    "ended"
                },
                tally.crashes(),
                args.kills
            );
        }
    }
    finish(layout, args, seed, &mut tally, &mut heads, &mut acks)?;
    Ok(tally)
}

/// Runs `dtask torture`.
#[allow(clippy::too_many_lines, reason = "the summary has many lines")]
pub fn run(global: &Global, args: &Args) -> Result<()> {
    if global.journal_flag {
        return Err(CliError::Usage(
            "torture does not take --journal: it makes a new journal of its own, in DIR/journal \
             with --dir DIR (else in a temporary directory)"
                .into(),
        ));
    }
    let fail = validate(args)?;
    let started = Instant::now();
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| {
                d.as_secs() ^ u64::from(d.subsec_nanos()).rotate_left(32)
            })
    });
    let temp;
    let root = if let Some(dir) = &args.dir {
        let used = dir.exists()
            && std::fs::read_dir(dir)
                .map_err(CliError::io(format!("reading {}", dir.display())))?
                .next()
                .is_some();
        if used {
            return Err(CliError::Usage(format!(
                "{} is not empty: the torture run needs a new directory",
                dir.display()
            )));
        }
        temp = None;
        dir.clone()
    } else {
        let dir = tempfile::Builder::new()
            .prefix("dtask-torture-")
            .tempdir()
            .map_err(CliError::io("creating a temporary directory"))?;
        let path = dir.path().to_path_buf();
        temp = Some(dir);
        path
    };
    let layout = Layout::new(&root, args.postgres.as_deref());
    layout.create()?;
    if let Some(url) = &args.postgres {
        if !super::location::At::Postgres(url.clone()).is_new()? {
            return Err(CliError::Usage(format!(
                "{} holds tasks already: the torture run needs a schema of its own",
                super::location::At::Postgres(url.clone()).display()
            )));
        }
    }
    eprintln!(
        "torture: seed {seed}, {}{}, in {}",
        count(args.kills, "crash"),
        fail.as_ref()
            .map(|(p, a)| format!(" (fail point {p}: {a})"))
            .unwrap_or_default(),
        root.display()
    );
    let checked = if args.nodes > 1 {
        crash_loop_nodes(&layout, args, seed)
    } else {
        crash_loop(&layout, args, seed, fail.as_ref())
    }
    .and_then(|tally| Ok((tally, check::check(&layout)?)));
    let (tally, findings) = match checked {
        Ok(checked) => checked,
        Err(e) => {
            // The evidence stays: the run's directory is kept whatever stopped it.
            let _ = temp.map(tempfile::TempDir::keep);
            eprintln!(
                "torture: stopped by an error; the run's directory is kept: {}\nreproduce: {}",
                root.display(),
                reproduce(args, seed)
            );
            return Err(e);
        }
    };
    let mut violations = tally.violations.clone();
    violations.extend(findings.violations.iter().cloned());
    let wall = started.elapsed().as_secs_f64();
    let reproduce = reproduce(args, seed);
    let clean = violations.is_empty();
    let kept = !clean || args.dir.is_some();
    let dir_shown = if kept {
        // A failed run keeps its directory for inspection.
        let _ = temp.map(tempfile::TempDir::keep);
        Some(root.display().to_string())
    } else {
        None
    };
    let mut out = Out::new();
    if global.json {
        out.json(&json!({
            "seed": seed,
            "kills": tally.crashes(),
            "sigkills": tally.sigkills,
            "aborts": tally.aborts,
            "panics": tally.panics,
            "drains": tally.drains,
            "runs": tally.runs + 1,
            "fail_point": fail.as_ref().map(|(p, _)| p.clone()),
            "fail_action": fail.as_ref().map(|(_, a)| a.as_str()),
            "fail_point_hits": tally.hits,
            "tasks": findings.tasks,
            "by_status": findings.by_status,
            "by_tool": findings.by_tool,
            "records": findings.records,
            "updates": findings.updates,
            "max_attempts": findings.max_attempts,
            "acknowledged": findings.acknowledged,
            "side_effects": findings.side_effects,
            "timers": findings.timers,
            "purged": findings.purged,
            "trimmed": findings.trimmed,
            "violations": violations,
            "clean": clean,
            "wall_secs": (wall * 10.0).round() / 10.0,
            "dir": dir_shown,
            "nodes": args.nodes,
            "reproduce": reproduce,
        }))?;
    } else {
        out.line(format!(
            "torture: seed {seed}: {} ({} SIGKILL, {}, {}) and {} in {}",
            count(tally.crashes(), "crash"),
            tally.sigkills,
            count(tally.aborts, "abort"),
            count(tally.panics, "panic"),
            count(tally.drains, "clean drain"),
            count(tally.runs + 1, "run")
        ))?;
        if let Some((point, action)) = &fail {
            out.line(format!(
                "fail point {point} ({action}) fired {}",
                count(tally.hits, "time")
            ))?;
        }
        let statuses: Vec<String> = findings
            .by_status
            .iter()
            .map(|(s, n)| format!("{n} {s}"))
            .collect();
        let tools: Vec<String> = findings
            .by_tool
            .iter()
            .map(|(t, n)| format!("{n} {t}"))
            .collect();
        if findings.tasks == 0 {
            out.line("tasks: none (no child run submitted a task)")?;
        } else {
            out.line(format!(
                "tasks: {} ({}; {}), {}, {}, at most {} per task",
                findings.tasks,
                statuses.join(", "),
                tools.join(", "),
                count(findings.records, "record"),
                count(findings.updates, "update"),
                count(findings.max_attempts, "attempt")
            ))?;
        }
        out.line(format!(
            "checked: {}, {} in the ledger, {}, {}, {}, verify, terminal states, event ids, attempts",
            count(findings.acknowledged, "acknowledgement"),
            count(findings.side_effects, "side effect"),
            count(findings.timers, "durable timer"),
            count(findings.purged, "purged task"),
            count(findings.trimmed, "trimmed update")
        ))?;
        for violation in &violations {
            out.line(format!("VIOLATION {violation}"))?;
        }
        out.line(format!(
            "{} in {wall:.1} s",
            if clean {
                "no violations".to_owned()
            } else {
                count(violations.len() as u64, "violation").to_uppercase()
            }
        ))?;
        if let Some(dir) = &dir_shown {
            out.line(format!("kept: {dir}"))?;
        }
        if !clean {
            out.line(format!("reproduce: {reproduce}"))?;
        }
    }
    out.flush()?;
    if clean {
        Ok(())
    } else {
        Err(CliError::Problems(String::new()))
    }
}

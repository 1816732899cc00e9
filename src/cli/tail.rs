//! `dtask tail`: the last records in global commit order, or (`--follow`) every record a live
//! process commits, read as a follower (a RocksDB secondary: no lock, the writer runs on).
//!
//! A follower keeps its own files in a scratch directory (under the system's temporary
//! directory, `TMPDIR`), removed whenever `tail --follow` ends: at `--max` records, after
//! `--until-idle` without a new record, on SIGINT or SIGTERM, or on an error.

use super::codec::{self, Bytes};
use super::{fmt, CliError, Global, Out, Result};
use dtask_journal::{Committed, Journal};
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};

/// Arguments of `dtask tail`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Keep following: print new records as they are committed (until interrupted, or until
    /// `--max` or `--until-idle` says to stop).
    #[arg(long, short)]
    follow: bool,
    /// Without `--from-seq`, start with the last N records.
    #[arg(long, short = 'n', default_value_t = 10)]
    lines: u64,
    /// Start at this global sequence (every record from it on).
    #[arg(long, value_name = "SEQ")]
    from_seq: Option<u64>,
    /// How often to poll for new records with `--follow`, in milliseconds.
    #[arg(long, default_value_t = 250, value_name = "MS")]
    interval: u64,
    /// With `--follow`: exit after this many seconds without a new record (fractions allowed).
    #[arg(long, value_name = "SECS", requires = "follow", value_parser = parse_secs)]
    until_idle: Option<Duration>,
    /// With `--follow`: exit after printing N records.
    #[arg(long, value_name = "N", requires = "follow")]
    max: Option<u64>,
    /// With `--json`, replace payloads and data by their length.
    #[arg(long)]
    no_payload: bool,
}

fn parse_secs(text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .ok_or_else(|| format!("{text:?} is not a number of seconds"))
}

fn print(out: &mut Out, global: &Global, c: &Committed, bytes: Bytes) -> Result<()> {
    if global.json {
        return out.json_line(&codec::record_json(&c.task, &c.record, bytes)?);
    }
    let r = &c.record;
    out.line(format!(
        "{:>8}  {}  {}#{}  {}  {}",
        r.seq,
        fmt::time(r.event.at()),
        c.task,
        r.position,
        r.event.event_type(),
        fmt::summary(&r.event)
    ))
}

/// Prints the records from `from` on, at most `limit` of them; returns the next sequence to
/// read and how many records were printed.
fn drain(
    journal: &Journal,
    from: u64,
    limit: Option<u64>,
    out: &mut Out,
    global: &Global,
    bytes: Bytes,
) -> Result<(u64, u64)> {
    let mut next = from;
    let mut printed = 0;
    for item in journal.commits(from) {
        if limit.is_some_and(|limit| printed >= limit) {
            break;
        }
        let c = item?;
        print(out, global, &c, bytes)?;
        next = c.record.seq + 1;
        printed += 1;
    }
    out.flush()?;
    Ok((next, printed))
}

/// Runs `dtask tail`.
pub fn run(global: &Global, args: &Args) -> Result<()> {
    let at = global.at()?;
    let bytes = codec::bytes(args.no_payload);
    let mut out = Out::new();
    if !args.follow {
        let journal = global.open()?;
        let from = start(&journal, args)?;
        drain(&journal, from, None, &mut out, global, bytes)?;
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::io("starting the runtime"))?;
    runtime.block_on(follow(&at, args, &mut out, global, bytes))
}

/// The first sequence to print.
fn start(journal: &Journal, args: &Args) -> Result<u64> {
    Ok(match args.from_seq {
        Some(seq) => seq.max(1),
        None => journal.last_seq()?.saturating_sub(args.lines) + 1,
    })
}

/// `tail --follow`: polls the follower until a stop flag or a signal says to stop; the scratch
/// directory goes with it.
async fn follow(
    at: &super::location::At,
    args: &Args,
    out: &mut Out,
    global: &Global,
    bytes: Bytes,
) -> Result<()> {
    // The handlers come first: from then on SIGINT and SIGTERM end the loop instead of the
    // process, and the scratch directory is always removed.
    let mut interrupt =
        signal(SignalKind::interrupt()).map_err(CliError::io("installing a signal handler"))?;
    let mut terminate =
        signal(SignalKind::terminate()).map_err(CliError::io("installing a signal handler"))?;
    let scratch = tempfile::Builder::new()
        .prefix("dtask-tail-")
        .tempdir()
        .map_err(CliError::io("creating a scratch directory"))?;
    let journal = at.open_follower(scratch.path())?;
    let interval = Duration::from_millis(args.interval.max(10));
    let mut next = start(&journal, args)?;
    let mut printed = 0;
    let mut last_new = Instant::now();
    loop {
        journal.catch_up()?;
        let remaining = args.max.map(|max| max.saturating_sub(printed));
        let (after, new) = drain(&journal, next, remaining, out, global, bytes)?;
        next = after;
        printed += new;
        if new > 0 {
            last_new = Instant::now();
        }
        if args.max.is_some_and(|max| printed >= max) {
            break;
        }
        let mut wait = interval;
        if let Some(idle) = args.until_idle {
            let left = idle.saturating_sub(last_new.elapsed());
            if left.is_zero() {
                break;
            }
            wait = wait.min(left);
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
        }
    }
    drop(journal);
    scratch
        .close()
        .map_err(CliError::io("removing the scratch directory"))
}

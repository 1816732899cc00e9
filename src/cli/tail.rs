//! `dtask tail`: the last records in global commit order, or (`--follow`) every record a live
//! process commits, read as a follower (a RocksDB secondary: no lock, the writer runs on).

use super::codec::Bytes;
use super::export::record_line;
use super::{fmt, CliError, Global, Out, Result};
use dtask_journal::{Committed, Journal};
use std::time::Duration;

/// Arguments of `dtask tail`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Keep following: print new records as they are committed (until interrupted).
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
    /// With `--json`, replace payloads and data by their length.
    #[arg(long)]
    no_payload: bool,
}

fn print(out: &mut Out, global: &Global, c: &Committed, bytes: Bytes) -> Result<()> {
    if global.json {
        return out.json_line(&record_line(&c.task, &c.record, bytes));
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

/// Prints every record from `from` on; returns the next sequence to read.
fn drain(
    journal: &Journal,
    from: u64,
    out: &mut Out,
    global: &Global,
    bytes: Bytes,
) -> Result<u64> {
    let mut next = from;
    for item in journal.commits(from) {
        let c = item?;
        print(out, global, &c, bytes)?;
        next = c.record.seq + 1;
    }
    out.flush()?;
    Ok(next)
}

/// Runs `dtask tail`.
pub fn run(global: &Global, args: &Args) -> Result<()> {
    let dir = global.journal_dir()?;
    if !dir.is_dir() {
        return Err(CliError::Usage(format!(
            "no journal at {}: not a directory",
            dir.display()
        )));
    }
    let bytes = if args.no_payload {
        Bytes::Redact
    } else {
        Bytes::Base64
    };
    let start = |journal: &Journal| -> Result<u64> {
        Ok(match args.from_seq {
            Some(seq) => seq.max(1),
            None => journal.last_seq()?.saturating_sub(args.lines) + 1,
        })
    };
    let mut out = Out::new();
    if !args.follow {
        let journal = global.open()?;
        let from = start(&journal)?;
        drain(&journal, from, &mut out, global, bytes)?;
        return Ok(());
    }
    let scratch = tempfile::tempdir().map_err(CliError::io("creating a scratch directory"))?;
    let journal = Journal::open_follower(dir, scratch.path())?;
    let mut next = start(&journal)?;
    loop {
        journal.catch_up()?;
        next = drain(&journal, next, &mut out, global, bytes)?;
        std::thread::sleep(Duration::from_millis(args.interval.max(10)));
    }
}

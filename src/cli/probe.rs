//! `dtask probe`: what a synced append promises where the journal lies — for a directory its
//! file system, block device and write cache, and the cost of a synced write there; for
//! PostgreSQL the server's settings and the cost of a flushed commit (see
//! `dtask_journal::probe`). Exit 1 when a synced record would not survive a power failure.

use super::location::At;
use super::{CliError, Global, Out, Result};
use dtask_journal::postgres::{probe as pg, PgLocation};
use dtask_journal::probe::{time_syncs, Placement, SyncPromise, SyncTimes, Verdict};
use serde_json::json;
use std::time::Duration;

/// Arguments of `dtask probe`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// How many synced writes (or, on PostgreSQL, flushed commits) to time; 0 times none; at
    /// most 100,000.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    syncs: u32,
}

/// A duration as milliseconds with three decimals.
fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

/// The line of timed syncs.
fn times_line(what: &str, t: &SyncTimes) -> String {
    format!(
        "{what}: p50 {}, p99 {}, max {}, mean {} ({} timed)",
        ms(t.p50),
        ms(t.p99),
        ms(t.max),
        ms(t.mean),
        t.count,
    )
}

/// Prints the verdict's lines.
fn verdict_lines(out: &mut Out, verdict: &Verdict) -> Result<()> {
    out.line(format!(
        "verdict: {} — {}",
        verdict.promise.as_str(),
        verdict.why
    ))?;
    for note in &verdict.notes {
        out.line(format!("  note: {note}"))?;
    }
    Ok(())
}

/// A yes or no, or what the system did not say.
fn yes_no(flag: Option<bool>) -> &'static str {
    match flag {
        Some(true) => "yes",
        Some(false) => "no",
        None => "not told",
    }
}

/// Probes a directory.
fn probe_dir(global: &Global, dir: &std::path::Path, args: &Args) -> Result<Verdict> {
    let placement = Placement::examine(dir)?;
    let syncs = (args.syncs > 0)
        .then(|| time_syncs(dir, args.syncs))
        .transpose()?;
    let verdict = placement.verdict(syncs.as_ref());
    let mut out = Out::new();
    if global.json {
        out.json(&json!({
            "journal": dir.display().to_string(),
            "placement": placement,
            "syncs": syncs,
            "verdict": verdict,
        }))?;
    } else {
        if dir.canonicalize().ok().as_ref() == Some(&placement.dir) {
            out.line(format!("journal: {}", dir.display()))?;
        } else {
            out.line(format!(
                "journal: {} (not there yet: examined {}, where it would be created)",
                dir.display(),
                placement.dir.display()
            ))?;
        }
        match (&placement.filesystem, &placement.mount_point) {
            (Some(fs), Some(point)) => out.line(format!(
                "file system: {fs} from {}, mounted at {} ({})",
                placement.source.as_deref().unwrap_or("?"),
                point.display(),
                placement.options.join(",")
            ))?,
            _ => out.line("file system: not told by the system")?,
        }
        match &placement.device {
            Some(d) => out.line(format!(
                "device: {}{}, write cache: {}, forced unit access: {}, rotational: {}",
                d.name,
                d.model
                    .as_deref()
                    .map(|m| format!(" ({m})"))
                    .unwrap_or_default(),
                match d.write_cache {
                    Some(dtask_journal::probe::WriteCache::WriteBack) => "write back",
                    Some(dtask_journal::probe::WriteCache::WriteThrough) => "write through",
                    Some(_) | None => "not told",
                },
                yes_no(d.fua),
                yes_no(d.rotational),
            ))?,
            None => out.line("device: none seen")?,
        }
        if let Some(t) = &syncs {
            out.line(times_line("synced writes of 4 KiB", t))?;
        }
        verdict_lines(&mut out, &verdict)?;
    }
    out.flush()?;
    Ok(verdict)
}

/// Probes a PostgreSQL server.
fn probe_postgres(global: &Global, at: &At, url: &str, args: &Args) -> Result<Verdict> {
    let location = PgLocation::parse(url)?;
    let settings = pg::settings(&location)?;
    let commits = (args.syncs > 0)
        .then(|| pg::time_commits(&location, args.syncs))
        .transpose()?;
    let verdict = settings.verdict();
    let mut out = Out::new();
    if global.json {
        out.json(&json!({
            "journal": at.display(),
            "server": settings,
            "commits": commits,
            "verdict": verdict,
        }))?;
    } else {
        out.line(format!("journal: {}", at.display()))?;
        out.line(format!(
            "server: PostgreSQL {}, fsync {}, full_page_writes {}, wal_sync_method {}, data \
             checksums {}, default synchronous_commit {} (the journal's sessions set their own)",
            settings.version,
            if settings.fsync { "on" } else { "off" },
            if settings.full_page_writes {
                "on"
            } else {
                "off"
            },
            settings.wal_sync_method,
            yes_no(settings.data_checksums),
            settings.synchronous_commit,
        ))?;
        if let Some(t) = &commits {
            out.line(times_line("commits flushed", t))?;
        }
        verdict_lines(&mut out, &verdict)?;
    }
    out.flush()?;
    Ok(verdict)
}

/// Runs `dtask probe`.
pub fn run(global: &Global, args: &Args) -> Result<()> {
    let at = global.at()?;
    let verdict = match &at {
        At::Dir(dir) => probe_dir(global, dir, args)?,
        At::Postgres(url) => probe_postgres(global, &at, url, args)?,
    };
    if verdict.promise == SyncPromise::Lost {
        // Reported above; the exit code tells a script.
        return Err(CliError::Problems(String::new()));
    }
    Ok(())
}

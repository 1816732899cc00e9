//! `dtask stats`: tasks by status and executor, records by type, bytes, largest tasks, and
//! the storage engine's own figures (RocksDB: each column family's memtables, table files and
//! compaction work owed).

use super::fmt::{self, Table};
use super::{progress, Global, Out, Result};
use dtask_journal::probe::{Placement, Verdict};
use dtask_journal::{EventType, StorageStats};
use dtask_replay::FoldViews;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Arguments of `dtask stats`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// How many of the largest tasks to list.
    #[arg(long, default_value_t = 5)]
    top: usize,
}

#[derive(Debug, Default)]
struct Counts {
    records: u64,
    bytes: u64,
}

/// Sorts `sizes` largest first (ties by id) and keeps the first `top`.
fn largest_first(sizes: &mut Vec<(u64, u64, String)>, top: usize) {
    sizes.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.2.cmp(&b.2)));
    sizes.truncate(top);
}

/// Runs `dtask stats`.
#[allow(
    clippy::too_many_lines,
    reason = "one fold of every stream, then one document or its text"
)]
pub fn run(global: &Global, args: &Args) -> Result<()> {
    let journal = global.open()?;
    let last_seq = journal.last_seq()?;
    let bar = progress(last_seq, "scanning");
    let mut by_status: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_executor: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_type: BTreeMap<EventType, Counts> = BTreeMap::new();
    let mut sizes: Vec<(u64, u64, String)> = Vec::new();
    let (mut tasks, mut records, mut bytes, mut damaged) = (0u64, 0u64, 0u64, 0u64);
    let mut purged = 0u64;
    let mut views = FoldViews::new(&journal, None);
    while let Some(folded) = views.next_with(|r| {
        let c = by_type.entry(r.event.event_type()).or_default();
        c.records += 1;
        c.bytes += r.size as u64;
    }) {
        let folded = folded?;
        let id = folded.id().to_owned();
        bar.inc(folded.records);
        records += folded.records;
        bytes += folded.bytes;
        damaged += u64::from(folded.has_problems());
        if folded.purged.is_some() {
            // A purged task's tombstone: its records are counted, the task apart (as
            // `tasks` leaves it out and the server counts it).
            purged += 1;
            continue;
        }
        tasks += 1;
        let status = folded
            .task
            .as_ref()
            .map_or("unreadable", |t| t.state.status.as_str());
        *by_status.entry(status.to_owned()).or_default() += 1;
        let executor = folded
            .task
            .as_ref()
            .map_or_else(|| "?".to_owned(), |t| t.state.spec.executor_key.clone());
        *by_executor.entry(executor).or_default() += 1;
        if args.top > 0 {
            sizes.push((folded.bytes, folded.records, id));
            // Only the largest are kept: memory bounded by `--top`, not by the journal.
            if sizes.len() >= args.top.saturating_mul(2) {
                largest_first(&mut sizes, args.top);
            }
        }
    }
    bar.finish_and_clear();
    largest_first(&mut sizes, args.top);
    let storage = journal.storage_stats()?;
    let promise = sync_promise(global)?;
    let mut out = Out::new();
    if global.json {
        let types: BTreeMap<&str, Value> = by_type
            .iter()
            .map(|(t, c)| {
                (
                    t.as_str(),
                    json!({ "records": c.records, "bytes": c.bytes }),
                )
            })
            .collect();
        let largest: Vec<Value> = sizes
            .iter()
            .map(|(b, r, id)| json!({ "task": id, "records": r, "bytes": b }))
            .collect();
        out.json(&json!({
            "journal_format": journal.format_version(),
            "record_format": journal.record_format().version(),
            "postgres_schema": journal.schema_version(),
            "tasks": tasks,
            "purged": purged,
            "records": records,
            "bytes": bytes,
            "last_seq": last_seq,
            "tasks_with_problems": damaged,
            "by_status": by_status,
            "by_executor": by_executor,
            "by_type": types,
            "largest": largest,
            "storage": storage,
            "sync_promise": promise,
        }))?;
        return out.flush();
    }
    let schema = journal
        .schema_version()
        .map(|v| format!(", PostgreSQL schema version {v}"))
        .unwrap_or_default();
    out.line(format!(
        "{}, {}, {} ({bytes} bytes), last sequence {last_seq}, journal format {}, record \
         format {}{schema}",
        fmt::count(tasks, "task"),
        fmt::count(records, "record"),
        fmt::size(bytes),
        journal.format_version(),
        journal.record_format()
    ))?;
    if purged > 0 {
        out.line(format!(
            "{} purged (their tombstones counted among the records)",
            fmt::count(purged, "task")
        ))?;
    }
    if damaged > 0 {
        out.line(format!(
            "{} {} not fold cleanly: run `dtask verify`",
            fmt::count(damaged, "task"),
            if damaged == 1 { "does" } else { "do" }
        ))?;
    }
    tables(&mut out, &by_status, &by_executor, &by_type, &sizes)?;
    footer(&mut out, storage.as_ref(), promise.as_ref())?;
    out.flush()
}

/// The storage engine's figures, if it has any, and what a synced append promises, if the
/// journal's directory was examined.
fn footer(out: &mut Out, storage: Option<&StorageStats>, promise: Option<&Verdict>) -> Result<()> {
    if let Some(storage) = storage {
        storage_table(out, storage)?;
    }
    if let Some(verdict) = promise {
        out.line(format!(
            "synced appends: {} — {} (`dtask probe` times a sync)",
            verdict.promise.as_str(),
            verdict.why
        ))?;
    }
    Ok(())
}

/// What a synced append promises where an embedded journal lies (`dtask probe` also times a
/// sync there); `None` for a PostgreSQL journal, whose server's settings `probe` reads, and
/// where the directory cannot be examined.
fn sync_promise(global: &Global) -> Result<Option<Verdict>> {
    Ok(global
        .at()?
        .dir()
        .and_then(|dir| Placement::examine(dir).ok())
        .map(|placement| placement.verdict(None)))
}

/// The storage engine's figures: a row per column family, then what runs and whether writes
/// are held back.
fn storage_table(out: &mut Out, storage: &StorageStats) -> Result<()> {
    let mut t = Table::new(&[
        "SPACE",
        "MEMTABLES",
        "LEVEL-0 FILES",
        "TABLE FILES",
        "COMPACTION OWED",
        "KEYS (EST.)",
    ]);
    for space in &storage.spaces {
        t.row(vec![
            space.name.clone(),
            fmt::size(space.memtable_bytes),
            space.level0_files.to_string(),
            fmt::size(space.table_bytes),
            fmt::size(space.pending_compaction_bytes),
            space.estimated_keys.to_string(),
        ]);
    }
    out.text(format!("\n{}", t.render(2)))?;
    let writes = if storage.write_stopped {
        "stopped".to_owned()
    } else if storage.delayed_write_rate > 0 {
        format!("slowed to {}/s", fmt::size(storage.delayed_write_rate))
    } else {
        "not held back".to_owned()
    };
    out.line(format!(
        "\n{} running, {} running; writes {writes}; {} background {}",
        fmt::count(storage.running_flushes, "flush"),
        fmt::count(storage.running_compactions, "compaction"),
        storage.background_errors,
        if storage.background_errors == 1 {
            "error"
        } else {
            "errors"
        },
    ))?;
    Ok(())
}

/// The text tables of `dtask stats`: tasks by status and executor, records by type, the
/// largest tasks.
fn tables(
    out: &mut Out,
    by_status: &BTreeMap<String, u64>,
    by_executor: &BTreeMap<String, u64>,
    by_type: &BTreeMap<EventType, Counts>,
    sizes: &[(u64, u64, String)],
) -> Result<()> {
    let mut t = Table::new(&["STATUS", "TASKS"]);
    for (s, n) in by_status {
        t.row(vec![s.clone(), n.to_string()]);
    }
    out.text(format!("\n{}", t.render(2)))?;
    let mut t = Table::new(&["EXECUTOR", "TASKS"]);
    for (e, n) in by_executor {
        t.row(vec![e.clone(), n.to_string()]);
    }
    out.text(format!("\n{}", t.render(2)))?;
    let mut t = Table::new(&["EVENT TYPE", "RECORDS", "BYTES"]);
    for (ty, c) in by_type {
        t.row(vec![
            ty.as_str().to_owned(),
            c.records.to_string(),
            fmt::size(c.bytes),
        ]);
    }
    out.text(format!("\n{}", t.render(2)))?;
    let mut t = Table::new(&["LARGEST TASK", "RECORDS", "BYTES"]);
    for (b, r, id) in sizes {
        t.row(vec![id.clone(), r.to_string(), fmt::size(*b)]);
    }
    out.text(format!("\n{}", t.render(2)))?;
    Ok(())
}

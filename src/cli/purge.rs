//! `dtask purge`: deletes finished tasks' records from a journal, keeping one tombstone a
//! task (see docs/semantics.md, "Purging finished tasks").
//!
//! The tasks are chosen by name or by age (`--finished-before`): root tasks that ended, each
//! taken with its nested tasks — a tree goes whole, and only once every task of it ended and
//! no notification of it is still queued. They are purged in batches, each one atomic write:
//! a purge cut short (a crash, `^C`) leaves whole batches purged and the rest as they were,
//! and running it again goes on where it stopped. `--dry-run` says what would go;
//! `--export FILE` first writes the tasks to go to a file, in the export format; `--compact`
//! gives the space back at once.

use super::{fmt, progress, CliError, Global, Out, Result};
use dtask_journal::{JournalOptions, Timestamp};
use dtask_replay::FoldViews;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};

/// Arguments of `dtask purge`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Purge these root tasks (with their nested tasks); each must have ended.
    #[arg(value_name = "TASK", conflicts_with = "finished_before")]
    tasks: Vec<String>,
    /// Purge every root task that ended before this time (ms since the epoch, YYYY-MM-DD or
    /// RFC 3339 UTC), with its nested tasks.
    #[arg(long, value_parser = fmt::parse_time, required_unless_present = "tasks")]
    finished_before: Option<Timestamp>,
    /// Only say what would be purged; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Tasks purged per atomic write at most (a tree is never split).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=4096))]
    batch: u64,
    /// First export the tasks to be purged to this file (the export format, every byte
    /// field in full; synced before anything is purged). Nothing is purged if it fails.
    #[arg(long, value_name = "FILE", conflicts_with = "dry_run")]
    export: Option<std::path::PathBuf>,
    /// Then compact the journal's storage, so that the space is given back now rather than as
    /// compactions come due (an embedded journal; PostgreSQL's autovacuum does this itself).
    #[arg(long, conflicts_with = "dry_run")]
    compact: bool,
}

/// The bytes of the files under `dir` (the journal's directory), if it can be read. A file
/// that goes while it is listed — RocksDB deletes the files a compaction made obsolete as
/// it likes — is not counted, rather than making the whole size unknown.
fn dir_bytes(dir: &std::path::Path) -> Option<u64> {
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let mut total = 0;
    for entry in std::fs::read_dir(dir).ok()? {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) if gone(&e) => continue,
            Err(_) => return None,
        };
        let meta = match entry.metadata() {
            Ok(meta) => meta,
            Err(e) if gone(&e) => continue,
            Err(_) => return None,
        };
        total += if meta.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Some(total)
}

/// The journal's directory's size before and after a compaction, if one ran (`None` on
/// PostgreSQL, which reclaims the space itself).
pub(super) type Compacted = Option<(Option<u64>, Option<u64>)>;

/// Compacts the journal's storage now ([`dtask_journal::Journal::compact_now`]), measuring
/// its directory before and after.
pub(super) fn compact(
    at: &super::location::At,
    journal: &dtask_journal::Journal,
) -> Result<Compacted> {
    let before = at.dir().and_then(dir_bytes);
    let done = journal.compact_now()?;
    let after = at.dir().and_then(dir_bytes);
    Ok(done.then_some((before, after)))
}

/// What a compaction did, as JSON: `{bytes_before, bytes_after}`, or `null` when none ran.
pub(super) fn compacted_json(compacted: Compacted) -> serde_json::Value {
    compacted.map_or(
        serde_json::Value::Null,
        |(before, after)| json!({ "bytes_before": before, "bytes_after": after }),
    )
}

/// The line saying what a compaction did (`asked`: whether one was asked for).
pub(super) fn print_compacted(out: &mut Out, compacted: Compacted, asked: bool) -> Result<()> {
    match compacted {
        Some((Some(before), Some(after))) => out.line(format!(
            "compacted: {} → {} on disk",
            fmt::size(before),
            fmt::size(after)
        )),
        Some(_) => out.line("compacted"),
        None if asked => out.line("not compacted: the database reclaims the space itself"),
        None => Ok(()),
    }
}

/// What the fold of the journal says of one task.
struct Seen {
    parent: String,
    ended: Option<Timestamp>,
    queued: bool,
    held: bool,
    records: u64,
}

/// A root task and what keeps it, if anything.
struct Tree {
    tasks: Vec<String>,
    records: u64,
    kept: Option<String>,
}

/// The tree of `root`: its tasks (root first) and whether it may go.
fn tree(root: &str, seen: &BTreeMap<String, Seen>, children: &BTreeMap<&str, Vec<&str>>) -> Tree {
    let mut tree = Tree {
        tasks: Vec::new(),
        records: 0,
        kept: None,
    };
    let mut next = vec![root];
    let mut visited = BTreeSet::new();
    while let Some(id) = next.pop() {
        if !visited.insert(id) {
            continue;
        }
        let Some(task) = seen.get(id) else { continue };
        if task.ended.is_none() && tree.kept.is_none() {
            tree.kept = Some(format!("{id} has not ended"));
        }
        if task.queued && tree.kept.is_none() {
            tree.kept = Some(format!("a notification of {id} is still queued"));
        }
        if task.held && tree.kept.is_none() {
            tree.kept = Some(format!("{id} is on hold"));
        }
        tree.tasks.push(id.to_owned());
        tree.records += task.records;
        next.extend(children.get(id).into_iter().flatten().copied());
    }
    tree
}

/// Runs `dtask purge`.
#[allow(
    clippy::too_many_lines,
    reason = "fold, choose, purge in batches, report"
)]
pub fn run(global: &Global, args: &Args) -> Result<()> {
    let at = global.at()?;
    let journal = if args.dry_run {
        at.open_reader()?
    } else {
        at.open_writer(JournalOptions::default())?
    };
    let bar = progress(journal.last_seq()?, "reading tasks");
    let mut seen = BTreeMap::new();
    let mut already = 0u64;
    for view in FoldViews::new(&journal, None) {
        let view = view?;
        bar.inc(view.records);
        if view.purged.is_some() {
            already += 1;
            continue;
        }
        let Some(task) = &view.task else {
            // Damage or an illegal record: never purged (it is evidence); `verify` names it.
            continue;
        };
        let s = &task.state;
        seen.insert(
            view.id().to_owned(),
            Seen {
                parent: s.parent_task_id.clone(),
                ended: s
                    .status
                    .is_terminal()
                    .then(|| s.done_at.unwrap_or(s.updated_at)),
                queued: !task.outbox.is_empty(),
                held: s.hold.is_some(),
                records: view.records,
            },
        );
    }
    bar.finish_and_clear();
    let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (id, task) in &seen {
        if !task.parent.is_empty() {
            children.entry(task.parent.as_str()).or_default().push(id);
        }
    }
    let roots: Vec<&str> = if args.tasks.is_empty() {
        let before = args.finished_before.unwrap_or(Timestamp(0));
        seen.iter()
            .filter(|(_, t)| t.parent.is_empty() && t.ended.is_some_and(|at| at < before))
            .map(|(id, _)| id.as_str())
            .collect()
    } else {
        for id in &args.tasks {
            match seen.get(id) {
                None => {
                    return Err(CliError::Usage(format!(
                        "no task {id:?} that could be purged (unknown, purged before, or damaged)"
                    )))
                }
                Some(t) if !t.parent.is_empty() => {
                    return Err(CliError::Usage(format!(
                    "{id:?} is a nested task of {:?}: purge its root task, which takes it along",
                    t.parent
                )))
                }
                Some(_) => {}
            }
        }
        args.tasks.iter().map(String::as_str).collect()
    };
    let trees: Vec<Tree> = roots.iter().map(|r| tree(r, &seen, &children)).collect();
    if !args.tasks.is_empty() {
        if let Some(kept) = trees.iter().find_map(|t| t.kept.as_ref()) {
            return Err(CliError::Usage(format!("cannot purge: {kept}")));
        }
    }
    let (going, kept): (Vec<&Tree>, Vec<&Tree>) = trees.iter().partition(|t| t.kept.is_none());
    let mut purged_tasks = 0u64;
    let mut purged_records = 0u64;
    let mut purged_bytes = 0u64;
    if args.dry_run {
        purged_tasks = going.iter().map(|t| t.tasks.len() as u64).sum();
        purged_records = going.iter().map(|t| t.records).sum();
    } else {
        if let Some(path) = &args.export {
            let tasks: Vec<String> = going.iter().flat_map(|t| t.tasks.iter().cloned()).collect();
            if !tasks.is_empty() {
                super::export::export_to_file(&journal, &tasks, super::codec::bytes(false), path)?;
            }
        }
        let bar = progress(going.len() as u64, "purging");
        let now = fmt::now();
        let mut batch: Vec<&str> = Vec::new();
        let mut trees_in_batch = 0u64;
        let mut flush = |batch: &mut Vec<&str>, trees: &mut u64| -> Result<()> {
            if batch.is_empty() {
                return Ok(());
            }
            for stream in journal.purge(batch, now)? {
                purged_tasks += 1;
                purged_records += stream.records;
                purged_bytes += stream.bytes;
            }
            bar.inc(*trees);
            batch.clear();
            *trees = 0;
            Ok(())
        };
        for tree in &going {
            if batch.len() + tree.tasks.len() > usize::try_from(args.batch).unwrap_or(usize::MAX) {
                flush(&mut batch, &mut trees_in_batch)?;
            }
            batch.extend(tree.tasks.iter().map(String::as_str));
            trees_in_batch += 1;
        }
        flush(&mut batch, &mut trees_in_batch)?;
        bar.finish_and_clear();
    }
    let compacted = if args.compact && !args.dry_run {
        compact(&at, &journal)?
    } else {
        None
    };
    let mut out = Out::new();
    if global.json {
        out.json(&json!({
            "dry_run": args.dry_run,
            "purged": { "tasks": purged_tasks, "records": purged_records, "bytes": purged_bytes },
            "kept": kept.iter().map(|t| json!({ "task": t.tasks[0], "why": t.kept })).collect::<Vec<_>>(),
            "purged_before": already,
            "compacted": compacted_json(compacted),
        }))?;
    } else {
        out.line(format!(
            "{} {} ({}{})",
            if args.dry_run {
                "would purge"
            } else {
                "purged"
            },
            fmt::count(purged_tasks, "task"),
            fmt::count(purged_records, "record"),
            if args.dry_run {
                String::new()
            } else {
                format!(", {}", fmt::size(purged_bytes))
            },
        ))?;
        for t in &kept {
            out.line(format!(
                "  kept {}: {}",
                t.tasks[0],
                t.kept.as_deref().unwrap_or_default()
            ))?;
        }
        if already > 0 {
            out.line(format!("{} purged before", fmt::count(already, "task")))?;
        }
        print_compacted(&mut out, compacted, args.compact)?;
    }
    out.flush()
}

//! `dtask trim`: drops the bytes of tasks' older progress updates, every record kept (see
//! docs/semantics.md, "Trimming progress").
//!
//! The tasks are chosen by name (any task, running or ended) or by age
//! (`--finished-before`: every task that ended before then with more updates than it
//! keeps). Each task is trimmed in one atomic write to its last `--keep` updates; a trim cut
//! short leaves whole tasks trimmed and the rest as they were, and running it again trims
//! nothing twice. `--dry-run` says what would go; `--compact` gives the space back at once.

use super::{fmt, progress, CliError, Global, Out, Result};
use dtask_engine::{progress_trimmable, trim_due, StoreConfig, StoreError, SystemClock, TaskStore};
use dtask_journal::{Error as JournalError, Event, Journal, JournalOptions, Timestamp};
use dtask_replay::FoldViews;
use futures::StreamExt;
use serde_json::json;
use std::collections::BTreeMap;

/// Trims written at once offline.
const TRIMS_AT_ONCE: usize = 64;

/// Arguments of `dtask trim`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Trim these tasks' progress (running or ended).
    #[arg(value_name = "TASK", conflicts_with = "finished_before")]
    tasks: Vec<String>,
    /// Trim the progress of every task that ended before this time (ms since the epoch,
    /// YYYY-MM-DD or RFC 3339 UTC).
    #[arg(long, value_parser = fmt::parse_time, required_unless_present = "tasks")]
    finished_before: Option<Timestamp>,
    /// The latest progress updates of each task kept whole (the progress reader shows 20).
    #[arg(long, default_value_t = 20)]
    keep: u64,
    /// Only say what would be trimmed; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Then compact the journal's storage, so that the space is given back now (an
    /// embedded journal; PostgreSQL's autovacuum does this itself).
    #[arg(long, conflicts_with = "dry_run")]
    compact: bool,
}

/// What trimming `task` to its last `keep` updates would take: the updates and their
/// bytes. Also whether a hold stands.
fn trimmable(journal: &Journal, task: &str, keep: u64) -> Result<(u64, u64, bool)> {
    let mut updates = Vec::new();
    let mut held = false;
    for record in journal.read_stream(task, 0) {
        let record = record?;
        match &record.event {
            Event::UpdateAppended { .. } | Event::PartAppended { .. } => {
                updates.push(Some(record.size as u64));
            }
            Event::UpdateTrimmed { .. } => updates.push(None),
            Event::Hold { .. } => held = true,
            Event::HoldLifted { .. } => held = false,
            _ => {}
        }
    }
    let keep = usize::try_from(keep)
        .unwrap_or(usize::MAX)
        .min(updates.len());
    let going = updates[..updates.len() - keep].iter().flatten();
    Ok((going.clone().count() as u64, going.sum(), held))
}

/// The tasks to trim: those named (each known, not an agent run), or those a sweep by age
/// takes. Only those are held, not every task the fold reads.
fn choose(journal: &Journal, args: &Args) -> Result<Vec<String>> {
    let bar = progress(journal.last_seq()?, "reading tasks");
    // Whether each named task's progress may go, once the fold has found it.
    let mut named: BTreeMap<&str, Option<bool>> =
        args.tasks.iter().map(|t| (t.as_str(), None)).collect();
    // The named tasks on hold, with the hold's reason: refused before anything is written
    // (the store refuses them too, but the trims of the others would have gone by then).
    let mut held: BTreeMap<String, Box<str>> = BTreeMap::new();
    let mut due = Vec::new();
    for view in FoldViews::new(journal, None) {
        let view = view?;
        bar.inc(view.records);
        let Some(task) = &view.task else { continue };
        if let Some(found) = named.get_mut(view.id()) {
            *found = Some(progress_trimmable(&task.state));
            if let Some(reason) = &task.state.hold {
                held.insert(view.id().to_owned(), reason.clone());
            }
        }
        if args
            .finished_before
            .is_some_and(|before| trim_due(&task.state, before, args.keep))
            && !view.has_problems()
        {
            due.push(view.id().to_owned());
        }
    }
    bar.finish_and_clear();
    if args.tasks.is_empty() {
        return Ok(due);
    }
    for id in &args.tasks {
        match named.get(id.as_str()).copied().flatten() {
            None => {
                return Err(CliError::Usage(format!(
                    "no task {id:?} that could be trimmed (unknown, purged, or damaged)"
                )))
            }
            Some(false) => {
                return Err(CliError::Usage(format!(
                    "{id:?} is an agent run: its updates are its conversation, never trimmed"
                )))
            }
            Some(true) => {}
        }
        if let Some(reason) = held.get(id) {
            return Err(CliError::Usage(format!(
                "{id:?} is on hold ({reason}): its progress is kept until the hold is lifted \
                 (nothing trimmed)"
            )));
        }
    }
    Ok(args.tasks.clone())
}

/// What a task's trim did (or would do): the updates and their bytes, or why it was kept.
type Outcome = (String, std::result::Result<(u64, u64), String>);

/// What trimming each of `tasks` would do (a dry run): read, nothing written.
fn count_all(
    journal: &Journal,
    tasks: Vec<String>,
    keep: u64,
    bar: &indicatif::ProgressBar,
) -> Result<Vec<Outcome>> {
    let mut outcomes = Vec::with_capacity(tasks.len());
    for task in tasks {
        bar.inc(1);
        let (n, size, held) = trimmable(journal, &task, keep)?;
        let outcome = if held {
            Err("it is on hold".to_owned())
        } else {
            Ok((n, size))
        };
        outcomes.push((task, outcome));
    }
    Ok(outcomes)
}

/// Trims each of `tasks` through the task store (its rules), many at once — each its own
/// atomic write, their syncs shared by the journal's group commit.
fn trim_all(
    journal: &Journal,
    tasks: Vec<String>,
    args: &Args,
    bar: &indicatif::ProgressBar,
) -> Result<Vec<Outcome>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::io("starting the runtime"))?;
    runtime.block_on(async {
        let store = TaskStore::open(journal.clone(), SystemClock, StoreConfig::default())
            .map_err(|e| CliError::Usage(e.to_string()))?;
        let store = &store;
        let mut done = futures::stream::iter(tasks)
            .map(|task| async move {
                let outcome = store.trim_progress(&task, args.keep).await;
                (task, outcome)
            })
            .buffer_unordered(TRIMS_AT_ONCE);
        let mut outcomes = Vec::new();
        while let Some((task, outcome)) = done.next().await {
            bar.inc(1);
            let outcome = match outcome {
                Ok(trimmed) => Ok((trimmed.records, trimmed.bytes)),
                // A sweep by age keeps (and names) a held task; one named is an error.
                Err(StoreError::Journal(JournalError::NotTrimmable { why, .. }))
                    if args.tasks.is_empty() =>
                {
                    Err(why.to_string())
                }
                Err(e) => return Err(CliError::Usage(format!("cannot trim {task:?}: {e}"))),
            };
            outcomes.push((task, outcome));
        }
        Ok(outcomes)
    })
}

/// Runs `dtask trim`.
pub fn run(global: &Global, args: &Args) -> Result<()> {
    let at = global.at()?;
    let journal = if args.dry_run {
        at.open_reader()?
    } else {
        at.open_existing_writer(JournalOptions::default())?
    };
    let candidates = choose(&journal, args)?;
    let bar = progress(candidates.len() as u64, "trimming");
    let outcomes = if args.dry_run {
        count_all(&journal, candidates, args.keep, &bar)?
    } else {
        trim_all(&journal, candidates, args, &bar)?
    };
    bar.finish_and_clear();
    let (mut tasks, mut records, mut bytes) = (0u64, 0u64, 0u64);
    let mut kept: Vec<(String, String)> = Vec::new();
    for (task, outcome) in outcomes {
        match outcome {
            Ok((n, size)) if n > 0 => {
                tasks += 1;
                records += n;
                bytes += size;
            }
            Ok(_) => {}
            Err(why) => kept.push((task, why)),
        }
    }
    kept.sort();
    let compacted = if args.compact {
        super::purge::compact(&at, &journal)?
    } else {
        None
    };
    let mut out = Out::new();
    if global.json {
        out.json(&json!({
            "dry_run": args.dry_run,
            "keep": args.keep,
            "trimmed": { "tasks": tasks, "records": records, "bytes": bytes },
            "kept": kept.iter().map(|(task, why)| json!({ "task": task, "why": why })).collect::<Vec<_>>(),
            "compacted": super::purge::compacted_json(compacted),
        }))?;
    } else {
        out.line(format!(
            "{} {} of {} ({} {})",
            if args.dry_run {
                "would trim"
            } else {
                "trimmed"
            },
            fmt::count(records, "progress update"),
            fmt::count(tasks, "task"),
            fmt::size(bytes),
            if args.dry_run {
                "in those records"
            } else {
                "saved"
            },
        ))?;
        for (task, why) in &kept {
            out.line(format!("  kept {task}: {why}"))?;
        }
        super::purge::print_compacted(&mut out, compacted, args.compact)?;
    }
    out.flush()
}

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
use dtask_journal::{Error as JournalError, JournalOptions, Timestamp};
use dtask_replay::FoldViews;
use serde_json::json;

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

/// A task that has not ended, in [`Entry::ended`].
const NOT_ENDED: u64 = u64::MAX;

/// What the fold of the journal says of one task (its id in [`Seen::ids`]).
#[derive(Debug, Clone, Copy)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "what keeps a tree, a flag each, in ~40 bytes a task"
)]
struct Entry {
    /// Where its id starts in [`Seen::ids`].
    start: usize,
    /// Its id's length.
    len: u32,
    /// Whether a notification of it is still queued.
    queued: bool,
    /// Whether a hold stands on it.
    held: bool,
    /// Whether it is a nested task.
    nested: bool,
    /// When it ended (ms), or [`NOT_ENDED`].
    ended: u64,
    /// Its records.
    records: u64,
    /// Whether its stream is damaged or does not fold (evidence: never purged).
    damaged: bool,
}

/// The id of `entry` in `ids` ([`Seen::ids`]).
fn id_in<'a>(ids: &'a str, entry: &Entry) -> &'a str {
    &ids[entry.start..entry.start + entry.len as usize]
}

/// What the fold of the journal says of its tasks, held compactly — a purge of a journal of
/// millions of tasks holds ~40 bytes a task and its id — and in id order, for lookups.
#[derive(Debug, Default)]
struct Seen {
    /// Every id, back to back.
    ids: String,
    /// The tasks, in id order.
    entries: Vec<Entry>,
    /// Each nested task's parent: (the parent's index, the child's), in the parents' order.
    children: Vec<(u32, u32)>,
    /// Each nested task's parent by id: (the child's index, the parent's id), in the
    /// children's order (a parent purged before is in none of [`Seen::children`]).
    parents: Vec<(u32, Box<str>)>,
}

impl Seen {
    /// Folds the journal: every task that is not a purge's tombstone (counted in the second
    /// value) or damaged (never purged: it is evidence; `verify` names it).
    fn read(journal: &dtask_journal::Journal) -> Result<(Self, u64)> {
        let bar = progress(journal.last_seq()?, "reading tasks");
        let mut seen = Self::default();
        // Each nested task's id (where it is in `ids`) and its parent's.
        let mut nested: Vec<(usize, u32, Box<str>)> = Vec::new();
        let mut already = 0u64;
        for view in FoldViews::new(journal, None) {
            let view = view?;
            bar.inc(view.records);
            if view.purged.is_some() {
                already += 1;
                continue;
            }
            let Some(task) = &view.task else { continue };
            let s = &task.state;
            let id = view.id();
            let entry = Entry {
                start: seen.ids.len(),
                len: u32::try_from(id.len()).unwrap_or(u32::MAX),
                queued: !task.outbox.is_empty(),
                held: s.hold.is_some(),
                nested: !s.parent_task_id.is_empty(),
                ended: if s.status.is_terminal() {
                    s.done_at.unwrap_or(s.updated_at).0
                } else {
                    NOT_ENDED
                },
                records: view.records,
                damaged: view.has_problems(),
            };
            if entry.nested {
                nested.push((entry.start, entry.len, s.parent_task_id.as_str().into()));
            }
            seen.entries.push(entry);
            seen.ids.push_str(id);
        }
        bar.finish_and_clear();
        if u32::try_from(seen.entries.len()).is_err() {
            return Err(CliError::Usage("more than 4 billion tasks".into()));
        }
        // In id order, for lookups (the fold reads tasks so: the sort only checks it).
        let ids = &seen.ids;
        seen.entries
            .sort_by(|a, b| id_in(ids, a).cmp(id_in(ids, b)));
        for (start, len, parent) in nested {
            let child = &seen.ids[start..start + len as usize];
            let Some(child) = seen.find(child) else {
                continue;
            };
            // A parent no longer (or never) in the journal has nothing to take its child along.
            if let Some(index) = seen.find(&parent) {
                seen.children.push((index, child));
            }
            seen.parents.push((child, parent));
        }
        seen.parents.sort_unstable_by_key(|(child, _)| *child);
        seen.children.sort_unstable();
        Ok((seen, already))
    }

    /// The id of the task at `index`.
    fn id(&self, index: u32) -> &str {
        id_in(&self.ids, &self.entries[index as usize])
    }

    /// The index of task `id`.
    fn find(&self, id: &str) -> Option<u32> {
        self.entries
            .binary_search_by(|e| id_in(&self.ids, e).cmp(id))
            .ok()
            .and_then(|i| u32::try_from(i).ok())
    }

    /// The parent of the task at `index`, if it is a nested task.
    fn parent_of(&self, index: u32) -> Option<&str> {
        let at = self
            .parents
            .binary_search_by_key(&index, |(c, _)| *c)
            .ok()?;
        Some(&self.parents[at].1)
    }

    /// The nested tasks of the task at `index`.
    fn children_of(&self, index: u32) -> impl Iterator<Item = u32> + '_ {
        let from = self.children.partition_point(|(p, _)| *p < index);
        self.children[from..]
            .iter()
            .take_while(move |(p, _)| *p == index)
            .map(|(_, c)| *c)
    }

    /// The root tasks that ended before `before`, in id order.
    fn ended_roots(&self, before: Timestamp) -> Vec<u32> {
        (0..self.entries.len())
            .filter(|i| {
                let e = &self.entries[*i];
                !e.nested && e.ended != NOT_ENDED && e.ended < before.0
            })
            .filter_map(|i| u32::try_from(i).ok())
            .collect()
    }

    /// The tree of the root at `root`: its tasks (root first) and whether it may go.
    fn tree(&self, root: u32) -> Tree {
        let mut tree = Tree {
            tasks: Vec::new(),
            records: 0,
            kept: None,
        };
        let mut next = vec![root];
        let mut visited = std::collections::HashSet::new();
        while let Some(index) = next.pop() {
            if !visited.insert(index) {
                continue;
            }
            let task = &self.entries[index as usize];
            let id = self.id(index);
            // Damage first: what else the fold says of a damaged stream may be its damage.
            if task.damaged && tree.kept.is_none() {
                tree.kept = Some(format!(
                    "{id} is damaged or does not fold (see `dtask verify`)"
                ));
            }
            if task.ended == NOT_ENDED && tree.kept.is_none() {
                tree.kept = Some(format!("{id} has not ended"));
            }
            if task.queued && tree.kept.is_none() {
                tree.kept = Some(format!("a notification of {id} is still queued"));
            }
            if task.held && tree.kept.is_none() {
                tree.kept = Some(format!("{id} is on hold"));
            }
            tree.tasks.push(index);
            tree.records += task.records;
            next.extend(self.children_of(index));
        }
        tree
    }
}

/// A root task's tree and what keeps it, if anything.
struct Tree {
    /// Its tasks, root first.
    tasks: Vec<u32>,
    /// Their records.
    records: u64,
    /// Why it may not go.
    kept: Option<String>,
}

/// Runs `dtask purge`.
#[allow(
    clippy::too_many_lines,
    reason = "fold, choose, purge in batches, report"
)]
pub fn run(global: &Global, args: &Args) -> Result<()> {
    if let Some(path) = args.export.as_ref().filter(|path| path.exists()) {
        // The archive of an earlier purge holds records the journal has no more.
        return Err(CliError::Usage(format!(
            "{} exists: a purge's export never replaces a file",
            path.display()
        )));
    }
    let at = global.at()?;
    let journal = if args.dry_run {
        at.open_reader()?
    } else {
        at.open_existing_writer(JournalOptions::default())?
    };
    let (seen, already) = Seen::read(&journal)?;
    let roots: Vec<u32> = if args.tasks.is_empty() {
        seen.ended_roots(args.finished_before.unwrap_or(Timestamp(0)))
    } else {
        let mut roots = Vec::with_capacity(args.tasks.len());
        for id in &args.tasks {
            let Some(index) = seen.find(id) else {
                return Err(CliError::Usage(format!(
                    "no task {id:?} that could be purged (unknown, purged before, or damaged)"
                )));
            };
            if let Some(parent) = seen.parent_of(index) {
                return Err(CliError::Usage(format!(
                    "{id:?} is a nested task of {parent:?}: purge its root task, which takes it along"
                )));
            }
            roots.push(index);
        }
        for root in &roots {
            if let Some(kept) = seen.tree(*root).kept {
                return Err(CliError::Usage(format!("cannot purge: {kept}")));
            }
        }
        roots
    };
    // The trees are walked again where they are needed rather than held: a sweep of
    // millions of roots holds their indexes only.
    let mut kept: Vec<(u32, String)> = Vec::new();
    let mut going: Vec<u32> = Vec::new();
    let (mut going_tasks, mut going_records) = (0u64, 0u64);
    for root in roots {
        let tree = seen.tree(root);
        if let Some(why) = tree.kept {
            kept.push((root, why));
        } else {
            going.push(root);
            going_tasks += tree.tasks.len() as u64;
            going_records += tree.records;
        }
    }
    let mut purged_tasks = 0u64;
    let mut purged_records = 0u64;
    let mut purged_bytes = 0u64;
    if args.dry_run {
        purged_tasks = going_tasks;
        purged_records = going_records;
    } else {
        if let Some(path) = &args.export {
            let tasks: Vec<String> = going
                .iter()
                .flat_map(|root| seen.tree(*root).tasks)
                .map(|index| seen.id(index).to_owned())
                .collect();
            if !tasks.is_empty() {
                super::export::export_to_file(
                    &journal,
                    &tasks,
                    super::codec::bytes(false),
                    path,
                    false,
                )?;
            }
        }
        let bar = progress(going.len() as u64, "purging");
        let now = fmt::now();
        // Each stream is purged as it was read (and exported): one another node appended
        // to since, or put on hold, is kept — with the rest of its batch — and named.
        let mut batch: Vec<(&str, u64)> = Vec::new();
        let mut roots_in_batch: Vec<u32> = Vec::new();
        let mut flush = |batch: &mut Vec<(&str, u64)>, roots: &mut Vec<u32>| -> Result<()> {
            if batch.is_empty() {
                return Ok(());
            }
            match journal.purge_as_read(batch, now) {
                Ok(streams) => {
                    for stream in streams {
                        purged_tasks += 1;
                        purged_records += stream.records;
                        purged_bytes += stream.bytes;
                    }
                }
                Err(e @ (JournalError::Conflict { .. } | JournalError::NotPurgeable { .. })) => {
                    let why = format!("changed since it was read: {e}");
                    kept.extend(roots.iter().map(|root| (*root, why.clone())));
                }
                Err(e) => return Err(e.into()),
            }
            bar.inc(roots.len() as u64);
            batch.clear();
            roots.clear();
            Ok(())
        };
        for root in &going {
            let tree = seen.tree(*root);
            if batch.len() + tree.tasks.len() > usize::try_from(args.batch).unwrap_or(usize::MAX) {
                flush(&mut batch, &mut roots_in_batch)?;
            }
            batch.extend(
                tree.tasks
                    .iter()
                    .map(|index| (seen.id(*index), seen.entries[*index as usize].records)),
            );
            roots_in_batch.push(*root);
        }
        flush(&mut batch, &mut roots_in_batch)?;
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
            "kept": kept.iter().map(|(root, why)| json!({ "task": seen.id(*root), "why": why })).collect::<Vec<_>>(),
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
        for (root, why) in &kept {
            out.line(format!("  kept {}: {why}", seen.id(*root)))?;
        }
        if already > 0 {
            out.line(format!("{} purged before", fmt::count(already, "task")))?;
        }
        print_compacted(&mut out, compacted, args.compact)?;
    }
    out.flush()
}

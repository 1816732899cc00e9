//! What the server keeps in memory about the journal: counts of tasks by status and executor
//! and of records by type, made by one full count at start and kept up to date from the
//! commits the pump reads (see [`super::sse`]), with the same fold ([`Task::apply`]) the
//! engine uses. Nothing here is authoritative: every endpoint that shows a task folds it from
//! the journal.

use dtask_journal::{EventType, Journal, Record};
use dtask_replay::{FoldViews, Status, Task};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};

/// The counts.
#[derive(Debug, Default)]
struct Counts {
    /// Whether the first count is done.
    counted: bool,
    /// The last sequence applied.
    last_seq: u64,
    /// Live tasks, folded (the statuses that still change).
    live: HashMap<String, Task>,
    /// Tasks that will not change status: terminal, or whose stream stopped folding.
    settled: BTreeMap<Status, u64>,
    /// Tasks by executor.
    by_executor: BTreeMap<String, u64>,
    /// Records by event type.
    by_type: BTreeMap<EventType, u64>,
    /// Live tasks whose tool's started marker is durable: their next attempt recovers it.
    marked: HashSet<String>,
    /// Attempts started on a task whose started marker was durable (recovered, not
    /// restarted).
    recovered: u64,
    tasks: u64,
    records: u64,
    bytes: u64,
    problems: u64,
    /// Purged tasks (their tombstones), as last counted.
    purged: u64,
    /// Tasks the first count folded past the sequence it started at, with the last sequence
    /// it folded: the pump skips their records up to it.
    counted_past: HashMap<String, u64>,
    /// A purge's tombstone was applied: what the purged tasks counted for is unknown here,
    /// so the journal is counted again ([`Projection::needs_recount`]).
    recount: bool,
    /// A trim was applied since the count: it rewrote records in place (their sequences
    /// kept, so no commit of theirs comes), which the counts do not follow; the pump counts
    /// the journal again a while after ([`Projection::trimmed_since_count`]).
    trimmed: bool,
}

/// A snapshot of the counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Whether the first count is done.
    pub counted: bool,
    /// The last sequence applied.
    pub last_seq: u64,
    /// Tasks.
    pub tasks: u64,
    /// Records.
    pub records: u64,
    /// Bytes of the records.
    pub bytes: u64,
    /// Tasks whose stream does not fold cleanly.
    pub problems: u64,
    /// Purged tasks (counted apart from `tasks`; a purge makes the counts again).
    pub purged: u64,
    /// Tasks by status (every status present, 0 included).
    pub by_status: BTreeMap<Status, u64>,
    /// Tasks by executor.
    pub by_executor: BTreeMap<String, u64>,
    /// Records by event type.
    pub by_type: BTreeMap<EventType, u64>,
    /// Attempts started on a task whose tool's started marker was already durable: the tool
    /// was recovered, not started again.
    pub attempts_recovered: u64,
}

impl Snapshot {
    /// Records of one type.
    pub fn records_of(&self, event_type: EventType) -> u64 {
        self.by_type.get(&event_type).copied().unwrap_or(0)
    }

    /// The outbox's backlog: notifications queued and not acknowledged. Every enqueue record
    /// puts an entry in the outbox's index and every acknowledgement takes its enqueue's out
    /// (the audit checks the index against the streams), and a task is purged only once its
    /// notifications are all acknowledged: so the counts of the records, kept up to date as
    /// the pump reads, answer it without reading the index.
    pub fn outbox(&self) -> u64 {
        (self.records_of(EventType::NotificationEnqueued)
            + self.records_of(EventType::NotificationEnqueuedV2))
        .saturating_sub(self.records_of(EventType::NotificationAcked))
    }

    /// Tasks by executor as the server shows them (`/api/stats`, `/metrics`): the
    /// [`EXECUTORS_SHOWN`] executor keys with the most tasks (the first by name among equals),
    /// the tasks of every other key summed under [`OTHER_EXECUTORS`]. Executor keys are the
    /// clients' to choose: one entry (or metric series) per key would grow without bound.
    pub fn executors_shown(&self) -> BTreeMap<String, u64> {
        let mut keys: Vec<(&String, u64)> = self.by_executor.iter().map(|(k, n)| (k, *n)).collect();
        if keys.len() <= EXECUTORS_SHOWN {
            return self.by_executor.clone();
        }
        // Most tasks first; equals in name order (the map's order, kept by a stable sort).
        keys.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        let mut shown: BTreeMap<String, u64> = BTreeMap::new();
        for (key, n) in &keys[..EXECUTORS_SHOWN] {
            *shown.entry((*key).clone()).or_default() += n;
        }
        let rest: u64 = keys[EXECUTORS_SHOWN..].iter().map(|(_, n)| n).sum();
        *shown.entry(OTHER_EXECUTORS.to_owned()).or_default() += rest;
        shown
    }
}

/// How many executor keys [`Snapshot::executors_shown`] names.
pub const EXECUTORS_SHOWN: usize = 50;

/// The key under which [`Snapshot::executors_shown`] sums the tasks of the other executors.
pub const OTHER_EXECUTORS: &str = "other";

/// Whether `record` starts an attempt on a task whose started marker is durable (`marked`),
/// and whether the task is marked after it.
fn recovery(marked: bool, event_type: EventType) -> (bool, bool) {
    match event_type {
        EventType::AttemptStarted => (marked, marked),
        EventType::StartCommitted => (false, true),
        _ => (false, marked),
    }
}

/// The server's counts of the journal.
#[derive(Debug, Default)]
pub struct Projection {
    counts: Mutex<Counts>,
}

impl Projection {
    /// Whether the first count is done.
    pub fn is_counted(&self) -> bool {
        self.counts.lock().counted
    }

    /// Counts the whole journal (once, at start), as `dtask stats` does: every task folded.
    /// Returns the sequence the pump goes on from.
    ///
    /// # Errors
    /// Journal errors other than damage.
    pub fn count(&self, journal: &Journal) -> Result<u64, dtask_journal::Error> {
        let start = journal.last_seq()?;
        let mut c = Counts::default();
        let mut views = FoldViews::new(journal, None);
        loop {
            let mut max_seq = 0;
            let mut marked = false;
            let Some(view) = views.next_with(|r| {
                let event_type = r.event.event_type();
                *c.by_type.entry(event_type).or_default() += 1;
                max_seq = max_seq.max(r.seq);
                let (recovered, after) = recovery(marked, event_type);
                c.recovered += u64::from(recovered);
                marked = after;
            }) else {
                break;
            };
            let view = view?;
            let id = view.id().to_owned();
            if view.purged.is_some() {
                // Purged: counted apart (its records are gone; its tombstone is not a
                // task's).
                c.purged += 1;
                continue;
            }
            if !view.exists() {
                // Written and not yet durable (an embedded journal's readers stop at its
                // durable watermark, and so does `start`): the pump counts it from its first
                // record.
                continue;
            }
            c.tasks += 1;
            c.records += view.records;
            c.bytes += view.bytes;
            if max_seq > start {
                c.counted_past.insert(id.clone(), max_seq);
            }
            let executor = view
                .task
                .as_ref()
                .map_or_else(|| "?".to_owned(), |t| t.state.spec.executor_key.clone());
            *c.by_executor.entry(executor).or_default() += 1;
            let problems = view.has_problems();
            match view.task {
                Some(task) if !problems && !task.state.is_terminal() => {
                    if marked {
                        c.marked.insert(id.clone());
                    }
                    c.live.insert(id, task);
                }
                Some(task) => {
                    c.problems += u64::from(problems);
                    *c.settled.entry(task.state.status).or_default() += 1;
                }
                None => c.problems += 1,
            }
        }
        c.counted = true;
        c.last_seq = start;
        *self.counts.lock() = c;
        Ok(start)
    }

    /// Applies a record read from the commits after the first count.
    pub fn apply(&self, task: &str, record: &Record) {
        let mut c = self.counts.lock();
        if c.counted && record.seq <= c.last_seq {
            // Counted already (by a count made after the pump read it).
            return;
        }
        if c.recount || matches!(record.event, dtask_journal::Event::Purged { .. }) {
            // Not read up to here until the count made again (which reads this record too)
            // says so.
            c.recount = true;
            return;
        }
        c.last_seq = c.last_seq.max(record.seq);
        if c.counted_past
            .get(task)
            .is_some_and(|seq| record.seq <= *seq)
        {
            return;
        }
        c.records += 1;
        c.bytes += record.size as u64;
        let event_type = record.event.event_type();
        *c.by_type.entry(event_type).or_default() += 1;
        if event_type == EventType::ProgressTrimmed {
            c.trimmed = true;
        }
        if let Some(folded) = c.live.get_mut(task) {
            let settled = match folded.apply(&record.event) {
                Ok(()) if folded.state.is_terminal() => Some((folded.state.status, 0)),
                Ok(()) => None,
                Err(_) => Some((folded.state.status, 1)),
            };
            if let Some((status, problems)) = settled {
                c.live.remove(task);
                c.marked.remove(task);
                c.problems += problems;
                *c.settled.entry(status).or_default() += 1;
            } else {
                let (recovered, marked) = recovery(c.marked.contains(task), event_type);
                c.recovered += u64::from(recovered);
                if marked {
                    c.marked.insert(task.to_owned());
                }
            }
        } else if record.position == 0 {
            c.tasks += 1;
            if let Ok(folded) = Task::created(task, &record.event) {
                *c.by_executor
                    .entry(folded.state.spec.executor_key.clone())
                    .or_default() += 1;
                c.live.insert(task.to_owned(), folded);
            } else {
                c.problems += 1;
                *c.by_executor.entry("?".to_owned()).or_default() += 1;
            }
        }
    }

    /// Whether a purge was applied since the last count: the pump then counts the journal
    /// again ([`Projection::count`]), and the records it read before are not applied twice.
    pub fn needs_recount(&self) -> bool {
        self.counts.lock().recount
    }

    /// Whether a trim was applied since the last count: the counts of record types and bytes
    /// then stand for the trimmed records as they were, until the journal is counted again.
    pub fn trimmed_since_count(&self) -> bool {
        self.counts.lock().trimmed
    }

    /// Marks the counts as not whole (records the pump could not apply): the pump counts
    /// the journal again, and applies nothing to them until then.
    pub fn invalidate(&self) {
        self.counts.lock().recount = true;
    }

    /// The counts now.
    pub fn snapshot(&self) -> Snapshot {
        let c = self.counts.lock();
        let mut by_status: BTreeMap<Status, u64> = Status::ALL.iter().map(|s| (*s, 0)).collect();
        for (status, n) in &c.settled {
            *by_status.entry(*status).or_default() += n;
        }
        for task in c.live.values() {
            *by_status.entry(task.state.status).or_default() += 1;
        }
        Snapshot {
            counted: c.counted,
            last_seq: c.last_seq,
            tasks: c.tasks,
            records: c.records,
            bytes: c.bytes,
            problems: c.problems,
            purged: c.purged,
            by_status,
            by_executor: c.by_executor.clone(),
            by_type: c.by_type.clone(),
            attempts_recovered: c.recovered,
        }
    }
}

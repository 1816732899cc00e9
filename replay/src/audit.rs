//! The audit: everything a journal promises, checked record by record.
//!
//! [`audit_task`] checks one task and [`audit_journal`] the whole journal; both open nothing and
//! write nothing, so a service can run them on its own [`Journal`] (a read-only or follower
//! handle works as well as the writer's). What is checked:
//!
//! - **every record**: its CRC, its framing and format version, the position it stores, the
//!   BLAKE3 hash chain from the previous record — all reported per record by
//!   [`Journal::read_stream`], which continues past damage so that every bad record is named
//!   (a deleted *last* record leaves no gap: the `commits` check below names it);
//! - **legality**: the stream is re-folded with [`Task::apply`], whose [`crate::FoldError`]s
//!   are the invariant violations (version +1 per lifecycle event, attempts only grow, at most
//!   one terminal event and only notification records after it, update event ids unique, lease
//!   expiry resolved as its policy says, …); the first illegal record of a task is reported and
//!   legality checks of that task stop there (a fold past it would only report consequences).
//!   A few facts the fold does not need are checked too: a lease expiry names the deadline that
//!   was in force and happens after it, a notification carries the task version it was queued
//!   at, and an acknowledgement names the sequence of the record that queued it;
//! - **the indexes**: the `live` index holds exactly the tasks without a terminal event;
//!   `commits` is dense from 1 to the last sequence and every entry points at a record carrying
//!   that sequence (and every record's sequence appears once); `outbox` holds exactly the
//!   `notification_enqueued` records not yet acknowledged.
//!
//! Problems are collected, never raised: the result is a report with one [`Problem`] per
//! finding. Only an I/O failure of the storage stops an audit early.

use crate::fold::Task;
use crate::state::Status;
use dtask_journal::{CorruptionKind, Error, Event, Journal, Record};
use serde::Serialize;
use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;

/// What kind of problem an audit found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProblemKind {
    /// A record's CRC does not match its bytes (a flipped or edited byte).
    Checksum,
    /// A record is shorter than its framing says.
    Truncated,
    /// A record has a format version this build does not read.
    UnknownVersion,
    /// A record stores another position than the key it was found under.
    Misplaced,
    /// A record does not chain from its predecessor.
    Chain,
    /// A record is missing (deleted).
    Missing,
    /// A record's payload is not a valid event.
    Decode,
    /// A key does not follow the key layout.
    Key,
    /// Other damage reported by the journal.
    Damaged,
    /// A record a correct engine could not have written where it stands (a fold error).
    Illegal,
    /// A record whose fields disagree with the task's state (deadline, version, sequence).
    Inconsistent,
    /// The `live` index disagrees with the streams.
    LiveIndex,
    /// The `commits` index disagrees with the streams.
    CommitIndex,
    /// The `outbox` index disagrees with the streams.
    OutboxIndex,
    /// A number read from disk (a position, a sequence) is outside what a journal can hold.
    OutOfRange,
    /// The tail marker (format 3) disagrees with the streams: their last sequence, or the
    /// live tasks' heads.
    TailMarker,
    /// The journal's layout disagrees with its format version, or holds keys its layout has
    /// no place for.
    Layout,
}

impl ProblemKind {
    /// The `snake_case` name used in reports.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Checksum => "checksum",
            Self::Truncated => "truncated",
            Self::UnknownVersion => "unknown_version",
            Self::Misplaced => "misplaced",
            Self::Chain => "chain",
            Self::Missing => "missing",
            Self::Decode => "decode",
            Self::Key => "key",
            Self::Damaged => "damaged",
            Self::Illegal => "illegal",
            Self::Inconsistent => "inconsistent",
            Self::LiveIndex => "live_index",
            Self::CommitIndex => "commit_index",
            Self::OutboxIndex => "outbox_index",
            Self::OutOfRange => "out_of_range",
            Self::TailMarker => "tail_marker",
            Self::Layout => "layout",
        }
    }

    /// Whether the problem is physical damage of stored bytes (as opposed to a legal-looking
    /// record that breaks an invariant, or an index that disagrees).
    #[must_use]
    pub const fn is_damage(self) -> bool {
        !matches!(
            self,
            Self::Illegal
                | Self::Inconsistent
                | Self::LiveIndex
                | Self::CommitIndex
                | Self::OutboxIndex
                | Self::TailMarker
                | Self::Layout
        )
    }

    fn of(kind: &CorruptionKind) -> Self {
        match kind {
            CorruptionKind::Truncated { .. } => Self::Truncated,
            CorruptionKind::Checksum { .. } => Self::Checksum,
            CorruptionKind::UnknownVersion(_) => Self::UnknownVersion,
            CorruptionKind::Misplaced { .. } => Self::Misplaced,
            CorruptionKind::Chain => Self::Chain,
            CorruptionKind::Missing => Self::Missing,
            CorruptionKind::Decode(_) => Self::Decode,
            CorruptionKind::Key(_) => Self::Key,
            CorruptionKind::OutOfRange { .. } => Self::OutOfRange,
            _ => Self::Damaged,
        }
    }
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One finding of an audit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The task concerned (empty when an index key names no readable task).
    pub task: String,
    /// The position of the record concerned, when there is one.
    pub position: Option<u64>,
    /// What kind of problem.
    pub kind: ProblemKind,
    /// The reason, for humans.
    pub detail: String,
}

impl Problem {
    fn new(
        task: &str,
        position: Option<u64>,
        kind: ProblemKind,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            task: task.to_owned(),
            position,
            kind,
            detail: detail.into(),
        }
    }

    fn corruption(task: &str, position: u64, kind: &CorruptionKind) -> Self {
        Self::new(
            task,
            Some(position),
            ProblemKind::of(kind),
            kind.to_string(),
        )
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task {:?}", self.task)?;
        if let Some(position) = self.position {
            write!(f, " position {position}")?;
        }
        write!(f, ": {}: {}", self.kind, self.detail)
    }
}

/// The audit of one task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaskReport {
    /// The task.
    pub task: String,
    /// Whether the journal knows the task (it has records, intact or not).
    pub exists: bool,
    /// The records read intact.
    pub records: u64,
    /// The bytes of the records read intact.
    pub bytes: u64,
    /// The status folded from the stream (up to the first damaged or illegal record).
    pub status: Option<Status>,
    /// The version folded from the stream (same caveat).
    pub version: u64,
    /// Whether a terminal event is recorded.
    pub terminal: bool,
    /// What is wrong, in stream order.
    pub problems: Vec<Problem>,
}

impl TaskReport {
    /// Whether nothing is wrong with the task.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// The audit of a whole journal.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct AuditReport {
    /// Tasks checked (tasks with records).
    pub tasks: u64,
    /// Records read intact.
    pub records: u64,
    /// Bytes of the records read intact.
    pub bytes: u64,
    /// The last global sequence according to the commit index.
    pub last_seq: u64,
    /// Entries of the `live` index.
    pub live: u64,
    /// Entries of the `outbox` index.
    pub outbox: u64,
    /// Every problem found: per task in task-id order, then the index cross-checks.
    pub problems: Vec<Problem>,
}

impl AuditReport {
    /// Whether nothing is wrong with the journal.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// How far an audit has come, handed to the progress callback of [`audit_journal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Progress {
    /// Tasks checked so far.
    pub tasks: u64,
    /// Records read so far.
    pub records: u64,
    /// Records in the journal (the last global sequence), for a progress bar.
    pub total_records: u64,
}

/// What scanning one stream found, besides the report.
struct Scan {
    report: TaskReport,
    /// Positions with damage already reported.
    damaged: HashSet<u64>,
    /// Positions of the `notification_enqueued` records not acknowledged.
    unacked: BTreeSet<u64>,
}

/// Folds and checks one task's stream; `on_record` sees every intact record.
fn scan_task(
    journal: &Journal,
    task: &str,
    on_record: &mut dyn FnMut(&Record),
) -> Result<Scan, Error> {
    scan_records(task, journal.read_stream(task, 0), on_record)
}

/// [`scan_task`] over records already being read.
fn scan_records(
    task: &str,
    records: impl Iterator<Item = Result<Record, Error>>,
    on_record: &mut dyn FnMut(&Record),
) -> Result<Scan, Error> {
    let mut report = TaskReport {
        task: task.to_owned(),
        exists: false,
        records: 0,
        bytes: 0,
        status: None,
        version: 0,
        terminal: false,
        problems: Vec::new(),
    };
    let mut damaged = HashSet::new();
    let mut fold: Option<Task> = None;
    let mut folding = true;
    // id → (position, seq) of queued notifications, tracked without the fold so that the
    // outbox can be checked even past an illegal record.
    let mut queued: HashMap<String, (u64, u64)> = HashMap::new();
    for item in records {
        let record = match item {
            Ok(record) => record,
            Err(Error::Corruption { position, kind, .. }) => {
                report.exists = true;
                damaged.insert(position);
                report
                    .problems
                    .push(Problem::corruption(task, position, &kind));
                folding = false;
                continue;
            }
            Err(e) => return Err(e),
        };
        report.exists = true;
        report.records += 1;
        report.bytes += record.size as u64;
        on_record(&record);
        if record.event.is_terminal() {
            report.terminal = true;
        }
        track_notifications(task, &record, &mut queued, &mut report.problems);
        if !folding {
            continue;
        }
        let position = record.position;
        let applied = match fold.as_mut() {
            None => Task::created(task, &record.event).map(|t| fold = Some(t)),
            Some(t) => {
                consistency(task, t, &record, &mut report.problems);
                t.apply(&record.event)
            }
        };
        if let Err(error) = applied {
            report.problems.push(Problem::new(
                task,
                Some(position),
                ProblemKind::Illegal,
                error.to_string(),
            ));
            folding = false;
        }
    }
    if let Some(t) = &fold {
        report.status = Some(t.state.status);
        report.version = t.state.version;
    }
    let unacked = queued.into_values().map(|(position, _)| position).collect();
    Ok(Scan {
        report,
        damaged,
        unacked,
    })
}

/// Tracks queued notifications and checks that an acknowledgement names its enqueue record.
fn track_notifications(
    task: &str,
    record: &Record,
    queued: &mut HashMap<String, (u64, u64)>,
    problems: &mut Vec<Problem>,
) {
    match &record.event {
        Event::NotificationEnqueued { id, .. } => {
            queued.insert(id.clone(), (record.position, record.seq));
        }
        Event::NotificationAcked {
            id, enqueued_seq, ..
        } => {
            if let Some((_, seq)) = queued.remove(id) {
                if seq != *enqueued_seq {
                    problems.push(Problem::new(
                        task,
                        Some(record.position),
                        ProblemKind::Inconsistent,
                        format!(
                            "ack of {id:?} names sequence {enqueued_seq}, it was queued at {seq}"
                        ),
                    ));
                }
            }
        }
        _ => {}
    }
}

/// Checks the fields of `record` that the fold does not need against the state before it.
fn consistency(task: &str, t: &Task, record: &Record, problems: &mut Vec<Problem>) {
    let s = &t.state;
    let mut problem = |detail: String| {
        problems.push(Problem::new(
            task,
            Some(record.position),
            ProblemKind::Inconsistent,
            detail,
        ));
    };
    match &record.event {
        Event::LeaseExpired { deadline, at, .. } if s.status == Status::Running => {
            if s.lease_deadline != Some(*deadline) {
                problem(format!(
                    "lease expiry names deadline {}, the lease in force ends at {}",
                    deadline.as_millis(),
                    s.lease_deadline
                        .map_or(0, dtask_journal::Timestamp::as_millis)
                ));
            }
            if at < deadline {
                problem(format!(
                    "lease expiry recorded at {} before its deadline {}",
                    at.as_millis(),
                    deadline.as_millis()
                ));
            }
        }
        Event::NotificationEnqueued { version, .. } if *version != s.version => {
            problem(format!(
                "notification queued with version {version}, the task is at version {}",
                s.version
            ));
        }
        _ => {}
    }
}

/// Whether `live` (the index says the task is live) agrees with the report. A stream with
/// damage may hide its terminal event: then only a terminal task listed as live is wrong.
fn check_live(report: &mut TaskReport, live: bool, damaged: bool) {
    if report.terminal && live {
        report.problems.push(Problem::new(
            &report.task,
            None,
            ProblemKind::LiveIndex,
            "the task is terminal but listed in the live index",
        ));
    } else if !report.terminal && !live && report.records > 0 && !damaged {
        report.problems.push(Problem::new(
            &report.task,
            None,
            ProblemKind::LiveIndex,
            "the task is not terminal but missing from the live index",
        ));
    }
}

/// Compares outbox entries with the unacknowledged notifications (`expected`: task → positions),
/// removing what matches; reports entries that match nothing. `damaged` skips entries whose
/// record damage was already reported.
fn check_outbox<'a>(
    journal: &'a Journal,
    only: Option<&str>,
    expected: &mut BTreeSet<(String, u64)>,
    damaged: &dyn Fn(&str, u64) -> bool,
    problems: &mut Vec<Problem>,
) -> Result<u64, Error> {
    let mut entries = 0;
    for item in journal.outbox() {
        match item {
            Ok(c) => {
                if only.is_some_and(|t| t != c.task) {
                    continue;
                }
                entries += 1;
                let key = (c.task.clone(), c.record.position);
                let is_enqueue = matches!(c.record.event, Event::NotificationEnqueued { .. });
                if !is_enqueue {
                    problems.push(Problem::new(
                        &c.task,
                        Some(c.record.position),
                        ProblemKind::OutboxIndex,
                        format!(
                            "an outbox entry points at a `{}` record",
                            c.record.event.event_type()
                        ),
                    ));
                } else if !expected.remove(&key) {
                    problems.push(Problem::new(
                        &c.task,
                        Some(c.record.position),
                        ProblemKind::OutboxIndex,
                        "an outbox entry points at a notification that was acknowledged \
                         (or is listed twice)",
                    ));
                }
            }
            Err(Error::Corruption {
                task,
                position,
                kind,
            }) => {
                if only.is_some_and(|t| t != task) {
                    continue;
                }
                entries += 1;
                if !damaged(&task, position) {
                    problems.push(Problem::new(
                        &task,
                        Some(position),
                        ProblemKind::OutboxIndex,
                        format!("an outbox entry points at an unreadable record: {kind}"),
                    ));
                }
            }
            Err(e) => return Err(e),
        }
    }
    for (task, position) in std::mem::take(expected) {
        problems.push(Problem::new(
            &task,
            Some(position),
            ProblemKind::OutboxIndex,
            "an unacknowledged notification is missing from the outbox index",
        ));
    }
    Ok(entries)
}

/// Audits one task: its records, its legality, and its entries in the `live` and
/// `outbox` indexes. An unknown task gives a report with `exists == false`.
///
/// # Errors
/// [`Error::Storage`] (or another non-corruption journal error) when the journal cannot be
/// read; damage is reported in the result, never as an error.
pub fn audit_task(journal: &Journal, task: &str) -> Result<TaskReport, Error> {
    let mut scan = scan_task(journal, task, &mut |_| {})?;
    if !scan.report.exists {
        return Ok(scan.report);
    }
    let mut live = false;
    for id in journal.live_tasks() {
        match id {
            Ok(id) if id == task => live = true,
            Ok(_) | Err(Error::Corruption { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    check_live(&mut scan.report, live, !scan.damaged.is_empty());
    let mut expected = scan.unacked.iter().map(|&p| (task.to_owned(), p)).collect();
    let damaged = |_: &str, p: u64| scan.damaged.contains(&p);
    let mut problems = Vec::new();
    check_outbox(journal, Some(task), &mut expected, &damaged, &mut problems)?;
    scan.report.problems.extend(problems);
    Ok(scan.report)
}

/// Audits the whole journal: every task (see [`audit_task`]), then the `live`, `commits` and
/// `outbox` indexes against the streams. `progress` is called after each task.
///
/// The journal is read in a few forward passes — the streams and the `live`
/// index in task order, the `commits` index in sequence order — never all held at once: a
/// reader thread hands batches of raw streams to worker threads that verify, decode and fold
/// them, and the results are taken in task order (the report is the same as a sequential
/// audit's). The commit index is checked against the streams through an order-independent
/// fingerprint of (sequence, event key) pairs; only when it disagrees is the index walked
/// again entry by entry to name what is wrong.
///
/// # Errors
/// [`Error::Storage`] (or another non-corruption journal error) when the journal cannot be
/// read; damage is reported in the result, never as an error.
pub fn audit_journal(
    journal: &Journal,
    progress: &mut dyn FnMut(Progress),
) -> Result<AuditReport, Error> {
    let last_seq = last_commit_seq(journal)?;
    std::thread::scope(|scope| {
        let commits = scope.spawn(|| CommitSummary::read(journal));
        let (batches, results, tokens) = pipeline::start(scope, journal);
        let report = collect(journal, last_seq, &results, &tokens, progress);
        drop((results, tokens));
        let commits = commits
            .join()
            .unwrap_or_else(|_| Err(Error::Storage("the commit index reader failed".into())));
        let batches = batches
            .join()
            .map_err(|_| Error::Storage("the journal reader failed".into()));
        let (report, events) = report?;
        batches?;
        finish(journal, report, &commits?, &events)
    })
}

/// What the in-order pass over the task results leaves for the index checks.
struct Collected {
    report: AuditReport,
    damaged: HashMap<String, HashSet<u64>>,
    unacked: BTreeSet<(String, u64)>,
    /// The tail marker the streams call for.
    tail: dtask_journal::Tail,
}

/// Takes the task results in task order and builds the report: everything but the `commits`
/// and `outbox` checks. Returns the fingerprint of the intact records' (sequence, key) pairs.
#[allow(
    clippy::too_many_lines,
    reason = "the live-index merge and the per-task bookkeeping read best together"
)]
fn collect(
    journal: &Journal,
    last_seq: u64,
    results: &pipeline::Results,
    tokens: &pipeline::Tokens,
    progress: &mut dyn FnMut(Progress),
) -> Result<(Collected, Fingerprint), Error> {
    let mut report = AuditReport {
        last_seq,
        ..AuditReport::default()
    };
    let mut live = journal.live_tasks().peekable();
    let mut live_unreadable = Vec::new();
    let mut live_unknown = Vec::new();
    let mut task_problems = Vec::new();
    // Takes the live index up to `task`: entries before it list tasks without records;
    // returns whether `task` itself is listed.
    let mut live_until = |task: Option<&str>, report: &mut AuditReport| -> Result<bool, Error> {
        loop {
            let next = match live.peek() {
                None => return Ok(false),
                Some(Ok(id)) => match task {
                    Some(task) if id.as_str() > task => return Ok(false),
                    Some(task) if id == task => Ordering::Equal,
                    _ => Ordering::Less,
                },
                Some(Err(_)) => Ordering::Less,
            };
            match live.next() {
                Some(Ok(id)) => {
                    report.live += 1;
                    if next == Ordering::Equal {
                        return Ok(true);
                    }
                    live_unknown.push(Problem::new(
                        &id,
                        None,
                        ProblemKind::LiveIndex,
                        "the live index lists a task the journal does not have",
                    ));
                }
                Some(Err(Error::Corruption { task, kind, .. })) => {
                    live_unreadable.push(Problem::new(
                        &task,
                        None,
                        ProblemKind::LiveIndex,
                        format!("unreadable live index entry: {kind}"),
                    ));
                }
                Some(Err(e)) => return Err(e),
                None => return Ok(false),
            }
        }
    };
    // The sequences of the intact records, sparse: a forged sequence cannot size anything.
    let mut seqs = roaring::RoaringTreemap::new();
    let mut damaged: HashMap<String, HashSet<u64>> = HashMap::new();
    let mut unacked = BTreeSet::new();
    let mut tally = Progress {
        total_records: last_seq,
        ..Progress::default()
    };
    let mut events = Fingerprint::default();
    // The tail marker the streams call for: their last sequence, and the heads of the tasks
    // without a terminal event.
    let mut tail = dtask_journal::Tail::default();
    for outcomes in results.in_order(tokens) {
        for outcome in outcomes {
            let (mut scan, records) = match outcome {
                pipeline::Outcome::Failed(e) => return Err(e),
                pipeline::Outcome::Task(scan, records, fingerprint) => {
                    events.add(&fingerprint);
                    (scan, records)
                }
            };
            let task = scan.report.task.clone();
            let mut seq_problems = Vec::new();
            for &(position, seq) in &records {
                let detail = if seq > last_seq {
                    format!(
                        "the record's sequence {seq} has no commit entry (the index ends at \
                         {last_seq})"
                    )
                } else if seqs.insert(seq) {
                    continue;
                } else {
                    format!("sequence {seq} is carried by two records")
                };
                seq_problems.push(Problem::new(
                    &task,
                    Some(position),
                    ProblemKind::CommitIndex,
                    detail,
                ));
            }
            if let Some(&(position, seq)) = records.iter().max_by_key(|(position, _)| *position) {
                tail.last_seq = tail.last_seq.max(seq);
                if !scan.report.terminal {
                    let head = dtask_journal::Head {
                        next_position: position + 1,
                        last_seq: seq,
                        ..dtask_journal::Head::default()
                    };
                    tail.live.add(&task, &head);
                }
            }
            let listed = live_until(Some(&task), &mut report)?;
            check_live(&mut scan.report, listed, !scan.damaged.is_empty());
            report.tasks += 1;
            report.records += scan.report.records;
            report.bytes += scan.report.bytes;
            tally.tasks += 1;
            tally.records += scan.report.records + scan.damaged.len() as u64;
            task_problems.append(&mut scan.report.problems);
            task_problems.append(&mut seq_problems);
            for position in scan.unacked {
                unacked.insert((task.clone(), position));
            }
            if !scan.damaged.is_empty() {
                damaged.insert(task, scan.damaged);
            }
            progress(tally);
        }
    }
    live_until(None, &mut report)?;
    report.problems = live_unreadable;
    report.problems.append(&mut task_problems);
    report.problems.append(&mut live_unknown);
    Ok((
        Collected {
            report,
            damaged,
            unacked,
            tail,
        },
        events,
    ))
}

/// The `commits` and `outbox` checks, once every stream was read.
fn finish(
    journal: &Journal,
    collected: Collected,
    commits: &CommitSummary,
    events: &Fingerprint,
) -> Result<AuditReport, Error> {
    let Collected {
        mut report,
        damaged,
        mut unacked,
        tail,
    } = collected;
    let is_damaged =
        |task: &str, position: u64| damaged.get(task).is_some_and(|d| d.contains(&position));
    if !commits.agrees_with(events) {
        // Something is wrong with the index: walk it entry by entry to say what.
        check_commits(journal, &is_damaged, &mut report.problems)?;
    }
    report.outbox = check_outbox(
        journal,
        None,
        &mut unacked,
        &is_damaged,
        &mut report.problems,
    )?;
    if damaged.is_empty() {
        // With damage in the streams what they call for is unknown; the damage is reported.
        check_tail(journal, &tail, report.records > 0, &mut report.problems)?;
    }
    check_layout(journal, &mut report.problems)?;
    Ok(report)
}

/// The last well-formed sequence of the commit index (0 when there is none). A malformed
/// last entry is reported by the index walk; here it is stepped over, so that it sizes
/// nothing.
fn last_commit_seq(journal: &Journal) -> Result<u64, Error> {
    match journal.last_seq() {
        Ok(seq) => Ok(seq),
        Err(Error::Corruption { .. }) => {
            let mut last = 0;
            journal.for_each_commit_entry(&mut |key, _| {
                if let Ok(seq) = dtask_journal::keys::parse_seq_key(key) {
                    last = seq;
                }
            })?;
            Ok(last)
        }
        Err(e) => Err(e),
    }
}

/// Compares the tail marker (format 3 on) with what the streams call for (`expected`).
fn check_tail(
    journal: &Journal,
    expected: &dtask_journal::Tail,
    has_records: bool,
    problems: &mut Vec<Problem>,
) -> Result<(), Error> {
    let marker = match journal.read_tail() {
        Ok(Some(marker)) => marker,
        Ok(None) => {
            if journal.format_version() >= 3 && has_records {
                problems.push(Problem::new(
                    "",
                    None,
                    ProblemKind::TailMarker,
                    format!(
                        "a format-{} journal without a tail marker",
                        journal.format_version()
                    ),
                ));
            }
            return Ok(());
        }
        Err(Error::Corruption { kind, .. }) => {
            problems.push(Problem::new(
                "",
                None,
                ProblemKind::TailMarker,
                format!("the tail marker is unreadable: {kind}"),
            ));
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let mut differences = Vec::new();
    if marker.last_seq != expected.last_seq {
        differences.push(format!(
            "it says the last sequence is {}, the streams end at {}",
            marker.last_seq, expected.last_seq
        ));
    }
    if marker.live != expected.live {
        differences.push(format!(
            "it records {} live tasks (heads {}), the streams have {} (heads {})",
            marker.live.tasks, marker.live.digest, expected.live.tasks, expected.live.digest
        ));
    }
    if !differences.is_empty() {
        problems.push(Problem::new(
            "",
            None,
            ProblemKind::TailMarker,
            format!(
                "the tail marker disagrees with the streams: {}",
                differences.join("; ")
            ),
        ));
    }
    Ok(())
}

/// Keys the layout has no place for, and a layout that disagrees with the format version.
/// (A format-3 journal that still has format 1's `heads` space is an upgrade cut short between
/// its two steps, which the next writable open finishes: not a problem.)
fn check_layout(journal: &Journal, problems: &mut Vec<Problem>) -> Result<(), Error> {
    /// Unknown keys reported at most, each; a count follows.
    const MAX: usize = 100;
    for (space, key) in journal.foreign_keys(MAX)? {
        problems.push(Problem::new(
            "",
            None,
            ProblemKind::Layout,
            format!(
                "unknown key {:?} in the `{space}` space",
                String::from_utf8_lossy(&key)
            ),
        ));
    }
    let format = journal.format_version();
    if format == 1 && !journal.has_legacy_heads() {
        problems.push(Problem::new(
            "",
            None,
            ProblemKind::Layout,
            "stamped format 1 but laid out as a newer format (no `heads` space)",
        ));
    }
    if format < 3 && matches!(journal.read_tail(), Ok(Some(_)) | Err(_)) {
        problems.push(Problem::new(
            "",
            None,
            ProblemKind::Layout,
            format!("stamped format {format} but laid out as format 3 (a tail marker)"),
        ));
    }
    Ok(())
}

/// An order-independent fingerprint of a set of (sequence, event key) pairs
/// ([`dtask_journal::PairHash`]) and their count. It tells an intact index from a damaged one
/// (any difference sends the audit to the entry-by-entry check); it is not meant to resist
/// deliberate forgery, which the index is not protected against anyway.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Fingerprint {
    pairs: dtask_journal::PairHash,
    count: u64,
    /// A pair that cannot be compared this way was seen (a key that does not parse back).
    opaque: bool,
}

impl Fingerprint {
    fn add_pair(&mut self, seq: u64, key: &[u8]) {
        self.pairs.add(seq, key);
        self.count += 1;
    }

    fn add(&mut self, other: &Self) {
        self.pairs.merge(&other.pairs);
        self.count += other.count;
        self.opaque |= other.opaque;
    }
}

/// One pass over the `commits` index: whether it is dense from 1 with well-formed keys, and
/// the fingerprint of its (sequence, event key) entries.
struct CommitSummary {
    dense: bool,
    fingerprint: Fingerprint,
}

impl CommitSummary {
    fn read(journal: &Journal) -> Result<Self, Error> {
        let mut summary = Self {
            dense: true,
            fingerprint: Fingerprint::default(),
        };
        let mut next = 1u64;
        journal.for_each_commit_entry(&mut |key, value| {
            match dtask_journal::keys::parse_seq_key(key) {
                Ok(seq) if seq == next => summary.fingerprint.add_pair(seq, value),
                _ => summary.dense = false,
            }
            next += 1;
        })?;
        Ok(summary)
    }

    /// Whether the index holds exactly the (sequence, key) pairs of the intact records, so
    /// that an entry-by-entry check would find nothing.
    fn agrees_with(&self, events: &Fingerprint) -> bool {
        self.dense && !events.opaque && self.fingerprint == *events
    }
}

/// The threads of [`audit_journal`]: one reads raw streams in task order and hands them out in
/// numbered batches, workers verify and fold them, and [`pipeline::Results::in_order`] gives
/// the results back in batch order. At most [`pipeline::IN_FLIGHT`] batches exist at a time
/// (a token is taken per batch and returned when its results are consumed), so memory is
/// bounded by the batch size, not by the journal.
mod pipeline {
    use super::{scan_records, Fingerprint, Scan};
    use dtask_journal::{Error, Journal, RawStream};
    use std::collections::BTreeMap;
    use std::sync::mpsc::{self, Receiver, SyncSender};
    use std::sync::{Arc, Mutex};
    use std::thread::{Scope, ScopedJoinHandle};

    /// Batches in flight at most.
    pub(super) const IN_FLIGHT: usize = 16;
    /// A batch is sent once it holds this many records (or [`BATCH_TASKS`] tasks).
    const BATCH_RECORDS: usize = 2048;
    const BATCH_TASKS: usize = 256;

    /// A task's result.
    pub(super) enum Outcome {
        /// The scan, the (position, sequence) of every intact record, and their fingerprint.
        Task(Scan, Vec<(u64, u64)>, Fingerprint),
        /// The journal could not be read.
        Failed(Error),
    }

    /// The tokens bounding the batches in flight.
    pub(super) struct Tokens(SyncSender<()>);

    /// Results as workers finish them.
    pub(super) struct Results(Receiver<(usize, Vec<Outcome>)>);

    impl Results {
        /// The batches' outcomes in batch order; each batch consumed returns its token.
        pub(super) fn in_order<'a>(
            &'a self,
            tokens: &'a Tokens,
        ) -> impl Iterator<Item = Vec<Outcome>> + 'a {
            let mut waiting: BTreeMap<usize, Vec<Outcome>> = BTreeMap::new();
            let mut next = 0;
            std::iter::from_fn(move || loop {
                if let Some(batch) = waiting.remove(&next) {
                    next += 1;
                    let _ = tokens.0.send(());
                    return Some(batch);
                }
                let (index, batch) = self.0.recv().ok()?;
                waiting.insert(index, batch);
            })
        }
    }

    /// Starts the reader and the workers.
    pub(super) fn start<'scope>(
        scope: &'scope Scope<'scope, '_>,
        journal: &'scope Journal,
    ) -> (ScopedJoinHandle<'scope, ()>, Results, Tokens) {
        let (token_tx, token_rx) = mpsc::sync_channel(IN_FLIGHT);
        for _ in 0..IN_FLIGHT {
            let _ = token_tx.send(());
        }
        let (batch_tx, batch_rx) = mpsc::sync_channel::<(usize, Vec<RawStream>)>(IN_FLIGHT);
        let (result_tx, result_rx) = mpsc::channel();
        let batch_rx = Arc::new(Mutex::new(batch_rx));
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(1, 8));
        for _ in 0..workers {
            let batch_rx = Arc::clone(&batch_rx);
            let result_tx = result_tx.clone();
            scope.spawn(move || work(&batch_rx, &result_tx));
        }
        let reader = scope.spawn(move || read(journal, &token_rx, &batch_tx));
        (reader, Results(result_rx), Tokens(token_tx))
    }

    /// Reads the streams of every task, in task order.
    fn read(
        journal: &Journal,
        tokens: &Receiver<()>,
        batches: &SyncSender<(usize, Vec<RawStream>)>,
    ) {
        let mut scanner = journal.stream_scanner();
        let mut batch = Vec::new();
        let mut records = 0;
        let mut index = 0;
        let mut send = |batch: &mut Vec<RawStream>| -> bool {
            if tokens.recv().is_err() {
                return false;
            }
            let sent = batches.send((index, std::mem::take(batch))).is_ok();
            index += 1;
            sent
        };
        loop {
            let mut stream = RawStream::default();
            if !scanner.read_next(&mut stream) {
                break;
            }
            records += stream.len();
            batch.push(stream);
            if records >= BATCH_RECORDS || batch.len() >= BATCH_TASKS {
                records = 0;
                if !send(&mut batch) {
                    return;
                }
            }
        }
        if !batch.is_empty() {
            send(&mut batch);
        }
    }

    /// Verifies and folds batches until the reader is done.
    fn work(
        batches: &Mutex<Receiver<(usize, Vec<RawStream>)>>,
        results: &mpsc::Sender<(usize, Vec<Outcome>)>,
    ) {
        loop {
            let next = match batches.lock() {
                Ok(rx) => rx.recv(),
                Err(_) => return,
            };
            let Ok((index, units)) = next else {
                return;
            };
            let outcomes = units.into_iter().map(outcome).collect();
            if results.send((index, outcomes)).is_err() {
                return;
            }
        }
    }

    fn outcome(stream: RawStream) -> Outcome {
        let records = stream.into_records();
        let task = records.task().to_owned();
        let valid = dtask_journal::keys::is_valid_task_id(&task);
        let mut seqs = Vec::new();
        let mut fingerprint = Fingerprint {
            opaque: !valid,
            ..Fingerprint::default()
        };
        let mut key = dtask_journal::keys::task_prefix(&task);
        let prefix = key.len();
        let mut on_record = |record: &dtask_journal::Record| {
            seqs.push((record.position, record.seq));
            key.truncate(prefix);
            key.extend_from_slice(&record.position.to_be_bytes());
            fingerprint.add_pair(record.seq, &key);
        };
        match scan_records(&task, records, &mut on_record) {
            Ok(scan) => Outcome::Task(scan, seqs, fingerprint),
            Err(e) => Outcome::Failed(e),
        }
    }
}

/// Checks that the commit index is dense from 1 and that every entry points at a record
/// carrying that sequence.
fn check_commits(
    journal: &Journal,
    damaged: &dyn Fn(&str, u64) -> bool,
    problems: &mut Vec<Problem>,
) -> Result<(), Error> {
    let mut next = 1u64;
    // From the start of the index: an entry at sequence 0 is damage too.
    for item in journal.commits(0) {
        match item {
            Ok(c) => {
                let seq = c.record.seq;
                if seq > next {
                    problems.push(Problem::new(
                        &c.task,
                        Some(c.record.position),
                        ProblemKind::CommitIndex,
                        if seq == next + 1 {
                            format!("sequence {next} is missing from the commit index")
                        } else {
                            format!(
                                "sequences {next}..{} are missing from the commit index",
                                seq - 1
                            )
                        },
                    ));
                }
                next = seq + 1;
            }
            Err(Error::Corruption {
                task,
                position,
                kind,
            }) => {
                // The entry's own sequence is unknown; assume it is the next one.
                if task.is_empty() {
                    // The entry itself is malformed: its key or the key it names.
                    problems.push(Problem::new(
                        "",
                        None,
                        ProblemKind::CommitIndex,
                        format!(
                            "a malformed commit entry after sequence {}: {kind}",
                            next - 1
                        ),
                    ));
                    continue;
                } else if kind == CorruptionKind::Missing && !damaged(&task, position) {
                    // A record deleted at the end of its stream leaves no gap there: only
                    // the index still names it.
                    problems.push(Problem::new(
                        &task,
                        Some(position),
                        ProblemKind::Missing,
                        format!("record missing (deleted); sequence {next} of the commit index names it"),
                    ));
                } else if !damaged(&task, position) {
                    problems.push(Problem::new(
                        &task,
                        Some(position),
                        ProblemKind::CommitIndex,
                        format!("the commit entry of sequence {next} is wrong: {kind}"),
                    ));
                }
                next += 1;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

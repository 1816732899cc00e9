//! The audit: everything a journal promises, checked record by record.
//!
//! [`audit_task`] checks one task and [`audit_journal`] the whole journal; both open nothing and
//! write nothing, so a service can run them on its own [`Journal`] (a read-only or follower
//! handle works as well as the writer's). What is checked:
//!
//! - **every record**: its CRC, its framing and format version, the position it stores, the
//!   hash chain from the previous record (SHA-256, or BLAKE3 in older journals) — all reported per record by
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
//! - **links across streams**: a rerun's two ends name each other (`rerun_of` in the new
//!   task's stream, `rerun_as` in the original's: one append writes both), and a nested
//!   task's parent names it (`child_created`) and holds the input of each application
//!   notification the child put into its mailbox (`parent_notified`: one append writes
//!   both), with the same kind, data and delivery — or the other task was purged; a stream
//!   that
//!   did not fold whole is not held against the others (its damage is the finding);
//! - **the indexes**: the `live` index holds exactly the tasks without a terminal event;
//!   `commits` is dense from 1 to the last sequence and every entry points at a record carrying
//!   that sequence (and every record's sequence appears once); `outbox` holds exactly the
//!   `notification_enqueued` records not yet acknowledged.
//!
//! Problems are collected, never raised: the result is a report with one [`Problem`] per
//! finding. Only an I/O failure of the storage stops an audit early.

use crate::fold::Task;
use crate::parallel;
use crate::replay::{replay_records, tolerant, FoldView, Replay};
use crate::state::Status;
use dtask_journal::{
    application_notification_id, application_notification_source, CorruptionKind, Error, Event,
    Journal, Record,
};
use serde::Serialize;
use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::convert::Infallible;
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
    /// Whether a terminal event is recorded (or the stream is a purge's tombstone).
    pub terminal: bool,
    /// Whether the stream is the tombstone of a purged task (its records deleted).
    pub purged: bool,
    /// The stream's trimmed progress updates ([`Event::UpdateTrimmed`]).
    pub trimmed: u64,
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
    /// Purged tasks (streams of a tombstone alone).
    pub purged: u64,
    /// Records their purges deleted: the sequences the commit index lacks.
    pub purged_records: u64,
    /// Tasks whose progress was trimmed (streams holding trimmed updates).
    pub trimmed: u64,
    /// Progress updates trimmed, in all.
    pub trimmed_records: u64,
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
    /// What the stream says of other streams, when it says anything.
    links: Option<Box<Links>>,
}

/// What a stream says of other streams, which theirs must say back: a rerun's two ends
/// (`rerun_of` here, `rerun_as` there, written in one append) and a nested task's parent
/// (whose `child_created` names it, written in the same append as the child's creation).
#[derive(Debug, Default)]
struct Links {
    /// The task this one reruns.
    rerun_of: String,
    /// The tasks this one was rerun as.
    rerun_as: Vec<String>,
    /// The parent of a nested task.
    parent: String,
    /// The children this task's stream names.
    children: BTreeSet<String>,
    /// The input ids (and contents) of the application notifications this nested task put
    /// into its parent's mailbox (`parent_notified`), which the parent's inputs must hold.
    notified: Vec<(String, Notice)>,
    /// This task's inputs that are application notifications of its children: id → content.
    notices: HashMap<String, Notice>,
    /// Whether the stream folded whole (a damaged or illegal one says less than it held:
    /// its links are not held against others).
    whole: bool,
}

impl Links {
    /// The links of a folded task (`notified`: the input ids and contents of its
    /// `parent_notified` records; `notices`: its inputs from its children), `None` for one
    /// with none that folded whole.
    fn of(
        task: &Task,
        notified: Vec<(String, Notice)>,
        notices: HashMap<String, Notice>,
        whole: bool,
    ) -> Option<Box<Self>> {
        let s = &task.state;
        let lineage = s.lineage.as_deref();
        let layer = task.layer();
        // A stream that did not fold whole is kept even without links: others' links to it
        // are not held against it.
        if whole && lineage.is_none() && s.parent_task_id.is_empty() && layer.children.is_empty() {
            return None;
        }
        let notices = if layer.children.is_empty() {
            HashMap::new()
        } else {
            notices
        };
        Some(Box::new(Self {
            rerun_of: lineage.map(|l| l.rerun_of.clone()).unwrap_or_default(),
            rerun_as: lineage.map(|l| l.rerun_as.clone()).unwrap_or_default(),
            parent: s.parent_task_id.clone(),
            children: layer.children.clone(),
            notified,
            notices,
            whole,
        }))
    }
}

/// What an application notification to a parent carried — its kind, data and delivery — as
/// one hash, to hold a child's record against its parent's input without keeping the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Notice(u64);

impl Notice {
    /// The content of a `parent_notified` record or an `input_sent` of one.
    fn of(kind: &str, data: &[u8], event: &Event) -> Self {
        use std::hash::{Hash as _, Hasher as _};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        kind.hash(&mut hasher);
        data.hash(&mut hasher);
        event
            .delivery()
            .unwrap_or_default()
            .as_str()
            .hash(&mut hasher);
        Self(hasher.finish())
    }
}

/// Checks that every link names a stream that names it back — or a purged one (a purge
/// takes a tree whole, and a rerun's original may go before it) — once every stream was
/// read: a problem of the task whose link is not answered.
fn check_links(
    links: &HashMap<String, Box<Links>>,
    purged: &HashSet<String>,
    problems: &mut Vec<Problem>,
) {
    let mut ids: Vec<&String> = links.keys().collect();
    ids.sort();
    for id in ids {
        let mine = &links[id];
        let mut differs = Vec::new();
        let mut unanswered = |other: &str, what: &str, answered: &dyn Fn(&Links) -> bool| {
            let fine = match links.get(other) {
                Some(theirs) => answered(theirs) || !theirs.whole || !mine.whole,
                None => purged.contains(other) || !mine.whole,
            };
            if !fine {
                problems.push(Problem::new(
                    id,
                    None,
                    ProblemKind::Inconsistent,
                    format!("{what} {other:?}, whose stream does not name it back"),
                ));
            }
        };
        if !mine.rerun_of.is_empty() {
            unanswered(&mine.rerun_of, "a rerun of", &|t| t.rerun_as.contains(id));
        }
        for rerun in &mine.rerun_as {
            unanswered(rerun, "rerun as", &|t| t.rerun_of == *id);
        }
        if !mine.parent.is_empty() {
            unanswered(&mine.parent, "a nested task of", &|t| {
                t.children.contains(id)
            });
            for (input, notice) in &mine.notified {
                unanswered(
                    &mine.parent,
                    &format!("a notification ({input}) to its parent"),
                    &|t| t.notices.contains_key(input),
                );
                let held = links
                    .get(&mine.parent)
                    .filter(|theirs| theirs.whole && mine.whole)
                    .and_then(|theirs| theirs.notices.get(input));
                if held.is_some_and(|held| held != notice) {
                    differs.push(Problem::new(
                        id,
                        None,
                        ProblemKind::Inconsistent,
                        format!(
                            "a notification ({input}) to its parent {:?}, whose input of it \
                             has another kind, data or delivery",
                            mine.parent
                        ),
                    ));
                }
            }
            problems.append(&mut differs);
        }
    }
}

/// The audit's per-task checker: a [`Replay`] built on the damage-tolerant [`FoldView`],
/// which adds the checks the fold does not make and collects problems in stream order.
struct TaskChecker<'a> {
    task: &'a str,
    view: FoldView,
    terminal: bool,
    problems: Vec<Problem>,
    /// id → (position, seq) of queued notifications, tracked without the fold so that the
    /// outbox can be checked even past an illegal record.
    queued: HashMap<String, (u64, u64)>,
    /// The trimmed updates read, those read since the last trim's marker, and the updates
    /// the markers say they trimmed ([`Event::ProgressTrimmed`]).
    trims: Trims,
    /// The input ids and contents of the stream's `parent_notified` records.
    notified: Vec<(String, Notice)>,
    /// The stream's inputs that are its children's application notifications.
    notices: HashMap<String, Notice>,
    on_record: &'a mut dyn FnMut(&Record),
}

/// A stream's trimmed updates and its trims' markers, to account for each other.
#[derive(Debug, Default)]
struct Trims {
    /// Trimmed updates read.
    stubs: u64,
    /// Of them, those after the last marker, and the first one's position.
    after_marker: Option<(u64, u64)>,
    /// The updates the markers say they trimmed.
    claimed: u64,
}

impl Trims {
    fn track(&mut self, record: &Record) {
        match &record.event {
            Event::UpdateTrimmed { .. } => {
                self.stubs += 1;
                let (n, _) = self.after_marker.get_or_insert((0, record.position));
                *n += 1;
            }
            Event::ProgressTrimmed { records, .. } => {
                self.claimed = self.claimed.saturating_add(*records);
                self.after_marker = None;
            }
            _ => {}
        }
    }

    /// What is wrong: a trimmed update no trim's marker follows (a trim writes its marker
    /// after every update it trims), or markers and trimmed updates that disagree in number.
    fn check(&self, task: &str, problems: &mut Vec<Problem>) {
        if let Some((n, position)) = self.after_marker {
            problems.push(Problem::new(
                task,
                Some(position),
                ProblemKind::Inconsistent,
                format!("{n} trimmed update(s) with no trim's record after them"),
            ));
        } else if self.stubs != self.claimed {
            problems.push(Problem::new(
                task,
                None,
                ProblemKind::Inconsistent,
                format!(
                    "{} trimmed update(s), the trims' records account for {}",
                    self.stubs, self.claimed
                ),
            ));
        }
    }
}

impl<'a> TaskChecker<'a> {
    fn new(task: &'a str, on_record: &'a mut dyn FnMut(&Record)) -> Self {
        Self {
            task,
            view: FoldView::new(task),
            terminal: false,
            problems: Vec::new(),
            queued: HashMap::new(),
            trims: Trims::default(),
            notified: Vec::new(),
            notices: HashMap::new(),
            on_record,
        }
    }

    fn finish(mut self) -> Scan {
        // On a damaged stream the records that could not be read are not counted: the damage
        // is the finding.
        if self.view.damage.is_empty() {
            self.trims.check(self.task, &mut self.problems);
        }
        let whole = self.view.damage.is_empty() && self.view.illegal.is_none();
        let view = self.view;
        let folded = view.task.as_ref();
        let links = match folded {
            Some(t) => Links::of(t, self.notified, self.notices, whole),
            None if !whole => Some(Box::default()),
            None => None,
        };
        Scan {
            report: TaskReport {
                task: self.task.to_owned(),
                exists: view.exists(),
                records: view.records,
                bytes: view.bytes,
                status: folded.map(|t| t.state.status),
                version: folded.map_or(0, |t| t.state.version),
                terminal: self.terminal,
                purged: view.purged.is_some(),
                trimmed: self.trims.stubs,
                problems: self.problems,
            },
            damaged: view.damage.iter().map(|(position, _)| *position).collect(),
            unacked: self
                .queued
                .into_values()
                .map(|(position, _)| position)
                .collect(),
            links,
        }
    }
}

impl Replay for TaskChecker<'_> {
    type Error = Infallible;

    fn replay(&mut self, record: &Record) -> Result<(), Infallible> {
        (self.on_record)(record);
        if record.event.is_terminal() || matches!(record.event, Event::Purged { .. }) {
            self.terminal = true;
        }
        track_notifications(self.task, record, &mut self.queued, &mut self.problems);
        self.trims.track(record);
        match &record.event {
            Event::ParentNotified {
                event_id,
                kind,
                data,
                ..
            }
            | Event::ParentNotifiedV2 {
                event_id,
                kind,
                data,
                ..
            } => {
                let notice = Notice::of(kind, data, &record.event);
                self.notified
                    .push((application_notification_id(self.task, event_id), notice));
            }
            Event::InputSent {
                event_id,
                kind,
                data,
                ..
            } if application_notification_source(event_id).is_some() => {
                let notice = Notice::of(kind, data, &record.event);
                self.notices.insert(event_id.clone(), notice);
            }
            _ => {}
        }
        let folding = self.view.is_folding();
        if folding {
            if let Some(t) = &self.view.task {
                consistency(self.task, t, record, &mut self.problems);
            }
        }
        self.view.replay(record)?;
        if folding {
            if let Some((position, error)) = &self.view.illegal {
                self.problems.push(Problem::new(
                    self.task,
                    Some(*position),
                    ProblemKind::Illegal,
                    error.to_string(),
                ));
            }
        }
        Ok(())
    }

    fn damaged(&mut self, position: u64, kind: &CorruptionKind) -> bool {
        self.problems
            .push(Problem::corruption(self.task, position, kind));
        self.view.damaged(position, kind)
    }
}

/// Folds and checks one task's stream; `on_record` sees every intact record.
fn scan_records(
    task: &str,
    records: impl Iterator<Item = Result<Record, Error>>,
    on_record: &mut dyn FnMut(&Record),
) -> Result<Scan, Error> {
    let mut checker = TaskChecker::new(task, on_record);
    tolerant(replay_records(task, records, None, &mut checker))?;
    Ok(checker.finish())
}

/// Tracks queued notifications and checks that an acknowledgement names its enqueue record.
fn track_notifications(
    task: &str,
    record: &Record,
    queued: &mut HashMap<String, (u64, u64)>,
    problems: &mut Vec<Problem>,
) {
    match &record.event {
        Event::NotificationEnqueued { id, .. } | Event::NotificationEnqueuedV2 { id, .. } => {
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
    if s.status == Status::Running {
        fenced_write(s, record, &mut problem);
    }
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
        Event::NotificationEnqueued { event_id, .. }
        | Event::NotificationEnqueuedV2 { event_id, .. }
            if !event_id.is_empty() && s.status != Status::Running =>
        {
            // An application notification is sent by the running attempt only.
            problem(format!(
                "application notification {event_id:?} of a task that is {} (not running)",
                s.status
            ));
        }
        // The engine names every part (an empty id is an update's shorthand, written as one);
        // a trim would turn a nameless part into an update, and the stream would not fold.
        Event::PartAppended {
            event_id, part_id, ..
        } if part_id.is_empty() => {
            problem(format!("part of update {event_id:?} without a part id"));
        }
        Event::NotificationEnqueued { version, .. }
        | Event::NotificationEnqueuedV2 { version, .. }
            if *version != s.version =>
        {
            problem(format!(
                "notification queued with version {version}, the task is at version {}",
                s.version
            ));
        }
        _ => {}
    }
}

/// The attempt's fence (docs/semantics.md, "Fencing"), for what the fold cannot check
/// without a clock: a write of the running attempt is decided at its `at` while its lease is
/// live — so recorded before the lease's deadline — and, but for its acknowledgement of a
/// cancellation or a transcript failure, only without cancel intent. A record that breaks
/// it is a zombie's (a worker past its lease, or told to stop), which the engine refuses.
fn fenced_write(s: &crate::state::TaskState, record: &Record, problem: &mut impl FnMut(String)) {
    let event = &record.event;
    let (scoped, despite_cancel) = match event {
        Event::Heartbeat { .. }
        | Event::StartCommitted { .. }
        | Event::Completed { .. }
        | Event::Failed { .. }
        | Event::WaitingInput { .. }
        | Event::Suspended { .. }
        | Event::Yielded { .. }
        | Event::InputCommitted { .. }
        | Event::InputsPending { .. }
        | Event::CursorAdvanced { .. }
        | Event::UpdateAppended { .. }
        | Event::PartAppended { .. }
        // A trimmed update's stand-in keeps the attempt and the time of the update.
        | Event::UpdateTrimmed { .. }
        | Event::ChildCreated { .. }
        | Event::ParentNotified { .. }
        | Event::ParentNotifiedV2 { .. } => (true, false),
        // An application notification (a lifecycle one has no event id: the store's own).
        Event::NotificationEnqueued { event_id, .. }
        | Event::NotificationEnqueuedV2 { event_id, .. } => (!event_id.is_empty(), false),
        Event::TranscriptFailed { .. } | Event::Canceled { .. } => (true, true),
        _ => (false, false),
    };
    if !scoped {
        return;
    }
    let at = event.at();
    if let Some(deadline) = s.lease_deadline.filter(|deadline| at >= *deadline) {
        problem(format!(
            "{} of the running attempt recorded at {}, when its lease had ended (at {})",
            event.event_type(),
            at.as_millis(),
            deadline.as_millis()
        ));
    }
    if !despite_cancel && s.cancel_requested_at.is_some() {
        problem(format!(
            "{} of the running attempt after its cancellation was requested",
            event.event_type()
        ));
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
                let is_enqueue = matches!(
                    c.record.event,
                    Event::NotificationEnqueued { .. } | Event::NotificationEnqueuedV2 { .. }
                );
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
            Err(Error::MalformedEntry { kind, .. }) => {
                // The entry names no task: it belongs to no task's audit.
                if only.is_some() {
                    continue;
                }
                entries += 1;
                problems.push(Problem::new(
                    "",
                    None,
                    ProblemKind::OutboxIndex,
                    format!("a malformed outbox entry: {kind}"),
                ));
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
/// The task's stream and the indexes are read one after the other: audit a journal that is
/// being written (or followed) through its [`Journal::frozen`] view, as `dtask verify` and the
/// server do, or appends made meanwhile show as mismatches.
///
/// # Errors
/// [`AuditError::Journal`] when the journal cannot be read; damage is reported in the
/// result, never as an error.
pub fn audit_task(journal: &Journal, task: &str) -> Result<TaskReport, AuditError> {
    let mut scan = scan_records(task, journal.read_stream(task, 0), &mut |_| {})?;
    if !scan.report.exists {
        return Ok(scan.report);
    }
    let mut live = false;
    for id in journal.live_tasks() {
        match id {
            Ok(id) if id == task => live = true,
            Ok(_) => {}
            Err(e) if e.is_damage() => {}
            Err(e) => return Err(e.into()),
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
/// `outbox` indexes against the streams. `progress` is called after each task. Its passes
/// read the journal one after the other: audit a journal that is being written (or
/// followed) through its [`Journal::frozen`] view.
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
/// [`AuditError::Journal`] when the journal cannot be read; damage is reported in the
/// result, never as an error.
pub fn audit_journal(
    journal: &Journal,
    progress: &mut dyn FnMut(Progress),
) -> Result<AuditReport, AuditError> {
    let last_seq = last_commit_seq(journal)?;
    std::thread::scope(|scope| {
        let commits = scope.spawn(|| CommitSummary::read(journal));
        let (reader, batches) = pipeline::read(scope, journal);
        let mut collector = Collector::new(journal, last_seq);
        let mut failed = None;
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(1, 8));
        let pooled = parallel::ordered(
            workers,
            pipeline::IN_FLIGHT,
            batches.iter(),
            || (),
            |(), _, batch| pipeline::check(batch),
            |outcomes| {
                for outcome in outcomes {
                    if let Err(e) = collector.take(outcome, progress) {
                        failed = Some(e);
                        return false;
                    }
                }
                true
            },
        );
        // The reader ends once its batches are no longer taken.
        drop(batches);
        let commits = commits
            .join()
            .map_err(|_| AuditError::Panicked("the commit index reader"));
        let read = reader
            .join()
            .map_err(|_| AuditError::Panicked("the journal reader"));
        pooled.map_err(|parallel::Panicked| AuditError::Panicked("a worker"))?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        read?;
        let (collected, events) = collector.finish()?;
        Ok(finish(journal, collected, &commits??, &events)?)
    })
}

/// Why an audit could not run to its end. Damage never is: it is reported in the result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    /// The journal could not be read (I/O, or a storage failure).
    #[error(transparent)]
    Journal(#[from] Error),
    /// A thread of the audit panicked (a bug): its report would be incomplete.
    #[error("the audit failed: {0} panicked")]
    Panicked(&'static str),
}

/// What the in-order pass over the task results leaves for the index checks.
struct Collected {
    report: AuditReport,
    damaged: HashMap<String, HashSet<u64>>,
    unacked: BTreeSet<(String, u64)>,
    /// The tail marker the streams call for.
    tail: dtask_journal::Tail,
    /// The sequences the purge tombstones say they deleted.
    purged: Holes,
}

/// Takes the task results in task order and builds the report: everything but the `commits`
/// and `outbox` checks, and the fingerprint of the intact records' (sequence, key) pairs.
struct Collector<'j> {
    last_seq: u64,
    report: AuditReport,
    live: std::iter::Peekable<Box<dyn Iterator<Item = Result<String, Error>> + 'j>>,
    live_unreadable: Vec<Problem>,
    live_unknown: Vec<Problem>,
    task_problems: Vec<Problem>,
    /// The sequences of the intact records, sparse: a forged sequence cannot size anything.
    seqs: roaring::RoaringTreemap,
    damaged: HashMap<String, HashSet<u64>>,
    unacked: BTreeSet<(String, u64)>,
    tally: Progress,
    events: Fingerprint,
    /// The sequences the purge tombstones say they deleted.
    purged: Holes,
    /// The tail marker the streams call for: their last sequence, and the heads of the tasks
    /// without a terminal event.
    tail: dtask_journal::Tail,
    /// What the streams with links say of others ([`Links`]), and the purged tasks.
    links: HashMap<String, Box<Links>>,
    purged_tasks: HashSet<String>,
}

impl<'j> Collector<'j> {
    fn new(journal: &'j Journal, last_seq: u64) -> Self {
        Self {
            last_seq,
            report: AuditReport {
                last_seq,
                ..AuditReport::default()
            },
            live: (Box::new(journal.live_tasks()) as Box<dyn Iterator<Item = _>>).peekable(),
            live_unreadable: Vec::new(),
            live_unknown: Vec::new(),
            task_problems: Vec::new(),
            seqs: roaring::RoaringTreemap::new(),
            damaged: HashMap::new(),
            unacked: BTreeSet::new(),
            tally: Progress {
                total_records: last_seq,
                ..Progress::default()
            },
            events: Fingerprint::default(),
            purged: Holes::default(),
            tail: dtask_journal::Tail::default(),
            links: HashMap::new(),
            purged_tasks: HashSet::new(),
        }
    }

    /// Takes the live index up to `task`: entries before it list tasks without records;
    /// returns whether `task` itself is listed.
    fn live_until(&mut self, task: Option<&str>) -> Result<bool, Error> {
        loop {
            let next = match self.live.peek() {
                None => return Ok(false),
                Some(Ok(id)) => match task {
                    Some(task) if id.as_str() > task => return Ok(false),
                    Some(task) if id == task => Ordering::Equal,
                    _ => Ordering::Less,
                },
                Some(Err(_)) => Ordering::Less,
            };
            match self.live.next() {
                Some(Ok(id)) => {
                    self.report.live += 1;
                    if next == Ordering::Equal {
                        return Ok(true);
                    }
                    self.live_unknown.push(Problem::new(
                        &id,
                        None,
                        ProblemKind::LiveIndex,
                        "the live index lists a task the journal does not have",
                    ));
                }
                Some(Err(Error::MalformedEntry { kind, .. })) => {
                    self.live_unreadable.push(Problem::new(
                        "",
                        None,
                        ProblemKind::LiveIndex,
                        format!("unreadable live index entry: {kind}"),
                    ));
                }
                Some(Err(Error::Corruption { task, kind, .. })) => {
                    self.live_unreadable.push(Problem::new(
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
    }

    /// Takes the next task's result, in task order.
    fn take(
        &mut self,
        outcome: pipeline::Outcome,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<(), Error> {
        let (mut scan, records) = match outcome {
            pipeline::Outcome::Failed(e) => return Err(e),
            pipeline::Outcome::Task(scan, records, fingerprint, purged) => {
                self.events.add(&fingerprint);
                self.purged.merge(&purged);
                (scan, records)
            }
        };
        let task = scan.report.task.clone();
        let last_seq = self.last_seq;
        let mut seq_problems = Vec::new();
        for &(position, seq) in &records {
            let detail = if seq > last_seq {
                format!(
                    "the record's sequence {seq} has no commit entry (the index ends at \
                     {last_seq})"
                )
            } else if self.seqs.insert(seq) {
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
            self.tail.last_seq = self.tail.last_seq.max(seq);
            if !scan.report.terminal {
                let head = dtask_journal::Head {
                    next_position: position + 1,
                    last_seq: seq,
                    ..dtask_journal::Head::default()
                };
                self.tail.live.add(&task, &head);
            }
        }
        let listed = self.live_until(Some(&task))?;
        check_live(&mut scan.report, listed, !scan.damaged.is_empty());
        self.report.tasks += 1;
        if scan.report.purged {
            self.report.purged += 1;
            self.purged_tasks.insert(task.clone());
        }
        if let Some(links) = scan.links.take() {
            self.links.insert(task.clone(), links);
        }
        if scan.report.trimmed > 0 {
            self.report.trimmed += 1;
            self.report.trimmed_records += scan.report.trimmed;
        }
        self.report.records += scan.report.records;
        self.report.bytes += scan.report.bytes;
        self.tally.tasks += 1;
        self.tally.records += scan.report.records + scan.damaged.len() as u64;
        self.task_problems.append(&mut scan.report.problems);
        self.task_problems.append(&mut seq_problems);
        for position in scan.unacked {
            self.unacked.insert((task.clone(), position));
        }
        if !scan.damaged.is_empty() {
            self.damaged.insert(task, scan.damaged);
        }
        progress(self.tally);
        Ok(())
    }

    /// The live index past the last task, and the report in its order: unreadable live
    /// entries, the tasks' problems, live entries of unknown tasks.
    fn finish(mut self) -> Result<(Collected, Fingerprint), Error> {
        self.live_until(None)?;
        let mut report = self.report;
        report.purged_records = self.purged.count;
        check_links(&self.links, &self.purged_tasks, &mut self.task_problems);
        report.problems = self.live_unreadable;
        report.problems.append(&mut self.task_problems);
        report.problems.append(&mut self.live_unknown);
        Ok((
            Collected {
                report,
                damaged: self.damaged,
                unacked: self.unacked,
                tail: self.tail,
                purged: self.purged,
            },
            self.events,
        ))
    }
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
        purged,
    } = collected;
    let is_damaged =
        |task: &str, position: u64| damaged.get(task).is_some_and(|d| d.contains(&position));
    let holes_accounted = commits.missing == purged;
    if !commits.agrees_with(events) || !holes_accounted {
        // Something is wrong with the index: walk it entry by entry to say what.
        check_commits(journal, &is_damaged, holes_accounted, &mut report.problems)?;
        if !holes_accounted && purged.count > 0 {
            report.problems.push(Problem::new(
                "",
                None,
                ProblemKind::CommitIndex,
                format!(
                    "the purge tombstones account for {} deleted sequences, the commit index \
                     lacks {} (or others)",
                    purged.count, commits.missing.count
                ),
            ));
        }
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
        Err(e) if e.is_damage() => {
            let mut last = 0;
            journal.for_each_commit_entry(&mut |seq, _| {
                if let Some(seq) = seq {
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
        Err(Error::Corruption { kind, .. } | Error::MalformedEntry { kind, .. }) => {
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

/// A set of global sequences, summed order-independently
/// ([`dtask_journal::PairHash::add_sequence`]), and their count: those missing from the
/// commit index, and those the purge tombstones say they deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Holes {
    sum: dtask_journal::PairHash,
    count: u64,
}

impl Holes {
    fn merge(&mut self, other: &Self) {
        self.sum.merge(&other.sum);
        self.count = self.count.saturating_add(other.count);
    }
}

/// The longest run of sequences missing from the commit index that the audit sums up one by
/// one; a longer one (a forged entry's sequence, say) is reported, not walked.
const MAX_HOLE: u64 = 1 << 32;

/// One pass over the `commits` index: whether it is in order from 1 with well-formed keys,
/// the sequences missing from it (a purge's, or lost), and the fingerprint of its
/// (sequence, event key) entries.
struct CommitSummary {
    ordered: bool,
    missing: Holes,
    fingerprint: Fingerprint,
}

impl CommitSummary {
    fn read(journal: &Journal) -> Result<Self, Error> {
        let mut summary = Self {
            ordered: true,
            missing: Holes::default(),
            fingerprint: Fingerprint::default(),
        };
        let mut next = 1u64;
        journal.for_each_commit_entry(&mut |seq, value| match seq {
            Some(seq) if seq >= next && seq - next <= MAX_HOLE => {
                for hole in next..seq {
                    summary.missing.sum.add_sequence(hole);
                    summary.missing.count += 1;
                }
                summary.fingerprint.add_pair(seq, value);
                next = seq + 1;
            }
            _ => {
                summary.ordered = false;
                next += 1;
            }
        })?;
        Ok(summary)
    }

    /// Whether the index holds exactly the (sequence, key) pairs of the intact records, so
    /// that an entry-by-entry check would find nothing (its holes are compared with the
    /// purges' apart).
    fn agrees_with(&self, events: &Fingerprint) -> bool {
        self.ordered && !events.opaque && self.fingerprint == *events
    }
}

/// The audit's reading: a reader thread reads every task's raw stream in one forward pass and
/// hands them out in batches; the shared worker pool ([`parallel::ordered`]) verifies, decodes
/// and checks them, and the results come back in batch order. At most [`pipeline::IN_FLIGHT`]
/// batches are with the workers and as many wait in the channel, so memory is bounded by the
/// batch size (a few megabytes, or one stream larger than that: a stream is read whole), not
/// by the journal.
mod pipeline {
    use super::{scan_records, Fingerprint, Holes, Scan};
    use dtask_journal::{Error, Journal, RawStream};
    use std::sync::mpsc::{self, Receiver};
    use std::thread::{Scope, ScopedJoinHandle};

    /// Batches with the workers at most (and as many again waiting to be taken).
    pub(super) const IN_FLIGHT: usize = 16;
    /// A batch is sent once it holds this many records (or [`BATCH_TASKS`] tasks, or
    /// [`BATCH_BYTES`] bytes: records of megabytes each made batches of gigabytes).
    const BATCH_RECORDS: usize = 2048;
    const BATCH_TASKS: usize = 256;
    const BATCH_BYTES: usize = 4 << 20;

    /// A task's result.
    pub(super) enum Outcome {
        /// The scan, the (position, sequence) of every intact record, their fingerprint,
        /// and the sequences a purge tombstone among them says it deleted.
        Task(Scan, Vec<(u64, u64)>, Fingerprint, Holes),
        /// The journal could not be read.
        Failed(Error),
    }

    /// Starts the reader: the streams of every task, in task order, in batches.
    pub(super) fn read<'scope>(
        scope: &'scope Scope<'scope, '_>,
        journal: &'scope Journal,
    ) -> (ScopedJoinHandle<'scope, ()>, Receiver<Vec<RawStream>>) {
        let (batch_tx, batch_rx) = mpsc::sync_channel::<Vec<RawStream>>(IN_FLIGHT);
        let reader = scope.spawn(move || {
            let mut scanner = journal.stream_scanner();
            let mut batch = Vec::new();
            let (mut records, mut bytes) = (0, 0);
            loop {
                let mut stream = RawStream::default();
                if !scanner.read_next(&mut stream) {
                    break;
                }
                records += stream.len();
                bytes += stream.bytes();
                batch.push(stream);
                if records >= BATCH_RECORDS || batch.len() >= BATCH_TASKS || bytes >= BATCH_BYTES {
                    (records, bytes) = (0, 0);
                    if batch_tx.send(std::mem::take(&mut batch)).is_err() {
                        return;
                    }
                }
            }
            if !batch.is_empty() {
                let _ = batch_tx.send(batch);
            }
        });
        (reader, batch_rx)
    }

    /// Verifies, folds and checks a batch of streams.
    pub(super) fn check(batch: Vec<RawStream>) -> Vec<Outcome> {
        batch.into_iter().map(outcome).collect()
    }

    fn outcome(stream: RawStream) -> Outcome {
        let split = stream.is_split();
        let records = stream.into_records();
        let task = records.task().to_owned();
        let mut pairs = dtask_journal::TaskPairs::new(&task);
        let mut seqs = Vec::new();
        let mut fingerprint = Fingerprint {
            opaque: pairs.is_none(),
            ..Fingerprint::default()
        };
        let mut purged = Holes::default();
        let mut on_record = |record: &dtask_journal::Record| {
            if let dtask_journal::Event::Purged {
                records, sequences, ..
            } = &record.event
            {
                purged
                    .sum
                    .merge(&dtask_journal::PairHash::from_lanes(*sequences));
                purged.count = purged.count.saturating_add(*records);
            }
            seqs.push((record.position, record.seq));
            if let Some(pairs) = &mut pairs {
                pairs.add(&mut fingerprint.pairs, record.position, record.seq);
                fingerprint.count += 1;
            }
        };
        match scan_records(&task, records, &mut on_record) {
            Ok(mut scan) => {
                if split {
                    scan.report.problems.push(super::Problem::new(
                        &task,
                        None,
                        super::ProblemKind::Layout,
                        "the stream's records lie in both column families of the events \
                         space (a stream lies wholly in one): recovery, which looks for a live \
                         stream in `events` first, would read part of it",
                    ));
                }
                Outcome::Task(scan, seqs, fingerprint, purged)
            }
            Err(e) => Outcome::Failed(e),
        }
    }
}

/// Checks that the commit index is dense from 1 — but for the holes of purges, when
/// `holes_accounted` (the sequences missing are those the purge tombstones deleted) — and
/// that every entry points at a record carrying that sequence.
fn check_commits(
    journal: &Journal,
    damaged: &dyn Fn(&str, u64) -> bool,
    holes_accounted: bool,
    problems: &mut Vec<Problem>,
) -> Result<(), Error> {
    let mut next = 1u64;
    // From the start of the index: an entry at sequence 0 is damage too.
    for item in journal.commits(0) {
        match item {
            Ok(c) => {
                let seq = c.record.seq;
                if seq > next && !holes_accounted {
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
            Err(Error::MalformedEntry { kind, .. }) => {
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
            }
            Err(Error::Corruption {
                task,
                position,
                kind,
            }) => {
                // The entry's own sequence is unknown; assume it is the next one.
                if kind == CorruptionKind::Missing && !damaged(&task, position) {
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

//! The invariant checker of a torture run: what the journal, the acknowledgement log and the
//! ledger must say after any number of crashes.

use super::child::{POLL, POLLS, SHELL};
use super::Layout;
use crate::cli::{CliError, Result};
use dtask_engine::managed::codec::ToolPayload;
use dtask_journal::{Digest, Error as JournalError, Event, Journal, Record};
use dtask_replay::{
    audit_journal, replay_task, FoldError, Replay, ReplayError, Status, Task, TaskFold,
};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The heads of every task at one moment: (records, last digest).
pub type Heads = HashMap<String, (u64, Digest, u64)>;

/// Opens the torture journal read-only, or `None` when no child has created it yet — the
/// directory is missing or empty, or holds a database that is not a journal yet (a child was
/// killed while creating it: no format version, or not all of its column families). Nothing
/// can have been acknowledged then: every acknowledgement follows a durable append, and the
/// first append follows the format version.
///
/// # Errors
/// I/O errors reading the directory, and any other journal error.
pub fn open_if_created(layout: &Layout) -> Result<Option<Journal>> {
    if let Some(url) = layout.postgres() {
        return match Journal::open_postgres_read_only(url) {
            Ok(journal) => Ok(Some(journal)),
            Err(JournalError::NotAJournal(_)) => Ok(None),
            Err(e) => Err(e.into()),
        };
    }
    let path = layout.journal();
    let path = path.as_path();
    let empty = match std::fs::read_dir(path) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(CliError::io(format!("reading {}", path.display()))(e)),
    };
    if empty {
        return Ok(None);
    }
    match Journal::open_read_only(path) {
        Ok(journal) => Ok(Some(journal)),
        Err(JournalError::NotAJournal(_)) => Ok(None),
        Err(JournalError::Storage(storage))
            if storage.message().contains("Column family not found") =>
        {
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Reads the heads of every task.
///
/// # Errors
/// Journal errors (damage included).
pub fn heads(journal: &Journal) -> Result<Heads> {
    let mut heads = Heads::new();
    for item in journal.tasks() {
        let (task, head) = item?;
        heads.insert(task, (head.next_position, head.last_digest, head.last_seq));
    }
    Ok(heads)
}

/// The tombstone of `task`'s stream, if it was purged: (records deleted, the last one's
/// digest).
fn tombstone(journal: &Journal, task: &str) -> Result<Option<(u64, Digest)>> {
    let first = journal.read_stream(task, 0).next().transpose()?;
    Ok(first.and_then(|r| match r.event {
        Event::Purged {
            records,
            last_digest,
            ..
        } => Some((records, Digest(last_digest))),
        _ => None,
    }))
}

/// Checks that nothing durable before a crash went missing after it (damage read on the way
/// is a violation too): every task still
/// exists, its stream did not shrink, and the record it ended with is still there unchanged —
/// or, for a stream purged since, its tombstone stands for at least the records seen before
/// and, when for exactly those, chains from the one it ended with; for a stream whose progress
/// was trimmed since (a trim frames its records again), the record it ended with is still
/// there at its sequence.
///
#[must_use]
pub fn heads_grew(journal: &Journal, before: &Heads, now: &Heads) -> Vec<String> {
    let mut violations = Vec::new();
    for (task, (records, digest, seq)) in before {
        let Some((now_records, now_digest, _)) = now.get(task) else {
            violations.push(format!("task {task} vanished after a crash"));
            continue;
        };
        if (now_records, now_digest) == (records, digest) {
            continue;
        }
        let purged = match tombstone(journal, task) {
            Ok(purged) => purged,
            Err(e) => {
                violations.push(format!("task {task}: damaged after a crash: {e}"));
                continue;
            }
        };
        if let Some((deleted, last)) = purged {
            if deleted < *records || (deleted == *records && last != *digest) {
                violations.push(format!(
                    "task {task}: purged as {deleted} records, {records} were durable before \
                     a crash (or the last of them changed)"
                ));
            }
            continue;
        }
        if now_records < records {
            violations.push(format!(
                "task {task} shrank from {records} to {now_records} records after a crash"
            ));
        } else if now_records == records {
            if now_digest != digest {
                violations.push(format!(
                    "task {task}: its last record changed after a crash"
                ));
            }
        } else if *records > 0 {
            let position = records - 1;
            let mut stream = journal.read_stream(task, position);
            let last = match stream.next().transpose() {
                Ok(last) => last,
                Err(e) => {
                    violations.push(format!("task {task}: damaged after a crash: {e}"));
                    continue;
                }
            };
            let same = last
                .as_ref()
                .is_some_and(|r| r.position == position && r.digest == *digest);
            let trimmed_since = || -> std::result::Result<bool, JournalError> {
                for record in stream {
                    if matches!(record?.event, Event::ProgressTrimmed { .. }) {
                        return Ok(true);
                    }
                }
                Ok(false)
            };
            let kept = last
                .as_ref()
                .is_some_and(|r| r.position == position && r.seq == *seq);
            let trimmed = if same || !kept {
                Ok(false)
            } else {
                trimmed_since()
            };
            let trimmed = match trimmed {
                Ok(trimmed) => trimmed,
                Err(e) => {
                    violations.push(format!("task {task}: damaged after a crash: {e}"));
                    continue;
                }
            };
            if !(same || trimmed) {
                violations.push(format!(
                    "task {task}: record {position} changed after a crash"
                ));
            }
        }
    }
    violations
}

/// The acknowledgement log as far as the checks after the crashes have read it.
///
/// After each crash the lines appended since the last check are checked against the journal
/// as it is then — before the next engine runs. An acknowledged record lost in the crash
/// could otherwise be written again by the recovery that follows (a recovered tool emits its
/// updates again, under the same event ids), and the final check, which looks only for the
/// event id, would find it.
#[derive(Debug, Default)]
pub struct AckLog {
    /// Bytes of the log read so far (whole lines only).
    offset: u64,
}

impl AckLog {
    /// The whole lines appended to the log since the last call. Read before the journal is
    /// looked at: a line is written only after its record is durable, so every line read
    /// names a record the journal holds from then on.
    ///
    /// # Errors
    /// I/O errors reading the log.
    pub fn read_new(&mut self, layout: &Layout) -> Result<Vec<String>> {
        use std::io::{Read, Seek, SeekFrom};
        let path = layout.acks();
        let mut file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(CliError::io(format!("opening {}", path.display()))(e)),
        };
        let mut bytes = Vec::new();
        file.seek(SeekFrom::Start(self.offset))
            .and_then(|_| file.read_to_end(&mut bytes))
            .map_err(CliError::io(format!("reading {}", path.display())))?;
        let Some(end) = bytes.iter().rposition(|b| *b == b'\n') else {
            return Ok(Vec::new());
        };
        self.offset += end as u64 + 1;
        Ok(String::from_utf8_lossy(&bytes[..end])
            .lines()
            .map(str::to_owned)
            .collect())
    }
}

/// What one task's stream holds that acknowledgements are checked against.
#[derive(Debug, Default)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "one flag per kind of acknowledgement"
)]
struct Facts {
    exists: bool,
    purged: bool,
    event_ids: HashSet<String>,
    cancel: bool,
    input: bool,
    /// The positions of its trims' markers.
    trims: HashSet<u64>,
    damage: Option<String>,
}

fn facts(journal: &Journal, task: &str) -> Facts {
    let mut facts = Facts::default();
    for record in journal.read_stream(task, 0) {
        let record = match record {
            Ok(record) => record,
            Err(e) => {
                facts.damage.get_or_insert_with(|| e.to_string());
                continue;
            }
        };
        facts.exists = true;
        match record.event {
            Event::Purged { .. } if record.position == 0 => facts.purged = true,
            Event::UpdateAppended { event_id, .. } | Event::UpdateTrimmed { event_id, .. } => {
                facts.event_ids.insert(event_id);
            }
            Event::CancelRequested { .. } | Event::Canceled { .. } => facts.cancel = true,
            Event::InputProvided { .. } => facts.input = true,
            Event::ProgressTrimmed { .. } => {
                facts.trims.insert(record.position);
            }
            _ => {}
        }
    }
    facts
}

/// Checks acknowledgement `lines` (read before `journal` was opened) against it: each names
/// a record that must be there — or its task purged, the tombstone standing for it. One
/// violation per line that is not, and one per task damaged.
#[must_use]
pub fn acks_durable(journal: &Journal, lines: &[String]) -> Vec<String> {
    let mut violations = Vec::new();
    let mut read: HashMap<String, Facts> = HashMap::new();
    for line in lines {
        let fields: Vec<&str> = line.split('\t').collect();
        let Some(task) = fields.get(1).copied() else {
            violations.push(format!("unreadable acknowledgement line {line:?}"));
            continue;
        };
        let facts = read.entry(task.to_owned()).or_insert_with(|| {
            let facts = facts(journal, task);
            if let Some(damage) = &facts.damage {
                violations.push(format!("task {task}: damaged after a crash: {damage}"));
            }
            facts
        });
        if facts.purged {
            continue;
        }
        let kept = match fields.as_slice() {
            ["created", ..] => facts.exists,
            ["purged", ..] => false,
            ["cancel", _] => facts.cancel,
            ["resume", _] => facts.input,
            ["trimmed", _, position] => position
                .parse::<u64>()
                .is_ok_and(|position| facts.trims.contains(&position)),
            ["update", _, event_id] => facts.event_ids.contains(*event_id),
            _ => {
                violations.push(format!("unreadable acknowledgement line {line:?}"));
                continue;
            }
        };
        if !kept {
            violations.push(format!(
                "acknowledged {line:?} was lost in a crash (not in the journal after it)"
            ));
        }
    }
    violations
}

/// What the final check found.
#[derive(Debug, Default)]
pub struct Findings {
    /// Tasks in the journal.
    pub tasks: u64,
    /// Tasks by final status.
    pub by_status: BTreeMap<String, u64>,
    /// Tasks by tool.
    pub by_tool: BTreeMap<String, u64>,
    /// Records in the journal.
    pub records: u64,
    /// Progress updates in the journal.
    pub updates: u64,
    /// The most attempts any task took.
    pub max_attempts: u64,
    /// Lines of the acknowledgement log checked.
    pub acknowledged: u64,
    /// Side effects in the ledger.
    pub side_effects: u64,
    /// Durable timers the tasks waited on (`not_before` records).
    pub timers: u64,
    /// Tasks purged (their tombstones).
    pub purged: u64,
    /// Progress updates trimmed (their bytes dropped, their records kept).
    pub trimmed: u64,
    /// Invariant violations, one line each.
    pub violations: Vec<String>,
}

/// One task as the checker sees it.
struct Seen {
    task: Task,
    tool: String,
    token: String,
    cancel_requested: bool,
    input_provided: bool,
    /// The durable timers the task waited on (`not_before` records).
    timers: u64,
    /// Its attempts' check-backs (`yielded` records).
    check_backs: u64,
    /// The positions of its progress trims' markers (`progress_trimmed` records).
    trims: HashSet<u64>,
}

/// The torture's own checks of one stream, beside the fold: update event ids are unique, and
/// attempts only grow.
struct StreamCheck<'a> {
    fold: TaskFold<'a>,
    event_ids: HashSet<String>,
    last_attempt: u64,
    cancel_requested: bool,
    input_provided: bool,
    timers: u64,
    check_backs: u64,
    records: u64,
    updates: u64,
    trimmed: u64,
    trims: HashSet<u64>,
    violations: Vec<String>,
}

impl Replay for StreamCheck<'_> {
    type Error = FoldError;

    fn replay(&mut self, record: &Record) -> std::result::Result<(), FoldError> {
        self.records += 1;
        match &record.event {
            Event::UpdateAppended { event_id, .. } | Event::UpdateTrimmed { event_id, .. } => {
                self.updates += 1;
                if matches!(record.event, Event::UpdateTrimmed { .. }) {
                    self.trimmed += 1;
                }
                if !self.event_ids.insert(event_id.clone()) {
                    self.violations
                        .push(format!("event id {event_id:?} appears twice"));
                }
            }
            Event::AttemptStarted { attempt, .. } => {
                if *attempt <= self.last_attempt {
                    self.violations.push(format!(
                        "attempt {attempt} started after attempt {}",
                        self.last_attempt
                    ));
                }
                self.last_attempt = *attempt;
            }
            Event::CancelRequested { .. } => self.cancel_requested = true,
            Event::InputProvided { .. } => self.input_provided = true,
            Event::NotBefore { .. } => self.timers += 1,
            Event::Yielded { .. } => self.check_backs += 1,
            Event::ProgressTrimmed { .. } => {
                self.trims.insert(record.position);
            }
            _ => {}
        }
        self.fold.replay(record)
    }
}

/// Folds one task's stream, checking event ids and attempts on the way.
fn read_task(
    journal: &Journal,
    id: &str,
    findings: &mut Findings,
    purged: &mut HashSet<String>,
) -> Option<Seen> {
    let mut check = StreamCheck {
        fold: TaskFold::new(id),
        event_ids: HashSet::new(),
        last_attempt: 0,
        cancel_requested: false,
        input_provided: false,
        timers: 0,
        check_backs: 0,
        records: 0,
        updates: 0,
        trimmed: 0,
        trims: HashSet::new(),
        violations: Vec::new(),
    };
    let outcome = replay_task(journal, id, None, &mut check);
    findings.records += check.records;
    findings.updates += check.updates;
    findings.trimmed += check.trimmed;
    findings.violations.extend(
        check
            .violations
            .iter()
            .map(|violation| format!("task {id}: {violation}")),
    );
    match outcome {
        Ok(()) => {}
        Err(ReplayError::Rejected {
            error: FoldError::Purged { .. },
            ..
        }) => {
            findings.purged += 1;
            purged.insert(id.to_owned());
            return None;
        }
        Err(ReplayError::Rejected {
            position, error, ..
        }) => {
            findings.violations.push(format!(
                "task {id}: record {position} does not fold: {error}"
            ));
            return None;
        }
        Err(e) => {
            findings.violations.push(format!("task {id}: {e}"));
            return None;
        }
    }
    let (cancel_requested, input_provided, timers, check_backs, trims) = (
        check.cancel_requested,
        check.input_provided,
        check.timers,
        check.check_backs,
        check.trims,
    );
    let task = check.fold.finish()?;
    let (tool, token) = match ToolPayload::decode(&task.state.spec.payload) {
        Ok(payload) => {
            let token = serde_json::from_str::<serde_json::Value>(&payload.arguments)
                .ok()
                .and_then(|v| v.get("token").and_then(|t| t.as_str()).map(str::to_owned))
                .unwrap_or_default();
            (payload.tool_name, token)
        }
        Err(e) => {
            findings
                .violations
                .push(format!("task {id}: payload does not decode: {e}"));
            (String::new(), String::new())
        }
    };
    Some(Seen {
        task,
        tool,
        token,
        cancel_requested,
        input_provided,
        timers,
        check_backs,
        trims,
    })
}

/// The final check: `verify` is clean; every task is terminal; every acknowledged submission,
/// cancellation, answer and update is in the journal; no event id twice in a task; attempts
/// only grow; every recoverable side effect ran at most once per task (exactly once for a
/// completed shell task).
///
/// # Errors
/// Journal errors other than damage, and I/O errors reading the logs.
pub fn check(layout: &Layout) -> Result<Findings> {
    let mut findings = Findings::default();
    let Some(journal) = open_if_created(layout)? else {
        // No journal: whatever the acknowledgement log names is missing.
        let purged = check_acks(layout, &HashMap::new(), &HashSet::new(), &mut findings);
        check_ledger(layout, &HashMap::new(), &purged, &mut findings);
        return Ok(findings);
    };
    let audit = audit_journal(&journal, &mut |_| {})?;
    for problem in &audit.problems {
        findings.violations.push(format!("verify: {problem}"));
    }
    let mut seen: HashMap<String, Seen> = HashMap::new();
    let mut purged = HashSet::new();
    let ids: Vec<String> = journal
        .tasks()
        .map(|item| item.map(|(id, _)| id))
        .collect::<std::result::Result<_, _>>()?;
    for id in ids {
        findings.tasks += 1;
        let Some(task) = read_task(&journal, &id, &mut findings, &mut purged) else {
            continue;
        };
        let status = task.task.state.status;
        *findings
            .by_status
            .entry(status.as_str().to_owned())
            .or_default() += 1;
        *findings.by_tool.entry(task.tool.clone()).or_default() += 1;
        findings.max_attempts = findings.max_attempts.max(task.task.state.attempt);
        if !status.is_terminal() {
            findings
                .violations
                .push(format!("task {id} ({}) ended {status}", task.tool));
        }
        // A poll task that completed checked back after each look but the last, each
        // check-back recorded (none lost to a crash) with its durable timer — unless its time
        // had come already when the check-back was written, which then writes no timer.
        if task.tool == POLL && status == Status::Completed {
            let expected = format!("polled {POLLS} times");
            if task.task.state.result_data != expected.as_bytes()
                || task.check_backs < POLLS - 1
                || task.timers > task.check_backs
            {
                findings.violations.push(format!(
                    "poll task {id} completed with {:?} after {} check-backs ({} timers)",
                    String::from_utf8_lossy(&task.task.state.result_data),
                    task.check_backs,
                    task.timers
                ));
            }
        }
        findings.timers += task.timers;
        seen.insert(id, task);
    }
    let purged_tokens = check_acks(layout, &seen, &purged, &mut findings);
    check_ledger(layout, &seen, &purged_tokens, &mut findings);
    Ok(findings)
}

/// Checks every acknowledgement against the journal: a task purged since (its tombstone
/// in the journal) stands for what was acknowledged of it, and an acknowledged purge must
/// have left its tombstone. Returns the tokens of the purged tasks.
fn check_acks(
    layout: &Layout,
    seen: &HashMap<String, Seen>,
    purged: &HashSet<String>,
    findings: &mut Findings,
) -> HashSet<String> {
    let acks = std::fs::read_to_string(layout.acks()).unwrap_or_default();
    let mut purged_tokens = HashSet::new();
    for line in acks.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        findings.acknowledged += 1;
        let about = fields.get(1).copied().unwrap_or_default();
        if purged.contains(about) {
            match fields.as_slice() {
                ["created", _, _, token] | ["purged", _, token] => {
                    purged_tokens.insert((*token).to_owned());
                }
                _ => {}
            }
            continue;
        }
        let missing = match fields.as_slice() {
            ["purged", id, _] => Some(format!("acknowledged purge of {id} is missing")),
            ["created", id, tool, token] => match seen.get(*id) {
                None => Some(format!(
                    "acknowledged task {id} ({tool}, {token}) is missing"
                )),
                Some(task) if task.token != *token => Some(format!(
                    "task {id} carries token {:?}, acknowledged as {token:?}",
                    task.token
                )),
                Some(_) => None,
            },
            ["cancel", id] => match seen.get(*id) {
                Some(task)
                    if task.cancel_requested || task.task.state.status == Status::Canceled =>
                {
                    None
                }
                _ => Some(format!("acknowledged cancellation of {id} is missing")),
            },
            ["resume", id] => match seen.get(*id) {
                Some(task) if task.input_provided => None,
                _ => Some(format!("acknowledged answer to {id} is missing")),
            },
            ["trimmed", id, position] => match seen.get(*id) {
                Some(task)
                    if position
                        .parse::<u64>()
                        .is_ok_and(|position| task.trims.contains(&position)) =>
                {
                    None
                }
                _ => Some(format!(
                    "acknowledged trim of {id} (its marker at {position}) is missing"
                )),
            },
            ["update", id, event_id] => match seen.get(*id) {
                Some(task) if task.task.update_ids.contains_key(event_id) => None,
                _ => Some(format!(
                    "acknowledged update {event_id:?} of {id} is missing"
                )),
            },
            _ => Some(format!("unreadable acknowledgement line {line:?}")),
        };
        findings.violations.extend(missing);
    }
    purged_tokens
}

/// Checks the side effects: at most once per shell task (exactly once for a completed one
/// still in the journal), none for no task; a purged task's token (`purged_tokens`) counts as
/// a task's, its side effect at most once.
fn check_ledger(
    layout: &Layout,
    seen: &HashMap<String, Seen>,
    purged_tokens: &HashSet<String>,
    findings: &mut Findings,
) {
    let ledger = std::fs::read_to_string(layout.ledger()).unwrap_or_default();
    let mut runs: HashMap<&str, u64> = HashMap::new();
    for token in ledger.lines().map(str::trim).filter(|t| !t.is_empty()) {
        findings.side_effects += 1;
        *runs.entry(token).or_default() += 1;
    }
    let mut tokens = HashSet::new();
    for (id, task) in seen {
        if task.tool != SHELL {
            continue;
        }
        tokens.insert(task.token.as_str());
        let ran = runs.get(task.token.as_str()).copied().unwrap_or(0);
        if ran > 1 {
            findings.violations.push(format!(
                "task {id}: its side effect ({}) ran {ran} times",
                task.token
            ));
        }
        if task.task.state.status == Status::Completed && ran == 0 {
            findings.violations.push(format!(
                "task {id} completed but its side effect ({}) never ran",
                task.token
            ));
        }
    }
    for (token, ran) in runs {
        if purged_tokens.contains(token) {
            if ran > 1 {
                findings.violations.push(format!(
                    "a purged task's side effect ({token}) ran {ran} times"
                ));
            }
            continue;
        }
        if !tokens.contains(token) {
            findings.violations.push(format!(
                "side effect {token:?} ran {} for no task in the journal",
                crate::cli::fmt::count(ran, "time")
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use dtask_journal::{JournalOptions, LeasePolicy, TaskSpec, Timestamp};

    /// A journal with task `t` created and completed, and its heads before a purge.
    fn ended(layout: &Layout) -> (Journal, Heads) {
        let journal = Journal::open(layout.journal(), JournalOptions::default()).unwrap();
        let spec = TaskSpec::new("t", "x");
        journal
            .append(
                "t",
                0,
                &[Event::created(spec, LeasePolicy::Retry, Timestamp(1))],
            )
            .unwrap();
        journal
            .append(
                "t",
                1,
                &[Event::Completed {
                    data: vec![],
                    at: Timestamp(2),
                }],
            )
            .unwrap();
        let before = heads(&journal).unwrap();
        (journal, before)
    }

    #[test]
    fn a_purge_stands_for_the_records_seen_before_it_and_no_fewer() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path(), None);
        let (journal, before) = ended(&layout);
        journal.purge(&["t"], Timestamp(3)).unwrap();
        let now = heads(&journal).unwrap();
        assert_eq!(now["t"].0, 1, "the tombstone alone");
        assert!(heads_grew(&journal, &before, &now).is_empty());
        // Seen with one record more before the crash than the tombstone stands for: lost.
        let mut more = before.clone();
        more.get_mut("t").unwrap().0 += 1;
        let violations = heads_grew(&journal, &more, &now);
        assert!(
            violations[0].contains("purged as 2 records, 3"),
            "{violations:?}"
        );
        // The same count, another last record: changed.
        let mut other = before;
        other.get_mut("t").unwrap().1 = Digest([9; 32]);
        assert_eq!(heads_grew(&journal, &other, &now).len(), 1);
    }

    #[test]
    fn a_trim_since_the_snapshot_frames_records_again_without_losing_any() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path(), None);
        let journal = Journal::open(layout.journal(), JournalOptions::default()).unwrap();
        let spec = TaskSpec::new("t", "x");
        let update = |n: u64| Event::UpdateAppended {
            attempt: 1,
            event_id: format!("e{n}"),
            kind: "k".into(),
            data: vec![1; 100],
            metadata: vec![],
            at: Timestamp(3),
        };
        journal
            .append(
                "t",
                0,
                &[
                    Event::created(spec, LeasePolicy::Retry, Timestamp(1)),
                    Event::AttemptStarted {
                        attempt: 1,
                        lease_deadline: Timestamp(9),
                        at: Timestamp(2),
                    },
                    update(0),
                    update(1),
                ],
            )
            .unwrap();
        let before = heads(&journal).unwrap();
        journal.append("t", 4, &[update(2)]).unwrap();
        assert_eq!(
            journal.trim_progress("t", 1, Timestamp(4)).unwrap().records,
            2
        );
        let now = heads(&journal).unwrap();
        assert_ne!(before["t"].1, {
            let r = journal.read_stream("t", 3).next().unwrap().unwrap();
            r.digest
        });
        assert!(heads_grew(&journal, &before, &now).is_empty());
        // Seen with another sequence at that position: changed, trim or not.
        let mut other = before;
        other.get_mut("t").unwrap().2 += 100;
        assert_eq!(heads_grew(&journal, &other, &now).len(), 1);
    }

    #[test]
    fn an_acknowledged_update_lost_in_a_crash_is_found_before_a_recovery_writes_it_again() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path(), None);
        let journal = Journal::open(layout.journal(), JournalOptions::default()).unwrap();
        let update = |n: u64| Event::UpdateAppended {
            attempt: 1,
            event_id: format!("e{n}"),
            kind: "k".into(),
            data: vec![1; 10],
            metadata: vec![],
            at: Timestamp(3),
        };
        journal
            .append(
                "t",
                0,
                &[
                    Event::created(TaskSpec::new("t", "x"), LeasePolicy::Retry, Timestamp(1)),
                    Event::AttemptStarted {
                        attempt: 1,
                        lease_deadline: Timestamp(9),
                        at: Timestamp(2),
                    },
                    update(0),
                ],
            )
            .unwrap();
        // e1 was acknowledged, then lost in the crash; a half-written line is not read yet.
        std::fs::write(
            layout.acks(),
            "update\tt\te0\nupdate\tt\te1\ntrimmed\tt\t2\nupd",
        )
        .unwrap();
        let mut acks = AckLog::default();
        let lines = acks.read_new(&layout).unwrap();
        assert_eq!(lines.len(), 3, "{lines:?}");
        let violations = acks_durable(&journal, &lines);
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert!(violations[0].contains("e1"), "{violations:?}");
        assert!(violations[1].contains("trimmed"), "{violations:?}");
        assert!(acks.read_new(&layout).unwrap().is_empty());
        // The recovery writes e1 again under its event id, and a trim marker lands elsewhere:
        // the final check alone would find the update, not the trim at its position.
        journal.append("t", 3, &[update(1)]).unwrap();
        assert!(acks_durable(&journal, &lines[..2]).is_empty());
        // The rest of the half-written line comes later.
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .open(layout.acks())
            .unwrap();
        std::io::Write::write_all(&mut log, b"ate\tt\te1\n").unwrap();
        assert_eq!(acks.read_new(&layout).unwrap(), vec!["update\tt\te1"]);
    }

    #[test]
    fn damage_met_after_a_crash_is_a_violation_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path(), None);
        let (journal, before) = ended(&layout);
        journal
            .append(
                "t",
                2,
                &[Event::Hold {
                    reason: "r".into(),
                    at: Timestamp(4),
                }],
            )
            .unwrap();
        drop(journal);
        {
            let cfs: Vec<_> = dtask_journal::keys::COLUMN_FAMILIES.to_vec();
            let db =
                rocksdb::DB::open_cf(&rocksdb::Options::default(), layout.journal(), cfs).unwrap();
            // Wherever the stream lies: with the live ones, or moved apart once finished.
            for name in [
                dtask_journal::keys::Space::Events.name(),
                dtask_journal::keys::FINISHED_EVENTS,
            ] {
                let cf = db.cf_handle(name).unwrap();
                for position in [0, 1] {
                    let key = dtask_journal::keys::event_key("t", position);
                    if let Some(mut value) = db.get_cf(cf, &key).unwrap() {
                        value[12] ^= 0x40;
                        db.put_cf(cf, &key, value).unwrap();
                    }
                }
            }
        }
        let journal = Journal::open_read_only(layout.journal()).unwrap();
        let now = heads(&journal).unwrap();
        let violations = heads_grew(&journal, &before, &now);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].contains("damaged"), "{violations:?}");
        let lines = vec!["update\tt\te0".to_owned()];
        let violations = acks_durable(&journal, &lines);
        assert!(violations[0].contains("damaged"), "{violations:?}");
    }

    #[test]
    fn an_acknowledged_purge_needs_its_tombstone_and_covers_what_was_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path(), None);
        let (journal, _) = ended(&layout);
        std::fs::write(
            layout.acks(),
            "created\tt\tshell\ttok\nupdate\tt\te1\npurged\tt\ttok\n",
        )
        .unwrap();
        std::fs::write(layout.ledger(), "tok\n").unwrap();
        // Not purged yet: the acknowledged purge (and the update) are missing.
        drop(journal);
        let findings = check(&layout).unwrap();
        assert!(
            findings
                .violations
                .iter()
                .any(|v| v == "acknowledged purge of t is missing"),
            "{:?}",
            findings.violations
        );
        let journal = Journal::open(layout.journal(), JournalOptions::default()).unwrap();
        journal.purge(&["t"], Timestamp(3)).unwrap();
        drop(journal);
        let findings = check(&layout).unwrap();
        assert_eq!(findings.purged, 1);
        assert!(findings.violations.is_empty(), "{:?}", findings.violations);
        // A purged task's side effect still runs at most once.
        std::fs::write(layout.ledger(), "tok\ntok\n").unwrap();
        let findings = check(&layout).unwrap();
        assert_eq!(findings.violations.len(), 1, "{:?}", findings.violations);
    }
}

//! The read side of the API: listing, folding and paging a task's records, straight from the
//! journal (the same reads and the same damage-tolerant fold as `dtask tasks`, `show`,
//! `events`, `replay` and `verify`). Every function here blocks: handlers call them on the
//! blocking pool.

use super::model::{
    AtRecord, Bytes, DamagedRecord, ListQuery, ProblemView, RecordPage, RecordView, StateAt,
    TaskDetail, TaskList, TaskStateView, TaskSummary, UpdatePage, UpdateView, VerifyReport,
};
use super::ApiError;
use crate::conversation::{Collector, ConversationView};
use axum::http::StatusCode;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use dtask_journal::export::ByteFields;
use dtask_journal::{Error as JournalError, Journal};
use dtask_replay::audit::{audit_journal, audit_task, AuditReport};
use dtask_replay::{replay_task, FoldView, FoldViews, Status};
use serde::{Deserialize, Serialize};

/// The default page of the task list.
const DEFAULT_LIMIT: usize = 50;
/// The largest page of the task list and the updates.
const MAX_LIMIT: usize = 1000;
/// The default and largest pages of a task's records.
const DEFAULT_RECORDS: usize = 500;
const MAX_RECORDS: usize = 5000;
/// The default page of updates.
const DEFAULT_UPDATES: usize = 100;
/// The bytes a page of records or updates holds at most before it ends (with `next_from` or
/// a cursor): records of megabytes each would otherwise make pages of gigabytes. At least
/// one record or update is always listed.
const PAGE_BYTES: usize = 8 << 20;
/// The records a page of the task list folds at most before it ends (with a cursor): the
/// list folds each task it examines whole, so a page of long streams is bounded by their
/// records as a filtered page is by its tasks (at least one task is always examined).
const LIST_RECORD_BUDGET: u64 = 50_000;

/// A cursor of the task list: the last task id examined.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListCursor {
    v: u32,
    after: String,
}

/// A cursor of a task's updates: the next position to read.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateCursor {
    v: u32,
    task: String,
    position: u64,
}

fn encode<T: Serialize>(cursor: &T) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(cursor).unwrap_or_default())
}

fn decode<T: for<'de> Deserialize<'de>>(cursor: &str) -> Result<T, ApiError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(cursor)
        .map_err(|e| ApiError::invalid_cursor(format!("not a cursor of this server: {e}")))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid_cursor(format!("not a cursor of this server: {e}")))
}

/// Splits a comma-separated filter.
fn list(filter: Option<&String>) -> Vec<String> {
    filter
        .map(|f| {
            f.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The filters of a listing, parsed.
struct Filters {
    status: Vec<Status>,
    executor: Vec<String>,
    tool: Vec<String>,
    text: Option<String>,
}

impl Filters {
    fn parse(query: &ListQuery) -> Result<Self, ApiError> {
        let status = list(query.status.as_ref())
            .iter()
            .map(|s| {
                Status::parse(s).ok_or_else(|| {
                    let names: Vec<_> = Status::ALL.iter().map(|s| s.as_str()).collect();
                    ApiError::bad_request(format!(
                        "unknown status {s:?}: one of {}",
                        names.join(", ")
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            status,
            executor: list(query.executor.as_ref()),
            tool: list(query.tool.as_ref()),
            text: query
                .q
                .as_ref()
                .map(|q| q.trim().to_lowercase())
                .filter(|q| !q.is_empty()),
        })
    }

    fn keep(&self, row: &TaskSummary) -> bool {
        let status = row.status.as_deref().and_then(Status::parse);
        (self.status.is_empty() || status.is_some_and(|s| self.status.contains(&s)))
            && (self.executor.is_empty() || self.executor.contains(&row.executor))
            && (self.tool.is_empty() || row.tool.as_ref().is_some_and(|t| self.tool.contains(t)))
            && self.text.as_ref().is_none_or(|q| {
                row.id.to_lowercase().contains(q)
                    || row.description.to_lowercase().contains(q)
                    || row
                        .tool
                        .as_ref()
                        .is_some_and(|t| t.to_lowercase().contains(q))
            })
    }
}

/// The row of a folded task, whose last intact record has sequence `last_seq`.
fn summary(id: String, view: &FoldView, last_seq: u64) -> TaskSummary {
    let problem = view.has_problems().then(|| view.problems().join("; "));
    match &view.task {
        Some(task) => {
            let s = &task.state;
            TaskSummary {
                id,
                status: Some(s.status.as_str().to_owned()),
                executor: s.spec.executor_key.clone(),
                tool: super::model::tool_name(&s.spec.payload),
                kind: s.spec.kind.clone(),
                description: s.spec.description.clone(),
                attempt: s.attempt,
                version: s.version,
                records: view.records,
                last_seq,
                created_at: s.created_at.0,
                updated_at: s.updated_at.0,
                not_before: s.not_before.map(|t| t.0),
                problem,
            }
        }
        None => TaskSummary {
            id,
            status: None,
            executor: String::new(),
            tool: None,
            kind: String::new(),
            description: String::new(),
            attempt: 0,
            version: 0,
            records: view.records,
            last_seq,
            created_at: 0,
            updated_at: 0,
            not_before: None,
            problem,
        },
    }
}

/// A page of the task list: tasks are folded in id order from the cursor, in one forward
/// pass ([`FoldViews`]), until the page is full or a scan budget is spent — 20 tasks per
/// task asked (at least 2000), or [`LIST_RECORD_BUDGET`] records folded; the cursor then
/// resumes after the last task examined.
///
/// # Errors
/// 400 for bad filters or a bad cursor; journal errors.
pub fn list_tasks(journal: &Journal, query: &ListQuery) -> Result<TaskList, ApiError> {
    let filters = Filters::parse(query)?;
    let limit = match query.limit {
        None | Some(0) => DEFAULT_LIMIT,
        Some(n) => n.min(MAX_LIMIT),
    };
    let after = match &query.cursor {
        None => None,
        Some(c) => {
            let c: ListCursor = decode(c)?;
            if c.v != 1 {
                return Err(ApiError::invalid_cursor("a cursor of another version"));
            }
            Some(c.after)
        }
    };
    let budget = (limit * 20).max(2000);
    let mut tasks = Vec::new();
    let mut scanned = 0usize;
    let mut folded = 0u64;
    let mut last: Option<String> = None;
    let mut exhausted = true;
    let mut views = FoldViews::new(journal, after.as_deref());
    let mut last_seq = 0;
    while let Some(view) = views.next_with(|record| last_seq = record.seq) {
        let view = view?;
        let seen = std::mem::take(&mut last_seq);
        if tasks.len() == limit || scanned == budget || folded >= LIST_RECORD_BUDGET {
            exhausted = false;
            break;
        }
        scanned += 1;
        folded += view.records;
        let id = view.id().to_owned();
        last = Some(id.clone());
        if !view.exists() || view.purged.is_some() {
            // Written and not yet durable (an embedded journal's readers stop at its durable
            // watermark): not a task to show yet. Or purged: not a task any more.
            continue;
        }
        let row = summary(id, &view, seen);
        if filters.keep(&row) {
            tasks.push(row);
        }
    }
    let next_cursor = match (exhausted, last) {
        (false, Some(after)) => Some(encode(&ListCursor { v: 1, after })),
        _ => None,
    };
    Ok(TaskList {
        tasks,
        next_cursor,
        scanned: scanned as u64,
    })
}

/// Whether the journal knows `id`; its stream length as its readers see it (on an embedded
/// owner, up to the durable watermark: a page's `length` and cursors never count a record
/// its reads cannot show yet).
fn require(journal: &Journal, id: &str) -> Result<u64, ApiError> {
    valid_id(id)?;
    journal.stream_len(id)?.ok_or_else(|| ApiError::no_task(id))
}

/// 400 for an id no task can have (empty, or holding NUL): its keys would be read as
/// another task's.
fn valid_id(id: &str) -> Result<(), ApiError> {
    if dtask_journal::keys::is_valid_task_id(id) {
        Ok(())
    } else {
        Err(dtask_journal::Error::InvalidTaskId(id.to_owned()).into())
    }
}

/// A task, folded up to its first damaged or illegal record.
///
/// # Errors
/// 404 for an unknown task; journal errors.
pub fn task(journal: &Journal, id: &str, with_base64: bool) -> Result<TaskDetail, ApiError> {
    // A task all of whose records are written and not yet durable is unknown, as in the list.
    require(journal, id)?;
    let mut last_seq = 0;
    let view = FoldView::read(journal, id, |record| last_seq = record.seq)?;
    if let (Some((records, at)), None) = (view.purged, &view.task) {
        return Err(ApiError::purged(id, records, at));
    }
    Ok(TaskDetail {
        task: id.to_owned(),
        state: view
            .task
            .as_ref()
            .map(|t| TaskStateView::of(&t.state, with_base64)),
        records: view.records,
        last_seq,
        problems: view.problems(),
    })
}

/// A page of a task's records (base64 byte fields).
///
/// # Errors
/// 404 for an unknown task; journal errors.
pub fn records(
    journal: &Journal,
    id: &str,
    from: u64,
    limit: Option<usize>,
) -> Result<RecordPage, ApiError> {
    let length = require(journal, id)?;
    let limit = match limit {
        None | Some(0) => DEFAULT_RECORDS,
        Some(n) => n.min(MAX_RECORDS),
    };
    let mut end = from.saturating_add(limit as u64).min(length);
    let mut records = Vec::new();
    let mut damaged = Vec::new();
    let mut bytes = 0;
    for item in journal.read_stream(id, from) {
        match item {
            Ok(record) if record.position >= end => break,
            Ok(record) if !records.is_empty() && bytes + record.size > PAGE_BYTES => {
                // The page is full by bytes: the next one starts here.
                end = record.position;
                break;
            }
            Ok(record) => {
                bytes += record.size;
                records.push(
                    RecordView::of(id, &record, ByteFields::Base64)
                        .map_err(|e| ApiError::internal(e.to_string()))?,
                );
            }
            Err(JournalError::Corruption { position, kind, .. }) => {
                if position < end {
                    damaged.push(DamagedRecord {
                        position,
                        problem: kind.to_string(),
                    });
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(RecordPage {
        task: id.to_owned(),
        records,
        damaged,
        length,
        next_from: (end < length).then_some(end),
    })
}

/// The damage-tolerant fold up to a position, and the last record folded.
struct Upto {
    view: FoldView,
    last: Option<AtRecord>,
}
impl dtask_replay::Replay for Upto {
    type Error = std::convert::Infallible;
    fn replay(&mut self, record: &dtask_journal::Record) -> Result<(), Self::Error> {
        self.last = Some(AtRecord {
            position: record.position,
            seq: record.seq,
            time: record.event.at().0,
            event_type: record.event.event_type().as_str().to_owned(),
        });
        self.view.replay(record)
    }
    fn damaged(&mut self, position: u64, kind: &dtask_journal::CorruptionKind) -> bool {
        self.view.damaged(position, kind)
    }
}

/// The task as it was after position `at` (default: its last record), folded as `show`
/// folds (up to the first damaged or illegal record).
///
/// # Errors
/// 404 for an unknown task, 400 `out_of_range` for a position past the end.
pub fn state_at(
    journal: &Journal,
    id: &str,
    at: Option<u64>,
    with_base64: bool,
) -> Result<StateAt, ApiError> {
    let length = require(journal, id)?;
    let last = length.saturating_sub(1);
    let at = at.unwrap_or(last);
    if at > last {
        return Err(ApiError::out_of_range(format!(
            "task {id:?} has positions 0..={last}; at={at} is beyond its end"
        )));
    }
    let mut upto = Upto {
        view: FoldView::new(id),
        last: None,
    };
    match replay_task(journal, id, Some(at + 1), &mut upto) {
        Ok(()) => {}
        Err(dtask_replay::ReplayError::Journal(e)) => return Err(e.into()),
        Err(e) => return Err(ApiError::internal(e.to_string())),
    }
    let record = upto.last.ok_or_else(|| {
        // Damage, not a failure of the journal: never a 500.
        ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "does_not_fold",
            format!("task {id:?}: no intact record up to position {at} (run a verify)"),
        )
    })?;
    Ok(StateAt {
        task: id.to_owned(),
        at: record,
        last_position: last,
        state: upto
            .view
            .task
            .as_ref()
            .map(|t| TaskStateView::of(&t.state, with_base64)),
        problems: upto.view.problems(),
    })
}

/// A page of a task's progress updates, oldest first.
///
/// # Errors
/// 404 for an unknown task, 400 for a bad cursor.
pub fn updates(
    journal: &Journal,
    id: &str,
    cursor: Option<&str>,
    limit: Option<usize>,
    with_base64: bool,
) -> Result<UpdatePage, ApiError> {
    let length = require(journal, id)?;
    let from = match cursor {
        None => 0,
        Some(c) => {
            let c: UpdateCursor = decode(c)?;
            if c.v != 1 || c.task != id {
                return Err(ApiError::invalid_cursor("a cursor of another task"));
            }
            if c.position > length {
                return Err(ApiError::invalid_cursor("a cursor past the task's end"));
            }
            c.position
        }
    };
    let limit = match limit {
        None | Some(0) => DEFAULT_UPDATES,
        Some(n) => n.min(MAX_LIMIT),
    };
    let mut updates = Vec::new();
    let mut next = None;
    let mut bytes = 0;
    for record in journal.read_stream(id, from) {
        let record = match record {
            Ok(record) => record,
            Err(JournalError::Corruption { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        // Only up to the length read first: a record made durable since is the next
        // page's, which the cursor (at that length) starts from.
        if record.position >= length {
            break;
        }
        // The store's one reading of an update record (a trimmed one's bytes empty); the
        // parts of multi-part events are not listed here.
        let position = record.position;
        let seq = record.seq;
        let Some(update) = dtask_engine::UpdateRecord::from_record(id, &record) else {
            continue;
        };
        if !update.part_id.is_empty() {
            continue;
        }
        if updates.len() == limit || (!updates.is_empty() && bytes + record.size > PAGE_BYTES) {
            next = Some(position);
            break;
        }
        bytes += record.size;
        updates.push(UpdateView {
            position,
            seq,
            attempt: update.attempt,
            data: Bytes::of(&update.data, with_base64),
            metadata: update
                .metadata
                .into_iter()
                .map(|(key, value)| super::model::MetadataPair { key, value })
                .collect(),
            event_id: update.event_id,
            kind: update.kind,
            trimmed: update.trimmed,
            at: update.created_at.0,
        });
    }
    // The end of what is stored now: a later page goes on from there.
    let position = next.unwrap_or(length);
    Ok(UpdatePage {
        task: id.to_owned(),
        updates,
        next_cursor: encode(&UpdateCursor {
            v: 1,
            task: id.to_owned(),
            position,
        }),
    })
}

/// Runs the audit of the whole journal, or of one task, on a view of the journal that does
/// not move while the audit reads it ([`Journal::frozen`]): its passes over the streams and
/// the indexes see the same moment, whatever is appended meanwhile.
///
/// # Errors
/// 404 for an unknown task; an audit that could not run to its end.
pub fn verify(journal: &Journal, task: Option<&str>) -> Result<VerifyReport, ApiError> {
    let started = std::time::Instant::now();
    let frozen = journal.frozen()?;
    let journal = frozen.journal();
    let (scope, report) = match task {
        None => ("journal", audit_journal(journal, &mut |_| {})?),
        Some(id) => {
            valid_id(id)?;
            let t = audit_task(journal, id)?;
            if !t.exists {
                return Err(ApiError::no_task(id));
            }
            let report = AuditReport {
                tasks: 1,
                records: t.records,
                bytes: t.bytes,
                last_seq: journal.last_seq()?,
                live: u64::from(!t.terminal),
                problems: t.problems,
                ..AuditReport::default()
            };
            ("task", report)
        }
    };
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    Ok(VerifyReport {
        scope: scope.to_owned(),
        clean: report.is_clean(),
        tasks: report.tasks,
        records: report.records,
        bytes: report.bytes,
        last_seq: report.last_seq,
        live: report.live,
        outbox: report.outbox,
        problems: report
            .problems
            .iter()
            .map(|p| ProblemView {
                task: p.task.clone(),
                position: p.position,
                kind: p.kind.to_string(),
                detail: p.detail.clone(),
            })
            .collect(),
        elapsed_ms,
    })
}

/// The conversation of the durable agent's run `id` (its updates folded by the transcript
/// fold, each call's task read for its status).
///
/// # Errors
/// 404 for an unknown task and for one that is not an agent run (code
/// `not_an_agent_run`), 410 for a purged one; journal errors.
pub fn conversation(journal: &Journal, id: &str) -> Result<ConversationView, ApiError> {
    require(journal, id)?;
    let mut collector = Collector::default();
    let view = FoldView::read(journal, id, |r| collector.add(r))?;
    if let (Some((records, at)), None) = (view.purged, &view.task) {
        return Err(ApiError::purged(id, records, at));
    }
    let Some(task) = &view.task else {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "does_not_fold",
            format!("task {id:?} does not fold: {}", view.problems().join("; ")),
        ));
    };
    match collector.conversation(journal, &task.state)? {
        Some(conversation) => Ok(conversation.view()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_an_agent_run",
            format!(
                "task {id:?} is not a durable agent's run (executor {:?}): it has no conversation",
                task.state.spec.executor_key
            ),
        )),
    }
}

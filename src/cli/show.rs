//! `dtask show <task>`: the folded state and a timeline built from the task's records.

use super::fmt::{self, Table};
use super::{fold_task, require_task, CliError, Global, Out, Result};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use dtask::conversation::Collector;
use dtask_journal::{Event, Record, Timestamp};
use dtask_replay::TaskState;
use serde_json::{json, Value};

/// Arguments of `dtask show`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The task id.
    task: String,
    /// Show checkpoints, data and payloads themselves, not only their sizes.
    #[arg(long)]
    bytes: bool,
    /// Show the latest N entries of the updates table (0: all): the earlier ones are
    /// counted, not listed (`dtask events` pages every record).
    #[arg(long, value_name = "N", default_value_t = 100)]
    updates: usize,
}

/// The most characters of a text value shown without `--bytes`.
const PREVIEW_CHARS: usize = 40;

/// Bytes as a size (with a preview of printable text), or as the bytes themselves with
/// `--bytes`.
#[derive(Debug, Clone, Copy)]
pub struct Show {
    /// Whether to show bytes.
    pub bytes: bool,
}

impl Show {
    /// For humans: the bytes themselves with `--bytes`; else the size, after a preview of
    /// the text when the bytes are printable UTF-8.
    pub fn text(self, data: &[u8]) -> String {
        if self.bytes {
            fmt::bytes(data)
        } else if let Some(preview) = fmt::preview(data, PREVIEW_CHARS) {
            format!("{preview} ({})", fmt::size(data.len() as u64))
        } else {
            fmt::size(data.len() as u64)
        }
    }

    /// For JSON: the size, plus base64 with `--bytes`.
    fn json(self, data: &[u8]) -> Value {
        if self.bytes {
            json!({ "size": data.len(), "base64": STANDARD.encode(data) })
        } else {
            json!({ "size": data.len() })
        }
    }
}

/// One attempt of the timeline.
#[derive(Debug, Default)]
struct Attempt {
    number: u64,
    started_at: Timestamp,
    lease_deadline: Timestamp,
    heartbeats: u64,
    last_heartbeat: Option<Timestamp>,
    updates: u64,
    started_marker: Option<Timestamp>,
    ended_at: Option<Timestamp>,
    end: Option<String>,
}

/// A dated entry of the timeline (checkpoints, waits, updates, notifications).
#[derive(Debug)]
struct Entry {
    position: u64,
    at: Timestamp,
    what: String,
    fields: Vec<(&'static str, Value, String)>,
}

impl Entry {
    fn new(record: &Record, what: &str) -> Self {
        Self {
            position: record.position,
            at: record.event.at(),
            what: what.to_owned(),
            fields: Vec::new(),
        }
    }

    fn field(mut self, name: &'static str, json: Value, text: String) -> Self {
        self.fields.push((name, json, text));
        self
    }

    fn json(&self) -> Value {
        let mut map = serde_json::Map::new();
        map.insert("position".into(), self.position.into());
        map.insert("at".into(), self.at.0.into());
        map.insert("event".into(), self.what.clone().into());
        for (name, value, _) in &self.fields {
            map.insert((*name).into(), value.clone());
        }
        Value::Object(map)
    }
}

/// The timeline of a task, built from its records (by `show`, and by `replay` up to a
/// position).
#[derive(Debug, Default)]
pub struct Timeline {
    attempts: Vec<Attempt>,
    checkpoints: Vec<Entry>,
    waits: Vec<Entry>,
    updates: Vec<Entry>,
    /// How many of the latest updates to keep (0: all).
    keep_updates: usize,
    /// Updates dropped from the front of `updates` so far.
    updates_dropped: u64,
    notifications: Vec<Entry>,
    inputs: Vec<Entry>,
    children: Vec<Entry>,
    cancel: Option<Entry>,
    outcome: Option<Entry>,
}

impl Timeline {
    /// A timeline that keeps only the latest `n` entries of its updates (0: all of them), so
    /// that a task with millions of updates is shown in bounded memory.
    pub fn keeping_updates(n: usize) -> Self {
        Self {
            keep_updates: n,
            ..Self::default()
        }
    }

    /// Adds an entry of the updates table, dropping the oldest ones once there are twice as
    /// many as are kept.
    fn push_update(&mut self, entry: Entry) {
        self.updates.push(entry);
        if self.keep_updates > 0 && self.updates.len() >= self.keep_updates.saturating_mul(2) {
            let drop = self.updates.len() - self.keep_updates;
            self.updates.drain(..drop);
            self.updates_dropped += drop as u64;
        }
    }

    /// The updates shown (the latest kept) and how many earlier ones are left out.
    fn shown_updates(&self) -> (&[Entry], u64) {
        let extra = match self.keep_updates {
            0 => 0,
            keep => self.updates.len().saturating_sub(keep),
        };
        (&self.updates[extra..], self.updates_dropped + extra as u64)
    }

    /// Counts an update of `attempt` (its latest attempt of that number).
    fn count_update(&mut self, attempt: u64) {
        if let Some(a) = self.attempts.iter_mut().rev().find(|a| a.number == attempt) {
            a.updates += 1;
        }
    }

    fn end_attempt(&mut self, at: Timestamp, how: &str) {
        if let Some(a) = self.attempts.last_mut() {
            if a.end.is_none() {
                a.ended_at = Some(at);
                a.end = Some(how.to_owned());
            }
        }
    }

    /// Adds a record of the task (in stream order).
    #[allow(clippy::too_many_lines, reason = "one arm per event type reads best")]
    pub fn add(&mut self, record: &Record, show: Show) {
        let at = record.event.at();
        let bytes = |name: &'static str, data: &[u8]| (name, show.json(data), show.text(data));
        match &record.event {
            Event::Created { checkpoint, .. } | Event::CreatedV2 { checkpoint, .. } => {
                if !checkpoint.is_empty() {
                    let (n, j, t) = bytes("checkpoint", checkpoint);
                    self.checkpoints
                        .push(Entry::new(record, "created").field(n, j, t));
                }
            }
            Event::AttemptStarted {
                attempt,
                lease_deadline,
                ..
            } => self.attempts.push(Attempt {
                number: *attempt,
                started_at: at,
                lease_deadline: *lease_deadline,
                ..Attempt::default()
            }),
            Event::Heartbeat { lease_deadline, .. } => {
                if let Some(a) = self.attempts.last_mut() {
                    a.heartbeats += 1;
                    a.last_heartbeat = Some(at);
                    a.lease_deadline = *lease_deadline;
                }
            }
            Event::StartCommitted { checkpoint, .. } => {
                if let Some(a) = self.attempts.last_mut() {
                    a.started_marker = Some(at);
                }
                let (n, j, t) = bytes("checkpoint", checkpoint);
                self.checkpoints
                    .push(Entry::new(record, "start_committed").field(n, j, t));
            }
            Event::TranscriptFailed { error, .. } => {
                self.outcome.get_or_insert_with(|| {
                    Entry::new(record, "transcript_failed").field(
                        "error",
                        error.clone().into(),
                        format!("{error:?}"),
                    )
                });
            }
            Event::WaitingInput { checkpoint, .. } | Event::Suspended { checkpoint, .. } => {
                let what = record.event.event_type().as_str();
                self.end_attempt(at, what);
                let (n, j, t) = bytes("checkpoint", checkpoint);
                self.checkpoints
                    .push(Entry::new(record, what).field(n, j.clone(), t.clone()));
                self.waits.push(Entry::new(record, what).field(n, j, t));
            }
            Event::Yielded { checkpoint, .. } => {
                self.end_attempt(at, "yielded");
                if !checkpoint.is_empty() {
                    let (n, j, t) = bytes("checkpoint", checkpoint);
                    self.checkpoints
                        .push(Entry::new(record, "yielded").field(n, j, t));
                }
            }
            Event::InputProvided { data, .. } => {
                let (n, j, t) = bytes("data", data);
                self.waits
                    .push(Entry::new(record, "input_provided").field(n, j, t));
            }
            Event::Released { .. } => self.waits.push(Entry::new(record, "released")),
            Event::CancelRequested {
                reason,
                direct,
                lease_deadline,
                ..
            } => {
                let mut e = Entry::new(record, "cancel_requested")
                    .field("reason", reason.clone().into(), format!("{reason:?}"))
                    .field("direct", (*direct).into(), direct.to_string());
                if let Some(d) = lease_deadline {
                    e = e.field("lease_deadline", d.0.into(), fmt::time(*d));
                }
                self.cancel = Some(e);
            }
            Event::LeaseExpired {
                resolution,
                deadline,
                ..
            } => {
                let how = format!("lease_expired ({resolution:?})").to_lowercase();
                self.end_attempt(at, &how);
                if resolution.is_terminal() {
                    self.outcome = Some(Entry::new(record, &how).field(
                        "deadline",
                        deadline.0.into(),
                        fmt::time(*deadline),
                    ));
                }
            }
            Event::Completed { data, .. } => {
                self.end_attempt(at, "completed");
                let (n, j, t) = bytes("data", data);
                self.outcome = Some(Entry::new(record, "completed").field(n, j, t));
            }
            Event::Failed { error, .. } => {
                self.end_attempt(at, "failed");
                self.outcome = Some(Entry::new(record, "failed").field(
                    "error",
                    error.clone().into(),
                    format!("{error:?}"),
                ));
            }
            Event::Canceled { reason, .. } => {
                self.end_attempt(at, "canceled");
                self.outcome = Some(Entry::new(record, "canceled").field(
                    "reason",
                    reason.clone().into(),
                    format!("{reason:?}"),
                ));
            }
            Event::UpdateAppended {
                attempt,
                event_id,
                kind,
                data,
                metadata,
                ..
            } => {
                self.count_update(*attempt);
                let (n, j, t) = bytes("data", data);
                let meta: Vec<String> = metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
                self.push_update(
                    Entry::new(record, "update_appended")
                        .field("attempt", (*attempt).into(), attempt.to_string())
                        .field("event_id", event_id.clone().into(), event_id.clone())
                        .field("kind", kind.clone().into(), kind.clone())
                        .field(n, j, t)
                        .field(
                            "metadata",
                            metadata
                                .iter()
                                .map(|(k, v)| json!([k, v]))
                                .collect::<Vec<_>>()
                                .into(),
                            meta.join(","),
                        ),
                );
            }
            Event::NotificationEnqueued {
                id, kind, version, ..
            }
            | Event::NotificationEnqueuedV2 {
                id, kind, version, ..
            } => {
                let delivery = record.event.delivery().unwrap_or_default().as_str();
                self.notifications.push(
                    Entry::new(record, record.event.event_type().as_str())
                        .field("id", id.clone().into(), id.clone())
                        .field("kind", kind.clone().into(), kind.clone())
                        .field("version", (*version).into(), version.to_string())
                        .field("delivery", delivery.into(), delivery.to_owned())
                        .field("acked_at", Value::Null, "-".into()),
                );
            }
            Event::ChildCreated {
                child_id,
                attempt,
                generation,
                ..
            } => self.children.push(
                Entry::new(record, "child_created")
                    .field("child", child_id.clone().into(), child_id.clone())
                    .field("attempt", (*attempt).into(), attempt.to_string())
                    .field("generation", (*generation).into(), generation.to_string()),
            ),
            Event::InputSent {
                sequence,
                event_id,
                kind,
                data,
                delivery,
                ..
            } => {
                let (n, j, t) = bytes("data", data);
                let mut entry = Entry::new(record, "input_sent")
                    .field("sequence", (*sequence).into(), sequence.to_string())
                    .field("event_id", event_id.clone().into(), event_id.clone())
                    .field("kind", kind.clone().into(), kind.clone())
                    .field(
                        "delivery",
                        delivery.as_str().into(),
                        delivery.as_str().to_owned(),
                    )
                    .field(n, j, t);
                // A nested task's application notification: the child and its event id.
                if let Some((task, event_id)) =
                    dtask_journal::application_notification_source(event_id)
                {
                    let text = format!("{task} ({event_id})");
                    entry = entry.field(
                        "from",
                        serde_json::json!({ "task": task, "event_id": event_id }),
                        text,
                    );
                }
                self.inputs.push(entry);
            }
            Event::InputWoke { sequence, .. } => {
                self.waits.push(Entry::new(record, "input_woke").field(
                    "sequence",
                    (*sequence).into(),
                    sequence.to_string(),
                ));
            }
            Event::CursorAdvanced { cursor, .. } => {
                self.inputs
                    .push(Entry::new(record, "cursor_advanced").field(
                        "consumed",
                        (*cursor).into(),
                        cursor.to_string(),
                    ));
            }
            Event::InputCommitted {
                cursor, checkpoint, ..
            } => {
                self.inputs
                    .push(Entry::new(record, "input_committed").field(
                        "consumed",
                        (*cursor).into(),
                        cursor.to_string(),
                    ));
                let (n, j, t) = bytes("checkpoint", checkpoint);
                self.checkpoints
                    .push(Entry::new(record, "input_committed").field(n, j, t));
            }
            Event::InputsPending { cursor, .. } => {
                self.end_attempt(at, "inputs_pending");
                self.inputs.push(Entry::new(record, "inputs_pending").field(
                    "consumed",
                    (*cursor).into(),
                    cursor.to_string(),
                ));
            }
            Event::Published { .. } => self.notifications.push(Entry::new(record, "published")),
            Event::PartAppended {
                attempt,
                event_id,
                part_id,
                last,
                kind,
                data,
                ..
            } => {
                self.count_update(*attempt);
                let (n, j, t) = bytes("data", data);
                self.push_update(
                    Entry::new(record, "part_appended")
                        .field("attempt", (*attempt).into(), attempt.to_string())
                        .field("event_id", event_id.clone().into(), event_id.clone())
                        .field("part", part_id.clone().into(), part_id.clone())
                        .field("final", (*last).into(), last.to_string())
                        .field("kind", kind.clone().into(), kind.clone())
                        .field(n, j, t),
                );
            }
            Event::UpdateTrimmed {
                attempt,
                event_id,
                part_id,
                kind,
                bytes,
                ..
            } => {
                self.count_update(*attempt);
                self.push_update(
                    Entry::new(record, "update_trimmed")
                        .field("attempt", (*attempt).into(), attempt.to_string())
                        .field("event_id", event_id.clone().into(), event_id.clone())
                        .field("part", part_id.clone().into(), part_id.clone())
                        .field("kind", kind.clone().into(), kind.clone())
                        .field("bytes", (*bytes).into(), format!("{bytes} B trimmed")),
                );
            }
            Event::ProgressTrimmed { records, bytes, .. } => self.push_update(
                Entry::new(record, "progress_trimmed")
                    .field("records", (*records).into(), records.to_string())
                    .field("bytes", (*bytes).into(), fmt::size(*bytes)),
            ),
            Event::ParentNotified {
                attempt,
                event_id,
                kind,
                ..
            }
            | Event::ParentNotifiedV2 {
                attempt,
                event_id,
                kind,
                ..
            } => {
                let delivery = record.event.delivery().unwrap_or_default().as_str();
                self.notifications.push(
                    Entry::new(record, record.event.event_type().as_str())
                        .field("attempt", (*attempt).into(), attempt.to_string())
                        .field("event_id", event_id.clone().into(), event_id.clone())
                        .field("kind", kind.clone().into(), kind.clone())
                        .field("delivery", delivery.into(), delivery.to_owned()),
                );
            }
            Event::ParentNotificationFailed { kind, error, .. } => self.notifications.push(
                Entry::new(record, "parent_notification_failed")
                    .field("kind", kind.clone().into(), kind.clone())
                    .field("error", error.clone().into(), format!("{error:?}")),
            ),
            // The lineage is the state's (`rerun of`, `rerun as`); the records' times are
            // in the event list.
            // So is the hold (`on hold`).
            Event::RerunOf { .. }
            | Event::RerunAs { .. }
            | Event::RecoveryLimit { .. }
            | Event::Purged { .. }
            | Event::Hold { .. }
            | Event::HoldLifted { .. } => {}
            Event::NotBefore { until, .. } => self.waits.push(
                Entry::new(record, "not_before").field("until", until.0.into(), fmt::time(*until)),
            ),
            Event::NotificationAcked { id, .. } => {
                let queued = self
                    .notifications
                    .iter_mut()
                    .find(|n| n.fields.first().is_some_and(|(_, v, _)| v == id));
                if let Some(entry) = queued {
                    if let Some(acked) = entry.fields.iter_mut().find(|f| f.0 == "acked_at") {
                        *acked = ("acked_at", at.0.into(), fmt::time(at));
                    }
                }
            }
        }
    }
}

/// The folded state as JSON (sizes of byte fields; the bytes too with `--bytes`).
pub fn state_json(s: &TaskState, show: Show) -> Value {
    json!({
        "id": s.spec.id,
        "executor_key": s.spec.executor_key,
        "kind": s.spec.kind,
        "tool": fmt::tool_name(&s.spec.payload),
        "description": s.spec.description,
        "output_file": s.spec.output_file,
        "session_id": s.spec.session_id,
        "notify_session": s.spec.notify_session,
        "payload": show.json(&s.spec.payload),
        "policy": s.policy.as_str(),
        "status": s.status.as_str(),
        "version": s.version,
        "attempt": s.attempt,
        "records": s.position,
        "updates": s.updates,
        "trimmed_updates": s.trimmed,
        "checkpoint": show.json(&s.checkpoint),
        "result_data": show.json(&s.result_data),
        "result_error": s.result_error,
        "output_file_error": s.output_file_error,
        "pending_resume": s.pending_resume.as_deref().map(|d| show.json(d)),
        "context_snapshot": show.json(&s.context_snapshot),
        "cancel_requested_at": s.cancel_requested_at.map(|t| t.0),
        "cancel_reason": s.cancel_reason,
        "created_at": s.created_at.0,
        "updated_at": s.updated_at.0,
        "done_at": s.done_at.map(|t| t.0),
        "lease_deadline": s.lease_deadline.map(|t| t.0),
        "publication": s.publication.as_str(),
        "parent_task_id": s.parent_task_id,
        "root_session_id": s.root_session_id,
        "mailbox": {
            "generation": s.mailbox.generation,
            "latest": s.mailbox.latest,
            "consumed": s.mailbox.consumed,
            "sealed": s.mailbox_sealed(),
        },
        "parent_notification_error": s.parent_notification_error,
        "rerun_of": s.rerun_of(),
        "rerun_as": s.rerun_as(),
        "max_recoveries": s.max_recoveries,
        "recoveries": s.recoveries,
        "not_before": s.not_before.map(|t| t.0),
        "hold": s.hold.as_deref(),
    })
}

/// The folded state for humans, as `key  value` lines.
#[allow(clippy::too_many_lines, reason = "one line per field reads best")]
pub fn state_text(s: &TaskState, show: Show) -> String {
    let dash = |v: &str| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            v.to_owned()
        }
    };
    let mut t = Table::default();
    let mut kv = |k: &str, v: String| t.row(vec![k.to_owned(), v]);
    kv("task", s.spec.id.clone());
    kv(
        "status",
        format!(
            "{}  (version {}, attempt {}, {}, {})",
            s.status,
            s.version,
            s.attempt,
            fmt::count(s.position, "record"),
            if s.trimmed == 0 {
                fmt::count(s.updates, "update")
            } else {
                format!("{}, {} trimmed", fmt::count(s.updates, "update"), s.trimmed)
            }
        ),
    );
    kv(
        "executor",
        format!(
            "{}  (kind {}, policy {})",
            s.spec.executor_key,
            dash(&s.spec.kind),
            s.policy.as_str()
        ),
    );
    kv(
        "tool",
        fmt::tool_name(&s.spec.payload).unwrap_or_else(|| "-".into()),
    );
    kv("payload", show.text(&s.spec.payload));
    if !s.spec.description.is_empty() {
        kv("description", s.spec.description.clone());
    }
    if !s.spec.output_file.is_empty() {
        kv("output file", s.spec.output_file.clone());
    }
    kv(
        "session",
        if s.spec.session_id.is_empty() {
            "-".into()
        } else {
            format!(
                "{}{}",
                s.spec.session_id,
                if s.spec.notify_session {
                    " (notified)"
                } else {
                    ""
                }
            )
        },
    );
    if s.is_nested() {
        kv("parent", s.parent_task_id.clone());
    }
    if !s.root_session_id.is_empty() {
        kv("root session", s.root_session_id.clone());
    }
    if s.publication != dtask_journal::Publication::OnCreate {
        kv("publication", s.publication.as_str().to_owned());
    }
    if s.mailbox.latest > 0 {
        kv(
            "mailbox",
            format!(
                "{} (consumed up to {}, generation {}{})",
                fmt::count(s.mailbox.latest, "input"),
                s.mailbox.consumed,
                s.mailbox.generation,
                if s.mailbox_sealed() { ", sealed" } else { "" }
            ),
        );
    }
    if s.max_recoveries.is_some() || s.recoveries > 0 {
        kv(
            "recoveries",
            match s.max_recoveries {
                Some(max) => format!("{} (at most {max})", s.recoveries),
                None => s.recoveries.to_string(),
            },
        );
    }
    if let Some(original) = s.rerun_of() {
        kv("rerun of", original.to_owned());
    }
    if !s.rerun_as().is_empty() {
        kv("rerun as", s.rerun_as().join(", "));
    }
    if !s.parent_notification_error.is_empty() {
        kv(
            "parent notice",
            format!("failed: {:?}", s.parent_notification_error),
        );
    }
    kv("created", fmt::time(s.created_at));
    kv("updated", fmt::time(s.updated_at));
    kv("done", fmt::opt_time(s.done_at));
    kv("lease until", fmt::opt_time(s.lease_deadline));
    if let Some(until) = s.not_before {
        kv("not before", fmt::time(until));
    }
    if let Some(reason) = &s.hold {
        kv("on hold", format!("{reason:?}"));
    }
    kv("checkpoint", show.text(&s.checkpoint));
    if let Some(resume) = &s.pending_resume {
        kv("pending resume", show.text(resume));
    }
    if !s.context_snapshot.is_empty() {
        kv("context", show.text(&s.context_snapshot));
    }
    if let Some(at) = s.cancel_requested_at {
        kv(
            "cancel",
            format!("requested {} reason {:?}", fmt::time(at), s.cancel_reason),
        );
    }
    if s.status == dtask_replay::Status::Completed {
        kv("result", show.text(&s.result_data));
    }
    if !s.result_error.is_empty() {
        kv("error", format!("{:?}", s.result_error));
    }
    if !s.output_file_error.is_empty() {
        kv("transcript", format!("failed: {:?}", s.output_file_error));
    }
    t.render(0)
}

fn entries_table(title: &str, entries: &[Entry], out: &mut String) {
    if entries.is_empty() {
        return;
    }
    out.push('\n');
    out.push_str(title);
    out.push('\n');
    let mut headers = vec!["POS", "AT", "EVENT"];
    let names: Vec<String> = entries
        .iter()
        .flat_map(|e| e.fields.iter().map(|f| f.0.to_uppercase()))
        .fold(Vec::new(), |mut acc, n| {
            if !acc.contains(&n) {
                acc.push(n);
            }
            acc
        });
    headers.extend(names.iter().map(String::as_str));
    let mut table = Table::new(&headers);
    for e in entries {
        let mut row = vec![e.position.to_string(), fmt::time(e.at), e.what.clone()];
        for name in &names {
            row.push(
                e.fields
                    .iter()
                    .find(|f| f.0.to_uppercase() == *name)
                    .map_or_else(String::new, |f| f.2.clone()),
            );
        }
        table.row(row);
    }
    out.push_str(&table.render(2));
}

/// The timeline for humans: one table per part, each after a blank line.
pub fn timeline_text(t: &Timeline) -> String {
    let mut out = String::new();
    if !t.attempts.is_empty() {
        out.push_str("\nattempts\n");
        let mut table = Table::new(&[
            "#",
            "STARTED",
            "HEARTBEATS",
            "LAST HEARTBEAT",
            "STARTED MARKER",
            "UPDATES",
            "ENDED",
            "END",
        ]);
        for a in &t.attempts {
            table.row(vec![
                a.number.to_string(),
                fmt::time(a.started_at),
                a.heartbeats.to_string(),
                fmt::opt_time(a.last_heartbeat),
                fmt::opt_time(a.started_marker),
                a.updates.to_string(),
                fmt::opt_time(a.ended_at),
                a.end.clone().unwrap_or_else(|| {
                    format!("(running, lease until {})", fmt::time(a.lease_deadline))
                }),
            ]);
        }
        out.push_str(&table.render(2));
    }
    entries_table("checkpoints", &t.checkpoints, &mut out);
    entries_table("waits and answers", &t.waits, &mut out);
    let (updates, left_out) = t.shown_updates();
    let title = if left_out == 0 {
        "updates".to_owned()
    } else {
        format!(
            "updates (the latest {}; {} before them left out: --updates 0 shows all, \
             `dtask events` pages the records)",
            updates.len(),
            left_out
        )
    };
    entries_table(&title, updates, &mut out);
    entries_table("notifications", &t.notifications, &mut out);
    entries_table("mailbox", &t.inputs, &mut out);
    entries_table("children", &t.children, &mut out);
    if let Some(c) = &t.cancel {
        entries_table("cancellation", std::slice::from_ref(c), &mut out);
    }
    if let Some(o) = &t.outcome {
        entries_table("outcome", std::slice::from_ref(o), &mut out);
    }
    out
}

/// The timeline as JSON.
pub fn timeline_json(t: &Timeline) -> Value {
    let attempts: Vec<Value> = t
        .attempts
        .iter()
        .map(|a| {
            json!({
                "attempt": a.number,
                "started_at": a.started_at.0,
                "lease_deadline": a.lease_deadline.0,
                "heartbeats": a.heartbeats,
                "last_heartbeat": a.last_heartbeat.map(|t| t.0),
                "started_marker_at": a.started_marker.map(|t| t.0),
                "updates": a.updates,
                "ended_at": a.ended_at.map(|t| t.0),
                "end": a.end,
            })
        })
        .collect();
    let list = |entries: &[Entry]| entries.iter().map(Entry::json).collect::<Vec<_>>();
    let (updates, left_out) = t.shown_updates();
    json!({
        "attempts": attempts,
        "checkpoints": list(&t.checkpoints),
        "waits": list(&t.waits),
        "updates": list(updates),
        "updates_left_out": left_out,
        "notifications": list(&t.notifications),
        "inputs": list(&t.inputs),
        "children": list(&t.children),
        "cancel": t.cancel.as_ref().map(Entry::json),
        "outcome": t.outcome.as_ref().map(Entry::json),
    })
}

/// Runs `dtask show`.
pub fn run(global: &Global, args: &Args) -> Result<()> {
    let journal = global.open()?;
    require_task(&journal, &args.task)?;
    let show = Show { bytes: args.bytes };
    let mut timeline = Timeline::keeping_updates(args.updates);
    let mut agent = Collector::default();
    let folded = fold_task(&journal, &args.task, |r| {
        timeline.add(r, show);
        agent.add(r);
    })?;
    if let (Some((records, at)), None) = (folded.purged, &folded.task) {
        let problems = folded.problems();
        let mut out = Out::new();
        if global.json {
            out.json(&json!({
                "task": args.task,
                "purged": { "records": records, "at": at.0 },
                "problems": problems,
            }))?;
        } else {
            out.line(format!(
                "task {}: purged at {} ({} deleted; its tombstone is left, and its id stays \
                 taken)",
                args.task,
                fmt::time(at),
                fmt::count(records, "record")
            ))?;
            if !problems.is_empty() {
                out.line("\nproblems (after the tombstone)")?;
                for p in &problems {
                    out.line(format!("  {p}"))?;
                }
            }
        }
        out.flush()?;
        // Damage, or records after the tombstone, are problems as anywhere else.
        return if problems.is_empty() {
            Ok(())
        } else {
            Err(CliError::Problems(String::new()))
        };
    }
    let task = folded.task.as_ref().ok_or_else(|| {
        CliError::Problems(format!(
            "task {:?} does not fold: {}",
            args.task,
            folded.problems().join("; ")
        ))
    })?;
    let problems = folded.problems();
    let conversation = agent.conversation(&journal, &task.state)?;
    let mut out = Out::new();
    if global.json {
        let mut value = json!({
            "task": args.task,
            "state": state_json(&task.state, show),
            "timeline": timeline_json(&timeline),
            "problems": problems,
        });
        if let Some(c) = &conversation {
            value["conversation"] = serde_json::to_value(c.view())?;
        }
        out.json(&value)?;
    } else {
        out.text(state_text(&task.state, show))?;
        if let Some(c) = &conversation {
            out.text(c.text())?;
        }
        out.text(timeline_text(&timeline))?;
        if !problems.is_empty() {
            out.line("\nproblems (the state above is folded up to the first one)")?;
            for p in &problems {
                out.line(format!("  {p}"))?;
            }
        }
    }
    out.flush()?;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CliError::Problems(String::new()))
    }
}

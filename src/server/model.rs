//! The JSON bodies of the API: what handlers answer and accept, with their OpenAPI schemas
//! (derived by utoipa from these types, so the served document cannot drift from the code).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use dtask_journal::export::{ByteFields, EventJson};
use dtask_journal::{Event, Record};
use dtask_replay::TaskState;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// The most bytes of a byte field shown as text in [`Bytes::text`].
const TEXT_PREVIEW_BYTES: usize = 4096;

/// A byte field (payload, checkpoint, data): its size, its text when it is UTF-8, and with
/// `?bytes=true` its base64.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Bytes {
    /// The length in bytes.
    pub size: usize,
    /// The bytes as text when they are valid UTF-8 (cut to 4096 bytes; see `truncated`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Whether `text` was cut.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// The bytes, standard base64 (only with `?bytes=true`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
}

impl Bytes {
    /// The view of `data`.
    pub fn of(data: &[u8], with_base64: bool) -> Self {
        let text = std::str::from_utf8(data).ok().map(|s| {
            if s.len() <= TEXT_PREVIEW_BYTES {
                s.to_owned()
            } else {
                let mut end = TEXT_PREVIEW_BYTES;
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                s[..end].to_owned()
            }
        });
        let truncated = text.as_ref().is_some_and(|t| t.len() < data.len());
        Self {
            size: data.len(),
            text,
            truncated,
            base64: with_base64.then(|| STANDARD.encode(data)),
        }
    }
}

/// One row of the task list.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskSummary {
    /// The task id.
    pub id: String,
    /// The folded status (`null` when the stream does not fold at all).
    pub status: Option<String>,
    /// The executor key.
    pub executor: String,
    /// The payload's `tool_name`, when the payload is a JSON object with one.
    pub tool: Option<String>,
    /// The spec's kind tag.
    pub kind: String,
    /// The spec's description.
    pub description: String,
    /// Claims so far.
    pub attempt: u64,
    /// The CAS version (lifecycle events).
    pub version: u64,
    /// Records read intact.
    pub records: u64,
    /// The global sequence of the last record read intact (0 for none): a stream's records
    /// of the task past it are the ones `records` does not count.
    pub last_seq: u64,
    /// Creation time, ms since the epoch.
    pub created_at: u64,
    /// Time of the last lifecycle event, ms since the epoch.
    pub updated_at: u64,
    /// A delayed pending task's earliest claim time, ms since the epoch (`null` for none).
    pub not_before: Option<u64>,
    /// What is wrong with the stream, when something is (run a verify).
    pub problem: Option<String>,
}

/// A page of the task list.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskList {
    /// The tasks, in id order.
    pub tasks: Vec<TaskSummary>,
    /// Pass as `cursor` for the next page; `null` when the listing is complete.
    pub next_cursor: Option<String>,
    /// How many task streams this page examined (filters may skip many).
    pub scanned: u64,
}

/// Query of `GET /api/tasks`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only these statuses, comma-separated (`pending,running,waiting_input,suspended,
    /// completed,failed,canceled`).
    pub status: Option<String>,
    /// Only these executor keys, comma-separated.
    pub executor: Option<String>,
    /// Only these tools (the payload's `tool_name`), comma-separated.
    pub tool: Option<String>,
    /// Only tasks whose id, description or tool contains this text (case-insensitive).
    pub q: Option<String>,
    /// At most this many tasks (default 50, at most 1000).
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// The folded state of a task.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskStateView {
    /// The task id.
    pub id: String,
    /// The executor key.
    pub executor_key: String,
    /// The spec's kind tag.
    pub kind: String,
    /// The payload's `tool_name`, if any.
    pub tool: Option<String>,
    /// The spec's description.
    pub description: String,
    /// The transcript path.
    pub output_file: String,
    /// The notification session.
    pub session_id: String,
    /// Whether the session is notified.
    pub notify_session: bool,
    /// The payload.
    pub payload: Bytes,
    /// The lease-expiry policy (`retry` or `fail`).
    pub policy: String,
    /// The status.
    pub status: String,
    /// The CAS version.
    pub version: u64,
    /// Claims so far.
    pub attempt: u64,
    /// Records folded (the stream's next position).
    pub records: u64,
    /// Progress updates recorded.
    pub updates: u64,
    /// How many of them were trimmed (their bytes dropped, their records kept).
    pub trimmed_updates: u64,
    /// The latest checkpoint.
    pub checkpoint: Bytes,
    /// The result data (completed tasks).
    pub result_data: Bytes,
    /// The result error (failed and canceled tasks).
    pub result_error: String,
    /// The first transcript failure.
    pub output_file_error: String,
    /// Input given to a waiting task, for its next attempt.
    pub pending_resume: Option<Bytes>,
    /// The context snapshot.
    pub context_snapshot: Bytes,
    /// When cancellation was first requested (ms).
    pub cancel_requested_at: Option<u64>,
    /// The first cancel reason.
    pub cancel_reason: String,
    /// Creation time (ms).
    pub created_at: u64,
    /// Last lifecycle event (ms).
    pub updated_at: u64,
    /// When the task became terminal (ms).
    pub done_at: Option<u64>,
    /// The running attempt's lease deadline (ms).
    pub lease_deadline: Option<u64>,
    /// When the task is visible to its parent or session: `deferred`, `on_create`,
    /// `on_background`.
    pub publication: String,
    /// The parent task (empty for a root task).
    pub parent_task_id: String,
    /// The inputs sent to the task's mailbox (the newest sequence).
    pub inputs_received: u64,
    /// How far the task's attempts read them (the consumed cursor).
    pub inputs_read: u64,
    /// The task this one is a rerun of (`null` for none).
    pub rerun_of: Option<String>,
    /// The tasks this one was rerun as, oldest first.
    pub rerun_as: Vec<String>,
    /// How many times the task may be recovered after a lease expiry (`null`: no limit).
    pub max_recoveries: Option<u64>,
    /// How many times it was recovered.
    pub recoveries: u64,
    /// A delayed pending task's earliest claim time (ms; `null` for none).
    pub not_before: Option<u64>,
    /// The reason of the operator's hold on the task (`null` for none): it is not purged
    /// while one stands.
    pub hold: Option<String>,
}

impl TaskStateView {
    /// The view of `s`.
    pub fn of(s: &TaskState, with_base64: bool) -> Self {
        let b = |d: &[u8]| Bytes::of(d, with_base64);
        Self {
            id: s.spec.id.clone(),
            executor_key: s.spec.executor_key.clone(),
            kind: s.spec.kind.clone(),
            tool: tool_name(&s.spec.payload),
            description: s.spec.description.clone(),
            output_file: s.spec.output_file.clone(),
            session_id: s.spec.session_id.clone(),
            notify_session: s.spec.notify_session,
            payload: b(&s.spec.payload),
            policy: s.policy.as_str().to_owned(),
            status: s.status.as_str().to_owned(),
            version: s.version,
            attempt: s.attempt,
            records: s.position,
            updates: s.updates,
            trimmed_updates: s.trimmed,
            checkpoint: b(&s.checkpoint),
            result_data: b(&s.result_data),
            result_error: s.result_error.clone(),
            output_file_error: s.output_file_error.clone(),
            pending_resume: s.pending_resume.as_deref().map(b),
            context_snapshot: b(&s.context_snapshot),
            cancel_requested_at: s.cancel_requested_at.map(|t| t.0),
            cancel_reason: s.cancel_reason.clone(),
            created_at: s.created_at.0,
            updated_at: s.updated_at.0,
            done_at: s.done_at.map(|t| t.0),
            lease_deadline: s.lease_deadline.map(|t| t.0),
            publication: s.publication.as_str().to_owned(),
            parent_task_id: s.parent_task_id.clone(),
            inputs_received: s.mailbox.latest,
            inputs_read: s.mailbox.consumed,
            rerun_of: s.rerun_of().map(str::to_owned),
            rerun_as: s.rerun_as().to_vec(),
            max_recoveries: s.max_recoveries,
            recoveries: s.recoveries,
            not_before: s.not_before.map(|t| t.0),
            hold: s.hold.as_deref().map(str::to_owned),
        }
    }
}

/// A task: its folded state and what is wrong with its stream, if anything.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskDetail {
    /// The task id.
    pub task: String,
    /// The state, folded up to the first damaged or illegal record (`null` if none folds).
    pub state: Option<TaskStateView>,
    /// Records read intact.
    pub records: u64,
    /// The global sequence of the last record read intact (0 for none): the records of the
    /// task a stream carries past it are the ones this answer does not count.
    pub last_seq: u64,
    /// Problems of the stream, one line each (empty for a clean stream).
    pub problems: Vec<String>,
}

/// Query of the endpoints that show byte fields.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct BytesQuery {
    /// Include byte fields as base64, not only their size and text.
    pub bytes: Option<bool>,
}

/// One record of a task's stream, as stored.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RecordView {
    /// The task.
    pub task: String,
    /// Position in the task's stream (0 is `created`).
    pub position: u64,
    /// Global commit sequence.
    pub seq: u64,
    /// The event type (`created`, `attempt_started`, `heartbeat`, …).
    #[serde(rename = "type")]
    pub event_type: String,
    /// The event's time, ms since the epoch.
    pub at: u64,
    /// CRC-32 of the record, 8 hex digits.
    pub crc: String,
    /// The chain digest, 64 hex digits: SHA-256 (record format 2), or BLAKE3 in journals of
    /// record format 1.
    pub digest: String,
    /// The encoded record's size in bytes.
    pub size: usize,
    /// The event as in the export format (`docs/export-format.md`): `{"type": …, fields…}`;
    /// byte fields are base64, or `{"redacted_len": N}` on the streams.
    #[schema(value_type = Object)]
    pub event: serde_json::Value,
}

impl RecordView {
    /// The view of `record` of `task`; byte fields as `bytes` says.
    ///
    /// # Errors
    /// When the event does not serialize (it always does).
    pub fn of(task: &str, record: &Record, bytes: ByteFields) -> Result<Self, serde_json::Error> {
        Ok(Self {
            task: task.to_owned(),
            position: record.position,
            seq: record.seq,
            event_type: record.event.event_type().as_str().to_owned(),
            at: record.event.at().0,
            crc: format!("{:08x}", record.crc),
            digest: record.digest.to_hex(),
            size: record.size,
            event: event_json(&record.event, bytes)?,
        })
    }
}

/// The export-format JSON of `event`.
fn event_json(event: &Event, bytes: ByteFields) -> Result<serde_json::Value, serde_json::Error> {
    serde_json::to_value(EventJson::new(event, bytes))
}

/// A damaged record of a stream.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DamagedRecord {
    /// Its position.
    pub position: u64,
    /// What is wrong.
    pub problem: String,
}

/// A page of a task's records.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RecordPage {
    /// The task.
    pub task: String,
    /// The records, in stream order.
    pub records: Vec<RecordView>,
    /// Damaged records met in the range.
    pub damaged: Vec<DamagedRecord>,
    /// The stream's length (records, intact or not).
    pub length: u64,
    /// Pass as `from` for the next page; `null` at the end.
    pub next_from: Option<u64>,
}

/// Query of `GET /api/tasks/{id}/records`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RecordsQuery {
    /// The first position (default 0).
    pub from: Option<u64>,
    /// At most this many records (default 500, at most 5000).
    pub limit: Option<usize>,
}

/// Query of `GET /api/tasks/{id}/state`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StateQuery {
    /// The last position folded (0 is `created`); default: the last record.
    pub at: Option<u64>,
    /// Include byte fields as base64.
    pub bytes: Option<bool>,
}

/// The record a state-at-position view ends with.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AtRecord {
    /// Its position.
    pub position: u64,
    /// Its global sequence.
    pub seq: u64,
    /// Its time (ms).
    pub time: u64,
    /// Its event type.
    #[serde(rename = "type")]
    pub event_type: String,
}

/// A task as it was after a position (time travel).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StateAt {
    /// The task.
    pub task: String,
    /// The last record folded.
    pub at: AtRecord,
    /// The stream's last position.
    pub last_position: u64,
    /// The state after `at` (`null` if nothing folds).
    pub state: Option<TaskStateView>,
    /// Problems met up to `at`.
    pub problems: Vec<String>,
}

/// Query of `GET /api/tasks/{id}/updates`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UpdatesQuery {
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// At most this many updates (default 100, at most 1000).
    pub limit: Option<usize>,
    /// Include data as base64.
    pub bytes: Option<bool>,
}

/// A progress update.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UpdateView {
    /// Its position in the task's stream.
    pub position: u64,
    /// Its global sequence.
    pub seq: u64,
    /// The attempt that emitted it.
    pub attempt: u64,
    /// The idempotency key.
    pub event_id: String,
    /// The kind tag.
    pub kind: String,
    /// The data.
    pub data: Bytes,
    /// Key/value metadata.
    pub metadata: Vec<MetadataPair>,
    /// Whether its data and metadata were trimmed (`dtask trim`): both are empty, the rest
    /// is as it was appended.
    pub trimmed: bool,
    /// When it was appended (ms).
    pub at: u64,
}

/// One metadata entry of an update.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MetadataPair {
    /// The key.
    pub key: String,
    /// The value.
    pub value: String,
}

/// A page of a task's progress updates.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UpdatePage {
    /// The task.
    pub task: String,
    /// The updates, oldest first.
    pub updates: Vec<UpdateView>,
    /// Pass as `cursor` for the next page. Always given: at the end it points at what is
    /// stored now, so polling with it yields only newer updates.
    pub next_cursor: String,
}

/// `POST /api/tasks`: a task to create (pending, for an executor to claim).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitBody {
    /// The task id; default `<kind or "task">_<UUID v7>`.
    pub id: Option<String>,
    /// The executor key that routes the task (required).
    pub executor_key: String,
    /// A free tag; also the prefix of a generated id (`[A-Za-z0-9_-]`, at most 64 bytes).
    #[serde(default)]
    pub kind: String,
    /// The payload, any JSON value (stored as its JSON text). A JSON object with a
    /// `tool_name` names the task's tool.
    #[schema(value_type = Object)]
    pub payload: Option<serde_json::Value>,
    /// Human-readable description.
    #[serde(default)]
    pub description: String,
    /// The session notifications are routed to.
    #[serde(default)]
    pub session_id: String,
    /// Whether the session is notified.
    #[serde(default)]
    pub notify_session: bool,
    /// Path of a derived transcript.
    #[serde(default)]
    pub output_file: String,
    /// The lease-expiry policy, `retry` (default) or `fail`; with an embedded manager the
    /// executor's policy is used instead.
    pub policy: Option<String>,
    /// How many times a `retry` task may be recovered after a lease expiry before the next
    /// one fails it (default: no limit); with an embedded manager the executor's is used
    /// instead.
    pub max_recoveries: Option<u64>,
    /// The earliest time a worker may claim the task, in milliseconds since the UNIX epoch
    /// (a delayed run; default: at once); at most 253402300799999, the end of the year 9999:
    /// a larger number is no time in milliseconds (nanoseconds, say) and is refused (400
    /// `invalid_request`).
    #[schema(maximum = 253_402_300_799_999_u64)]
    pub not_before: Option<u64>,
}

/// The latest `not_before` a submit takes: 9999-12-31T23:59:59.999Z, in milliseconds since
/// the UNIX epoch.
pub const MAX_NOT_BEFORE_MS: u64 = 253_402_300_799_999;

/// `POST /api/tasks/{id}/cancel`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Why (the first reason wins).
    #[serde(default)]
    pub reason: String,
}

/// `POST /api/tasks/{id}/rerun`: the new task's id, if the caller names it.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RerunBody {
    /// The new task's id; without it, `<id>.rerun-<n>` (`n` counting the task's reruns
    /// from 1). Naming a rerun the task already has returns it (a repeated request reruns
    /// once).
    pub id: Option<String>,
}

/// `POST /api/tasks/{id}/hold`: why the task is held.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HoldBody {
    /// Why (a case number, an investigation): required, at most the store's error limit.
    pub reason: String,
}

/// `DELETE /api/tasks/{id}`: what a purge deleted.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PurgeView {
    /// Each purged stream: the root task's first, then its nested tasks'.
    pub purged: Vec<PurgedStreamView>,
}

/// One stream a purge deleted the records of.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PurgedStreamView {
    /// The task.
    pub task: String,
    /// Records deleted.
    pub records: u64,
    /// Bytes of the records deleted.
    pub bytes: u64,
}

impl PurgeView {
    /// The view of a purge's outcome.
    #[must_use]
    pub fn of(purged: &[dtask_journal::PurgedStream]) -> Self {
        Self {
            purged: purged
                .iter()
                .map(|p| PurgedStreamView {
                    task: p.task.clone(),
                    records: p.records,
                    bytes: p.bytes,
                })
                .collect(),
        }
    }
}

/// `POST /api/tasks/{id}/trim`: how many of the latest progress updates stay whole.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TrimBody {
    /// The latest progress updates kept whole.
    pub keep: u64,
}

/// `POST /api/tasks/{id}/trim`: what a trim did.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TrimView {
    /// The task.
    pub task: String,
    /// Progress updates trimmed by this call (0: nothing was written).
    pub records: u64,
    /// Records framed again (the trimmed ones and every record after the first of them).
    pub rewritten: u64,
    /// Bytes saved.
    pub bytes: u64,
}

impl TrimView {
    /// The view of a trim's outcome.
    #[must_use]
    pub fn of(trimmed: &dtask_journal::TrimmedStream) -> Self {
        Self {
            task: trimmed.task.clone(),
            records: trimmed.records,
            rewritten: trimmed.rewritten,
            bytes: trimmed.bytes,
        }
    }
}

/// `POST /api/tasks/{id}/resume`: input for a task waiting for it.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeBody {
    /// The input as text (UTF-8); give this or `data_base64`.
    pub data: Option<String>,
    /// The input as standard base64.
    pub data_base64: Option<String>,
    /// The version of the wait being answered (default: the task's current version).
    pub expected_version: Option<u64>,
}

/// `POST /api/tasks/{id}/inputs`: an input for the task's mailbox, at any time before it
/// ends.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputBody {
    /// The sender's idempotency key: the same key with the same content returns the input
    /// already recorded.
    pub event_id: String,
    /// The input kind (for example `user_message`).
    pub kind: String,
    /// The input as text (UTF-8); give this or `data_base64`.
    pub data: Option<String>,
    /// The input as standard base64.
    pub data_base64: Option<String>,
    /// `queued` (default) or `preempt`.
    pub delivery: Option<String>,
}

/// `POST /api/tasks/{id}/messages`: a message for a durable agent's run, which its model
/// sees before its next call.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageBody {
    /// The text (required, not blank).
    pub text: String,
    /// The sender's idempotency key (default: a new UUID); `agent.close` is the close's.
    pub event_id: Option<String>,
    /// Also drop the model call in flight, which is asked again with the message
    /// (default `false`).
    pub preempt: Option<bool>,
}

/// The answer of `POST /api/tasks/{id}/inputs`, `/messages` and `/close`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct InputView {
    /// The input's sequence in the mailbox (1, 2, 3, …).
    pub sequence: u64,
    /// The sender's idempotency key.
    pub event_id: String,
    /// Whether this request recorded it (`false`: it was recorded before).
    pub inserted: bool,
}

impl InputView {
    /// The answer for `record`, which this request recorded when `inserted`.
    #[must_use]
    pub fn of(record: dtask_engine::InputRecord, inserted: bool) -> Self {
        Self {
            sequence: record.sequence,
            event_id: record.event_id,
            inserted,
        }
    }
}

/// `POST /api/notifications/receive`: lease the outbox's deliverable notifications.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReceiveBody {
    /// How many at most (default 100, at most 1000).
    pub limit: Option<i64>,
    /// The lease, in milliseconds (required, > 0): a notification not acknowledged within it
    /// is handed out again, with a fresh receipt.
    pub lease_ms: u64,
    /// How long to wait, in milliseconds, while nothing is deliverable (default 0: answer at
    /// once; at most 60000): the answer comes as soon as something is (a notification queued,
    /// a lease run out), or empty at the end of the wait.
    pub wait_ms: Option<u64>,
    /// Only the notifications routed to this session (default: every session's), so that
    /// consumers of different sessions do not take each other's.
    pub session: Option<String>,
}

/// A notification handed out of the outbox with its receipt.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NotificationView {
    /// The notification id (`<task>:<version>:<kind>` for a lifecycle one,
    /// `dtask.custom:…:application-event` for an application one).
    pub id: String,
    /// The task it concerns.
    pub task_id: String,
    /// The session it is routed to.
    pub session_id: String,
    /// The task version when it was queued.
    pub version: u64,
    /// The kind (`task_created`, `waiting_input`, `completed`, … or the application's).
    pub kind: String,
    /// The data, whole in `base64` (empty for a lifecycle notification).
    pub data: Bytes,
    /// `queued`, or `preempt` for an application notification sent to preempt.
    pub delivery: String,
    /// When it was queued (ms).
    pub created_at: u64,
    /// The receipt to acknowledge it with (fresh on every delivery).
    pub receipt: String,
}

impl NotificationView {
    /// The view of a delivered notification.
    pub fn of(n: dtask_engine::Notification) -> Self {
        Self {
            data: Bytes::of(&n.data, true),
            delivery: n.delivery.as_str().to_owned(),
            created_at: n.created_at.as_millis(),
            id: n.id,
            task_id: n.task_id,
            session_id: n.session_id,
            version: n.version,
            kind: n.kind,
            receipt: n.receipt,
        }
    }
}

/// The answer of `POST /api/notifications/receive`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NotificationBatch {
    /// The notifications leased, in insertion order (none when nothing is deliverable).
    pub notifications: Vec<NotificationView>,
}

/// `POST /api/notifications/ack`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AckBody {
    /// The receipt of the notification's latest delivery.
    pub receipt: String,
}

/// The answer of `POST /api/notifications/ack`: the notification left the outbox for good.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AckView {
    /// The receipt acknowledged.
    pub receipt: String,
}

/// `POST /api/tasks/{id}/release`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// A replacement context snapshot as text (empty clears it); absent keeps it.
    pub context_snapshot: Option<String>,
}

/// Query of `POST /api/verify`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct VerifyQuery {
    /// Audit only this task (the global index checks are skipped then).
    pub task: Option<String>,
}

/// One finding of an audit.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProblemView {
    /// The task concerned (empty for an index key that names no task).
    pub task: String,
    /// The record concerned, when there is one.
    pub position: Option<u64>,
    /// The kind of problem (as `dtask verify` names it).
    pub kind: String,
    /// The reason.
    pub detail: String,
}

/// The audit's report (as `dtask verify --json`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VerifyReport {
    /// `journal` or `task`.
    pub scope: String,
    /// Whether nothing is wrong.
    pub clean: bool,
    /// Tasks checked.
    pub tasks: u64,
    /// Records read intact.
    pub records: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The last global sequence.
    pub last_seq: u64,
    /// Entries of the `live` index (tasks not terminal).
    pub live: u64,
    /// Queued notifications (whole-journal audits only).
    pub outbox: u64,
    /// Every problem found.
    pub problems: Vec<ProblemView>,
    /// How long the audit took, in milliseconds.
    pub elapsed_ms: u64,
}

/// Journal statistics kept by the server as it reads the journal's commits.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Stats {
    /// `owner` (this server writes the journal) or `follower` (`--read-only`).
    pub mode: String,
    /// The journal's format version.
    pub journal_format: u32,
    /// The framing of the journal's records: 1 (BLAKE3 chain digests) or 2 (SHA-256).
    pub record_format: u8,
    /// The version of a PostgreSQL journal's database schema (`null` for an embedded
    /// journal).
    pub postgres_schema: Option<u32>,
    /// The last global sequence the server has read.
    pub last_seq: u64,
    /// Whether the first count of the journal is done (the counts below are 0 until then).
    pub counted: bool,
    /// Tasks.
    pub tasks: u64,
    /// Records.
    pub records: u64,
    /// Bytes of the records.
    pub bytes: u64,
    /// Tasks whose stream does not fold cleanly (as last read).
    pub tasks_with_problems: u64,
    /// Purged tasks: their records deleted, their tombstones kept (not in `tasks`).
    pub tasks_purged: u64,
    /// Tasks by status.
    pub by_status: std::collections::BTreeMap<String, u64>,
    /// Tasks by executor: the 50 executor keys with the most tasks, the tasks of any other
    /// key summed under `other`.
    pub by_executor: std::collections::BTreeMap<String, u64>,
    /// Records by event type.
    pub by_type: std::collections::BTreeMap<String, u64>,
    /// Open SSE streams.
    pub subscribers: u64,
    /// Notifications queued and not yet acknowledged (the outbox's backlog: `dtask outbox`
    /// lists them), from the counts — as of `last_seq`; `null` until the first count is done.
    pub outbox: Option<u64>,
    /// The storage engine's own figures (RocksDB journals; `null` for PostgreSQL): what the
    /// appends left owed to its background threads.
    pub storage: Option<StorageView>,
    /// What a synced append promises where the journal's directory lies, as `dtask probe`
    /// judges it without timing a sync (`null` for PostgreSQL).
    pub sync_promise: Option<SyncPromiseView>,
}

/// What a synced append promises where the journal lies (`dtask_journal::probe::Verdict`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SyncPromiseView {
    /// `stable` (no volatile write cache), `flushed` (a volatile cache each sync flushes),
    /// `lost` (a file system in memory, write barriers off) or `unknown`.
    pub promise: String,
    /// Why, in a sentence.
    pub why: String,
    /// Cautions that do not change the promise.
    pub notes: Vec<String>,
}

impl From<&dtask_journal::probe::Verdict> for SyncPromiseView {
    fn from(verdict: &dtask_journal::probe::Verdict) -> Self {
        Self {
            promise: verdict.promise.as_str().to_owned(),
            why: verdict.why.clone(),
            notes: verdict.notes.clone(),
        }
    }
}

/// The storage engine's state at one moment (`Journal::storage_stats`; `dtask stats` prints
/// the same).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StorageView {
    /// A row per column family.
    pub spaces: Vec<SpaceView>,
    /// Memtable flushes running.
    pub running_flushes: u64,
    /// Compactions running.
    pub running_compactions: u64,
    /// Whether writes are stopped until the background work catches up.
    pub write_stopped: bool,
    /// The rate writes are slowed to, bytes a second (0 when they are not).
    pub delayed_write_rate: u64,
    /// Failed flushes or compactions since the journal was opened.
    pub background_errors: u64,
    /// Whether flushes and compactions write table files with direct I/O, past the page
    /// cache (`false` on a follower, which writes none).
    pub direct_table_io: bool,
}

/// One column family's memtables and table files.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SpaceView {
    /// The column family (`events`, `finished`, `commits`, `live`, `outbox`, `meta`).
    pub name: String,
    /// Bytes in memtables (the active one and those waiting for their flush).
    pub memtable_bytes: u64,
    /// Full memtables waiting for their flush.
    pub immutable_memtables: u64,
    /// Table files at level 0.
    pub level0_files: u64,
    /// Bytes of the table files in use.
    pub table_bytes: u64,
    /// Bytes the storage engine estimates its compactions must rewrite (work owed).
    pub pending_compaction_bytes: u64,
    /// Keys, by the storage engine's estimate.
    pub estimated_keys: u64,
}

impl From<&dtask_journal::StorageStats> for StorageView {
    fn from(stats: &dtask_journal::StorageStats) -> Self {
        Self {
            spaces: stats
                .spaces
                .iter()
                .map(|space| SpaceView {
                    name: space.name.clone(),
                    memtable_bytes: space.memtable_bytes,
                    immutable_memtables: space.immutable_memtables,
                    level0_files: space.level0_files,
                    table_bytes: space.table_bytes,
                    pending_compaction_bytes: space.pending_compaction_bytes,
                    estimated_keys: space.estimated_keys,
                })
                .collect(),
            running_flushes: stats.running_flushes,
            running_compactions: stats.running_compactions,
            write_stopped: stats.write_stopped,
            delayed_write_rate: stats.delayed_write_rate,
            background_errors: stats.background_errors,
            direct_table_io: stats.direct_table_io,
        }
    }
}

/// The payload's `tool_name`, when the payload is a JSON object with one (as `dtask tasks`
/// reads it).
pub fn tool_name(payload: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(payload).ok()?;
    value.get("tool_name")?.as_str().map(str::to_owned)
}

/// The answer of `GET /healthz` and `GET /readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok` (HTTP 200) or `unavailable` (HTTP 503).
    pub status: HealthStatus,
    /// Why not `ok`, in a fixed order; empty when `ok`.
    pub reasons: Vec<HealthReason>,
}

/// Whether a health check passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthStatus {
    /// The check passed.
    Ok,
    /// The check failed: see the reasons.
    Unavailable,
}

/// Why a health check failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum HealthReason {
    /// The journal stopped after a failed sync: every append is refused until the process
    /// reopens it (liveness and readiness).
    JournalStopped,
    /// The journal's disk is full: appends fail, and nothing of them is written, until there
    /// is room again; the journal then writes again by itself (readiness).
    DiskFull,
    /// The journal's last write failed for another reason (an I/O error, a database out of
    /// reach) and none has succeeded since; each refused write's error says why (readiness).
    JournalFailing,
    /// The server's first count of the journal is not done: its counts, statistics and
    /// streams would miss records (readiness).
    Counting,
    /// The server's last read of the journal's commits failed: a PostgreSQL journal's
    /// database out of reach, a follower that cannot catch up (readiness).
    JournalUnreadable,
    /// The server's manager is closed: submits are refused (a service draining before it
    /// stops) (readiness).
    ManagerClosed,
    /// The server is shutting down (readiness).
    Stopping,
}

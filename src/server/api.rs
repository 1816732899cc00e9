//! The HTTP handlers of the JSON API, each with its OpenAPI description.

use super::error::ErrorBody;
use super::extract::{ApiPath, ApiQuery, JsonBody, OptionalJsonBody};
use super::metrics::Scrape;
use super::model::{
    AckBody, AckView, BytesQuery, CancelBody, HoldBody, InputBody, InputView, ListQuery,
    MessageBody, NotificationBatch, NotificationView, PurgeView, ReceiveBody, RecordPage,
    RecordsQuery, ReleaseBody, RerunBody, ResumeBody, StateAt, StateQuery, Stats, StorageView,
    SubmitBody, SyncPromiseView, TaskDetail, TaskList, TaskStateView, TrimBody, TrimView,
    UpdatePage, UpdatesQuery, VerifyQuery, VerifyReport,
};
use super::sse::{self, Scope};
use super::{read, ApiError, Shared};
use crate::conversation::ConversationView;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use dtask_journal::Journal;
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;
use utoipa::IntoParams;

type Api<T> = Result<Json<T>, ApiError>;

/// Runs a blocking read of the journal on the blocking pool.
async fn blocking<T: Send + 'static>(
    shared: &Shared,
    read: impl FnOnce(&Journal) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let journal = shared.journal.clone();
    tokio::task::spawn_blocking(move || read(&journal)).await?
}

/// The answers every write may give besides its own, in the OpenAPI document of each write
/// (the error mapping is `ApiError`'s).
#[derive(utoipa::IntoResponses)]
#[allow(
    dead_code,
    reason = "describes responses for the OpenAPI document; never built"
)]
enum WriteRefusals {
    /// A follower (read-only) server.
    #[response(status = 403, description = "A read-only server")]
    ReadOnly(ErrorBody),
    /// The journal's disk is full.
    #[response(
        status = 507,
        description = "The journal's disk is full: nothing was written; the same request can be made again once there is room"
    )]
    DiskFull(ErrorBody),
    /// The journal stopped after a failed sync.
    #[response(
        status = 503,
        description = "`journal_stopped`: the journal stopped after a failed sync and refuses every write until the process restarts (see `/healthz`)"
    )]
    JournalStopped(ErrorBody),
}

/// Lists tasks, a page at a time, with filters.
#[utoipa::path(
    get, path = "/api/tasks", tag = "tasks", params(ListQuery),
    responses(
        (status = 200, description = "A page of tasks, in id order", body = TaskList),
        (status = 400, description = "A bad filter or cursor", body = ErrorBody),
    )
)]
pub async fn list_tasks(
    State(shared): State<Arc<Shared>>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Api<TaskList> {
    blocking(&shared, move |j| read::list_tasks(j, &query))
        .await
        .map(Json)
}

/// A task's folded state.
#[utoipa::path(
    get, path = "/api/tasks/{id}", tag = "tasks",
    params(("id" = String, Path, description = "The task id"), BytesQuery),
    responses(
        (status = 200, description = "The task, folded from its stream", body = TaskDetail),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 410, description = "The task was purged: only its tombstone is left", body = ErrorBody),
        (status = 400, description = "An id holding NUL, or a bad body", body = ErrorBody),
    )
)]
pub async fn get_task(
    State(shared): State<Arc<Shared>>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<BytesQuery>,
) -> Api<TaskDetail> {
    let base64 = query.bytes.unwrap_or(false);
    blocking(&shared, move |j| read::task(j, &id, base64))
        .await
        .map(Json)
}

/// A task's raw records: position, sequence, CRC, chain digest, type, time, event.
#[utoipa::path(
    get, path = "/api/tasks/{id}/records", tag = "tasks",
    params(("id" = String, Path, description = "The task id"), RecordsQuery),
    responses(
        (status = 200, description = "A page of the task's records", body = RecordPage),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 400, description = "An id holding NUL, or a bad query", body = ErrorBody),
    )
)]
pub async fn get_records(
    State(shared): State<Arc<Shared>>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<RecordsQuery>,
) -> Api<RecordPage> {
    blocking(&shared, move |j| {
        read::records(j, &id, query.from.unwrap_or(0), query.limit)
    })
    .await
    .map(Json)
}

/// The task as it was after a position (time travel).
#[utoipa::path(
    get, path = "/api/tasks/{id}/state", tag = "tasks",
    params(("id" = String, Path, description = "The task id"), StateQuery),
    responses(
        (status = 200, description = "The state after position `at`", body = StateAt),
        (status = 400, description = "A position past the end", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 422, description = "No intact record up to the position (code `does_not_fold`: run a verify)", body = ErrorBody),
    )
)]
pub async fn get_state(
    State(shared): State<Arc<Shared>>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<StateQuery>,
) -> Api<StateAt> {
    let base64 = query.bytes.unwrap_or(false);
    blocking(&shared, move |j| read::state_at(j, &id, query.at, base64))
        .await
        .map(Json)
}

/// A durable agent's run as a conversation: its opening messages, each model answer with
/// its tool calls (their tasks' status and results), the messages sent to the run where the
/// model first saw them, and the token usage (the view `dtask show` prints).
#[utoipa::path(
    get, path = "/api/tasks/{id}/conversation", tag = "tasks",
    params(("id" = String, Path, description = "The run's task id")),
    responses(
        (status = 200, description = "The run's conversation (`problem` alone when its entries do not fold)", body = ConversationView),
        (status = 404, description = "No such task, or one that is not an agent run (code `not_an_agent_run`)", body = ErrorBody),
        (status = 410, description = "The task was purged", body = ErrorBody),
        (status = 422, description = "The task's stream does not fold at all (code `does_not_fold`: run a verify)", body = ErrorBody),
        (status = 400, description = "An id holding NUL, or a bad body", body = ErrorBody),
    )
)]
pub async fn get_conversation(
    State(shared): State<Arc<Shared>>,
    ApiPath(id): ApiPath<String>,
) -> Api<ConversationView> {
    blocking(&shared, move |j| read::conversation(j, &id))
        .await
        .map(Json)
}

/// A task's progress updates, oldest first, a page at a time.
#[utoipa::path(
    get, path = "/api/tasks/{id}/updates", tag = "tasks",
    params(("id" = String, Path, description = "The task id"), UpdatesQuery),
    responses(
        (status = 200, description = "A page of updates; `next_cursor` goes on from the end of what is stored now", body = UpdatePage),
        (status = 400, description = "A bad cursor", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
    )
)]
pub async fn get_updates(
    State(shared): State<Arc<Shared>>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<UpdatesQuery>,
) -> Api<UpdatePage> {
    let base64 = query.bytes.unwrap_or(false);
    blocking(&shared, move |j| {
        read::updates(j, &id, query.cursor.as_deref(), query.limit, base64)
    })
    .await
    .map(Json)
}

fn owner(shared: &Shared) -> Result<&super::control::Owner, ApiError> {
    shared.owner.as_ref().ok_or_else(ApiError::read_only)
}

/// Creates a task (owner mode).
#[utoipa::path(
    post, path = "/api/tasks", tag = "control", request_body = SubmitBody,
    responses(
        (status = 201, description = "The task, created pending", body = TaskStateView),
        (status = 400, description = "Bad JSON, an unknown field, an invalid spec, a `not_before` past the year 9999 (`invalid_request`)", body = ErrorBody),
        WriteRefusals,
        (status = 409, description = "The id is taken", body = ErrorBody),
        (status = 413, description = "The body is over the limit", body = ErrorBody),
        (status = 415, description = "Not `application/json`", body = ErrorBody),
    )
)]
pub async fn submit(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody<SubmitBody>,
) -> Result<Response, ApiError> {
    let state = owner(&shared)?.submit(body).await?;
    Ok((StatusCode::CREATED, Json(TaskStateView::of(&state, false))).into_response())
}

/// Requests cancellation (owner mode); the first reason wins.
#[utoipa::path(
    post, path = "/api/tasks/{id}/cancel", tag = "control", request_body = CancelBody,
    params(("id" = String, Path, description = "The task id")),
    responses(
        (status = 200, description = "The task after the request", body = TaskStateView),
        WriteRefusals,
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task is terminal", body = ErrorBody),
        (status = 400, description = "An id holding NUL, or a bad body", body = ErrorBody),
        (status = 413, description = "The body is over the limit", body = ErrorBody),
        (status = 415, description = "Not `application/json`", body = ErrorBody),
        (status = 410, description = "The task was purged", body = ErrorBody),
    )
)]
pub async fn cancel(
    State(shared): State<Arc<Shared>>,
    ApiPath(id): ApiPath<String>,
    OptionalJsonBody(body): OptionalJsonBody<CancelBody>,
) -> Api<TaskStateView> {
    let state = owner(&shared)?.cancel(&id, body).await?;
    Ok(Json(TaskStateView::of(&state, false)))
}

/// Gives input to a task waiting for it (owner mode).
#[utoipa::path(
    post, path = "/api/tasks/{id}/resume", tag = "control", request_body = ResumeBody,
    params(("id" = String, Path, description = "The task id")),
    responses(
        (status = 200, description = "The task, pending again with the input", body = TaskStateView),
        WriteRefusals,
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "Not waiting for input, or not at the expected version", body = ErrorBody),
        (status = 400, description = "An id holding NUL, or a bad body", body = ErrorBody),
        (status = 413, description = "The body is over the limit", body = ErrorBody),
        (status = 415, description = "Not `application/json`", body = ErrorBody),
        (status = 410, description = "The task was purged", body = ErrorBody),
    )
)]
pub async fn resume(
    State(shared): State<Arc<Shared>>,
    ApiPath(id): ApiPath<String>,
    OptionalJsonBody(body): OptionalJsonBody<ResumeBody>,
) -> Api<TaskStateView> {
    let state = owner(&shared)?.resume(&id, body).await?;
    Ok(Json(TaskStateView::of(&state, false)))
}

/// Sends an input to a task's mailbox (owner mode): at any time before the task ends; a task
/// waiting for input wakes, a running one receives it.
#[utoipa::path(
    post, path = "/api/tasks/{id}/inputs", tag = "control", request_body = InputBody,
    params(("id" = String, Path, description = "The task id")),
    responses(
        (status = 200, description = "The input's sequence, and whether this request recorded it", body = InputView),
        (status = 400, description = "A bad body", body = ErrorBody),
        WriteRefusals,
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task has ended, or the event id was used with other content", body = ErrorBody),
        (status = 413, description = "The body is over the limit", body = ErrorBody),
        (status = 415, description = "Not `application/json`", body = ErrorBody),
        (status = 410, description = "The task was purged", body = ErrorBody),
    )
)]
pub async fn send_input(
    State(shared): State<Arc<Shared>>,
    ApiPath(id): ApiPath<String>,
    JsonBody(body): JsonBody<InputBody>,
) -> Api<InputView> {
    Ok(Json(owner(&shared)?.send_input(&id, body).await?))
}

/// Sends a message to a durable agent's run (owner mode): its model sees it before its next
/// call, once the tool results of the turn before are in; with `preempt`, a model call in
/// flight is dropped and asked again with it (docs/tools.md, "Durable agents").
#[utoipa::path(
    post, path = "/api/tasks/{id}/messages", tag = "control", request_body = MessageBody,
    params(("id" = String, Path, description = "The run's task id")),
    responses(
        (status = 200, description = "The message's input: its sequence, and whether this request recorded it", body = InputView),
        (status = 400, description = "Blank text, bad JSON, an unknown field", body = ErrorBody),
        WriteRefusals,
        (status = 404, description = "No such task, or one that is not an agent run (code `not_an_agent_run`)", body = ErrorBody),
        (status = 409, description = "The run has ended, or the event id was used with other content", body = ErrorBody),
        (status = 413, description = "The body is over the limit", body = ErrorBody),
        (status = 415, description = "Not `application/json`", body = ErrorBody),
        (status = 410, description = "The task was purged", body = ErrorBody),
        (status = 422, description = "The task's payload is not a run this server reads", body = ErrorBody),
    )
)]
pub async fn send_message(
    State(shared): State<Arc<Shared>>,
    ApiPath(id): ApiPath<String>,
    JsonBody(body): JsonBody<MessageBody>,
) -> Api<InputView> {
    Ok(Json(owner(&shared)?.send_message(&id, body).await?))
}

/// Closes an interactive durable agent run (owner mode): once it has answered every message
/// sent before, it completes with its last answer. Closing twice closes once.
#[utoipa::path(
    post, path = "/api/tasks/{id}/close", tag = "control",
    params(("id" = String, Path, description = "The run's task id")),
    responses(
        (status = 200, description = "The close's input, and whether this request recorded it", body = InputView),
        WriteRefusals,
        (status = 404, description = "No such task, or one that is not an agent run (code `not_an_agent_run`)", body = ErrorBody),
        (status = 409, description = "A run that is not interactive (code `not_interactive`), or one that has ended", body = ErrorBody),
        (status = 400, description = "An id holding NUL, or a bad body", body = ErrorBody),
        (status = 410, description = "The task was purged", body = ErrorBody),
        (status = 422, description = "The task's payload is not a run this server reads", body = ErrorBody),
    )
)]
pub async fn close_run(
    State(shared): State<Arc<Shared>>,
    ApiPath(id): ApiPath<String>,
) -> Api<InputView> {
    Ok(Json(owner(&shared)?.close_run(&id).await?))
}

/// Leases the outbox's deliverable notifications (owner mode): up to `limit`, in insertion
/// order, each with a fresh receipt; one leased to another consumer and not expired is
/// skipped; with `session`, only that session's. With `wait_ms`, an empty answer waits for a
/// notification (long polling). Leases live in this server's memory: after its restart
/// every unacknowledged notification is deliverable again (at-least-once).
#[utoipa::path(
    post, path = "/api/notifications/receive", tag = "notifications", request_body = ReceiveBody,
    responses(
        (status = 200, description = "The notifications leased (none when nothing is deliverable)", body = NotificationBatch),
        (status = 400, description = "A zero lease, a wait over 60 s, bad JSON, an unknown field", body = ErrorBody),
        (status = 403, description = "A read-only server", body = ErrorBody),
        (status = 413, description = "The body is over the limit", body = ErrorBody),
        (status = 415, description = "Not `application/json`", body = ErrorBody),
    )
)]
pub async fn receive_notifications(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody<ReceiveBody>,
) -> Api<NotificationBatch> {
    let owner = owner(&shared)?;
    let wait = Duration::from_millis(body.wait_ms.unwrap_or(0));
    if wait > MAX_RECEIVE_WAIT {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("wait_ms: at most {}", MAX_RECEIVE_WAIT.as_millis()),
        ));
    }
    let deadline = tokio::time::Instant::now() + wait;
    // Subscribed before the first look, so that no commit between the look and the wait is
    // missed.
    let mut commits = shared.hub.commits();
    let mut stop = shared.stop.clone();
    let mut parked = None;
    let mut stopping = false;
    let notifications = loop {
        let got = owner.receive_notifications(body.clone()).await?;
        let now = tokio::time::Instant::now();
        if !got.is_empty() || now >= deadline || stopping || *stop.borrow() {
            break got;
        }
        // Counted while it waits (a dropped request uncounts itself).
        parked.get_or_insert_with(|| Parked::new(&shared.metrics.receives_waiting));
        // A commit may have queued one; a lease may run out without any: look again at the
        // next commit, and at least every RECEIVE_RECHECK.
        let recheck = deadline.min(now + RECEIVE_RECHECK);
        tokio::select! {
            _ = commits.recv() => {}
            () = tokio::time::sleep_until(recheck) => {}
            // A server gone (its stop's sender dropped) answers as one stopping.
            changed = stop.changed() => stopping = changed.is_err(),
        }
    };
    Ok(Json(NotificationBatch {
        notifications: notifications
            .into_iter()
            .map(NotificationView::of)
            .collect(),
    }))
}

/// A waiting receive, counted in a gauge while it lives.
struct Parked(prometheus_client::metrics::gauge::Gauge);

impl Parked {
    fn new(gauge: &prometheus_client::metrics::gauge::Gauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The longest a receive of notifications waits for one (`wait_ms`).
const MAX_RECEIVE_WAIT: Duration = Duration::from_secs(60);

/// How often a waiting receive looks again without a commit (for leases that ran out).
const RECEIVE_RECHECK: Duration = Duration::from_secs(1);

/// Acknowledges a delivered notification (owner mode): it leaves the outbox for good.
#[utoipa::path(
    post, path = "/api/notifications/ack", tag = "notifications", request_body = AckBody,
    responses(
        (status = 200, description = "Acknowledged: the notification left the outbox", body = AckView),
        (status = 400, description = "Bad JSON, an unknown field", body = ErrorBody),
        WriteRefusals,
        (status = 404, description = "An unknown receipt, or one superseded by a later delivery", body = ErrorBody),
        (status = 409, description = "The receipt's lease expired: the notification stays and is delivered again", body = ErrorBody),
        (status = 413, description = "The body is over the limit", body = ErrorBody),
        (status = 415, description = "Not `application/json`", body = ErrorBody),
    )
)]
pub async fn ack_notification(
    State(shared): State<Arc<Shared>>,
    JsonBody(body): JsonBody<AckBody>,
) -> Api<AckView> {
    let receipt = body.receipt.clone();
    owner(&shared)?.ack_notification(body).await?;
    Ok(Json(AckView { receipt }))
}

/// Releases a suspended task to pending (owner mode).
#[utoipa::path(
    post, path = "/api/tasks/{id}/release", tag = "control", request_body = ReleaseBody,
    params(("id" = String, Path, description = "The task id")),
    responses(
        (status = 200, description = "The task, pending again", body = TaskStateView),
        WriteRefusals,
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "Not suspended", body = ErrorBody),
        (status = 400, description = "An id holding NUL, or a bad body", body = ErrorBody),
        (status = 413, description = "The body is over the limit", body = ErrorBody),
        (status = 415, description = "Not `application/json`", body = ErrorBody),
        (status = 410, description = "The task was purged", body = ErrorBody),
    )
)]
pub async fn release(
    State(shared): State<Arc<Shared>>,
    ApiPath(id): ApiPath<String>,
    OptionalJsonBody(body): OptionalJsonBody<ReleaseBody>,
) -> Api<TaskStateView> {
    let state = owner(&shared)?.release(&id, body).await?;
    Ok(Json(TaskStateView::of(&state, false)))
}

/// Reruns a finished root task as a new task (owner mode): created pending from the task's
/// creation (same spec under the new id, policy, initial checkpoint), both tasks naming each
/// other (`rerun_of`, `rerun_as`).
#[utoipa::path(
    post, path = "/api/tasks/{id}/rerun", tag = "control", request_body = RerunBody,
    params(("id" = String, Path, description = "The finished task")),
    responses(
        (status = 201, description = "The new task, pending (or the rerun named, made before)", body = TaskStateView),
        (status = 400, description = "A nested task (its parent reruns it), or a bad new id", body = ErrorBody),
        WriteRefusals,
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task has not ended, or the new id is taken", body = ErrorBody),
        (status = 413, description = "The body is over the limit", body = ErrorBody),
        (status = 415, description = "Not `application/json`", body = ErrorBody),
        (status = 410, description = "The task was purged", body = ErrorBody),
    )
)]
pub async fn rerun(
    State(shared): State<Arc<Shared>>,
    ApiPath(id): ApiPath<String>,
    OptionalJsonBody(body): OptionalJsonBody<RerunBody>,
) -> Result<Response, ApiError> {
    let state = owner(&shared)?.rerun(&id, body).await?;
    Ok((StatusCode::CREATED, Json(TaskStateView::of(&state, false))).into_response())
}

/// Purges a finished root task (owner mode): its records, and its nested tasks', are
/// deleted from the journal, one tombstone a task kept; the id stays taken. Reads of it
/// answer 410 from then on.
#[utoipa::path(
    delete, path = "/api/tasks/{id}", tag = "control",
    params(("id" = String, Path, description = "The finished root task")),
    responses(
        (status = 200, description = "What each purged stream lost, the root's first", body = PurgeView),
        (status = 400, description = "A nested task (purge its root)", body = ErrorBody),
        WriteRefusals,
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task (or a nested task) has not ended, or a notification of it is still queued", body = ErrorBody),
        (status = 410, description = "The task was purged before", body = ErrorBody),
    )
)]
pub async fn purge_task(
    State(shared): State<Arc<Shared>>,
    ApiPath(id): ApiPath<String>,
) -> Api<PurgeView> {
    let purged = owner(&shared)?.store.purge(&id).await?;
    Ok(Json(PurgeView::of(&purged)))
}

/// Places an operator's hold on a task (owner mode): while it stands the task (and the tree
/// it is in) is not purged. Placed again while one stands, nothing changes.
#[utoipa::path(
    post, path = "/api/tasks/{id}/hold", tag = "control", request_body = HoldBody,
    params(("id" = String, Path, description = "The task")),
    responses(
        (status = 200, description = "The task, held", body = TaskStateView),
        (status = 400, description = "An empty or too long reason", body = ErrorBody),
        WriteRefusals,
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 410, description = "The task was purged", body = ErrorBody),
        (status = 413, description = "The body is over the limit", body = ErrorBody),
        (status = 415, description = "Not `application/json`", body = ErrorBody),
    )
)]
pub async fn hold_task(
    State(shared): State<Arc<Shared>>,
    ApiPath(id): ApiPath<String>,
    JsonBody(body): JsonBody<HoldBody>,
) -> Api<TaskStateView> {
    let state = owner(&shared)?.store.hold(&id, &body.reason).await?;
    Ok(Json(TaskStateView::of(&state, false)))
}

/// Lifts the hold on a task (owner mode): it may be purged again. Without a hold, nothing
/// changes.
#[utoipa::path(
    delete, path = "/api/tasks/{id}/hold", tag = "control",
    params(("id" = String, Path, description = "The task")),
    responses(
        (status = 200, description = "The task, its hold lifted", body = TaskStateView),
        WriteRefusals,
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 410, description = "The task was purged", body = ErrorBody),
        (status = 400, description = "An id holding NUL, or a bad body", body = ErrorBody),
    )
)]
pub async fn lift_hold(
    State(shared): State<Arc<Shared>>,
    ApiPath(id): ApiPath<String>,
) -> Api<TaskStateView> {
    let state = owner(&shared)?.store.lift_hold(&id).await?;
    Ok(Json(TaskStateView::of(&state, false)))
}

/// Trims a task's progress (owner mode): every progress update but the last `keep` loses
/// its data and metadata and keeps its place, event id, kind and time; the task's state is
/// unchanged and the journal's chain stays whole. A task with nothing more to trim is not
/// written to (`records` 0).
#[utoipa::path(
    post, path = "/api/tasks/{id}/trim", tag = "control", request_body = TrimBody,
    params(("id" = String, Path, description = "The task")),
    responses(
        (status = 200, description = "What the trim did", body = TrimView),
        (status = 400, description = "An agent run (its updates are its conversation)", body = ErrorBody),
        WriteRefusals,
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task is on hold", body = ErrorBody),
        (status = 410, description = "The task was purged", body = ErrorBody),
        (status = 413, description = "The body is over the limit", body = ErrorBody),
        (status = 415, description = "Not `application/json`", body = ErrorBody),
    )
)]
pub async fn trim_task(
    State(shared): State<Arc<Shared>>,
    ApiPath(id): ApiPath<String>,
    JsonBody(body): JsonBody<TrimBody>,
) -> Api<TrimView> {
    let trimmed = owner(&shared)?.store.trim_progress(&id, body.keep).await?;
    Ok(Json(TrimView::of(&trimmed)))
}

/// Audits the journal (or one task): CRCs, hash chains, legality, indexes. One audit runs at
/// a time.
#[utoipa::path(
    post, path = "/api/verify", tag = "journal", params(VerifyQuery),
    responses(
        (status = 200, description = "The audit's report (problems are findings, not errors)", body = VerifyReport),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 429, description = "An audit is running already", body = ErrorBody),
        (status = 400, description = "A task id holding NUL", body = ErrorBody),
    )
)]
pub async fn verify(
    State(shared): State<Arc<Shared>>,
    ApiQuery(query): ApiQuery<VerifyQuery>,
) -> Api<VerifyReport> {
    let Ok(running) = Arc::clone(&shared.verify_gate).try_acquire_owned() else {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "busy",
            "an audit is running already; try again when it is done",
        ));
    };
    // The audit holds the gate, not this request: a client that goes away leaves the audit
    // running (it cannot be stopped), and the next request waits for its end.
    let report = blocking(&shared, move |j| {
        let _running = running;
        read::verify(j, query.task.as_deref())
    })
    .await?;
    let result = if report.clean { "clean" } else { "problems" };
    shared
        .metrics
        .verifies
        .get_or_create(&super::metrics::ResultLabel {
            result: result.to_owned(),
        })
        .inc();
    Ok(Json(report))
}

/// The storage engine's figures, read off the runtime's threads (`None` on PostgreSQL, or
/// when they cannot be read).
async fn storage_figures(shared: &Shared) -> Option<dtask_journal::StorageStats> {
    let journal = shared.journal.clone();
    tokio::task::spawn_blocking(move || journal.storage_stats().ok().flatten())
        .await
        .ok()
        .flatten()
}

/// Journal statistics: tasks by status and executor, records by type.
#[utoipa::path(
    get, path = "/api/stats", tag = "journal",
    responses((status = 200, description = "The server's counts of the journal", body = Stats))
)]
pub async fn stats(State(shared): State<Arc<Shared>>) -> Json<Stats> {
    let s = shared.projection.snapshot();
    let storage = storage_figures(&shared).await;
    let outbox = s.counted.then(|| s.outbox());
    Json(Stats {
        mode: if shared.owner.is_some() {
            "owner"
        } else {
            "follower"
        }
        .to_owned(),
        journal_format: shared.journal.format_version(),
        record_format: shared.journal.record_format().version(),
        postgres_schema: shared.journal.schema_version(),
        last_seq: s.last_seq,
        counted: s.counted,
        tasks: s.tasks,
        records: s.records,
        bytes: s.bytes,
        tasks_with_problems: s.problems,
        tasks_purged: s.purged,
        by_status: s
            .by_status
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), *v))
            .collect(),
        by_executor: s.executors_shown(),
        by_type: s
            .by_type
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), *v))
            .collect(),
        subscribers: shared.hub.subscribers(),
        outbox,
        storage: storage.as_ref().map(StorageView::from),
        sync_promise: shared.sync_promise.as_ref().map(SyncPromiseView::from),
    })
}

/// Query of the streams.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    /// Start at this global sequence (without it, and without `Last-Event-ID`: from now on,
    /// or for a task stream from its first record).
    pub from_seq: Option<u64>,
}

/// The sequence a stream starts after: `Last-Event-ID`, else `from_seq - 1`, else `default`.
fn start_after(headers: &HeaderMap, query: &StreamQuery, default: u64) -> Result<u64, ApiError> {
    if let Some(value) = headers.get("last-event-id") {
        return value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                ApiError::bad_request("Last-Event-ID must be a global sequence (a number)")
            });
    }
    Ok(query.from_seq.map_or(default, |s| s.saturating_sub(1)))
}

/// Committed records in commit order, as server-sent events (`id` = global sequence,
/// `event: record`, `data` = a record as in `/records`, byte fields as their length). A
/// damaged record is passed over as an `event: damaged` without `id` (`data`: its `task`,
/// `position`, `after_seq` — the record sent before it — and `error`), and the stream goes on.
#[utoipa::path(
    get, path = "/api/stream", tag = "streams", params(StreamQuery,
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this global sequence")),
    responses(
        (status = 200, description = "An event stream (`text/event-stream`)", content_type = "text/event-stream", body = String),
        (status = 400, description = "A bad Last-Event-ID", body = ErrorBody),
        (status = 503, description = "Too many streams are open", body = ErrorBody),
    )
)]
pub async fn stream(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<StreamQuery>,
) -> Result<Response, ApiError> {
    // "From now on": the journal's last sequence (not the pump's, which is 0 until its first
    // count is done).
    let now = blocking(&shared, |j| Ok(j.last_seq()?)).await?;
    let after = start_after(&headers, &query, now)?;
    let events = sse::subscribe(
        &shared.hub,
        shared.journal.clone(),
        Scope::Journal,
        after,
        Arc::clone(&shared.metrics),
        shared.stop.clone(),
    )?;
    Ok(no_buffering(
        Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response(),
    ))
}

/// One task's records as server-sent events, from its first record (or `Last-Event-ID`).
#[utoipa::path(
    get, path = "/api/tasks/{id}/stream", tag = "streams",
    params(("id" = String, Path, description = "The task id"), StreamQuery,
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this global sequence")),
    responses(
        (status = 200, description = "An event stream (`text/event-stream`)", content_type = "text/event-stream", body = String),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 503, description = "Too many streams are open", body = ErrorBody),
        (status = 400, description = "An id holding NUL, or a bad `Last-Event-ID`", body = ErrorBody),
    )
)]
pub async fn task_stream(
    State(shared): State<Arc<Shared>>,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<StreamQuery>,
) -> Result<Response, ApiError> {
    let after = start_after(&headers, &query, 0)?;
    let task = id.clone();
    blocking(&shared, move |j| {
        j.stream_len(&task)?.ok_or_else(|| ApiError::no_task(&task))
    })
    .await?;
    let events = sse::subscribe(
        &shared.hub,
        shared.journal.clone(),
        Scope::Task(id),
        after,
        Arc::clone(&shared.metrics),
        shared.stop.clone(),
    )?;
    Ok(no_buffering(
        Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response(),
    ))
}

/// Asks proxies not to buffer a stream.
fn no_buffering(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    response
        .headers_mut()
        .insert("x-accel-buffering", header::HeaderValue::from_static("no"));
    response
}

/// Metrics in the Prometheus text format.
#[utoipa::path(
    get, path = "/metrics", tag = "journal",
    responses((status = 200, description = "OpenMetrics text", content_type = "application/openmetrics-text", body = String))
)]
pub async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let storage = storage_figures(&shared).await;
    let counts = shared.projection.snapshot();
    let outbox = counts.counted.then(|| counts.outbox());
    let scrape = Scrape {
        subscribers: shared.hub.subscribers(),
        store: shared.owner.as_ref().map(|owner| owner.store.counts()),
        outbox,
        storage,
        ready: super::health::not_ready(&shared).is_empty(),
        journal_stopped: super::health::journal_stopped(&shared),
    };
    let text = shared.metrics.render(&counts, &scrape);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The API's OpenAPI document.
#[utoipa::path(
    get, path = "/openapi.json", tag = "journal",
    responses((status = 200, description = "This document", content_type = "application/json", body = serde_json::Value))
)]
pub async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        super::openapi::document(),
    )
        .into_response()
}

/// Any path the API does not have.
pub async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}

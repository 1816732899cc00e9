//! The control side of the API (owner mode): submit, cancel, resume, release, through the
//! engine's task store, or through an embedded [`Manager`] when the server was given one (so
//! that executors are checked at submit, and a cancel reaches an attempt running in it).

use super::model::{
    AckBody, CancelBody, InputBody, InputView, MessageBody, ReceiveBody, ReleaseBody, RerunBody,
    ResumeBody, SubmitBody, MAX_NOT_BEFORE_MS,
};
use super::ApiError;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use dtask_engine::{
    Command, CreateRequest, Manager, Notification, StoreError, SubmitRequest, TaskStore,
};
use dtask_journal::{LeasePolicy, TaskSpec, Timestamp};
use dtask_replay::{Status, TaskState};

/// How many times a command retries a version conflict with a concurrent writer.
const CAS_TRIES: usize = 8;

/// What a server that owns the journal writes with.
#[derive(Debug, Clone)]
pub struct Owner {
    /// The task store.
    pub store: TaskStore,
    /// The manager, when one is embedded.
    pub manager: Option<Manager>,
}

/// A generated task id: `<kind or "task">_<UUID v7>` (time-ordered).
fn generate_id(kind: &str) -> Result<String, ApiError> {
    let valid = kind.len() <= 64
        && kind
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid {
        return Err(ApiError::new(
            axum::http::StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("kind {kind:?}: at most 64 bytes of [A-Za-z0-9_-] to prefix a generated id"),
        ));
    }
    let prefix = if kind.is_empty() { "task" } else { kind };
    Ok(format!("{prefix}_{}", uuid::Uuid::now_v7().simple()))
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::BAD_REQUEST,
        "invalid_request",
        message,
    )
}

impl Owner {
    /// Creates a task (pending).
    ///
    /// # Errors
    /// 400 for a bad request, 409 when the id is taken.
    pub async fn submit(&self, body: SubmitBody) -> Result<TaskState, ApiError> {
        if let Some(at) = body.not_before.filter(|at| *at > MAX_NOT_BEFORE_MS) {
            // Nanoseconds or microseconds taken for milliseconds: no date a reader can show.
            return Err(invalid(format!(
                "not_before {at}: milliseconds since the UNIX epoch, at most \
                 {MAX_NOT_BEFORE_MS} (the end of the year 9999)"
            )));
        }
        let id = match (body.id, &self.manager) {
            (Some(id), _) => id,
            // The manager's ids (its `ManagerConfig::id_generator`, if any).
            (None, Some(manager)) => manager.allocate_task_id(&body.kind)?,
            (None, None) => generate_id(&body.kind)?,
        };
        let policy = match body.policy.as_deref() {
            None | Some("retry") => LeasePolicy::Retry,
            Some("fail") => LeasePolicy::Fail,
            Some(other) => return Err(invalid(format!("policy {other:?}: `retry` or `fail`"))),
        };
        let payload = match &body.payload {
            None => Vec::new(),
            Some(value) => serde_json::to_vec(value).map_err(|e| invalid(e.to_string()))?,
        };
        let spec = TaskSpec {
            id,
            executor_key: body.executor_key,
            kind: body.kind,
            payload,
            description: body.description,
            output_file: body.output_file,
            session_id: body.session_id,
            notify_session: body.notify_session,
        };
        match &self.manager {
            Some(manager) => Ok(manager
                .submit(SubmitRequest {
                    spec,
                    not_before: body.not_before.map(Timestamp),
                    ..SubmitRequest::default()
                })
                .await?),
            None => Ok(self
                .store
                .create(CreateRequest {
                    spec,
                    policy: Some(policy),
                    max_recoveries: body.max_recoveries,
                    not_before: body.not_before.map(Timestamp),
                    ..CreateRequest::default()
                })
                .await?),
        }
    }

    /// Requests cancellation.
    ///
    /// # Errors
    /// 404, 409 for a terminal task.
    pub async fn cancel(&self, id: &str, body: CancelBody) -> Result<TaskState, ApiError> {
        if let Some(manager) = &self.manager {
            // As the store answers without a manager: an ended task is a conflict.
            let before = self.store.get(id).await?;
            if before.is_terminal() {
                return Err(StoreError::AlreadyTerminal(id.to_owned()).into());
            }
            return Ok(manager.request_cancel(id, &body.reason).await?);
        }
        self.retrying(id, |_| {
            Ok(Command::RequestCancel {
                reason: body.reason.clone(),
            })
        })
        .await
    }

    /// Gives input to a task waiting for it.
    ///
    /// # Errors
    /// 400 for bad data, 404, 409 when the task is not waiting (or not at the expected
    /// version).
    pub async fn resume(&self, id: &str, body: ResumeBody) -> Result<TaskState, ApiError> {
        let data = body_data(body.data, body.data_base64)?;
        let version = match body.expected_version {
            Some(v) => v,
            None => self.store.get(id).await?.version,
        };
        Ok(self
            .store
            .execute(
                id,
                version,
                Command::Resume {
                    data,
                    context_snapshot: None,
                },
            )
            .await?)
    }

    /// Sends an input to the task's mailbox (any status before it ends; a task waiting for
    /// input wakes).
    ///
    /// # Errors
    /// 400 for a bad body, 404, 409 when the task has ended or the event id was used with
    /// other content.
    pub async fn send_input(&self, id: &str, body: InputBody) -> Result<InputView, ApiError> {
        let data = body_data(body.data, body.data_base64)?;
        let delivery = match body.delivery.as_deref() {
            None | Some("queued") => dtask_journal::Delivery::Queued,
            Some("preempt") => dtask_journal::Delivery::Preempt,
            Some(other) => {
                return Err(invalid(format!(
                    "delivery must be `queued` or `preempt`, not {other:?}"
                )))
            }
        };
        let (record, inserted) = self
            .store
            .send_input(
                id,
                dtask_engine::InputRequest {
                    event_id: body.event_id,
                    kind: body.kind,
                    data,
                    delivery,
                },
            )
            .await?;
        Ok(InputView::of(record, inserted))
    }

    /// Sends a message to the durable agent's run `id` (`agent::send_message`).
    ///
    /// # Errors
    /// 400 for blank text, 404 for a task that is not an agent run, 409 for an ended run or
    /// an event id sent before with other content.
    pub async fn send_message(&self, id: &str, body: MessageBody) -> Result<InputView, ApiError> {
        if body.text.trim().is_empty() {
            return Err(invalid("text: required, not blank"));
        }
        let mut message = dtask_engine::agent::AgentMessage::new(body.text);
        if body.preempt.unwrap_or(false) {
            message = message.preempt();
        }
        if let Some(event_id) = body.event_id {
            message = message.with_event_id(event_id);
        }
        let (record, inserted) =
            dtask_engine::agent::send_message(&self.store, id, message).await?;
        Ok(InputView::of(record, inserted))
    }

    /// Closes the interactive agent run `id` (`agent::close_run`).
    ///
    /// # Errors
    /// 404 for a task that is not an agent run, 409 for a run that is not interactive or
    /// has ended.
    pub async fn close_run(&self, id: &str) -> Result<InputView, ApiError> {
        let (record, inserted) = dtask_engine::agent::close_run(&self.store, id).await?;
        Ok(InputView::of(record, inserted))
    }

    /// Leases up to `limit` deliverable notifications of the outbox for `lease_ms`.
    ///
    /// # Errors
    /// 400 for a zero lease.
    pub async fn receive_notifications(
        &self,
        body: ReceiveBody,
    ) -> Result<Vec<Notification>, ApiError> {
        if body.lease_ms == 0 {
            return Err(invalid("lease_ms: required, more than 0"));
        }
        let (limit, lease) = (
            body.limit.unwrap_or(0),
            std::time::Duration::from_millis(body.lease_ms),
        );
        Ok(match body.session.as_deref() {
            Some(session) => {
                self.store
                    .receive_session_notifications(session, limit, lease)
                    .await?
            }
            None => self.store.receive_notifications(limit, lease).await?,
        })
    }

    /// Acknowledges a delivered notification: it leaves the outbox.
    ///
    /// # Errors
    /// 404 for an unknown or superseded receipt, 409 when the receipt's lease has expired
    /// (the notification is delivered again).
    pub async fn ack_notification(&self, body: AckBody) -> Result<(), ApiError> {
        Ok(self.store.ack_notification(&body.receipt).await?)
    }

    /// Releases a suspended task to pending.
    ///
    /// # Errors
    /// 404, 409 when the task is not suspended.
    pub async fn release(&self, id: &str, body: ReleaseBody) -> Result<TaskState, ApiError> {
        let snapshot = body.context_snapshot.map(String::into_bytes);
        self.retrying(id, |state| {
            if state.status == Status::Suspended {
                Ok(Command::ReleaseSuspension {
                    context_snapshot: snapshot.clone(),
                })
            } else {
                Err(StoreError::IllegalTransition {
                    status: state.status,
                    operation: "release_suspension",
                }
                .into())
            }
        })
        .await
    }

    /// Reruns a finished root task as a new task (see [`TaskStore::rerun`]).
    ///
    /// # Errors
    /// 400 for a nested task, a bad new id or (with a manager) an executor it does not run,
    /// 404, 409 while the task has not ended or when the new id is taken.
    pub async fn rerun(&self, id: &str, body: RerunBody) -> Result<TaskState, ApiError> {
        if let Some(manager) = &self.manager {
            return Ok(manager.rerun(id, body.id).await?);
        }
        // As a manager running the managed tools would: their task's creation checkpoint
        // is a hand-off's started marker, not carried by a rerun.
        let key = self.store.get(id).await?.spec.executor_key.clone();
        let keep = dtask_engine::managed::codec::rerun_keeps_checkpoint(&key);
        Ok(self.store.rerun_with(id, body.id, keep).await?)
    }

    /// Executes the command `make` builds from the current state, retrying version conflicts.
    async fn retrying(
        &self,
        id: &str,
        make: impl Fn(&TaskState) -> Result<Command, ApiError>,
    ) -> Result<TaskState, ApiError> {
        let mut last = None;
        for _ in 0..CAS_TRIES {
            let current = self.store.get(id).await?;
            let command = make(&current)?;
            match self.store.execute(id, current.version, command).await {
                Ok(state) => return Ok(state),
                Err(e @ StoreError::VersionConflict { .. }) => last = Some(e),
                Err(e) => return Err(e.into()),
            }
        }
        Err(last.map_or_else(|| ApiError::internal("no attempt was made"), ApiError::from))
    }
}

/// A body's bytes, given as text (`data`) or as standard base64 (`data_base64`), not both;
/// none is empty.
fn body_data(text: Option<String>, base64: Option<String>) -> Result<Vec<u8>, ApiError> {
    match (text, base64) {
        (Some(text), None) => Ok(text.into_bytes()),
        (None, Some(b64)) => STANDARD
            .decode(b64)
            .map_err(|e| invalid(format!("data_base64: {e}"))),
        (None, None) => Ok(Vec::new()),
        (Some(_), Some(_)) => Err(invalid("give `data` or `data_base64`, not both")),
    }
}

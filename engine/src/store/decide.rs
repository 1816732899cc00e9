//! `decide`: what a request means for a task, as events. Pure: no I/O, the time is a parameter.
//!
//! Every write of the store is decided here — lifecycle commands, creation, progress updates,
//! application notifications and their acknowledgements — and then goes the same way: one
//! atomic journal append, then the same events folded into the task (`TaskStore::commit`).
//! The transition rules themselves (how an expired lease is resolved, when a cancel is
//! direct, the attempt fence) are methods of [`TaskState`], which the fold's legality check
//! calls too: each rule is written once.
//!
//! The order of checks follows the reference store: request validation first (before any
//! lookup), then existence, lazy lease expiry (written as its own event before the command is
//! decided), the version CAS, and last status and lease authority.

use super::config::StoreConfig;
use super::error::{NotFound, Result, StoreError};
use super::request::{
    application_notification_id, CreateRequest, NotificationRequest, UpdateRequest,
};
use dtask_journal::{Event, ExpiryResolution, TaskSpec, Timestamp};
use dtask_replay::{Fenced, Status, Task, TaskState};

/// A lifecycle command on an existing task. Every command carries the version the caller
/// observed (the CAS token).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Command {
    /// Claim a pending task (T2).
    Start,
    /// Renew the running attempt's lease (T3).
    Heartbeat,
    /// Write the started marker (T4).
    CommitStart {
        /// The managed checkpoint (non-empty).
        checkpoint: Vec<u8>,
    },
    /// Record the first transcript failure (T5).
    ReportTranscriptFailure {
        /// The error text (non-empty).
        error: String,
    },
    /// Complete the task (T6).
    Complete {
        /// The result data.
        data: Vec<u8>,
    },
    /// Fail the task (T7).
    Fail {
        /// The error text (non-empty).
        error: String,
    },
    /// End the attempt waiting for input (T8).
    WaitInput {
        /// The checkpoint with the input request (non-empty).
        checkpoint: Vec<u8>,
    },
    /// End the attempt suspended (T9).
    Suspend {
        /// The checkpoint (non-empty).
        checkpoint: Vec<u8>,
    },
    /// End the attempt and go back to pending (T10).
    Yield {
        /// A replacement checkpoint; empty keeps the stored one.
        checkpoint: Vec<u8>,
    },
    /// Acknowledge cancellation (T11).
    AckCancel {
        /// A reason used when no cancel reason is recorded.
        reason: String,
    },
    /// Request cancellation (T12–T16).
    RequestCancel {
        /// The reason (the first one wins).
        reason: String,
    },
    /// Give input to a waiting task (T17).
    Resume {
        /// The resume data.
        data: Vec<u8>,
        /// A replacement context snapshot.
        context_snapshot: Option<Vec<u8>>,
    },
    /// Release a suspended task (T18).
    ReleaseSuspension {
        /// A replacement context snapshot (empty clears it).
        context_snapshot: Option<Vec<u8>>,
    },
}

impl Command {
    /// The operation's name, for errors and traces.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Heartbeat => "heartbeat",
            Self::CommitStart { .. } => "commit_start",
            Self::ReportTranscriptFailure { .. } => "report_transcript_failure",
            Self::Complete { .. } => "complete",
            Self::Fail { .. } => "fail",
            Self::WaitInput { .. } => "wait_input",
            Self::Suspend { .. } => "suspend",
            Self::Yield { .. } => "yield",
            Self::AckCancel { .. } => "ack_cancel",
            Self::RequestCancel { .. } => "request_cancel",
            Self::Resume { .. } => "resume",
            Self::ReleaseSuspension { .. } => "release_suspension",
        }
    }
}

/// What a command decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Append these events (lifecycle first, then any notification).
    Write(Vec<Event>),
    /// Nothing to write: the command is an idempotent repeat.
    Unchanged,
}

/// What a write keyed by an event id (a progress update, an application notification)
/// decides.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "a return value, consumed at once: boxing the event would cost an allocation"
)]
pub(crate) enum Keyed<R> {
    /// A new event id: append this event.
    New(Event),
    /// The event id was recorded before, by the record at `position`: the store compares its
    /// content with the request's (same: the original is the answer; other: a conflict).
    Repeat {
        /// The position of the record that carries the event id.
        position: u64,
        /// The request, handed back for the comparison.
        request: R,
    },
}

fn check_len(field: &'static str, len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(StoreError::invalid(
            field,
            format!("{len} bytes exceeds the limit of {max}"),
        ));
    }
    Ok(())
}

fn check_non_empty(field: &'static str, empty: bool) -> Result<()> {
    if empty {
        return Err(StoreError::invalid(field, "must not be empty"));
    }
    Ok(())
}

/// Validates a task id.
pub(crate) fn validate_task_id(id: &str, config: &StoreConfig) -> Result<()> {
    check_non_empty("task id", id.is_empty())?;
    check_len("task id", id.len(), config.max_id_bytes)?;
    if id.contains('\0') {
        return Err(StoreError::invalid("task id", "must not contain NUL"));
    }
    Ok(())
}

/// Validates a create request (before any lookup).
fn validate_create(
    spec: &TaskSpec,
    checkpoint: &[u8],
    context_snapshot: &[u8],
    config: &StoreConfig,
) -> Result<()> {
    validate_task_id(&spec.id, config)?;
    check_non_empty("executor key", spec.executor_key.is_empty())?;
    check_len("executor key", spec.executor_key.len(), config.max_id_bytes)?;
    if spec.notify_session && spec.session_id.is_empty() {
        return Err(StoreError::invalid(
            "notify session",
            "requires a session id",
        ));
    }
    check_len("payload", spec.payload.len(), config.max_value_bytes)?;
    check_len("checkpoint", checkpoint.len(), config.max_value_bytes)?;
    check_len(
        "context snapshot",
        context_snapshot.len(),
        config.max_value_bytes,
    )?;
    Ok(())
}

/// Validates a command's own fields (before any lookup).
pub(crate) fn validate(command: &Command, config: &StoreConfig) -> Result<()> {
    let max_value = config.max_value_bytes;
    let max_error = config.max_error_bytes;
    match command {
        Command::Start | Command::Heartbeat => Ok(()),
        Command::CommitStart { checkpoint }
        | Command::WaitInput { checkpoint }
        | Command::Suspend { checkpoint } => {
            check_non_empty("checkpoint", checkpoint.is_empty())?;
            check_len("checkpoint", checkpoint.len(), max_value)
        }
        Command::Yield { checkpoint } => check_len("checkpoint", checkpoint.len(), max_value),
        Command::ReportTranscriptFailure { error } => {
            check_non_empty("error", error.is_empty())?;
            check_len("error", error.len(), max_error)
        }
        Command::Complete { data } => check_len("data", data.len(), max_value),
        Command::Fail { error } => {
            if error.is_empty() {
                return Err(StoreError::InvalidExecutionResult(
                    "a failure needs an error".into(),
                ));
            }
            check_len("error", error.len(), max_error)
        }
        Command::AckCancel { reason } | Command::RequestCancel { reason } => {
            check_len("reason", reason.len(), max_error)
        }
        Command::Resume {
            data,
            context_snapshot,
        } => {
            check_len("data", data.len(), max_value)?;
            check_len(
                "context snapshot",
                context_snapshot.as_ref().map_or(0, Vec::len),
                max_value,
            )
        }
        Command::ReleaseSuspension { context_snapshot } => check_len(
            "context snapshot",
            context_snapshot.as_ref().map_or(0, Vec::len),
            max_value,
        ),
    }
}

/// Decides a create request (T1): the `created` record, and the `task_created`
/// notification in the same batch when the task has a session. Returns the task's id.
pub(crate) fn create(
    request: CreateRequest,
    now: Timestamp,
    config: &StoreConfig,
) -> Result<(String, Vec<Event>)> {
    let CreateRequest {
        spec,
        policy,
        checkpoint,
        context_snapshot,
    } = request;
    validate_create(&spec, &checkpoint, &context_snapshot, config)?;
    let policy = policy.ok_or_else(|| StoreError::invalid("policy", "must be retry or fail"))?;
    let id = spec.id.clone();
    let notification = lifecycle_notification(&spec, "task_created", 1, now);
    let created = Event::Created {
        spec,
        policy,
        checkpoint,
        context_snapshot,
        at: now,
    };
    Ok((id, std::iter::once(created).chain(notification).collect()))
}

/// The lease-expiry event due at `now`, if the running attempt's lease has run out.
pub(crate) fn expiry(state: &TaskState, now: Timestamp) -> Option<Vec<Event>> {
    if !state.lease_expired_at(now) {
        return None;
    }
    let deadline = state.lease_deadline?;
    let resolution = state.expiry_resolution();
    let mut events = vec![Event::LeaseExpired {
        resolution,
        deadline,
        at: now,
    }];
    if resolution.is_terminal() {
        let kind = if resolution == ExpiryResolution::Failed {
            "failed"
        } else {
            "canceled"
        };
        events.extend(lifecycle_notification(
            &state.spec,
            kind,
            state.version + 1,
            now,
        ));
    }
    Some(events)
}

/// The outbox record of a lifecycle notification, when the task routes them.
fn lifecycle_notification(
    spec: &TaskSpec,
    kind: &str,
    version: u64,
    at: Timestamp,
) -> Option<Event> {
    let routed = !spec.session_id.is_empty();
    let wanted = kind == "task_created" || spec.notify_session;
    (routed && wanted).then(|| Event::NotificationEnqueued {
        id: format!("{}:{version}:{kind}", spec.id),
        event_id: String::new(),
        kind: kind.to_owned(),
        data: Vec::new(),
        version,
        at,
    })
}

fn cas(state: &TaskState, expected: u64) -> Result<()> {
    if state.version == expected {
        Ok(())
    } else {
        Err(StoreError::VersionConflict {
            expected,
            actual: state.version,
        })
    }
}

/// The attempt fence ([`TaskState::check_active`]) as a store error.
fn fence(
    state: &TaskState,
    attempt: Option<u64>,
    now: Timestamp,
    allow_cancel: bool,
) -> Result<()> {
    state
        .check_active(attempt, now, allow_cancel)
        .map_err(|fenced: Fenced| StoreError::LeaseLost(fenced.as_str()))
}

fn write(state: &TaskState, event: Event, notify: Option<&str>, now: Timestamp) -> Decision {
    let mut events = vec![event];
    if let Some(kind) = notify {
        events.extend(lifecycle_notification(
            &state.spec,
            kind,
            state.version + 1,
            now,
        ));
    }
    Decision::Write(events)
}

/// Decides `command` against `state` (whose expired lease, if any, was already resolved).
pub(crate) fn decide(
    state: &TaskState,
    expected_version: u64,
    command: &Command,
    now: Timestamp,
    config: &StoreConfig,
) -> Result<Decision> {
    let lease = now.plus_millis(config.lease_millis());
    if let Command::RequestCancel { reason } = command {
        return request_cancel(state, expected_version, reason, now, lease);
    }
    cas(state, expected_version)?;
    let require = |status: Status| {
        if state.status == status {
            Ok(())
        } else {
            Err(StoreError::IllegalTransition {
                status: state.status,
                operation: command.name(),
            })
        }
    };
    let event = match command {
        Command::Start => {
            require(Status::Pending)?;
            Event::AttemptStarted {
                attempt: state.attempt + 1,
                lease_deadline: lease,
                at: now,
            }
        }
        Command::Resume {
            data,
            context_snapshot,
        } => {
            require(Status::WaitingInput)?;
            Event::InputProvided {
                data: data.clone(),
                context_snapshot: context_snapshot.clone(),
                at: now,
            }
        }
        Command::ReleaseSuspension { context_snapshot } => {
            require(Status::Suspended)?;
            Event::Released {
                context_snapshot: context_snapshot.clone(),
                at: now,
            }
        }
        _ => return decide_active(state, command, now, lease),
    };
    Ok(write(state, event, None, now))
}

/// `RequestCancel` (T12–T16): terminal first, then the CAS, then the first request wins.
fn request_cancel(
    state: &TaskState,
    expected_version: u64,
    reason: &str,
    now: Timestamp,
    lease: Timestamp,
) -> Result<Decision> {
    if state.status.is_terminal() {
        return Err(StoreError::AlreadyTerminal(state.spec.id.clone()));
    }
    cas(state, expected_version)?;
    if state.cancel_requested_at.is_some() {
        return Ok(Decision::Unchanged);
    }
    let direct = state.cancel_is_direct();
    let running = state.status == Status::Running;
    let event = Event::CancelRequested {
        reason: reason.to_owned(),
        lease_deadline: running.then_some(lease),
        direct,
        at: now,
    };
    Ok(write(state, event, direct.then_some("canceled"), now))
}

/// Commands of the active attempt (the CAS already passed): the lease must be live and,
/// except for transcript failures and cancel acknowledgements, no cancel intent may exist.
fn decide_active(
    state: &TaskState,
    command: &Command,
    now: Timestamp,
    lease: Timestamp,
) -> Result<Decision> {
    let allow_cancel = matches!(
        command,
        Command::ReportTranscriptFailure { .. } | Command::AckCancel { .. }
    );
    fence(state, None, now, allow_cancel)?;
    let at = now;
    let (event, notify) = match command {
        Command::Heartbeat => (
            Event::Heartbeat {
                lease_deadline: lease,
                at,
            },
            None,
        ),
        Command::CommitStart { checkpoint } => {
            if !state.checkpoint.is_empty() {
                return Err(StoreError::IllegalTransition {
                    status: state.status,
                    operation: command.name(),
                });
            }
            let checkpoint = checkpoint.clone();
            (Event::StartCommitted { checkpoint, at }, None)
        }
        Command::ReportTranscriptFailure { error } => {
            if !state.output_file_error.is_empty() {
                return Ok(Decision::Unchanged);
            }
            let error = error.clone();
            (Event::TranscriptFailed { error, at }, None)
        }
        Command::AckCancel { reason } => {
            let reason = reason.clone();
            (Event::Canceled { reason, at }, Some("canceled"))
        }
        Command::Complete { data } => {
            let data = data.clone();
            (Event::Completed { data, at }, Some("completed"))
        }
        Command::Fail { error } => {
            let error = error.clone();
            (Event::Failed { error, at }, Some("failed"))
        }
        Command::WaitInput { checkpoint } => {
            let checkpoint = checkpoint.clone();
            (
                Event::WaitingInput { checkpoint, at },
                Some("waiting_input"),
            )
        }
        Command::Suspend { checkpoint } => {
            let checkpoint = checkpoint.clone();
            (Event::Suspended { checkpoint, at }, None)
        }
        Command::Yield { checkpoint } => {
            let checkpoint = checkpoint.clone();
            (Event::Yielded { checkpoint, at }, None)
        }
        Command::Start
        | Command::Resume { .. }
        | Command::ReleaseSuspension { .. }
        | Command::RequestCancel { .. } => {
            return Err(StoreError::IllegalTransition {
                status: state.status,
                operation: command.name(),
            })
        }
    };
    Ok(write(state, event, notify, now))
}

/// Validates a progress update's own fields (before any lookup).
pub(crate) fn validate_update(request: &UpdateRequest, config: &StoreConfig) -> Result<()> {
    if request.attempt == 0 {
        return Err(StoreError::invalid("attempt", "must be positive"));
    }
    if request.event_id.is_empty() {
        return Err(StoreError::invalid("event id", "must not be empty"));
    }
    if request.event_id.len() > config.max_id_bytes {
        return Err(StoreError::invalid("event id", "too long"));
    }
    if request.data.is_empty() {
        return Err(StoreError::invalid("data", "must not be empty"));
    }
    if request.data.len() > config.max_value_bytes {
        return Err(StoreError::invalid(
            "data",
            format!("{} bytes exceeds the limit", request.data.len()),
        ));
    }
    Ok(())
}

/// Decides a progress update of the running attempt: the fence first, then replay detection
/// (an event id seen before, in any attempt, is a [`Keyed::Repeat`]).
pub(crate) fn update(
    task: &Task,
    request: UpdateRequest,
    now: Timestamp,
) -> Result<Keyed<UpdateRequest>> {
    fence(&task.state, Some(request.attempt), now, false)?;
    if let Some(&position) = task.update_ids.get(&request.event_id) {
        return Ok(Keyed::Repeat { position, request });
    }
    let UpdateRequest {
        attempt,
        event_id,
        kind,
        data,
        metadata,
    } = request;
    Ok(Keyed::New(Event::UpdateAppended {
        attempt,
        event_id,
        kind,
        data,
        metadata,
        at: now,
    }))
}

/// Kind prefixes reserved for the engine's own notifications.
pub const RESERVED_KIND_PREFIXES: [&str; 2] = ["dtask.", "eino."];

/// Lifecycle notification kinds, which applications may not use.
const LIFECYCLE_KINDS: [&str; 6] = [
    "task_created",
    "task_backgrounded",
    "waiting_input",
    "completed",
    "failed",
    "canceled",
];

/// Validates an application notification's own fields (before any lookup).
pub(crate) fn validate_notification(
    id: &str,
    attempt: u64,
    request: &NotificationRequest,
    config: &StoreConfig,
) -> Result<()> {
    if request.event_id.is_empty() || request.event_id.len() > config.max_id_bytes {
        return Err(StoreError::invalid(
            "event id",
            "required, at most 1024 bytes",
        ));
    }
    if request.kind.is_empty() || request.kind.len() > config.max_notification_kind_bytes {
        return Err(StoreError::invalid("kind", "required, at most 64 bytes"));
    }
    if LIFECYCLE_KINDS.contains(&request.kind.as_str())
        || RESERVED_KIND_PREFIXES
            .iter()
            .any(|p| request.kind.starts_with(p))
    {
        return Err(StoreError::invalid("kind", "reserved"));
    }
    if request.data.len() > config.max_notification_bytes {
        return Err(StoreError::invalid("data", "over 256 KiB"));
    }
    validate_task_id(id, config)?;
    if attempt == 0 {
        return Err(StoreError::invalid("attempt", "must be positive"));
    }
    Ok(())
}

/// Decides an application notification of the running `attempt`: the fence, the session
/// route, then replay detection by event id.
pub(crate) fn notification(
    task: &Task,
    attempt: u64,
    request: NotificationRequest,
    now: Timestamp,
) -> Result<Keyed<NotificationRequest>> {
    fence(&task.state, Some(attempt), now, false)?;
    if task.state.spec.session_id.is_empty() {
        return Err(StoreError::NotificationUnavailable(
            "the task has no session route",
        ));
    }
    if let Some(&position) = task.notification_ids.get(&request.event_id) {
        return Ok(Keyed::Repeat { position, request });
    }
    let NotificationRequest {
        event_id,
        kind,
        data,
    } = request;
    Ok(Keyed::New(Event::NotificationEnqueued {
        id: application_notification_id(task.state.id(), &event_id),
        event_id,
        kind,
        data,
        version: task.state.version,
        at: now,
    }))
}

/// Decides the acknowledgement of notification `id`, queued by the record of global
/// sequence `enqueued_seq`.
pub(crate) fn ack(task: &Task, id: &str, enqueued_seq: u64, now: Timestamp) -> Result<Decision> {
    if !task.outbox.contains_key(id) {
        return Err(StoreError::NotFound(NotFound::Notification(id.to_owned())));
    }
    Ok(Decision::Write(vec![Event::NotificationAcked {
        id: id.to_owned(),
        enqueued_seq,
        at: now,
    }]))
}

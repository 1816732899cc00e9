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
    application_notification_id, AdvanceCursor, CreateRequest, ExecutionContext, InputRequest,
    NotificationRequest, UpdateRequest,
};
use dtask_journal::{Delivery, Event, ExpiryResolution, Publication, TaskSpec, Timestamp};
use dtask_replay::{part_key, Fenced, Status, Task, TaskState};

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
    /// [`Command::Yield`], the task not to be claimed again before `until`: a durable
    /// timer (a `not_before` record with the `yielded`).
    YieldUntil {
        /// A replacement checkpoint; empty keeps the stored one.
        checkpoint: Vec<u8>,
        /// The earliest time of the next claim.
        until: Timestamp,
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
    /// Consume mailbox inputs up to `cursor` and commit a checkpoint at that boundary (T24).
    CommitInput {
        /// The consumed cursor the attempt saw.
        expected_cursor: u64,
        /// The new consumed cursor (after `expected_cursor`, at most the newest sequence).
        cursor: u64,
        /// The checkpoint (non-empty).
        checkpoint: Vec<u8>,
    },
    /// Complete the task unless input newer than `cursor` arrived (T6'): then the task goes
    /// back to pending and the store answers [`StoreError::InputsPending`].
    CompleteIfNoInputs {
        /// The consumed cursor (must equal the mailbox's).
        cursor: u64,
        /// The result data.
        data: Vec<u8>,
    },
    /// Wait for input unless input newer than `cursor` arrived (T8'); consumes up to
    /// `cursor` either way.
    WaitInputIfNoInputs {
        /// The new consumed cursor (at least the mailbox's, at most the newest sequence).
        cursor: u64,
        /// The checkpoint with the input request (non-empty).
        checkpoint: Vec<u8>,
    },
    /// Suspend unless input newer than `cursor` arrived (T9').
    SuspendIfNoInputs {
        /// The consumed cursor (must equal the mailbox's).
        cursor: u64,
        /// The checkpoint (non-empty).
        checkpoint: Vec<u8>,
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
            Self::YieldUntil { .. } => "yield_until",
            Self::AckCancel { .. } => "ack_cancel",
            Self::RequestCancel { .. } => "request_cancel",
            Self::Resume { .. } => "resume",
            Self::ReleaseSuspension { .. } => "release_suspension",
            Self::CommitInput { .. } => "commit_input",
            Self::CompleteIfNoInputs { .. } => "complete_if_no_inputs",
            Self::WaitInputIfNoInputs { .. } => "wait_input_if_no_inputs",
            Self::SuspendIfNoInputs { .. } => "suspend_if_no_inputs",
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
pub(crate) enum Keyed<R, E = Event> {
    /// A new event id: append this event (or these events).
    New(E),
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
pub(crate) fn validate_create(request: &CreateRequest, config: &StoreConfig) -> Result<()> {
    let CreateRequest {
        spec,
        checkpoint,
        context_snapshot,
        publication,
        parent,
        root_session_id,
        ..
    } = request;
    validate_task_id(&spec.id, config)?;
    check_non_empty("executor key", spec.executor_key.is_empty())?;
    check_len("executor key", spec.executor_key.len(), config.max_id_bytes)?;
    if spec.notify_session && spec.session_id.is_empty() && parent.is_none() {
        return Err(StoreError::invalid(
            "notify session",
            "requires a session id or a parent",
        ));
    }
    if *publication == Publication::OnBackground {
        return Err(StoreError::invalid(
            "publication",
            "on_background requires publish (create deferred, then publish)",
        ));
    }
    if let Some(parent) = parent {
        validate_task_id(&parent.task_id, config)
            .map_err(|_| StoreError::invalid("parent task id", "must be a valid task id"))?;
        if parent.task_id == spec.id {
            return Err(StoreError::invalid(
                "parent task id",
                "a task cannot be its own parent",
            ));
        }
        if parent.attempt == 0 || parent.generation == 0 {
            return Err(StoreError::invalid(
                "parent",
                "the execution context of a running attempt (attempt and generation > 0)",
            ));
        }
        if !root_session_id.is_empty() {
            return Err(StoreError::invalid(
                "root session id",
                "a nested task inherits its parent's",
            ));
        }
    }
    check_len(
        "root session id",
        root_session_id.len(),
        config.max_id_bytes,
    )?;
    check_len("payload", spec.payload.len(), config.max_value_bytes)?;
    check_len("checkpoint", checkpoint.len(), config.max_value_bytes)?;
    check_len(
        "context snapshot",
        context_snapshot.len(),
        config.max_value_bytes,
    )?;
    // Here, with the request's other fields, so that a nested create is refused for it
    // before its parent is looked up (and its lease resolved).
    if request.policy.is_none() {
        return Err(StoreError::invalid("policy", "must be retry or fail"));
    }
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
        | Command::Suspend { checkpoint }
        | Command::WaitInputIfNoInputs { checkpoint, .. }
        | Command::SuspendIfNoInputs { checkpoint, .. } => {
            check_non_empty("checkpoint", checkpoint.is_empty())?;
            check_len("checkpoint", checkpoint.len(), max_value)
        }
        Command::Yield { checkpoint } | Command::YieldUntil { checkpoint, .. } => {
            check_len("checkpoint", checkpoint.len(), max_value)
        }
        Command::ReportTranscriptFailure { error } => {
            check_non_empty("error", error.is_empty())?;
            check_len("error", error.len(), max_error)
        }
        Command::Complete { data } | Command::CompleteIfNoInputs { data, .. } => {
            check_len("data", data.len(), max_value)
        }
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
        Command::CommitInput {
            expected_cursor,
            cursor,
            checkpoint,
        } => {
            if cursor <= expected_cursor {
                return Err(StoreError::invalid(
                    "cursor",
                    "must be after the expected cursor",
                ));
            }
            check_non_empty("checkpoint", checkpoint.is_empty())?;
            check_len("checkpoint", checkpoint.len(), max_value)
        }
    }
}

/// Decides a create request (T1): the `created` record, and the `task_created`
/// notification in the same batch when the task has a session. Returns the task's id.
pub(crate) fn create(
    request: CreateRequest,
    inherited_root: String,
    now: Timestamp,
    config: &StoreConfig,
) -> Result<(String, Vec<Event>)> {
    validate_create(&request, config)?;
    let CreateRequest {
        spec,
        policy,
        checkpoint,
        context_snapshot,
        publication,
        parent,
        root_session_id,
        max_recoveries,
        not_before,
    } = request;
    let policy = policy.ok_or_else(|| StoreError::invalid("policy", "must be retry or fail"))?;
    let root_session_id = if parent.is_some() {
        inherited_root
    } else {
        root_session_id
    };
    let id = spec.id.clone();
    let route = Route {
        spec: &spec,
        publication,
        nested: parent.is_some(),
    };
    let notification = lifecycle_notification(&route, "task_created", 1, now);
    let created =
        if publication == Publication::OnCreate && parent.is_none() && root_session_id.is_empty() {
            // A plain root task: the v1 record.
            Event::Created {
                spec: spec.into(),
                policy,
                checkpoint,
                context_snapshot,
                at: now,
            }
        } else {
            Event::CreatedV2 {
                spec: spec.into(),
                policy,
                checkpoint,
                context_snapshot,
                publication,
                parent_task_id: parent.map(|p| p.task_id).unwrap_or_default(),
                root_session_id,
                at: now,
            }
        };
    let limit = max_recoveries.map(|max_recoveries| Event::RecoveryLimit {
        max_recoveries,
        at: now,
    });
    let delay = not_before
        .filter(|until| *until > now)
        .map(|until| Event::NotBefore { until, at: now });
    Ok((
        id,
        std::iter::once(created)
            .chain(limit)
            .chain(delay)
            .chain(notification)
            .collect(),
    ))
}

/// The creation of a rerun of the finished `original` as task `new_id`, from `created`,
/// the first record of `original`'s stream: the same spec under the new id, policy, initial
/// checkpoint, context snapshot and root session, published on create. The caller appends
/// the lineage records.
pub(crate) fn rerun(original: &TaskState, created: Event, new_id: String) -> Result<CreateRequest> {
    if !original.is_terminal() {
        return Err(StoreError::IllegalTransition {
            status: original.status,
            operation: "rerun",
        });
    }
    if original.is_nested() {
        return Err(StoreError::invalid(
            "id",
            "a nested task is rerun by its parent, not on its own",
        ));
    }
    if new_id == original.spec.id {
        return Err(StoreError::invalid(
            "new id",
            "a rerun is a task of its own",
        ));
    }
    let (Event::Created {
        policy,
        checkpoint,
        context_snapshot,
        ..
    }
    | Event::CreatedV2 {
        policy,
        checkpoint,
        context_snapshot,
        ..
    }) = created
    else {
        return Err(StoreError::Invalid {
            field: "id",
            reason: format!(
                "the first record of {:?} is `{}`, not its creation",
                original.spec.id,
                created.event_type()
            ),
        });
    };
    let spec = TaskSpec {
        id: new_id,
        ..TaskSpec::clone(&original.spec)
    };
    Ok(CreateRequest {
        spec,
        policy: Some(policy),
        checkpoint,
        context_snapshot,
        publication: Publication::OnCreate,
        parent: None,
        root_session_id: original.root_session_id.clone(),
        max_recoveries: original.max_recoveries,
        not_before: None,
    })
}

/// The root session a nested task inherits from its parent: the parent's root session, or
/// the session of a root parent.
pub(crate) fn inherited_root(parent: &TaskState) -> String {
    if parent.root_session_id.is_empty() {
        parent.spec.session_id.clone()
    } else {
        parent.root_session_id.clone()
    }
}

/// Checks the authority a child is created under against its parent (the reference's
/// nested-task authority): the parent's mailbox is not sealed, the generation is current,
/// and the attempt is the parent's active, uncanceled one. Returns the parent's record of
/// the child.
pub(crate) fn child_authority(
    parent: &Task,
    context: &ExecutionContext,
    child: &str,
    now: Timestamp,
) -> Result<Event> {
    let state = &parent.state;
    if state.mailbox_sealed() {
        return Err(StoreError::MailboxSealed(state.spec.id.clone()));
    }
    if context.generation != state.mailbox.generation {
        return Err(StoreError::OwnershipLost {
            expected: context.generation,
            actual: state.mailbox.generation,
        });
    }
    fence(state, Some(context.attempt), now, false)?;
    if parent.layer().children.contains(child) {
        return Err(StoreError::AlreadyExists(child.to_owned()));
    }
    Ok(Event::ChildCreated {
        child_id: child.to_owned(),
        attempt: context.attempt,
        generation: context.generation,
        at: now,
    })
}

/// The lease-expiry event due at `now`, if the running attempt's lease had run out by
/// `expired_by` (`now` less the store's expiry grace: `StoreConfig::expiry_grace`) — and,
/// for a recovery under the store's `recovery_backoff`, the recovered task's not-before time.
pub(crate) fn expiry(
    state: &TaskState,
    expired_by: Timestamp,
    now: Timestamp,
    config: &StoreConfig,
) -> Option<Vec<Event>> {
    if !state.lease_expired_at(expired_by) {
        return None;
    }
    let deadline = state.lease_deadline?;
    let resolution = state.expiry_resolution();
    let mut events = vec![Event::LeaseExpired {
        resolution,
        deadline,
        at: now,
    }];
    if resolution == ExpiryResolution::Retry {
        if let Some(wait) = config.recovery_wait(state.recoveries).filter(|w| *w > 0) {
            events.push(Event::NotBefore {
                until: now.plus_millis(wait),
                at: now,
            });
        }
    }
    if resolution.is_terminal() {
        let kind = if resolution == ExpiryResolution::Failed {
            "failed"
        } else {
            "canceled"
        };
        events.extend(lifecycle_notification(
            &Route::of(state),
            kind,
            state.version + 1,
            now,
        ));
    }
    Some(events)
}

/// Where a task's lifecycle notifications go: a root task's to its session's outbox, a
/// nested task's into its parent's mailbox (see [`parent_notice`]); none while the task is
/// deferred.
pub(crate) struct Route<'a> {
    spec: &'a TaskSpec,
    publication: Publication,
    nested: bool,
}

impl<'a> Route<'a> {
    pub(crate) fn of(state: &'a TaskState) -> Self {
        Self {
            spec: &state.spec,
            publication: state.publication,
            nested: state.is_nested(),
        }
    }

    /// Whether a notification of `kind` is wanted at all (by either route).
    fn wants(&self, kind: &str) -> bool {
        self.publication != Publication::Deferred
            && (kind == "task_created" || kind == "task_backgrounded" || self.spec.notify_session)
    }
}

/// The id of the lifecycle notification of `kind` that task `id` sent at `version`.
fn lifecycle_notification_id(id: &str, version: u64, kind: &str) -> String {
    format!("{id}:{version}:{kind}")
}

/// The outbox record of a lifecycle notification, when the task routes them to a session.
fn lifecycle_notification(
    route: &Route<'_>,
    kind: &str,
    version: u64,
    at: Timestamp,
) -> Option<Event> {
    let spec = route.spec;
    let routed = !route.nested && !spec.session_id.is_empty();
    (routed && route.wants(kind)).then(|| Event::NotificationEnqueued {
        id: lifecycle_notification_id(&spec.id, version, kind),
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
    write_all(state, vec![event], notify, now)
}

/// [`write`] for several events, the last of them the lifecycle transition.
fn write_all(
    state: &TaskState,
    mut events: Vec<Event>,
    notify: Option<&str>,
    now: Timestamp,
) -> Decision {
    if let Some(kind) = notify {
        events.extend(lifecycle_notification(
            &Route::of(state),
            kind,
            state.version + 1,
            now,
        ));
    }
    Decision::Write(events)
}

/// A notification of a nested task on its way into the parent's mailbox: a lifecycle one,
/// or an application one of its running attempt ([`Event::ParentNotified`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParentNotice {
    /// The parent.
    pub parent: String,
    /// The notification id (the input's event id).
    pub id: String,
    /// The notification kind (the input's kind).
    pub kind: String,
    /// The input's data: the child's id for a lifecycle notification, the application's
    /// data for an application one.
    pub data: Vec<u8>,
    /// Whether the notice must reach the parent for the child's events to be written: an
    /// application notification is refused when the parent cannot take it, where a
    /// lifecycle one records why ([`Event::ParentNotificationFailed`]) and its transition
    /// goes ahead.
    pub required: bool,
    /// The input's delivery: the application notification's, queued for a lifecycle one.
    pub delivery: Delivery,
}

/// The notification that `events`, applied to the nested task `state`, send to its
/// parent's mailbox, if any: an application notification ([`Event::ParentNotified`]), or a
/// lifecycle one of the same kinds, conditions and ids as a root task's session
/// notifications (`task_created` when created on create, `task_backgrounded` when
/// published, `waiting_input` and the terminal kinds when the spec asks for them; none
/// while the task is deferred).
pub(crate) fn parent_notice(state: Option<&TaskState>, events: &[Event]) -> Option<ParentNotice> {
    let mut version = state.map_or(0, |s| s.version);
    let mut publication = state.map(|s| s.publication);
    let mut found = None;
    for event in events {
        if event.is_lifecycle() {
            version += 1;
        }
        if let Event::ParentNotified {
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
        } = event
        {
            let s = state.filter(|s| s.is_nested())?;
            return Some(ParentNotice {
                parent: s.parent_task_id.clone(),
                id: application_notification_id(s.id(), event_id),
                kind: kind.clone(),
                data: data.clone(),
                required: true,
                delivery: event.delivery().unwrap_or_default(),
            });
        }
        let kind = match event {
            Event::CreatedV2 {
                publication: p,
                parent_task_id,
                spec,
                ..
            } => {
                publication = Some(*p);
                if parent_task_id.is_empty() {
                    return None;
                }
                found = Some((parent_task_id.clone(), spec.id.clone(), spec.notify_session));
                "task_created"
            }
            Event::Published { .. } => {
                publication = Some(Publication::OnBackground);
                "task_backgrounded"
            }
            Event::WaitingInput { .. } => "waiting_input",
            Event::Completed { .. } => "completed",
            Event::Failed { .. } => "failed",
            Event::Canceled { .. } | Event::CancelRequested { direct: true, .. } => "canceled",
            Event::LeaseExpired { resolution, .. } => match resolution {
                ExpiryResolution::Retry => continue,
                ExpiryResolution::Failed => "failed",
                ExpiryResolution::Canceled => "canceled",
            },
            _ => continue,
        };
        let (parent, child, notify) = match (&found, state) {
            (Some(found), _) => found.clone(),
            (None, Some(s)) if s.is_nested() => (
                s.parent_task_id.clone(),
                s.spec.id.clone(),
                s.spec.notify_session,
            ),
            _ => return None,
        };
        let lifecycle_kind = matches!(kind, "task_created" | "task_backgrounded");
        let publication = publication.unwrap_or_default();
        if publication == Publication::Deferred
            || (kind == "task_created" && publication != Publication::OnCreate)
            || !(lifecycle_kind || notify)
        {
            continue;
        }
        return Some(ParentNotice {
            id: lifecycle_notification_id(&child, version, kind),
            parent,
            kind: kind.to_owned(),
            data: child.into_bytes(),
            // A publish is its notice: one its parent cannot take fails the whole publish
            // (the task stays deferred). A transition's notice that cannot be delivered is
            // recorded beside it, the transition made.
            required: kind == "task_backgrounded",
            delivery: Delivery::Queued,
        });
    }
    None
}

/// The events that put `notice` into the parent's mailbox: an input (and the wake of a
/// parent waiting for input) — or, when the parent's mailbox holds an input of the notice's
/// id already, that input's place, for the caller to check that it is the same (a replay)
/// and not another input under the id (a conflict).
///
/// # Errors
/// [`StoreError::MailboxSealed`] when the parent has ended.
pub(crate) fn deliver(
    parent: &Task,
    notice: &ParentNotice,
    now: Timestamp,
) -> Result<Keyed<InputRequest, Vec<Event>>> {
    let request = InputRequest {
        event_id: notice.id.clone(),
        kind: notice.kind.clone(),
        data: notice.data.clone(),
        delivery: notice.delivery,
    };
    input(parent, request, now)
}

/// Validates an input's own fields (before any lookup).
pub(crate) fn validate_input(id: &str, request: &InputRequest, config: &StoreConfig) -> Result<()> {
    validate_task_id(id, config)?;
    check_non_empty("event id", request.event_id.is_empty())?;
    check_len("event id", request.event_id.len(), config.max_id_bytes)?;
    check_non_empty("kind", request.kind.is_empty())?;
    check_len("kind", request.kind.len(), MAX_INPUT_KIND_BYTES)?;
    check_len("data", request.data.len(), config.max_value_bytes)
}

/// The longest input kind.
pub const MAX_INPUT_KIND_BYTES: usize = 128;

/// Decides an input to the task's mailbox: replay detection first (an event id seen before
/// is a [`Keyed::Repeat`], even once the mailbox is sealed), then the seal; a new input gets
/// the next sequence and wakes a task waiting for input (T17'). A suspended task stays
/// suspended (the newest reference): only a release wakes it.
pub(crate) fn input(
    task: &Task,
    request: InputRequest,
    now: Timestamp,
) -> Result<Keyed<InputRequest, Vec<Event>>> {
    if let Some(&position) = task.layer().input_ids.get(&request.event_id) {
        return Ok(Keyed::Repeat { position, request });
    }
    let state = &task.state;
    if state.mailbox_sealed() {
        return Err(StoreError::MailboxSealed(state.spec.id.clone()));
    }
    let sequence = state.mailbox.latest + 1;
    let InputRequest {
        event_id,
        kind,
        data,
        delivery,
    } = request;
    let mut events = vec![Event::InputSent {
        sequence,
        event_id,
        kind,
        data,
        delivery,
        at: now,
    }];
    if state.status == Status::WaitingInput {
        events.push(Event::InputWoke { sequence, at: now });
    }
    Ok(Keyed::New(events))
}

/// Decides a move of the consumed cursor: the generation, the cursor CAS, the range, then
/// the active attempt; a move to where it is writes nothing.
pub(crate) fn advance_cursor(
    state: &TaskState,
    request: &AdvanceCursor,
    now: Timestamp,
) -> Result<Decision> {
    if request.expected_generation != state.mailbox.generation {
        return Err(StoreError::OwnershipLost {
            expected: request.expected_generation,
            actual: state.mailbox.generation,
        });
    }
    if state.mailbox_sealed() {
        return Err(StoreError::MailboxSealed(state.spec.id.clone()));
    }
    check_cursor(state, request.expected_cursor, request.cursor)?;
    fence(state, Some(request.attempt), now, false)?;
    if request.cursor == state.mailbox.consumed {
        return Ok(Decision::Unchanged);
    }
    Ok(Decision::Write(vec![Event::CursorAdvanced {
        cursor: request.cursor,
        attempt: request.attempt,
        at: now,
    }]))
}

/// The consumed cursor is `expected`, and `cursor` lies between it and the newest input.
fn check_cursor(state: &TaskState, expected: u64, cursor: u64) -> Result<()> {
    let mailbox = state.mailbox;
    if mailbox.consumed != expected {
        return Err(StoreError::CursorConflict {
            expected,
            actual: mailbox.consumed,
        });
    }
    if cursor < expected || cursor > mailbox.latest {
        return Err(StoreError::InvalidCursor(format!(
            "cursor {cursor} outside [{expected}, {}]",
            mailbox.latest
        )));
    }
    Ok(())
}

/// Decides `Publish`: the CAS; an on-background task is returned unchanged; an on-create
/// one cannot be published; a deferred one that has ended stays deferred.
pub(crate) fn publish(
    state: &TaskState,
    expected_version: u64,
    now: Timestamp,
) -> Result<Decision> {
    cas(state, expected_version)?;
    match state.publication {
        Publication::OnBackground => Ok(Decision::Unchanged),
        Publication::OnCreate => Err(StoreError::IllegalTransition {
            status: state.status,
            operation: "publish",
        }),
        Publication::Deferred if state.is_terminal() => {
            Err(StoreError::AlreadyTerminal(state.spec.id.clone()))
        }
        Publication::Deferred => {
            let mut events = vec![Event::Published { at: now }];
            let route = Route {
                spec: &state.spec,
                publication: Publication::OnBackground,
                nested: state.is_nested(),
            };
            events.extend(lifecycle_notification(
                &route,
                "task_backgrounded",
                state.version,
                now,
            ));
            Ok(Decision::Write(events))
        }
    }
}

/// Decides `command` against `state` (whose expired lease, if any, was already resolved).
pub(crate) fn decide(
    state: &TaskState,
    expected_version: u64,
    command: Command,
    now: Timestamp,
    config: &StoreConfig,
) -> Result<Decision> {
    let lease = now.plus_millis(config.lease_millis());
    if let Command::RequestCancel { reason } = command {
        return request_cancel(state, expected_version, reason, now, lease);
    }
    cas(state, expected_version)?;
    let operation = command.name();
    let require = |status: Status| {
        if state.status == status {
            Ok(())
        } else {
            Err(StoreError::IllegalTransition {
                status: state.status,
                operation,
            })
        }
    };
    let event = match command {
        Command::Start => {
            require(Status::Pending)?;
            if let Some(until) = state.delayed_past(now) {
                return Err(StoreError::NotDue {
                    task: state.spec.id.clone(),
                    until,
                });
            }
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
                data,
                context_snapshot,
                at: now,
            }
        }
        Command::ReleaseSuspension { context_snapshot } => {
            require(Status::Suspended)?;
            Event::Released {
                context_snapshot,
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
    reason: String,
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
        reason,
        lease_deadline: running.then_some(lease),
        direct,
        at: now,
    };
    Ok(write(state, event, direct.then_some("canceled"), now))
}

/// Commands of the active attempt (the CAS already passed): the lease must be live and,
/// except for transcript failures and cancel acknowledgements, no cancel intent may exist.
#[allow(clippy::too_many_lines, reason = "one arm per command reads best")]
fn decide_active(
    state: &TaskState,
    command: Command,
    now: Timestamp,
    lease: Timestamp,
) -> Result<Decision> {
    let allow_cancel = matches!(
        command,
        Command::ReportTranscriptFailure { .. } | Command::AckCancel { .. }
    );
    fence(state, None, now, allow_cancel)?;
    let operation = command.name();
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
                    operation,
                });
            }
            (Event::StartCommitted { checkpoint, at }, None)
        }
        Command::ReportTranscriptFailure { error } => {
            if !state.output_file_error.is_empty() {
                return Ok(Decision::Unchanged);
            }
            (Event::TranscriptFailed { error, at }, None)
        }
        Command::AckCancel { reason } => (Event::Canceled { reason, at }, Some("canceled")),
        Command::Complete { data } => (Event::Completed { data, at }, Some("completed")),
        Command::Fail { error } => (Event::Failed { error, at }, Some("failed")),
        Command::WaitInput { checkpoint } => (
            Event::WaitingInput { checkpoint, at },
            Some("waiting_input"),
        ),
        Command::Suspend { checkpoint } => (Event::Suspended { checkpoint, at }, None),
        Command::Yield { checkpoint } => (Event::Yielded { checkpoint, at }, None),
        Command::YieldUntil { checkpoint, until } => {
            let yielded = Event::Yielded { checkpoint, at };
            if until <= now {
                (yielded, None)
            } else {
                return Ok(write_all(
                    state,
                    vec![yielded, Event::NotBefore { until, at }],
                    None,
                    now,
                ));
            }
        }
        Command::CommitInput {
            expected_cursor,
            cursor,
            checkpoint,
        } => {
            check_cursor(state, expected_cursor, cursor)?;
            (
                Event::InputCommitted {
                    cursor,
                    checkpoint,
                    at,
                },
                None,
            )
        }
        Command::CompleteIfNoInputs { cursor, data } => {
            return if_no_inputs(state, cursor, true, Vec::new(), now, |_| {
                (Event::Completed { data, at }, Some("completed"))
            })
        }
        Command::WaitInputIfNoInputs { cursor, checkpoint } => {
            return if_no_inputs(state, cursor, false, checkpoint, now, |checkpoint| {
                (
                    Event::WaitingInput { checkpoint, at },
                    Some("waiting_input"),
                )
            })
        }
        Command::SuspendIfNoInputs { cursor, checkpoint } => {
            return if_no_inputs(state, cursor, true, checkpoint, now, |checkpoint| {
                (Event::Suspended { checkpoint, at }, None)
            })
        }
        Command::Start
        | Command::Resume { .. }
        | Command::ReleaseSuspension { .. }
        | Command::RequestCancel { .. } => {
            return Err(StoreError::IllegalTransition {
                status: state.status,
                operation,
            })
        }
    };
    Ok(write(state, event, notify, now))
}

/// The `*IfNoInputs` transitions of the active attempt: the cursor must equal the consumed one
/// (`exact`) or lie between it and the newest input; with input newer than `cursor` the
/// task goes back to pending with the cursor consumed (and `checkpoint`, when non-empty),
/// else the cursor is consumed and `transition` is written (handed `checkpoint`: one of
/// the two ways takes it, so it is never copied).
fn if_no_inputs(
    state: &TaskState,
    cursor: u64,
    exact: bool,
    checkpoint: Vec<u8>,
    now: Timestamp,
    transition: impl FnOnce(Vec<u8>) -> (Event, Option<&'static str>),
) -> Result<Decision> {
    let mailbox = state.mailbox;
    if (exact && cursor != mailbox.consumed) || cursor < mailbox.consumed {
        return Err(StoreError::CursorConflict {
            expected: cursor,
            actual: mailbox.consumed,
        });
    }
    if cursor > mailbox.latest {
        return Err(StoreError::InvalidCursor(format!(
            "cursor {cursor} is past the newest input {}",
            mailbox.latest
        )));
    }
    if mailbox.latest > cursor {
        return Ok(Decision::Write(vec![Event::InputsPending {
            cursor,
            checkpoint,
            at: now,
        }]));
    }
    let mut events = Vec::with_capacity(3);
    if cursor > mailbox.consumed {
        events.push(Event::CursorAdvanced {
            cursor,
            attempt: state.attempt,
            at: now,
        });
    }
    let (event, notify) = transition(checkpoint);
    events.push(event);
    Ok(write_all(state, events, notify, now))
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
    if request.part_id.is_empty() && request.data.is_empty() {
        // A part may be metadata only; a single-record update carries data.
        return Err(StoreError::invalid("data", "must not be empty"));
    }
    check_len("part id", request.part_id.len(), config.max_id_bytes)?;
    if request.data.len() > config.max_value_bytes {
        return Err(StoreError::invalid(
            "data",
            format!("{} bytes exceeds the limit", request.data.len()),
        ));
    }
    Ok(())
}

/// Decides a progress update of the running attempt: the fence first, then replay detection
/// (an event id seen before, in any attempt, is a [`Keyed::Repeat`]), then the limit of
/// updates a task may record (`max_updates`).
pub(crate) fn update(
    task: &Task,
    request: UpdateRequest,
    now: Timestamp,
    max_updates: Option<u64>,
) -> Result<Keyed<UpdateRequest>> {
    fence(&task.state, Some(request.attempt), now, false)?;
    if !request.part_id.is_empty() {
        return part(task, request, now, max_updates);
    }
    if let Some(&position) = task.update_ids.get(&request.event_id) {
        return Ok(Keyed::Repeat { position, request });
    }
    if task.layer().part_events.contains_key(&request.event_id) {
        return Err(StoreError::EventIdConflict(request.event_id));
    }
    within_update_limit(task, max_updates)?;
    let UpdateRequest {
        attempt,
        event_id,
        kind,
        data,
        metadata,
        ..
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

/// Refuses a new update of a task that has recorded `max_updates` updates.
fn within_update_limit(task: &Task, max_updates: Option<u64>) -> Result<()> {
    match max_updates {
        Some(limit) if task.state.updates >= limit => Err(StoreError::UpdateLimit {
            task: task.state.spec.id.clone(),
            limit,
        }),
        _ => Ok(()),
    }
}

/// A part of a multi-part progress event (the fence already passed): a known (event, part)
/// is a repeat; a new part of an event whose final part is recorded (or of a single-record
/// update's event id) is refused, as is a new part past the limit of updates.
fn part(
    task: &Task,
    request: UpdateRequest,
    now: Timestamp,
    max_updates: Option<u64>,
) -> Result<Keyed<UpdateRequest>> {
    if let Some(&position) = task
        .layer()
        .parts
        .get(&part_key(&request.event_id, &request.part_id))
    {
        return Ok(Keyed::Repeat { position, request });
    }
    if task.layer().closed_events.contains_key(&request.event_id)
        || task.update_ids.contains_key(&request.event_id)
    {
        return Err(StoreError::EventClosed(request.event_id));
    }
    within_update_limit(task, max_updates)?;
    let UpdateRequest {
        attempt,
        event_id,
        kind,
        data,
        metadata,
        part_id,
        last,
    } = request;
    Ok(Keyed::New(Event::PartAppended {
        attempt,
        event_id,
        part_id,
        last,
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

/// Decides an application notification of the running `attempt`: the fence, the route (a
/// nested task's parent mailbox, else the session), then replay detection by event id.
pub(crate) fn notification(
    task: &Task,
    attempt: u64,
    request: NotificationRequest,
    now: Timestamp,
) -> Result<Keyed<NotificationRequest>> {
    let state = &task.state;
    fence(state, Some(attempt), now, false)?;
    if state.is_nested() {
        if state.publication == Publication::Deferred {
            return Err(StoreError::NotificationUnavailable(
                "the nested task is deferred: its parent does not see it yet",
            ));
        }
    } else if state.spec.session_id.is_empty() {
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
        delivery,
    } = request;
    // A queued notification keeps the record of schema v6 and older, byte for byte; one sent
    // to preempt is the v2 form, which records its delivery.
    let preempt = delivery == Delivery::Preempt;
    if state.is_nested() {
        // Into the parent's mailbox, in the same append as this record ([`parent_notice`]).
        return Ok(Keyed::New(if preempt {
            Event::ParentNotifiedV2 {
                attempt,
                event_id,
                kind,
                data,
                delivery,
                at: now,
            }
        } else {
            Event::ParentNotified {
                attempt,
                event_id,
                kind,
                data,
                at: now,
            }
        }));
    }
    let id = application_notification_id(task.state.id(), &event_id);
    let version = task.state.version;
    Ok(Keyed::New(if preempt {
        Event::NotificationEnqueuedV2 {
            id,
            event_id,
            kind,
            data,
            delivery,
            version,
            at: now,
        }
    } else {
        Event::NotificationEnqueued {
            id,
            event_id,
            kind,
            data,
            version,
            at: now,
        }
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

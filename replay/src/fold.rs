//! The fold: the only place where task state changes.
//!
//! [`Task::apply`] is a pure function of the current state and one event: no clock, no I/O, no
//! randomness. The live engine applies the events it just made durable; recovery and the audit
//! apply the events they read. Because both use this one function, a recovered task equals the
//! live one by construction. `apply` also checks that the event is legal where it stands, so
//! the audit can name the first record that could not have been written by a correct engine.

use crate::ids::IdIndex;
use crate::state::{Fenced, Mailbox, Status, TaskState, DEFAULT_CANCEL_REASON};
use dtask_journal::{Event, EventType, ExpiryResolution, Publication};
use std::collections::BTreeSet;
use std::fmt;

/// Why an event cannot follow the state it was applied to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FoldError {
    /// The first record of a stream is not `Created`.
    #[error("the stream does not start with `created` (found `{0}`)")]
    NotCreatedFirst(EventType),
    /// A second `Created`.
    #[error("`created` after the start of the stream")]
    CreatedTwice,
    /// The spec's id differs from the stream's task.
    #[error("the spec names task {found:?}, the stream is {expected:?}")]
    WrongTask {
        /// The stream's task.
        expected: String,
        /// The id in the spec.
        found: String,
    },
    /// A lifecycle event not allowed in the task's status.
    #[error("`{event}` is not allowed in status {status}")]
    IllegalTransition {
        /// The status found.
        status: Status,
        /// The event.
        event: EventType,
    },
    /// A record after the terminal event that may not follow it.
    #[error("`{0}` after the task was terminal")]
    AfterTerminal(EventType),
    /// An attempt number that is not the previous one plus one.
    #[error("attempt {found} started, expected {expected}")]
    AttemptNotNext {
        /// The attempt expected.
        expected: u64,
        /// The attempt recorded.
        found: u64,
    },
    /// An update of another attempt than the running one.
    #[error("update of attempt {found} while attempt {current} runs")]
    StaleAttempt {
        /// The running attempt.
        current: u64,
        /// The attempt recorded.
        found: u64,
    },
    /// An update or notification event id recorded twice.
    #[error("event id {0:?} recorded twice")]
    DuplicateEventId(String),
    /// A second started marker while a checkpoint exists.
    #[error("started marker committed while a checkpoint exists")]
    CheckpointExists,
    /// An empty checkpoint where one is required.
    #[error("`{0}` with an empty checkpoint")]
    EmptyCheckpoint(EventType),
    /// A second cancel request, or one recorded against the wrong status.
    #[error("cancel request inconsistent with the task: {0}")]
    CancelMismatch(&'static str),
    /// A lease expiry whose resolution does not follow from policy and cancel intent.
    #[error("lease expiry resolved as {found:?}, policy and intent require {expected:?}")]
    ResolutionMismatch {
        /// What policy and intent require.
        expected: ExpiryResolution,
        /// What was recorded.
        found: ExpiryResolution,
    },
    /// A second transcript failure was recorded.
    #[error("second transcript failure recorded")]
    TranscriptTwice,
    /// A failure without an error text.
    #[error("`failed` without an error")]
    EmptyError,
    /// An acknowledgement of a notification that is not queued.
    #[error("ack of notification {0:?} that is not queued")]
    UnknownNotification(String),
    /// An input sent to a sealed mailbox (the task had ended).
    #[error("input {0:?} sent after the mailbox was sealed")]
    MailboxSealed(String),
    /// An input whose sequence is not the mailbox's next one.
    #[error("input sequence {found}, expected {expected}")]
    SequenceNotNext {
        /// The next sequence.
        expected: u64,
        /// The sequence recorded.
        found: u64,
    },
    /// The consumed cursor moved backwards, or past the newest input.
    #[error("consumed cursor moved from {consumed} to {found} (newest input {latest})")]
    CursorOutOfRange {
        /// The consumed cursor before.
        consumed: u64,
        /// The cursor recorded.
        found: u64,
        /// The newest input's sequence.
        latest: u64,
    },
    /// A child task created under an authority that was not current: not the running
    /// attempt, or another mailbox generation.
    #[error("child {child:?} created under a stale authority: {why}")]
    StaleAuthority {
        /// The child.
        child: String,
        /// What was stale.
        why: String,
    },
    /// A child recorded twice.
    #[error("child {0:?} recorded twice")]
    DuplicateChild(String),
    /// A part of a progress event whose final part was recorded before.
    #[error("part of event {0:?} after its final part")]
    EventClosed(String),
    /// A publication change that does not follow from the task's publication.
    #[error("`published` while the publication is {0}")]
    NotDeferred(&'static str),
    /// A `rerun_of` or `rerun_as` record where no rerun puts one.
    #[error("rerun lineage inconsistent with the task: {0}")]
    Lineage(&'static str),
    /// A `recovery_limit` after the task's first attempt, or a second one.
    #[error("recovery limit recorded {0}")]
    RecoveryLimit(&'static str),
    /// A `hold` while one stands, or a `hold_lifted` where none does.
    #[error("hold inconsistent with the task: {0}")]
    Hold(&'static str),
    /// The stream is the tombstone of a purged task ([`Event::Purged`]): the task's
    /// records were deleted, and there is no state to fold. Not damage: what a read of a
    /// purged task finds.
    #[error("the task was purged at {at} ms ({records} records deleted)")]
    Purged {
        /// How many records were deleted.
        records: u64,
        /// When, in milliseconds since the UNIX epoch.
        at: u64,
    },
    /// An attempt started before the task's `not_before`.
    #[error("attempt started at {at} ms, before the task's not-before time {until} ms")]
    NotDue {
        /// The not-before time.
        until: u64,
        /// When the attempt started.
        at: u64,
    },
}

/// The key of a progress-event part in [`TaskLayer::parts`]: unambiguous for any two strings.
#[must_use]
pub fn part_key(event_id: &str, part_id: &str) -> String {
    format!("{}:{event_id}{part_id}", event_id.len())
}

/// A task as folded from its stream: the snapshot plus the indexes the store needs to fence
/// and deduplicate (also derived only from events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// The snapshot.
    pub state: TaskState,
    /// Update event id → position of its `UpdateAppended` record.
    pub update_ids: IdIndex,
    /// Application notification event id → position of its `NotificationEnqueued` record
    /// (a root task's) or its `ParentNotified` record (a nested task's), or of their v2
    /// forms.
    pub notification_ids: IdIndex,
    /// Queued, unacknowledged notification ids → position of the enqueue record.
    pub outbox: IdIndex,
    /// The indexes of the task layer (inputs, parts, children), allocated when the task
    /// first uses one: most tasks never do, and the empty indexes took ~270 bytes of every
    /// live task.
    layer: Option<Box<TaskLayer>>,
}

/// The indexes of a task's mailbox inputs, multi-part progress events and children (see
/// [`Task::layer`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskLayer {
    /// Mailbox input event id → position of its `InputSent` record.
    pub input_ids: IdIndex,
    /// The position of each input's record, by sequence (index 0 is sequence 1).
    pub input_positions: Vec<u64>,
    /// Progress-event parts ([`part_key`]) → position of their `PartAppended` record.
    pub parts: IdIndex,
    /// Event ids of multi-part progress events → position of their first part.
    pub part_events: IdIndex,
    /// Event ids whose final part is recorded → its position.
    pub closed_events: IdIndex,
    /// The ids of the task's children, in id order.
    pub children: BTreeSet<String>,
}

impl TaskLayer {
    /// No inputs, parts or children.
    pub const EMPTY: Self = Self {
        input_ids: IdIndex::new(),
        input_positions: Vec::new(),
        parts: IdIndex::new(),
        part_events: IdIndex::new(),
        closed_events: IdIndex::new(),
        children: BTreeSet::new(),
    };
}

/// What [`Task::layer`] lends a task that has no layer yet.
static NO_LAYER: TaskLayer = TaskLayer::EMPTY;

/// A task's layer, allocated on first use.
fn grow(layer: &mut Option<Box<TaskLayer>>) -> &mut TaskLayer {
    layer.get_or_insert_with(Box::default)
}

impl Task {
    /// The task layer's indexes: inputs, parts, children (empty for a task that has none).
    #[must_use]
    pub fn layer(&self) -> &TaskLayer {
        self.layer.as_deref().unwrap_or(&NO_LAYER)
    }

    /// Starts a fold of task `id`'s stream from its first record, which must be `Created`
    /// and name `id`. The task shares the event's spec (an `Arc`); its checkpoint and
    /// context are copied.
    ///
    /// # Errors
    /// [`FoldError::NotCreatedFirst`] for another event, [`FoldError::Purged`] for the
    /// tombstone of a purged stream, [`FoldError::WrongTask`] when the spec names another
    /// task.
    pub fn created(id: &str, event: &Event) -> Result<Self, FoldError> {
        match event {
            Event::Created { .. } | Event::CreatedV2 { .. } => {
                Self::from_created(id, event.clone())
            }
            Event::Purged { records, at, .. } => Err(FoldError::Purged {
                records: *records,
                at: at.as_millis(),
            }),
            _ => Err(FoldError::NotCreatedFirst(event.event_type())),
        }
    }

    /// [`Task::created`] taking the event: its spec, checkpoint and context move into the
    /// task instead of being shared or copied (recovery decodes each record for the fold
    /// alone).
    ///
    /// # Errors
    /// As [`Task::created`].
    pub fn from_created(id: &str, event: Event) -> Result<Self, FoldError> {
        let (spec, policy, checkpoint, context_snapshot, publication, parent, root, at) =
            match event {
                Event::Created {
                    spec,
                    policy,
                    checkpoint,
                    context_snapshot,
                    at,
                } => (
                    spec,
                    policy,
                    checkpoint,
                    context_snapshot,
                    Publication::OnCreate,
                    String::new(),
                    String::new(),
                    at,
                ),
                Event::CreatedV2 {
                    spec,
                    policy,
                    checkpoint,
                    context_snapshot,
                    publication,
                    parent_task_id,
                    root_session_id,
                    at,
                } => (
                    spec,
                    policy,
                    checkpoint,
                    context_snapshot,
                    publication,
                    parent_task_id,
                    root_session_id,
                    at,
                ),
                Event::Purged { records, at, .. } => {
                    return Err(FoldError::Purged {
                        records,
                        at: at.as_millis(),
                    })
                }
                other => return Err(FoldError::NotCreatedFirst(other.event_type())),
            };
        if spec.id != id {
            return Err(FoldError::WrongTask {
                expected: id.to_owned(),
                found: spec.id.clone(),
            });
        }
        Ok(Self {
            state: TaskState {
                // Shared with the event: a fold of a stream the caller holds copies no spec.
                spec,
                policy,
                status: Status::Pending,
                checkpoint,
                result_data: Vec::new(),
                result_error: String::new(),
                output_file_error: String::new(),
                pending_resume: None,
                context_snapshot,
                version: 1,
                attempt: 0,
                cancel_requested_at: None,
                cancel_reason: String::new(),
                created_at: at,
                updated_at: at,
                done_at: None,
                lease_deadline: None,
                position: 1,
                updates: 0,
                trimmed: 0,
                publication,
                parent_task_id: parent,
                root_session_id: root,
                mailbox: Mailbox::new(),
                parent_notification_error: String::new(),
                lineage: None,
                max_recoveries: None,
                recoveries: 0,
                not_before: None,
                hold: None,
            },
            update_ids: IdIndex::new(),
            notification_ids: IdIndex::new(),
            outbox: IdIndex::new(),
            layer: None,
        })
    }

    /// Folds a whole stream of task `id`.
    ///
    /// # Errors
    /// The first [`FoldError`], with the position of the record that caused it.
    pub fn fold<'a>(
        id: &str,
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Result<Option<Self>, (u64, FoldError)> {
        let mut task: Option<Self> = None;
        for (position, event) in (0u64..).zip(events) {
            match task.as_mut() {
                None => task = Some(Self::created(id, event).map_err(|e| (position, e))?),
                Some(t) => t.apply(event).map_err(|e| (position, e))?,
            }
        }
        Ok(task)
    }

    /// Applies one event, checking that it may follow the current state. On error the task is
    /// unchanged.
    ///
    /// # Errors
    /// The [`FoldError`] naming what is wrong.
    pub fn apply(&mut self, event: &Event) -> Result<(), FoldError> {
        if let Some(update) = untrimmed(event) {
            // A trimmed update folds exactly as the update it stands for.
            self.check(&update)?;
            self.evolve(&update);
            return Ok(());
        }
        self.check(event)?;
        self.evolve(event);
        Ok(())
    }

    /// Checks that `event` may follow the current state.
    #[allow(clippy::too_many_lines, reason = "one arm per event type reads best")]
    fn check(&self, event: &Event) -> Result<(), FoldError> {
        let ty = event.event_type();
        let s = &self.state;
        if s.status.is_terminal() {
            return match event {
                Event::NotificationEnqueued { .. }
                | Event::NotificationEnqueuedV2 { .. }
                | Event::NotificationAcked { .. }
                | Event::ParentNotificationFailed { .. }
                | Event::RerunAs { .. }
                | Event::Hold { .. }
                | Event::HoldLifted { .. }
                | Event::ProgressTrimmed { .. } => self.check_any(event),
                Event::InputSent { event_id, .. } => {
                    Err(FoldError::MailboxSealed(event_id.clone()))
                }
                _ => Err(FoldError::AfterTerminal(ty)),
            };
        }
        self.check_any(event)
    }

    /// [`Task::check`] past the terminal gate.
    #[allow(clippy::too_many_lines, reason = "one arm per event type reads best")]
    fn check_any(&self, event: &Event) -> Result<(), FoldError> {
        let ty = event.event_type();
        let s = &self.state;
        let illegal = || FoldError::IllegalTransition {
            status: s.status,
            event: ty,
        };
        let need_running = || s.check_attempt(None).map_err(|_| illegal());
        let cursor_range = |found: u64, strictly_after: bool| {
            let m = s.mailbox;
            let backwards = if strictly_after {
                found <= m.consumed
            } else {
                found < m.consumed
            };
            if backwards || found > m.latest {
                return Err(FoldError::CursorOutOfRange {
                    consumed: m.consumed,
                    found,
                    latest: m.latest,
                });
            }
            Ok(())
        };
        let fenced = |attempt: u64| {
            s.check_attempt(Some(attempt))
                .map_err(|fenced| match fenced {
                    Fenced::StaleAttempt { current, found } => {
                        FoldError::StaleAttempt { current, found }
                    }
                    _ => illegal(),
                })
        };
        match event {
            Event::Created { .. } | Event::CreatedV2 { .. } => return Err(FoldError::CreatedTwice),
            Event::ChildCreated {
                child_id,
                attempt,
                generation,
                ..
            } => {
                if let Err(fenced) = s.check_attempt(Some(*attempt)) {
                    return Err(FoldError::StaleAuthority {
                        child: child_id.clone(),
                        why: fenced.as_str().to_owned(),
                    });
                }
                if *generation != s.mailbox.generation {
                    return Err(FoldError::StaleAuthority {
                        child: child_id.clone(),
                        why: format!(
                            "generation {generation}, the mailbox is at {}",
                            s.mailbox.generation
                        ),
                    });
                }
                if self.layer().children.contains(child_id) {
                    return Err(FoldError::DuplicateChild(child_id.clone()));
                }
            }
            Event::InputSent {
                sequence, event_id, ..
            } => {
                if *sequence != s.mailbox.latest + 1 {
                    return Err(FoldError::SequenceNotNext {
                        expected: s.mailbox.latest + 1,
                        found: *sequence,
                    });
                }
                if self.layer().input_ids.contains_key(event_id) {
                    return Err(FoldError::DuplicateEventId(event_id.clone()));
                }
            }
            Event::InputWoke { sequence, .. } => {
                if s.status != Status::WaitingInput || *sequence != s.mailbox.latest {
                    return Err(illegal());
                }
            }
            Event::CursorAdvanced {
                cursor, attempt, ..
            } => {
                fenced(*attempt)?;
                cursor_range(*cursor, false)?;
            }
            Event::InputCommitted {
                cursor, checkpoint, ..
            } => {
                need_running()?;
                cursor_range(*cursor, true)?;
                if checkpoint.is_empty() {
                    return Err(FoldError::EmptyCheckpoint(ty));
                }
            }
            Event::InputsPending { cursor, .. } => {
                need_running()?;
                cursor_range(*cursor, false)?;
                if *cursor >= s.mailbox.latest {
                    // The fallback is taken only when newer input exists.
                    return Err(illegal());
                }
            }
            Event::Published { .. } => {
                if s.publication != Publication::Deferred {
                    return Err(FoldError::NotDeferred(s.publication.as_str()));
                }
            }
            Event::PartAppended {
                attempt,
                event_id,
                part_id,
                ..
            } => {
                fenced(*attempt)?;
                if self
                    .layer()
                    .parts
                    .contains_key(&part_key(event_id, part_id))
                    || self.update_ids.contains_key(event_id)
                {
                    return Err(FoldError::DuplicateEventId(event_id.clone()));
                }
                if self.layer().closed_events.contains_key(event_id) {
                    return Err(FoldError::EventClosed(event_id.clone()));
                }
            }
            Event::ParentNotificationFailed { .. } => {
                if s.parent_task_id.is_empty() {
                    return Err(illegal());
                }
            }
            Event::RerunOf { task, .. } => {
                if s.position != 1 {
                    return Err(FoldError::Lineage(
                        "`rerun_of` only right after the creation",
                    ));
                }
                check_rerun_link(s, task)?;
            }
            Event::RerunAs { task, .. } => {
                if !s.status.is_terminal() {
                    return Err(FoldError::Lineage("`rerun_as` before the task ended"));
                }
                check_rerun_link(s, task)?;
                if s.rerun_as().contains(task) {
                    return Err(FoldError::Lineage("a rerun recorded twice"));
                }
            }
            Event::RecoveryLimit { .. } => {
                if s.max_recoveries.is_some() {
                    return Err(FoldError::RecoveryLimit("twice"));
                }
                if s.attempt != 0 {
                    return Err(FoldError::RecoveryLimit("after the first attempt"));
                }
            }
            Event::NotBefore { .. } => {
                if s.status != Status::Pending {
                    return Err(illegal());
                }
            }
            // A tombstone stands first in its stream, alone.
            Event::Purged { .. } => return Err(illegal()),
            Event::Hold { .. } => {
                if s.hold.is_some() {
                    return Err(FoldError::Hold("a second hold while one stands"));
                }
            }
            Event::HoldLifted { .. } => {
                if s.hold.is_none() {
                    return Err(FoldError::Hold("a hold lifted where none stands"));
                }
            }
            // `apply` folds a trimmed update as the update it stands for; a trim's marker
            // may follow any record.
            Event::UpdateTrimmed { .. } | Event::ProgressTrimmed { .. } => {}
            Event::AttemptStarted { attempt, at, .. } => {
                if s.status != Status::Pending {
                    return Err(illegal());
                }
                if let Some(until) = s.delayed_past(*at) {
                    return Err(FoldError::NotDue {
                        until: until.0,
                        at: at.0,
                    });
                }
                if *attempt != s.attempt + 1 {
                    return Err(FoldError::AttemptNotNext {
                        expected: s.attempt + 1,
                        found: *attempt,
                    });
                }
            }
            Event::Heartbeat { .. }
            | Event::Completed { .. }
            | Event::Canceled { .. }
            | Event::Yielded { .. } => need_running()?,
            Event::Failed { error, .. } => {
                need_running()?;
                if error.is_empty() {
                    return Err(FoldError::EmptyError);
                }
            }
            Event::StartCommitted { checkpoint, .. } => {
                need_running()?;
                if !s.checkpoint.is_empty() {
                    return Err(FoldError::CheckpointExists);
                }
                if checkpoint.is_empty() {
                    return Err(FoldError::EmptyCheckpoint(ty));
                }
            }
            Event::TranscriptFailed { .. } => {
                need_running()?;
                if !s.output_file_error.is_empty() {
                    return Err(FoldError::TranscriptTwice);
                }
            }
            Event::WaitingInput { checkpoint, .. } | Event::Suspended { checkpoint, .. } => {
                need_running()?;
                if checkpoint.is_empty() {
                    return Err(FoldError::EmptyCheckpoint(ty));
                }
            }
            Event::InputProvided { .. } => {
                if s.status != Status::WaitingInput {
                    return Err(illegal());
                }
            }
            Event::Released { .. } => {
                if s.status != Status::Suspended {
                    return Err(illegal());
                }
            }
            Event::CancelRequested {
                lease_deadline,
                direct,
                ..
            } => {
                if s.cancel_requested_at.is_some() {
                    return Err(FoldError::CancelMismatch("cancel requested twice"));
                }
                if *direct != s.cancel_is_direct() {
                    return Err(FoldError::CancelMismatch(
                        "direct cancellation does not match the status",
                    ));
                }
                if (s.status == Status::Running) != lease_deadline.is_some() {
                    return Err(FoldError::CancelMismatch(
                        "a lease extension belongs to a running task only",
                    ));
                }
            }
            Event::LeaseExpired { resolution, .. } => {
                need_running()?;
                let expected = s.expiry_resolution();
                if *resolution != expected {
                    return Err(FoldError::ResolutionMismatch {
                        expected,
                        found: *resolution,
                    });
                }
            }
            Event::UpdateAppended {
                attempt, event_id, ..
            } => {
                s.check_attempt(Some(*attempt))
                    .map_err(|fenced| match fenced {
                        Fenced::StaleAttempt { current, found } => {
                            FoldError::StaleAttempt { current, found }
                        }
                        _ => illegal(),
                    })?;
                if self.update_ids.contains_key(event_id)
                    || self.layer().part_events.contains_key(event_id)
                {
                    return Err(FoldError::DuplicateEventId(event_id.clone()));
                }
            }
            Event::NotificationEnqueued { id, event_id, .. }
            | Event::NotificationEnqueuedV2 { id, event_id, .. } => {
                if self.outbox.contains_key(id)
                    || (!event_id.is_empty() && self.notification_ids.contains_key(event_id))
                {
                    return Err(FoldError::DuplicateEventId(id.clone()));
                }
            }
            Event::NotificationAcked { id, .. } => {
                if !self.outbox.contains_key(id) {
                    return Err(FoldError::UnknownNotification(id.clone()));
                }
            }
            Event::ParentNotified {
                attempt, event_id, ..
            }
            | Event::ParentNotifiedV2 {
                attempt, event_id, ..
            } => {
                if !s.is_nested() {
                    return Err(illegal());
                }
                fenced(*attempt)?;
                if self.notification_ids.contains_key(event_id) {
                    return Err(FoldError::DuplicateEventId(event_id.clone()));
                }
            }
        }
        Ok(())
    }

    /// Applies a checked event.
    #[allow(clippy::too_many_lines, reason = "one arm per event type reads best")]
    fn evolve(&mut self, event: &Event) {
        let position = self.state.position;
        self.state.position += 1;
        if event.is_lifecycle() {
            self.state.version += 1;
            self.state.updated_at = event.at();
        }
        let s = &mut self.state;
        match event {
            // `check` refuses a tombstone after the first record; `apply` folds a trimmed
            // update as the update it stands for, and a trim's record only counts them.
            Event::Created { .. }
            | Event::CreatedV2 { .. }
            | Event::Purged { .. }
            | Event::UpdateTrimmed { .. } => {}
            Event::ProgressTrimmed { records, .. } => {
                s.trimmed = s.trimmed.saturating_add(*records).min(s.updates);
            }
            Event::ChildCreated { child_id, .. } => {
                grow(&mut self.layer).children.insert(child_id.clone());
            }
            Event::InputSent {
                sequence, event_id, ..
            } => {
                s.mailbox.latest = *sequence;
                let layer = grow(&mut self.layer);
                layer.input_ids.insert(event_id, position);
                layer.input_positions.push(position);
            }
            Event::InputWoke { .. } => s.status = Status::Pending,
            Event::CursorAdvanced { cursor, .. } => s.mailbox.consumed = *cursor,
            Event::InputCommitted {
                cursor, checkpoint, ..
            } => {
                s.mailbox.consumed = *cursor;
                s.checkpoint.clone_from(checkpoint);
            }
            Event::InputsPending {
                cursor, checkpoint, ..
            } => {
                s.mailbox.consumed = *cursor;
                s.status = Status::Pending;
                if !checkpoint.is_empty() {
                    s.checkpoint.clone_from(checkpoint);
                }
                s.lease_deadline = None;
            }
            Event::Published { .. } => s.publication = Publication::OnBackground,
            Event::PartAppended {
                event_id,
                part_id,
                last,
                ..
            } => {
                s.updates += 1;
                let layer = grow(&mut self.layer);
                layer.parts.insert(&part_key(event_id, part_id), position);
                if !layer.part_events.contains_key(event_id) {
                    layer.part_events.insert(event_id, position);
                }
                if *last {
                    layer.closed_events.insert(event_id, position);
                }
            }
            Event::ParentNotificationFailed { error, .. } => {
                if s.parent_notification_error.is_empty() {
                    s.parent_notification_error.clone_from(error);
                }
            }
            Event::RerunOf { task, .. } => {
                s.lineage
                    .get_or_insert_with(Box::default)
                    .rerun_of
                    .clone_from(task);
            }
            Event::RerunAs { task, .. } => {
                s.lineage
                    .get_or_insert_with(Box::default)
                    .rerun_as
                    .push(task.clone());
            }
            Event::RecoveryLimit { max_recoveries, .. } => {
                s.max_recoveries = Some(*max_recoveries);
            }
            Event::NotBefore { until, .. } => s.not_before = Some(*until),
            Event::Hold { reason, .. } => s.hold = Some(reason.as_str().into()),
            Event::HoldLifted { .. } => s.hold = None,
            Event::AttemptStarted {
                attempt,
                lease_deadline,
                ..
            } => {
                s.status = Status::Running;
                s.attempt = *attempt;
                s.lease_deadline = Some(*lease_deadline);
                s.not_before = None;
            }
            Event::Heartbeat { lease_deadline, .. } => s.lease_deadline = Some(*lease_deadline),
            Event::StartCommitted { checkpoint, .. } => s.checkpoint.clone_from(checkpoint),
            Event::TranscriptFailed { error, .. } => s.output_file_error.clone_from(error),
            Event::WaitingInput { checkpoint, .. } => {
                s.status = Status::WaitingInput;
                s.checkpoint.clone_from(checkpoint);
                s.pending_resume = None;
                s.lease_deadline = None;
            }
            Event::Suspended { checkpoint, .. } => {
                s.status = Status::Suspended;
                s.checkpoint.clone_from(checkpoint);
                s.pending_resume = None;
                s.lease_deadline = None;
            }
            Event::Yielded { checkpoint, .. } => {
                s.status = Status::Pending;
                if !checkpoint.is_empty() {
                    s.checkpoint.clone_from(checkpoint);
                }
                s.lease_deadline = None;
            }
            Event::InputProvided {
                data,
                context_snapshot,
                ..
            } => {
                s.status = Status::Pending;
                s.pending_resume = Some(data.clone());
                if let Some(snapshot) = context_snapshot {
                    s.context_snapshot.clone_from(snapshot);
                }
            }
            Event::Released {
                context_snapshot, ..
            } => {
                s.status = Status::Pending;
                if let Some(snapshot) = context_snapshot {
                    s.context_snapshot.clone_from(snapshot);
                }
            }
            Event::CancelRequested {
                reason,
                lease_deadline,
                direct,
                at,
            } => {
                s.cancel_requested_at = Some(*at);
                s.cancel_reason.clone_from(reason);
                if *direct {
                    let error = cancel_error(reason, "");
                    finish(s, Status::Canceled, error, *at);
                } else if let Some(deadline) = lease_deadline {
                    s.lease_deadline = Some(*deadline);
                }
            }
            Event::LeaseExpired { resolution, at, .. } => match resolution {
                ExpiryResolution::Retry => {
                    s.status = Status::Pending;
                    s.lease_deadline = None;
                    s.recoveries += 1;
                }
                ExpiryResolution::Failed => {
                    let error = s.lease_expired_error();
                    finish(s, Status::Failed, error, *at);
                }
                ExpiryResolution::Canceled => {
                    let error = cancel_error(&s.cancel_reason, "");
                    finish(s, Status::Canceled, error, *at);
                }
            },
            Event::Completed { data, at } => {
                finish(s, Status::Completed, String::new(), *at);
                s.result_data.clone_from(data);
            }
            Event::Failed { error, at } => finish(s, Status::Failed, error.clone(), *at),
            Event::Canceled { reason, at } => {
                let error = cancel_error(&s.cancel_reason, reason);
                finish(s, Status::Canceled, error, *at);
            }
            Event::UpdateAppended { event_id, .. } => {
                s.updates += 1;
                // `check` refused an id already recorded.
                self.update_ids.insert_new(event_id, position);
            }
            Event::NotificationEnqueued { id, event_id, .. }
            | Event::NotificationEnqueuedV2 { id, event_id, .. } => {
                if !event_id.is_empty() {
                    self.notification_ids.insert(event_id, position);
                }
                self.outbox.insert(id, position);
            }
            Event::NotificationAcked { id, .. } => {
                self.outbox.remove(id);
            }
            Event::ParentNotified { event_id, .. } | Event::ParentNotifiedV2 { event_id, .. } => {
                // `check` refused an id already recorded.
                self.notification_ids.insert_new(event_id, position);
            }
        }
    }
}

/// The result error of a cancellation: the durable cancel reason, else the acknowledged
/// reason, else the default.
#[must_use]
pub fn cancel_error(cancel_reason: &str, ack_reason: &str) -> String {
    [cancel_reason, ack_reason]
        .into_iter()
        .find(|r| !r.is_empty())
        .unwrap_or(DEFAULT_CANCEL_REASON)
        .to_owned()
}

/// The update a trimmed one stands for ([`Event::UpdateTrimmed`]), its bytes empty: what
/// it folds as. `None` for any other event.
fn untrimmed(event: &Event) -> Option<Event> {
    let Event::UpdateTrimmed {
        attempt,
        event_id,
        part_id,
        last,
        at,
        ..
    } = event
    else {
        return None;
    };
    Some(if part_id.is_empty() {
        Event::UpdateAppended {
            attempt: *attempt,
            event_id: event_id.clone(),
            kind: String::new(),
            data: Vec::new(),
            metadata: Vec::new(),
            at: *at,
        }
    } else {
        Event::PartAppended {
            attempt: *attempt,
            event_id: event_id.clone(),
            part_id: part_id.clone(),
            last: *last,
            kind: String::new(),
            data: Vec::new(),
            metadata: Vec::new(),
            at: *at,
        }
    })
}

/// What both ends of a rerun's link require: a root task (a nested task is rerun by its
/// parent, not as a task of its own) linked to another task.
fn check_rerun_link(s: &TaskState, other: &str) -> Result<(), FoldError> {
    if s.is_nested() {
        return Err(FoldError::Lineage("a nested task in a rerun"));
    }
    if other.is_empty() || other == s.id() {
        return Err(FoldError::Lineage("a rerun linked to no other task"));
    }
    Ok(())
}

fn finish(s: &mut TaskState, status: Status, error: String, at: dtask_journal::Timestamp) {
    s.status = status;
    s.result_error = error;
    s.result_data.clear();
    s.pending_resume = None;
    s.lease_deadline = None;
    s.not_before = None;
    s.done_at = Some(at);
    // The mailbox is sealed: a new ownership generation, no new input. The checkpoint is
    // kept (see docs/semantics.md, "Terminal transitions and the checkpoint").
    s.mailbox.generation += 1;
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} v{} attempt {}",
            self.state.spec.id, self.state.status, self.state.version, self.state.attempt
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dtask_journal::{Delivery, LeasePolicy, TaskSpec, Timestamp};
    use std::sync::Arc;

    #[test]
    fn the_task_layer_is_allocated_only_when_a_task_first_uses_it() {
        let created = Event::created(TaskSpec::new("t", "exec"), LeasePolicy::Retry, Timestamp(1));
        let mut task = Task::created("t", &created).unwrap();
        assert!(task.layer.is_none());
        assert_eq!(task.layer(), &TaskLayer::EMPTY);
        let input = Event::InputSent {
            sequence: 1,
            event_id: "m1".into(),
            kind: "message".into(),
            data: b"hi".to_vec(),
            delivery: Delivery::Queued,
            at: Timestamp(2),
        };
        task.apply(&input).unwrap();
        assert!(task.layer.is_some());
        assert_eq!(task.layer().input_ids.get("m1"), Some(&1));
        assert_eq!(task.layer().input_positions, [1]);
    }

    #[test]
    fn a_fold_of_a_creation_shares_its_spec() {
        let spec = Arc::new(TaskSpec::new("t", "exec"));
        let created = Event::created(Arc::clone(&spec), LeasePolicy::Retry, Timestamp(1));
        // Folded from the event a caller holds (the store's way before an append): the
        // state's spec is the event's, not a copy.
        let shared = Task::created("t", &created).unwrap();
        assert!(Arc::ptr_eq(&shared.state.spec, &spec));
        drop(shared);
        // Taken by value (recovery's way): the spec moves in, the event's count with it.
        let owned = Task::from_created("t", created).unwrap();
        assert!(Arc::ptr_eq(&owned.state.spec, &spec));
        assert_eq!(Arc::strong_count(&spec), 2);
    }
}

//! The mailbox store: inputs sent to tasks, the consumed cursor, publication and children.
//!
//! Every task has a mailbox, created with it and sealed when it ends. Any party may send
//! input to a task that has not ended; inputs get FIFO sequence numbers and are deduplicated
//! by event id for the life of the task. A running attempt reads them
//! ([`TaskStore::list_inputs`], [`TaskStore::wait_inputs`]) and records how far it consumed
//! them — alone ([`TaskStore::advance_cursor`]) or atomically with a lifecycle transition
//! ([`crate::Command::CommitInput`] and the `*IfNoInputs` commands). Everything here is an
//! event of the task's stream, decided in `decide` and folded by the one fold.

use super::cursor;
use super::decide::{self, Decision, Keyed};
use super::error::{NotFound, Result, StoreError};
use super::request::{AdvanceCursor, InputRequest};
use super::{TaskPage, TaskStore};
use dtask_journal::{Delivery, Event, Record, Timestamp};
use dtask_replay::TaskState;
use serde::{Deserialize, Serialize};
use std::ops::Bound;

/// An input in a task's mailbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputRecord {
    /// The task.
    pub task_id: String,
    /// The mailbox sequence (1, 2, 3, …).
    pub sequence: u64,
    /// The sender's idempotency key.
    pub event_id: String,
    /// The input kind.
    pub kind: String,
    /// The input bytes.
    pub data: Vec<u8>,
    /// How it is delivered.
    pub delivery: Delivery,
    /// When it arrived.
    pub created_at: Timestamp,
    /// Its record's position in the task's stream.
    pub position: u64,
}

impl InputRecord {
    /// The input in `record`, if it is one.
    #[must_use]
    pub fn from_record(task_id: &str, record: &Record) -> Option<Self> {
        match &record.event {
            Event::InputSent {
                sequence,
                event_id,
                kind,
                data,
                delivery,
                at,
            } => Some(Self {
                task_id: task_id.to_owned(),
                sequence: *sequence,
                event_id: event_id.clone(),
                kind: kind.clone(),
                data: data.clone(),
                delivery: *delivery,
                created_at: *at,
                position: record.position,
            }),
            _ => None,
        }
    }
}

/// A page of a mailbox's inputs, with the mailbox's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputPage {
    /// The inputs after the requested sequence, in FIFO order.
    pub inputs: Vec<InputRecord>,
    /// The newest input's sequence.
    pub latest: u64,
    /// The consumed cursor.
    pub consumed: u64,
    /// The mailbox generation.
    pub generation: u64,
    /// Whether the mailbox is sealed (the task has ended).
    pub sealed: bool,
}

/// A children-list cursor: `{v:1, p:parent, l:last id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ChildCursor {
    v: u32,
    p: String,
    l: String,
}

impl TaskStore {
    /// Sends an input to task `id`'s mailbox. A new input gets the next sequence number and
    /// wakes a task waiting for input (version + 1); a suspended task stays suspended. The
    /// same event id with the same kind, data and delivery returns the existing record with
    /// `false` — even once the mailbox is sealed; with other content it fails.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] (checked first), [`StoreError::NotFound`],
    /// [`StoreError::MailboxSealed`] when the task has ended, [`StoreError::InputConflict`].
    pub async fn send_input(&self, id: &str, request: InputRequest) -> Result<(InputRecord, bool)> {
        decide::validate_input(id, &request, self.config())?;
        let slot = self.slot(id)?;
        let mut task = self.lock(&slot).await?;
        let mut request = super::Redecide::new(request);
        loop {
            let now = self.now();
            self.resolve_expiry(&slot, &mut task, now).await?;
            match decide::input(&task, request.take(self)?, now)? {
                Keyed::Repeat { position, request } => {
                    let original = self.repeated_input(id, position, &request)?;
                    self.count_input_deduplicated();
                    return Ok((original, false));
                }
                Keyed::New(events) => {
                    let position = task.state.position;
                    match self.commit(&slot, &mut task, &events).await {
                        // Another node wrote to the stream first (see `Redecide`).
                        Err(e) if request.again(&e) => continue,
                        other => other?,
                    }
                    return Ok((self.read_input(id, position)?, true));
                }
            }
        }
    }

    /// The input at `position` of task `id`'s stream, which `request` repeats (its event
    /// id): the input itself when the kind, data and delivery are the same, an
    /// [`StoreError::InputConflict`] when not — the one rule of a repeated input, for a
    /// caller's input and a child's notice alike.
    pub(super) fn repeated_input(
        &self,
        id: &str,
        position: u64,
        request: &InputRequest,
    ) -> Result<InputRecord> {
        let original = self.read_input(id, position)?;
        let same = original.kind == request.kind
            && original.data == request.data
            && original.delivery == request.delivery;
        if same {
            Ok(original)
        } else {
            Err(StoreError::InputConflict(request.event_id.clone()))
        }
    }

    fn read_input(&self, id: &str, position: u64) -> Result<InputRecord> {
        let missing = || {
            StoreError::NotFound(NotFound::Input {
                task: id.to_owned(),
                sequence: 0,
            })
        };
        let record = self
            .journal()
            .read_stream(id, position)
            .next()
            .ok_or_else(missing)??;
        InputRecord::from_record(id, &record).ok_or_else(missing)
    }

    /// Lists the inputs of task `id`'s mailbox after sequence `after`, oldest first, up to
    /// `limit` (the store's page rules), with the mailbox's counters.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown task.
    pub async fn list_inputs(&self, id: &str, after: u64, limit: i64) -> Result<InputPage> {
        let slot = self.slot(id)?;
        let (state, positions) = {
            let task = self.lock(&slot).await?;
            let skip = usize::try_from(after).unwrap_or(usize::MAX);
            let positions: Vec<u64> = task
                .layer()
                .input_positions
                .iter()
                .skip(skip)
                .take(self.config().page(limit))
                .copied()
                .collect();
            (task.state.clone(), positions)
        };
        let mut inputs = Vec::with_capacity(positions.len());
        for position in positions {
            inputs.push(self.read_input(id, position)?);
        }
        Ok(page(&state, inputs))
    }

    /// Waits until task `id`'s mailbox holds an input after sequence `after` (or is
    /// sealed), then lists them as [`TaskStore::list_inputs`] does.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown task.
    pub async fn wait_inputs(&self, id: &str, after: u64, limit: i64) -> Result<InputPage> {
        let slot = self.slot(id)?;
        let mut changes = slot.subscribe();
        loop {
            {
                let task = self.lock(&slot).await?;
                if task.state.mailbox.latest > after || task.state.mailbox_sealed() {
                    break;
                }
            }
            if changes.changed().await.is_err() {
                return Err(StoreError::Closed);
            }
        }
        self.list_inputs(id, after, limit).await
    }

    /// Moves task `id`'s consumed cursor from `expected_cursor` to `cursor`, for its running
    /// attempt. The version does not change; a move to where the cursor is writes nothing.
    ///
    /// # Errors
    /// [`StoreError::OwnershipLost`] for another generation, [`StoreError::MailboxSealed`],
    /// [`StoreError::CursorConflict`] for a stale expected cursor,
    /// [`StoreError::InvalidCursor`] for a cursor before it or past the newest input,
    /// [`StoreError::LeaseLost`] when the attempt is not the active one.
    pub async fn advance_cursor(&self, id: &str, request: AdvanceCursor) -> Result<TaskState> {
        if request.cursor < request.expected_cursor {
            return Err(StoreError::invalid(
                "cursor",
                "must not be before the expected cursor",
            ));
        }
        let slot = self.slot(id)?;
        let mut task = self.lock(&slot).await?;
        // The request is borrowed, not consumed: only the count of decisions is kept.
        let mut decisions = super::Redecide::new(());
        loop {
            let now = self.now();
            self.resolve_expiry(&slot, &mut task, now).await?;
            decisions.take(self)?;
            if let Decision::Write(events) = decide::advance_cursor(&task.state, &request, now)? {
                match self.commit(&slot, &mut task, &events).await {
                    // Another node wrote to the stream first (see `Redecide`).
                    Err(e) if decisions.again(&e) => continue,
                    other => other?,
                }
            }
            return Ok(task.state.clone());
        }
    }

    /// Publishes a deferred task: `on_background` from now on, without a version change;
    /// `task_backgrounded` goes to its session (root task) or its parent's mailbox (nested
    /// task) in the same append. Publishing a published task returns it unchanged.
    ///
    /// # Errors
    /// [`StoreError::VersionConflict`], [`StoreError::IllegalTransition`] for a task
    /// published on create, [`StoreError::AlreadyTerminal`] for a deferred task that ended;
    /// for a nested task, the refusal of its parent's mailbox
    /// ([`StoreError::MailboxSealed`] once the parent has ended): the whole publish fails,
    /// nothing written, the task still deferred.
    pub async fn publish(&self, id: &str, expected_version: u64) -> Result<TaskState> {
        if expected_version == 0 {
            return Err(StoreError::invalid("expected version", "must be positive"));
        }
        let slot = self.slot(id)?;
        let mut task = self.lock(&slot).await?;
        let mut decisions = super::Redecide::new(());
        loop {
            let now = self.now();
            self.resolve_expiry(&slot, &mut task, now).await?;
            decisions.take(self)?;
            if let Decision::Write(events) = decide::publish(&task.state, expected_version, now)? {
                match self.commit(&slot, &mut task, &events).await {
                    // Another node wrote to the stream first (see `Redecide`).
                    Err(e) if decisions.again(&e) => continue,
                    other => other?,
                }
            }
            return Ok(task.state.clone());
        }
    }

    /// Lists the children of task `parent` in id order, a page at a time.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown parent, [`StoreError::InvalidCursor`] for a
    /// malformed cursor, one of another parent, or one whose last id names no child.
    pub async fn list_children(
        &self,
        parent: &str,
        cursor: Option<&str>,
        limit: i64,
    ) -> Result<TaskPage> {
        let slot = self.slot(parent)?;
        let limit = self.config().page(limit);
        let ids: Vec<String> = {
            let task = self.lock(&slot).await?;
            let lower = match cursor {
                None => Bound::Unbounded,
                Some(c) => {
                    let c: ChildCursor = cursor::decode(c)?;
                    if c.v != 1 || c.p != parent {
                        return Err(StoreError::InvalidCursor("cursor of another parent".into()));
                    }
                    if !task.layer().children.contains(&c.l) {
                        return Err(StoreError::InvalidCursor(format!(
                            "the cursor's last id {:?} names no child",
                            c.l
                        )));
                    }
                    Bound::Excluded(c.l)
                }
            };
            task.layer()
                .children
                .range::<String, _>((lower, Bound::Unbounded))
                .take(limit + 1)
                .cloned()
                .collect()
        };
        let more = ids.len() > limit;
        let mut tasks = Vec::with_capacity(ids.len().min(limit));
        for id in ids.into_iter().take(limit) {
            tasks.push(self.get(&id).await?);
        }
        let next_cursor = match (more, tasks.last()) {
            (true, Some(last)) => Some(cursor::encode(&ChildCursor {
                v: 1,
                p: parent.to_owned(),
                l: last.spec.id.clone(),
            })),
            _ => None,
        };
        Ok(TaskPage { tasks, next_cursor })
    }
}

fn page(state: &TaskState, inputs: Vec<InputRecord>) -> InputPage {
    InputPage {
        inputs,
        latest: state.mailbox.latest,
        consumed: state.mailbox.consumed,
        generation: state.mailbox.generation,
        sealed: state.mailbox_sealed(),
    }
}

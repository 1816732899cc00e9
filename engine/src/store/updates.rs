//! The task-event store: progress updates of running attempts, fenced by attempt and
//! deduplicated task-wide by event id.

use super::cursor::{self, EventCursor};
use super::decide::{self, Keyed};
use super::error::{Result, StoreError};
use super::request::UpdateRequest;
use super::TaskStore;
use dtask_journal::{Event, MetadataEntry, Record, Timestamp};

/// A stored progress update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateRecord {
    /// The task.
    pub task_id: String,
    /// The attempt that emitted it.
    pub attempt: u64,
    /// The idempotency key.
    pub event_id: String,
    /// The kind tag.
    pub kind: String,
    /// The update bytes.
    pub data: Vec<u8>,
    /// Key/value metadata.
    pub metadata: Vec<MetadataEntry>,
    /// The part of a multi-part event; empty for a single-record update.
    pub part_id: String,
    /// Whether the record completes its event (always for a single-record update; for a
    /// part, whether it is the final one). Readers see an event as complete only then.
    pub last: bool,
    /// Whether the update's bytes were trimmed ([`TaskStore::trim_progress`]): its `data`
    /// and `metadata` are empty, everything else is as it was appended.
    pub trimmed: bool,
    /// The record's position in the task's stream (its append position).
    pub position: u64,
    /// When it was appended.
    pub created_at: Timestamp,
}

impl UpdateRecord {
    /// The update in `record`, if it is one.
    #[must_use]
    pub fn from_record(task_id: &str, record: &Record) -> Option<Self> {
        match &record.event {
            Event::UpdateAppended { .. }
            | Event::PartAppended { .. }
            | Event::UpdateTrimmed { .. } => {
                Self::from_event(task_id, record.position, record.event.clone())
            }
            _ => None,
        }
    }

    /// The update in `record`, if it is one, its fields moved out of the record.
    fn from_owned(task_id: &str, record: Record) -> Option<Self> {
        Self::from_event(task_id, record.position, record.event)
    }

    /// The update `event` holds (if it is one), at `position` of `task_id`'s stream, its
    /// fields moved rather than copied.
    fn from_event(task_id: &str, position: u64, event: Event) -> Option<Self> {
        match event {
            Event::UpdateAppended {
                attempt,
                event_id,
                kind,
                data,
                metadata,
                at,
            } => Some(Self {
                task_id: task_id.to_owned(),
                attempt,
                event_id,
                kind,
                data,
                metadata,
                part_id: String::new(),
                last: true,
                trimmed: false,
                position,
                created_at: at,
            }),
            Event::PartAppended {
                attempt,
                event_id,
                part_id,
                last,
                kind,
                data,
                metadata,
                at,
            } => Some(Self {
                task_id: task_id.to_owned(),
                attempt,
                event_id,
                kind,
                data,
                metadata,
                part_id,
                last,
                trimmed: false,
                position,
                created_at: at,
            }),
            Event::UpdateTrimmed {
                attempt,
                event_id,
                part_id,
                last,
                kind,
                at,
                ..
            } => Some(Self {
                task_id: task_id.to_owned(),
                attempt,
                event_id,
                kind,
                data: Vec::new(),
                metadata: Vec::new(),
                part_id,
                last,
                trimmed: true,
                position,
                created_at: at,
            }),
            _ => None,
        }
    }
}

/// One page of updates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdatePage {
    /// The updates, in append order (or reverse order when newest first).
    pub updates: Vec<UpdateRecord>,
    /// The cursor of the next page; `None` when nothing remains in the traversal's snapshot.
    pub next_cursor: Option<String>,
}

impl TaskStore {
    /// Appends a progress update of the running attempt. The fence (running, no cancel intent,
    /// current attempt, live lease) is checked **before** replay detection; then an event id
    /// seen before (in any attempt) with the same bytes returns the original record with
    /// `false`, and with other bytes fails. The task's version does not change. An original
    /// whose bytes were trimmed ([`TaskStore::trim_progress`]) is compared by what it kept:
    /// the same kind (and final flag) returns it.
    ///
    /// With a `part_id`, the update is one part of a multi-part event, deduplicated by
    /// (event id, part id) — the same bytes and final flag return the original; once the
    /// event's final part is recorded, a new part of it is refused.
    ///
    /// # Errors
    /// [`StoreError::Invalid`], [`StoreError::NotFound`], [`StoreError::LeaseLost`],
    /// [`StoreError::EventIdConflict`], [`StoreError::PartConflict`],
    /// [`StoreError::EventClosed`].
    pub async fn append_update(
        &self,
        id: &str,
        request: UpdateRequest,
    ) -> Result<(UpdateRecord, bool)> {
        let config = self.config();
        decide::validate_task_id(id, config)?;
        decide::validate_update(&request, config)?;
        let slot = self.slot(id)?;
        let mut task = self.lock(&slot).await?;
        let mut request = super::Redecide::new(request);
        loop {
            let now = self.now();
            self.resolve_expiry(&slot, &mut task, now).await?;
            let position = task.state.position;
            let decided = decide::update(&task, request.take(self)?, now, config.max_updates);
            if matches!(decided, Err(StoreError::UpdateLimit { .. })) {
                self.count_update_over_limit();
            }
            match decided? {
                Keyed::Repeat { position, request } => {
                    let original = self.read_update(id, position)?;
                    let same = original.kind == request.kind
                        && (original.trimmed
                            || (original.data == request.data
                                && original.metadata == request.metadata))
                        && (request.part_id.is_empty() || original.last == request.last);
                    return match (same, request.part_id.is_empty()) {
                        (true, _) => {
                            self.count_update_deduplicated();
                            Ok((original, false))
                        }
                        (false, true) => Err(StoreError::EventIdConflict(request.event_id)),
                        (false, false) => Err(StoreError::PartConflict {
                            event_id: request.event_id,
                            part_id: request.part_id,
                        }),
                    };
                }
                Keyed::New(event) => {
                    match self
                        .commit(&slot, &mut task, std::slice::from_ref(&event))
                        .await
                    {
                        // Another node wrote to the stream first (see `Redecide`).
                        Err(e) if request.again(&e) => continue,
                        other => other?,
                    }
                    let capped = config.capped(&task.state);
                    drop(task);
                    if let Some((over, keep)) = capped {
                        self.cap_progress(id, over, keep).await;
                    }
                    return UpdateRecord::from_event(id, position, event)
                        .map(|u| (u, true))
                        .ok_or_else(|| StoreError::update_not_found(id, position));
                }
            }
        }
    }

    /// Trims the progress of task `id`, over the store's progress cap (more than `over`
    /// whole updates), to its last `keep` updates
    /// ([`StoreConfig::progress_cap`](super::StoreConfig::progress_cap)) — unless an update
    /// made at the same time trimmed it first. The update that went over the cap is durable
    /// whatever the trim does: a trim refused or failed is logged, and the next update over
    /// the cap tries again.
    async fn cap_progress(&self, id: &str, over: u64, keep: u64) {
        match self.trim_progress_over(id, keep, Some(over)).await {
            Ok(trimmed) => {
                if trimmed.records > 0 {
                    self.count_progress_capped();
                }
            }
            Err(error) => {
                tracing::warn!(task = %id, %error, "progress over the cap not trimmed");
            }
        }
    }

    fn read_update(&self, id: &str, position: u64) -> Result<UpdateRecord> {
        let record = self
            .journal()
            .read_stream(id, position)
            .next()
            .ok_or_else(|| StoreError::update_not_found(id, position))??;
        UpdateRecord::from_owned(id, record)
            .ok_or_else(|| StoreError::update_not_found(id, position))
    }

    /// Lists a task's updates a page at a time, oldest first (or newest first). The first page
    /// fixes the traversal's snapshot: updates appended later are not seen by its cursors.
    /// They are read through the journal's durable view
    /// ([`dtask_journal::Journal::durable_view`]): what a caller shows of them (the managed
    /// tools' progress, an agent's transcript) is nothing a crash can take back, on a shared
    /// journal too.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown task, [`StoreError::InvalidCursor`] for a
    /// malformed cursor or one of another task or direction.
    pub async fn list_updates(
        &self,
        id: &str,
        cursor: Option<&str>,
        limit: i64,
        newest_first: bool,
    ) -> Result<UpdatePage> {
        let slot = self.slot(id)?;
        let length = self.lock(&slot).await?.state.position;
        let (snapshot, start) = match cursor {
            None => (length, if newest_first { length } else { 0 }),
            Some(c) => {
                let c: EventCursor = cursor::decode(c)?;
                if c.v != 1 || c.t != id || c.n != newest_first {
                    return Err(StoreError::InvalidCursor(
                        "cursor of another task or direction".into(),
                    ));
                }
                if c.s > length || c.p > c.s {
                    return Err(StoreError::InvalidCursor("cursor out of range".into()));
                }
                (c.s, c.p)
            }
        };
        let limit = self.config().page(limit);
        let (updates, next) = if newest_first {
            self.scan_backward(id, start, limit)?
        } else {
            self.scan_forward(id, start, snapshot, limit)?
        };
        let next_cursor = next.map(|p| {
            cursor::encode(&EventCursor {
                v: 1,
                t: id.to_owned(),
                s: snapshot,
                p,
                n: newest_first,
            })
        });
        Ok(UpdatePage {
            updates,
            next_cursor,
        })
    }

    /// Updates in `[from, end)`, up to `limit`, and the position of the next one if any.
    fn scan_forward(
        &self,
        id: &str,
        from: u64,
        end: u64,
        limit: usize,
    ) -> Result<(Vec<UpdateRecord>, Option<u64>)> {
        let mut out = Vec::new();
        for record in self.durable_journal().read_stream(id, from) {
            let record = record?;
            if record.position >= end {
                break;
            }
            let position = record.position;
            if let Some(update) = UpdateRecord::from_owned(id, record) {
                if out.len() == limit {
                    return Ok((out, Some(position)));
                }
                out.push(update);
            }
        }
        Ok((out, None))
    }

    /// Updates below `before`, newest first, up to `limit`, and the exclusive upper position
    /// of the next page if any.
    fn scan_backward(
        &self,
        id: &str,
        before: u64,
        limit: usize,
    ) -> Result<(Vec<UpdateRecord>, Option<u64>)> {
        const CHUNK: u64 = 256;
        let mut out = Vec::new();
        let mut end = before;
        while end > 0 {
            let start = end.saturating_sub(CHUNK);
            let mut chunk = Vec::new();
            for record in self.durable_journal().read_stream(id, start) {
                let record = record?;
                if record.position >= end {
                    break;
                }
                if let Some(update) = UpdateRecord::from_owned(id, record) {
                    chunk.push(update);
                }
            }
            for update in chunk.into_iter().rev() {
                if out.len() == limit {
                    return Ok((out, Some(update.position + 1)));
                }
                out.push(update);
            }
            end = start;
        }
        Ok((out, None))
    }
}

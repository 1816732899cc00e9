//! Following what other processes commit to a shared journal (PostgreSQL).
//!
//! A store's memory is a cache of the journal. On an embedded journal this process is the
//! only writer, so the cache is always current. When several processes share one database,
//! each store follows the global commit order: [`TaskStore::refresh`] reads the records
//! committed since it last looked and brings its memory up to them — a task created
//! elsewhere joins the pending index (so this process's workers can claim it), a task
//! changed elsewhere is folded forward (so waiters wake and the lease index is right). Its
//! own records come back too and are skipped (the task has folded them already).
//!
//! The commit order is read through the journal's durable view
//! ([`dtask_journal::Journal::durable_view`]): a record is followed once the database has
//! flushed it, never while a crash of the database could still take it back and give its
//! sequence to another record (which the follower, past that sequence, would never read).
//!
//! The cache is never trusted for a write: every append names the stream's expected
//! position and the database refuses a stale one; the store then folds the task again from
//! the journal and reports [`StoreError::VersionConflict`]. Following only makes a node's
//! reads fresh and its claims find work sooner.

use super::{Placement, Result, StoreError, TaskKey, TaskStore};
use dtask_journal::Record;
use dtask_replay::{load_task, Status};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Records read per refresh step.
const STEP: usize = 4096;

/// How often a follower looks without being woken.
const POLL: Duration = Duration::from_secs(1);

impl TaskStore {
    /// Applies to this store's memory every record committed to the journal since the last
    /// refresh, by any process; returns how many were read. A no-op in effect on an embedded
    /// journal (every record read is this store's own).
    ///
    /// A record that this store cannot apply to its task — an id it does not take (another
    /// node's larger [`crate::StoreConfig::max_id_bytes`]), a stream that does not fold, a
    /// task gone, a record that does not decode (damaged, or a newer build's event during a
    /// rolling upgrade) — is logged and passed over: the task's copy in memory is dropped, to be
    /// folded from the journal when it is next asked for (and found wanting then, to whoever
    /// asks), and the refresh goes on with the records after it. Stopping there would stop
    /// this node's following for good, at that record every time.
    ///
    /// # Errors
    /// [`StoreError::Journal`] when the journal cannot be read (the commit order, or a task's
    /// stream, for a storage failure: the next refresh reads from the record it stopped at).
    pub async fn refresh(&self) -> Result<usize> {
        let mut read = 0;
        loop {
            let from = self.inner.seen.load(Ordering::Acquire) + 1;
            // Through the durable view: a record another node committed is followed only
            // once the database has flushed it. A record the database could still take back
            // (it crashes before the flush) would move `seen` past a sequence that is then
            // given to another record, which this node would never follow.
            let journal = self.durable_journal().clone();
            // Up to the first failure of the reading itself; a record that does not decode
            // (damaged, or a newer build's event) is its task's alone, and passed over.
            let mut commits = Vec::new();
            for item in journal.commits(from).take(STEP) {
                let failed = matches!(&item, Err(e) if undecodable(e).is_none());
                commits.push(item);
                if failed {
                    break;
                }
            }
            let n = commits.len();
            for item in commits {
                let c = match item {
                    Ok(c) => c,
                    Err(error) => {
                        let Some((task, position)) = undecodable(&error) else {
                            return Err(error.into());
                        };
                        self.passed_over(task, position, &error).await;
                        continue;
                    }
                };
                if let Err(error) = self.apply_committed(&c.task, &c.record).await {
                    if !confined_to_its_task(&error) {
                        return Err(error);
                    }
                    tracing::warn!(
                        task = %c.task,
                        seq = c.record.seq,
                        %error,
                        "a committed record was not followed; its task is read \
                         from the journal when next asked for"
                    );
                    self.forget(&c.task).await;
                }
                self.inner.seen.fetch_max(c.record.seq, Ordering::AcqRel);
            }
            read += n;
            // A step of nothing but records that do not decode moved `seen` nowhere (their
            // sequences cannot be read): the next step would read them again, for ever.
            // The next refresh tries again, once a record that decodes follows them.
            if n < STEP || self.inner.seen.load(Ordering::Acquire) + 1 == from {
                return Ok(read);
            }
        }
    }

    /// Passes over the record at `position` of task `task`, which does not decode (`error`):
    /// the task's copy in memory is dropped, to be folded from the journal — and found
    /// wanting — when next asked for. Logged once for each record: the records at the end
    /// of the commit order are read again by each refresh until one that decodes follows
    /// them (their sequences, in the records, cannot be read); the store remembers those
    /// it logged, [`STEP`] at most.
    async fn passed_over(&self, task: &str, position: u64, error: &dtask_journal::Error) {
        let first = {
            let mut logged = self.inner.passed_over.lock();
            let key = (task.to_owned(), position);
            if logged.contains(&key) {
                false
            } else {
                if logged.len() >= STEP {
                    logged.clear();
                }
                logged.insert(key)
            }
        };
        if first {
            tracing::warn!(
                task = %task,
                position,
                %error,
                "a committed record does not decode (damaged, or written by a newer build): \
                 passed over; its task is read from the journal when next asked for"
            );
        }
        self.forget(task).await;
    }

    /// Forgets task `id` — purged by another node, or changed there in a way this node could
    /// not follow: its slot, and wherever the index placed it as this node last saw it — a
    /// task this node had not seen end (the purge came in before its last records) would
    /// otherwise stay in the listings and the leases. A later read folds it from the journal.
    async fn forget(&self, id: &str) {
        let held = {
            let mut index = self.index();
            // A fold of it under way is made again (see `Index::cold_epoch`).
            index.moved_cold(id);
            index.slots.get(id).cloned()
        };
        let Some(slot) = held else { return };
        let task = slot.task.lock().await;
        let mut index = self.index();
        index.unplace(&TaskKey::of(&task.state), &Placement::of(&task.state));
        index.remove(id);
    }

    /// Brings the task of `record` up to it.
    async fn apply_committed(&self, id: &str, record: &Record) -> Result<()> {
        if let dtask_journal::Event::NotificationAcked { enqueued_seq, .. } = record.event {
            // Acknowledged, here or elsewhere: no longer this node's to deliver.
            self.followed_ack(enqueued_seq);
        }
        if let dtask_journal::Event::Purged { .. } = record.event {
            // Purged elsewhere: forget it (a read finds the tombstone).
            self.forget(id).await;
            return Ok(());
        }
        let held = {
            let mut index = self.index();
            let held = index.slots.get(id).cloned();
            if held.is_none() {
                // A fold of it under way is made again (see `Index::cold_epoch`).
                index.moved_cold(id);
            }
            held
        };
        let Some(slot) = held else {
            if record.position == 0 {
                // Created elsewhere: load it (with whatever followed) and index it.
                let slot = match self.slot(id) {
                    Ok(slot) => slot,
                    // Gone since (purged): nothing to follow.
                    Err(StoreError::NotFound(_) | StoreError::Purged { .. }) => return Ok(()),
                    Err(e) => return Err(e),
                };
                if self.lock(&slot).await?.state.status == Status::Pending {
                    self.inner
                        .pending_epoch
                        .send_modify(|e| *e = e.wrapping_add(1));
                }
            }
            // Otherwise a task this store does not hold: read on demand when asked for.
            return Ok(());
        };
        let mut task = self.lock(&slot).await?;
        let position = task.state.position;
        if record.position < position {
            return Ok(());
        }
        let before = Placement::of(&task.state);
        if record.position > position || task.apply(&record.event).is_err() {
            // A gap (records this store never saw) or a record that does not fold on the
            // cached state: fold the task again from the journal.
            match load_task(self.journal(), id).map_err(StoreError::from) {
                Ok(Some(folded)) => *task = folded,
                Ok(None) => return Err(StoreError::task_not_found(id)),
                Err(StoreError::Purged { .. }) => {
                    // Purged since: the tombstone comes later in the commit order.
                    drop(task);
                    self.forget(id).await;
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        self.publish_change(&slot, &task, &before);
        Ok(())
    }

    /// Follows the journal in the background: [`TaskStore::refresh`] each time the journal
    /// announces new commits ([`dtask_journal::Journal::watch_durable`]: on PostgreSQL, any
    /// process's) and at least every second. What a store on a shared journal runs so that
    /// its reads are fresh and its workers find tasks created elsewhere; the
    /// [`crate::Manager`] starts one by itself on a shared journal.
    pub fn spawn_follower(&self) -> tokio::task::JoinHandle<()> {
        let store = self.clone();
        tokio::spawn(async move {
            let mut announced = store.journal().watch_durable();
            loop {
                match store.refresh().await {
                    Ok(n) if n > 0 => tracing::trace!(records = n, "followed the journal"),
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, "following the journal failed"),
                }
                tokio::select! {
                    changed = announced.changed() => {
                        if changed.is_err() {
                            tokio::time::sleep(POLL).await;
                        }
                    }
                    () = tokio::time::sleep(POLL) => {}
                }
            }
        })
    }
}

/// The task and position of the record a reading of the commit order met undecodable
/// (`Corruption` of a named task), if that is what `error` is.
fn undecodable(error: &dtask_journal::Error) -> Option<(&str, u64)> {
    match error {
        dtask_journal::Error::Corruption { task, position, .. } if !task.is_empty() => {
            Some((task.as_str(), *position))
        }
        _ => None,
    }
}

/// Whether `error`, met applying a followed record to its task, concerns that task alone (an
/// id this store does not take, a stream that does not fold or is damaged, a task not found)
/// rather than the journal's reading (a storage failure, the journal closed or upgraded
/// under it) or the store (closed), which the next refresh must try again.
fn confined_to_its_task(error: &StoreError) -> bool {
    match error.journal_error() {
        Some(
            dtask_journal::Error::Storage(_)
            | dtask_journal::Error::Closed
            | dtask_journal::Error::Stopped(_)
            | dtask_journal::Error::FormatChanged { .. },
        ) => false,
        Some(_) => true,
        None => !matches!(error, StoreError::Closed),
    }
}

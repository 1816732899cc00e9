//! Retention: purging finished tasks, on top of the journal's purge
//! ([`dtask_journal::Journal::purge`]), sweeps by age, and operators' holds.
//!
//! A task tree is purged whole: a purge names a root task, and its nested tasks (each
//! ended) go in the same atomic write; a nested task alone is refused, so that no parent
//! names a child that is gone. A task not ended, with a notification still queued or under
//! a hold ([`TaskStore::hold`]) is refused; nothing is written on a refusal. A purged task reads as
//! [`StoreError::Purged`] from then on — on every node of a shared journal, which follows
//! the tombstone through the commit order — and its id stays taken.
//!
//! A task's progress is trimmed rather than purged where its record should stay but its
//! older updates' bytes need not ([`TaskStore::trim_progress`], [`TaskStore::trim_finished`]):
//! the task folds to the same state, its readers see the trimmed updates as such.

use super::index::Placement;
use super::{Result, StoreError, TaskStore};
use dtask_journal::{PurgeRefusal, PurgedStream, Timestamp, TrimRefusal, TrimmedStream};
use dtask_replay::FoldViews;
use std::collections::BTreeSet;

/// The most tasks of one tree a purge takes in one write.
pub const MAX_PURGE_TREE: usize = 4096;

impl TaskStore {
    /// Purges the finished root task `id` and its nested tasks: their records are deleted
    /// from the journal, one tombstone a task kept (see `docs/semantics.md`, "Purging
    /// finished tasks"). Returns what each stream lost, the root's first. The write, and the
    /// tree's leaving this store's memory, run in a task of their own, which a caller that
    /// stops waiting leaves to finish.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown task; [`StoreError::Purged`] for one purged
    /// before; [`StoreError::IllegalTransition`] (operation `purge`) when the task or one of
    /// its nested tasks has not ended; [`StoreError::Invalid`] for a nested task (purge its
    /// root) or a tree of more than [`MAX_PURGE_TREE`] tasks;
    /// [`StoreError::Journal`] with [`dtask_journal::Error::NotPurgeable`] for a task with
    /// a queued notification or under a hold, or [`dtask_journal::Error::Conflict`] when a
    /// stream changed meanwhile. Nothing is written on an error.
    pub async fn purge(&self, id: &str) -> Result<Vec<PurgedStream>> {
        let slot = self.slot(id)?;
        let tree = {
            let task = self.lock(&slot).await?;
            let state = &task.state;
            if !state.parent_task_id.is_empty() {
                return Err(StoreError::invalid(
                    "id",
                    format!(
                        "{id:?} is a nested task of {:?}: purge its root task, which takes it along",
                        state.parent_task_id
                    ),
                ));
            }
            if !state.status.is_terminal() {
                return Err(StoreError::IllegalTransition {
                    status: state.status,
                    operation: "purge",
                });
            }
            let mut tree = vec![id.to_owned()];
            let mut next: Vec<String> = task.layer().children.iter().cloned().collect();
            drop(task);
            let mut seen = BTreeSet::new();
            while let Some(child) = next.pop() {
                if !seen.insert(child.clone()) {
                    continue;
                }
                if tree.len() >= MAX_PURGE_TREE {
                    return Err(StoreError::invalid(
                        "id",
                        format!("the task tree holds more than {MAX_PURGE_TREE} tasks"),
                    ));
                }
                let slot = match self.slot(&child) {
                    // A child whose creation was refused leaves its parent's record only.
                    Err(StoreError::NotFound(_) | StoreError::Purged { .. }) => continue,
                    other => other?,
                };
                let task = self.lock(&slot).await?;
                if !task.state.status.is_terminal() {
                    return Err(StoreError::IllegalTransition {
                        status: task.state.status,
                        operation: "purge",
                    });
                }
                next.extend(task.layer().children.iter().cloned());
                tree.push(child);
            }
            tree
        };
        // The write and the tree's leaving memory run in a task of their own: a caller that
        // stops waiting (a dropped future) must not leave the purged tasks in memory, read
        // as the tasks they were until the store closes.
        let (store, now) = (self.clone(), self.now());
        let purging = tokio::spawn(async move {
            let ids: Vec<&str> = tree.iter().map(String::as_str).collect();
            let purged = store.journal().purge_async(&ids, now).await;
            if matches!(
                purged,
                Ok(_)
                    | Err(dtask_journal::Error::NotPurgeable {
                        why: PurgeRefusal::AlreadyPurged,
                        ..
                    })
            ) {
                // Purged now, or before by a write this store did not see to its end: the
                // tree's tasks (all ended) are read from the journal from now on.
                let mut index = store.index();
                for id in &tree {
                    index.remove(id);
                }
            }
            purged
        });
        let purged = match purging.await {
            Ok(purged) => purged,
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(_) => Err(dtask_journal::Error::Closed),
        }
        .map_err(|e| match e {
            dtask_journal::Error::NotPurgeable {
                task,
                why: PurgeRefusal::AlreadyPurged,
            } => StoreError::Purged { task },
            e => StoreError::Journal(e),
        })?;
        tracing::info!(task = %id, tasks = purged.len(), "purged");
        Ok(purged)
    }
}

impl TaskStore {
    /// One step of a sweep: up to `limit` (at least 1) tasks in id order after `after`,
    /// folded off the journal on a blocking thread; returns the ids of those whose state
    /// `pick` takes (intact streams only: a damaged or illegal one is evidence, left alone)
    /// and where the next step starts (`None` at the journal's end).
    async fn looked_at(
        &self,
        after: Option<String>,
        limit: usize,
        pick: impl Fn(&dtask_replay::TaskState) -> bool + Send + 'static,
    ) -> Result<(Vec<String>, Option<String>)> {
        let journal = self.journal().clone();
        let limit = limit.max(1);
        tokio::task::spawn_blocking(move || {
            let mut picked = Vec::new();
            let mut looked = 0;
            for view in FoldViews::new(&journal, after.as_deref()) {
                let view = view?;
                looked += 1;
                if view.task.as_ref().is_some_and(|t| pick(&t.state)) && !view.has_problems() {
                    picked.push(view.id().to_owned());
                }
                if looked == limit {
                    return Ok((picked, Some(view.id().to_owned())));
                }
            }
            Ok((picked, None))
        })
        .await
        .map_err(|_| StoreError::Closed)?
    }
}

/// One step of a retention sweep ([`TaskStore::purge_finished`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionStep {
    /// The streams purged: each tree's root first, then its nested tasks.
    pub purged: Vec<PurgedStream>,
    /// Root tasks old enough that were kept: a nested task still running, a notification
    /// still queued, or the task changed while the step ran.
    pub kept: Vec<(String, String)>,
    /// Where the next step starts (the last task id looked at), or `None` when the sweep
    /// reached the end of the journal.
    pub next_after: Option<String>,
}

impl TaskStore {
    /// One step of a retention sweep: looks at up to `limit` tasks in id order after
    /// `after` and purges each root task among them that ended before `before`, with its
    /// nested tasks ([`TaskStore::purge`]; a tree that may not go yet is kept and named).
    /// A sweep is incremental and resumable: each purge is one atomic write, and the next
    /// step starts at [`RetentionStep::next_after`] — after a crash, a sweep from the start
    /// finds the purged tasks gone and goes on.
    ///
    /// # Errors
    /// [`StoreError::Journal`] when the journal cannot be read or a purge cannot be written
    /// (the purges before it stand).
    pub async fn purge_finished(
        &self,
        before: Timestamp,
        after: Option<String>,
        limit: usize,
    ) -> Result<RetentionStep> {
        let (candidates, next_after) = self
            .looked_at(after, limit, move |s| {
                s.parent_task_id.is_empty()
                    && s.status.is_terminal()
                    && s.done_at.unwrap_or(s.updated_at) < before
            })
            .await?;
        let mut step = RetentionStep {
            next_after,
            ..RetentionStep::default()
        };
        for id in candidates {
            match self.purge(&id).await {
                Ok(purged) => step.purged.extend(purged),
                Err(StoreError::Journal(
                    e @ (dtask_journal::Error::NotPurgeable { .. }
                    | dtask_journal::Error::Conflict { .. }),
                )) => {
                    step.kept.push((id, e.to_string()));
                }
                // The journal failing ends the step; the next sweep goes on.
                Err(e @ StoreError::Journal(_)) => return Err(e),
                // A refusal of this tree alone (not ended, purged meanwhile, too large, a
                // task of it that does not fold): kept and named, and the sweep goes on —
                // it stopped here at every sweep, and never reached the tasks after it.
                Err(e) => step.kept.push((id, e.to_string())),
            }
        }
        Ok(step)
    }
}

/// Tasks a step of the background retention sweep looks at.
const RETENTION_STEP: usize = 512;

/// What one step of a background sweep did: tasks done, tasks kept, where the next step
/// starts (`None`: the sweep reached the end of the journal).
type SweepStep = (usize, usize, Option<String>);

impl TaskStore {
    /// Spawns a background retention sweep: every `every`, purges the root tasks that ended
    /// more than `retain` ago (by this store's clock), with their nested tasks, in steps of
    /// [`TaskStore::purge_finished`] over the whole journal — a tree that may not go yet is
    /// looked at again at the next sweep. What `dtask serve --retain` runs.
    #[must_use]
    pub fn spawn_retention(
        &self,
        retain: std::time::Duration,
        every: std::time::Duration,
    ) -> tokio::task::JoinHandle<()> {
        let retain = u64::try_from(retain.as_millis()).unwrap_or(u64::MAX);
        self.spawn_sweep(every, "retention", move |store, after| async move {
            let before = Timestamp(store.now().0.saturating_sub(retain));
            let step = store.purge_finished(before, after, RETENTION_STEP).await?;
            Ok((step.purged.len(), step.kept.len(), step.next_after))
        })
    }

    /// Spawns a background sweep trimming finished tasks' progress: every `every`, trims the
    /// tasks that ended more than `after` ago (by this store's clock) to their last `keep`
    /// updates, in steps of [`TaskStore::trim_finished`] over the whole journal. What `dtask
    /// serve --trim-after` runs.
    #[must_use]
    pub fn spawn_trimming(
        &self,
        after: std::time::Duration,
        keep: u64,
        every: std::time::Duration,
    ) -> tokio::task::JoinHandle<()> {
        let after = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        self.spawn_sweep(every, "trim", move |store, start| async move {
            let before = Timestamp(store.now().0.saturating_sub(after));
            let step = store
                .trim_finished(before, keep, start, RETENTION_STEP)
                .await?;
            Ok((step.trimmed.len(), step.kept.len(), step.next_after))
        })
    }

    /// Runs `step` from the journal's start to its end every `every`, logging what each
    /// sweep did (`what`) and a step's error (the sweep stops there; the next goes on).
    fn spawn_sweep<F, Fut>(
        &self,
        every: std::time::Duration,
        what: &'static str,
        step: F,
    ) -> tokio::task::JoinHandle<()>
    where
        F: Fn(TaskStore, Option<String>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<SweepStep>> + Send,
    {
        let store = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let (mut after, mut done, mut kept) = (None, 0usize, 0usize);
                loop {
                    match step(store.clone(), after).await {
                        Ok((n, k, next)) => {
                            done += n;
                            kept += k;
                            after = next;
                            if after.is_none() {
                                break;
                            }
                        }
                        Err(error) => {
                            tracing::warn!(%error, sweep = what, "sweep failed");
                            break;
                        }
                    }
                }
                if done > 0 || kept > 0 {
                    tracing::info!(done, kept, sweep = what, "sweep");
                }
            }
        })
    }
}

impl TaskStore {
    /// Places an operator's hold on task `id` (any task, in any status, ended or not): while
    /// it stands the task is not purged — by name, by a retention sweep or offline — and a
    /// tree with a held task is kept whole. `reason` says why (a case, an investigation).
    /// A hold placed again while one stands changes nothing and returns the task.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for an empty reason or one longer than the store's error
    /// limit; [`StoreError::NotFound`], [`StoreError::Purged`]; journal errors. Nothing is
    /// written on an error.
    pub async fn hold(&self, id: &str, reason: &str) -> Result<dtask_replay::TaskState> {
        if reason.is_empty() {
            return Err(StoreError::invalid("reason", "a hold needs a reason"));
        }
        let max = self.inner.config.max_error_bytes;
        if reason.len() > max {
            return Err(StoreError::invalid(
                "reason",
                format!("{} bytes, more than {max}", reason.len()),
            ));
        }
        self.write_hold(id, |state, at| {
            state.hold.is_none().then(|| dtask_journal::Event::Hold {
                reason: reason.to_owned(),
                at,
            })
        })
        .await
    }

    /// Lifts the hold on task `id`: it may be purged again. Without a hold, changes nothing
    /// and returns the task.
    ///
    /// # Errors
    /// [`StoreError::NotFound`], [`StoreError::Purged`]; journal errors.
    pub async fn lift_hold(&self, id: &str) -> Result<dtask_replay::TaskState> {
        self.write_hold(id, |state, at| {
            state
                .hold
                .is_some()
                .then_some(dtask_journal::Event::HoldLifted { at })
        })
        .await
    }

    /// Appends the record `decide` makes of the task's state, if any (a non-lifecycle one:
    /// the version does not change), deciding again after another writer moved the task.
    async fn write_hold(
        &self,
        id: &str,
        decide: impl Fn(&dtask_replay::TaskState, Timestamp) -> Option<dtask_journal::Event>,
    ) -> Result<dtask_replay::TaskState> {
        /// Decisions made again after a version conflict, at most.
        const TRIES: usize = 4;
        let slot = self.slot(id)?;
        let mut tries = 0;
        loop {
            tries += 1;
            let mut task = self.lock(&slot).await?;
            let Some(event) = decide(&task.state, self.now()) else {
                return Ok(task.state.clone());
            };
            match self.commit(&slot, &mut task, &[event]).await {
                Ok(()) => return Ok(task.state.clone()),
                Err(StoreError::VersionConflict { .. }) if tries < TRIES => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// One step of a sweep trimming finished tasks' progress ([`TaskStore::trim_finished`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrimStep {
    /// The streams trimmed (each with updates trimmed by this step).
    pub trimmed: Vec<TrimmedStream>,
    /// Tasks old enough that were kept: on hold, or changed while the step ran.
    pub kept: Vec<(String, String)>,
    /// Where the next step starts (the last task id looked at), or `None` when the sweep
    /// reached the end of the journal.
    pub next_after: Option<String>,
}

/// Whether the progress updates of a task in `state` may be trimmed: not an agent run's,
/// whose updates are its conversation — the run's state, read back whole — rather than
/// progress.
#[must_use]
pub fn progress_trimmable(state: &dtask_replay::TaskState) -> bool {
    state.spec.executor_key != crate::agent::AGENT_EXECUTOR_KEY
}

/// Whether a sweep trimming finished tasks' progress to their last `keep` updates takes a
/// task in `state` ([`TaskStore::trim_finished`], `dtask trim --finished-before`): one that
/// ended before `before`, whose progress may be trimmed ([`progress_trimmable`]) and that
/// has more whole updates (not trimmed before) than it keeps — so a sweep passes over a task
/// it trimmed before without reading its stream again.
#[must_use]
pub fn trim_due(state: &dtask_replay::TaskState, before: Timestamp, keep: u64) -> bool {
    state.status.is_terminal()
        && state.done_at.unwrap_or(state.updated_at) < before
        && whole_updates(state) > keep
        && progress_trimmable(state)
}

/// A task's progress updates whose bytes were not trimmed: a trim to the last `keep`
/// updates has nothing to do unless there are more than `keep` of them (trimmed updates
/// are always the oldest).
#[must_use]
pub fn whole_updates(state: &dtask_replay::TaskState) -> u64 {
    state.updates.saturating_sub(state.trimmed)
}

impl TaskStore {
    /// Trims the progress of task `id` (running or ended): every progress update but the
    /// last `keep` loses its data and metadata and keeps its place, attempt, event id, part,
    /// kind and time — the task's state is unchanged, the progress readers see the trimmed
    /// updates with [`UpdateRecord::trimmed`](super::UpdateRecord::trimmed) set, a retried
    /// update with a trimmed one's event id is still recognised, and the journal's chain
    /// stays whole ([`dtask_journal::Journal::trim_progress`]; `docs/semantics.md`,
    /// "Trimming progress"). Returns what the trim did; a task with nothing more to trim is
    /// not written to (`records` 0).
    ///
    /// # Errors
    /// [`StoreError::NotFound`], [`StoreError::Purged`]; [`StoreError::Invalid`] for an
    /// agent run ([`progress_trimmable`]); [`StoreError::Journal`] with
    /// [`dtask_journal::Error::NotTrimmable`] for a task on hold, or another journal error.
    /// Nothing is written on an error.
    pub async fn trim_progress(&self, id: &str, keep: u64) -> Result<TrimmedStream> {
        self.trim_progress_over(id, keep, None).await
    }

    /// [`TaskStore::trim_progress`], made only if the task has more than `over` whole
    /// updates when its lock is taken (else nothing is read or written: `records` 0) — the
    /// progress cap's trim, which updates made at once may all ask for.
    pub(crate) async fn trim_progress_over(
        &self,
        id: &str,
        keep: u64,
        over: Option<u64>,
    ) -> Result<TrimmedStream> {
        /// Trims made again after another node appended to the stream, at most.
        const TRIES: usize = 4;
        let slot = self.slot(id)?;
        let mut tries = 0;
        loop {
            tries += 1;
            let mut task = self.lock(&slot).await?;
            if over.is_some_and(|over| whole_updates(&task.state) <= over) {
                return Ok(TrimmedStream {
                    task: id.to_owned(),
                    records: 0,
                    rewritten: 0,
                    bytes: 0,
                    marker: None,
                });
            }
            if !progress_trimmable(&task.state) {
                return Err(StoreError::invalid(
                    "id",
                    format!(
                        "{id:?} is an agent run: its updates are its conversation, never trimmed"
                    ),
                ));
            }
            // With no hold standing as far as this store folded the stream, the trim reads
            // only the stream's untrimmed tail (and checks what came after for a hold). It
            // runs in a task of its own, the task marked unsettled meanwhile: a caller that
            // stops waiting leaves the trim to land and the next holder of the task's lock to
            // refold it (else the task in memory stayed behind its stream, and its running
            // attempt's next write — its outcome — was refused as a conflict).
            let (raise, signal) = tokio::sync::watch::channel(false);
            slot.unsettled.mark(signal);
            let (journal, task_id, now) = (self.journal().clone(), id.to_owned(), self.now());
            let (recent, position) = (task.state.hold.is_none(), task.state.position);
            let running = tokio::spawn(async move {
                let trimmed = if recent {
                    journal
                        .trim_recent_progress_async(&task_id, keep, now, position)
                        .await
                } else {
                    journal.trim_progress_async(&task_id, keep, now).await
                };
                let _ = raise.send(true);
                trimmed
            });
            let trimmed = match running.await {
                Ok(trimmed) => trimmed,
                Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
                Err(_) => Err(dtask_journal::Error::Closed),
            };
            // The outcome is known here, under the lock: the task is made current below (or
            // marked stale again when the outcome is not known).
            slot.unsettled.clear();
            match trimmed {
                Ok(trimmed) => {
                    if let Some((position, marker)) = &trimmed.marker {
                        if *position == task.state.position {
                            let before = Placement::of(&task.state);
                            Self::apply_all(&mut task, std::slice::from_ref(marker))?;
                            self.publish_change(&slot, &task, &before);
                        } else {
                            // Written after records this node had not folded yet.
                            self.refold(&slot, &mut task)?;
                        }
                        tracing::info!(task = %id, records = trimmed.records, bytes = trimmed.bytes, "progress trimmed");
                    }
                    return Ok(trimmed);
                }
                Err(dtask_journal::Error::Conflict { .. }) if tries < TRIES => {
                    self.refold(&slot, &mut task)?;
                }
                Err(dtask_journal::Error::NotTrimmable {
                    task,
                    why: TrimRefusal::Purged,
                }) => return Err(StoreError::Purged { task }),
                Err(e) => {
                    if !matches!(e, dtask_journal::Error::NotTrimmable { .. }) {
                        // Written or not (or the stream moved on): the next holder of the lock
                        // folds the task again.
                        slot.unsettled.mark_stale();
                    }
                    return Err(StoreError::Journal(e));
                }
            }
        }
    }

    /// One step of a sweep trimming finished tasks' progress: looks at up to `limit` tasks
    /// in id order after `after` and trims, to their last `keep` updates, those that ended
    /// before `before` with more updates than that ([`TaskStore::trim_progress`]). Like a
    /// retention step ([`TaskStore::purge_finished`]) it is incremental and resumable, and a
    /// sweep run again trims nothing twice.
    ///
    /// # Errors
    /// [`StoreError::Journal`] when the journal cannot be read or a trim cannot be written
    /// (the trims before it stand).
    pub async fn trim_finished(
        &self,
        before: Timestamp,
        keep: u64,
        after: Option<String>,
        limit: usize,
    ) -> Result<TrimStep> {
        let (candidates, next_after) = self
            .looked_at(after, limit, move |s| trim_due(s, before, keep))
            .await?;
        let mut step = TrimStep {
            next_after,
            ..TrimStep::default()
        };
        for id in candidates {
            match self.trim_progress(&id, keep).await {
                Ok(trimmed) if trimmed.records > 0 => step.trimmed.push(trimmed),
                Ok(_) => {}
                Err(e @ StoreError::Purged { .. }) => step.kept.push((id, e.to_string())),
                Err(StoreError::Journal(
                    e @ (dtask_journal::Error::NotTrimmable { .. }
                    | dtask_journal::Error::Conflict { .. }),
                )) => step.kept.push((id, e.to_string())),
                Err(e) => return Err(e),
            }
        }
        Ok(step)
    }
}

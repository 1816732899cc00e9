//! Retention: purging finished tasks, on top of the journal's purge
//! ([`dtask_journal::Journal::purge`]), sweeps by age, and operators' holds.
//!
//! A task tree is purged whole: a purge names a root task, and its nested tasks (each
//! ended) go in the same atomic write; a nested task alone is refused, so that no parent
//! names a child that is gone. A task not ended, with a notification still queued or under
//! a hold ([`TaskStore::hold`]) is refused; nothing is written on a refusal. A purged task reads as
//! [`StoreError::Purged`] from then on — on every node of a shared journal, which follows
//! the tombstone through the commit order — and its id stays taken.

use super::{Result, StoreError, TaskStore};
use dtask_journal::{PurgeRefusal, PurgedStream, Timestamp};
use dtask_replay::FoldViews;
use std::collections::BTreeSet;

/// The most tasks of one tree a purge takes in one write.
pub const MAX_PURGE_TREE: usize = 4096;

impl TaskStore {
    /// Purges the finished root task `id` and its nested tasks: their records are deleted
    /// from the journal, one tombstone a task kept (see `docs/semantics.md`, "Purging
    /// finished tasks"). Returns what each stream lost, the root's first.
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
        let ids: Vec<&str> = tree.iter().map(String::as_str).collect();
        let purged = self
            .journal()
            .purge_async(&ids, self.now())
            .await
            .map_err(|e| match e {
                dtask_journal::Error::NotPurgeable {
                    task,
                    why: PurgeRefusal::AlreadyPurged,
                } => StoreError::Purged { task },
                e => StoreError::Journal(e),
            })?;
        let mut index = self.index();
        for id in &tree {
            index.slots.remove(id.as_str());
        }
        drop(index);
        tracing::info!(task = %id, tasks = purged.len(), "purged");
        Ok(purged)
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
        let journal = self.journal().clone();
        let limit = limit.max(1);
        let (candidates, next_after) = tokio::task::spawn_blocking(move || {
            let mut candidates = Vec::new();
            let mut looked = 0;
            for view in FoldViews::new(&journal, after.as_deref()) {
                let view = view?;
                looked += 1;
                if let Some(task) = &view.task {
                    let s = &task.state;
                    if s.parent_task_id.is_empty()
                        && s.status.is_terminal()
                        && s.done_at.unwrap_or(s.updated_at) < before
                        && !view.has_problems()
                    {
                        candidates.push(view.id().to_owned());
                    }
                }
                if looked == limit {
                    return Ok((candidates, Some(view.id().to_owned())));
                }
            }
            Ok::<_, StoreError>((candidates, None))
        })
        .await
        .map_err(|_| StoreError::Closed)??;
        let mut step = RetentionStep {
            next_after,
            ..RetentionStep::default()
        };
        for id in candidates {
            match self.purge(&id).await {
                Ok(purged) => step.purged.extend(purged),
                Err(e @ (StoreError::IllegalTransition { .. } | StoreError::Purged { .. })) => {
                    step.kept.push((id, e.to_string()));
                }
                Err(StoreError::Journal(
                    e @ (dtask_journal::Error::NotPurgeable { .. }
                    | dtask_journal::Error::Conflict { .. }),
                )) => {
                    step.kept.push((id, e.to_string()));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(step)
    }
}

/// Tasks a step of the background retention sweep looks at.
const RETENTION_STEP: usize = 512;

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
        let store = self.clone();
        let retain = u64::try_from(retain.as_millis()).unwrap_or(u64::MAX);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let before = Timestamp(store.now().0.saturating_sub(retain));
                let (mut after, mut purged, mut kept) = (None, 0usize, 0usize);
                loop {
                    match store.purge_finished(before, after, RETENTION_STEP).await {
                        Ok(step) => {
                            purged += step.purged.len();
                            kept += step.kept.len();
                            after = step.next_after;
                            if after.is_none() {
                                break;
                            }
                        }
                        Err(error) => {
                            tracing::warn!(%error, "retention sweep failed");
                            break;
                        }
                    }
                }
                if purged > 0 || kept > 0 {
                    tracing::info!(purged, kept, "retention sweep");
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

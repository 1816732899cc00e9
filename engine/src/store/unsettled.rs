//! Writes whose caller went away mid-flight.
//!
//! A task's in-memory state is the fold of its stream, kept current by the write that holds
//! the task's lock: it appends, awaits the acknowledgement, then folds the appended events
//! in. An async caller may be dropped between the append's submission and the fold — a
//! `timeout` around a wait that resolves an expired lease, a `select!` branch not taken —
//! and the journal's writer does not cancel a submitted append: the records land, and the
//! task in memory stays behind them. Every later write of the task would then conflict with
//! its own journal.
//!
//! So an append in flight is held by an [`InFlight`] guard. Dropped before the outcome is
//! known, the guard marks the slots of the tasks the append advances as [`Unsettled`] (with
//! a signal raised once the append settles, awaited on a task of its own); the next holder of
//! such a task's lock waits for that signal and refolds the task from the journal before it
//! decides anything (`TaskStore::lock`). A finished task is not evicted from memory while
//! marked (`Index::evict`). A write that failed with the outcome unknown marks
//! its tasks the same way, settled at once.

use dtask_journal::{Appended, PendingAppend};
use parking_lot::Mutex;
use tokio::sync::watch;

/// Whether a slot's task may be behind its journal, and the signal of the append it waits
/// for: raised (`true`) once that append has settled, or gone with its sender.
#[derive(Default)]
pub(super) struct Unsettled(Mutex<Option<watch::Receiver<bool>>>);

impl Unsettled {
    /// The signal to wait for before the task is refolded; `None` when the task is current.
    pub(super) fn signal(&self) -> Option<watch::Receiver<bool>> {
        self.0.lock().clone()
    }

    /// Whether no append the task may be behind is still in flight: unmarked, or its signal
    /// raised (or its sender gone). A task so marked is refolded when next locked; evicted
    /// meanwhile, it is folded from the journal when next read, which holds the append.
    pub(super) fn is_settled(&self) -> bool {
        self.0
            .lock()
            .as_ref()
            .is_none_or(|signal| *signal.borrow() || signal.has_changed().is_err())
    }

    /// Marks the task current again (after its refold, under the task's lock).
    pub(super) fn clear(&self) {
        *self.0.lock() = None;
    }

    /// Marks the task as possibly behind its journal until `signal` is raised.
    pub(super) fn mark(&self, signal: watch::Receiver<bool>) {
        *self.0.lock() = Some(signal);
    }

    /// Marks the task as possibly behind its journal, with nothing left to wait for.
    pub(super) fn mark_stale(&self) {
        let (_, settled) = watch::channel(true);
        self.mark(settled);
    }
}

/// Waits for `signal` (see [`Unsettled`]): until the append settled, or its sender is gone.
pub(super) async fn settled(mut signal: watch::Receiver<bool>) {
    // An error is the sender gone: the task that awaited the append ended (or none could be
    // spawned, without a runtime), and there is nothing left to wait for.
    let _ = signal.wait_for(|settled| *settled).await;
}

/// An append in flight for the tasks whose markers are `slots` — a task's own and, for a
/// linked append, the other task's (see the module docs).
pub(super) struct InFlight<'a> {
    slots: [Option<&'a Unsettled>; 2],
    pending: Option<PendingAppend>,
}

impl<'a> InFlight<'a> {
    /// Holds `pending`, an append that advances the tasks of `slots`.
    pub(super) fn new(slots: [Option<&'a Unsettled>; 2], pending: PendingAppend) -> Self {
        Self {
            slots,
            pending: Some(pending),
        }
    }

    /// The append's outcome. An error other than a conflict leaves the outcome unknown, and
    /// the tasks are marked to be refolded from the journal.
    pub(super) async fn outcome(mut self) -> dtask_journal::Result<Appended> {
        let Some(pending) = self.pending.as_mut() else {
            return Err(dtask_journal::Error::Closed);
        };
        let outcome = pending.await;
        self.pending = None;
        if let Err(e) = &outcome {
            if !matches!(e, dtask_journal::Error::Conflict { .. }) {
                for slot in self.slots.iter().flatten() {
                    slot.mark_stale();
                }
            }
        }
        outcome
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let Some(pending) = self.pending.take() else {
            return;
        };
        let (raise, signal) = watch::channel(false);
        for slot in self.slots.iter().flatten() {
            slot.mark(signal.clone());
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = pending.await;
                let _ = raise.send(true);
            });
        }
    }
}

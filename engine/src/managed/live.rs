//! Process-local state shared by the managed-tool wrapper and the executors of the same
//! [`ManagedTools`](super::ManagedTools): runs adopted from the foreground, start windows and
//! live projections of a streaming caller. Nothing here is durable: after a crash the journal
//! alone decides (an adopted run that is gone is recovered from its started marker).

use super::tool::{Run, Update};
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

/// How many projected updates may wait for a streaming caller before newer ones are dropped
/// from the live view (they are durable in the journal either way).
pub(crate) const PROJECTION_BUFFER: usize = 16;

#[derive(Default)]
struct Entry {
    adopted: Option<Arc<dyn Run>>,
    started: Option<watch::Sender<bool>>,
    projection: Option<mpsc::Sender<Update>>,
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.adopted.is_none() && self.started.is_none() && self.projection.is_none()
    }
}

/// The table, keyed by task id.
#[derive(Default)]
pub(crate) struct LiveTable {
    entries: Mutex<HashMap<String, Entry>>,
}

impl std::fmt::Debug for LiveTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveTable")
            .field("tasks", &self.lock().len())
            .finish()
    }
}

impl LiveTable {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock()
    }

    fn edit(&self, task_id: &str, f: impl FnOnce(&mut Entry)) {
        let mut entries = self.lock();
        let entry = entries.entry(task_id.to_owned()).or_default();
        f(entry);
        if entry.is_empty() {
            entries.remove(task_id);
        }
    }

    /// Registers an adopted run for the task's first attempt. False when one is there already.
    pub(crate) fn adopt(&self, task_id: &str, run: Arc<dyn Run>) -> bool {
        let mut added = false;
        self.edit(task_id, |e| {
            if e.adopted.is_none() {
                e.adopted = Some(run);
                added = true;
            }
        });
        added
    }

    /// Takes the adopted run of a task, if this process holds one.
    pub(crate) fn take_adopted(&self, task_id: &str) -> Option<Arc<dyn Run>> {
        let mut run = None;
        self.edit(task_id, |e| run = e.adopted.take());
        run
    }

    /// Opens a start window: the receiver turns true once an attempt of the task has obtained
    /// its run (the started marker is durable for recoverable tools).
    pub(crate) fn open_window(&self, task_id: &str) -> watch::Receiver<bool> {
        let (tx, rx) = watch::channel(false);
        self.edit(task_id, |e| e.started = Some(tx));
        rx
    }

    /// Signals (and closes) the task's start window, if one is open.
    pub(crate) fn signal_started(&self, task_id: &str) {
        self.edit(task_id, |e| {
            if let Some(tx) = e.started.take() {
                let _ = tx.send(true);
            }
        });
    }

    /// Closes the task's start window without signalling it.
    pub(crate) fn close_window(&self, task_id: &str) {
        self.edit(task_id, |e| e.started = None);
    }

    /// Registers a live projection. False when the task has one already.
    pub(crate) fn project(&self, task_id: &str, sender: mpsc::Sender<Update>) -> bool {
        let mut added = false;
        self.edit(task_id, |e| {
            if e.projection.is_none() {
                e.projection = Some(sender);
                added = true;
            }
        });
        added
    }

    /// Offers a first emission, built by `make` only if the task has a live projection, to
    /// that projection (never blocks: a full or closed projection misses it).
    pub(crate) fn offer(&self, task_id: &str, make: impl FnOnce() -> Update) {
        let sender = self.lock().get(task_id).and_then(|e| e.projection.clone());
        if let Some(sender) = sender {
            let _ = sender.try_send(make());
        }
    }

    /// Removes the task's live projection.
    pub(crate) fn detach(&self, task_id: &str) {
        self.edit(task_id, |e| e.projection = None);
    }
}

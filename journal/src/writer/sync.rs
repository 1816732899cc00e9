//! The syncer: one sync for every batch written since the last, then the durable watermark
//! published and the callers acknowledged — or, after a failed sync, failed (their outcome
//! unknown) or told that the journal stopped.

use super::{Appended, Recipient, Shared};
use crate::backend::Backend;
use crate::error::{Error, Result, StorageError};
use crate::observe::{Synced, WriteObserver};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

/// An accepted append waiting for its acknowledgement.
pub(super) struct Ack {
    pub(super) to: Recipient,
    pub(super) appended: Appended,
}

impl Ack {
    /// Sends the caller its outcome, telling `observer` how long it waited.
    fn send(self, observer: Option<&dyn WriteObserver>) {
        if let (Some(observer), Some(submitted)) = (observer, self.to.submitted) {
            observer.acknowledged(submitted.elapsed());
        }
        let _ = self.to.reply.send(Ok(self.appended));
    }
}

/// A written batch waiting for its sync.
pub(super) struct Written {
    pub(super) last_seq: u64,
    pub(super) acks: Vec<Ack>,
}

/// Fails every caller of `acks` with the error `error` makes.
pub(super) fn fail(acks: Vec<Ack>, error: impl Fn() -> Error) {
    for ack in acks {
        let _ = ack.to.reply.send(Err(error()));
    }
}

/// Syncs for the batches up to sequence `last_seq` ([`Backend::sync_through`]), timing it.
pub(super) fn timed_sync(backend: &dyn Backend, last_seq: u64) -> (Result<()>, Duration) {
    let started = Instant::now();
    let result = match crate::failpoints::hit(crate::failpoints::SYNC) {
        Some(message) => Err(Error::storage(message)),
        None => backend.sync_through(last_seq),
    };
    (result, started.elapsed())
}

/// The syncer: syncs once for every batch written since the last sync, then acknowledges.
pub(super) fn sync_loop(backend: &dyn Backend, shared: &Shared, written: &Receiver<Written>) {
    crate::backend::perf_counters_off();
    let mut pending = Vec::new();
    while let Ok(first) = written.recv() {
        pending.push(first);
        while let Ok(more) = written.try_recv() {
            pending.push(more);
        }
        let last_seq = pending.iter().map(|w| w.last_seq).max().unwrap_or(0);
        let (result, took) = match shared.stopped() {
            Some(stopped) => (Err(stopped), Duration::ZERO),
            None => timed_sync(backend, last_seq),
        };
        let batches = pending.len() as u64;
        // No longer waiting for a sync (counted down before the callers hear of it).
        let appends = pending.iter().map(|w| w.acks.len() as u64).sum();
        shared
            .in_flight_appends
            .fetch_sub(appends, Ordering::AcqRel);
        let final_failure = backend.sync_failure_is_final();
        settle(
            shared,
            std::mem::take(&mut pending),
            result,
            took,
            final_failure,
        );
        shared.in_flight.fetch_sub(batches, Ordering::AcqRel);
    }
}

/// Publishes and acknowledges `batches` after their sync gave `result`. A failed sync stops
/// the journal when `final_failure` ([`Backend::sync_failure_is_final`]); else it fails the
/// batches' appends with the sync's error (their outcome unknown, as after a failed write),
/// and the journal goes on.
pub(super) fn settle(
    shared: &Shared,
    batches: Vec<Written>,
    result: Result<()>,
    took: Duration,
    final_failure: bool,
) {
    if let Some(observer) = shared.observer() {
        observer.synced(&Synced {
            batches: batches.len(),
            sync: took,
            ok: result.is_ok(),
        });
    }
    match result {
        Ok(()) => {
            if let Some(last) = batches.iter().map(|w| w.last_seq).max() {
                shared.publish(last);
            }
            if let Some(message) = crate::failpoints::hit(crate::failpoints::AFTER_WRITE) {
                // Durable, but the callers hear of a failure: an ambiguous outcome.
                for batch in batches {
                    fail(batch.acks, || Error::storage(message.clone()));
                }
                return;
            }
            acknowledge(shared, batches);
        }
        Err(e) if !final_failure && !matches!(e, Error::Stopped(_)) => {
            tracing::error!(error = %e, "journal sync failed: its appends' outcome is unknown");
            let storage = match e {
                Error::Storage(storage) => storage,
                e => StorageError::new(e.to_string()),
            };
            for batch in batches {
                fail(batch.acks, || Error::Storage(storage.clone()));
            }
        }
        Err(e) => {
            let why = match e {
                Error::Stopped(why) => why,
                other => {
                    tracing::error!(error = %other, "journal sync failed: the journal stops");
                    format!("a sync failed: {other}")
                }
            };
            let _ = shared.stopped.set(why);
            let why = shared.stopped.get().cloned().unwrap_or_default();
            for batch in batches {
                fail(batch.acks, || Error::Stopped(why.clone()));
            }
        }
    }
}

/// Sends every caller of `batches` its outcome, durable now. The callers awaiting it on a
/// multi-threaded runtime other than this thread's (the syncer's, or a caller's that wrote
/// inline on another runtime) are acknowledged from one task spawned on that runtime for all
/// of them here: a wake-up sent from within a runtime puts the woken task in the worker's own
/// queue, where one sent from outside takes the runtime's shared queue's lock and often a
/// system call to unpark a worker (~0.85 µs a caller, on the syncer's way from one sync to
/// the next). Blocking callers, callers on this thread's runtime, and a runtime's lone caller
/// (whose wake-up the task would only precede) are acknowledged here.
pub(super) fn acknowledge(shared: &Shared, batches: Vec<Written>) {
    let observer = shared.observer.get();
    let here = Handle::try_current().ok().map(|handle| handle.id());
    let mut elsewhere: Vec<(Handle, Vec<Ack>)> = Vec::new();
    // Sized once: grown ack by ack, a runtime's list was reallocated a dozen times a sync.
    let callers = batches.iter().map(|batch| batch.acks.len()).sum();
    for batch in batches {
        for mut ack in batch.acks {
            match ack.to.runtime.take() {
                Some(runtime) if Some(runtime.id()) != here => {
                    let id = runtime.id();
                    if let Some((_, acks)) =
                        elsewhere.iter_mut().find(|(handle, _)| handle.id() == id)
                    {
                        acks.push(ack);
                    } else {
                        let mut acks = Vec::with_capacity(callers);
                        acks.push(ack);
                        elsewhere.push((runtime, acks));
                    }
                }
                _ => ack.send(observer.map(AsRef::as_ref)),
            }
        }
    }
    for (runtime, mut acks) in elsewhere {
        if acks.len() == 1 {
            // One foreign wake-up either way: the caller's own, without a task between.
            if let Some(ack) = acks.pop() {
                ack.send(observer.map(AsRef::as_ref));
            }
            continue;
        }
        let observer = observer.cloned();
        // On a runtime shut down meanwhile the task is dropped unrun, and with it the
        // replies: its callers, cancelled with it, hear nothing.
        drop(runtime.spawn(async move {
            for ack in acks {
                ack.send(observer.as_deref());
            }
        }));
    }
}

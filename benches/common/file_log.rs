//! The machine's closed-loop bound, measured without RocksDB, on a plain file in the file
//! system the journals are in.
//!
//! [`batches`] is the open-loop stream: one thread writing and syncing batches of as many
//! records as there are writers, back to back, as the raw synced-batch columns do.
//! [`group_commit`] is the simplest closed-loop group commit over one log: writers that each
//! queue a record and wait for its acknowledgement, one thread writing everything queued in
//! one `write`, one syncing everything written in one `fdatasync` and then waking its writers
//! — no framing, no index, no memtable, nothing a journal adds. The ratio of the two is the
//! share of an open-loop batch stream that so many closed-loop writers reach on this machine
//! when writing costs next to nothing.

use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Records per second of synced batches of `batch` records of `record_bytes` each, written to
/// a fresh plain file from one thread for `secs`: one `write` and one `fdatasync` a batch.
pub fn batches(batch: usize, record_bytes: usize, secs: f64) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let mut file = std::fs::File::create(dir.path().join("log")).unwrap();
    let bytes = vec![7u8; record_bytes * batch];
    let start = Instant::now();
    let mut records = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        file.write_all(&bytes).unwrap();
        file.sync_data().unwrap();
        records += batch as u64;
    }
    records as f64 / start.elapsed().as_secs_f64()
}

/// What the group commit's writers, its writing thread and its syncing threads share.
#[derive(Default)]
struct Log {
    state: Mutex<State>,
    /// Signalled when the queue turns non-empty, and at the end.
    queued: Condvar,
    /// Signalled when a batch has been written, and at the end.
    written: Condvar,
}

#[derive(Default)]
struct State {
    /// The acknowledgements of the records queued and not yet written.
    queue: Vec<tokio::sync::oneshot::Sender<()>>,
    /// The acknowledgements of the records written and not yet being synced.
    written: Vec<tokio::sync::oneshot::Sender<()>>,
    stop: bool,
}

/// How [`group_commit`] runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Shape {
    /// How many syncs may run at once: one (zero counts as one), as RocksDB's log allows;
    /// more let syncs overlap.
    pub syncers: usize,
    /// How long a syncer that finds fewer records written than its last sync woke may wait
    /// for them, so that one sync can cover every writer instead of the writers splitting
    /// into cohorts. Zero: no wait.
    pub linger: Duration,
    /// CPU time the writing thread spends per record after its `write` (a busy loop),
    /// standing for what a journal's writer adds on the way of each record: framing, index
    /// entries, memtable inserts. Zero: none.
    pub work_per_record: Duration,
}

/// Acknowledged records per second of `writers` closed-loop writers over a fresh plain file
/// for `secs`. The writers are tokio tasks on a two-thread runtime (as the journal bench's
/// dtask column and the engine have them); each queues one record of `record_bytes` and waits
/// for its acknowledgement. One thread writes everything queued in one `write`; a syncing
/// thread takes everything written since the last sync began, syncs it in one `fdatasync`
/// and wakes its writers. `shape` varies this (see [`Shape`]).
pub fn group_commit(writers: usize, record_bytes: usize, secs: f64, shape: Shape) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let file = Arc::new(std::fs::File::create(dir.path().join("log")).unwrap());
    let log = Arc::new(Log::default());
    let writer = spawn_writer(
        Arc::clone(&log),
        Arc::clone(&file),
        record_bytes,
        shape.work_per_record,
    );
    let syncing: Vec<_> = (0..shape.syncers.max(1))
        .map(|_| spawn_syncer(Arc::clone(&log), Arc::clone(&file), shape.linger))
        .collect();
    let rate = super::closed_loop(
        writers,
        secs,
        |_, stop, done| {
            let log = Arc::clone(&log);
            async move {
                while !stop.load(Ordering::Relaxed) {
                    let (ack, acked) = tokio::sync::oneshot::channel();
                    let first = {
                        let mut state = log.state.lock().unwrap();
                        state.queue.push(ack);
                        state.queue.len() == 1
                    };
                    if first {
                        log.queued.notify_one();
                    }
                    if acked.await.is_err() {
                        return;
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        },
        || {
            // Dropping the acknowledgements still queued or written ends their writers.
            let mut state = log.state.lock().unwrap();
            state.stop = true;
            state.queue.clear();
            state.written.clear();
            drop(state);
            log.queued.notify_all();
            log.written.notify_all();
        },
    );
    writer.join().unwrap();
    for syncer in syncing {
        syncer.join().unwrap();
    }
    rate
}

/// The writing thread: everything queued, in one `write` a batch, then `work_per_record` of
/// CPU for each record in it.
fn spawn_writer(
    log: Arc<Log>,
    file: Arc<std::fs::File>,
    record_bytes: usize,
    work_per_record: Duration,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        loop {
            let mut state = log.state.lock().unwrap();
            while state.queue.is_empty() && !state.stop {
                state = log.queued.wait(state).unwrap();
            }
            if state.stop {
                return;
            }
            let batch = std::mem::take(&mut state.queue);
            drop(state);
            bytes.clear();
            bytes.resize(record_bytes * batch.len(), 7);
            (&*file).write_all(&bytes).unwrap();
            let work = work_per_record * u32::try_from(batch.len()).unwrap_or(u32::MAX);
            let begun = Instant::now();
            while begun.elapsed() < work {
                std::hint::spin_loop();
            }
            let mut state = log.state.lock().unwrap();
            if state.stop {
                return; // dropping the batch's acknowledgements ends its writers
            }
            state.written.extend(batch);
            drop(state);
            log.written.notify_one();
        }
    })
}

/// A syncing thread: everything written since the last sync began, in one `fdatasync`, then
/// its writers woken.
fn spawn_syncer(
    log: Arc<Log>,
    file: Arc<std::fs::File>,
    linger: Duration,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut woken = 0;
        loop {
            let mut state = log.state.lock().unwrap();
            while state.written.is_empty() && !state.stop {
                state = log.written.wait(state).unwrap();
            }
            let deadline = Instant::now() + linger;
            while state.written.len() < woken && !state.stop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                state = log.written.wait_timeout(state, left).unwrap().0;
            }
            if state.stop {
                return;
            }
            let batch = std::mem::take(&mut state.written);
            drop(state);
            woken = batch.len();
            file.sync_data().unwrap();
            for ack in batch {
                let _ = ack.send(());
            }
        }
    })
}

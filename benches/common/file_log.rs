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
//!
//! [`Shape::apply`] models a journal's store behind that log: each batch's records also go
//! into RocksDB (its own log off), either on the writing thread before the sync — the order
//! dtask's writer keeps with RocksDB's log — or on a thread of its own beside the sync, as a
//! journal with a log of its own would apply them. The two bound what that structural change
//! could gain before it is built.

use std::io::Write as _;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
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

/// What the group commit's writers, its writing thread, its syncing threads and its applier
/// share.
#[derive(Default)]
struct Log {
    state: Mutex<State>,
    /// Signalled when the queue turns non-empty, and at the end.
    queued: Condvar,
    /// Signalled when a batch has been written, and at the end.
    written: Condvar,
    /// Signalled when a batch awaits its apply, and at the end.
    to_apply: Condvar,
    /// What the writing and syncing threads did ([`Shape::breakdown`]).
    counts: Counts,
}

/// What a group commit's threads did, counted for [`Shape::breakdown`].
#[derive(Default)]
struct Counts {
    /// Batches written.
    batches: AtomicU64,
    /// Records in them.
    records: AtomicU64,
    /// Syncs.
    syncs: AtomicU64,
    /// Time spent in them.
    sync_nanos: AtomicU64,
    /// Records the syncs made durable.
    synced: AtomicU64,
    /// Records acknowledged.
    acks: AtomicU64,
    /// Their latencies from queued to acknowledged, summed.
    ack_nanos: AtomicU64,
}

impl Counts {
    /// One line over `secs` of `writers`, as dtask's `--breakdown` prints its own: per
    /// second, batches and syncs; per batch, records; per sync, the mean sync and the records
    /// it covered; per record, the mean latency and the way back (see
    /// [`super::way_back_micros`]).
    fn print(&self, apply: Apply, secs: f64, writers: usize) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let batches = get(&self.batches).max(1.0);
        let syncs = get(&self.syncs).max(1.0);
        let acks = get(&self.acks).max(1.0);
        let ack = get(&self.ack_nanos) / acks / 1e3;
        println!(
            "         {apply:?}: batches/s {:.0} | records/batch {:.1} | syncs/s {:.0} | sync {:.1} us | records/sync {:.1} | ack {ack:.1} us | way back {:.1} us",
            batches / secs,
            get(&self.records) / batches,
            syncs / secs,
            get(&self.sync_nanos) / syncs / 1e3,
            get(&self.synced) / syncs,
            super::way_back_micros(writers, acks / secs, ack),
        );
    }
}

#[derive(Default)]
struct State {
    /// The records queued and not yet written.
    queue: Vec<Queued>,
    /// The batches written and not yet being synced.
    written: Vec<Arc<Batch>>,
    /// The batches written and not yet being applied ([`Apply::Beside`] only).
    to_apply: Vec<Arc<Batch>>,
    stop: bool,
}

/// One writer's record, queued.
struct Queued {
    /// The writer (its records' task).
    writer: usize,
    /// The record's position in that writer's stream.
    position: u64,
    ack: tokio::sync::oneshot::Sender<()>,
    /// When it was queued.
    at: Instant,
}

/// A batch written to the file: its records, and their acknowledgements, sent once every
/// stage still owed (the sync, and the apply when it runs beside the sync) is done.
struct Batch {
    /// Stages still owed.
    left: AtomicU8,
    /// The first record's sequence (the commit index's key).
    first_seq: u64,
    /// Each record's writer and position.
    records: Vec<(usize, u64)>,
    /// Each record's acknowledgement, with when it was queued.
    acks: Mutex<Vec<(tokio::sync::oneshot::Sender<()>, Instant)>>,
}

impl Batch {
    /// One stage done; the last one acknowledges the batch's writers, counting each
    /// record's latency into `counts`.
    fn stage_done(&self, counts: &Counts) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            for (ack, at) in self.acks.lock().unwrap().drain(..) {
                counts.acks.fetch_add(1, Ordering::Relaxed);
                counts.ack_nanos.fetch_add(
                    u64::try_from(at.elapsed().as_nanos()).unwrap_or(u64::MAX),
                    Ordering::Relaxed,
                );
                let _ = ack.send(());
            }
        }
    }
}

/// Where [`group_commit`] also writes its records to RocksDB (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Apply {
    /// Nowhere: the plain file alone.
    #[default]
    None,
    /// On the writing thread, after the file's `write` and before the batch is handed to the
    /// sync: RocksDB's work on the loop's way, as in dtask's writer today.
    Before,
    /// On a thread of its own, beside the sync; a record is acknowledged once both are done.
    Beside,
    /// Instead of the file: the writing thread writes each batch to RocksDB with RocksDB's
    /// own log on, unsynced, and the syncer syncs that log (`FlushWAL(true)`) — dtask's
    /// write path without its framing, indexes and API.
    Wal,
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
    /// Whether and where each batch's records also go into RocksDB: a put of the record under
    /// its writer's task and position, and a commit-index put under its sequence, as a
    /// journal's batch writes them, in one `WriteBatch` with RocksDB's log off.
    pub apply: Apply,
    /// Print what the writing and syncing threads did, as dtask's `--breakdown` does: how
    /// many records each batch and each sync covered, and how long a sync took.
    pub breakdown: bool,
}

/// The RocksDB a model's batches are applied to, and the ops of one apply.
struct Store {
    db: rocksdb::DB,
    value: Vec<u8>,
}

impl Store {
    fn open(dir: &std::path::Path, record_bytes: usize) -> Self {
        // One memtable insertion hint per writer's task, as the journal keeps one per task:
        // the model's event keys are the task's 9 bytes and a position, and its commit keys
        // (8 bytes) lie outside the extractor's domain.
        let mut opts = rocksdb::Options::default()
            .get_options_from_string(
                "memtable_insert_with_hint_prefix_extractor=rocksdb.FixedPrefix.9",
            )
            .unwrap();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        // The journal's layout (`journal/src/backend.rs`: `db_options`, `space_options`,
        // `events_table_options`), so that RocksDB's background work compares: recent levels
        // uncompressed and the last LZ4 — the records' space uncompressed on every level, as
        // the journal keeps it while finished streams are kept apart (the default) —, the
        // write-ahead log capped at 64 MiB (which flushes the commit index with the records),
        // two background jobs, 64 MiB memtables, and the records' table options. Until
        // 2026-12-04 this model compressed every level with LZ4 and had RocksDB's default
        // table options: its records (one byte repeated) flushed and compacted to next to
        // nothing, and its background threads cost a third of the journal's per record.
        opts.set_compression_type(rocksdb::DBCompressionType::None);
        opts.set_bottommost_compression_type(rocksdb::DBCompressionType::Lz4);
        opts.set_max_total_wal_size(64 << 20);
        opts.increase_parallelism(2);
        opts.set_max_background_jobs(2);
        opts.set_write_buffer_size(64 << 20);
        opts.set_use_direct_io_for_flush_and_compaction(super::direct_io());
        let mut events = opts.clone();
        events.set_bottommost_compression_type(rocksdb::DBCompressionType::None);
        let mut table = rocksdb::BlockBasedOptions::default();
        table.set_block_size(32 << 10);
        table.set_bloom_filter(10.0, false);
        table.set_partition_filters(true);
        table.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
        table.set_cache_index_and_filter_blocks(true);
        table.set_pin_top_level_index_and_filter(true);
        events.set_block_based_table_factory(&table);
        let db = rocksdb::DB::open_cf_descriptors(
            &opts,
            dir,
            [
                rocksdb::ColumnFamilyDescriptor::new("events", events),
                rocksdb::ColumnFamilyDescriptor::new("commits", opts.clone()),
            ],
        )
        .unwrap();
        Self {
            db,
            value: vec![7u8; record_bytes],
        }
    }

    /// Writes `batches`' records in one `WriteBatch`, unsynced, RocksDB's log on when `wal`.
    fn apply(&self, batches: &[Arc<Batch>], wal: bool) {
        let events = self.db.cf_handle("events").unwrap();
        let commits = self.db.cf_handle("commits").unwrap();
        let mut wb = rocksdb::WriteBatch::default();
        let mut key = Vec::with_capacity(32);
        for batch in batches {
            for (i, &(writer, position)) in batch.records.iter().enumerate() {
                key.clear();
                write!(key, "task-{writer:04}").unwrap();
                key.extend_from_slice(&position.to_be_bytes());
                wb.put_cf(&events, &key, &self.value);
                wb.put_cf(&commits, (batch.first_seq + i as u64).to_be_bytes(), &key);
            }
        }
        let mut wo = rocksdb::WriteOptions::default();
        wo.disable_wal(!wal);
        self.db.write_opt(wb, &wo).unwrap();
    }
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
    let store = (shape.apply != Apply::None)
        .then(|| Arc::new(Store::open(&dir.path().join("store"), record_bytes)));
    let log = Arc::new(Log::default());
    let writer = spawn_writer(
        Arc::clone(&log),
        Arc::clone(&file),
        record_bytes,
        shape,
        store
            .clone()
            .filter(|_| matches!(shape.apply, Apply::Before | Apply::Wal)),
    );
    let syncing: Vec<_> = (0..shape.syncers.max(1))
        .map(|_| {
            let target = match &store {
                Some(store) if shape.apply == Apply::Wal => SyncTarget::Wal(Arc::clone(store)),
                _ => SyncTarget::File(Arc::clone(&file)),
            };
            spawn_syncer(Arc::clone(&log), target, shape.linger)
        })
        .collect();
    let applier = store
        .filter(|_| shape.apply == Apply::Beside)
        .map(|store| spawn_applier(Arc::clone(&log), store));
    // With the breakdown, each thread's CPU time from here to the stop.
    let threads = super::ThreadTimes::start(shape.breakdown);
    let rate = super::closed_loop(
        writers,
        secs,
        |writer, stop, done| {
            let log = Arc::clone(&log);
            async move {
                let mut position = 0;
                while !stop.load(Ordering::Relaxed) {
                    let (ack, acked) = tokio::sync::oneshot::channel();
                    let first = {
                        let mut state = log.state.lock().unwrap();
                        if state.stop {
                            // Stopped between this writer's look at `stop` and here: the
                            // writing thread may be gone, and nothing would end this ack.
                            return;
                        }
                        state.queue.push(Queued {
                            writer,
                            position,
                            ack,
                            at: Instant::now(),
                        });
                        state.queue.len() == 1
                    };
                    if first {
                        log.queued.notify_one();
                    }
                    if acked.await.is_err() {
                        return;
                    }
                    position += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        },
        || {
            threads.stop();
            // Dropping the acknowledgements still queued, written or awaiting their apply
            // ends their writers.
            let mut state = log.state.lock().unwrap();
            state.stop = true;
            state.queue.clear();
            state.written.clear();
            state.to_apply.clear();
            drop(state);
            log.queued.notify_all();
            log.written.notify_all();
            log.to_apply.notify_all();
        },
    );
    writer.join().unwrap();
    for syncer in syncing {
        syncer.join().unwrap();
    }
    if let Some(applier) = applier {
        applier.join().unwrap();
    }
    if shape.breakdown {
        log.counts.print(shape.apply, secs, writers);
        if let Some(line) = threads.line(rate * secs) {
            println!(
                "         {:?}: CPU us per record by thread: {line}",
                shape.apply
            );
        }
    }
    rate
}

/// The writing thread: everything queued, in one `write` a batch, then `work_per_record` of
/// CPU for each record in it, then (with [`Apply::Before`]) the batch's apply to `store`.
fn spawn_writer(
    log: Arc<Log>,
    file: Arc<std::fs::File>,
    record_bytes: usize,
    shape: Shape,
    store: Option<Arc<Store>>,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("file-writer".into())
        .spawn(move || {
            let mut bytes = Vec::new();
            let mut seq = 0;
            let stages = if shape.apply == Apply::Beside { 2 } else { 1 };
            loop {
                let Some(mut state) = wait_for(&log, &log.queued, |state| state.queue.is_empty())
                else {
                    return;
                };
                let queued = std::mem::take(&mut state.queue);
                drop(state);
                let mut records = Vec::with_capacity(queued.len());
                let mut acks = Vec::with_capacity(queued.len());
                for Queued {
                    writer,
                    position,
                    ack,
                    at,
                } in queued
                {
                    records.push((writer, position));
                    acks.push((ack, at));
                }
                let batch = Arc::new(Batch {
                    left: AtomicU8::new(stages),
                    first_seq: seq,
                    records,
                    acks: Mutex::new(acks),
                });
                seq += batch.records.len() as u64;
                log.counts.batches.fetch_add(1, Ordering::Relaxed);
                log.counts
                    .records
                    .fetch_add(batch.records.len() as u64, Ordering::Relaxed);
                bytes.clear();
                bytes.resize(record_bytes * batch.records.len(), 7);
                (&*file).write_all(&bytes).unwrap();
                let work =
                    shape.work_per_record * u32::try_from(batch.records.len()).unwrap_or(u32::MAX);
                let begun = Instant::now();
                while begun.elapsed() < work {
                    std::hint::spin_loop();
                }
                if let Some(store) = &store {
                    store.apply(std::slice::from_ref(&batch), shape.apply == Apply::Wal);
                }
                let mut state = log.state.lock().unwrap();
                if state.stop {
                    return; // dropping the batch's acknowledgements ends its writers
                }
                if shape.apply == Apply::Beside {
                    state.to_apply.push(Arc::clone(&batch));
                    log.to_apply.notify_one();
                }
                state.written.push(batch);
                drop(state);
                log.written.notify_one();
            }
        })
        .unwrap()
}

/// The applier ([`Apply::Beside`]): every batch written since its last apply, in one
/// `WriteBatch` to `store`, while the syncer syncs them.
fn spawn_applier(log: Arc<Log>, store: Arc<Store>) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("file-applier".into())
        .spawn(move || loop {
            let Some(mut state) = wait_for(&log, &log.to_apply, |state| state.to_apply.is_empty())
            else {
                return;
            };
            let batches = std::mem::take(&mut state.to_apply);
            drop(state);
            store.apply(&batches, false);
            for batch in &batches {
                batch.stage_done(&log.counts);
            }
        })
        .unwrap()
}

/// A syncing thread: everything written since the last sync began, in one `fdatasync`, then
/// its writers woken.
fn spawn_syncer(
    log: Arc<Log>,
    target: SyncTarget,
    linger: Duration,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("file-syncer".into())
        .spawn(move || {
            let mut woken = 0;
            loop {
                let Some(mut state) =
                    wait_for(&log, &log.written, |state| state.written.is_empty())
                else {
                    return;
                };
                let deadline = Instant::now() + linger;
                while records(&state.written) < woken && !state.stop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    state = log.written.wait_timeout(state, left).unwrap().0;
                }
                if state.stop {
                    return;
                }
                let batches = std::mem::take(&mut state.written);
                drop(state);
                woken = records(&batches);
                let began = Instant::now();
                match &target {
                    SyncTarget::File(file) => file.sync_data().unwrap(),
                    SyncTarget::Wal(store) => store.db.flush_wal(true).unwrap(),
                }
                let counts = &log.counts;
                counts.syncs.fetch_add(1, Ordering::Relaxed);
                counts.sync_nanos.fetch_add(
                    u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX),
                    Ordering::Relaxed,
                );
                counts.synced.fetch_add(woken as u64, Ordering::Relaxed);
                for batch in &batches {
                    batch.stage_done(&log.counts);
                }
            }
        })
        .unwrap()
}

/// What a syncing thread syncs.
enum SyncTarget {
    /// The plain file.
    File(Arc<std::fs::File>),
    /// RocksDB's own log ([`Apply::Wal`]).
    Wal(Arc<Store>),
}

/// The shared state once `empty` says it has something to take, waiting on `signal`
/// meanwhile; `None` once the run stops.
fn wait_for<'a>(
    log: &'a Log,
    signal: &Condvar,
    empty: impl Fn(&State) -> bool,
) -> Option<std::sync::MutexGuard<'a, State>> {
    let mut state = log.state.lock().unwrap();
    while empty(&state) && !state.stop {
        state = signal.wait(state).unwrap();
    }
    (!state.stop).then_some(state)
}

/// How many records `batches` hold.
fn records(batches: &[Arc<Batch>]) -> usize {
    batches.iter().map(|batch| batch.records.len()).sum()
}

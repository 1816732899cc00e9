//! Durable appends per second with `Durability::Sync`, side by side with raw RocksDB doing the
//! same work on the same machine in the same run: one synced put per append, and synced
//! WriteBatches of as many records as there are writers (what a perfect group commit forms),
//! each holding one record of every writer's task (the keys the puts write); and, as a
//! second batch column, the same batches of ascending keys (RocksDB's cheapest insert, which
//! no journal keyed by task makes).
//! dtask is measured with its writers as tokio tasks (how the engine calls it; the ratios use
//! this column) and as OS threads blocking on each append.
//!
//! Two more columns measure the machine without RocksDB (`common::file_log`): **file batch**,
//! a plain file's synced batches of as many records as there are writers from one thread (the
//! open-loop stream the raw batches are), and **file group**, the simplest closed-loop group
//! commit over that file for that many writers (no framing, index or memtable). Their ratio,
//! **file bound**, is the share of an open-loop batch stream that closed-loop writers reach on
//! this machine when writing costs next to nothing.
//!
//! Each cell runs its seven columns in alternating rounds (three by default) and prints the
//! medians and the range of the per-round ratios: the machine's speed swings too much from
//! one minute to the next for one run of each column to compare them.
//!
//! Run: `cargo bench --bench journal_append` (add `-- --secs 3` for longer columns, `-- --rounds 5`
//! for more rounds, `-- --writers 64` for one row, `-- --ours` for dtask's tokio column alone (with
//! `--breakdown`, what its write path did: batches, writes, syncs, appends per sync, latency —
//! with `--model` or `--file` the same of each group commit beside it; `--ours` and
//! `--breakdown` also print each thread's CPU time per append up to the stop, by role — the
//! writing thread, the syncer, a model's applier, the callers (the runtime's workers),
//! RocksDB's flushes and compactions —, and `--ours` the storage work the run left owed:
//! memtables waiting for their flush, level-0 files, compaction bytes),
//! `-- --max-batch 8` to cap dtask's batches at 8 appends, `-- --file` for the two plain-file
//! columns alone, `-- --file-syncers 2` to let the file group commit run two syncs at once,
//! which RocksDB's log cannot, `-- --file-linger 150` to let its syncer wait up to 150 µs for
//! the writers it last woke, `-- --file-work 2000` to have its writing thread spend 2 µs of
//! CPU per record, as a journal's writer does on framing, index and memtable; `-- --model` to
//! run dtask beside the file group commit alone, with its batches applied to RocksDB before
//! the sync, applied beside it, and with RocksDB's own log in place of the file: where dtask's
//! time goes against the machine's limit, and what a log of the journal's own could gain).
#![allow(clippy::unwrap_used, clippy::cast_precision_loss, missing_docs)]

use clap::Parser;
use dtask::journal::{Event, Journal, JournalOptions};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
mod common;
use common::file_log;

const VALUE_BYTES: usize = 200;

/// A writer's `i`-th record: a progress update of [`VALUE_BYTES`] or so.
fn update(i: u64) -> Event {
    common::update(i, VALUE_BYTES - 40)
}

/// `--max-batch N`: [`JournalOptions::max_batch_appends`] for dtask's columns.
static MAX_BATCH: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// `--no-inline`: [`JournalOptions::inline_lone_appends`] off for dtask's columns.
static NO_INLINE: AtomicBool = AtomicBool::new(false);

/// `--buffered`: dtask's columns with `Durability::Buffered` (no sync): CPU-bound, so that
/// appends per second and CPU per append compare builds without the disk's noise.
static BUFFERED: AtomicBool = AtomicBool::new(false);

/// `--breakdown`: what the write path did in dtask's tokio column, told by an observer.
static BREAKDOWN: AtomicBool = AtomicBool::new(false);

/// `--ours`: the storage work dtask's tokio column left owed at its end.
static OWED: AtomicBool = AtomicBool::new(false);

fn journal_options() -> JournalOptions {
    let options =
        common::journal_options().with_inline_lone_appends(!NO_INLINE.load(Ordering::Relaxed));
    let options = if BUFFERED.load(Ordering::Relaxed) {
        options.with_durability(dtask::journal::Durability::Buffered)
    } else {
        options
    };
    match MAX_BATCH.get() {
        Some(&appends) => options.with_max_batch_appends(appends),
        None => options,
    }
}

/// Runs `work(thread, stop)` on `threads` threads for `secs`; returns operations per second.
fn run_threads(
    threads: usize,
    secs: f64,
    work: impl Fn(usize, &AtomicBool, &AtomicU64) + Send + Sync + 'static,
) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let work = Arc::new(work);
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (stop, done, work) = (Arc::clone(&stop), Arc::clone(&done), Arc::clone(&work));
            std::thread::spawn(move || work(t, &stop, &done))
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn dtask_appends(writers: usize, secs: f64) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), journal_options()).unwrap();
    let rate = run_threads(writers, secs, move |t, stop, done| {
        let task = format!("task-{t:04}");
        let mut position = 0;
        while !stop.load(Ordering::Relaxed) {
            journal
                .append(&task, position, &[update(position)])
                .unwrap();
            position += 1;
            done.fetch_add(1, Ordering::Relaxed);
        }
    });
    drop(dir);
    rate
}

/// The same appends from `writers` tokio tasks on a two-thread runtime (how the engine calls
/// the journal).
fn dtask_async_appends(writers: usize, secs: f64) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), journal_options()).unwrap();
    let breakdown = BREAKDOWN.load(Ordering::Relaxed).then(|| {
        let breakdown = Arc::new(common::WriteBreakdown::default());
        journal.observe(Arc::clone(&breakdown) as Arc<dyn dtask::journal::WriteObserver>);
        breakdown
    });
    // `--ours` or `--breakdown`: each thread's CPU time from here to the stop (the journal's
    // and RocksDB's threads are running; the runtime's are born in the loop and count from
    // zero).
    let threads = common::ThreadTimes::start(
        OWED.load(Ordering::Relaxed) || BREAKDOWN.load(Ordering::Relaxed),
    );
    let rate = common::append_loop(&journal, writers, secs, VALUE_BYTES - 40, || threads.stop());
    if let Some(breakdown) = breakdown {
        breakdown.print(secs, writers);
    }
    if let Some(line) = threads.line(rate * secs) {
        println!("         CPU us per append by thread: {line}");
    }
    if OWED.load(Ordering::Relaxed) {
        print_owed(&journal);
    }
    drop(journal);
    drop(dir);
    rate
}

/// What the run left for RocksDB's background threads: a short run's appends/s do not count
/// the flushes and compactions it left owed, which a longer run pays for.
fn print_owed(journal: &Journal) {
    let Ok(Some(stats)) = journal.storage_stats() else {
        return;
    };
    let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
    let (mut memtables, mut waiting, mut level0, mut owed) = (0, 0, 0, 0);
    for space in &stats.spaces {
        memtables += space.memtable_bytes;
        waiting += space.immutable_memtables;
        level0 += space.level0_files;
        owed += space.pending_compaction_bytes;
    }
    println!(
        "         owed at the end: memtables {:.0} MiB ({waiting} waiting for their flush) | level-0 files {level0} | compaction {:.0} MiB | write {} | table files {}",
        mib(memtables),
        mib(owed),
        if stats.write_stopped {
            "stopped".to_owned()
        } else if stats.delayed_write_rate > 0 {
            format!("slowed to {:.0} MiB/s", mib(stats.delayed_write_rate))
        } else {
            "not held back".to_owned()
        },
        if stats.direct_table_io {
            "written with direct I/O"
        } else {
            "through the page cache"
        }
    );
}

fn raw_db(dir: &std::path::Path) -> rocksdb::DB {
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
    // Table files as the journal writes them (`--no-direct-io` turns both off).
    opts.set_use_direct_io_for_flush_and_compaction(common::direct_io());
    rocksdb::DB::open(&opts, dir).unwrap()
}

/// The raw key of writer `t`'s `i`-th record: what the raw puts and the task-keyed raw
/// batches both write.
fn raw_task_key(t: usize, i: u64) -> String {
    format!("task-{t:04}/{i:016}")
}

fn raw_puts(writers: usize, secs: f64) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(raw_db(dir.path()));
    let value = vec![7u8; VALUE_BYTES];
    run_threads(writers, secs, move |t, stop, done| {
        let mut wo = rocksdb::WriteOptions::default();
        wo.set_sync(true);
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let key = raw_task_key(t, i);
            db.put_opt(key, &value, &wo).unwrap();
            i += 1;
            done.fetch_add(1, Ordering::Relaxed);
        }
    })
}

/// The keys of a raw batch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BatchKeys {
    /// The keys the writers' appends write (one record of each writer's task per batch, as
    /// in the raw puts): what a perfect group commit of this workload writes.
    Tasks,
    /// One ascending key after another: RocksDB's cheapest insert, which no journal keyed by
    /// task makes.
    Sequential,
}

fn raw_batches(batch: usize, secs: f64, keys: BatchKeys) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(raw_db(dir.path()));
    let value = vec![7u8; VALUE_BYTES];
    run_threads(1, secs, move |_, stop, done| {
        let mut wo = rocksdb::WriteOptions::default();
        wo.set_sync(true);
        let mut round = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let mut wb = rocksdb::WriteBatch::default();
            for t in 0..batch {
                match keys {
                    BatchKeys::Tasks => wb.put(raw_task_key(t, round), &value),
                    BatchKeys::Sequential => {
                        wb.put(format!("k{:016}", round * batch as u64 + t as u64), &value);
                    }
                }
            }
            round += 1;
            db.write_opt(wb, &wo).unwrap();
            done.fetch_add(batch as u64, Ordering::Relaxed);
        }
    })
}

/// `--file-syncers N`: how many syncs the plain file's group commit may run at once.
static FILE_SYNCERS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
/// `--file-linger US`: how long the plain file's syncer may wait for the writers it last woke.
static FILE_LINGER: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
/// `--file-work NS`: CPU the plain file's writing thread spends per record.
static FILE_WORK: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

/// `--file-apply WHERE`: where the plain file's group commit also applies its batches to
/// RocksDB.
static FILE_APPLY: std::sync::OnceLock<file_log::Apply> = std::sync::OnceLock::new();

/// The plain file's group commit as the flags set it.
fn file_group_commit(writers: usize, secs: f64) -> f64 {
    file_group_commit_applying(writers, secs, FILE_APPLY.get().copied().unwrap_or_default())
}

/// The plain file's group commit as the flags set it, its batches also applied to RocksDB as
/// `apply` says (`--model`).
fn file_group_commit_applying(writers: usize, secs: f64, apply: file_log::Apply) -> f64 {
    let shape = file_log::Shape {
        syncers: FILE_SYNCERS.get().copied().unwrap_or(1),
        linger: FILE_LINGER.get().copied().unwrap_or_default(),
        work_per_record: FILE_WORK.get().copied().unwrap_or_default(),
        apply,
        breakdown: BREAKDOWN.load(Ordering::Relaxed),
    };
    file_log::group_commit(writers, VALUE_BYTES, secs, shape)
}

/// One cell's seven columns over `rounds` rounds, each round running them in a rotated order
/// (so that no column always runs first, after the previous cell's journal was dropped).
#[derive(Default)]
struct Cell {
    ours: Vec<f64>,
    threads: Vec<f64>,
    puts: Vec<f64>,
    batches: Vec<f64>,
    sequential: Vec<f64>,
    file_batches: Vec<f64>,
    file_group: Vec<f64>,
}

fn measure_cell(writers: usize, secs: f64, rounds: usize) -> Cell {
    let mut cell = Cell::default();
    for round in 0..rounds {
        for column in 0..7 {
            match (column + round) % 7 {
                0 => cell.ours.push(dtask_async_appends(writers, secs)),
                1 => cell.threads.push(dtask_appends(writers, secs)),
                2 => cell.puts.push(raw_puts(writers, secs)),
                3 => cell
                    .batches
                    .push(raw_batches(writers, secs, BatchKeys::Tasks)),
                4 => cell
                    .file_batches
                    .push(file_log::batches(writers, VALUE_BYTES, secs)),
                5 => cell.file_group.push(file_group_commit(writers, secs)),
                _ => cell
                    .sequential
                    .push(raw_batches(writers, secs, BatchKeys::Sequential)),
            }
        }
    }
    cell
}

/// Durable appends per second against raw RocksDB and a plain file (see the module docs).
#[derive(Debug, Parser)]
#[allow(clippy::struct_excessive_bools)] // one bool per command-line flag
struct Args {
    /// Seconds per column.
    #[arg(long, default_value_t = 2.0)]
    secs: f64,
    /// Alternating rounds of every column (at least 1).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// One row only, at this many writers (default: 1, 16, 64 and 256).
    #[arg(long)]
    writers: Option<usize>,
    /// Only dtask's tokio column, for profiling.
    #[arg(long)]
    ours: bool,
    /// With `--ours`: what the write path did (batches, writes, syncs, appends per sync,
    /// latency), told by an observer; with `--model` or `--file`, the same of each group
    /// commit (records per batch and per sync, syncs and their length) beside it.
    #[arg(long)]
    breakdown: bool,
    /// Only the two plain-file columns, and their ratio per round.
    #[arg(long)]
    file: bool,
    /// dtask beside the plain file's group commit with its batches applied to RocksDB before
    /// the sync and beside it: what a log of the journal's own could gain.
    #[arg(long)]
    model: bool,
    /// Cap dtask's batches at this many appends.
    #[arg(long, value_name = "APPENDS")]
    max_batch: Option<usize>,
    /// Hand every append to the writer thread, even when the journal is idle.
    #[arg(long)]
    no_inline: bool,
    /// dtask's columns without syncs (`Durability::Buffered`): CPU-bound, for comparing the
    /// CPU cost of two builds (not a durable figure).
    #[arg(long)]
    buffered: bool,
    /// Syncs the plain file's group commit may run at once.
    #[arg(long, value_name = "SYNCERS")]
    file_syncers: Option<usize>,
    /// Microseconds the plain file's syncer waits for the writers it last woke.
    #[arg(long, value_name = "MICROS")]
    file_linger: Option<u64>,
    /// Nanoseconds of CPU the plain file's writing thread spends per record.
    #[arg(long, value_name = "NANOS")]
    file_work: Option<u64>,
    /// Where the plain file's group commit also writes each batch to RocksDB (its log off):
    /// `before` the sync on the writing thread, `beside` it on a thread of its own, or `wal`:
    /// RocksDB's own log in place of the file.
    #[arg(long, value_name = "WHERE")]
    file_apply: Option<FileApply>,
    #[command(flatten)]
    journal: common::JournalFlags,
    #[command(flatten)]
    _cargo: common::CargoBench,
}

/// The values of `--file-apply`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum FileApply {
    /// On the writing thread, before the sync.
    Before,
    /// On a thread of its own, beside the sync.
    Beside,
    /// RocksDB's own log in place of the file.
    Wal,
}

fn main() {
    let args = Args::parse();
    args.journal.apply();
    let secs = args.secs;
    let rounds = args.rounds.max(1);
    NO_INLINE.store(args.no_inline, Ordering::Relaxed);
    BUFFERED.store(args.buffered, Ordering::Relaxed);
    BREAKDOWN.store(args.breakdown, Ordering::Relaxed);
    if let Some(appends) = args.max_batch {
        MAX_BATCH.set(appends).unwrap();
    }
    if let Some(syncers) = args.file_syncers {
        FILE_SYNCERS.set(syncers).unwrap();
    }
    if let Some(micros) = args.file_linger {
        FILE_LINGER.set(Duration::from_micros(micros)).unwrap();
    }
    if let Some(nanos) = args.file_work {
        FILE_WORK.set(Duration::from_nanos(nanos)).unwrap();
    }
    if let Some(apply) = args.file_apply {
        FILE_APPLY
            .set(match apply {
                FileApply::Before => file_log::Apply::Before,
                FileApply::Beside => file_log::Apply::Beside,
                FileApply::Wal => file_log::Apply::Wal,
            })
            .unwrap();
    }
    let cells = args
        .writers
        .map_or_else(|| vec![1usize, 16, 64, 256], |w| vec![w]);
    // `--file`: only the two plain-file columns, alternating, and their ratio per round.
    if args.file {
        for writers in cells {
            for _ in 0..rounds {
                let batches = file_log::batches(writers, VALUE_BYTES, secs);
                let group = file_group_commit(writers, secs);
                println!(
                    "{writers:>8} | file batch {batches:>9.0} | file group {group:>9.0} | {:.2}x",
                    group / batches
                );
            }
        }
        return;
    }
    if args.model {
        for writers in cells {
            model(writers, secs, rounds);
        }
        return;
    }
    // `--ours`: only dtask's tokio column, for profiling.
    if args.ours {
        OWED.store(true, Ordering::Relaxed);
        for writers in cells {
            let (ours, cpu) = common::with_cpu(secs, || dtask_async_appends(writers, secs));
            match cpu {
                Some(cpu) => println!("{writers:>8} | {ours:>13.0} | CPU {cpu:.1} us per append"),
                None => println!("{writers:>8} | {ours:>13.0}"),
            }
        }
        return;
    }
    table(&cells, secs, rounds);
}

/// `--model`: dtask and four shapes of the plain file's group commit in alternating rounds —
/// the file alone; its batches applied to RocksDB (its log off) on the writing thread before
/// the sync, the order dtask's writer keeps; applied on a thread of their own beside the sync,
/// as a log of the journal's own would; and RocksDB's own log in place of the file (written
/// by the writing thread, synced by the syncer: dtask's write path without its framing,
/// indexes and API) — with the medians of each round's ratios to the file alone.
fn model(writers: usize, secs: f64, rounds: usize) {
    use file_log::Apply;
    println!(
        "{writers} writers, {secs} s per column: dtask | file group | apply before the sync | apply beside it | RocksDB's log"
    );
    let mut columns: [Vec<f64>; 5] = Default::default();
    let mut cpu: [Vec<f64>; 5] = Default::default();
    for round in 0..rounds {
        for column in 0..5 {
            let i = (column + round) % 5;
            let (rate, cpu_per_op) = common::with_cpu(secs, || match i {
                0 => dtask_async_appends(writers, secs),
                1 => file_group_commit(writers, secs),
                2 => file_group_commit_applying(writers, secs, Apply::Before),
                3 => file_group_commit_applying(writers, secs, Apply::Beside),
                _ => file_group_commit_applying(writers, secs, Apply::Wal),
            });
            columns[i].push(rate);
            cpu[i].extend(cpu_per_op);
        }
        let [ours, file, before, beside, wal] = columns.each_ref().map(|c| c[round]);
        println!(
            "  round {round}: {ours:>9.0} | {file:>9.0} | {before:>9.0} | {beside:>9.0} | {wal:>9.0}"
        );
    }
    if cpu.iter().all(|c| !c.is_empty()) {
        let [ours, file, before, beside, wal] =
            cpu.each_ref().map(|c| common::Spread::of(c).median);
        println!(
            "  CPU us per record (process, all threads, medians): {ours:>5.1} | {file:>5.1} | {before:>5.1} | {beside:>5.1} | {wal:>5.1}"
        );
    }
    let [ours, file, before, beside, wal] = &columns;
    let median = |c: &[f64]| common::Spread::of(c).median;
    println!(
        "  medians: {:>9.0} | {:>9.0} | {:>9.0} | {:>9.0} | {:>9.0}",
        median(ours),
        median(file),
        median(before),
        median(beside),
        median(wal),
    );
    println!(
        "  against the file group: dtask {}, apply before {}, apply beside {}, RocksDB's log {}; beside against before {}; dtask against RocksDB's log {}",
        common::Spread::of_ratios(ours, file).ratio(),
        common::Spread::of_ratios(before, file).ratio(),
        common::Spread::of_ratios(beside, file).ratio(),
        common::Spread::of_ratios(wal, file).ratio(),
        common::Spread::of_ratios(beside, before).ratio(),
        common::Spread::of_ratios(ours, wal).ratio(),
    );
}

/// The medians a cell of 64 writers or more is judged on.
struct Targets {
    writers: usize,
    vs_put: f64,
    vs_batch: f64,
    vs_sequential: f64,
    /// The plain file's group commit against its own synced batches.
    file_bound: f64,
    /// The plain file's group commit against the raw synced puts.
    file_group_vs_put: f64,
    /// dtask against the plain file's group commit: the closed-loop limit.
    vs_file_group: f64,
}

impl Targets {
    fn print(&self) {
        let Self {
            writers,
            vs_put,
            vs_batch,
            vs_sequential,
            file_bound,
            file_group_vs_put,
            vs_file_group,
        } = self;
        println!(
            "target at {writers} writers: >= 0.9x the plain-file group commit {} ({vs_file_group:.2}x)",
            common::verdict(*vs_file_group >= 0.9),
        );
        if *writers == 64 {
            println!(
                "target at {writers} writers: >= 3x raw synced puts {} ({vs_put:.2}x)",
                common::verdict(*vs_put >= 3.0),
            );
        }
        // The retired target (0.8x raw synced batches, an open-loop stream), for comparison.
        println!(
            "info at {writers} writers: {vs_batch:.2}x raw synced batches, {vs_sequential:.2}x against ascending keys",
        );
        println!(
            "closed-loop bound at {writers} writers: a plain file's group commit reaches {file_bound:.2}x its own synced batches{} and {file_group_vs_put:.2}x raw synced puts",
            if *file_bound < 0.8 {
                " (below 0.8x without RocksDB)"
            } else {
                ""
            }
        );
    }
}

/// The whole table: every cell's seven columns in alternating rounds, then the target lines.
fn table(cells: &[usize], secs: f64, rounds: usize) {
    println!(
        "durable appends/s, Durability::Sync, {VALUE_BYTES}-byte records, {secs} s per column, \
         {rounds} alternating rounds: medians, and the range of the per-round ratios"
    );
    println!(
        "{:>8} | {:>13} | {:>12} | {:>12} | {:>14} | {:>14} | {:>18} | {:>18} | {:>18} | {:>10} | {:>10} | {:>18} | {:>18}",
        "writers",
        "dtask (tasks)",
        "dtask (thr)",
        "raw sync put",
        "raw batch",
        "raw batch seq",
        "vs put",
        "vs batch",
        "vs batch seq",
        "file batch",
        "file group",
        "file bound",
        "vs file group"
    );
    let mut targets = Vec::new();
    for &writers in cells {
        let cell = measure_cell(writers, secs, rounds);
        let median = |values: &[f64]| common::Spread::of(values).median;
        let vs_put = common::Spread::of_ratios(&cell.ours, &cell.puts);
        let vs_batch = common::Spread::of_ratios(&cell.ours, &cell.batches);
        let vs_sequential = common::Spread::of_ratios(&cell.ours, &cell.sequential);
        let file_bound = common::Spread::of_ratios(&cell.file_group, &cell.file_batches);
        let vs_file_group = common::Spread::of_ratios(&cell.ours, &cell.file_group);
        println!(
            "{writers:>8} | {:>13.0} | {:>12.0} | {:>12.0} | {:>14.0} | {:>14.0} | {:>18} | {:>18} | {:>18} | {:>10.0} | {:>10.0} | {:>18} | {:>18}",
            median(&cell.ours),
            median(&cell.threads),
            median(&cell.puts),
            median(&cell.batches),
            median(&cell.sequential),
            vs_put.ratio(),
            vs_batch.ratio(),
            vs_sequential.ratio(),
            median(&cell.file_batches),
            median(&cell.file_group),
            file_bound.ratio(),
            vs_file_group.ratio()
        );
        if writers >= 64 {
            targets.push(Targets {
                writers,
                vs_put: vs_put.median,
                vs_batch: vs_batch.median,
                vs_sequential: vs_sequential.median,
                file_bound: file_bound.median,
                file_group_vs_put: common::Spread::of_ratios(&cell.file_group, &cell.puts).median,
                vs_file_group: vs_file_group.median,
            });
        }
    }
    println!(
        "(raw batch: one record of each writer's task per batch, the keys the raw puts write; \
         raw batch seq: ascending keys, RocksDB's cheapest insert; file batch / file group: a \
         plain file's synced batches and the simplest closed-loop group commit over it, no \
         RocksDB; file bound: their ratio, the share of an open-loop batch stream that closed-loop \
         writers reach on this machine when writing costs next to nothing; vs file group: dtask \
         against that group commit)"
    );
    for target in &targets {
        target.print();
    }
}

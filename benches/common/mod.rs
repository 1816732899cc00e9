//! Journals the benches build as input.
#![allow(dead_code, reason = "each bench uses a part of these helpers")]

pub mod file_log;

use dtask::journal::{
    Durability, Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp,
};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sums of what a journal's write path told its observer: batches and their appends, write
/// and sync times, acknowledgement latencies (`journal_append -- --breakdown`, the batch
/// sizes of `postgres`).
#[derive(Debug, Default)]
pub struct WriteBreakdown {
    batches: AtomicU64,
    appends: AtomicU64,
    write_nanos: AtomicU64,
    syncs: AtomicU64,
    sync_nanos: AtomicU64,
    acks: AtomicU64,
    ack_nanos: AtomicU64,
}

/// `d` in nanoseconds, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl dtask::journal::WriteObserver for WriteBreakdown {
    fn batch_written(&self, batch: &dtask::journal::observe::BatchWritten) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.appends
            .fetch_add(batch.appends as u64, Ordering::Relaxed);
        self.write_nanos
            .fetch_add(nanos(batch.write), Ordering::Relaxed);
    }

    fn synced(&self, sync: &dtask::journal::observe::Synced) {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.sync_nanos
            .fetch_add(nanos(sync.sync), Ordering::Relaxed);
    }

    fn acknowledged(&self, latency: Duration) {
        self.acks.fetch_add(1, Ordering::Relaxed);
        self.ack_nanos.fetch_add(nanos(latency), Ordering::Relaxed);
    }
}

impl WriteBreakdown {
    /// Batches written so far.
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// Appends in those batches.
    pub fn appends(&self) -> u64 {
        self.appends.load(Ordering::Relaxed)
    }

    /// One line over `secs` of `writers`: per second, batches and syncs; per batch, appends
    /// and the mean write; per sync, the mean sync and the appends it acknowledged; per
    /// append, the mean latency and the way back ([`way_back_micros`]).
    pub fn print(&self, secs: f64, writers: usize) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let batches = get(&self.batches).max(1.0);
        let syncs = get(&self.syncs).max(1.0);
        let acks = get(&self.acks).max(1.0);
        println!(
            "         batches/s {:.0} | appends/batch {:.1} | write {:.1} us | syncs/s {:.0} | sync {:.1} us | appends/sync {:.1} | ack {:.1} us | way back {:.1} us",
            batches / secs,
            get(&self.appends) / batches,
            get(&self.write_nanos) / batches / 1e3,
            syncs / secs,
            get(&self.sync_nanos) / syncs / 1e3,
            get(&self.acks) / syncs,
            get(&self.ack_nanos) / acks / 1e3,
            way_back_micros(writers, acks / secs, get(&self.ack_nanos) / acks / 1e3),
        );
    }
}

/// The way back of a closed loop of `writers` at `rate` acknowledgements a second whose mean
/// latency from submission to acknowledgement is `ack_micros`, in µs: each writer's cycle
/// (`writers / rate`) less that latency — the time from one acknowledgement to the next
/// submission, the caller's own work and its wake-up.
pub fn way_back_micros(writers: usize, rate: f64, ack_micros: f64) -> f64 {
    writers as f64 / rate.max(1.0) * 1e6 - ack_micros
}

/// The stream of one sample task: created, claimed, started marker, updates, and (when
/// `terminal`) completed — `events` records in all.
pub fn task_events(id: &str, events: usize, terminal: bool) -> Vec<Event> {
    let at = Timestamp(1_764_000_000_000);
    let mut stream = vec![
        Event::Created {
            spec: TaskSpec {
                id: id.into(),
                executor_key: "bench".into(),
                kind: "background_tool".into(),
                payload: br#"{"version":1,"tool_name":"shell","arguments":"{}"}"#.to_vec(),
                ..TaskSpec::default()
            }
            .into(),
            policy: LeasePolicy::Retry,
            checkpoint: vec![],
            context_snapshot: vec![],
            at,
        },
        Event::AttemptStarted {
            attempt: 1,
            lease_deadline: Timestamp(u64::MAX / 2),
            at,
        },
        Event::StartCommitted {
            checkpoint: b"{\"started\":true}".to_vec(),
            at,
        },
    ];
    let updates = events.saturating_sub(stream.len() + usize::from(terminal));
    for u in 0..updates {
        stream.push(Event::UpdateAppended {
            attempt: 1,
            event_id: format!("u{u}"),
            kind: "progress".into(),
            data: b"step".to_vec(),
            metadata: vec![],
            at,
        });
    }
    if terminal {
        stream.push(Event::Completed {
            data: b"ok".to_vec(),
            at,
        });
    }
    stream
}

/// Writes `tasks` sample tasks of `events_per_task` records (half of them terminal, laid out
/// as `finished` says) into a new journal at `dir`, from four threads, and closes it (the
/// journal's default options: finished streams kept apart).
pub fn build_journal(dir: &Path, tasks: usize, events_per_task: usize, finished: Finished) {
    fill_journal_with(dir, tasks, events_per_task, finished, true);
}

/// [`build_journal`] with finished streams left among the live ones
/// (`JournalOptions::keep_finished_apart` off).
pub fn build_journal_in_place(
    dir: &Path,
    tasks: usize,
    events_per_task: usize,
    finished: Finished,
) {
    fill_journal_with(dir, tasks, events_per_task, finished, false);
}

/// Which of the sample tasks are finished.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// Every other task (in id order): between two live tasks lie a finished one's records,
    /// which a recovery steps over. The worst case, and the default.
    Interleaved,
    /// The first half (in id order): tasks finish about in the order they were created, and
    /// ids that grow with time (such as the `Manager`'s, `UUIDv7`) keep the live ones together.
    OldestHalf,
    /// Every other task, as [`Finished::Interleaved`], but each stream written in two halves
    /// with a restart between: the finished streams' first records are in the table files
    /// when their terminal record moves them to the finished ones, which leaves a deletion
    /// of each in the live records until a compaction drops it with its record.
    Later,
}

/// [`build_journal`] (or, not `apart`, [`build_journal_in_place`]) without closing: the journal is
/// returned open (dropping it closes it; aborting the process instead leaves what a crash
/// leaves).
pub fn fill_journal(dir: &Path, tasks: usize, events_per_task: usize, apart: bool) -> Journal {
    fill_journal_with(dir, tasks, events_per_task, Finished::Interleaved, apart)
}

fn fill_journal_with(
    dir: &Path,
    tasks: usize,
    events_per_task: usize,
    finished: Finished,
    apart: bool,
) -> Journal {
    let open = || {
        Journal::open(
            dir,
            journal_options()
                .with_durability(Durability::Buffered)
                .with_keep_finished_apart(apart),
        )
        .expect("open the bench journal")
    };
    // Which part of each stream each pass writes: the whole stream, or its halves in two
    // passes with a restart between.
    let passes: &[(bool, bool)] = match finished {
        Finished::Interleaved | Finished::OldestHalf => &[(true, true)],
        Finished::Later => &[(true, false), (false, true)],
    };
    let mut journal = None;
    for &(first_half, second_half) in passes {
        drop(journal.take());
        let opened = open();
        let threads: Vec<_> = (0..4)
            .map(|part| {
                let journal = opened.clone();
                std::thread::spawn(move || {
                    for t in (part..tasks).step_by(4) {
                        let id = format!("task-{t:07}");
                        let terminal = match finished {
                            Finished::Interleaved | Finished::Later => t % 2 == 0,
                            Finished::OldestHalf => t < tasks / 2,
                        };
                        let events = task_events(&id, events_per_task, terminal);
                        let half = events.len() / 2;
                        let (from, to) = (
                            if first_half { 0 } else { half },
                            if second_half { events.len() } else { half },
                        );
                        journal
                            .append(&id, from as u64, &events[from..to])
                            .expect("append");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("builder thread");
        }
        journal = Some(opened);
    }
    journal.expect("one pass at least")
}

/// The `i`-th progress update of a bench's writer, with `data_bytes` bytes of data.
pub fn update(i: u64, data_bytes: usize) -> Event {
    Event::UpdateAppended {
        attempt: 1,
        event_id: format!("e{i}"),
        kind: "progress".into(),
        data: vec![7; data_bytes],
        metadata: vec![],
        at: Timestamp(i),
    }
}

/// The journal's durable appends per second of `writers` closed-loop writers (see
/// [`closed_loop`]), each appending one [`update`] of `data_bytes` to a task of its own and
/// awaiting it before the next. `on_stop` as for [`closed_loop`].
pub fn append_loop(
    journal: &Journal,
    writers: usize,
    secs: f64,
    data_bytes: usize,
    on_stop: impl FnOnce(),
) -> f64 {
    closed_loop(
        writers,
        secs,
        |writer, stop, done| {
            let journal = journal.clone();
            async move {
                let task = format!("task-{writer:04}");
                let mut position = 0;
                while !stop.load(Ordering::Relaxed) {
                    journal
                        .append_async(&task, position, &[update(position, data_bytes)])
                        .await
                        .unwrap();
                    position += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        },
        on_stop,
    )
}

/// Runs `writers` closed-loop writers as tokio tasks on a two-thread runtime (as the engine
/// runs on the two cores) for `secs`. Each is `work(writer, stop, done)`: a loop that adds
/// what it completes to `done` until `stop` is set. `on_stop` runs once `stop` is set and
/// before the writers are awaited, to release any still waiting. Returns completions per
/// second up to the stop.
pub fn closed_loop<W, F>(writers: usize, secs: f64, work: W, on_stop: impl FnOnce()) -> f64
where
    W: Fn(usize, Arc<AtomicBool>, Arc<AtomicU64>) -> F,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..writers)
            .map(|writer| tokio::spawn(work(writer, Arc::clone(&stop), Arc::clone(&done))))
            .collect();
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        stop.store(true, Ordering::Relaxed);
        let rate = done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
        on_stop();
        for task in tasks {
            task.await.unwrap();
        }
        rate
    })
}

/// What a bench cell measured over several rounds: the median and the range. The machines
/// the benches run on swing by a factor of two from one minute to the next (the disk's sync
/// latency, the host's CPU), so a cell alternates dtask with its raw baseline round by
/// round and reports the median of the per-round figures, not one run of each.
#[derive(Debug, Clone, Copy)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (at least one).
    pub fn of(values: &[f64]) -> Self {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            f64::midpoint(sorted[n / 2 - 1], sorted[n / 2])
        };
        Self {
            median,
            min: sorted[0],
            max: sorted[n - 1],
        }
    }

    /// The spread of the per-round ratios `ours[i] / base[i]`.
    pub fn of_ratios(ours: &[f64], base: &[f64]) -> Self {
        let ratios: Vec<f64> = ours.iter().zip(base).map(|(o, b)| o / b).collect();
        Self::of(&ratios)
    }

    /// `2.61x (2.20-3.28)`: the median ratio and its range.
    pub fn ratio(&self) -> String {
        format!("{:.2}x ({:.2}-{:.2})", self.median, self.min, self.max)
    }
}

/// The flag `cargo bench` passes to every bench binary, accepted and ignored: flatten it into
/// a bench's arguments.
#[derive(Debug, clap::Args)]
pub struct CargoBench {
    /// Passed by `cargo bench`; ignored.
    #[arg(long = "bench", hide = true)]
    bench: bool,
}

/// `--no-direct-io`: the journal flag the journal and engine benches share. Flatten it into
/// a bench's arguments and call [`JournalFlags::apply`]; [`journal_options`] then honours it.
#[derive(Debug, clap::Args)]
pub struct JournalFlags {
    /// Write the journal's table files through the page cache
    /// (`JournalOptions::direct_table_io` off), to compare with the default.
    #[arg(long)]
    no_direct_io: bool,
}

impl JournalFlags {
    /// Makes the flags the process's.
    pub fn apply(&self) {
        DIRECT_IO.store(!self.no_direct_io, Ordering::Relaxed);
    }
}

/// Not `--no-direct-io`.
static DIRECT_IO: AtomicBool = AtomicBool::new(true);

/// Whether the benches' journals write table files with direct I/O (not `--no-direct-io`):
/// the plain file's models of the write path follow it too.
pub fn direct_io() -> bool {
    DIRECT_IO.load(Ordering::Relaxed)
}

/// The benches' journal options: the defaults, with [`JournalFlags`].
pub fn journal_options() -> JournalOptions {
    JournalOptions::default().with_direct_table_io(direct_io())
}

/// `met` or `not met`, for a target line.
pub fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "not met"
    }
}

/// The CPU time (user and system, all threads) this process has used so far, read from
/// `/proc/self/stat`; `None` where there is no such file.
pub fn process_cpu() -> Option<Duration> {
    stat_cpu(Path::new("/proc/self/stat")).map(|(_, used)| used)
}

/// Each living thread of this process by thread id: its name and the CPU time (user and
/// system) it has used so far, read from `/proc/self/task/*/stat`. Empty where there is no
/// such directory.
pub type ThreadCpu = std::collections::HashMap<u32, (String, Duration)>;

/// A [`ThreadCpu`] snapshot of this process's threads.
pub fn thread_cpu() -> ThreadCpu {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return ThreadCpu::new();
    };
    tasks
        .flatten()
        .filter_map(|task| {
            let tid = task.file_name().to_str()?.parse::<u32>().ok()?;
            // `None` too for a thread that ended meanwhile.
            Some((tid, stat_cpu(&task.path().join("stat"))?))
        })
        .collect()
}

/// The name and the CPU time (user and system) of a `/proc` `stat` file — "pid (name) state
/// …", in clock ticks of 10 ms — of a process or of one of its threads.
fn stat_cpu(path: &Path) -> Option<(String, Duration)> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The name may hold spaces and parentheses: it ends with the last ')'.
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // utime and stime are the stat's 14th and 15th fields: the 12th and 13th after the name.
    let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
    let used = Duration::from_millis((ticks(11)? + ticks(12)?) * 10);
    Some((stat.get(open + 1..close)?.to_owned(), used))
}

/// The CPU time the threads used between two [`thread_cpu`] snapshots, summed by the role
/// their names give them (a thread born after `before` counts from zero; one that ended
/// before `after` is not counted), in µs per operation over `ops` operations, each role that
/// used any: the writing thread (the journal's writer, or the plain file's group commit's),
/// the syncer, the model's applier, the callers (the runtime's workers), RocksDB's flushes
/// (its `high` pool) and compactions (`low`), and the rest.
pub fn cpu_by_role(before: &ThreadCpu, after: &ThreadCpu, ops: f64) -> String {
    const ROLES: [&str; 7] = [
        "writer",
        "syncer",
        "applier",
        "callers",
        "flushes",
        "compactions",
        "other",
    ];
    const NAMES: [(&str, usize); 8] = [
        ("dtask-journal-w", 0),
        ("file-writer", 0),
        ("dtask-journal-s", 1),
        ("file-syncer", 1),
        ("file-applier", 2),
        ("tokio-rt-worker", 3),
        ("rocksdb:high", 4),
        ("rocksdb:low", 5),
    ];
    let mut sums = [Duration::ZERO; ROLES.len()];
    for (tid, (name, used)) in after {
        let earlier = before
            .get(tid)
            .filter(|(was, _)| was == name)
            .map_or(Duration::ZERO, |(_, used)| *used);
        let role = NAMES
            .iter()
            .find(|(prefix, _)| name.starts_with(prefix))
            .map_or(ROLES.len() - 1, |(_, role)| *role);
        sums[role] += used.saturating_sub(earlier);
    }
    let per_op = |d: Duration| d.as_secs_f64() * 1e6 / ops.max(1.0);
    let line: Vec<String> = ROLES
        .iter()
        .zip(sums)
        .filter(|(_, used)| !used.is_zero())
        .map(|(role, used)| format!("{role} {:.2}", per_op(used)))
        .collect();
    line.join(" | ")
}

/// Each thread's CPU time over one closed loop: a [`thread_cpu`] snapshot when made, another
/// at [`ThreadTimes::stop`] (call it from the loop's `on_stop`, while its threads are still
/// alive), and the CPU per operation by role between them ([`cpu_by_role`]).
pub struct ThreadTimes {
    before: Option<ThreadCpu>,
    after: std::sync::Mutex<Option<ThreadCpu>>,
}

impl ThreadTimes {
    /// Takes the first snapshot when `on` (otherwise [`ThreadTimes::line`] gives `None`).
    pub fn start(on: bool) -> Self {
        Self {
            before: on.then(thread_cpu),
            after: std::sync::Mutex::new(None),
        }
    }

    /// Takes the second snapshot (once the first was taken).
    pub fn stop(&self) {
        if self.before.is_some() {
            *self.after.lock().unwrap() = Some(thread_cpu());
        }
    }

    /// The CPU per operation by role between the snapshots, over `ops` operations.
    pub fn line(self, ops: f64) -> Option<String> {
        let after = self.after.into_inner().unwrap()?;
        Some(cpu_by_role(&self.before?, &after, ops))
    }
}

/// Runs `column`, which returns operations per second over `secs`, and returns that rate with
/// the process's CPU time per operation in microseconds (`None` where [`process_cpu`] is).
pub fn with_cpu(secs: f64, column: impl FnOnce() -> f64) -> (f64, Option<f64>) {
    let before = process_cpu();
    let rate = column();
    let cpu = process_cpu().zip(before).map(|(after, before)| {
        after.saturating_sub(before).as_secs_f64() * 1e6 / (rate * secs).max(1.0)
    });
    (rate, cpu)
}

//! The peers' workload on the PostgreSQL journal, beside PostgreSQL's own inserts on the same
//! database in the same run.
//!
//! A task of 10 durable steps (create, start, 10 progress updates, complete: 13 synced appends;
//! a step is an update the caller waits for) run by C = 1, 16, 64 concurrent callers, each
//! looping over new tasks — on one node (one `TaskStore`, its journal's six connections) and
//! on two nodes (two stores, C/2 callers each, one database) — and the journal's own appends
//! without the engine (C closed-loop writers, one record each, as the journal bench's dtask
//! column). Beside them, baselines of the same durability (`synchronous_commit` on):
//! **single-row** inserts, C connections each committing one row at a time; **multi-row**
//! inserts, one connection committing C rows per transaction — the ceiling a perfect group
//! commit reaches — and the same multi-row commits in **the journal's own rows** (a copy of
//! the record table, its two indexes with it: C tasks, each at its next position, the
//! sequence counting on), the ceiling a perfect group commit of the journal's records
//! reaches; and the **closed-loop group commit** of the journal's rows: C writers each
//! waiting for its row's acknowledgement before the next, one connection inserting all that
//! is queued, a second flushing (the analogue of the journal bench's plain-file group
//! commit), or in its simplest shape, the writer's commit waiting for the flush: the better
//! of the two is the limit a closed loop reaches on this database. The columns alternate,
//! round after round.
//!
//! Targets (printed `met` / `not met`): at C = 64, dtask's durable appends per second ≥ 0.8×
//! the multi-row ceiling's rows per second, ≥ 0.8× the journal rows' ceiling; the journal's
//! appends, and the workload's, ≥ 0.8× the closed-loop group commit; and ≥ 2,500 durable
//! steps/s (10× DBOS on PostgreSQL on this machine class, measured at ~250:
//! docs/performance.md, "The peers' workload").
//!
//! Run: `DTASK_TEST_PG_URL=postgres://… cargo bench --bench postgres` (`./dev postgres` starts
//! a private database and prints its URL; `-- --secs 5`, `-- --rounds 3`, `-- --callers 64`,
//! `-- --breakdown` for a line of the write path of one node, of two and of the journal's
//! appends).
#![allow(
    clippy::unwrap_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    missing_docs
)]

mod common;

use clap::Parser;
use dtask::journal::{Journal, JournalOptions, LeasePolicy, TaskSpec};
use dtask_engine::{Command, CreateRequest, StoreConfig, SystemClock, TaskStore, UpdateRequest};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
struct Args {
    /// Seconds per cell.
    #[arg(long, default_value_t = 3.0)]
    secs: f64,
    /// Alternating rounds.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// One row only.
    #[arg(long)]
    callers: Option<usize>,
    /// After each cell, a line of the write path of one node, of two (both nodes' batches
    /// together) and of the journal's appends: batches and flushes per second, appends per
    /// batch and per flush, the mean commit and flush, each append's latency.
    #[arg(long)]
    breakdown: bool,
    /// Accepted for `cargo bench`'s own flag.
    #[arg(long, hide = true)]
    bench: bool,
}

const STEPS: u64 = 10;

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "not met"
    }
}

fn schema_url(base: &str, schema: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}schema={schema}")
}

/// Runs one task of 10 steps after another until `stop`; counts steps in `steps`.
async fn caller(store: TaskStore, name: String, stop: Arc<AtomicBool>, steps: Arc<AtomicU64>) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let id = format!("{name}-{n}");
        n += 1;
        let created = store
            .create(CreateRequest {
                spec: TaskSpec {
                    id: id.clone(),
                    executor_key: "bench".into(),
                    kind: "workflow".into(),
                    ..TaskSpec::default()
                },
                policy: Some(LeasePolicy::Retry),
                ..CreateRequest::default()
            })
            .await
            .unwrap();
        let running = store
            .execute(&id, created.version, Command::Start)
            .await
            .unwrap();
        for step in 0..STEPS {
            store
                .append_update(
                    &id,
                    UpdateRequest {
                        attempt: running.attempt,
                        event_id: format!("step-{step}"),
                        kind: "step".into(),
                        data: b"step result".to_vec(),
                        ..UpdateRequest::default()
                    },
                )
                .await
                .unwrap();
            steps.fetch_add(1, Ordering::Relaxed);
        }
        store
            .execute(
                &id,
                running.version,
                Command::Complete {
                    data: b"done".to_vec(),
                },
            )
            .await
            .unwrap();
    }
}

/// dtask's durable steps per second with `callers` callers over `nodes` stores, every
/// journal's write path told to `counter`.
fn dtask(
    base: &str,
    schema: &str,
    nodes: usize,
    callers: usize,
    secs: f64,
    counter: &Arc<common::WriteBreakdown>,
) -> f64 {
    let url = schema_url(base, schema);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stores: Vec<TaskStore> = (0..nodes)
        .map(|_| {
            let journal = Journal::open_postgres(&url, JournalOptions::default()).unwrap();
            journal.observe(Arc::clone(counter) as Arc<dyn dtask::journal::WriteObserver>);
            TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap()
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let steps = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..callers)
            .map(|c| {
                tokio::spawn(caller(
                    stores[c % nodes].clone(),
                    format!("{schema}-c{c}"),
                    Arc::clone(&stop),
                    Arc::clone(&steps),
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        stop.store(true, Ordering::Relaxed);
        let elapsed = started.elapsed();
        let done = steps.load(Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        done as f64 / elapsed.as_secs_f64()
    })
}

/// PostgreSQL's own synchronous inserts: `callers` connections committing one row each time
/// (`multi` false), or one connection committing `callers` rows per transaction.
fn baseline(base: &str, table: &str, callers: usize, multi: bool, secs: f64) -> f64 {
    let workers = if multi { 1 } else { callers };
    let batch = if multi { callers } else { 1 };
    let create = format!(
        "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} \
         (id bigserial PRIMARY KEY, task text NOT NULL, data bytea NOT NULL)"
    );
    let insert =
        format!("INSERT INTO {table} (task, data) SELECT * FROM unnest($1::text[], $2::bytea[])");
    // Every commit of a worker sends the same rows, made once.
    let data: Param = Arc::new(vec![vec![7u8; 120]; batch]);
    let tasks: Vec<Param> = (0..workers)
        .map(|w| Arc::new((0..batch).map(|i| format!("w{w}-{i}")).collect::<Vec<_>>()) as Param)
        .collect();
    inserts(base, &create, &insert, workers, secs, move |w, _| {
        (batch as u64, vec![Arc::clone(&tasks[w]), Arc::clone(&data)])
    })
}

/// The multi-row ceiling in the journal's own rows: one connection committing `callers` rows
/// per transaction into a copy of `schema`'s record table (its columns, constraints and
/// both indexes), one row for each of `callers` tasks at its next position, the sequence
/// counting on, each record as long as the workload's (~92 bytes). What a perfect group
/// commit of the journal's records reaches: the record table's two indexes (by task and
/// position, at `callers` places; by sequence) make its rows dearer than the plain ceiling's.
fn journal_rows(base: &str, schema: &str, callers: usize, secs: f64) -> f64 {
    let table = "dtask_bench_rows";
    let create = format!(
        "DROP TABLE IF EXISTS {table}; \
         CREATE TABLE {table} (LIKE \"{schema}\".dtask_records INCLUDING ALL)"
    );
    let insert = format!(
        "INSERT INTO {table} (task, position, seq, record) \
         SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[], $4::bytea[])"
    );
    let tasks: Param = Arc::new(
        (0..callers)
            .map(|i| format!("{table}-c{i}-0"))
            .collect::<Vec<_>>(),
    );
    let records: Param = Arc::new(vec![vec![7u8; 92]; callers]);
    let c = i64::try_from(callers).unwrap();
    inserts(base, &create, &insert, 1, secs, move |_, k| {
        let k = k.cast_signed();
        let positions: Param = Arc::new(vec![k; callers]);
        let sequences: Param = Arc::new((0..c).map(|i| k * c + i + 1).collect::<Vec<_>>());
        (
            callers as u64,
            vec![
                Arc::clone(&tasks),
                positions,
                sequences,
                Arc::clone(&records),
            ],
        )
    })
}

/// The journal's own durable appends per second on PostgreSQL, without the engine: `callers`
/// closed-loop writers ([`common::append_loop`]), each appending one progress update (12
/// bytes of data: a record of ~92 bytes, as the workload's) to a task of its own and
/// waiting for it before the next — the journal bench's dtask column, on this database. Against
/// [`group_commit`], what the journal's write path costs beyond a closed loop's limit.
fn journal_appends(
    base: &str,
    schema: &str,
    callers: usize,
    secs: f64,
    counter: &Arc<common::WriteBreakdown>,
) -> f64 {
    let journal =
        Journal::open_postgres(&schema_url(base, schema), JournalOptions::default()).unwrap();
    journal.observe(Arc::clone(counter) as Arc<dyn dtask::journal::WriteObserver>);
    common::append_loop(&journal, callers, secs, 12, || {})
}

/// The closed-loop group commit of the journal's rows: `callers` writers (tokio tasks on a
/// two-thread runtime, as the engine's callers are), each appending one record of its own
/// task at its next position and waiting for its acknowledgement before the next. One
/// connection (driven on a thread of its own, as the journal's writer is) inserts everything
/// queued in one prepared multi-row insert into a copy of `schema`'s record table — the
/// sequence counting on, records of the workload's ~92 bytes — committing without waiting
/// for the flush; a second connection makes everything written since its last flush durable
/// with one transaction that waits for the flush (as the journal's syncer does), and
/// acknowledges it. With `serial`, the writer's commit waits for the flush and acknowledges
/// its batch itself: the simplest group commit (one round trip a batch, where the other
/// takes two: faster for a lone writer). The better of the two is what a closed loop of C
/// writers can reach on this database, the analogue of the plain-file group commit of the
/// journal bench; the multi-row ceilings are not closed loops (their C rows are all there
/// again at once).
/// Returns the rows per second and the mean rows a batch.
fn group_commit(base: &str, schema: &str, callers: usize, secs: f64, serial: bool) -> (f64, f64) {
    let queue = Arc::new(Group::default());
    let (ready, opened) = std::sync::mpsc::channel();
    let writer = {
        let (base, schema, queue, ready) = (
            base.to_owned(),
            schema.to_owned(),
            Arc::clone(&queue),
            ready.clone(),
        );
        std::thread::spawn(move || {
            on_connection(&base, serial, |client| {
                group_writer(client, &schema, callers, serial, &queue, &ready)
            });
        })
    };
    opened.recv().unwrap();
    let syncer = (!serial).then(|| {
        let (base, queue) = (base.to_owned(), Arc::clone(&queue));
        std::thread::spawn(move || {
            on_connection(&base, true, |client| async move {
                ready.send(()).unwrap();
                while let Some(acks) = queue.take_written() {
                    client
                        .batch_execute(
                            "BEGIN; SELECT pg_logical_emit_message(true, 'dtask-bench', ''); COMMIT",
                        )
                        .await
                        .unwrap();
                    Group::acknowledge(acks);
                }
            });
        })
    });
    if syncer.is_some() {
        opened.recv().unwrap();
    }
    let rate = common::closed_loop(
        callers,
        secs,
        |caller, stop, done| {
            let queue = Arc::clone(&queue);
            async move {
                let mut position = 0;
                while !stop.load(Ordering::Relaxed) {
                    let Some(acked) = queue.push(caller, position) else {
                        return;
                    };
                    if acked.await.is_err() {
                        return;
                    }
                    position += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        },
        || queue.stop(),
    );
    writer.join().unwrap();
    if let Some(syncer) = syncer {
        syncer.join().unwrap();
    }
    let batches = queue.batches.load(Ordering::Relaxed).max(1);
    (
        rate,
        queue.rows.load(Ordering::Relaxed) as f64 / batches as f64,
    )
}

/// [`group_commit`]'s writer, on `client`: makes the table, says it is `ready`, then writes
/// everything queued, batch after batch, until the stop.
async fn group_writer(
    client: tokio_postgres::Client,
    schema: &str,
    callers: usize,
    serial: bool,
    queue: &Group,
    ready: &std::sync::mpsc::Sender<()>,
) {
    let table = "dtask_bench_group";
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}; \
             CREATE TABLE {table} (LIKE \"{schema}\".dtask_records INCLUDING ALL)"
        ))
        .await
        .unwrap();
    let insert = client
        .prepare(&format!(
            "INSERT INTO {table} (task, position, seq, record) \
             SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[], $4::bytea[])"
        ))
        .await
        .unwrap();
    let names: Vec<String> = (0..callers).map(|c| format!("{table}-c{c}")).collect();
    ready.send(()).unwrap();
    let mut last_seq = 0i64;
    while let Some(batch) = queue.take_queued() {
        let n = batch.len();
        queue.batches.fetch_add(1, Ordering::Relaxed);
        queue.rows.fetch_add(n as u64, Ordering::Relaxed);
        let tasks: Vec<&str> = batch.iter().map(|q| names[q.0].as_str()).collect();
        let positions: Vec<i64> = batch.iter().map(|q| q.1).collect();
        let sequences: Vec<i64> = (0..n)
            .map(|_| {
                last_seq += 1;
                last_seq
            })
            .collect();
        let records = vec![vec![7u8; 92]; n];
        client
            .execute(&insert, &[&tasks, &positions, &sequences, &records])
            .await
            .unwrap();
        let acks = batch.into_iter().map(|q| q.2).collect();
        if serial {
            Group::acknowledge(acks);
        } else if !queue.written(acks) {
            return;
        }
    }
}

/// Runs `work` with a client of its own connection (its commits waiting for the flush when
/// `synchronous`), driven on this thread.
fn on_connection<F, W>(base: &str, synchronous: bool, work: W)
where
    W: FnOnce(tokio_postgres::Client) -> F,
    F: std::future::Future<Output = ()>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, conn) = tokio_postgres::connect(base, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let setting = if synchronous { "on" } else { "off" };
        client
            .batch_execute(&format!("SET synchronous_commit TO {setting}"))
            .await
            .unwrap();
        work(client).await;
    });
}

/// A writer's record waiting in [`Group`]'s queue: its task's number, its position, its
/// acknowledgement.
type Queued = (usize, i64, tokio::sync::oneshot::Sender<()>);

/// What [`group_commit`]'s callers, writer and syncer share.
#[derive(Default)]
struct Group {
    state: std::sync::Mutex<GroupState>,
    /// Signalled when the queue turns non-empty, and at the stop.
    queued: std::sync::Condvar,
    /// Signalled when a batch is written, and at the stop.
    written: std::sync::Condvar,
    /// Batches written, and the rows in them.
    batches: AtomicU64,
    rows: AtomicU64,
}

#[derive(Default)]
struct GroupState {
    queue: Vec<Queued>,
    /// The acknowledgements of the batches written since the last flush began.
    written: Vec<tokio::sync::oneshot::Sender<()>>,
    stop: bool,
}

impl Group {
    /// Queues a record; its acknowledgement, or `None` once stopped.
    fn push(&self, caller: usize, position: i64) -> Option<tokio::sync::oneshot::Receiver<()>> {
        let (ack, acked) = tokio::sync::oneshot::channel();
        let mut state = self.state.lock().unwrap();
        if state.stop {
            return None;
        }
        state.queue.push((caller, position, ack));
        if state.queue.len() == 1 {
            self.queued.notify_one();
        }
        Some(acked)
    }

    /// Everything queued, once there is something; `None` at the stop.
    fn take_queued(&self) -> Option<Vec<Queued>> {
        let mut state = self.state.lock().unwrap();
        while state.queue.is_empty() && !state.stop {
            state = self.queued.wait(state).unwrap();
        }
        (!state.stop).then(|| std::mem::take(&mut state.queue))
    }

    /// Hands a written batch's acknowledgements to the syncer; `false` at the stop.
    fn written(&self, acks: Vec<tokio::sync::oneshot::Sender<()>>) -> bool {
        let mut state = self.state.lock().unwrap();
        if state.stop {
            return false;
        }
        state.written.extend(acks);
        self.written.notify_one();
        true
    }

    /// Every acknowledgement written since the last take, once there is one; `None` at the
    /// stop.
    fn take_written(&self) -> Option<Vec<tokio::sync::oneshot::Sender<()>>> {
        let mut state = self.state.lock().unwrap();
        while state.written.is_empty() && !state.stop {
            state = self.written.wait(state).unwrap();
        }
        (!state.stop).then(|| std::mem::take(&mut state.written))
    }

    fn acknowledge(acks: Vec<tokio::sync::oneshot::Sender<()>>) {
        for ack in acks {
            let _ = ack.send(());
        }
    }

    /// Stops the writer and the syncer, and drops every acknowledgement still waiting, which
    /// ends its caller.
    fn stop(&self) {
        let mut state = self.state.lock().unwrap();
        state.stop = true;
        state.queue.clear();
        state.written.clear();
        drop(state);
        self.queued.notify_all();
        self.written.notify_all();
    }
}

/// A parameter of a baseline's insert, shared by the commits that send the same value.
type Param = Arc<dyn tokio_postgres::types::ToSql + Sync + Send>;
/// A commit's parameters.
type Params = Vec<Param>;

/// Rows per second of `workers` connections committing `insert` in a loop
/// (`synchronous_commit` on) for `secs`, once `create` has set up its table; `params(w, k)`
/// gives worker `w`'s `k`-th commit its rows' count and parameters.
fn inserts(
    base: &str,
    create: &str,
    insert: &str,
    workers: usize,
    secs: f64,
    params: impl Fn(usize, u64) -> (u64, Params) + Send + Sync + 'static,
) -> f64 {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let connect = || async {
            let (client, conn) = tokio_postgres::connect(base, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            client
                .batch_execute("SET synchronous_commit TO on")
                .await
                .unwrap();
            client
        };
        connect().await.batch_execute(create).await.unwrap();
        let mut clients = Vec::new();
        for _ in 0..workers {
            let client = connect().await;
            let statement = client.prepare(insert).await.unwrap();
            clients.push((client, statement));
        }
        let params = Arc::new(params);
        let stop = Arc::new(AtomicBool::new(false));
        let rows = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let tasks: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(w, (client, statement))| {
                let (params, stop, rows) =
                    (Arc::clone(&params), Arc::clone(&stop), Arc::clone(&rows));
                tokio::spawn(async move {
                    let mut k = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let (n, values) = params(w, k);
                        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                            values.iter().map(|v| v.as_ref() as _).collect();
                        client.execute(&statement, &refs).await.unwrap();
                        rows.fetch_add(n, Ordering::Relaxed);
                        k += 1;
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        stop.store(true, Ordering::Relaxed);
        let elapsed = started.elapsed();
        let done = rows.load(Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        done as f64 / elapsed.as_secs_f64()
    })
}

fn main() {
    let args = Args::parse();
    let Ok(base) = std::env::var("DTASK_TEST_PG_URL") else {
        println!(
            "postgres bench: SKIPPED — set DTASK_TEST_PG_URL (./dev postgres starts a private \
             PostgreSQL and prints its URL)"
        );
        return;
    };
    let rows: Vec<usize> = args.callers.map_or_else(|| vec![1, 16, 64], |c| vec![c]);
    let stamp = std::process::id();
    println!(
        "postgres bench: a task of {STEPS} steps (13 synced appends), {} s per cell, {} round(s)",
        args.secs, args.rounds
    );
    println!(
        "{:>3} {:>5} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9}",
        "C",
        "round",
        "1 node st/s",
        "2 nodes",
        "appends/s",
        "group r/s",
        "single r/s",
        "multi r/s",
        "rows r/s",
        "app/group",
        "1n/group",
        "1n/multi",
        "1n/rows"
    );
    let mut at_64 = Vec::new();
    for &callers in &rows {
        for round in 0..args.rounds {
            let schema = format!("b{stamp}_{callers}_{round}_a");
            let counter = Arc::new(common::WriteBreakdown::default());
            let one = dtask(&base, &schema, 1, callers, args.secs, &counter);
            let batches = counter.batches();
            let per_batch = counter.appends() as f64 / batches.max(1) as f64;
            let single = baseline(&base, "dtask_bench_single", callers, false, args.secs);
            let both = Arc::new(common::WriteBreakdown::default());
            let two = dtask(
                &base,
                &format!("b{stamp}_{callers}_{round}_b"),
                2,
                callers.max(2),
                args.secs,
                &both,
            );
            let multi = baseline(&base, "dtask_bench_multi", callers, true, args.secs);
            let own = Arc::new(common::WriteBreakdown::default());
            let appended = journal_appends(
                &base,
                &format!("b{stamp}_{callers}_{round}_j"),
                callers,
                args.secs,
                &own,
            );
            let rows = journal_rows(&base, &schema, callers, args.secs);
            let (piped, piped_batch) = group_commit(&base, &schema, callers, args.secs, false);
            let (serial, serial_batch) = group_commit(&base, &schema, callers, args.secs, true);
            let group = piped.max(serial);
            // Appends per step: 13 appends carry 10 steps.
            let appends = |steps: f64| steps * 13.0 / STEPS as f64;
            let round_of = Round {
                steps: one,
                of_multi: appends(one) / multi,
                of_rows: appends(one) / rows,
                of_group: appends(one) / group,
                appends_of_group: appended / group,
            };
            println!(
                "{callers:>3} {round:>5} {one:>11.0} {two:>11.0} {appended:>11.0} {group:>11.0} {single:>11.0} {multi:>11.0} {rows:>11.0} {:>8.2}× {:>8.2}× {:>8.2}× {:>8.2}×",
                round_of.appends_of_group, round_of.of_group, round_of.of_multi, round_of.of_rows,
            );
            println!(
                "    (batches: 1 node {batches} of {per_batch:.1} appends on average; the journal's \
                 appends {:.1}; the group commit {piped:.0} rows/s in batches of \
                 {piped_batch:.1} with a syncer, {serial:.0} in batches of {serial_batch:.1} \
                 alone)",
                own.appends() as f64 / own.batches().max(1) as f64
            );
            if args.breakdown {
                println!("    1 node:");
                counter.print(args.secs, callers);
                println!("    2 nodes, both nodes' batches together:");
                both.print(args.secs, callers.max(2));
                println!("    the journal's appends:");
                own.print(args.secs, callers);
            }
            if callers == 64 {
                at_64.push(round_of);
            }
            drop_round(&base, &format!("b{stamp}_{callers}_{round}"));
        }
    }
    print_targets(&at_64);
}

/// Drops what a round made: its journals' schemas (`{prefix}_a`, `_b`, `_j`) and the
/// baselines' tables, so that runs leave nothing behind in the database.
fn drop_round(base: &str, prefix: &str) {
    on_connection(base, false, |client| async move {
        client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS \"{prefix}_a\", \"{prefix}_b\", \"{prefix}_j\" CASCADE; \
                 DROP TABLE IF EXISTS dtask_bench_single, dtask_bench_multi, dtask_bench_rows, \
                 dtask_bench_group"
            ))
            .await
            .unwrap();
    });
}

/// One round's figures at C = 64, for the target lines.
struct Round {
    /// One node's durable steps per second.
    steps: f64,
    /// One node's appends ÷ the multi-row ceiling.
    of_multi: f64,
    /// One node's appends ÷ the journal rows' ceiling.
    of_rows: f64,
    /// One node's appends ÷ the closed-loop group commit.
    of_group: f64,
    /// The journal's own appends ÷ the closed-loop group commit.
    appends_of_group: f64,
}

/// The target lines, judged on the medians of the rounds at C = 64.
fn print_targets(at_64: &[Round]) {
    if at_64.is_empty() {
        return;
    }
    let median = |figure: fn(&Round) -> f64| {
        let mut values: Vec<f64> = at_64.iter().map(figure).collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let ratio = median(|r| r.of_multi);
    println!(
        "target: at C = 64, durable appends ≥ 0.8× the multi-row ceiling ({ratio:.2}×): {}",
        verdict(ratio >= 0.8)
    );
    let of_rows = median(|r| r.of_rows);
    println!(
        "target: at C = 64, durable appends ≥ 0.8× the multi-row ceiling of the journal's \
         rows ({of_rows:.2}×): {}",
        verdict(of_rows >= 0.8)
    );
    let appends = median(|r| r.appends_of_group);
    println!(
        "target: at C = 64, the journal's appends ≥ 0.8× the closed-loop group commit of its \
         rows ({appends:.2}×): {}",
        verdict(appends >= 0.8)
    );
    let of_group = median(|r| r.of_group);
    println!(
        "target: at C = 64, durable appends of the workload ≥ 0.8× the closed-loop group \
         commit of the journal's rows ({of_group:.2}×): {}",
        verdict(of_group >= 0.8)
    );
    let steps = median(|r| r.steps);
    println!(
        "target: at C = 64, ≥ 2,500 durable steps/s ({steps:.0}): {}",
        verdict(steps >= 2500.0)
    );
}

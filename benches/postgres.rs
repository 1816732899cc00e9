//! The peers' workload on the PostgreSQL journal, beside PostgreSQL's own inserts on the same
//! database in the same run.
//!
//! A task of 10 durable steps (create, start, 10 progress updates, complete: 13 synced appends;
//! a step is an update the caller waits for) run by C = 1, 16, 64 concurrent callers, each
//! looping over new tasks — on one node (one `TaskStore`, its journal's six connections) and
//! on two nodes (two stores, C/2 callers each, one database). Beside it, two baselines of the
//! same durability (`synchronous_commit` on): **single-row** inserts, C connections each
//! committing one row at a time, and **multi-row** inserts, one connection committing C rows
//! per transaction — the ceiling a perfect group commit reaches — and the same multi-row
//! commits in **the journal's own rows** (a copy of the record table, its two indexes with
//! it: C tasks, each at its next position, the sequence counting on), the ceiling a perfect
//! group commit of the journal's records reaches. The columns alternate, round after round.
//!
//! Targets (printed `met` / `not met`): at C = 64, dtask's durable appends per second ≥ 0.8×
//! the multi-row ceiling's rows per second, ≥ 0.8× the journal rows' ceiling, and ≥ 2,500
//! durable steps/s (10× DBOS on PostgreSQL on this machine class, measured at ~250:
//! docs/performance.md, "The peers' workload").
//!
//! Run: `DTASK_TEST_PG_URL=postgres://… cargo bench --bench postgres` (`./dev postgres` starts
//! a private database and prints its URL; `-- --secs 5`, `-- --rounds 3`, `-- --callers 64`,
//! `-- --breakdown` for a line of the write path of one node and of two).
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
    /// After each cell, a line of the write path of one node and of two (both nodes'
    /// batches together): batches and flushes per second, appends per batch and per flush,
    /// the mean commit and flush, each append's latency.
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
        "{:>3} {:>5} {:>12} {:>12} {:>12} {:>12} {:>12} {:>10} {:>10} {:>10}",
        "C",
        "round",
        "1 node st/s",
        "2 nodes st/s",
        "single r/s",
        "multi r/s",
        "rows r/s",
        "1n/multi",
        "2n/multi",
        "1n/rows"
    );
    let mut at_64 = Vec::new();
    for &callers in &rows {
        for round in 0..args.rounds {
            let counter = Arc::new(common::WriteBreakdown::default());
            let one = dtask(
                &base,
                &format!("b{stamp}_{callers}_{round}_a"),
                1,
                callers,
                args.secs,
                &counter,
            );
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
            let rows = journal_rows(
                &base,
                &format!("b{stamp}_{callers}_{round}_a"),
                callers,
                args.secs,
            );
            // Appends per step: 13 appends carry 10 steps.
            let appends = |steps: f64| steps * 13.0 / STEPS as f64;
            println!(
                "{callers:>3} {round:>5} {one:>12.0} {two:>12.0} {single:>12.0} {multi:>12.0} {rows:>12.0} {:>9.2}× {:>9.2}× {:>9.2}×",
                appends(one) / multi,
                appends(two) / multi,
                appends(one) / rows
            );
            println!("    (1 node: {batches} batches of {per_batch:.1} appends on average)");
            if args.breakdown {
                println!("    1 node:");
                counter.print(args.secs, callers);
                println!("    2 nodes, both nodes' batches together:");
                both.print(args.secs, callers.max(2));
            }
            if callers == 64 {
                at_64.push((one, appends(one) / multi, appends(one) / rows));
            }
        }
    }
    print_targets(&at_64);
}

/// The target lines, judged on the medians of the rounds at C = 64: each round's durable
/// steps/s, its appends ÷ the multi-row ceiling, and ÷ the journal rows' ceiling.
fn print_targets(at_64: &[(f64, f64, f64)]) {
    if at_64.is_empty() {
        return;
    }
    let mut steps: Vec<f64> = at_64.iter().map(|r| r.0).collect();
    let mut ratios: Vec<f64> = at_64.iter().map(|r| r.1).collect();
    let mut of_rows: Vec<f64> = at_64.iter().map(|r| r.2).collect();
    steps.sort_by(f64::total_cmp);
    ratios.sort_by(f64::total_cmp);
    of_rows.sort_by(f64::total_cmp);
    let (steps, ratio, of_rows) = (
        steps[steps.len() / 2],
        ratios[ratios.len() / 2],
        of_rows[of_rows.len() / 2],
    );
    println!(
        "target: at C = 64, durable appends ≥ 0.8× the multi-row ceiling ({ratio:.2}×): {}",
        verdict(ratio >= 0.8)
    );
    println!(
        "target: at C = 64, durable appends ≥ 0.8× the multi-row ceiling of the journal's \
         rows ({of_rows:.2}×): {}",
        verdict(of_rows >= 0.8)
    );
    println!(
        "target: at C = 64, ≥ 2,500 durable steps/s ({steps:.0}): {}",
        verdict(steps >= 2500.0)
    );
}

//! A node on a PostgreSQL journal whose database goes away for a while — an operator's
//! restart (`pg_ctl stop -m fast`, then `start`), then a crash (`-m immediate`), of a private
//! cluster (the distribution's `initdb` and `pg_ctl`, from `DTASK_TEST_PG_BIN`, which
//! `./dev test` sets): the worker's claims fail while the database is away and the worker
//! goes on; once the database is back it claims the task, which completes, its tool run once. The node's server (`dtask serve`)
//! is not ready meanwhile, and ready again once the database is back. Without the variable
//! the test says loudly that it was skipped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../journal/tests/cluster/mod.rs"]
mod cluster;
mod support;

use cluster::Cluster;
use dtask::engine::{
    Manager, ManagerConfig, ManualClock, StoreConfig, TaskOutcome, TaskStore, Worker, WorkerConfig,
};
use dtask::journal::{Journal, JournalOptions};
use dtask::server::{Server, ServerConfig};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{Held, Served, PATIENCE};

/// What the worker logs when the journal's storage fails.
const WORKER_OUTAGE: &str = "the journal's storage fails";

/// Tasks are claimed this long after their creation, by the store's (manual) clock.
const PICKUP_DELAY: Duration = Duration::from_secs(1);

/// The messages of the warnings logged in this process (a subscriber of its own: the
/// worker says when it meets an outage of the journal's storage).
#[derive(Default)]
struct Warnings(Mutex<Vec<String>>);

impl Warnings {
    fn count(&self, needle: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|m| m.contains(needle))
            .count()
    }
}

/// An event's `message` field.
struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::WARN
    }

    fn new_span(&self, _span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _span: &tracing::span::Id, _values: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _span: &tracing::span::Id, _follows: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        self.0.lock().unwrap().push(message.0);
    }

    fn enter(&self, _span: &tracing::span::Id) {}

    fn exit(&self, _span: &tracing::span::Id) {}
}

async fn completed(manager: &Manager, id: &str) {
    let outcome = tokio::time::timeout(PATIENCE, manager.wait(id))
        .await
        .unwrap_or_else(|_| panic!("{id} did not complete"))
        .unwrap();
    assert!(
        matches!(outcome, TaskOutcome::Completed(ref data) if data == b"done"),
        "{id}: {outcome:?}"
    );
}

#[test]
fn a_workers_claims_refused_while_the_database_is_away_are_made_again_once_it_is_back() {
    let Some(cluster) = Cluster::new("pg_outage") else {
        return;
    };
    let warnings = Arc::new(Warnings::default());
    tracing::subscriber::set_global_default(Arc::clone(&warnings)).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let journal =
        Journal::open_postgres(&cluster.url("outage"), JournalOptions::default()).unwrap();
    let clock = ManualClock::new(1_000);
    let store = TaskStore::open(journal, clock.clone(), StoreConfig::default()).unwrap();
    let held = Held::default();
    held.let_go(3);
    let manager = Manager::new(store, held.registry(), ManagerConfig::default());
    let worker = Worker::new(
        manager.clone(),
        WorkerConfig::new(["held"])
            .with_poll_interval(Duration::from_millis(20))
            .with_initial_pickup_delay(PICKUP_DELAY),
    )
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = runtime.spawn(worker.run(async move {
        let _ = stopped.await;
    }));
    let served = runtime.block_on(async {
        let config = ServerConfig::default().with_poll_interval(Duration::from_millis(20));
        let server = Server::owner(manager.store().clone(), Some(manager.clone()), config);
        Served::start(server).await
    });
    assert_eq!(runtime.block_on(served.readiness(true)), json!([]));

    // The worker runs a task while the database is up.
    runtime.block_on(async {
        let first = Held::submit(&manager).await;
        clock.advance(PICKUP_DELAY);
        completed(&manager, &first).await;
    });

    // A task comes due while the database is away — stopped as an operator restarts it,
    // then crashed: the worker's listings and claims fail, it says so, and it goes on.
    for (round, away) in [Cluster::stop_fast, Cluster::crash].into_iter().enumerate() {
        let due = runtime.block_on(Held::submit(&manager));
        let warned = warnings.count(WORKER_OUTAGE);
        away(&cluster);
        clock.advance(PICKUP_DELAY);
        let down = Instant::now();
        while warnings.count(WORKER_OUTAGE) == warned {
            assert!(
                !worker.is_finished(),
                "round {round}: the worker ended while the database was away: {:?}",
                runtime.block_on(worker)
            );
            assert!(down.elapsed() < PATIENCE, "round {round}: no outage met");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Not ready: the server's reads of the commits fail.
        let reasons = runtime.block_on(served.readiness(false));
        assert!(
            reasons
                .as_array()
                .unwrap()
                .contains(&json!("journal_unreadable")),
            "round {round}: {reasons}"
        );
        // Polls after the first failure (each 20 ms): the worker still runs.
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !worker.is_finished(),
            "round {round}: the worker ended while the database was away: {:?}",
            runtime.block_on(worker)
        );
        assert_eq!(
            held.runs(),
            round + 1,
            "round {round}: nothing ran while away"
        );

        // The database is back: the task is claimed and completes, its tool run once.
        cluster.start();
        runtime.block_on(completed(&manager, &due));
        assert_eq!(held.runs(), round + 2, "round {round}: each tool ran once");
        assert_eq!(runtime.block_on(served.readiness(true)), json!([]));
    }
    stop.send(()).unwrap();
    runtime.block_on(worker).unwrap().unwrap();
    runtime.block_on(served.stop());
}

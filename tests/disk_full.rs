//! A journal whose disk fills — a real file system, a tmpfs of the test's own: appends fail
//! with a no-space storage error and leave nothing behind (no record, no sequence, no index
//! entry); once space is freed the journal writes again by itself, each task going on at
//! the position where it stopped; closed and opened again, it holds every acknowledged
//! append and audits clean. The same through the task store: a command refused for a full
//! disk changed nothing, and the same command, made again once there is room, is recorded;
//! the store's server (`dtask serve`) is not ready (`disk_full`) meanwhile, alive all along.
//! And through the runtime: a tool's outcome refused for a full disk waits for room, and is
//! recorded once there is, the tool run once; a worker's claim refused for a full disk is
//! made again at its next poll, once there is room. And `dtask import`: an import the disk cannot
//! hold fails and leaves nothing behind; with room, the same import succeeds, bit-exact.
//!
//! The tmpfs is mounted in a mount namespace of the test's own (`unshare`): no privilege is
//! needed where unprivileged user namespaces are allowed (root's plain mount namespace is
//! tried next), and no mount outlives the test. Where neither can mount, the test says
//! SKIPPED — unless `DTASK_REQUIRE_TMPFS` is set, as CI sets it, which makes that a failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../journal/tests/cluster/mod.rs"]
mod cluster;
mod support;

use cluster::Cluster;

use dtask::engine::{
    Command, CreateRequest, ManualClock, StoreConfig, StoreError, TaskStore, UpdateRequest,
};
use dtask::engine::{Manager, ManagerConfig, TaskOutcome, Worker, WorkerConfig};
use dtask::journal::{
    Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp, WriteState,
};
use dtask::server::{Server, ServerConfig};
use dtask::Status;
use prometheus_client::registry::Registry;
use serde_json::json;
use std::future::Future;
use std::io::Write as _;
use std::path::Path;
use std::process::Command as Process;
use std::time::{Duration, Instant};
use support::{Held, Served};

/// The environment variable that makes the test binary the child, naming its mount point.
const CHILD: &str = "DTASK_DISK_FULL_CHILD";

/// The tmpfs's size: the journal (its write-ahead log preallocated, ~70 MiB) and the
/// ballast, and after the ballast is gone more than RocksDB asks to be free before it writes
/// again (its largest memtable, 64 MiB).
const TMPFS: &str = "size=256m";

/// What the ballast leaves free once the journal is open (and the tasks set up): the
/// writers fill it. The journal opens with room: on a tmpfs, RocksDB's preallocation of a
/// file takes all the free space for a moment, and a write beside it would meet a full disk
/// before the test means it to.
const SLACK: u64 = 6 << 20;

/// The bytes of each update: large, so that the disk fills after a few hundred.
const UPDATE_BYTES: usize = 64 << 10;

/// Writers, each appending to a task of its own.
const WRITERS: usize = 8;

/// Appends a writer makes at most before the disk must have filled.
const MAX_APPENDS: u64 = 100_000;

/// Appends each writer makes once the journal writes again.
const AFTER: u64 = 20;

/// How long the tests wait for the journal to write again once space is freed: a guard
/// against a hang, not a bound on speed (RocksDB looks for room every 5 s; it took 3–5 s).
const RESUME_WITHIN: Duration = Duration::from_secs(120);

#[test]
fn a_full_disk_fails_appends_cleanly_and_the_journal_writes_again_with_room() {
    in_tmpfs(
        "a_full_disk_fails_appends_cleanly_and_the_journal_writes_again_with_room",
        journal_child,
    );
}

#[test]
fn an_outcome_refused_for_a_full_disk_is_recorded_once_there_is_room_the_tool_run_once() {
    in_tmpfs(
        "an_outcome_refused_for_a_full_disk_is_recorded_once_there_is_room_the_tool_run_once",
        runtime_child,
    );
}

#[test]
fn a_workers_claim_refused_for_a_full_disk_is_made_again_once_there_is_room() {
    in_tmpfs(
        "a_workers_claim_refused_for_a_full_disk_is_made_again_once_there_is_room",
        worker_child,
    );
}

#[test]
fn a_postgres_journal_whose_tablespace_fills_fails_appends_cleanly_and_writes_again_with_room() {
    // The database server runs as `postgres`, which a user namespace of the test's own does
    // not map: root's plain mount namespace only.
    in_tmpfs_with(
        "a_postgres_journal_whose_tablespace_fills_fails_appends_cleanly_and_writes_again_with_room",
        &[&["--mount"]],
        postgres_child,
    );
}

#[test]
fn an_import_that_fills_the_disk_fails_leaving_nothing_and_succeeds_with_room() {
    in_tmpfs(
        "an_import_that_fills_the_disk_fails_leaving_nothing_and_succeeds_with_room",
        import_child,
    );
}

#[test]
fn a_full_disk_fails_store_commands_cleanly_and_the_same_command_succeeds_with_room() {
    in_tmpfs(
        "a_full_disk_fails_store_commands_cleanly_and_the_same_command_succeeds_with_room",
        store_child,
    );
}

/// Runs `child` on a tmpfs: in the child process (started with [`CHILD`] naming the mount
/// point), `child` itself; otherwise the test `name` of this binary alone, as that child, in
/// a mount namespace of its own with a tmpfs mounted on a fresh directory.
fn in_tmpfs(name: &str, child: fn(&Path)) {
    in_tmpfs_with(
        name,
        &[&["--user", "--map-root-user", "--mount"], &["--mount"]],
        child,
    );
}

/// [`in_tmpfs`], trying the namespaces given (`unshare`'s flags), in order.
fn in_tmpfs_with(name: &str, namespaces: &[&[&str]], child: fn(&Path)) {
    if let Some(dir) = std::env::var_os(CHILD) {
        child(Path::new(&dir));
        return;
    }
    let mount = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let script = format!(
        "mount -t tmpfs -o {TMPFS} dtask-disk-full \"$0\" || exit 77; \
         exec \"$1\" --exact {name} --nocapture --test-threads 1"
    );
    let mut refused = Vec::new();
    for namespace in namespaces {
        let output = Process::new("unshare")
            .args(*namespace)
            .args(["sh", "-c", &script])
            .arg(mount.path())
            .arg(&exe)
            .env(CHILD, mount.path())
            .output();
        let output = match output {
            Ok(output) => output,
            Err(e) => {
                refused.push(format!("unshare: {e}"));
                break;
            }
        };
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if output.status.success() && stdout.contains("1 passed") {
            print!("{stdout}");
            return;
        }
        assert!(
            output.status.code() != Some(101) && !stdout.contains("panicked"),
            "the child failed:\n{stdout}\n{stderr}"
        );
        refused.push(format!(
            "unshare {}: {} {}",
            namespace.join(" "),
            output.status,
            stderr.trim()
        ));
    }
    let why = refused.join("; ");
    assert!(
        std::env::var_os("DTASK_REQUIRE_TMPFS").is_none(),
        "no tmpfs could be mounted: {why}"
    );
    eprintln!("SKIPPED {name}: no tmpfs could be mounted ({why})");
}

fn created(id: &str) -> Event {
    Event::created(TaskSpec::new(id, "disk"), LeasePolicy::Retry, Timestamp(1))
}

/// The event at `position` of a writer's task: its creation, an attempt, then updates of
/// [`UPDATE_BYTES`] (a legal stream, so that the audit at the end checks every record).
fn event(id: &str, position: u64) -> Event {
    match position {
        0 => created(id),
        1 => Event::AttemptStarted {
            attempt: 1,
            lease_deadline: Timestamp(u64::MAX / 2),
            at: Timestamp(2),
        },
        n => Event::UpdateAppended {
            attempt: 1,
            event_id: format!("step-{n}"),
            kind: "progress".into(),
            data: vec![0x5a; UPDATE_BYTES],
            metadata: vec![],
            at: Timestamp(n),
        },
    }
}

/// The value of the metric `name` (without labels) as `registry` exposes it.
fn metric(registry: &Registry, name: &str) -> u64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

/// Fills the file system of `dir` with a ballast file, then gives back all but `slack`
/// bytes of it.
fn ballast(path: &Path, slack: u64) {
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 1 << 20];
    let mut written = 0u64;
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("writing the ballast: {e}"),
        }
    }
    assert!(written > slack, "the file system is smaller than the slack");
    file.set_len(written - slack).unwrap();
    file.sync_all().unwrap();
}

/// The journal's test, on the tmpfs mounted at `dir`.
fn journal_child(dir: &Path) {
    let path = dir.join("journal");
    let runtime = runtime();
    let journal = Journal::open(&path, JournalOptions::default()).unwrap();
    let registry = observed(&journal);
    let ballast_path = dir.join("ballast");
    ballast(&ballast_path, SLACK);

    let stopped = runtime.block_on(fill_streams(&journal, event));
    let acknowledged: u64 = stopped.iter().sum();
    println!("disk full after {acknowledged} acknowledged appends: {stopped:?}");
    // No sequence was taken by a failed append.
    assert_eq!(journal.last_seq().unwrap(), acknowledged);
    assert_eq!(metric(&registry, "dtask_journal_disk_full"), 1);
    assert!(metric(&registry, "dtask_journal_batch_failures_total") >= 1);
    // Full, not stopped: the journal writes again by itself once there is room.
    assert_eq!(journal.write_state(), WriteState::DiskFull);

    // Room again: the journal writes again by itself, each task at the position where it
    // stopped (its failed append left nothing there to conflict with).
    std::fs::remove_file(&ballast_path).unwrap();
    let freed = Instant::now();
    runtime.block_on(async {
        for (w, &at) in stopped.iter().enumerate() {
            let id = format!("task-{w}");
            loop {
                match journal.append_async(&id, at, &[event(&id, at)]).await {
                    Ok(_) => break,
                    Err(e) => {
                        assert!(e.is_no_space(), "{id} at {at}, space freed: {e}");
                        assert!(
                            freed.elapsed() < RESUME_WITHIN,
                            "the journal did not write again within {RESUME_WITHIN:?} of the \
                             space being freed: {e}"
                        );
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            for position in at + 1..=at + AFTER {
                journal
                    .append_async(&id, position, &[event(&id, position)])
                    .await
                    .unwrap();
            }
        }
    });
    println!(
        "writing again {:?} after the space was freed",
        freed.elapsed()
    );
    assert_eq!(metric(&registry, "dtask_journal_disk_full"), 0);
    assert_eq!(journal.write_state(), WriteState::Writing);
    drop(journal);

    // Opened again (the tail marker, the indexes and the streams agree, or the open would
    // refuse): every acknowledged append is there, the sequences have no gap, the audit is
    // clean.
    let journal = Journal::open(&path, JournalOptions::default()).unwrap();
    let per_task = 1 + AFTER;
    for (w, &len) in stopped.iter().enumerate() {
        let read = journal.read_stream(&format!("task-{w}"), 0).count() as u64;
        assert_eq!(read, len + per_task, "task-{w}'s stream after the reopen");
    }
    let total = acknowledged + per_task * WRITERS as u64;
    assert_eq!(journal.last_seq().unwrap(), total);
    let audit = dtask::replay::audit_journal(&journal, &mut |_| {}).unwrap();
    assert!(audit.is_clean(), "{:?}", audit.problems);
    assert_eq!(audit.records, total);
}

/// The progress update `n` of a running attempt.
fn update(n: u64) -> UpdateRequest {
    UpdateRequest {
        attempt: 1,
        event_id: format!("step-{n}"),
        kind: "progress".into(),
        data: vec![0x5a; UPDATE_BYTES],
        ..UpdateRequest::default()
    }
}

/// The task store's test, on the tmpfs mounted at `dir`.
fn store_child(dir: &Path) {
    let path = dir.join("journal");
    let runtime = runtime();
    let open = || {
        // The server's last handles on the journal may be dropped a moment after it stops.
        let mut tries = 0;
        let journal = loop {
            match Journal::open(&path, JournalOptions::default()) {
                Ok(journal) => break journal,
                Err(dtask::journal::Error::InUse { .. }) if tries < 1_000 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("the journal does not open: {e}"),
            }
        };
        TaskStore::open(journal, ManualClock::new(1_000), StoreConfig::default()).unwrap()
    };
    let store = open();
    // The store served, for its readiness (on loopback).
    let served = runtime.block_on(Served::start(Server::owner(
        store.clone(),
        None,
        ServerConfig::default(),
    )));
    assert_eq!(runtime.block_on(served.readiness(true)), json!([]));
    let ids: Vec<String> = (0..WRITERS).map(|w| format!("task-{w}")).collect();
    runtime.block_on(start(&store, &ids));
    let ballast_path = dir.join("ballast");
    ballast(&ballast_path, SLACK);
    let stopped = runtime.block_on(fill_with_updates(&store, &ids));
    println!("disk full after updates {stopped:?}");
    // Not ready while the disk is full; alive all the same (a restart would not help).
    assert_eq!(
        runtime.block_on(served.readiness(false)),
        json!(["disk_full"])
    );
    let (live, _) = runtime.block_on(served.get("/healthz"));
    assert_eq!(live, 200);
    runtime.block_on(async {
        for (id, &n) in ids.iter().zip(&stopped) {
            assert_eq!(store.get(id).await.unwrap().updates, n, "{id}'s updates");
        }
    });

    // Room again: the update refused is made again and recorded (not taken for a repeat of
    // one written before), then the task completes.
    std::fs::remove_file(&ballast_path).unwrap();
    let freed = Instant::now();
    runtime.block_on(async {
        for (id, &n) in ids.iter().zip(&stopped) {
            let recorded = loop {
                match store.append_update(id, update(n)).await {
                    Ok((_, recorded)) => break recorded,
                    Err(StoreError::Journal(e)) if e.is_no_space() => {
                        assert!(
                            freed.elapsed() < RESUME_WITHIN,
                            "the store did not write again within {RESUME_WITHIN:?} of the \
                             space being freed: {e}"
                        );
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => panic!("{id}, update {n} again: {e}"),
                }
            };
            assert!(
                recorded,
                "{id}: update {n} was taken for one recorded before"
            );
            let state = store.get(id).await.unwrap();
            store
                .execute(
                    id,
                    state.version,
                    Command::Complete {
                        data: b"done".to_vec(),
                    },
                )
                .await
                .unwrap();
        }
    });
    // Ready again once a batch is written.
    assert_eq!(runtime.block_on(served.readiness(true)), json!([]));
    runtime.block_on(served.stop());
    drop(store);

    // Opened again: each task completed with exactly its acknowledged updates; the audit is
    // clean.
    let store = open();
    runtime.block_on(async {
        for (id, &n) in ids.iter().zip(&stopped) {
            let state = store.get(id).await.unwrap();
            assert_eq!(
                (state.status, state.updates),
                (Status::Completed, n + 1),
                "{id}"
            );
        }
    });
    let audit = dtask::replay::audit_journal(store.journal(), &mut |_| {}).unwrap();
    assert!(audit.is_clean(), "{:?}", audit.problems);
}

/// Creates and starts each of `ids`' tasks.
async fn start(store: &TaskStore, ids: &[String]) {
    for id in ids {
        let created = store
            .create(CreateRequest {
                spec: TaskSpec::new(id.as_str(), "disk"),
                policy: Some(LeasePolicy::Retry),
                ..CreateRequest::default()
            })
            .await
            .unwrap();
        store
            .execute(id, created.version, Command::Start)
            .await
            .unwrap();
    }
}

/// Every writer (one a task, `task-0`, `task-1`, …) appends `event(id, position)` until the
/// disk is full, each failure a no-space one; then nothing of a failed append may be there:
/// each stream ends at its last acknowledged append. Returns how many each writer made.
async fn fill_streams(journal: &Journal, event: fn(&str, u64) -> Event) -> Vec<u64> {
    let ids: Vec<String> = (0..WRITERS).map(|w| format!("task-{w}")).collect();
    let stopped = until_full(&ids, |id, position| {
        let journal = journal.clone();
        async move {
            match journal
                .append_async(&id, position, &[event(&id, position)])
                .await
            {
                Ok(_) => true,
                Err(e) => {
                    assert!(e.is_no_space(), "{id} at {position}: {e}");
                    false
                }
            }
        }
    })
    .await;
    for (id, &len) in ids.iter().zip(&stopped) {
        let read = journal.read_stream(id, 0).count() as u64;
        assert_eq!(read, len, "{id}'s stream");
    }
    stopped
}

/// Appends progress updates to the running tasks `ids`, all at once, until the disk is
/// full: each refusal must say so. Returns how many updates each task took.
async fn fill_with_updates(store: &TaskStore, ids: &[String]) -> Vec<u64> {
    until_full(ids, |id, n| {
        let store = store.clone();
        async move {
            match store.append_update(&id, update(n)).await {
                Ok(_) => true,
                Err(StoreError::Journal(e)) if e.is_no_space() => false,
                Err(e) => panic!("{id}, update {n}: {e}"),
            }
        }
    })
    .await
}

/// One writer a task of `ids`, all at once, each making `write(id, n)` for n = 0, 1, …
/// until one is refused for a full disk (`false`; `write` panics at any other failure).
/// Returns how many writes each made.
async fn until_full<W, F>(ids: &[String], write: W) -> Vec<u64>
where
    W: Fn(String, u64) -> F,
    F: Future<Output = bool> + Send + 'static,
{
    let write = &write;
    let writers = ids.iter().map(|id| async move {
        for n in 0..MAX_APPENDS {
            // Each write on the runtime's workers, as a service's would be.
            if !tokio::spawn(write(id.clone(), n)).await.unwrap() {
                return n;
            }
        }
        panic!("{id}: the disk never filled in {MAX_APPENDS} writes");
    });
    futures::future::join_all(writers).await
}

/// A runtime of two worker threads.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The write path's metrics of `journal`, in a registry of their own.
fn observed(journal: &Journal) -> Registry {
    let mut registry = Registry::with_prefix("dtask");
    let metrics = dtask::server::WriteMetrics::register(&mut registry);
    journal.observe(metrics.observer());
    registry
}

/// The runtime's test, on the tmpfs mounted at `dir`: a tool runs; meanwhile another task's
/// appends fill the disk; the tool returns, its outcome is refused for the full disk (the
/// metrics count the failed batch) and waits; the space is freed, and the outcome is
/// recorded — the task completed, the tool run once.
fn runtime_child(dir: &Path) {
    let runtime = runtime();
    let (journal, registry, held, manager) = held_manager(dir);
    let ballast_path = dir.join("ballast");
    let state = runtime.block_on(async {
        let id = Held::submit(&manager).await;
        let execution = {
            let (manager, id) = (manager.clone(), id.clone());
            tokio::spawn(async move { manager.execute(&id).await })
        };
        held.started().await;

        // The disk fills under another task's appends while the tool runs.
        ballast(&ballast_path, SLACK);
        fill_with_filler(&journal).await;
        let failed = metric(&registry, "dtask_journal_batch_failures_total");

        // The tool returns; its outcome is refused (a batch fails) and waits.
        held.let_go(1);
        let refused = Instant::now();
        while metric(&registry, "dtask_journal_batch_failures_total") == failed {
            assert!(
                refused.elapsed() < RESUME_WITHIN,
                "the outcome was never tried"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            !execution.is_finished(),
            "the execution gave up on a full disk"
        );

        std::fs::remove_file(&ballast_path).unwrap();
        execution.await.unwrap().unwrap()
    });
    assert_eq!(state.status, Status::Completed);
    assert_eq!(state.result_data, b"done");
    assert_eq!(held.runs(), 1, "the tool ran once");
    let audit = dtask::replay::audit_journal(&journal, &mut |_| {}).unwrap();
    assert!(audit.is_clean(), "{:?}", audit.problems);
}

/// The worker's test, on the tmpfs mounted at `dir`: a task is pending; the disk fills under
/// another task's appends; a worker starts and its claims of the task are refused for the
/// full disk — it goes on polling (it ended at the first refusal before) — and once the space
/// is freed it claims the task, which completes, its tool run once.
fn worker_child(dir: &Path) {
    let runtime = runtime();
    let (journal, registry, held, manager) = held_manager(dir);
    held.let_go(1);
    let ballast_path = dir.join("ballast");
    let outcome = runtime.block_on(async {
        let id = Held::submit(&manager).await;
        ballast(&ballast_path, SLACK);
        fill_with_filler(&journal).await;
        let failed = metric(&registry, "dtask_journal_batch_failures_total");

        let worker = Worker::new(
            manager.clone(),
            WorkerConfig::new(["held"]).with_poll_interval(Duration::from_millis(20)),
        )
        .unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let worker = tokio::spawn(worker.run(async move {
            let _ = stopped.await;
        }));
        // Two claims refused: the worker outlived the first.
        let refused = Instant::now();
        while metric(&registry, "dtask_journal_batch_failures_total") < failed + 2 {
            assert!(
                !worker.is_finished(),
                "the worker ended at a claim refused for a full disk: {:?}",
                worker.await
            );
            assert!(refused.elapsed() < RESUME_WITHIN, "no claim was tried");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(held.runs(), 0, "nothing ran on a full disk");

        std::fs::remove_file(&ballast_path).unwrap();
        let outcome = tokio::time::timeout(RESUME_WITHIN, manager.wait(&id))
            .await
            .expect("the task completes once there is room")
            .unwrap();
        stop.send(()).unwrap();
        worker.await.unwrap().unwrap();
        outcome
    });
    assert!(
        matches!(outcome, TaskOutcome::Completed(ref data) if data == b"done"),
        "{outcome:?}"
    );
    assert_eq!(held.runs(), 1, "the tool ran once");
    let audit = dtask::replay::audit_journal(&journal, &mut |_| {}).unwrap();
    assert!(audit.is_clean(), "{:?}", audit.problems);
}

/// A journal on the tmpfs at `dir` with its write metrics, and a manager running the
/// [`Held`] tool on a store of it (a manual clock: no lease expires).
fn held_manager(dir: &Path) -> (Journal, Registry, Held, Manager) {
    let journal = Journal::open(dir.join("journal"), JournalOptions::default()).unwrap();
    let registry = observed(&journal);
    let store = TaskStore::open(
        journal.clone(),
        ManualClock::new(1_000),
        StoreConfig::default(),
    )
    .unwrap();
    let held = Held::default();
    let manager = Manager::new(store, held.registry(), ManagerConfig::default());
    (journal, registry, held, manager)
}

/// Appends to a task of its own until the disk is full (each refusal must say so).
async fn fill_with_filler(journal: &Journal) {
    let mut position = 0;
    loop {
        match journal
            .append_async("filler", position, &[event("filler", position)])
            .await
        {
            Ok(_) => position += 1,
            Err(e) if e.is_no_space() => return,
            Err(e) => panic!("filler at {position}: {e}"),
        }
        assert!(position < MAX_APPENDS, "the disk never filled");
    }
}

/// PostgreSQL's test, on the tmpfs mounted at `dir`: a private cluster (its own files on the
/// disk) keeps the journal's tables in a tablespace on the tmpfs; eight writers of
/// incompressible 64 KiB updates fill it. Every failure must be the server's `disk_full`
/// (a no-space storage error), each stream end at its last acknowledged append; once space
/// is freed, every writer goes on at its position, and the journal audits clean.
fn postgres_child(dir: &Path) {
    let Some(cluster) = Cluster::new("pg_disk_full") else {
        return;
    };
    let space = dir.join("tablespace");
    std::fs::create_dir(&space).unwrap();
    if cluster.user() == "postgres" {
        let owned = Process::new("chown")
            .arg("postgres")
            .arg(&space)
            .status()
            .unwrap();
        assert!(owned.success());
    }
    let runtime = runtime();
    runtime.block_on(async {
        let admin = format!(
            "host=127.0.0.1 port={} user={} dbname=postgres",
            cluster.port,
            cluster.user()
        );
        let (client, connection) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        // One statement a call: `CREATE TABLESPACE` refuses a transaction block.
        for statement in [
            format!("CREATE TABLESPACE small LOCATION '{}'", space.display()),
            "ALTER DATABASE postgres SET default_tablespace = small".to_owned(),
        ] {
            client.batch_execute(&statement).await.unwrap();
        }
    });
    let journal = Journal::open_postgres(&cluster.url("full"), JournalOptions::default()).unwrap();
    let ballast_path = dir.join("ballast");
    ballast(&ballast_path, SLACK);

    let stopped = runtime.block_on(fill_streams(&journal, incompressible));
    println!("tablespace full after {stopped:?}");
    assert_eq!(journal.write_state(), WriteState::DiskFull);

    // Room again: each writer goes on at its position.
    std::fs::remove_file(&ballast_path).unwrap();
    runtime.block_on(async {
        for (w, &at) in stopped.iter().enumerate() {
            let id = format!("task-{w}");
            for position in at..at + AFTER {
                journal
                    .append_async(&id, position, &[incompressible(&id, position)])
                    .await
                    .unwrap();
            }
        }
    });
    assert_eq!(journal.write_state(), WriteState::Writing);
    let audit = dtask::replay::audit_journal(&journal, &mut |_| {}).unwrap();
    assert!(audit.is_clean(), "{:?}", audit.problems);
    drop(journal);
    drop(cluster);
}

/// [`event`], its update's bytes made incompressible (PostgreSQL compresses large values).
fn incompressible(id: &str, position: u64) -> Event {
    let mut event = event(id, position);
    if let Event::UpdateAppended { data, .. } = &mut event {
        let mut state = position.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for byte in data.iter_mut() {
            // xorshift64
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = state.to_le_bytes()[0];
        }
    }
    event
}

/// The names in `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `dtask --journal JOURNAL ARGS…`.
fn dtask(journal: &Path, args: &[&std::ffi::OsStr]) -> std::process::Output {
    Process::new(env!("CARGO_BIN_EXE_dtask"))
        .arg("--journal")
        .arg(journal)
        .args(args)
        .output()
        .unwrap()
}

/// The import's test, on the tmpfs mounted at `dir`: an export of ~20 MiB (made beside the
/// tmpfs) imported where a few MiB are free fails for the full disk and leaves nothing;
/// once there is room, the same import succeeds and exports back to the same file.
fn import_child(dir: &Path) {
    let source = tempfile::tempdir().unwrap();
    {
        let journal = Journal::open(source.path(), JournalOptions::default()).unwrap();
        for position in 0..320 {
            journal
                .append("big", position, &[event("big", position)])
                .unwrap();
        }
    }
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("export.jsonl");
    let exported = dtask(
        source.path(),
        &["export".as_ref(), "--output".as_ref(), file.as_os_str()],
    );
    assert!(exported.status.success(), "{exported:?}");

    let ballast_path = dir.join("ballast");
    ballast(&ballast_path, SLACK);
    let target = dir.join("copy");
    let refused = dtask(&target, &["import".as_ref(), file.as_os_str()]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "the import fit: {stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert_eq!(
        entries(dir),
        ["ballast"],
        "the failed import left something"
    );

    std::fs::remove_file(&ballast_path).unwrap();
    let imported = dtask(&target, &["import".as_ref(), file.as_os_str()]);
    assert!(imported.status.success(), "{imported:?}");
    let again = work.path().join("again.jsonl");
    let exported = dtask(
        &target,
        &["export".as_ref(), "--output".as_ref(), again.as_os_str()],
    );
    assert!(exported.status.success(), "{exported:?}");
    assert!(
        std::fs::read(&file).unwrap() == std::fs::read(&again).unwrap(),
        "the import is not bit-exact"
    );
}

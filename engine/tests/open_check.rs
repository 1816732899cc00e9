//! What a store's open does with a journal that disagrees with itself: a `live` index that
//! lost or gained entries is derived from the streams again (and said so); a live task that
//! lost its last record, or a commit index that lost its tail, is refused with a typed error.
//! Each on a real journal damaged with raw RocksDB.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use dtask_engine::{Command, StoreConfig, StoreError, TaskStore};
use dtask_journal::keys::{self, Space};
use dtask_journal::LeasePolicy::Retry;
use dtask_journal::{Durability, Error, Inconsistency, Journal, JournalOptions};
use dtask_replay::Status;
use std::path::Path;

/// "run" running (attempt 1, a started marker), "wait" pending, "done" completed.
async fn build(env: &Env) {
    let store = env.store();
    running(store, "run", Retry).await;
    ok(
        store,
        "run",
        Command::CommitStart {
            checkpoint: cp("m"),
        },
    )
    .await;
    create(store, "wait", Retry).await;
    running(store, "done", Retry).await;
    ok(
        store,
        "done",
        Command::Complete {
            data: b"ok".to_vec(),
        },
    )
    .await;
}

fn tamper(dir: &Path, f: impl FnOnce(&rocksdb::DB)) {
    let cfs: Vec<_> = dtask_journal::keys::COLUMN_FAMILIES.to_vec();
    let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir, cfs).unwrap();
    f(&db);
}

fn cf(db: &rocksdb::DB, space: Space) -> &rocksdb::ColumnFamily {
    db.cf_handle(space.name()).unwrap()
}

fn try_open(dir: &Path, env: &Env) -> Result<TaskStore, StoreError> {
    let journal = Journal::open(
        dir,
        JournalOptions::default().with_durability(Durability::Buffered),
    )?;
    TaskStore::open(journal, env.clock.clone(), StoreConfig::default())
}

/// Closes the env's store, applies `f` to the raw database, and opens a store again.
fn damage_and_open(env: &mut Env, f: impl FnOnce(&rocksdb::DB)) -> Result<TaskStore, StoreError> {
    env.close();
    tamper(env.dir.path(), f);
    try_open(env.dir.path(), env)
}

#[tokio::test]
async fn a_lost_live_entry_of_a_running_task_is_derived_again() {
    let mut env = Env::new();
    build(&env).await;
    let store = damage_and_open(&mut env, |db| {
        db.delete_cf(cf(db, Space::Live), keys::task_key("run"))
            .unwrap();
    })
    .unwrap();
    let repair = store.repaired_live_index().unwrap();
    assert_eq!(repair.added, ["run"]);
    assert!(repair.removed.is_empty());
    // The task is recovered as it was: running, its started marker durable.
    let run = store.get("run").await.unwrap();
    assert_eq!(run.status, Status::Running);
    assert_eq!(run.checkpoint, cp("m"));
    drop(store);
    // The repair is durable: the next open has nothing to repair.
    let store = try_open(env.dir.path(), &env).unwrap();
    assert!(store.repaired_live_index().is_none());
    assert_eq!(store.get("run").await.unwrap().status, Status::Running);
}

/// A journal that purged a task repairs its index as any: the tombstone is an ended stream.
#[tokio::test]
async fn a_lost_live_entry_is_derived_again_beside_a_purged_task() {
    let mut env = Env::new();
    build(&env).await;
    env.store().purge("done").await.unwrap();
    let store = damage_and_open(&mut env, |db| {
        db.delete_cf(cf(db, Space::Live), keys::task_key("run"))
            .unwrap();
    })
    .unwrap();
    let repair = store.repaired_live_index().unwrap();
    assert_eq!(repair.added, ["run"]);
    assert!(repair.removed.is_empty());
    assert!(matches!(
        store.get("done").await,
        Err(StoreError::Purged { .. })
    ));
}

#[tokio::test]
async fn a_stray_live_entry_is_removed() {
    let mut env = Env::new();
    build(&env).await;
    let store = damage_and_open(&mut env, |db| {
        db.put_cf(cf(db, Space::Live), keys::task_key("done"), b"")
            .unwrap();
    })
    .unwrap();
    let repair = store.repaired_live_index().unwrap();
    assert!(repair.added.is_empty());
    assert_eq!(repair.removed, ["done"]);
    assert_eq!(store.get("done").await.unwrap().status, Status::Completed);
}

#[tokio::test]
async fn a_live_task_that_lost_its_last_record_is_refused() {
    let mut env = Env::new();
    build(&env).await;
    let last = {
        let journal = env.store().journal();
        journal.stream_len("run").unwrap().unwrap() - 1
    };
    let refused = damage_and_open(&mut env, |db| {
        db.delete_cf(cf(db, Space::Events), keys::event_key("run", last))
            .unwrap();
    });
    match refused {
        Err(StoreError::Journal(Error::Inconsistent(Inconsistency::LiveTasks {
            marker: 2,
            found: 2,
            digest_differs: true,
        }))) => {}
        other => panic!("{other:?}"),
    }
    // Nothing was written: the position is still free, for `dtask verify` to name.
    let reader = Journal::open_read_only(env.dir.path()).unwrap();
    assert_eq!(reader.stream_len("run").unwrap(), Some(last));
}

#[tokio::test]
async fn a_commit_index_that_lost_its_tail_is_refused() {
    let mut env = Env::new();
    build(&env).await;
    let last = env.store().journal().last_seq().unwrap();
    let refused = damage_and_open(&mut env, |db| {
        db.delete_cf(cf(db, Space::Commits), keys::seq_key(last))
            .unwrap();
    });
    assert!(
        matches!(
            refused,
            Err(StoreError::Journal(Error::Inconsistent(
                Inconsistency::CommitTail { .. }
            )))
        ),
        "{refused:?}"
    );
}

/// Tasks `t0` … `t49` created straight through `journal` (each append synced), as a
/// service that writes before it opens its store does.
fn create_through_the_journal(journal: &Journal) {
    for i in 0..50 {
        let id = format!("t{i}");
        let created = dtask_journal::Event::Created {
            spec: spec(&id).into(),
            policy: Retry,
            checkpoint: vec![],
            context_snapshot: vec![],
            at: dtask_journal::Timestamp(T0),
        };
        journal.append(&id, 0, &[created]).unwrap();
    }
}

/// The environment variable that makes this test binary a writer that crashes (see
/// [`the_open_releases_the_log_its_journal_replayed`]).
const CRASH_CHILD: &str = "DTASK_OPEN_CHECK_CRASH_CHILD";

/// Once its fold is over, a store's open starts the flush of the log the journal's open
/// replayed after a crash, so that it does not stay in memory until the first appends; the
/// store reads its tasks as before.
#[test]
fn the_open_releases_the_log_its_journal_replayed() {
    if let Some(dir) = std::env::var_os(CRASH_CHILD) {
        // The child: 50 tasks created, each synced, and a crash with the journal open.
        let journal = Journal::open(Path::new(&dir), JournalOptions::default()).unwrap();
        create_through_the_journal(&journal);
        std::process::abort();
    }
    let dir = tempfile::tempdir().unwrap();
    let crashed = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["the_open_releases_the_log_its_journal_replayed", "--exact"])
        .env(CRASH_CHILD, dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!crashed.success(), "the writer was to crash");
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let in_memory = |journal: &Journal| -> (u64, bool) {
        let stats = journal.storage_stats().unwrap().unwrap();
        (stats.memtable_bytes(), stats.flushing())
    };
    let (held, _) = in_memory(&journal);
    let store = TaskStore::open(
        journal.clone(),
        dtask_engine::ManualClock::new(T0),
        StoreConfig::default(),
    )
    .unwrap();
    // RocksDB's own threads do the flush: wait for it (a guard, not a measure).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (bytes, flushing) = in_memory(&journal);
        if !flushing && bytes < held / 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the store's open left {bytes} of {held} bytes in memory"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let task = runtime.block_on(store.get("t7")).unwrap();
    assert_eq!(task.status, Status::Pending);
}

/// A store opens over a journal that was appended to since its open (a service that wrote
/// before it recovered its tasks): the check holds the live tasks against the marker the
/// last batch wrote, not the one read at the open, and the store goes on from there.
#[test]
fn a_store_opens_over_a_journal_appended_to_since_its_open() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    create_through_the_journal(&journal);
    let store = TaskStore::open(
        journal,
        dtask_engine::ManualClock::new(T0),
        StoreConfig::default(),
    )
    .unwrap();
    assert!(store.repaired_live_index().is_none());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let task = store.get("t7").await.unwrap();
        assert_eq!(task.status, Status::Pending);
        let running = store
            .execute("t7", task.version, Command::Start)
            .await
            .unwrap();
        assert_eq!(running.status, Status::Running);
    });
}

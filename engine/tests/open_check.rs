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

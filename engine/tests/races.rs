//! Concurrency: racing commands on one task resolve to exactly one consistent outcome, and the
//! outbox holds exactly the lifecycle notifications that were committed.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use dtask_engine::{Command, TaskStore};
use dtask_journal::LeasePolicy::{Fail, Retry};
use dtask_replay::{load_task, Status};
use std::collections::BTreeMap;

const REPS: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_starts_one_winner() {
    let env = Env::new();
    let store = env.store().clone();
    for i in 0..REPS {
        let id = format!("t{i}");
        create(&store, &id, Retry).await;
        let spawn = |store: TaskStore, id: String| {
            tokio::spawn(async move { store.execute(&id, 1, Command::Start).await })
        };
        let a = spawn(store.clone(), id.clone());
        let b = spawn(store.clone(), id.clone());
        let results = [a.await.unwrap(), b.await.unwrap()];
        let wins = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(wins, 1, "{id}: {results:?}");
        for r in &results {
            if let Err(e) = r {
                assert!(
                    matches!(kind(e), "VersionConflict" | "IllegalTransition"),
                    "{e}"
                );
            }
        }
        let t = store.get(&id).await.unwrap();
        assert_eq!((t.status, t.attempt, t.version), (Status::Running, 1, 2));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_cancel_races_complete() {
    let env = Env::new();
    let store = env.store().clone();
    let mut completed = 0;
    let mut canceled = 0;
    for i in 0..REPS {
        let id = format!("t{i}");
        let policy = if i % 2 == 0 { Retry } else { Fail };
        store
            .create(request(session_spec(&id, true), policy))
            .await
            .unwrap();
        let version = ok(&store, &id, Command::Start).await.version;
        let cancel = {
            let (store, id) = (store.clone(), id.clone());
            tokio::spawn(async move {
                store
                    .execute(
                        &id,
                        version,
                        Command::RequestCancel {
                            reason: "stop".into(),
                        },
                    )
                    .await
            })
        };
        let complete = {
            let (store, id) = (store.clone(), id.clone());
            tokio::spawn(async move {
                store
                    .execute(
                        &id,
                        version,
                        Command::Complete {
                            data: b"done".to_vec(),
                        },
                    )
                    .await
            })
        };
        let cancel = cancel.await.unwrap();
        let complete = complete.await.unwrap();
        let t = store.get(&id).await.unwrap();
        match (&cancel, &complete) {
            (Err(e), Ok(done)) => {
                // Complete went first; the cancel found a terminal task.
                assert_eq!(kind(e), "AlreadyTerminal");
                assert_eq!(t.status, Status::Completed);
                assert_eq!(&t, done);
                assert_eq!(t.result_data, b"done");
                assert_eq!(t.cancel_requested_at, None);
                completed += 1;
            }
            (Ok(c), Err(e)) => {
                // The cancel went first; Complete's version is stale.
                assert_eq!(kind(e), "VersionConflict");
                assert_eq!(t.status, Status::Running);
                assert!(t.cancel_requested_at.is_some());
                assert_eq!(&t, c);
                assert_eq!(t.version, version + 1);
                // The attempt acknowledges.
                let acked = ok(
                    &store,
                    &id,
                    Command::AckCancel {
                        reason: String::new(),
                    },
                )
                .await;
                assert_eq!(
                    (acked.status, acked.result_error.as_str()),
                    (Status::Canceled, "stop")
                );
                canceled += 1;
            }
            other => panic!("{id}: inconsistent outcome {other:?}"),
        }
    }
    assert_eq!(completed + canceled, REPS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_matches_committed_lifecycle() {
    let env = Env::new();
    let store = env.store().clone();
    let mut handles = Vec::new();
    for i in 0..REPS {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let id = format!("t{i:03}");
            let (session, notify) = match i % 4 {
                0 => (false, false),
                1 => (true, false),
                _ => (true, true),
            };
            let spec = if session {
                session_spec(&id, notify)
            } else {
                spec(&id)
            };
            let policy = if i % 3 == 0 { Fail } else { Retry };
            store.create(request(spec, policy)).await.unwrap();
            let v = ok(&store, &id, Command::Start).await.version;
            if i % 5 == 0 {
                ok(
                    &store,
                    &id,
                    Command::WaitInput {
                        checkpoint: b"w".to_vec(),
                    },
                )
                .await;
                ok(
                    &store,
                    &id,
                    Command::Resume {
                        data: vec![],
                        context_snapshot: None,
                    },
                )
                .await;
                let v = ok(&store, &id, Command::Start).await.version;
                race(&store, &id, v).await;
            } else {
                race(&store, &id, v).await;
            }
            store.get(&id).await.unwrap()
        }));
    }
    let mut expected = Vec::new();
    for h in handles {
        let t = h.await.unwrap();
        assert!(t.is_terminal());
        if t.spec.session_id.is_empty() {
            continue;
        }
        expected.push(format!("{}:1:task_created", t.spec.id));
        if t.spec.notify_session {
            if t.spec.id.ends_with('0') || t.spec.id.ends_with('5') {
                // Every fifth task waited for input once (at version 3).
                expected.push(format!("{}:3:waiting_input", t.spec.id));
            }
            expected.push(format!("{}:{}:{}", t.spec.id, t.version, t.status));
        }
    }
    let got = receive_all(&store).await;
    let mut ids: Vec<String> = got.iter().map(|n| n.id.clone()).collect();
    // Per task, notifications come in the order of their transitions.
    let mut per_task: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for n in &got {
        per_task
            .entry(n.task_id.as_str())
            .or_default()
            .push(n.version);
        assert_eq!(n.session_id, "session-1");
    }
    for versions in per_task.values() {
        assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
    }
    ids.sort();
    expected.sort();
    assert_eq!(ids, expected);
    for n in &got {
        store.ack_notification(&n.receipt).await.unwrap();
    }
    assert!(receive_all(&store).await.is_empty());
}

/// `Complete` and `RequestCancel` race at version `v`; a surviving cancel intent is acknowledged.
async fn race(store: &TaskStore, id: &str, v: u64) {
    let a = {
        let (store, id) = (store.clone(), id.to_owned());
        tokio::spawn(async move {
            store
                .execute(&id, v, Command::Complete { data: vec![] })
                .await
        })
    };
    let b = {
        let (store, id) = (store.clone(), id.to_owned());
        tokio::spawn(async move {
            store
                .execute(
                    &id,
                    v,
                    Command::RequestCancel {
                        reason: String::new(),
                    },
                )
                .await
        })
    };
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert!(a.is_ok() != b.is_ok(), "{id}: {a:?} {b:?}");
    if b.is_ok() {
        ok(
            store,
            id,
            Command::AckCancel {
                reason: String::new(),
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_races_readers() {
    let env = Env::new();
    let store = env.store().clone();
    for i in 0..REPS {
        let id = format!("t{i}");
        let reader = {
            let (store, id) = (store.clone(), id.clone());
            tokio::spawn(async move {
                // Claim the task as soon as it can be read.
                loop {
                    if let Ok(t) = store.get(&id).await {
                        return store.execute(&id, t.version, Command::Start).await;
                    }
                    tokio::task::yield_now().await;
                }
            })
        };
        create(&store, &id, Retry).await;
        let claimed = reader.await.unwrap().unwrap();
        assert_eq!(claimed.status, Status::Running);
        // The store's view, the journal's fold and the listings agree.
        let t = store.get(&id).await.unwrap();
        let folded = load_task(store.journal(), &id).unwrap().unwrap().state;
        assert_eq!(t, folded, "{id}");
        let pending = store.list_pending(&keys(), None, 0).await.unwrap();
        assert!(
            pending.tasks.iter().all(|p| p.spec.id != id),
            "{id} listed pending"
        );
        let done = store
            .execute(&id, t.version, Command::Complete { data: vec![] })
            .await
            .unwrap();
        assert_eq!(done.status, Status::Completed);
    }
}

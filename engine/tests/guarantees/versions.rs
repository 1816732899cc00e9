//! Guarantees of the task store: version and CAS.

use super::*;

#[tokio::test]
async fn g008_every_mutation_raises_version_by_one() {
    let env = Env::new();
    let store = env.store();
    create(store, "a", Retry).await;
    create(store, "b", Retry).await;
    let script_a = [
        Command::Start,
        Command::Heartbeat,
        Command::CommitStart {
            checkpoint: cp("c"),
        },
        Command::ReportTranscriptFailure { error: "e".into() },
        Command::WaitInput {
            checkpoint: cp("w"),
        },
        Command::Resume {
            data: cp("in"),
            context_snapshot: None,
        },
        Command::Start,
        Command::Suspend {
            checkpoint: cp("s"),
        },
        Command::ReleaseSuspension {
            context_snapshot: None,
        },
        Command::Start,
        Command::Yield { checkpoint: vec![] },
        Command::Start,
        Command::Complete { data: cp("done") },
    ];
    let script_b = [
        Command::Start,
        Command::RequestCancel {
            reason: String::new(),
        },
        Command::AckCancel {
            reason: String::new(),
        },
    ];
    for (id, script) in [("a", &script_a[..]), ("b", &script_b[..])] {
        for command in script {
            let before = store.get(id).await.unwrap().version;
            let after = store.execute(id, before, command.clone()).await.unwrap();
            assert_eq!(after.version, before + 1, "{id}: {command:?}");
        }
    }
    create(store, "c", Retry).await;
    let t = store
        .execute(
            "c",
            1,
            Command::RequestCancel {
                reason: String::new(),
            },
        )
        .await
        .unwrap();
    assert_eq!(t.version, 2);
    // Lease expiry written down also counts one.
    let r = running(store, "d", Retry).await;
    env.advance(LEASE_MS);
    assert_eq!(store.get("d").await.unwrap().version, r.version + 1);
}

#[tokio::test]
async fn g009_stale_version_conflicts_and_changes_nothing() {
    let env = Env::new();
    let store = env.store();
    create(store, "p", Retry).await;
    let r = running(store, "r", Retry).await;
    store
        .execute(
            "r",
            r.version,
            Command::CommitStart {
                checkpoint: cp("c"),
            },
        )
        .await
        .unwrap();
    ok(store, "r", Command::Heartbeat).await;
    create(store, "w", Retry).await;
    ok(store, "w", Command::Start).await;
    ok(
        store,
        "w",
        Command::CommitStart {
            checkpoint: cp("c"),
        },
    )
    .await;
    ok(
        store,
        "w",
        Command::WaitInput {
            checkpoint: cp("w"),
        },
    )
    .await;
    create(store, "s", Retry).await;
    ok(store, "s", Command::Start).await;
    ok(
        store,
        "s",
        Command::CommitStart {
            checkpoint: cp("c"),
        },
    )
    .await;
    ok(
        store,
        "s",
        Command::Suspend {
            checkpoint: cp("s"),
        },
    )
    .await;
    let cases: Vec<(&str, Command)> = vec![
        ("p", Command::Start),
        ("p", Command::RequestCancel { reason: "x".into() }),
        ("r", Command::Heartbeat),
        ("r", Command::Complete { data: vec![] }),
        ("r", Command::Fail { error: "e".into() }),
        ("r", Command::Yield { checkpoint: vec![] }),
        (
            "r",
            Command::WaitInput {
                checkpoint: cp("x"),
            },
        ),
        (
            "r",
            Command::Suspend {
                checkpoint: cp("x"),
            },
        ),
        (
            "r",
            Command::AckCancel {
                reason: String::new(),
            },
        ),
        ("r", Command::ReportTranscriptFailure { error: "e".into() }),
        (
            "r",
            Command::RequestCancel {
                reason: String::new(),
            },
        ),
        (
            "w",
            Command::Resume {
                data: vec![],
                context_snapshot: None,
            },
        ),
        (
            "s",
            Command::ReleaseSuspension {
                context_snapshot: None,
            },
        ),
    ];
    for (id, command) in cases {
        let before = store.get(id).await.unwrap();
        for stale in [before.version - 1, before.version + 1] {
            let r = store.execute(id, stale, command.clone()).await;
            assert_err!(r, StoreError::VersionConflict { .. });
            assert_eq!(store.get(id).await.unwrap(), before, "{id} {command:?}");
        }
    }
}

#[tokio::test]
async fn g010_non_lifecycle_operations_keep_version() {
    let env = Env::new();
    let store = env.store();
    let v = routed_running(&env, "a", true, Retry).await;
    store
        .append_update("a", update(1, "e1", "x"))
        .await
        .unwrap();
    store
        .append_update("a", update(1, "e1", "x"))
        .await
        .unwrap();
    store
        .enqueue_notification("a", 1, note("n1", "app", "d"))
        .await
        .unwrap();
    let t = store
        .execute(
            "a",
            v,
            Command::ReportTranscriptFailure {
                error: "first".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(t.version, v + 1);
    let again = store
        .execute(
            "a",
            v + 1,
            Command::ReportTranscriptFailure {
                error: "second".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(again.version, v + 1);
    let c = store
        .execute("a", v + 1, Command::RequestCancel { reason: "r".into() })
        .await
        .unwrap();
    assert_eq!(c.version, v + 2);
    let c2 = store
        .execute(
            "a",
            v + 2,
            Command::RequestCancel {
                reason: "r2".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(c2.version, v + 2);
    for n in receive_all(store).await {
        store.ack_notification(&n.receipt).await.unwrap();
    }
    assert_eq!(store.get("a").await.unwrap().version, v + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g011_wait_for_version_ignores_updates() {
    let env = Env::new();
    let store = env.store().clone();
    let r = running(&store, "a", Retry).await;
    let waiter = {
        let store = store.clone();
        let after = r.version;
        tokio::spawn(async move { store.wait_for_task_version("a", after).await })
    };
    // Updates change the stream but not the version: the waiter must stay blocked.
    for i in 0..5 {
        store
            .append_update("a", update(1, &format!("e{i}"), "x"))
            .await
            .unwrap();
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert!(!waiter.is_finished(), "woken by a task event");
    }
    let hb = ok(&store, "a", Command::Heartbeat).await;
    let got = waiter.await.unwrap().unwrap();
    assert!(got.version > r.version);
    assert_eq!(got.version, hb.version);
    // Already past: returns at once, with a version above the one asked.
    let now = store.wait_for_task_version("a", 1).await.unwrap();
    assert!(now.version > 1);
}

/// The change channel of a task is made at the first subscription: a receiver made after
/// changes starts at the latest counters, and sees every later one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_starts_at_the_latest_change_and_follows() {
    let env = Env::new();
    let store = env.store().clone();
    let r = running(&store, "a", Retry).await;
    store
        .append_update("a", update(1, "e0", "x"))
        .await
        .unwrap();
    let mut rx = store.watch("a").unwrap();
    let first = *rx.borrow_and_update();
    assert_eq!(first.version, r.version);
    assert_eq!(first.position, store.get("a").await.unwrap().position);
    let hb = ok(&store, "a", Command::Heartbeat).await;
    rx.changed().await.unwrap();
    assert_eq!(rx.borrow_and_update().version, hb.version);
    // A second receiver shares the channel and starts where it is.
    let second = store.watch("a").unwrap();
    assert_eq!(second.borrow().version, hb.version);
}

#[tokio::test]
async fn appends_after_a_restart_chain_from_the_recovered_heads() {
    let mut env = Env::new();
    let v = routed_running(&env, "a", true, Retry).await;
    env.store()
        .append_update("a", update(1, "e1", "x"))
        .await
        .unwrap();
    env.store()
        .create(request(session_spec("b", false), Retry))
        .await
        .unwrap();
    env.reopen();
    // The first appends after the restart frame on the heads the recovery handed the writer.
    env.store()
        .append_update("a", update(1, "e2", "y"))
        .await
        .unwrap();
    env.store()
        .execute("a", v, Command::Heartbeat)
        .await
        .unwrap();
    let b = env.store().get("b").await.unwrap();
    env.store()
        .execute("b", b.version, Command::Start)
        .await
        .unwrap();
    let journal = env.store().journal().clone();
    for task in ["a", "b"] {
        let records: Vec<_> = journal
            .read_stream(task, 0)
            .collect::<Result<_, _>>()
            .unwrap();
        let head = journal.head(task).unwrap().unwrap();
        assert_eq!(head.next_position, records.len() as u64, "{task}");
    }
    let report = dtask_replay::audit::audit_journal(&journal, &mut |_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// Recovery folds the live tasks in chunks on several threads and indexes each chunk as it
/// comes: with more live tasks than a few chunks hold, every one comes back as it was, the
/// pending ones are listed in id order, and the first appends after the restart chain on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_many_live_tasks_brings_back_and_indexes_each() {
    let mut env = Env::new();
    let ids: Vec<String> = (0..1_300).map(|i| format!("t{i:05}")).collect();
    let mut before = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let task = create(env.store(), id, Retry).await;
        before.push(if i % 3 == 0 {
            ok(env.store(), id, Command::Start).await
        } else {
            task
        });
    }
    env.reopen();
    let store = env.store();
    for (id, was) in ids.iter().zip(&before) {
        assert_eq!(&store.get(id).await.unwrap(), was, "{id}");
    }
    let page = store.list_pending(&keys(), None, 10_000).await.unwrap();
    let pending: Vec<&str> = page.tasks.iter().map(|t| t.spec.id.as_str()).collect();
    let expected: Vec<&str> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 0)
        .map(|(_, id)| id.as_str())
        .collect();
    assert_eq!(pending, expected);
    for id in [&ids[0], &ids[ids.len() - 1], &ids[3 * 300]] {
        ok(store, id, Command::Heartbeat).await;
    }
    ok(store, &ids[1], Command::Start).await;
    let report = dtask_replay::audit::audit_journal(store.journal(), &mut |_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[tokio::test]
async fn g012_wait_for_unknown_task_not_found() {
    let env = Env::new();
    assert_err!(
        env.store().wait_for_task_version("nope", 0).await,
        StoreError::NotFound { .. }
    );
}

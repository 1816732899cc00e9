//! Guarantees of the task store: claiming and attempts.

use super::*;

#[tokio::test]
async fn g013_start_only_from_pending() {
    let env = Env::new();
    let store = env.store();
    let r = running(store, "running", Retry).await;
    assert_err!(
        store.execute("running", r.version, Command::Start).await,
        StoreError::IllegalTransition { .. }
    );
    running(store, "w", Retry).await;
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
            checkpoint: cp("c"),
        },
    )
    .await;
    running(store, "s", Retry).await;
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
            checkpoint: cp("c"),
        },
    )
    .await;
    running(store, "done", Retry).await;
    ok(store, "done", Command::Complete { data: vec![] }).await;
    running(store, "failed", Retry).await;
    ok(store, "failed", Command::Fail { error: "e".into() }).await;
    create(store, "canceled", Retry).await;
    ok(
        store,
        "canceled",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    for id in ["running", "w", "s", "done", "failed", "canceled"] {
        let before = store.get(id).await.unwrap();
        assert_err!(
            exec(store, id, Command::Start).await,
            StoreError::IllegalTransition { .. }
        );
        assert_eq!(store.get(id).await.unwrap(), before);
    }
    // From pending with the current version it succeeds; a stale one conflicts.
    create(store, "p", Retry).await;
    assert_err!(
        store.execute("p", 2, Command::Start).await,
        StoreError::VersionConflict { .. }
    );
    assert_eq!(
        store.execute("p", 1, Command::Start).await.unwrap().status,
        Status::Running
    );
}

#[tokio::test]
async fn g014_start_raises_attempt_by_one() {
    let env = Env::new();
    let store = env.store();
    create(store, "a", Retry).await;
    for n in 1..=3 {
        let t = ok(store, "a", Command::Start).await;
        assert_eq!(t.status, Status::Running);
        assert_eq!(t.attempt, n);
        assert_eq!(t.lease_deadline, Some(Timestamp(T0 + LEASE_MS)));
        ok(store, "a", Command::Yield { checkpoint: vec![] }).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g015_one_start_wins_per_version() {
    let env = Env::new();
    let store = env.store().clone();
    create(&store, "a", Retry).await;
    let mut handles = Vec::new();
    for _ in 0..8 {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            store.execute("a", 1, Command::Start).await
        }));
    }
    let mut wins = 0;
    for h in handles {
        match h.await.unwrap() {
            Ok(t) => {
                wins += 1;
                assert_eq!(t.attempt, 1);
            }
            Err(e) => assert!(
                matches!(
                    e,
                    StoreError::VersionConflict { .. } | StoreError::IllegalTransition { .. }
                ),
                "{e}"
            ),
        }
    }
    assert_eq!(wins, 1);
    let t = store.get("a").await.unwrap();
    assert_eq!((t.attempt, t.version), (1, 2));
}

#[tokio::test]
async fn g016_attempt_unchanged_by_yield_expiry_resume_release() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    assert_eq!(
        ok(store, "a", Command::Yield { checkpoint: vec![] })
            .await
            .attempt,
        1
    );
    ok(store, "a", Command::Start).await;
    env.advance(LEASE_MS);
    let expired = store.get("a").await.unwrap();
    assert_eq!((expired.status, expired.attempt), (Status::Pending, 2));
    ok(store, "a", Command::Start).await;
    ok(
        store,
        "a",
        Command::CommitStart {
            checkpoint: cp("c"),
        },
    )
    .await;
    ok(
        store,
        "a",
        Command::WaitInput {
            checkpoint: cp("c"),
        },
    )
    .await;
    let resumed = ok(
        store,
        "a",
        Command::Resume {
            data: vec![],
            context_snapshot: None,
        },
    )
    .await;
    assert_eq!(resumed.attempt, 3);
    ok(store, "a", Command::Start).await;
    ok(
        store,
        "a",
        Command::Suspend {
            checkpoint: cp("c"),
        },
    )
    .await;
    let released = ok(
        store,
        "a",
        Command::ReleaseSuspension {
            context_snapshot: None,
        },
    )
    .await;
    assert_eq!(released.attempt, 4);
}

#[tokio::test]
async fn g017_attempt_only_grows() {
    let env = Env::new();
    let store = env.store();
    create(store, "a", Retry).await;
    let mut last = 0;
    let script = [
        Command::Start,
        Command::Heartbeat,
        Command::Yield {
            checkpoint: cp("y"),
        },
        Command::Start,
        Command::WaitInput {
            checkpoint: cp("w"),
        },
        Command::Resume {
            data: cp("d"),
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
        Command::RequestCancel {
            reason: String::new(),
        },
        Command::AckCancel {
            reason: String::new(),
        },
    ];
    for command in script {
        let t = ok(store, "a", command).await;
        assert!(t.attempt >= last);
        last = t.attempt;
    }
    assert_eq!(last, 4);
}

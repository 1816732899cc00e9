//! Guarantees of the task store: `CommitStart`.

use super::*;

#[tokio::test]
async fn g024_commit_start_stores_checkpoint() {
    let env = Env::new();
    let store = env.store();
    let r = running(store, "a", Retry).await;
    let t = store
        .execute(
            "a",
            r.version,
            Command::CommitStart {
                checkpoint: cp("started"),
            },
        )
        .await
        .unwrap();
    assert_eq!(t.status, Status::Running);
    assert_eq!(t.checkpoint, b"started");
    assert_eq!(t.version, r.version + 1);
}

#[tokio::test]
async fn g025_second_commit_start_illegal() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    let t = ok(
        store,
        "a",
        Command::CommitStart {
            checkpoint: cp("one"),
        },
    )
    .await;
    assert_err!(
        store
            .execute(
                "a",
                t.version,
                Command::CommitStart {
                    checkpoint: cp("two"),
                },
            )
            .await,
        StoreError::IllegalTransition { .. }
    );
    assert_eq!(store.get("a").await.unwrap(), t);
    // An initial checkpoint from Create counts as started too.
    let mut req = request(spec("b"), Retry);
    req.checkpoint = cp("initial");
    store.create(req).await.unwrap();
    ok(store, "b", Command::Start).await;
    assert_err!(
        exec(
            store,
            "b",
            Command::CommitStart {
                checkpoint: cp("x"),
            },
        )
        .await,
        StoreError::IllegalTransition { .. }
    );
}

#[tokio::test]
async fn g026_commit_start_stale_version() {
    let env = Env::new();
    let store = env.store();
    let r = running(store, "a", Retry).await;
    ok(store, "a", Command::Heartbeat).await;
    assert_err!(
        store
            .execute(
                "a",
                r.version,
                Command::CommitStart {
                    checkpoint: cp("c"),
                },
            )
            .await,
        StoreError::VersionConflict { .. }
    );
    assert!(store.get("a").await.unwrap().checkpoint.is_empty());
}

#[tokio::test]
async fn g027_yield_without_checkpoint_keeps_it() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    ok(
        store,
        "a",
        Command::CommitStart {
            checkpoint: cp("started"),
        },
    )
    .await;
    let t = ok(store, "a", Command::Yield { checkpoint: vec![] }).await;
    assert_eq!(t.status, Status::Pending);
    assert_eq!(t.checkpoint, b"started");
}

#[tokio::test]
async fn g028_commit_start_empty_checkpoint_rejected() {
    let env = Env::new();
    let store = env.store();
    let r = running(store, "a", Retry).await;
    assert_err!(
        store
            .execute("a", r.version, Command::CommitStart { checkpoint: vec![] })
            .await,
        StoreError::Invalid { .. }
    );
    assert_eq!(store.get("a").await.unwrap(), r);
}

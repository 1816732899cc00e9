//! Guarantees of the task store: yield.

use super::*;

#[tokio::test]
async fn g064_yield_to_pending_without_notification() {
    let env = Env::new();
    let store = env.store();
    let v = routed_running(&env, "a", true, Retry).await;
    drain(store).await;
    let t = store
        .execute("a", v, Command::Yield { checkpoint: vec![] })
        .await
        .unwrap();
    assert_eq!(t.status, Status::Pending);
    assert_eq!(t.lease_deadline, None);
    assert!(receive_all(store).await.is_empty());
    assert_err!(
        store.execute("a", t.version, Command::Heartbeat).await,
        StoreError::LeaseLost { .. }
    );
}

#[tokio::test]
async fn g065_yield_checkpoint_replaces_or_keeps() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    ok(
        store,
        "a",
        Command::CommitStart {
            checkpoint: cp("c0"),
        },
    )
    .await;
    assert_eq!(
        ok(
            store,
            "a",
            Command::Yield {
                checkpoint: cp("c1")
            }
        )
        .await
        .checkpoint,
        b"c1"
    );
    ok(store, "a", Command::Start).await;
    assert_eq!(
        ok(store, "a", Command::Yield { checkpoint: vec![] })
            .await
            .checkpoint,
        b"c1"
    );
}

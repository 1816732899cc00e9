//! Guarantees of the task store: lease expiry.

use super::*;

#[tokio::test]
async fn g049_retry_expiry_pending_on_next_read() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    let r = ok(
        store,
        "a",
        Command::CommitStart {
            checkpoint: cp("c"),
        },
    )
    .await;
    env.advance(LEASE_MS - 1);
    assert_eq!(store.get("a").await.unwrap(), r);
    env.advance(1);
    let t = store.get("a").await.unwrap();
    assert_eq!(t.status, Status::Pending);
    assert!(t.version > r.version);
    assert_eq!(t.attempt, r.attempt);
    assert_eq!(t.checkpoint, b"c");
    // Written down as a lease_expired event.
    let last = store
        .journal()
        .read_stream("a", t.position - 1)
        .next()
        .unwrap()
        .unwrap();
    assert!(matches!(last.event, Event::LeaseExpired { .. }));
}

#[tokio::test]
async fn g050_fail_expiry_failed_on_next_read() {
    let env = Env::new();
    let store = env.store();
    let r = running(store, "a", Fail).await;
    env.advance(LEASE_MS);
    let t = store.get("a").await.unwrap();
    assert_eq!(t.status, Status::Failed);
    assert_eq!(t.result_error, LEASE_EXPIRED_ERROR);
    assert_eq!(t.version, r.version + 1);
    // Listing resolves it too.
    running(store, "b", Fail).await;
    env.advance(LEASE_MS);
    store.list_pending(&keys(), None, 0).await.unwrap();
    let t = store.get("b").await.unwrap();
    assert_eq!((t.status, t.version), (Status::Failed, 3));
}

#[tokio::test]
async fn g051_heartbeat_extends_the_lease() {
    let env = Env::new();
    let store = env.store();
    let r = running(store, "a", Retry).await;
    env.advance(LEASE_MS - 1);
    let hb = store
        .execute("a", r.version, Command::Heartbeat)
        .await
        .unwrap();
    assert_eq!(hb.lease_deadline, Some(Timestamp(T0 + 2 * LEASE_MS - 1)));
    env.advance(LEASE_MS - 1);
    assert_eq!(store.get("a").await.unwrap().status, Status::Running);
    env.advance(1);
    assert_err!(
        store.execute("a", hb.version, Command::Heartbeat).await,
        StoreError::VersionConflict { .. }
    );
    assert_eq!(store.get("a").await.unwrap().status, Status::Pending);
}

#[tokio::test]
async fn g052_retry_has_no_attempt_limit() {
    let env = Env::new();
    let store = env.store();
    create(store, "a", Retry).await;
    for n in 1..=25 {
        let t = ok(store, "a", Command::Start).await;
        assert_eq!(t.attempt, n);
        env.advance(LEASE_MS);
        assert_eq!(store.get("a").await.unwrap().status, Status::Pending);
    }
}

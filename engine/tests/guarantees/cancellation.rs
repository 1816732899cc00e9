//! Guarantees of the task store: cancellation.

use super::*;

#[tokio::test]
async fn g038_request_cancel_running_keeps_running() {
    let env = Env::new();
    let store = env.store();
    let r = running(store, "a", Retry).await;
    env.advance(10_000);
    let t = store
        .execute(
            "a",
            r.version,
            Command::RequestCancel {
                reason: "stop".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(t.status, Status::Running);
    assert_eq!(t.cancel_requested_at, Some(Timestamp(T0 + 10_000)));
    assert_eq!(t.cancel_reason, "stop");
    assert_eq!(t.version, r.version + 1);
    // The lease is extended to now + timeout.
    assert_eq!(t.lease_deadline, Some(Timestamp(T0 + 10_000 + LEASE_MS)));
}

#[tokio::test]
async fn g039_first_cancel_reason_wins() {
    let env = Env::new();
    let store = env.store();
    let r = running(store, "a", Retry).await;
    let first = store
        .execute(
            "a",
            r.version,
            Command::RequestCancel {
                reason: "first".into(),
            },
        )
        .await
        .unwrap();
    env.advance(1);
    let second = store
        .execute(
            "a",
            first.version,
            Command::RequestCancel {
                reason: "second".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(second, first);
    assert_eq!(second.cancel_reason, "first");
    assert_eq!(second.cancel_requested_at, Some(Timestamp(T0)));
}

#[tokio::test]
async fn g040_ack_cancel_reason_precedence() {
    let env = Env::new();
    let store = env.store();
    running(store, "intent", Retry).await;
    ok(
        store,
        "intent",
        Command::RequestCancel {
            reason: "durable".into(),
        },
    )
    .await;
    let t = ok(
        store,
        "intent",
        Command::AckCancel {
            reason: "ack".into(),
        },
    )
    .await;
    assert_eq!(t.result_error, "durable");
    running(store, "ack", Retry).await;
    let t = ok(
        store,
        "ack",
        Command::AckCancel {
            reason: "ack".into(),
        },
    )
    .await;
    assert_eq!(t.result_error, "ack");
    running(store, "none", Retry).await;
    let t = ok(
        store,
        "none",
        Command::AckCancel {
            reason: String::new(),
        },
    )
    .await;
    assert_eq!(t.result_error, DEFAULT_CANCEL_REASON);
    // An empty durable reason falls through to the ack reason.
    running(store, "empty", Retry).await;
    ok(
        store,
        "empty",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    let t = ok(
        store,
        "empty",
        Command::AckCancel {
            reason: "ack".into(),
        },
    )
    .await;
    assert_eq!(t.result_error, "ack");
}

#[tokio::test]
async fn g041_cancel_never_started_pending_is_direct() {
    let env = Env::new();
    let store = env.store();
    for policy in [Retry, Fail] {
        let id = policy.as_str();
        create(store, id, policy).await;
        let t = store
            .execute(
                id,
                1,
                Command::RequestCancel {
                    reason: String::new(),
                },
            )
            .await
            .unwrap();
        assert_eq!(t.status, Status::Canceled);
        assert_eq!(t.result_error, DEFAULT_CANCEL_REASON);
        assert_eq!(t.version, 2);
        assert!(t.done_at.is_some());
    }
    // A fail-policy pending task that ran before is canceled directly too.
    running(store, "f2", Fail).await;
    ok(store, "f2", Command::Yield { checkpoint: vec![] }).await;
    let t = ok(store, "f2", Command::RequestCancel { reason: "r".into() }).await;
    assert_eq!((t.status, t.result_error.as_str()), (Status::Canceled, "r"));
}

#[tokio::test]
async fn g042_cancel_waiting_or_suspended_is_direct() {
    let env = Env::new();
    let store = env.store();
    running(store, "w", Retry).await;
    ok(
        store,
        "w",
        Command::WaitInput {
            checkpoint: cp("w"),
        },
    )
    .await;
    running(store, "s", Retry).await;
    ok(
        store,
        "s",
        Command::Suspend {
            checkpoint: cp("s"),
        },
    )
    .await;
    for id in ["w", "s"] {
        let t = ok(
            store,
            id,
            Command::RequestCancel {
                reason: "bye".into(),
            },
        )
        .await;
        assert_eq!(t.status, Status::Canceled);
        assert_eq!(t.result_error, "bye");
    }
    assert!(store
        .list_suspended(&keys(), None, 0)
        .await
        .unwrap()
        .tasks
        .is_empty());
}

#[tokio::test]
async fn g043_cancel_retried_pending_keeps_intent() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    ok(store, "a", Command::Yield { checkpoint: vec![] }).await;
    let t = ok(store, "a", Command::RequestCancel { reason: "r".into() }).await;
    assert_eq!(t.status, Status::Pending);
    assert_eq!(t.cancel_requested_at, Some(Timestamp(T0)));
    assert!(t.done_at.is_none());
    let listed = store.list_pending(&keys(), None, 0).await.unwrap();
    assert_eq!(listed.tasks, [t]);
}

#[tokio::test]
async fn g044_claim_with_intent_exposes_it() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    ok(store, "a", Command::Yield { checkpoint: vec![] }).await;
    ok(store, "a", Command::RequestCancel { reason: "r".into() }).await;
    let claimed = ok(store, "a", Command::Start).await;
    assert_eq!(claimed.status, Status::Running);
    assert_eq!(claimed.attempt, 2);
    assert_eq!(claimed.cancel_requested_at, Some(Timestamp(T0)));
    assert_eq!(claimed.cancel_reason, "r");
    // The claimed attempt can only acknowledge.
    assert_err!(
        exec(store, "a", Command::Heartbeat).await,
        StoreError::LeaseLost { .. }
    );
    let done = ok(
        store,
        "a",
        Command::AckCancel {
            reason: String::new(),
        },
    )
    .await;
    assert_eq!(done.result_error, "r");
}

#[tokio::test]
async fn g045_retry_expiry_with_intent_back_to_pending() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    let c = ok(store, "a", Command::RequestCancel { reason: "r".into() }).await;
    env.advance(LEASE_MS);
    let t = store.get("a").await.unwrap();
    assert_eq!(t.status, Status::Pending);
    assert_eq!(t.version, c.version + 1);
    assert_eq!(t.cancel_requested_at, c.cancel_requested_at);
    assert_eq!(t.cancel_reason, "r");
}

#[tokio::test]
async fn g046_fail_expiry_with_intent_canceled() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Fail).await;
    ok(store, "a", Command::RequestCancel { reason: "r".into() }).await;
    env.advance(LEASE_MS);
    let t = store.get("a").await.unwrap();
    assert_eq!(t.status, Status::Canceled);
    assert_eq!(t.result_error, "r");
    running(store, "b", Fail).await;
    ok(
        store,
        "b",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    env.advance(LEASE_MS);
    assert_eq!(
        store.get("b").await.unwrap().result_error,
        DEFAULT_CANCEL_REASON
    );
}

#[tokio::test]
async fn g048_cancel_intent_alone_sends_no_notification() {
    let env = Env::new();
    let store = env.store();
    routed_running(&env, "a", true, Retry).await;
    drain(store).await;
    ok(
        store,
        "a",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    assert!(receive_all(store).await.is_empty());
    let t = ok(
        store,
        "a",
        Command::AckCancel {
            reason: String::new(),
        },
    )
    .await;
    let got = receive_all(store).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].kind, "canceled");
    assert_eq!(got[0].id, format!("a:{}:canceled", t.version));
    assert_eq!(got[0].version, t.version);
    // A retried pending task: intent only, no notification.
    let v = routed_running(&env, "b", true, Retry).await;
    env.store()
        .execute("b", v, Command::Yield { checkpoint: vec![] })
        .await
        .unwrap();
    drain(store).await;
    ok(
        store,
        "b",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    assert!(receive_all(store).await.is_empty());
}

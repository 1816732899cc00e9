//! Guarantees of the task store: active-attempt fencing.

use super::*;

#[tokio::test]
async fn g018_active_operations_fail_after_expiry() {
    let env = Env::new();
    let store = env.store();
    for (i, command) in active_commands().into_iter().enumerate() {
        for policy in [Retry, Fail] {
            let id = format!("t{i}{}", policy.as_str());
            let r = running(store, &id, policy).await;
            env.advance(LEASE_MS);
            // The reference store's answer: resolving the expiry raised the version first.
            assert_err!(
                store.execute(&id, r.version, command.clone()).await,
                StoreError::VersionConflict { .. }
            );
            let t = store.get(&id).await.unwrap();
            assert_eq!(t.version, r.version + 1);
            assert_ne!(t.status, Status::Running);
            // With the post-expiry version it is no longer an active attempt.
            let r2 = store.execute(&id, t.version, command.clone()).await;
            assert_err!(r2, StoreError::LeaseLost { .. });
        }
    }
}

#[tokio::test]
async fn g019_active_operations_fail_with_cancel_intent() {
    let env = Env::new();
    let store = env.store();
    for (i, command) in active_commands().into_iter().enumerate() {
        let id = format!("t{i}");
        running(store, &id, Retry).await;
        let c = ok(
            store,
            &id,
            Command::RequestCancel {
                reason: "stop".into(),
            },
        )
        .await;
        assert_err!(
            store.execute(&id, c.version, command.clone()).await,
            StoreError::LeaseLost { .. }
        );
        assert_eq!(store.get(&id).await.unwrap(), c);
    }
}

#[tokio::test]
async fn g020_ack_cancel_with_or_without_intent() {
    let env = Env::new();
    let store = env.store();
    let r = running(store, "plain", Retry).await;
    let t = store
        .execute(
            "plain",
            r.version,
            Command::AckCancel {
                reason: String::new(),
            },
        )
        .await
        .unwrap();
    assert_eq!(t.status, Status::Canceled);
    running(store, "intent", Fail).await;
    ok(
        store,
        "intent",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    let t = ok(
        store,
        "intent",
        Command::AckCancel {
            reason: String::new(),
        },
    )
    .await;
    assert_eq!(t.status, Status::Canceled);
    // Not on an inactive attempt.
    create(store, "pending", Retry).await;
    assert_err!(
        exec(
            store,
            "pending",
            Command::AckCancel {
                reason: String::new(),
            },
        )
        .await,
        StoreError::LeaseLost { .. }
    );
}

#[tokio::test]
async fn g021_stale_attempt_update_lease_lost() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    let (_, inserted) = store
        .append_update("a", update(1, "e1", "x"))
        .await
        .unwrap();
    assert!(inserted);
    ok(store, "a", Command::Yield { checkpoint: vec![] }).await;
    ok(store, "a", Command::Start).await;
    // The same bytes from attempt 1 once accepted: now refused by the fence.
    assert_err!(
        store.append_update("a", update(1, "e1", "x")).await,
        StoreError::LeaseLost { .. }
    );
    assert_err!(
        store.append_update("a", update(1, "e2", "x")).await,
        StoreError::LeaseLost { .. }
    );
    // Attempt 2 replaying attempt 1's event is a replay.
    let (_, inserted) = store
        .append_update("a", update(2, "e1", "x"))
        .await
        .unwrap();
    assert!(!inserted);
    assert_err!(
        store.append_update("a", update(3, "e3", "x")).await,
        StoreError::LeaseLost { .. }
    );
}

#[tokio::test]
async fn g022_stale_application_notification_lease_lost() {
    let env = Env::new();
    let store = env.store();
    // Earlier attempt.
    routed_running(&env, "a", false, Retry).await;
    ok(store, "a", Command::Yield { checkpoint: vec![] }).await;
    ok(store, "a", Command::Start).await;
    assert_err!(
        store
            .enqueue_notification("a", 1, note("e", "app", ""))
            .await,
        StoreError::LeaseLost { .. }
    );
    // Expired lease.
    routed_running(&env, "b", false, Retry).await;
    env.advance(LEASE_MS);
    assert_err!(
        store
            .enqueue_notification("b", 1, note("e", "app", ""))
            .await,
        StoreError::LeaseLost { .. }
    );
    // Cancel intent.
    routed_running(&env, "c", false, Retry).await;
    ok(
        store,
        "c",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    assert_err!(
        store
            .enqueue_notification("c", 1, note("e", "app", ""))
            .await,
        StoreError::LeaseLost { .. }
    );
    // Only the task_created notifications are queued.
    let kinds: Vec<_> = receive_all(store)
        .await
        .into_iter()
        .map(|n| n.kind)
        .collect();
    assert_eq!(kinds, ["task_created"; 3]);
}

#[tokio::test]
async fn g023_stale_attempt_commit_cannot_overwrite() {
    let env = Env::new();
    let store = env.store();
    let first = running(store, "a", Retry).await;
    env.advance(LEASE_MS);
    let pending = store.get("a").await.unwrap();
    let second = store
        .execute("a", pending.version, Command::Start)
        .await
        .unwrap();
    assert_eq!(second.attempt, 2);
    ok(
        store,
        "a",
        Command::CommitStart {
            checkpoint: cp("attempt-2"),
        },
    )
    .await;
    let current = store.get("a").await.unwrap();
    for command in [
        Command::Complete { data: cp("stale") },
        Command::Fail {
            error: "stale".into(),
        },
        Command::Yield {
            checkpoint: cp("stale"),
        },
        Command::AckCancel {
            reason: String::new(),
        },
    ] {
        assert_err!(
            store.execute("a", first.version, command).await,
            StoreError::VersionConflict { .. }
        );
    }
    assert_err!(
        store.append_update("a", update(1, "x", "stale")).await,
        StoreError::LeaseLost { .. }
    );
    assert_eq!(store.get("a").await.unwrap(), current);
    assert_eq!(current.checkpoint, b"attempt-2");
}

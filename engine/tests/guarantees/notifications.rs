//! Guarantees of the task store: notifications and outbox.

use super::*;

#[tokio::test]
async fn g083_create_with_session_queues_one_task_created() {
    let env = Env::new();
    let store = env.store();
    store
        .create(request(session_spec("a", false), Retry))
        .await
        .unwrap();
    store
        .create(request(session_spec("b", true), Retry))
        .await
        .unwrap();
    create(store, "c", Retry).await;
    let got = receive_all(store).await;
    let summary: Vec<_> = got
        .iter()
        .map(|n| {
            (
                n.id.as_str(),
                n.kind.as_str(),
                n.task_id.as_str(),
                n.session_id.as_str(),
                n.version,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("a:1:task_created", "task_created", "a", "session-1", 1),
            ("b:1:task_created", "task_created", "b", "session-1", 1)
        ]
    );
    assert!(got
        .iter()
        .all(|n| n.data.is_empty() && n.created_at == Timestamp(T0)));
}

#[tokio::test]
async fn g089_lifecycle_notifications_need_notify_session() {
    let env = Env::new();
    let store = env.store();
    for (id, notify) in [("quiet", false), ("loud", true)] {
        store
            .create(request(session_spec(id, notify), Retry))
            .await
            .unwrap();
    }
    create(store, "none", Retry).await;
    drain(store).await;
    for id in ["quiet", "loud", "none"] {
        ok(store, id, Command::Start).await;
        ok(
            store,
            id,
            Command::WaitInput {
                checkpoint: cp("w"),
            },
        )
        .await;
        ok(
            store,
            id,
            Command::Resume {
                data: vec![],
                context_snapshot: None,
            },
        )
        .await;
        ok(store, id, Command::Start).await;
        ok(store, id, Command::Complete { data: vec![] }).await;
    }
    let got = drain(store).await;
    assert_eq!(got, ["loud:3:waiting_input", "loud:6:completed"]);
    // failed, canceled (direct and acked) and fail-policy expiry.
    let next = |id: &str| session_spec(id, true);
    store.create(request(next("f"), Retry)).await.unwrap();
    store.create(request(next("d"), Retry)).await.unwrap();
    store.create(request(next("x"), Fail)).await.unwrap();
    ok(store, "f", Command::Start).await;
    ok(store, "f", Command::Fail { error: "e".into() }).await;
    ok(
        store,
        "d",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    ok(store, "x", Command::Start).await;
    env.advance(LEASE_MS);
    store.get("x").await.unwrap();
    let got = drain(store).await;
    assert_eq!(
        got,
        [
            "f:1:task_created",
            "d:1:task_created",
            "x:1:task_created",
            "f:3:failed",
            "d:2:canceled",
            "x:3:failed"
        ]
    );
}

#[tokio::test]
async fn g090_notification_committed_with_its_transition() {
    let mut env = Env::with(StoreConfig::default(), Durability::Sync);
    env.store()
        .create(request(session_spec("a", true), Fail))
        .await
        .unwrap();
    ok(env.store(), "a", Command::Start).await;
    ok(
        env.store(),
        "a",
        Command::WaitInput {
            checkpoint: cp("w"),
        },
    )
    .await;
    ok(
        env.store(),
        "a",
        Command::Resume {
            data: vec![],
            context_snapshot: None,
        },
    )
    .await;
    ok(env.store(), "a", Command::Start).await;
    env.advance(LEASE_MS);
    env.store().get("a").await.unwrap();
    env.reopen();
    // Each notification record directly follows the record of its transition, in the same
    // append (consecutive global sequence numbers) and carries its version.
    let records: Vec<_> = env
        .store()
        .journal()
        .read_stream("a", 0)
        .collect::<Result<_, _>>()
        .unwrap();
    let mut version = 0;
    let mut seen = 0;
    for (i, r) in records.iter().enumerate() {
        if r.event.is_lifecycle() {
            version += 1;
        }
        if let Event::NotificationEnqueued {
            version: v, kind, ..
        } = &r.event
        {
            seen += 1;
            assert_eq!(*v, version, "{kind}");
            let cause = &records[i - 1];
            assert!(cause.event.is_lifecycle());
            assert_eq!(cause.seq + 1, r.seq);
        }
    }
    assert_eq!(seen, 3);
    let got = drain(env.store()).await;
    assert_eq!(got, ["a:1:task_created", "a:3:waiting_input", "a:6:failed"]);
}

#[tokio::test]
async fn g091_leased_notification_not_redelivered() {
    let env = Env::new();
    let store = env.store();
    store
        .create(request(session_spec("a", false), Retry))
        .await
        .unwrap();
    let first = store
        .receive_notifications(10, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    env.advance(9_999);
    assert!(store
        .receive_notifications(10, Duration::from_secs(10))
        .await
        .unwrap()
        .is_empty());
    store
        .create(request(session_spec("b", false), Retry))
        .await
        .unwrap();
    let second = store
        .receive_notifications(10, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].task_id, "b");
}

#[tokio::test]
async fn g092_ack_with_expired_receipt_lease_lost() {
    let env = Env::new();
    let store = env.store();
    store
        .create(request(session_spec("a", false), Retry))
        .await
        .unwrap();
    let got = store
        .receive_notifications(10, Duration::from_secs(10))
        .await
        .unwrap();
    env.advance(10_000);
    assert_err!(
        store.ack_notification(&got[0].receipt).await,
        StoreError::LeaseLost { .. }
    );
    let again = receive_all(store).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, got[0].id);
}

#[tokio::test]
async fn g093_redelivery_with_a_new_receipt() {
    let env = Env::new();
    let store = env.store();
    store
        .create(request(session_spec("a", false), Retry))
        .await
        .unwrap();
    let first = store
        .receive_notifications(10, Duration::from_secs(10))
        .await
        .unwrap();
    env.advance(10_000);
    let second = store
        .receive_notifications(10, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].id, first[0].id);
    assert_ne!(second[0].receipt, first[0].receipt);
}

#[tokio::test]
async fn g094_superseded_receipt_rejected() {
    let env = Env::new();
    let store = env.store();
    store
        .create(request(session_spec("a", false), Retry))
        .await
        .unwrap();
    let first = store
        .receive_notifications(10, Duration::from_secs(10))
        .await
        .unwrap();
    env.advance(10_000);
    let second = store
        .receive_notifications(10, Duration::from_secs(10))
        .await
        .unwrap();
    assert_err!(
        store.ack_notification(&first[0].receipt).await,
        StoreError::NotFound { .. }
    );
    store.ack_notification(&second[0].receipt).await.unwrap();
    assert_err!(
        store.ack_notification("lease:unknown").await,
        StoreError::NotFound { .. }
    );
}

#[tokio::test]
async fn g094_superseded_receipt_rejected_across_restart() {
    let mut env = Env::new();
    env.store()
        .create(request(session_spec("a", false), Retry))
        .await
        .unwrap();
    env.store()
        .create(request(session_spec("b", false), Retry))
        .await
        .unwrap();
    // A receipt for "a" is superseded; "a" is acknowledged with the new one.
    let old = env
        .store()
        .receive_notifications(1, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(old[0].task_id, "a");
    env.advance(10_000);
    let new = env
        .store()
        .receive_notifications(1, Duration::from_secs(10))
        .await
        .unwrap();
    env.store().ack_notification(&new[0].receipt).await.unwrap();
    env.reopen();
    // After a restart "b" is delivered; the old receipt of "a" must not acknowledge it.
    let b = env
        .store()
        .receive_notifications(10, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].task_id, "b");
    for stale in [&old[0].receipt, &new[0].receipt] {
        assert_err!(
            env.store().ack_notification(stale).await,
            StoreError::NotFound { .. }
        );
    }
    env.store().ack_notification(&b[0].receipt).await.unwrap();
    assert!(receive_all(env.store()).await.is_empty());
}

#[tokio::test]
async fn g095_acked_never_redelivered() {
    let mut env = Env::new();
    env.store()
        .create(request(session_spec("a", false), Retry))
        .await
        .unwrap();
    assert_eq!(drain(env.store()).await, ["a:1:task_created"]);
    env.advance(LEASE_MS * 10);
    assert!(receive_all(env.store()).await.is_empty());
    env.reopen();
    assert!(receive_all(env.store()).await.is_empty());
}

#[tokio::test]
async fn g096_receive_with_zero_lease_rejected() {
    let env = Env::new();
    env.store()
        .create(request(session_spec("a", false), Retry))
        .await
        .unwrap();
    assert_err!(
        env.store().receive_notifications(10, Duration::ZERO).await,
        StoreError::Invalid { .. }
    );
    assert_eq!(receive_all(env.store()).await.len(), 1);
}

#[tokio::test]
async fn g097_application_notification_id_is_deterministic() {
    let mut ids = Vec::new();
    for _ in 0..2 {
        let env = Env::new();
        let store = env.store();
        routed_running(&env, "task/1", false, Retry).await;
        drain(store).await;
        store
            .enqueue_notification("task/1", 1, note("evt:9", "app", "d"))
            .await
            .unwrap();
        // Replayed from a later attempt: same id, nothing new.
        ok(store, "task/1", Command::Yield { checkpoint: vec![] }).await;
        ok(store, "task/1", Command::Start).await;
        store
            .enqueue_notification("task/1", 2, note("evt:9", "app", "d"))
            .await
            .unwrap();
        let got = drain(store).await;
        assert_eq!(got.len(), 1);
        ids.push(got[0].clone());
    }
    assert_eq!(ids[0], ids[1]);
    assert!(ids[0].ends_with(":application-event"));
}

#[tokio::test]
async fn g098_application_notification_keeps_the_snapshot() {
    let env = Env::new();
    let store = env.store();
    let v = routed_running(&env, "a", false, Retry).await;
    drain(store).await;
    let before = store.get("a").await.unwrap();
    store
        .enqueue_notification("a", 1, note("e", "app", "d"))
        .await
        .unwrap();
    let mut after = store.get("a").await.unwrap();
    // The stream position (a bookkeeping field, not part of the reference record) advances.
    assert_eq!(after.position, before.position + 1);
    after.position = before.position;
    assert_eq!(after, before);
    let got = receive_all(store).await;
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].version, got[0].kind.as_str(), got[0].data.as_slice()),
        (v, "app", &b"d"[..])
    );
}

#[tokio::test]
async fn g099_application_notification_replay_after_ack() {
    let env = Env::new();
    let store = env.store();
    routed_running(&env, "a", false, Retry).await;
    drain(store).await;
    store
        .enqueue_notification("a", 1, note("e", "app", "d"))
        .await
        .unwrap();
    assert_eq!(drain(store).await.len(), 1);
    ok(store, "a", Command::Yield { checkpoint: vec![] }).await;
    ok(store, "a", Command::Start).await;
    store
        .enqueue_notification("a", 2, note("e", "app", "d"))
        .await
        .unwrap();
    assert!(receive_all(store).await.is_empty());
}

#[tokio::test]
async fn g100_application_notification_conflict() {
    let env = Env::new();
    let store = env.store();
    routed_running(&env, "a", false, Retry).await;
    store
        .enqueue_notification("a", 1, note("e", "app", "d"))
        .await
        .unwrap();
    assert_err!(
        store
            .enqueue_notification("a", 1, note("e", "app2", "d"))
            .await,
        StoreError::NotificationEventIdConflict { .. }
    );
    assert_err!(
        store
            .enqueue_notification("a", 1, note("e", "app", "other"))
            .await,
        StoreError::NotificationEventIdConflict { .. }
    );
    assert_eq!(drain(store).await.len(), 2);
}

#[tokio::test]
async fn g101_nil_and_empty_data_are_the_same() {
    let env = Env::new();
    let store = env.store();
    routed_running(&env, "a", false, Retry).await;
    drain(store).await;
    store
        .enqueue_notification(
            "a",
            1,
            NotificationRequest {
                event_id: "e".into(),
                kind: "app".into(),
                data: Vec::new(),
                ..NotificationRequest::default()
            },
        )
        .await
        .unwrap();
    store
        .enqueue_notification(
            "a",
            1,
            NotificationRequest {
                event_id: "e".into(),
                kind: "app".into(),
                data: Vec::with_capacity(8),
                ..NotificationRequest::default()
            },
        )
        .await
        .unwrap();
    assert_err!(
        store
            .enqueue_notification("a", 1, note("e", "app", "x"))
            .await,
        StoreError::NotificationEventIdConflict { .. }
    );
    let got = drain(store).await;
    assert_eq!(got.len(), 1);
}

#[tokio::test]
async fn g102_invalid_application_notification_rejected() {
    let env = Env::new();
    let store = env.store();
    routed_running(&env, "a", false, Retry).await;
    drain(store).await;
    let before = store.get("a").await.unwrap();
    let bad = vec![
        note("", "app", ""),
        note(&"e".repeat(1025), "app", ""),
        note("e", "", ""),
        note("e", &"k".repeat(65), ""),
        note("e", "completed", ""),
        note("e", "task_created", ""),
        note("e", "eino.x", ""),
        note("e", "dtask.x", ""),
        NotificationRequest {
            event_id: "e".into(),
            kind: "app".into(),
            data: vec![0; (256 << 10) + 1],
            ..NotificationRequest::default()
        },
    ];
    for request in bad {
        assert_err!(
            store.enqueue_notification("a", 1, request).await,
            StoreError::Invalid { .. }
        );
    }
    assert_err!(
        store
            .enqueue_notification("a", 0, note("e", "app", ""))
            .await,
        StoreError::Invalid { .. }
    );
    // Validation comes before authorization: a stale attempt with a bad kind is Invalid.
    assert_err!(
        store.enqueue_notification("a", 7, note("e", "", "")).await,
        StoreError::Invalid { .. }
    );
    assert_eq!(store.get("a").await.unwrap(), before);
    assert!(receive_all(store).await.is_empty());
    // No route.
    running(store, "b", Retry).await;
    assert_err!(
        store
            .enqueue_notification("b", 1, note("e", "app", ""))
            .await,
        StoreError::NotificationUnavailable { .. }
    );
}

#[tokio::test]
async fn g103_application_notification_max_sizes_accepted() {
    let env = Env::new();
    let store = env.store();
    routed_running(&env, "a", false, Retry).await;
    drain(store).await;
    let request = NotificationRequest {
        event_id: "e".repeat(1024),
        kind: "k".repeat(64),
        data: vec![7; 256 << 10],
        ..NotificationRequest::default()
    };
    store
        .enqueue_notification("a", 1, request.clone())
        .await
        .unwrap();
    let got = receive_all(store).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].kind, request.kind);
    assert_eq!(got[0].data, request.data);
}

/// A receive reads only what was queued since the one before and walks its session's
/// notifications alone: with sessions interleaved, limits that stop a walk early, and
/// notifications queued between receives, each session's consumer gets its own, each once
/// while leased, in insertion order; one acknowledged is never delivered again.
#[tokio::test]
async fn sessions_receive_their_own_across_receives_limits_and_new_notifications() {
    let env = Env::new();
    let store = env.store();
    let routed = |id: &str, session: &str| {
        request(
            dtask_journal::TaskSpec {
                session_id: session.to_owned(),
                ..session_spec(id, false)
            },
            Retry,
        )
    };
    let lease = Duration::from_secs(10);
    for (id, session) in [("a1", "a"), ("b1", "b"), ("a2", "a"), ("b2", "b")] {
        store.create(routed(id, session)).await.unwrap();
    }
    let tasks = |got: &[dtask_engine::Notification]| {
        got.iter().map(|n| n.task_id.clone()).collect::<Vec<_>>()
    };
    let first = store
        .receive_session_notifications("a", 1, lease)
        .await
        .unwrap();
    assert_eq!(tasks(&first), ["a1"]);
    assert_eq!(first[0].session_id, "a");
    // Queued after the first receive: read by the next one, behind what was there.
    for (id, session) in [("a3", "a"), ("c1", "c")] {
        store.create(routed(id, session)).await.unwrap();
    }
    let second = store
        .receive_session_notifications("a", 10, lease)
        .await
        .unwrap();
    assert_eq!(tasks(&second), ["a2", "a3"], "a1 is leased");
    let b = store
        .receive_session_notifications("b", 10, lease)
        .await
        .unwrap();
    assert_eq!(tasks(&b), ["b1", "b2"]);
    assert!(store
        .receive_session_notifications("nobody", 10, lease)
        .await
        .unwrap()
        .is_empty());
    // Every session's alone, without a session: what no one holds.
    let rest = store.receive_notifications(10, lease).await.unwrap();
    assert_eq!(tasks(&rest), ["c1"]);
    assert_eq!(rest[0].session_id, "c");
    // Acknowledged: gone for good; the others come back once their leases run out.
    store.ack_notification(&second[0].receipt).await.unwrap();
    env.advance(10_000);
    let again = store
        .receive_session_notifications("a", 10, lease)
        .await
        .unwrap();
    assert_eq!(tasks(&again), ["a1", "a3"]);
    for n in &again {
        store.ack_notification(&n.receipt).await.unwrap();
    }
    assert!(store
        .receive_session_notifications("a", 10, Duration::from_secs(1))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(store.journal().outbox_len().unwrap(), 3, "b1, b2 and c1");
    assert_eq!(
        store.notifications_routed(),
        3,
        "the acknowledged ones' routes let go"
    );
}

/// An acknowledgement checked in time holds its lease while it is written: a receive meanwhile
/// — the lease's time run out by then — does not deliver the notification again (it did, and
/// the late acknowledgement then took the new consumer's receipt with it).
#[tokio::test]
async fn g094_an_acknowledgement_being_written_keeps_its_lease() {
    let env = Env::new();
    let store = env.store();
    store
        .create(request(session_spec("a", false), Retry))
        .await
        .unwrap();
    store
        .create(request(session_spec("b", false), Retry))
        .await
        .unwrap();
    let got = store
        .receive_notifications(10, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
    // One thread: the acknowledgement's write, handed to the journal's writer, is still in
    // flight after one poll.
    let mut ack = Box::pin(store.ack_notification(&got[0].receipt));
    assert!(futures::poll!(ack.as_mut()).is_pending());
    env.advance(10_000);
    let meanwhile = store
        .receive_notifications(10, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        meanwhile.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(),
        [got[1].id.as_str()],
        "only the notification not being acknowledged is delivered again"
    );
    ack.await.unwrap();
    env.advance(10_000);
    let after = receive_all(store).await;
    assert!(after.iter().all(|n| n.id != got[0].id), "{after:?}");
}

/// An acknowledgement whose caller stops waiting while its write is in flight (an HTTP
/// client gone) keeps its lease until the write has landed: a receive meanwhile — the
/// lease's time run out by then — does not deliver the notification again (the dropped
/// acknowledgement let go of the lease, a second consumer got the notification, and the
/// acknowledgement then landed from under that consumer's receipt).
#[tokio::test]
async fn g094_an_acknowledgement_whose_caller_stops_waiting_keeps_its_lease() {
    let (env, gate) = Env::gated(StoreConfig::default());
    let store = env.store();
    for id in ["a", "b"] {
        store
            .create(request(session_spec(id, false), Retry))
            .await
            .unwrap();
    }
    let got = store
        .receive_notifications(10, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
    // The writer held after one acknowledgement's batch: the other's append, submitted
    // after it, waits unwritten.
    gate.arm();
    let mut first = Box::pin(store.ack_notification(&got[1].receipt));
    assert!(futures::poll!(first.as_mut()).is_pending());
    gate.until_held().await;
    let mut ack = Box::pin(store.ack_notification(&got[0].receipt));
    assert!(futures::poll!(ack.as_mut()).is_pending());
    tokio::task::yield_now().await;
    env.advance(10_000);
    drop(ack);
    let meanwhile = store
        .receive_notifications(10, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        meanwhile.is_empty(),
        "a notification being acknowledged was delivered again: {meanwhile:?}"
    );
    gate.release();
    first.await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while store.journal().outbox_len().unwrap() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the acknowledgement never landed"
        );
        tokio::task::yield_now().await;
    }
    env.advance(10_000);
    assert!(receive_all(store).await.is_empty());
}

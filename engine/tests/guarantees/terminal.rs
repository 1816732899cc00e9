//! Guarantees of the task store: terminal states.

use super::*;

/// One task per terminal path: completed, failed, acked cancel, direct cancel, fail-expiry,
/// fail-expiry with intent.
async fn terminal_tasks(env: &Env) -> Vec<String> {
    let store = env.store();
    running(store, "completed", Retry).await;
    ok(store, "completed", Command::Complete { data: cp("r") }).await;
    running(store, "failed", Retry).await;
    ok(
        store,
        "failed",
        Command::Fail {
            error: "boom".into(),
        },
    )
    .await;
    running(store, "acked", Retry).await;
    ok(
        store,
        "acked",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    ok(
        store,
        "acked",
        Command::AckCancel {
            reason: String::new(),
        },
    )
    .await;
    create(store, "direct", Retry).await;
    ok(
        store,
        "direct",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    running(store, "expired", Fail).await;
    running(store, "expired-intent", Fail).await;
    ok(
        store,
        "expired-intent",
        Command::RequestCancel {
            reason: "why".into(),
        },
    )
    .await;
    env.advance(LEASE_MS + 1);
    let ids: Vec<String> = [
        "completed",
        "failed",
        "acked",
        "direct",
        "expired",
        "expired-intent",
    ]
    .map(str::to_owned)
    .to_vec();
    for id in &ids {
        assert!(store.get(id).await.unwrap().is_terminal(), "{id}");
    }
    ids
}

#[tokio::test]
async fn g029_terminal_never_changes_status() {
    let env = Env::new();
    let store = env.store();
    let ids = terminal_tasks(&env).await;
    for id in &ids {
        let before = store.get(id).await.unwrap();
        let mut commands = active_commands();
        commands.extend([
            Command::Start,
            Command::AckCancel {
                reason: String::new(),
            },
            Command::RequestCancel {
                reason: String::new(),
            },
            Command::ReportTranscriptFailure { error: "e".into() },
            Command::Resume {
                data: vec![],
                context_snapshot: None,
            },
            Command::ReleaseSuspension {
                context_snapshot: None,
            },
        ]);
        for command in commands {
            assert!(store.execute(id, before.version, command).await.is_err());
        }
        assert!(store
            .append_update(id, update(1, "late", "x"))
            .await
            .is_err());
        env.advance(LEASE_MS * 3);
        assert_eq!(store.get(id).await.unwrap(), before);
    }
}

#[tokio::test]
async fn g030_commands_on_terminal_task_fail() {
    let env = Env::new();
    let store = env.store();
    for id in terminal_tasks(&env).await {
        let t = store.get(&id).await.unwrap();
        let mut commands = active_commands();
        commands.push(Command::AckCancel {
            reason: String::new(),
        });
        for command in commands {
            if matches!(command, Command::CommitStart { .. } | Command::Heartbeat) {
                continue;
            }
            assert_err!(
                store.execute(&id, t.version, command.clone()).await,
                StoreError::LeaseLost { .. }
            );
            assert_err!(
                store.execute(&id, t.version - 1, command).await,
                StoreError::VersionConflict { .. }
            );
        }
    }
}

#[tokio::test]
async fn g031_request_cancel_on_terminal_already_terminal() {
    let env = Env::new();
    let store = env.store();
    for id in terminal_tasks(&env).await {
        let t = store.get(&id).await.unwrap();
        assert_err!(
            exec(store, &id, Command::RequestCancel { reason: "x".into() }).await,
            StoreError::AlreadyTerminal { .. }
        );
        // Regardless of the version passed.
        assert_err!(
            store
                .execute(
                    &id,
                    t.version - 1,
                    Command::RequestCancel { reason: "x".into() },
                )
                .await,
            StoreError::AlreadyTerminal { .. }
        );
    }
}

#[tokio::test]
async fn g032_done_at_set_once() {
    let env = Env::new();
    let store = env.store();
    let r = running(store, "a", Retry).await;
    assert_eq!(r.done_at, None);
    env.advance(5);
    let done = ok(store, "a", Command::Complete { data: vec![] }).await;
    assert_eq!(done.done_at, Some(Timestamp(T0 + 5)));
    env.advance(LEASE_MS);
    let _ = exec(
        store,
        "a",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    assert_eq!(
        store.get("a").await.unwrap().done_at,
        Some(Timestamp(T0 + 5))
    );
    // Every non-terminal status has none.
    create(store, "b", Retry).await;
    for command in [
        Command::Start,
        Command::WaitInput {
            checkpoint: cp("w"),
        },
        Command::Resume {
            data: vec![],
            context_snapshot: None,
        },
        Command::Start,
        Command::Suspend {
            checkpoint: cp("s"),
        },
        Command::ReleaseSuspension {
            context_snapshot: None,
        },
    ] {
        assert_eq!(ok(store, "b", command).await.done_at, None);
    }
    for id in terminal_tasks(&env).await {
        let t = store.get(&id).await.unwrap();
        assert_eq!(t.done_at, Some(t.updated_at), "{id}");
    }
}

#[tokio::test]
async fn g033_result_fields_per_terminal_status() {
    let env = Env::new();
    let store = env.store();
    for id in terminal_tasks(&env).await {
        let t = store.get(&id).await.unwrap();
        match t.status {
            Status::Completed => {
                assert!(t.result_error.is_empty());
                assert_eq!(t.result_data, b"r");
            }
            Status::Failed => {
                assert!(!t.result_error.is_empty());
                assert!(t.result_data.is_empty());
            }
            Status::Canceled => assert!(t.result_data.is_empty()),
            s => panic!("{id} is {s}"),
        }
    }
    assert_eq!(store.get("failed").await.unwrap().result_error, "boom");
    assert_eq!(
        store.get("expired").await.unwrap().result_error,
        LEASE_EXPIRED_ERROR
    );
}

#[tokio::test]
async fn g034_fail_without_error_rejected() {
    let env = Env::new();
    let store = env.store();
    let r = running(store, "a", Retry).await;
    assert_err!(
        store
            .execute(
                "a",
                r.version,
                Command::Fail {
                    error: String::new(),
                },
            )
            .await,
        StoreError::InvalidExecutionResult { .. }
    );
    let t = store.get("a").await.unwrap();
    assert_eq!(t, r);
    assert_eq!(t.status, Status::Running);
}

#[tokio::test]
async fn g035_leaving_running_drops_the_lease() {
    let env = Env::new();
    let store = env.store();
    let exits = [
        Command::Yield { checkpoint: vec![] },
        Command::WaitInput {
            checkpoint: cp("w"),
        },
        Command::Suspend {
            checkpoint: cp("s"),
        },
        Command::Complete { data: vec![] },
        Command::Fail { error: "e".into() },
        Command::AckCancel {
            reason: String::new(),
        },
    ];
    for (i, exit) in exits.into_iter().enumerate() {
        let id = format!("t{i}");
        running(store, &id, Retry).await;
        let t = ok(store, &id, exit).await;
        assert_ne!(t.status, Status::Running);
        assert_eq!(t.lease_deadline, None);
        assert_err!(
            store.execute(&id, t.version, Command::Heartbeat).await,
            StoreError::LeaseLost { .. }
        );
        assert_err!(
            store
                .execute(&id, t.version, Command::Yield { checkpoint: vec![] })
                .await,
            StoreError::LeaseLost { .. }
        );
        assert_err!(
            store.append_update(&id, update(1, "u", "x")).await,
            StoreError::LeaseLost { .. }
        );
    }
    // Retry expiry too.
    running(store, "x", Retry).await;
    env.advance(LEASE_MS);
    let t = store.get("x").await.unwrap();
    assert_eq!((t.status, t.lease_deadline), (Status::Pending, None));
    assert_err!(
        store.execute("x", t.version, Command::Heartbeat).await,
        StoreError::LeaseLost { .. }
    );
}

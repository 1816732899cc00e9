//! Guarantees of the task store: waiting, suspension, resume.

use super::*;

#[tokio::test]
async fn g053_wait_and_suspend_require_and_replace_checkpoint() {
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
    for command in [
        Command::WaitInput { checkpoint: vec![] },
        Command::Suspend { checkpoint: vec![] },
    ] {
        assert_err!(exec(store, "a", command).await, StoreError::Invalid { .. });
    }
    assert_eq!(
        ok(
            store,
            "a",
            Command::WaitInput {
                checkpoint: cp("c1")
            }
        )
        .await
        .checkpoint,
        b"c1"
    );
    ok(
        store,
        "a",
        Command::Resume {
            data: vec![],
            context_snapshot: None,
        },
    )
    .await;
    ok(store, "a", Command::Start).await;
    assert_eq!(
        ok(
            store,
            "a",
            Command::Suspend {
                checkpoint: cp("c2")
            }
        )
        .await
        .checkpoint,
        b"c2"
    );
}

#[tokio::test]
async fn g054_waiting_and_suspended_not_listed_pending() {
    let env = Env::new();
    let store = env.store();
    running(store, "w", Retry).await;
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
        Command::Suspend {
            checkpoint: cp("c"),
        },
    )
    .await;
    create(store, "p", Retry).await;
    let ids: Vec<_> = store
        .list_pending(&keys(), None, 0)
        .await
        .unwrap()
        .tasks
        .into_iter()
        .map(|t| t.spec.id.clone())
        .collect();
    assert_eq!(ids, ["p"]);
}

#[tokio::test]
async fn g055_suspended_listed_until_released() {
    let mut env = Env::new();
    running(env.store(), "s", Retry).await;
    ok(
        env.store(),
        "s",
        Command::Suspend {
            checkpoint: cp("c"),
        },
    )
    .await;
    let listed = env
        .store()
        .list_suspended(&keys(), None, 0)
        .await
        .unwrap()
        .tasks;
    assert_eq!(listed.len(), 1);
    env.reopen();
    let listed = env
        .store()
        .list_suspended(&keys(), None, 0)
        .await
        .unwrap()
        .tasks;
    assert_eq!(listed.len(), 1);
    ok(
        env.store(),
        "s",
        Command::ReleaseSuspension {
            context_snapshot: None,
        },
    )
    .await;
    assert!(env
        .store()
        .list_suspended(&keys(), None, 0)
        .await
        .unwrap()
        .tasks
        .is_empty());
    assert_eq!(
        env.store()
            .list_pending(&keys(), None, 0)
            .await
            .unwrap()
            .tasks
            .len(),
        1
    );
}

#[tokio::test]
async fn g056_release_only_from_suspended() {
    let env = Env::new();
    let store = env.store();
    running(store, "s", Retry).await;
    ok(
        store,
        "s",
        Command::Suspend {
            checkpoint: cp("c"),
        },
    )
    .await;
    let t = ok(
        store,
        "s",
        Command::ReleaseSuspension {
            context_snapshot: Some(cp("ctx")),
        },
    )
    .await;
    assert_eq!(
        (t.status, t.context_snapshot.as_slice()),
        (Status::Pending, &b"ctx"[..])
    );
    // Empty non-none clears the snapshot.
    ok(store, "s", Command::Start).await;
    ok(
        store,
        "s",
        Command::Suspend {
            checkpoint: cp("c"),
        },
    )
    .await;
    let t = ok(
        store,
        "s",
        Command::ReleaseSuspension {
            context_snapshot: Some(vec![]),
        },
    )
    .await;
    assert!(t.context_snapshot.is_empty());
    // Every other status.
    create(store, "p", Retry).await;
    running(store, "r", Retry).await;
    running(store, "w", Retry).await;
    ok(
        store,
        "w",
        Command::WaitInput {
            checkpoint: cp("c"),
        },
    )
    .await;
    running(store, "d", Retry).await;
    ok(store, "d", Command::Complete { data: vec![] }).await;
    for id in ["p", "r", "w", "d"] {
        let before = store.get(id).await.unwrap();
        assert_err!(
            exec(
                store,
                id,
                Command::ReleaseSuspension {
                    context_snapshot: None,
                },
            )
            .await,
            StoreError::IllegalTransition { .. }
        );
        assert_eq!(store.get(id).await.unwrap(), before);
    }
}

#[tokio::test]
async fn g057_resume_only_waiting_input() {
    let env = Env::new();
    let store = env.store();
    running(store, "w", Retry).await;
    ok(
        store,
        "w",
        Command::WaitInput {
            checkpoint: cp("c"),
        },
    )
    .await;
    let t = ok(
        store,
        "w",
        Command::Resume {
            data: cp("answer"),
            context_snapshot: Some(cp("ctx")),
        },
    )
    .await;
    assert_eq!(t.status, Status::Pending);
    assert_eq!(t.pending_resume.as_deref(), Some(&b"answer"[..]));
    assert_eq!(t.context_snapshot, b"ctx");
    let claimed = ok(store, "w", Command::Start).await;
    assert_eq!(claimed.pending_resume.as_deref(), Some(&b"answer"[..]));
    create(store, "p", Retry).await;
    running(store, "s", Retry).await;
    ok(
        store,
        "s",
        Command::Suspend {
            checkpoint: cp("c"),
        },
    )
    .await;
    for id in ["p", "w", "s"] {
        assert_err!(
            exec(
                store,
                id,
                Command::Resume {
                    data: vec![],
                    context_snapshot: None,
                },
            )
            .await,
            StoreError::IllegalTransition { .. }
        );
    }
}

#[tokio::test]
async fn g058_pending_resume_kept_by_yield_and_retry_expiry() {
    let env = Env::new();
    let store = env.store();
    // Survives yield and retry expiry.
    running(store, "a", Retry).await;
    ok(
        store,
        "a",
        Command::WaitInput {
            checkpoint: cp("c"),
        },
    )
    .await;
    ok(
        store,
        "a",
        Command::Resume {
            data: cp("in"),
            context_snapshot: None,
        },
    )
    .await;
    ok(store, "a", Command::Start).await;
    assert_eq!(
        ok(store, "a", Command::Yield { checkpoint: vec![] })
            .await
            .pending_resume
            .as_deref(),
        Some(&b"in"[..])
    );
    ok(store, "a", Command::Start).await;
    env.advance(LEASE_MS);
    assert_eq!(
        store.get("a").await.unwrap().pending_resume.as_deref(),
        Some(&b"in"[..])
    );
    // Cleared by WaitInput and Suspend.
    ok(store, "a", Command::Start).await;
    assert_eq!(
        ok(
            store,
            "a",
            Command::WaitInput {
                checkpoint: cp("c")
            }
        )
        .await
        .pending_resume,
        None
    );
    ok(
        store,
        "a",
        Command::Resume {
            data: cp("in"),
            context_snapshot: None,
        },
    )
    .await;
    ok(store, "a", Command::Start).await;
    assert_eq!(
        ok(
            store,
            "a",
            Command::Suspend {
                checkpoint: cp("c")
            }
        )
        .await
        .pending_resume,
        None
    );
    // Cleared by every terminal transition.
    let terminal: Vec<(LeasePolicy, Option<Command>)> = vec![
        (Retry, Some(Command::Complete { data: vec![] })),
        (Retry, Some(Command::Fail { error: "e".into() })),
        (
            Retry,
            Some(Command::AckCancel {
                reason: String::new(),
            }),
        ),
        (Fail, None),
    ];
    for (i, (policy, end)) in terminal.into_iter().enumerate() {
        let id = format!("t{i}");
        running(store, &id, policy).await;
        ok(
            store,
            &id,
            Command::WaitInput {
                checkpoint: cp("c"),
            },
        )
        .await;
        ok(
            store,
            &id,
            Command::Resume {
                data: cp("in"),
                context_snapshot: None,
            },
        )
        .await;
        ok(store, &id, Command::Start).await;
        let t = if let Some(end) = end {
            ok(store, &id, end).await
        } else {
            env.advance(LEASE_MS);
            store.get(&id).await.unwrap()
        };
        assert!(t.is_terminal());
        assert_eq!(t.pending_resume, None, "{id}");
    }
    // And by a direct cancel.
    running(store, "d", Retry).await;
    ok(
        store,
        "d",
        Command::WaitInput {
            checkpoint: cp("c"),
        },
    )
    .await;
    ok(
        store,
        "d",
        Command::Resume {
            data: cp("in"),
            context_snapshot: None,
        },
    )
    .await;
    let t = ok(
        store,
        "d",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    // A resumed retry task that ran before is pending: the request records intent only.
    assert_eq!(t.status, Status::Pending);
    assert_eq!(t.pending_resume.as_deref(), Some(&b"in"[..]));
    running(store, "e", Fail).await;
    ok(
        store,
        "e",
        Command::WaitInput {
            checkpoint: cp("c"),
        },
    )
    .await;
    ok(
        store,
        "e",
        Command::Resume {
            data: cp("in"),
            context_snapshot: None,
        },
    )
    .await;
    let t = ok(
        store,
        "e",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    assert_eq!((t.status, t.pending_resume), (Status::Canceled, None));
}

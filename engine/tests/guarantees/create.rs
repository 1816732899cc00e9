//! Guarantees of the task store: create and snapshots.

use super::*;

#[tokio::test]
async fn g001_create_returns_pending_v1() {
    let env = Env::new();
    let t = create(env.store(), "a", Retry).await;
    assert_eq!(t.status, Status::Pending);
    assert_eq!(t.version, 1);
    assert_eq!(t.attempt, 0);
    assert_ne!(t.created_at, Timestamp(0));
    assert_eq!(t.created_at, Timestamp(T0));
    assert_eq!(t.created_at, t.updated_at);
    assert_eq!(t.done_at, None);
    assert_eq!(env.store().get("a").await.unwrap(), t);
}

#[tokio::test]
async fn g002_duplicate_id_already_exists() {
    let env = Env::new();
    let store = env.store();
    let first = create(store, "a", Retry).await;
    let mut other = spec("a");
    other.payload = b"different".to_vec();
    assert_err!(
        store.create(request(other, Fail)).await,
        StoreError::AlreadyExists { .. }
    );
    assert_eq!(store.get("a").await.unwrap(), first);
    // Also after a reopen (the id is only in the journal then) and once terminal.
    let mut env = env;
    ok(
        env.store(),
        "a",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    env.reopen();
    assert_err!(
        env.store().create(request(spec("a"), Retry)).await,
        StoreError::AlreadyExists { .. }
    );
}

#[tokio::test]
async fn g003_returned_snapshot_is_a_copy() {
    let env = Env::new();
    let store = env.store();
    let mut req = request(spec("a"), Retry);
    req.checkpoint = cp("cp");
    let mut t = store.create(req.clone()).await.unwrap();
    // The request was moved into the store; mutate our copy of it and the returned snapshot.
    req.spec.payload.clear();
    std::sync::Arc::make_mut(&mut t.spec).payload = b"mutated".to_vec();
    t.checkpoint.push(b'!');
    t.status = Status::Completed;
    let again = store.get("a").await.unwrap();
    assert_eq!(again.spec.payload, b"payload of a");
    assert_eq!(again.checkpoint, b"cp");
    assert_eq!(again.status, Status::Pending);
    let mut g = store.get("a").await.unwrap();
    g.version = 99;
    assert_eq!(store.get("a").await.unwrap().version, 1);
}

#[tokio::test]
async fn g004_initial_checkpoint_stored_exactly() {
    let mut env = Env::new();
    let mut buffer = vec![0u8, 1, 2, 255, 0];
    let mut req = request(spec("a"), Retry);
    req.checkpoint.clone_from(&buffer);
    env.store().create(req).await.unwrap();
    buffer[0] = 42;
    assert_eq!(
        env.store().get("a").await.unwrap().checkpoint,
        [0, 1, 2, 255, 0]
    );
    env.reopen();
    assert_eq!(
        env.store().get("a").await.unwrap().checkpoint,
        [0, 1, 2, 255, 0]
    );
}

#[tokio::test]
async fn g005_spec_and_policy_never_change() {
    let env = Env::new();
    let store = env.store();
    let s = session_spec("a", true);
    store.create(request(s.clone(), Retry)).await.unwrap();
    let mut seen = vec![store.get("a").await.unwrap()];
    for command in [
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
            context_snapshot: Some(cp("ctx")),
        },
        Command::Start,
        Command::Yield { checkpoint: vec![] },
        Command::Start,
        Command::RequestCancel { reason: "r".into() },
        Command::AckCancel {
            reason: String::new(),
        },
    ] {
        seen.push(ok(store, "a", command).await);
    }
    for t in seen {
        assert_eq!(*t.spec, s);
        assert_eq!(t.policy, Retry);
    }
}

#[tokio::test]
async fn g006_create_rejects_invalid_requests() {
    let env = Env::new();
    let store = env.store();
    let mut no_id = spec("x");
    no_id.id = String::new();
    assert_err!(
        store.create(request(no_id, Retry)).await,
        StoreError::Invalid { .. }
    );
    let mut no_key = spec("x");
    no_key.executor_key = String::new();
    assert_err!(
        store.create(request(no_key, Retry)).await,
        StoreError::Invalid { .. }
    );
    let mut notify_without_session = spec("x");
    notify_without_session.notify_session = true;
    assert_err!(
        store.create(request(notify_without_session, Retry)).await,
        StoreError::Invalid { .. }
    );
    let no_policy = CreateRequest {
        spec: spec("x"),
        policy: None,
        ..CreateRequest::default()
    };
    assert_err!(store.create(no_policy).await, StoreError::Invalid { .. });
    // Nothing was created.
    assert_err!(store.get("x").await, StoreError::NotFound { .. });
    assert!(store.journal().head("x").unwrap().is_none());
}

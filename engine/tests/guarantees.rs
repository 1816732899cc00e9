//! One test per numbered guarantee of eino-core §7 that applies to the G2 core task store.
//!
//! Skipped: 7 (G3 publication), 36–37 (mailbox sealing), 47 (manager-level cancel wait),
//! 59–63 (mailbox inputs), 77 (event parts), 84–88 (publication), 104 (nested tasks) and
//! 105 onwards (manager-level).

#![allow(clippy::unwrap_used, clippy::too_many_lines)]

mod common;

use common::*;
use dtask_engine::{Command, CreateRequest, NotificationRequest, StoreConfig, UpdateRequest};
use dtask_journal::{Durability, Event, LeasePolicy, Timestamp};
use dtask_replay::{Status, DEFAULT_CANCEL_REASON, LEASE_EXPIRED_ERROR};
use std::time::Duration;

use LeasePolicy::{Fail, Retry};

fn update(attempt: u64, event_id: &str, data: &str) -> UpdateRequest {
    UpdateRequest {
        attempt,
        event_id: event_id.to_owned(),
        kind: "progress".to_owned(),
        data: data.as_bytes().to_vec(),
        metadata: vec![("k".to_owned(), "v".to_owned())],
    }
}

fn note(event_id: &str, kind: &str, data: &str) -> NotificationRequest {
    NotificationRequest {
        event_id: event_id.to_owned(),
        kind: kind.to_owned(),
        data: data.as_bytes().to_vec(),
    }
}

/// A session-routed running task.
async fn routed_running(env: &Env, id: &str, notify: bool, policy: LeasePolicy) -> u64 {
    let store = env.store();
    let t = store
        .create(request(session_spec(id, notify), policy))
        .await
        .unwrap();
    store.execute(id, t.version, Command::Start).await.unwrap();
    store.get(id).await.unwrap().version
}

// ---------------------------------------------------------------- create and snapshots

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
    assert_err(store.create(request(other, Fail)).await, "AlreadyExists");
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
    assert_err(
        env.store().create(request(spec("a"), Retry)).await,
        "AlreadyExists",
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
    t.spec.payload = b"mutated".to_vec();
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
        assert_eq!(t.spec, s);
        assert_eq!(t.policy, Retry);
    }
}

#[tokio::test]
async fn g006_create_rejects_invalid_requests() {
    let env = Env::new();
    let store = env.store();
    let mut no_id = spec("x");
    no_id.id = String::new();
    assert_err(store.create(request(no_id, Retry)).await, "Invalid");
    let mut no_key = spec("x");
    no_key.executor_key = String::new();
    assert_err(store.create(request(no_key, Retry)).await, "Invalid");
    let mut notify_without_session = spec("x");
    notify_without_session.notify_session = true;
    assert_err(
        store.create(request(notify_without_session, Retry)).await,
        "Invalid",
    );
    let no_policy = CreateRequest {
        spec: spec("x"),
        policy: None,
        ..CreateRequest::default()
    };
    assert_err(store.create(no_policy).await, "Invalid");
    // Nothing was created.
    assert_err(store.get("x").await, "NotFound");
    assert!(store.journal().head("x").unwrap().is_none());
}

// ---------------------------------------------------------------- version and CAS

#[tokio::test]
async fn g008_every_mutation_raises_version_by_one() {
    let env = Env::new();
    let store = env.store();
    create(store, "a", Retry).await;
    create(store, "b", Retry).await;
    let script_a = [
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
            context_snapshot: None,
        },
        Command::Start,
        Command::Yield { checkpoint: vec![] },
        Command::Start,
        Command::Complete { data: cp("done") },
    ];
    let script_b = [
        Command::Start,
        Command::RequestCancel {
            reason: String::new(),
        },
        Command::AckCancel {
            reason: String::new(),
        },
    ];
    for (id, script) in [("a", &script_a[..]), ("b", &script_b[..])] {
        for command in script {
            let before = store.get(id).await.unwrap().version;
            let after = store.execute(id, before, command.clone()).await.unwrap();
            assert_eq!(after.version, before + 1, "{id}: {command:?}");
        }
    }
    create(store, "c", Retry).await;
    let t = store
        .execute(
            "c",
            1,
            Command::RequestCancel {
                reason: String::new(),
            },
        )
        .await
        .unwrap();
    assert_eq!(t.version, 2);
    // Lease expiry written down also counts one.
    let r = running(store, "d", Retry).await;
    env.advance(LEASE_MS);
    assert_eq!(store.get("d").await.unwrap().version, r.version + 1);
}

#[tokio::test]
async fn g009_stale_version_conflicts_and_changes_nothing() {
    let env = Env::new();
    let store = env.store();
    create(store, "p", Retry).await;
    let r = running(store, "r", Retry).await;
    store
        .execute(
            "r",
            r.version,
            Command::CommitStart {
                checkpoint: cp("c"),
            },
        )
        .await
        .unwrap();
    ok(store, "r", Command::Heartbeat).await;
    create(store, "w", Retry).await;
    ok(store, "w", Command::Start).await;
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
            checkpoint: cp("w"),
        },
    )
    .await;
    create(store, "s", Retry).await;
    ok(store, "s", Command::Start).await;
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
            checkpoint: cp("s"),
        },
    )
    .await;
    let cases: Vec<(&str, Command)> = vec![
        ("p", Command::Start),
        ("p", Command::RequestCancel { reason: "x".into() }),
        ("r", Command::Heartbeat),
        ("r", Command::Complete { data: vec![] }),
        ("r", Command::Fail { error: "e".into() }),
        ("r", Command::Yield { checkpoint: vec![] }),
        (
            "r",
            Command::WaitInput {
                checkpoint: cp("x"),
            },
        ),
        (
            "r",
            Command::Suspend {
                checkpoint: cp("x"),
            },
        ),
        (
            "r",
            Command::AckCancel {
                reason: String::new(),
            },
        ),
        ("r", Command::ReportTranscriptFailure { error: "e".into() }),
        (
            "r",
            Command::RequestCancel {
                reason: String::new(),
            },
        ),
        (
            "w",
            Command::Resume {
                data: vec![],
                context_snapshot: None,
            },
        ),
        (
            "s",
            Command::ReleaseSuspension {
                context_snapshot: None,
            },
        ),
    ];
    for (id, command) in cases {
        let before = store.get(id).await.unwrap();
        for stale in [before.version - 1, before.version + 1] {
            let r = store.execute(id, stale, command.clone()).await;
            assert_err(r, "VersionConflict");
            assert_eq!(store.get(id).await.unwrap(), before, "{id} {command:?}");
        }
    }
}

#[tokio::test]
async fn g010_non_lifecycle_operations_keep_version() {
    let env = Env::new();
    let store = env.store();
    let v = routed_running(&env, "a", true, Retry).await;
    store
        .append_update("a", update(1, "e1", "x"))
        .await
        .unwrap();
    store
        .append_update("a", update(1, "e1", "x"))
        .await
        .unwrap();
    store
        .enqueue_notification("a", 1, note("n1", "app", "d"))
        .await
        .unwrap();
    let t = store
        .execute(
            "a",
            v,
            Command::ReportTranscriptFailure {
                error: "first".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(t.version, v + 1);
    let again = store
        .execute(
            "a",
            v + 1,
            Command::ReportTranscriptFailure {
                error: "second".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(again.version, v + 1);
    let c = store
        .execute("a", v + 1, Command::RequestCancel { reason: "r".into() })
        .await
        .unwrap();
    assert_eq!(c.version, v + 2);
    let c2 = store
        .execute(
            "a",
            v + 2,
            Command::RequestCancel {
                reason: "r2".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(c2.version, v + 2);
    for n in receive_all(store).await {
        store.ack_notification(&n.receipt).await.unwrap();
    }
    assert_eq!(store.get("a").await.unwrap().version, v + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g011_wait_for_version_ignores_updates() {
    let env = Env::new();
    let store = env.store().clone();
    let r = running(&store, "a", Retry).await;
    let waiter = {
        let store = store.clone();
        let after = r.version;
        tokio::spawn(async move { store.wait_for_task_version("a", after).await })
    };
    // Updates change the stream but not the version: the waiter must stay blocked.
    for i in 0..5 {
        store
            .append_update("a", update(1, &format!("e{i}"), "x"))
            .await
            .unwrap();
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert!(!waiter.is_finished(), "woken by a task event");
    }
    let hb = ok(&store, "a", Command::Heartbeat).await;
    let got = waiter.await.unwrap().unwrap();
    assert!(got.version > r.version);
    assert_eq!(got.version, hb.version);
    // Already past: returns at once, with a version above the one asked.
    let now = store.wait_for_task_version("a", 1).await.unwrap();
    assert!(now.version > 1);
}

/// The change channel of a task is made at the first subscription: a receiver made after
/// changes starts at the latest counters, and sees every later one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_starts_at_the_latest_change_and_follows() {
    let env = Env::new();
    let store = env.store().clone();
    let r = running(&store, "a", Retry).await;
    store
        .append_update("a", update(1, "e0", "x"))
        .await
        .unwrap();
    let mut rx = store.watch("a").unwrap();
    let first = *rx.borrow_and_update();
    assert_eq!(first.version, r.version);
    assert_eq!(first.position, store.get("a").await.unwrap().position);
    let hb = ok(&store, "a", Command::Heartbeat).await;
    rx.changed().await.unwrap();
    assert_eq!(rx.borrow_and_update().version, hb.version);
    // A second receiver shares the channel and starts where it is.
    let second = store.watch("a").unwrap();
    assert_eq!(second.borrow().version, hb.version);
}

#[tokio::test]
async fn appends_after_a_restart_chain_from_the_recovered_heads() {
    let mut env = Env::new();
    let v = routed_running(&env, "a", true, Retry).await;
    env.store()
        .append_update("a", update(1, "e1", "x"))
        .await
        .unwrap();
    env.store()
        .create(request(session_spec("b", false), Retry))
        .await
        .unwrap();
    env.reopen();
    // The first appends after the restart frame on the heads the recovery handed the writer.
    env.store()
        .append_update("a", update(1, "e2", "y"))
        .await
        .unwrap();
    env.store()
        .execute("a", v, Command::Heartbeat)
        .await
        .unwrap();
    let b = env.store().get("b").await.unwrap();
    env.store()
        .execute("b", b.version, Command::Start)
        .await
        .unwrap();
    let journal = env.store().journal().clone();
    for task in ["a", "b"] {
        let records: Vec<_> = journal
            .read_stream(task, 0)
            .collect::<Result<_, _>>()
            .unwrap();
        let head = journal.head(task).unwrap().unwrap();
        assert_eq!(head.next_position, records.len() as u64, "{task}");
    }
    let report = dtask_replay::audit::audit_journal(&journal, &mut |_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// Recovery folds the live tasks in chunks on several threads and indexes each chunk as it
/// comes: with more live tasks than a few chunks hold, every one comes back as it was, the
/// pending ones are listed in id order, and the first appends after the restart chain on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_many_live_tasks_brings_back_and_indexes_each() {
    let mut env = Env::new();
    let ids: Vec<String> = (0..1_300).map(|i| format!("t{i:05}")).collect();
    let mut before = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let task = create(env.store(), id, Retry).await;
        before.push(if i % 3 == 0 {
            ok(env.store(), id, Command::Start).await
        } else {
            task
        });
    }
    env.reopen();
    let store = env.store();
    for (id, was) in ids.iter().zip(&before) {
        assert_eq!(&store.get(id).await.unwrap(), was, "{id}");
    }
    let page = store.list_pending(&keys(), None, 10_000).await.unwrap();
    let pending: Vec<&str> = page.tasks.iter().map(|t| t.spec.id.as_str()).collect();
    let expected: Vec<&str> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 0)
        .map(|(_, id)| id.as_str())
        .collect();
    assert_eq!(pending, expected);
    for id in [&ids[0], &ids[ids.len() - 1], &ids[3 * 300]] {
        ok(store, id, Command::Heartbeat).await;
    }
    ok(store, &ids[1], Command::Start).await;
    let report = dtask_replay::audit::audit_journal(store.journal(), &mut |_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[tokio::test]
async fn g012_wait_for_unknown_task_not_found() {
    let env = Env::new();
    assert_err(
        env.store().wait_for_task_version("nope", 0).await,
        "NotFound",
    );
}

// ---------------------------------------------------------------- claiming and attempts

#[tokio::test]
async fn g013_start_only_from_pending() {
    let env = Env::new();
    let store = env.store();
    let r = running(store, "running", Retry).await;
    assert_err(
        store.execute("running", r.version, Command::Start).await,
        "IllegalTransition",
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
        assert_err(exec(store, id, Command::Start).await, "IllegalTransition");
        assert_eq!(store.get(id).await.unwrap(), before);
    }
    // From pending with the current version it succeeds; a stale one conflicts.
    create(store, "p", Retry).await;
    assert_err(
        store.execute("p", 2, Command::Start).await,
        "VersionConflict",
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
                matches!(kind(&e), "VersionConflict" | "IllegalTransition"),
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

// ---------------------------------------------------------------- active-attempt fencing

/// Every active-attempt command, with valid arguments.
fn active_commands() -> Vec<Command> {
    vec![
        Command::Heartbeat,
        Command::CommitStart {
            checkpoint: cp("c"),
        },
        Command::Complete { data: cp("d") },
        Command::Fail { error: "e".into() },
        Command::WaitInput {
            checkpoint: cp("w"),
        },
        Command::Suspend {
            checkpoint: cp("s"),
        },
        Command::Yield { checkpoint: vec![] },
    ]
}

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
            assert_err(
                store.execute(&id, r.version, command.clone()).await,
                "VersionConflict",
            );
            let t = store.get(&id).await.unwrap();
            assert_eq!(t.version, r.version + 1);
            assert_ne!(t.status, Status::Running);
            // With the post-expiry version it is no longer an active attempt.
            let r2 = store.execute(&id, t.version, command.clone()).await;
            assert_err(r2, "LeaseLost");
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
        assert_err(
            store.execute(&id, c.version, command.clone()).await,
            "LeaseLost",
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
    assert_err(
        exec(
            store,
            "pending",
            Command::AckCancel {
                reason: String::new(),
            },
        )
        .await,
        "LeaseLost",
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
    assert_err(
        store.append_update("a", update(1, "e1", "x")).await,
        "LeaseLost",
    );
    assert_err(
        store.append_update("a", update(1, "e2", "x")).await,
        "LeaseLost",
    );
    // Attempt 2 replaying attempt 1's event is a replay.
    let (_, inserted) = store
        .append_update("a", update(2, "e1", "x"))
        .await
        .unwrap();
    assert!(!inserted);
    assert_err(
        store.append_update("a", update(3, "e3", "x")).await,
        "LeaseLost",
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
    assert_err(
        store
            .enqueue_notification("a", 1, note("e", "app", ""))
            .await,
        "LeaseLost",
    );
    // Expired lease.
    routed_running(&env, "b", false, Retry).await;
    env.advance(LEASE_MS);
    assert_err(
        store
            .enqueue_notification("b", 1, note("e", "app", ""))
            .await,
        "LeaseLost",
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
    assert_err(
        store
            .enqueue_notification("c", 1, note("e", "app", ""))
            .await,
        "LeaseLost",
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
        assert_err(
            store.execute("a", first.version, command).await,
            "VersionConflict",
        );
    }
    assert_err(
        store.append_update("a", update(1, "x", "stale")).await,
        "LeaseLost",
    );
    assert_eq!(store.get("a").await.unwrap(), current);
    assert_eq!(current.checkpoint, b"attempt-2");
}

// ---------------------------------------------------------------- CommitStart

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
    assert_err(
        store
            .execute(
                "a",
                t.version,
                Command::CommitStart {
                    checkpoint: cp("two"),
                },
            )
            .await,
        "IllegalTransition",
    );
    assert_eq!(store.get("a").await.unwrap(), t);
    // An initial checkpoint from Create counts as started too.
    let mut req = request(spec("b"), Retry);
    req.checkpoint = cp("initial");
    store.create(req).await.unwrap();
    ok(store, "b", Command::Start).await;
    assert_err(
        exec(
            store,
            "b",
            Command::CommitStart {
                checkpoint: cp("x"),
            },
        )
        .await,
        "IllegalTransition",
    );
}

#[tokio::test]
async fn g026_commit_start_stale_version() {
    let env = Env::new();
    let store = env.store();
    let r = running(store, "a", Retry).await;
    ok(store, "a", Command::Heartbeat).await;
    assert_err(
        store
            .execute(
                "a",
                r.version,
                Command::CommitStart {
                    checkpoint: cp("c"),
                },
            )
            .await,
        "VersionConflict",
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
    assert_err(
        store
            .execute("a", r.version, Command::CommitStart { checkpoint: vec![] })
            .await,
        "Invalid",
    );
    assert_eq!(store.get("a").await.unwrap(), r);
}

// ---------------------------------------------------------------- terminal states

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
            assert_err(
                store.execute(&id, t.version, command.clone()).await,
                "LeaseLost",
            );
            assert_err(
                store.execute(&id, t.version - 1, command).await,
                "VersionConflict",
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
        assert_err(
            exec(store, &id, Command::RequestCancel { reason: "x".into() }).await,
            "AlreadyTerminal",
        );
        // Regardless of the version passed.
        assert_err(
            store
                .execute(
                    &id,
                    t.version - 1,
                    Command::RequestCancel { reason: "x".into() },
                )
                .await,
            "AlreadyTerminal",
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
    assert_err(
        store
            .execute(
                "a",
                r.version,
                Command::Fail {
                    error: String::new(),
                },
            )
            .await,
        "InvalidExecutionResult",
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
        assert_err(
            store.execute(&id, t.version, Command::Heartbeat).await,
            "LeaseLost",
        );
        assert_err(
            store
                .execute(&id, t.version, Command::Yield { checkpoint: vec![] })
                .await,
            "LeaseLost",
        );
        assert_err(
            store.append_update(&id, update(1, "u", "x")).await,
            "LeaseLost",
        );
    }
    // Retry expiry too.
    running(store, "x", Retry).await;
    env.advance(LEASE_MS);
    let t = store.get("x").await.unwrap();
    assert_eq!((t.status, t.lease_deadline), (Status::Pending, None));
    assert_err(
        store.execute("x", t.version, Command::Heartbeat).await,
        "LeaseLost",
    );
}

// ---------------------------------------------------------------- cancellation

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
    assert_err(exec(store, "a", Command::Heartbeat).await, "LeaseLost");
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

// ---------------------------------------------------------------- lease expiry

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
    assert_err(
        store.execute("a", hb.version, Command::Heartbeat).await,
        "VersionConflict",
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

// ---------------------------------------------------------------- waiting, suspension, resume

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
        assert_err(exec(store, "a", command).await, "Invalid");
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
        .map(|t| t.spec.id)
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
        assert_err(
            exec(
                store,
                id,
                Command::ReleaseSuspension {
                    context_snapshot: None,
                },
            )
            .await,
            "IllegalTransition",
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
        assert_err(
            exec(
                store,
                id,
                Command::Resume {
                    data: vec![],
                    context_snapshot: None,
                },
            )
            .await,
            "IllegalTransition",
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

// ---------------------------------------------------------------- yield

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
    assert_err(
        store.execute("a", t.version, Command::Heartbeat).await,
        "LeaseLost",
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

// ---------------------------------------------------------------- transcript failure

#[tokio::test]
async fn g066_transcript_failure_first_wins() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    let first = ok(
        store,
        "a",
        Command::ReportTranscriptFailure {
            error: "disk full".into(),
        },
    )
    .await;
    assert_eq!(first.output_file_error, "disk full");
    let again = ok(
        store,
        "a",
        Command::ReportTranscriptFailure {
            error: "other".into(),
        },
    )
    .await;
    assert_eq!(again, first);
    // Allowed with cancel intent; still the first message.
    ok(
        store,
        "a",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    let t = ok(
        store,
        "a",
        Command::ReportTranscriptFailure {
            error: "third".into(),
        },
    )
    .await;
    assert_eq!(t.output_file_error, "disk full");
    running(store, "b", Retry).await;
    ok(
        store,
        "b",
        Command::RequestCancel {
            reason: String::new(),
        },
    )
    .await;
    let t = ok(
        store,
        "b",
        Command::ReportTranscriptFailure { error: "x".into() },
    )
    .await;
    assert_eq!(t.output_file_error, "x");
}

#[tokio::test]
async fn g067_transcript_failure_keeps_status_and_result() {
    let env = Env::new();
    let store = env.store();
    let r = running(store, "a", Retry).await;
    let t = ok(
        store,
        "a",
        Command::ReportTranscriptFailure { error: "e".into() },
    )
    .await;
    assert_eq!(
        (t.status, &t.result_data, &t.result_error),
        (r.status, &r.result_data, &r.result_error)
    );
    let done = ok(store, "a", Command::Complete { data: cp("ok") }).await;
    assert_eq!(
        (
            done.status,
            done.result_data.as_slice(),
            done.result_error.as_str()
        ),
        (Status::Completed, &b"ok"[..], "")
    );
    assert_eq!(done.output_file_error, "e");
}

// ---------------------------------------------------------------- listing

#[tokio::test]
async fn g068_list_ascending_and_filtered() {
    let env = Env::new();
    let store = env.store();
    for id in ["c", "a", "d", "b"] {
        create(store, id, Retry).await;
    }
    let mut other = spec("aa");
    other.executor_key = "other".into();
    store.create(request(other, Retry)).await.unwrap();
    let ids = |page: dtask_engine::TaskPage| -> Vec<String> {
        page.tasks.into_iter().map(|t| t.spec.id).collect()
    };
    assert_eq!(
        ids(store.list_pending(&keys(), None, 0).await.unwrap()),
        ["a", "b", "c", "d"]
    );
    assert_eq!(
        ids(store
            .list_pending(&["other".into()], None, 0)
            .await
            .unwrap()),
        ["aa"]
    );
    assert_eq!(
        ids(store
            .list_pending(&["other".into(), KEY.into()], None, 0)
            .await
            .unwrap()),
        ["a", "aa", "b", "c", "d"]
    );
    assert!(store
        .list_pending(&["none".into()], None, 0)
        .await
        .unwrap()
        .tasks
        .is_empty());
}

#[tokio::test]
async fn g069_list_rejects_empty_keys() {
    let env = Env::new();
    let store = env.store();
    create(store, "a", Retry).await;
    assert_err(store.list_pending(&[], None, 0).await, "Invalid");
    assert_err(
        store
            .list_pending(&[KEY.into(), String::new()], None, 0)
            .await,
        "Invalid",
    );
    assert_err(store.list_suspended(&[], None, 0).await, "Invalid");
}

#[tokio::test]
async fn g070_list_pagination() {
    let env = Env::new();
    let store = env.store();
    for id in ["b", "a", "c"] {
        create(store, id, Retry).await;
    }
    let first = store.list_pending(&keys(), None, 2).await.unwrap();
    let ids: Vec<_> = first.tasks.iter().map(|t| t.spec.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    let cursor = first.next_cursor.expect("a cursor");
    let next = store.list_pending(&keys(), Some(&cursor), 2).await.unwrap();
    let ids: Vec<_> = next.tasks.iter().map(|t| t.spec.id.as_str()).collect();
    assert_eq!(ids, ["c"]);
    assert_eq!(next.next_cursor, None);
    // An exactly full last page has no cursor either.
    let all = store.list_pending(&keys(), None, 3).await.unwrap();
    assert_eq!((all.tasks.len(), all.next_cursor), (3, None));
}

#[tokio::test]
async fn g071_list_cursor_of_another_listing() {
    let env = Env::new();
    let store = env.store();
    for id in ["a", "b", "c"] {
        create(store, id, Retry).await;
    }
    let cursor = store
        .list_pending(&keys(), None, 1)
        .await
        .unwrap()
        .next_cursor
        .unwrap();
    assert_err(
        store.list_suspended(&keys(), Some(&cursor), 1).await,
        "InvalidCursor",
    );
    assert_err(
        store
            .list_pending(&["other".into()], Some(&cursor), 1)
            .await,
        "InvalidCursor",
    );
    assert_err(
        store
            .list_pending(&[KEY.into(), "x".into()], Some(&cursor), 1)
            .await,
        "InvalidCursor",
    );
    // Key order and duplicates do not matter.
    assert!(store
        .list_pending(&[KEY.into(), KEY.into()], Some(&cursor), 1)
        .await
        .is_ok());
}

#[tokio::test]
async fn g072_list_malformed_cursor() {
    let env = Env::new();
    let store = env.store();
    create(store, "a", Retry).await;
    for bad in ["", "!!!", "e30", "not-a-cursor", "eyJ2IjoyfQ"] {
        assert_err(
            store.list_pending(&keys(), Some(bad), 1).await,
            "InvalidCursor",
        );
    }
}

#[tokio::test]
async fn g073_list_limit_default_and_cap() {
    let env = Env::new();
    let store = env.store();
    for i in 0..1001 {
        create(store, &format!("t{i:04}"), Retry).await;
    }
    for limit in [0, -5] {
        let page = store.list_pending(&keys(), None, limit).await.unwrap();
        assert_eq!(page.tasks.len(), 100);
        assert!(page.next_cursor.is_some());
    }
    let page = store.list_pending(&keys(), None, 5000).await.unwrap();
    assert_eq!(page.tasks.len(), 1000);
    let rest = store
        .list_pending(&keys(), page.next_cursor.as_deref(), 5000)
        .await
        .unwrap();
    assert_eq!(rest.tasks.len(), 1);
    assert_eq!(rest.next_cursor, None);
}

// ---------------------------------------------------------------- task events (updates)

#[tokio::test]
async fn g074_update_keeps_version_and_updated_at() {
    let env = Env::new();
    let store = env.store();
    let r = running(store, "a", Retry).await;
    env.advance(7);
    let (rec, inserted) = store.append_update("a", update(1, "e", "x")).await.unwrap();
    assert!(inserted);
    assert_eq!(rec.created_at, Timestamp(T0 + 7));
    let t = store.get("a").await.unwrap();
    assert_eq!((t.version, t.updated_at), (r.version, r.updated_at));
    assert_eq!(t.updates, 1);
}

#[tokio::test]
async fn g075_update_replay_returns_original() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    let (original, inserted) = store.append_update("a", update(1, "e", "x")).await.unwrap();
    assert!(inserted);
    env.advance(100);
    let (again, inserted) = store.append_update("a", update(1, "e", "x")).await.unwrap();
    assert!(!inserted);
    assert_eq!(again, original);
    assert_eq!(store.get("a").await.unwrap().updates, 1);
}

#[tokio::test]
async fn g076_update_conflict_stores_nothing() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    store.append_update("a", update(1, "e", "x")).await.unwrap();
    let before = store.get("a").await.unwrap();
    assert_err(
        store.append_update("a", update(1, "e", "y")).await,
        "EventIdConflict",
    );
    let mut other_kind = update(1, "e", "x");
    other_kind.kind = "other".into();
    assert_err(
        store.append_update("a", other_kind).await,
        "EventIdConflict",
    );
    let mut other_meta = update(1, "e", "x");
    other_meta.metadata.clear();
    assert_err(
        store.append_update("a", other_meta).await,
        "EventIdConflict",
    );
    assert_eq!(store.get("a").await.unwrap(), before);
    assert_eq!(
        store
            .list_updates("a", None, 0, false)
            .await
            .unwrap()
            .updates
            .len(),
        1
    );
}

#[tokio::test]
async fn g078_updates_in_append_order_and_reversed() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    let ids = ["z", "a", "m", "b", "y"];
    for (i, id) in ids.iter().enumerate() {
        store
            .append_update("a", update(1, id, &i.to_string()))
            .await
            .unwrap();
        if i == 2 {
            ok(store, "a", Command::Heartbeat).await;
        }
    }
    let forward: Vec<_> = store
        .list_updates("a", None, 0, false)
        .await
        .unwrap()
        .updates
        .into_iter()
        .map(|u| u.event_id)
        .collect();
    assert_eq!(forward, ids);
    let backward: Vec<_> = store
        .list_updates("a", None, 0, true)
        .await
        .unwrap()
        .updates
        .into_iter()
        .map(|u| u.event_id)
        .collect();
    let mut reversed: Vec<String> = ids.map(str::to_owned).to_vec();
    reversed.reverse();
    assert_eq!(backward, reversed);
    // Paged, both directions.
    for newest_first in [false, true] {
        let mut cursor = None;
        let mut all = Vec::new();
        loop {
            let page = store
                .list_updates("a", cursor.as_deref(), 2, newest_first)
                .await
                .unwrap();
            assert!(page.updates.len() <= 2);
            all.extend(page.updates.into_iter().map(|u| u.event_id));
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(
            all,
            if newest_first {
                reversed.clone()
            } else {
                ids.map(str::to_owned).to_vec()
            }
        );
    }
}

#[tokio::test]
async fn g079_update_cursor_keeps_its_snapshot() {
    let env = Env::new();
    let store = env.store();
    running(store, "a", Retry).await;
    for i in 0..3 {
        store
            .append_update("a", update(1, &format!("e{i}"), "x"))
            .await
            .unwrap();
    }
    for newest_first in [false, true] {
        let first = store
            .list_updates("a", None, 2, newest_first)
            .await
            .unwrap();
        let cursor = first.next_cursor.unwrap();
        store
            .append_update("a", update(1, &format!("late{newest_first}"), "x"))
            .await
            .unwrap();
        let rest = store
            .list_updates("a", Some(&cursor), 100, newest_first)
            .await
            .unwrap();
        let ids: Vec<_> = rest.updates.into_iter().map(|u| u.event_id).collect();
        if newest_first {
            // The traversal started after "latefalse" was appended; "latetrue" is not seen.
            assert_eq!(ids, ["e1", "e0"]);
        } else {
            assert_eq!(ids, ["e2"]);
        }
        assert_eq!(rest.next_cursor, None);
    }
}

#[tokio::test]
async fn g080_update_cursor_validation() {
    let env = Env::new();
    let store = env.store();
    for id in ["a", "b"] {
        running(store, id, Retry).await;
        for i in 0..3 {
            store
                .append_update(id, update(1, &format!("e{i}"), "x"))
                .await
                .unwrap();
        }
    }
    let cursor = store
        .list_updates("a", None, 1, false)
        .await
        .unwrap()
        .next_cursor
        .unwrap();
    assert_err(
        store.list_updates("b", Some(&cursor), 1, false).await,
        "InvalidCursor",
    );
    assert_err(
        store.list_updates("a", Some(&cursor), 1, true).await,
        "InvalidCursor",
    );
    assert_err(
        store.list_updates("a", Some("garbage"), 1, false).await,
        "InvalidCursor",
    );
    assert!(store
        .list_updates("a", Some(&cursor), 1, false)
        .await
        .is_ok());
}

#[tokio::test]
async fn g081_updates_of_unknown_task_not_found() {
    let env = Env::new();
    assert_err(
        env.store().list_updates("nope", None, 0, false).await,
        "NotFound",
    );
    assert_err(
        env.store().append_update("nope", update(1, "e", "x")).await,
        "NotFound",
    );
}

#[tokio::test]
async fn g082_updates_readable_after_terminal_and_retry() {
    let mut env = Env::new();
    running(env.store(), "a", Retry).await;
    env.store()
        .append_update("a", update(1, "first", "x"))
        .await
        .unwrap();
    env.advance(LEASE_MS);
    ok(env.store(), "a", Command::Start).await;
    env.store()
        .append_update("a", update(2, "second", "y"))
        .await
        .unwrap();
    ok(env.store(), "a", Command::Complete { data: vec![] }).await;
    env.reopen();
    let page = env.store().list_updates("a", None, 0, false).await.unwrap();
    let got: Vec<_> = page
        .updates
        .iter()
        .map(|u| (u.event_id.as_str(), u.attempt))
        .collect();
    assert_eq!(got, [("first", 1), ("second", 2)]);
}

// ---------------------------------------------------------------- notifications and outbox

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
    assert_err(store.ack_notification(&got[0].receipt).await, "LeaseLost");
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
    assert_err(store.ack_notification(&first[0].receipt).await, "NotFound");
    store.ack_notification(&second[0].receipt).await.unwrap();
    assert_err(store.ack_notification("lease:unknown").await, "NotFound");
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
        assert_err(env.store().ack_notification(stale).await, "NotFound");
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
    assert_err(
        env.store().receive_notifications(10, Duration::ZERO).await,
        "Invalid",
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
    assert_err(
        store
            .enqueue_notification("a", 1, note("e", "app2", "d"))
            .await,
        "NotificationEventIdConflict",
    );
    assert_err(
        store
            .enqueue_notification("a", 1, note("e", "app", "other"))
            .await,
        "NotificationEventIdConflict",
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
            },
        )
        .await
        .unwrap();
    assert_err(
        store
            .enqueue_notification("a", 1, note("e", "app", "x"))
            .await,
        "NotificationEventIdConflict",
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
        },
    ];
    for request in bad {
        assert_err(store.enqueue_notification("a", 1, request).await, "Invalid");
    }
    assert_err(
        store
            .enqueue_notification("a", 0, note("e", "app", ""))
            .await,
        "Invalid",
    );
    // Validation comes before authorization: a stale attempt with a bad kind is Invalid.
    assert_err(
        store.enqueue_notification("a", 7, note("e", "", "")).await,
        "Invalid",
    );
    assert_eq!(store.get("a").await.unwrap(), before);
    assert!(receive_all(store).await.is_empty());
    // No route.
    running(store, "b", Retry).await;
    assert_err(
        store
            .enqueue_notification("b", 1, note("e", "app", ""))
            .await,
        "NotificationUnavailable",
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

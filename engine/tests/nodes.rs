//! Several nodes — task stores in one process, each with its own journal connections — on one
//! PostgreSQL journal (`DTASK_TEST_PG_URL`, set by `./dev test` and CI): a task created on one
//! node is found and claimed on another, and two nodes racing on one task have exactly one
//! winner, the loser getting the typed `VersionConflict`, 100 runs each. Without the variable
//! every test says loudly that it was skipped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use dtask_engine::{
    Command, InputRequest, ManualClock, StoreConfig, StoreError, TaskStore, UpdateRequest,
};
use dtask_journal::{Delivery, Journal, JournalOptions, LeasePolicy};
use dtask_replay::Status;

const RUNS: usize = 100;

/// Two stores on a fresh schema, or `None` (and a loud line) without a database.
fn nodes(test: &str) -> Option<(TaskStore, TaskStore, String)> {
    let Ok(base) = std::env::var("DTASK_TEST_PG_URL") else {
        eprintln!("SKIPPED {test}: DTASK_TEST_PG_URL is not set (./dev test sets it)");
        return None;
    };
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}schema=n{}_{test}", std::process::id());
    let clock = ManualClock::new(T0);
    let open = || {
        let journal = Journal::open_postgres(&url, JournalOptions::default()).unwrap();
        TaskStore::open(journal, clock.clone(), StoreConfig::default()).unwrap()
    };
    Some((open(), open(), url))
}

/// The two outcomes of a race: exactly one success, and the other a version conflict.
fn one_winner<T: std::fmt::Debug>(a: Result<T, StoreError>, b: Result<T, StoreError>, run: usize) {
    let wins = usize::from(a.is_ok()) + usize::from(b.is_ok());
    assert_eq!(wins, 1, "run {run}: {a:?} / {b:?}");
    let lost = if a.is_err() { a } else { b };
    assert!(
        matches!(lost, Err(StoreError::VersionConflict { .. })),
        "run {run}: the loser got {lost:?}"
    );
}

/// The journal audits clean.
fn clean(url: &str) {
    let journal = Journal::open_postgres_read_only(url).unwrap();
    let audit = dtask_replay::audit_journal(&journal, &mut |_| {}).unwrap();
    assert!(audit.is_clean(), "{:?}", audit.problems);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_created_on_one_node_is_claimed_on_another() {
    let Some((a, b, url)) = nodes("handoff") else {
        return;
    };
    create(&a, "t", LeasePolicy::Retry).await;
    // B learns of it by following the journal, and finds it pending.
    b.refresh().await.unwrap();
    let seen = b.get("t").await.unwrap();
    assert_eq!(seen.status, Status::Pending);
    let claimed = b.execute("t", seen.version, Command::Start).await.unwrap();
    assert_eq!(claimed.attempt, 1);
    // A's memory was a cache: a write on it is refused by the database, and A folds again.
    let stale = a.execute("t", seen.version, Command::Start).await;
    assert!(
        matches!(stale, Err(StoreError::VersionConflict { .. })),
        "{stale:?}"
    );
    assert_eq!(a.get("t").await.unwrap().status, Status::Running);
    // Following brings A's reads up to date without a write.
    b.execute(
        "t",
        claimed.version,
        Command::Complete {
            data: b"done".to_vec(),
        },
    )
    .await
    .unwrap();
    a.refresh().await.unwrap();
    assert_eq!(a.get("t").await.unwrap().status, Status::Completed);
    clean(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_claiming_one_task_exactly_one_wins() {
    let Some((a, b, url)) = nodes("claim") else {
        return;
    };
    for run in 0..RUNS {
        let id = format!("c{run}");
        let created = create(&a, &id, LeasePolicy::Retry).await;
        b.refresh().await.unwrap();
        let (ra, rb) = tokio::join!(
            a.execute(&id, created.version, Command::Start),
            b.execute(&id, created.version, Command::Start),
        );
        one_winner(ra, rb, run);
    }
    clean(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_against_cancel_across_nodes_exactly_one_wins() {
    let Some((a, b, url)) = nodes("cancel") else {
        return;
    };
    for run in 0..RUNS {
        let id = format!("k{run}");
        let state = running(&a, &id, LeasePolicy::Retry).await;
        b.refresh().await.unwrap();
        let (ra, rb) = tokio::join!(
            a.execute(
                &id,
                state.version,
                Command::Complete {
                    data: b"ok".to_vec()
                }
            ),
            b.execute(
                &id,
                state.version,
                Command::RequestCancel {
                    reason: "stop".into()
                }
            ),
        );
        one_winner(ra, rb, run);
    }
    clean(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_update_sent_to_two_nodes_is_recorded_once() {
    let Some((a, b, url)) = nodes("update") else {
        return;
    };
    for run in 0..RUNS {
        let id = format!("u{run}");
        running(&a, &id, LeasePolicy::Retry).await;
        b.refresh().await.unwrap();
        let update = UpdateRequest {
            attempt: 1,
            event_id: "e1".into(),
            kind: "progress".into(),
            data: b"half".to_vec(),
            ..UpdateRequest::default()
        };
        let (ra, rb) = tokio::join!(
            a.append_update(&id, update.clone()),
            b.append_update(&id, update.clone()),
        );
        one_winner(ra, rb, run);
        // The loser, sending it again, is told it is recorded already.
        let (_, new_a) = a.append_update(&id, update.clone()).await.unwrap();
        let (_, new_b) = b.append_update(&id, update).await.unwrap();
        assert!(!new_a && !new_b, "run {run}");
        let stream = Journal::open_postgres_read_only(&url).unwrap();
        let updates = stream
            .read_stream(&id, 0)
            .filter(|r| {
                r.as_ref().unwrap().event.event_type() == dtask_journal::EventType::UpdateAppended
            })
            .count();
        assert_eq!(updates, 1, "run {run}");
    }
    clean(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_against_completion_across_nodes_exactly_one_wins() {
    let Some((a, b, url)) = nodes("input") else {
        return;
    };
    for run in 0..RUNS {
        let id = format!("i{run}");
        let state = running(&a, &id, LeasePolicy::Retry).await;
        b.refresh().await.unwrap();
        let input = InputRequest {
            event_id: format!("in{run}"),
            kind: "message".into(),
            data: b"hello".to_vec(),
            delivery: Delivery::Queued,
        };
        let (ra, rb) = tokio::join!(
            a.execute(
                &id,
                state.version,
                Command::Complete {
                    data: b"ok".to_vec()
                }
            ),
            b.send_input(&id, input),
        );
        one_winner(ra.map(|_| ()), rb.map(|_| ()), run);
    }
    clean(&url);
}

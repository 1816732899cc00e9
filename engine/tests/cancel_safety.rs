//! Cancellation safety: a store call whose future is dropped while its append is in flight —
//! a `timeout` around a wait that resolves an expired lease, a `select!` branch not taken —
//! leaves no task behind its journal. The append still lands (the journal's writer does not
//! cancel it); the next call on the task sees it instead of conflicting with it forever.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use dtask_engine::{Command, StoreConfig, TaskStore};
use dtask_journal::{Durability, Journal, JournalOptions, LeasePolicy::Retry};
use dtask_replay::{load_task, Status};
use std::future::Future;
use std::task::Poll;
use std::time::Duration;

const LEASE_MS: u64 = 30_000;

/// A store whose appends always go to the journal's writer thread and wait for a sync: an
/// append is in flight from its submission until the sync's acknowledgement.
fn store(dir: &std::path::Path, clock: &dtask_engine::ManualClock) -> TaskStore {
    let options = JournalOptions::default()
        .with_durability(Durability::Sync)
        .with_inline_lone_appends(false);
    let journal = Journal::open(dir, options).unwrap();
    let config = StoreConfig::default().with_lease_duration(Duration::from_millis(LEASE_MS));
    TaskStore::open(journal, clock.clone(), config).unwrap()
}

/// Polls `future` up to three times — enough for its append to be submitted — then drops
/// it; whether it was dropped unfinished (its append in flight, as a sync takes far longer
/// than three polls).
async fn drop_midway<F: Future>(future: F) -> bool {
    let mut future = Box::pin(future);
    for _ in 0..3 {
        let finished =
            std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_ready())).await;
        if finished {
            return false;
        }
    }
    true
}

/// Waits until the journal's durable sequence reaches `seq`.
async fn durable(journal: &Journal, seq: u64) {
    let mut durable = journal.watch_durable();
    while *durable.borrow_and_update() < seq {
        durable.changed().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_dropped_while_its_expiry_is_appended_leaves_the_task_current() {
    let dir = tempfile::tempdir().unwrap();
    let clock = dtask_engine::ManualClock::new(T0);
    let store = store(dir.path(), &clock);
    let mut exercised = 0;
    for i in 0..20 {
        let id = format!("t{i}");
        let started = running(&store, &id, Retry).await;
        let before = store.journal().durable_seq();
        clock.advance(Duration::from_millis(LEASE_MS + 1));
        // The wait finds the lease expired and appends the expiry; dropped before the
        // append is acknowledged.
        if drop_midway(store.wait_for_task_version(&id, started.version)).await {
            exercised += 1;
        }
        // The dropped append lands all the same.
        durable(store.journal(), before + 1).await;
        let stored = load_task(store.journal(), &id).unwrap().unwrap();
        assert_eq!(
            stored.state.status,
            Status::Pending,
            "{id}: expired in the journal"
        );
        // The store sees it: its state is the journal's, and a claim at that version wins.
        let state = store.get(&id).await.unwrap();
        assert_eq!(
            (state.version, state.position, state.status),
            (stored.state.version, stored.state.position, Status::Pending),
            "{id}: the store's state is the journal's"
        );
        let claimed = store
            .execute(&id, state.version, Command::Start)
            .await
            .unwrap();
        assert_eq!(
            (claimed.status, claimed.attempt),
            (Status::Running, 2),
            "{id}"
        );
    }
    // Most rounds drop the wait with its append in flight (a sync takes far longer than
    // three polls); one is enough for the test to mean something.
    assert!(exercised > 0, "no round dropped an append in flight");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_completion_dropped_in_flight_leaves_its_parent_current() {
    let dir = tempfile::tempdir().unwrap();
    let clock = dtask_engine::ManualClock::new(T0);
    let store = store(dir.path(), &clock);
    let mut exercised = 0;
    for i in 0..10 {
        let (parent, child) = (format!("p{i}"), format!("c{i}"));
        running(&store, &parent, Retry).await;
        store
            .create(child_request(&child, &parent, 1, true))
            .await
            .unwrap();
        let started = ok(&store, &child, Command::Start).await;
        let before = store.journal().durable_seq();
        // The child's completion goes into its parent's mailbox in the same append; the
        // call is dropped before that append is acknowledged.
        let complete = store.execute(
            &child,
            started.version,
            Command::Complete { data: cp("done") },
        );
        if drop_midway(complete).await {
            exercised += 1;
        }
        durable(store.journal(), before + 1).await;
        // Both tasks are as their streams say: the child completed, the parent one input on.
        for id in [&child, &parent] {
            let stored = load_task(store.journal(), id).unwrap().unwrap().state;
            let state = store.get(id).await.unwrap();
            assert_eq!(
                (state.version, state.position, state.status),
                (stored.version, stored.position, stored.status),
                "{id}: the store's state is the journal's"
            );
        }
        assert_eq!(store.get(&child).await.unwrap().status, Status::Completed);
        let inputs = store.list_inputs(&parent, 0, 10).await.unwrap().inputs;
        let kinds: Vec<&str> = inputs.iter().map(|input| input.kind.as_str()).collect();
        assert_eq!(
            kinds.last(),
            Some(&"completed"),
            "{parent}: the child's completion delivered ({kinds:?})"
        );
        // And the parent's next write goes through.
        let version = store.get(&parent).await.unwrap().version;
        store
            .execute(&parent, version, Command::Heartbeat)
            .await
            .unwrap();
    }
    assert!(exercised > 0, "no round dropped an append in flight");
}

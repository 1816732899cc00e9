//! What the store offers beyond the reference: reruns (a finished root task run again as a
//! new task, with the lineage written both ways in one append), recovery limits (a task
//! that keeps losing its worker fails instead of being retried forever) and delayed runs (a
//! pending task no worker may claim before its not-before time: a durable timer). Scenarios run
//! straight and with the store reopened before every step (what the journal holds is all
//! there is).

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use dtask_engine::{
    trim_due, whole_updates, Command, CreateRequest, StoreConfig, StoreError, TaskStore,
};
use dtask_journal::{Event, EventType, LeasePolicy, Timestamp};
use dtask_replay::{recovery_limit_error, Status};

use LeasePolicy::{Fail, Retry};

/// The store, reopened first when `reboot` is set.
fn s(env: &mut Env, reboot: bool) -> &TaskStore {
    if reboot {
        env.reopen();
    }
    env.store()
}

/// The event types of `id`'s stream, in order.
fn stream_types(store: &TaskStore, id: &str) -> Vec<EventType> {
    store
        .journal()
        .read_stream(id, 0)
        .map(|r| r.unwrap().event.event_type())
        .collect()
}

/// A task created with a context (and `initial` checkpoint, if given), run and failed — with
/// a started marker when it had no initial checkpoint.
async fn failed_task(store: &TaskStore, id: &str, initial: Option<&str>) {
    let mut req = request(spec(id), Fail);
    req.checkpoint = initial.map(cp).unwrap_or_default();
    req.context_snapshot = cp("context");
    req.spec.payload = br#"{"tool_name":"shell"}"#.to_vec();
    let t = store.create(req).await.unwrap();
    store.execute(id, t.version, Command::Start).await.unwrap();
    if initial.is_none() {
        ok(
            store,
            id,
            Command::CommitStart {
                checkpoint: cp("started"),
            },
        )
        .await;
    }
    ok(
        store,
        id,
        Command::Fail {
            error: "boom".into(),
        },
    )
    .await;
}

async fn reruns_a_finished_task_from_its_creation(reboot: bool) {
    let mut env = Env::new();
    failed_task(s(&mut env, reboot), "t", None).await;
    let before = s(&mut env, reboot).get("t").await.unwrap();

    let rerun = s(&mut env, reboot).rerun("t", None).await.unwrap();
    assert_eq!(rerun.id(), "t.rerun-1");
    assert_eq!(rerun.status, Status::Pending);
    assert_eq!((rerun.version, rerun.attempt, rerun.position), (1, 0, 2));
    assert_eq!(rerun.policy, Fail);
    assert!(
        rerun.checkpoint.is_empty(),
        "the started marker is not carried"
    );
    assert_eq!(rerun.context_snapshot, cp("context"));
    assert_eq!(rerun.spec.payload, before.spec.payload);
    assert_eq!(rerun.spec.executor_key, KEY);
    assert_eq!(rerun.rerun_of(), Some("t"));
    assert!(rerun.rerun_as().is_empty());

    let store = s(&mut env, reboot);
    let original = store.get("t").await.unwrap();
    assert_eq!(original.rerun_as(), ["t.rerun-1"]);
    assert_eq!(original.rerun_of(), None);
    assert_eq!(original.status, Status::Failed);
    assert_eq!(
        original.version, before.version,
        "lineage is not a lifecycle event"
    );
    assert_eq!(original.position, before.position + 1);
    assert_eq!(
        stream_types(store, "t.rerun-1"),
        [EventType::Created, EventType::RerunOf]
    );
    assert_eq!(stream_types(store, "t").last(), Some(&EventType::RerunAs));
    assert_eq!(
        store.get("t.rerun-1").await.unwrap(),
        rerun,
        "the folded rerun is the one returned"
    );

    // The rerun runs like any task: claimed, started from scratch, completed.
    let store = s(&mut env, reboot);
    let claimed = store.execute("t.rerun-1", 1, Command::Start).await.unwrap();
    assert_eq!(claimed.attempt, 1);
    assert!(!claimed.is_started());
    ok(store, "t.rerun-1", Command::Complete { data: cp("ok") }).await;

    // A second rerun of the original, and a rerun of the rerun.
    let second = s(&mut env, reboot).rerun("t", None).await.unwrap();
    assert_eq!(second.id(), "t.rerun-2");
    let third = s(&mut env, reboot)
        .rerun("t.rerun-1", Some("t.third".into()))
        .await
        .unwrap();
    assert_eq!(third.rerun_of(), Some("t.rerun-1"));
    let store = s(&mut env, reboot);
    assert_eq!(
        store.get("t").await.unwrap().rerun_as(),
        ["t.rerun-1", "t.rerun-2"]
    );
    let middle = store.get("t.rerun-1").await.unwrap();
    assert_eq!(middle.rerun_of(), Some("t"));
    assert_eq!(middle.rerun_as(), ["t.third"]);
    assert_eq!(middle.status, Status::Completed);
}

#[tokio::test]
async fn a_finished_task_reruns_from_its_creation_and_both_name_each_other() {
    reruns_a_finished_task_from_its_creation(false).await;
}

#[tokio::test]
async fn a_rerun_and_its_lineage_survive_a_reopen_at_every_step() {
    reruns_a_finished_task_from_its_creation(true).await;
}

#[tokio::test]
async fn a_rerun_asked_for_twice_by_name_is_made_once() {
    let env = Env::new();
    let store = env.store();
    failed_task(store, "t", Some("initial")).await;
    let first = store.rerun("t", Some("again".into())).await.unwrap();
    assert_eq!(first.checkpoint, cp("initial"), "the creation's checkpoint");
    let repeat = store.rerun("t", Some("again".into())).await.unwrap();
    assert_eq!(first, repeat);
    let original = store.get("t").await.unwrap();
    assert_eq!(original.rerun_as(), ["again"]);
}

#[tokio::test]
async fn a_rerun_is_refused_before_the_end_for_a_nested_task_and_for_a_taken_id() {
    let env = Env::new();
    let store = env.store();
    assert_err!(store.rerun("nobody", None).await, StoreError::NotFound(_));

    // Not finished: pending, then running.
    create(store, "live", Retry).await;
    assert_err!(
        store.rerun("live", None).await,
        StoreError::IllegalTransition {
            status: Status::Pending,
            operation: "rerun"
        }
    );
    running(store, "run", Retry).await;
    assert_err!(
        store.rerun("run", None).await,
        StoreError::IllegalTransition {
            status: Status::Running,
            ..
        }
    );

    // Its own id, and an id another task holds: refused, nothing written.
    failed_task(store, "t", None).await;
    create(store, "taken", Retry).await;
    let before = store.get("t").await.unwrap();
    assert_err!(
        store.rerun("t", Some("t".into())).await,
        StoreError::Invalid { .. }
    );
    assert!(matches!(
        store.rerun("t", Some("taken".into())).await,
        Err(StoreError::AlreadyExists(id)) if id == "taken"
    ));
    assert_err!(
        store.rerun("t", Some(String::new())).await,
        StoreError::Invalid { .. }
    );
    let after = store.get("t").await.unwrap();
    assert_eq!(after, before, "no lineage written for a refused rerun");
    assert_eq!(store.get("taken").await.unwrap().rerun_of(), None);

    // A nested task, finished: its parent reruns it, not the store.
    let parent = running(store, "parent", Retry).await;
    let child: CreateRequest = child_request("child", "parent", parent.attempt, false);
    store.create(child).await.unwrap();
    ok(store, "child", Command::Start).await;
    ok(store, "child", Command::Fail { error: "e".into() }).await;
    assert_err!(
        store.rerun("child", None).await,
        StoreError::Invalid { field: "id", .. }
    );
    let events: Vec<Event> = store
        .journal()
        .read_stream("child", 0)
        .map(|r| r.unwrap().event)
        .collect();
    assert!(!events.iter().any(|e| e.event_type() == EventType::RerunAs));
}

/// A retry-policy task created with `max_recoveries`, and a session (so that its lifecycle
/// notifications are queued).
async fn capped(store: &TaskStore, id: &str, max_recoveries: Option<u64>) {
    let mut req = request(session_spec(id, true), Retry);
    req.max_recoveries = max_recoveries;
    let t = store.create(req).await.unwrap();
    assert_eq!(t.max_recoveries, max_recoveries);
    assert_eq!(t.recoveries, 0);
}

/// Claims `id` and lets its lease run out; returns the state the expiry left.
async fn lose_the_worker(env: &mut Env, reboot: bool, id: &str) -> dtask_replay::TaskState {
    let store = s(env, reboot);
    let t = store.get(id).await.unwrap();
    store.execute(id, t.version, Command::Start).await.unwrap();
    env.advance(LEASE_MS + 1);
    s(env, reboot).get(id).await.unwrap()
}

async fn fails_once_out_of_recoveries(reboot: bool) {
    let mut env = Env::new();
    capped(s(&mut env, reboot), "t", Some(2)).await;
    assert_eq!(
        stream_types(s(&mut env, reboot), "t")[..2],
        [EventType::Created, EventType::RecoveryLimit]
    );
    for n in 1..=2 {
        let t = lose_the_worker(&mut env, reboot, "t").await;
        assert_eq!((t.status, t.recoveries, t.attempt), (Status::Pending, n, n));
    }
    let t = lose_the_worker(&mut env, reboot, "t").await;
    assert_eq!(t.status, Status::Failed);
    assert_eq!((t.recoveries, t.attempt), (2, 3));
    assert_eq!(t.result_error, recovery_limit_error(2));
    assert_eq!(
        t.result_error,
        "execution lease expired after 2 recoveries, the most the task allows"
    );
    assert!(t.done_at.is_some());
    let notices = drain(s(&mut env, reboot)).await;
    assert_eq!(notices.last().map(String::as_str), Some("t:7:failed"));
}

#[tokio::test]
async fn a_task_out_of_recoveries_fails_at_its_next_lease_expiry() {
    fails_once_out_of_recoveries(false).await;
}

#[tokio::test]
async fn a_recovery_limit_and_its_count_survive_a_reopen_at_every_step() {
    fails_once_out_of_recoveries(true).await;
}

#[tokio::test]
async fn without_a_limit_a_task_is_recovered_every_time_and_with_intent_it_is_canceled() {
    let mut env = Env::new();
    capped(env.store(), "free", None).await;
    for n in 1..=5 {
        let t = lose_the_worker(&mut env, false, "free").await;
        assert_eq!((t.status, t.recoveries), (Status::Pending, n));
    }
    assert!(!stream_types(env.store(), "free").contains(&EventType::RecoveryLimit));

    // No recovery left, and cancellation requested while it ran: canceled, not failed.
    capped(env.store(), "c", Some(0)).await;
    let store = env.store();
    store.execute("c", 1, Command::Start).await.unwrap();
    ok(
        store,
        "c",
        Command::RequestCancel {
            reason: "stop".into(),
        },
    )
    .await;
    env.advance(2 * LEASE_MS + 1);
    let t = env.store().get("c").await.unwrap();
    assert_eq!(
        (t.status, t.result_error.as_str()),
        (Status::Canceled, "stop")
    );
}

#[tokio::test]
async fn a_limit_is_written_with_a_claimed_creation_and_carried_by_a_rerun() {
    let mut env = Env::new();
    let store = env.store();
    let mut req = request(spec("claimed"), Retry);
    req.max_recoveries = Some(1);
    let t = store.create_claimed(req).await.unwrap();
    assert_eq!((t.status, t.max_recoveries), (Status::Running, Some(1)));
    assert_eq!(
        stream_types(store, "claimed"),
        [
            EventType::Created,
            EventType::RecoveryLimit,
            EventType::AttemptStarted
        ]
    );
    env.advance(LEASE_MS + 1);
    assert_eq!(env.store().get("claimed").await.unwrap().recoveries, 1);
    let t = lose_the_worker(&mut env, false, "claimed").await;
    assert_eq!(t.status, Status::Failed);

    // The rerun starts with the same limit and none used.
    let rerun = env.store().rerun("claimed", None).await.unwrap();
    assert_eq!((rerun.max_recoveries, rerun.recoveries), (Some(1), 0));
    assert_eq!(
        stream_types(env.store(), rerun.id()),
        [
            EventType::Created,
            EventType::RerunOf,
            EventType::RecoveryLimit
        ]
    );
    env.reopen();
    let again = env.store().get(rerun.id()).await.unwrap();
    assert_eq!(again, rerun);
}

/// The ids `list_pending` gives for the default executor key.
async fn claimable(store: &TaskStore) -> Vec<String> {
    store
        .list_pending(&[KEY.to_owned()], None, 100)
        .await
        .unwrap()
        .tasks
        .into_iter()
        .map(|t| t.spec.id.clone())
        .collect()
}

async fn a_delayed_task_waits_for_its_time(reboot: bool) {
    let mut env = Env::new();
    let until = Timestamp(T0 + 60_000);
    let mut req = request(spec("later"), Retry);
    req.not_before = Some(until);
    let t = s(&mut env, reboot).create(req).await.unwrap();
    assert_eq!((t.status, t.not_before), (Status::Pending, Some(until)));
    create(s(&mut env, reboot), "now", Retry).await;
    assert_eq!(
        stream_types(s(&mut env, reboot), "later"),
        [EventType::Created, EventType::NotBefore]
    );
    assert_eq!(s(&mut env, reboot).next_due(), Some(until));

    // Not listed, not claimable, until its time.
    assert_eq!(claimable(s(&mut env, reboot)).await, ["now"]);
    assert!(matches!(
        s(&mut env, reboot).execute("later", 1, Command::Start).await,
        Err(StoreError::NotDue { until: u, .. }) if u == until
    ));
    env.advance(59_999);
    assert_eq!(claimable(s(&mut env, reboot)).await, ["now"]);
    env.advance(1);
    assert_eq!(claimable(s(&mut env, reboot)).await, ["later", "now"]);
    let claimed = s(&mut env, reboot)
        .execute("later", 1, Command::Start)
        .await
        .unwrap();
    assert_eq!(
        (claimed.status, claimed.not_before),
        (Status::Running, None)
    );

    // A durable timer: the attempt yields for ten seconds, keeping a new checkpoint.
    let store = s(&mut env, reboot);
    ok(
        store,
        "later",
        Command::YieldUntil {
            checkpoint: cp("poll 1"),
            until: Timestamp(T0 + 70_000),
        },
    )
    .await;
    let t = s(&mut env, reboot).get("later").await.unwrap();
    assert_eq!(t.status, Status::Pending);
    assert_eq!(t.not_before, Some(Timestamp(T0 + 70_000)));
    assert_eq!(t.checkpoint, cp("poll 1"));
    assert_eq!(
        stream_types(s(&mut env, reboot), "later")[3..],
        [EventType::Yielded, EventType::NotBefore]
    );
    assert_eq!(claimable(s(&mut env, reboot)).await, ["now"]);
    assert_err!(
        s(&mut env, reboot)
            .execute("later", t.version, Command::Start)
            .await,
        StoreError::NotDue { .. }
    );
    env.advance(10_000);
    let again = s(&mut env, reboot)
        .execute("later", t.version, Command::Start)
        .await
        .unwrap();
    assert_eq!((again.attempt, again.not_before), (2, None));
    assert_eq!(s(&mut env, reboot).next_due(), None);
}

#[tokio::test]
async fn a_delayed_task_is_claimed_only_once_due_and_a_yield_can_delay_it_again() {
    a_delayed_task_waits_for_its_time(false).await;
}

#[tokio::test]
async fn a_delay_survives_a_reopen_at_every_step() {
    a_delayed_task_waits_for_its_time(true).await;
}

#[tokio::test]
async fn a_past_delay_writes_nothing_and_a_delayed_task_can_be_canceled() {
    let env = Env::new();
    let store = env.store();
    // A not-before time that has passed (or a yield until now) is no delay: no record.
    let mut req = request(spec("past"), Retry);
    req.not_before = Some(Timestamp(T0));
    let t = store.create(req).await.unwrap();
    assert_eq!(t.not_before, None);
    assert_eq!(stream_types(store, "past"), [EventType::Created]);
    store.execute("past", 1, Command::Start).await.unwrap();
    ok(
        store,
        "past",
        Command::YieldUntil {
            checkpoint: vec![],
            until: Timestamp(T0),
        },
    )
    .await;
    assert_eq!(
        stream_types(store, "past").last(),
        Some(&EventType::Yielded)
    );
    assert_eq!(claimable(store).await, ["past"]);

    // A delayed task, canceled before its time: canceled at once, no longer delayed.
    let mut req = request(spec("soon"), Retry);
    req.not_before = Some(Timestamp(T0 + 1_000));
    store.create(req).await.unwrap();
    let canceled = ok(
        store,
        "soon",
        Command::RequestCancel {
            reason: "not needed".into(),
        },
    )
    .await;
    assert_eq!(
        (canceled.status, canceled.not_before),
        (Status::Canceled, None)
    );
    assert_eq!(store.next_due(), None);

    // A task created claimed runs at once: a delay is refused.
    let mut req = request(spec("claimed"), Retry);
    req.not_before = Some(Timestamp(T0 + 1_000));
    assert_err!(
        store.create_claimed(req).await,
        StoreError::Invalid {
            field: "not_before",
            ..
        }
    );
}

#[tokio::test]
async fn under_a_recovery_backoff_each_recovery_waits_twice_as_long_up_to_the_most() {
    let config = StoreConfig::default().with_recovery_backoff(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(3),
    );
    let mut env = Env::with(config, dtask_journal::Durability::Buffered);
    create(env.store(), "t", Retry).await;
    for (n, wait) in [(1, 1_000), (2, 2_000), (3, 3_000), (4, 3_000)] {
        let version = env.store().get("t").await.unwrap().version;
        env.store()
            .execute("t", version, Command::Start)
            .await
            .unwrap();
        env.advance(LEASE_MS + 1);
        let expired_at = env.store().now().0;
        // Reopened: the wait is in the journal, not in this store's memory.
        env.reopen();
        let t = env.store().get("t").await.unwrap();
        assert_eq!((t.status, t.recoveries), (Status::Pending, n));
        assert_eq!(
            t.not_before,
            Some(Timestamp(expired_at + wait)),
            "recovery {n}"
        );
        assert!(claimable(env.store()).await.is_empty());
        assert!(matches!(
            env.store().execute("t", t.version, Command::Start).await,
            Err(StoreError::NotDue { .. })
        ));
        env.advance(wait);
        assert_eq!(claimable(env.store()).await, ["t"]);
    }
    // Without the setting a recovered task is claimable at once.
    let mut plain = Env::new();
    create(plain.store(), "t", Retry).await;
    plain.store().execute("t", 1, Command::Start).await.unwrap();
    plain.advance(LEASE_MS + 1);
    plain.reopen();
    assert_eq!(plain.store().get("t").await.unwrap().not_before, None);
    assert_eq!(claimable(plain.store()).await, ["t"]);
}

async fn purges_a_finished_tree(reboot: bool) {
    let mut env = Env::new();
    failed_task(s(&mut env, reboot), "t", None).await;
    // A root with a nested task, both ended.
    let parent = running(s(&mut env, reboot), "parent", Retry).await;
    let child = child_request("child", "parent", parent.attempt, false);
    s(&mut env, reboot).create(child).await.unwrap();
    ok(s(&mut env, reboot), "child", Command::Start).await;
    ok(
        s(&mut env, reboot),
        "child",
        Command::Fail { error: "e".into() },
    )
    .await;
    // Not ended yet: refused, nothing written.
    assert_err!(
        s(&mut env, reboot).purge("parent").await,
        StoreError::IllegalTransition {
            status: Status::Running,
            operation: "purge"
        }
    );
    ok(
        s(&mut env, reboot),
        "parent",
        Command::Fail { error: "e".into() },
    )
    .await;
    // A nested task goes with its root only.
    assert_err!(
        s(&mut env, reboot).purge("child").await,
        StoreError::Invalid { field: "id", .. }
    );
    let records = stream_types(s(&mut env, reboot), "t").len() as u64;

    let purged = s(&mut env, reboot).purge("t").await.unwrap();
    assert_eq!((purged.len(), purged[0].records), (1, records));
    let purged = s(&mut env, reboot).purge("parent").await.unwrap();
    let mut tasks: Vec<&str> = purged.iter().map(|p| p.task.as_str()).collect();
    tasks.sort_unstable();
    assert_eq!(tasks, ["child", "parent"]);

    for id in ["t", "parent", "child"] {
        assert!(
            matches!(s(&mut env, reboot).get(id).await, Err(StoreError::Purged { task }) if task == id),
            "{id}"
        );
        assert_eq!(stream_types(s(&mut env, reboot), id), [EventType::Purged]);
    }
    assert_err!(
        s(&mut env, reboot).purge("t").await,
        StoreError::Purged { .. }
    );
    // The id stays taken.
    assert!(matches!(
        s(&mut env, reboot).create(request(spec("t"), Retry)).await,
        Err(StoreError::AlreadyExists(id)) if id == "t"
    ));
    assert_err!(
        s(&mut env, reboot).rerun("t", None).await,
        StoreError::Purged { .. }
    );
    let report =
        dtask_replay::audit::audit_journal(s(&mut env, reboot).journal(), &mut |_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.purged, 3);
}

#[tokio::test]
async fn a_finished_task_tree_is_purged_whole_and_reads_as_purged() {
    purges_a_finished_tree(false).await;
}

#[tokio::test]
async fn a_purge_and_its_refusals_hold_across_a_reopen_at_every_step() {
    purges_a_finished_tree(true).await;
}

#[tokio::test]
async fn a_task_with_a_queued_notification_is_not_purged_until_it_is_acknowledged() {
    let env = Env::new();
    let store = env.store();
    let mut req = request(session_spec("n", true), Retry);
    req.spec.executor_key = "x".into();
    store.create(req).await.unwrap();
    ok(store, "n", Command::Start).await;
    ok(
        store,
        "n",
        Command::Complete {
            data: b"ok".to_vec(),
        },
    )
    .await;
    let refused = store.purge("n").await.unwrap_err();
    assert!(
        matches!(
            refused.journal_error(),
            Some(dtask_journal::Error::NotPurgeable {
                why: dtask_journal::PurgeRefusal::QueuedNotification,
                ..
            })
        ),
        "{refused}"
    );
    assert_eq!(store.get("n").await.unwrap().status, Status::Completed);
}

#[tokio::test]
async fn a_retention_sweep_purges_the_trees_that_ended_before_its_time_a_step_at_a_time() {
    let env = Env::new();
    let store = env.store();
    failed_task(store, "a-old", None).await;
    let old_end = store.now();
    env.advance(10_000);
    // A root ended long ago whose notification is still queued: kept, and named.
    let mut queued = request(session_spec("b-queued", true), Retry);
    queued.spec.executor_key = "x".into();
    store.create(queued).await.unwrap();
    ok(store, "b-queued", Command::Start).await;
    ok(store, "b-queued", Command::Fail { error: "e".into() }).await;
    env.advance(10_000);
    failed_task(store, "c-new", None).await;
    running(store, "d-running", Retry).await;
    let before = dtask_journal::Timestamp(old_end.0 + 15_000);

    // Two tasks a step: resumable where the last step stopped.
    let first = store.purge_finished(before, None, 2).await.unwrap();
    let purged: Vec<&str> = first.purged.iter().map(|p| p.task.as_str()).collect();
    assert_eq!(purged, ["a-old"]);
    assert_eq!(first.kept.len(), 1);
    assert_eq!(first.kept[0].0, "b-queued");
    assert!(first.kept[0].1.contains("queued"), "{}", first.kept[0].1);
    assert_eq!(first.next_after.as_deref(), Some("b-queued"));
    let second = store
        .purge_finished(before, first.next_after, 2)
        .await
        .unwrap();
    assert!(second.purged.is_empty() && second.kept.is_empty());
    assert_eq!(second.next_after.as_deref(), Some("d-running"));
    let last = store
        .purge_finished(before, second.next_after, 2)
        .await
        .unwrap();
    assert_eq!(last, dtask_engine::RetentionStep::default());

    // Later, a sweep from the start finds the purged task gone and takes the newer one.
    env.advance(60_000);
    let now = store.now();
    let again = store.purge_finished(now, None, 100).await.unwrap();
    let purged: Vec<&str> = again.purged.iter().map(|p| p.task.as_str()).collect();
    assert_eq!(purged, ["c-new"]);
    assert_eq!(again.next_after, None);
    // Its lease expired meanwhile (pending again): not ended, not purged.
    assert!(!store.get("d-running").await.unwrap().is_terminal());
}

async fn a_hold_keeps_a_tree(reboot: bool) {
    let mut env = Env::new();
    let parent = running(s(&mut env, reboot), "root", Retry).await;
    let child = child_request("kid", "root", parent.attempt, false);
    s(&mut env, reboot).create(child).await.unwrap();
    ok(s(&mut env, reboot), "kid", Command::Start).await;
    ok(
        s(&mut env, reboot),
        "kid",
        Command::Fail { error: "e".into() },
    )
    .await;
    ok(
        s(&mut env, reboot),
        "root",
        Command::Fail { error: "e".into() },
    )
    .await;
    assert_err!(
        s(&mut env, reboot).hold("kid", "").await,
        StoreError::Invalid {
            field: "reason",
            ..
        }
    );
    // A hold on the nested task keeps the whole tree; placed again, nothing is written.
    let held = s(&mut env, reboot).hold("kid", "case 12").await.unwrap();
    assert_eq!(held.hold.as_deref(), Some("case 12"));
    let again = s(&mut env, reboot).hold("kid", "another").await.unwrap();
    assert_eq!(
        (again.hold.as_deref(), again.position),
        (Some("case 12"), held.position)
    );
    let refused = s(&mut env, reboot).purge("root").await.unwrap_err();
    assert!(
        matches!(
            refused.journal_error(),
            Some(dtask_journal::Error::NotPurgeable {
                task,
                why: dtask_journal::PurgeRefusal::OnHold,
            }) if task == "kid"
        ),
        "{refused}"
    );
    let now = s(&mut env, reboot).now();
    let swept = s(&mut env, reboot)
        .purge_finished(dtask_journal::Timestamp(now.0 + 1), None, 10)
        .await
        .unwrap();
    assert!(swept.purged.is_empty());
    assert_eq!(swept.kept[0].0, "root");
    // Lifted (twice: the second writes nothing), the tree goes.
    let lifted = s(&mut env, reboot).lift_hold("kid").await.unwrap();
    assert_eq!(lifted.hold, None);
    let again = s(&mut env, reboot).lift_hold("kid").await.unwrap();
    assert_eq!(again.position, lifted.position);
    assert_eq!(s(&mut env, reboot).purge("root").await.unwrap().len(), 2);
    assert_err!(
        s(&mut env, reboot).hold("root", "too late").await,
        StoreError::Purged { .. }
    );
}

#[tokio::test]
async fn a_hold_on_any_task_of_a_tree_keeps_it_until_lifted() {
    a_hold_keeps_a_tree(false).await;
}

#[tokio::test]
async fn a_hold_survives_a_reopen_at_every_step() {
    a_hold_keeps_a_tree(true).await;
}

/// A progress update of attempt 1.
fn progress(event_id: &str, data: &str) -> dtask_engine::UpdateRequest {
    dtask_engine::UpdateRequest {
        attempt: 1,
        event_id: event_id.into(),
        kind: "stdout".into(),
        data: data.as_bytes().to_vec(),
        metadata: vec![("line".into(), event_id.into())],
        ..dtask_engine::UpdateRequest::default()
    }
}

async fn trims_progress(reboot: bool) {
    let mut env = Env::new();
    running(s(&mut env, reboot), "t", Retry).await;
    for n in 0..5 {
        let (_, new) = s(&mut env, reboot)
            .append_update("t", progress(&format!("e{n}"), &"x".repeat(500)))
            .await
            .unwrap();
        assert!(new);
    }
    let before = s(&mut env, reboot).get("t").await.unwrap();

    // Running: all but the last two lose their bytes; the state stands.
    let trimmed = s(&mut env, reboot).trim_progress("t", 2).await.unwrap();
    assert_eq!(trimmed.records, 3);
    assert!(trimmed.bytes >= 3 * 500, "{trimmed:?}");
    let after = s(&mut env, reboot).get("t").await.unwrap();
    assert_eq!(
        (after.version, after.updates, after.position),
        (before.version, before.updates, before.position + 1)
    );
    assert_eq!((before.trimmed, after.trimmed), (0, 3), "the trim counted");
    let page = s(&mut env, reboot)
        .list_updates("t", None, 0, false)
        .await
        .unwrap();
    let seen: Vec<(&str, bool, usize)> = page
        .updates
        .iter()
        .map(|u| (u.event_id.as_str(), u.trimmed, u.data.len()))
        .collect();
    assert_eq!(
        seen,
        [
            ("e0", true, 0),
            ("e1", true, 0),
            ("e2", true, 0),
            ("e3", false, 500),
            ("e4", false, 500)
        ]
    );
    // A retried update of a trimmed one is still recognised (by what it kept), and one of
    // another kind is still a conflict.
    let (original, new) = s(&mut env, reboot)
        .append_update("t", progress("e1", &"x".repeat(500)))
        .await
        .unwrap();
    assert!(!new && original.trimmed && original.event_id == "e1");
    let mut other = progress("e1", "y");
    other.kind = "stderr".into();
    assert_err!(
        s(&mut env, reboot).append_update("t", other).await,
        StoreError::EventIdConflict(_)
    );
    // The run goes on and ends; nothing more to trim writes nothing.
    s(&mut env, reboot)
        .append_update("t", progress("e5", "z"))
        .await
        .unwrap();
    ok(s(&mut env, reboot), "t", Command::Complete { data: vec![] }).await;
    let end = s(&mut env, reboot).get("t").await.unwrap();
    // Three of six updates whole: a sweep keeping three passes the task by, one keeping
    // two takes it.
    assert_eq!((end.updates, end.trimmed, whole_updates(&end)), (6, 3, 3));
    let later = Timestamp(end.updated_at.0 + 1);
    assert!(!trim_due(&end, later, 3) && trim_due(&end, later, 2));
    let again = s(&mut env, reboot).trim_progress("t", 3).await.unwrap();
    assert_eq!((again.records, again.marker), (0, None));
    assert_eq!(s(&mut env, reboot).get("t").await.unwrap(), end);
    let report =
        dtask_replay::audit::audit_journal(s(&mut env, reboot).journal(), &mut |_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.trimmed_records, 3);
}

#[tokio::test]
async fn a_trim_drops_older_progress_bytes_and_leaves_the_state_and_the_dedup_as_they_were() {
    trims_progress(false).await;
}

#[tokio::test]
async fn a_trim_and_what_it_kept_hold_across_a_reopen_at_every_step() {
    trims_progress(true).await;
}

#[tokio::test]
async fn a_trim_is_refused_for_an_agent_run_a_held_task_and_a_purged_one() {
    let env = Env::new();
    let store = env.store();
    let mut agent = request(spec("agent"), Retry);
    agent.spec.executor_key = dtask_engine::agent::AGENT_EXECUTOR_KEY.into();
    store.create(agent).await.unwrap();
    assert_err!(
        store.trim_progress("agent", 0).await,
        StoreError::Invalid { field: "id", .. }
    );
    running(store, "held", Retry).await;
    store
        .append_update("held", progress("e0", "a"))
        .await
        .unwrap();
    store.hold("held", "case 9").await.unwrap();
    assert!(matches!(
        store.trim_progress("held", 0).await,
        Err(StoreError::Journal(dtask_journal::Error::NotTrimmable {
            why: dtask_journal::TrimRefusal::OnHold,
            ..
        }))
    ));
    failed_task(store, "gone", None).await;
    store.purge("gone").await.unwrap();
    assert_err!(
        store.trim_progress("gone", 0).await,
        StoreError::Purged { .. }
    );
    assert_err!(
        store.trim_progress("nobody", 0).await,
        StoreError::NotFound(_)
    );
}

#[tokio::test]
async fn a_trim_sweep_takes_the_tasks_that_ended_before_its_time_a_step_at_a_time() {
    let env = Env::new();
    let store = env.store();
    for id in ["a", "b", "c"] {
        running(store, id, Retry).await;
        for n in 0..4 {
            store
                .append_update(id, progress(&format!("e{n}"), "line"))
                .await
                .unwrap();
        }
    }
    ok(store, "a", Command::Complete { data: vec![] }).await;
    ok(store, "b", Command::Fail { error: "e".into() }).await;
    store.hold("b", "case 1").await.unwrap();
    env.advance(1_000);
    let before = store.now();
    let first = store.trim_finished(before, 1, None, 2).await.unwrap();
    let trimmed: Vec<(&str, u64)> = first
        .trimmed
        .iter()
        .map(|t| (t.task.as_str(), t.records))
        .collect();
    assert_eq!(trimmed, [("a", 3)]);
    assert_eq!(first.kept.len(), 1);
    assert_eq!(first.kept[0].0, "b");
    assert_eq!(first.next_after.as_deref(), Some("b"));
    // "c" is still running: not taken.
    let rest = store
        .trim_finished(before, 1, first.next_after, 2)
        .await
        .unwrap();
    assert_eq!(rest, dtask_engine::TrimStep::default());
    // Swept again: nothing twice — a task trimmed before is not due (its stream is not
    // read again).
    let a = store.get("a").await.unwrap();
    assert_eq!((a.updates, a.trimmed), (4, 3));
    assert!(!trim_due(&a, before, 1));
    let again = store.trim_finished(before, 1, None, 10).await.unwrap();
    assert!(again.trimmed.is_empty(), "{again:?}");
}

/// What a task's progress updates are as listed: (event id, trimmed) each, oldest first.
async fn listed(store: &TaskStore, id: &str) -> Vec<(String, bool)> {
    let page = store.list_updates(id, None, 0, false).await.unwrap();
    page.updates
        .into_iter()
        .map(|u| (u.event_id, u.trimmed))
        .collect()
}

async fn caps_progress(reboot: bool) {
    let mut env = Env::with(
        StoreConfig::default().with_progress_cap(4, 1),
        dtask_journal::Durability::Buffered,
    );
    running(s(&mut env, reboot), "t", Retry).await;
    let mut seen = Vec::new();
    for n in 0..10 {
        let (_, new) = s(&mut env, reboot)
            .append_update("t", progress(&format!("e{n}"), &"x".repeat(100)))
            .await
            .unwrap();
        assert!(new);
        let state = s(&mut env, reboot).get("t").await.unwrap();
        assert!(whole_updates(&state) <= 4, "never over the cap: {state:?}");
        seen.push(state.trimmed);
    }
    // The fifth update takes the task over four whole ones: trimmed to the last one; the
    // ninth again.
    assert_eq!(seen, [0, 0, 0, 0, 4, 4, 4, 4, 8, 8]);
    let listed = listed(s(&mut env, reboot), "t").await;
    let trimmed: Vec<bool> = listed.iter().map(|(_, t)| *t).collect();
    assert_eq!(
        trimmed,
        [true, true, true, true, true, true, true, true, false, false]
    );
    if !reboot {
        assert_eq!(env.store().counts().progress_capped, 2);
    }
    // A retried update the cap trimmed is still recognised.
    let (original, new) = s(&mut env, reboot)
        .append_update("t", progress("e0", &"x".repeat(100)))
        .await
        .unwrap();
    assert!(!new && original.trimmed);
    ok(s(&mut env, reboot), "t", Command::Complete { data: vec![] }).await;
    let report =
        dtask_replay::audit::audit_journal(s(&mut env, reboot).journal(), &mut |_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!((report.trimmed, report.trimmed_records), (1, 8));
}

#[tokio::test]
async fn the_progress_cap_trims_a_running_task_by_the_update_that_takes_it_over() {
    caps_progress(false).await;
}

#[tokio::test]
async fn the_progress_cap_holds_across_a_reopen_at_every_step() {
    caps_progress(true).await;
}

async fn limits_updates(reboot: bool) {
    let mut env = Env::with(
        StoreConfig::default()
            .with_max_updates(4)
            .with_progress_cap(2, 0),
        dtask_journal::Durability::Buffered,
    );
    running(s(&mut env, reboot), "t", Retry).await;
    for n in 0..3 {
        let (_, new) = s(&mut env, reboot)
            .append_update("t", progress(&format!("e{n}"), "line"))
            .await
            .unwrap();
        assert!(new);
    }
    // The fourth record is a part; trimmed updates count too (the cap trimmed the first three).
    let mut part = progress("multi", "part");
    part.part_id = "p1".into();
    let (_, new) = s(&mut env, reboot)
        .append_update("t", part.clone())
        .await
        .unwrap();
    assert!(new);
    let before = s(&mut env, reboot).get("t").await.unwrap();
    assert_eq!((before.updates, before.trimmed), (4, 3), "{before:?}");
    // A new update, and a new part, past the limit: refused, nothing written.
    let mut next_part = part.clone();
    next_part.part_id = "p2".into();
    for request in [progress("e3", "line"), next_part] {
        match s(&mut env, reboot).append_update("t", request).await {
            Err(StoreError::UpdateLimit { task, limit }) => {
                assert_eq!((task.as_str(), limit), ("t", 4));
            }
            other => panic!("{other:?}"),
        }
    }
    let after = s(&mut env, reboot).get("t").await.unwrap();
    assert_eq!(
        (after.position, after.updates),
        (before.position, before.updates)
    );
    // Replays of recorded updates and parts are still answered, a trimmed one too.
    for request in [progress("e0", "line"), progress("e2", "line"), part] {
        let (_, new) = s(&mut env, reboot)
            .append_update("t", request)
            .await
            .unwrap();
        assert!(!new);
    }
    if !reboot {
        assert_eq!(env.store().counts().updates_over_limit, 2);
    }
    // The task goes on to its end.
    ok(s(&mut env, reboot), "t", Command::Complete { data: vec![] }).await;
}

#[tokio::test]
async fn a_task_past_the_update_limit_is_refused_new_updates_and_answered_replays() {
    limits_updates(false).await;
}

#[tokio::test]
async fn the_update_limit_holds_across_a_reopen_at_every_step() {
    limits_updates(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_over_the_cap_at_once_trim_the_task_once_for_each_time_it_goes_over() {
    let env = Env::with(
        StoreConfig::default().with_progress_cap(10, 0),
        dtask_journal::Durability::Buffered,
    );
    let store = env.store().clone();
    running(&store, "t", Retry).await;
    let calls: Vec<_> = (0..50)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .append_update("t", progress(&format!("e{n}"), "line"))
                    .await
                    .unwrap()
            })
        })
        .collect();
    for call in calls {
        assert!(call.await.unwrap().1, "each update recorded once");
    }
    let state = store.get("t").await.unwrap();
    assert_eq!(state.updates, 50);
    assert!(whole_updates(&state) <= 10, "{state:?}");
    // Each cap trim found more than 10 whole updates and kept none: at most 50 / 11 of
    // them, however the 50 calls interleaved (a call that asked for a trim its neighbour
    // had made writes nothing).
    let trims = store.counts().progress_capped;
    assert!((1..=4).contains(&trims), "{trims} trims");
    let markers = stream_types(&store, "t")
        .into_iter()
        .filter(|t| *t == EventType::ProgressTrimmed)
        .count() as u64;
    assert_eq!(markers, trims);
}

#[tokio::test]
async fn the_progress_cap_passes_over_held_tasks_and_agent_runs() {
    let env = Env::with(
        StoreConfig::default().with_progress_cap(2, 0),
        dtask_journal::Durability::Buffered,
    );
    let store = env.store();
    running(store, "held", Retry).await;
    store.hold("held", "case 7").await.unwrap();
    let mut agent = request(spec("agent"), Retry);
    agent.spec.executor_key = dtask_engine::agent::AGENT_EXECUTOR_KEY.into();
    store.create(agent).await.unwrap();
    ok(store, "agent", Command::Start).await;
    for id in ["held", "agent"] {
        for n in 0..5 {
            let (_, new) = store
                .append_update(id, progress(&format!("e{n}"), "line"))
                .await
                .unwrap();
            assert!(new, "the update stands: {id}");
        }
        let state = store.get(id).await.unwrap();
        assert_eq!((state.updates, state.trimmed), (5, 0), "{id}");
    }
    assert_eq!(store.counts().progress_capped, 0);
    // A cap set by hand whose `keep` is not below `over` does nothing.
    let mut config = StoreConfig::default();
    config.progress_cap = Some((2, 5));
    let other = Env::with(config, dtask_journal::Durability::Buffered);
    running(other.store(), "t", Retry).await;
    for n in 0..8 {
        other
            .store()
            .append_update("t", progress(&format!("e{n}"), "line"))
            .await
            .unwrap();
    }
    let state = other.store().get("t").await.unwrap();
    assert_eq!((state.updates, state.trimmed), (8, 0));
    // The hold lifted, the next update trims the task to nothing whole.
    store.lift_hold("held").await.unwrap();
    store
        .append_update("held", progress("e5", "line"))
        .await
        .unwrap();
    let state = store.get("held").await.unwrap();
    assert_eq!((state.updates, state.trimmed), (6, 6));
    assert_eq!(store.counts().progress_capped, 1);
}

#[tokio::test]
async fn a_background_trim_sweep_trims_the_tasks_that_ended_long_enough_ago() {
    let env = Env::new();
    let store = env.store();
    for id in ["old", "young"] {
        running(store, id, Retry).await;
        for n in 0..3 {
            store
                .append_update(id, progress(&format!("e{n}"), "line"))
                .await
                .unwrap();
        }
        ok(store, id, Command::Complete { data: vec![] }).await;
        if id == "old" {
            env.advance(10_000);
        }
    }
    let before = store.get("old").await.unwrap().position;
    let mut changes = store.watch("old").unwrap();
    let sweep = store.spawn_trimming(
        std::time::Duration::from_secs(5),
        1,
        std::time::Duration::from_secs(3600),
    );
    changes.wait_for(|c| c.position > before).await.unwrap();
    sweep.abort();
    let trimmed = |id: &'static str| async move {
        let page = store.list_updates(id, None, 0, false).await.unwrap();
        page.updates.iter().filter(|u| u.trimmed).count()
    };
    assert_eq!(trimmed("old").await, 2);
    assert_eq!(trimmed("young").await, 0, "ended 0 s ago, younger than 5 s");
}

/// A tree a sweep may not purge for a reason of its own — here more than `MAX_PURGE_TREE`
/// tasks — is kept and named, and the sweep goes on to the tasks after it (it stopped there
/// at every sweep, and never purged anything after it again).
#[tokio::test]
async fn a_tree_too_large_to_purge_is_kept_and_the_sweep_goes_on() {
    let env = Env::new();
    let store = env.store();
    let parent = running(store, "a-big", Retry).await;
    for i in 0..dtask_engine::MAX_PURGE_TREE {
        let id = format!("a-big.{i}");
        store
            .create(child_request(&id, "a-big", parent.attempt, false))
            .await
            .unwrap();
        ok(
            store,
            &id,
            Command::RequestCancel {
                reason: "done".into(),
            },
        )
        .await;
    }
    ok(store, "a-big", Command::Fail { error: "e".into() }).await;
    failed_task(store, "b-after", None).await;
    env.advance(1_000);
    let (mut after, mut kept, mut purged) = (None, Vec::new(), Vec::new());
    loop {
        let step = store.purge_finished(store.now(), after, 512).await.unwrap();
        kept.extend(step.kept);
        purged.extend(step.purged.into_iter().map(|p| p.task));
        after = step.next_after;
        if after.is_none() {
            break;
        }
    }
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0].0, "a-big");
    assert!(kept[0].1.contains("more than"), "{}", kept[0].1);
    assert_eq!(purged, ["b-after"]);
}

/// A create whose caller stops waiting — its future dropped at its first wait, as a
/// `timeout` or an unchosen `select!` branch drops it (here: polled once, then dropped) —
/// still lands whole: the task is
/// written and indexed, so it is listed and claimed (it was written and never indexed:
/// never listed, until something read it by its id).
// One thread: the work the call hands to a task of its own cannot end before the
// call is dropped.
#[tokio::test]
async fn a_create_whose_caller_stops_waiting_is_written_and_listed() {
    let env = Env::new();
    let store = env.store();
    let mut create = Box::pin(store.create(request(spec("t"), Retry)));
    assert!(
        futures::poll!(create.as_mut()).is_pending(),
        "the create is cut short at its first wait"
    );
    drop(create);
    let keys = [KEY.to_owned()];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let listed = store.list_pending(&keys, None, 10).await.unwrap();
        if listed.tasks.iter().any(|t| t.id() == "t") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the task was never listed (in the journal: {:?})",
            store.journal().stream_len("t")
        );
        tokio::task::yield_now().await;
    }
}

/// A trim of a running task whose caller stops waiting leaves the task to be folded again by
/// the next write (it stayed behind its trimmed stream, and the running attempt's outcome
/// was refused as a version conflict).
// One thread: the work the call hands to a task of its own cannot end before the
// call is dropped.
#[tokio::test]
async fn a_trim_whose_caller_stops_waiting_leaves_the_attempts_next_write_unrefused() {
    let env = Env::new();
    let store = env.store();
    let running = running(store, "t", Retry).await;
    for i in 0..6 {
        store
            .append_update("t", progress(&format!("e{i}"), "line"))
            .await
            .unwrap();
    }
    let mut trim = Box::pin(store.trim_progress("t", 2));
    assert!(
        futures::poll!(trim.as_mut()).is_pending(),
        "the trim is cut short at its first wait"
    );
    drop(trim);
    let done = store
        .execute(
            "t",
            running.version,
            Command::Complete {
                data: b"ok".to_vec(),
            },
        )
        .await
        .unwrap();
    assert_eq!(done.status, Status::Completed);
    assert_eq!(done.result_data, b"ok");
}

/// The same for a nested task (and a rerun, made the same way): its parent's running attempt
/// creates it, the call is dropped at its first wait, and the task is still indexed once the
/// append has settled — listed for a worker to claim.
#[tokio::test]
async fn a_nested_create_whose_caller_stops_waiting_is_listed() {
    // Synced appends: the writer's answer is not in before the first poll looks (a create
    // answered that soon is over, and another is tried).
    let env = Env::with(StoreConfig::default(), dtask_journal::Durability::Sync);
    let store = env.store();
    let parent = running(store, "p", Retry).await;
    let mut cut = None;
    for i in 0..20 {
        let id = format!("p.kid{i}");
        let mut create = Box::pin(store.create(child_request(&id, "p", parent.attempt, false)));
        if futures::poll!(create.as_mut()).is_pending() {
            cut = Some(id);
            break;
        }
    }
    let cut = cut.expect("a create cut short at its first wait");
    let keys = [KEY.to_owned()];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let listed = store.list_pending(&keys, None, 10).await.unwrap();
        if listed.tasks.iter().any(|t| t.id() == cut) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the task was never listed (in the journal: {:?})",
            store.journal().stream_len(&cut)
        );
        tokio::task::yield_now().await;
    }
}

/// A purge whose caller stops waiting still drops the purged tree from memory once its write
/// has landed: the root and its nested task read as purged (they were still read from
/// memory as the tasks they had been — and a purge asked for again answered `Purged` and
/// left them there). A tree the journal holds purged already is dropped from memory by a
/// purge of it too.
// One thread: the work the call hands to a task of its own cannot end before the
// call is dropped.
#[tokio::test]
async fn a_purge_whose_caller_stops_waiting_leaves_the_tree_read_as_purged() {
    let env = Env::new();
    let store = env.store();
    let parent = running(store, "a", Retry).await;
    store
        .create(child_request("a.kid", "a", parent.attempt, false))
        .await
        .unwrap();
    ok(store, "a.kid", Command::Start).await;
    for id in ["a.kid", "a"] {
        ok(store, id, Command::Complete { data: cp("ok") }).await;
    }
    let mut purge = Box::pin(store.purge("a"));
    assert!(
        futures::poll!(purge.as_mut()).is_pending(),
        "the purge is cut short at its first wait"
    );
    drop(purge);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match store.get("a").await {
            Err(StoreError::Purged { .. }) => break,
            other => assert!(
                std::time::Instant::now() < deadline,
                "the task reads as {other:?} (its stream: {:?})",
                stream_types(store, "a")
            ),
        }
        tokio::task::yield_now().await;
    }
    assert_err!(store.get("a.kid").await, StoreError::Purged { .. });
    assert_err!(
        store.list_children("a", None, 10).await,
        StoreError::Purged { .. }
    );

    // Purged under the store, which still holds it.
    failed_task(store, "b", None).await;
    store
        .journal()
        .purge_async(&["b"], store.now())
        .await
        .unwrap();
    assert_err!(store.purge("b").await, StoreError::Purged { .. });
    assert_err!(store.get("b").await, StoreError::Purged { .. });
}

/// A finished task read, run and ended with a cache of no finished tasks.
async fn ended(store: &TaskStore, id: &str) {
    running(store, id, Retry).await;
    ok(store, id, Command::Complete { data: cp("ok") }).await;
}

/// A rerun whose caller stops waiting mid-append is listed once the append has settled
/// even when its original, marked unsettled meanwhile, is evicted from the cache of finished
/// tasks by another read before then: the eviction took the mark with it, the rerun was
/// looked for before its append had landed, not found, and never listed (no worker claimed
/// it until a restart).
// One thread: what the dropped rerun leaves to run waits for the test to yield.
#[tokio::test]
async fn a_rerun_whose_caller_stops_waiting_is_listed_though_a_read_evicts_its_original() {
    let (env, gate) = Env::gated(StoreConfig::default().with_terminal_cache(0));
    let store = env.store();
    for id in ["t", "cold"] {
        ended(store, id).await;
    }
    // The rerun's append written and held, unseen.
    gate.arm();
    let mut rerun = Box::pin(store.rerun("t", Some("r".to_owned())));
    assert!(futures::poll!(rerun.as_mut()).is_pending());
    gate.until_held().await;
    drop(rerun);
    store.get("cold").await.unwrap();
    tokio::task::yield_now().await;
    gate.release();
    let keys = [KEY.to_owned()];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let listed = store.list_pending(&keys, None, 10).await.unwrap();
        if listed.tasks.iter().any(|t| t.id() == "r") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the rerun was never listed (in the journal: {:?})",
            store.journal().stream_len("r")
        );
        tokio::task::yield_now().await;
    }
}

/// A finished task whose write's caller stopped waiting mid-append stays in memory, marked,
/// until the append has settled: a read meanwhile waits for it and reads the hold it wrote.
/// (Evicted by another read, the task was folded again before the hold had landed and kept
/// so: it read without the hold, and `lift_hold` found none to lift.)
// One thread: what the dropped hold leaves to run waits for the test to yield.
#[tokio::test]
async fn a_finished_task_with_a_write_in_flight_is_not_evicted_before_it_lands() {
    let (env, gate) = Env::gated(StoreConfig::default().with_terminal_cache(0));
    let store = env.store();
    for id in ["t", "cold"] {
        ended(store, id).await;
    }
    gate.arm();
    let mut hold = Box::pin(store.hold("t", "audit"));
    assert!(futures::poll!(hold.as_mut()).is_pending());
    gate.until_held().await;
    drop(hold);
    store.get("cold").await.unwrap();
    let read = tokio::spawn({
        let store = store.clone();
        async move { store.get("t").await }
    });
    tokio::task::yield_now().await;
    gate.release();
    assert_eq!(read.await.unwrap().unwrap().hold.as_deref(), Some("audit"));
    assert_eq!(store.lift_hold("t").await.unwrap().hold, None);
    assert_eq!(
        stream_types(store, "t").last(),
        Some(&EventType::HoldLifted)
    );
}

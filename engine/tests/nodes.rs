//! Several nodes — task stores in one process, each with its own journal connections — on one
//! PostgreSQL journal (`DTASK_TEST_PG_URL`, set by `./dev test` and CI): a task created on one
//! node is found and claimed on another, and two nodes racing on one task have exactly one
//! winner, the loser decided again against the winner's record (a `VersionConflict` where
//! the version moved), 100 runs each; a rerun asked for on a
//! node that has not yet seen another node's rerun finds it. Without the variable every test
//! says loudly that it was skipped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../journal/tests/cluster/mod.rs"]
mod cluster;
mod common;
#[path = "support/models.rs"]
mod models;

use common::*;
use dtask_engine::{
    Command, InputRequest, ManualClock, StoreConfig, StoreError, TaskStore, UpdateRequest,
};
use dtask_journal::{Delivery, Durability, Journal, JournalOptions, LeasePolicy};
use dtask_replay::Status;

const RUNS: usize = 100;

/// The URL of a fresh schema of the test database for `test`, or `None` (and a loud line)
/// without a database.
fn schema_url(test: &str) -> Option<String> {
    let Ok(base) = std::env::var("DTASK_TEST_PG_URL") else {
        eprintln!("SKIPPED {test}: DTASK_TEST_PG_URL is not set (./dev test sets it)");
        return None;
    };
    let sep = if base.contains('?') { '&' } else { '?' };
    Some(format!("{base}{sep}schema=n{}_{test}", std::process::id()))
}

/// Two stores on a fresh schema, or `None` (and a loud line) without a database.
fn nodes(test: &str) -> Option<(TaskStore, TaskStore, String)> {
    nodes_and_clock(test).map(|(a, b, _, url)| (a, b, url))
}

/// [`nodes`], with the clock they share.
fn nodes_and_clock(test: &str) -> Option<(TaskStore, TaskStore, ManualClock, String)> {
    let url = schema_url(test)?;
    let clock = ManualClock::new(T0);
    let open = || {
        let journal = Journal::open_postgres(&url, JournalOptions::default()).unwrap();
        TaskStore::open(journal, clock.clone(), StoreConfig::default()).unwrap()
    };
    Some((open(), open(), clock, url))
}

/// The two outcomes of a race: exactly one success, and the other a version conflict.
fn one_winner<T: std::fmt::Debug>(a: Result<T, StoreError>, b: Result<T, StoreError>, run: usize) {
    one_winner_of(a, b, run, |e| {
        matches!(e, StoreError::VersionConflict { .. })
    });
}

/// The two outcomes of a race: exactly one success, and the other refused as `lost` says.
fn one_winner_of<T: std::fmt::Debug>(
    a: Result<T, StoreError>,
    b: Result<T, StoreError>,
    run: usize,
    lost: impl Fn(&StoreError) -> bool,
) {
    let wins = usize::from(a.is_ok()) + usize::from(b.is_ok());
    assert_eq!(wins, 1, "run {run}: {a:?} / {b:?}");
    let loser = if a.is_err() { a } else { b };
    assert!(
        loser.as_ref().err().is_some_and(&lost),
        "run {run}: the loser got {loser:?}"
    );
}

/// The journal audits clean.
fn clean(url: &str) {
    let journal = Journal::open_postgres_read_only(url).unwrap();
    let audit = dtask_replay::audit_journal(&journal, &mut |_| {}).unwrap();
    assert!(audit.is_clean(), "{:?}", audit.problems);
}

/// A node follows another's record only once the database has flushed it. Node A's commits
/// never wait for the flush (`Durability::Buffered`, as a synced writer's are until its
/// sync), on a private server told to leave its log unflushed for as long as it may: B's
/// refresh must have made A's task durable before it indexed it, or a crash of the database
/// would take back a task B had followed (and give its sequence to another record, past
/// which B would never read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_another_node_followed_survives_a_crash_of_the_database() {
    let Some(cluster) = cluster::Cluster::with_settings(
        "followcrash",
        "-c wal_writer_delay=10000 -c bgwriter_lru_maxpages=0 -c autovacuum=off",
    ) else {
        return;
    };
    let url = cluster.url("followcrash");
    let clock = ManualClock::new(T0);
    let open = |options: JournalOptions| {
        let journal = Journal::open_postgres(&url, options).unwrap();
        TaskStore::open(journal, clock.clone(), StoreConfig::default()).unwrap()
    };
    let b = open(JournalOptions::default());
    let a = open(JournalOptions::default().with_durability(Durability::Buffered));
    create(&a, "t", LeasePolicy::Retry).await;
    b.refresh().await.unwrap();
    assert_eq!(b.get("t").await.unwrap().status, Status::Pending);
    cluster.crash();
    cluster.start();
    let after = Journal::open_postgres_read_only(&url).unwrap();
    assert!(
        after.read_stream("t", 0).next().is_some(),
        "B followed a task the crash took back"
    );
    drop((a, b));
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
        // The loser is decided again against the winner's record: a completion after the
        // cancel request meets a new version, a cancel after the completion a terminal task.
        one_winner_of(ra, rb, run, |e| {
            matches!(
                e,
                StoreError::VersionConflict { .. } | StoreError::AlreadyTerminal(_)
            )
        });
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
        // The loser is decided again against the winner's record: the same update, recorded
        // already.
        let (ra, rb) = (ra.unwrap().1, rb.unwrap().1);
        assert!(ra != rb, "run {run}: exactly one recorded it ({ra} / {rb})");
        // Sent again, it is recorded already on both.
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
        // Each node lists it once, read through its durable view, whichever node wrote it.
        for node in [&a, &b] {
            let page = node.list_updates(&id, None, 0, false).await.unwrap();
            let listed: Vec<&[u8]> = page.updates.iter().map(|u| u.data.as_slice()).collect();
            assert_eq!(listed, [b"half".as_slice()], "run {run}");
        }
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
        // Each is decided against the other, whichever the database took first: the
        // completion goes ahead (an input changes no version); the input lands before it, or
        // is refused by the sealed mailbox after — never a version conflict no version made.
        let done = ra.unwrap_or_else(|e| panic!("run {run}: the completion got {e:?}"));
        assert_eq!(done.status, Status::Completed, "run {run}");
        match rb {
            Ok((input, true)) => assert!(input.sequence <= done.mailbox.latest, "run {run}"),
            Err(StoreError::MailboxSealed(_)) => {}
            other => panic!("run {run}: the input got {other:?}"),
        }
    }
    clean(&url);
}

/// A node whose memory has not folded another node's input, notice or update decides its
/// write again against them when the database refuses it for a stale position: a completion
/// asked "if no inputs" finds the input and goes back to pending, a progress update and a
/// plain completion go ahead, and an input to a task another node completed meets the
/// sealed mailbox — none of them a version conflict that no version change made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_meeting_another_nodes_record_is_decided_again_against_it() {
    let Some((a, b, url)) = nodes("stale") else {
        return;
    };
    let input = |event_id: &str| InputRequest {
        event_id: event_id.to_owned(),
        kind: "message".into(),
        data: b"hello".to_vec(),
        delivery: Delivery::Queued,
    };
    let state = running(&a, "t1", LeasePolicy::Retry).await;
    b.refresh().await.unwrap();
    b.send_input("t1", input("in1")).await.unwrap();
    let asked = a
        .execute(
            "t1",
            state.version,
            Command::CompleteIfNoInputs {
                cursor: 0,
                data: b"ok".to_vec(),
            },
        )
        .await;
    assert!(
        matches!(&asked, Err(StoreError::InputsPending(s)) if s.status == Status::Pending),
        "{asked:?}"
    );

    let state = running(&a, "t2", LeasePolicy::Retry).await;
    b.refresh().await.unwrap();
    b.send_input("t2", input("in2")).await.unwrap();
    a.append_update(
        "t2",
        UpdateRequest {
            attempt: state.attempt,
            event_id: "u1".into(),
            kind: "progress".into(),
            data: b"half".to_vec(),
            ..UpdateRequest::default()
        },
    )
    .await
    .unwrap();
    b.refresh().await.unwrap();
    b.send_input("t2", input("in3")).await.unwrap();
    let done = a
        .execute(
            "t2",
            state.version,
            Command::Complete {
                data: b"ok".to_vec(),
            },
        )
        .await
        .unwrap();
    assert_eq!(done.status, Status::Completed);
    assert_eq!(done.mailbox.latest, 2, "both inputs in before the seal");
    let late = b.send_input("t2", input("late")).await;
    assert!(
        matches!(late, Err(StoreError::MailboxSealed(_))),
        "{late:?}"
    );
    clean(&url);
}

/// Two nodes whose clocks disagree, B's running 3 s ahead of A's, on a fresh schema; each
/// with an expiry grace of `grace_ms`. Returns them with their clocks.
fn skewed_nodes(
    test: &str,
    grace_ms: u64,
) -> Option<(TaskStore, ManualClock, TaskStore, ManualClock, String)> {
    let url = schema_url(test)?;
    let config =
        StoreConfig::default().with_expiry_grace(std::time::Duration::from_millis(grace_ms));
    let open = |clock: &ManualClock| {
        let journal = Journal::open_postgres(&url, JournalOptions::default()).unwrap();
        TaskStore::open(journal, clock.clone(), config.clone()).unwrap()
    };
    let (a_clock, b_clock) = (ManualClock::new(T0), ManualClock::new(T0 + 3_000));
    Some((open(&a_clock), a_clock, open(&b_clock), b_clock, url))
}

/// A lease's deadline is written from the clock of the node that claimed it. Without a
/// grace, a node whose clock runs 3 s ahead writes the lease down as expired while its
/// holder, by its own clock, still has a second of it: the holder's heartbeat is then
/// refused. With a grace of 5 s (more than the skew) that node expires nothing until the
/// holder has stopped: the heartbeat renews the lease, and the renewed lease is expired only
/// once it has run out by the holder's clock and the grace has passed by the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiry_grace_keeps_a_node_whose_clock_runs_ahead_from_expiring_a_live_lease() {
    let second = std::time::Duration::from_secs(1);
    let lease = std::time::Duration::from_millis(LEASE_MS);
    // A's clock one second short of the deadline, B's two seconds past it.
    let almost = std::time::Duration::from_millis(LEASE_MS - 1_000);
    // No grace: expired early.
    let Some((a, a_clock, b, b_clock, url)) = skewed_nodes("skew0", 0) else {
        return;
    };
    let claimed = running(&a, "t", LeasePolicy::Retry).await;
    a_clock.advance(almost);
    b_clock.advance(almost);
    b.refresh().await.unwrap();
    assert_eq!(b.sweep_expired().await.unwrap(), 1, "B expires it early");
    a.refresh().await.unwrap();
    let beat = a.execute("t", claimed.version, Command::Heartbeat).await;
    assert!(beat.is_err(), "A's lease was taken from it early: {beat:?}");
    assert_eq!(a.get("t").await.unwrap().status, Status::Pending);
    clean(&url);

    // A grace of 5 s: nothing expired while A holds the lease by its own clock.
    let Some((a, a_clock, b, b_clock, url)) = skewed_nodes("skew5", 5_000) else {
        return;
    };
    let claimed = running(&a, "t", LeasePolicy::Retry).await;
    a_clock.advance(almost);
    b_clock.advance(almost);
    b.refresh().await.unwrap();
    assert_eq!(b.sweep_expired().await.unwrap(), 0, "within the grace");
    let renewed = a
        .execute("t", claimed.version, Command::Heartbeat)
        .await
        .unwrap();
    assert_eq!(renewed.status, Status::Running);
    // The renewed lease runs out by A's clock: A stops (its heartbeat is refused), and B
    // waits out the grace before it writes the expiry down.
    a_clock.advance(lease);
    b_clock.advance(lease);
    let late = a.execute("t", renewed.version, Command::Heartbeat).await;
    assert!(
        matches!(late, Err(StoreError::LeaseLost(_))),
        "the holder stops at its deadline: {late:?}"
    );
    b.refresh().await.unwrap();
    assert_eq!(
        b.sweep_expired().await.unwrap(),
        0,
        "B is 3 s past it: within the grace"
    );
    b_clock.advance(2 * second);
    assert_eq!(
        b.sweep_expired().await.unwrap(),
        1,
        "5 s past it by B's clock"
    );
    a.refresh().await.unwrap();
    assert_eq!(a.get("t").await.unwrap().status, Status::Pending);
    clean(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_made_on_one_node_is_found_by_another_that_has_not_seen_it() {
    let Some((a, b, url)) = nodes("rerun") else {
        return;
    };
    create(&a, "t", LeasePolicy::Retry).await;
    let t = a.execute("t", 1, Command::Start).await.unwrap();
    a.execute("t", t.version, Command::Fail { error: "e".into() })
        .await
        .unwrap();
    // B holds the finished task before either rerun.
    b.refresh().await.unwrap();
    assert_eq!(b.get("t").await.unwrap().status, Status::Failed);

    let named = a.rerun("t", Some("again".into())).await.unwrap();
    let first = a.rerun("t", None).await.unwrap();
    assert_eq!(first.id(), "t.rerun-2");
    // B's copy of `t` has neither: the same named request is the same rerun, an unnamed one
    // a new one after those two, not a conflict.
    let repeat = b.rerun("t", Some("again".into())).await.unwrap();
    assert_eq!(repeat, named);
    let next = b.rerun("t", None).await.unwrap();
    assert_eq!(next.id(), "t.rerun-3");
    a.refresh().await.unwrap();
    assert_eq!(
        a.get("t").await.unwrap().rerun_as(),
        ["again", "t.rerun-2", "t.rerun-3"]
    );
    // An id another task holds stays taken on either node.
    create(&a, "other", LeasePolicy::Retry).await;
    assert!(matches!(
        b.rerun("t", Some("other".into())).await,
        Err(StoreError::AlreadyExists(id)) if id == "other"
    ));
    clean(&url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_made_on_one_node_reaches_another_that_holds_the_task() {
    let Some((a, b, url)) = nodes("purge") else {
        return;
    };
    for id in ["t", "u"] {
        create(&a, id, LeasePolicy::Retry).await;
        let t = a.execute(id, 1, Command::Start).await.unwrap();
        a.execute(id, t.version, Command::Fail { error: "e".into() })
            .await
            .unwrap();
    }
    // B holds `t` (folded when it followed the creation) before the purge.
    b.refresh().await.unwrap();
    assert_eq!(b.get("t").await.unwrap().status, Status::Failed);

    a.purge("t").await.unwrap();
    // B follows the commit order past the tombstone and forgets its copy.
    b.refresh().await.unwrap();
    assert!(matches!(b.get("t").await, Err(StoreError::Purged { task }) if task == "t"));
    // B purges `u`, which A held; a purge asked for again on either node finds it done, and
    // neither may create a task under a purged id.
    b.purge("u").await.unwrap();
    assert!(matches!(a.purge("u").await, Err(StoreError::Purged { .. })));
    a.refresh().await.unwrap();
    assert!(matches!(a.get("u").await, Err(StoreError::Purged { .. })));
    for (node, id) in [(&a, "u"), (&b, "t")] {
        assert!(matches!(
            node.create(request(spec(id), LeasePolicy::Retry)).await,
            Err(StoreError::AlreadyExists(taken)) if taken == id
        ));
    }
    let report = dtask_replay::audit::audit_journal(a.journal(), &mut |_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.purged, 2);
    clean(&url);
}

/// A record this node cannot apply to its task — here a task whose id is longer than this
/// node takes, created on a node that takes longer ones — does not stop its following: the
/// refresh passes it over and indexes what comes after it (a task created next, pending, is
/// this node's to claim), and a read of the long id is refused as any request with it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_a_node_cannot_follow_does_not_stop_its_following() {
    let Some(url) = schema_url("unfollowable") else {
        return;
    };
    let clock = ManualClock::new(T0);
    let open = |config: StoreConfig| {
        let journal = Journal::open_postgres(&url, JournalOptions::default()).unwrap();
        TaskStore::open(journal, clock.clone(), config).unwrap()
    };
    let mut shorter = StoreConfig::default();
    shorter.max_id_bytes = 64;
    let a = open(shorter);
    let b = open(StoreConfig::default());
    let long = "l".repeat(100);
    create(&b, &long, LeasePolicy::Retry).await;
    create(&b, "y", LeasePolicy::Retry).await;
    let mut pending = a.pending_signal();
    pending.mark_unchanged();
    assert_eq!(a.refresh().await.unwrap(), 2);
    // Past both records: the next refresh has nothing to read.
    assert_eq!(a.refresh().await.unwrap(), 0);
    assert!(pending.has_changed().unwrap(), "y was indexed as pending");
    let listed = a.list_pending(&[KEY.to_owned()], None, 10).await.unwrap();
    let ids: Vec<&str> = listed.tasks.iter().map(|t| t.spec.id.as_str()).collect();
    assert_eq!(ids, ["y"]);
    assert!(matches!(
        a.get(&long).await,
        Err(StoreError::Invalid {
            field: "task id",
            ..
        })
    ));
    assert_eq!(b.get(&long).await.unwrap().status, Status::Pending);
    clean(&url);
}

/// A record this node cannot decode — damaged here, as a newer build's event would be to an
/// older node during a rolling upgrade — does not stop its following either: the refresh
/// passes it over and indexes the task created after it; a read of the damaged task reports
/// the damage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_a_node_cannot_decode_does_not_stop_its_following() {
    let Some((a, b, url)) = nodes("undecodable") else {
        return;
    };
    create(&b, "x", LeasePolicy::Retry).await;
    create(&b, "y", LeasePolicy::Retry).await;
    let schema = url.rsplit_once("schema=").unwrap().1.to_owned();
    let base = std::env::var("DTASK_TEST_PG_URL").unwrap();
    let (admin, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    // The last byte of x's creation flipped.
    admin
        .batch_execute(&format!(
            "UPDATE \"{schema}\".dtask_records \
             SET record = set_byte(record, length(record) - 1, \
                                   get_byte(record, length(record) - 1) # 255) \
             WHERE task = 'x'"
        ))
        .await
        .unwrap();
    drop(admin);
    let _ = connection.await;
    assert_eq!(a.refresh().await.unwrap(), 2);
    let listed = a.list_pending(&[KEY.to_owned()], None, 10).await.unwrap();
    let ids: Vec<&str> = listed.tasks.iter().map(|t| t.spec.id.as_str()).collect();
    assert_eq!(ids, ["y"]);
    assert_eq!(a.refresh().await.unwrap(), 0, "past both records");
    let read = a.get("x").await;
    assert!(
        read.as_ref().is_err_and(|e| e
            .journal_error()
            .is_some_and(dtask_journal::Error::is_damage)),
        "{read:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trim_made_on_one_node_is_followed_by_another_that_appends_after_it() {
    let Some((a, b, url)) = nodes("trim") else {
        return;
    };
    create(&a, "t", LeasePolicy::Retry).await;
    let t = a.execute("t", 1, Command::Start).await.unwrap();
    let update = |n: u64| UpdateRequest {
        attempt: t.attempt,
        event_id: format!("e{n}"),
        kind: "stdout".into(),
        data: vec![b'x'; 200],
        ..UpdateRequest::default()
    };
    for n in 0..3 {
        a.append_update("t", update(n)).await.unwrap();
    }
    // B holds `t` with its head (the last record's digest) before A trims it.
    b.refresh().await.unwrap();
    assert_eq!(b.get("t").await.unwrap().updates, 3);
    assert_eq!(a.trim_progress("t", 1).await.unwrap().records, 2);
    // B follows the trim's record, and its own appends chain on the stream as A left it.
    b.refresh().await.unwrap();
    let seen = b.get("t").await.unwrap();
    assert_eq!(
        (seen.updates, seen.position),
        (3, a.get("t").await.unwrap().position)
    );
    let (original, new) = b.append_update("t", update(0)).await.unwrap();
    assert!(
        !new && original.trimmed,
        "B recognises a trimmed update's id"
    );
    b.append_update("t", update(3)).await.unwrap();
    b.execute("t", seen.version, Command::Complete { data: vec![] })
        .await
        .unwrap();
    let report = dtask_replay::audit::audit_journal(a.journal(), &mut |_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.trimmed_records, 2);
    clean(&url);
}

/// Each node leases notifications on its own (delivery is at-least-once), but one
/// acknowledged on one node is not delivered again by another that had delivered it before:
/// the other drops its route when it follows the acknowledgement, and its receive checks
/// each notification against the journal before it hands it out. A notification queued on
/// one node is found by the other's next receive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_acknowledged_on_one_node_is_not_delivered_again_by_another() {
    use std::time::Duration;

    let Some(url) = schema_url("outbox") else {
        return;
    };
    let clock = ManualClock::new(T0);
    let open = || {
        let journal = Journal::open_postgres(&url, JournalOptions::default()).unwrap();
        TaskStore::open(journal, clock.clone(), StoreConfig::default()).unwrap()
    };
    let (a, b) = (open(), open());
    let lease = Duration::from_secs(10);
    let ids = |got: &[dtask_engine::Notification]| {
        got.iter().map(|n| n.task_id.clone()).collect::<Vec<_>>()
    };
    for id in ["t1", "t2"] {
        a.create(request(session_spec(id, false), LeasePolicy::Retry))
            .await
            .unwrap();
    }
    assert_eq!(
        ids(&b.receive_notifications(10, lease).await.unwrap()),
        ["t1", "t2"]
    );
    let on_a = a.receive_notifications(10, lease).await.unwrap();
    assert_eq!(ids(&on_a), ["t1", "t2"], "each node leases on its own");
    assert_eq!(b.notifications_routed(), 2);
    a.ack_notification(&on_a[0].receipt).await.unwrap();
    // Following the journal, B hears of the acknowledgement and lets its route go at its
    // next receive — of any session, here one that has nothing.
    b.refresh().await.unwrap();
    assert_eq!(b.notifications_routed(), 2);
    assert!(b
        .receive_session_notifications("nobody", 10, lease)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(b.notifications_routed(), 1);
    clock.advance(Duration::from_secs(10));
    a.create(request(session_spec("t3", false), LeasePolicy::Retry))
        .await
        .unwrap();
    let again = b.receive_notifications(10, lease).await.unwrap();
    assert_eq!(
        ids(&again),
        ["t2", "t3"],
        "t1 was acknowledged on the other node"
    );
    for n in &again {
        b.ack_notification(&n.receipt).await.unwrap();
    }
    assert!(a.receive_notifications(10, lease).await.unwrap().is_empty());
    assert_eq!(a.journal().outbox_len().unwrap(), 0);
    assert_eq!((a.notifications_routed(), b.notifications_routed()), (0, 0));
    clean(&url);
}

/// A durable agent's run on one node is steered by a message sent on another: the node
/// running it follows the journal, its run drops the model call in flight for the message
/// sent to preempt, and the model sees the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_sent_on_one_node_steers_an_agent_run_on_another() {
    use dtask_engine::agent::{send_message, AgentMessage};

    let Some((a, b, url)) = nodes("steer") else {
        return;
    };
    let (model, _, manager) = models::counting_run(&a, "r").await;
    let running = {
        let manager = manager.clone();
        tokio::spawn(async move { manager.execute("r").await })
    };
    model.called.notified().await;
    b.refresh().await.unwrap();
    let (_, new) = send_message(&b, "r", AgentMessage::new("stop counting").preempt())
        .await
        .unwrap();
    assert!(new);
    let done = models::steered(running, &model, "stop counting").await;
    assert_eq!(done.mailbox.consumed, done.mailbox.latest);
    clean(&url);
}

/// Losing the race to write down an expired lease is no error to a listing: B, which has
/// not followed A's expiry, decides again against it (the task is pending: nothing to
/// write) — it used to fail `list_pending` with a version conflict, which stops a worker.
/// And a running task B holds that A finishes and purges before B follows its end leaves
/// B's listings and leases (every sweep failed on it, for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_another_node_expired_or_purged_first_does_not_fail_a_listing() {
    let lease = std::time::Duration::from_millis(LEASE_MS + 1);
    let keys = [spec("t").executor_key];
    let Some((a, b, clock, url)) = nodes_and_clock("expiryrace") else {
        return;
    };
    running(&a, "t", LeasePolicy::Retry).await;
    b.refresh().await.unwrap();
    assert_eq!(b.get("t").await.unwrap().status, Status::Running);
    clock.advance(lease);
    let listed = a.list_pending(&keys, None, 10).await.unwrap();
    assert_eq!(listed.tasks.len(), 1, "A writes the expiry down");
    let listed = b.list_pending(&keys, None, 10).await.unwrap();
    assert_eq!(
        listed
            .tasks
            .iter()
            .map(dtask_replay::TaskState::id)
            .collect::<Vec<_>>(),
        ["t"]
    );
    clean(&url);

    let Some((a, b, clock, url)) = nodes_and_clock("purgerace") else {
        return;
    };
    let claimed = running(&a, "t", LeasePolicy::Retry).await;
    b.refresh().await.unwrap();
    a.execute("t", claimed.version, Command::Fail { error: "e".into() })
        .await
        .unwrap();
    a.purge("t").await.unwrap();
    clock.advance(lease);
    b.refresh().await.unwrap();
    for _ in 0..2 {
        assert!(b
            .list_pending(&keys, None, 10)
            .await
            .unwrap()
            .tasks
            .is_empty());
    }
    assert_eq!(b.sweep_expired().await.unwrap(), 0);
    clean(&url);
}

/// An acknowledgement is decided against what the journal holds, not only against what the
/// node has followed: a notification A's receive read off the journal before A followed
/// the record that queued it is acknowledged (it was `NotFound`: A's copy of the task had
/// no such notification), and one whose task another node wrote to meanwhile — a heartbeat
/// — is decided again after it (it was a `VersionConflict`, which no version change made).
/// A deferred task's publication likewise goes in after another node's progress update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledgement_or_a_publication_meeting_another_nodes_record_is_decided_again() {
    use dtask_engine::{CreateRequest, NotificationRequest};
    use std::time::Duration;

    let Some((a, b, url)) = nodes("ackstale") else {
        return;
    };
    let lease = Duration::from_secs(10);
    let note = |event_id: &str| NotificationRequest::new(event_id, "app", b"d".to_vec());
    // Runs on B; A holds it, its creation's notification acknowledged.
    let t = b
        .create(request(session_spec("t", false), LeasePolicy::Retry))
        .await
        .unwrap();
    let t = b.execute("t", t.version, Command::Start).await.unwrap();
    a.refresh().await.unwrap();
    for n in a.receive_notifications(10, lease).await.unwrap() {
        a.ack_notification(&n.receipt).await.unwrap();
    }
    b.refresh().await.unwrap();

    b.enqueue_notification("t", t.attempt, note("n1"))
        .await
        .unwrap();
    let got = a.receive_notifications(10, lease).await.unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    a.ack_notification(&got[0].receipt).await.unwrap();

    a.refresh().await.unwrap();
    b.refresh().await.unwrap();
    b.enqueue_notification("t", t.attempt, note("n2"))
        .await
        .unwrap();
    a.refresh().await.unwrap();
    let beat = b.get("t").await.unwrap().version;
    b.execute("t", beat, Command::Heartbeat).await.unwrap();
    let got = a.receive_notifications(10, lease).await.unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    a.ack_notification(&got[0].receipt).await.unwrap();
    assert_eq!(a.journal().outbox_len().unwrap(), 0);

    let d = b
        .create(CreateRequest {
            publication: dtask_journal::Publication::Deferred,
            ..request(spec("d"), LeasePolicy::Retry)
        })
        .await
        .unwrap();
    let d = b.execute("d", d.version, Command::Start).await.unwrap();
    a.refresh().await.unwrap();
    b.append_update(
        "d",
        UpdateRequest {
            attempt: d.attempt,
            event_id: "u1".into(),
            kind: "progress".into(),
            data: b"half".to_vec(),
            ..UpdateRequest::default()
        },
    )
    .await
    .unwrap();
    let published = a.publish("d", d.version).await.unwrap();
    assert_eq!(
        published.publication,
        dtask_journal::Publication::OnBackground
    );
    clean(&url);
}

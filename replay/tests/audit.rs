//! The audit on real journals: clean ones, damaged ones (bytes flipped and index entries
//! removed with raw RocksDB) and illegal ones (events no correct engine writes, appended
//! through the raw journal API); and the whole-journal fold of listings ([`FoldViews`]) on
//! the same damage.
#![allow(clippy::unwrap_used)]

use dtask_journal::keys::{self, Space};
use dtask_journal::{
    Event, ExpiryResolution, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp,
};
use dtask_replay::audit::{audit_journal, audit_task, AuditReport, ProblemKind};
use dtask_replay::{FoldView, FoldViews};
use std::path::Path;

fn created(task: &str, policy: LeasePolicy) -> Event {
    Event::Created {
        spec: TaskSpec {
            id: task.into(),
            executor_key: "x".into(),
            session_id: "s".into(),
            ..TaskSpec::default()
        }
        .into(),
        policy,
        checkpoint: vec![],
        context_snapshot: vec![],
        at: Timestamp(1),
    }
}

fn started(attempt: u64, deadline: u64) -> Event {
    Event::AttemptStarted {
        attempt,
        lease_deadline: Timestamp(deadline),
        at: Timestamp(10),
    }
}

fn update(attempt: u64, id: &str) -> Event {
    Event::UpdateAppended {
        attempt,
        event_id: id.into(),
        kind: "progress".into(),
        data: b"50%".to_vec(),
        metadata: vec![],
        at: Timestamp(11),
    }
}

fn notify(id: &str, version: u64) -> Event {
    Event::NotificationEnqueued {
        id: id.into(),
        event_id: String::new(),
        kind: "completed".into(),
        data: vec![],
        version,
        at: Timestamp(12),
    }
}

fn completed() -> Event {
    Event::Completed {
        data: b"ok".to_vec(),
        at: Timestamp(20),
    }
}

/// A journal whose finished streams are kept apart: the audit reads both places.
fn journal(dir: &Path) -> Journal {
    Journal::open(
        dir,
        JournalOptions::default().with_keep_finished_apart(true),
    )
    .unwrap()
}

/// "done": created, started, update, completed + notification, ack (6 records, sequences 1..=3
/// and 7..=9); "running": created, started, two updates (4 records, sequences 4..=6 and 10).
fn build(dir: &Path) {
    let j = journal(dir);
    j.append("done", 0, &[created("done", LeasePolicy::Retry)])
        .unwrap();
    j.append("done", 1, &[started(1, 30_000), update(1, "u1")])
        .unwrap();
    j.append("running", 0, &[created("running", LeasePolicy::Fail)])
        .unwrap();
    j.append("running", 1, &[started(1, 30_000), update(1, "a")])
        .unwrap();
    let appended = j
        .append("done", 3, &[completed(), notify("done:3:completed", 3)])
        .unwrap();
    j.append(
        "done",
        5,
        &[Event::NotificationAcked {
            id: "done:3:completed".into(),
            enqueued_seq: appended.last_seq,
            at: Timestamp(30),
        }],
    )
    .unwrap();
    j.append("running", 3, &[update(1, "b")]).unwrap();
}

fn audit(dir: &Path) -> AuditReport {
    let j = Journal::open_read_only(dir).unwrap();
    audit_journal(&j, &mut |_| {}).unwrap()
}

/// [`audit`], which must find nothing wrong (`context` names the case in the failure).
fn audit_clean(dir: &Path, context: &str) -> AuditReport {
    let report = audit(dir);
    assert!(report.is_clean(), "{context}: {:?}", report.problems);
    report
}

/// Opens the raw database and applies `f` to it.
fn tamper(dir: &Path, f: impl FnOnce(&rocksdb::DB)) {
    let cfs: Vec<_> = dtask_journal::keys::COLUMN_FAMILIES.to_vec();
    let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir, cfs).unwrap();
    f(&db);
}

fn cf(db: &rocksdb::DB, space: Space) -> &rocksdb::ColumnFamily {
    db.cf_handle(space.name()).unwrap()
}

/// The column family holding `task`'s records: `events` while its stream has no terminal
/// record, `finished` after (format 4).
fn records_cf<'a>(db: &'a rocksdb::DB, task: &str) -> &'a rocksdb::ColumnFamily {
    let events = cf(db, Space::Events);
    if db
        .get_cf(events, keys::event_key(task, 0))
        .unwrap()
        .is_some()
    {
        events
    } else {
        db.cf_handle(keys::FINISHED_EVENTS).unwrap()
    }
}

/// Flips one bit inside the payload of `task`'s record at `position`, where it lies.
fn flip(db: &rocksdb::DB, task: &str, position: u64) {
    let key = keys::event_key(task, position);
    let cf = records_cf(db, task);
    let mut value = db.get_cf(cf, &key).unwrap().unwrap();
    value[25] ^= 0x40;
    db.put_cf(cf, &key, value).unwrap();
}

/// Builds the journal of [`build`], damages it with `f` and audits it.
fn audit_damaged(f: impl FnOnce(&rocksdb::DB)) -> AuditReport {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    tamper(dir.path(), f);
    audit(dir.path())
}

fn kinds(report: &AuditReport) -> Vec<(String, Option<u64>, ProblemKind)> {
    report
        .problems
        .iter()
        .map(|p| (p.task.clone(), p.position, p.kind))
        .collect()
}

#[test]
fn a_clean_journal_audits_clean() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let mut calls = Vec::new();
    let j = Journal::open_read_only(dir.path()).unwrap();
    let report = audit_journal(&j, &mut |p| calls.push(p)).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!((report.tasks, report.records, report.last_seq), (2, 10, 10));
    assert_eq!((report.live, report.outbox), (1, 0));
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].records, 10);
    assert_eq!(calls[1].total_records, 10);
    let task = audit_task(&j, "running").unwrap();
    assert!(task.is_clean(), "{:?}", task.problems);
    assert_eq!(task.records, 4);
    assert_eq!(task.status, Some(dtask_replay::Status::Running));
    assert!(!audit_task(&j, "nobody").unwrap().exists);
}

#[test]
fn completed_on_a_pending_task_is_illegal_at_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    j.append("t", 0, &[created("t", LeasePolicy::Retry)])
        .unwrap();
    j.append("t", 1, &[completed()]).unwrap();
    let task = audit_task(&j, "t").unwrap();
    assert_eq!(task.problems.len(), 1, "{:?}", task.problems);
    let p = &task.problems[0];
    assert_eq!((p.position, p.kind), (Some(1), ProblemKind::Illegal));
    assert!(
        p.detail
            .contains("`completed` is not allowed in status pending"),
        "{p}"
    );
    assert!(p.to_string().contains("position 1"));
    // The whole-journal audit says the same, and nothing else.
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    assert_eq!(
        kinds(&report),
        [("t".into(), Some(1), ProblemKind::Illegal)]
    );
}

#[test]
fn only_the_first_illegal_record_of_a_task_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    j.append("t", 0, &[created("t", LeasePolicy::Retry)])
        .unwrap();
    // Attempt 2 first (attempts must grow by one), then records that follow from it.
    j.append("t", 1, &[started(2, 100), update(2, "a"), completed()])
        .unwrap();
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    assert_eq!(
        kinds(&report),
        [("t".into(), Some(1), ProblemKind::Illegal)]
    );
    assert!(report.problems[0]
        .detail
        .contains("attempt 2 started, expected 1"));
}

#[test]
fn duplicate_update_ids_and_records_after_the_end_are_illegal() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    j.append(
        "dup",
        0,
        &[created("dup", LeasePolicy::Retry), started(1, 100)],
    )
    .unwrap();
    j.append("dup", 2, &[update(1, "same"), update(1, "same")])
        .unwrap();
    j.append(
        "late",
        0,
        &[created("late", LeasePolicy::Retry), started(1, 100)],
    )
    .unwrap();
    j.append("late", 2, &[completed(), notify("late:3:completed", 3)])
        .unwrap();
    j.append("late", 4, &[update(1, "x")]).unwrap();
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    assert_eq!(
        kinds(&report),
        [
            ("dup".into(), Some(3), ProblemKind::Illegal),
            ("late".into(), Some(4), ProblemKind::Illegal),
        ]
    );
    assert!(report.problems[0].detail.contains("recorded twice"));
    assert!(report.problems[1]
        .detail
        .contains("after the task was terminal"));
}

#[test]
fn rerun_records_stand_only_where_a_rerun_puts_them() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    let at = Timestamp(5);
    let rerun_of = |task: &str| Event::RerunOf {
        task: task.into(),
        at,
    };
    let rerun_as = |task: &str| Event::RerunAs {
        task: task.into(),
        at,
    };
    // Where a rerun puts them: right after the new task's creation, after the old one's end.
    j.append(
        "old",
        0,
        &[created("old", LeasePolicy::Retry), started(1, 100)],
    )
    .unwrap();
    j.append("old", 2, &[completed(), rerun_as("new")]).unwrap();
    j.append(
        "new",
        0,
        &[created("new", LeasePolicy::Retry), rerun_of("old")],
    )
    .unwrap();
    // Elsewhere: a rerun_of after an attempt, a rerun_as of a task that has not ended, the
    // same rerun twice, a task its own rerun.
    j.append(
        "late",
        0,
        &[
            created("late", LeasePolicy::Retry),
            started(1, 100),
            rerun_of("old"),
        ],
    )
    .unwrap();
    j.append(
        "live",
        0,
        &[created("live", LeasePolicy::Retry), rerun_as("x")],
    )
    .unwrap();
    j.append(
        "twice",
        0,
        &[created("twice", LeasePolicy::Retry), started(1, 100)],
    )
    .unwrap();
    j.append("twice", 2, &[completed(), rerun_as("a"), rerun_as("a")])
        .unwrap();
    j.append(
        "self",
        0,
        &[created("self", LeasePolicy::Retry), rerun_of("self")],
    )
    .unwrap();
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    assert_eq!(
        kinds(&report),
        [
            ("late".into(), Some(2), ProblemKind::Illegal),
            ("live".into(), Some(1), ProblemKind::Illegal),
            ("self".into(), Some(1), ProblemKind::Illegal),
            ("twice".into(), Some(4), ProblemKind::Illegal),
        ],
        "{:?}",
        report.problems
    );
    let details: Vec<&str> = report.problems.iter().map(|p| p.detail.as_str()).collect();
    assert!(details[0].contains("only right after the creation"));
    assert!(details[1].contains("before the task ended"));
    assert!(details[2].contains("linked to no other task"));
    assert!(details[3].contains("recorded twice"));
}

#[test]
fn lease_expiry_must_follow_policy_and_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    // Fail policy resolved as retry: illegal.
    j.append(
        "policy",
        0,
        &[created("policy", LeasePolicy::Fail), started(1, 100)],
    )
    .unwrap();
    j.append(
        "policy",
        2,
        &[Event::LeaseExpired {
            resolution: ExpiryResolution::Retry,
            deadline: Timestamp(100),
            at: Timestamp(150),
        }],
    )
    .unwrap();
    // Right resolution, wrong deadline and detected before it: inconsistent.
    j.append(
        "deadline",
        0,
        &[created("deadline", LeasePolicy::Retry), started(1, 100)],
    )
    .unwrap();
    j.append(
        "deadline",
        2,
        &[Event::LeaseExpired {
            resolution: ExpiryResolution::Retry,
            deadline: Timestamp(90),
            at: Timestamp(80),
        }],
    )
    .unwrap();
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    assert_eq!(
        kinds(&report),
        [
            ("deadline".into(), Some(2), ProblemKind::Inconsistent),
            ("deadline".into(), Some(2), ProblemKind::Inconsistent),
            ("policy".into(), Some(2), ProblemKind::Illegal),
        ]
    );
    assert!(
        report.problems[2].detail.contains("require Failed"),
        "{}",
        report.problems[2]
    );
}

#[test]
fn a_recovery_limit_stands_before_the_first_attempt_once_and_bounds_the_retries() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    let limit = |max_recoveries| Event::RecoveryLimit {
        max_recoveries,
        at: Timestamp(1),
    };
    let expired = |resolution, deadline| Event::LeaseExpired {
        resolution,
        deadline: Timestamp(deadline),
        at: Timestamp(deadline + 1),
    };
    // Kept: one recovery, then the second expiry fails the task.
    j.append(
        "kept",
        0,
        &[
            created("kept", LeasePolicy::Retry),
            limit(1),
            started(1, 100),
            expired(ExpiryResolution::Retry, 100),
            started(2, 200),
            expired(ExpiryResolution::Failed, 200),
        ],
    )
    .unwrap();
    // A third attempt recovered past the limit; a limit after the first attempt; two limits.
    j.append(
        "past",
        0,
        &[
            created("past", LeasePolicy::Retry),
            limit(1),
            started(1, 100),
            expired(ExpiryResolution::Retry, 100),
            started(2, 200),
            expired(ExpiryResolution::Retry, 200),
        ],
    )
    .unwrap();
    j.append(
        "late",
        0,
        &[
            created("late", LeasePolicy::Retry),
            started(1, 100),
            limit(3),
        ],
    )
    .unwrap();
    j.append(
        "twice",
        0,
        &[created("twice", LeasePolicy::Retry), limit(3), limit(4)],
    )
    .unwrap();
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    assert_eq!(
        kinds(&report),
        [
            ("late".into(), Some(2), ProblemKind::Illegal),
            ("past".into(), Some(5), ProblemKind::Illegal),
            ("twice".into(), Some(2), ProblemKind::Illegal),
        ],
        "{:?}",
        report.problems
    );
    let details: Vec<&str> = report.problems.iter().map(|p| p.detail.as_str()).collect();
    assert!(
        details[0].contains("after the first attempt"),
        "{}",
        details[0]
    );
    assert!(details[1].contains("require Failed"), "{}", details[1]);
    assert!(details[2].contains("twice"), "{}", details[2]);
    let kept = dtask_replay::load_task(&j, "kept").unwrap().unwrap();
    assert_eq!(
        kept.state.result_error,
        dtask_replay::recovery_limit_error(1)
    );
}

#[test]
fn an_attempt_before_the_not_before_time_and_a_delay_of_a_running_task_are_illegal() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    let not_before = |until| Event::NotBefore {
        until: Timestamp(until),
        at: Timestamp(1),
    };
    // Claimed once due (`started` claims at 10 ms, after the delay ends at 1 ms).
    j.append(
        "kept",
        0,
        &[
            created("kept", LeasePolicy::Retry),
            not_before(1),
            started(1, 100),
        ],
    )
    .unwrap();
    // Claimed before its time; delayed while running.
    j.append(
        "early",
        0,
        &[
            created("early", LeasePolicy::Retry),
            not_before(50),
            started(1, 100),
        ],
    )
    .unwrap();
    j.append(
        "running",
        0,
        &[
            created("running", LeasePolicy::Retry),
            started(1, 100),
            not_before(50),
        ],
    )
    .unwrap();
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    assert_eq!(
        kinds(&report),
        [
            ("early".into(), Some(2), ProblemKind::Illegal),
            ("running".into(), Some(2), ProblemKind::Illegal),
        ],
        "{:?}",
        report.problems
    );
    assert!(
        report.problems[0]
            .detail
            .contains("before the task's not-before time 50 ms"),
        "{}",
        report.problems[0]
    );
}

#[test]
fn a_notification_must_carry_the_task_version() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    j.append(
        "t",
        0,
        &[created("t", LeasePolicy::Retry), notify("t:7:x", 7)],
    )
    .unwrap();
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    assert_eq!(
        kinds(&report),
        [("t".into(), Some(1), ProblemKind::Inconsistent)]
    );
    assert!(report.problems[0].detail.contains("version 7"));
}

#[test]
fn flipped_bytes_are_reported_and_the_audit_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    tamper(dir.path(), |db| {
        flip(db, "done", 1);
        flip(db, "done", 4);
    });
    let report = audit(dir.path());
    // Both flips are named; the damaged enqueue record is not blamed on the outbox again.
    assert_eq!(
        kinds(&report),
        [
            ("done".into(), Some(1), ProblemKind::Checksum),
            ("done".into(), Some(4), ProblemKind::Checksum),
        ]
    );
    let task = audit_task(&Journal::open_read_only(dir.path()).unwrap(), "running").unwrap();
    assert!(task.is_clean());
}

/// A task folded as of a position is folded from the records up to it: damage after them
/// does not stop it.
#[test]
fn a_fold_as_of_a_position_is_not_stopped_by_damage_after_it() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    tamper(dir.path(), |db| flip(db, "done", 3));
    let j = Journal::open_read_only(dir.path()).unwrap();
    let as_of = dtask_replay::load_task_at(&j, "done", 3).unwrap().unwrap();
    assert_eq!(as_of.state.position, 3, "records 0 to 2 folded");
    assert!(dtask_replay::load_task_at(&j, "done", 4).is_err());
}

#[test]
fn a_damaged_terminal_record_is_not_also_blamed_on_the_live_index() {
    let report = audit_damaged(|db| flip(db, "done", 3));
    // The damage hides the `completed` event; "done" is rightly absent from the live index.
    assert_eq!(
        kinds(&report),
        [("done".into(), Some(3), ProblemKind::Checksum)]
    );
}

#[test]
fn a_missing_commit_entry_is_reported() {
    let report = audit_damaged(|db| {
        db.delete_cf(cf(db, Space::Commits), keys::seq_key(5))
            .unwrap();
    });
    assert_eq!(
        kinds(&report),
        [("running".into(), Some(2), ProblemKind::CommitIndex)]
    );
    assert!(report.problems[0].detail.contains("sequence 5 is missing"));
}

#[test]
fn a_commit_entry_pointing_elsewhere_is_reported() {
    let report = audit_damaged(|db| {
        db.put_cf(
            cf(db, Space::Commits),
            keys::seq_key(2),
            keys::event_key("running", 0),
        )
        .unwrap();
    });
    assert_eq!(
        kinds(&report),
        [("running".into(), Some(0), ProblemKind::CommitIndex)]
    );
}

#[test]
fn live_index_disagreements_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    tamper(dir.path(), |db| {
        let live = cf(db, Space::Live);
        db.delete_cf(live, keys::task_key("running")).unwrap();
        db.put_cf(live, keys::task_key("done"), b"").unwrap();
        db.put_cf(live, keys::task_key("ghost"), b"").unwrap();
    });
    let report = audit(dir.path());
    assert_eq!(
        kinds(&report),
        [
            ("done".into(), None, ProblemKind::LiveIndex),
            ("running".into(), None, ProblemKind::LiveIndex),
            ("ghost".into(), None, ProblemKind::LiveIndex),
        ]
    );
    let j = Journal::open_read_only(dir.path()).unwrap();
    assert_eq!(audit_task(&j, "running").unwrap().problems.len(), 1);
}

#[test]
fn outbox_disagreements_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    j.append(
        "a",
        0,
        &[
            created("a", LeasePolicy::Retry),
            notify("a:1:task_created", 1),
        ],
    )
    .unwrap();
    j.append(
        "b",
        0,
        &[
            created("b", LeasePolicy::Retry),
            notify("b:1:task_created", 1),
        ],
    )
    .unwrap();
    j.append(
        "b",
        2,
        &[Event::NotificationAcked {
            id: "b:1:task_created".into(),
            enqueued_seq: 4,
            at: Timestamp(5),
        }],
    )
    .unwrap();
    assert!(audit_journal(&j, &mut |_| {}).unwrap().is_clean());
    drop(j);
    tamper(dir.path(), |db| {
        let outbox = cf(db, Space::Outbox);
        // a's queued notification loses its entry; b's acked one gets one back.
        db.delete_cf(outbox, keys::seq_key(2)).unwrap();
        db.put_cf(outbox, keys::seq_key(4), keys::event_key("b", 1))
            .unwrap();
    });
    let report = audit(dir.path());
    assert_eq!(
        kinds(&report),
        [
            ("b".into(), Some(1), ProblemKind::OutboxIndex),
            ("a".into(), Some(1), ProblemKind::OutboxIndex),
        ]
    );
    assert!(report.problems[1]
        .detail
        .contains("missing from the outbox"));
}

#[test]
fn an_ack_naming_the_wrong_sequence_is_inconsistent() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    j.append("a", 0, &[created("a", LeasePolicy::Retry), notify("n", 1)])
        .unwrap();
    j.append(
        "a",
        2,
        &[Event::NotificationAcked {
            id: "n".into(),
            enqueued_seq: 1,
            at: Timestamp(5),
        }],
    )
    .unwrap();
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    // The ack removed the wrong outbox key, so the real entry stays behind too.
    assert_eq!(
        kinds(&report),
        [
            ("a".into(), Some(2), ProblemKind::Inconsistent),
            ("a".into(), Some(1), ProblemKind::OutboxIndex),
        ]
    );
}

#[test]
fn a_deleted_last_record_is_named_by_the_commit_index() {
    let report = audit_damaged(|db| {
        db.delete_cf(cf(db, Space::Events), keys::event_key("running", 3))
            .unwrap();
    });
    // The journal's tail marker, written with the record, says where the streams ended.
    assert_eq!(
        kinds(&report),
        [
            ("running".into(), Some(3), ProblemKind::Missing),
            (String::new(), None, ProblemKind::TailMarker),
        ],
        "{:?}",
        report.problems
    );
    assert!(report.problems[1]
        .detail
        .contains("the last sequence is 10, the streams end at 9"));
    assert_eq!(report.records, 9);
}

#[test]
fn forged_huge_commit_sequences_are_problems_not_an_abort() {
    for forged in [1u64 << 37, keys::MAX_SEQUENCE + 1, u64::MAX] {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path());
        tamper(dir.path(), |db| {
            db.put_cf(
                cf(db, Space::Commits),
                keys::seq_key(forged),
                keys::event_key("running", 0),
            )
            .unwrap();
        });
        let report = audit(dir.path());
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.kind == ProblemKind::CommitIndex),
            "forged {forged}: {:?}",
            report.problems
        );
        assert_eq!(report.records, 10);
    }
}

#[test]
fn a_deleted_last_commit_entry_is_reported() {
    let report = audit_damaged(|db| {
        db.delete_cf(cf(db, Space::Commits), keys::seq_key(10))
            .unwrap();
    });
    assert_eq!(
        kinds(&report),
        [("running".into(), Some(3), ProblemKind::CommitIndex)],
        "{:?}",
        report.problems
    );
    assert!(
        report.problems[0]
            .detail
            .contains("sequence 10 has no commit entry"),
        "{}",
        report.problems[0]
    );
}

/// Writes a well-formed record at the end of `task`'s stream, chained on its last record, with
/// sequence `seq` — in the `events` space only, as no journal writes it.
fn forge_next(db: &rocksdb::DB, task: &str, position: u64, seq: u64, event: &Event) {
    let events = cf(db, Space::Events);
    let prev = db
        .get_cf(events, keys::event_key(task, position - 1))
        .unwrap()
        .unwrap();
    let prev = dtask_journal::record::parse(&prev).unwrap().digest;
    let payload = dtask_journal::record::encode_payload(event).unwrap();
    let (bytes, _) = dtask_journal::record::frame(task, position, seq, &payload, &prev).unwrap();
    db.put_cf(events, keys::event_key(task, position), bytes)
        .unwrap();
}

#[test]
fn a_record_without_a_commit_entry_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    // Sequence 11: one past the index, inside the same 64-bit word of a bitmap of sequences.
    tamper(dir.path(), |db| {
        forge_next(db, "running", 4, 11, &update(1, "c"));
    });
    let report = audit(dir.path());
    assert_eq!(
        kinds(&report),
        [
            ("running".into(), Some(4), ProblemKind::CommitIndex),
            (String::new(), None, ProblemKind::TailMarker),
        ],
        "{:?}",
        report.problems
    );
    assert!(report.problems[0]
        .detail
        .contains("sequence 11 has no commit entry"));
}

#[test]
fn a_record_reusing_a_sequence_is_reported() {
    let report = audit_damaged(|db| {
        forge_next(db, "running", 4, 3, &update(1, "c"));
    });
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.kind == ProblemKind::CommitIndex
                && p.detail.contains("sequence 3 is carried by two records")),
        "{:?}",
        report.problems
    );
}

#[test]
fn a_created_record_naming_another_task_is_illegal() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    // The append refuses it, so it is forged: a stream "x" opened by "other"'s `created`,
    // with its commit and live entries, as the writer would have written them.
    tamper(dir.path(), |db| {
        let payload =
            dtask_journal::record::encode_payload(&created("other", LeasePolicy::Retry)).unwrap();
        let (bytes, _) =
            dtask_journal::record::frame("x", 0, 11, &payload, &dtask_journal::Digest::GENESIS)
                .unwrap();
        db.put_cf(cf(db, Space::Events), keys::event_key("x", 0), bytes)
            .unwrap();
        db.put_cf(
            cf(db, Space::Commits),
            keys::seq_key(11),
            keys::event_key("x", 0),
        )
        .unwrap();
        db.put_cf(cf(db, Space::Live), keys::task_key("x"), b"")
            .unwrap();
    });
    let report = audit(dir.path());
    let illegal: Vec<_> = report
        .problems
        .iter()
        .filter(|p| p.kind == ProblemKind::Illegal)
        .collect();
    assert_eq!(illegal.len(), 1, "{:?}", report.problems);
    assert_eq!(
        (illegal[0].task.as_str(), illegal[0].position),
        ("x", Some(0))
    );
    assert!(
        illegal[0].detail.contains("the spec names task \"other\""),
        "{}",
        illegal[0]
    );
}

#[test]
fn a_commit_entry_at_sequence_zero_is_reported() {
    let report = audit_damaged(|db| {
        db.put_cf(
            cf(db, Space::Commits),
            keys::seq_key(0),
            keys::event_key("done", 0),
        )
        .unwrap();
    });
    assert_eq!(
        kinds(&report),
        [(String::new(), None, ProblemKind::CommitIndex)],
        "{:?}",
        report.problems
    );
    assert!(
        report.problems[0].detail.contains("sequence 0"),
        "{}",
        report.problems[0]
    );
}

#[test]
fn a_value_in_the_live_index_is_reported() {
    let report = audit_damaged(|db| {
        db.put_cf(cf(db, Space::Live), keys::task_key("running"), b"junk")
            .unwrap();
    });
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.kind == ProblemKind::LiveIndex
                && p.task == "running"
                && p.detail.contains("carries 4 bytes")),
        "{:?}",
        report.problems
    );
}

#[test]
fn unknown_keys_in_meta_and_in_the_default_space_are_reported() {
    let report = audit_damaged(|db| {
        db.put_cf(cf(db, Space::Meta), b"colour", b"blue").unwrap();
        db.put(b"stray", b"x").unwrap();
    });
    let details: Vec<_> = report
        .problems
        .iter()
        .map(|p| (p.kind, p.detail.as_str()))
        .collect();
    assert_eq!(
        details,
        [
            (
                ProblemKind::Layout,
                "unknown key \"colour\" in the `meta` space"
            ),
            (
                ProblemKind::Layout,
                "unknown key \"stray\" in the `default` space"
            ),
        ]
    );
}

#[test]
fn an_older_format_stamp_on_a_newer_layout_is_reported() {
    for version in [1u32, 2] {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path());
        tamper(dir.path(), |db| {
            db.put_cf(
                cf(db, Space::Meta),
                keys::META_FORMAT_VERSION,
                version.to_be_bytes(),
            )
            .unwrap();
        });
        let report = audit(dir.path());
        assert!(
            !report.problems.is_empty()
                && report
                    .problems
                    .iter()
                    .all(|p| p.kind == ProblemKind::Layout),
            "format {version}: {:?}",
            report.problems
        );
    }
}

/// Not a test: times the audit of the journal at `$DTASK_LARGE` (see `large_journal` in the
/// root package's `tests/cli.rs`), e.g.
/// `DTASK_LARGE=/tmp/big cargo test --release -p dtask-replay --test audit -- --ignored --nocapture`.
#[test]
#[ignore = "measures the audit of a large journal"]
#[allow(clippy::cast_precision_loss)]
fn audit_timing() {
    let Some(dir) = std::env::var_os("DTASK_LARGE") else {
        return;
    };
    let j = Journal::open_read_only(dir).unwrap();
    let started = std::time::Instant::now();
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    let elapsed = started.elapsed();
    assert!(
        report.is_clean(),
        "{:?}",
        &report.problems[..report.problems.len().min(5)]
    );
    println!(
        "audit of {} tasks, {} records ({} bytes): {:.3} s ({:.0} records/s)",
        report.tasks,
        report.records,
        report.bytes,
        elapsed.as_secs_f64(),
        report.records as f64 / elapsed.as_secs_f64()
    );
}

fn sent(sequence: u64, id: &str) -> Event {
    Event::InputSent {
        sequence,
        event_id: id.into(),
        kind: "message".into(),
        data: b"hi".to_vec(),
        delivery: dtask_journal::Delivery::Queued,
        at: Timestamp(13),
    }
}

/// Each G3 record a correct engine could not have written is a named problem: an input past
/// a sealed mailbox, an input out of sequence, a consumed cursor moved backwards, a child
/// created under a stale authority, a part after its event's final part, a publication of a
/// task that was not deferred.
#[test]
fn illegal_g3_records_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    let base = |id: &str| [created(id, LeasePolicy::Retry), started(1, 100)];
    j.append("sealed", 0, &base("sealed")).unwrap();
    j.append("sealed", 2, &[completed(), sent(1, "late")])
        .unwrap();
    j.append("gap", 0, &base("gap")).unwrap();
    j.append("gap", 2, &[sent(1, "a"), sent(3, "b")]).unwrap();
    j.append("back", 0, &base("back")).unwrap();
    let advance = |cursor| Event::CursorAdvanced {
        cursor,
        attempt: 1,
        at: Timestamp(14),
    };
    j.append(
        "back",
        2,
        &[sent(1, "a"), sent(2, "b"), advance(2), advance(1)],
    )
    .unwrap();
    j.append("stale", 0, &base("stale")).unwrap();
    j.append(
        "stale",
        2,
        &[Event::ChildCreated {
            child_id: "c".into(),
            attempt: 1,
            generation: 2,
            at: Timestamp(15),
        }],
    )
    .unwrap();
    j.append("parts", 0, &base("parts")).unwrap();
    let part = |part_id: &str, last| Event::PartAppended {
        attempt: 1,
        event_id: "e".into(),
        part_id: part_id.into(),
        last,
        kind: "token".into(),
        data: vec![],
        metadata: vec![],
        at: Timestamp(16),
    };
    j.append("parts", 2, &[part("p1", true), part("p2", true)])
        .unwrap();
    j.append("public", 0, &base("public")).unwrap();
    j.append("public", 2, &[Event::Published { at: Timestamp(17) }])
        .unwrap();
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    let found: Vec<(String, Option<u64>, ProblemKind, bool)> = report
        .problems
        .iter()
        .map(|p| {
            let named = match p.task.as_str() {
                "sealed" => p.detail.contains("sealed"),
                "gap" => p.detail.contains("input sequence 3, expected 2"),
                "back" => p.detail.contains("from 2 to 1"),
                "stale" => p.detail.contains("stale authority"),
                "parts" => p.detail.contains("after its final part"),
                "public" => p.detail.contains("publication is on_create"),
                _ => false,
            };
            (p.task.clone(), p.position, p.kind, named)
        })
        .collect();
    let expected: Vec<(String, Option<u64>, ProblemKind, bool)> = [
        ("back", 5),
        ("gap", 3),
        ("parts", 3),
        ("public", 2),
        ("sealed", 3),
        ("stale", 2),
    ]
    .into_iter()
    .map(|(t, p)| (t.to_owned(), Some(p), ProblemKind::Illegal, true))
    .collect();
    assert_eq!(found, expected, "{:#?}", report.problems);
}

/// A finished stream kept apart (format 4) whose records lie in both column families — one
/// moved back by hand, or one copied — is a layout problem; the same stream whole in either
/// place is clean.
#[test]
fn a_stream_split_across_the_two_places_is_reported() {
    fn finished(db: &rocksdb::DB) -> &rocksdb::ColumnFamily {
        db.cf_handle(keys::FINISHED_EVENTS).unwrap()
    }
    // Whole in `finished`, as the writer left it: clean.
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    tamper(dir.path(), |db| {
        let events = cf(db, Space::Events);
        assert!(db
            .get_cf(events, keys::event_key("done", 0))
            .unwrap()
            .is_none());
        assert!(db
            .get_cf(finished(db), keys::event_key("done", 0))
            .unwrap()
            .is_some());
    });
    assert!(audit(dir.path()).is_clean());
    // "done"'s record at `position` put in `events` too, and taken out of `finished` when
    // `moved`: either way the stream lies in both places.
    for (position, moved) in [(5, true), (0, false)] {
        let report = audit_damaged(|db| {
            let key = keys::event_key("done", position);
            let value = db.get_cf(finished(db), &key).unwrap().unwrap();
            if moved {
                db.delete_cf(finished(db), &key).unwrap();
            }
            db.put_cf(cf(db, Space::Events), &key, value).unwrap();
        });
        assert_eq!(
            kinds(&report),
            [("done".into(), None, ProblemKind::Layout)],
            "position {position}, moved {moved}: {report:?}"
        );
    }
    // The live stream stays in `events` alone.
    let report = audit_damaged(|db| {
        assert!(db
            .get_cf(finished(db), keys::event_key("running", 0))
            .unwrap()
            .is_none());
    });
    assert!(report.is_clean());
}

/// A view as the listings show it: id, records, bytes, problems, status and version.
type Shown = (String, u64, u64, Vec<String>, Option<String>, Option<u64>);

fn shown(view: &FoldView) -> Shown {
    (
        view.id().to_owned(),
        view.records,
        view.bytes,
        view.problems(),
        view.task
            .as_ref()
            .map(|t| t.state.status.as_str().to_owned()),
        view.task.as_ref().map(|t| t.state.version),
    )
}

/// What listing ids and reading each task gives (the listings before [`FoldViews`]): a key
/// that names no task comes as its error.
fn listed_one_by_one(journal: &Journal, after: Option<&str>) -> Vec<Result<Shown, String>> {
    journal
        .task_ids_from(after)
        .map(|id| match id {
            Ok(id) => Ok(shown(&FoldView::read(journal, &id, |_| {}).unwrap())),
            Err(e) => Err(e.to_string()),
        })
        .collect()
}

#[test]
fn the_views_of_one_pass_are_those_of_reading_each_task() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    {
        // An illegal record: a second completion of "done".
        let j = journal(dir.path());
        j.append("done", 6, &[completed()]).unwrap();
    }
    tamper(dir.path(), |db| {
        flip(db, "running", 2);
        // Before "done", too short to hold a separator and a position.
        db.put_cf(cf(db, Space::Events), b"c", b"junk").unwrap();
    });
    let j = Journal::open_read_only(dir.path()).unwrap();
    for after in [None, Some("b"), Some("c"), Some("done"), Some("running")] {
        let mut records = 0;
        let mut views = FoldViews::new(&j, after);
        let mut all = Vec::new();
        while let Some(view) = views.next_with(|_| records += 1) {
            all.push(view.map(|v| shown(&v)).map_err(|e| e.to_string()));
        }
        let expected = listed_one_by_one(&j, after);
        assert_eq!(all, expected, "after {after:?}");
        let counted: u64 = expected.iter().flatten().map(|s| s.1).sum();
        assert_eq!(
            records, counted,
            "every intact record handed over, after {after:?}"
        );
    }
    // The damage is there to be seen, not lost in the pass.
    let all: Vec<_> = FoldViews::new(&j, None).collect();
    assert_eq!(all.len(), 3);
    assert!(all[0]
        .as_ref()
        .is_err_and(|e| e.to_string().contains("\"c\"")));
    let done = all[1].as_ref().unwrap();
    assert_eq!((done.id(), done.records), ("done", 7));
    assert!(done.illegal.is_some());
    let running = all[2].as_ref().unwrap();
    assert_eq!(
        (running.id(), running.records, running.damage.len()),
        ("running", 3, 1)
    );
}

/// The records of `task` as read back: (position, event type).
fn stream(j: &Journal, task: &str) -> Vec<(u64, dtask_journal::EventType)> {
    j.read_stream(task, 0)
        .map(|r| r.map(|r| (r.position, r.event.event_type())))
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn a_purged_task_keeps_its_tombstone_alone_and_the_journal_audits_clean() {
    for apart in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path());
        let options = JournalOptions::default().with_keep_finished_apart(apart);
        let j = Journal::open(dir.path(), options.clone()).unwrap();
        let purged = j.purge(&["done"], Timestamp(40)).unwrap();
        assert_eq!((purged[0].task.as_str(), purged[0].records), ("done", 6));
        assert_eq!(stream(&j, "done"), [(0, dtask_journal::EventType::Purged)]);
        let view = FoldView::read(&j, "done", |_| {}).unwrap();
        assert_eq!(view.purged, Some((6, Timestamp(40))));
        assert!(view.task.is_none() && !view.has_problems());
        let err = dtask_replay::load_task(&j, "done").unwrap_err();
        assert!(
            matches!(
                err,
                dtask_replay::ReplayError::Rejected {
                    error: dtask_replay::FoldError::Purged { records: 6, at: 40 },
                    ..
                }
            ),
            "{err}"
        );
        drop(j);
        let report = audit_clean(dir.path(), &format!("apart {apart}"));
        assert_eq!(
            (
                report.tasks,
                report.records,
                report.purged,
                report.purged_records
            ),
            (2, 5, 1, 6)
        );

        // Reopened: the id stays taken, the stream goes on from its tombstone's head, and a
        // second purge leaves the commit order with two tasks' holes, accounted.
        let j = Journal::open(dir.path(), options).unwrap();
        assert!(matches!(
            j.append("done", 0, &[created("done", LeasePolicy::Retry)]),
            Err(dtask_journal::Error::Conflict { actual: 1, .. })
        ));
        j.append("running", 4, &[completed()]).unwrap();
        j.append("later", 0, &[created("later", LeasePolicy::Retry)])
            .unwrap();
        j.purge(&["running"], Timestamp(50)).unwrap();
        assert_eq!(
            stream(&j, "running"),
            [(0, dtask_journal::EventType::Purged)]
        );
        drop(j);
        let report = audit_clean(dir.path(), &format!("apart {apart}"));
        assert_eq!(
            (
                report.tasks,
                report.purged,
                report.purged_records,
                report.live
            ),
            (3, 2, 11, 1)
        );
        let listed: Vec<_> = FoldViews::new(&Journal::open_read_only(dir.path()).unwrap(), None)
            .map(|v| {
                let v = v.unwrap();
                (v.id().to_owned(), v.purged.is_some(), v.task.is_some())
            })
            .collect();
        assert_eq!(
            listed,
            [
                ("done".into(), true, false),
                ("later".into(), false, true),
                ("running".into(), true, false)
            ]
        );
    }
}

#[test]
fn a_purge_is_refused_with_nothing_written_where_it_may_not_go() {
    use dtask_journal::{Error, PurgeRefusal};
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let j = journal(dir.path());
    j.append("queued", 0, &[created("queued", LeasePolicy::Retry)])
        .unwrap();
    let cancel = Event::CancelRequested {
        reason: "stop".into(),
        lease_deadline: None,
        direct: true,
        at: Timestamp(12),
    };
    j.append("queued", 1, &[cancel, notify("queued:1:canceled", 2)])
        .unwrap();
    let before = j.last_seq().unwrap();
    let refused = |tasks: &[&str]| j.purge(tasks, Timestamp(40)).unwrap_err();
    let why = |e: Error| match e {
        Error::NotPurgeable { task, why } => (task, why),
        e => panic!("{e}"),
    };
    assert_eq!(
        why(refused(&["running"])),
        ("running".into(), PurgeRefusal::NotEnded)
    );
    assert_eq!(
        why(refused(&["nobody"])),
        ("nobody".into(), PurgeRefusal::Unknown)
    );
    assert_eq!(
        why(refused(&["queued"])),
        ("queued".into(), PurgeRefusal::QueuedNotification)
    );
    // All or nothing: one refusal among several purges none.
    assert_eq!(
        why(refused(&["done", "running"])),
        ("running".into(), PurgeRefusal::NotEnded)
    );
    assert!(matches!(refused(&["done", "done"]), Error::DuplicateStream(t) if t == "done"));
    let tombstone = Event::Purged {
        records: 6,
        sequences: [0, 0],
        last_digest: [0; 32],
        at: Timestamp(40),
    };
    assert_eq!(
        why(j.append("done", 6, &[tombstone]).unwrap_err()),
        ("done".into(), PurgeRefusal::AppendedTombstone)
    );
    assert_eq!(j.last_seq().unwrap(), before);
    assert_eq!(stream(&j, "done").len(), 6);
    // A hold keeps a task; lifted, it goes.
    let hold = Event::Hold {
        reason: "case 7".into(),
        at: Timestamp(40),
    };
    j.append("done", 6, &[hold]).unwrap();
    assert_eq!(
        why(refused(&["done"])),
        ("done".into(), PurgeRefusal::OnHold)
    );
    j.append("done", 7, &[Event::HoldLifted { at: Timestamp(41) }])
        .unwrap();
    assert_eq!(
        stream(&j, "done").len(),
        8,
        "the refused purge wrote nothing"
    );
    j.purge(&["done"], Timestamp(40)).unwrap();
    assert_eq!(
        why(refused(&["done"])),
        ("done".into(), PurgeRefusal::AlreadyPurged)
    );
    drop(j);
    audit_clean(dir.path(), "after the purge");
}

#[test]
fn holes_the_purges_do_not_account_for_are_reported() {
    let purged = |dir: &Path| {
        build(dir);
        let j = journal(dir);
        j.purge(&["done"], Timestamp(40)).unwrap();
    };
    // A commit entry of a record still there deleted behind the journal's back.
    let dir = tempfile::tempdir().unwrap();
    purged(dir.path());
    tamper(dir.path(), |db| {
        db.delete_cf(cf(db, Space::Commits), keys::seq_key(5))
            .unwrap();
    });
    let report = audit(dir.path());
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.kind == ProblemKind::CommitIndex && p.detail.contains("sequence 5")),
        "{:?}",
        report.problems
    );
    assert!(report
        .problems
        .iter()
        .any(|p| p.detail.contains("the purge tombstones account for 6")));
    // The tombstone itself deleted: its stream is gone and nothing accounts for the holes.
    let dir = tempfile::tempdir().unwrap();
    purged(dir.path());
    tamper(dir.path(), |db| {
        db.delete_cf(records_cf(db, "done"), keys::event_key("done", 0))
            .unwrap();
    });
    let report = audit(dir.path());
    assert!(!report.is_clean());
    assert_eq!(report.purged, 0);
    assert!(report
        .problems
        .iter()
        .any(|p| p.kind == ProblemKind::CommitIndex && p.detail.contains("sequences 1..3")));
}

#[test]
fn a_hold_stands_once_at_a_time_and_is_lifted_only_where_one_stands() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let j = journal(dir.path());
    let hold = |reason: &str| Event::Hold {
        reason: reason.into(),
        at: Timestamp(40),
    };
    let lifted = Event::HoldLifted { at: Timestamp(41) };
    // Legal: on a live task and after the end, lifted and placed again.
    j.append("running", 4, &[hold("a"), lifted.clone(), hold("b")])
        .unwrap();
    j.append("done", 6, &[hold("c")]).unwrap();
    // Illegal: a second hold while one stands; a lift where none stands.
    j.append("done", 7, &[hold("d")]).unwrap();
    j.append("later", 0, &[created("later", LeasePolicy::Retry)])
        .unwrap();
    j.append("later", 1, &[lifted]).unwrap();
    drop(j);
    let report = audit(dir.path());
    assert_eq!(
        kinds(&report),
        [
            ("done".into(), Some(7), ProblemKind::Illegal),
            ("later".into(), Some(1), ProblemKind::Illegal)
        ],
        "{:?}",
        report.problems
    );
    let j = Journal::open_read_only(dir.path()).unwrap();
    let view = FoldView::read(&j, "running", |_| {}).unwrap();
    assert_eq!(view.task.unwrap().state.hold.as_deref(), Some("b"));
}

/// A part of a multi-part progress event.
fn part(attempt: u64, id: &str, part_id: &str, last: bool) -> Event {
    Event::PartAppended {
        attempt,
        event_id: id.into(),
        part_id: part_id.into(),
        last,
        kind: "chunk".into(),
        data: vec![b'x'; 300],
        metadata: vec![("k".into(), "v".into())],
        at: Timestamp(11),
    }
}

/// The events of `task`'s stream, read and checked.
fn stream_events(j: &Journal, task: &str) -> Vec<Event> {
    j.read_stream(task, 0)
        .map(|r| r.map(|r| r.event))
        .collect::<Result<_, _>>()
        .unwrap()
}

/// A task's folded state with its position (the stream's length) and its count of trimmed
/// updates left out — what a trim must leave as it was —, and that count.
fn state_but_position(j: &Journal, task: &str) -> (dtask_replay::TaskState, u64) {
    let mut state = dtask_replay::load_task(j, task).unwrap().unwrap().state;
    state.position = 0;
    let trimmed = std::mem::take(&mut state.trimmed);
    (state, trimmed)
}

#[test]
fn a_trimmed_stream_folds_as_before_keeps_its_chain_and_audits_clean() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let j = journal(dir.path());
    // "done" gets more updates before its end: a multi-part event and a heartbeat among
    // them. (Built again: `build` ended it.)
    let mut events = vec![created("long", LeasePolicy::Retry), started(1, 30_000)];
    for n in 0..6 {
        events.push(update(1, &format!("u{n}")));
    }
    events.push(part(1, "p", "1", false));
    events.push(Event::Heartbeat {
        lease_deadline: Timestamp(40_000),
        at: Timestamp(12),
    });
    events.push(part(1, "p", "2", true));
    events.push(update(1, "u6"));
    events.push(completed());
    j.append("long", 0, &events).unwrap();
    let (before, none) = state_but_position(&j, "long");
    assert_eq!(none, 0);
    let (running_before, _) = state_but_position(&j, "running");
    let last_seq = j.last_seq().unwrap();

    // Nine update records (seven updates, two parts); the last two stay whole.
    let trimmed = j.trim_progress("long", 2, Timestamp(50)).unwrap();
    assert_eq!((trimmed.records, trimmed.rewritten), (7, 11));
    assert!(
        trimmed.bytes > 300,
        "the part's bytes at least: {trimmed:?}"
    );
    assert_eq!(j.last_seq().unwrap(), last_seq + 1, "one record appended");
    let after = stream_events(&j, "long");
    assert_eq!(after.len(), events.len() + 1);
    assert!(
        matches!(&after[2], Event::UpdateTrimmed { event_id, part_id, last: true, kind, .. }
        if event_id == "u0" && part_id.is_empty() && kind == "progress")
    );
    assert!(
        matches!(&after[8], Event::UpdateTrimmed { event_id, part_id, last: false, kind, .. }
        if event_id == "p" && part_id == "1" && kind == "chunk")
    );
    assert!(matches!(after[9], Event::Heartbeat { .. }), "untouched");
    assert_eq!(after[10], events[10], "kept whole: the last part");
    assert_eq!(after[11], events[11], "kept whole: the last update");
    assert!(matches!(
        after[13],
        Event::ProgressTrimmed { records: 7, .. }
    ));
    assert_eq!(
        state_but_position(&j, "long"),
        (before.clone(), 7),
        "the same state, seven updates trimmed"
    );

    // A running task: trimmed, then appended to and ended as before.
    assert_eq!(
        j.trim_progress("running", 1, Timestamp(51))
            .unwrap()
            .records,
        1
    );
    j.append("running", 5, &[update(1, "c"), completed()])
        .unwrap();
    let (mut running, trimmed) = state_but_position(&j, "running");
    assert_eq!(trimmed, 1);
    assert_eq!(running.updates, running_before.updates + 1);
    running.updates = running_before.updates;
    assert_eq!(running.status, dtask_replay::Status::Completed);

    // Nothing more to trim: nothing written.
    let last_seq = j.last_seq().unwrap();
    assert_eq!(
        j.trim_progress("long", 2, Timestamp(52)).unwrap().records,
        0
    );
    assert_eq!(j.last_seq().unwrap(), last_seq);
    drop(j);
    let report = audit_clean(dir.path(), "trimmed");
    assert_eq!((report.trimmed, report.trimmed_records), (2, 8));

    // Reopened for writing (the tail marker agrees); trimmed again, to nothing kept; purged.
    let j = journal(dir.path());
    assert_eq!(
        j.trim_progress("long", 0, Timestamp(53)).unwrap().records,
        2
    );
    assert_eq!(
        state_but_position(&j, "long"),
        (before, 9),
        "every update trimmed"
    );
    j.purge(&["long"], Timestamp(54)).unwrap();
    // Compacted: no record a trim replaced comes back (each key keeps one put at a time
    // for the single deletions of moves and purges).
    assert!(j.compact_now().unwrap());
    drop(j);
    let report = audit_clean(dir.path(), "trimmed twice, then purged");
    assert_eq!((report.trimmed, report.purged), (1, 1));
}

#[test]
fn a_trim_is_refused_with_nothing_written_where_it_may_not_go() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let j = journal(dir.path());
    let last_seq = j.last_seq().unwrap();
    let refused = |task: &str| match j.trim_progress(task, 0, Timestamp(50)) {
        Err(dtask_journal::Error::NotTrimmable { why, .. }) => why,
        other => panic!("{task}: {other:?}"),
    };
    assert_eq!(refused("nobody"), dtask_journal::TrimRefusal::Unknown);
    j.append(
        "running",
        4,
        &[Event::Hold {
            reason: "case 7".into(),
            at: Timestamp(40),
        }],
    )
    .unwrap();
    assert_eq!(refused("running"), dtask_journal::TrimRefusal::OnHold);
    j.purge(&["done"], Timestamp(41)).unwrap();
    assert_eq!(refused("done"), dtask_journal::TrimRefusal::Purged);
    // A trim's records are not appended by hand.
    let stub = Event::UpdateTrimmed {
        attempt: 1,
        event_id: "z".into(),
        part_id: String::new(),
        last: true,
        kind: "progress".into(),
        bytes: 70,
        at: Timestamp(42),
    };
    let marker = Event::ProgressTrimmed {
        records: 1,
        bytes: 10,
        digest_before: [0; 32],
        at: Timestamp(42),
    };
    for event in [stub, marker] {
        match j.append("running", 5, &[event]) {
            Err(dtask_journal::Error::NotTrimmable { why, .. }) => {
                assert_eq!(why, dtask_journal::TrimRefusal::AppendedTrim);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        j.last_seq().unwrap(),
        last_seq + 2,
        "the hold and the tombstone only"
    );
}

#[test]
fn trimmed_updates_are_chained_and_accounted_for() {
    // A trimmed update no trim's record accounts for (written as only an import may).
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let j = journal(dir.path());
    let stub = Event::UpdateTrimmed {
        attempt: 1,
        event_id: "c".into(),
        part_id: String::new(),
        last: true,
        kind: "progress".into(),
        bytes: 70,
        at: Timestamp(42),
    };
    let next = j.last_seq().unwrap() + 1;
    futures::executor::block_on(j.submit_at_seq("running", 4, &[stub], next).unwrap()).unwrap();
    drop(j);
    let report = audit(dir.path());
    assert_eq!(
        kinds(&report),
        [("running".into(), Some(4), ProblemKind::Inconsistent)],
        "{:?}",
        report.problems
    );

    // A trimmed update edited, its CRC and its own digest made again: the next record's
    // chain no longer holds.
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let j = journal(dir.path());
    j.append("running", 4, &[update(1, "c")]).unwrap();
    j.trim_progress("running", 1, Timestamp(50)).unwrap();
    drop(j);
    tamper(dir.path(), |db| {
        let events = cf(db, Space::Events);
        let prev = db
            .get_cf(events, keys::event_key("running", 1))
            .unwrap()
            .unwrap();
        let prev = dtask_journal::record::parse(&prev).unwrap();
        let old = db
            .get_cf(events, keys::event_key("running", 2))
            .unwrap()
            .unwrap();
        let old = dtask_journal::record::parse(&old).unwrap();
        let forged = Event::UpdateTrimmed {
            attempt: 1,
            event_id: "a".into(),
            part_id: String::new(),
            last: true,
            kind: "forged".into(),
            bytes: 70,
            at: Timestamp(11),
        };
        let payload = dtask_journal::record::encode_payload(&forged).unwrap();
        let (bytes, _) =
            dtask_journal::record::frame("running", 2, old.seq, &payload, &prev.digest).unwrap();
        db.put_cf(events, keys::event_key("running", 2), bytes)
            .unwrap();
    });
    let report = audit(dir.path());
    assert_eq!(
        kinds(&report),
        [("running".into(), Some(3), ProblemKind::Chain)],
        "{:?}",
        report.problems
    );
}

#[test]
fn a_link_the_other_stream_does_not_name_back_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    let at = Timestamp(5);
    let ended = |task: &str, extra: Vec<Event>| {
        let mut events = vec![
            created(task, LeasePolicy::Retry),
            started(1, 100),
            completed(),
        ];
        events.extend(extra);
        events
    };
    let rerun_as = |task: &str| Event::RerunAs {
        task: task.into(),
        at,
    };
    let rerun_of = |task: &str| Event::RerunOf {
        task: task.into(),
        at,
    };
    let nested = |task: &str, parent: &str| nested_created(task, parent, at);
    // Both ends written: clean.
    j.append("a-old", 0, &ended("a-old", vec![rerun_as("a-new")]))
        .unwrap();
    j.append(
        "a-new",
        0,
        &[created("a-new", LeasePolicy::Retry), rerun_of("a-old")],
    )
    .unwrap();
    let child_created = Event::ChildCreated {
        child_id: "p-kid".into(),
        attempt: 1,
        generation: 1,
        at,
    };
    j.append(
        "p",
        0,
        &[
            created("p", LeasePolicy::Retry),
            started(1, 100),
            child_created,
        ],
    )
    .unwrap();
    j.append("p-kid", 0, &[nested("p-kid", "p")]).unwrap();
    // A rerun's original purged: its rerun still names it, as it should.
    j.append("g-old", 0, &ended("g-old", vec![rerun_as("g-new")]))
        .unwrap();
    j.append(
        "g-new",
        0,
        &[created("g-new", LeasePolicy::Retry), rerun_of("g-old")],
    )
    .unwrap();
    j.purge(&["g-old"], at).unwrap();
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);

    // One end alone: a rerun of a task that does not name it, a rerun no stream names back,
    // a nested task its parent does not name.
    j.append(
        "b-new",
        0,
        &[created("b-new", LeasePolicy::Retry), rerun_of("a-old")],
    )
    .unwrap();
    j.append("c-old", 0, &ended("c-old", vec![rerun_as("c-new")]))
        .unwrap();
    j.append("q-kid", 0, &[nested("q-kid", "p")]).unwrap();
    // A parent whose stream is illegal before it names its child: the illegal record is the
    // finding, not the child's link.
    j.append("r", 0, &[created("r", LeasePolicy::Retry), completed()])
        .unwrap();
    j.append("r-kid", 0, &[nested("r-kid", "r")]).unwrap();
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    assert_eq!(
        kinds(&report),
        [
            ("r".into(), Some(1), ProblemKind::Illegal),
            ("b-new".into(), None, ProblemKind::Inconsistent),
            ("c-old".into(), None, ProblemKind::Inconsistent),
            ("q-kid".into(), None, ProblemKind::Inconsistent),
        ],
        "{:?}",
        report.problems
    );
    let details: Vec<&str> = report.problems.iter().map(|p| p.detail.as_str()).collect();
    assert!(details[1].contains("a rerun of \"a-old\""), "{details:?}");
    assert!(details[2].contains("rerun as \"c-new\""), "{details:?}");
    assert!(details[3].contains("a nested task of \"p\""), "{details:?}");
}

/// The creation of nested task `task` of `parent`, published on create.
fn nested_created(task: &str, parent: &str, at: Timestamp) -> Event {
    Event::CreatedV2 {
        spec: TaskSpec {
            id: task.into(),
            executor_key: "x".into(),
            ..TaskSpec::default()
        }
        .into(),
        policy: LeasePolicy::Retry,
        checkpoint: vec![],
        context_snapshot: vec![],
        publication: dtask_journal::Publication::OnCreate,
        parent_task_id: parent.into(),
        root_session_id: String::new(),
        at,
    }
}

/// A nested task's application notification to its parent (`parent_notified`) is answered by
/// the parent's input of the notification's id; one the parent's mailbox lacks is reported.
#[test]
fn a_notification_to_a_parent_its_mailbox_lacks_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    let at = Timestamp(5);
    let kid = |task: &str| {
        vec![
            nested_created(task, "n", at),
            started(1, 100),
            Event::ParentNotified {
                attempt: 1,
                event_id: "e1".into(),
                kind: "finding".into(),
                data: b"src/a.rs".to_vec(),
                at,
            },
        ]
    };
    let child_created = |child: &str| Event::ChildCreated {
        child_id: child.into(),
        attempt: 1,
        generation: 1,
        at,
    };
    j.append(
        "n",
        0,
        &[
            created("n", LeasePolicy::Retry),
            started(1, 100),
            child_created("n-kid"),
            child_created("n-kid2"),
            Event::InputSent {
                sequence: 1,
                event_id: dtask_journal::application_notification_id("n-kid", "e1"),
                kind: "finding".into(),
                data: b"src/a.rs".to_vec(),
                delivery: dtask_journal::Delivery::Queued,
                at,
            },
        ],
    )
    .unwrap();
    j.append("n-kid", 0, &kid("n-kid")).unwrap();
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);

    // The same notification from a child whose input the parent does not hold.
    j.append("n-kid2", 0, &kid("n-kid2")).unwrap();
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    assert_eq!(
        kinds(&report),
        [("n-kid2".into(), None, ProblemKind::Inconsistent)],
        "{:?}",
        report.problems
    );
    assert!(
        report.problems[0]
            .detail
            .contains("a notification (dtask.custom:"),
        "{:?}",
        report.problems
    );
}

/// The parent's input of a child's application notification must carry what the child's
/// `parent_notified` record does — kind, data and delivery (`parent_notified_v2` for one
/// sent to preempt): one append writes both, so any difference is damage or a forgery.
#[test]
fn a_notification_whose_parent_input_differs_is_reported() {
    use dtask_journal::Delivery::{Preempt, Queued};
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    let at = Timestamp(5);
    // (child, the child's kind and delivery, the parent's input's kind and delivery)
    let cases = [
        ("p-same", ("finding", Queued), ("finding", Queued)),
        ("p-preempt", ("finding", Preempt), ("finding", Preempt)),
        ("p-delivery", ("finding", Preempt), ("finding", Queued)),
        ("p-kind", ("finding", Queued), ("other", Queued)),
    ];
    let mut parent = vec![created("p", LeasePolicy::Retry), started(1, 100)];
    for (child, _, _) in &cases {
        parent.push(Event::ChildCreated {
            child_id: (*child).into(),
            attempt: 1,
            generation: 1,
            at,
        });
    }
    for (sequence, (child, _, (kind, delivery))) in (1..).zip(&cases) {
        parent.push(Event::InputSent {
            sequence,
            event_id: dtask_journal::application_notification_id(child, "e1"),
            kind: (*kind).into(),
            data: b"src/a.rs".to_vec(),
            delivery: *delivery,
            at,
        });
    }
    j.append("p", 0, &parent).unwrap();
    for (child, (kind, delivery), _) in &cases {
        let notified = match delivery {
            Queued => Event::ParentNotified {
                attempt: 1,
                event_id: "e1".into(),
                kind: (*kind).into(),
                data: b"src/a.rs".to_vec(),
                at,
            },
            Preempt => Event::ParentNotifiedV2 {
                attempt: 1,
                event_id: "e1".into(),
                kind: (*kind).into(),
                data: b"src/a.rs".to_vec(),
                delivery: Preempt,
                at,
            },
        };
        j.append(
            child,
            0,
            &[nested_created(child, "p", at), started(1, 100), notified],
        )
        .unwrap();
    }
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    assert_eq!(
        kinds(&report),
        [
            ("p-delivery".into(), None, ProblemKind::Inconsistent),
            ("p-kind".into(), None, ProblemKind::Inconsistent)
        ],
        "{:?}",
        report.problems
    );
    assert!(report
        .problems
        .iter()
        .all(|p| p.detail.contains("another kind, data or delivery")));
}

/// The attempt's fence, for what the fold cannot check without a clock: a write of the
/// running attempt recorded after its lease had ended, or after its cancellation was
/// requested (but for its acknowledgement), is a zombie's — inconsistent. The
/// acknowledgement itself is clean.
#[test]
fn writes_of_an_attempt_past_its_lease_or_told_to_stop_are_inconsistent() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    let cancel = Event::CancelRequested {
        reason: "stop".into(),
        lease_deadline: Some(Timestamp(1_000)),
        direct: false,
        at: Timestamp(15),
    };
    j.append(
        "zombie",
        0,
        &[created("zombie", LeasePolicy::Retry), started(1, 100)],
    )
    .unwrap();
    j.append(
        "zombie",
        2,
        &[Event::Completed {
            data: b"late".to_vec(),
            at: Timestamp(150),
        }],
    )
    .unwrap();
    j.append(
        "stopped",
        0,
        &[
            created("stopped", LeasePolicy::Retry),
            started(1, 1_000),
            cancel.clone(),
        ],
    )
    .unwrap();
    j.append("stopped", 3, &[update(1, "e1"), completed()])
        .unwrap();
    j.append(
        "acked",
        0,
        &[
            created("acked", LeasePolicy::Retry),
            started(1, 1_000),
            cancel,
            Event::Canceled {
                reason: "stop".into(),
                at: Timestamp(20),
            },
        ],
    )
    .unwrap();
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    assert_eq!(
        kinds(&report),
        [
            ("stopped".into(), Some(3), ProblemKind::Inconsistent),
            ("stopped".into(), Some(4), ProblemKind::Inconsistent),
            ("zombie".into(), Some(2), ProblemKind::Inconsistent),
        ]
    );
    assert!(
        report.problems[2].detail.contains("lease had ended"),
        "{}",
        report.problems[2]
    );
    assert!(
        report.problems[0]
            .detail
            .contains("cancellation was requested"),
        "{}",
        report.problems[0]
    );
    // Trimmed, the zombie's update is still the zombie's: its stand-in keeps attempt and time.
    let trimmed = j.trim_progress("stopped", 0, Timestamp(2_000)).unwrap();
    assert_eq!(trimmed.records, 1);
    let again = audit_journal(&j, &mut |_| {}).unwrap();
    assert!(
        again
            .problems
            .iter()
            .any(|p| p.task == "stopped" && p.position == Some(3)),
        "{:?}",
        again.problems
    );
}

/// An application notification is sent by the running attempt only, and every part of an
/// update is named: either recorded otherwise is inconsistent.
#[test]
fn a_notification_after_the_end_and_a_nameless_part_are_inconsistent() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path());
    j.append(
        "late",
        0,
        &[
            created("late", LeasePolicy::Retry),
            started(1, 1_000),
            completed(),
            notify("late:3:completed", 3),
            Event::NotificationEnqueued {
                id: dtask_journal::application_notification_id("late", "e1"),
                event_id: "e1".into(),
                kind: "note".into(),
                data: vec![],
                version: 3,
                at: Timestamp(30),
            },
        ],
    )
    .unwrap();
    j.append(
        "parts",
        0,
        &[
            created("parts", LeasePolicy::Retry),
            started(1, 1_000),
            Event::PartAppended {
                attempt: 1,
                event_id: "e".into(),
                part_id: String::new(),
                last: false,
                kind: "progress".into(),
                data: b"1".to_vec(),
                metadata: vec![],
                at: Timestamp(11),
            },
        ],
    )
    .unwrap();
    let report = audit_journal(&j, &mut |_| {}).unwrap();
    assert_eq!(
        kinds(&report),
        [
            ("late".into(), Some(4), ProblemKind::Inconsistent),
            ("parts".into(), Some(2), ProblemKind::Inconsistent),
        ]
    );
}

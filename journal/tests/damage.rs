//! Real damage on a real RocksDB journal: each kind of tampering is reported with the exact
//! task, position and kind of damage.
#![allow(clippy::unwrap_used)]

use dtask_journal::keys::{self, Space};
use dtask_journal::{
    CorruptionKind, Error, Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp,
};
use std::path::Path;

fn created(task: &str) -> Event {
    Event::Created {
        spec: TaskSpec {
            id: task.into(),
            executor_key: "x".into(),
            ..TaskSpec::default()
        },
        policy: LeasePolicy::Retry,
        checkpoint: vec![],
        context_snapshot: vec![],
        at: Timestamp(1),
    }
}

fn heartbeat(i: u64) -> Event {
    Event::Heartbeat {
        lease_deadline: Timestamp(1000 + i),
        at: Timestamp(i),
    }
}

/// A journal with task "victim" of 6 records and task "bystander" of 3.
fn build(dir: &Path) {
    let journal = Journal::open(dir, JournalOptions::default()).unwrap();
    journal.append("victim", 0, &[created("victim")]).unwrap();
    journal
        .append("bystander", 0, &[created("bystander")])
        .unwrap();
    for i in 1..6 {
        journal.append("victim", i, &[heartbeat(i)]).unwrap();
    }
    journal
        .append("bystander", 1, &[heartbeat(1), heartbeat(2)])
        .unwrap();
}

/// Opens the raw database and applies `f` to it.
fn tamper(dir: &Path, f: impl FnOnce(&rocksdb::DB)) {
    let cfs: Vec<_> = Space::ALL.iter().map(|s| s.name()).collect();
    let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir, cfs).unwrap();
    f(&db);
}

fn events_cf(db: &rocksdb::DB) -> &rocksdb::ColumnFamily {
    db.cf_handle(Space::Events.name()).unwrap()
}

/// Flips one bit of byte `at` of `task`'s record at `position`.
fn flip(db: &rocksdb::DB, task: &str, position: u64, at: usize) {
    let key = keys::event_key(task, position);
    let mut value = db.get_cf(events_cf(db), &key).unwrap().unwrap();
    value[at] ^= 0x40;
    db.put_cf(events_cf(db), &key, value).unwrap();
}

/// Every error reading `task`, as (position, kind).
fn problems(dir: &Path, task: &str) -> Vec<(u64, CorruptionKind)> {
    let journal = Journal::open_read_only(dir).unwrap();
    bulk_reads_agree(&journal, task);
    journal
        .read_stream(task, 0)
        .filter_map(Result::err)
        .map(|e| match e {
            Error::Corruption {
                task: t,
                position,
                kind,
            } => {
                assert_eq!(t, task);
                (position, kind)
            }
            other => panic!("unexpected error {other}"),
        })
        .collect()
}

/// The bulk reader reports exactly what `read_stream` reports, for every task of the journal
/// (read in one pass, in id order) and for `task`.
fn bulk_reads_agree(journal: &Journal, task: &str) {
    let mut names: Vec<String> = journal
        .tasks()
        .filter_map(|t| t.ok().map(|t| t.0))
        .collect();
    names.push(task.to_owned());
    names.sort();
    names.dedup();
    // Reading every task in turn finds the same tasks with the same records.
    let mut scanner = journal.stream_scanner();
    let mut stream = dtask_journal::RawStream::default();
    let mut every = Vec::new();
    while scanner.read_next(&mut stream) {
        let records: Vec<String> = stream.fold_records().map(|r| format!("{r:?}")).collect();
        let direct: Vec<String> = journal
            .read_stream(stream.task(), 0)
            .map(|r| format!("{r:?}"))
            .collect();
        let lean = direct.iter().all(|r| !r.contains("UpdateAppended"));
        if lean {
            assert_eq!(records, direct, "task {:?}", stream.task());
        }
        every.push(stream.task().to_owned());
    }
    let listed: Vec<String> = journal.task_ids().map(Result::unwrap).collect();
    assert_eq!(every, listed);
    let mut scanner = journal.stream_scanner();
    for name in &names {
        let bulk: Vec<String> = scanner
            .read(name)
            .into_records()
            .map(|r| format!("{r:?}"))
            .collect();
        let direct: Vec<String> = journal
            .read_stream(name, 0)
            .map(|r| format!("{r:?}"))
            .collect();
        assert_eq!(bulk, direct, "task {name:?}");
    }
}

#[test]
fn an_intact_journal_reads_clean() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    assert!(problems(dir.path(), "victim").is_empty());
    assert!(problems(dir.path(), "bystander").is_empty());
}

#[test]
fn a_flipped_byte_is_a_checksum_error_at_its_position() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    tamper(dir.path(), |db| flip(db, "victim", 3, 25));
    let found = problems(dir.path(), "victim");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, 3);
    assert!(matches!(found[0].1, CorruptionKind::Checksum { .. }));
    assert!(problems(dir.path(), "bystander").is_empty());
}

#[test]
fn a_truncated_record_is_reported_as_truncated() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    tamper(dir.path(), |db| {
        let key = keys::event_key("victim", 2);
        let value = db.get_cf(events_cf(db), &key).unwrap().unwrap();
        db.put_cf(events_cf(db), &key, &value[..value.len() - 7])
            .unwrap();
    });
    let found = problems(dir.path(), "victim");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, 2);
    assert!(matches!(found[0].1, CorruptionKind::Truncated { .. }));
}

#[test]
fn a_deleted_middle_record_is_reported_missing() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    tamper(dir.path(), |db| {
        db.delete_cf(events_cf(db), keys::event_key("victim", 2))
            .unwrap();
    });
    let found = problems(dir.path(), "victim");
    assert_eq!(found, vec![(2, CorruptionKind::Missing)]);
}

#[test]
fn a_deleted_last_record_is_reported_by_the_commit_index() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    tamper(dir.path(), |db| {
        db.delete_cf(events_cf(db), keys::event_key("victim", 5))
            .unwrap();
    });
    // The stream alone ends cleanly one record early (nothing after it says otherwise) ...
    assert!(problems(dir.path(), "victim").is_empty());
    let journal = Journal::open_read_only(dir.path()).unwrap();
    assert_eq!(journal.head("victim").unwrap().unwrap().next_position, 5);
    // ... but the commit index still names the record, and says where it is missing.
    let errors: Vec<(String, u64, CorruptionKind)> = journal
        .commits(1)
        .filter_map(Result::err)
        .map(|e| match e {
            Error::Corruption {
                task,
                position,
                kind,
            } => (task, position, kind),
            other => panic!("unexpected error {other}"),
        })
        .collect();
    assert_eq!(
        errors,
        vec![("victim".to_owned(), 5, CorruptionKind::Missing)]
    );
}

#[test]
fn a_damaged_last_record_fails_the_head_but_not_the_stream_length() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    tamper(dir.path(), |db| flip(db, "victim", 5, 30));
    let journal = Journal::open_read_only(dir.path()).unwrap();
    assert!(matches!(
        journal.head("victim"),
        Err(Error::Corruption { position: 5, .. })
    ));
    assert_eq!(journal.stream_len("victim").unwrap(), Some(6));
    assert_eq!(journal.stream_len("nobody").unwrap(), None);
    // Listing ids goes on past it; listing heads names it and goes on too.
    assert_eq!(journal.task_ids().count(), 2);
    let heads: Vec<_> = journal.tasks().collect();
    assert!(matches!(heads[0], Ok((ref t, _)) if t == "bystander"));
    assert!(matches!(heads[1], Err(Error::Corruption { ref task, .. }) if task == "victim"));
}

#[test]
fn a_key_that_names_no_task_is_reported_and_the_listing_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    tamper(dir.path(), |db| {
        // Between "bystander" and "victim", too short to hold a separator and a position.
        db.put_cf(events_cf(db), b"c", b"junk").unwrap();
    });
    let journal = Journal::open_read_only(dir.path()).unwrap();
    let ids: Vec<_> = journal.task_ids().collect();
    assert!(matches!(&ids[0], Ok(t) if t == "bystander"));
    assert!(matches!(
        &ids[1],
        Err(Error::Corruption { task, kind: CorruptionKind::Key(_), .. }) if task == "c"
    ));
    assert!(matches!(&ids[2], Ok(t) if t == "victim"));
    assert_eq!(ids.len(), 3);
    let mut scanner = journal.stream_scanner();
    let mut stream = dtask_journal::RawStream::default();
    let mut seen = Vec::new();
    while scanner.read_next(&mut stream) {
        let errors = stream.fold_records().filter(Result::is_err).count();
        seen.push((stream.task().to_owned(), stream.len(), errors));
    }
    assert_eq!(
        seen,
        [
            ("bystander".to_owned(), 3, 0),
            ("c".to_owned(), 0, 1),
            ("victim".to_owned(), 6, 0)
        ]
    );
}

#[test]
fn swapped_records_are_reported_misplaced() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    tamper(dir.path(), |db| {
        let (a, b) = (keys::event_key("victim", 2), keys::event_key("victim", 4));
        let va = db.get_cf(events_cf(db), &a).unwrap().unwrap();
        let vb = db.get_cf(events_cf(db), &b).unwrap().unwrap();
        db.put_cf(events_cf(db), &a, vb).unwrap();
        db.put_cf(events_cf(db), &b, va).unwrap();
    });
    let found = problems(dir.path(), "victim");
    assert_eq!(
        found,
        vec![
            (2, CorruptionKind::Misplaced { found: 4 }),
            (4, CorruptionKind::Misplaced { found: 2 }),
        ]
    );
}

#[test]
fn a_record_edited_with_a_valid_checksum_breaks_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    tamper(dir.path(), |db| {
        // Re-frame another event at position 1 chaining from a wrong digest: the CRC is
        // valid, only the chain can tell.
        let payload = dtask_journal::record::encode_payload(&heartbeat(99)).unwrap();
        let (bytes, _) =
            dtask_journal::record::frame("victim", 1, 3, &payload, &dtask_journal::Digest([7; 32]))
                .unwrap();
        db.put_cf(events_cf(db), keys::event_key("victim", 1), bytes)
            .unwrap();
    });
    let found = problems(dir.path(), "victim");
    // Position 1 fails the chain; position 2 chains from the original digest of position 1,
    // which the edit replaced.
    assert_eq!(found[0], (1, CorruptionKind::Chain));
    assert!(found.iter().all(|(p, _)| *p <= 2), "{found:?}");
}

#[test]
fn a_record_transplanted_from_another_task_breaks_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    tamper(dir.path(), |db| {
        let theirs = db
            .get_cf(events_cf(db), keys::event_key("bystander", 1))
            .unwrap()
            .unwrap();
        db.put_cf(events_cf(db), keys::event_key("victim", 1), theirs)
            .unwrap();
    });
    let found = problems(dir.path(), "victim");
    assert_eq!(found[0], (1, CorruptionKind::Chain));
}

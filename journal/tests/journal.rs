//! Journal behaviour on a real RocksDB: appends, conflicts, limits, concurrency, reopen,
//! read-only and follower opens, the format version.
#![allow(clippy::unwrap_used)]

mod strategies;

use dtask_journal::keys::Space;
use dtask_journal::{
    Durability, Error, Event, EventType, Journal, JournalOptions, Limit, RecordFormat, Timestamp,
};
use std::sync::{Arc, Barrier};
use strategies::{created, update};

#[test]
fn many_writers_then_reopen_every_stream_complete_and_in_order() {
    const TASKS: u64 = 64;
    const APPENDS: u64 = 1_000;
    let dir = tempfile::tempdir().unwrap();
    {
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        let threads: Vec<_> = (0..TASKS)
            .map(|t| {
                let journal = journal.clone();
                std::thread::spawn(move || {
                    let task = format!("task-{t:03}");
                    for i in 0..APPENDS {
                        let appended = journal.append(&task, i, &[update(i)]).unwrap();
                        assert_eq!(appended.next_position, i + 1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let mut seqs = Vec::new();
    for t in 0..TASKS {
        let task = format!("task-{t:03}");
        let records: Vec<_> = journal
            .read_stream(&task, 0)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(records.len() as u64, APPENDS);
        for (i, rec) in records.iter().enumerate() {
            assert_eq!(rec.position, i as u64);
            assert_eq!(rec.event, update(i as u64));
            seqs.push(rec.seq);
        }
    }
    seqs.sort_unstable();
    let expected: Vec<u64> = (1..=TASKS * APPENDS).collect();
    assert_eq!(seqs, expected, "global sequences are dense and unique");
    assert_eq!(journal.last_seq().unwrap(), TASKS * APPENDS);
    // The global commit order agrees with each stream's order.
    let mut last_pos = std::collections::HashMap::new();
    for c in journal.commits(1) {
        let c = c.unwrap();
        let prev = last_pos.insert(c.task.clone(), c.record.position);
        assert_eq!(prev.map_or(0, |p| p + 1), c.record.position);
    }
    assert_eq!(journal.tasks().count() as u64, TASKS);
}

#[test]
fn readers_racing_appends_see_a_clean_prefix() {
    // A reader takes the records, then the head: appends landing in between must not look
    // like damage, and a reader sees a prefix of the stream, never a gap.
    const APPENDS: u64 = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    journal.append("t", 0, &[created("t")]).unwrap();
    let writer = {
        let journal = journal.clone();
        std::thread::spawn(move || {
            for i in 1..=APPENDS {
                journal.append("t", i, &[update(i)]).unwrap();
            }
        })
    };
    let mut reads = 0_u64;
    let mut longest = 0;
    while !writer.is_finished() || reads == 0 {
        let records: Vec<_> = journal
            .read_stream("t", 0)
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("read {reads} saw damage: {e}"));
        for (i, record) in records.iter().enumerate() {
            assert_eq!(record.position, i as u64);
        }
        assert!(records.len() >= longest, "a later read saw fewer records");
        assert!(records.last().unwrap().seq <= journal.durable_seq());
        longest = records.len();
        reads += 1;
    }
    writer.join().unwrap();
    assert_eq!(journal.read_stream("t", 0).count() as u64, APPENDS + 1);
}

#[test]
fn racing_appends_at_one_position_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(
        dir.path(),
        JournalOptions::default().with_durability(Durability::Buffered),
    )
    .unwrap();
    for round in 0..100 {
        let task = format!("race-{round}");
        let barrier = Arc::new(Barrier::new(2));
        let handles: Vec<_> = (0..2)
            .map(|i| {
                let journal = journal.clone();
                let barrier = Arc::clone(&barrier);
                let task = task.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    journal.append(&task, 0, &[update(i)])
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let wins = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(wins, 1, "round {round}: {results:?}");
        let loser = results.into_iter().find(Result::is_err).unwrap();
        assert!(matches!(
            loser,
            Err(Error::Conflict {
                expected: 0,
                actual: 1,
                ..
            })
        ));
        assert_eq!(journal.read_stream(&task, 0).count(), 1);
    }
}

/// After a reopen the records are in table files, where a task's first append looks for its
/// first record through the `events` space's Bloom filters: every task there is refused a
/// second creation — finished or not, the only one of its table file or not — and new ids
/// that sort between them are created; `contains_task` tells the two apart, in the table
/// files and in the memtable.
#[test]
fn a_task_in_the_table_files_is_not_created_twice_and_new_ones_between_them_are() {
    let dir = tempfile::tempdir().unwrap();
    {
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        for t in 0..500u64 {
            let task = format!("task-{:04}", 2 * t);
            journal.append(&task, 0, &[created(&task)]).unwrap();
            journal.append(&task, 1, &[update(t)]).unwrap();
        }
    }
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    for t in 0..500u64 {
        let task = format!("task-{:04}", 2 * t);
        let new = format!("task-{:04}", 2 * t + 1);
        // Found in a table file whose blocks may not be cached yet, and absent between.
        assert!(journal.contains_task(&task).unwrap(), "{task}");
        assert!(!journal.contains_task(&new).unwrap(), "{new}");
        let err = journal.append(&task, 0, &[created(&task)]).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Conflict {
                    expected: 0,
                    actual: 2,
                    ..
                }
            ),
            "{task}: {err:?}"
        );
        journal.append(&new, 0, &[created(&new)]).unwrap();
        // Found in the memtable now.
        assert!(journal.contains_task(&new).unwrap(), "{new}");
    }
    assert_eq!(journal.task_ids().count(), 1_000);
}

/// Task ids of every length a job may carry — held in place by the append up to 56 bytes,
/// on the heap beyond — are written, cached and refused alike: appends from many writers at
/// once (one batch) and one after the other, a conflict naming the whole id, and the
/// streams read back complete after a reopen.
#[test]
fn task_ids_short_and_long_append_and_conflict_alike() {
    let ids: Vec<String> = [1, 55, 56, 57, 64, 200, 1_000]
        .iter()
        .map(|len| format!("{len:04}").repeat(len / 4 + 1)[..*len].to_owned())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    {
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        let barrier = Arc::new(Barrier::new(ids.len()));
        let handles: Vec<_> = ids
            .iter()
            .cloned()
            .map(|task| {
                let journal = journal.clone();
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    barrier.wait();
                    journal.append(&task, 0, &[created(&task)]).unwrap();
                    for i in 1..4 {
                        journal.append(&task, i, &[update(i)]).unwrap();
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
        for task in &ids {
            match journal.append(task, 2, &[update(9)]).unwrap_err() {
                Error::Conflict {
                    task: named,
                    expected: 2,
                    actual: 4,
                } => assert_eq!(&named, task),
                other => panic!("{} bytes: {other:?}", task.len()),
            }
        }
    }
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    for task in &ids {
        let records: Vec<_> = journal
            .read_stream(task, 0)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(records.len(), 4, "{} bytes", task.len());
        assert_eq!(records[0].event, created(task));
        assert_eq!(journal.head(task).unwrap().unwrap().next_position, 4);
    }
    assert_eq!(journal.last_seq().unwrap(), 4 * ids.len() as u64);
}

#[test]
fn a_stale_expected_position_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    journal.append("t", 0, &[created("t")]).unwrap();
    let err = journal.append("t", 0, &[update(1), update(2)]).unwrap_err();
    assert!(matches!(
        err,
        Error::Conflict {
            expected: 0,
            actual: 1,
            ..
        }
    ));
    let err = journal.append("t", 5, &[update(1)]).unwrap_err();
    assert!(matches!(
        err,
        Error::Conflict {
            expected: 5,
            actual: 1,
            ..
        }
    ));
    assert_eq!(journal.read_stream("t", 0).count(), 1);
    assert_eq!(journal.head("t").unwrap().unwrap().next_position, 1);
    assert_eq!(journal.last_seq().unwrap(), 1);
}

#[test]
fn bad_input_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(
        dir.path(),
        JournalOptions::default().with_max_value_bytes(1024),
    )
    .unwrap();
    let big = Event::Completed {
        data: vec![0; 1025],
        at: Timestamp(1),
    };
    let err = journal.append("t", 0, &[created("t"), big]).unwrap_err();
    assert!(matches!(
        err,
        Error::TooLarge {
            limit: Limit::Value,
            size: 1025,
            max: 1024
        }
    ));
    assert!(matches!(
        journal.append("", 0, &[created("")]),
        Err(Error::InvalidTaskId(_))
    ));
    assert!(matches!(
        journal.append("a\0b", 0, &[created("a")]),
        Err(Error::InvalidTaskId(_))
    ));
    assert!(matches!(
        journal.append("t", 0, &[]),
        Err(Error::EmptyAppend)
    ));
    let long = "x".repeat(1025);
    assert!(matches!(
        journal.append(&long, 0, &[created("x")]),
        Err(Error::TooLarge {
            limit: Limit::TaskId,
            ..
        })
    ));
    assert_eq!(journal.tasks().count(), 0);
    assert_eq!(journal.last_seq().unwrap(), 0);
    // Exactly at the limit is accepted.
    let fits = Event::Completed {
        data: vec![0; 1024],
        at: Timestamp(1),
    };
    journal.append("t", 0, &[created("t"), fits]).unwrap();
}

#[test]
fn the_live_index_and_outbox_follow_the_events() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    journal.append("a", 0, &[created("a")]).unwrap();
    journal.append("b", 0, &[created("b")]).unwrap();
    let appended = journal
        .append(
            "a",
            1,
            &[
                Event::Completed {
                    data: vec![],
                    at: Timestamp(2),
                },
                Event::NotificationEnqueued {
                    id: "a:2:completed".into(),
                    event_id: String::new(),
                    kind: "completed".into(),
                    data: vec![],
                    version: 2,
                    at: Timestamp(2),
                },
            ],
        )
        .unwrap();
    let live: Vec<_> = journal.live_tasks().collect::<Result<_, _>>().unwrap();
    assert_eq!(live, vec!["b".to_string()]);
    assert!(journal.head("a").unwrap().unwrap().terminal);
    let outbox: Vec<_> = journal.outbox().collect::<Result<_, _>>().unwrap();
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox[0].task, "a");
    assert_eq!(outbox[0].record.seq, appended.last_seq);
    // The index's entries alone, from a sequence on, and one entry's record by its sequence.
    let entries: Vec<_> = journal.outbox_entries(0).collect::<Result<_, _>>().unwrap();
    assert_eq!(
        entries,
        [dtask_journal::OutboxEntry {
            seq: appended.last_seq,
            task: "a".into(),
            position: 2
        }]
    );
    assert_eq!(journal.outbox_entries(appended.last_seq).count(), 0);
    assert_eq!(
        journal.outbox_entries(appended.last_seq - 1).count(),
        1,
        "the entries above the sequence given"
    );
    assert_eq!(
        journal.queued(appended.last_seq).unwrap(),
        Some(outbox[0].clone())
    );
    assert_eq!(
        journal.queued(appended.last_seq - 1).unwrap(),
        None,
        "not an enqueue"
    );
    journal
        .append(
            "a",
            3,
            &[Event::NotificationAcked {
                id: "a:2:completed".into(),
                enqueued_seq: appended.last_seq,
                at: Timestamp(3),
            }],
        )
        .unwrap();
    assert_eq!(journal.outbox().count(), 0);
    assert_eq!(journal.outbox_entries(0).count(), 0);
    assert_eq!(
        journal.queued(appended.last_seq).unwrap(),
        None,
        "acknowledged"
    );
}

#[test]
fn read_only_and_follower_see_a_live_writer() {
    let dir = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let writer = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    writer.append("t", 0, &[created("t")]).unwrap();

    assert_eq!(writer.durable_seq(), 1);

    let reader = Journal::open_read_only(dir.path()).unwrap();
    // A reader cannot know its writer's syncs: it sees what the database holds.
    assert_eq!(reader.durable_seq(), u64::MAX);
    assert_eq!(reader.read_stream("t", 0).count(), 1);
    assert!(matches!(
        reader.append("t", 1, &[update(1)]),
        Err(Error::ReadOnly)
    ));

    let follower = Journal::open_follower(dir.path(), scratch.path()).unwrap();
    assert_eq!(follower.read_stream("t", 0).count(), 1);
    writer.append("t", 1, &[update(1)]).unwrap();
    follower.catch_up().unwrap();
    let types: Vec<_> = follower
        .read_stream("t", 0)
        .map(|r| r.unwrap().event.event_type())
        .collect();
    assert_eq!(types, vec![EventType::Created, EventType::UpdateAppended]);
}

#[test]
fn a_reopened_writer_starts_with_everything_durable() {
    let dir = tempfile::tempdir().unwrap();
    {
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        journal
            .append("t", 0, &[created("t"), update(1), update(2)])
            .unwrap();
    }
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    assert_eq!(journal.durable_seq(), 3);
    assert_eq!(journal.read_stream("t", 0).count(), 3);
    assert_eq!(journal.commits(0).count(), 3);
    journal.append("t", 3, &[update(3)]).unwrap();
    assert_eq!(journal.durable_seq(), 4);
}

#[test]
fn a_newer_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(Journal::open(dir.path(), JournalOptions::default()).unwrap());
    {
        let cfs: Vec<_> = dtask_journal::keys::COLUMN_FAMILIES.to_vec();
        let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir.path(), cfs).unwrap();
        set_format_version(&db, 10);
    }
    let err = Journal::open(dir.path(), JournalOptions::default()).unwrap_err();
    assert!(matches!(
        err,
        Error::UnsupportedFormat {
            found: 10,
            supported: 9
        }
    ));
    assert!(matches!(
        Journal::open_read_only(dir.path()),
        Err(Error::UnsupportedFormat { found: 10, .. })
    ));
}

/// Formats 5 to 6, 6 to 7, 7 to 8 and 8 to 9 change the version alone: a format-5 journal
/// (SHA-256 framing) opened for writing is stamped 9 and keeps its framing; its records read
/// and chain as before.
#[test]
fn a_format_5_journal_is_stamped_9_and_keeps_its_framing() {
    let dir = tempfile::tempdir().unwrap();
    {
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        journal.append("t", 0, &[created("t")]).unwrap();
        assert_eq!(journal.record_format(), dtask_journal::RecordFormat::SHA256);
    }
    {
        let cfs: Vec<_> = dtask_journal::keys::COLUMN_FAMILIES.to_vec();
        let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir.path(), cfs).unwrap();
        set_format_version(&db, 5);
    }
    assert_eq!(
        Journal::open_read_only(dir.path())
            .unwrap()
            .format_version(),
        5
    );
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    assert_eq!(journal.format_version(), 9);
    assert_eq!(journal.record_format(), dtask_journal::RecordFormat::SHA256);
    journal.append("t", 1, &[update(1)]).unwrap();
    assert_eq!(
        journal
            .read_stream("t", 0)
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn reading_from_a_middle_position_still_checks_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    journal.append("t", 0, &[created("t")]).unwrap();
    for i in 1..5 {
        journal.append("t", i, &[update(i)]).unwrap();
    }
    let tail: Vec<_> = journal
        .read_stream("t", 3)
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        tail.iter().map(|r| r.position).collect::<Vec<_>>(),
        vec![3, 4]
    );
    assert_eq!(journal.read_stream("unknown", 0).count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_appends_group_commit() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let mut handles = Vec::new();
    for t in 0..32 {
        let journal = journal.clone();
        handles.push(tokio::spawn(async move {
            let task = format!("t{t}");
            for i in 0..20 {
                journal.append_async(&task, i, &[update(i)]).await.unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    assert_eq!(journal.last_seq().unwrap(), 32 * 20);
}

/// Stores `version` as the journal's format version, behind the journal's back.
fn set_format_version(db: &rocksdb::DB, version: u32) {
    let meta = db.cf_handle(Space::Meta.name()).unwrap();
    db.put_cf(
        meta,
        dtask_journal::keys::META_FORMAT_VERSION,
        version.to_be_bytes(),
    )
    .unwrap();
}

/// The options of a journal framed as every journal before format 5 was.
fn blake3() -> JournalOptions {
    JournalOptions::default().with_record_format(RecordFormat::BLAKE3)
}

/// Rewrites a journal of this build made with [`blake3`] into what format 4 stored: version 4
/// and no record framing in `meta`.
fn make_format_4(dir: &std::path::Path) {
    let db = rocksdb::DB::open_cf(
        &rocksdb::Options::default(),
        dir,
        dtask_journal::keys::COLUMN_FAMILIES,
    )
    .unwrap();
    set_format_version(&db, 4);
    let meta = db.cf_handle(Space::Meta.name()).unwrap();
    db.delete_cf(meta, dtask_journal::keys::META_RECORD_FORMAT)
        .unwrap();
}

/// The journal in `dir`, opened read-only as a plain RocksDB database.
fn raw(dir: &std::path::Path) -> rocksdb::DB {
    rocksdb::DB::open_cf_for_read_only(
        &rocksdb::Options::default(),
        dir,
        dtask_journal::keys::COLUMN_FAMILIES,
        false,
    )
    .unwrap()
}

/// The version byte of every record in the `events` space, in key order.
fn framings(dir: &std::path::Path) -> Vec<u8> {
    let db = raw(dir);
    let events = db.cf_handle(Space::Events.name()).unwrap();
    db.iterator_cf(events, rocksdb::IteratorMode::Start)
        .map(|item| item.unwrap().1[0])
        .collect()
}

/// The record framing named in `meta`, if any.
fn meta_framing(dir: &std::path::Path) -> Option<Vec<u8>> {
    let db = raw(dir);
    let meta = db.cf_handle(Space::Meta.name()).unwrap();
    db.get_cf(meta, dtask_journal::keys::META_RECORD_FORMAT)
        .unwrap()
}

#[test]
fn a_new_journal_frames_its_records_in_sha256_and_an_upgraded_one_keeps_blake3() {
    // A new journal names its framing and frames every record so; the option names the
    // framing of a new journal only.
    let dir = tempfile::tempdir().unwrap();
    {
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        assert_eq!(
            journal.format_version(),
            dtask_journal::JOURNAL_FORMAT_VERSION
        );
        assert_eq!(journal.record_format(), RecordFormat::SHA256);
        journal.append("t", 0, &[created("t")]).unwrap();
    }
    {
        let journal = Journal::open(dir.path(), blake3()).unwrap();
        assert_eq!(journal.record_format(), RecordFormat::SHA256);
        journal.append("t", 1, &[update(1)]).unwrap();
    }
    assert_eq!(framings(dir.path()), [2, 2]);
    assert_eq!(meta_framing(dir.path()), Some(vec![2]));

    // A format-4 journal: BLAKE3 records, no framing named.
    let old = tempfile::tempdir().unwrap();
    {
        let journal = Journal::open(old.path(), blake3()).unwrap();
        assert_eq!(journal.record_format(), RecordFormat::BLAKE3);
        journal.append("t", 0, &[created("t")]).unwrap();
        journal.append("t", 1, &[update(1)]).unwrap();
    }
    make_format_4(old.path());
    let reader = Journal::open_read_only(old.path()).unwrap();
    assert_eq!(reader.format_version(), 4);
    assert_eq!(reader.record_format(), RecordFormat::BLAKE3);
    assert_eq!(reader.read_stream("t", 0).count(), 2);
    drop(reader);
    assert_eq!(meta_framing(old.path()), None);
    // A writer upgrades it to format 5, names the framing its records have and goes on
    // with it: the stream chains on across the upgrade.
    let journal = Journal::open(old.path(), JournalOptions::default()).unwrap();
    assert_eq!(
        journal.format_version(),
        dtask_journal::JOURNAL_FORMAT_VERSION
    );
    assert_eq!(journal.record_format(), RecordFormat::BLAKE3);
    journal.append("t", 2, &[update(2)]).unwrap();
    let records: Vec<_> = journal.read_stream("t", 0).map(Result::unwrap).collect();
    assert_eq!(records.len(), 3);
    assert_eq!(
        journal.head("t").unwrap().unwrap().last_digest,
        records[2].digest
    );
    drop(journal);
    assert_eq!(framings(old.path()), [1, 1, 1]);
    assert_eq!(meta_framing(old.path()), Some(vec![1]));
    let journal = Journal::open(old.path(), JournalOptions::default()).unwrap();
    assert_eq!(journal.read_stream("t", 0).count(), 3);
    drop(journal);

    // A framing this build does not read, named in `meta`, is refused at open.
    {
        let db = rocksdb::DB::open_cf(
            &rocksdb::Options::default(),
            old.path(),
            dtask_journal::keys::COLUMN_FAMILIES,
        )
        .unwrap();
        let meta = db.cf_handle(Space::Meta.name()).unwrap();
        db.put_cf(meta, dtask_journal::keys::META_RECORD_FORMAT, [9])
            .unwrap();
    }
    assert!(matches!(
        Journal::open_read_only(old.path()),
        Err(Error::NotAJournal(why)) if why.contains("record format version 9")
    ));
    assert!(matches!(
        Journal::open(old.path(), JournalOptions::default()),
        Err(Error::NotAJournal(_))
    ));
}

/// Rewrites a format-2 journal into what format 1 stored: version 1 and a `heads` space.
fn make_format_1(dir: &std::path::Path) {
    let mut opts = rocksdb::Options::default();
    opts.create_missing_column_families(true);
    let cfs: Vec<_> = dtask_journal::keys::COLUMN_FAMILIES
        .into_iter()
        .chain([dtask_journal::keys::LEGACY_HEADS])
        .collect();
    let db = rocksdb::DB::open_cf(&opts, dir, cfs).unwrap();
    set_format_version(&db, 1);
    for key in [
        dtask_journal::keys::META_TAIL,
        dtask_journal::keys::META_RECORD_FORMAT,
    ] {
        db.delete_cf(db.cf_handle(Space::Meta.name()).unwrap(), key)
            .unwrap();
    }
    // A stale head, as if format 1 had stopped counting: format 2 must not trust it.
    let heads = db.cf_handle(dtask_journal::keys::LEGACY_HEADS).unwrap();
    db.put_cf(heads, b"t", [0u8; 54]).unwrap();
}

fn reader_tail(dir: &std::path::Path) -> Option<dtask_journal::Tail> {
    Journal::open_read_only(dir).unwrap().read_tail().unwrap()
}

fn column_families(dir: &std::path::Path) -> Vec<String> {
    rocksdb::DB::list_cf(&rocksdb::Options::default(), dir).unwrap()
}

#[test]
fn a_format_1_journal_is_read_as_is_and_upgraded_when_opened_for_writing() {
    let dir = tempfile::tempdir().unwrap();
    {
        let journal = Journal::open(dir.path(), blake3()).unwrap();
        journal.append("t", 0, &[created("t")]).unwrap();
        journal.append("t", 1, &[update(1), update(2)]).unwrap();
    }
    make_format_1(dir.path());
    assert!(column_families(dir.path()).contains(&"heads".to_owned()));

    // Readers read it as it is, and leave it so.
    let reader = Journal::open_read_only(dir.path()).unwrap();
    assert_eq!(reader.format_version(), 1);
    assert_eq!(reader.head("t").unwrap().unwrap().next_position, 3);
    assert_eq!(reader.read_stream("t", 0).count(), 3);
    drop(reader);
    assert!(column_families(dir.path()).contains(&"heads".to_owned()));

    assert!(reader_tail(dir.path()).is_none());

    // A writer upgrades it: version 5, no `heads`, a tail marker summed up from the journal,
    // the framing its records have named; appends go on where the stream ends.
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    assert_eq!(
        journal.format_version(),
        dtask_journal::JOURNAL_FORMAT_VERSION
    );
    assert_eq!(journal.record_format(), RecordFormat::BLAKE3);
    let tail = journal.read_tail().unwrap().unwrap();
    assert_eq!((tail.last_seq, tail.live.tasks), (3, 1));
    assert!(!column_families(dir.path()).contains(&"heads".to_owned()));
    assert!(matches!(
        journal.append("t", 0, &[update(9)]),
        Err(Error::Conflict { actual: 3, .. })
    ));
    journal.append("t", 3, &[update(3)]).unwrap();
    let positions: Vec<u64> = journal
        .read_stream("t", 0)
        .map(|r| r.unwrap().position)
        .collect();
    assert_eq!(positions, vec![0, 1, 2, 3]);
    drop(journal);
    let db = raw(dir.path());
    let meta = db.cf_handle(Space::Meta.name()).unwrap();
    assert_eq!(
        db.get_cf(meta, dtask_journal::keys::META_FORMAT_VERSION)
            .unwrap()
            .unwrap(),
        dtask_journal::JOURNAL_FORMAT_VERSION.to_be_bytes()
    );
}

#[test]
fn heads_and_task_ids_are_read_off_the_last_records() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    // Ids that are prefixes of one another, and one with a byte right after the separator.
    for task in ["a", "a\u{1}", "ab", "b"] {
        journal.append(task, 0, &[created(task)]).unwrap();
    }
    let last = journal.append("ab", 1, &[update(1), update(2)]).unwrap();
    let ids: Vec<String> = journal.task_ids().map(Result::unwrap).collect();
    assert_eq!(ids, ["a", "a\u{1}", "ab", "b"]);
    let head = journal.head("ab").unwrap().unwrap();
    assert_eq!(head.next_position, 3);
    assert_eq!(head.last_seq, last.last_seq);
    let records: Vec<_> = journal.read_stream("ab", 0).map(Result::unwrap).collect();
    assert_eq!(head.last_digest, records[2].digest);
    assert!(!head.terminal);
    assert!(journal.head("zz").unwrap().is_none());
    let heads: Vec<(String, u64)> = journal
        .tasks()
        .map(|t| t.map(|(id, h)| (id, h.next_position)).unwrap())
        .collect();
    assert_eq!(
        heads,
        [
            ("a".to_owned(), 1),
            ("a\u{1}".to_owned(), 1),
            ("ab".to_owned(), 3),
            ("b".to_owned(), 1)
        ]
    );
}

#[test]
fn primed_heads_are_taken_before_the_first_append_only() {
    let dir = tempfile::tempdir().unwrap();
    {
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        journal.append("t", 0, &[created("t")]).unwrap();
        journal.append("u", 0, &[created("u")]).unwrap();
    }
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let head = journal.head("t").unwrap().unwrap();
    // The writer trusts a primed head: a wrong one shows that it was used, not read again.
    let wrong = dtask_journal::Head {
        next_position: 5,
        ..head
    };
    assert!(journal.prime_heads([("t", wrong)]));
    assert!(matches!(
        journal.append("t", 1, &[update(1)]),
        Err(Error::Conflict { actual: 5, .. })
    ));
    // Once the writer has begun, heads read earlier may be stale: refused.
    let u = journal.head("u").unwrap().unwrap();
    assert!(!journal.prime_heads([("u", u)]));
    journal.append("u", 1, &[update(1)]).unwrap();
    drop(journal);
    let reader = Journal::open_read_only(dir.path()).unwrap();
    assert!(!reader.prime_heads([("u", u)]));
}

/// A journal opened with memory-mapped reads reads the same records — from table files, after
/// a reopen — and goes on appending; the option reaches RocksDB.
#[test]
fn mmap_reads_read_the_same_records() {
    let dir = tempfile::tempdir().unwrap();
    let tasks: Vec<String> = (0..200).map(|i| format!("task-{i:03}")).collect();
    {
        let options = JournalOptions::default().with_durability(Durability::Buffered);
        let journal = Journal::open(dir.path(), options).unwrap();
        for task in &tasks {
            let events: Vec<Event> = std::iter::once(created(task))
                .chain((1..20).map(update))
                .collect();
            journal.append(task, 0, &events).unwrap();
        }
    }
    let read_all = |journal: &Journal| -> Vec<Vec<dtask_journal::Record>> {
        tasks
            .iter()
            .map(|task| journal.read_stream(task, 0).map(Result::unwrap).collect())
            .collect()
    };
    let plain = read_all(&Journal::open(dir.path(), JournalOptions::default()).unwrap());
    let journal =
        Journal::open(dir.path(), JournalOptions::default().with_mmap_reads(true)).unwrap();
    let options_file = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("OPTIONS-")
        })
        .max()
        .unwrap();
    assert!(std::fs::read_to_string(options_file)
        .unwrap()
        .contains("allow_mmap_reads=true"));
    assert_eq!(plain.len(), tasks.len());
    assert!(plain.iter().all(|stream| stream.len() == 20));
    assert_eq!(read_all(&journal), plain);
    let mut scanner = journal.stream_scanner();
    for (task, stream) in tasks.iter().zip(&plain) {
        let mut raw = scanner.read(task);
        let folded: Vec<_> = raw.fold_records().map(Result::unwrap).collect();
        assert_eq!(folded.len(), stream.len(), "{task}");
        assert_eq!(
            folded.last().map(|r| r.digest),
            stream.last().map(|r| r.digest)
        );
    }
    journal.append(&tasks[7], 20, &[update(20)]).unwrap();
    assert_eq!(journal.read_stream(&tasks[7], 0).count(), 21);
}

/// A fold that hands each record back (`Records::recycle`) gets every later update decoded
/// into the buffer of an earlier one: the records are still exactly the lean ones, whatever
/// the ids' lengths, from one stream to the next with one `RawStream`.
#[test]
fn recycled_records_decode_the_next_updates_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let id = |t: usize, i: usize| match (t + i) % 3 {
        0 => format!("a-long-event-id-{t}-{i}-{}", "x".repeat(i)),
        1 => format!("{i}"),
        _ => String::new(),
    };
    let tasks: Vec<String> = (0..3).map(|t| format!("task-{t}")).collect();
    for (t, task) in tasks.iter().enumerate() {
        let updates = (0..12).map(|i| Event::UpdateAppended {
            attempt: 1,
            event_id: id(t, i),
            kind: "progress".into(),
            data: vec![7; i],
            metadata: vec![("k".into(), "v".into())],
            at: Timestamp(2),
        });
        let events: Vec<Event> = std::iter::once(created(task)).chain(updates).collect();
        journal.append(task, 0, &events).unwrap();
    }
    let mut scanner = journal.stream_scanner();
    let mut raw = dtask_journal::RawStream::default();
    for task in &tasks {
        let expected: Vec<_> = scanner
            .read(task)
            .into_records()
            .map(Result::unwrap)
            .collect();
        scanner.read_into(task, &mut raw);
        let mut records = raw.fold_records();
        let mut seen = 0;
        while let Some(record) = records.next() {
            let mut record = record.unwrap();
            let mut lean = expected[seen].clone();
            if let Event::UpdateAppended {
                kind,
                data,
                metadata,
                ..
            } = &mut lean.event
            {
                kind.clear();
                data.clear();
                metadata.clear();
            }
            assert_eq!(record, lean, "{task} at {seen}");
            records.recycle(&mut record);
            if seen > 0 {
                // The id's buffer was taken; what is left of the event is empty.
                assert!(
                    matches!(&record.event, Event::UpdateAppended { event_id, .. } if event_id.is_empty()),
                    "{task} at {seen}: {:?}",
                    record.event
                );
            }
            seen += 1;
        }
        assert_eq!(seen, 13, "{task}");
    }
}

/// The level-0 table files of the `events` space, read with RocksDB itself (read-only).
fn events_level0_files(dir: &std::path::Path) -> u64 {
    let names = column_families(dir);
    let db = rocksdb::DB::open_cf_for_read_only(&rocksdb::Options::default(), dir, &names, false)
        .unwrap();
    let events = db.cf_handle(Space::Events.name()).unwrap();
    db.property_int_value_cf(events, "rocksdb.num-files-at-level0")
        .unwrap()
        .unwrap()
}

/// Each clean close flushes a table file per space; the close that brings `events` to
/// RocksDB's compaction trigger (four level-0 files) waits for that compaction, so the next
/// open reads one merged run. A journal opened and closed without appending (its compactions
/// still off) settles too. Nothing is lost either way.
#[test]
fn a_clean_close_settles_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let options = |settle: std::time::Duration| {
        JournalOptions::default()
            .with_durability(Durability::Buffered)
            .with_settle_on_close(settle)
    };
    let session = |round: u64, settle: std::time::Duration| {
        let journal = Journal::open(dir.path(), options(settle)).unwrap();
        for task in ["a", "b", "c"] {
            let events: Vec<Event> = if round == 0 {
                std::iter::once(created(task))
                    .chain((1..50).map(update))
                    .collect()
            } else {
                (round * 50..round * 50 + 50).map(update).collect()
            };
            journal.append(task, round * 50, &events).unwrap();
        }
    };
    // Three closes without waiting leave three level-0 files: below the trigger, nothing due.
    for round in 0..3 {
        session(round, std::time::Duration::ZERO);
    }
    assert_eq!(events_level0_files(dir.path()), 3);
    // The fourth close's flush makes a compaction due; the close waits for it.
    session(3, std::time::Duration::from_secs(60));
    assert_eq!(events_level0_files(dir.path()), 0);
    // Four more flushes, the last one by a close that does not wait for the compaction due.
    for round in 4..8 {
        session(round, std::time::Duration::ZERO);
    }
    // Opened and closed without an append (compactions off since the open): settled too.
    drop(Journal::open(dir.path(), options(std::time::Duration::from_secs(60))).unwrap());
    assert_eq!(events_level0_files(dir.path()), 0);
    let journal = Journal::open_read_only(dir.path()).unwrap();
    for task in ["a", "b", "c"] {
        let stream: Vec<_> = journal.read_stream(task, 0).map(Result::unwrap).collect();
        assert_eq!(stream.len(), 400, "{task}");
        assert!(stream
            .iter()
            .enumerate()
            .all(|(i, r)| r.position == i as u64));
    }
}

/// A linked append writes every stream's part in one batch, or none: a conflict on any part
/// leaves every stream as it was; a stream named twice is refused before anything is written.
#[test]
fn a_linked_append_is_all_or_nothing_across_streams() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    journal.append("parent", 0, &[created("parent")]).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let appended = runtime
        .block_on(journal.append_linked_async(
            "child",
            0,
            &[created("child")],
            &[("parent", 1, &[update(1)])],
        ))
        .unwrap();
    assert_eq!(appended.next_position, 1);
    assert_eq!(journal.stream_len("parent").unwrap(), Some(2));
    assert_eq!(journal.stream_len("child").unwrap(), Some(1));
    // The parent's part is stale: neither stream changes.
    let err = runtime
        .block_on(journal.append_linked_async(
            "child",
            1,
            &[update(2)],
            &[("parent", 1, &[update(3)])],
        ))
        .unwrap_err();
    assert!(matches!(
        err,
        Error::Conflict { ref task, expected: 1, actual: 2 } if task == "parent"
    ));
    assert_eq!(journal.stream_len("parent").unwrap(), Some(2));
    assert_eq!(journal.stream_len("child").unwrap(), Some(1));
    let err = runtime
        .block_on(journal.append_linked_async(
            "child",
            1,
            &[update(2)],
            &[("child", 1, &[update(3)])],
        ))
        .unwrap_err();
    assert!(matches!(err, Error::DuplicateStream(ref t) if t == "child"));
    let last = journal.last_seq().unwrap();
    // Reopened, both streams hold exactly what was acknowledged.
    drop(journal);
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    assert_eq!(journal.last_seq().unwrap(), last);
    assert_eq!(journal.read_stream("parent", 0).count(), 2);
    assert_eq!(journal.read_stream("child", 0).count(), 1);
}

/// Records what the write path tells it.
#[derive(Debug, Default)]
struct Recorder {
    batches: std::sync::Mutex<Vec<dtask_journal::observe::BatchWritten>>,
    syncs: std::sync::atomic::AtomicUsize,
    acks: std::sync::atomic::AtomicUsize,
}

impl dtask_journal::WriteObserver for Recorder {
    fn batch_written(&self, batch: &dtask_journal::observe::BatchWritten) {
        self.batches.lock().unwrap().push(*batch);
    }
    fn synced(&self, sync: &dtask_journal::observe::Synced) {
        assert!(sync.ok);
        self.syncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn acknowledged(&self, _latency: std::time::Duration) {
        self.acks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[test]
fn an_observer_is_told_every_batch_sync_and_acknowledgement() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    journal.append("before", 0, &[created("before")]).unwrap();
    let recorder = Arc::new(Recorder::default());
    assert!(journal.observe(recorder.clone()));
    assert!(
        !journal.observe(Arc::new(Recorder::default())),
        "one observer"
    );

    journal.append("a", 0, &[created("a"), update(1)]).unwrap();
    journal.append("a", 2, &[update(2)]).unwrap();
    let stale = journal.append("a", 1, &[update(3)]);
    assert!(matches!(stale, Err(Error::Conflict { .. })));

    // The stale append formed a batch of its own and wrote nothing: reported (just after its
    // caller was answered), not synced.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while recorder
        .batches
        .lock()
        .unwrap()
        .iter()
        .all(|b| b.conflicts == 0)
        && std::time::Instant::now() < deadline
    {
        std::thread::yield_now();
    }
    let batches = recorder.batches.lock().unwrap().clone();
    assert_eq!(batches.iter().map(|b| b.appends).sum::<usize>(), 2);
    assert_eq!(batches.iter().map(|b| b.conflicts).sum::<usize>(), 1);
    let written = batches.iter().filter(|b| b.appends > 0).count();
    assert_eq!(batches.iter().map(|b| b.records).sum::<usize>(), 3);
    let on_disk: usize = journal.read_stream("a", 0).map(|r| r.unwrap().size).sum();
    assert_eq!(batches.iter().map(|b| b.bytes).sum::<usize>(), on_disk);
    assert_eq!(recorder.acks.load(Ordering::Relaxed), 2);
    assert_eq!(recorder.syncs.load(Ordering::Relaxed), written);
}

/// Reads a stream and the last sequence as the journal's readers see them after each batch
/// is written and before its sync.
#[derive(Debug, Default)]
struct ReadBeforeSync {
    journal: std::sync::Mutex<Option<Journal>>,
    seen: std::sync::Mutex<Vec<(Option<u64>, usize, u64)>>,
}

impl dtask_journal::WriteObserver for ReadBeforeSync {
    fn batch_written(&self, _: &dtask_journal::observe::BatchWritten) {
        if let Some(journal) = self.journal.lock().unwrap().as_ref() {
            let len = journal.stream_len("t").unwrap();
            let read = journal.read_stream("t", 0).count();
            let last = journal.last_seq().unwrap();
            self.seen.lock().unwrap().push((len, read, last));
        }
    }
}

#[test]
fn a_streams_length_and_the_last_sequence_count_only_what_its_readers_read() {
    let dir = tempfile::tempdir().unwrap();
    let options = JournalOptions::default().with_inline_lone_appends(false);
    let journal = Journal::open(dir.path(), options).unwrap();
    let reader = Arc::new(ReadBeforeSync::default());
    *reader.journal.lock().unwrap() = Some(journal.clone());
    assert!(journal.observe(reader.clone()));

    journal.append("t", 0, &[created("t")]).unwrap();
    journal.append("t", 1, &[update(1), update(2)]).unwrap();
    assert_eq!(journal.stream_len("t").unwrap(), Some(3));
    assert_eq!(journal.last_seq().unwrap(), 3);
    // Between each batch's write and its sync the written records are neither read nor
    // counted: a task whose first record waits for its sync is unknown, and a reader of the
    // commits going on after the last sequence misses nothing.
    let seen = reader.seen.lock().unwrap().clone();
    assert_eq!(seen, [(None, 0, 0), (Some(1), 1, 1)]);
    reader.journal.lock().unwrap().take();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_durable_watermark_can_be_awaited() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let mut watermark = journal.watch_durable();
    assert_eq!(*watermark.borrow(), 0);
    let waiter = tokio::spawn(async move {
        let seq = *watermark.wait_for(|seq| *seq >= 2).await.unwrap();
        seq
    });
    journal
        .append_async("a", 0, &[created("a"), update(1)])
        .await
        .unwrap();
    assert_eq!(waiter.await.unwrap(), 2);
    assert_eq!(*journal.watch_durable().borrow(), journal.durable_seq());
}

#[test]
fn task_ids_resume_after_any_id() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    for id in ["a", "ab", "b", "c"] {
        journal.append(id, 0, &[created(id)]).unwrap();
    }
    let from = |after: Option<&str>| -> Vec<String> {
        journal
            .task_ids_from(after)
            .collect::<Result<_, _>>()
            .unwrap()
    };
    assert_eq!(from(None), ["a", "ab", "b", "c"]);
    // After an id: not its prefix's neighbours ("ab" follows "a"), and an id that is not in
    // the journal resumes at the next one.
    assert_eq!(from(Some("a")), ["ab", "b", "c"]);
    assert_eq!(from(Some("aa")), ["ab", "b", "c"]);
    assert_eq!(from(Some("c")), Vec::<String>::new());
    assert_eq!(from(Some("")), ["a", "ab", "b", "c"]);
}

/// The environment variable that makes this test binary a crashing writer (see
/// [`two_crashes_before_a_flush_lose_no_acknowledged_record`]).
const CRASH_CHILD: &str = "DTASK_JOURNAL_TEST_CRASH_CHILD";

/// A writer's life that ends in a crash: opens the journal at `dir`, appends 100 updates to
/// task "t" (each synced and acknowledged), and aborts with the journal open.
fn crash_child(dir: &std::path::Path) -> ! {
    let journal = Journal::open(dir, JournalOptions::default()).unwrap();
    if journal.stream_len("t").unwrap().is_none() {
        journal.append("t", 0, &[created("t")]).unwrap();
    }
    let start = journal.stream_len("t").unwrap().unwrap();
    for i in start..start + 100 {
        journal.append("t", i, &[update(i)]).unwrap();
    }
    std::process::abort();
}

/// Runs one crashing writer's life in a process of its own.
fn crash_once(dir: &std::path::Path) {
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "two_crashes_before_a_flush_lose_no_acknowledged_record",
            "--exact",
        ])
        .env(CRASH_CHILD, dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "the writer was to crash");
}

fn table_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|entry| {
            entry
                .as_ref()
                .is_ok_and(|entry| entry.path().extension().is_some_and(|ext| ext == "sst"))
        })
        .count()
}

/// Two crashes in a row, the second before anything was flushed: a writer's open replays the
/// log the first crash left into the memtables without writing a table file, and keeps that
/// log, so the second crash loses none of the first life's records, nor of the second's.
#[test]
fn two_crashes_before_a_flush_lose_no_acknowledged_record() {
    if let Some(dir) = std::env::var_os(CRASH_CHILD) {
        crash_child(std::path::Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    crash_once(dir.path());
    let tables = table_files(dir.path());
    crash_once(dir.path());
    assert_eq!(
        table_files(dir.path()),
        tables,
        "the open after the first crash wrote its replayed log as a table file"
    );
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    assert_eq!(journal.stream_len("t").unwrap(), Some(201));
    let records: Vec<_> = journal
        .read_stream("t", 0)
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(records.len(), 201);
    for (i, record) in records.iter().enumerate().skip(1) {
        match &record.event {
            Event::UpdateAppended { event_id, .. } => assert_eq!(*event_id, format!("e{i}")),
            other => panic!("position {i}: {other:?}"),
        }
    }
}

/// Bytes the journal's in-memory tables hold, and whether a flush of them is running or
/// waiting.
fn in_memory(journal: &Journal) -> (u64, bool) {
    let stats = journal.storage_stats().unwrap().unwrap();
    (stats.memtable_bytes(), stats.flushing())
}

/// After a crash the open leaves the replayed log in memory (and writes no table file);
/// `release_replayed_log` writes it out in the background, which frees that memory, and
/// every record reads as before — through a second crash too.
#[test]
fn the_replayed_log_is_released_once_asked_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    crash_once(dir.path());
    let tables = table_files(dir.path());
    {
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        let (held, _) = in_memory(&journal);
        assert_eq!(
            table_files(dir.path()),
            tables,
            "the open wrote its replayed log"
        );
        journal.release_replayed_log().unwrap();
        // RocksDB's own threads do the flush: wait for it (a guard, not a measure).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let released = loop {
            let (bytes, flushing) = in_memory(&journal);
            if !flushing && bytes < held / 2 {
                break bytes;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the replayed log was not released: {bytes} of {held} bytes in memory"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert!(
            table_files(dir.path()) > tables,
            "released without a table file: {released} of {held} bytes"
        );
        assert_eq!(journal.read_stream("t", 0).count(), 101);
        // Nothing more to release: a second call is harmless.
        journal.release_replayed_log().unwrap();
    }
    crash_once(dir.path());
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let records: Vec<_> = journal
        .read_stream("t", 0)
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(records.len(), 201);
}

/// A read-only journal and a follower have nothing of their own to release.
#[test]
fn a_reader_has_no_replayed_log_to_release() {
    let dir = tempfile::tempdir().unwrap();
    crash_once(dir.path());
    let reader = Journal::open_read_only(dir.path()).unwrap();
    reader.release_replayed_log().unwrap();
    assert_eq!(reader.read_stream("t", 0).count(), 101);
    let scratch = tempfile::tempdir().unwrap();
    let follower = Journal::open_follower(dir.path(), scratch.path()).unwrap();
    follower.release_replayed_log().unwrap();
    assert_eq!(follower.read_stream("t", 0).count(), 101);
}

/// A frozen view of a journal open for writing is a copy that stands where it was made while
/// appends go on, holds every record written before it, and is removed with the view; a
/// copy a crash left behind goes at the next open for writing.
#[test]
fn a_frozen_view_of_a_writer_stands_still_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let copies = copies_of;
    {
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        journal.append("t", 0, &[created("t")]).unwrap();
        let frozen = journal.frozen().unwrap();
        assert_eq!(copies(dir.path()), 1);
        journal.append("t", 1, &[update(1), update(2)]).unwrap();
        journal.append("u", 0, &[created("u")]).unwrap();
        let view = frozen.journal();
        assert!(view.is_read_only());
        assert_eq!(view.last_seq().unwrap(), 1);
        assert_eq!(view.stream_len("t").unwrap(), Some(1));
        assert_eq!(view.stream_len("u").unwrap(), None);
        assert_eq!(view.read_stream("t", 0).count(), 1);
        assert_eq!(journal.last_seq().unwrap(), 4);
        drop(frozen);
        assert_eq!(copies(dir.path()), 0);
    }
    // A copy left by a crash (here: made by hand) is removed by the next writer's open.
    std::fs::create_dir(dir.path().join(".frozen-copy-left")).unwrap();
    std::fs::write(dir.path().join(".frozen-copy-left").join("x"), b"x").unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    assert_eq!(copies(dir.path()), 0);
    assert_eq!(journal.read_stream("t", 0).count(), 3);
}

/// A frozen view of a follower is the follower itself, which does not catch up while the
/// view is held; a read-only open's is itself.
#[test]
fn a_frozen_follower_does_not_catch_up_until_the_view_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    journal.append("t", 0, &[created("t")]).unwrap();
    let follower = Journal::open_follower(dir.path(), scratch.path()).unwrap();
    let frozen = follower.frozen().unwrap();
    journal.append("t", 1, &[update(1)]).unwrap();
    follower.catch_up().unwrap();
    assert_eq!(frozen.journal().last_seq().unwrap(), 1);
    assert_eq!(follower.last_seq().unwrap(), 1);
    drop(frozen);
    follower.catch_up().unwrap();
    assert_eq!(follower.last_seq().unwrap(), 2);

    let reader = Journal::open_read_only(dir.path()).unwrap();
    let frozen = reader.frozen().unwrap();
    assert_eq!(frozen.journal().last_seq().unwrap(), 2);
    assert_eq!(copies_of(dir.path()), 0);
}

/// The frozen copies in a journal's directory.
fn copies_of(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with(".frozen-copy-")
        })
        .count()
}

/// An append that would take a sequence past the last one there is — after an import whose
/// records end near it, or an import's batch that runs over — is refused whole, nothing
/// written: such a record could be written and acknowledged, and then never read back (every
/// reader refuses its key), nor the journal opened again.
#[test]
fn an_append_past_the_last_sequence_is_refused() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let last = dtask_journal::keys::MAX_SEQUENCE;
    let over = runtime.block_on(
        journal
            .submit_at_seq("a", 0, &[created("a"), update(1)], last)
            .unwrap(),
    );
    assert!(
        matches!(over, Err(Error::SequencesExhausted { last: l }) if l == last + 1),
        "{over:?}"
    );
    assert_eq!(journal.tasks().count(), 0);
    runtime
        .block_on(
            journal
                .submit_at_seq("a", 0, &[created("a")], last)
                .unwrap(),
        )
        .unwrap();
    assert!(matches!(
        journal.append("b", 0, &[created("b")]),
        Err(Error::SequencesExhausted { .. })
    ));
    assert_eq!(journal.read_stream("a", 0).count(), 1);
    drop(journal);
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    assert_eq!(journal.last_seq().unwrap(), last);
}

/// A purge of streams as they were read refuses one that has grown since (another node
/// appended to it: a rerun's link, a hold), and writes nothing.
#[test]
fn a_purge_as_read_refuses_a_stream_that_grew() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    for task in ["a", "b"] {
        journal
            .append(
                task,
                0,
                &[
                    created(task),
                    Event::Completed {
                        data: Vec::new(),
                        at: Timestamp(2),
                    },
                ],
            )
            .unwrap();
    }
    let refused = journal.purge_as_read(&[("a", 2), ("b", 1)], Timestamp(3));
    assert!(
        matches!(&refused, Err(Error::Conflict { task, expected: 1, actual: 2 }) if task == "b"),
        "{refused:?}"
    );
    assert_eq!(journal.read_stream("a", 0).count(), 2);
    let purged = journal
        .purge_as_read(&[("a", 2), ("b", 2)], Timestamp(3))
        .unwrap();
    assert_eq!(purged.len(), 2);
}

/// A reader of the commit order that a purge overtakes passes over the records the purge
/// deleted — their entries gone with them — instead of reporting them as damage (a server's
/// stream, `dtask tail`, a follower's refresh failed so beside a retention sweep).
#[test]
fn a_purge_while_the_commit_order_is_read_is_not_damage() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    journal
        .append(
            "a",
            0,
            &[
                created("a"),
                Event::Completed {
                    data: Vec::new(),
                    at: Timestamp(2),
                },
            ],
        )
        .unwrap();
    journal.append("b", 0, &[created("b")]).unwrap();
    let mut reading = journal.commits(1);
    let first = reading.next().unwrap().unwrap();
    assert_eq!((first.task.as_str(), first.record.position), ("a", 0));
    journal.purge(&["a"], Timestamp(3)).unwrap();
    let rest: Vec<(String, u64)> = reading
        .map(|c| c.map(|c| (c.task, c.record.position)))
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        rest.iter()
            .all(|(task, position)| task != "a" || *position == 0),
        "{rest:?}"
    );
    assert!(rest.contains(&("b".to_owned(), 0)), "{rest:?}");
}

/// A wrapper of the real backend that counts the records written through it and delegates
/// every method, the provided ones included ([`Journal::open_wrapped`]).
struct Counting {
    inner: Arc<dyn dtask_journal::Backend>,
    /// Records put in the events space.
    records_written: std::sync::atomic::AtomicUsize,
    /// Reads of one key.
    gets: std::sync::atomic::AtomicUsize,
}

impl Counting {
    fn count(counter: &std::sync::atomic::AtomicUsize) {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl dtask_journal::Backend for Counting {
    fn write(&self, ops: Vec<dtask_journal::BatchOp>, durability: Durability) -> Result<(), Error> {
        for op in &ops {
            if let dtask_journal::BatchOp::Put {
                space: Space::Events,
                ..
            } = op
            {
                Self::count(&self.records_written);
            }
        }
        self.inner.write(ops, durability)
    }
    fn sync(&self) -> Result<(), Error> {
        self.inner.sync()
    }
    fn sync_through(&self, last_seq: u64) -> Result<(), Error> {
        self.inner.sync_through(last_seq)
    }
    fn max_batch_bytes(&self) -> usize {
        self.inner.max_batch_bytes()
    }
    fn sync_failure_is_final(&self) -> bool {
        self.inner.sync_failure_is_final()
    }
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Self::count(&self.gets);
        self.inner.get(space, key)
    }
    fn scan(&self, space: Space, range: dtask_journal::Range) -> dtask_journal::RawIter<'_> {
        self.inner.scan(space, range)
    }
    fn cursor(&self, space: Space) -> Box<dyn dtask_journal::Cursor + '_> {
        self.inner.cursor(space)
    }
    fn lookup_cursor(&self, space: Space) -> Box<dyn dtask_journal::Cursor + '_> {
        self.inner.lookup_cursor(space)
    }
    fn records_by_seq(
        &self,
        first: u64,
        last: u64,
    ) -> Option<Result<Vec<dtask_journal::KeyValue>, Error>> {
        self.inner.records_by_seq(first, last)
    }
    fn live_records_cursor(&self) -> Option<Box<dyn dtask_journal::Cursor + '_>> {
        self.inner.live_records_cursor()
    }
    fn unmoved_records_cursor(&self) -> Option<Box<dyn dtask_journal::Cursor + '_>> {
        self.inner.unmoved_records_cursor()
    }
    fn catch_up(&self) -> Result<(), Error> {
        self.inner.catch_up()
    }
    fn read_only(&self) -> bool {
        self.inner.read_only()
    }
    fn is_secondary(&self) -> bool {
        self.inner.is_secondary()
    }
    fn frozen_copy(&self) -> Result<Option<tempfile::TempDir>, Error> {
        self.inner.frozen_copy()
    }
    fn frozen_view(&self) -> Result<Option<Arc<dyn dtask_journal::Backend>>, Error> {
        self.inner.frozen_view()
    }
    fn start_compactions(&self) -> Result<(), Error> {
        self.inner.start_compactions()
    }
    fn compact(&self) -> Result<bool, Error> {
        self.inner.compact()
    }
    fn flush(&self) -> Result<(), Error> {
        self.inner.flush()
    }
    fn flush_in_background(&self) -> Result<(), Error> {
        self.inner.flush_in_background()
    }
    fn settle(&self, timeout: std::time::Duration) -> Result<bool, Error> {
        self.inner.settle(timeout)
    }
    fn foreign_keys(&self, max: usize) -> Result<Vec<Vec<u8>>, Error> {
        self.inner.foreign_keys(max)
    }
    fn has_legacy_heads(&self) -> bool {
        self.inner.has_legacy_heads()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn schema_version(&self) -> Option<u32> {
        self.inner.schema_version()
    }
    fn scan_snapshot_rows(&self) -> usize {
        self.inner.scan_snapshot_rows()
    }
    fn is_shared(&self) -> bool {
        self.inner.is_shared()
    }
    fn dir(&self) -> Option<&std::path::Path> {
        self.inner.dir()
    }
    fn lock_for_write(
        &self,
        since: u64,
        lacks: &[String],
    ) -> Result<Option<dtask_journal::WriteLock>, Error> {
        self.inner.lock_for_write(since, lacks)
    }
    fn write_locked(
        &self,
        ops: Vec<dtask_journal::BatchOp>,
        flush: dtask_journal::CommitFlush,
    ) -> Result<(), Error> {
        self.inner.write_locked(ops, flush)
    }
    fn write_expecting(
        &self,
        ops: Vec<dtask_journal::BatchOp>,
        expected: &[u8],
        flush: dtask_journal::CommitFlush,
    ) -> Result<bool, Error> {
        self.inner.write_expecting(ops, expected, flush)
    }
    fn unlock_write(&self) {
        self.inner.unlock_write();
    }
    fn last_records(
        &self,
        tasks: &[String],
    ) -> Option<Result<Vec<dtask_journal::LastRecord>, Error>> {
        self.inner.last_records(tasks)
    }
    fn watch_commits(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.inner.watch_commits()
    }
    fn durable_reader(&self) -> Option<Arc<dyn dtask_journal::Backend>> {
        self.inner.durable_reader()
    }
    fn storage_stats(&self) -> Result<Option<dtask_journal::StorageStats>, Error> {
        self.inner.storage_stats()
    }
}

#[test]
fn a_wrapped_journal_appends_and_reads_back_like_a_plain_one() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut counting = None;
        let journal = Journal::open_wrapped(dir.path(), JournalOptions::default(), |inner| {
            let wrapper = Arc::new(Counting {
                inner,
                records_written: std::sync::atomic::AtomicUsize::new(0),
                gets: std::sync::atomic::AtomicUsize::new(0),
            });
            counting = Some(Arc::clone(&wrapper));
            wrapper
        })
        .unwrap();
        let counting = counting.as_ref().unwrap();
        // The real backend is underneath.
        assert_eq!(journal.location(), dir.path().display().to_string());
        journal.append("a", 0, &[created("a"), update(1)]).unwrap();
        journal.append("b", 0, &[created("b")]).unwrap();
        journal.append("a", 2, &[update(2)]).unwrap();
        // Every record went through the wrapper, and reads go through it too.
        assert_eq!(
            counting
                .records_written
                .load(std::sync::atomic::Ordering::SeqCst),
            4
        );
        let before = counting.gets.load(std::sync::atomic::Ordering::SeqCst);
        let commits: Vec<(String, u64, u64)> = journal
            .commits(1)
            .map(|c| c.map(|c| (c.task, c.record.position, c.record.seq)))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            commits,
            [
                ("a".to_owned(), 0, 1),
                ("a".to_owned(), 1, 2),
                ("b".to_owned(), 0, 3),
                ("a".to_owned(), 2, 4)
            ]
        );
        assert!(counting.gets.load(std::sync::atomic::Ordering::SeqCst) >= before + 4);
        let a: Vec<EventType> = journal
            .read_stream("a", 0)
            .map(|r| r.map(|r| r.event.event_type()))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            a,
            [
                EventType::Created,
                EventType::UpdateAppended,
                EventType::UpdateAppended
            ]
        );
    }
    // What the wrapped journal wrote (the wrapper gone, and the real backend with it) is a
    // journal like any other.
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    assert_eq!(journal.last_seq().unwrap(), 4);
    assert_eq!(journal.read_stream("b", 0).count(), 1);
}

//! Real damage on a real RocksDB journal: each kind of tampering is reported with the exact
//! task, position and kind of damage; and what a writable open and an append refuse: forged
//! numbers, a commit index that does not end where the journal's tail marker says, a record
//! for another task, and what a torn first start leaves behind; and a write-ahead log torn by
//! a power failure, cut anywhere, leaves whole appends in commit order.
#![allow(clippy::unwrap_used)]

use dtask_journal::keys::{self, Space};
use dtask_journal::{
    Committed, CorruptionKind, Error, Event, Inconsistency, Journal, JournalOptions, LeasePolicy,
    LiveSummary, RawCommits, RecordFetcher, Sealed, TaskSpec, Timestamp,
};
use std::path::Path;

fn created(task: &str) -> Event {
    Event::created(TaskSpec::new(task, "x"), LeasePolicy::Retry, Timestamp(1))
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
    let cfs: Vec<_> = dtask_journal::keys::COLUMN_FAMILIES.to_vec();
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
    commit_reads_agree(journal);
}

/// The commit order read a record at a time, in batches resolved to records, and in batches
/// resolved to seals only (the events not decoded) finds the same records and the same
/// damage.
fn commit_reads_agree(journal: &Journal) {
    let shown = |item: Result<Sealed, Error>| match item {
        Ok(sealed) => format!("{sealed:?}"),
        Err(e) => e.to_string(),
    };
    let sealed_of = |item: Result<Committed, Error>| {
        shown(item.map(|c| Sealed {
            task: c.task,
            position: c.record.position,
            seq: c.record.seq,
            digest: c.record.digest,
            crc: c.record.crc,
        }))
    };
    let one_by_one: Vec<String> = journal.commits(1).map(sealed_of).collect();
    assert!(!one_by_one.is_empty());
    // Each batch resolved by `resolve`, with one fetcher for the whole read.
    let batched = |resolve: &dyn Fn(RawCommits, &mut RecordFetcher) -> Vec<String>| {
        let mut fetcher = journal.record_fetcher();
        journal
            .commit_batches(1, 3)
            .flat_map(|batch| resolve(batch, &mut fetcher))
            .collect::<Vec<_>>()
    };
    let decoded = batched(&|batch, fetcher| batch.into_committed(fetcher).map(sealed_of).collect());
    assert_eq!(decoded, one_by_one);
    let sealed = batched(&|batch, fetcher| batch.into_sealed(fetcher).map(shown).collect());
    assert_eq!(sealed, one_by_one);
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

/// "a" (3 records, sequences 1, 3, 4) and "b" (2 records, sequences 2, 5); both live.
fn build_ab(dir: &Path) {
    let journal = Journal::open(dir, JournalOptions::default()).unwrap();
    journal.append("a", 0, &[created("a")]).unwrap();
    journal.append("b", 0, &[created("b")]).unwrap();
    journal
        .append("a", 1, &[heartbeat(1), heartbeat(2)])
        .unwrap();
    journal.append("b", 1, &[heartbeat(3)]).unwrap();
}

fn cf(db: &rocksdb::DB, space: Space) -> &rocksdb::ColumnFamily {
    db.cf_handle(space.name()).unwrap()
}

fn open(dir: &Path) -> Result<Journal, Error> {
    Journal::open(dir, JournalOptions::default())
}

#[test]
fn a_created_event_for_another_task_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path()).unwrap();
    let refused = journal.append("job-1", 0, &[created("other-task")]);
    assert!(
        matches!(
            &refused,
            Err(Error::WrongTask { task, found }) if task == "job-1" && found == "other-task"
        ),
        "{refused:?}"
    );
    assert_eq!(journal.stream_len("job-1").unwrap(), None);
    assert_eq!(journal.stream_len("other-task").unwrap(), None);
    assert_eq!(journal.last_seq().unwrap(), 0);
    // The right one goes through at position 0: nothing was taken by the refusal.
    journal.append("job-1", 0, &[created("job-1")]).unwrap();
    assert_eq!(journal.last_seq().unwrap(), 1);
}

#[test]
fn forged_huge_sequences_are_refused_at_open_not_a_panic() {
    for forged in [1u64 << 37, keys::MAX_SEQUENCE + 1, u64::MAX] {
        let dir = tempfile::tempdir().unwrap();
        build_ab(dir.path());
        tamper(dir.path(), |db| {
            db.put_cf(
                cf(db, Space::Commits),
                keys::seq_key(forged),
                keys::event_key("a", 0),
            )
            .unwrap();
        });
        let refused = open(dir.path());
        match &refused {
            Err(Error::Inconsistent(Inconsistency::CommitTail { index, marker: 5 }))
                if *index == forged => {}
            Err(Error::Inconsistent(Inconsistency::CommitTarget { .. })) => {}
            other => panic!("forged sequence {forged}: {other:?}"),
        }
        let message = refused.unwrap_err().to_string();
        assert!(message.contains("dtask verify"), "{message}");
        // Readers still open it and read the streams.
        let reader = Journal::open_read_only(dir.path()).unwrap();
        assert_eq!(reader.read_stream("a", 0).count(), 3);
    }
}

#[test]
fn a_commit_index_that_lost_its_tail_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    build_ab(dir.path());
    tamper(dir.path(), |db| {
        db.delete_cf(cf(db, Space::Commits), keys::seq_key(5))
            .unwrap();
    });
    let refused = open(dir.path());
    assert!(
        matches!(
            refused,
            Err(Error::Inconsistent(Inconsistency::CommitTail {
                index: 4,
                marker: 5
            }))
        ),
        "{refused:?}"
    );
    // Nothing was written: the damage is still there for `verify` to name.
    let reader = Journal::open_read_only(dir.path()).unwrap();
    assert_eq!(reader.last_seq().unwrap(), 4);
    assert_eq!(reader.read_tail().unwrap().unwrap().last_seq, 5);
}

#[test]
fn a_last_commit_entry_naming_no_record_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    build_ab(dir.path());
    // The global last record (b's heartbeat, sequence 5) is deleted.
    tamper(dir.path(), |db| {
        db.delete_cf(cf(db, Space::Events), keys::event_key("b", 1))
            .unwrap();
    });
    let refused = open(dir.path());
    assert!(
        matches!(
            &refused,
            Err(Error::Inconsistent(Inconsistency::CommitTarget { seq: 5, detail }))
                if detail.contains("has no record")
        ),
        "{refused:?}"
    );
}

#[test]
fn a_missing_or_damaged_tail_marker_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    build_ab(dir.path());
    tamper(dir.path(), |db| {
        let meta = cf(db, Space::Meta);
        let mut tail = db.get_cf(meta, keys::META_TAIL).unwrap().unwrap();
        tail[3] ^= 1;
        db.put_cf(meta, keys::META_TAIL, tail).unwrap();
    });
    assert!(matches!(
        open(dir.path()),
        Err(Error::Inconsistent(Inconsistency::Marker(_)))
    ));
    tamper(dir.path(), |db| {
        db.delete_cf(cf(db, Space::Meta), keys::META_TAIL).unwrap();
    });
    assert!(matches!(
        open(dir.path()),
        Err(Error::Inconsistent(Inconsistency::Marker(_)))
    ));
}

#[test]
fn the_tail_marker_follows_every_batch() {
    let dir = tempfile::tempdir().unwrap();
    build_ab(dir.path());
    let journal = open(dir.path()).unwrap();
    let tail = journal.read_tail().unwrap().unwrap();
    assert_eq!(tail.last_seq, 5);
    let heads: Vec<_> = ["a", "b"]
        .iter()
        .map(|t| (*t, journal.head(t).unwrap().unwrap()))
        .collect();
    let live = LiveSummary::of(heads.iter().map(|(t, h)| (*t, h)));
    assert_eq!(tail.live, live);
    assert_eq!(live.tasks, 2);
    journal.check_live(&live).unwrap();
    // A live task missing from what a recovery found is a mismatch.
    let only_a = LiveSummary::of(heads.iter().take(1).map(|(t, h)| (*t, h)));
    assert!(matches!(
        journal.check_live(&only_a),
        Err(Error::Inconsistent(Inconsistency::LiveTasks {
            marker: 2,
            found: 1,
            ..
        }))
    ));
    // A terminal event takes the task out of the marker's live tasks.
    journal
        .append(
            "a",
            3,
            &[Event::Completed {
                data: vec![],
                at: Timestamp(9),
            }],
        )
        .unwrap();
    let tail = journal.read_tail().unwrap().unwrap();
    assert_eq!((tail.last_seq, tail.live.tasks), (6, 1));
    let b = journal.head("b").unwrap().unwrap();
    assert_eq!(tail.live, LiveSummary::of([("b", &b)]));
    // What a recovery sizes its tables by: the count at the open, not since.
    assert_eq!(journal.live_tasks_at_open(), Some(2));
    drop(journal);
    assert_eq!(open(dir.path()).unwrap().live_tasks_at_open(), Some(1));
    assert_eq!(
        Journal::open_read_only(dir.path())
            .unwrap()
            .live_tasks_at_open(),
        Some(1)
    );
}

#[test]
fn a_versionless_journal_without_records_opens_as_new_everywhere() {
    // What a process killed after RocksDB created the column families, before the version
    // was stored, leaves behind.
    let dir = tempfile::tempdir().unwrap();
    {
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        let cfs: Vec<_> = dtask_journal::keys::COLUMN_FAMILIES.to_vec();
        rocksdb::DB::open_cf(&opts, dir.path(), cfs).unwrap();
    }
    let reader = Journal::open_read_only(dir.path()).unwrap();
    assert_eq!(reader.task_ids().count(), 0);
    assert_eq!(reader.last_seq().unwrap(), 0);
    drop(reader);
    let scratch = tempfile::tempdir().unwrap();
    let follower = Journal::open_follower(dir.path(), scratch.path()).unwrap();
    assert_eq!(follower.commits(1).count(), 0);
    drop(follower);
    let journal = open(dir.path()).unwrap();
    assert_eq!(
        journal.format_version(),
        dtask_journal::JOURNAL_FORMAT_VERSION
    );
    journal.append("t", 0, &[created("t")]).unwrap();
    assert_eq!(journal.read_tail().unwrap().unwrap().last_seq, 1);
}

#[test]
fn a_versionless_database_with_data_is_not_a_journal() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        let cfs: Vec<_> = dtask_journal::keys::COLUMN_FAMILIES.to_vec();
        let db = rocksdb::DB::open_cf(&opts, dir.path(), cfs).unwrap();
        db.put_cf(cf(&db, Space::Live), b"t", b"").unwrap();
    }
    assert!(matches!(
        Journal::open_read_only(dir.path()),
        Err(Error::NotAJournal(_))
    ));
    assert!(matches!(open(dir.path()), Err(Error::NotAJournal(_))));
}

/// The `live` index listed with damage in it: an entry whose key names no task and one that
/// carries bytes each come as an error in their place, the listing goes on after them, and
/// it ends.
#[test]
fn the_live_listing_reports_damaged_entries_in_place_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    tamper(dir.path(), |db| {
        // A NUL is not allowed in a task id; "c" sorts between "bystander" and "victim".
        db.put_cf(cf(db, Space::Live), b"a\0b", b"").unwrap();
        db.put_cf(cf(db, Space::Live), keys::task_key("c"), b"junk")
            .unwrap();
    });
    let journal = Journal::open_read_only(dir.path()).unwrap();
    let listed: Vec<_> = journal.live_tasks().collect();
    assert_eq!(listed.len(), 4, "{listed:?}");
    assert!(matches!(
        &listed[0],
        Err(Error::MalformedEntry { space: Space::Live, key, .. }) if key == b"a\0b"
    ));
    assert_eq!(listed[1].as_ref().unwrap(), "bystander");
    assert!(
        matches!(&listed[2], Err(Error::Corruption { task, .. }) if task == "c"),
        "{:?}",
        listed[2]
    );
    assert_eq!(listed[3].as_ref().unwrap(), "victim");
    // Past its end the listing stays ended.
    let mut listing = journal.live_tasks();
    assert_eq!(listing.by_ref().count(), 4);
    assert!(listing.next().is_none());
}

/// The files of the journal directory `from` copied to `to` (a crash image when the journal
/// is idle: every append synced, nothing being written).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// Where each physical record of a RocksDB write-ahead log ends: its 32 KiB blocks hold
/// records of a 7-byte header (CRC, length, type; 11 bytes for the recyclable types 5–8)
/// and their payload, a block's last bytes too few for a header left as zeros; a zero type
/// is the end.
fn log_record_ends(log: &[u8]) -> Vec<usize> {
    const BLOCK: usize = 32 * 1024;
    let mut ends = Vec::new();
    let mut at = 0;
    while at + 7 <= log.len() {
        let left_in_block = BLOCK - at % BLOCK;
        if left_in_block < 7 {
            at += left_in_block;
            continue;
        }
        let len = usize::from(u16::from_le_bytes([log[at + 4], log[at + 5]]));
        let kind = log[at + 6];
        if kind == 0 {
            break;
        }
        let header = if (5..=8).contains(&kind) { 11 } else { 7 };
        at += header + len;
        ends.push(at.min(log.len()));
    }
    ends
}

/// The tasks of the torn-log test.
const TORN_TASKS: [&str; 3] = ["a", "b", "c"];

/// Appends 15 appends of one to three records to the three tasks of the journal at `dir`
/// (one record larger than a log block, written in fragments) and copies the journal's files
/// to `image` while it is idle; returns the sequence each append ended at, in commit order
/// (0 first: none).
fn torn_log_workload(dir: &Path, image: &Path) -> Vec<u64> {
    let journal = Journal::open(dir, JournalOptions::default()).unwrap();
    let mut ends = vec![0u64];
    let mut lengths = [0u64; 3];
    for i in 0..15u64 {
        let t = usize::try_from(i % 3).unwrap();
        let task = TORN_TASKS[t];
        let mut events = Vec::new();
        if lengths[t] == 0 {
            events.push(created(task));
        }
        for n in 0..=(i % 3) {
            let big = i == 7 && n == 0;
            events.push(Event::UpdateAppended {
                attempt: 1,
                event_id: format!("{task}-{i}-{n}"),
                kind: "progress".into(),
                data: vec![u8::try_from(i).unwrap(); if big { 40_000 } else { 100 }],
                metadata: vec![],
                at: Timestamp(10 + i),
            });
        }
        let appended = journal.append(task, lengths[t], &events).unwrap();
        lengths[t] = appended.next_position;
        ends.push(appended.last_seq);
    }
    // The crash image: the journal idle, every append synced and none flushed from the log.
    copy_dir(dir, image);
    ends
}

/// Opens the torn journal at `torn` (its log cut at `cut`) and checks it: it opens, its
/// records are the first of the commit order, each stream whole from position 0 and clean,
/// and it writes on. Returns how many records it held.
fn check_torn(torn: &Path, cut: usize) -> u64 {
    let journal = Journal::open(torn, JournalOptions::default())
        .unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
    let seqs: Vec<u64> = journal
        .commits(1)
        .map(|c| c.unwrap_or_else(|e| panic!("cut at {cut}: {e}")).record.seq)
        .collect();
    let held = u64::try_from(seqs.len()).unwrap();
    assert_eq!(seqs, (1..=held).collect::<Vec<_>>(), "cut at {cut}");
    assert_eq!(journal.last_seq().unwrap(), held, "cut at {cut}");
    let mut found = 0;
    for task in TORN_TASKS {
        let records: Vec<u64> = journal
            .read_stream(task, 0)
            .map(|r| r.unwrap_or_else(|e| panic!("cut at {cut}: {e}")).position)
            .collect();
        let n = u64::try_from(records.len()).unwrap();
        assert_eq!(
            records,
            (0..n).collect::<Vec<_>>(),
            "cut at {cut}, task {task}"
        );
        found += n;
    }
    assert_eq!(found, held, "cut at {cut}");
    if held > 0 {
        bulk_reads_agree(&journal, "a");
    }
    // The journal writes on where the cut left it.
    let next = u64::try_from(journal.read_stream("c", 0).count()).unwrap();
    let mut more = Vec::new();
    if next == 0 {
        more.push(created("c"));
    }
    more.push(heartbeat(99));
    let appended = journal.append("c", next, &more).unwrap();
    assert_eq!(
        appended.last_seq,
        held + u64::try_from(more.len()).unwrap(),
        "cut at {cut}"
    );
    drop(journal);
    let reopened = Journal::open_read_only(torn).unwrap();
    assert_eq!(reopened.last_seq().unwrap(), appended.last_seq);
    held
}

/// A power failure may tear the write-ahead log's tail: the bytes after the last sync lost,
/// or cut anywhere. Whatever the cut, the journal opens, every record it holds reads clean
/// (CRCs, chains, positions), the records are the first appends in commit order whole —
/// never a part of one, never one without the one before — the cut further on never holds
/// fewer, and the journal writes on where the cut left it.
#[test]
fn a_torn_log_tail_leaves_whole_appends_in_commit_order() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("image");
    let ends = torn_log_workload(&dir.path().join("live"), &image);
    let log_name = std::fs::read_dir(&image)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| Path::new(name).extension().is_some_and(|e| e == "log"))
        .max()
        .expect("a write-ahead log");
    let log = std::fs::read(image.join(&log_name)).unwrap();
    // Cuts at each record's end, a byte either side, and inside the next one's header.
    let mut cuts: Vec<usize> = log_record_ends(&log)
        .into_iter()
        .flat_map(|end| [end.saturating_sub(1), end, end + 1, end + 4])
        .chain([0, 1, log.len()])
        .filter(|cut| *cut <= log.len())
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    assert!(cuts.len() > 40, "{} cuts", cuts.len());
    let mut held_before = 0;
    for (i, cut) in cuts.iter().enumerate() {
        let torn = dir.path().join(format!("torn-{i}"));
        copy_dir(&image, &torn);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(torn.join(&log_name))
            .unwrap();
        file.set_len(u64::try_from(*cut).unwrap()).unwrap();
        drop(file);
        let held = check_torn(&torn, *cut);
        assert!(
            ends.contains(&held),
            "cut at {cut}: {held} records, part of an append"
        );
        assert!(held >= held_before, "cut at {cut}: {held} < {held_before}");
        held_before = held;
        std::fs::remove_dir_all(&torn).unwrap();
    }
    assert_eq!(
        Some(&held_before),
        ends.last(),
        "the whole log holds every append"
    );
}

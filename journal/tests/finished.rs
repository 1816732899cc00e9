//! Format 4 on RocksDB: with `JournalOptions::keep_finished_apart`, finished streams lie in a
//! column family of their own, out of the way of recovery's reads, and every read sees the
//! journal as before; without it they stay where they are; a stream lies wholly in one place
//! whichever way the option was set when; a format-3 journal is read as it is and upgraded in
//! place.
#![allow(clippy::unwrap_used)]

mod strategies;

use dtask_journal::keys::{self, Space, COLUMN_FAMILIES, FINISHED_EVENTS};
use dtask_journal::{Journal, JournalOptions, RecordFormat};
use std::path::Path;
use strategies::{completed, created, update};

/// Options with finished streams kept apart (the default, said here).
fn apart() -> JournalOptions {
    JournalOptions::default().with_keep_finished_apart(true)
}

/// Options with finished streams left among the live ones.
fn in_place() -> JournalOptions {
    JournalOptions::default().with_keep_finished_apart(false)
}

/// No positions.
const NONE: [u64; 0] = [];

/// The positions of `task`'s records in the raw column family `name`.
fn raw_positions(dir: &Path, name: &str, task: &str) -> Vec<u64> {
    let existing = rocksdb::DB::list_cf(&rocksdb::Options::default(), dir).unwrap();
    let db =
        rocksdb::DB::open_cf_for_read_only(&rocksdb::Options::default(), dir, &existing, false)
            .unwrap();
    let Some(cf) = db.cf_handle(name) else {
        return Vec::new();
    };
    let prefix = keys::task_prefix(task);
    db.prefix_iterator_cf(cf, &prefix)
        .map(Result::unwrap)
        .take_while(|(key, _)| key.starts_with(&prefix))
        .map(|(key, _)| keys::position_in(task, &key).unwrap())
        .collect()
}

/// Everything a reader can see of the journal: each task's records and head, the commit
/// order with the records it names, and the bulk reader's streams.
fn everything(journal: &Journal) -> Vec<String> {
    let mut seen = Vec::new();
    for task in journal.task_ids() {
        let task = task.unwrap();
        let head = journal.head(&task).unwrap().unwrap();
        seen.push(format!(
            "{task}: next {} last {} terminal {}",
            head.next_position, head.last_seq, head.terminal
        ));
        for record in journal.read_stream(&task, 0) {
            let record = record.unwrap();
            seen.push(format!("  {} {:?}", record.position, record.event));
        }
        let mut scanner = journal.stream_scanner();
        let raw = scanner.read(&task);
        let positions: Vec<u64> = raw.into_records().map(|r| r.unwrap().position).collect();
        seen.push(format!("  bulk {positions:?}"));
        seen.push(format!(
            "  record 1 {:?}",
            journal.raw_record(&task, 1).unwrap().map(|b| b.len())
        ));
    }
    for committed in journal.commits(1) {
        let committed = committed.unwrap();
        seen.push(format!(
            "commit {} {} {}",
            committed.record.seq, committed.task, committed.record.position
        ));
    }
    seen
}

/// A journal with a finished stream written in several batches ("done"), one finished in the
/// batch that created it ("quick"), a live one ("live"), and a live one whose id has "done"
/// as a prefix ("done-too").
fn build(dir: &Path) -> Vec<String> {
    build_with(dir, apart())
}

/// [`build`] with `options`.
fn build_with(dir: &Path, options: JournalOptions) -> Vec<String> {
    let journal = Journal::open(dir, options).unwrap();
    journal.append("done", 0, &[created("done")]).unwrap();
    journal.append("live", 0, &[created("live")]).unwrap();
    journal
        .append("done-too", 0, &[created("done-too")])
        .unwrap();
    journal.append("done", 1, &[update(1)]).unwrap();
    journal.append("live", 1, &[update(1)]).unwrap();
    journal
        .append("done", 2, &[update(2), completed()])
        .unwrap();
    journal
        .append("quick", 0, &[created("quick"), update(1), completed()])
        .unwrap();
    everything(&journal)
}

#[test]
fn a_finished_stream_is_stored_apart_and_read_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let before_close = build(dir.path());
    // The finished streams left `events` whole; the live ones stayed.
    assert_eq!(
        raw_positions(dir.path(), FINISHED_EVENTS, "done"),
        [0, 1, 2, 3]
    );
    assert_eq!(
        raw_positions(dir.path(), FINISHED_EVENTS, "quick"),
        [0, 1, 2]
    );
    assert_eq!(
        raw_positions(dir.path(), Space::Events.name(), "done"),
        NONE
    );
    assert_eq!(
        raw_positions(dir.path(), Space::Events.name(), "quick"),
        NONE
    );
    assert_eq!(
        raw_positions(dir.path(), Space::Events.name(), "live"),
        [0, 1]
    );
    assert_eq!(
        raw_positions(dir.path(), Space::Events.name(), "done-too"),
        [0]
    );
    assert_eq!(raw_positions(dir.path(), FINISHED_EVENTS, "live"), NONE);
    // Every reader sees what the writer saw.
    let reader = Journal::open_read_only(dir.path()).unwrap();
    assert_eq!(everything(&reader), before_close);
    drop(reader);
    let scratch = tempfile::tempdir().unwrap();
    let follower = Journal::open_follower(dir.path(), scratch.path()).unwrap();
    assert_eq!(everything(&follower), before_close);
    drop(follower);
    // A record written after the terminal one goes where its stream is.
    let journal = Journal::open(dir.path(), apart()).unwrap();
    assert_eq!(everything(&journal), before_close);
    journal.append("done", 4, &[update(4)]).unwrap();
    assert_eq!(journal.head("done").unwrap().unwrap().next_position, 5);
    drop(journal);
    assert_eq!(
        raw_positions(dir.path(), FINISHED_EVENTS, "done"),
        [0, 1, 2, 3, 4]
    );
    assert_eq!(
        raw_positions(dir.path(), Space::Events.name(), "done"),
        NONE
    );
}

#[test]
fn a_new_task_is_refused_over_a_finished_one() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let journal = Journal::open(dir.path(), apart()).unwrap();
    // The writer's check that a task is new looks among the finished streams too.
    assert!(matches!(
        journal.append("quick", 0, &[created("quick")]),
        Err(dtask_journal::Error::Conflict { actual: 3, .. })
    ));
    assert!(journal.contains_task("quick").unwrap());
    assert_eq!(journal.stream_len("quick").unwrap(), Some(3));
}

/// Turns the journal in `dir` (built with [`as_format_3`]) into what format 3 stored: every
/// stream in `events`, no `finished` column family, version 3, no record framing named.
fn make_format_3(dir: &Path) {
    let mut db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir, COLUMN_FAMILIES).unwrap();
    {
        let events = db.cf_handle(Space::Events.name()).unwrap();
        let finished = db.cf_handle(FINISHED_EVENTS).unwrap();
        let moved: Vec<_> = db
            .iterator_cf(finished, rocksdb::IteratorMode::Start)
            .map(Result::unwrap)
            .collect();
        for (key, value) in moved {
            db.put_cf(events, key, value).unwrap();
        }
        let meta = db.cf_handle(Space::Meta.name()).unwrap();
        db.put_cf(meta, keys::META_FORMAT_VERSION, 3u32.to_be_bytes())
            .unwrap();
        db.delete_cf(meta, keys::META_RECORD_FORMAT).unwrap();
    }
    db.drop_cf(FINISHED_EVENTS).unwrap();
}

/// The options of a journal to be made format 3: its records framed as format 3's were.
fn as_format_3() -> JournalOptions {
    apart().with_record_format(RecordFormat::BLAKE3)
}

#[test]
fn a_format_3_journal_is_read_as_it_is_and_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let built = build_with(dir.path(), as_format_3());
    make_format_3(dir.path());
    let families = rocksdb::DB::list_cf(&rocksdb::Options::default(), dir.path()).unwrap();
    assert!(!families.contains(&FINISHED_EVENTS.to_owned()));
    // Readers read it as it is, and leave it so.
    let reader = Journal::open_read_only(dir.path()).unwrap();
    assert_eq!(reader.format_version(), 3);
    assert_eq!(everything(&reader), built);
    drop(reader);
    let scratch = tempfile::tempdir().unwrap();
    let follower = Journal::open_follower(dir.path(), scratch.path()).unwrap();
    assert_eq!(everything(&follower), built);
    drop(follower);
    let families = rocksdb::DB::list_cf(&rocksdb::Options::default(), dir.path()).unwrap();
    assert!(!families.contains(&FINISHED_EVENTS.to_owned()));
    // A writer upgrades it in place: version 5, the column family made, the framing its
    // records have named, nothing moved.
    let journal = Journal::open(dir.path(), in_place()).unwrap();
    assert_eq!(
        journal.format_version(),
        dtask_journal::JOURNAL_FORMAT_VERSION
    );
    assert_eq!(journal.record_format(), RecordFormat::BLAKE3);
    assert_eq!(everything(&journal), built);
    drop(journal);
    assert_eq!(
        raw_positions(dir.path(), Space::Events.name(), "done"),
        [0, 1, 2, 3]
    );
    assert_eq!(raw_positions(dir.path(), FINISHED_EVENTS, "done"), NONE);
    // With the option, a finished stream of the older format moves, whole, when a record is
    // next written to it (in that batch); the others when the writer's sweep finds them.
    let journal = Journal::open(dir.path(), apart()).unwrap();
    journal.append("done", 4, &[update(4)]).unwrap();
    assert_eq!(
        raw_positions(dir.path(), Space::Events.name(), "done"),
        NONE
    );
    assert_eq!(
        raw_positions(dir.path(), FINISHED_EVENTS, "done"),
        [0, 1, 2, 3, 4]
    );
    journal.append("live", 2, &[completed()]).unwrap();
    journal.move_finished_now().unwrap();
    drop(journal);
    assert_eq!(
        raw_positions(dir.path(), FINISHED_EVENTS, "live"),
        [0, 1, 2]
    );
    assert_eq!(
        raw_positions(dir.path(), FINISHED_EVENTS, "quick"),
        [0, 1, 2]
    );
    assert_eq!(
        raw_positions(dir.path(), Space::Events.name(), "quick"),
        NONE
    );
    assert_eq!(
        raw_positions(dir.path(), Space::Events.name(), "done-too"),
        [0]
    );
    let reader = Journal::open_read_only(dir.path()).unwrap();
    let positions: Vec<u64> = reader
        .read_stream("done", 0)
        .map(|r| r.unwrap().position)
        .collect();
    assert_eq!(positions, [0, 1, 2, 3, 4]);
}

/// Writes, with finished streams left in place, two streams finished by a later append
/// ("a", "b"), a live one ("c") and a live one whose id has "a" as its prefix ("a-x").
fn build_in_place(dir: &Path) -> Vec<String> {
    let journal = Journal::open(dir, in_place()).unwrap();
    for task in ["a", "a-x", "b", "c"] {
        journal.append(task, 0, &[created(task)]).unwrap();
    }
    journal.append("a", 1, &[update(1), completed()]).unwrap();
    journal.append("b", 1, &[completed()]).unwrap();
    everything(&journal)
}

/// The finished streams a writer finds among the live ones at its open — left there by a run
/// with the option off, by an older format, or by a crash that lost the moves waiting — are
/// moved by the sweep of its first idle moments, or at once when asked; live streams stay.
#[test]
fn finished_streams_left_among_the_live_ones_are_swept_out() {
    let events = Space::Events.name();
    let moved = |dir: &Path| {
        raw_positions(dir, FINISHED_EVENTS, "a") == [0, 1, 2]
            && raw_positions(dir, FINISHED_EVENTS, "b") == [0, 1]
    };
    let stayed = |dir: &Path| {
        raw_positions(dir, events, "a").is_empty()
            && raw_positions(dir, events, "b").is_empty()
            && raw_positions(dir, events, "a-x") == [0]
            && raw_positions(dir, events, "c") == [0]
            && raw_positions(dir, FINISHED_EVENTS, "a-x").is_empty()
            && raw_positions(dir, FINISHED_EVENTS, "c").is_empty()
    };
    // Asked.
    let dir = tempfile::tempdir().unwrap();
    let built = build_in_place(dir.path());
    assert_eq!(raw_positions(dir.path(), events, "a"), [0, 1, 2]);
    let journal = Journal::open(dir.path(), apart()).unwrap();
    let swept = journal.move_finished_now().unwrap();
    assert_eq!(swept, 2, "no idle sweep before the open's first write");
    assert!(moved(dir.path()) && stayed(dir.path()));
    assert_eq!(everything(&journal), built);
    assert_eq!(journal.move_finished_now().unwrap(), 0);
    drop(journal);
    // When the journal idles after its first write (waited for, up to a minute); not
    // before, when a recovery's fold reads what the sweep would walk.
    let dir = tempfile::tempdir().unwrap();
    let built = build_in_place(dir.path());
    let journal = Journal::open(dir.path(), apart()).unwrap();
    assert_eq!(everything(&journal), built);
    journal.append("after", 0, &[created("after")]).unwrap();
    let written = everything(&journal);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !moved(dir.path()) {
        assert!(std::time::Instant::now() < deadline, "never swept");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(stayed(dir.path()));
    assert_eq!(everything(&journal), written);
}

#[test]
fn without_the_option_streams_stay_where_they_were_put_and_whole() {
    let dir = tempfile::tempdir().unwrap();
    // Kept apart in a first run: "done" and "quick" are moved.
    let built = build(dir.path());
    let events = Space::Events.name();
    // A second run without the option: a stream finished now stays in `events`, and records
    // written after the terminal one go where their stream lies.
    let journal = Journal::open(dir.path(), in_place()).unwrap();
    assert_eq!(everything(&journal), built);
    journal.append("live", 2, &[completed()]).unwrap();
    journal.append("live", 3, &[update(3)]).unwrap();
    journal.append("done", 4, &[update(4)]).unwrap();
    journal
        .append("fresh", 0, &[created("fresh"), completed()])
        .unwrap();
    journal.append("fresh", 2, &[update(2)]).unwrap();
    let seen = everything(&journal);
    drop(journal);
    assert_eq!(raw_positions(dir.path(), events, "live"), [0, 1, 2, 3]);
    assert_eq!(raw_positions(dir.path(), FINISHED_EVENTS, "live"), NONE);
    assert_eq!(
        raw_positions(dir.path(), FINISHED_EVENTS, "done"),
        [0, 1, 2, 3, 4]
    );
    assert_eq!(raw_positions(dir.path(), events, "done"), NONE);
    assert_eq!(raw_positions(dir.path(), events, "fresh"), [0, 1, 2]);
    assert_eq!(raw_positions(dir.path(), FINISHED_EVENTS, "fresh"), NONE);
    // Reopened (the writer learns again that streams were moved) and kept apart once more:
    // a stream left in `events` moves whole when next written to.
    let journal = Journal::open(dir.path(), in_place()).unwrap();
    assert_eq!(everything(&journal), seen);
    journal.append("done", 5, &[update(5)]).unwrap();
    drop(journal);
    assert_eq!(
        raw_positions(dir.path(), FINISHED_EVENTS, "done"),
        [0, 1, 2, 3, 4, 5]
    );
    let journal = Journal::open(dir.path(), apart()).unwrap();
    journal.append("live", 4, &[update(4)]).unwrap();
    drop(journal);
    assert_eq!(raw_positions(dir.path(), events, "live"), NONE);
    assert_eq!(
        raw_positions(dir.path(), FINISHED_EVENTS, "live"),
        [0, 1, 2, 3, 4]
    );
}

/// A follower opened before any stream was moved reads a stream its writer moves later, once
/// it catches up; so does a reader of the writer's own handle.
#[test]
fn a_follower_reads_a_stream_moved_after_it_opened() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), apart()).unwrap();
    journal.append("t", 0, &[created("t"), update(1)]).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let follower = Journal::open_follower(dir.path(), scratch.path()).unwrap();
    assert_eq!(follower.read_stream("t", 0).count(), 2);
    journal.append("t", 2, &[completed()]).unwrap();
    // Its move waits for an idle moment: made now.
    journal.move_finished_now().unwrap();
    // Moved: gone from `events`, whole in `finished`, and the writer's reads see it.
    let positions =
        |j: &Journal| -> Vec<u64> { j.read_stream("t", 0).map(|r| r.unwrap().position).collect() };
    assert_eq!(positions(&journal), [0, 1, 2]);
    follower.catch_up().unwrap();
    assert_eq!(positions(&follower), [0, 1, 2]);
    assert!(follower.head("t").unwrap().unwrap().terminal);
    assert_eq!(follower.stream_scanner().read("t").len(), 3);
    drop(follower);
    drop(journal);
    assert_eq!(raw_positions(dir.path(), FINISHED_EVENTS, "t"), [0, 1, 2]);
}

/// A stream finished by a later append moves once the journal has been idle a moment,
/// while the writer stays open; nothing a reader sees changes meanwhile.
#[test]
fn a_stream_finished_later_moves_once_the_journal_is_idle() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), apart()).unwrap();
    journal.append("t", 0, &[created("t"), update(1)]).unwrap();
    journal.append("live", 0, &[created("live")]).unwrap();
    journal.append("t", 2, &[completed()]).unwrap();
    let seen = everything(&journal);
    // The writer moves it after 20 ms without appends; waited for, up to a minute.
    let events = Space::Events.name();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while raw_positions(dir.path(), FINISHED_EVENTS, "t") != [0, 1, 2] {
        assert!(std::time::Instant::now() < deadline, "never moved");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(raw_positions(dir.path(), events, "t"), NONE);
    assert_eq!(raw_positions(dir.path(), events, "live"), [0]);
    assert_eq!(everything(&journal), seen);
    assert_eq!(journal.move_finished_now().unwrap(), 0);
}

/// A follower of a format-3 journal whose writer upgrades it is told to open it again at its
/// next catch-up, rather than reading on without the finished streams' column family.
#[test]
fn a_follower_is_told_when_its_writer_upgrades_the_format() {
    let dir = tempfile::tempdir().unwrap();
    build_with(dir.path(), as_format_3());
    make_format_3(dir.path());
    let scratch = tempfile::tempdir().unwrap();
    let follower = Journal::open_follower(dir.path(), scratch.path()).unwrap();
    assert_eq!(follower.format_version(), 3);
    follower.catch_up().unwrap();
    let journal = Journal::open(dir.path(), apart()).unwrap();
    journal.append("live", 2, &[completed()]).unwrap();
    assert!(matches!(
        follower.catch_up(),
        Err(dtask_journal::Error::FormatChanged { opened: 3, now })
            if now == dtask_journal::JOURNAL_FORMAT_VERSION
    ));
    drop(follower);
    let scratch = tempfile::tempdir().unwrap();
    let follower = Journal::open_follower(dir.path(), scratch.path()).unwrap();
    follower.catch_up().unwrap();
    assert_eq!(follower.read_stream("live", 0).count(), 3);
}

/// A follower is told when its writer — a newer build — stamps a format newer than this
/// build reads, whatever format the follower opened (it read on, and failed at each record
/// of the new format, or misread it).
#[test]
fn a_follower_is_told_when_the_format_becomes_newer_than_its_build() {
    let dir = tempfile::tempdir().unwrap();
    build_with(dir.path(), apart());
    let scratch = tempfile::tempdir().unwrap();
    let follower = Journal::open_follower(dir.path(), scratch.path()).unwrap();
    follower.catch_up().unwrap();
    let newer = dtask_journal::JOURNAL_FORMAT_VERSION + 1;
    {
        // What a newer build's writer does at its open.
        let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir.path(), COLUMN_FAMILIES)
            .unwrap();
        let meta = db.cf_handle(Space::Meta.name()).unwrap();
        db.put_cf(meta, keys::META_FORMAT_VERSION, newer.to_be_bytes())
            .unwrap();
        db.flush_wal(true).unwrap();
    }
    assert!(matches!(
        follower.catch_up(),
        Err(dtask_journal::Error::UnsupportedFormat { found, .. }) if found == newer
    ));
}

/// A journal of an older format whose commit index does not end where its tail marker says
/// is refused by a writer's open — and left as it was: not stamped with this build's format
/// (the build it came from would refuse it too).
#[test]
fn an_inconsistent_journal_of_an_older_format_is_refused_without_an_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    build_with(dir.path(), as_format_3());
    make_format_3(dir.path());
    let empty = tempfile::tempdir().unwrap();
    drop(Journal::open(empty.path(), apart()).unwrap());
    let empty_tail = {
        let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), empty.path(), COLUMN_FAMILIES)
            .unwrap();
        let meta = db.cf_handle(Space::Meta.name()).unwrap();
        db.get_cf(meta, keys::META_TAIL).unwrap().unwrap()
    };
    let stored = |dir: &Path| {
        let db = rocksdb::DB::open_cf_for_read_only(
            &rocksdb::Options::default(),
            dir,
            COLUMN_FAMILIES.iter().filter(|cf| **cf != FINISHED_EVENTS),
            false,
        )
        .unwrap();
        let meta = db.cf_handle(Space::Meta.name()).unwrap();
        db.get_cf(meta, keys::META_FORMAT_VERSION).unwrap().unwrap()
    };
    {
        let cfs = COLUMN_FAMILIES.iter().filter(|cf| **cf != FINISHED_EVENTS);
        let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir.path(), cfs).unwrap();
        let meta = db.cf_handle(Space::Meta.name()).unwrap();
        db.put_cf(meta, keys::META_TAIL, &empty_tail).unwrap();
    }
    assert!(matches!(
        Journal::open(dir.path(), apart()),
        Err(dtask_journal::Error::Inconsistent(_))
    ));
    assert_eq!(stored(dir.path()), 3u32.to_be_bytes());
}

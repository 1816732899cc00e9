//! The journal on a real PostgreSQL (`DTASK_TEST_PG_URL`, set by `./dev test` and CI): the
//! same records and readers as on RocksDB, the database deciding every expected position, two
//! journals ("nodes") on one database racing, commit order across them, the schema's version,
//! and a clear error when the database cannot be reached. Each test has a schema of its own.
//! Without the variable every test says loudly that it was skipped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod strategies;

use dtask_journal::{
    Durability, Error, Event, EventType, Journal, JournalOptions, RecordFormat, Timestamp,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use strategies::{completed, created, update};

/// A fresh schema's journal URL, or `None` (and a loud line) without a database.
fn url(test: &str) -> Option<String> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let Ok(base) = std::env::var("DTASK_TEST_PG_URL") else {
        eprintln!("SKIPPED {test}: DTASK_TEST_PG_URL is not set (./dev test sets it)");
        return None;
    };
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let schema = format!("j{}_{n}_{}", std::process::id(), test.len());
    let sep = if base.contains('?') { '&' } else { '?' };
    Some(format!("{base}{sep}schema={schema}"))
}

fn open(url: &str) -> Journal {
    Journal::open_postgres(url, JournalOptions::default()).unwrap()
}

/// Batches of the commit order resolved to seals only (the import's read-back) name the same
/// records with the same seals on both backends (by a range of sequences on PostgreSQL, by
/// key on RocksDB) as the records read one at a time.
fn sealed_batches_match(pg: &Journal, rocks: &Journal) {
    let sealed = |j: &Journal| -> Vec<(String, u64, u64, String, u32)> {
        let mut fetcher = j.record_fetcher();
        j.commit_batches(1, 4)
            .flat_map(|batch| batch.into_sealed(&mut fetcher).collect::<Vec<_>>())
            .map(|s| {
                let s = s.unwrap();
                (s.task, s.position, s.seq, s.digest.to_hex(), s.crc)
            })
            .collect()
    };
    let whole: Vec<_> = rocks
        .commits(1)
        .map(|c| {
            let c = c.unwrap();
            let r = c.record;
            (c.task, r.position, r.seq, r.digest.to_hex(), r.crc)
        })
        .collect();
    assert!(!whole.is_empty());
    assert_eq!(sealed(pg), whole);
    assert_eq!(sealed(rocks), whole);
}

#[test]
fn appends_reads_and_indexes_match_the_embedded_journal() {
    let Some(url) = url("appends_reads") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let rocks = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let pg = open(&url);
    for journal in [&rocks, &pg] {
        journal.append("a", 0, &[created("a"), update(1)]).unwrap();
        journal.append("b", 0, &[created("b")]).unwrap();
        journal.append("a", 2, &[update(2), completed()]).unwrap();
        let stale = journal.append("a", 1, &[update(3)]);
        assert!(
            matches!(
                stale,
                Err(Error::Conflict {
                    expected: 1,
                    actual: 4,
                    ..
                })
            ),
            "{stale:?}"
        );
        journal
            .append(
                "b",
                1,
                &[Event::NotificationEnqueued {
                    id: "b:1:done".into(),
                    event_id: "n1".into(),
                    kind: "done".into(),
                    data: vec![],
                    version: 1,
                    at: Timestamp(3),
                }],
            )
            .unwrap();
    }
    // The same bytes, at the same keys, in the same order.
    let records = |j: &Journal, task: &str| -> Vec<(u64, u64, Vec<u8>)> {
        j.read_stream(task, 0)
            .map(|r| {
                let r = r.unwrap();
                (r.position, r.seq, r.digest.0.to_vec())
            })
            .collect()
    };
    for task in ["a", "b"] {
        assert_eq!(records(&rocks, task), records(&pg, task), "task {task}");
    }
    let ids = |j: &Journal| -> Vec<String> { j.task_ids().map(Result::unwrap).collect() };
    assert_eq!(ids(&pg), ["a", "b"]);
    assert_eq!(ids(&rocks), ids(&pg));
    let live = |j: &Journal| -> Vec<String> { j.live_tasks().map(Result::unwrap).collect() };
    assert_eq!(live(&pg), ["b"]);
    let commits = |j: &Journal| -> Vec<(String, u64)> {
        j.commits(1)
            .map(|c| {
                let c = c.unwrap();
                (c.task, c.record.seq)
            })
            .collect()
    };
    assert_eq!(commits(&rocks), commits(&pg));
    // Batches of the commit order resolved by a fetcher (export's path): by key on RocksDB,
    // by a range of sequences on PostgreSQL; the same records.
    let batched = |j: &Journal| -> Vec<(String, u64, u64)> {
        let mut fetcher = j.record_fetcher();
        j.commit_batches(1, 4)
            .flat_map(|batch| batch.into_committed(&mut fetcher).collect::<Vec<_>>())
            .map(|c| {
                let c = c.unwrap();
                (c.task, c.record.position, c.record.seq)
            })
            .collect()
    };
    assert_eq!(batched(&pg).len(), 6);
    assert_eq!(batched(&rocks), batched(&pg));
    sealed_batches_match(&pg, &rocks);
    assert_eq!(pg.last_seq().unwrap(), 6);
    assert_eq!(pg.outbox_len().unwrap(), 1);
    // The outbox's entries from a sequence on, and one entry's record: as on RocksDB.
    let entries = |j: &Journal| j.outbox_entries(0).collect::<Result<Vec<_>, _>>().unwrap();
    assert_eq!(entries(&pg), entries(&rocks));
    let queued = entries(&pg)[0].seq;
    assert_eq!(pg.outbox_entries(queued).count(), 0);
    assert_eq!(pg.queued(queued).unwrap(), rocks.queued(queued).unwrap());
    assert!(pg.queued(queued).unwrap().is_some());
    assert_eq!(pg.queued(queued - 1).unwrap(), None);
    let head = pg.head("a").unwrap().unwrap();
    assert_eq!((head.next_position, head.terminal), (4, true));
    assert_eq!(
        pg.task_ids_from(Some("a"))
            .map(Result::unwrap)
            .collect::<Vec<_>>(),
        ["b"]
    );
    assert_eq!(
        pg.raw_record("b", 0).unwrap(),
        rocks.raw_record("b", 0).unwrap()
    );
    assert!(pg.location().contains("schema"));
    assert!(!pg.location().contains("password"));
    // RocksDB reports its memtables and table files; PostgreSQL keeps statistics of its own.
    assert!(rocks.storage_stats().unwrap().is_some());
    assert_eq!(pg.storage_stats().unwrap(), None);
}

#[test]
fn a_reopened_journal_and_a_reader_see_everything() {
    let Some(url) = url("reopen") else {
        return;
    };
    {
        let pg = open(&url);
        for i in 0..50 {
            let task = format!("t{i:02}");
            pg.append(&task, 0, &[created(&task), update(i)]).unwrap();
        }
    }
    let pg = open(&url);
    assert_eq!(pg.task_ids().count(), 50);
    pg.append("t00", 2, &[completed()]).unwrap();
    assert_eq!(pg.last_seq().unwrap(), 101);
    let reader = Journal::open_postgres_read_only(&url).unwrap();
    assert!(reader.is_read_only());
    assert_eq!(reader.live_tasks().count(), 49);
    assert!(matches!(
        reader.append("t01", 2, &[completed()]),
        Err(Error::ReadOnly)
    ));
    // Pages of the scans: a stream longer than a first page reads whole and in order.
    for i in 0..200 {
        pg.append(
            "long",
            i,
            &[if i == 0 { created("long") } else { update(i) }],
        )
        .unwrap();
    }
    let positions: Vec<u64> = reader
        .read_stream("long", 0)
        .map(|r| r.unwrap().position)
        .collect();
    assert_eq!(positions, (0..200).collect::<Vec<_>>());
}

#[test]
fn two_nodes_racing_for_one_position_exactly_one_wins() {
    let Some(url) = url("race") else {
        return;
    };
    let nodes = [open(&url), open(&url)];
    nodes[0].append("t", 0, &[created("t")]).unwrap();
    for round in 1..=100u64 {
        let barrier = Arc::new(Barrier::new(2));
        let outcomes: Vec<_> = nodes
            .iter()
            .map(|node| {
                let node = node.clone();
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    barrier.wait();
                    node.append("t", round, &[update(round)])
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let won = outcomes.iter().filter(|o| o.is_ok()).count();
        assert_eq!(won, 1, "round {round}: {outcomes:?}");
        let lost = outcomes.iter().find(|o| o.is_err()).unwrap();
        assert!(
            matches!(lost, Err(Error::Conflict { expected, actual, .. }) if *expected == round && *actual == round + 1),
            "round {round}: {lost:?}"
        );
    }
    // Every record verifies (chain and CRC) and the stream has no gap.
    let reader = Journal::open_postgres_read_only(&url).unwrap();
    let positions: Vec<u64> = reader
        .read_stream("t", 0)
        .map(|r| r.unwrap().position)
        .collect();
    assert_eq!(positions, (0..=100).collect::<Vec<_>>());
}

#[test]
fn a_node_forgets_the_heads_another_node_moved_listed_with_the_lock_or_read_from_the_index() {
    let Some(url) = url("forget") else {
        return;
    };
    let (a, b) = (open(&url), open(&url));
    // A holds the heads of both streams.
    a.append("t0", 0, &[created("t0")]).unwrap();
    a.append("t1", 0, &[created("t1")]).unwrap();
    // B moves t0: A's next lock lists it, and A builds on B's record, not on its cached head
    // (which would refuse position 2 as a conflict).
    b.append("t0", 1, &[update(1)]).unwrap();
    a.append("t0", 2, &[update(2)]).unwrap();
    // B moves t1 and more streams than a lock lists: A forgets every head instead.
    b.append("t1", 1, &[update(1)]).unwrap();
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let b = b.clone();
            std::thread::spawn(move || {
                for i in (t..=dtask_journal::WRITTEN_SINCE_MAX).step_by(16) {
                    let task = format!("many-{i}");
                    b.append(&task, 0, &[created(&task)]).unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    a.append("t1", 2, &[update(2)]).unwrap();
    // And B, in turn, builds on A's records.
    b.append("t0", 3, &[update(3)]).unwrap();
    b.append("t1", 3, &[update(3)]).unwrap();
    let reader = Journal::open_postgres_read_only(&url).unwrap();
    for task in ["t0", "t1"] {
        let positions: Vec<u64> = reader
            .read_stream(task, 0)
            .map(|r| r.unwrap().position)
            .collect();
        assert_eq!(positions, vec![0, 1, 2, 3], "{task}");
    }
}

#[test]
fn sequences_across_nodes_are_dense_and_in_commit_order() {
    let Some(url) = url("order") else {
        return;
    };
    let nodes: Vec<Journal> = (0..3).map(|_| open(&url)).collect();
    let threads: Vec<_> = nodes
        .iter()
        .enumerate()
        .flat_map(|(n, node)| {
            (0..4).map(move |w| {
                let node = node.clone();
                std::thread::spawn(move || {
                    let task = format!("n{n}w{w}");
                    node.append(&task, 0, &[created(&task)]).unwrap();
                    for i in 1..40 {
                        node.append(&task, i, &[update(i)]).unwrap();
                    }
                })
            })
        })
        .collect();
    // A reader following the commit order while they write never sees a gap.
    let reader = Journal::open_postgres_read_only(&url).unwrap();
    let mut next = 1;
    while threads.iter().any(|t| !t.is_finished()) {
        for c in reader.commits(next) {
            let c = c.unwrap();
            assert_eq!(c.record.seq, next, "a reader skipped a sequence");
            next += 1;
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    let all: Vec<u64> = reader.commits(1).map(|c| c.unwrap().record.seq).collect();
    assert_eq!(all, (1..=3 * 4 * 40).collect::<Vec<_>>());
    let types: usize = reader
        .commits(1)
        .filter(|c| c.as_ref().unwrap().record.event.event_type() == EventType::Created)
        .count();
    assert_eq!(types, 12);
}

#[test]
fn a_newer_schema_is_refused_with_both_versions() {
    let Some(url) = url("newer") else {
        return;
    };
    drop(open(&url));
    let schema = url.rsplit_once("schema=").unwrap().1.to_owned();
    let base = url.split_once('?').unwrap().0.to_owned();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, conn) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
            .batch_execute(&format!(
                "INSERT INTO \"{schema}\".dtask_schema (version) VALUES (99)"
            ))
            .await
            .unwrap();
    });
    let refused = Journal::open_postgres(&url, JournalOptions::default());
    assert!(
        matches!(
            refused,
            Err(Error::UnsupportedSchema {
                found: 99,
                supported: dtask_journal::postgres::SCHEMA_VERSION
            })
        ),
        "{refused:?}"
    );
    assert!(Journal::open_postgres_read_only(&url).is_err());
}

/// A new journal on PostgreSQL frames its records in SHA-256 and names it; one of journal
/// format 4 (BLAKE3 records, no framing named) is upgraded to 5 at a writer's open, keeps
/// BLAKE3, and its streams chain on across the upgrade — on any node.
#[test]
fn a_new_journal_chains_with_sha256_and_a_format_4_one_keeps_blake3() {
    let Some(new) = url("record-format") else {
        return;
    };
    let journal = open(&new);
    assert_eq!(
        journal.format_version(),
        dtask_journal::JOURNAL_FORMAT_VERSION
    );
    assert_eq!(journal.record_format(), RecordFormat::SHA256);
    drop(journal);

    let Some(old) = url("record-format-4") else {
        return;
    };
    let blake3 = JournalOptions::default().with_record_format(RecordFormat::BLAKE3);
    let journal = Journal::open_postgres(&old, blake3).unwrap();
    assert_eq!(journal.record_format(), RecordFormat::BLAKE3);
    journal.append("t", 0, &[created("t")]).unwrap();
    drop(journal);
    let schema = old.rsplit_once("schema=").unwrap().1.to_owned();
    admin(&format!(
        "DELETE FROM \"{schema}\".dtask_meta WHERE name = 'record_format'::bytea; \
         UPDATE \"{schema}\".dtask_meta SET value = '\\x00000004'::bytea \
         WHERE name = 'format_version'::bytea"
    ));
    let reader = Journal::open_postgres_read_only(&old).unwrap();
    assert_eq!(reader.format_version(), 4);
    assert_eq!(reader.record_format(), RecordFormat::BLAKE3);
    drop(reader);
    let (a, b) = (open(&old), open(&old));
    assert_eq!(a.format_version(), dtask_journal::JOURNAL_FORMAT_VERSION);
    assert_eq!(b.record_format(), RecordFormat::BLAKE3);
    a.append("t", 1, &[update(1)]).unwrap();
    b.append("t", 2, &[update(2)]).unwrap();
    let records: Vec<_> = a.read_stream("t", 0).map(Result::unwrap).collect();
    assert_eq!(records.len(), 3);
    assert_eq!(b.head("t").unwrap().unwrap().last_digest, records[2].digest);
}

#[test]
fn an_unreachable_database_is_named_in_the_error() {
    // Nothing listens on port 1 of loopback.
    let refused = Journal::open_postgres(
        "postgres://nobody@127.0.0.1:1/nothing",
        JournalOptions::default(),
    );
    let message = refused.unwrap_err().to_string();
    assert!(message.contains("127.0.0.1:1"), "{message}");
    assert!(message.contains("cannot connect"), "{message}");
    let malformed =
        Journal::open_postgres("postgres://host:notaport/db", JournalOptions::default());
    assert!(
        matches!(malformed, Err(Error::InvalidLocation(_))),
        "{malformed:?}"
    );
}

#[test]
fn buffered_durability_and_linked_appends_work_the_same() {
    let Some(url) = url("linked") else {
        return;
    };
    let pg = Journal::open_postgres(
        &url,
        JournalOptions::default().with_durability(Durability::Buffered),
    )
    .unwrap();
    pg.append("p", 0, &[created("p")]).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        pg.append_linked_async("c", 0, &[created("c")], &[("p", 1, &[update(1)])])
            .await
            .unwrap();
        // A stale part fails the whole append: neither stream moves.
        let stale = pg
            .append_linked_async("c", 1, &[update(2)], &[("p", 1, &[update(3)])])
            .await;
        assert!(matches!(stale, Err(Error::Conflict { .. })), "{stale:?}");
    });
    assert_eq!(pg.stream_len("p").unwrap(), Some(2));
    assert_eq!(pg.stream_len("c").unwrap(), Some(1));
}

/// Runs `sql` on the test database (outside any journal).
fn admin(sql: &str) {
    let base = std::env::var("DTASK_TEST_PG_URL").unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, conn) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client.batch_execute(sql).await.unwrap();
    });
}

#[test]
fn connections_cut_under_load_fail_typed_and_lose_nothing_acknowledged() {
    let Some(url) = url("cut") else {
        return;
    };
    let schema = url.rsplit_once("schema=").unwrap().1.to_owned();
    let journal = open(&url);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..6)
        .map(|w| {
            let journal = journal.clone();
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let task = format!("w{w}");
                let mut acknowledged = Vec::new();
                let mut failed = 0;
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    // Where the stream really is: an append that failed may have committed.
                    let Ok(position) = journal.stream_len(&task).map(Option::unwrap_or_default)
                    else {
                        failed += 1;
                        continue;
                    };
                    let event = if position == 0 {
                        created(&task)
                    } else {
                        update(i)
                    };
                    i += 1;
                    match journal.append(&task, position, &[event]) {
                        Ok(_) => acknowledged.push(position),
                        Err(Error::Storage(_) | Error::Conflict { .. }) => failed += 1,
                        Err(other) => panic!("an untyped failure: {other:?}"),
                    }
                }
                (task, acknowledged, failed)
            })
        })
        .collect();
    // The server drops every connection of this journal, five times, as a restart would.
    for _ in 0..5 {
        std::thread::sleep(std::time::Duration::from_millis(150));
        admin(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = 'dtask:{schema}'"
        ));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let mut failures = 0;
    let reader = Journal::open_postgres_read_only(&url).unwrap();
    for writer in writers {
        let (task, acknowledged, failed) = writer.join().unwrap();
        failures += failed;
        // Every acknowledged append is there, and the stream verifies (CRC and chain).
        let positions: Vec<u64> = reader
            .read_stream(&task, 0)
            .map(|r| r.unwrap().position)
            .collect();
        assert!(!acknowledged.is_empty(), "{task} never appended");
        for position in &acknowledged {
            assert!(positions.contains(position), "{task}@{position} lost");
        }
    }
    assert!(failures > 0, "no append saw a connection cut");
    // The journal goes on after the cuts.
    let len = journal.stream_len("w0").unwrap().unwrap();
    journal.append("w0", len, &[update(999_999)]).unwrap();
}

#[test]
fn an_older_schema_is_migrated_at_open_and_keeps_its_records() {
    let Some(url) = url("older") else {
        return;
    };
    let schema = url.rsplit_once("schema=").unwrap().1.to_owned();
    {
        let pg = open(&url);
        pg.append("a", 0, &[created("a")]).unwrap();
    }
    // Back to schema version 1: as a journal made by the build before version 2 was.
    admin(&format!(
        "SET search_path TO \"{schema}\"; {BACK_TO_2} DROP FUNCTION dtask_expect_tail(bytea); \
         DELETE FROM dtask_schema WHERE version = 2"
    ));
    // A reader leaves it as it is and says so; a writer migrates it.
    let reader = Journal::open_postgres_read_only(&url).unwrap();
    assert_eq!(reader.schema_version(), Some(1));
    drop(reader);
    let pg = open(&url);
    assert_eq!(
        pg.schema_version(),
        Some(dtask_journal::postgres::SCHEMA_VERSION)
    );
    for i in 1..20 {
        pg.append("a", i, &[update(i)]).unwrap();
    }
    assert_eq!(pg.stream_len("a").unwrap(), Some(20));
    let reader = Journal::open_postgres_read_only(&url).unwrap();
    assert_eq!(reader.read_stream("a", 0).count(), 20);
}

/// Takes a schema of version 4 back to version 2 (run with the schema on the search path):
/// batches written as pipelined statements again (version 3), and the writer lock the row of
/// `dtask_writer` again.
const BACK_TO_2: &str = "DROP FUNCTION dtask_write_batch; \
     DELETE FROM dtask_schema WHERE version = 4; \
     DROP FUNCTION dtask_lock_writer(); \
     CREATE TABLE dtask_writer (id integer PRIMARY KEY CHECK (id = 1)); \
     INSERT INTO dtask_writer (id) VALUES (1); \
     DELETE FROM dtask_schema WHERE version = 3;";

/// A connection of the test's own to the test database, with `schema` on its search path, and
/// a runtime to drive it.
fn raw(schema: &str) -> (tokio::runtime::Runtime, tokio_postgres::Client) {
    let base = std::env::var("DTASK_TEST_PG_URL").unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = runtime.block_on(async {
        let (client, conn) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
            .batch_execute(&format!("SET search_path TO \"{schema}\""))
            .await
            .unwrap();
        client
    });
    (runtime, client)
}

/// Whether a session comes to wait for a lock the server process `pid` holds (asked of the
/// server over `watch` until it does, for up to a minute).
fn blocked_by(runtime: &tokio::runtime::Runtime, watch: &tokio_postgres::Client, pid: i32) -> bool {
    sessions_blocked_by(runtime, watch, pid, 1)
}

/// Whether `sessions` sessions come to wait for a lock the server process `pid` holds (asked
/// of the server over `watch` until they do, for up to a minute).
fn sessions_blocked_by(
    runtime: &tokio::runtime::Runtime,
    watch: &tokio_postgres::Client,
    pid: i32,
    sessions: i64,
) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let row = runtime
            .block_on(watch.query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND $1 = ANY(pg_blocking_pids(pid))",
                &[&pid],
            ))
            .unwrap();
        if row.get::<_, i64>(0) == sessions {
            return true;
        }
        std::thread::yield_now();
    }
    false
}

/// How a node of the build before schema version 3 began each batch.
const OLD_LOCK: &str = "BEGIN; SELECT id FROM dtask_writer WHERE id = 1 FOR UPDATE";

/// A node of the build before schema version 3 takes the writer lock as a row lock; the
/// upgrade to version 3 (an open of this build) waits for its batch in flight, then drops the
/// row's table, so that the earlier node's next batch fails instead of writing beside the
/// upgraded nodes, which take an advisory lock the row lock does not exclude.
#[test]
fn an_upgrade_fences_off_the_nodes_of_the_earlier_version() {
    let Some(url) = url("fence") else {
        return;
    };
    let schema = url.rsplit_once("schema=").unwrap().1.to_owned();
    drop(open(&url));
    admin(&format!("SET search_path TO \"{schema}\"; {BACK_TO_2}"));
    // The earlier node, in the middle of a batch: it holds the row lock.
    let (runtime, old) = raw(&schema);
    runtime.block_on(old.batch_execute(OLD_LOCK)).unwrap();
    let old_pid: i32 = runtime
        .block_on(old.query_one("SELECT pg_backend_pid()", &[]))
        .unwrap()
        .get(0);
    let upgrading = std::thread::spawn({
        let url = url.clone();
        move || {
            let journal = open(&url);
            journal.append("after", 0, &[created("after")]).unwrap();
            journal
        }
    });
    // The upgrade waits on the earlier node's lock (seen from the server's side) …
    let (watch_runtime, watch) = raw(&schema);
    assert!(
        blocked_by(&watch_runtime, &watch, old_pid),
        "the upgrade did not wait for the earlier node's batch"
    );
    assert!(!upgrading.is_finished());
    // … which commits; the upgrade goes on, and the upgraded node appends.
    runtime.block_on(old.batch_execute("COMMIT")).unwrap();
    let journal = upgrading.join().unwrap();
    assert_eq!(journal.stream_len("after").unwrap(), Some(1));
    // The earlier node's next batch fails: its lock is gone.
    let fenced = runtime.block_on(old.batch_execute(OLD_LOCK)).unwrap_err();
    assert_eq!(
        fenced.code(),
        Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE),
        "{fenced}"
    );
    runtime.block_on(old.batch_execute("ROLLBACK")).unwrap();
    // And an open of the earlier version would be refused: the schema says 3.
    let version = watch_runtime
        .block_on(watch.query_one("SELECT max(version) FROM dtask_schema", &[]))
        .unwrap();
    assert_eq!(
        u32::try_from(version.get::<_, i32>(0)).unwrap(),
        dtask_journal::postgres::SCHEMA_VERSION
    );
}

/// A node of the build before schema version 4 writes its batches as pipelined statements
/// under the same advisory lock that `dtask_write_batch` takes: while such a node holds it in
/// the middle of a batch, an upgraded node's append waits for it, and goes on after its commit.
#[test]
fn the_batch_call_waits_for_the_writer_lock_an_earlier_node_holds() {
    let Some(url) = url("call-lock") else {
        return;
    };
    let schema = url.rsplit_once("schema=").unwrap().1.to_owned();
    let journal = open(&url);
    journal.append("a", 0, &[created("a")]).unwrap();
    // The earlier node, in the middle of a batch: it holds the lock.
    let (runtime, old) = raw(&schema);
    runtime
        .block_on(old.batch_execute("BEGIN; SELECT dtask_lock_writer()"))
        .unwrap();
    let old_pid: i32 = runtime
        .block_on(old.query_one("SELECT pg_backend_pid()", &[]))
        .unwrap()
        .get(0);
    let appending = std::thread::spawn({
        let journal = journal.clone();
        move || journal.append("a", 1, &[update(1)]).map(|_| ())
    });
    let (watch_runtime, watch) = raw(&schema);
    assert!(
        blocked_by(&watch_runtime, &watch, old_pid),
        "the append did not wait for the earlier node's lock"
    );
    assert!(!appending.is_finished());
    assert_eq!(journal.stream_len("a").unwrap(), Some(1));
    runtime.block_on(old.batch_execute("COMMIT")).unwrap();
    appending.join().unwrap().unwrap();
    assert_eq!(journal.stream_len("a").unwrap(), Some(2));
    let reader = Journal::open_postgres_read_only(&url).unwrap();
    assert_eq!(reader.read_stream("a", 0).count(), 2);
}

/// The writer lock's design reads in READ COMMITTED: a batch that waited for the lock reads
/// the tail the batch before it committed, in a snapshot taken after the wait. With
/// `default_transaction_isolation` set to serializable for the journal's sessions (here by the
/// URL's `options`, as a database's or a role's default would), the journal still reads
/// committed: two nodes waiting behind the lock — one on its careful way, whose transaction
/// would otherwise have taken its snapshot before the wait — both append once it is free,
/// each on the other's commit.
#[test]
fn nodes_waiting_for_the_writer_lock_read_what_was_committed_whatever_the_default_isolation() {
    let Some(url) = url("isolation") else {
        return;
    };
    let schema = url.rsplit_once("schema=").unwrap().1.to_owned();
    let url = format!("{url}&options=-c%20default_transaction_isolation%3Dserializable");
    let first = open(&url);
    first.append("a", 0, &[created("a")]).unwrap();
    // A node that has not written yet: its first batch takes the careful way, the lock and
    // the tail's read in one transaction.
    let second = open(&url);
    let (runtime, holder) = raw(&schema);
    runtime
        .block_on(holder.batch_execute("BEGIN; SELECT dtask_lock_writer()"))
        .unwrap();
    let holder_pid: i32 = runtime
        .block_on(holder.query_one("SELECT pg_backend_pid()", &[]))
        .unwrap()
        .get(0);
    let (watch_runtime, watch) = raw(&schema);
    // The first node waits first (the lock is granted in that order), then the second.
    let appending_first = std::thread::spawn({
        let first = first.clone();
        move || first.append("a", 1, &[update(1)]).map(|_| ())
    });
    assert!(sessions_blocked_by(&watch_runtime, &watch, holder_pid, 1));
    let appending_second = std::thread::spawn({
        let second = second.clone();
        move || second.append("b", 0, &[created("b")]).map(|_| ())
    });
    assert!(sessions_blocked_by(&watch_runtime, &watch, holder_pid, 2));
    runtime.block_on(holder.batch_execute("COMMIT")).unwrap();
    appending_first.join().unwrap().unwrap();
    appending_second.join().unwrap().unwrap();
    let reader = Journal::open_postgres_read_only(&url).unwrap();
    assert_eq!(reader.read_stream("a", 0).count(), 2);
    assert_eq!(reader.read_stream("b", 0).count(), 1);
    let order: Vec<(String, u64)> = reader
        .commits(1)
        .map(|c| {
            let c = c.unwrap();
            (c.task, c.record.seq)
        })
        .collect();
    assert_eq!(
        order,
        [
            ("a".to_owned(), 1),
            ("a".to_owned(), 2),
            ("b".to_owned(), 3)
        ]
    );
}

/// `dtask_write_batch`'s `sync_at_commit` turns `synchronous_commit` on for the rest of the
/// transaction that called it — its commit waits for the flush — on a session whose commits do
/// not (the writer's); without it the session's setting stands.
#[test]
fn the_batch_call_makes_its_commit_wait_for_the_flush_when_asked() {
    let Some(url) = url("call-flush") else {
        return;
    };
    let schema = url.rsplit_once("schema=").unwrap().1.to_owned();
    drop(open(&url));
    let (runtime, client) = raw(&schema);
    let setting = |sync_at_commit: bool| -> String {
        runtime.block_on(async {
            client
                .batch_execute("BEGIN; SET LOCAL synchronous_commit TO off")
                .await
                .unwrap();
            client
                .execute(
                    "SELECT dtask_write_batch(NULL, $1, '{}', '{}', '{}', '{}', '{}', '{}', \
                     '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', NULL)",
                    &[&sync_at_commit],
                )
                .await
                .unwrap();
            let row = client
                .query_one("SHOW synchronous_commit", &[])
                .await
                .unwrap();
            client.batch_execute("ROLLBACK").await.unwrap();
            row.get(0)
        })
    };
    assert_eq!(setting(true), "on");
    assert_eq!(setting(false), "off");
}

/// The writer lock is held in the server's memory for the transaction, and is the journal's
/// own: while one journal's is held, another journal's (another schema) is free, and its
/// appends go on.
#[test]
fn the_writer_lock_is_each_journals_own() {
    let (Some(one), Some(other)) = (url("lock-one"), url("lock-other")) else {
        return;
    };
    let (one_journal, other_journal) = (open(&one), open(&other));
    let schema = |url: &str| url.rsplit_once("schema=").unwrap().1.to_owned();
    let (runtime, holder) = raw(&schema(&one));
    runtime
        .block_on(holder.batch_execute("BEGIN; SELECT dtask_lock_writer()"))
        .unwrap();
    // Held: another transaction of this journal cannot take it …
    let (contender_runtime, contender) = raw(&schema(&one));
    let refused =
        contender_runtime
            .block_on(contender.batch_execute(
                "BEGIN; SET LOCAL lock_timeout TO '50ms'; SELECT dtask_lock_writer()",
            ))
            .unwrap_err();
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE),
        "{refused}"
    );
    contender_runtime
        .block_on(contender.batch_execute("ROLLBACK"))
        .unwrap();
    // … an advisory lock, not a row's …
    let advisory = runtime
        .block_on(holder.query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND pid = pg_backend_pid()",
            &[],
        ))
        .unwrap();
    assert_eq!(advisory.get::<_, i64>(0), 1);
    // … and the other journal's writer is not held up by it.
    other_journal.append("free", 0, &[created("free")]).unwrap();
    runtime.block_on(holder.batch_execute("COMMIT")).unwrap();
    one_journal.append("then", 0, &[created("then")]).unwrap();
    assert_eq!(one_journal.stream_len("then").unwrap(), Some(1));
}

/// A frozen view of a PostgreSQL journal — of a writable open, of its durable view, of
/// another node's — reads one snapshot: appends committed after it are in no pass of it,
/// while the journal itself sees them; a frozen view of it is itself.
#[test]
fn a_frozen_view_reads_one_snapshot() {
    let Some(url) = url("frozen_view") else {
        return;
    };
    let journal = open(&url);
    let other = open(&url);
    journal.append("t", 0, &[created("t")]).unwrap();
    let views = [
        journal.frozen().unwrap(),
        journal.durable_view().frozen().unwrap(),
        other.frozen().unwrap(),
    ];
    journal.append("t", 1, &[update(1), completed()]).unwrap();
    other.append("u", 0, &[created("u")]).unwrap();
    for frozen in &views {
        let view = frozen.journal();
        assert!(view.is_read_only());
        assert_eq!(view.last_seq().unwrap(), 1);
        assert_eq!(view.stream_len("t").unwrap(), Some(1));
        assert_eq!(view.read_stream("t", 0).count(), 1);
        assert_eq!(view.stream_len("u").unwrap(), None);
        let live: Vec<String> = view.live_tasks().map(Result::unwrap).collect();
        assert_eq!(live, ["t"]);
        assert_eq!(view.read_tail().unwrap().unwrap().last_seq, 1);
    }
    // A frozen view of a frozen view reads the same snapshot.
    let again = views[0].journal().frozen().unwrap();
    assert_eq!(again.journal().last_seq().unwrap(), 1);
    assert_eq!(journal.last_seq().unwrap(), 4);
    let live: Vec<String> = journal.live_tasks().map(Result::unwrap).collect();
    assert_eq!(live, ["u"]);
}

/// A database on the same machine is reached over its Unix socket too: a URL whose host is
/// the socket's directory, percent-encoded (docs/postgres.md). Every connection of the journal
/// goes over the socket (the server sees no client address for them).
#[test]
fn a_unix_socket_url_reaches_the_journal() {
    let Some(tcp_url) = url("unix_socket") else {
        return;
    };
    let schema = dtask_journal::postgres::PgLocation::parse(&tcp_url)
        .unwrap()
        .schema()
        .to_owned();
    let (runtime, client) = raw("public");
    let (directory, port, user, database) = runtime.block_on(async {
        let row = client
            .query_one(
                "SELECT split_part(current_setting('unix_socket_directories'), ',', 1), \
                 current_setting('port'), current_user::text, current_database()::text",
                &[],
            )
            .await
            .unwrap();
        (
            row.get::<_, String>(0).trim().to_owned(),
            row.get::<_, String>(1),
            row.get::<_, String>(2),
            row.get::<_, String>(3),
        )
    });
    if directory.is_empty() || !std::path::Path::new(&directory).exists() {
        eprintln!("SKIPPED a_unix_socket_url_reaches_the_journal: the database's socket is not on this machine");
        return;
    }
    let host =
        percent_encoding::utf8_percent_encode(&directory, percent_encoding::NON_ALPHANUMERIC);
    let socket_url = format!("postgres://{user}@{host}:{port}/{database}?schema={schema}");
    let journal = open(&socket_url);
    journal.append("t", 0, &[created("t")]).unwrap();
    journal.append("t", 1, &[update(1)]).unwrap();
    assert_eq!(journal.read_stream("t", 0).count(), 2);
    let reader = Journal::open_postgres_read_only(&socket_url).unwrap();
    assert_eq!(reader.read_stream("t", 0).count(), 2);
    let (over_socket, over_tcp): (i64, i64) = runtime.block_on(async {
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE client_addr IS NULL), \
                 count(*) FILTER (WHERE client_addr IS NOT NULL) \
                 FROM pg_stat_activity WHERE application_name = $1",
                &[&format!("dtask:{schema}")],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    });
    assert!(
        over_socket > 0,
        "no connection of the journal over the socket"
    );
    assert_eq!(over_tcp, 0, "a connection of the journal over TCP");
}

#[test]
fn an_import_replaces_only_a_missing_schema_or_an_empty_journals() {
    let (Some(target), Some(staging)) = (url("promote-target"), url("promote-staging")) else {
        return;
    };
    let schema = |url: &str| url.rsplit_once("schema=").unwrap().1.to_owned();
    let (target_schema, staging_schema) = (schema(&target), schema(&staging));
    let location = dtask_journal::postgres::PgLocation::parse(&target).unwrap();
    let staged = open(&staging);
    staged.append("t", 0, &[created("t")]).unwrap();
    drop(staged);

    // Another application's table in the target schema: refused, before and at the end,
    // and nothing of it touched.
    admin(&format!(
        "CREATE SCHEMA \"{target_schema}\"; CREATE TABLE \"{target_schema}\".orders (id int); \
         INSERT INTO \"{target_schema}\".orders VALUES (7)"
    ));
    let why = dtask_journal::postgres::admin::check_target(&location).unwrap();
    assert!(why.unwrap().contains("not a dtask journal's"));
    let refused = dtask_journal::postgres::admin::promote(&location, &staging_schema);
    assert!(
        matches!(refused, Err(Error::InvalidLocation(_))),
        "{refused:?}"
    );
    admin(&format!(
        "DO $$ BEGIN IF (SELECT count(*) FROM \"{target_schema}\".orders) <> 1 THEN \
         RAISE EXCEPTION 'the application''s table changed'; END IF; END $$"
    ));

    // A journal with records: refused too.
    admin(&format!("DROP SCHEMA \"{target_schema}\" CASCADE"));
    let occupied = open(&target);
    occupied.append("x", 0, &[created("x")]).unwrap();
    drop(occupied);
    let refused = dtask_journal::postgres::admin::promote(&location, &staging_schema);
    assert!(
        matches!(refused, Err(Error::InvalidLocation(_))),
        "{refused:?}"
    );

    // An empty journal's schema is replaced, and the staged journal is read there.
    admin(&format!("DROP SCHEMA \"{target_schema}\" CASCADE"));
    drop(open(&target));
    assert_eq!(
        dtask_journal::postgres::admin::check_target(&location).unwrap(),
        None
    );
    dtask_journal::postgres::admin::promote(&location, &staging_schema).unwrap();
    let promoted = Journal::open_postgres_read_only(&target).unwrap();
    assert_eq!(promoted.stream_len("t").unwrap(), Some(1));
}

/// A stream longer than one page is read a query per page on PostgreSQL, each in its own
/// snapshot. Another node trims it between two pages — every record from the first stub on
/// framed again — and the read goes on, intact, with the stream as the trim left it rather
/// than reporting its chain broken; another node purges it between two pages, and the read
/// says so (an error that is not damage) rather than end early as if the stream did (a
/// finished task folded as running).
#[test]
fn a_stream_trimmed_or_purged_between_two_pages_of_its_read_reads_on_or_says_so() {
    let Some(url) = url("paged_change") else {
        return;
    };
    let journal = open(&url);
    let other = open(&url);
    for task in ["t", "p"] {
        journal.append(task, 0, &[created(task)]).unwrap();
        let updates: Vec<Event> = (1..=200).map(update).collect();
        journal.append(task, 1, &updates).unwrap();
    }
    journal.append("p", 201, &[completed()]).unwrap();

    let mut read = journal.read_stream("t", 0);
    let first: Vec<_> = read.by_ref().take(64).map(Result::unwrap).collect();
    assert_eq!(
        other.trim_progress("t", 1, Timestamp(500)).unwrap().records,
        199
    );
    let rest: Vec<_> = read.map(Result::unwrap).collect();
    let positions: Vec<u64> = first.iter().chain(&rest).map(|r| r.position).collect();
    assert_eq!(positions, (0..202).collect::<Vec<_>>());
    assert!(matches!(
        rest.last().unwrap().event,
        Event::ProgressTrimmed { .. }
    ));
    // Read now, the stream is the trim's.
    assert_eq!(journal.read_stream("t", 0).map(Result::unwrap).count(), 202);

    let mut read = journal.read_stream("p", 0);
    assert_eq!(read.by_ref().take(64).map(Result::unwrap).count(), 64);
    other.purge(&["p"], Timestamp(600)).unwrap();
    let rest: Vec<_> = read.collect();
    let said = rest
        .iter()
        .find_map(|item| item.as_ref().err())
        .expect("the read says the stream went");
    assert!(!said.is_damage(), "{said}");
    assert!(said.to_string().contains("purged"), "{said}");
}

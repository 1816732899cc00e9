//! The PostgreSQL journal when the database itself crashes: a private cluster (the
//! distribution's `initdb` and `pg_ctl`, from `DTASK_TEST_PG_BIN`, which `./dev test` sets) is
//! stopped in `immediate` mode under load — its processes quit at once, with no checkpoint and
//! no flush of the write-ahead log they hold in memory, as in a crash — and started again.
//!
//! The writer's commits return before the database's flush and its sync makes them durable
//! afterwards, so a crash can take back commits the server had acknowledged: the journal must
//! never have acknowledged one of them, and must not build on them once the database is back.
//! A restart by an operator (`fast`) keeps every commit: then no append whose batch the
//! server committed may fail — its sync waits for the server to come back.
//! Without the variable the test says loudly that it was skipped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cluster;
mod strategies;

use cluster::Cluster;
use dtask_journal::observe::{BatchWritten, WriteObserver};
use dtask_journal::{Durability, Error, Event, Journal, JournalOptions, Timestamp};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use strategies::{created, update};

/// What one writer thread did.
struct Writer {
    task: String,
    /// The positions acknowledged.
    acknowledged: Vec<u64>,
    /// The ids of the updates acknowledged, and of those that failed (each attempt has an
    /// id of its own; a creation has none).
    acknowledged_ids: Vec<String>,
    failed_ids: Vec<String>,
    failed: usize,
    /// Appends whose sync found their batch gone: committed, then lost in the crash.
    lost: usize,
}

/// An update whose id is the attempt's own, to tell afterwards which attempts the database
/// kept.
fn attempt(id: &str, at: u64) -> Event {
    Event::UpdateAppended {
        attempt: 1,
        event_id: id.to_owned(),
        kind: "progress".into(),
        data: Vec::new(),
        metadata: vec![],
        at: Timestamp(at),
    }
}

/// Appends to `task` until `stop`, each attempt with an id of its own.
fn write_until(journal: &Journal, task: String, stop: &AtomicBool, acks: &AtomicUsize) -> Writer {
    let mut writer = Writer {
        task,
        acknowledged: Vec::new(),
        acknowledged_ids: Vec::new(),
        failed_ids: Vec::new(),
        failed: 0,
        lost: 0,
    };
    let task = writer.task.clone();
    let mut position = None;
    let mut n = 0_u64;
    while !stop.load(Ordering::Relaxed) {
        // Where the stream really is, after a failure: an append that failed may have
        // committed.
        let at = match position {
            Some(at) => at,
            None => match journal.stream_len(&task) {
                Ok(len) => len.unwrap_or_default(),
                Err(Error::Storage(_)) => {
                    // The database is down: try again shortly.
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                Err(other) => panic!("{task}: {other:?}"),
            },
        };
        n += 1;
        let id = (at > 0).then(|| format!("{task}-{n}"));
        let event = match &id {
            None => created(&task),
            Some(id) => attempt(id, at),
        };
        match journal.append(&task, at, &[event]) {
            Ok(_) => {
                writer.acknowledged.push(at);
                writer.acknowledged_ids.extend(id);
                acks.fetch_add(1, Ordering::Relaxed);
                position = Some(at + 1);
            }
            Err(e @ (Error::Storage(_) | Error::Conflict { .. })) => {
                writer.failed += 1;
                writer.failed_ids.extend(id);
                writer.lost += usize::from(e.to_string().contains("is gone"));
                position = None;
            }
            Err(other) => panic!("{task}: {other:?}"),
        }
    }
    writer
}

/// Starts `n` writer threads ([`write_until`]) on tasks `{prefix}0`, `{prefix}1`, …; returns
/// the flag that stops them, the count of their acknowledgements, and the threads.
fn start_writers(
    journal: &Journal,
    n: usize,
    prefix: &str,
) -> (
    Arc<AtomicBool>,
    Arc<AtomicUsize>,
    Vec<std::thread::JoinHandle<Writer>>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(AtomicUsize::new(0));
    let threads = (0..n)
        .map(|w| {
            let (journal, stop, acks) = (journal.clone(), Arc::clone(&stop), Arc::clone(&acks));
            let task = format!("{prefix}{w}");
            std::thread::spawn(move || write_until(&journal, task, &stop, &acks))
        })
        .collect();
    (stop, acks, threads)
}

/// Lets the writers `threads` make `more` acknowledgements from now (`what`), or stop on
/// their own, then stops them and returns what each did.
fn stop_after(
    what: &str,
    more: usize,
    acks: &AtomicUsize,
    stop: &AtomicBool,
    threads: Vec<std::thread::JoinHandle<Writer>>,
) -> Vec<Writer> {
    let before = acks.load(Ordering::Relaxed);
    wait_for(what, || {
        acks.load(Ordering::Relaxed) >= before + more
            || threads.iter().any(std::thread::JoinHandle::is_finished)
    });
    stop.store(true, Ordering::Relaxed);
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Waits until `done` holds, or panics after a minute (a hang).
fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn check_everything_acknowledged_is_there(url: &str, writers: &[Writer]) {
    let reader = Journal::open_postgres_read_only(url).unwrap();
    for writer in writers {
        // Read back whole: every record's CRC and chain checked.
        let positions: Vec<u64> = reader
            .read_stream(&writer.task, 0)
            .map(|r| r.unwrap().position)
            .collect();
        assert_eq!(
            positions,
            (0..positions.len() as u64).collect::<Vec<_>>(),
            "{}: a stream with a gap",
            writer.task
        );
        for position in &writer.acknowledged {
            assert!(
                positions.contains(position),
                "{}@{position} was acknowledged and is lost",
                writer.task
            );
        }
    }
    // The commit order has no gap either.
    let seqs: Vec<u64> = reader.commits(1).map(|c| c.unwrap().record.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
}

#[test]
fn a_database_crash_under_load_loses_nothing_acknowledged_and_the_journal_goes_on_on_what_it_kept()
{
    let Some(cluster) = Cluster::new("dbcrash") else {
        return;
    };
    let url = cluster.url("crash");
    let journal = Journal::open_postgres(&url, JournalOptions::default()).unwrap();
    let (stop, acks, threads) = start_writers(&journal, 16, "w");
    for round in 0..3 {
        let before = acks.load(Ordering::Relaxed);
        wait_for("appends acknowledged", || {
            acks.load(Ordering::Relaxed) >= before + 300
                || threads.iter().any(std::thread::JoinHandle::is_finished)
        });
        if threads.iter().any(std::thread::JoinHandle::is_finished) {
            // A writer failed: its join below says why.
            break;
        }
        cluster.crash();
        cluster.start();
        eprintln!("round {round}: the database crashed and started again");
    }
    // The journal goes on on what the database kept.
    let writers = stop_after(
        "appends acknowledged after the last crash",
        300,
        &acks,
        &stop,
        threads,
    );
    let failed: usize = writers.iter().map(|w| w.failed).sum();
    let lost: usize = writers.iter().map(|w| w.lost).sum();
    eprintln!(
        "{} appends acknowledged; {failed} failed with the database down, {lost} of them \
         committed and lost in a crash before their flush",
        acks.load(Ordering::Relaxed)
    );
    assert!(failed > 0, "no append saw a crash");
    check_everything_acknowledged_is_there(&url, &writers);

    // A journal opened anew finds every stream where the database has it and appends on.
    drop(journal);
    let again = Journal::open_postgres(&url, JournalOptions::default()).unwrap();
    for writer in &writers {
        let len = again.stream_len(&writer.task).unwrap().unwrap_or_default();
        let event = if len == 0 {
            created(&writer.task)
        } else {
            update(len)
        };
        again.append(&writer.task, len, &[event]).unwrap();
    }
    check_everything_acknowledged_is_there(&url, &writers);
}

/// Stops the database (`fast`) from within the writer, right after it committed a batch that
/// its syncer is to flush (one written with appends queued behind it), and has it started
/// again on another thread: that batch's sync then finds the server down.
#[derive(Debug)]
struct RestartAfterACommit {
    cluster: Arc<Cluster>,
    done: AtomicBool,
    restarted: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl WriteObserver for RestartAfterACommit {
    fn batch_written(&self, batch: &BatchWritten) {
        if batch.appends == 0 || batch.queued == 0 || self.done.swap(true, Ordering::AcqRel) {
            return;
        }
        self.cluster.stop_fast();
        let cluster = Arc::clone(&self.cluster);
        *self.restarted.lock().unwrap() = Some(std::thread::spawn(move || cluster.start()));
    }
}

/// A restart of the database (an operator's: `fast`) keeps every commit the server
/// acknowledged, so no append whose batch was committed may fail: the sync of a batch
/// committed just before the stop waits for the server to come back, finds the batch, flushes
/// it and acknowledges its appends. Every attempt that failed is absent from the journal, and
/// every acknowledged one is there.
#[test]
fn a_restart_of_the_database_fails_no_append_whose_batch_it_kept() {
    let Some(cluster) = Cluster::new("dbrestart") else {
        return;
    };
    let cluster = Arc::new(cluster);
    let url = cluster.url("restart");
    let journal = Journal::open_postgres(&url, JournalOptions::default()).unwrap();
    let restart = Arc::new(RestartAfterACommit {
        cluster: Arc::clone(&cluster),
        done: AtomicBool::new(false),
        restarted: Mutex::new(None),
    });
    assert!(journal.observe(Arc::clone(&restart) as Arc<dyn WriteObserver>));
    let (stop, acks, threads) = start_writers(&journal, 8, "r");
    wait_for("the database stopped after a commit", || {
        restart.done.load(Ordering::Acquire)
            || threads.iter().any(std::thread::JoinHandle::is_finished)
    });
    let restarted = loop {
        if let Some(handle) = restart.restarted.lock().unwrap().take() {
            break Some(handle);
        }
        if threads.iter().any(std::thread::JoinHandle::is_finished) {
            break None;
        }
        std::thread::yield_now();
    };
    if let Some(restarted) = restarted {
        restarted.join().unwrap();
    }
    let writers = stop_after(
        "appends acknowledged after the restart",
        200,
        &acks,
        &stop,
        threads,
    );
    let reader = Journal::open_postgres_read_only(&url).unwrap();
    let mut failures = 0;
    for writer in &writers {
        assert_eq!(writer.lost, 0, "{}: a restart lost a commit", writer.task);
        let kept: std::collections::HashSet<String> = reader
            .read_stream(&writer.task, 0)
            .filter_map(|r| match r.unwrap().event {
                Event::UpdateAppended { event_id, .. } => Some(event_id),
                _ => None,
            })
            .collect();
        for id in &writer.acknowledged_ids {
            assert!(kept.contains(id), "{id} was acknowledged and is lost");
        }
        for id in &writer.failed_ids {
            assert!(
                !kept.contains(id),
                "{id} failed, yet the database kept it: its batch was committed and its sync \
                 gave up"
            );
        }
        failures += writer.failed;
    }
    eprintln!(
        "{} appends acknowledged, {failures} failed while the database restarted, none of \
         them kept",
        acks.load(Ordering::Relaxed)
    );
    assert!(
        restart.done.load(Ordering::Acquire),
        "the database never restarted"
    );
}

/// A read-only reader (what `dtask serve --read-only`, `tail` and `export` open) shows only
/// what the database has made durable: every record it read is still there after a crash of
/// the database.
#[test]
fn a_read_only_reader_sees_no_record_that_a_crash_of_the_database_takes_back() {
    reads_survive_a_crash("dbreadcrash", |url| {
        let reader = Journal::open_postgres_read_only(url).unwrap();
        (reader.clone(), reader)
    });
}

/// The durable view of another node's writable open (what an owner's `dtask serve` reads
/// through) shows only what the database has made durable, as a read-only open does; the
/// node's own reads see the commits at once.
#[test]
fn a_nodes_durable_view_sees_no_record_that_a_crash_of_the_database_takes_back() {
    reads_survive_a_crash("dbviewcrash", |url| {
        let node = Journal::open_postgres(url, JournalOptions::default()).unwrap();
        let view = node.durable_view();
        assert!(view.is_read_only() && !node.is_read_only());
        assert!(matches!(
            view.append("v", 0, &[created("v")]),
            Err(Error::ReadOnly)
        ));
        (node, view)
    });
}

/// Records written by a journal of `Durability::Buffered`, whose commits never wait for the
/// log's flush (a synced writer's commits are the same until its sync), are read through
/// the reader `open` returns (with whatever must live as long as it), on a server told to
/// leave its log unflushed for as long as it may (`wal_writer_delay` of 10 s, no pages
/// written by its background writer, no autovacuum): only the reader's read can have made
/// them durable before the crash, after which a fresh open must find every record read.
fn reads_survive_a_crash(name: &str, open: impl Fn(&str) -> (Journal, Journal)) {
    let Some(cluster) = Cluster::with_settings(
        name,
        "-c wal_writer_delay=10000 -c bgwriter_lru_maxpages=0 -c autovacuum=off",
    ) else {
        return;
    };
    let url = cluster.url("readcrash");
    let options = JournalOptions::default().with_durability(Durability::Buffered);
    let journal = Journal::open_postgres(&url, options).unwrap();
    journal.append("t", 0, &[created("t")]).unwrap();
    let (_kept_open, reader) = open(&url);
    journal.append("t", 1, &[attempt("t-1", 1)]).unwrap();
    let seen: Vec<u64> = reader
        .read_stream("t", 0)
        .map(|r| r.unwrap().position)
        .collect();
    assert_eq!(seen, vec![0, 1], "the reader reads what was committed");
    cluster.crash();
    cluster.start();
    let after = Journal::open_postgres_read_only(&url).unwrap();
    let kept: Vec<u64> = after
        .read_stream("t", 0)
        .map(|r| r.unwrap().position)
        .collect();
    assert_eq!(kept, seen, "the reader saw records the crash took back");
}

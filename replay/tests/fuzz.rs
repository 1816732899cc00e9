//! Arbitrary damage, generated: random keys and values written with raw RocksDB into every
//! space of a real journal, then every reader run over it — the read-only and the writable
//! open, the audit of the journal and of each task, the stream, commit-order and outbox
//! readers. Nothing may panic or abort, every error must be a typed one, and a journal that
//! was changed must not audit clean.
//!
//! The cases run per test are `DTASK_FUZZ_CASES` (64 by default, as in CI; `./dev fuzz N` runs more).
//! The committed corpus — the forged values that once crashed or slipped through — runs
//! first, in every build, as [`corpus_entries_are_reported`].
#![allow(clippy::unwrap_used)]

use dtask_journal::keys::{self, Space};
use dtask_journal::{
    Durability, Error, Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp,
};
use dtask_replay::audit::{audit_journal, audit_task};
use proptest::prelude::*;
use std::path::Path;

fn created(task: &str) -> Event {
    Event::created(TaskSpec::new(task, "x"), LeasePolicy::Retry, Timestamp(1))
}

/// Fast opens: the cases need no fsync, and no wait for compactions at close.
fn options() -> JournalOptions {
    JournalOptions::default()
        .with_durability(Durability::Buffered)
        .with_settle_on_close(std::time::Duration::ZERO)
}

/// A copy of the small journal of [`build_template`] in a fresh directory.
fn build(dir: &Path) {
    static TEMPLATE: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let template = TEMPLATE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        build_template(dir.path());
        dir
    });
    for entry in std::fs::read_dir(template.path()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
}

/// A small journal: "a" live with a queued notification, "b" completed.
fn build_template(dir: &Path) {
    let journal = Journal::open(dir, options()).unwrap();
    journal
        .append(
            "a",
            0,
            &[
                created("a"),
                Event::NotificationEnqueued {
                    id: "n".into(),
                    event_id: String::new(),
                    kind: "task_created".into(),
                    data: vec![],
                    version: 1,
                    at: Timestamp(2),
                },
            ],
        )
        .unwrap();
    journal.append("b", 0, &[created("b")]).unwrap();
    journal
        .append(
            "b",
            1,
            &[Event::Completed {
                data: b"ok".to_vec(),
                at: Timestamp(3),
            }],
        )
        .unwrap();
}

/// Where a damaging write goes: a journal space, or RocksDB's default column family.
#[derive(Debug, Clone, Copy)]
enum Target {
    Space(Space),
    Default,
}

/// One damaging write.
#[derive(Debug, Clone)]
struct Write {
    target: Target,
    key: Vec<u8>,
    value: Vec<u8>,
}

/// Keys that look like the journal's own (so that they reach past the first parse), and
/// arbitrary ones.
fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<u64>().prop_map(|seq| keys::seq_key(seq).to_vec()),
        (0u64..8).prop_map(|seq| keys::seq_key(seq).to_vec()),
        ("[ab]", any::<u64>()).prop_map(|(task, p)| keys::event_key(&task, p)),
        ("[abc]", 0u64..4).prop_map(|(task, p)| keys::event_key(&task, p)),
        Just(b"a".to_vec()),
        Just(keys::META_FORMAT_VERSION.to_vec()),
        Just(keys::META_TAIL.to_vec()),
        proptest::collection::vec(any::<u8>(), 0..24),
    ]
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(Vec::new()),
        ("[ab]", 0u64..4).prop_map(|(task, p)| keys::event_key(&task, p)),
        any::<u32>().prop_map(|v| v.to_be_bytes().to_vec()),
        proptest::collection::vec(any::<u8>(), 0..80),
    ]
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        Just(Target::Space(Space::Events)),
        Just(Target::Space(Space::Commits)),
        Just(Target::Space(Space::Live)),
        Just(Target::Space(Space::Outbox)),
        Just(Target::Space(Space::Meta)),
        Just(Target::Default),
    ]
}

fn write() -> impl Strategy<Value = Write> {
    (target(), key(), value()).prop_map(|(target, key, value)| Write { target, key, value })
}

/// Applies `writes`; returns whether any changed what the database held.
fn apply(dir: &Path, writes: &[Write]) -> bool {
    let cfs: Vec<_> = dtask_journal::keys::COLUMN_FAMILIES.to_vec();
    let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir, cfs).unwrap();
    let mut changed = false;
    for w in writes {
        let before = match w.target {
            Target::Space(space) => {
                let cf = db.cf_handle(space.name()).unwrap();
                let before = db.get_cf(cf, &w.key).unwrap();
                db.put_cf(cf, &w.key, &w.value).unwrap();
                before
            }
            Target::Default => {
                let before = db.get(&w.key).unwrap();
                db.put(&w.key, &w.value).unwrap();
                before
            }
        };
        changed |= before.as_deref() != Some(w.value.as_slice());
    }
    changed
}

/// Every reader over the damaged journal; panics only on a broken promise.
fn read_everything(dir: &Path, changed: bool) {
    match Journal::open_read_only(dir) {
        Ok(journal) => {
            let report = audit_journal(&journal, &mut |_| {}).unwrap();
            assert!(
                !changed || !report.is_clean(),
                "a changed journal audited clean"
            );
            for task in ["a", "b", "c"] {
                audit_task(&journal, task).unwrap();
                journal.read_stream(task, 0).for_each(drop);
                let _ = journal.head(task);
                let _ = journal.stream_len(task);
            }
            journal.task_ids().for_each(drop);
            journal.tasks().for_each(drop);
            journal.live_tasks().for_each(drop);
            journal.commits(0).for_each(drop);
            journal.outbox().for_each(drop);
            let _ = journal.last_seq();
            let _ = journal.read_tail();
        }
        Err(
            Error::NotAJournal(_)
            | Error::UnsupportedFormat { .. }
            | Error::Corruption { .. }
            | Error::MalformedEntry { .. },
        ) => {}
        Err(e) => panic!("untyped failure of a read-only open: {e:?}"),
    }
    // A writable open refuses with a typed error, or opens a journal it can append to.
    match Journal::open(dir, options()) {
        Ok(journal) => {
            let at = journal.stream_len("fresh").unwrap_or(None).unwrap_or(0);
            let _ = journal.append("fresh", at, &[created("fresh")]);
        }
        Err(
            Error::NotAJournal(_)
            | Error::UnsupportedFormat { .. }
            | Error::Corruption { .. }
            | Error::MalformedEntry { .. }
            | Error::Inconsistent(_),
        ) => {}
        Err(e) => panic!("untyped failure of a writable open: {e:?}"),
    }
}

fn cases() -> u32 {
    std::env::var("DTASK_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn arbitrary_damage_is_reported_never_a_panic(writes in proptest::collection::vec(write(), 1..4)) {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path());
        let changed = apply(dir.path(), &writes);
        read_everything(dir.path(), changed);
    }

    #[test]
    fn tail_markers_of_arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = dtask_journal::Tail::decode(&bytes);
    }
}

/// The committed corpus: forged values found to crash, abort or slip through an audit.
#[test]
fn corpus_entries_are_reported() {
    let corpus = [
        // A commit entry at sequence 2^37, and at 2^64-1: sized a bitmap, overflowed an add.
        (
            Space::Commits,
            keys::seq_key(1 << 37).to_vec(),
            keys::event_key("a", 0),
        ),
        (
            Space::Commits,
            keys::seq_key(u64::MAX).to_vec(),
            keys::event_key("a", 0),
        ),
        // A commit entry at sequence 0.
        (
            Space::Commits,
            keys::seq_key(0).to_vec(),
            keys::event_key("b", 0),
        ),
        // A record position of 2^64-1.
        (Space::Events, keys::event_key("a", u64::MAX), vec![0; 60]),
        // A value where the live index keeps none.
        (Space::Live, b"a".to_vec(), b"x".to_vec()),
        // An unknown meta key.
        (Space::Meta, b"colour".to_vec(), b"blue".to_vec()),
        // An outbox entry naming a record of another kind.
        (
            Space::Outbox,
            keys::seq_key(1).to_vec(),
            keys::event_key("b", 1),
        ),
    ];
    for (space, key, value) in corpus {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path());
        let changed = apply(
            dir.path(),
            &[Write {
                target: Target::Space(space),
                key,
                value,
            }],
        );
        assert!(changed);
        read_everything(dir.path(), changed);
    }
}

//! What the storage engine reports of itself ([`crate::Journal::storage_stats`]): each column
//! family's memtables and table files, the compaction work it owes, and whether RocksDB is
//! slowing or stopping writes.
//!
//! Appends are acknowledged once they are in RocksDB's log and memtables; flushing the
//! memtables to table files and compacting those files happens later, on RocksDB's
//! background threads. A journal can take appends faster than those threads keep up for a
//! while — the work is owed, not saved — and RocksDB slows writes down, then stops them,
//! once too much is owed (too many memtables waiting for their flush, too many level-0 files,
//! too many bytes to compact). These figures show that debt: the server exposes them at
//! `/metrics`, `dtask stats` prints them, and the journal bench prints them at the end of a
//! run, so that a short run's throughput is not read as sustainable when it left work owed.
//!
//! ```
//! use dtask_journal::{Event, Journal, JournalOptions, Timestamp};
//! # fn main() -> Result<(), dtask_journal::Error> {
//! let dir = tempfile::tempdir().expect("tempdir");
//! let journal = Journal::open(dir.path(), JournalOptions::default())?;
//! let update = Event::UpdateAppended {
//!     attempt: 1, event_id: "e1".into(), kind: "progress".into(), data: vec![7; 100],
//!     metadata: vec![], at: Timestamp(1),
//! };
//! journal.append("job-1", 0, &[update])?;
//! let stats = journal.storage_stats()?.expect("a RocksDB journal reports its storage");
//! let events = stats.space("events").expect("the events space");
//! assert!(events.memtable_bytes > 0, "the record waits in a memtable for its flush");
//! assert!(!stats.write_stopped);
//! # Ok(()) }
//! ```

use serde::Serialize;

/// The storage engine's state at one moment. RocksDB journals only (a PostgreSQL journal's
/// server keeps its own statistics).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct StorageStats {
    /// One entry per column family the journal has open, in the journal's order (`events`,
    /// `commits`, `live`, `outbox`, `meta`, then `finished` when the journal has it).
    pub spaces: Vec<SpaceStats>,
    /// Flushes of memtables to table files running now.
    pub running_flushes: u64,
    /// Compactions running now.
    pub running_compactions: u64,
    /// Whether RocksDB stops writes now, until its background work catches up (appends wait).
    pub write_stopped: bool,
    /// The rate RocksDB slows writes to, in bytes a second, while it does (0 when it does
    /// not): the first sign of a backlog of flushes or compactions.
    pub delayed_write_rate: u64,
    /// Background errors (failed flushes or compactions) since the journal was opened.
    pub background_errors: u64,
    /// Whether flushes and compactions write table files with direct I/O, past the page
    /// cache ([`crate::JournalOptions::direct_table_io`], and the file system allowed it at
    /// the open); `false` for a read-only open or a follower, which write no table files.
    pub direct_table_io: bool,
}

impl StorageStats {
    /// The column family named `name`, if the journal has it open.
    #[must_use]
    pub fn space(&self, name: &str) -> Option<&SpaceStats> {
        self.spaces.iter().find(|space| space.name == name)
    }

    /// Bytes held in the memtables of every column family.
    #[must_use]
    pub fn memtable_bytes(&self) -> u64 {
        self.spaces.iter().map(|space| space.memtable_bytes).sum()
    }

    /// Whether memtables are being flushed to table files or wait for it: a flush running,
    /// or a full memtable waiting in some column family (what a caller of
    /// [`crate::Journal::release_replayed_log`] waits out to see the memory released).
    #[must_use]
    pub fn flushing(&self) -> bool {
        self.running_flushes > 0
            || self
                .spaces
                .iter()
                .any(|space| space.immutable_memtables > 0)
    }
}

/// One column family's memtables and table files.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SpaceStats {
    /// The column family (`events`, `finished`, `commits`, `live`, `outbox`, `meta`; the
    /// layouts are in `docs/journal-format.md`).
    pub name: String,
    /// Bytes held in memtables: the active one and those waiting for their flush.
    pub memtable_bytes: u64,
    /// Full memtables waiting for their flush.
    pub immutable_memtables: u64,
    /// Table files at level 0 (each flush makes one; compactions merge them into the levels
    /// below). RocksDB slows writes at 20 and stops them at 36.
    pub level0_files: u64,
    /// Bytes of the table files in use.
    pub table_bytes: u64,
    /// Bytes RocksDB estimates its compactions must rewrite to bring the levels back to
    /// their target sizes: the compaction work owed.
    pub pending_compaction_bytes: u64,
    /// Keys, by RocksDB's estimate (overwritten and deleted ones count until a compaction
    /// drops them).
    pub estimated_keys: u64,
}

#[cfg(test)]
mod tests {
    use crate::{Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp};

    fn update(i: u64) -> Event {
        Event::UpdateAppended {
            attempt: 1,
            event_id: format!("e{i}"),
            kind: "progress".into(),
            data: vec![7; 200],
            metadata: vec![],
            at: Timestamp(i),
        }
    }

    /// A writer names every column family it has open; the records wait in the `events`
    /// memtable until the close's flush, and a read-only open then finds them in table files
    /// (and its memtables empty: it replays no log after a clean close). The task is created
    /// first, so that it is live: the writer's idle sweep moves a stream that is not (it
    /// takes it for a finished one) to the `finished` column family.
    #[test]
    fn a_writer_reports_its_memtables_and_a_later_reader_the_table_files_they_became() {
        let dir = tempfile::tempdir().unwrap();
        {
            let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
            let created = Event::Created {
                spec: TaskSpec {
                    id: "job-1".into(),
                    executor_key: "shell".into(),
                    ..TaskSpec::default()
                }
                .into(),
                policy: LeasePolicy::Retry,
                checkpoint: vec![],
                context_snapshot: vec![],
                at: Timestamp(0),
            };
            journal.append("job-1", 0, &[created]).unwrap();
            for i in 1..=50 {
                journal.append("job-1", i, &[update(i)]).unwrap();
            }
            let stats = journal.storage_stats().unwrap().unwrap();
            let mut names: Vec<_> = stats.spaces.iter().map(|s| s.name.as_str()).collect();
            names.sort_unstable();
            assert_eq!(
                names,
                ["commits", "events", "finished", "live", "meta", "outbox"]
            );
            let events = stats.space("events").unwrap();
            assert!(events.memtable_bytes > 50 * 200, "{events:?}");
            assert_eq!(events.table_bytes, 0, "nothing flushed yet: {events:?}");
            assert_eq!(events.level0_files, 0);
            assert!(events.estimated_keys >= 50, "{events:?}");
            assert!(!stats.write_stopped);
            assert_eq!(stats.delayed_write_rate, 0);
            assert_eq!(stats.background_errors, 0);
            assert!(stats.space("nonesuch").is_none());
            // A follower replays the writer's log into memtables of its own.
            let scratch = tempfile::tempdir().unwrap();
            let secondary = Journal::open_follower(dir.path(), scratch.path()).unwrap();
            let followed = secondary.storage_stats().unwrap().unwrap();
            let events = followed.space("events").unwrap();
            assert!(events.memtable_bytes > 50 * 200, "{events:?}");
            assert_eq!(followed.running_flushes, 0);
            assert!(
                !followed.direct_table_io,
                "a follower writes no table files"
            );
        }
        let reader = Journal::open_read_only(dir.path()).unwrap();
        let stats = reader.storage_stats().unwrap().unwrap();
        let events = stats.space("events").unwrap();
        assert!(events.table_bytes > 50 * 200, "{events:?}");
        // An empty memtable still holds its arena's first block.
        assert!(events.memtable_bytes < 50 * 200, "{events:?}");
        assert!(events.level0_files <= 1, "{events:?}");
        assert!(stats.space("commits").unwrap().table_bytes > 0);
        assert_eq!(stats.running_compactions, 0);
        assert!(!stats.direct_table_io, "a reader writes no table files");
    }
}

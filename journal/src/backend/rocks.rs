//! [`RocksBackend`]: the journal on an embedded RocksDB, the default backend — its options,
//! its column families (one a space, the `events` space in two), its reads and writes.

use crate::backend::{Backend, BatchOp, Cursor, Range, RawIter};
use crate::error::{Error, Result};
use crate::keys::{Space, FINISHED_EVENTS, LEGACY_HEADS};
use crate::memtable_hint::events_memtable_options;
use crate::merge::{Merged, MergedCursor};
use crate::options::Durability;
use crate::storage::{SpaceStats, StorageStats};
use rocksdb::{
    ColumnFamily, ColumnFamilyDescriptor, Direction, IteratorMode, Options, ReadOptions,
    WriteOptions, DB,
};
use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// How a RocksDB journal is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpenMode<'a> {
    /// The writer: creates the database if missing.
    Primary,
    /// Read-only: a snapshot of the database as of open.
    ReadOnly,
    /// A secondary that follows a live primary; keeps its own info log in the given directory.
    Secondary(&'a Path),
}

/// The embedded RocksDB backend.
pub struct RocksBackend {
    /// Shared with the thread that turns compactions on ([`Compactions::Starting`]), which
    /// the backend's drop joins before the database closes.
    db: Arc<DB>,
    /// Whether automatic compactions are on: see [`Backend::start_compactions`].
    compactions: std::sync::Mutex<Compactions>,
    /// What the thread turning compactions on waits for before it does (for tests).
    #[cfg(test)]
    compactions_gate: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    /// Whether the `finished` column family may hold records (it did at open, or a batch put
    /// some there since; always for a follower of a journal that has it); reads of the
    /// `events` space look there only then.
    finished_used: AtomicBool,
    /// The settings in effect: those asked for, but [`Tuning::direct_table_io`] only where
    /// the file system allowed it.
    tuning: Tuning,
    read_only: bool,
    secondary: bool,
    sync: WriteOptions,
    buffered: WriteOptions,
    /// The options of every point lookup ([`Backend::get`]), made once: the driver's
    /// `get_cf` makes a set of its own for each call (an allocation in RocksDB a lookup;
    /// every new task is looked up twice, by its creator and by the writer).
    point_reads: rocksdb::ReadOptions,
}

impl std::fmt::Debug for RocksBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksBackend")
            .field("path", &self.db.path())
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

/// Where a writable journal's automatic compactions stand ([`Backend::start_compactions`]).
enum Compactions {
    /// Off: as a writable open of an existing journal leaves them.
    Off,
    /// Being turned on by a thread of their own; its outcome when joined.
    Starting(std::thread::JoinHandle<Result<()>>),
    /// On (and always so for a new journal and a read-only open).
    On,
}

/// Turns automatic compactions on in each of `spaces` (column family names) of `db`.
fn compactions_on(db: &DB, spaces: &[&str]) -> Result<()> {
    for name in spaces {
        db.set_options_cf(
            cf_named(db, name)?,
            &[("disable_auto_compactions", "false")],
        )?;
    }
    Ok(())
}

/// The column family `name` of `db`.
fn cf_named<'a>(db: &'a DB, name: &str) -> Result<&'a ColumnFamily> {
    db.cf_handle(name)
        .ok_or_else(|| Error::NotAJournal(format!("column family {name} missing")))
}

impl Drop for RocksBackend {
    /// Joins the thread turning compactions on, if one runs: it holds the database, which
    /// must close with the backend (a reopen follows a close at once).
    fn drop(&mut self) {
        if let Compactions::Starting(handle) =
            std::mem::replace(&mut *self.compactions_state(), Compactions::On)
        {
            let _ = handle.join();
        }
    }
}

/// The size of RocksDB's encoding of `ops` as one write batch, or a little more: a 12-byte
/// header, then per op a tag, the column family's id and each length as varints (at most
/// five bytes each), the key and (for a put) the value.
fn write_batch_bytes(ops: &[BatchOp]) -> usize {
    const HEADER: usize = 12;
    const PER_DELETE: usize = 1 + 5 + 5;
    const PER_PUT: usize = PER_DELETE + 5;
    HEADER
        + ops
            .iter()
            .map(|op| match op {
                BatchOp::Put { key, value, .. } => PER_PUT + key.len() + value.len(),
                BatchOp::Replace { key, value } => {
                    PER_DELETE + PER_PUT + 2 * key.len() + value.len()
                }
                BatchOp::Delete { key, .. } => PER_DELETE + key.len(),
                // The moved records are not known yet: the buffer grows for them.
                BatchOp::Retire { .. } => 0,
                BatchOp::Purge { task, below, .. } => usize::try_from(*below)
                    .unwrap_or(usize::MAX)
                    .saturating_mul(PER_DELETE + task.len() + 9),
            })
            .sum::<usize>()
}

/// Turns RocksDB's performance counters off on the calling thread. By default RocksDB counts,
/// per thread, every key an iterator steps over, every block it reads and every memtable
/// insert, for whoever reads its `PerfContext` on that thread; nothing in dtask does. The
/// journal's writer and syncer threads and each bulk reader ([`crate::StreamScanner`]: the
/// recovery's fold threads, the audit's readers) turn them off: 1–2 % less CPU for the fold
/// and the writer (alternating rounds; within the noise of a single round).
/// A service that reads RocksDB's perf context on a thread that made a scanner turns them
/// on again with its own call (`rocksdb::perf::set_perf_stats`). (This workspace compiles
/// the counters out of RocksDB altogether, `NPERF_CONTEXT`: docs/tuning.md.)
pub(crate) fn perf_counters_off() {
    rocksdb::perf::set_perf_stats(rocksdb::perf::PerfStatsLevel::Disable);
}

/// The most write-ahead log kept before the spaces holding the oldest log file are flushed.
const MAX_TOTAL_WAL_BYTES: u64 = 64 << 20;

fn db_options(create: bool) -> Options {
    let mut opts = Options::default();
    opts.create_if_missing(create);
    opts.create_missing_column_families(create);
    // Recent data — the memtables' flushes and the levels above the last — is stored
    // uncompressed, and only the last level is compressed with LZ4. A live task's records
    // are recent: recovery reads them without decompressing a block (a twentieth of its
    // instructions on the bench journal), flushes do not compress, and the older bulk,
    // mostly finished tasks, is still compressed. The price is disk: the level-0 files of a
    // young journal are about twice the size.
    opts.set_compression_type(rocksdb::DBCompressionType::None);
    opts.set_bottommost_compression_type(rocksdb::DBCompressionType::Lz4);
    // The write-ahead log a crash leaves is replayed at the next open (about 100 MB/s on a
    // two-core machine). Each space has a memtable of its own, and a log file lives until
    // every space with data in it has flushed: the small spaces (commits, live, outbox) fill
    // their memtables slowly and would keep gigabytes of log alive (RocksDB's default bound
    // is four times the sum of the write buffers). Capping the log flushes them with the
    // large one instead, so recovery after a crash replays at most about this much.
    opts.set_max_total_wal_size(MAX_TOTAL_WAL_BYTES);
    // Log files whose data is flushed are deleted, not reused (RocksDB's default, said here
    // because reuse was tried): a sync into a reused file is cheaper, but RocksDB's follower
    // reads a reused file past the writer's end into the earlier log's records, and when
    // one of those starts right there it reads it again and again and never returns
    // (`a_follower_opens_while_its_writer_has_flushed_twice`).
    opts.set_recycle_log_file_num(0);
    opts.increase_parallelism(2);
    opts.set_max_background_jobs(2);
    opts.set_write_buffer_size(64 << 20);
    opts.set_keep_log_file_num(4);
    opts
}

/// The options of a writer's open: [`db_options`], and the write-ahead log a crash left
/// replayed into the memtables without flushing them at the open.
///
/// By default RocksDB flushes what it replayed before the open returns: after a crash with a
/// full log, tens of megabytes written as level-0 files while recovery waits (on the bench
/// journal, a third of the journal's open). Here the replayed records stay in the memtables
/// and their log files are kept until those flush — in the background once the recovery's
/// reads are over ([`crate::Journal::release_replayed_log`]), or else in the ordinary way
/// after the first appends; a crash before that replays the same files again. Open after a
/// crash 0.19–0.24 s → 0.12–0.18 s, open + fold 0.48–0.55 s → 0.39–0.51 s (six alternating
/// rounds). (The Rust binding has no setter for this option; RocksDB's options string sets
/// it.)
///
/// # Errors
/// [`Error::Storage`] if RocksDB refuses the option string (it does not: the name is its own).
fn primary_db_options() -> Result<Options> {
    Ok(db_options(true).get_options_from_string("avoid_flush_during_recovery=true")?)
}

/// Syncs the write-ahead log files a writer's open found at `path`, and the directory.
///
/// The open replays them into the memtables and keeps them ([`primary_db_options`]), but
/// RocksDB syncs only the log it starts: records a killed process had written and not yet
/// synced (no one was told of them) sit in the page cache — and the journal, which counts
/// every record it reads at the open as durable, acts on them at once (a recovery's fold
/// answers for them, the new records it appends are synced after them). A power cut before
/// their memtables flushed would lose them from under later, acknowledged records: the log
/// would end early, and the records after it be out of sequence. Synced here, before the
/// journal is built on the database, what the open read is on the disk. (After a clean
/// close the files are clean and their syncs cost nothing.)
///
/// # Errors
/// [`Error::Storage`] when a file cannot be opened or synced.
fn sync_replayed_logs(path: &Path) -> Result<()> {
    let sync = |file: &Path| -> std::io::Result<()> { std::fs::File::open(file)?.sync_all() };
    let failed = |e: std::io::Error| Error::Storage(crate::error::StorageError::caused_by(e));
    for entry in std::fs::read_dir(path).map_err(failed)? {
        let file = entry.map_err(failed)?.path();
        if file.extension().is_some_and(|e| e == "log") {
            sync(&file).map_err(failed)?;
        }
    }
    sync(path).map_err(failed)
}

/// The options of the space (column family) `name`: [`db_options`], and for `events` and
/// `finished` (the two halves of the `events` space) their memtables' insertion hint per task
/// ([`events_memtable_options`]) and their table options. A
/// writer's open and a follower's take the same.
///
/// # Errors
/// [`Error::Storage`] if RocksDB refuses the options string (it does not: the extractor it
/// names is registered first).
fn space_options(name: &str, create: bool) -> Result<Options> {
    let mut options = db_options(create);
    if name == Space::Events.name() || name == FINISHED_EVENTS {
        options = options.get_options_from_string(events_memtable_options())?;
        options.set_block_based_table_factory(&events_table_options());
    }
    if name == FINISHED_EVENTS {
        options.set_write_buffer_size(FINISHED_WRITE_BUFFER_BYTES);
    }
    Ok(options)
}

/// The memtable size of the `finished` column family, against 64 MiB for the others.
///
/// Finished streams are not read by recovery; after a crash, what the memtables held is
/// replayed from the log into memory before recovery folds. With 64 MiB for the finished
/// records too, a journal crashed while it was being filled kept 88 MB of log (16 MB before
/// finished streams were kept apart) and recovered at 2,782 B resident per live task instead
/// of 1,900 B; a smaller memtable for the records recovery never reads makes RocksDB flush
/// them sooner, so that less of the log stays to be replayed into memory.
const FINISHED_WRITE_BUFFER_BYTES: usize = 16 << 20;

/// The size of the `events` space's data blocks (uncompressed), against RocksDB's 4 KiB
/// default.
///
/// Recovery reads every live task's records in one forward pass, and every data block it
/// enters costs the same whatever its size — an index step, a read, a checksum, an
/// allocation and, on the compressed last level, a decompression call — so larger blocks
/// fold faster: on the bench journal (1M events, 100k tasks, half live) the fold took a
/// median 4.5 % less time than with 4 KiB blocks (ten alternating rounds). A read of one
/// task whose block is not cached reads up to 32 KiB instead of 4; the server's list pages
/// and the appends that read a head after a restart were no slower in the same runs. A
/// table file's block size is its own, so journals written with other sizes read as before.
const EVENTS_BLOCK_BYTES: usize = 32 << 10;

/// Bits per key of the `events` space's Bloom filters (about 1 % false positives).
const EVENTS_FILTER_BITS_PER_KEY: f64 = 10.0;

/// The table options of the `events` space: [`EVENTS_BLOCK_BYTES`] data blocks and a
/// whole-key Bloom filter, partitioned like the index, read through the block cache.
///
/// The filter is for the one point lookup that usually finds nothing: the writer's check,
/// at a new task's first append, that the task has no record yet. Without a filter, each
/// table file whose key range holds the id is searched — an index step, a data block read
/// and, on the compressed last level, decompressed — on the writer thread, which every
/// append waits behind: on a recovered journal of 1M records, 1,024 callers created 62–70k
/// tasks/s; 125–128k with this filter, and 178–189k with the lookup left out altogether.
///
/// Filters and index are cut in partitions of about 4 KiB (their top levels pinned in
/// memory) and read through the block cache when a lookup needs them, rather than whole
/// filters held by every open table file: a lookup reads one small partition per table
/// file, the memory they take stays within the cache however large the journal grows, and
/// recovery, which only iterates, never reads a filter. Whole filters held in memory made
/// recovery use 4 % more CPU (12 of 12 alternating rounds) and 25–30 B more per live task;
/// partitioned, recovery's CPU and memory were those without a filter (1.00× over ten
/// rounds). A table file keeps the layout it was written with: journals written before
/// read as they were, and gain the filters as compactions rewrite their files.
fn events_table_options() -> rocksdb::BlockBasedOptions {
    let mut table = rocksdb::BlockBasedOptions::default();
    table.set_block_size(EVENTS_BLOCK_BYTES);
    table.set_bloom_filter(EVENTS_FILTER_BITS_PER_KEY, false);
    table.set_partition_filters(true);
    table.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
    table.set_cache_index_and_filter_blocks(true);
    table.set_pin_top_level_index_and_filter(true);
    table
}

/// Whether RocksDB refused an open because the database's `LOCK` file is held: by another
/// process (`While lock file: …`) or by another open in this one (`lock hold by current
/// process`).
fn is_lock_error(e: &rocksdb::Error) -> bool {
    let message = e.as_ref();
    e.kind() == rocksdb::ErrorKind::IOError
        && (message.contains("While lock file") || message.contains("lock hold by current process"))
}

/// How a [`RocksBackend`] is opened beyond its mode: the RocksDB settings that
/// [`crate::JournalOptions`] chooses.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tuning {
    /// Read table files through memory maps ([`crate::JournalOptions::mmap_reads`]).
    pub mmap_reads: bool,
    /// Finished streams are kept apart ([`crate::JournalOptions::keep_finished_apart`]): the
    /// live records are then stored uncompressed and merged into one run at a clean close
    /// ([`RocksBackend::settle`]).
    pub live_apart: bool,
    /// Flushes and compactions write and read table files with direct I/O where the file
    /// system allows it ([`crate::JournalOptions::direct_table_io`]; a writer's open only).
    pub direct_table_io: bool,
}

/// How the temporary directories of frozen copies ([`Backend::frozen_copy`]) start; a
/// writer's open removes those a crash left behind ([`remove_frozen_copies`]).
pub(crate) const FROZEN_COPY_PREFIX: &str = ".frozen-copy-";

/// The name of the copy inside its temporary directory.
pub(crate) const FROZEN_COPY_NAME: &str = "journal";

/// Removes the frozen copies ([`Backend::frozen_copy`]) a process that crashed while it held
/// them left in the journal's directory: their links to table files the journal has since
/// deleted would keep those files' space taken.
pub(crate) fn remove_frozen_copies(path: &Path) {
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    for entry in entries.flatten() {
        let left = entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.starts_with(FROZEN_COPY_PREFIX));
        if left {
            if let Err(error) = std::fs::remove_dir_all(entry.path()) {
                tracing::warn!(%error, path = %entry.path().display(), "removing a frozen copy left by a crash failed");
            }
        }
    }
}

/// The name of the file a writer's open writes with direct I/O, then removes, to learn
/// whether the journal's file system allows it ([`direct_io_allowed`]).
pub(crate) const DIRECT_IO_PROBE: &str = "DIRECT_IO_PROBE";

/// One block of the size and alignment direct I/O asks for (RocksDB writes table files in
/// multiples of the file system's logical block, 4 KiB on the usual ones).
#[repr(C, align(4096))]
struct AlignedBlock([u8; 4096]);

/// Whether the file system holding `dir` allows direct I/O: a block written to
/// [`DIRECT_IO_PROBE`] opened with `O_DIRECT`, then the file removed. Some file systems
/// refuse the flag at the open (tmpfs before Linux 6.6, some FUSE and network file
/// systems), others the first write; RocksDB would then fail its first flush and stop the
/// journal's writes, so a writer's open asks first. `false` on any failure, and on systems
/// other than Linux (where the journal does not ask RocksDB for direct I/O).
fn direct_io_allowed(dir: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        if std::fs::create_dir_all(dir).is_err() {
            return false;
        }
        let probe = dir.join(DIRECT_IO_PROBE);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(&probe)
            .and_then(|mut file| file.write_all(&Box::new(AlignedBlock([0; 4096])).0));
        // Another open of the same directory probing at the same moment may have removed
        // it first; what counts is that this one's block was written.
        let removed = match std::fs::remove_file(&probe) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        };
        written.is_ok() && removed.is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = dir;
        false
    }
}

impl RocksBackend {
    /// Places the streams of a batch's purges and retirements (their stored records moved
    /// or deleted into `batch`) and returns the key prefixes of those whose records of this
    /// batch are stored with the finished ones, if any.
    fn place_streams(
        &self,
        ops: &[BatchOp],
        batch: &mut rocksdb::WriteBatch,
    ) -> Result<Option<HashSet<Vec<u8>>>> {
        // The streams whose records of this batch are stored with the finished ones (most
        // batches have none), by their key prefix; each retired stream is placed once, by the
        // first retirement naming it (which saw the fewest of its records written).
        let mut apart: Option<HashSet<Vec<u8>>> = None;
        let mut placed: Option<HashSet<Vec<u8>>> = None;
        // A bulk move (the writer's moves that waited: many streams, in key order) reads
        // the streams with one cursor; a few, by key.
        let moves = ops
            .iter()
            .filter(|op| matches!(op, BatchOp::Retire { apart: true, .. }))
            .count();
        let mut cursor = (moves >= BULK_MOVE_STREAMS)
            .then(|| self.cf(Space::Events))
            .transpose()?
            .map(|events| self.db.raw_iterator_cf(events));
        for op in ops {
            if let BatchOp::Purge {
                task,
                below,
                apart: moving,
            } = op
            {
                if self.purge_stored(task, *below, *moving, batch)? {
                    apart
                        .get_or_insert_with(HashSet::new)
                        .insert(crate::keys::task_prefix(task));
                }
                placed
                    .get_or_insert_with(HashSet::new)
                    .insert(crate::keys::task_prefix(task));
                continue;
            }
            if let BatchOp::Retire {
                task,
                stored,
                apart: moving,
            } = op
            {
                let prefix = crate::keys::task_prefix(task);
                if placed
                    .get_or_insert_with(HashSet::new)
                    .insert(prefix.clone())
                    && self.place_retired(task, *stored, *moving, cursor.as_mut(), batch)?
                {
                    apart.get_or_insert_with(HashSet::new).insert(prefix);
                }
            }
        }
        Ok(apart)
    }

    pub(crate) fn open(path: &Path, mode: OpenMode<'_>) -> Result<Self> {
        Self::open_tuned(path, mode, Tuning::default())
    }

    /// Opens the database at `path` for writing, with the column families `names` (a `new`
    /// one with automatic compactions on, an existing one with them off); the database and
    /// whether its table files are written with direct I/O.
    fn open_primary<'a>(
        path: &Path,
        names: impl Iterator<Item = &'a str>,
        tuning: Tuning,
        new: bool,
    ) -> Result<(DB, bool)> {
        let mut opts = primary_db_options()?;
        opts.set_allow_mmap_reads(tuning.mmap_reads);
        let direct = tuning.direct_table_io && direct_io_allowed(path);
        opts.set_use_direct_io_for_flush_and_compaction(direct);
        if tuning.direct_table_io && !direct {
            tracing::info!(
                path = %path.display(),
                "the journal's file system refuses direct I/O: table files are written through the page cache"
            );
        }
        let descriptors = names
            .map(|name| {
                let mut cf = space_options(name, true)?;
                if tuning.live_apart && name == Space::Events.name() {
                    cf.set_bottommost_compression_type(rocksdb::DBCompressionType::None);
                }
                // Until the first write (see `Backend::start_compactions`), unless the
                // journal is new: then nothing is there to compact.
                cf.set_disable_auto_compactions(!new);
                Ok(ColumnFamilyDescriptor::new(name, cf))
            })
            .collect::<Result<Vec<_>>>()?;
        let db = DB::open_cf_descriptors(&opts, path, descriptors).map_err(|e| {
            if is_lock_error(&e) {
                Error::InUse {
                    path: path.to_path_buf(),
                }
            } else {
                e.into()
            }
        })?;
        if !new {
            sync_replayed_logs(path)?;
        }
        Ok((db, direct))
    }

    /// [`RocksBackend::open`] with the settings `tuning` names.
    pub(crate) fn open_tuned(path: &Path, mode: OpenMode<'_>, tuning: Tuning) -> Result<Self> {
        if !matches!(mode, OpenMode::Primary) && !path.join("CURRENT").exists() {
            return Err(Error::NotAJournal(format!(
                "no database at {}",
                path.display()
            )));
        }
        // A format-1 journal still has its `heads` space until it is opened for writing
        // (RocksDB opens a database only with all its column families named), and one of
        // formats 1–3 has no `finished` column family until then (a writer's open creates it).
        let existing = if path.join("CURRENT").exists() {
            DB::list_cf(&db_options(false), path)?
        } else {
            Vec::new()
        };
        let has = |name: &str| existing.iter().any(|n| n == name);
        let legacy = has(LEGACY_HEADS);
        let finished = matches!(mode, OpenMode::Primary) || has(FINISHED_EVENTS);
        let names = Space::ALL
            .iter()
            .map(|s| s.name())
            .chain(finished.then_some(FINISHED_EVENTS))
            .chain(legacy.then_some(LEGACY_HEADS));
        let mut direct = false;
        let db = match mode {
            OpenMode::Primary => {
                let (db, direct_io) = Self::open_primary(path, names, tuning, existing.is_empty())?;
                direct = direct_io;
                db
            }
            OpenMode::ReadOnly => {
                DB::open_cf_for_read_only(&db_options(false), path, names, false)?
            }
            OpenMode::Secondary(secondary) => {
                let mut opts = db_options(false);
                opts.set_max_open_files(-1);
                // A follower replays the writer's log into memtables of its own: the same
                // per-space options as the writer's, the insertion hints among them.
                let descriptors = names
                    .map(|name| {
                        Ok(ColumnFamilyDescriptor::new(
                            name,
                            space_options(name, false)?,
                        ))
                    })
                    .collect::<Result<Vec<_>>>()?;
                DB::open_cf_descriptors_as_secondary(&opts, path, secondary, descriptors)?
            }
        };
        let mut sync = WriteOptions::default();
        // Sync: the WAL is fsynced before the write returns, so an acknowledged append
        // survives power loss, not only a process crash.
        sync.set_sync(true);
        let mut buffered = WriteOptions::default();
        buffered.set_sync(false);
        let compactions = if matches!(mode, OpenMode::Primary) && !existing.is_empty() {
            Compactions::Off
        } else {
            Compactions::On
        };
        let backend = Self {
            finished_used: AtomicBool::new(false),
            db: Arc::new(db),
            compactions: std::sync::Mutex::new(compactions),
            #[cfg(test)]
            compactions_gate: std::sync::Mutex::new(None),
            read_only: !matches!(mode, OpenMode::Primary),
            secondary: matches!(mode, OpenMode::Secondary(_)),
            sync,
            buffered,
            point_reads: rocksdb::ReadOptions::default(),
            tuning: Tuning {
                direct_table_io: direct,
                ..tuning
            },
        };
        // A follower reads both places whenever the journal has the `finished` column
        // family: its catch-up makes a stream's move visible at once, before any flag could
        // be set after it, and a read in between would find the stream nowhere.
        let used = (backend.secondary && backend.finished_cf().is_some())
            || backend.finished_has_records()?;
        backend.finished_used.store(used, Ordering::Release);
        Ok(backend)
    }

    /// Whether the `finished` column family holds anything (one seek).
    fn finished_has_records(&self) -> Result<bool> {
        let Some(finished) = self.finished_cf() else {
            return Ok(false);
        };
        let mut cursor = self.db.raw_iterator_cf(finished);
        cursor.seek_to_first();
        cursor.status()?;
        Ok(cursor.valid())
    }

    /// The number of level-0 files of `space` (for tests).
    #[cfg(test)]
    pub(crate) fn level0_files(&self, space: Space) -> Result<u64> {
        Ok(self
            .db
            .property_int_value_cf(self.cf(space)?, "rocksdb.num-files-at-level0")?
            .unwrap_or(0))
    }

    /// The number RocksDB's aggregated table properties of `space` give for `name` (for
    /// tests); `None` before any table file exists, or when they do not name it.
    #[cfg(test)]
    pub(crate) fn table_property(&self, space: Space, name: &str) -> Result<Option<u64>> {
        let properties = self
            .db
            .property_value_cf(self.cf(space)?, "rocksdb.aggregated-table-properties")?
            .unwrap_or_default();
        Ok(properties.split(';').find_map(|part| {
            let (key, value) = part.split_once('=')?;
            (key.trim() == name).then(|| value.trim().parse::<u64>().ok())?
        }))
    }

    /// The mean size of the data blocks of `space`'s table files, from RocksDB's aggregated
    /// table properties (for tests); `None` before any table file exists.
    #[cfg(test)]
    pub(crate) fn mean_data_block_bytes(&self, space: Space) -> Result<Option<u64>> {
        Ok(
            match (
                self.table_property(space, "data block size")?,
                self.table_property(space, "# data blocks")?,
            ) {
                (Some(bytes), Some(blocks)) if blocks > 0 => Some(bytes / blocks),
                _ => None,
            },
        )
    }

    /// Waits until no compaction is due or running (for tests), once compactions are on if
    /// they are being turned on.
    #[cfg(test)]
    pub(crate) fn wait_for_compactions(&self) -> Result<()> {
        if matches!(*self.compactions_state(), Compactions::Starting(_)) {
            self.compactions_started()?;
        }
        Ok(self
            .db
            .wait_for_compact(&rocksdb::WaitForCompactOptions::default())?)
    }

    fn cf(&self, space: Space) -> Result<&ColumnFamily> {
        cf_named(&self.db, space.name())
    }

    /// The column family of finished streams' records; `None` in a journal of formats 1–3
    /// opened read-only or as a follower (it has none yet).
    fn finished_cf(&self) -> Option<&ColumnFamily> {
        self.db.cf_handle(FINISHED_EVENTS)
    }

    /// The `finished` column family, if a record may lie there: reads of the `events` space
    /// read it beside `events` only then (two iterators for one cost a short read up to a
    /// tenth of its time). Asked after the `events` part of a read is made: a stream moved
    /// before that part saw it was moved after the flag was set (see `write`).
    fn finished_in_use(&self) -> Option<&ColumnFamily> {
        if self.finished_used.load(Ordering::Acquire) {
            self.finished_cf()
        } else {
            None
        }
    }

    /// [`RocksBackend::compactions`], locked.
    fn compactions_state(&self) -> std::sync::MutexGuard<'_, Compactions> {
        self.compactions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits until automatic compactions are on: for the thread turning them on, or turns
    /// them on here if they were off.
    ///
    /// # Errors
    /// [`Error::Storage`] when they could not be turned on (they count as off, to be tried
    /// again).
    fn compactions_started(&self) -> Result<()> {
        let mut state = self.compactions_state();
        let outcome = match std::mem::replace(&mut *state, Compactions::On) {
            Compactions::On => Ok(()),
            Compactions::Off => compactions_on(&self.db, &self.space_names()),
            Compactions::Starting(handle) => handle.join().unwrap_or_else(|_| {
                Err(Error::storage("the thread turning compactions on panicked"))
            }),
        };
        if outcome.is_err() {
            *state = Compactions::Off;
        }
        outcome
    }

    /// The names of every column family the journal has: one per space, and `finished`.
    fn space_names(&self) -> Vec<&'static str> {
        let mut all: Vec<&'static str> = Space::ALL.iter().map(|space| space.name()).collect();
        if self.finished_cf().is_some() {
            all.push(FINISHED_EVENTS);
        }
        all
    }

    /// Every column family the journal has ([`RocksBackend::space_names`]).
    fn column_families(&self) -> Result<Vec<&ColumnFamily>> {
        self.space_names()
            .into_iter()
            .map(|name| cf_named(&self.db, name))
            .collect()
    }

    /// Where the records of retired `task` that a batch writes go: `true` for `finished`.
    /// Moving (finished streams kept apart), the records of it stored so far go there too
    /// ([`RocksBackend::move_stored`]). Not moving, they go where the stream lies: in
    /// `finished` only if it was moved there before (while streams were kept apart), which
    /// its first record in `events` tells; a journal that never moved a stream asks nothing.
    fn place_retired(
        &self,
        task: &str,
        stored: u64,
        moving: bool,
        cursor: Option<&mut rocksdb::DBRawIterator<'_>>,
        batch: &mut rocksdb::WriteBatch,
    ) -> Result<bool> {
        if moving {
            match cursor {
                Some(cursor) => self.move_stored_scanning(cursor, task, stored, batch)?,
                None => self.move_stored(task, stored, batch)?,
            }
            return Ok(true);
        }
        if stored == 0 || !self.finished_used.load(Ordering::Acquire) {
            return Ok(false);
        }
        let first = crate::keys::event_key(task, 0);
        Ok(self
            .db
            .get_pinned_cf(self.cf(Space::Events)?, first)?
            .is_none())
    }

    /// Deletes `task`'s records below `below` in `batch` where the stream lies — in `events`
    /// when its first record is there, else in `finished` — each key with a single deletion
    /// (each was put once where it lies, and a move single-deleted it from `events`; a second
    /// kind of deletion of a key would break that contract). Returns whether the records of
    /// the stream the batch puts (its tombstone) go to `finished`: when `moving` (finished
    /// streams kept apart) or when the stream lies there.
    fn purge_stored(
        &self,
        task: &str,
        below: u64,
        moving: bool,
        batch: &mut rocksdb::WriteBatch,
    ) -> Result<bool> {
        let events = self.cf(Space::Events)?;
        let first = crate::keys::event_key(task, 0);
        let in_events = self.db.get_pinned_cf(events, &first)?.is_some();
        let finished = self.finished_cf();
        let cf = match (in_events, finished) {
            (false, Some(finished)) => finished,
            _ => events,
        };
        for position in 0..below.min(crate::keys::MAX_POSITION) {
            batch.single_delete_cf(cf, crate::keys::event_key(task, position));
        }
        Ok(finished.is_some() && (moving || !in_events))
    }

    /// The two column families a move reads from and writes to: `events` and `finished`.
    ///
    /// # Errors
    /// [`Error::NotAJournal`] when `finished` is missing (an open made it otherwise).
    fn move_cfs(&self) -> Result<(&ColumnFamily, &ColumnFamily)> {
        let events = self.cf(Space::Events)?;
        let finished = self.finished_cf().ok_or_else(|| {
            Error::NotAJournal(format!("column family {FINISHED_EVENTS} missing"))
        })?;
        Ok((events, finished))
    }

    /// The records of `task` at positions below `stored` that lie in the `events` column
    /// family (its stream had no terminal record before this batch, or is of an older format),
    /// put into `finished` and single-deleted from `events` in `batch`.
    ///
    /// Looked up by key, not scanned: an iterator stepping past a task's last record would step
    /// over every moved record whose put and deletion still wait in the memtable for a flush
    /// to drop them (a third of the writer's time in the lifecycle bench). The first record
    /// decides: a stream lies wholly in one place, so without it in `events` nothing of the
    /// stream is (a new task, or a stream already finished). Each key of `events` is put once
    /// and never overwritten, so a single deletion meets exactly one put: when both are still
    /// in a memtable, its flush drops the pair, and no tombstone is left for recovery to step
    /// over.
    fn move_stored(&self, task: &str, stored: u64, batch: &mut rocksdb::WriteBatch) -> Result<()> {
        if stored == 0 {
            return Ok(());
        }
        let (events, finished) = self.move_cfs()?;
        let first = crate::keys::event_key(task, 0);
        let Some(value) = self.db.get_pinned_cf(events, &first)? else {
            return Ok(());
        };
        batch.put_cf(finished, &first, value);
        batch.single_delete_cf(events, &first);
        let rest: Vec<Vec<u8>> = (1..stored.min(crate::keys::MAX_POSITION))
            .map(|position| crate::keys::event_key(task, position))
            .collect();
        for (key, value) in rest
            .iter()
            .zip(self.db.batched_multi_get_cf(events, &rest, true))
        {
            if let Some(value) = value? {
                batch.put_cf(finished, key, value);
                batch.single_delete_cf(events, key);
            }
        }
        Ok(())
    }

    /// [`RocksBackend::move_stored`] for a bulk move ([`BULK_MOVE_STREAMS`] or more): the
    /// stream's records read with `cursor`, one iterator on `events` that the batch's moves
    /// share, in key order, so that each seek lands just past the last. It reads at most
    /// `stored` records of the stream, never stepping past its last one onto the moved
    /// pairs of earlier batches that may wait in the memtable; records this batch moves are
    /// not seen by it (a cursor reads the column family as it was when made).
    fn move_stored_scanning(
        &self,
        cursor: &mut rocksdb::DBRawIterator<'_>,
        task: &str,
        stored: u64,
        batch: &mut rocksdb::WriteBatch,
    ) -> Result<()> {
        if stored == 0 {
            return Ok(());
        }
        let (events, finished) = self.move_cfs()?;
        let prefix = crate::keys::task_prefix(task);
        cursor.seek(&prefix);
        let mut read = 0;
        while read < stored {
            match (cursor.key(), cursor.value()) {
                (Some(key), Some(value)) if key.starts_with(&prefix) => {
                    batch.put_cf(finished, key, value);
                    batch.single_delete_cf(events, key);
                }
                _ => break,
            }
            read += 1;
            if read < stored {
                cursor.next();
            }
        }
        cursor.status()?;
        Ok(())
    }

    /// An iterator over `range` of one column family.
    fn scan_cf<'a>(&'a self, cf: &'a ColumnFamily, range: &Range) -> RawIter<'a> {
        self.scan_cf_at(cf, range, None)
    }

    /// [`RocksBackend::scan_cf`], reading at `snapshot` when one is given.
    fn scan_cf_at<'a>(
        &'a self,
        cf: &'a ColumnFamily,
        range: &Range,
        snapshot: Option<&rocksdb::SnapshotWithThreadMode<'a, DB>>,
    ) -> RawIter<'a> {
        let mut opts = ReadOptions::default();
        if let Some(snapshot) = snapshot {
            opts.set_snapshot(snapshot);
        }
        if let Some(upper) = &range.upper {
            opts.set_iterate_upper_bound(upper.clone());
        }
        opts.set_iterate_lower_bound(range.lower.clone());
        let mode = if range.reverse {
            IteratorMode::End
        } else {
            IteratorMode::From(&range.lower, Direction::Forward)
        };
        Box::new(
            self.db
                .iterator_cf_opt(cf, opts, mode)
                .map(|item| item.map_err(Error::from)),
        )
    }

    /// A cursor on `space`'s own column family alone.
    fn raw_cursor(&self, space: Space, options: ReadOptions) -> Box<dyn Cursor + '_> {
        match self.cf(space) {
            Ok(cf) => Box::new(RocksCursor {
                raw: self.db.raw_iterator_cf_opt(cf, options),
                positioned: false,
            }),
            Err(e) => Box::new(FailedCursor(e.to_string())),
        }
    }

    /// A cursor on `space`; for `events`, on both its column families seen as one (`events`
    /// made first, for the reason [`Backend::get`] gives).
    fn cursor_with(&self, space: Space, options: fn() -> ReadOptions) -> Box<dyn Cursor + '_> {
        match (space, self.finished_in_use()) {
            (Space::Events, Some(finished)) if self.read_only => Box::new(MergedCursor::new(
                self.raw_cursor(space, options()),
                Box::new(RocksCursor {
                    raw: self.db.raw_iterator_cf_opt(finished, options()),
                    positioned: false,
                }),
            )),
            (Space::Events, Some(finished)) => {
                // Both column families at one snapshot (see `AtSnapshot`), where records
                // move (a follower cannot take snapshots).
                let snapshot = self.db.snapshot();
                let at = || {
                    let mut opts = options();
                    opts.set_snapshot(&snapshot);
                    opts
                };
                let merged = MergedCursor::new(
                    self.raw_cursor(space, at()),
                    Box::new(RocksCursor {
                        raw: self.db.raw_iterator_cf_opt(finished, at()),
                        positioned: false,
                    }),
                );
                Box::new(AtSnapshot {
                    inner: merged,
                    _snapshot: snapshot,
                })
            }
            _ => self.raw_cursor(space, options()),
        }
    }

    /// Drops format 1's `heads` space, if the database still has it.
    pub(crate) fn drop_legacy_heads(&mut self) -> Result<()> {
        if self.db.cf_handle(LEGACY_HEADS).is_some() {
            // Called at open, before any thread shares the database.
            Arc::get_mut(&mut self.db)
                .ok_or_else(|| Error::storage("the database is shared: cannot drop a space"))?
                .drop_cf(LEGACY_HEADS)?;
        }
        Ok(())
    }
}

impl Backend for RocksBackend {
    fn dir(&self) -> Option<&Path> {
        Some(self.db.path())
    }

    fn describe(&self) -> String {
        self.db.path().display().to_string()
    }

    fn storage_stats(&self) -> Result<Option<StorageStats>> {
        use rocksdb::properties as p;
        // A figure of the whole database, then of each column family.
        let int = |name: &rocksdb::properties::PropName| -> Result<u64> {
            Ok(self.db.property_int_value(name)?.unwrap_or(0))
        };
        let names = Space::ALL
            .iter()
            .map(|space| space.name())
            .chain([FINISHED_EVENTS, LEGACY_HEADS]);
        let mut spaces = Vec::new();
        for name in names {
            let Some(cf) = self.db.cf_handle(name) else {
                continue;
            };
            let of_space = |property: &rocksdb::properties::PropName| -> Result<u64> {
                Ok(self.db.property_int_value_cf(cf, property)?.unwrap_or(0))
            };
            spaces.push(SpaceStats {
                name: name.to_owned(),
                memtable_bytes: of_space(p::CUR_SIZE_ALL_MEM_TABLES)?,
                immutable_memtables: of_space(p::NUM_IMMUTABLE_MEM_TABLE)?,
                level0_files: self
                    .db
                    .property_int_value_cf(cf, p::num_files_at_level(0))?
                    .unwrap_or(0),
                table_bytes: of_space(p::LIVE_SST_FILES_SIZE)?,
                pending_compaction_bytes: of_space(p::ESTIMATE_PENDING_COMPACTION_BYTES)?,
                estimated_keys: of_space(p::ESTIMATE_NUM_KEYS)?,
            });
        }
        Ok(Some(StorageStats {
            spaces,
            running_flushes: int(p::NUM_RUNNING_FLUSHES)?,
            running_compactions: int(p::NUM_RUNNING_COMPACTIONS)?,
            write_stopped: int(p::IS_WRITE_STOPPED)? != 0,
            delayed_write_rate: int(p::ACTUAL_DELAYED_WRITE_RATE)?,
            background_errors: int(p::BACKGROUND_ERRORS)?,
            direct_table_io: self.tuning.direct_table_io,
        }))
    }

    fn write(&self, ops: Vec<BatchOp>, durability: Durability) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        // Sized once for the whole batch: grown op by op, RocksDB's buffer would be copied a
        // dozen times on the way to a large batch's size.
        let mut batch = rocksdb::WriteBatch::with_capacity_bytes(write_batch_bytes(&ops));
        // Each space's handle looked up once per batch, not once per op (a lookup by name).
        let mut handles: [Option<&ColumnFamily>; Space::ALL.len()] = [None; Space::ALL.len()];
        let mut cf = |space: Space| -> Result<&ColumnFamily> {
            let slot = &mut handles[space as usize];
            match *slot {
                Some(handle) => Ok(handle),
                None => Ok(*slot.insert(self.cf(space)?)),
            }
        };
        let apart = self.place_streams(&ops, &mut batch)?;
        let finished = match apart {
            Some(_) => {
                let finished = self.finished_cf().ok_or_else(|| {
                    Error::NotAJournal(format!("column family {FINISHED_EVENTS} missing"))
                })?;
                // Before the write: a reader that sees a stream gone from `events` sees this.
                self.finished_used.store(true, Ordering::Release);
                Some(finished)
            }
            None => None,
        };
        for op in ops {
            match op {
                BatchOp::Put {
                    space: Space::Events,
                    key,
                    value,
                } => {
                    let task = key.len().saturating_sub(crate::keys::POSITION_BYTES);
                    match (&apart, finished) {
                        (Some(apart), Some(finished)) if apart.contains(&key[..task]) => {
                            batch.put_cf(finished, key, value);
                        }
                        _ => batch.put_cf(cf(Space::Events)?, key, value),
                    }
                }
                // A record is put once where it lies, and removed from there (by a move or a
                // purge) with a single deletion, which cancels one put: a replacement first
                // cancels the put it replaces, so that each key keeps at most one put between
                // single deletions (a second put would come back when the next single
                // deletion cancels the first).
                BatchOp::Replace { key, value } => {
                    let task = key.len().saturating_sub(crate::keys::POSITION_BYTES);
                    let cf = match (&apart, finished) {
                        (Some(apart), Some(finished)) if apart.contains(&key[..task]) => finished,
                        _ => cf(Space::Events)?,
                    };
                    batch.single_delete_cf(cf, &key);
                    batch.put_cf(cf, key, value);
                }
                BatchOp::Put { space, key, value } => batch.put_cf(cf(space)?, key, value),
                // A record is removed wherever it lies (only tests and repairs remove any).
                BatchOp::Delete {
                    space: Space::Events,
                    key,
                } => {
                    batch.delete_cf(cf(Space::Events)?, &key);
                    if let Some(finished) = self.finished_cf() {
                        batch.delete_cf(finished, key);
                    }
                }
                BatchOp::Delete { space, key } => batch.delete_cf(cf(space)?, key),
                // Placed above.
                BatchOp::Retire { .. } | BatchOp::Purge { .. } => {}
            }
        }
        let write_options = match durability {
            Durability::Sync => &self.sync,
            Durability::Buffered => &self.buffered,
        };
        self.db.write_opt(batch, write_options)?;
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        // With automatic WAL flushing (the default) every write is already in the OS's
        // buffers; this syncs the log files up to the current one, concurrently with writers.
        self.db.flush_wal(true)?;
        Ok(())
    }

    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let found = self
            .db
            .get_cf_opt(self.cf(space)?, key, &self.point_reads)?;
        // `events` before `finished`: a record moved between the two reads is found in the
        // second (records only ever move that way).
        match (found, space, self.finished_in_use()) {
            (None, Space::Events, Some(finished)) => {
                Ok(self.db.get_cf_opt(finished, key, &self.point_reads)?)
            }
            (found, ..) => Ok(found),
        }
    }

    fn scan(&self, space: Space, range: Range) -> RawIter<'_> {
        let cf = match self.cf(space) {
            Ok(cf) => cf,
            Err(e) => return Box::new(std::iter::once(Err(e))),
        };
        match (space, self.finished_in_use()) {
            // Both column families at one snapshot (see `AtSnapshot`): a record moved
            // between the two iterators' making would otherwise be in both (and come once),
            // but a trim that moves a stream rewrites its records as it moves them, and the
            // old records of one would have come with the new ones of the other.
            // (Only where records move: a follower, whose view moves at its catch-ups,
            // cannot take snapshots.)
            (Space::Events, Some(finished)) if !self.read_only => {
                let snapshot = self.db.snapshot();
                let iter = self.scan_cf_at(cf, &range, Some(&snapshot));
                let moved = self.scan_cf_at(finished, &range, Some(&snapshot));
                Box::new(AtSnapshot {
                    inner: Merged::new(iter, moved, range.reverse),
                    _snapshot: snapshot,
                })
            }
            (Space::Events, Some(finished)) => Box::new(Merged::new(
                self.scan_cf(cf, &range),
                self.scan_cf(finished, &range),
                range.reverse,
            )),
            _ => self.scan_cf(cf, &range),
        }
    }

    fn cursor(&self, space: Space) -> Box<dyn Cursor + '_> {
        self.cursor_with(space, bulk_read_options)
    }

    fn lookup_cursor(&self, space: Space) -> Box<dyn Cursor + '_> {
        self.cursor_with(space, ReadOptions::default)
    }

    fn live_records_cursor(&self) -> Option<Box<dyn Cursor + '_>> {
        // With nothing in `finished` every stream is in `events`: no shortcut.
        self.finished_in_use()?;
        Some(self.raw_cursor(Space::Events, bulk_read_options()))
    }

    fn unmoved_records_cursor(&self) -> Option<Box<dyn Cursor + '_>> {
        self.finished_cf()?;
        Some(self.raw_cursor(Space::Events, bulk_read_options()))
    }

    fn catch_up(&self) -> Result<()> {
        if self.secondary {
            // A follower of a format-4 journal reads both places from its open (see
            // `open_tuned`); one of an older format has no `finished` column family, and
            // its writer's upgrade is reported by the journal's catch-up.
            self.db.try_catch_up_with_primary()?;
        }
        Ok(())
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn is_secondary(&self) -> bool {
        self.secondary
    }

    fn frozen_copy(&self) -> Result<Option<tempfile::TempDir>> {
        if self.read_only {
            return Ok(None);
        }
        let dir = tempfile::Builder::new()
            .prefix(FROZEN_COPY_PREFIX)
            .tempdir_in(self.db.path())
            .map_err(|e| Error::storage(format!("a directory for a frozen copy: {e}")))?;
        // Without a flush (the log files are copied as they stand, a batch cut short at the
        // end of the last one dropped when the copy is opened): a copy costs links to the
        // table files and a copy of the log, and leaves the store's memtables alone.
        rocksdb::checkpoint::Checkpoint::new(&self.db)?
            .create_checkpoint_with_log_size(dir.path().join(FROZEN_COPY_NAME), u64::MAX)?;
        self.sync()?;
        Ok(Some(dir))
    }

    fn foreign_keys(&self, max: usize) -> Result<Vec<Vec<u8>>> {
        let mut keys = Vec::new();
        for item in self.db.iterator(rocksdb::IteratorMode::Start).take(max) {
            let (key, _) = item?;
            keys.push(key.to_vec());
        }
        Ok(keys)
    }

    fn has_legacy_heads(&self) -> bool {
        self.db.cf_handle(LEGACY_HEADS).is_some()
    }

    fn start_compactions(&self) -> Result<()> {
        let mut state = self.compactions_state();
        if !matches!(*state, Compactions::Off) {
            return Ok(());
        }
        let db = Arc::clone(&self.db);
        let spaces = self.space_names();
        #[cfg(test)]
        let gate = self
            .compactions_gate
            .lock()
            .ok()
            .and_then(|mut gate| gate.take());
        let started = std::thread::Builder::new()
            .name("dtask-compactions-on".into())
            .spawn(move || {
                #[cfg(test)]
                if let Some(gate) = gate {
                    let _ = gate.recv();
                }
                let outcome = compactions_on(&db, &spaces);
                if let Err(error) = &outcome {
                    tracing::warn!(%error, "cannot turn the journal's compactions on");
                }
                outcome
            });
        *state = if let Ok(handle) = started {
            Compactions::Starting(handle)
        } else {
            // No thread to spare: turned on here.
            compactions_on(&self.db, &self.space_names())?;
            Compactions::On
        };
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        for cf in self.column_families()? {
            self.db.flush_cf(cf)?;
        }
        Ok(())
    }

    fn compact(&self) -> Result<bool> {
        if self.read_only {
            return Ok(false);
        }
        self.flush()?;
        for cf in self.column_families()? {
            self.db.compact_range_cf(cf, None::<&[u8]>, None::<&[u8]>);
        }
        Ok(true)
    }

    fn flush_in_background(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        // RocksDB skips a column family whose memtables are empty. The call returns once the
        // flushes are scheduled, except that RocksDB first waits while one more memtable or
        // level-0 file would stall writes (`allow_write_stall` stays off: the binding has no
        // setter). Before the writer's first write compactions are off, so only the memtable
        // count counts, and a second full memtable waits for a flush already running, which
        // ends: the wait is bounded.
        let mut options = rocksdb::FlushOptions::default();
        options.set_wait(false);
        self.db.flush_cfs_opt(&self.column_families()?, &options)?;
        Ok(())
    }

    fn settle(&self, timeout: std::time::Duration) -> Result<bool> {
        if self.read_only {
            return Ok(true);
        }
        // A journal that was opened and not appended to still has its compactions off.
        self.compactions_started()?;
        let mut options = rocksdb::WaitForCompactOptions::default();
        // RocksDB reads a zero timeout as "no limit": wait at least a microsecond.
        options.set_timeout(
            u64::try_from(timeout.as_micros())
                .unwrap_or(u64::MAX)
                .max(1),
        );
        match self.db.wait_for_compact(&options) {
            Ok(()) => {}
            Err(e) if e.kind() == rocksdb::ErrorKind::TimedOut => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        self.merge_live_records()?;
        Ok(true)
    }
}

/// Streams moved in one batch from which the batch reads them with one cursor
/// ([`RocksBackend::move_stored_scanning`]) rather than by key.
const BULK_MOVE_STREAMS: usize = 8;

/// The most live records (table files of the `events` column family) a clean close merges
/// into one run when finished streams are kept apart ([`RocksBackend::merge_live_records`]).
const MERGE_LIVE_RECORDS_BYTES: u64 = 256 << 20;

impl RocksBackend {
    /// With finished streams kept apart, merges the live records' level-0 files into one
    /// sorted run, if there are several and they are small enough: part of a clean close.
    ///
    /// Kept apart, the `events` column family receives about half the records it would
    /// otherwise, so it often closes with two or three overlapping level-0 files (four
    /// start RocksDB's own compaction), which recovery's cursor merges record by record. What
    /// it holds then is the live working set, stored uncompressed (a compaction writes the
    /// last level, otherwise LZ4-compressed), so merging it at close is cheap; above
    /// [`MERGE_LIVE_RECORDS_BYTES`] it is left to RocksDB.
    fn merge_live_records(&self) -> Result<()> {
        if !self.tuning.live_apart || !self.finished_used.load(Ordering::Acquire) {
            return Ok(());
        }
        let events = self.cf(Space::Events)?;
        let level0 = self
            .db
            .property_int_value_cf(events, "rocksdb.num-files-at-level0")?
            .unwrap_or(0);
        let bytes = self
            .db
            .property_int_value_cf(events, "rocksdb.total-sst-files-size")?
            .unwrap_or(u64::MAX);
        if level0 >= 2 && bytes <= MERGE_LIVE_RECORDS_BYTES {
            self.db
                .compact_range_cf(events, None::<&[u8]>, None::<&[u8]>);
        }
        Ok(())
    }
}

/// Read options of bulk reads: a large read-ahead, and blocks read once stay out of the block
/// cache (they would only evict the working set of the point reads).
fn bulk_read_options() -> ReadOptions {
    let mut opts = ReadOptions::default();
    opts.set_readahead_size(BULK_READAHEAD);
    opts.fill_cache(false);
    opts
}

/// The read-ahead of bulk reads.
const BULK_READAHEAD: usize = 2 << 20;

/// Reads of `events` and `finished` made at one snapshot, kept with them: the two column
/// families of one space seen as of one moment. (Declared first, the reads are dropped
/// before the snapshot is released.)
struct AtSnapshot<'a, I> {
    inner: I,
    _snapshot: rocksdb::SnapshotWithThreadMode<'a, DB>,
}

impl<I: Iterator> Iterator for AtSnapshot<'_, I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        self.inner.next()
    }
}

impl<C: Cursor> Cursor for AtSnapshot<'_, C> {
    fn seek(&mut self, key: &[u8]) {
        self.inner.seek(key);
    }

    fn next(&mut self) {
        self.inner.next();
    }

    fn key(&self) -> Option<&[u8]> {
        self.inner.key()
    }

    fn value(&self) -> Option<&[u8]> {
        self.inner.value()
    }

    fn status(&self) -> Result<()> {
        self.inner.status()
    }

    fn source(&self) -> super::Source {
        self.inner.source()
    }
}

/// A [`Cursor`] on a RocksDB raw iterator.
struct RocksCursor<'a> {
    raw: rocksdb::DBRawIteratorWithThreadMode<'a, DB>,
    positioned: bool,
}

impl Cursor for RocksCursor<'_> {
    fn seek(&mut self, key: &[u8]) {
        self.raw.seek(key);
        self.positioned = true;
    }

    fn next(&mut self) {
        if self.positioned && self.raw.valid() {
            self.raw.next();
        }
    }

    fn key(&self) -> Option<&[u8]> {
        if self.positioned {
            self.raw.key()
        } else {
            None
        }
    }

    fn value(&self) -> Option<&[u8]> {
        if self.positioned {
            self.raw.value()
        } else {
            None
        }
    }

    fn status(&self) -> Result<()> {
        Ok(self.raw.status()?)
    }
}

/// A cursor of a space that cannot be opened: empty, with the error as its status.
struct FailedCursor(String);

impl Cursor for FailedCursor {
    fn seek(&mut self, _key: &[u8]) {}
    fn next(&mut self) {}
    fn key(&self) -> Option<&[u8]> {
        None
    }
    fn value(&self) -> Option<&[u8]> {
        None
    }
    fn status(&self) -> Result<()> {
        Err(Error::storage(self.0.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text of the newest options file RocksDB wrote in `dir` (it writes one at every
    /// open, numbered in order).
    fn newest_options(dir: &Path) -> String {
        let newest = std::fs::read_dir(dir)
            .expect("the journal's directory")
            .filter_map(|entry| {
                entry
                    .ok()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
            })
            .filter_map(|name| {
                let number = name.strip_prefix("OPTIONS-")?.parse::<u64>().ok()?;
                Some((number, name))
            })
            .max()
            .expect("an options file");
        std::fs::read_to_string(dir.join(newest.1)).expect("the options file")
    }

    /// The `[CFOptions "<space>"]` section of [`newest_options`].
    fn options_section(dir: &Path, space: Space) -> String {
        let text = newest_options(dir);
        let header = format!("[CFOptions \"{}\"]", space.name());
        let start = text.find(&header).expect("the space's section");
        let rest = &text[start + header.len()..];
        rest[..rest.find("\n[").unwrap_or(rest.len())].to_owned()
    }

    #[test]
    fn only_the_events_space_keeps_an_insertion_hint_per_task() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let backend = RocksBackend::open(dir.path(), OpenMode::Primary).expect("open");
        backend
            .write(
                vec![BatchOp::Put {
                    space: Space::Events,
                    key: crate::keys::event_key("a-task", 0).into(),
                    value: b"a record".to_vec().into(),
                }],
                Durability::Sync,
            )
            .expect("a write");
        drop(backend);
        let hint = "memtable_insert_with_hint_prefix_extractor=dtask.TaskPrefix";
        assert!(options_section(dir.path(), Space::Events).contains(hint));
        assert!(!options_section(dir.path(), Space::Commits).contains(hint));
        // The options file RocksDB wrote names the extractor, and the journal opens again (the
        // read-only open does not need it).
        let backend = RocksBackend::open(dir.path(), OpenMode::ReadOnly).expect("read-only");
        drop(backend);
        RocksBackend::open(dir.path(), OpenMode::Primary).expect("reopen");
    }

    /// Puts `count` records of `task` from position `from`, one write each: log records of
    /// one size, so that a reused log file's earlier records start where a later one's end.
    fn put_records(backend: &RocksBackend, task: &str, from: u64, count: u64) {
        for position in from..from + count {
            let op = BatchOp::Put {
                space: Space::Events,
                key: crate::keys::event_key(task, position).into(),
                value: vec![7; 200].into(),
            };
            backend
                .write(vec![op], Durability::Buffered)
                .expect("a write");
        }
    }

    /// How many keys a cursor over `space` of `backend` steps through.
    fn records_in(backend: &RocksBackend, space: Space) -> usize {
        let mut cursor = backend.cursor(space);
        cursor.seek(&[]);
        let mut records = 0;
        while cursor.key().is_some() {
            records += 1;
            cursor.next();
        }
        records
    }

    /// The keys of `task` in the raw column family `name`, with their values.
    fn raw_records(backend: &RocksBackend, name: &str, task: &str) -> Vec<(u64, Vec<u8>)> {
        let cf = backend.db.cf_handle(name).expect("the column family");
        backend
            .db
            .prefix_iterator_cf(cf, crate::keys::task_prefix(task))
            .map(|item| item.expect("a read"))
            .take_while(|(key, _)| key.starts_with(&crate::keys::task_prefix(task)))
            .map(|(key, value)| {
                (
                    crate::keys::position_in(task, &key).expect("an event key"),
                    value.to_vec(),
                )
            })
            .collect()
    }

    /// A retirement moves what is stored of the stream and stores there what the batch puts
    /// of it, before and after the retirement, once however often the batch names it; other
    /// streams stay; every read of the `events` space sees the stream as before.
    #[test]
    fn a_retired_stream_lies_wholly_with_the_finished_ones() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let backend = RocksBackend::open(dir.path(), OpenMode::Primary).expect("open");
        put_records(&backend, "t", 0, 3);
        put_records(&backend, "t-other", 0, 2);
        put_records(&backend, "u", 0, 1);
        let put = |task: &str, position: u64| BatchOp::Put {
            space: Space::Events,
            key: crate::keys::event_key(task, position).into(),
            value: vec![8; 100].into(),
        };
        let retire = |task: &str, stored: u64| BatchOp::Retire {
            task: task.to_owned(),
            stored,
            apart: true,
        };
        backend
            .write(
                vec![
                    put("t", 3),
                    put("u", 1),
                    retire("t", 4),
                    put("t", 4),
                    retire("t", 5),
                ],
                Durability::Sync,
            )
            .expect("the batch");
        assert_eq!(raw_records(&backend, Space::Events.name(), "t"), []);
        let finished = raw_records(&backend, FINISHED_EVENTS, "t");
        assert_eq!(
            finished.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
        assert_eq!(finished[0].1, vec![7; 200], "moved as it was");
        assert_eq!(finished[4].1, vec![8; 100]);
        // Neighbours, one of them a longer id with `t` as its prefix, stay.
        assert_eq!(
            raw_records(&backend, Space::Events.name(), "t-other").len(),
            2
        );
        assert_eq!(raw_records(&backend, Space::Events.name(), "u").len(), 2);
        assert_eq!(raw_records(&backend, FINISHED_EVENTS, "u"), []);
        // Reads see one space.
        let all: Vec<_> = backend
            .scan(Space::Events, Range::default())
            .map(|item| item.expect("a read").0)
            .collect();
        assert_eq!(all.len(), 5 + 2 + 2);
        assert!(
            all.windows(2).all(|w| w[0] < w[1]),
            "in key order, each once"
        );
        let reversed = backend
            .scan(
                Space::Events,
                Range::prefix(&crate::keys::task_prefix("t")).reversed(),
            )
            .map(|item| crate::keys::position_in("t", &item.expect("a read").0).expect("a key"))
            .collect::<Vec<_>>();
        assert_eq!(reversed, [4, 3, 2, 1, 0]);
        assert_eq!(
            backend
                .get(Space::Events, &crate::keys::event_key("t", 1))
                .expect("a read"),
            Some(vec![7; 200])
        );
        // Recovery's cursor sees the streams without a terminal record alone.
        let mut live = backend.live_records_cursor().expect("kept apart");
        live.seek(&[]);
        let mut tasks = Vec::new();
        while let Some(key) = live.key() {
            tasks.push(
                crate::keys::parse_event_key(key)
                    .expect("a key")
                    .0
                    .to_owned(),
            );
            live.next();
        }
        tasks.dedup();
        assert_eq!(tasks, ["t-other", "u"]);
        // Flushed, the moved records' single deletions met their puts: no tombstone is left.
        backend.flush().expect("a flush");
        let events = backend.cf(Space::Events).expect("events");
        let deletions = backend
            .db
            .property_int_value_cf(events, "rocksdb.num-deletes-active-mem-table")
            .expect("a property");
        assert_eq!(deletions, Some(0));
        assert_eq!(
            backend
                .table_property(Space::Events, "# deletions")
                .expect("a property"),
            Some(0),
            "the flush dropped each single deletion with its put"
        );
        assert_eq!(
            backend
                .table_property(Space::Events, "# entries")
                .expect("a property"),
            Some(4),
            "t-other's and u's records alone"
        );
    }

    /// A bulk move (the writer's moves that waited) reads the streams with one cursor and
    /// moves each whole, in any order, past a stream moved before and beside a neighbour
    /// whose id has a moved one's as its prefix.
    #[test]
    fn a_bulk_move_moves_each_stream_whole() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let backend = RocksBackend::open(dir.path(), OpenMode::Primary).expect("open");
        let tasks: Vec<String> = (0..12).map(|i| format!("s{i:02}")).collect();
        for task in &tasks {
            put_records(&backend, task, 0, 3);
        }
        put_records(&backend, "s03-x", 0, 2);
        let retire = |task: &str, stored: u64| BatchOp::Retire {
            task: task.to_owned(),
            stored,
            apart: true,
        };
        // One moved before, by key (a batch of one move).
        backend
            .write(vec![retire("s05", 3)], Durability::Buffered)
            .expect("a move");
        // The rest in one batch, one of them out of key order, one more than once.
        let mut ops: Vec<BatchOp> = vec![retire("s11", 3)];
        ops.extend(tasks.iter().map(|task| retire(task, 3)));
        ops.push(retire("s00", 3));
        assert!(ops.len() > BULK_MOVE_STREAMS);
        backend
            .write(ops, Durability::Buffered)
            .expect("the bulk move");
        for task in &tasks {
            assert_eq!(
                raw_records(&backend, Space::Events.name(), task),
                [],
                "{task}"
            );
            let moved = raw_records(&backend, FINISHED_EVENTS, task);
            assert_eq!(
                moved.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
                [0, 1, 2],
                "{task}"
            );
            assert!(moved.iter().all(|(_, value)| *value == vec![7; 200]));
        }
        assert_eq!(
            raw_records(&backend, Space::Events.name(), "s03-x").len(),
            2
        );
        assert_eq!(raw_records(&backend, FINISHED_EVENTS, "s03-x"), []);
        let all = backend.scan(Space::Events, Range::default()).count();
        assert_eq!(all, 12 * 3 + 2, "each record read once");
    }

    /// Kept apart, a clean close merges the live records' level-0 files into one run, left
    /// uncompressed; without streams kept apart it leaves them to RocksDB.
    #[test]
    fn a_clean_close_merges_the_live_records_kept_apart() {
        for apart in [true, false] {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let backend = RocksBackend::open_tuned(
                dir.path(),
                OpenMode::Primary,
                Tuning {
                    live_apart: apart,
                    ..Tuning::default()
                },
            )
            .expect("open");
            for (task, finished) in [("a", "b"), ("c", "d")] {
                put_records(&backend, task, 0, 50);
                put_records(&backend, finished, 0, 50);
                let retire = BatchOp::Retire {
                    task: finished.to_owned(),
                    stored: 50,
                    apart,
                };
                backend
                    .write(vec![retire], Durability::Buffered)
                    .expect("a retirement");
                backend.flush().expect("a flush");
            }
            assert_eq!(backend.level0_files(Space::Events).expect("files"), 2);
            assert!(backend
                .settle(std::time::Duration::from_secs(10))
                .expect("settled"));
            let level0 = backend.level0_files(Space::Events).expect("files");
            assert_eq!(level0, if apart { 0 } else { 2 }, "apart: {apart}");
            if apart {
                assert_eq!(
                    backend
                        .table_property(Space::Events, "# entries")
                        .expect("a property"),
                    Some(100),
                    "a's and c's records, the moved ones dropped with their deletions"
                );
            }
            let all = backend.scan(Space::Events, Range::default()).count();
            assert_eq!(all, 200);
        }
    }

    /// A writer's open asks the file system whether it takes direct I/O, leaves no probe
    /// file behind, and has its flushes and compactions use it only when asked and allowed;
    /// table files written and compacted either way read back whole after a reopen.
    #[test]
    fn table_files_use_direct_io_only_when_asked_and_the_file_system_allows_it() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let allowed = direct_io_allowed(dir.path());
        assert!(!dir.path().join(DIRECT_IO_PROBE).exists());
        // The file systems a journal usually lives on all take direct I/O: a probe that
        // never says yes would pass the rest of this test.
        let file_system = rustix::fs::statfs(dir.path()).expect("statfs").f_type;
        if cfg!(target_os = "linux") && [0xEF53, 0x5846_5342, 0x9123_683E].contains(&file_system) {
            assert!(allowed, "ext4, XFS and Btrfs take direct I/O");
        }
        for asked in [true, false] {
            let path = dir.path().join(format!("asked-{asked}"));
            {
                let tuning = Tuning {
                    direct_table_io: asked,
                    ..Tuning::default()
                };
                let backend =
                    RocksBackend::open_tuned(&path, OpenMode::Primary, tuning).expect("open");
                assert!(!path.join(DIRECT_IO_PROBE).exists(), "the probe is removed");
                let stats = backend.storage_stats().expect("stats").expect("reported");
                assert_eq!(stats.direct_table_io, asked && allowed, "asked: {asked}");
                backend.start_compactions().expect("compactions on");
                for round in 0..5 {
                    put_records(&backend, &format!("t{round}"), 0, 300);
                    backend.flush().expect("a flush");
                }
                let events = backend.cf(Space::Events).expect("events");
                backend
                    .db
                    .compact_range_cf(events, None::<&[u8]>, None::<&[u8]>);
                assert_eq!(backend.level0_files(Space::Events).expect("files"), 0);
                let stats = backend.storage_stats().expect("stats").expect("reported");
                assert_eq!(stats.background_errors, 0);
            }
            let reader = RocksBackend::open(&path, OpenMode::ReadOnly).expect("read-only");
            assert!(
                !reader
                    .storage_stats()
                    .expect("stats")
                    .expect("reported")
                    .direct_table_io
            );
            let records: Vec<_> = reader
                .scan(Space::Events, Range::default())
                .collect::<Result<_>>()
                .expect("every record read");
            assert_eq!(records.len(), 5 * 300);
            assert!(records
                .iter()
                .all(|(_, value)| value.as_ref() == [7; 200].as_slice()));
        }
    }

    /// The probe answers `false` where it cannot write its block — here, a directory that
    /// cannot be made because a file stands in its way.
    #[test]
    fn the_direct_io_probe_answers_no_when_it_cannot_write() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"not a directory").expect("a file");
        assert!(!direct_io_allowed(&file.join("journal")));
        assert!(!file.join("journal").exists());
    }

    /// A follower opened after its writer has flushed twice (a writer that reused flushed
    /// log files would now write into the first log's file, whose tail holds the first log's
    /// records) opens and sees every record. With log files reused, RocksDB's follower read
    /// up to the writer's end, met an earlier record starting right there, read it again and
    /// again and never returned.
    #[test]
    fn a_follower_opens_while_its_writer_has_flushed_twice() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let scratch = tempfile::tempdir().expect("a temporary directory");
        let backend = RocksBackend::open(dir.path(), OpenMode::Primary).expect("open");
        // The first log's file is reused for the third log, which holds fewer records: the
        // rest of the file is the first log's.
        put_records(&backend, "a", 0, 100);
        backend.flush().expect("flush");
        put_records(&backend, "a", 100, 100);
        backend.flush().expect("flush");
        put_records(&backend, "a", 200, 10);
        let (done, opened) = std::sync::mpsc::channel();
        let path = dir.path().to_path_buf();
        std::thread::spawn(move || {
            let follower = RocksBackend::open(&path, OpenMode::Secondary(scratch.path()))
                .map(|follower| records_in(&follower, Space::Events));
            let _ = done.send(follower.map_err(|e| e.to_string()));
        });
        // Not a measure of speed: a generous bound on an open that took milliseconds, so that
        // the old endless loop fails this test instead of hanging the suite.
        let records = opened
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the follower's open returned")
            .expect("the follower opened");
        assert_eq!(records, 210);
        drop(backend);
    }

    /// A follower's catch-up makes a stream's move visible at once: a read right after it —
    /// before anything else the follower does — finds the stream in its new place. (The
    /// follower once looked in the `finished` column family only after a catch-up had found
    /// records there, so a read between RocksDB's catch-up and that look found nothing.)
    #[test]
    fn a_follower_finds_a_stream_moved_since_its_open_right_after_the_catch_up() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let scratch = tempfile::tempdir().expect("a temporary directory");
        let writer = RocksBackend::open(dir.path(), OpenMode::Primary).expect("open");
        put_records(&writer, "a", 0, 3);
        writer.sync().expect("a sync");
        let follower =
            RocksBackend::open(dir.path(), OpenMode::Secondary(scratch.path())).expect("open");
        let key = crate::keys::event_key("a", 1);
        assert!(follower.get(Space::Events, &key).expect("a read").is_some());
        let retire = BatchOp::Retire {
            task: "a".to_owned(),
            stored: 3,
            apart: true,
        };
        writer
            .write(vec![retire], Durability::Sync)
            .expect("the move");
        assert_eq!(raw_records(&writer, Space::Events.name(), "a"), []);
        // RocksDB's catch-up alone, as a reader on another thread may see it.
        follower
            .db
            .try_catch_up_with_primary()
            .expect("the catch-up");
        let found = follower.get(Space::Events, &key).expect("a read");
        assert_eq!(found.as_deref(), Some(&[7u8; 200][..]));
        assert_eq!(records_in(&follower, Space::Events), 3);
    }

    #[test]
    fn a_write_batch_is_sized_for_all_its_ops_at_once() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let backend = RocksBackend::open(dir.path(), OpenMode::Primary).expect("open");
        let ops: Vec<BatchOp> = (0..300u64)
            .flat_map(|i| {
                [
                    BatchOp::Put {
                        space: Space::Events,
                        key: crate::keys::event_key("a-task", i).into(),
                        // Lengths on both sides of a varint's one-byte limit.
                        value: vec![1; usize::try_from(i).unwrap_or(0) * 3].into(),
                    },
                    BatchOp::Delete {
                        space: Space::Outbox,
                        key: crate::keys::seq_key(i + 1).to_vec().into(),
                    },
                ]
            })
            .collect();
        let mut batch = rocksdb::WriteBatch::default();
        for op in &ops {
            match op {
                BatchOp::Put { space, key, value } => {
                    batch.put_cf(backend.cf(*space).expect("space"), key, value);
                }
                BatchOp::Delete { space, key } => {
                    batch.delete_cf(backend.cf(*space).expect("space"), key);
                }
                BatchOp::Retire { .. } | BatchOp::Purge { .. } | BatchOp::Replace { .. } => {
                    unreachable!("the test's batch retires, purges and replaces nothing")
                }
            }
        }
        let estimate = write_batch_bytes(&ops);
        assert!(
            estimate >= batch.size_in_bytes(),
            "{estimate} < {}",
            batch.size_in_bytes()
        );
        // A bound, not a guess: at most the varints' unused bytes over (four a varint).
        assert!(estimate <= batch.size_in_bytes() + ops.len() * 12);
    }

    #[test]
    fn the_records_are_stored_in_large_blocks_and_the_indexes_in_small_ones() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let backend = RocksBackend::open(dir.path(), OpenMode::Primary).expect("open");
        // 4 MiB of 200-byte values under ascending keys, with an index entry for each.
        let ops = (0..20_000u64)
            .flat_map(|i| {
                [
                    BatchOp::Put {
                        space: Space::Events,
                        key: crate::keys::event_key(&format!("task-{:05}", i / 10), i % 10).into(),
                        value: vec![u8::try_from(i % 251).unwrap_or(0); 200].into(),
                    },
                    BatchOp::Put {
                        space: Space::Commits,
                        key: crate::keys::seq_key(i + 1).to_vec().into(),
                        value: vec![7; 20].into(),
                    },
                ]
            })
            .collect();
        backend.write(ops, Durability::Buffered).expect("write");
        backend.flush().expect("flush");
        let events = backend
            .mean_data_block_bytes(Space::Events)
            .expect("properties")
            .expect("a table file of records");
        let commits = backend
            .mean_data_block_bytes(Space::Commits)
            .expect("properties")
            .expect("a table file of the commit index");
        // A block closes near its size (RocksDB closes it early when the next entry would
        // take it more than a tenth past it), so the mean lies within a tenth of it.
        let size = EVENTS_BLOCK_BYTES as u64;
        assert!(
            (size - size / 10..=size + size / 10).contains(&events),
            "records: {events} bytes a block"
        );
        assert!(commits < 8 << 10, "commit index: {commits} bytes a block");
    }

    /// The `events` space's table files carry a Bloom filter over every key, cut in
    /// partitions with the index, and a lookup through them finds every record there is
    /// and none that is not — a filter that let a record it holds go unseen would let a
    /// task be created twice.
    #[test]
    fn the_records_tables_carry_a_partitioned_filter_that_misses_no_record() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let backend = RocksBackend::open(dir.path(), OpenMode::Primary).expect("open");
        // Tasks with even numbers, ten records each (2 MiB).
        let key =
            |task: u64, position: u64| crate::keys::event_key(&format!("task-{task:05}"), position);
        let ops = (0..1_000u64)
            .flat_map(|task| (0..10).map(move |position| (2 * task, position)))
            .map(|(task, position)| BatchOp::Put {
                space: Space::Events,
                key: key(task, position).into(),
                value: vec![7; 200].into(),
            })
            .chain((1..=100).map(|seq| BatchOp::Put {
                space: Space::Commits,
                key: crate::keys::seq_key(seq).to_vec().into(),
                value: vec![7; 20].into(),
            }))
            .collect();
        backend.write(ops, Durability::Buffered).expect("write");
        backend.flush().expect("flush");
        let property = |space, name| backend.table_property(space, name).expect("properties");
        assert!(property(Space::Events, "filter block size").is_some_and(|bytes| bytes > 0));
        assert_eq!(
            property(Space::Events, "# entries for filter"),
            Some(10_000)
        );
        // A two-level index (RocksDB names its partitions only then).
        assert!(property(Space::Events, "# index partitions").is_some_and(|n| n >= 1));
        assert!(property(Space::Events, "top-level index size").is_some_and(|n| n > 0));
        // The other spaces are only ever iterated, or looked up for keys they hold.
        assert_eq!(property(Space::Commits, "# entries"), Some(100));
        assert_eq!(property(Space::Commits, "filter block size"), Some(0));
        // Reopened, so that every lookup goes to the table file, not the memtable.
        drop(backend);
        let backend = RocksBackend::open(dir.path(), OpenMode::Primary).expect("reopen");
        for task in 0..2_000u64 {
            for position in [0, 9] {
                let found = backend
                    .get(Space::Events, &key(task, position))
                    .expect("a lookup");
                assert_eq!(found.is_some(), task % 2 == 0, "task {task} at {position}");
            }
        }
    }

    /// What a writer's open sets is what RocksDB records in the options file it writes at
    /// every open.
    #[test]
    fn a_writer_keeps_the_replayed_log_in_the_memtables() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        drop(RocksBackend::open(dir.path(), OpenMode::Primary).expect("open"));
        let text = newest_options(dir.path());
        assert!(
            text.lines()
                .any(|line| line.trim() == "avoid_flush_during_recovery=true"),
            "{text}"
        );
        // The rest of the set-up is kept: log files are not reused.
        assert!(
            text.lines()
                .any(|line| line.trim() == "recycle_log_file_num=0"),
            "{text}"
        );
    }

    /// How many times RocksDB changed column families' options since the journal's last
    /// open (its info log, begun anew at each open, records each change).
    fn options_changes(dir: &Path) -> usize {
        std::fs::read_to_string(dir.join("LOG"))
            .expect("RocksDB's info log")
            .lines()
            .filter(|line| line.contains("SetOptions() on"))
            .count()
    }

    /// How many column families the newest options file has with automatic compactions off.
    fn compactions_off(dir: &Path) -> usize {
        newest_options(dir)
            .lines()
            .filter(|line| line.trim() == "disable_auto_compactions=true")
            .count()
    }

    #[test]
    fn compactions_are_turned_on_beside_the_first_write_and_once() {
        use crate::{Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp};
        let dir = tempfile::tempdir().expect("a temporary directory");
        let created = Event::Created {
            spec: TaskSpec {
                id: "t".into(),
                executor_key: "shell".into(),
                ..TaskSpec::default()
            }
            .into(),
            policy: LeasePolicy::Retry,
            checkpoint: vec![],
            context_snapshot: vec![],
            at: Timestamp(1),
        };
        // A new journal opens with its compactions on: nothing to turn on, then or later.
        {
            let journal = Journal::open(dir.path(), JournalOptions::default()).expect("open");
            assert_eq!(compactions_off(dir.path()), 0);
            journal.append("t", 0, &[created]).expect("append");
        }
        assert_eq!(
            options_changes(dir.path()),
            0,
            "a new journal changes no options"
        );
        assert_eq!(compactions_off(dir.path()), 0);

        // An existing one opens with them off in every space a writer writes ...
        let backend = RocksBackend::open(dir.path(), OpenMode::Primary).expect("reopen");
        let spaces = backend.space_names().len();
        assert_eq!(compactions_off(dir.path()), spaces);
        let (release, gate) = std::sync::mpsc::channel();
        *backend.compactions_gate.lock().expect("the gate") = Some(gate);
        let backend = Arc::new(backend);
        let journal = Journal::with_backend(
            Arc::clone(&backend) as Arc<dyn Backend>,
            JournalOptions::default(),
        )
        .expect("a journal over it");
        // ... and its first write does not wait for them to be turned on: the thread that
        // turns them on is held at its gate while the append is made durable.
        let heartbeat = Event::Heartbeat {
            lease_deadline: Timestamp(3),
            at: Timestamp(2),
        };
        let appended = journal.append("t", 1, &[heartbeat]).expect("append");
        assert_eq!(appended.next_position, 2);
        assert_eq!(options_changes(dir.path()), 0, "not turned on yet");
        release.send(()).expect("the thread waits at its gate");
        // The close waits for them, and turns nothing on a second time.
        drop(journal);
        assert_eq!(options_changes(dir.path()), spaces, "once per space");
        assert_eq!(compactions_off(dir.path()), 0);
        drop(backend);
    }

    #[test]
    fn a_held_journal_is_in_use_for_writers_and_open_for_readers() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let _writer = RocksBackend::open(dir.path(), OpenMode::Primary).expect("the first open");
        match RocksBackend::open(dir.path(), OpenMode::Primary) {
            Err(Error::InUse { path }) => assert_eq!(path, dir.path()),
            other => panic!("expected InUse, got {other:?}"),
        }
        let message = Error::InUse {
            path: dir.path().to_path_buf(),
        }
        .to_string();
        assert!(
            message.contains(&dir.path().display().to_string()),
            "{message}"
        );
        assert!(message.contains("read-only"), "{message}");
        RocksBackend::open(dir.path(), OpenMode::ReadOnly).expect("a reader takes no lock");
    }
}

//! Journal configuration.

use crate::record::RecordFormat;
use std::time::Duration;

/// When an append is acknowledged relative to stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Durability {
    /// The write-ahead log is fsynced before any caller of the batch is acknowledged, so an
    /// acknowledged append survives a crash of the machine. The default.
    #[default]
    Sync,
    /// Acknowledged once the batch is in the write-ahead log's OS buffers: survives a crash of
    /// the process but not of the machine. For tests and benches.
    Buffered,
}

/// Options of [`crate::Journal::open`]. Build with [`JournalOptions::default`] and the
/// `with_*` methods.
///
/// ```
/// use dtask_journal::{Durability, JournalOptions};
/// let opts = JournalOptions::default()
///     .with_durability(Durability::Buffered)
///     .with_max_value_bytes(64 * 1024);
/// assert_eq!(opts.max_value_bytes, 64 * 1024);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[allow(
    clippy::struct_excessive_bools,
    reason = "independent switches, each set by its own builder method"
)]
pub struct JournalOptions {
    /// When appends are acknowledged. Default: [`Durability::Sync`].
    pub durability: Durability,
    /// The largest opaque value (payload, checkpoint, data, snapshot) of one event.
    /// Default: 1 MiB.
    pub max_value_bytes: usize,
    /// The largest encoded record. Default: 4 MiB (a record may hold several values); at most
    /// [`crate::record::MAX_PAYLOAD_BYTES`].
    pub max_record_bytes: usize,
    /// The longest task id. Default: 1024 bytes.
    pub max_task_id_bytes: usize,
    /// The most events in one append. Default: 1024.
    pub max_events_per_append: usize,
    /// The most appends the group-commit writer puts in one batch. Default: 4096 (in effect,
    /// every append queued).
    ///
    /// With [`Durability::Sync`], a small cap (around 8) lets a sync that ends while the
    /// writer is busy take more of the queued appends, already written in several small
    /// batches rather than inside one large batch still being written. Measured with 64
    /// concurrent writers it was faster in most short rounds (by up to a quarter) but not
    /// beyond the noise in whole bench runs, and with 256 it was slower: there the writer's
    /// CPU is the bound and each batch costs a write of its own (the measurements are in
    /// `docs/performance-history.md`).
    pub max_batch_appends: usize,
    /// Read the journal's table files through memory maps instead of copying each block
    /// read into a buffer of its own. Default: off.
    ///
    /// Recovery folds faster with it (~10–15 % on the bench's 1M-event journal), but the
    /// mapped pages of the files it reads count as the process's resident memory: ~3.5 KB
    /// per live task there, against ~1.45 KB without. They are clean page cache that the
    /// kernel can drop at any time, but a resident set that grows with the journal read
    /// surprises operators and memory limits that count it, hence off by default. For
    /// services that recover large journals and measure memory by the page cache anyway.
    pub mmap_reads: bool,
    /// How long a clean close (dropping the last handle of a writable journal) waits for
    /// the compactions the store has due, after flushing its in-memory tables. Default: 10 s;
    /// [`Duration::ZERO`] closes without waiting.
    ///
    /// The flush at close leaves a new table file per space, and a journal that has run a
    /// while often closes with a compaction due or under way (RocksDB merges level-0 files
    /// once there are four; it abandons a compaction under way when the database closes).
    /// Closing without waiting hands that compaction to the next run, which starts it at its
    /// first append: in the first seconds after the restart, beside the workers resuming
    /// every task, whose appends then run markedly slower (docs/performance-history.md has
    /// the figures). Waiting makes a planned restart (a
    /// deploy, an upgrade) start from a settled journal; a crash, which has no clean close,
    /// recovers as before. The wait is bounded: what is not done by then stays due.
    pub settle_on_close: Duration,
    /// Let a lone append be written and synced on its caller's thread. Default: on.
    ///
    /// When the journal is idle — the last batch was one append synced alone, nothing is
    /// queued and nothing is being synced — an append is written and synced by the thread
    /// that asked for it instead of being handed to the writer thread and back: two thread
    /// wake-ups fewer, ~30–40 µs of a ~0.25 ms append on the benches' machine (a single agent
    /// waiting on its tool's steps is this case). The caller's thread is blocked for one sync;
    /// an asynchronous caller does so only on a multi-threaded tokio runtime (whose other
    /// workers take over its tasks meanwhile), never on a current-thread one, and never on a
    /// store shared with other processes (whose writes are network round trips). Turn it off
    /// where no runtime worker may block for a sync; the writer thread then makes every
    /// write, as it does for every append that finds the journal busy.
    pub inline_lone_appends: bool,
    /// Keep finished streams apart from the live ones (RocksDB; format 4). Default: on.
    ///
    /// With it on, finished streams are moved to a column family of their own
    /// ([`crate::keys::FINISHED_EVENTS`]), so that recovery, which reads the live streams,
    /// no longer steps over finished ones lying between them: on the bench's 1M-event
    /// journal (half the tasks finished, every other one) the fold took 0.78–0.87× the
    /// time after a clean close. A stream written whole in one batch goes there as it is
    /// written. A stream finished by a later append is moved later, off the busy path: once
    /// the journal has had no append for 20 ms, at a clean close (for at most
    /// [`JournalOptions::settle_on_close`]; about 20 µs a stream of ten records) or when
    /// asked ([`crate::Journal::move_finished_now`]); its records are read back and written
    /// a second time then. Appends run as fast as without the option (the lifecycle and
    /// peers' workload benches, docs/performance.md). A stream whose move was still waiting
    /// at a crash, or finished while 131,072 waited, stays with the live ones until the next
    /// open's writer sweeps the records not moved, in its first idle moments after the open's
    /// first write (not beside the recovery's fold, which it would slow). With it on,
    /// the live records are also stored uncompressed, and a clean close merges them into
    /// one run (up to 256 MiB), which recovery reads fastest. Reads see the journal alike
    /// either way, and it can be turned on or off between runs: a stream stays where it was
    /// put until a record is next written to it. Off for a service that wants its close
    /// short and its disk written once per record.
    pub keep_finished_apart: bool,
    /// Write and read table files — the memtables' flushes, the compactions — with direct
    /// I/O, past the operating system's page cache, where the journal's file system allows
    /// it. Default: on.
    ///
    /// A writer's open first writes one block with direct I/O to a probe file in the
    /// journal's directory (removed at once); where the file system refuses (tmpfs before
    /// Linux 6.6, some FUSE and network file systems) or on systems other than Linux, table
    /// files go through the page cache as with the option off.
    /// [`crate::StorageStats::direct_table_io`] says which the open chose. Only RocksDB's
    /// background work changes: the write-ahead log, which every append waits for, is
    /// written and synced as before, and reads of the journal (recovery, lookups) still go
    /// through the page cache.
    ///
    /// Through the page cache, every byte a flush or a compaction writes is first copied
    /// into newly allocated page-cache pages, on the same two cores as the appends; under a
    /// sustained heavy load that copy was the largest part of the compactions' time, and
    /// they fell behind (the level-0 files and the compaction bytes owed grew, and RocksDB
    /// would have slowed the appends down). With direct I/O, 256 concurrent writers made
    /// 1.06–1.38× the appends over 20 s for 0.55–0.67× the CPU time an append, and the
    /// background work kept up (docs/tuning.md has the measurements). The price: a
    /// table file just written is not in the page cache, so its first reads go to the disk
    /// (recovery's fold right after a clean close measured ~0.83× as fast). Off for a
    /// journal whose reads must find recent table files in memory, or to compare.
    pub direct_table_io: bool,
    /// The record framing of a journal this open creates: which hash makes its records'
    /// chain digests (see [`RecordFormat`]). Default: [`RecordFormat::NEWEST`] (SHA-256).
    ///
    /// Only a new journal takes it: an existing one keeps the framing it was created with
    /// (a journal of an older build, BLAKE3), since every record's digest chains on the one
    /// before. `dtask import` sets it to the export's, so that the import is bit-exact. A
    /// journal on a CPU without SHA extensions may choose [`RecordFormat::BLAKE3`], faster
    /// there.
    pub record_format: RecordFormat,
}

impl Default for JournalOptions {
    fn default() -> Self {
        Self {
            durability: Durability::Sync,
            max_value_bytes: 1 << 20,
            max_record_bytes: 4 << 20,
            max_task_id_bytes: 1024,
            max_events_per_append: 1024,
            max_batch_appends: 4096,
            mmap_reads: false,
            settle_on_close: Duration::from_secs(10),
            inline_lone_appends: true,
            keep_finished_apart: true,
            direct_table_io: true,
            record_format: RecordFormat::NEWEST,
        }
    }
}

impl JournalOptions {
    /// Sets [`JournalOptions::durability`].
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets [`JournalOptions::max_value_bytes`].
    #[must_use]
    pub fn with_max_value_bytes(mut self, bytes: usize) -> Self {
        self.max_value_bytes = bytes;
        self
    }

    /// Sets [`JournalOptions::max_record_bytes`].
    #[must_use]
    pub fn with_max_record_bytes(mut self, bytes: usize) -> Self {
        self.max_record_bytes = bytes.min(crate::record::MAX_PAYLOAD_BYTES);
        self
    }

    /// Sets [`JournalOptions::mmap_reads`].
    #[must_use]
    pub fn with_mmap_reads(mut self, on: bool) -> Self {
        self.mmap_reads = on;
        self
    }

    /// Sets [`JournalOptions::settle_on_close`] ([`Duration::ZERO`]: close without waiting).
    #[must_use]
    pub fn with_settle_on_close(mut self, timeout: Duration) -> Self {
        self.settle_on_close = timeout;
        self
    }

    /// Sets [`JournalOptions::inline_lone_appends`].
    #[must_use]
    pub fn with_inline_lone_appends(mut self, on: bool) -> Self {
        self.inline_lone_appends = on;
        self
    }

    /// Sets [`JournalOptions::keep_finished_apart`].
    #[must_use]
    pub fn with_keep_finished_apart(mut self, on: bool) -> Self {
        self.keep_finished_apart = on;
        self
    }

    /// Sets [`JournalOptions::direct_table_io`].
    #[must_use]
    pub fn with_direct_table_io(mut self, on: bool) -> Self {
        self.direct_table_io = on;
        self
    }

    /// Sets [`JournalOptions::record_format`].
    #[must_use]
    pub fn with_record_format(mut self, format: RecordFormat) -> Self {
        self.record_format = format;
        self
    }

    /// Sets [`JournalOptions::max_batch_appends`] (at least 1).
    #[must_use]
    pub fn with_max_batch_appends(mut self, appends: usize) -> Self {
        self.max_batch_appends = appends.max(1);
        self
    }
}

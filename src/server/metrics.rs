//! Metrics in the Prometheus text format (`OpenMetrics`), from a registry owned by the server:
//! HTTP requests by route, method and status (and their durations), tasks by status and
//! executor, records by type, attempts started, recovered and expired, the journal's last
//! sequence, the SSE streams — and, when the server owns the journal, its write path (appends,
//! records and bytes written, batch sizes, write, sync and append latencies, the writer's queue)
//! through a [`WriteObserver`], and the store's deduplications and the outbox's backlog — and
//! the storage engine's own state (memtables, table files, compaction work owed, write stalls:
//! [`StorageStats`]), read at each scrape.
//!
//! The registry is the server's own (`prometheus-client`), not a process-global recorder, so
//! two servers in one process (tests, or a service that embeds one) never mix their counts.

use super::projection::Snapshot;
use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use dtask_engine::StoreCounts;
use dtask_journal::observe::{BatchFailed, BatchWritten, Synced, WriteObserver};
use dtask_journal::{EventType, StorageStats};
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The labels of an HTTP request.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The route's pattern (`/api/tasks/{id}`), or `unmatched`.
    pub route: String,
    /// The method.
    pub method: String,
    /// The status code.
    pub status: u16,
}

/// The labels of a duration.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The route's pattern.
    pub route: String,
}

/// A label with one value.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PromiseLabel {
    /// What a synced append promises (`dtask_journal::probe::SyncPromise`).
    pub promise: String,
}

/// A label with one value.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    /// The task status.
    pub status: String,
}

/// A label with one value.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExecutorLabel {
    /// The executor key.
    pub executor: String,
}

/// The label of a record count.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeValue {
    /// The event type.
    pub event_type: String,
}

/// The label of a storage figure.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SpaceLabel {
    /// The column family (`events`, `finished`, `commits`, `live`, `outbox`, `meta`).
    pub space: String,
}

/// A label with one value.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `clean` or `problems`.
    pub result: String,
}

/// The journal's write path as Prometheus metrics: appends, conflicts, records and bytes
/// written, batches and their sizes, the writer's queue, write, sync and append latencies.
/// The server registers one in its registry and installs it on the journal it owns; a service
/// with an HTTP stack of its own can do the same with its registry:
///
/// ```
/// use prometheus_client::registry::Registry;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let journal = dtask::journal::Journal::open(dir.path(), Default::default())?;
/// let mut registry = Registry::with_prefix("dtask");
/// let metrics = dtask::server::WriteMetrics::register(&mut registry);
/// journal.observe(metrics.observer());
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, &registry)?;
/// assert!(text.contains("dtask_journal_append_seconds"));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct WriteMetrics {
    appends: Counter,
    conflicts: Counter,
    records: Counter,
    bytes: Counter,
    batches: Counter,
    batch_appends: Histogram,
    queued: Gauge,
    write: Histogram,
    sync: Histogram,
    sync_failures: Counter,
    batch_failures: Counter,
    disk_full: Gauge,
    append: Histogram,
}

/// Latency buckets from 25 µs to ~0.4 s.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.000_025, 2.0, 15))
}

impl WriteMetrics {
    /// Registers the write path's metrics in `registry` (names `journal_…`, under the
    /// registry's prefix).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            appends: Counter::default(),
            conflicts: Counter::default(),
            records: Counter::default(),
            bytes: Counter::default(),
            batches: Counter::default(),
            batch_appends: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            queued: Gauge::default(),
            write: latency(),
            sync: latency(),
            sync_failures: Counter::default(),
            batch_failures: Counter::default(),
            disk_full: Gauge::default(),
            append: latency(),
        };
        let r = registry;
        r.register(
            "journal_appends",
            "Appends written by this process (each one stream's records, or a linked set)",
            metrics.appends.clone(),
        );
        r.register(
            "journal_append_conflicts",
            "Appends refused because their stream had moved past the expected position",
            metrics.conflicts.clone(),
        );
        r.register(
            "journal_records_written",
            "Records written by this process",
            metrics.records.clone(),
        );
        r.register(
            "journal_bytes_written",
            "Bytes of the records written by this process",
            metrics.bytes.clone(),
        );
        r.register(
            "journal_batches",
            "Group-commit batches written",
            metrics.batches.clone(),
        );
        r.register(
            "journal_batch_appends",
            "Appends per group-commit batch",
            metrics.batch_appends.clone(),
        );
        r.register(
            "journal_writer_queue",
            "Appends queued behind the last batch the writer formed",
            metrics.queued.clone(),
        );
        r.register(
            "journal_write_seconds",
            "Time to write a batch (to the OS's buffers, before its sync)",
            metrics.write.clone(),
        );
        r.register(
            "journal_sync_seconds",
            "Time of one sync of the write-ahead log (fdatasync; it may cover several batches)",
            metrics.sync.clone(),
        );
        r.register(
            "journal_sync_failures",
            "Syncs that failed (each stops the journal)",
            metrics.sync_failures.clone(),
        );
        r.register(
            "journal_batch_failures",
            "Batches whose write failed (each of their appends failed)",
            metrics.batch_failures.clone(),
        );
        r.register(
            "journal_disk_full",
            "1 while the journal's writes fail for a full disk; 0 once a batch is written",
            metrics.disk_full.clone(),
        );
        r.register(
            "journal_append_seconds",
            "Time from an append's submission to its acknowledgement as durable",
            metrics.append.clone(),
        );
        metrics
    }
}

impl WriteMetrics {
    /// These metrics as the observer to install ([`dtask_journal::Journal::observe`]).
    pub fn observer(&self) -> Arc<dyn WriteObserver> {
        Arc::new(self.clone())
    }
}

/// A count as a gauge's value.
fn int(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Registers `metric` under `name` and returns it (metrics are handles: the registry keeps a
/// clone).
fn register<M>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M
where
    M: prometheus_client::registry::Metric + Clone,
{
    registry.register(name, help, metric.clone());
    metric
}

/// Registers a gauge under `name` and returns it.
fn gauge(registry: &mut Registry, name: &str, help: &str) -> Gauge {
    register(registry, name, help, Gauge::default())
}

/// Registers a counter under `name` and returns it.
/// The pump's counters: its failed reads, and the damaged records it passed over.
fn pump_counters(registry: &mut Registry) -> (Counter, Counter) {
    let errors = counter(
        registry,
        "pump_errors",
        "Failed reads of the journal's commits by the server",
    );
    let damaged = counter(
        registry,
        "pump_damaged_records",
        "Damaged records of the journal's commit order the server passed over (run a verify)",
    );
    (errors, damaged)
}

fn counter(registry: &mut Registry, name: &str, help: &str) -> Counter {
    register(registry, name, help, Counter::default())
}

impl WriteObserver for WriteMetrics {
    fn batch_written(&self, batch: &BatchWritten) {
        self.batches.inc();
        self.appends.inc_by(batch.appends as u64);
        self.conflicts.inc_by(batch.conflicts as u64);
        self.records.inc_by(batch.records as u64);
        self.bytes.inc_by(batch.bytes as u64);
        self.batch_appends
            .observe(f64::from(u32::try_from(batch.appends).unwrap_or(u32::MAX)));
        self.queued.set(int(batch.queued));
        self.write.observe(batch.write.as_secs_f64());
        if batch.appends > 0 {
            self.disk_full.set(0);
        }
    }

    fn batch_failed(&self, failed: &BatchFailed) {
        self.batch_failures.inc();
        if failed.no_space {
            self.disk_full.set(1);
        }
    }

    fn synced(&self, sync: &Synced) {
        if sync.ok {
            if sync.sync > Duration::ZERO {
                self.sync.observe(sync.sync.as_secs_f64());
            }
        } else {
            self.sync_failures.inc();
        }
    }

    fn acknowledged(&self, latency: Duration) {
        self.append.observe(latency.as_secs_f64());
    }
}

/// What a scrape reads besides the projection's counts.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// Open SSE streams.
    pub subscribers: u64,
    /// The store's counts, in owner mode.
    pub store: Option<StoreCounts>,
    /// The outbox's backlog, from the counts (`None` until the first count is done).
    pub outbox: Option<u64>,
    /// The storage engine's state, when it reports one (RocksDB) and could be read.
    pub storage: Option<StorageStats>,
    /// Whether `/readyz` would answer 200.
    pub ready: bool,
    /// Whether the journal this server writes stopped after a failed sync.
    pub journal_stopped: bool,
}

/// The storage engine's state ([`StorageStats`]), set at each scrape.
#[derive(Debug)]
struct StorageGauges {
    memtable_bytes: Family<SpaceLabel, Gauge>,
    immutable_memtables: Family<SpaceLabel, Gauge>,
    level0_files: Family<SpaceLabel, Gauge>,
    table_bytes: Family<SpaceLabel, Gauge>,
    pending_compaction_bytes: Family<SpaceLabel, Gauge>,
    estimated_keys: Family<SpaceLabel, Gauge>,
    running_flushes: Gauge,
    running_compactions: Gauge,
    write_stopped: Gauge,
    delayed_write_rate: Gauge,
    background_errors: Gauge,
    direct_table_io: Gauge,
}

impl StorageGauges {
    fn register(r: &mut Registry) -> Self {
        let family = |r: &mut Registry, name: &str, help: &str| {
            register(r, name, help, Family::<SpaceLabel, Gauge>::default())
        };
        Self {
            memtable_bytes: family(
                r,
                "storage_memtable_bytes",
                "Bytes in the storage engine's memtables (active and waiting for their flush), by column family",
            ),
            immutable_memtables: family(
                r,
                "storage_immutable_memtables",
                "Full memtables waiting for their flush, by column family",
            ),
            level0_files: family(
                r,
                "storage_level0_files",
                "Table files at level 0 (RocksDB slows writes at 20 and stops them at 36), by column family",
            ),
            table_bytes: family(
                r,
                "storage_table_bytes",
                "Bytes of the table files in use, by column family",
            ),
            pending_compaction_bytes: family(
                r,
                "storage_pending_compaction_bytes",
                "Bytes the storage engine estimates its compactions must rewrite (work owed), by column family",
            ),
            estimated_keys: family(
                r,
                "storage_estimated_keys",
                "Keys, by the storage engine's estimate, by column family",
            ),
            running_flushes: gauge(r, "storage_running_flushes", "Memtable flushes running"),
            running_compactions: gauge(r, "storage_running_compactions", "Compactions running"),
            write_stopped: gauge(
                r,
                "storage_write_stopped",
                "1 while the storage engine stops writes until its background work catches up",
            ),
            delayed_write_rate: gauge(
                r,
                "storage_delayed_write_rate_bytes",
                "The rate the storage engine slows writes to, bytes a second (0 when it does not)",
            ),
            background_errors: gauge(
                r,
                "storage_background_errors",
                "Failed flushes or compactions since the journal was opened",
            ),
            direct_table_io: gauge(
                r,
                "storage_direct_table_io",
                "1 when flushes and compactions write table files with direct I/O, past the page cache",
            ),
        }
    }

    fn set(&self, stats: &StorageStats) {
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        for space in &stats.spaces {
            let label = SpaceLabel {
                space: space.name.clone(),
            };
            let figures = [
                (&self.memtable_bytes, space.memtable_bytes),
                (&self.immutable_memtables, space.immutable_memtables),
                (&self.level0_files, space.level0_files),
                (&self.table_bytes, space.table_bytes),
                (
                    &self.pending_compaction_bytes,
                    space.pending_compaction_bytes,
                ),
                (&self.estimated_keys, space.estimated_keys),
            ];
            for (family, value) in figures {
                family.get_or_create(&label).set(int(value));
            }
        }
        self.running_flushes.set(int(stats.running_flushes));
        self.running_compactions.set(int(stats.running_compactions));
        self.write_stopped.set(i64::from(stats.write_stopped));
        self.delayed_write_rate.set(int(stats.delayed_write_rate));
        self.background_errors.set(int(stats.background_errors));
        self.direct_table_io.set(i64::from(stats.direct_table_io));
    }
}

/// Counters that mirror a count kept elsewhere (the store's): raised to it at each scrape.
#[derive(Debug, Default)]
struct Mirrored {
    updates_deduplicated: Counter,
    inputs_deduplicated: Counter,
    version_conflicts: Counter,
    progress_capped: Counter,
    updates_over_limit: Counter,
}

impl Mirrored {
    /// The mirrored counters, registered.
    fn register(r: &mut Registry) -> Self {
        Self {
            updates_deduplicated: counter(
                r,
                "updates_deduplicated",
                "Progress updates answered from the journal (event id seen before) by this server's store",
            ),
            inputs_deduplicated: counter(
                r,
                "inputs_deduplicated",
                "Inputs answered from the journal (event id seen before) by this server's store",
            ),
            version_conflicts: counter(
                r,
                "version_conflicts",
                "Appends of this server's store that lost a race for their stream's position",
            ),
            progress_capped: counter(
                r,
                "progress_capped",
                "Running tasks' progress trimmed by this server's store for going over its progress cap",
            ),
            updates_over_limit: counter(
                r,
                "updates_over_limit",
                "New progress updates refused by this server's store: their task had recorded its limit of updates",
            ),
        }
    }

    fn raise(counter: &Counter, to: u64) {
        let now = counter.get();
        if to > now {
            counter.inc_by(to - now);
        }
    }
}

/// The journal's counts, set at each scrape.
#[derive(Debug)]
struct JournalGauges {
    tasks: Gauge,
    records: Gauge,
    bytes: Gauge,
    problems: Gauge,
    purged: Gauge,
    last_seq: Gauge,
    attempts_started: Gauge,
    attempts_recovered: Gauge,
    leases_expired: Gauge,
    outbox: Gauge,
}

impl JournalGauges {
    fn register(r: &mut Registry) -> Self {
        let tasks = gauge(r, "journal_tasks", "Tasks in the journal");
        let records = gauge(r, "journal_records", "Records in the journal");
        let bytes = gauge(
            r,
            "journal_record_bytes",
            "Bytes of the records in the journal",
        );
        let problems = gauge(
            r,
            "journal_tasks_with_problems",
            "Tasks whose stream does not fold cleanly (run a verify)",
        );
        let purged = gauge(
            r,
            "journal_tasks_purged",
            "Purged tasks: their records deleted, their tombstones kept",
        );
        let last_seq = gauge(
            r,
            "journal_last_sequence",
            "The last global sequence the server has read",
        );
        let attempts_started = gauge(r, "attempts_started", "Attempts started, in the journal");
        let attempts_recovered = gauge(
            r,
            "attempts_recovered",
            "Attempts that recovered a tool whose started marker was durable, in the journal",
        );
        let leases_expired = gauge(
            r,
            "leases_expired",
            "Attempts whose lease expired, in the journal",
        );
        let outbox = gauge(
            r,
            "outbox_backlog",
            "Notifications queued and not yet acknowledged",
        );
        Self {
            tasks,
            records,
            bytes,
            problems,
            purged,
            last_seq,
            attempts_started,
            attempts_recovered,
            leases_expired,
            outbox,
        }
    }
}

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: Family<RouteLabels, Histogram>,
    tasks: Family<StatusLabel, Gauge>,
    tasks_by_executor: Family<ExecutorLabel, Gauge>,
    records: Family<TypeValue, Gauge>,
    subscribers: Gauge,
    ready: Gauge,
    journal_stopped: Gauge,
    sync_promise: Family<PromiseLabel, Gauge>,
    /// Streams that fell behind the broadcast buffer and went back to reading the journal.
    pub stream_lagged: Counter,
    /// Failed reads of the pump.
    pub pump_errors: Counter,
    /// Damaged records of the commit order the pump passed over.
    pub damaged_records: Counter,
    /// Audits run, by result.
    pub verifies: Family<ResultLabel, Counter>,
    /// Receives of notifications waiting for one (`wait_ms`: long polls parked now).
    pub receives_waiting: Gauge,
    journal: JournalGauges,
    write: WriteMetrics,
    storage: StorageGauges,
    /// The store's counts, raised at each scrape (one scrape at a time).
    mirrored: Mutex<Mirrored>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric registered, prefixed `dtask`.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("dtask");
        let r = &mut registry;
        let requests = register(
            r,
            "http_requests",
            "HTTP requests answered, by route, method and status",
            Family::<RequestLabels, Counter>::default(),
        );
        let durations = register(
            r,
            "http_request_duration_seconds",
            "Time to answer an HTTP request (for streams: to open them), by route",
            Family::<RouteLabels, Histogram>::new_with_constructor(
                (|| Histogram::new(exponential_buckets(0.000_25, 4.0, 9))) as fn() -> Histogram,
            ),
        );
        let tasks = register(
            r,
            "tasks",
            "Tasks in the journal, by status",
            Family::<StatusLabel, Gauge>::default(),
        );
        let tasks_by_executor = register(
            r,
            "tasks_by_executor",
            "Tasks in the journal, by executor key",
            Family::<ExecutorLabel, Gauge>::default(),
        );
        let records = register(
            r,
            "journal_records_by_type",
            "Records in the journal, by event type",
            Family::<TypeValue, Gauge>::default(),
        );
        let subscribers = gauge(r, "sse_streams", "Open server-sent event streams");
        let ready = gauge(
            r,
            "ready",
            "1 when the server is ready (GET /readyz answers 200), else 0",
        );
        let journal_stopped = gauge(
            r,
            "journal_stopped",
            "1 once the journal stopped after a failed sync: it refuses every write until the process restarts",
        );
        let sync_promise = register(
            r,
            "journal_sync_promise",
            "1 for what a synced append promises where the journal's directory lies (stable, flushed, lost or unknown; none on PostgreSQL): dtask probe",
            Family::<PromiseLabel, Gauge>::default(),
        );
        let stream_lagged = counter(
            r,
            "sse_lagged",
            "Streams that fell behind the broadcast buffer and went back to reading the journal",
        );
        let (pump_errors, damaged_records) = pump_counters(r);
        let verifies = register(
            r,
            "verify_runs",
            "Audits run through the API, by result",
            Family::<ResultLabel, Counter>::default(),
        );
        let receives_waiting = gauge(
            r,
            "notification_receives_waiting",
            "Receives of notifications waiting for one (long polls with wait_ms), now",
        );
        let mirrored = Mirrored::register(r);
        let journal = JournalGauges::register(r);
        let write = WriteMetrics::register(r);
        let storage = StorageGauges::register(r);
        Self {
            registry,
            requests,
            durations,
            tasks,
            tasks_by_executor,
            records,
            subscribers,
            ready,
            journal_stopped,
            sync_promise,
            stream_lagged,
            pump_errors,
            damaged_records,
            verifies,
            receives_waiting,
            journal,
            write,
            storage,
            mirrored: Mutex::new(mirrored),
        }
    }

    /// Sets what a synced append promises where the journal lies (once, when the server is
    /// made).
    pub fn set_sync_promise(&self, promise: &str) {
        self.sync_promise
            .get_or_create(&PromiseLabel {
                promise: promise.to_owned(),
            })
            .set(1);
    }

    /// Counts an answered request.
    pub fn observe(&self, route: &str, method: &str, status: u16, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.to_owned(),
                method: method.to_owned(),
                status,
            })
            .inc();
        self.durations
            .get_or_create(&RouteLabels {
                route: route.to_owned(),
            })
            .observe(seconds);
    }

    /// The observer to install on the journal the server owns ([`dtask_journal::Journal::observe`]).
    pub fn write_observer(&self) -> Arc<dyn WriteObserver> {
        self.write.observer()
    }

    /// The text exposition, after setting the gauges from `snapshot` and `scrape`.
    pub fn render(&self, snapshot: &Snapshot, scrape: &Scrape) -> String {
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let mirrored = self.mirrored.lock();
        if let Some(store) = scrape.store {
            Mirrored::raise(&mirrored.updates_deduplicated, store.updates_deduplicated);
            Mirrored::raise(&mirrored.inputs_deduplicated, store.inputs_deduplicated);
            Mirrored::raise(&mirrored.version_conflicts, store.version_conflicts);
            Mirrored::raise(&mirrored.progress_capped, store.progress_capped);
            Mirrored::raise(&mirrored.updates_over_limit, store.updates_over_limit);
        }
        if let Some(backlog) = scrape.outbox {
            self.journal.outbox.set(int(backlog));
        }
        if let Some(storage) = &scrape.storage {
            self.storage.set(storage);
        }
        self.journal
            .attempts_started
            .set(int(snapshot.records_of(EventType::AttemptStarted)));
        self.journal
            .leases_expired
            .set(int(snapshot.records_of(EventType::LeaseExpired)));
        self.journal
            .attempts_recovered
            .set(int(snapshot.attempts_recovered));
        let subscribers = scrape.subscribers;
        for (status, n) in &snapshot.by_status {
            self.tasks
                .get_or_create(&StatusLabel {
                    status: status.as_str().to_owned(),
                })
                .set(int(*n));
        }
        // An executor or a record type a purge took the last of goes, not stays at its
        // last count (renders take turns: `mirrored` is held to the end).
        self.tasks_by_executor.clear();
        self.records.clear();
        // The most common executor keys, the rest as `other`: the keys are the clients' to
        // choose, and the series must stay bounded.
        for (executor, n) in snapshot.executors_shown() {
            self.tasks_by_executor
                .get_or_create(&ExecutorLabel { executor })
                .set(int(n));
        }
        for (event_type, n) in &snapshot.by_type {
            self.records
                .get_or_create(&TypeValue {
                    event_type: event_type.as_str().to_owned(),
                })
                .set(int(*n));
        }
        self.journal.tasks.set(int(snapshot.tasks));
        self.journal.records.set(int(snapshot.records));
        self.journal.bytes.set(int(snapshot.bytes));
        self.journal.problems.set(int(snapshot.problems));
        self.journal.purged.set(int(snapshot.purged));
        self.journal.last_seq.set(int(snapshot.last_seq));
        self.subscribers.set(int(subscribers));
        self.ready.set(i64::from(scrape.ready));
        self.journal_stopped.set(i64::from(scrape.journal_stopped));
        let mut out = String::new();
        // Writing to a String does not fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        drop(mirrored);
        out
    }
}

/// Middleware: counts every request by its route's pattern.
pub async fn track(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    // The methods HTTP names, and `other`: a label of whatever a client sends would let
    // anyone (the count runs before the token check) grow the registry without bound.
    let method = match *request.method() {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
    .to_owned();
    let response = next.run(request).await;
    metrics.observe(
        &route,
        &method,
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

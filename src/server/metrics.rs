//! Metrics in the Prometheus text format (`OpenMetrics`), from a registry owned by the server:
//! HTTP requests by route, method and status (and their durations), tasks by status and
//! executor, records by type, the journal's last sequence, the SSE streams.
//!
//! The registry is the server's own (`prometheus-client`), not a process-global recorder, so
//! two servers in one process (tests, or a service that embeds one) never mix their counts.

use super::projection::Snapshot;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Instant;

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

/// A label with one value.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `clean` or `problems`.
    pub result: String,
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
    journal_tasks: Gauge,
    journal_records: Gauge,
    journal_bytes: Gauge,
    journal_problems: Gauge,
    last_seq: Gauge,
    subscribers: Gauge,
    /// Streams that fell behind the broadcast buffer and went back to reading the journal.
    pub stream_lagged: Counter,
    /// Failed reads of the pump.
    pub pump_errors: Counter,
    /// Audits run, by result.
    pub verifies: Family<ResultLabel, Counter>,
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
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by route, method and status",
            requests.clone(),
        );
        let durations = Family::<RouteLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.000_25, 4.0, 9))) as fn() -> Histogram,
        );
        registry.register(
            "http_request_duration_seconds",
            "Time to answer an HTTP request (for streams: to open them), by route",
            durations.clone(),
        );
        let tasks = Family::<StatusLabel, Gauge>::default();
        registry.register("tasks", "Tasks in the journal, by status", tasks.clone());
        let tasks_by_executor = Family::<ExecutorLabel, Gauge>::default();
        registry.register(
            "tasks_by_executor",
            "Tasks in the journal, by executor key",
            tasks_by_executor.clone(),
        );
        let records = Family::<TypeValue, Gauge>::default();
        registry.register(
            "journal_records_by_type",
            "Records in the journal, by event type",
            records.clone(),
        );
        let journal_tasks = Gauge::default();
        registry.register(
            "journal_tasks",
            "Tasks in the journal",
            journal_tasks.clone(),
        );
        let journal_records = Gauge::default();
        registry.register(
            "journal_records",
            "Records in the journal",
            journal_records.clone(),
        );
        let journal_bytes = Gauge::default();
        registry.register(
            "journal_record_bytes",
            "Bytes of the records in the journal",
            journal_bytes.clone(),
        );
        let journal_problems = Gauge::default();
        registry.register(
            "journal_tasks_with_problems",
            "Tasks whose stream does not fold cleanly (run a verify)",
            journal_problems.clone(),
        );
        let last_seq = Gauge::default();
        registry.register(
            "journal_last_sequence",
            "The last global sequence the server has read",
            last_seq.clone(),
        );
        let subscribers = Gauge::default();
        registry.register(
            "sse_streams",
            "Open server-sent event streams",
            subscribers.clone(),
        );
        let stream_lagged = Counter::default();
        registry.register(
            "sse_lagged",
            "Streams that fell behind the broadcast buffer and went back to reading the journal",
            stream_lagged.clone(),
        );
        let pump_errors = Counter::default();
        registry.register(
            "pump_errors",
            "Failed reads of the journal's commits by the server",
            pump_errors.clone(),
        );
        let verifies = Family::<ResultLabel, Counter>::default();
        registry.register(
            "verify_runs",
            "Audits run through the API, by result",
            verifies.clone(),
        );
        Self {
            registry,
            requests,
            durations,
            tasks,
            tasks_by_executor,
            records,
            journal_tasks,
            journal_records,
            journal_bytes,
            journal_problems,
            last_seq,
            subscribers,
            stream_lagged,
            pump_errors,
            verifies,
        }
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

    /// The text exposition, after setting the gauges from `snapshot`.
    pub fn render(&self, snapshot: &Snapshot, subscribers: u64) -> String {
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        for (status, n) in &snapshot.by_status {
            self.tasks
                .get_or_create(&StatusLabel {
                    status: status.as_str().to_owned(),
                })
                .set(int(*n));
        }
        for (executor, n) in &snapshot.by_executor {
            self.tasks_by_executor
                .get_or_create(&ExecutorLabel {
                    executor: executor.clone(),
                })
                .set(int(*n));
        }
        for (event_type, n) in &snapshot.by_type {
            self.records
                .get_or_create(&TypeValue {
                    event_type: event_type.as_str().to_owned(),
                })
                .set(int(*n));
        }
        self.journal_tasks.set(int(snapshot.tasks));
        self.journal_records.set(int(snapshot.records));
        self.journal_bytes.set(int(snapshot.bytes));
        self.journal_problems.set(int(snapshot.problems));
        self.last_seq.set(int(snapshot.last_seq));
        self.subscribers.set(int(subscribers));
        let mut out = String::new();
        // Writing to a String does not fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
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
    let method = request.method().as_str().to_owned();
    let response = next.run(request).await;
    metrics.observe(
        &route,
        &method,
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

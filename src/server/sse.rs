//! Committed records as server-sent events.
//!
//! One pump per server reads the journal's commits in order — woken by the journal's durable
//! watermark ([`Journal::watch_durable`]) when this process writes it or the database
//! announces commits (PostgreSQL), polling a follower of an embedded journal —
//! applies them to the [`Projection`] and broadcasts
//! each as a pre-serialized event on a bounded channel. A subscriber first reads what it
//! missed from the journal (from its `Last-Event-ID`, the global sequence), then follows the
//! channel. A subscriber that falls behind the channel's buffer is switched back to reading
//! the journal from its last event: it never misses a record, and never slows the pump or
//! the writer. The number of open streams is bounded.

use super::metrics::Metrics;
use super::model::RecordView;
use super::projection::Projection;
use super::ApiError;
use axum::response::sse::Event;
use dtask_journal::export::ByteFields;
use dtask_journal::{Committed, Journal, Record};
use futures::stream::{self, Stream, StreamExt};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, watch};

/// Records read from the journal per step (pump and catch-up).
const BATCH: usize = 512;

/// Damaged records a read of the commits keeps, at most, before it stops (a read of a
/// journal damaged throughout stays bounded).
const MAX_DAMAGED: usize = 16 * BATCH;

/// A committed record, ready to send — or a damaged record passed over.
#[derive(Debug)]
pub struct Item {
    /// The global sequence (the event id); for a damaged record, the sequence of the last
    /// record read before it.
    pub seq: u64,
    /// The task.
    pub task: String,
    /// The JSON of its [`RecordView`] (byte fields redacted to their length), or of its
    /// [`Damaged`].
    pub json: String,
    /// The damage passed over, for an `event: damaged` (no record).
    damaged: Option<Damaged>,
}

impl Item {
    fn of(task: &str, record: &Record) -> Self {
        let json = RecordView::of(task, record, ByteFields::Redacted)
            .and_then(|v| serde_json::to_string(&v))
            .unwrap_or_else(|e| format!("{{\"error\":{:?}}}", e.to_string()));
        Self {
            seq: record.seq,
            task: task.to_owned(),
            json,
            damaged: None,
        }
    }

    /// The damaged record `damaged`, met after the record of sequence `after`.
    fn damaged(damaged: Damaged, after: u64) -> Self {
        let json = serde_json::json!({
            "task": damaged.task,
            "position": damaged.position,
            "after_seq": after,
            "error": damaged.error,
        })
        .to_string();
        Self {
            seq: after,
            task: damaged.task.clone().unwrap_or_default(),
            json,
            damaged: Some(damaged),
        }
    }

    fn event(&self) -> Event {
        if self.damaged.is_some() {
            // No id: a client's `Last-Event-ID` stays at the last record it was sent.
            return Event::default().event("damaged").data(&self.json);
        }
        Event::default()
            .id(self.seq.to_string())
            .event("record")
            .data(&self.json)
    }
}

/// A damaged record of the commit order (its CRC does not match, it is cut short…), passed
/// over by the pump and the journal-wide streams: the records after it go on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Damaged {
    /// Its task (`None` when the index entry naming it is itself unreadable).
    pub task: Option<String>,
    /// Its position in its task's stream (`None` likewise).
    pub position: Option<u64>,
    /// What is wrong.
    pub error: String,
}

impl Damaged {
    fn of(error: &dtask_journal::Error) -> Self {
        let (task, position) = match error {
            dtask_journal::Error::Corruption { task, position, .. } => {
                (Some(task.clone()), Some(*position))
            }
            _ => (None, None),
        };
        Self {
            task,
            position,
            error: error.to_string(),
        }
    }
}

/// One entry of the commit order as read: a record, or a damaged one passed over.
enum Entry {
    Record(Committed),
    Damaged(Damaged),
}

/// What one read of the commit order found.
struct CommitRead {
    /// What was read, in order.
    entries: Vec<Entry>,
    /// The records among them.
    records: usize,
    /// The error that ended the read early (not damage, which is passed over): what was read
    /// before it is kept.
    failed: Option<String>,
}

/// Reads the commit order from sequence `from`: up to `limit` records, passing over damaged
/// ones (kept as [`Entry::Damaged`], at most [`MAX_DAMAGED`]) — the journal's iterator goes on
/// with the records after a damaged one — and stopping at any other error, keeping what came
/// before it.
fn read_commits(journal: &Journal, from: u64, limit: usize) -> CommitRead {
    let mut read = CommitRead {
        entries: Vec::new(),
        records: 0,
        failed: None,
    };
    let mut damaged = 0;
    for item in journal.commits(from) {
        match item {
            Ok(c) => {
                read.entries.push(Entry::Record(c));
                read.records += 1;
                if read.records == limit {
                    break;
                }
            }
            Err(e) if e.is_damage() => {
                read.entries.push(Entry::Damaged(Damaged::of(&e)));
                damaged += 1;
                if damaged == MAX_DAMAGED {
                    break;
                }
            }
            Err(e) => {
                read.failed = Some(e.to_string());
                break;
            }
        }
    }
    read
}

/// The damaged records met after the last record a reader has taken: the reader's next read
/// starts after that record and meets them again, and each is reported once.
#[derive(Debug, Default)]
struct Trailing(std::collections::HashSet<Damaged>);

impl Trailing {
    /// A record was taken: what was met before it is behind.
    fn passed(&mut self) {
        self.0.clear();
    }

    /// Whether `damaged` is met for the first time since the last record taken.
    fn first(&mut self, damaged: &Damaged) -> bool {
        if self.0.contains(damaged) {
            return false;
        }
        self.0.insert(damaged.clone());
        true
    }

    /// Whether damage was met after the last record taken.
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The broadcast side: the channel and the subscribers.
#[derive(Debug)]
pub struct Hub {
    sender: broadcast::Sender<Arc<Item>>,
    subscribers: Arc<AtomicU64>,
    max_subscribers: u64,
}

impl Hub {
    /// A hub whose channel keeps `buffer` events, allowing `max_subscribers` streams.
    pub fn new(buffer: usize, max_subscribers: usize) -> Self {
        let (sender, _) = broadcast::channel(buffer.max(16));
        Self {
            sender,
            subscribers: Arc::new(AtomicU64::new(0)),
            max_subscribers: max_subscribers as u64,
        }
    }

    /// A receiver of the records committed from now on, not counted as a stream (a waiting
    /// request looks again at each).
    pub fn commits(&self) -> broadcast::Receiver<Arc<Item>> {
        self.sender.subscribe()
    }

    /// Open streams.
    pub fn subscribers(&self) -> u64 {
        self.subscribers.load(Ordering::Relaxed)
    }

    fn admit(&self) -> Result<Admitted, ApiError> {
        let n = self.subscribers.fetch_add(1, Ordering::AcqRel);
        let admitted = Admitted(Arc::clone(&self.subscribers));
        if n >= self.max_subscribers {
            drop(admitted);
            return Err(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "too_many_subscribers",
                format!("{} streams are open already", self.max_subscribers),
            ));
        }
        Ok(admitted)
    }
}

/// A counted subscriber; uncounted when dropped.
#[derive(Debug)]
struct Admitted(Arc<AtomicU64>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the pump needs.
pub struct Pump {
    /// The journal read.
    pub journal: Journal,
    /// Whether the journal is a follower (caught up before each read).
    pub follower: bool,
    /// The counts to keep.
    pub projection: Arc<Projection>,
    /// Where to broadcast.
    pub hub: Arc<Hub>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// Set while reads of the commits fail (readiness).
    pub read_failing: Arc<AtomicBool>,
    /// How long to wait when nothing new was read.
    pub interval: Duration,
    /// How long after a count a trim makes the pump count the journal again
    /// ([`super::ServerConfig::recount_after_trim`]).
    pub recount_after_trim: Duration,
}

impl Pump {
    /// Counts the journal (again each interval while the count fails: the server is not
    /// ready until it is done), then reads its commits until `stop` turns true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let Some(mut next) = self.first_count(&mut stop).await else {
            return;
        };
        let follower = self.follower;
        let shared = self.journal.is_shared();
        let mut durable_rx = self.journal.watch_durable();
        // A count of the journal made again after a purge, running beside the pump.
        let mut recount: Option<Recount> = None;
        // When the last count made again failed: the next waits an interval.
        let mut count_failed: Option<std::time::Instant> = None;
        // When the counts were last made whole (a trim's count waits a while after it).
        let mut counted_at = std::time::Instant::now();
        // The damaged records read after the last record read (reported once each).
        let mut trailing = Trailing::default();
        loop {
            if *stop.borrow() {
                // A count made again holds the journal: the server's end waits for it, so
                // that the journal can be opened again once the server is done.
                if let Some(running) = recount.as_mut() {
                    running.wait().await;
                }
                return;
            }
            if let Some(done) = recount.as_mut().and_then(Recount::try_done) {
                recount = None;
                let counted = self.counted_again(done, next).await;
                count_failed = (!counted).then(std::time::Instant::now);
                if counted {
                    counted_at = std::time::Instant::now();
                }
            }
            // What the journal had made durable before the read: a read that ended on
            // damaged records waits for more than this.
            let durable_before = self.journal.durable_seq();
            let journal = self.journal.clone();
            let read = tokio::task::spawn_blocking(move || -> Result<CommitRead, String> {
                if follower {
                    journal.catch_up().map_err(|e| e.to_string())?;
                }
                Ok(read_commits(&journal, next, BATCH))
            })
            .await;
            let (entries, records, failed) = match read {
                Ok(Ok(read)) => (read.entries, read.records, read.failed),
                Ok(Err(e)) => (Vec::new(), 0, Some(e)),
                Err(e) => (Vec::new(), 0, Some(e.to_string())),
            };
            // Damage is not a failed read: the records after it are read.
            self.read_failing.store(failed.is_some(), Ordering::Relaxed);
            if let Some(e) = &failed {
                self.metrics.pump_errors.inc();
                tracing_error(&format!("reading the journal's commits failed: {e}"));
            }
            let full = records == BATCH;
            // While a count runs, the counts are its to replace: what the pump reads
            // meanwhile is applied once it is done (`counted_again`), in order.
            self.publish(entries, &mut next, &mut trailing, recount.is_none());
            let may_count = count_failed.is_none_or(|at| at.elapsed() >= self.interval);
            // A trim rewrote records in place: counted again, at most once a while (trims
            // come often where a progress cap trims running tasks).
            let trim_due = self.projection.trimmed_since_count()
                && counted_at.elapsed() >= self.recount_after_trim;
            if recount.is_none() && may_count && (self.projection.needs_recount() || trim_due) {
                // What the purged tasks counted for is gone with their records: count again,
                // beside the pump — a count reads the whole journal, and the streams, the
                // waiting receives and the live pages go on meanwhile (the counts stand
                // still until it is done).
                recount = Some(Recount::start(&self.journal, &self.projection));
            }
            if failed.is_some() {
                // A failed read waits the interval, whatever the journal says: reading again
                // at once would fail again at once (a busy loop).
                tokio::select! {
                    () = tokio::time::sleep(self.interval) => {}
                    _ = stop.changed() => {}
                }
            } else if !full {
                // The embedded journal this process writes says when a sync made more
                // records durable; a shared one when any process committed more (announced
                // by the database); a follower of an embedded journal another process
                // writes is polled. A read that ended on damaged records (met again by the
                // next read, which starts after the last record read) waits for a record
                // durable after what the read saw.
                let target = if trailing.is_empty() {
                    next
                } else {
                    next.max(durable_before.saturating_add(1))
                };
                let ready = !follower && !shared && self.journal.durable_seq() >= target;
                let moved = async {
                    // An error: the journal is gone; the interval goes on.
                    let woken = if shared {
                        // Each announcement wakes the pump once: an announced batch can be
                        // gone after a crash of the database, and waiting for the announced
                        // sequence to be reached would then never wait again.
                        durable_rx.changed().await.is_ok()
                    } else if follower {
                        false
                    } else {
                        durable_rx.wait_for(|seq| *seq >= target).await.is_ok()
                    };
                    if !woken {
                        std::future::pending::<()>().await;
                    }
                };
                if !ready {
                    let counted = async {
                        match recount.as_mut() {
                            Some(running) => running.wait().await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        () = tokio::time::sleep(self.interval) => {}
                        () = moved => {}
                        () = counted => {}
                        _ = stop.changed() => {}
                    }
                }
            }
        }
    }
}

impl Pump {
    /// Applies the records read to the counts (unless a count made again runs:
    /// `count` false) and broadcasts them, moving `next` past each; reports each damaged
    /// record met for the first time since the last record read (`trailing`).
    fn publish(&self, entries: Vec<Entry>, next: &mut u64, trailing: &mut Trailing, count: bool) {
        for entry in entries {
            let c = match entry {
                Entry::Record(c) => c,
                Entry::Damaged(damaged) => {
                    // Met again by each read until a record after it is read: reported once.
                    if trailing.first(&damaged) {
                        self.metrics.damaged_records.inc();
                        tracing_error(&format!(
                            "passed over a damaged record of the commits: {}",
                            damaged.error
                        ));
                        if self.hub.sender.receiver_count() > 0 {
                            let item = Item::damaged(damaged, next.saturating_sub(1));
                            let _ = self.hub.sender.send(Arc::new(item));
                        }
                    }
                    continue;
                }
            };
            trailing.passed();
            if count {
                self.projection.apply(&c.task, &c.record);
            }
            *next = c.record.seq + 1;
            // Serialized only for someone: with no stream open, nothing is made. (A stream
            // opening meanwhile reads what it missed from the journal.)
            if self.hub.sender.receiver_count() > 0 {
                let item = Arc::new(Item::of(&c.task, &c.record));
                let _ = self.hub.sender.send(item);
            }
        }
    }

    /// Counts the journal, again each interval while the count fails; the sequence the pump
    /// goes on from, or `None` once `stop` turns true.
    async fn first_count(&self, stop: &mut watch::Receiver<bool>) -> Option<u64> {
        loop {
            let journal = self.journal.clone();
            let projection = Arc::clone(&self.projection);
            let counted = tokio::task::spawn_blocking(move || projection.count(&journal)).await;
            let failure = match counted {
                Ok(Ok(last)) => return Some(last + 1),
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            };
            self.metrics.pump_errors.inc();
            self.read_failing.store(true, Ordering::Relaxed);
            tracing_error(&format!("counting the journal failed: {failure}"));
            tokio::select! {
                () = tokio::time::sleep(self.interval) => {}
                _ = stop.changed() => {}
            }
            if *stop.borrow() {
                return None;
            }
        }
    }

    /// Takes a count made again: on success the counts stand at the sequence it started at,
    /// and the records the pump read since (up to `next`, skipped by the counts while the
    /// count ran) are applied to them now — to the counts only, the streams had them.
    /// Returns whether the counts are whole; if not (the count or the reading after it
    /// failed), they are marked to be counted again.
    async fn counted_again(&self, done: Result<u64, String>, next: u64) -> bool {
        let start = match done {
            Ok(start) => start,
            Err(e) => {
                self.metrics.pump_errors.inc();
                tracing_error(&format!(
                    "counting the journal again after a purge failed: {e}"
                ));
                self.projection.invalidate();
                return false;
            }
        };
        if start + 1 >= next {
            return true;
        }
        let journal = self.journal.clone();
        let projection = Arc::clone(&self.projection);
        let caught_up = tokio::task::spawn_blocking(move || -> Result<(), String> {
            for c in journal.commits(start + 1) {
                let c = match c {
                    Ok(c) => c,
                    // Passed over (the pump reported it when it read it).
                    Err(e) if e.is_damage() => continue,
                    Err(e) => return Err(e.to_string()),
                };
                if c.record.seq >= next {
                    break;
                }
                projection.apply(&c.task, &c.record);
            }
            Ok(())
        })
        .await;
        if matches!(caught_up, Ok(Ok(()))) {
            return true;
        }
        self.metrics.pump_errors.inc();
        tracing_error("reading the commits a count made again missed failed");
        // Some of them are not in the counts: count again.
        self.projection.invalidate();
        false
    }
}

/// A count of the journal made again ([`Projection::count`]) on a blocking thread, its
/// outcome (the sequence it started at) coming back through a watch channel (`None` until
/// then), which can be waited on without taking it.
struct Recount {
    done: watch::Receiver<Option<Result<u64, String>>>,
}

impl Recount {
    fn start(journal: &Journal, projection: &Arc<Projection>) -> Self {
        let (tx, done) = watch::channel(None);
        let (journal, projection) = (journal.clone(), Arc::clone(projection));
        tokio::task::spawn_blocking(move || {
            let outcome = projection.count(&journal).map_err(|e| e.to_string());
            // Let go of the journal before saying so: a server that stops waits for the
            // count, and the journal must be free to open again once it has stopped.
            drop(journal);
            let _ = tx.send(Some(outcome));
        });
        Self { done }
    }

    /// Its outcome, if it is done.
    fn try_done(&mut self) -> Option<Result<u64, String>> {
        if let Some(outcome) = self.done.borrow().clone() {
            return Some(outcome);
        }
        // The count's thread gone without an answer (it panicked).
        self.done
            .has_changed()
            .is_err()
            .then(|| Err("the count ended without an answer".to_owned()))
    }

    /// Returns once it is done (its outcome left for [`Recount::try_done`]).
    async fn wait(&mut self) {
        // An error: the sender is gone, which `try_done` reports.
        let _ = self.done.wait_for(Option::is_some).await;
    }
}

/// Reports a failure of the background pump on standard error.
fn tracing_error(message: &str) {
    eprintln!("dtask serve: {message}");
}

/// Which records a stream carries.
#[derive(Debug, Clone)]
pub enum Scope {
    /// Every record, in commit order.
    Journal,
    /// One task's records, in stream order.
    Task(String),
}

impl Scope {
    /// Whether a record of `task` belongs to this stream.
    fn carries(&self, task: &str) -> bool {
        match self {
            Self::Journal => true,
            Self::Task(id) => id == task,
        }
    }
}

enum Phase {
    /// Reading what the subscriber missed from the journal.
    Journal,
    /// Following the broadcast channel.
    Live,
    /// A read of the journal failed: the stream ends (its client reconnects).
    Failed,
}

struct Follow {
    journal: Journal,
    scope: Scope,
    receiver: broadcast::Receiver<Arc<Item>>,
    /// The last sequence sent.
    after: u64,
    /// For a task stream: the next position to read from the journal.
    position: u64,
    /// The damaged records sent after the last record sent (not sent twice).
    trailing: Trailing,
    phase: Phase,
    metrics: Arc<Metrics>,
    _admitted: Admitted,
}

/// Opens a stream of `scope`'s records after sequence `after`, ending when `stop` turns true.
///
/// # Errors
/// [`ApiError`] `too_many_subscribers` when the bound is reached.
pub fn subscribe(
    hub: &Hub,
    journal: Journal,
    scope: Scope,
    after: u64,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) -> Result<impl Stream<Item = Result<Event, std::convert::Infallible>>, ApiError> {
    let admitted = hub.admit()?;
    // Subscribed before the journal is read: whatever the pump sends from now on is either
    // read from the journal below or received.
    let follow = Follow {
        journal,
        scope,
        receiver: hub.sender.subscribe(),
        after,
        position: 0,
        trailing: Trailing::default(),
        phase: Phase::Journal,
        metrics,
        _admitted: admitted,
    };
    let events = stream::unfold(follow, step)
        .flat_map(stream::iter)
        .map(|item| Ok(item.event()));
    Ok(events.take_until(async move {
        // An error means the server is gone: end as well.
        let _ = stop.wait_for(|stopped| *stopped).await;
    }))
}

/// The next events of a stream (`None` ends it).
async fn step(mut f: Follow) -> Option<(Vec<Arc<Item>>, Follow)> {
    loop {
        match f.phase {
            Phase::Journal => {
                let (journal, scope, after, position) =
                    (f.journal.clone(), f.scope.clone(), f.after, f.position);
                let read = tokio::task::spawn_blocking(move || {
                    read_after(&journal, &scope, after, position)
                })
                .await;
                let Ok(read) = read else {
                    return None;
                };
                f.position = read.position;
                // Damaged records are passed over (each sent once as an `event: damaged`);
                // the records after them go on.
                let mut items = Vec::with_capacity(read.items.len());
                for item in read.items {
                    if let Some(damaged) = &item.damaged {
                        if f.trailing.first(damaged) {
                            items.push(item);
                        }
                    } else {
                        f.trailing.passed();
                        f.after = item.seq;
                        items.push(item);
                    }
                }
                if !read.records {
                    // Nothing more in the journal (but perhaps damage, sent now): what comes
                    // next comes through the channel. A read that failed ends the stream
                    // once what it read is sent (the client reconnects from its last event).
                    if read.failed {
                        if items.is_empty() {
                            return None;
                        }
                        f.phase = Phase::Failed;
                    } else {
                        f.phase = Phase::Live;
                    }
                    if items.is_empty() {
                        continue;
                    }
                }
                return Some((items, f));
            }
            Phase::Failed => return None,
            Phase::Live => match f.receiver.recv().await {
                Ok(item) => {
                    // Whatever else is already in the channel goes out with it: one write for
                    // the lot, not one per record.
                    let mut items = Vec::new();
                    let mut next = Some(item);
                    while let Some(item) = next.take() {
                        match &item.damaged {
                            // A damaged record met after the last record sent (the pump
                            // passed over it), sent once; task streams pass over damage
                            // silently.
                            Some(damaged) => {
                                if matches!(f.scope, Scope::Journal)
                                    && item.seq >= f.after
                                    && f.trailing.first(damaged)
                                {
                                    items.push(item);
                                }
                            }
                            None => {
                                if item.seq > f.after && f.scope.carries(&item.task) {
                                    f.trailing.passed();
                                    f.after = item.seq;
                                    items.push(item);
                                }
                            }
                        }
                        if items.len() < BATCH {
                            next = match f.receiver.try_recv() {
                                Ok(item) => Some(item),
                                Err(broadcast::error::TryRecvError::Lagged(_)) => {
                                    // The channel overwrote records this subscriber had not
                                    // taken (its cursor now past them): they are read from
                                    // the journal, after what was taken here.
                                    f.metrics.stream_lagged.inc();
                                    f.receiver = f.receiver.resubscribe();
                                    f.phase = Phase::Journal;
                                    None
                                }
                                Err(_) => None,
                            };
                        }
                    }
                    if items.is_empty() {
                        continue;
                    }
                    return Some((items, f));
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    f.metrics.stream_lagged.inc();
                    f.receiver = f.receiver.resubscribe();
                    f.phase = Phase::Journal;
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            },
        }
    }
}

/// What a stream read from the journal.
struct Read {
    /// Records, and (journal-wide) damaged records passed over, in order.
    items: Vec<Arc<Item>>,
    /// For a task: the position to read from next.
    position: u64,
    /// Whether a record was read.
    records: bool,
    /// Whether the read ended on an error other than damage.
    failed: bool,
}

/// Up to [`BATCH`] records of `scope` with a sequence above `after`, and (for a task) the
/// position to read from next. The journal-wide order passes over a damaged record (as an
/// item of its own) and goes on with the records after it; a task's stream skips it.
fn read_after(journal: &Journal, scope: &Scope, after: u64, position: u64) -> Read {
    match scope {
        Scope::Journal => {
            let read = read_commits(journal, after.saturating_add(1), BATCH);
            let mut last = after;
            let items = read
                .entries
                .into_iter()
                .map(|entry| match entry {
                    Entry::Record(c) => {
                        last = c.record.seq;
                        Arc::new(Item::of(&c.task, &c.record))
                    }
                    Entry::Damaged(damaged) => Arc::new(Item::damaged(damaged, last)),
                })
                .collect();
            Read {
                items,
                position,
                records: read.records > 0,
                failed: read.failed.is_some(),
            }
        }
        Scope::Task(task) => {
            let position = if position == 0 && after > 0 {
                first_after(journal, task, after)
            } else {
                position
            };
            let mut items = Vec::new();
            let mut next = position;
            for record in journal.read_stream(task, position) {
                // A damaged record is skipped here (the records endpoint and verify name it).
                let Ok(record) = record else { continue };
                next = record.position + 1;
                if record.seq > after {
                    items.push(Arc::new(Item::of(task, &record)));
                    if items.len() == BATCH {
                        break;
                    }
                }
            }
            Read {
                records: !items.is_empty(),
                items,
                position: next,
                failed: false,
            }
        }
    }
}

/// A position of `task`'s stream at or before its first record with a sequence above
/// `after`: where a task stream resumed from a `Last-Event-ID` starts reading. Sequences grow
/// with positions, so it is found by bisection — a few reads, where reading from position 0
/// read the whole stream at each reconnect. A record that cannot be read ends the search
/// where it stands (the reading that follows skips what is at or below `after` anyway).
fn first_after(journal: &Journal, task: &str, after: u64) -> u64 {
    // Every position below `low` holds a record at or below `after`; `high` bounds the
    // answer from above.
    let (mut low, mut high) = (0, journal.stream_len(task).ok().flatten().unwrap_or(0));
    while low < high {
        let middle = low + (high - low) / 2;
        match journal.read_stream(task, middle).next() {
            // The first record at or after `middle` (a trim may have left gaps).
            Some(Ok(record)) if record.seq <= after => low = record.position + 1,
            Some(Ok(_)) => high = middle,
            None | Some(Err(_)) => break,
        }
    }
    low
}

#[cfg(test)]
mod tests {
    use super::first_after;
    use dtask_journal::{Event, Journal, JournalOptions, Timestamp};

    fn update(i: u64) -> Event {
        Event::UpdateAppended {
            attempt: 1,
            event_id: format!("e{i}"),
            kind: "progress".into(),
            data: vec![1],
            metadata: vec![],
            at: Timestamp(i),
        }
    }

    #[test]
    fn a_resumed_task_stream_starts_at_its_first_record_past_the_last_event_id() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        // Task `a`'s records among others' (some appended two at a time), so that its
        // sequences skip.
        let (mut a, mut other) = (0, 0);
        for i in 0..40 {
            let n = if i % 3 == 0 { 2 } else { 1 };
            let events: Vec<Event> = (0..n).map(|k| update(i * 2 + k)).collect();
            journal.append("a", a, &events).unwrap();
            a += n;
            for _ in 0..i % 4 {
                journal.append("other", other, &[update(i)]).unwrap();
                other += 1;
            }
        }
        let seqs: Vec<u64> = journal
            .read_stream("a", 0)
            .map(|r| r.unwrap().seq)
            .collect();
        let last = *seqs.last().unwrap();
        for after in 0..=last + 3 {
            let expected = seqs.iter().take_while(|seq| **seq <= after).count() as u64;
            assert_eq!(first_after(&journal, "a", after), expected, "after {after}");
        }
        assert_eq!(first_after(&journal, "nothing", 5), 0);
    }
}

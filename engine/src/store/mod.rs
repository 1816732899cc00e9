//! The durable task store: commands → `decide` → one atomic journal append → the fold.
//!
//! Every live (non-terminal) task is held folded in memory, rebuilt by replay when the store
//! opens; terminal tasks are folded on demand and kept in a bounded cache. Each task has a
//! slot with an async lock that serializes its commands: the lock is held from reading the
//! state, through the durable append, to applying the same events with [`Task::apply`]. A
//! command's events are appended in **one** batch together with the lifecycle notification it
//! causes, so a crash never leaves one without the other.

mod config;
mod cursor;
pub(crate) mod decide;
mod error;
mod follow;
mod index;
mod mailbox;
mod outbox;
mod request;
mod retention;
mod unsettled;
mod updates;

pub use config::StoreConfig;
pub use decide::{Command, MAX_INPUT_KIND_BYTES};
pub use error::{NotFound, Result, StoreError};
pub use mailbox::{InputPage, InputRecord};
pub use outbox::{Notification, RESERVED_KIND_PREFIXES};
pub use request::{
    application_notification_id, application_notification_source, AdvanceCursor, CreateRequest,
    ExecutionContext, InputRequest, NotificationRequest, UpdateRequest,
};
pub use retention::{
    progress_trimmable, trim_due, whole_updates, RetentionStep, TrimStep, MAX_PURGE_TREE,
};
pub use updates::{UpdatePage, UpdateRecord};

use crate::clock::Clock;
use decide::{Decision, Keyed, ParentNotice};
use dtask_journal::{Event, Head, Journal, LiveRepair, LiveSummary, Timestamp};
use dtask_replay::{
    load_listed_tasks_each, load_task, load_tasks_each, ReplayError, Status, Task, TaskState,
};
use index::{Index, IndexBuilder, Placement, TaskKey, MAX_SIZED_LIVE_TASKS};
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::sync::watch;
use tracing::Instrument;

/// How many times one request is decided again after a write refused for a stale position
/// ([`Redecide`]).
const STALE_DECISIONS: usize = 3;

/// A request decided on a locked task, kept to be decided again when its write is refused
/// for a stale position (the commit's `VersionConflict`, the task folded again by then): on
/// a journal shared with other nodes, where another node appended to the task's stream what
/// this node's memory had not folded yet. Often a record that changes no version — an
/// input, a child's notice, a progress update — after which the request is decided against
/// what the other node wrote (an input that came first sends a completion asked "if no
/// inputs" back to pending, and a plain one goes ahead) instead of the caller hearing of a
/// version conflict no version change made; else the decision names what did change (a
/// stale expected version, a lost lease, a sealed mailbox). Bounded by
/// [`STALE_DECISIONS`]: a stream that keeps moving answers with the conflict. A copy is kept
/// only while the request may be decided again (never on an embedded journal).
struct Redecide<R> {
    next: Option<R>,
    kept: Option<R>,
    stale: usize,
}

impl<R: Clone> Redecide<R> {
    fn new(request: R) -> Self {
        Self {
            next: Some(request),
            kept: None,
            stale: 0,
        }
    }

    /// The request to decide now.
    fn take(&mut self, store: &TaskStore) -> Result<R> {
        let request = self
            .next
            .take()
            .ok_or_else(|| StoreError::invalid("request", "decided once only"))?;
        let may = self.stale < STALE_DECISIONS && store.inner.journal.is_shared();
        self.kept = may.then(|| request.clone());
        Ok(request)
    }

    /// Whether the commit's `error` is a stale position after which the request is to be
    /// decided again (it is then the next one [`Redecide::take`] gives).
    fn again(&mut self, error: &StoreError) -> bool {
        if !matches!(error, StoreError::VersionConflict { .. }) {
            return false;
        }
        let Some(request) = self.kept.take() else {
            return false;
        };
        self.next = Some(request);
        self.stale += 1;
        true
    }
}

/// A task being created with a parent (a nested task, a rerun) whose append is in flight:
/// dropped before the append's outcome is known — its caller stopped waiting — it indexes
/// the task once the append has settled, if it landed.
struct Orphan {
    /// `None` once the outcome is known (the create indexes the task itself).
    store: Option<TaskStore>,
    task: String,
    parent: String,
}

impl Drop for Orphan {
    fn drop(&mut self) {
        let Some(store) = self.store.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (task, parent) = (
            std::mem::take(&mut self.task),
            std::mem::take(&mut self.parent),
        );
        runtime.spawn(async move {
            // Runs after the drop, by which time the append's guard has marked the parent.
            let signal = store
                .index()
                .slots
                .get(parent.as_str())
                .and_then(|slot| slot.unsettled.signal());
            if let Some(signal) = signal {
                unsettled::settled(signal).await;
            }
            if store.slot(&task).is_ok() {
                store
                    .inner
                    .pending_epoch
                    .send_modify(|e| *e = e.wrapping_add(1));
            }
        });
    }
}

/// How many times [`TaskStore::slot`] folds a task not in memory while slots leave the index
/// meanwhile ([`Index::cold_epoch`]: its own, or another's that shares its counter); the last fold is placed whatever happened meanwhile
/// (as every fold was before: a store evicting all the time could otherwise fold for ever).
const COLD_FOLDS: usize = 3;

/// How many times [`TaskStore::rerun`] decides again when another node's write to the
/// original got in first (a shared journal).
const RERUN_TRIES: usize = 8;

/// One page of a task listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskPage {
    /// The tasks, in ascending id order.
    pub tasks: Vec<TaskState>,
    /// The cursor of the next page; `None` on the last page.
    pub next_cursor: Option<String>,
}

/// Whether an append was written or lost a race.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Appended {
    Written,
    Conflict,
}

/// The change counters of a task, published after every applied event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Change {
    /// The task's version.
    pub version: u64,
    /// The task's stream length.
    pub position: u64,
}

struct Slot {
    task: tokio::sync::Mutex<Task>,
    /// The latest change counters; guards the creation of `changes` too.
    latest: Mutex<Change>,
    /// The channel of change counters, made when the first receiver subscribes: most live
    /// tasks never have one, and a watch channel is ~400 bytes (a quarter of a recovered
    /// task's memory before it was made lazy).
    changes: OnceLock<watch::Sender<Change>>,
    /// Whether `task` may be behind the journal: a write's caller was dropped with its
    /// append in flight ([`unsettled`]); [`TaskStore::lock`] settles it.
    unsettled: unsettled::Unsettled,
}

impl Slot {
    fn new(task: Task) -> Arc<Self> {
        let change = Change {
            version: task.state.version,
            position: task.state.position,
        };
        Arc::new(Self {
            task: tokio::sync::Mutex::new(task),
            latest: Mutex::new(change),
            changes: OnceLock::new(),
            unsettled: unsettled::Unsettled::default(),
        })
    }

    /// Records `change` and sends it to the receivers, if any.
    fn publish(&self, change: Change) {
        let mut latest = self.latest.lock();
        *latest = change;
        if let Some(changes) = self.changes.get() {
            changes.send_replace(change);
        }
    }

    /// A receiver of the change counters, starting at the latest ones.
    fn subscribe(&self) -> watch::Receiver<Change> {
        // Under `latest`, so that no change is published between reading the latest counters
        // and making the channel.
        let latest = self.latest.lock();
        self.changes
            .get_or_init(|| watch::Sender::new(*latest))
            .subscribe()
    }
}

struct Inner {
    journal: Journal,
    /// The journal's durable view ([`Journal::durable_view`]): what the store reads for
    /// what its callers show (a task's updates), so that they show nothing a crash can take
    /// back.
    durable: Journal,
    clock: Arc<dyn Clock>,
    config: StoreConfig,
    index: Mutex<Index>,
    outbox: Mutex<outbox::Outbox>,
    pending_epoch: watch::Sender<u64>,
    /// What the open repaired in the `live` index, if anything.
    repaired: Option<LiveRepair>,
    /// What the store counts of what it did not append.
    counters: Counters,
    /// The last global sequence [`TaskStore::refresh`] has looked at.
    seen: AtomicU64,
    /// The records [`TaskStore::refresh`] passed over undecodable (task, position) and
    /// logged: each is logged once.
    passed_over: Mutex<std::collections::HashSet<(String, u64)>>,
}

/// What a store did without appending, counted since it was opened (the journal holds the
/// rest): see [`TaskStore::counts`].
#[derive(Debug, Default)]
struct Counters {
    updates_deduplicated: AtomicU64,
    inputs_deduplicated: AtomicU64,
    version_conflicts: AtomicU64,
    progress_capped: AtomicU64,
    updates_over_limit: AtomicU64,
}

/// What a store did without appending anything, since it was opened: what its metrics need
/// beside the journal's records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreCounts {
    /// Progress updates (and parts) answered from the journal: their event id was recorded
    /// before, with the same bytes.
    pub updates_deduplicated: u64,
    /// Inputs answered from the journal: their event id was recorded before.
    pub inputs_deduplicated: u64,
    /// Appends that lost a race for a stream's position (the task was refolded).
    pub version_conflicts: u64,
    /// Trims of running tasks' progress made by the progress cap
    /// ([`StoreConfig::progress_cap`]).
    pub progress_capped: u64,
    /// New progress updates refused because their task had recorded the store's limit
    /// ([`StoreConfig::max_updates`]).
    pub updates_over_limit: u64,
}

/// Derives the `live` index from the streams: folds every task of the journal and hands the
/// ones without a terminal event, with their heads, to [`Journal::repair_live_index`], which
/// rewrites the index only if they sum up to the journal's tail marker.
fn repair_live_index(journal: &Journal) -> Result<LiveRepair> {
    let ids = journal
        .task_ids()
        .collect::<std::result::Result<Vec<_>, _>>()?;
    // A purged task's tombstone is an ended stream, not one to fold (it does not fold).
    let mut kept = Vec::with_capacity(ids.len());
    for id in ids {
        let first = journal.read_stream(&id, 0).next().transpose()?;
        if !first.is_some_and(|r| matches!(r.event, dtask_journal::Event::Purged { .. })) {
            kept.push(id);
        }
    }
    let mut ids = kept;
    let mut live: Vec<(String, Head)> = Vec::new();
    load_tasks_each(
        journal,
        &mut ids,
        |_, task, head| (!task.state.is_terminal()).then_some(head),
        |ids, built| {
            for (id, built) in ids.iter_mut().zip(built) {
                if let Some(Some(head)) = built.take() {
                    live.push((std::mem::take(id), head));
                }
            }
        },
    )?;
    Ok(journal.repair_live_index(&live)?)
}

/// The durable task store.
///
/// Cheap to clone; clones share state. See the module docs for how a command is executed.
///
/// ```
/// use dtask_engine::{Command, CreateRequest, ManualClock, StoreConfig, TaskStore};
/// use dtask_journal::{Journal, JournalOptions, LeasePolicy, TaskSpec};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let journal = Journal::open(dir.path(), JournalOptions::default())?;
/// let store = TaskStore::open(journal, ManualClock::new(1_000), StoreConfig::default())?;
/// let spec = TaskSpec { id: "t1".into(), executor_key: "shell".into(), ..TaskSpec::default() };
/// let task = store
///     .create(CreateRequest { spec, policy: Some(LeasePolicy::Retry), ..Default::default() })
///     .await?;
/// let running = store.execute("t1", task.version, Command::Start).await?;
/// assert_eq!(running.attempt, 1);
/// let done = store
///     .execute("t1", running.version, Command::Complete { data: b"ok".to_vec() })
///     .await?;
/// assert!(done.is_terminal());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct TaskStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for TaskStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskStore")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl TaskStore {
    /// Opens a store over `journal`, folding every live task into memory. Once the fold is
    /// over, it lets the journal release what its open replayed from the write-ahead log
    /// after a crash ([`Journal::release_replayed_log`]).
    ///
    /// The journal may have been appended to since it was opened, but no append may be in
    /// flight while the store opens (the store folds the tasks as they are then).
    ///
    /// The open checks the journal before building on it: the live tasks it folded, with
    /// their heads, must sum up to the journal's tail marker ([`Journal::check_live`]). When
    /// they do not, every stream is folded to find out why: if the streams agree with the
    /// marker, the `live` index is what was damaged, and it is derived from them again
    /// ([`Journal::repair_live_index`]; a `tracing` warning and
    /// [`TaskStore::repaired_live_index`] say what changed); otherwise the open is refused.
    ///
    /// # Errors
    /// [`StoreError::Journal`] when the journal cannot be read or is inconsistent
    /// ([`dtask_journal::Error::Inconsistent`]: `dtask verify` names every problem),
    /// [`StoreError::Replay`] when a live task's stream is damaged or does not fold.
    pub fn open(journal: Journal, clock: impl Clock, config: StoreConfig) -> Result<Self> {
        let clock: Arc<dyn Clock> = Arc::new(clock);
        match Self::recover(&journal)? {
            Ok(index) => Ok(Self::with_index(journal, clock, config, index, None)),
            Err(mismatch) => {
                let repair = repair_live_index(&journal).map_err(|e| match e {
                    // The streams do not agree with the marker either: the first finding
                    // (the live tasks' mismatch) is the one to report.
                    StoreError::Journal(dtask_journal::Error::Inconsistent(_)) => mismatch.into(),
                    e => e,
                })?;
                tracing::warn!(
                    added = ?repair.added,
                    removed = ?repair.removed,
                    "the live index disagreed with the task streams and was derived from them again"
                );
                match Self::recover(&journal)? {
                    Ok(index) => Ok(Self::with_index(
                        journal,
                        clock,
                        config,
                        index,
                        Some(repair),
                    )),
                    Err(mismatch) => Err(mismatch.into()),
                }
            }
        }
    }

    /// Folds every task of the `live` index and checks them against the journal's tail
    /// marker: the index, or the inconsistency found.
    fn recover(journal: &Journal) -> Result<Result<Index, dtask_journal::Error>> {
        let mut index = IndexBuilder::default();
        let mut unreadable = None;
        let listed = journal
            .live_tasks()
            .map_while(|id| id.map_err(|e| unreadable = Some(e)).ok());
        // With the count of live tasks the tail marker keeps, the live tasks are folded as
        // they are listed, and the index's table is sized once from that count (grown chunk
        // by chunk, it would leave the tables it outgrew in the allocator); without it, they
        // are listed first and counted.
        let (live, expected): (Box<dyn Iterator<Item = String>>, usize) =
            if let Some(count) = journal.live_tasks_at_open() {
                let count = usize::try_from(count).unwrap_or(usize::MAX);
                (Box::new(listed), count)
            } else {
                let live: Vec<String> = listed.collect();
                let count = live.len();
                (Box::new(live.into_iter()), count)
            };
        // A damaged marker could claim any count: the table is not sized beyond this.
        index.slots.reserve(expected.min(MAX_SIZED_LIVE_TASKS));
        let mut summary = LiveSummary::default();
        // Each task's slot is built on the fold thread that folded it; the index entries of
        // each chunk of tasks are made here, while later chunks are being folded.
        load_listed_tasks_each(
            journal,
            live,
            expected,
            |_, task, head| {
                let placement = Placement::of(&task.state);
                let key = TaskKey::of(&task.state);
                (Slot::new(task), key, placement, head)
            },
            |ids, built| {
                // The writer need not read these heads again at each live task's first
                // append.
                journal.prime_heads(
                    ids.iter()
                        .zip(built.iter())
                        .filter_map(|(id, built)| built.as_ref().map(|b| (id.as_str(), b.3))),
                );
                for (id, built) in ids.iter().zip(built) {
                    let Some((slot, key, placement, head)) = built.take() else {
                        continue;
                    };
                    summary.add(id, &head);
                    index.add(key, &placement, slot);
                }
            },
        )?;
        if let Some(e) = unreadable {
            return Err(e.into());
        }
        match journal.check_live(&summary) {
            Ok(()) => Ok(Ok(index.build())),
            Err(e @ dtask_journal::Error::Inconsistent(_)) => Ok(Err(e)),
            Err(e) => Err(e.into()),
        }
    }

    fn with_index(
        journal: Journal,
        clock: Arc<dyn Clock>,
        config: StoreConfig,
        index: Index,
        repaired: Option<LiveRepair>,
    ) -> Self {
        tracing::debug!(live = index.slots.len(), "task store opened");
        // The fold is over: what the journal's open replayed from its log after a crash need
        // not stay in memory until the first appends.
        if let Err(error) = journal.release_replayed_log() {
            tracing::warn!(%error, "cannot start the flush of the journal's replayed log");
        }
        // Everything up to the journal's tail at its open is in what the recovery folded.
        let journal_seen = journal.durable_seq();
        Self {
            inner: Arc::new(Inner {
                durable: journal.durable_view(),
                journal,
                clock,
                config,
                counters: Counters::default(),
                seen: AtomicU64::new(journal_seen),
                passed_over: Mutex::new(std::collections::HashSet::new()),
                index: Mutex::new(index),
                outbox: Mutex::new(outbox::Outbox::new()),
                pending_epoch: watch::Sender::new(0),
                repaired,
            }),
        }
    }

    /// What the open repaired in the journal's `live` index (see [`TaskStore::open`]), if it
    /// had to.
    #[must_use]
    pub fn repaired_live_index(&self) -> Option<&LiveRepair> {
        self.inner.repaired.as_ref()
    }

    /// The journal under the store.
    #[must_use]
    pub fn journal(&self) -> &Journal {
        &self.inner.journal
    }

    /// The journal's durable view, for the reads of what the store's callers show.
    pub(crate) fn durable_journal(&self) -> &Journal {
        &self.inner.durable
    }

    /// The store's configuration.
    #[must_use]
    pub fn config(&self) -> &StoreConfig {
        &self.inner.config
    }

    /// The store's clock reading.
    #[must_use]
    pub fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    /// A receiver that changes whenever a task becomes pending in this process (for workers
    /// that want to claim without waiting a poll interval).
    #[must_use]
    pub fn pending_signal(&self) -> watch::Receiver<u64> {
        self.inner.pending_epoch.subscribe()
    }

    fn index(&self) -> MutexGuard<'_, Index> {
        // parking_lot's locks do not poison: a panic while holding this plain map lock leaves
        // the maps consistent (every update is a single insert/remove).
        self.inner.index.lock()
    }

    /// The slot of `id`, folding a task that is not in memory. The id is validated first,
    /// the same way on every path: an empty id is a validation error, never "not found".
    fn slot(&self, id: &str) -> Result<Arc<Slot>> {
        decide::validate_task_id(id, &self.inner.config)?;
        let mut epoch = {
            let index = self.index();
            if let Some(slot) = index.slots.get(id) {
                return Ok(Arc::clone(slot));
            }
            index.cold_epoch(id)
        };
        let mut folds = 0;
        loop {
            folds += 1;
            let task = load_task(&self.inner.journal, id)?
                .ok_or_else(|| StoreError::task_not_found(id))?;
            let mut index = self.index();
            if let Some(slot) = index.slots.get(id) {
                return Ok(Arc::clone(slot));
            }
            // Folded outside the lock: a write made meanwhile through a slot that has since
            // left the index (evicted), or a purge, is not in the fold, which would be kept
            // behind its journal. Folded again when such a thing may have happened.
            if index.cold_epoch(id) != epoch && folds < COLD_FOLDS {
                epoch = index.cold_epoch(id);
                continue;
            }
            // Usually a terminal task; but a task read between its creation's append and its
            // indexing is live, so it is placed by its state like any other.
            let key = TaskKey::of(&task.state);
            index.place(&key, None, &Placement::of(&task.state));
            let slot = Slot::new(task);
            index.slots.insert(key, Arc::clone(&slot));
            index.evict(self.inner.config.terminal_cache);
            return Ok(slot);
        }
    }

    /// Locks `slot`'s task — after settling what a write dropped mid-flight left behind
    /// ([`unsettled`]): the append's outcome awaited, the task refolded from the journal.
    /// Every decision on a task is made under this lock.
    ///
    /// # Errors
    /// The journal's, when the task cannot be refolded.
    async fn lock<'a>(&self, slot: &'a Slot) -> Result<tokio::sync::MutexGuard<'a, Task>> {
        let mut task = slot.task.lock().await;
        if let Some(signal) = slot.unsettled.signal() {
            unsettled::settled(signal).await;
            self.refold(slot, &mut task)?;
            slot.unsettled.clear();
        }
        Ok(task)
    }

    /// Folds the locked `task` of `slot` again from its journal, where it may be ahead of
    /// it: a conflict (another writer advanced the stream), or a write dropped mid-flight.
    fn refold(&self, slot: &Slot, task: &mut Task) -> Result<()> {
        let id = task.state.spec.id.clone();
        let before = Placement::of(&task.state);
        *task =
            load_task(&self.inner.journal, &id)?.ok_or_else(|| StoreError::task_not_found(&id))?;
        self.publish_change(slot, task, &before);
        Ok(())
    }

    /// Appends `events` at the end of `id`'s stream, `position` records long — and each of
    /// `linked` to its own stream, in the same atomic append: the one durable step of every
    /// write. `slots` (at most two: a task's own and a linked one's) hold the tasks the
    /// append advances, which a caller dropped before the outcome leaves unsettled
    /// ([`unsettled`]).
    async fn submit(
        &self,
        slots: &[&Slot],
        id: &str,
        position: u64,
        events: &[Event],
        linked: &[(&str, u64, &[Event])],
    ) -> dtask_journal::Result<dtask_journal::Appended> {
        let pending = self
            .inner
            .journal
            .submit_linked_async(id, position, events, linked)
            .await?;
        debug_assert!(slots.len() <= 2, "a task's own slot and a linked one's");
        let markers = [
            slots.first().map(|s| &s.unsettled),
            slots.get(1).map(|s| &s.unsettled),
        ];
        let outcome = unsettled::InFlight::new(markers, pending).outcome().await;
        if matches!(outcome, Err(dtask_journal::Error::Conflict { .. })) {
            self.count_conflict();
        }
        outcome
    }

    /// [`TaskStore::submit`] of one stream. A conflict (another writer advanced the stream,
    /// or — at position 0 — the task exists) is handed back for the caller to interpret.
    async fn append(
        &self,
        slot: Option<&Slot>,
        id: &str,
        position: u64,
        events: &[Event],
    ) -> Result<Appended> {
        let slots: &[&Slot] = match &slot {
            Some(slot) => std::slice::from_ref(slot),
            None => &[],
        };
        match self.submit(slots, id, position, events, &[]).await {
            Ok(_) => {}
            Err(dtask_journal::Error::Conflict { .. }) => return Ok(Appended::Conflict),
            Err(e) => return Err(e.into()),
        }
        crate::failpoints::point!(crate::failpoints::STORE_AFTER_APPEND, |m| Err(
            crate::failpoints::injected(m)
        ));
        Ok(Appended::Written)
    }

    /// Appends `events` for the locked `task`, then folds them into it: every decided write
    /// of an existing task ends here. A nested task's notification (lifecycle or
    /// application) goes into its parent's mailbox in the same atomic append.
    async fn commit(&self, slot: &Slot, task: &mut Task, events: &[Event]) -> Result<()> {
        let span = tracing::debug_span!(
            "commit",
            task = %task.state.spec.id,
            attempt = task.state.attempt,
            position = task.state.position,
            events = events.len(),
        );
        async {
            if task.state.is_nested() {
                if let Some(notice) = decide::parent_notice(Some(&task.state), events) {
                    return self.commit_with_parent(slot, task, events, notice).await;
                }
            }
            self.commit_one(slot, task, events).await
        }
        .instrument(span)
        .await
    }

    /// What this store did without appending, since it was opened.
    pub fn counts(&self) -> StoreCounts {
        let c = &self.inner.counters;
        StoreCounts {
            updates_deduplicated: c.updates_deduplicated.load(Ordering::Relaxed),
            inputs_deduplicated: c.inputs_deduplicated.load(Ordering::Relaxed),
            version_conflicts: c.version_conflicts.load(Ordering::Relaxed),
            progress_capped: c.progress_capped.load(Ordering::Relaxed),
            updates_over_limit: c.updates_over_limit.load(Ordering::Relaxed),
        }
    }

    fn count_conflict(&self) {
        self.inner
            .counters
            .version_conflicts
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_update_deduplicated(&self) {
        self.inner
            .counters
            .updates_deduplicated
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_progress_capped(&self) {
        self.inner
            .counters
            .progress_capped
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_update_over_limit(&self) {
        self.inner
            .counters
            .updates_over_limit
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_input_deduplicated(&self) {
        self.inner
            .counters
            .inputs_deduplicated
            .fetch_add(1, Ordering::Relaxed);
    }

    /// [`TaskStore::commit`] with a notice for the parent: the parent's slot is locked after
    /// the child's (locks are only ever taken child before parent), the input decided on
    /// the parent's state, and both streams appended at once. When the parent cannot take
    /// it (it ended, or is gone), the child records why and its transition goes ahead — or,
    /// for an application notification ([`decide::ParentNotice::required`]), nothing is
    /// written and the caller hears why.
    async fn commit_with_parent(
        &self,
        slot: &Slot,
        task: &mut Task,
        events: &[Event],
        notice: ParentNotice,
    ) -> Result<()> {
        let now = self.now();
        let parent_slot = match self.slot(&notice.parent) {
            Ok(parent) => Some(parent),
            Err(StoreError::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        let mut parent = match &parent_slot {
            Some(parent) => Some(self.lock(parent).await?),
            None => None,
        };
        let delivery = match parent.as_deref() {
            Some(parent) => match decide::deliver(parent, &notice, now) {
                Ok(Keyed::New(events)) => Ok(events),
                // Delivered before — or another input holds the notice's id.
                Ok(Keyed::Repeat { position, request }) => self
                    .repeated_input(&notice.parent, position, &request)
                    .map(|_| Vec::new()),
                Err(e) => Err(e),
            },
            None => Err(StoreError::NotFound(error::NotFound::Mailbox(
                notice.parent.clone(),
            ))),
        };
        let parent_events = match delivery {
            Ok(parent_events) => parent_events,
            Err(e) if notice.required => return Err(e),
            Err(e) => {
                let mut events = events.to_vec();
                events.push(Event::ParentNotificationFailed {
                    kind: notice.kind,
                    error: e.to_string(),
                    at: now,
                });
                return self.commit_one(slot, task, &events).await;
            }
        };
        let (Some(parent_slot), Some(parent)) = (parent_slot.as_deref(), parent.as_deref_mut())
        else {
            return self.commit_one(slot, task, events).await;
        };
        if parent_events.is_empty() {
            // Delivered before (a replayed notice): nothing more for the parent.
            return self.commit_one(slot, task, events).await;
        }
        self.commit_linked(
            slot,
            task,
            events,
            Some((parent_slot, parent, &parent_events)),
        )
        .await
    }

    /// Appends `events` for `task` — and, when given, `linked` events for another locked
    /// task in the same atomic append — then folds each into its task.
    async fn commit_linked(
        &self,
        slot: &Slot,
        task: &mut Task,
        events: &[Event],
        linked: Option<(&Slot, &mut Task, &[Event])>,
    ) -> Result<()> {
        let Some((other_slot, other, other_events)) = linked else {
            return self.commit_one(slot, task, events).await;
        };
        let id = task.state.spec.id.clone();
        let other_id = other.state.spec.id.clone();
        let before = Placement::of(&task.state);
        let other_before = Placement::of(&other.state);
        let parts = [(other_id.as_str(), other.state.position, other_events)];
        match self
            .submit(
                &[slot, other_slot],
                &id,
                task.state.position,
                events,
                &parts,
            )
            .await
        {
            Ok(_) => {}
            Err(dtask_journal::Error::Conflict { .. }) => {
                // Another writer advanced one of the streams: refold both, report a stale
                // version.
                let expected = task.state.version;
                self.refold(slot, task)?;
                self.refold(other_slot, other)?;
                return Err(StoreError::VersionConflict {
                    expected,
                    actual: task.state.version,
                });
            }
            Err(e) => return Err(e.into()),
        }
        Self::apply_all(task, events)?;
        Self::apply_all(other, other_events)?;
        self.publish_change(slot, task, &before);
        self.publish_change(other_slot, other, &other_before);
        Ok(())
    }

    /// Folds appended `events` into `task`.
    fn apply_all(task: &mut Task, events: &[Event]) -> Result<()> {
        for event in events {
            task.apply(event).map_err(|error| {
                let id = &task.state.spec.id;
                tracing::error!(task = %id, %error, "a decided event does not fold");
                StoreError::Replay(ReplayError::Rejected {
                    task: id.clone(),
                    position: task.state.position,
                    error,
                })
            })?;
        }
        Ok(())
    }

    /// [`TaskStore::commit`] of one stream.
    async fn commit_one(&self, slot: &Slot, task: &mut Task, events: &[Event]) -> Result<()> {
        let before = Placement::of(&task.state);
        if self
            .append(Some(slot), &task.state.spec.id, task.state.position, events)
            .await?
            == Appended::Conflict
        {
            // Another writer advanced the stream (only possible if a task was folded twice
            // concurrently). Refold and report a stale version.
            let expected = task.state.version;
            self.refold(slot, task)?;
            return Err(StoreError::VersionConflict {
                expected,
                actual: task.state.version,
            });
        }
        Self::apply_all(task, events)?;
        self.publish_change(slot, task, &before);
        Ok(())
    }

    fn publish_change(&self, slot: &Slot, task: &Task, before: &Placement) {
        let after = Placement::of(&task.state);
        if after != *before {
            let mut index = self.index();
            index.place(&TaskKey::of(&task.state), Some(before), &after);
            index.evict(self.inner.config.terminal_cache);
        }
        slot.publish(Change {
            version: task.state.version,
            position: task.state.position,
        });
        if after.status == Status::Pending && before.status != Status::Pending {
            self.inner
                .pending_epoch
                .send_modify(|e| *e = e.wrapping_add(1));
        }
    }

    /// Writes down an expired lease of the locked task, if one is due.
    ///
    /// On a shared journal another node may write first — its own expiry of the same lease,
    /// say: the task, folded again, is decided again (at most [`STALE_DECISIONS`] times), so
    /// that losing that race is no error to a read.
    async fn resolve_expiry(&self, slot: &Slot, task: &mut Task, now: Timestamp) -> Result<()> {
        let expired_by = self.inner.config.expired_by(now);
        let mut stale = 0;
        while let Some(events) = decide::expiry(&task.state, expired_by, now, &self.inner.config) {
            crate::failpoints::point!(crate::failpoints::LEASE_EXPIRY, |m| Err(
                crate::failpoints::injected(m)
            ));
            match self.commit(slot, task, &events).await {
                Err(StoreError::VersionConflict { .. })
                    if self.inner.journal.is_shared() && stale < STALE_DECISIONS =>
                {
                    stale += 1;
                }
                other => return other,
            }
        }
        Ok(())
    }

    /// Creates a task: pending, version 1, attempt 0 (T1), with its `task_created`
    /// notification in the same batch when the task has a session.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for a bad spec, [`StoreError::AlreadyExists`] when the id is
    /// taken; nothing is written in either case.
    pub async fn create(&self, request: CreateRequest) -> Result<TaskState> {
        decide::validate_create(&request, &self.inner.config)?;
        let Some(context) = request.parent.clone() else {
            let now = self.now();
            let (id, events) = decide::create(request, String::new(), now, &self.inner.config)?;
            return self.create_stream(id, events, None).await;
        };
        // A nested task: its parent's running attempt is the authority, checked under the
        // parent's lock and recorded in the parent's stream in the same append.
        let parent_slot = match self.slot(&context.task_id) {
            Err(StoreError::NotFound(_)) => {
                return Err(StoreError::NotFound(error::NotFound::Mailbox(
                    context.task_id,
                )))
            }
            other => other?,
        };
        let mut parent = self.lock(&parent_slot).await?;
        let now = self.now();
        self.resolve_expiry(&parent_slot, &mut parent, now).await?;
        let root = decide::inherited_root(&parent.state);
        let (id, events) = decide::create(request, root, now, &self.inner.config)?;
        let mut parent_events = vec![decide::child_authority(&parent, &context, &id, now)?];
        if let Some(notice) = decide::parent_notice(None, &events) {
            match decide::deliver(&parent, &notice, now)? {
                Keyed::New(events) => parent_events.extend(events),
                Keyed::Repeat { position, request } => {
                    self.repeated_input(&context.task_id, position, &request)?;
                }
            }
        }
        self.create_stream(
            id,
            events,
            Some((&parent_slot, &mut parent, &parent_events)),
        )
        .await
    }

    /// Creates a root task and claims its first attempt in **one** atomic append (T1 then T2):
    /// the task is never pending, so no worker takes it; its creator runs attempt 1 (see
    /// `Manager::run_now`). One synced append fewer than `create` then `Start`.
    ///
    /// # Errors
    /// As for [`TaskStore::create`]; [`StoreError::Invalid`] for a nested task (`parent`)
    /// or a deferred one. Nothing is written on error.
    pub async fn create_claimed(&self, request: CreateRequest) -> Result<TaskState> {
        let config = &self.inner.config;
        decide::validate_create(&request, config)?;
        if request.parent.is_some() {
            return Err(StoreError::Invalid {
                field: "parent",
                reason: "a task created claimed is a root task".into(),
            });
        }
        if request.publication != dtask_journal::Publication::OnCreate {
            return Err(StoreError::Invalid {
                field: "publication",
                reason: "a task created claimed is published on create".into(),
            });
        }
        if request.not_before.is_some() {
            return Err(StoreError::Invalid {
                field: "not_before",
                reason: "a task created claimed runs at once".into(),
            });
        }
        let now = self.now();
        let (id, mut events) = decide::create(request, String::new(), now, config)?;
        let mut task = fold_new(&id, &events)?;
        match decide::decide(&task.state, task.state.version, Command::Start, now, config)? {
            Decision::Write(start) => {
                // Folded on from the creation, as a fold of the whole stream would.
                Self::apply_all(&mut task, &start)?;
                events.extend(start);
            }
            Decision::Unchanged => {}
        }
        self.create_folded(id, events, task, None).await
    }

    /// Reruns the finished root task `id` as a new task: created pending from `id`'s creation
    /// record — its spec (under the new id), policy, initial checkpoint, context snapshot and
    /// root session — with a `rerun_of` record naming `id`, while `id`'s stream gets a
    /// `rerun_as` record naming the new task, both in one atomic append. The new task runs
    /// from the start: nothing of `id`'s attempts carries over, and its tool's side effects
    /// happen again (that is what a rerun is for).
    ///
    /// `new_id` names the new task; `None` gives `<id>.rerun-<n>`, `n` counting `id`'s
    /// reruns from 1. Naming a task that is already a rerun of `id` returns it as it is, so
    /// a request repeated after a lost answer reruns once — on a shared journal too, where
    /// this store's copy of `id` may not have seen another node's rerun yet (it folds `id`
    /// again and decides again).
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown task; [`StoreError::IllegalTransition`] while
    /// it has not ended; [`StoreError::Invalid`] for a nested task (its parent reruns it) or a
    /// bad new id; [`StoreError::AlreadyExists`] when the new id is taken by another task.
    /// Nothing is written on error.
    pub async fn rerun(&self, id: &str, new_id: Option<String>) -> Result<TaskState> {
        self.rerun_with(id, new_id, true).await
    }

    /// [`TaskStore::rerun`], carrying the original's creation checkpoint only when
    /// `keep_checkpoint` says so (the new task then starts with none: its first attempt
    /// starts from the beginning even where the original was created with a started
    /// marker, as a hand-off creates a managed tool's task).
    ///
    /// # Errors
    /// As [`TaskStore::rerun`].
    pub async fn rerun_with(
        &self,
        id: &str,
        new_id: Option<String>,
        keep_checkpoint: bool,
    ) -> Result<TaskState> {
        let slot = self.slot(id)?;
        let mut tries = 0;
        loop {
            tries += 1;
            let mut task = self.lock(&slot).await?;
            let now = self.now();
            self.resolve_expiry(&slot, &mut task, now).await?;
            let rerun_id = match &new_id {
                Some(named) if task.state.rerun_as().contains(named) => {
                    drop(task);
                    return self.get(named).await;
                }
                Some(named) => named.clone(),
                None => format!("{id}.rerun-{}", task.state.rerun_as().len() + 1),
            };
            let created = self
                .inner
                .journal
                .read_stream(id, 0)
                .next()
                .transpose()?
                .ok_or_else(|| StoreError::task_not_found(id))?;
            let mut request = decide::rerun(&task.state, created.event, rerun_id)?;
            if !keep_checkpoint {
                request.checkpoint = Vec::new();
            }
            let (rerun_id, mut events) =
                decide::create(request, String::new(), now, &self.inner.config)?;
            events.insert(
                1,
                Event::RerunOf {
                    task: id.to_owned(),
                    at: now,
                },
            );
            let linked = [Event::RerunAs {
                task: rerun_id.clone(),
                at: now,
            }];
            let known = task.state.rerun_as().len();
            match self
                .create_stream(rerun_id, events, Some((&slot, &mut task, &linked)))
                .await
            {
                // On a shared journal this store's copy of the original may be behind:
                // another node reran it (under this id, or under the default one this store
                // computed). Fold it again and decide again — a repeat, or the next default
                // id; an id some other task holds stays taken.
                Err(StoreError::AlreadyExists(taken)) if tries < RERUN_TRIES => {
                    self.refold(&slot, &mut task)?;
                    if task.state.rerun_as().len() == known {
                        return Err(StoreError::AlreadyExists(taken));
                    }
                }
                // The original moved on under another node's write (the store folded it
                // again): decide again.
                Err(StoreError::VersionConflict { .. }) if tries < RERUN_TRIES => {}
                other => return other,
            }
        }
    }

    /// Writes a new task's stream (with, for a nested task, its parent's events in the same
    /// append) and indexes it.
    async fn create_stream(
        &self,
        id: String,
        events: Vec<Event>,
        parent: Option<(&Slot, &mut Task, &[Event])>,
    ) -> Result<TaskState> {
        // Folded before the append, so that a stream that would not fold is never written.
        let task = fold_new(&id, &events)?;
        self.create_folded(id, events, task, parent).await
    }

    /// [`TaskStore::create_stream`] of a stream already folded into `task`.
    async fn create_folded(
        &self,
        id: String,
        events: Vec<Event>,
        task: Task,
        parent: Option<(&Slot, &mut Task, &[Event])>,
    ) -> Result<TaskState> {
        // A task in the index exists. Whether one outside it does (finished and evicted, or
        // written by another node) is the journal's to tell: the append at position 0 below
        // is refused with a conflict when the task has a record, checked where every append
        // is checked — by the writer, or on a shared journal by its writer lock — so the
        // store does not look it up first.
        if self.index().slots.contains_key(id.as_str()) {
            return Err(StoreError::AlreadyExists(id));
        }
        match parent {
            None => {
                // The append and the indexing run in a task of their own: a caller that stops
                // waiting (a dropped future) must not leave a task written and never indexed
                // — never listed, never swept, until something read it by its id.
                let store = self.clone();
                let created = tokio::spawn(async move {
                    if store.append(None, &id, 0, &events).await? == Appended::Conflict {
                        return Err(StoreError::AlreadyExists(id));
                    }
                    Ok(store.index_created(&id, task))
                });
                return match created.await {
                    Ok(outcome) => outcome,
                    Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
                    Err(_) => Err(StoreError::Journal(dtask_journal::Error::Closed)),
                };
            }
            Some((parent_slot, parent, parent_events)) => {
                let before = Placement::of(&parent.state);
                let parts = [(
                    parent.state.spec.id.as_str(),
                    parent.state.position,
                    parent_events,
                )];
                // Should the caller stop waiting during the append, the new task is indexed
                // once the append has settled (the parent's slot is marked unsettled till
                // then): else it was written and never listed.
                let mut orphan = Orphan {
                    store: Some(self.clone()),
                    task: id.clone(),
                    parent: parent.state.spec.id.clone(),
                };
                let appended = self.submit(&[parent_slot], &id, 0, &events, &parts).await;
                orphan.store = None;
                match appended {
                    Ok(_) => {}
                    Err(dtask_journal::Error::Conflict { task, .. }) if task == id => {
                        return Err(StoreError::AlreadyExists(id));
                    }
                    Err(dtask_journal::Error::Conflict { .. }) => {
                        let expected = parent.state.version;
                        self.refold(parent_slot, parent)?;
                        return Err(StoreError::VersionConflict {
                            expected,
                            actual: parent.state.version,
                        });
                    }
                    Err(e) => return Err(e.into()),
                }
                Self::apply_all(parent, parent_events)?;
                self.publish_change(parent_slot, parent, &before);
            }
        }
        Ok(self.index_created(&id, task))
    }

    /// Places `task`, just created under `id`, in the index; its state.
    fn index_created(&self, id: &str, task: Task) -> TaskState {
        let state = task.state.clone();
        {
            let mut index = self.index();
            // A reader may have folded the new task from the journal already (and even run a
            // command on it): its slot is then the authoritative one and stays.
            if !index.slots.contains_key(id) {
                let key = TaskKey::of(&state);
                index.place(&key, None, &Placement::of(&state));
                index.slots.insert(key, Slot::new(task));
            }
        }
        self.inner
            .pending_epoch
            .send_modify(|e| *e = e.wrapping_add(1));
        state
    }

    /// The task's snapshot, resolving an expired lease first (which writes its event).
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown task.
    pub async fn get(&self, id: &str) -> Result<TaskState> {
        let slot = self.slot(id)?;
        let mut task = self.lock(&slot).await?;
        self.resolve_expiry(&slot, &mut task, self.now()).await?;
        Ok(task.state.clone())
    }

    /// The folded task with its indexes (for the runtime and tests).
    ///
    /// # Errors
    /// As for [`TaskStore::get`].
    pub async fn get_task(&self, id: &str) -> Result<Task> {
        let slot = self.slot(id)?;
        let mut task = self.lock(&slot).await?;
        self.resolve_expiry(&slot, &mut task, self.now()).await?;
        Ok(task.clone())
    }

    /// Executes a lifecycle command against the task at `expected_version`.
    ///
    /// # Errors
    /// The command's typed error (see [`StoreError`]); nothing is written on error, except an
    /// expired lease found on the way, which is written down first.
    pub async fn execute(
        &self,
        id: &str,
        expected_version: u64,
        command: Command,
    ) -> Result<TaskState> {
        self.execute_then(id, expected_version, command, TaskState::clone)
            .await
    }

    /// [`TaskStore::execute`], handing the task's new snapshot to `then` under the task's
    /// lock instead of copying it out: for callers that need only part of it (its version).
    pub(crate) async fn execute_then<R>(
        &self,
        id: &str,
        expected_version: u64,
        command: Command,
        then: impl FnOnce(&TaskState) -> R,
    ) -> Result<R> {
        let config = &self.inner.config;
        decide::validate_task_id(id, config)?;
        decide::validate(&command, config)?;
        let slot = self.slot(id)?;
        let mut task = self.lock(&slot).await?;
        let mut command = Redecide::new(command);
        loop {
            let now = self.now();
            self.resolve_expiry(&slot, &mut task, now).await?;
            let this = command.take(self)?;
            match decide::decide(&task.state, expected_version, this, now, config)? {
                Decision::Unchanged => {}
                Decision::Write(events) => match self.commit(&slot, &mut task, &events).await {
                    Err(e) if command.again(&e) => continue,
                    Err(e) => return Err(e),
                    Ok(()) => {
                        if matches!(events.last(), Some(Event::InputsPending { .. })) {
                            return Err(StoreError::InputsPending(Box::new(task.state.clone())));
                        }
                    }
                },
            }
            return Ok(then(&task.state));
        }
    }

    /// Resolves every lease that has expired by now; returns how many were written down.
    ///
    /// A task's own trouble does not stop the sweep (nor the listings that sweep first, nor
    /// the workers that list): a task purged or gone since it was placed leaves the index; a
    /// lease another node resolved first, or a task that does not fold, is skipped (the
    /// latter with a warning).
    ///
    /// # Errors
    /// The first journal error.
    pub async fn sweep_expired(&self) -> Result<usize> {
        let now = self.now();
        let expired_by = self.inner.config.expired_by(now);
        let due: Vec<(Timestamp, TaskKey)> = self
            .index()
            .leases
            .iter()
            .take_while(|(lease, _)| *lease <= expired_by)
            .cloned()
            .collect();
        let mut resolved = 0;
        for (lease, key) in due {
            match self.sweep_one(key.id(), expired_by, now).await {
                Ok(true) => resolved += 1,
                Ok(false) => {}
                Err(StoreError::Purged { .. } | StoreError::NotFound(_)) => {
                    self.index().leases.remove(&(lease, key));
                }
                Err(e @ StoreError::Journal(_)) => return Err(e),
                Err(e) => {
                    tracing::warn!(task = %key.id(), error = %e, "an expired lease not resolved");
                }
            }
        }
        Ok(resolved)
    }

    /// Resolves the expired lease of task `id`, if it is due; whether it was.
    async fn sweep_one(&self, id: &str, expired_by: Timestamp, now: Timestamp) -> Result<bool> {
        let slot = self.slot(id)?;
        let mut task = self.lock(&slot).await?;
        if decide::expiry(&task.state, expired_by, now, &self.inner.config).is_none() {
            return Ok(false);
        }
        self.resolve_expiry(&slot, &mut task, now).await?;
        Ok(true)
    }

    /// Spawns a background sweeper that resolves expired leases every `every` (optional:
    /// expiry is also resolved lazily whenever a task is read or written).
    #[must_use]
    pub fn spawn_sweeper(&self, every: std::time::Duration) -> tokio::task::JoinHandle<()> {
        let store = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                if let Err(error) = store.sweep_expired().await {
                    tracing::warn!(%error, "lease sweep failed");
                }
            }
        })
    }

    /// The ids of a page of `status` tasks of `executor_keys`, the page's size and the keys
    /// sorted and deduplicated (borrowed: a worker lists at every look for work, and only a
    /// page with more after it needs them owned, in its cursor).
    fn list<'k>(
        &self,
        status: Status,
        executor_keys: &'k [String],
        cursor: Option<&str>,
        limit: i64,
    ) -> Result<(Vec<String>, usize, Vec<&'k str>)> {
        if executor_keys.is_empty() || executor_keys.iter().any(String::is_empty) {
            return Err(StoreError::invalid(
                "executor keys",
                "must be non-empty, each key non-empty",
            ));
        }
        let mut keys: Vec<&str> = executor_keys.iter().map(String::as_str).collect();
        keys.sort_unstable();
        keys.dedup();
        let after = match cursor {
            None => None,
            Some(c) => {
                let c: cursor::ListCursor = cursor::decode(c)?;
                if c.v != 1
                    || c.s != status.as_str()
                    || !c.k.iter().map(String::as_str).eq(keys.iter().copied())
                {
                    return Err(StoreError::InvalidCursor(
                        "cursor does not match the status or executor keys".into(),
                    ));
                }
                self.check_cursor_task(&c.l)?;
                Some(c.l)
            }
        };
        let limit = self.inner.config.page(limit);
        let now = self.now();
        let mut index = self.index();
        let set = if status == Status::Pending {
            index.promote_due(now);
            &index.pending
        } else {
            &index.suspended
        };
        let ids = set.page(&keys, after.as_deref(), limit + 1);
        Ok((ids, limit, keys))
    }

    /// The earliest not-before time of a delayed pending task this store holds, if any: when
    /// the next one becomes claimable (a worker wakes for it).
    pub fn next_due(&self) -> Option<Timestamp> {
        self.index().next_due()
    }

    /// A list cursor's last id must name a task (a cursor is only ever made from one).
    fn check_cursor_task(&self, id: &str) -> Result<()> {
        let known = self.index().slots.contains_key(id)
            || (!id.is_empty() && self.inner.journal.stream_len(id)?.is_some());
        if known {
            Ok(())
        } else {
            Err(StoreError::InvalidCursor(format!(
                "the cursor's last id {id:?} names no task"
            )))
        }
    }

    async fn list_status(
        &self,
        status: Status,
        executor_keys: &[String],
        cursor: Option<&str>,
        limit: i64,
    ) -> Result<TaskPage> {
        self.sweep_expired().await?;
        let (ids, limit, keys) = self.list(status, executor_keys, cursor, limit)?;
        let mut tasks = Vec::with_capacity(ids.len().min(limit));
        let mut more = false;
        for id in ids {
            let Ok(slot) = self.slot(&id) else { continue };
            let task = self.lock(&slot).await?;
            if task.state.status != status {
                continue;
            }
            if tasks.len() == limit {
                more = true;
                break;
            }
            tasks.push(task.state.clone());
        }
        let next_cursor = match (more, tasks.last()) {
            (true, Some(last)) => Some(cursor::encode(&cursor::ListCursor {
                v: 1,
                s: status.as_str().to_owned(),
                k: keys.into_iter().map(str::to_owned).collect(),
                l: last.spec.id.clone(),
            })),
            _ => None,
        };
        Ok(TaskPage { tasks, next_cursor })
    }

    /// Lists pending tasks of the given executors in ascending id order, after resolving
    /// expired leases.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for an empty key set or an empty key, [`StoreError::InvalidCursor`]
    /// for a malformed cursor or one of another listing.
    pub async fn list_pending(
        &self,
        executor_keys: &[String],
        cursor: Option<&str>,
        limit: i64,
    ) -> Result<TaskPage> {
        self.list_status(Status::Pending, executor_keys, cursor, limit)
            .await
    }

    /// Lists suspended tasks of the given executors in ascending id order.
    ///
    /// # Errors
    /// As for [`TaskStore::list_pending`].
    pub async fn list_suspended(
        &self,
        executor_keys: &[String],
        cursor: Option<&str>,
        limit: i64,
    ) -> Result<TaskPage> {
        self.list_status(Status::Suspended, executor_keys, cursor, limit)
            .await
    }

    /// Waits until the task's version exceeds `after_version` and returns that snapshot.
    /// Progress updates never satisfy it. Expired leases are resolved at every check.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown task.
    pub async fn wait_for_task_version(&self, id: &str, after_version: u64) -> Result<TaskState> {
        let slot = self.slot(id)?;
        let mut changes = slot.subscribe();
        loop {
            {
                let mut task = self.lock(&slot).await?;
                self.resolve_expiry(&slot, &mut task, self.now()).await?;
                if task.state.version > after_version {
                    return Ok(task.state.clone());
                }
            }
            if changes.changed().await.is_err() {
                return Err(StoreError::Closed);
            }
        }
    }

    /// A receiver of the task's change counters (version and stream length), for progress
    /// readers that follow updates.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown task.
    pub fn watch(&self, id: &str) -> Result<watch::Receiver<Change>> {
        Ok(self.slot(id)?.subscribe())
    }
}

/// Folds the events of a task about to be created (before anything is written, so that a
/// stream that would not fold never is).
fn fold_new(id: &str, events: &[Event]) -> Result<Task> {
    Task::fold(id, events)
        .map_err(|(position, error)| {
            StoreError::Replay(ReplayError::Rejected {
                task: id.to_owned(),
                position,
                error,
            })
        })?
        .ok_or_else(|| StoreError::task_not_found(id))
}

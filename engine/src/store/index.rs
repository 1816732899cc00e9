//! The store's in-memory index of its tasks: the slot of each task held in memory, the
//! ordered sets of pending and suspended tasks, the delayed pending tasks by their
//! not-before time, the lease deadlines and the eviction queue of terminal tasks — each entry a [`TaskKey`], the task's own spec — and the rules that place a
//! task in them, written once for a command's change and a recovery's bulk build.

use super::Slot;
use dtask_journal::{TaskSpec, Timestamp};
use dtask_replay::{Status, TaskState};
use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Where a task sits in the in-memory indexes (derived from its state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Placement {
    pub(super) status: Status,
    pub(super) lease: Option<Timestamp>,
    /// A pending task's not-before time (a delayed run).
    pub(super) not_before: Option<Timestamp>,
}

impl Placement {
    pub(super) fn of(state: &TaskState) -> Self {
        Self {
            status: state.status,
            lease: state.lease_deadline,
            not_before: state.not_before,
        }
    }
}

/// The most live tasks a recovery sizes the index's table for from the tail marker's count
/// before listing them (a journal with more grows it as it lists; a damaged marker cannot
/// make the open reserve more).
pub(super) const MAX_SIZED_LIVE_TASKS: usize = 1 << 20;

/// A task as the in-memory indexes key it: its spec, shared with its folded state, and
/// ordered, compared and hashed by the task id alone (as the id itself would be, so that a
/// lookup by `&str` finds it). An index entry is a pointer to what the task holds anyway,
/// not a copy of its id and executor key.
#[derive(Clone)]
pub(super) struct TaskKey(Arc<TaskSpec>);

impl TaskKey {
    /// The key of the task whose state this is.
    pub(super) fn of(state: &TaskState) -> Self {
        Self(Arc::clone(&state.spec))
    }

    pub(super) fn id(&self) -> &str {
        &self.0.id
    }

    pub(super) fn executor_key(&self) -> &str {
        &self.0.executor_key
    }
}

impl PartialEq for TaskKey {
    fn eq(&self, other: &Self) -> bool {
        self.id() == other.id()
    }
}

impl Eq for TaskKey {}

impl PartialOrd for TaskKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TaskKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.id().cmp(other.id())
    }
}

impl Hash for TaskKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id().hash(state);
    }
}

impl Borrow<str> for TaskKey {
    fn borrow(&self) -> &str {
        self.id()
    }
}

impl std::fmt::Debug for TaskKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TaskKey").field(&self.id()).finish()
    }
}

/// Tasks by executor key, each key's ordered by id: a listing of some executors' tasks
/// walks theirs alone. (One set of every key's, filtered as it was walked, had a worker of
/// one executor walk every pending task of the others at each look for work — under the
/// index's lock, which every commit takes — however few were its own.)
#[derive(Default, Debug, PartialEq, Eq)]
pub(super) struct ByExecutor {
    sets: HashMap<String, BTreeSet<TaskKey>>,
}

impl ByExecutor {
    pub(super) fn insert(&mut self, task: TaskKey) {
        if let Some(set) = self.sets.get_mut(task.executor_key()) {
            set.insert(task);
        } else {
            let key = task.executor_key().to_owned();
            self.sets.insert(key, BTreeSet::from([task]));
        }
    }

    pub(super) fn remove(&mut self, task: &TaskKey) {
        let key = task.executor_key();
        if let Some(set) = self.sets.get_mut(key) {
            set.remove(task.id());
            if set.is_empty() {
                self.sets.remove(key);
            }
        }
    }

    /// Whether the set holds no task.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    /// Whether `task` is in the set.
    #[cfg(test)]
    pub(super) fn contains(&self, task: &TaskKey) -> bool {
        self.sets
            .get(task.executor_key())
            .is_some_and(|set| set.contains(task.id()))
    }

    /// The ids of up to `n` tasks of the executors `keys` after the id `after`, in id order
    /// across the keys: each key's range, merged.
    pub(super) fn page(&self, keys: &[&str], after: Option<&str>, n: usize) -> Vec<String> {
        let lower = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        let mut walks: Vec<_> = keys
            .iter()
            .filter_map(|key| self.sets.get(*key))
            .map(|set| {
                set.range::<str, _>((lower, std::ops::Bound::Unbounded))
                    .peekable()
            })
            .collect();
        let mut ids = Vec::with_capacity(n.min(64));
        while ids.len() < n {
            let next = walks
                .iter_mut()
                .enumerate()
                .filter_map(|(i, walk)| walk.peek().map(|task| (task.id(), i)))
                .min();
            let Some((_, i)) = next else {
                break;
            };
            if let Some(task) = walks[i].next() {
                ids.push(task.id().to_owned());
            }
        }
        ids
    }
}

impl FromIterator<TaskKey> for ByExecutor {
    /// In bulk, as a recovery builds it: each key's tasks gathered, then each set built at
    /// once (sorted, not inserted one by one).
    fn from_iter<I: IntoIterator<Item = TaskKey>>(tasks: I) -> Self {
        let mut by_key: HashMap<String, Vec<TaskKey>> = HashMap::new();
        for task in tasks {
            if let Some(tasks) = by_key.get_mut(task.executor_key()) {
                tasks.push(task);
            } else {
                by_key.insert(task.executor_key().to_owned(), vec![task]);
            }
        }
        Self {
            sets: by_key
                .into_iter()
                .map(|(key, tasks)| (key, tasks.into_iter().collect()))
                .collect(),
        }
    }
}

#[derive(Default)]
pub(super) struct Index {
    pub(super) slots: HashMap<TaskKey, Arc<Slot>>,
    /// Pending tasks by executor key and id: the claimable ones, and the delayed ones
    /// [`Index::promote_due`] moved here once due.
    pub(super) pending: ByExecutor,
    /// Delayed pending tasks by not-before time, until they are due.
    pub(super) delayed: BTreeSet<(Timestamp, TaskKey)>,
    /// Suspended tasks by executor key and id.
    pub(super) suspended: ByExecutor,
    pub(super) leases: BTreeSet<(Timestamp, TaskKey)>,
    pub(super) terminal: VecDeque<TaskKey>,
    /// Counters, by a hash of the task id, that move whenever a task's journal may have
    /// moved on with no slot here to follow it: a slot removed ([`Index::remove`]: evicted,
    /// purged) or a record followed of a task not held ([`Index::moved_cold`]). A task
    /// folded from the journal outside the index's lock across a move of its own counter is
    /// folded again before it is placed (`TaskStore::slot`): its fold may predate a write
    /// made through the slot that left, or a purge. (By id, not one counter for all: every
    /// eviction would otherwise send every cold read in flight back to the journal.)
    cold_epochs: ColdEpochs,
}

/// The counters of [`Index::cold_epoch`], [`COLD_BUCKETS`] of them.
struct ColdEpochs(Box<[u64]>);

impl Default for ColdEpochs {
    fn default() -> Self {
        Self(vec![0; COLD_BUCKETS].into_boxed_slice())
    }
}

/// The buckets of [`Index::cold_epoch`]: two ids share one in this many.
const COLD_BUCKETS: usize = 1024;
const COLD_BUCKETS_U64: u64 = 1024;

fn cold_bucket(id: &str) -> usize {
    use std::hash::{BuildHasher, BuildHasherDefault};
    let hash =
        BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(id);
    usize::try_from(hash % COLD_BUCKETS_U64).unwrap_or(0)
}

/// An entry of the in-memory indexes, as a task's placement makes it.
enum Entry {
    /// In `pending`.
    Pending(TaskKey),
    /// In `delayed`: the not-before time and the task.
    Delayed(Timestamp, TaskKey),
    /// In `suspended`.
    Suspended(TaskKey),
    /// In `terminal` (the eviction queue).
    Terminal(TaskKey),
    /// In `leases`: the lease deadline and the task.
    Lease(Timestamp, TaskKey),
}

impl Entry {
    /// The entries of a task placed at `after`, coming from `before` (`None`: new to the
    /// index). The rules of placement, written once for the live index and a recovery's
    /// bulk build.
    fn each(
        task: &TaskKey,
        before: Option<&Placement>,
        after: &Placement,
        mut add: impl FnMut(Self),
    ) {
        match after.status {
            Status::Pending => add(match after.not_before {
                Some(until) => Self::Delayed(until, task.clone()),
                None => Self::Pending(task.clone()),
            }),
            Status::Suspended => add(Self::Suspended(task.clone())),
            s if s.is_terminal() && before.is_none_or(|b| !b.status.is_terminal()) => {
                add(Self::Terminal(task.clone()));
            }
            _ => {}
        }
        if let Some(lease) = after.lease {
            add(Self::Lease(lease, task.clone()));
        }
    }
}

impl Index {
    pub(super) fn place(&mut self, task: &TaskKey, before: Option<&Placement>, after: &Placement) {
        if let Some(before) = before {
            self.unplace(task, before);
        }
        Entry::each(task, before, after, |entry| match entry {
            Entry::Pending(task) => {
                self.pending.insert(task);
            }
            Entry::Delayed(until, task) => {
                self.delayed.insert((until, task));
            }
            Entry::Suspended(task) => {
                self.suspended.insert(task);
            }
            Entry::Terminal(task) => self.terminal.push_back(task),
            Entry::Lease(lease, task) => {
                self.leases.insert((lease, task));
            }
        });
    }

    /// Takes `task`, placed at `before`, out of the listings and the leases: a task that is
    /// gone (purged by another node while this one still held it running, say).
    pub(super) fn unplace(&mut self, task: &TaskKey, before: &Placement) {
        {
            match before.status {
                Status::Pending => {
                    // A delayed task may have been promoted to `pending` since it was placed.
                    self.pending.remove(task);
                    if let Some(until) = before.not_before {
                        self.delayed.remove(&(until, task.clone()));
                    }
                }
                Status::Suspended => {
                    self.suspended.remove(task);
                }
                _ => {}
            }
            if let Some(lease) = before.lease {
                self.leases.remove(&(lease, task.clone()));
            }
        }
    }

    /// Moves the delayed tasks due at `now` to `pending`, where listings find them. (Their
    /// placement still names the not-before time; [`Index::place`] removes a task from both
    /// sets when it moves on.)
    pub(super) fn promote_due(&mut self, now: Timestamp) {
        while self.delayed.first().is_some_and(|(until, _)| *until <= now) {
            if let Some((_, task)) = self.delayed.pop_first() {
                self.pending.insert(task);
            }
        }
    }

    /// The earliest not-before time of a delayed task, if any.
    pub(super) fn next_due(&self) -> Option<Timestamp> {
        self.delayed.first().map(|(until, _)| *until)
    }

    /// Takes the slot of `id` out of the index (its task evicted or gone).
    pub(super) fn remove(&mut self, id: &str) {
        if self.slots.remove(id).is_some() {
            self.moved_cold(id);
        }
    }

    /// Notes that `id`'s journal may have moved on with no slot here to follow it: a fold of
    /// it under way is made again ([`Index::cold_epoch`]).
    pub(super) fn moved_cold(&mut self, id: &str) {
        if let Some(bucket) = self.cold_epochs.0.get_mut(cold_bucket(id)) {
            *bucket = bucket.wrapping_add(1);
        }
    }

    /// Where `id`'s counter of moves stands (see [`Index::moved_cold`]).
    pub(super) fn cold_epoch(&self, id: &str) -> u64 {
        self.cold_epochs
            .0
            .get(cold_bucket(id))
            .copied()
            .unwrap_or(0)
    }

    pub(super) fn evict(&mut self, cap: usize) {
        let mut busy = Vec::new();
        while self.terminal.len() > cap {
            let Some(task) = self.terminal.pop_front() else {
                break;
            };
            if let Some(slot) = self.slots.get(task.id()) {
                // A task marked unsettled (a write's caller went away with its append in
                // flight) stays until that append has settled: folded again from the journal
                // before the append landed, it would be kept without it — and the mark is
                // what a nested create or a rerun left so waits for before indexing its task.
                // (Settled, it may go: a fold then reads the append.)
                let idle = Arc::strong_count(slot) == 1
                    && slot.unsettled.is_settled()
                    && slot.task.try_lock().is_ok_and(|t| t.state.is_terminal());
                if idle {
                    self.remove(task.id());
                } else {
                    // In use: keep it queued so a later eviction gets it.
                    busy.push(task);
                }
            }
        }
        self.terminal.extend(busy);
    }
}

/// A recovery's [`Index`], built in bulk: each folded task's entries ([`Entry::each`]) are
/// collected as the tasks come and sorted into the ordered indexes once at the end —
/// inserting them one by one into B-trees took ~3 % of a recovery's instructions, on the
/// thread that also lists the live tasks.
#[derive(Default)]
pub(super) struct IndexBuilder {
    pub(super) slots: HashMap<TaskKey, Arc<Slot>>,
    pending: Vec<TaskKey>,
    delayed: Vec<(Timestamp, TaskKey)>,
    suspended: Vec<TaskKey>,
    leases: Vec<(Timestamp, TaskKey)>,
    terminal: VecDeque<TaskKey>,
}

impl IndexBuilder {
    /// Adds a task new to the index, placed at `placement`.
    pub(super) fn add(&mut self, task: TaskKey, placement: &Placement, slot: Arc<Slot>) {
        Entry::each(&task, None, placement, |entry| match entry {
            Entry::Pending(task) => self.pending.push(task),
            Entry::Delayed(until, task) => self.delayed.push((until, task)),
            Entry::Suspended(task) => self.suspended.push(task),
            Entry::Terminal(task) => self.terminal.push_back(task),
            Entry::Lease(lease, task) => self.leases.push((lease, task)),
        });
        self.slots.insert(task, slot);
    }

    /// The index (each id is added once, so no entry is lost to a duplicate key).
    pub(super) fn build(self) -> Index {
        Index {
            slots: self.slots,
            pending: self.pending.into_iter().collect(),
            delayed: self.delayed.into_iter().collect(),
            suspended: self.suspended.into_iter().collect(),
            leases: self.leases.into_iter().collect(),
            terminal: self.terminal,
            cold_epochs: ColdEpochs::default(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::{fold_new, Slot};
    use super::*;
    use dtask_journal::{Event, LeasePolicy, TaskSpec};

    /// Every entry of the index is the task's own spec (a pointer, not a copy), found by
    /// the task id; a placement moves it from one index to the next.
    #[test]
    fn index_entries_point_at_the_tasks_spec() {
        let created = Event::created(TaskSpec::new("a", "key"), LeasePolicy::Retry, Timestamp(1));
        let task = fold_new("a", &[created]).unwrap();
        let spec = &task.state.spec;
        let pending = Placement {
            status: Status::Pending,
            lease: None,
            not_before: None,
        };
        let mut index = Index::default();
        index.place(&TaskKey::of(&task.state), None, &pending);
        index
            .slots
            .insert(TaskKey::of(&task.state), Slot::new(task.clone()));
        let entry = index.pending.sets["key"].first().unwrap();
        assert!(Arc::ptr_eq(&entry.0, spec));
        assert_eq!((entry.id(), entry.executor_key()), ("a", "key"));
        assert!(index.slots.contains_key("a") && index.pending.contains(&TaskKey::of(&task.state)));
        let running = Placement {
            status: Status::Running,
            lease: Some(Timestamp(5)),
            not_before: None,
        };
        index.place(&TaskKey::of(&task.state), Some(&pending), &running);
        assert!(index.pending.is_empty());
        let (lease, entry) = index.leases.first().unwrap();
        assert_eq!(*lease, Timestamp(5));
        assert!(Arc::ptr_eq(&entry.0, spec));
        let done = Placement {
            status: Status::Completed,
            lease: None,
            not_before: None,
        };
        index.place(&TaskKey::of(&task.state), Some(&running), &done);
        assert!(index.leases.is_empty());
        assert!(Arc::ptr_eq(&index.terminal[0].0, spec));
    }

    /// A delayed pending task waits in `delayed` until due, is moved to `pending` then, and
    /// leaves both when it moves on.
    #[test]
    fn a_delayed_task_is_listed_once_due_and_leaves_both_sets_when_claimed() {
        let created = Event::created(TaskSpec::new("d", "key"), LeasePolicy::Retry, Timestamp(1));
        let task = fold_new("d", &[created]).unwrap();
        let key = TaskKey::of(&task.state);
        let delayed = Placement {
            status: Status::Pending,
            lease: None,
            not_before: Some(Timestamp(50)),
        };
        let mut index = Index::default();
        index.place(&key, None, &delayed);
        assert!(index.pending.is_empty());
        assert_eq!(index.next_due(), Some(Timestamp(50)));
        index.promote_due(Timestamp(49));
        assert!(index.pending.is_empty(), "not due yet");
        index.promote_due(Timestamp(50));
        assert!(index.pending.contains(&key) && index.delayed.is_empty());
        assert_eq!(index.next_due(), None);
        let running = Placement {
            status: Status::Running,
            lease: Some(Timestamp(80)),
            not_before: None,
        };
        index.place(&key, Some(&delayed), &running);
        assert!(index.pending.is_empty() && index.delayed.is_empty());
        // Claimed before it was promoted (a listing that never ran): gone from `delayed`.
        index.place(&key, Some(&running), &delayed);
        index.place(&key, Some(&delayed), &running);
        assert!(index.pending.is_empty() && index.delayed.is_empty());
    }

    proptest::proptest! {
        /// A page of some executors' tasks is what walking every task in id order and keeping
        /// theirs gives (the listing before the sets were kept by executor), from any id on
        /// and of any size; removing tasks takes them out of later pages.
        #[test]
        fn a_page_of_some_executors_is_the_filtered_walk_of_all(
            tasks in proptest::collection::btree_map(0u16..500, 0u8..4, 0..80),
            wanted in proptest::collection::vec(0u8..5, 1..4),
            after in proptest::option::of(0u16..500),
            n in 0usize..20,
            removed in proptest::collection::vec(proptest::num::usize::ANY, 0..20),
        ) {
            let key_of = |k: u8| format!("key-{k}");
            let keys_owned: Vec<String> = wanted.iter().map(|k| key_of(*k)).collect();
            let mut keys: Vec<&str> = keys_owned.iter().map(String::as_str).collect();
            keys.sort_unstable();
            keys.dedup();
            let entries: Vec<TaskKey> = tasks
                .iter()
                .map(|(id, k)| {
                    let spec = TaskSpec::new(format!("t{id:04}"), key_of(*k));
                    let created = Event::created(spec, LeasePolicy::Retry, Timestamp(1));
                    TaskKey::of(&fold_new(&format!("t{id:04}"), &[created]).unwrap().state)
                })
                .collect();
            let mut set: ByExecutor = entries.iter().cloned().collect();
            // Tasks of the set, by index: every removal takes one out (or one out again).
            let removed: Vec<String> = if entries.is_empty() {
                Vec::new()
            } else {
                removed.iter().map(|i| entries[i % entries.len()].id().to_owned()).collect()
            };
            for id in &removed {
                if let Some(task) = entries.iter().find(|t| t.id() == id) {
                    set.remove(task);
                }
            }
            let after = after.map(|id| format!("t{id:04}"));
            let expected: Vec<String> = entries
                .iter()
                .filter(|t| !removed.iter().any(|id| t.id() == id))
                .filter(|t| after.as_deref().is_none_or(|a| t.id() > a))
                .filter(|t| keys.contains(&t.executor_key()))
                .map(|t| t.id().to_owned())
                .take(n)
                .collect();
            proptest::prop_assert_eq!(set.page(&keys, after.as_deref(), n), expected);
            let emptied = set.sets.values().any(BTreeSet::is_empty);
            proptest::prop_assert!(!emptied, "an emptied key's set goes");
        }

        /// A recovery's bulk-built index holds exactly the entries that placing each task
        /// one by one makes, whatever the order the tasks come in and their placements.
        #[test]
        fn the_bulk_built_index_equals_the_one_placed_task_by_task(
            tasks in proptest::collection::vec(
                (0u8..7, proptest::option::of(0u64..4), proptest::option::of(0u64..4)),
                0..64,
            ),
        ) {
            let mut placed = Index::default();
            let mut built = IndexBuilder::default();
            for (i, (status, lease, not_before)) in tasks.iter().enumerate() {
                // Ids out of order, so that the bulk build has something to sort.
                let id = format!("task-{:03}", (i * 37) % 101);
                let key = format!("key-{}", i % 3);
                let placement = Placement {
                    status: Status::ALL[usize::from(*status)],
                    lease: lease.map(Timestamp),
                    not_before: not_before.map(Timestamp),
                };
                let spec = TaskSpec::new(id.clone(), key.clone());
                let created = Event::created(spec, LeasePolicy::Retry, Timestamp(1));
                let task = fold_new(&id, &[created]).unwrap();
                let task_key = TaskKey::of(&task.state);
                placed.place(&task_key, None, &placement);
                placed.slots.insert(task_key.clone(), Slot::new(task.clone()));
                built.add(task_key, &placement, Slot::new(task));
            }
            let built = built.build();
            proptest::prop_assert_eq!(&built.pending, &placed.pending);
            proptest::prop_assert_eq!(&built.delayed, &placed.delayed);
            proptest::prop_assert_eq!(&built.suspended, &placed.suspended);
            proptest::prop_assert_eq!(&built.leases, &placed.leases);
            proptest::prop_assert_eq!(&built.terminal, &placed.terminal);
            let mut ids: Vec<_> = built.slots.keys().collect();
            let mut expected: Vec<_> = placed.slots.keys().collect();
            ids.sort();
            expected.sort();
            proptest::prop_assert_eq!(ids, expected);
        }
    }
}

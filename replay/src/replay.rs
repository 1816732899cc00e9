//! Replaying a task's stream from the journal through a [`Replay`] implementation.
//!
//! One driver ([`replay_task`], over records already being read: `replay_records`) feeds
//! every consumer of a stream: the strict state fold of recovery ([`TaskFold`]), the
//! damage-tolerant view of inspection ([`FoldView`]), and the audit's per-task checker, which
//! builds on the view. A consumer says what damage means to it ([`Replay::damaged`]); the
//! driver does the rest the same way for all.

use crate::fold::{FoldError, Task};
use crate::parallel;
use dtask_journal::{CorruptionKind, Head, Journal, RawStream, Record, StreamScanner};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Something that consumes a task's records in stream order: the state fold used by recovery,
/// the audit's checker, a test's model. Each sees the same verified records.
pub trait Replay {
    /// The error a record can cause.
    type Error;

    /// Consumes the next record of the stream.
    ///
    /// # Errors
    /// Whatever the implementation finds wrong with the record; replay stops there.
    fn replay(&mut self, record: &Record) -> Result<(), Self::Error>;

    /// [`Replay::replay`] taking the record, for a consumer that keeps parts of it (the
    /// driver hands each record over this way). The default borrows it.
    ///
    /// # Errors
    /// As [`Replay::replay`].
    fn replay_owned(&mut self, record: Record) -> Result<(), Self::Error> {
        self.replay(&record)
    }

    /// A record at `position` is damaged (it does not verify, or is missing). Returns whether
    /// the replay goes on: a damage-tolerant replay notes the damage and returns `true`; the
    /// default, `false`, ends the replay with the damage as its error.
    fn damaged(&mut self, position: u64, kind: &CorruptionKind) -> bool {
        let _ = (position, kind);
        false
    }
}

/// Errors of replaying a stream.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError<E = FoldError> {
    /// The journal could not be read, or a record is damaged.
    #[error(transparent)]
    Journal(#[from] dtask_journal::Error),
    /// A fold thread panicked (a bug): the tasks it was folding have no result.
    #[error("a fold thread panicked")]
    FoldThreadPanicked,
    /// A record was rejected by the replay.
    #[error("task {task:?} at position {position}: {error}")]
    Rejected {
        /// The task.
        task: String,
        /// The position of the rejected record.
        position: u64,
        /// Why.
        error: E,
    },
}

/// The state fold as a [`Replay`]: builds a [`Task`] from the records of one task's stream.
#[derive(Debug)]
pub struct TaskFold<'a> {
    /// The stream's task: its `created` record must name it.
    id: &'a str,
    task: Option<Task>,
}

impl<'a> TaskFold<'a> {
    /// An empty fold of `id`'s stream.
    #[must_use]
    pub fn new(id: &'a str) -> Self {
        Self { id, task: None }
    }

    /// The folded task (`None` when no record was replayed).
    #[must_use]
    pub fn finish(self) -> Option<Task> {
        self.task
    }
}

impl Replay for TaskFold<'_> {
    type Error = FoldError;

    fn replay(&mut self, record: &Record) -> Result<(), FoldError> {
        self.replay_owned(record.clone())
    }

    fn replay_owned(&mut self, record: Record) -> Result<(), FoldError> {
        self.replay_then(record, |_| {})
    }
}

impl TaskFold<'_> {
    /// [`Replay::replay_owned`], then `read` with every record the fold only read (each one
    /// after the first, whose event becomes the task): a bulk fold hands those back to
    /// their stream to reuse their buffers.
    #[inline]
    fn replay_then(
        &mut self,
        mut record: Record,
        read: impl FnOnce(&mut Record),
    ) -> Result<(), FoldError> {
        match self.task.as_mut() {
            None => {
                self.task = Some(Task::from_created(self.id, record.event)?);
                Ok(())
            }
            Some(task) => {
                task.apply(&record.event)?;
                read(&mut record);
                Ok(())
            }
        }
    }
}

/// Replays `task`'s records at positions below `until` (all when `None`) into `replay`.
///
/// # Errors
/// [`ReplayError::Journal`] for a damaged or unreadable record, [`ReplayError::Rejected`] when
/// `replay` rejects one.
pub fn replay_task<R: Replay>(
    journal: &Journal,
    task: &str,
    until: Option<u64>,
    replay: &mut R,
) -> Result<(), ReplayError<R::Error>> {
    replay_records(task, journal.read_stream(task, 0), until, replay)
}

/// [`replay_task`] over records already being read: the one driver of every [`Replay`].
pub(crate) fn replay_records<R: Replay>(
    task: &str,
    records: impl Iterator<Item = dtask_journal::Result<Record>>,
    until: Option<u64>,
    replay: &mut R,
) -> Result<(), ReplayError<R::Error>> {
    for record in records {
        let record = match record {
            Ok(record) => record,
            // Damage past the replay's end is not the replay's business.
            Err(dtask_journal::Error::Corruption { position, .. })
                if until.is_some_and(|end| position >= end) =>
            {
                break
            }
            Err(dtask_journal::Error::Corruption {
                position, ref kind, ..
            }) if replay.damaged(position, kind) => continue,
            Err(e) => return Err(e.into()),
        };
        if until.is_some_and(|end| record.position >= end) {
            break;
        }
        let position = record.position;
        replay
            .replay_owned(record)
            .map_err(|error| ReplayError::Rejected {
                task: task.to_owned(),
                position,
                error,
            })?;
    }
    Ok(())
}

/// The outcome of a replay that never rejects a record: only the journal can fail it.
pub(crate) fn tolerant(
    outcome: Result<(), ReplayError<Infallible>>,
) -> Result<(), dtask_journal::Error> {
    match outcome {
        Ok(()) => Ok(()),
        Err(ReplayError::Journal(e)) => Err(e),
        Err(ReplayError::Rejected { error, .. }) => match error {},
        Err(ReplayError::FoldThreadPanicked) => {
            Err(dtask_journal::Error::storage("a fold thread panicked"))
        }
    }
}

/// A task folded for inspection, tolerating damage: the fold goes up to the first damaged or
/// illegal record and keeps what stopped it, while every intact record is still counted.
/// A [`Replay`] that never fails, so a damaged journal can be shown and audited.
///
/// ```
/// use dtask_journal::{Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp};
/// use dtask_replay::{FoldView, Status};
/// let dir = tempfile::tempdir()?;
/// let journal = Journal::open(dir.path(), JournalOptions::default())?;
/// let spec = TaskSpec { id: "t".into(), executor_key: "x".into(), ..TaskSpec::default() };
/// journal.append("t", 0, &[Event::Created {
///     spec: spec.into(), policy: LeasePolicy::Retry, checkpoint: vec![], context_snapshot: vec![], at: Timestamp(1),
/// }])?;
/// let view = FoldView::read(&journal, "t", |_| {})?;
/// assert_eq!(view.task.as_ref().map(|t| t.state.status), Some(Status::Pending));
/// assert_eq!((view.records, view.has_problems()), (1, false));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Default)]
pub struct FoldView {
    /// The stream's task.
    id: String,
    /// The task as far as it folds.
    pub task: Option<Task>,
    /// Intact records read.
    pub records: u64,
    /// Bytes of the intact records read.
    pub bytes: u64,
    /// Damaged records, in stream order: position and what is wrong.
    pub damage: Vec<(u64, CorruptionKind)>,
    /// The first record that could not follow the state before it, and why.
    pub illegal: Option<(u64, FoldError)>,
    /// The stream is a purged task's tombstone: how many records were deleted and when it
    /// was purged. `task` is `None` then, and nothing is wrong.
    pub purged: Option<(u64, dtask_journal::Timestamp)>,
}

impl FoldView {
    /// An empty view of `id`'s stream.
    #[must_use]
    pub fn new(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            ..Self::default()
        }
    }

    /// Reads and folds `task`'s stream, handing every intact record to `on_record`.
    ///
    /// # Errors
    /// Journal errors other than damage (I/O); damage is in the view.
    pub fn read(
        journal: &Journal,
        task: &str,
        on_record: impl FnMut(&Record),
    ) -> Result<Self, dtask_journal::Error> {
        Self::fold(task, journal.read_stream(task, 0), on_record)
    }

    /// Folds `records`, `task`'s stream being read, handing every intact record to
    /// `on_record`: the one body of [`FoldView::read`] and [`FoldViews`].
    fn fold(
        task: &str,
        records: impl Iterator<Item = dtask_journal::Result<Record>>,
        mut on_record: impl FnMut(&Record),
    ) -> Result<Self, dtask_journal::Error> {
        struct Observed<'a, F> {
            view: FoldView,
            on_record: &'a mut F,
        }
        impl<F: FnMut(&Record)> Replay for Observed<'_, F> {
            type Error = Infallible;
            fn replay(&mut self, record: &Record) -> Result<(), Infallible> {
                (self.on_record)(record);
                self.view.replay(record)
            }
            fn damaged(&mut self, position: u64, kind: &CorruptionKind) -> bool {
                self.view.damaged(position, kind)
            }
        }
        let mut observed = Observed {
            view: Self::new(task),
            on_record: &mut on_record,
        };
        tolerant(replay_records(task, records, None, &mut observed))?;
        Ok(observed.view)
    }

    /// Whether the fold still goes on: no damaged or illegal record so far.
    #[must_use]
    pub fn is_folding(&self) -> bool {
        self.damage.is_empty() && self.illegal.is_none()
    }

    /// Whether anything is wrong with the stream.
    #[must_use]
    pub fn has_problems(&self) -> bool {
        !self.is_folding()
    }

    /// The stream's task.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether the stream has any record, intact or damaged.
    #[must_use]
    pub fn exists(&self) -> bool {
        self.records > 0 || !self.damage.is_empty()
    }

    /// The problems, one line each, in stream order of the damage, then the illegal record.
    #[must_use]
    pub fn problems(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .damage
            .iter()
            .map(|(p, kind)| format!("position {p}: {kind}"))
            .collect();
        if let Some((p, e)) = &self.illegal {
            out.push(format!("position {p}: illegal: {e}"));
        }
        out
    }
}

impl Replay for FoldView {
    type Error = Infallible;

    fn replay(&mut self, record: &Record) -> Result<(), Infallible> {
        self.records += 1;
        self.bytes += record.size as u64;
        if self.is_folding() {
            let applied = match self.task.as_mut() {
                None if self.purged.is_some() => {
                    Err(FoldError::AfterTerminal(record.event.event_type()))
                }
                None => match &record.event {
                    dtask_journal::Event::Purged { records, at, .. } => {
                        self.purged = Some((*records, *at));
                        Ok(())
                    }
                    event => Task::created(&self.id, event).map(|t| self.task = Some(t)),
                },
                Some(t) => t.apply(&record.event),
            };
            if let Err(e) = applied {
                self.illegal = Some((record.position, e));
            }
        }
        Ok(())
    }

    fn damaged(&mut self, position: u64, kind: &CorruptionKind) -> bool {
        self.damage.push((position, kind.clone()));
        true
    }
}

/// Every task's [`FoldView`], in task-id order, read in one forward pass over the journal: what
/// listings and counts of the whole journal fold (`dtask tasks`, `dtask stats`, the server's
/// counts). Each view is the one [`FoldView::read`] makes of the task, damage and all, but the
/// streams come from one [`StreamScanner`] pass (on PostgreSQL, pages of records rather than
/// queries per task). A key that names no task is an error, as [`Journal::task_ids`] reports
/// it, and the listing goes on after it.
///
/// ```
/// use dtask_journal::{Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp};
/// use dtask_replay::{FoldViews, Status};
/// let dir = tempfile::tempdir()?;
/// let journal = Journal::open(dir.path(), JournalOptions::default())?;
/// for id in ["a", "b", "c"] {
///     let spec = TaskSpec { id: id.into(), executor_key: "x".into(), ..TaskSpec::default() };
///     journal.append(id, 0, &[Event::Created {
///         spec: spec.into(), policy: LeasePolicy::Retry, checkpoint: vec![], context_snapshot: vec![],
///         at: Timestamp(1),
///     }])?;
/// }
/// let mut views = FoldViews::new(&journal, Some("a"));
/// let mut seen = Vec::new();
/// while let Some(view) = views.next_with(|_| {}) {
///     let view = view?;
///     seen.push((view.id().to_owned(), view.task.map(|t| t.state.status)));
/// }
/// assert_eq!(seen, [("b".into(), Some(Status::Pending)), ("c".into(), Some(Status::Pending))]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct FoldViews<'a> {
    scanner: StreamScanner<'a>,
}

impl std::fmt::Debug for FoldViews<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FoldViews").finish_non_exhaustive()
    }
}

impl<'a> FoldViews<'a> {
    /// The views of every task after `after` (every task when `None`), as this process's
    /// readers see them ([`Journal::visible_stream_scanner`]: of a journal open for writing,
    /// up to its durable watermark — a task all of whose records are above it comes as a view
    /// that does not [exist](FoldView::exists)).
    #[must_use]
    pub fn new(journal: &'a Journal, after: Option<&str>) -> Self {
        let mut scanner = journal.visible_stream_scanner();
        if let Some(after) = after {
            scanner.skip_past(after);
        }
        Self { scanner }
    }

    /// The next task's view, each of its intact records handed to `on_record` first; `None`
    /// after the last task.
    ///
    /// # Errors
    /// A key that names no task (the next call goes on after it); a storage error.
    pub fn next_with(
        &mut self,
        on_record: impl FnMut(&Record),
    ) -> Option<Result<FoldView, dtask_journal::Error>> {
        let mut raw = RawStream::default();
        if !self.scanner.read_next(&mut raw) {
            return None;
        }
        if let Some(error) = raw.take_error_of_empty() {
            return Some(Err(error));
        }
        let task = raw.task().to_owned();
        Some(FoldView::fold(&task, raw.into_records(), on_record))
    }
}

impl Iterator for FoldViews<'_> {
    type Item = Result<FoldView, dtask_journal::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_with(|_| {})
    }
}

/// Folds `task` from the journal; `None` for an unknown task.
///
/// # Errors
/// As for [`replay_task`].
pub fn load_task(journal: &Journal, task: &str) -> Result<Option<Task>, ReplayError> {
    let mut fold = TaskFold::new(task);
    replay_task(journal, task, None, &mut fold)?;
    Ok(fold.finish())
}

/// Tasks folded per thread at least; fewer are folded on the calling thread.
const PARALLEL_MIN_TASKS: usize = 256;

/// Tasks a fold thread takes at a time. The threads take chunks in id order as they finish
/// the last, so that a thread whose tasks happen to be cheap does not sit idle while another
/// still folds; each chunk costs its thread one seek.
const CHUNK_TASKS: usize = 512;

/// Folds many tasks — [`load_task`] for each of `tasks`, with the same results in the same
/// order — reading their streams in forward passes ([`Journal::stream_scanner`]) on up to as
/// many threads as the machine has cores. Tasks in ascending id order read fastest (the
/// `live` index lists them so).
///
/// # Errors
/// The error [`load_task`] gives for the first task (in the order given) that fails.
pub fn load_tasks(journal: &Journal, tasks: &[String]) -> Result<Vec<Option<Task>>, ReplayError> {
    load_tasks_with(journal, tasks, |_, task, _| task)
}

/// [`load_tasks`], with `build` applied to each folded task on the fold thread that folded
/// it (so a caller's per-task setup runs in parallel too); `build` gets the task's id and its
/// head as read (for [`Journal::prime_heads`]).
///
/// # Errors
/// As for [`load_tasks`].
pub fn load_tasks_with<T, F>(
    journal: &Journal,
    tasks: &[String],
    build: F,
) -> Result<Vec<Option<T>>, ReplayError>
where
    T: Send,
    F: Fn(&str, Task, Head) -> T + Sync,
{
    let mut folded: Vec<Option<T>> = std::iter::repeat_with(|| None).take(tasks.len()).collect();
    let (threads, chunk) = plan(tasks.len());
    let chunks = tasks.chunks(chunk).zip(folded.chunks_mut(chunk));
    fold_chunks(journal, threads, chunks, &build, |_, _| {})?;
    Ok(folded)
}

/// [`load_tasks_with`], each chunk of tasks handed with its results to `consume` on the
/// calling thread, in order, as soon as it is folded, while later chunks are still being
/// folded: the caller may take the ids and the results out of the slices (`std::mem::take`,
/// `Option::take`). A store's open makes its index there, so that indexing does not wait for
/// the whole fold.
///
/// ```
/// use dtask_journal::{Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp};
/// let dir = tempfile::tempdir()?;
/// let journal = Journal::open(dir.path(), JournalOptions::default())?;
/// for id in ["a", "b"] {
///     let spec = TaskSpec { id: id.into(), executor_key: "x".into(), ..TaskSpec::default() };
///     let created = Event::Created {
///         spec: spec.into(), policy: LeasePolicy::Retry, checkpoint: vec![], context_snapshot: vec![], at: Timestamp(1),
///     };
///     journal.append(id, 0, &[created])?;
/// }
/// let mut ids: Vec<String> = journal.live_tasks().collect::<Result<_, _>>()?;
/// let mut seen = Vec::new();
/// dtask_replay::load_tasks_each(
///     &journal,
///     &mut ids,
///     |_, task, head| (task.state.version, head.next_position),
///     |ids, folded| {
///         for (id, folded) in ids.iter_mut().zip(folded) {
///             seen.push((std::mem::take(id), folded.take()));
///         }
///     },
/// )?;
/// assert_eq!(seen, [("a".to_owned(), Some((1, 1))), ("b".to_owned(), Some((1, 1)))]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As for [`load_tasks`]; `consume` has then seen the chunks before the failing one.
pub fn load_tasks_each<T, F, C>(
    journal: &Journal,
    tasks: &mut [String],
    build: F,
    consume: C,
) -> Result<(), ReplayError>
where
    T: Send,
    F: Fn(&str, Task, Head) -> T + Sync,
    C: FnMut(&mut [String], &mut [Option<T>]),
{
    let mut folded: Vec<Option<T>> = std::iter::repeat_with(|| None).take(tasks.len()).collect();
    let (threads, chunk) = plan(tasks.len());
    let chunks = tasks.chunks_mut(chunk).zip(folded.chunks_mut(chunk));
    fold_chunks(journal, threads, chunks, &build, consume)
}

/// [`load_tasks_each`] over tasks as they are listed: the calling thread takes `tasks` a
/// chunk at a time (a few chunks ahead of the fold threads), so the fold begins with the
/// first chunk instead of after the whole list, and a recovery's listing of its live tasks
/// no longer precedes the fold. `expected` (how many tasks `tasks` is expected to yield)
/// plans the threads and the chunk size as [`load_tasks_each`] plans them for that many; a
/// wrong guess costs speed, never results. Each chunk's ids and result slots are made and
/// freed on the calling thread.
///
/// ```
/// use dtask_journal::{Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp};
/// let dir = tempfile::tempdir()?;
/// let journal = Journal::open(dir.path(), JournalOptions::default())?;
/// for id in ["a", "b"] {
///     let spec = TaskSpec { id: id.into(), executor_key: "x".into(), ..TaskSpec::default() };
///     let created = Event::Created {
///         spec: spec.into(), policy: LeasePolicy::Retry, checkpoint: vec![], context_snapshot: vec![], at: Timestamp(1),
///     };
///     journal.append(id, 0, &[created])?;
/// }
/// let listed = journal.live_tasks().map_while(Result::ok);
/// let mut seen = Vec::new();
/// dtask_replay::load_listed_tasks_each(
///     &journal,
///     listed,
///     2,
///     |_, task, head| (task.state.version, head.next_position),
///     |ids, folded| {
///         for (id, folded) in ids.iter_mut().zip(folded) {
///             seen.push((std::mem::take(id), folded.take()));
///         }
///     },
/// )?;
/// assert_eq!(seen, [("a".to_owned(), Some((1, 1))), ("b".to_owned(), Some((1, 1)))]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As for [`load_tasks_each`]; no more of `tasks` is taken after the failing chunk.
pub fn load_listed_tasks_each<T, F, C>(
    journal: &Journal,
    tasks: impl Iterator<Item = String>,
    expected: usize,
    build: F,
    mut consume: C,
) -> Result<(), ReplayError>
where
    T: Send,
    F: Fn(&str, Task, Head) -> T + Sync,
    C: FnMut(&mut [String], &mut [Option<T>]),
{
    let (threads, chunk) = plan(expected);
    let mut tasks = tasks.fuse();
    let chunks = std::iter::from_fn(move || {
        let mut ids = Vec::with_capacity(chunk);
        ids.extend(tasks.by_ref().take(chunk));
        if ids.is_empty() {
            return None;
        }
        let slots: Vec<Option<T>> = std::iter::repeat_with(|| None).take(ids.len()).collect();
        Some((ids, slots))
    });
    fold_chunks(journal, threads, chunks, &build, |mut ids, mut slots| {
        consume(&mut ids, &mut slots);
    })
}

/// How many threads fold `tasks` tasks, and how many tasks each takes at a time.
fn plan(tasks: usize) -> (usize, usize) {
    let threads = parallel::threads_for(tasks, PARALLEL_MIN_TASKS);
    (threads, tasks.div_ceil(threads).clamp(1, CHUNK_TASKS))
}

/// Folds each task of `chunks` into the chunk's result slots on `threads` threads (the
/// calling thread alone when 1), and hands each chunk with its results to `consume` on the
/// calling thread, in chunk order. The first error, in chunk order, ends it: later chunks are
/// not folded, nor handed over. The results go straight into the slots each chunk carries,
/// which the calling thread made (slices of the caller's, or a listed chunk's own) and
/// frees: a buffer made on a fold thread and freed on another would leave holes in the
/// fold thread's allocator arena.
fn fold_chunks<S, R, T, F, C>(
    journal: &Journal,
    threads: usize,
    chunks: impl Iterator<Item = (S, R)>,
    build: &F,
    mut consume: C,
) -> Result<(), ReplayError>
where
    S: std::ops::Deref<Target = [String]> + Send,
    R: std::ops::DerefMut<Target = [Option<T>]> + Send,
    T: Send,
    F: Fn(&str, Task, Head) -> T + Sync,
    C: FnMut(S, R),
{
    // Chunks after this one are skipped: it failed.
    let failed_at = AtomicUsize::new(usize::MAX);
    let mut error = None;
    parallel::ordered(
        threads,
        // Enough chunks out that no fold thread waits for the caller's `consume`.
        4 * threads,
        chunks,
        || ChunkFolder::new(journal),
        |folder, i, (ids, mut slots)| {
            let result = if i > failed_at.load(Ordering::Acquire) {
                Ok(())
            } else {
                folder.fold(&ids, &mut slots, build)
            };
            if result.is_err() {
                failed_at.fetch_min(i, Ordering::AcqRel);
            }
            (ids, slots, result)
        },
        |(ids, slots, result)| match result {
            Ok(()) => {
                consume(ids, slots);
                true
            }
            Err(e) => {
                error = Some(e);
                false
            }
        },
    )
    .map_err(|parallel::Panicked| ReplayError::FoldThreadPanicked)?;
    error.map_or(Ok(()), Err)
}

/// A fold thread's reader: one forward pass over the journal, its buffers reused from task
/// to task.
struct ChunkFolder<'a> {
    scanner: StreamScanner<'a>,
    raw: RawStream,
}

impl<'a> ChunkFolder<'a> {
    fn new(journal: &'a Journal) -> Self {
        Self {
            scanner: journal.stream_scanner(),
            raw: RawStream::default(),
        }
    }

    /// Folds each task of `tasks`, in order, into `slots`, stopping at the first that fails.
    fn fold<T, F>(
        &mut self,
        tasks: &[String],
        slots: &mut [Option<T>],
        build: &F,
    ) -> Result<(), ReplayError>
    where
        F: Fn(&str, Task, Head) -> T,
    {
        for (task, slot) in tasks.iter().zip(slots) {
            let mut fold = TaskFold::new(task);
            let mut head = Head::default();
            self.scanner.read_into(task, &mut self.raw);
            // `replay_records` with each record handed back to the stream once folded (a
            // fold refuses damage, so the first error ends it).
            let mut records = self.raw.fold_records();
            while let Some(record) = records.next() {
                let record = record?;
                head.next_position = record.position + 1;
                head.last_seq = record.seq;
                head.last_digest = record.digest;
                let position = record.position;
                fold.replay_then(record, |read| records.recycle(read))
                    .map_err(|error| ReplayError::Rejected {
                        task: task.clone(),
                        position,
                        error,
                    })?;
            }
            drop(records);
            *slot = fold.finish().map(|folded| {
                head.terminal = folded.state.is_terminal();
                build(task, folded, head)
            });
        }
        Ok(())
    }
}

/// Folds `task`'s first `records` records: the task as it was after position `records - 1`.
///
/// # Errors
/// As for [`replay_task`].
pub fn load_task_at(
    journal: &Journal,
    task: &str,
    records: u64,
) -> Result<Option<Task>, ReplayError> {
    let mut fold = TaskFold::new(task);
    replay_task(journal, task, Some(records), &mut fold)?;
    Ok(fold.finish())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use dtask_journal::{Event, JournalOptions, LeasePolicy, TaskSpec, Timestamp};

    fn created(id: &str) -> Event {
        Event::Created {
            spec: TaskSpec {
                id: id.to_owned(),
                executor_key: "x".into(),
                ..TaskSpec::default()
            }
            .into(),
            policy: LeasePolicy::Retry,
            checkpoint: vec![1, 2],
            context_snapshot: vec![],
            at: Timestamp(1),
        }
    }

    /// Recovery folds with lean records (updates without their payload): the tasks are
    /// those the full read gives.
    #[test]
    fn the_lean_fold_of_recovery_equals_the_full_fold() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        let ids: Vec<String> = (0..5).map(|i| format!("t{i}")).collect();
        for (i, id) in ids.iter().enumerate() {
            let started = Event::AttemptStarted {
                attempt: 1,
                lease_deadline: Timestamp(30_000),
                at: Timestamp(2),
            };
            let updates = (0..=i).map(|u| Event::UpdateAppended {
                attempt: 1,
                event_id: format!("u{u}"),
                kind: "progress".into(),
                data: vec![7; 100 * u],
                metadata: vec![("step".into(), u.to_string())],
                at: Timestamp(3),
            });
            let events: Vec<Event> = [created(id), started].into_iter().chain(updates).collect();
            journal.append(id, 0, &events).unwrap();
        }
        let lean = load_tasks(&journal, &ids).unwrap();
        for (id, lean) in ids.iter().zip(lean) {
            let full = load_task(&journal, id).unwrap();
            assert!(full.is_some(), "{id}");
            assert_eq!(lean, full, "{id}");
        }
    }

    /// A journal in a temporary directory that acknowledges without syncing (these tests
    /// append many tasks and crash nothing).
    fn buffered_journal() -> (tempfile::TempDir, Journal) {
        let dir = tempfile::tempdir().unwrap();
        let options =
            JournalOptions::default().with_durability(dtask_journal::Durability::Buffered);
        let journal = Journal::open(dir.path(), options).unwrap();
        (dir, journal)
    }

    /// `n` task ids in ascending order.
    fn task_ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("t{i:05}")).collect()
    }

    /// Several chunks on several threads: each chunk is handed over once, in order, with its
    /// own ids and results; a task that does not fold ends it with its error (the first in
    /// id order), after the chunks before its own and none after.
    #[test]
    fn load_tasks_each_hands_over_the_chunks_in_order_up_to_the_first_failure() {
        let (_dir, journal) = buffered_journal();
        let mut ids = task_ids(2 * CHUNK_TASKS + 100);
        let broken = [CHUNK_TASKS + 7, 2 * CHUNK_TASKS + 3];
        for (i, id) in ids.iter().enumerate() {
            let event = if broken.contains(&i) {
                // A stream must begin with its creation.
                Event::Heartbeat {
                    lease_deadline: Timestamp(2),
                    at: Timestamp(1),
                }
            } else {
                created(id)
            };
            journal.append(id, 0, &[event]).unwrap();
        }
        let whole = ids.clone();
        let mut seen = Vec::new();
        let error = load_tasks_each(
            &journal,
            &mut ids,
            |id, task, _| {
                assert_eq!(task.state.spec.id, id);
                id.to_owned()
            },
            |chunk, folded| {
                for (id, folded) in chunk.iter_mut().zip(folded) {
                    assert_eq!(folded.take().as_ref(), Some(&*id));
                    seen.push(std::mem::take(id));
                }
            },
        )
        .unwrap_err();
        assert!(
            matches!(&error, ReplayError::Rejected { task, .. } if *task == whole[broken[0]]),
            "{error}"
        );
        // On one thread or several, only whole chunks are handed over: the first one here.
        let (_, chunk) = plan(whole.len());
        assert_eq!(chunk, CHUNK_TASKS);
        assert_eq!(seen, whole[..chunk]);

        // Without the broken tasks every chunk is handed over.
        let mut fine: Vec<String> = whole
            .iter()
            .enumerate()
            .filter(|(i, _)| !broken.contains(i))
            .map(|(_, id)| id.clone())
            .collect();
        let expected = fine.clone();
        let mut seen = Vec::new();
        load_tasks_each(
            &journal,
            &mut fine,
            |id, _, _| id.to_owned(),
            |chunk, folded| {
                seen.extend(
                    chunk
                        .iter()
                        .cloned()
                        .zip(folded.iter_mut().map(Option::take)),
                );
            },
        )
        .unwrap();
        let ids: Vec<&String> = seen.iter().map(|(id, _)| id).collect();
        assert_eq!(ids, expected.iter().collect::<Vec<_>>());
        assert!(seen.iter().all(|(id, built)| built.as_ref() == Some(id)));
    }

    /// Tasks folded as they are listed: whatever count the caller expected (too few, right,
    /// too many), the same chunks are handed over in order with the same results; the list is
    /// taken only as far as the fold needs it, and no further once a task does not fold.
    #[test]
    fn load_listed_tasks_each_folds_as_the_list_comes_and_stops_taking_it_at_a_failure() {
        let (_dir, journal) = buffered_journal();
        // More chunks than the fold keeps out at a time on two cores.
        let ids = task_ids(16 * CHUNK_TASKS + 50);
        for id in &ids {
            journal.append(id, 0, &[created(id)]).unwrap();
        }
        for expected in [0, 10, ids.len(), 10 * ids.len()] {
            let mut seen = Vec::new();
            load_listed_tasks_each(
                &journal,
                ids.iter().cloned(),
                expected,
                |id, task, head| {
                    assert_eq!(task.state.spec.id, id);
                    (id.to_owned(), head.next_position)
                },
                |chunk, folded| {
                    for (id, folded) in chunk.iter_mut().zip(folded) {
                        assert_eq!(folded.take(), Some((id.clone(), 1)));
                        seen.push(std::mem::take(id));
                    }
                },
            )
            .unwrap();
            assert_eq!(seen, ids, "expected {expected}");
        }

        // A task that does not fold in the second chunk: the chunks before it are handed
        // over, and the list is not taken to its end.
        let broken = format!("{}-broken", ids[CHUNK_TASKS + 3]);
        journal
            .append(
                &broken,
                0,
                &[Event::Heartbeat {
                    lease_deadline: Timestamp(2),
                    at: Timestamp(1),
                }],
            )
            .unwrap();
        let mut listed = ids.clone();
        listed.insert(CHUNK_TASKS + 4, broken.clone());
        let taken = std::cell::Cell::new(0);
        let mut seen = Vec::new();
        let error = load_listed_tasks_each(
            &journal,
            listed
                .iter()
                .inspect(|_| taken.set(taken.get() + 1))
                .cloned(),
            listed.len(),
            |id, _, _| id.to_owned(),
            |chunk, _| seen.extend(chunk.iter().cloned()),
        )
        .unwrap_err();
        assert!(
            matches!(&error, ReplayError::Rejected { task, .. } if *task == broken),
            "{error}"
        );
        assert_eq!(seen, listed[..CHUNK_TASKS]);
        let (threads, _) = plan(listed.len());
        // The caller lists at most a few chunks ahead of the fold (none on one thread).
        let ahead = if threads > 1 { 4 * threads } else { 0 };
        assert!(
            taken.get() <= (2 + ahead) * CHUNK_TASKS,
            "{} of {} listed",
            taken.get(),
            listed.len()
        );
    }

    /// A panic on a fold thread comes back as an error, not as a panic of the caller (on a
    /// machine with one core the tasks fold on the calling thread, and the panic is its own).
    #[test]
    fn a_panicking_fold_thread_is_an_error() {
        let (_dir, journal) = buffered_journal();
        let ids = task_ids(CHUNK_TASKS + 10);
        for id in &ids {
            journal.append(id, 0, &[created(id)]).unwrap();
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            load_tasks_with(&journal, &ids, |id, _, _| {
                assert_ne!(id, "t00003", "a bug in build");
            })
        }));
        if plan(ids.len()).0 > 1 {
            let error = outcome.expect("no panic").unwrap_err();
            assert!(error.to_string().contains("panicked"), "{error}");
        } else {
            assert!(outcome.is_err());
        }
    }

    #[test]
    fn load_tasks_with_builds_on_each_folded_task_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        // Enough tasks for several fold threads on a multi-core machine.
        let ids: Vec<String> = (0..2 * PARALLEL_MIN_TASKS + 7)
            .map(|i| format!("t{i:05}"))
            .collect();
        for id in ids.iter().step_by(2) {
            journal.append(id, 0, &[created(id)]).unwrap();
        }
        let plain = load_tasks(&journal, &ids).unwrap();
        let built = load_tasks_with(&journal, &ids, |id, task, head| {
            (id.to_owned(), task.state.spec.id.clone(), head)
        })
        .unwrap();
        assert_eq!(plain.len(), ids.len());
        for ((id, plain), built) in ids.iter().zip(&plain).zip(&built) {
            assert_eq!(plain.is_some(), built.is_some(), "{id}");
            if let Some((seen, spec_id, head)) = built {
                assert_eq!(seen, id);
                assert_eq!(spec_id, id);
                // The head handed to `build` is the journal's own.
                assert_eq!(Some(*head), journal.head(id).unwrap(), "{id}");
            }
        }
    }
}

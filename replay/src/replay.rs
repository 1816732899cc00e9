//! Replaying a task's stream from the journal through a [`Replay`] implementation.

use crate::fold::{FoldError, Task};
use dtask_journal::{Head, Journal, RawStream, Record};

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
}

/// Errors of replaying a stream.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError<E = FoldError> {
    /// The journal could not be read, or a record is damaged.
    #[error(transparent)]
    Journal(#[from] dtask_journal::Error),
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

/// The state fold as a [`Replay`]: builds a [`Task`] from its records.
#[derive(Debug, Default)]
pub struct TaskFold {
    task: Option<Task>,
}

impl TaskFold {
    /// An empty fold.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The folded task (`None` when no record was replayed).
    #[must_use]
    pub fn finish(self) -> Option<Task> {
        self.task
    }
}

impl Replay for TaskFold {
    type Error = FoldError;

    fn replay(&mut self, record: &Record) -> Result<(), FoldError> {
        match self.task.as_mut() {
            None => {
                self.task = Some(Task::created(&record.event)?);
                Ok(())
            }
            Some(task) => task.apply(&record.event),
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

/// [`replay_task`] over records already being read.
fn replay_records<R: Replay>(
    task: &str,
    records: impl Iterator<Item = dtask_journal::Result<Record>>,
    until: Option<u64>,
    replay: &mut R,
) -> Result<(), ReplayError<R::Error>> {
    for record in records {
        let record = record?;
        if until.is_some_and(|end| record.position >= end) {
            break;
        }
        replay
            .replay(&record)
            .map_err(|error| ReplayError::Rejected {
                task: task.to_owned(),
                position: record.position,
                error,
            })?;
    }
    Ok(())
}

/// Folds `task` from the journal; `None` for an unknown task.
///
/// # Errors
/// As for [`replay_task`].
pub fn load_task(journal: &Journal, task: &str) -> Result<Option<Task>, ReplayError> {
    let mut fold = TaskFold::new();
    replay_task(journal, task, None, &mut fold)?;
    Ok(fold.finish())
}

/// Tasks folded per thread at least; fewer are folded on the calling thread.
const PARALLEL_MIN_TASKS: usize = 256;

/// Folds many tasks — [`load_task`] for each of `tasks`, with the same results in the same
/// order — reading their streams in one forward pass per thread ([`Journal::stream_scanner`])
/// on up to as many threads as the machine has cores. Tasks in ascending id order read
/// fastest (the `live` index lists them so).
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
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .clamp(1, 8)
        .min(tasks.len() / PARALLEL_MIN_TASKS)
        .max(1);
    let build = &build;
    let fold = |chunk: &[String]| -> Result<Vec<Option<T>>, ReplayError> {
        let mut scanner = journal.stream_scanner();
        let mut raw = RawStream::default();
        chunk
            .iter()
            .map(|task| {
                let mut fold = TaskFold::new();
                let mut head = Head::default();
                scanner.read_into(task, &mut raw);
                let records = raw.fold_records().inspect(|record| {
                    if let Ok(record) = record {
                        head.next_position = record.position + 1;
                        head.last_seq = record.seq;
                        head.last_digest = record.digest;
                    }
                });
                replay_records(task, records, None, &mut fold)?;
                Ok(fold.finish().map(|folded| {
                    head.terminal = folded.state.is_terminal();
                    build(task, folded, head)
                }))
            })
            .collect()
    };
    if threads == 1 {
        return fold(tasks);
    }
    let chunk = tasks.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = tasks
            .chunks(chunk)
            .map(|chunk| scope.spawn(move || fold(chunk)))
            .collect();
        let mut folded = Vec::with_capacity(tasks.len());
        for handle in handles {
            let part = handle.join().map_err(|_| {
                ReplayError::Journal(dtask_journal::Error::Storage(
                    "a fold thread panicked".into(),
                ))
            })??;
            folded.extend(part);
        }
        Ok(folded)
    })
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
    let mut fold = TaskFold::new();
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
            },
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

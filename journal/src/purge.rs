//! Purging finished streams: a task's records deleted, one tombstone kept.
//!
//! A purge of a stream deletes, in one atomic batch through the writer, every record of
//! the stream with its `commits` entry and writes the stream's tombstone
//! ([`Event::Purged`], a new sequence) in its first record's place, position 0. The
//! tombstone keeps what the rest of the journal leans on: the task's id stays taken (its
//! first key is there, which is what an append at position 0 looks up), its hash chain goes
//! on (the tombstone chains from the last deleted record's digest, which it names), and the
//! commit order, dense no more, stays accountable (the tombstone sums the sequences it
//! deleted, so an audit matches every hole of the commit index against the tombstones).
//! What a purge keeps is O(tasks), not O(records): one small record and its commit entry.
//!
//! What may be purged is decided on the stream as read and written only if the stream is
//! still at that position (the append's expected position): a stream that ended (its head is
//! terminal), that was not purged before, whose notifications were all acknowledged (an
//! `outbox` entry must name a record) and on which no hold stands ([`Event::Hold`]). The engine's own rules (a task tree goes whole,
//! holds) are checked by its caller.

use crate::error::{Error, PurgeRefusal, Result};
use crate::event::{Event, Timestamp};
use crate::journal::{never, Journal};
use crate::record;
use crate::tail::PairHash;
use crate::writer::{EncodedEvent, EncodedEvents, IndexEffect, JobTask, LinkedPart};
use std::collections::HashSet;

/// One stream a purge removed ([`Journal::purge`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgedStream {
    /// The task.
    pub task: String,
    /// Records deleted (the tombstone takes the first one's place).
    pub records: u64,
    /// Bytes of the records deleted.
    pub bytes: u64,
}

/// A stream's purge, planned: its tombstone with the sequences to delete, at the position
/// expected.
struct Planned {
    expected: u64,
    event: EncodedEvent,
    stream: PurgedStream,
}

impl Journal {
    /// Purges the finished streams of `tasks` in one atomic write: each stream's records
    /// are deleted with their commit entries and its tombstone ([`Event::Purged`], recorded
    /// at `at`) is put after them — every stream, or none. Returns what each lost.
    ///
    /// ```
    /// use dtask_journal::{Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let journal = Journal::open(dir.path(), JournalOptions::default())?;
    /// let spec = TaskSpec::new("t1", "shell");
    /// journal.append("t1", 0, &[Event::created(spec, LeasePolicy::Retry, Timestamp(1))])?;
    /// journal.append("t1", 1, &[Event::Completed { data: b"ok".to_vec(), at: Timestamp(2) }])?;
    /// let purged = journal.purge(&["t1"], Timestamp(3))?;
    /// assert_eq!(purged[0].records, 2);
    /// // The stream keeps its tombstone alone, in its first record's place; the id stays
    /// // taken.
    /// let kept: Vec<_> = journal.read_stream("t1", 0).collect::<Result<_, _>>()?;
    /// assert_eq!((kept.len(), kept[0].position), (1, 0));
    /// assert!(matches!(kept[0].event, Event::Purged { records: 2, .. }));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::NotPurgeable`] for a task without records, one not ended, one purged before,
    /// one with a queued notification or one on hold; [`Error::Conflict`] when a stream was appended to
    /// after it was read; [`Error::DuplicateStream`] for a task named twice; damage met
    /// reading a stream ([`Error::Corruption`]: a damaged stream is not purged); as for
    /// [`Journal::append`] otherwise. Nothing is written on an error.
    ///
    /// # Panics
    /// Must not be called from inside an asynchronous runtime's worker (it blocks); use
    /// [`Journal::purge_async`] there.
    pub fn purge(&self, tasks: &[&str], at: Timestamp) -> Result<Vec<PurgedStream>> {
        let tasks: Vec<(&str, Option<u64>)> = tasks.iter().map(|t| (*t, None)).collect();
        let (streams, reply) = self.submit_purge(&tasks, at)?;
        reply.blocking_recv().map_err(|_| Error::Closed)??;
        Ok(streams)
    }

    /// [`Journal::purge`] of streams the caller read — exported, say — each named with the
    /// number of records it had then: a stream that has more now (on a shared journal,
    /// another node appended to it since: a rerun's link, a hold) is not purged, lest records
    /// the caller never saw go with it.
    ///
    /// # Errors
    /// As for [`Journal::purge`]; [`Error::Conflict`] (`expected` the records read,
    /// `actual` the records now) when a stream is not as long as read. Nothing is written
    /// on an error.
    pub fn purge_as_read(&self, tasks: &[(&str, u64)], at: Timestamp) -> Result<Vec<PurgedStream>> {
        let tasks: Vec<(&str, Option<u64>)> = tasks.iter().map(|(t, n)| (*t, Some(*n))).collect();
        let (streams, reply) = self.submit_purge(&tasks, at)?;
        reply.blocking_recv().map_err(|_| Error::Closed)??;
        Ok(streams)
    }

    /// [`Journal::purge`] for asynchronous callers.
    ///
    /// # Errors
    /// As for [`Journal::purge`].
    pub async fn purge_async(&self, tasks: &[&str], at: Timestamp) -> Result<Vec<PurgedStream>> {
        let tasks: Vec<(&str, Option<u64>)> = tasks.iter().map(|t| (*t, None)).collect();
        let (streams, reply) = self.submit_purge(&tasks, at)?;
        reply.await.map_err(|_| Error::Closed)??;
        Ok(streams)
    }

    fn submit_purge(
        &self,
        tasks: &[(&str, Option<u64>)],
        at: Timestamp,
    ) -> Result<(
        Vec<PurgedStream>,
        tokio::sync::oneshot::Receiver<Result<crate::Appended>>,
    )> {
        let mut seen = HashSet::new();
        let mut planned = Vec::with_capacity(tasks.len());
        for (task, read) in tasks {
            if !seen.insert(*task) {
                return Err(Error::DuplicateStream((*task).to_owned()));
            }
            let plan = self.plan_purge(task, at)?;
            if let Some(read) = read.filter(|read| *read != plan.expected) {
                return Err(Error::Conflict {
                    task: (*task).to_owned(),
                    expected: read,
                    actual: plan.expected,
                });
            }
            planned.push((*task, plan));
        }
        let mut parts = planned.into_iter();
        let Some((first, plan)) = parts.next() else {
            return Err(Error::EmptyAppend);
        };
        let mut streams = vec![plan.stream];
        let head = (
            JobTask::new(first),
            plan.expected,
            EncodedEvents::from_iter([plan.event]),
        );
        let linked = parts
            .map(|(task, plan)| {
                streams.push(plan.stream);
                LinkedPart {
                    task: JobTask::new(task),
                    expected: plan.expected,
                    events: EncodedEvents::from_iter([plan.event]),
                }
            })
            .collect();
        let reply = self.enqueue(head, linked, never, None, None)?;
        Ok((streams, reply))
    }

    /// Reads `task`'s stream and plans its purge.
    fn plan_purge(&self, task: &str, at: Timestamp) -> Result<Planned> {
        let refuse = |why| Error::NotPurgeable {
            task: task.to_owned(),
            why,
        };
        let mut seqs = Vec::new();
        let mut bytes = 0u64;
        let mut last_digest = None;
        let mut queued = HashSet::new();
        let mut on_hold = false;
        for record in self.read_stream(task, 0) {
            let record = record?;
            match &record.event {
                Event::Purged { .. } => return Err(refuse(PurgeRefusal::AlreadyPurged)),
                Event::NotificationEnqueued { id, .. }
                | Event::NotificationEnqueuedV2 { id, .. } => {
                    queued.insert(id.clone());
                }
                Event::NotificationAcked { id, .. } => {
                    queued.remove(id);
                }
                Event::Hold { .. } => on_hold = true,
                Event::HoldLifted { .. } => on_hold = false,
                _ => {}
            }
            seqs.push(record.seq);
            bytes += record.size as u64;
            last_digest = Some(record.digest);
        }
        let Some(last_digest) = last_digest else {
            return Err(refuse(PurgeRefusal::Unknown));
        };
        let head = self.head(task)?.unwrap_or_default();
        if !head.terminal {
            return Err(refuse(PurgeRefusal::NotEnded));
        }
        if !queued.is_empty() {
            return Err(refuse(PurgeRefusal::QueuedNotification));
        }
        if on_hold {
            return Err(refuse(PurgeRefusal::OnHold));
        }
        let records = seqs.len() as u64;
        let event = Event::Purged {
            records,
            sequences: PairHash::of_sequences(seqs.iter().copied()),
            last_digest: last_digest.0,
            at,
        };
        let payload = record::Unframed::encode(&event).map_err(Error::Encode)?;
        Ok(Planned {
            expected: records,
            event: EncodedEvent {
                payload,
                effect: IndexEffect::Purge {
                    seqs: seqs.into_boxed_slice(),
                    chain_from: last_digest,
                },
            },
            stream: PurgedStream {
                task: task.to_owned(),
                records,
                bytes,
            },
        })
    }
}

//! The group-commit writer.
//!
//! One thread owns every write. Callers hand it an [`AppendJob`] (events already encoded, limits
//! already checked) and wait on a one-shot reply. The writer takes the first job, drains every
//! job already queued (up to `max_batch_appends`), checks each job's expected position against
//! the task head (as advanced by earlier jobs of the same batch), frames the records, and writes
//! the whole batch — records, commit index, heads, live and outbox indexes — as **one** atomic
//! backend write with **one** sync. Only then is every caller of the batch acknowledged. A job
//! whose expected position is stale is refused alone and contributes nothing; a failed write
//! fails every job of the batch and leaves nothing behind.

use crate::backend::{Backend, BatchOp};
use crate::error::{Error, Result};
use crate::head::Head;
use crate::keys::{self, Space};
use crate::options::Durability;
use crate::record;
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// What an event does to the journal's indexes besides being recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IndexEffect {
    /// None.
    None,
    /// `Created`: the task becomes live.
    Created,
    /// A terminal event: the task leaves the live index.
    Terminal,
    /// `NotificationEnqueued`: an outbox entry keyed by this record's sequence.
    Enqueue,
    /// `NotificationAcked`: the outbox entry of that sequence goes away.
    Ack(u64),
}

/// One encoded event of a job.
#[derive(Debug)]
pub(crate) struct EncodedEvent {
    pub payload: Vec<u8>,
    pub effect: IndexEffect,
}

/// The result of a successful append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The stream's next position after the append (its new length).
    pub next_position: u64,
    /// The global sequence of the first record appended.
    pub first_seq: u64,
    /// The global sequence of the last record appended.
    pub last_seq: u64,
}

pub(crate) struct AppendJob {
    pub task: String,
    pub expected: u64,
    pub events: Vec<EncodedEvent>,
    pub reply: oneshot::Sender<Result<Appended>>,
}

pub(crate) struct Writer {
    backend: Arc<dyn Backend>,
    durability: Durability,
    max_batch: usize,
    next_seq: u64,
    heads: HashMap<String, Head>,
}

/// How long the writer waits for the callers of its previous batch to re-submit.
const LINGER: Duration = Duration::from_micros(100);

/// Heads kept in memory before the cache is dropped and refilled from the `heads` space.
const HEAD_CACHE_LIMIT: usize = 1 << 20;

impl Writer {
    pub(crate) fn new(
        backend: Arc<dyn Backend>,
        durability: Durability,
        max_batch: usize,
        next_seq: u64,
    ) -> Self {
        Self {
            backend,
            durability,
            max_batch,
            next_seq,
            heads: HashMap::new(),
        }
    }

    /// Runs until every sender is gone.
    ///
    /// Batch formation: after the first job, everything already queued is taken; then, when
    /// the batch is still smaller than the previous one (the callers of that batch are still
    /// re-submitting), the writer lingers up to [`LINGER`] for them. Without this a batch of
    /// one or two often goes out alone right after a large one, and pays a whole sync.
    pub(crate) fn run(mut self, jobs: &Receiver<AppendJob>) {
        let mut batch = Vec::with_capacity(self.max_batch);
        let mut previous = 1;
        while let Ok(first) = jobs.recv() {
            batch.push(first);
            let deadline = Instant::now() + LINGER;
            while batch.len() < self.max_batch {
                match jobs.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(TryRecvError::Disconnected) => break,
                    Err(TryRecvError::Empty) => {
                        let now = Instant::now();
                        if batch.len() >= previous || now >= deadline {
                            break;
                        }
                        match jobs.recv_timeout(deadline - now) {
                            Ok(job) => batch.push(job),
                            Err(_) => break,
                        }
                    }
                }
            }
            previous = batch.len();
            self.commit(&mut batch);
        }
    }

    fn head(&self, overlay: &HashMap<String, Head>, task: &str) -> Result<Head> {
        if let Some(head) = overlay.get(task).or_else(|| self.heads.get(task)) {
            return Ok(*head);
        }
        match self.backend.get(Space::Heads, &keys::task_key(task))? {
            Some(bytes) => Head::decode(&bytes).map_err(|kind| Error::corruption(task, 0, kind)),
            None => Ok(Head::default()),
        }
    }

    /// Frames one job's records on top of `head` starting at sequence `seq`, returning the
    /// batch ops, the advanced head and the acknowledgement.
    fn stage(
        job: &AppendJob,
        mut head: Head,
        mut seq: u64,
    ) -> Result<(Vec<BatchOp>, Head, Appended)> {
        let first_seq = seq;
        let mut ops = Vec::with_capacity(job.events.len() * 3 + 1);
        for event in &job.events {
            let (bytes, digest) = record::frame(
                &job.task,
                head.next_position,
                seq,
                &event.payload,
                &head.last_digest,
            )
            .map_err(|len| Error::Encode(format!("payload of {len} bytes")))?;
            let event_key = keys::event_key(&job.task, head.next_position);
            match event.effect {
                IndexEffect::None => {}
                IndexEffect::Created => ops.push(BatchOp::Put {
                    space: Space::Live,
                    key: keys::task_key(&job.task),
                    value: Vec::new(),
                }),
                IndexEffect::Terminal => {
                    head.terminal = true;
                    ops.push(BatchOp::Delete {
                        space: Space::Live,
                        key: keys::task_key(&job.task),
                    });
                }
                IndexEffect::Enqueue => ops.push(BatchOp::Put {
                    space: Space::Outbox,
                    key: keys::seq_key(seq).to_vec(),
                    value: event_key.clone(),
                }),
                IndexEffect::Ack(enqueued) => ops.push(BatchOp::Delete {
                    space: Space::Outbox,
                    key: keys::seq_key(enqueued).to_vec(),
                }),
            }
            ops.push(BatchOp::Put {
                space: Space::Commits,
                key: keys::seq_key(seq).to_vec(),
                value: event_key.clone(),
            });
            ops.push(BatchOp::Put {
                space: Space::Events,
                key: event_key,
                value: bytes,
            });
            head.next_position += 1;
            head.last_seq = seq;
            head.last_digest = digest;
            seq += 1;
        }
        ops.push(BatchOp::Put {
            space: Space::Heads,
            key: keys::task_key(&job.task),
            value: head.encode(),
        });
        let appended = Appended {
            next_position: head.next_position,
            first_seq,
            last_seq: seq - 1,
        };
        Ok((ops, head, appended))
    }

    fn commit(&mut self, batch: &mut Vec<AppendJob>) {
        let mut seq = self.next_seq;
        let mut ops = Vec::with_capacity(batch.len() * 4);
        let mut overlay: HashMap<String, Head> = HashMap::new();
        let mut accepted = Vec::with_capacity(batch.len());
        for job in batch.drain(..) {
            let head = match self.head(&overlay, &job.task) {
                Ok(head) if head.next_position == job.expected => head,
                Ok(head) => {
                    let _ = job.reply.send(Err(Error::Conflict {
                        task: job.task,
                        expected: job.expected,
                        actual: head.next_position,
                    }));
                    continue;
                }
                Err(e) => {
                    let _ = job.reply.send(Err(e));
                    continue;
                }
            };
            match Self::stage(&job, head, seq) {
                Ok((mut job_ops, head, appended)) => {
                    ops.append(&mut job_ops);
                    seq = appended.last_seq + 1;
                    overlay.insert(job.task, head);
                    accepted.push((job.reply, appended));
                }
                Err(e) => {
                    let _ = job.reply.send(Err(e));
                }
            }
        }
        if accepted.is_empty() {
            return;
        }
        if let Some(message) = crate::failpoints::hit(crate::failpoints::BEFORE_WRITE) {
            for (reply, _) in accepted {
                let _ = reply.send(Err(Error::Storage(message.clone())));
            }
            return;
        }
        match self.backend.write(ops, self.durability) {
            Ok(()) => {
                self.next_seq = seq;
                if self.heads.len() + overlay.len() > HEAD_CACHE_LIMIT {
                    self.heads.clear();
                }
                self.heads.extend(overlay);
                if let Some(message) = crate::failpoints::hit(crate::failpoints::AFTER_WRITE) {
                    // Durable, but the callers hear of a failure: an ambiguous outcome.
                    for (reply, _) in accepted {
                        let _ = reply.send(Err(Error::Storage(message.clone())));
                    }
                    return;
                }
                for (reply, appended) in accepted {
                    let _ = reply.send(Ok(appended));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, appends = accepted.len(), "journal batch failed");
                let message = e.to_string();
                for (reply, _) in accepted {
                    let _ = reply.send(Err(Error::Storage(message.clone())));
                }
            }
        }
    }
}

//! Trimming a stream's progress: the bytes of its older progress updates dropped, every
//! record kept, the hash chain whole.
//!
//! A long-running tool's stream is mostly progress updates (a shell command's output lines, a
//! sub-agent's steps), of which a reader wants the latest few; the rest cost disk, export
//! time and recovery's reads for as long as the task is kept. A trim rewrites each update
//! record but the last `keep` as an [`Event::UpdateTrimmed`] in its place — the attempt,
//! event id, part, kind and time the fold and the deduplication by event id need, without the
//! data and metadata — and appends an [`Event::ProgressTrimmed`] that says how many and what
//! the stream's end was before. The stream folds to the same state (a trimmed update folds as
//! the update it stands for; the marker changes nothing but the stream's length), a retried
//! update with a trimmed one's event id is still recognised, and nothing else of the journal
//! changes: every record keeps its position and its sequence, so the commit order stays
//! dense and its index untouched.
//!
//! **The chain stays whole.** Every record from the first trimmed one on is framed again on
//! the chain (an untouched record with its own payload bytes), in the same atomic write as
//! the marker, so a trimmed stream is an ordinary stream of ordinary records to every reader,
//! the audit, the export and the import: nothing is chained from a digest a record only
//! names. The marker keeps the digest the stream ended with before (`digest_before`), for a
//! reader that recorded it.
//!
//! **What may be trimmed** is decided on the stream as read, and written only if the stream
//! is still at that position (the append's expected position, as for a purge): any stream —
//! running or ended — that was not purged and on which no hold stands ([`Event::Hold`]).
//! Trimming is idempotent: records trimmed before are left as they are, and a stream with
//! nothing more to trim is not written to at all.

use crate::backend::Range;
use crate::error::{Error, Result, TrimRefusal};
use crate::event::{Event, Timestamp};
use crate::journal::{never, Journal};
use crate::keys::{self, Space};
use crate::record::{self, Digest};
use crate::stream::{Checked, StreamCheck};
use crate::writer::{EncodedEvent, EncodedEvents, IndexEffect, JobTask};

/// What a trim did to one stream ([`Journal::trim_progress`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrimmedStream {
    /// The task.
    pub task: String,
    /// Update records trimmed by this call (0: nothing was written).
    pub records: u64,
    /// Records framed again (the trimmed ones and every record after the first of them).
    pub rewritten: u64,
    /// The bytes saved: the rewritten records' sizes before, less after (the marker not
    /// counted).
    pub bytes: u64,
    /// The trim's marker ([`Event::ProgressTrimmed`]) and its position; `None` when there was
    /// nothing to trim.
    pub marker: Option<(u64, Event)>,
}

/// One record of the stream as read: its key, its bytes and its event.
struct Read {
    key: Vec<u8>,
    bytes: Vec<u8>,
    event: Event,
}

/// Whether `event` is a progress update with its bytes (one a trim may rewrite).
const fn is_update(event: &Event) -> bool {
    matches!(
        event,
        Event::UpdateAppended { .. } | Event::PartAppended { .. }
    )
}

/// The trimmed stand-in of an update event, of a record of `bytes` bytes; `None` for any
/// other event.
fn trimmed(event: &Event, bytes: u64) -> Option<Event> {
    match event {
        Event::UpdateAppended {
            attempt,
            event_id,
            kind,
            at,
            ..
        } => Some(Event::UpdateTrimmed {
            attempt: *attempt,
            event_id: event_id.clone(),
            part_id: String::new(),
            last: true,
            kind: kind.clone(),
            bytes,
            at: *at,
        }),
        Event::PartAppended {
            attempt,
            event_id,
            part_id,
            last,
            kind,
            at,
            ..
        } => Some(Event::UpdateTrimmed {
            attempt: *attempt,
            event_id: event_id.clone(),
            part_id: part_id.clone(),
            last: *last,
            kind: kind.clone(),
            bytes,
            at: *at,
        }),
        _ => None,
    }
}

impl Journal {
    /// Trims `task`'s progress: every progress update record but the last `keep` (trimmed
    /// ones counted among them) is rewritten in its place without its data and metadata
    /// ([`Event::UpdateTrimmed`]), and an [`Event::ProgressTrimmed`] recorded at `at` is
    /// appended, in one atomic write. The stream folds to the same state, and its chain
    /// stays whole (see the module's documentation). A stream with nothing more to trim is
    /// not written to.
    ///
    /// ```
    /// use dtask_journal::{Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let journal = Journal::open(dir.path(), JournalOptions::default())?;
    /// let spec = TaskSpec::new("t1", "shell");
    /// journal.append("t1", 0, &[Event::created(spec, LeasePolicy::Retry, Timestamp(1))])?;
    /// journal.append("t1", 1, &[Event::AttemptStarted { attempt: 1, lease_deadline: Timestamp(9), at: Timestamp(2) }])?;
    /// for n in 0..3u8 {
    ///     let update = Event::UpdateAppended {
    ///         attempt: 1,
    ///         event_id: format!("line-{n}"),
    ///         kind: "stdout".into(),
    ///         data: vec![b'x'; 1000],
    ///         metadata: vec![],
    ///         at: Timestamp(3),
    ///     };
    ///     journal.append("t1", 2 + u64::from(n), &[update])?;
    /// }
    /// let trimmed = journal.trim_progress("t1", 1, Timestamp(4))?;
    /// assert_eq!(trimmed.records, 2);
    /// let events: Vec<_> = journal.read_stream("t1", 0).map(|r| r.map(|r| r.event)).collect::<Result<_, _>>()?;
    /// assert!(matches!(&events[2], Event::UpdateTrimmed { event_id, .. } if event_id == "line-0"));
    /// assert!(matches!(&events[4], Event::UpdateAppended { data, .. } if data.len() == 1000));
    /// assert!(matches!(events[5], Event::ProgressTrimmed { records: 2, .. }));
    /// // Nothing more to trim: nothing is written.
    /// assert_eq!(journal.trim_progress("t1", 1, Timestamp(5))?.records, 0);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::NotTrimmable`] for a task without records, a purged one or one on hold;
    /// [`Error::Conflict`] when the stream was appended to after it was read (read it
    /// again); damage met reading the stream ([`Error::Corruption`]: a damaged stream is not
    /// rewritten); as for [`Journal::append`] otherwise. Nothing is written on an error.
    ///
    /// # Panics
    /// Must not be called from inside an asynchronous runtime's worker (it blocks); use
    /// [`Journal::trim_progress_async`] there.
    pub fn trim_progress(&self, task: &str, keep: u64, at: Timestamp) -> Result<TrimmedStream> {
        let (trimmed, reply) = self.submit_trim(task, keep, at)?;
        if let Some(reply) = reply {
            reply.blocking_recv().map_err(|_| Error::Closed)??;
        }
        Ok(trimmed)
    }

    /// [`Journal::trim_progress`] for asynchronous callers.
    ///
    /// # Errors
    /// As for [`Journal::trim_progress`].
    pub async fn trim_progress_async(
        &self,
        task: &str,
        keep: u64,
        at: Timestamp,
    ) -> Result<TrimmedStream> {
        let (trimmed, reply) = self.submit_trim(task, keep, at)?;
        if let Some(reply) = reply {
            reply.await.map_err(|_| Error::Closed)??;
        }
        Ok(trimmed)
    }

    #[allow(
        clippy::type_complexity,
        reason = "a private pair, named at its two callers"
    )]
    fn submit_trim(
        &self,
        task: &str,
        keep: u64,
        at: Timestamp,
    ) -> Result<(
        TrimmedStream,
        Option<tokio::sync::oneshot::Receiver<Result<crate::Appended>>>,
    )> {
        let refuse = |why| Error::NotTrimmable {
            task: task.to_owned(),
            why,
        };
        let stream = self.read_raw(task)?;
        let Some(first) = stream.first() else {
            return Err(refuse(TrimRefusal::Unknown));
        };
        if matches!(first.event, Event::Purged { .. }) {
            return Err(refuse(TrimRefusal::Purged));
        }
        let mut on_hold = false;
        let mut updates = Vec::new();
        for (position, read) in stream.iter().enumerate() {
            match &read.event {
                Event::Hold { .. } => on_hold = true,
                Event::HoldLifted { .. } => on_hold = false,
                event if is_update(event) || matches!(event, Event::UpdateTrimmed { .. }) => {
                    updates.push(position);
                }
                _ => {}
            }
        }
        if on_hold {
            return Err(refuse(TrimRefusal::OnHold));
        }
        let kept = usize::try_from(keep)
            .unwrap_or(usize::MAX)
            .min(updates.len());
        let trim: Vec<usize> = updates[..updates.len() - kept]
            .iter()
            .copied()
            .filter(|&p| is_update(&stream[p].event))
            .collect();
        let mut result = TrimmedStream {
            task: task.to_owned(),
            records: trim.len() as u64,
            rewritten: 0,
            bytes: 0,
            marker: None,
        };
        let Some(&from) = trim.first() else {
            return Ok((result, None));
        };
        let digest_of = |read: &Read| record::parse(&read.bytes).map(|frame| frame.digest);
        let corrupt = |position: usize, kind| Error::corruption(task, position as u64, kind);
        // The creation is never an update: the first trimmed record has one before it.
        let mut prev = match from.checked_sub(1) {
            Some(before) => digest_of(&stream[before]).map_err(|kind| corrupt(before, kind))?,
            None => Digest::GENESIS,
        };
        let mut trim = trim.into_iter().peekable();
        let mut replaced = Vec::with_capacity(stream.len() - from);
        let mut saved = 0u64;
        let mut last_before = prev;
        for (position, read) in stream.iter().enumerate().skip(from) {
            let frame = record::parse(&read.bytes).map_err(|kind| corrupt(position, kind))?;
            last_before = frame.digest;
            let unframed = if trim.next_if_eq(&position).is_some() {
                let stub = trimmed(&read.event, read.bytes.len() as u64)
                    .ok_or_else(|| Error::Encode("a trim of a record that is no update".into()))?;
                record::Unframed::encode(&stub).map_err(Error::Encode)?
            } else {
                record::Unframed::from_payload(frame.payload)
            };
            let (bytes, digest) = unframed
                .frame_as(frame.format, task, position as u64, frame.seq, &prev)
                .map_err(|len| Error::Encode(format!("payload of {len} bytes")))?;
            saved += (read.bytes.len() as u64).saturating_sub(bytes.len() as u64);
            prev = digest;
            replaced.push((read.key.clone(), bytes));
        }
        let marker = Event::ProgressTrimmed {
            records: result.records,
            bytes: saved,
            digest_before: last_before.0,
            at,
        };
        let payload = record::Unframed::encode(&marker).map_err(Error::Encode)?;
        result.rewritten = replaced.len() as u64;
        result.bytes = saved;
        result.marker = Some((stream.len() as u64, marker));
        let event = EncodedEvent {
            payload,
            effect: IndexEffect::Trim {
                replaced: replaced.into_boxed_slice(),
                chain_from: prev,
            },
        };
        let reply = self.enqueue(
            (
                JobTask::new(task),
                stream.len() as u64,
                EncodedEvents::from_iter([event]),
            ),
            Vec::new(),
            never,
            None,
            None,
        )?;
        Ok((result, Some(reply)))
    }

    /// `task`'s stream as stored — every record's key and bytes, checked (CRC, position,
    /// chain) and decoded — written or not yet durable alike: a trim frames them all again,
    /// and the writer takes it only if the stream is still that long.
    fn read_raw(&self, task: &str) -> Result<Vec<Read>> {
        let prefix = keys::task_prefix(task);
        let mut check = StreamCheck::new(task.to_owned(), 0, Some(Digest::GENESIS));
        let mut out = Vec::new();
        for entry in self.storage().scan(Space::Events, Range::prefix(&prefix)) {
            let (key, bytes) = entry?;
            let record = match check.entry(&key, &bytes) {
                Checked::One(record) => record?,
                Checked::Gap(missing, _) => return Err(missing),
            };
            out.push(Read {
                key: key.into_vec(),
                bytes: bytes.into_vec(),
                event: record.event,
            });
        }
        Ok(out)
    }
}

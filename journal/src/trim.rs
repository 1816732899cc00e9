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
        self.trim_progress_blocking(task, keep, at, None)
    }

    /// [`Journal::trim_recent_progress_async`] for synchronous callers.
    ///
    /// # Errors
    /// As for [`Journal::trim_progress`].
    ///
    /// # Panics
    /// Must not be called from inside an asynchronous runtime's worker (it blocks).
    pub fn trim_recent_progress(
        &self,
        task: &str,
        keep: u64,
        at: Timestamp,
        unheld_at: u64,
    ) -> Result<TrimmedStream> {
        self.trim_progress_blocking(task, keep, at, Some(unheld_at))
    }

    fn trim_progress_blocking(
        &self,
        task: &str,
        keep: u64,
        at: Timestamp,
        unheld_at: Option<u64>,
    ) -> Result<TrimmedStream> {
        let (trimmed, reply) = self.submit_trim(task, keep, at, unheld_at)?;
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
        self.trim_progress_reading(task, keep, at, None).await
    }

    /// [`Journal::trim_progress_async`] for a caller that has folded the stream up to
    /// position `unheld_at` and found no hold standing there: the trim reads the stream
    /// back from its end only as far as it needs — to the newest update trimmed before
    /// (trimmed updates are always a stream's oldest), and at least back to `unheld_at`,
    /// the records from there on checked for a hold — instead of from its first record.
    /// What it writes is what [`Journal::trim_progress`] writes; what it reads is the
    /// stream's untrimmed tail, not the whole stream (a running task trimmed again and
    /// again, by a store's progress cap, pays for what came since its last trim).
    ///
    /// # Errors
    /// As for [`Journal::trim_progress`]; damage before the records read is not met.
    pub async fn trim_recent_progress_async(
        &self,
        task: &str,
        keep: u64,
        at: Timestamp,
        unheld_at: u64,
    ) -> Result<TrimmedStream> {
        self.trim_progress_reading(task, keep, at, Some(unheld_at))
            .await
    }

    async fn trim_progress_reading(
        &self,
        task: &str,
        keep: u64,
        at: Timestamp,
        unheld_at: Option<u64>,
    ) -> Result<TrimmedStream> {
        let (trimmed, reply) = self.submit_trim(task, keep, at, unheld_at)?;
        if let Some(reply) = reply {
            reply.await.map_err(|_| Error::Closed)??;
        }
        Ok(trimmed)
    }

    #[allow(
        clippy::type_complexity,
        reason = "a private pair, named at its callers"
    )]
    fn submit_trim(
        &self,
        task: &str,
        keep: u64,
        at: Timestamp,
        unheld_at: Option<u64>,
    ) -> Result<(
        TrimmedStream,
        Option<tokio::sync::oneshot::Receiver<Result<crate::Appended>>>,
    )> {
        let (base, stream) = self.read_for_trim(task, unheld_at)?;
        let updates: Vec<usize> = stream
            .iter()
            .enumerate()
            .filter(|(_, read)| {
                is_update(&read.event) || matches!(read.event, Event::UpdateTrimmed { .. })
            })
            .map(|(i, _)| i)
            .collect();
        let kept = usize::try_from(keep)
            .unwrap_or(usize::MAX)
            .min(updates.len());
        let trim: Vec<usize> = updates[..updates.len() - kept]
            .iter()
            .copied()
            .filter(|&i| is_update(&stream[i].event))
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
        let position_of = |i: usize| base + i as u64;
        let digest_of = |read: &Read| record::parse(&read.bytes).map(|frame| frame.digest);
        let corrupt = |i: usize, kind| Error::corruption(task, position_of(i), kind);
        // The creation is never an update: the first trimmed record has one before it, read
        // (a tail read starts at a record no trim rewrites).
        let mut prev = match from.checked_sub(1) {
            Some(before) => digest_of(&stream[before]).map_err(|kind| corrupt(before, kind))?,
            None if base == 0 => Digest::GENESIS,
            None => return Err(Error::Encode("a tail read that starts at an update".into())),
        };
        let mut trim = trim.into_iter().peekable();
        let mut replaced = Vec::with_capacity(stream.len() - from);
        let mut saved = 0u64;
        let mut last_before = prev;
        for (i, read) in stream.iter().enumerate().skip(from) {
            let frame = record::parse(&read.bytes).map_err(|kind| corrupt(i, kind))?;
            last_before = frame.digest;
            let unframed = if trim.next_if_eq(&i).is_some() {
                let stub = trimmed(&read.event, read.bytes.len() as u64)
                    .ok_or_else(|| Error::Encode("a trim of a record that is no update".into()))?;
                record::Unframed::encode(&stub).map_err(Error::Encode)?
            } else {
                record::Unframed::from_payload(frame.payload)
            };
            let (bytes, digest) = unframed
                .frame_as(frame.format, task, position_of(i), frame.seq, &prev)
                .map_err(|len| Error::Encode(format!("payload of {len} bytes")))?;
            saved += (read.bytes.len() as u64).saturating_sub(bytes.len() as u64);
            prev = digest;
            replaced.push((read.key.clone(), bytes));
        }
        let end = position_of(stream.len());
        let marker = Event::ProgressTrimmed {
            records: result.records,
            bytes: saved,
            digest_before: last_before.0,
            at,
        };
        let payload = record::Unframed::encode(&marker).map_err(Error::Encode)?;
        result.rewritten = replaced.len() as u64;
        result.bytes = saved;
        result.marker = Some((end, marker));
        let event = EncodedEvent {
            payload,
            effect: IndexEffect::Trim {
                replaced: replaced.into_boxed_slice(),
                chain_from: prev,
            },
        };
        let reply = self.enqueue(
            (JobTask::new(task), end, EncodedEvents::from_iter([event])),
            Vec::new(),
            never,
            None,
            None,
        )?;
        Ok((result, Some(reply)))
    }

    /// The records of `task`'s stream a trim reads — all of them, or with `unheld_at` its
    /// untrimmed tail ([`Journal::trim_recent_progress_async`]) — and the position of the
    /// first; refused for a stream without records, a purged one, or one on hold.
    fn read_for_trim(&self, task: &str, unheld_at: Option<u64>) -> Result<(u64, Vec<Read>)> {
        let refuse = |why| Error::NotTrimmable {
            task: task.to_owned(),
            why,
        };
        let (base, stream, on_hold) = match unheld_at {
            None => {
                let stream = self.read_raw(task)?;
                let on_hold = hold_after(stream.iter());
                (0, stream, on_hold)
            }
            Some(unheld_at) => {
                let (base, stream) = self.read_untrimmed_tail(task, unheld_at)?;
                let skip = usize::try_from(unheld_at.saturating_sub(base)).unwrap_or(usize::MAX);
                let on_hold = hold_after(stream.iter().skip(skip));
                (base, stream, on_hold)
            }
        };
        match stream.first() {
            None => Err(refuse(TrimRefusal::Unknown)),
            Some(first) if matches!(first.event, Event::Purged { .. }) => {
                Err(refuse(TrimRefusal::Purged))
            }
            Some(_) if on_hold => Err(refuse(TrimRefusal::OnHold)),
            Some(_) => Ok((base, stream)),
        }
    }

    /// `task`'s stream as stored — every record's key and bytes, checked (CRC, position,
    /// chain) and decoded — written or not yet durable alike: a trim frames them all again,
    /// and the writer takes it only if the stream is still that long.
    fn read_raw(&self, task: &str) -> Result<Vec<Read>> {
        let prefix = keys::task_prefix(task);
        checked(
            StreamCheck::new(task.to_owned(), 0, Some(Digest::GENESIS)),
            self.storage().scan(Space::Events, Range::prefix(&prefix)),
        )
    }

    /// The end of `task`'s stream a trim needs (see [`Journal::trim_recent_progress_async`]):
    /// read backwards to the newest trimmed update — trimmed updates being a stream's oldest,
    /// every update before it is trimmed too — or else to the first record, and at least back
    /// to `unheld_at`; then checked forwards (CRC, positions, the chain within what was read).
    /// Returns the first position read and the records from there on.
    fn read_untrimmed_tail(&self, task: &str, unheld_at: u64) -> Result<(u64, Vec<Read>)> {
        let prefix = keys::task_prefix(task);
        let mut back = Vec::new();
        let mut first = 0;
        for entry in self
            .storage()
            .scan(Space::Events, Range::prefix(&prefix).reversed())
        {
            let (key, bytes) = entry?;
            let position = keys::parse_event_key(&key)
                .map_err(|kind| Error::corruption(task, 0, kind))?
                .1;
            let event = record::parse(&bytes)
                .and_then(|frame| record::decode_payload(frame.payload))
                .map_err(|kind| Error::corruption(task, position, kind))?;
            first = position;
            back.push((key, bytes));
            if matches!(event, Event::UpdateTrimmed { .. }) && position <= unheld_at {
                break;
            }
        }
        let check = StreamCheck::new(task.to_owned(), first, None);
        let out = checked(check, back.into_iter().rev().map(Ok))?;
        Ok((first, out))
    }
}

/// Whether a hold stands after `records`, none standing before them.
fn hold_after<'a>(records: impl Iterator<Item = &'a Read>) -> bool {
    records.fold(false, |on_hold, read| match read.event {
        Event::Hold { .. } => true,
        Event::HoldLifted { .. } => false,
        _ => on_hold,
    })
}

/// The entries of a stream, in order, through `check` (CRC, positions, chain): the first
/// damage or gap met is the error.
fn checked(
    mut check: StreamCheck,
    entries: impl Iterator<Item = Result<crate::backend::KeyValue>>,
) -> Result<Vec<Read>> {
    let mut out = Vec::new();
    for entry in entries {
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

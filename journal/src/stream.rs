//! One task's stream read back and checked — CRC, position, hash chain, gaps — by the same
//! [`StreamCheck`] for a reader of one stream ([`StreamReader`]) and for the bulk reads, so
//! that both report exactly the same problems; and a single record read by its key.

use crate::backend::{Backend, Range};
use crate::error::{CorruptionKind, Error, Result};
use crate::event::Event;
use crate::keys::{self, Space};
use crate::record::{self, Digest, Record};

pub(crate) fn read_unchained(backend: &dyn Backend, task: &str, position: u64) -> Result<Record> {
    let bytes = backend
        .get(Space::Events, &keys::event_key(task, position))?
        .ok_or_else(|| Error::corruption(task, position, CorruptionKind::Missing))?;
    unchained(&bytes, task, position)
}

/// Checks a record's CRC and position (not its chain) and decodes it.
pub(crate) fn unchained(bytes: &[u8], task: &str, position: u64) -> Result<Record> {
    located(bytes, task, position)?
        .into_record()
        .map_err(|kind| Error::corruption(task, position, kind))
}

/// Checks a record's CRC and position (not its chain); its payload is left undecoded.
pub(crate) fn located<'b>(bytes: &'b [u8], task: &str, position: u64) -> Result<record::Frame<'b>> {
    let frame = record::parse(bytes).map_err(|kind| Error::corruption(task, position, kind))?;
    if frame.position != position {
        return Err(Error::corruption(
            task,
            position,
            CorruptionKind::Misplaced {
                found: frame.position,
            },
        ));
    }
    Ok(frame)
}

/// The checks of one task's stream, fed its entries in key order: CRC, position, hash chain,
/// gaps. Shared by [`StreamReader`] and the bulk reads of
/// [`crate::StreamScanner`], so both report exactly the same problems.
#[derive(Debug)]
pub(crate) struct StreamCheck {
    task: String,
    /// The next position expected.
    expected: u64,
    /// The digest the next record must chain from; `None` after damage (chain unknown).
    prev: Option<Digest>,
    /// Decode with [`record::decode_payload_lean`] (for the state fold).
    lean: bool,
    /// A lean decode's buffer for the next update's event id (see [`StreamCheck::recycle`]).
    spare: String,
}

/// What one entry of a stream amounts to.
#[allow(
    clippy::large_enum_variant,
    reason = "a transient return value, never stored"
)]
pub(crate) enum Checked {
    /// The record (or its damage).
    One(Result<Record>),
    /// A gap before the record: the first missing position, then the record.
    Gap(Error, u64),
}

impl StreamCheck {
    /// Checks `task`'s stream from `from`, whose previous record's digest is `prev`.
    pub(crate) fn new(task: String, from: u64, prev: Option<Digest>) -> Self {
        Self {
            task,
            expected: from,
            prev,
            lean: false,
            spare: String::new(),
        }
    }

    /// Decodes update events lean ([`record::decode_payload_lean`]).
    pub(crate) fn lean(mut self) -> Self {
        self.lean = true;
        self
    }

    /// Checks `task`'s stream from position 0 again, keeping the buffers: the task id's and
    /// the spare event id's (a bulk fold checks thousands of streams with one check).
    pub(crate) fn restart(&mut self, task: &str) {
        self.task.clear();
        self.task.push_str(task);
        self.expected = 0;
        self.prev = Some(Digest::GENESIS);
    }

    /// Takes the buffer of an update's event id decoded here, once the event is no longer
    /// needed: a lean decode writes the next update's event id into it instead of
    /// allocating one.
    pub(crate) fn recycle(&mut self, event: &mut Event) {
        if let Event::UpdateAppended { event_id, .. } = event {
            if self.lean && event_id.capacity() > self.spare.capacity() {
                self.spare = std::mem::take(event_id);
            }
        }
    }

    fn err(&self, position: u64, kind: CorruptionKind) -> Error {
        Error::corruption(&self.task, position, kind)
    }

    /// Checks one entry found in the task's key range. On [`Checked::Gap`], the record comes
    /// from [`StreamCheck::decode`] at the position returned.
    pub(crate) fn entry(&mut self, key: &[u8], value: &[u8]) -> Checked {
        let position = match keys::position_in(&self.task, key) {
            Ok(position) => position,
            Err(kind) => {
                self.prev = None;
                return Checked::One(Err(self.err(self.expected, kind)));
            }
        };
        if position > self.expected {
            // A gap: report the first missing position, then the record after the gap.
            let missing = self.expected;
            self.prev = None;
            self.expected = position;
            return Checked::Gap(self.err(missing, CorruptionKind::Missing), position);
        }
        Checked::One(self.decode(position, value))
    }

    /// Whether `frame`, the first record of its stream, is a purge's tombstone
    /// ([`Event::Purged`]) chained from the digest it names — the last deleted record's —
    /// instead of from the genesis digest.
    fn is_tombstone(&self, frame: &record::Frame<'_>) -> bool {
        let Ok(record) = (*frame).into_record() else {
            return false;
        };
        matches!(
            record.event,
            Event::Purged { records, last_digest, .. }
                if records > 0 && frame.chains_from(&Digest(last_digest), &self.task)
        )
    }

    /// Verifies and decodes the record at `position`.
    pub(crate) fn decode(&mut self, position: u64, bytes: &[u8]) -> Result<Record> {
        self.expected = position + 1;
        let frame = match record::parse(bytes) {
            Ok(frame) => frame,
            Err(kind) => {
                self.prev = None;
                return Err(self.err(position, kind));
            }
        };
        let prev = self.prev.replace(frame.digest);
        if frame.position != position {
            // The record belongs elsewhere: its digest says nothing about this position, so
            // the next record's chain cannot be checked either.
            self.prev = None;
            return Err(self.err(
                position,
                CorruptionKind::Misplaced {
                    found: frame.position,
                },
            ));
        }
        if let Some(prev) = prev {
            let chained = frame.chains_from(&prev, &self.task)
                || (position == 0 && self.is_tombstone(&frame));
            if !chained {
                return Err(self.err(position, CorruptionKind::Chain));
            }
        }
        if self.lean {
            frame.into_lean_record_reusing(&mut self.spare)
        } else {
            frame.into_record()
        }
        .map_err(|kind| self.err(position, kind))
    }
}

/// Iterator over one task's records; see [`Journal::read_stream`](crate::Journal::read_stream).
pub struct StreamReader<'a> {
    raw: Option<crate::backend::RawIter<'a>>,
    check: StreamCheck,
    /// A gap found before this record was reported; the record itself comes next.
    pending: Option<(u64, Box<[u8]>)>,
    /// The durable watermark: the stream ends before a record above it.
    durable: u64,
    /// The first entry read, when it was not the record before `from` (read first, in the
    /// same scan, for the digest the stream chains from).
    first: Option<Result<crate::backend::KeyValue>>,
    done: bool,
}

impl<'a> StreamReader<'a> {
    /// A reader of `task`'s stream from `from`, ending before any record above `durable`.
    ///
    /// From a later position, the record before it is read by the same scan as the records
    /// after it (a separate read could see it before a trim rewrote the stream and the rest
    /// after, and report an intact chain broken); when it is not there, or not intact, the
    /// first record is not checked against it.
    pub(crate) fn new(backend: &'a dyn Backend, task: &str, from: u64, durable: u64) -> Self {
        let range = Range {
            lower: keys::event_key(task, from.saturating_sub(1)),
            upper: crate::backend::prefix_end(&keys::task_prefix(task)),
            reverse: false,
        };
        let mut raw = backend.scan(Space::Events, range);
        let (mut prev, mut first) = (Some(Digest::GENESIS), None);
        if from > 0 {
            prev = None;
            match raw.next() {
                Some(Ok((key, value)))
                    if keys::parse_event_key(&key).is_ok_and(|(_, p)| p == from - 1) =>
                {
                    prev = record::parse(&value).ok().map(|frame| frame.digest);
                }
                other => first = other,
            }
        }
        Self {
            raw: Some(raw),
            check: StreamCheck::new(task.to_owned(), from, prev),
            pending: None,
            durable,
            first,
            done: false,
        }
    }
}

impl Iterator for StreamReader<'_> {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if let Some((position, bytes)) = self.pending.take() {
            return match self.check.decode(position, &bytes) {
                Ok(record) if record.seq > self.durable => {
                    self.done = true;
                    None
                }
                result => Some(result),
            };
        }
        let item = match self
            .first
            .take()
            .or_else(|| self.raw.as_mut().and_then(Iterator::next))
        {
            None => {
                self.raw = None;
                self.done = true;
                return None;
            }
            Some(Err(e)) => {
                self.done = true;
                return Some(Err(e));
            }
            Some(Ok(item)) => item,
        };
        let (key, value) = item;
        match self.check.entry(&key, &value) {
            Checked::One(Ok(record)) if record.seq > self.durable => {
                // Written, not yet durable: the stream ends here for this process's readers.
                self.done = true;
                None
            }
            Checked::One(result) => Some(result),
            Checked::Gap(missing, position) => {
                self.pending = Some((position, value));
                Some(Err(missing))
            }
        }
    }
}

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

/// How many times a [`StreamReader`] reads its stream again from the start when the stream
/// changed under it.
const REREADS: u32 = 3;

/// Iterator over one task's records; see [`Journal::read_stream`](crate::Journal::read_stream).
///
/// On a store that reads a long scan in several snapshots ([`Backend::scan_snapshot_rows`]:
/// PostgreSQL's pages), another process may trim the stream (frame its records again) or
/// purge it (delete them) between two of them. A reader past the first snapshot that meets
/// a record not chained on the one before it, or whose stream ends, looks again: it reads the
/// stream again from the start, checks the records it handed out already without handing
/// them out again, and goes on from where it was, in the stream as it is now — or, when the
/// stream no longer reaches that far (purged), says so with a storage error (not damage:
/// read it again). A chain broken within one snapshot, or again in each of its three further
/// readings, is reported as damage.
pub struct StreamReader<'a> {
    backend: &'a dyn Backend,
    /// The position the read starts from.
    from: u64,
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
    /// The rows the scan returned so far, and the last of them.
    rows: usize,
    last: Option<crate::backend::KeyValue>,
    /// The positions below this were handed out before the stream was read again: they are
    /// checked, not handed out again.
    resume: u64,
    /// How many times the stream was read again.
    rereads: u32,
}

/// A scan of `task`'s stream from `from`, with the check of its first record: the record
/// before `from` is read by the same scan as the records after it (a separate read could
/// see it before a trim rewrote the stream and the rest after, and report an intact chain
/// broken); when it is not there, or not intact, the first record is not checked against
/// it. Also the rows that took, and the entry read that was not the record before `from`.
#[allow(
    clippy::type_complexity,
    reason = "one private constructor's parts, taken apart at once"
)]
fn scan_from<'a>(
    backend: &'a dyn Backend,
    task: &str,
    from: u64,
) -> (
    crate::backend::RawIter<'a>,
    StreamCheck,
    usize,
    Option<Result<crate::backend::KeyValue>>,
) {
    let range = Range {
        lower: keys::event_key(task, from.saturating_sub(1)),
        upper: crate::backend::prefix_end(&keys::task_prefix(task)),
        reverse: false,
    };
    let mut raw = backend.scan(Space::Events, range);
    let (mut prev, mut first, mut rows) = (Some(Digest::GENESIS), None, 0);
    if from > 0 {
        prev = None;
        match raw.next() {
            Some(Ok((key, value)))
                if keys::parse_event_key(&key).is_ok_and(|(_, p)| p == from - 1) =>
            {
                rows = 1;
                prev = record::parse(&value).ok().map(|frame| frame.digest);
            }
            other => first = other,
        }
    }
    (
        raw,
        StreamCheck::new(task.to_owned(), from, prev),
        rows,
        first,
    )
}

impl<'a> StreamReader<'a> {
    /// A reader of `task`'s stream from `from`, ending before any record above `durable`.
    pub(crate) fn new(backend: &'a dyn Backend, task: &str, from: u64, durable: u64) -> Self {
        let (raw, check, rows, first) = scan_from(backend, task, from);
        Self {
            backend,
            from,
            raw: Some(raw),
            check,
            pending: None,
            durable,
            first,
            done: false,
            rows,
            last: None,
            resume: 0,
            rereads: 0,
        }
    }

    /// Whether the scan read past the rows its store reads in one snapshot (`ended`: or read
    /// them all and then found no more, in another).
    fn spanned(&self, ended: bool) -> bool {
        let one = self.backend.scan_snapshot_rows();
        self.rows > one || (ended && self.rows == one)
    }

    /// Reads the stream again from the start, to go on at `at` (and not before the position
    /// it was to go on at already); `false` when it was read again as often as it may be.
    fn reread(&mut self, at: u64) -> bool {
        if self.rereads == REREADS {
            return false;
        }
        self.rereads += 1;
        self.resume = self.resume.max(at);
        let task = std::mem::take(&mut self.check.task);
        let (raw, check, rows, first) = scan_from(self.backend, &task, self.from);
        self.raw = Some(raw);
        self.check = check;
        self.rows = rows;
        self.first = first;
        self.pending = None;
        self.last = None;
        self.done = false;
        true
    }

    /// Whether the last row the scan read is still there as it was read.
    fn last_unchanged(&self) -> Result<bool> {
        let Some((key, value)) = &self.last else {
            return Ok(true);
        };
        Ok(self.backend.get(Space::Events, key)?.as_deref() == Some(&value[..]))
    }

    /// The next record as the scan reads it, checked.
    fn step(&mut self) -> Option<Result<Record>> {
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
        self.rows += 1;
        let (key, value) = item;
        let checked = match self.check.entry(&key, &value) {
            Checked::One(Ok(record)) if record.seq > self.durable => {
                // Written, not yet durable: the stream ends here for this process's readers.
                self.done = true;
                None
            }
            Checked::One(result) => Some(result),
            Checked::Gap(missing, position) => {
                self.pending = Some((position, value.clone()));
                Some(Err(missing))
            }
        };
        self.last = Some((key, value));
        checked
    }
}

impl Iterator for StreamReader<'_> {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let item = self.step();
            match &item {
                // Not chained on the record before it, read in an earlier snapshot: framed
                // again since (trimmed), perhaps.
                Some(Err(Error::Corruption {
                    position,
                    kind: CorruptionKind::Chain,
                    ..
                })) if self.spanned(false) && self.reread(*position) => {}
                // Read again, the stream ends before what was handed out: deleted since.
                None if self.check.expected < self.resume => {
                    (self.resume, self.last) = (0, None);
                    return Some(Err(Error::storage(format!(
                        "the stream of task {:?} was purged while it was read (by another \
                         process): read it again",
                        self.check.task
                    ))));
                }
                // The end, past the first snapshot: there if the last row read is still
                // there; deleted since (purged), perhaps.
                None if self.raw.is_none() && self.spanned(true) => match self.last_unchanged() {
                    Ok(false) if self.reread(self.check.expected) => {}
                    // Looked at once: the reader stays ended.
                    unchanged => {
                        self.last = None;
                        return match unchanged {
                            Ok(true) => None,
                            Ok(false) => Some(Err(Error::storage(format!(
                                "the stream of task {:?} changed while it was read, {} times: \
                                 read it again",
                                self.check.task,
                                REREADS + 1
                            )))),
                            Err(e) => Some(Err(e)),
                        };
                    }
                },
                // Handed out before the stream was read again: records and damage alike
                // (a damaged record is reported once however often the stream is read).
                Some(Ok(record)) if record.position < self.resume => {}
                Some(Err(Error::Corruption { position, .. })) if *position < self.resume => {}
                _ => return item,
            }
        }
    }
}

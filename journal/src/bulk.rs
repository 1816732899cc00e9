//! Bulk reads: many task streams in one forward pass.
//!
//! [`Journal::read_stream`](crate::Journal::read_stream) seeks to one task's records. Recovery
//! and audits read thousands of streams in task order; a [`StreamScanner`] reads them with one
//! forward cursor that steps over what lies between consecutive tasks instead of seeking (or,
//! for an audit, reads every task in turn: [`StreamScanner::read_next`]), and copies each
//! stream's raw entries into one buffer ([`RawStream`]) so that another thread can verify and
//! decode them. The checks are the very ones of `read_stream`, in the same order, with the
//! same errors.

use crate::backend::{Backend, Cursor, Source};
use crate::error::{Error, Result};
use crate::keys::{self, Space};
use crate::record::{Digest, Record};
use crate::stream::{Checked, StreamCheck};

/// How many entries a cursor steps over before it seeks instead.
const SKIP_LIMIT: usize = 16;

/// A cursor with what is known of its position.
pub(crate) struct Positioned<'a> {
    cursor: Box<dyn Cursor + 'a>,
    /// How many entries [`Positioned::reach`] steps over before it seeks instead.
    skip_limit: usize,
    /// The cursor stands at the first key at or after this one; `None` before the first seek
    /// and after an error.
    at: Option<Vec<u8>>,
}

impl<'a> Positioned<'a> {
    /// A cursor not positioned yet.
    pub(crate) fn new(cursor: Box<dyn Cursor + 'a>) -> Self {
        Self::with_skip_limit(cursor, SKIP_LIMIT)
    }

    /// A cursor not positioned yet, that steps over up to `skip_limit` entries before it
    /// seeks (none: it always seeks).
    pub(crate) fn with_skip_limit(cursor: Box<dyn Cursor + 'a>, skip_limit: usize) -> Self {
        Self {
            cursor,
            skip_limit,
            at: None,
        }
    }

    /// The current key.
    pub(crate) fn key(&self) -> Option<&[u8]> {
        self.cursor.key()
    }

    /// The current value.
    pub(crate) fn value(&self) -> Option<&[u8]> {
        self.cursor.value()
    }

    /// Moves to the first key at or after `target`, stepping forward when that is near.
    pub(crate) fn reach(&mut self, target: &[u8]) {
        match &self.at {
            Some(at) if at.as_slice() <= target => {
                let mut steps = 0;
                while let Some(key) = self.cursor.key() {
                    if key >= target {
                        break;
                    }
                    if steps == self.skip_limit {
                        self.cursor.seek(target);
                        break;
                    }
                    self.cursor.next();
                    steps += 1;
                }
            }
            _ => self.cursor.seek(target),
        }
        self.stand_at(target);
    }

    /// Records that the cursor stands at the first key at or after `key`, reusing the
    /// buffer of the last such key (a scan over many tasks allocates nothing per task).
    fn stand_at(&mut self, key: &[u8]) {
        match &mut self.at {
            Some(at) => {
                at.clear();
                at.extend_from_slice(key);
            }
            None => self.at = Some(key.to_vec()),
        }
    }

    /// The storage error, if any; the position is forgotten after one.
    pub(crate) fn status(&mut self) -> Result<()> {
        let status = self.cursor.status();
        if status.is_err() {
            self.at = None;
        }
        status
    }
}

/// Reads task streams in one forward pass; see the module docs. Reading tasks in ascending
/// id order is fastest; any order is correct. Making one turns RocksDB's per-thread
/// performance counters off on the calling thread (nothing in dtask reads them; counting
/// every key stepped over cost a bulk read 1–2 % of its CPU).
pub struct StreamScanner<'a> {
    /// Every stream's records.
    events: Positioned<'a>,
    /// The records of the streams without a terminal record, where the backend keeps them
    /// apart ([`Backend::live_records_cursor`]): [`StreamScanner::read_into`] looks there
    /// first, so that a recovery, which reads live tasks, steps over no finished stream.
    live: Option<Positioned<'a>>,
    /// Scratch: the first key of the task being read, and the first key after its records.
    lower: Vec<u8>,
    upper: Vec<u8>,
    /// [`StreamScanner::read_next`] reached the end (or a storage error).
    exhausted: bool,
    /// Each stream read ends before its first record of a higher global sequence: the
    /// readers' horizon of the journal ([`Journal::visible_stream_scanner`]), or `u64::MAX`.
    ///
    /// [`Journal::visible_stream_scanner`]: crate::Journal::visible_stream_scanner
    visible: u64,
}

impl std::fmt::Debug for StreamScanner<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamScanner").finish_non_exhaustive()
    }
}

impl<'a> StreamScanner<'a> {
    pub(crate) fn new(backend: &'a dyn Backend, visible: u64) -> Self {
        crate::backend::perf_counters_off();
        // The live cursor is made first: a stream moved to the finished ones after it was
        // made is seen whole by it, and one moved before by the other (see `crate::merge`).
        let live = backend.live_records_cursor().map(Positioned::new);
        Self {
            live,
            events: Positioned::new(backend.cursor(Space::Events)),
            lower: Vec::new(),
            upper: Vec::new(),
            exhausted: false,
            visible,
        }
    }

    /// Reads `task`'s whole stream (raw entries), unverified.
    pub fn read(&mut self, task: &str) -> RawStream {
        let mut stream = RawStream::default();
        self.read_into(task, &mut stream);
        stream
    }

    /// [`StreamScanner::read`] into `stream`, reusing its buffers (what it held before is
    /// replaced): a loop over many tasks allocates nothing per task for the raw bytes. A
    /// stream is looked for among the live ones first, where the backend keeps them apart,
    /// and among all only when it is not there (a finished stream, or no stream).
    pub fn read_into(&mut self, task: &str, stream: &mut RawStream) {
        self.begin(task, stream);
        if let Some(live) = &mut self.live {
            read_range(live, &self.lower, &self.upper, stream);
            if !stream.entries.is_empty() || stream.error.is_some() {
                return;
            }
        }
        read_range(&mut self.events, &self.lower, &self.upper, stream);
    }

    /// Empties `stream` for `task`'s records and sets the range they lie in.
    fn begin(&mut self, task: &str, stream: &mut RawStream) {
        stream.task.clear();
        stream.task.push_str(task);
        stream.data.clear();
        stream.entries.clear();
        stream.error = None;
        stream.split = false;
        stream.visible = self.visible;
        keys::event_key_into(task, 0, &mut self.lower);
        // A task's records end before the task id followed by the byte after the separator.
        keys::task_end_into(task, &mut self.upper);
    }

    /// Makes [`StreamScanner::read_next`] go on from the first task after `task` (whether or
    /// not `task` has records): where a listing resumes after the last task of its previous
    /// page. One seek.
    pub fn skip_past(&mut self, task: &str) {
        keys::task_end_into(task, &mut self.upper);
        self.events.reach(&self.upper);
        self.exhausted = false;
    }

    /// Reads the stream of the first task at or after where the last read ended (the first
    /// task of the journal at the start) into `stream`; `false` when no task is left. With it
    /// an audit reads every task in task order in one pass. A key that names no task comes as
    /// a stream of that key alone, with a [`crate::CorruptionKind::Key`] error, and the scan
    /// goes on after it.
    pub fn read_next(&mut self, stream: &mut RawStream) -> bool {
        if self.exhausted {
            return false;
        }
        if self.events.at.is_none() {
            self.events.reach(&[]);
        }
        let Some(key) = self.events.cursor.key() else {
            self.exhausted = true;
            stream.task.clear();
            stream.data.clear();
            stream.entries.clear();
            stream.split = false;
            stream.error = self.events.status().err();
            return stream.error.is_some();
        };
        match keys::parse_event_key(key) {
            Ok((task, _)) => {
                let task = task.to_owned();
                self.begin(&task, stream);
                read_range(&mut self.events, &self.lower, &self.upper, stream);
                // Past the last possible task (a storage error, or no key after it).
                self.exhausted = self.events.at.is_none();
            }
            Err(kind) => {
                let mut after = key.to_vec();
                after.push(0);
                stream.task = String::from_utf8_lossy(key).into_owned();
                stream.data.clear();
                stream.entries.clear();
                stream.split = false;
                stream.error = Some(Error::corruption(&stream.task, 0, kind));
                self.events.reach(&after);
            }
        }
        true
    }
}

/// Appends the entries of `cursor` from `lower` up to `upper` to `stream`, and a storage
/// error, if one ends them.
fn read_range(cursor: &mut Positioned<'_>, lower: &[u8], upper: &[u8], stream: &mut RawStream) {
    cursor.reach(lower);
    let (mut first, mut second) = (false, false);
    while let (Some(key), Some(value)) = (cursor.cursor.key(), cursor.cursor.value()) {
        if key >= upper {
            break;
        }
        match cursor.cursor.source() {
            Source::First => first = true,
            Source::Second => second = true,
            Source::Both => (first, second) = (true, true),
        }
        let start = stream.data.len();
        stream.data.extend_from_slice(key);
        let split = stream.data.len();
        stream.data.extend_from_slice(value);
        stream.entries.push((start, split, stream.data.len()));
        cursor.cursor.next();
    }
    cursor.stand_at(upper);
    stream.split = first && second;
    if let Err(e) = cursor.status() {
        stream.error = Some(e);
    }
}

/// One task's stream as read by a [`StreamScanner`]: raw, not yet verified. Verify and decode
/// it with [`RawStream::into_records`] (or [`RawStream::fold_records`] to keep the buffers
/// for the next [`StreamScanner::read_into`]).
#[derive(Debug)]
pub struct RawStream {
    task: String,
    /// Keys and values, back to back.
    data: Vec<u8>,
    /// (key start, key end = value start, value end) in `data`.
    entries: Vec<(usize, usize, usize)>,
    /// The storage error that cut the stream short.
    error: Option<Error>,
    /// Its records were found in both places of a space kept in two ([`RawStream::is_split`]).
    split: bool,
    /// The walk ends before the first record of a higher global sequence (the scanner's
    /// horizon).
    visible: u64,
    /// The check [`RawStream::fold_records`] walks with, kept between streams with its
    /// buffers (boxed: a stream that is never folded carries a pointer, not a check).
    fold_check: Option<Box<StreamCheck>>,
}

impl Default for RawStream {
    /// An empty stream, to be filled by [`StreamScanner::read_into`].
    fn default() -> Self {
        Self {
            task: String::new(),
            data: Vec::new(),
            entries: Vec::new(),
            error: None,
            split: false,
            visible: u64::MAX,
            fold_check: None,
        }
    }
}

impl RawStream {
    /// The task.
    #[must_use]
    pub fn task(&self) -> &str {
        &self.task
    }

    /// The number of entries read (records, intact or not).
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the stream has no entries.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The bytes its entries hold (keys and values): what it costs in memory.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Takes the error that stands in for the stream when it has no entries: a key that
    /// names no task ([`StreamScanner::read_next`] reports one as a stream of its own, with a
    /// [`crate::CorruptionKind::Key`] error), or a storage error before its first record.
    /// `None` for a stream with entries, whose error (if any) its walk reports after them.
    pub fn take_error_of_empty(&mut self) -> Option<Error> {
        if self.entries.is_empty() {
            self.error.take()
        } else {
            None
        }
    }

    /// Whether its records were found in both column families of the `events` space of a
    /// RocksDB journal of format 4 (or one key in both). After every batch a stream lies
    /// wholly in one of them, so this is damage — or a bug — that reads do not see (they read
    /// the two as one) but recovery could: it looks for a live stream in `events` alone.
    /// The audit reports it.
    #[must_use]
    pub fn is_split(&self) -> bool {
        self.split
    }

    /// The verified records, exactly as [`Journal::read_stream`](crate::Journal::read_stream)
    /// from position 0 yields them: every record's CRC, position and hash chain is checked,
    /// damage is reported per record and iteration continues.
    #[must_use]
    pub fn into_records(self) -> RawRecords {
        let walk = Walk::new(&self.task, false);
        RawRecords { stream: self, walk }
    }

    /// The records as the state fold needs them, without giving the stream up: decoded from
    /// its buffers, which stay for the next [`StreamScanner::read_into`], and verified as
    /// [`RawStream::into_records`] verifies them, but an `UpdateAppended` event comes without
    /// its `kind`, `data` and `metadata` (checked, not copied; see
    /// [`crate::record::decode_payload_lean`]). Recovery folds with these. (The stream's
    /// storage error is consumed by the walk.)
    ///
    /// Hand each record back with [`Records::recycle`] once it has been folded: the next
    /// update then reuses its event id's buffer, and a stream of updates decodes without
    /// allocating.
    pub fn fold_records(&mut self) -> Records<'_> {
        let (walk, slot) = match self.fold_check.take() {
            Some(mut slot) => {
                let mut check =
                    std::mem::replace(&mut *slot, StreamCheck::new(String::new(), 0, None));
                check.restart(&self.task);
                (Walk::with_check(check), Some(slot))
            }
            None => (Walk::new(&self.task, true), None),
        };
        Records {
            stream: self,
            walk,
            slot,
        }
    }
}

/// Where a walk over a [`RawStream`]'s entries is.
struct Walk {
    check: StreamCheck,
    next: usize,
    /// A gap was reported before the record at this position (entry index).
    pending: Option<(u64, usize)>,
    done: bool,
}

impl Walk {
    fn new(task: &str, lean: bool) -> Self {
        let check = StreamCheck::new(task.to_owned(), 0, Some(Digest::GENESIS));
        Self::with_check(if lean { check.lean() } else { check })
    }

    /// A walk from the start of the stream `check` checks.
    fn with_check(check: StreamCheck) -> Self {
        Self {
            check,
            next: 0,
            pending: None,
            done: false,
        }
    }

    fn next(&mut self, stream: &mut RawStream) -> Option<Result<Record>> {
        if self.done {
            return None;
        }
        if let Some((position, entry)) = self.pending.take() {
            let (_, split, end) = stream.entries[entry];
            let result = self.check.decode(position, &stream.data[split..end]);
            return self.unless_past(result, stream.visible);
        }
        let Some(&(start, split, end)) = stream.entries.get(self.next) else {
            self.done = true;
            return stream.error.take().map(Err);
        };
        let entry = self.next;
        self.next += 1;
        let data = &stream.data;
        match self.check.entry(&data[start..split], &data[split..end]) {
            Checked::One(result) => self.unless_past(result, stream.visible),
            Checked::Gap(missing, position) => {
                self.pending = Some((position, entry));
                Some(Err(missing))
            }
        }
    }

    /// `result`, unless it is a record past the `visible` horizon: the stream ends before it,
    /// as [`Journal::read_stream`](crate::Journal::read_stream)'s does.
    fn unless_past(&mut self, result: Result<Record>, visible: u64) -> Option<Result<Record>> {
        match result {
            Ok(record) if record.seq > visible => {
                self.done = true;
                None
            }
            result => Some(result),
        }
    }
}

/// The verified records of a [`RawStream`], owning it; see [`RawStream::into_records`].
pub struct RawRecords {
    stream: RawStream,
    walk: Walk,
}

impl std::fmt::Debug for RawRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawRecords")
            .field("task", &self.stream.task)
            .finish_non_exhaustive()
    }
}

impl RawRecords {
    /// The task.
    #[must_use]
    pub fn task(&self) -> &str {
        &self.stream.task
    }
}

impl Iterator for RawRecords {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Self::Item> {
        self.walk.next(&mut self.stream)
    }
}

/// The verified records of a borrowed [`RawStream`]; see [`RawStream::fold_records`].
pub struct Records<'a> {
    stream: &'a mut RawStream,
    walk: Walk,
    /// The box the walk's check goes back into (the stream's, once it has folded before).
    slot: Option<Box<StreamCheck>>,
}

impl std::fmt::Debug for Records<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Records")
            .field("task", &self.stream.task)
            .finish_non_exhaustive()
    }
}

impl Records<'_> {
    /// Takes the buffers of a record these records yielded, once its event is no longer
    /// needed (its update's event id is left empty): the next update is decoded into them
    /// instead of new ones.
    pub fn recycle(&mut self, record: &mut Record) {
        self.walk.check.recycle(&mut record.event);
    }
}

impl Iterator for Records<'_> {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Self::Item> {
        self.walk.next(self.stream)
    }
}

impl Drop for Records<'_> {
    /// Keeps the check (its buffers) in the stream for its next [`RawStream::fold_records`].
    fn drop(&mut self) {
        let check = std::mem::replace(
            &mut self.walk.check,
            StreamCheck::new(String::new(), 0, None),
        );
        self.stream.fold_check = Some(match self.slot.take() {
            Some(mut slot) => {
                *slot = check;
                slot
            }
            None => Box::new(check),
        });
    }
}

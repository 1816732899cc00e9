//! What the writer, the syncer and the journal's readers share: the durable watermark, the
//! stop after a failed sync, the counts of what is queued and in flight, and the heads
//! recovery hands the writer.

use super::PRIMED_LIMIT;
use crate::error::Error;
use crate::head::Head;
use crate::observe::{BatchWritten, WriteObserver};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::watch;

/// [`Shared::write_failure`]: the last batch was written, or none was tried.
pub(crate) const WRITTEN: u8 = 0;
/// [`Shared::write_failure`]: the last batch failed for want of room.
pub(crate) const FAILED_NO_SPACE: u8 = 1;
/// [`Shared::write_failure`]: the last batch failed otherwise.
pub(crate) const FAILED_OTHERWISE: u8 = 2;

/// What the writer, the syncer and the journal's readers share.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The sequence up to which every record is durable (per the journal's [`Durability`](crate::Durability)):
    /// readers of this process stop there.
    pub(super) durable: AtomicU64,
    /// Why the journal stopped, once a sync failed.
    pub(super) stopped: OnceLock<String>,
    /// How the last batch the writer tried failed ([`FAILED_NO_SPACE`],
    /// [`FAILED_OTHERWISE`]), until one is written ([`WRITTEN`]).
    pub(super) write_failure: AtomicU8,
    /// Batches handed to the syncer and not yet settled.
    pub(super) in_flight: AtomicU64,
    /// The appends of those batches: how many callers wait for a sync now
    /// ([`LINGER_WHEN_WAITING`](super::LINGER_WHEN_WAITING)).
    pub(super) in_flight_appends: AtomicU64,
    /// Heads handed over before the writer's first batch ([`Shared::prime`]).
    pub(super) primed: Mutex<Primed>,
    /// The durable watermark again, for those who wait for it to move.
    pub(super) durable_tx: watch::Sender<u64>,
    /// Jobs submitted and not yet taken by the writer.
    pub(super) queued: AtomicUsize,
    /// Asynchronous appends that found the journal idle and yielded once before deciding
    /// whether to write inline ([`Shared::intend`]).
    pub(super) intending: AtomicUsize,
    /// Who is told what the write path does, once installed.
    pub(super) observer: OnceLock<Arc<dyn WriteObserver>>,
}

/// An asynchronous append's intent to write inline, counted while it lasts
/// ([`Shared::intend`]).
pub(crate) struct Intent<'a>(&'a AtomicUsize);

impl Intent<'_> {
    /// Whether no other append has an intent out: this one may write inline.
    pub(crate) fn alone(&self) -> bool {
        self.0.load(Ordering::Acquire) == 1
    }
}

impl Drop for Intent<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Heads read off the journal by someone else (recovery's fold) for the writer to use instead
/// of reading them again, each at most once. Kept compact — the ids back to back in one
/// string, the entries sorted by id — since it holds one entry per live task until each
/// task's first append (~70 bytes plus the id, against ~150 in a map of strings).
#[derive(Debug, Default)]
pub(super) struct Primed {
    /// Every id, back to back.
    ids: String,
    /// (start, end) of the id in `ids`, and the head; sorted by id. A taken head is marked
    /// with `next_position == u64::MAX`.
    entries: Vec<(u32, u32, Head)>,
    /// Entries not taken yet; at 0 the buffers are freed.
    remaining: usize,
    /// The writer began its first batch: heads read before it may be stale from now on.
    closed: bool,
}

impl Primed {
    pub(super) fn id(&self, entry: &(u32, u32, Head)) -> &str {
        self.ids
            .get(entry.0 as usize..entry.1 as usize)
            .unwrap_or_default()
    }

    pub(super) fn take(&mut self, task: &str) -> Option<Head> {
        let at = self
            .entries
            .binary_search_by(|entry| self.id(entry).cmp(task))
            .ok()?;
        let head = &mut self.entries.get_mut(at)?.2;
        if head.next_position == u64::MAX {
            return None;
        }
        let taken = std::mem::replace(
            head,
            Head {
                next_position: u64::MAX,
                ..Head::default()
            },
        );
        self.remaining = self.remaining.saturating_sub(1);
        if self.remaining == 0 {
            // Every head was taken: give the memory back.
            self.ids = String::new();
            self.entries = Vec::new();
        }
        Some(taken)
    }
}

impl Shared {
    /// A journal whose records up to `durable` are all durable.
    pub(crate) fn new(durable: u64) -> Self {
        Self {
            durable: AtomicU64::new(durable),
            stopped: OnceLock::new(),
            write_failure: AtomicU8::new(WRITTEN),
            in_flight: AtomicU64::new(0),
            in_flight_appends: AtomicU64::new(0),
            primed: Mutex::new(Primed::default()),
            durable_tx: watch::Sender::new(durable),
            queued: AtomicUsize::new(0),
            intending: AtomicUsize::new(0),
            observer: OnceLock::new(),
        }
    }

    /// Installs `observer`; `false` when one is installed already.
    pub(crate) fn observe(&self, observer: Arc<dyn WriteObserver>) -> bool {
        self.observer.set(observer).is_ok()
    }

    /// The observer, if one is installed.
    pub(crate) fn observer(&self) -> Option<&dyn WriteObserver> {
        self.observer.get().map(AsRef::as_ref)
    }

    /// Whether a job is queued for the writer thread or a written batch waits for its sync:
    /// an append that finds the journal busy goes to the writer thread.
    pub(crate) fn busy(&self) -> bool {
        self.queued.load(Ordering::Relaxed) != 0 || self.in_flight.load(Ordering::Acquire) != 0
    }

    /// Counts an asynchronous append's intent to write inline until the [`Intent`] is
    /// dropped. Appends made together by one task (`join_all` over several) are each polled
    /// in turn on one thread: if the first wrote and synced inline at once, the next would
    /// find the journal idle again and do the same — one sync each instead of one batch for
    /// all. So an asynchronous append that finds the journal idle counts itself here and
    /// yields once; when it runs again, it writes inline only if it is still the only one
    /// counted ([`Intent::alone`]), and otherwise goes to the writer thread with the others.
    pub(crate) fn intend(&self) -> Intent<'_> {
        self.intending.fetch_add(1, Ordering::AcqRel);
        Intent(&self.intending)
    }

    /// Tells the observer of a batch whose every append was refused.
    pub(super) fn refused(&self, conflicts: usize, queued: usize) {
        if let (Some(observer), true) = (self.observer(), conflicts > 0) {
            observer.batch_written(&BatchWritten {
                appends: 0,
                conflicts,
                records: 0,
                bytes: 0,
                queued,
                write: Duration::ZERO,
            });
        }
    }

    /// A receiver of the durable watermark, which changes after each sync.
    pub(crate) fn watch_durable(&self) -> watch::Receiver<u64> {
        self.durable_tx.subscribe()
    }

    /// Counts a job handed to the writer.
    pub(crate) fn queue(&self) {
        self.queued.fetch_add(1, Ordering::Relaxed);
    }

    /// Uncounts a job that never reached the writer.
    pub(crate) fn unqueue(&self) {
        self.queued.fetch_sub(1, Ordering::Relaxed);
    }

    /// Hands the writer `heads` (read off the journal) so that it need not read them itself;
    /// `false`, and nothing taken, once the writer has begun its first batch: a head read
    /// before an append may be stale after it, and before the first append none is. The writer
    /// takes each head at most once, at the first append to its task, and trusts it (the
    /// caller must have read it from this journal after it was opened).
    pub(crate) fn prime<'a>(&self, heads: impl IntoIterator<Item = (&'a str, Head)>) -> bool {
        let Ok(mut primed) = self.primed.lock() else {
            return false;
        };
        if primed.closed {
            return false;
        }
        let primed = &mut *primed;
        let before = primed.entries.len();
        for (task, head) in heads {
            let start = primed.ids.len();
            let end = start + task.len();
            let (Ok(start), Ok(end)) = (u32::try_from(start), u32::try_from(end)) else {
                break;
            };
            if primed.entries.len() >= PRIMED_LIMIT || head.next_position == u64::MAX {
                break;
            }
            primed.ids.push_str(task);
            primed.entries.push((start, end, head));
        }
        // Recovery hands them over in id order already, chunk after chunk: what was there is
        // sorted, and stays so when the new ones follow it in order. Any other order is sorted
        // here (the first of equal ids kept).
        let ids = &primed.ids;
        let id = |entry: &(u32, u32, Head)| ids.get(entry.0 as usize..entry.1 as usize);
        let added = primed.entries.len() - before;
        let joined = primed
            .entries
            .get(before.saturating_sub(1)..)
            .unwrap_or_default();
        if joined.is_sorted_by(|a, b| id(a) < id(b)) {
            primed.remaining += added;
        } else {
            primed.entries.sort_by(|a, b| id(a).cmp(&id(b)));
            primed.entries.dedup_by(|a, b| id(a) == id(b));
            primed.remaining = primed
                .entries
                .iter()
                .filter(|entry| entry.2.next_position != u64::MAX)
                .count();
        }
        true
    }

    /// Closes priming (the writer's first batch begins).
    pub(super) fn close_priming(&self) {
        if let Ok(mut primed) = self.primed.lock() {
            primed.closed = true;
        }
    }

    /// Drops every primed head not taken yet (others may have written their tasks since).
    pub(super) fn forget_primed(&self) {
        if let Ok(mut primed) = self.primed.lock() {
            primed.ids = String::new();
            primed.entries = Vec::new();
            primed.remaining = 0;
        }
    }

    /// Takes `task`'s primed head, if any.
    pub(super) fn take_primed(&self, task: &str) -> Option<Head> {
        let mut primed = self.primed.lock().ok()?;
        if primed.entries.is_empty() {
            return None;
        }
        primed.take(task)
    }

    /// The durable watermark: every record of a sequence up to it is durable, none after it
    /// is acknowledged.
    pub(crate) fn durable(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    pub(super) fn publish(&self, seq: u64) {
        let before = self.durable.fetch_max(seq, Ordering::AcqRel);
        if seq > before {
            self.durable_tx.send_if_modified(|watermark| {
                let moved = seq > *watermark;
                *watermark = (*watermark).max(seq);
                moved
            });
        }
    }

    /// How the last batch the writer tried ended: [`WRITTEN`] (or none tried),
    /// [`FAILED_NO_SPACE`], [`FAILED_OTHERWISE`].
    pub(crate) fn write_failure(&self) -> u8 {
        self.write_failure.load(Ordering::Relaxed)
    }

    /// Why the journal stopped, once a sync failed.
    pub(crate) fn stopped(&self) -> Option<Error> {
        self.stopped.get().map(|why| Error::Stopped(why.clone()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::{Head, Shared};

    #[test]
    fn primed_heads_are_found_in_any_order_and_taken_once() {
        let head = |n: u64| Head {
            next_position: n,
            last_seq: n * 10,
            ..Head::default()
        };
        let shared = Shared::new(0);
        assert!(shared.prime([("b", head(2)), ("a", head(1)), ("c\u{1}", head(3))]));
        assert!(shared.prime([("ab", head(4))]));
        assert_eq!(shared.take_primed("a"), Some(head(1)));
        assert_eq!(shared.take_primed("a"), None, "taken once");
        assert_eq!(shared.take_primed("ab"), Some(head(4)));
        assert_eq!(shared.take_primed("c\u{1}"), Some(head(3)));
        assert_eq!(shared.take_primed("zz"), None);
        shared.close_priming();
        assert!(!shared.prime([("d", head(5))]), "closed");
        assert_eq!(
            shared.take_primed("b"),
            Some(head(2)),
            "still taken after closing"
        );
        assert_eq!(shared.take_primed("d"), None);
        let primed = shared.primed.lock().unwrap();
        assert_eq!(primed.remaining, 0);
        assert!(
            primed.entries.is_empty() && primed.ids.is_empty(),
            "freed once all taken"
        );
    }

    #[test]
    fn primed_heads_handed_over_chunk_after_chunk_stay_sorted() {
        let head = |n: u64| Head {
            next_position: n,
            ..Head::default()
        };
        let shared = Shared::new(0);
        // In order, chunk after chunk (recovery's way): appended as they come.
        assert!(shared.prime([("a", head(1)), ("b", head(2))]));
        assert!(shared.prime([("c", head(3)), ("d", head(4))]));
        // Out of order, and one id again: sorted, the first head of an id kept.
        assert!(shared.prime([("bb", head(5)), ("a", head(6))]));
        assert_eq!(shared.primed.lock().unwrap().remaining, 5);
        for (id, n) in [("d", 4), ("a", 1), ("bb", 5), ("c", 3), ("b", 2)] {
            assert_eq!(shared.take_primed(id), Some(head(n)), "{id}");
        }
        assert!(shared.primed.lock().unwrap().entries.is_empty(), "freed");
    }
}

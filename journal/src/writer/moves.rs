//! Finished streams moved out of the live ones' way
//! ([`crate::JournalOptions::keep_finished_apart`]): the moves that wait for an idle moment
//! or the close, and each writable open's sweep for the finished streams a crash, the option
//! off or an older format left among the live ones.

use super::Writer;
use crate::backend::BatchOp;
use crate::error::{Error, Result};
use crate::head::Head;
use crate::keys::{self, Space};
use crate::options::Durability;
use std::time::{Duration, Instant};

/// Whether the writer thread moves finished streams when the journal idles
/// ([`Writer::next_job`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IdleMoves {
    /// It does (always, outside tests).
    Made,
    /// It does not: the moves wait for a close or [`Writer::move_all`].
    #[cfg_attr(not(test), allow(dead_code))]
    Held,
}

/// Streams whose move to the finished ones waits at most ([`Writer::pending_moves`]; ~80
/// bytes each with a short id: ~10 MB). A stream finished while as many wait stays with the
/// live ones (read alike), so that the busy path never pays for a move.
pub(super) const PENDING_MOVES_LIMIT: usize = 1 << 17;

/// How long the writer waits without a job before it counts the journal as idle and moves
/// finished streams ([`Writer::next_job`]). Long enough that a busy journal — appends
/// coming every few milliseconds at most — never sees it.
pub(super) const IDLE_BEFORE_MOVING: Duration = Duration::from_millis(20);

/// Streams moved per write when the journal is idle: a job that comes meanwhile waits for
/// one such write (about a millisecond for streams of ten records).
pub(super) const MOVES_PER_WRITE: usize = 64;

/// Streams the idle writer's sweep examines at a time ([`Writer::sweep_some`]): a job that
/// comes meanwhile waits for them (a live one is a lookup and a seek, a finished one a
/// step per record).
pub(super) const SWEPT_STREAMS: usize = 256;

/// Whether the move of a stream that a batch finishes (its head going from `before` to
/// `after`) waits for an idle moment, when moves may (`defer`: [`Writer::defers_moves`]).
/// Only a stream with records stored before the batch waits: one written whole in one batch
/// goes with the finished streams as it is written, which costs nothing more
/// ([`Writer::stage`]).
pub(super) fn move_waits(defer: bool, before: &Head, after: &Head) -> bool {
    defer && after.terminal && !before.terminal && before.next_position > 0
}

impl Writer {
    /// Whether the idle writer goes on with the sweep ([`Writer::sweep_some`]): while there
    /// is one, once this open has written a batch. Not before: an open is followed by the
    /// recovery's fold, which reads, on both cores, what the sweep would walk — beside it
    /// the sweep took the fold 1.4–2× as long (and its moves' memtables stayed resident);
    /// the appends that follow a recovery start it.
    pub(super) fn sweeps_now(&self) -> bool {
        self.sweep.is_some() && self.next_seq > self.opened_seq
    }

    /// Goes on with the sweep of the records not moved to the finished ones
    /// ([`Writer::sweep`]) over up to `streams` streams: each finished one (a stream with
    /// records that is not live has a terminal record, as [`Head::read`] reads it) is noted
    /// to be moved with its records' count; a live one is skipped with one seek. Stops early
    /// when the list of moves waiting is full, and ends the sweep at the records' end.
    ///
    /// # Errors
    /// [`Error::Storage`] when a read failed, [`Error::Corruption`] on a damaged key: the
    /// sweep ends (what it noted stays noted).
    pub(crate) fn sweep_some(&mut self, streams: usize) -> Result<()> {
        let Some(from) = self.sweep.take() else {
            return Ok(());
        };
        let Some(mut cursor) = self.backend.unmoved_records_cursor() else {
            return Ok(());
        };
        cursor.seek(&from);
        // Where the sweep goes on from: past the last stream examined.
        let mut next = from;
        for _ in 0..streams {
            // (Never stuck: an empty list takes one stream whatever the limit.)
            if self.pending_moves.len() >= self.pending_limit.max(1) {
                self.sweep = Some(next);
                return Ok(());
            }
            let Some(key) = cursor.key() else {
                return cursor.status();
            };
            let (task, _) = keys::parse_event_key(key)
                .map_err(|kind| Error::corruption(&String::from_utf8_lossy(key), 0, kind))?;
            let task = task.to_owned();
            keys::task_end_into(&task, &mut next);
            if self
                .backend
                .get(Space::Live, &keys::task_key(&task))?
                .is_some()
            {
                cursor.seek(&next);
                continue;
            }
            let prefix = keys::task_prefix(&task);
            let mut stored = 0;
            while cursor.key().is_some_and(|key| key.starts_with(&prefix)) {
                stored += 1;
                cursor.next();
            }
            self.pending_moves.insert(task, stored);
        }
        cursor.status()?;
        self.sweep = Some(next);
        Ok(())
    }

    /// Finishes the sweep ([`Writer::sweep_some`]) and makes every move waiting; how many
    /// streams moved.
    ///
    /// # Errors
    /// As [`Writer::sweep_some`] and [`Writer::move_pending`].
    pub(crate) fn move_all(&mut self) -> Result<usize> {
        let mut moved = self.move_pending(usize::MAX)?;
        while self.sweep.is_some() {
            self.sweep_some(SWEPT_STREAMS)?;
            moved += self.move_pending(usize::MAX)?;
        }
        Ok(moved)
    }

    /// Moves the finished streams waiting, [`MOVES_PER_WRITE`] to a write, until none is
    /// left or `budget` is spent (those left stay where they are); how many moved.
    ///
    /// # Errors
    /// As [`Writer::move_pending`].
    pub(super) fn move_pending_within(&mut self, budget: Duration) -> Result<usize> {
        let started = Instant::now();
        let mut moved = 0;
        while !self.pending_moves.is_empty() && started.elapsed() < budget {
            let now = self.move_pending(MOVES_PER_WRITE)?;
            if now == 0 {
                break;
            }
            moved += now;
        }
        if !self.pending_moves.is_empty() {
            tracing::info!(
                left = self.pending_moves.len(),
                ?budget,
                "the journal closed with finished streams left among the live ones"
            );
        }
        Ok(moved)
    }

    /// Moves up to `max` of the finished streams waiting, in key order, [`MOVES_PER_WRITE`]
    /// to a write (not synced: a move lost in a crash leaves its stream where it was, read
    /// alike); how many.
    ///
    /// # Errors
    /// What the write returned when it failed: every move still waiting is given up then
    /// (those streams stay where they are).
    pub(crate) fn move_pending(&mut self, max: usize) -> Result<usize> {
        if self.shared.stopped().is_some() {
            // A stopped journal writes nothing more: its moves (and its sweep) are given up
            // — the next open's sweep finds those streams — so that the idle writer and the
            // close do not go round them for ever.
            self.pending_moves.clear();
            self.sweep = None;
            return Ok(0);
        }
        if self.pending_moves.is_empty() {
            return Ok(0);
        }
        let mut moved = 0;
        while moved < max {
            let mut ops = Vec::with_capacity(MOVES_PER_WRITE.min(max - moved));
            while ops.len() < MOVES_PER_WRITE && moved + ops.len() < max {
                let Some((task, stored)) = self.pending_moves.pop_first() else {
                    break;
                };
                ops.push(BatchOp::Retire {
                    task,
                    stored,
                    apart: true,
                });
            }
            if ops.is_empty() {
                break;
            }
            let count = ops.len();
            if let Err(error) = self.backend.write(ops, Durability::Buffered) {
                self.pending_moves.clear();
                return Err(error);
            }
            moved += count;
        }
        Ok(moved)
    }

    /// Notes the streams a written batch finished (in its order): each whose move waits
    /// with its records' count, each the batch moved (`None`) no longer waiting.
    pub(super) fn note_finished(&mut self, finished: Vec<(String, Option<u64>)>) {
        for (task, waits) in finished {
            match waits {
                Some(stored) => self.pending_moves.insert(task, stored),
                None => self.pending_moves.remove(&task),
            };
        }
    }

    /// Whether a stream finished now joins those waiting to be moved
    /// ([`Writer::pending_moves`]): with finished streams kept apart on this process's own
    /// store (a shared one keeps no column families), while there is room — beyond, it
    /// stays where it lies.
    pub(super) fn defers_moves(&self) -> bool {
        self.finished_apart
            && !self.backend.is_shared()
            && self.pending_moves.len() < self.pending_limit
    }
}

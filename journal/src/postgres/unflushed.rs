//! The writer's commits that no sync has made durable yet, as the syncer finds them again.
//!
//! The writer's session commits without waiting for the database's flush; a sync
//! (`PgBackend::sync_through`) makes a commit durable by writing to the log after it
//! (`write::flush`), which flushes every commit the server wrote before — on the same run of
//! the server. A server that crashed lost what it had not flushed, and a record committed
//! after its restart covers none of that. A sync answered on the syncer's session that was
//! open before the commit ([`Mark::syncer_session`]) shows the server did not restart in
//! between (a restart, even a crash's, ends every session): it writes to the log at once. On
//! a later session it first finds the batch's last record again, as committed — a record
//! another node has since trimmed (framed again) or purged (deleted) is then not found, and
//! the batch fails although it may be there. So the marks are kept one per session of the
//! writer's connection (a new session follows a failed call of it: `conn::Reopen::Loudly`),
//! each replacing the one before it in its session.
//!
//! A sync takes every mark noted when it starts, the marks of batches the writer committed
//! after the ones it syncs among them (their batches not yet handed to the syncer). If it
//! succeeds, those are durable too, and their own sync finds nothing left to do. If it fails,
//! its failure answers only for its own batches: the marks it did not find of later batches
//! are given back, for the sync of those batches — unless a later mark of their session was
//! noted meanwhile, whose finding covers them.

use std::sync::Arc;

/// The last record of a batch the writer committed without waiting for the flush: what a
/// sync finds again before it makes it durable.
#[derive(Debug)]
pub(super) struct Mark {
    /// The record's task.
    pub task: String,
    /// Its position in the task's stream.
    pub position: i64,
    /// Its sequence: the batch's last.
    pub seq: u64,
    /// Its bytes, as committed.
    pub record: Vec<u8>,
    /// The session of the writer's connection the batch was committed on: the failed calls
    /// of the connection before the commit (each may have been followed by a new session).
    pub session: u64,
    /// The session of the syncer's connection open before the batch's commit was sent
    /// (`conn::Conn::session`): a sync answered on it shows that the server has not
    /// restarted since the commit, which it then cannot have lost.
    pub syncer_session: u64,
}

/// The marks of the commits no sync has made durable yet, oldest first, one per session of
/// the writer's connection.
#[derive(Debug, Default)]
pub(super) struct Unflushed(Vec<Arc<Mark>>);

impl Unflushed {
    /// Notes `mark`, the writer's latest commit: it replaces the one before it of its session,
    /// whose commit it covers.
    pub fn note(&mut self, mark: Mark) {
        match self.0.last_mut() {
            Some(last) if last.session == mark.session => *last = Arc::new(mark),
            _ => self.0.push(Arc::new(mark)),
        }
    }

    /// Every mark noted, oldest first, for a sync to find again; none left.
    pub fn take(&mut self) -> Vec<Arc<Mark>> {
        std::mem::take(&mut self.0)
    }

    /// Gives back what a sync of the batches up to sequence `through` took (`taken`, oldest
    /// first) and failed on at `taken[failed]`: that failure fails the appends of those
    /// batches alone. The marks before it were found, and their commits are durable. The one
    /// it failed on is given back if it is of a later batch (its sequence is past `through`),
    /// and so is every mark after it, unfound — each unless a later mark of its session was
    /// noted meanwhile.
    pub fn give_back(&mut self, taken: Vec<Arc<Mark>>, failed: usize, through: u64) {
        let noted = std::mem::take(&mut self.0);
        self.0 = taken
            .into_iter()
            .enumerate()
            .filter(|(i, mark)| *i > failed || (*i == failed && mark.seq > through))
            .map(|(_, mark)| mark)
            .filter(|mark| noted.iter().all(|later| later.session != mark.session))
            .collect();
        self.0.extend(noted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(seq: u64, session: u64) -> Mark {
        Mark {
            task: "t".to_owned(),
            position: i64::try_from(seq).unwrap(),
            seq,
            record: Vec::new(),
            session,
            syncer_session: 0,
        }
    }

    fn seqs(marks: &[Arc<Mark>]) -> Vec<(u64, u64)> {
        marks.iter().map(|m| (m.seq, m.session)).collect()
    }

    #[test]
    fn a_mark_replaces_the_one_before_it_of_its_session_only() {
        let mut unflushed = Unflushed::default();
        unflushed.note(mark(1, 0));
        unflushed.note(mark(2, 0));
        // The writer's connection failed (a new session perhaps): a commit after it covers
        // nothing before, whose mark stays.
        unflushed.note(mark(3, 1));
        unflushed.note(mark(4, 1));
        assert_eq!(seqs(&unflushed.take()), [(2, 0), (4, 1)]);
        assert!(unflushed.take().is_empty());
    }

    /// The sync of batch 1 took batch 2's mark (the writer committed batch 2 before handing
    /// it to the syncer) and failed on it: batch 2's own sync must look for it again.
    #[test]
    fn a_failed_sync_gives_back_the_mark_of_a_later_batch() {
        let mut unflushed = Unflushed::default();
        unflushed.note(mark(2, 0));
        let taken = unflushed.take();
        unflushed.give_back(taken, 0, 1);
        assert_eq!(seqs(&unflushed.take()), [(2, 0)]);
        // Its own batch's sync fails on it too, and drops it: that failure answers for it.
        unflushed.note(mark(2, 0));
        let taken = unflushed.take();
        unflushed.give_back(taken, 0, 2);
        assert!(unflushed.take().is_empty());
    }

    #[test]
    fn a_later_mark_of_the_same_session_covers_one_given_back() {
        let mut unflushed = Unflushed::default();
        unflushed.note(mark(2, 0));
        let taken = unflushed.take();
        // Noted while the sync ran: batch 3's commit, on the same session, covers batch 2's.
        unflushed.note(mark(3, 0));
        unflushed.give_back(taken, 0, 1);
        assert_eq!(seqs(&unflushed.take()), [(3, 0)]);
    }

    #[test]
    fn a_failed_sync_gives_back_what_it_did_not_look_for_and_keeps_the_order() {
        let mut unflushed = Unflushed::default();
        unflushed.note(mark(5, 0));
        unflushed.note(mark(2, 1));
        unflushed.note(mark(3, 2));
        let taken = unflushed.take();
        // Noted while the sync ran, on another session still.
        unflushed.note(mark(4, 3));
        // Failed on the first (its own batch, 5 ≤ 5): the others, not looked for, go back
        // before the one noted since.
        unflushed.give_back(taken, 0, 5);
        assert_eq!(seqs(&unflushed.take()), [(2, 1), (3, 2), (4, 3)]);
        // Failed on the second: the first was found, and is durable.
        unflushed.note(mark(1, 0));
        unflushed.note(mark(2, 1));
        unflushed.note(mark(3, 2));
        let taken = unflushed.take();
        unflushed.give_back(taken, 1, 3);
        assert_eq!(seqs(&unflushed.take()), [(3, 2)]);
    }
}

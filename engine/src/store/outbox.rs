//! The notification outbox: lifecycle notifications written with their transitions,
//! application notifications of running attempts, and delivery with leased receipts.
//!
//! Queued notifications are journal records (`NotificationEnqueued`, or its v2 form for one
//! sent to preempt) indexed in the journal's outbox space; an acknowledgement is a
//! `NotificationAcked` record that removes the index entry in the same batch. Receipt leases
//! are delivery bookkeeping and live in memory only: after a restart every unacknowledged
//! notification is deliverable again (at-least-once delivery). The routes a receive walks
//! are read from the index incrementally ([`Outbox`]).

use super::decide::{self, Decision, Keyed};
use super::error::{NotFound, Result, StoreError};
use super::request::NotificationRequest;
use super::TaskStore;
use dtask_journal::{Delivery, Event, Timestamp};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::Arc;

/// A delivered notification with its receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The notification id.
    pub id: String,
    /// The task it concerns.
    pub task_id: String,
    /// The session it is routed to.
    pub session_id: String,
    /// The task version when it was queued.
    pub version: u64,
    /// The kind.
    pub kind: String,
    /// The data (empty for lifecycle notifications).
    pub data: Vec<u8>,
    /// How the consumer should take it (G3): [`Delivery::Queued`] unless the attempt sent it
    /// to preempt ([`crate::NotificationRequest::preempt`]); lifecycle notifications are
    /// queued.
    pub delivery: Delivery,
    /// When it was queued.
    pub created_at: Timestamp,
    /// The receipt to acknowledge it with (fresh on every delivery).
    pub receipt: String,
}

#[derive(Debug, Clone)]
struct Lease {
    receipt: String,
    expires: Timestamp,
    task: String,
    id: String,
    /// Acknowledgements of it being written ([`Outbox::pin`]): while any is, it does not
    /// expire.
    pins: u32,
}

/// Where a queued notification goes: its task and the session it is routed to.
#[derive(Debug)]
struct Route {
    task: Arc<str>,
    session: Arc<str>,
}

/// A task with notifications in the outbox: the session they are routed to (read once off
/// its creation), and how many of its routes are held.
#[derive(Debug)]
struct Routed {
    session: Arc<str>,
    routes: usize,
}

/// What the store knows of the outbox for delivery, behind one lock: the routes of the
/// queued notifications it has seen and the receipts it has leased.
///
/// The journal's outbox index stays the truth. The routes are read from it incrementally —
/// each receive reads only the entries queued since the last one ([`Journal::outbox_entries`]
/// after [`Outbox::scanned`]) — so a receive no longer grows with other sessions' backlog
/// or with what was acknowledged: before, every receive read every queued notification's
/// record and its task's creation, under this lock, and a waiting HTTP receive did so at
/// every commit. A route is checked against the journal before it is delivered
/// ([`Journal::queued`]): one whose notification was acknowledged elsewhere (another node of
/// a shared journal) is dropped then, or at the first receive after this store follows the
/// acknowledgement (checked durable first).
///
/// Receipts are `lease:<epoch>:<n>`: the epoch is drawn at random when the store opens, so a
/// receipt handed out before a restart can never match (and acknowledge) a different
/// notification delivered after it, when the counter starts again. Leases are keyed by the
/// enqueue record's global sequence.
///
/// [`Journal::outbox_entries`]: dtask_journal::Journal::outbox_entries
/// [`Journal::queued`]: dtask_journal::Journal::queued
#[derive(Debug)]
pub(crate) struct Outbox {
    by_seq: HashMap<u64, Lease>,
    by_receipt: HashMap<String, u64>,
    epoch: u64,
    next_receipt: u64,
    /// The routes of the queued notifications seen, by enqueue sequence.
    routes: BTreeMap<u64, Route>,
    /// The same sequences by session.
    sessions: HashMap<Arc<str>, BTreeSet<u64>>,
    /// The tasks the routes name.
    tasks: HashMap<Arc<str>, Routed>,
    /// The last enqueue sequence read from the journal's outbox index (0: none yet).
    scanned: u64,
    /// Routed notifications whose acknowledgement this store followed (another node's): the
    /// next receive lets their routes go once the durable view confirms them gone.
    acked_elsewhere: Vec<u64>,
}

impl Outbox {
    /// An empty table with a fresh receipt epoch (random: half of a version-4 UUID).
    pub(crate) fn new() -> Self {
        Self {
            by_seq: HashMap::new(),
            by_receipt: HashMap::new(),
            epoch: uuid::Uuid::new_v4().as_u64_pair().0,
            next_receipt: 0,
            routes: BTreeMap::new(),
            sessions: HashMap::new(),
            tasks: HashMap::new(),
            scanned: 0,
            acked_elsewhere: Vec::new(),
        }
    }

    /// Reads the outbox's entries queued since the last look into the routes; a new task's
    /// session is read off its creation by `session_of`.
    fn catch_up(
        &mut self,
        journal: &dtask_journal::Journal,
        session_of: impl Fn(&str) -> Result<String>,
    ) -> Result<()> {
        for entry in journal.outbox_entries(self.scanned) {
            let entry = entry?;
            if self.routes.contains_key(&entry.seq) {
                // Routed already (read again after a route found stale: `reroute`).
                self.scanned = self.scanned.max(entry.seq);
                continue;
            }
            let (task, session) =
                if let Some((task, routed)) = self.tasks.get_key_value(entry.task.as_str()) {
                    (Arc::clone(task), Arc::clone(&routed.session))
                } else {
                    let session = session_of(&entry.task)?;
                    let session = self
                        .sessions
                        .get_key_value(session.as_str())
                        .map_or_else(|| Arc::from(session.as_str()), |(s, _)| Arc::clone(s));
                    (Arc::from(entry.task), session)
                };
            self.tasks
                .entry(Arc::clone(&task))
                .or_insert_with(|| Routed {
                    session: Arc::clone(&session),
                    routes: 0,
                })
                .routes += 1;
            self.sessions
                .entry(Arc::clone(&session))
                .or_default()
                .insert(entry.seq);
            self.routes.insert(entry.seq, Route { task, session });
            self.scanned = self.scanned.max(entry.seq);
        }
        Ok(())
    }

    /// The first route after `after` (of `session`, when given).
    fn next_after(&self, session: Option<&str>, after: u64) -> Option<u64> {
        let range = (Bound::Excluded(after), Bound::Unbounded);
        match session {
            Some(session) => self.sessions.get(session)?.range(range).next().copied(),
            None => self.routes.range(range).next().map(|(seq, _)| *seq),
        }
    }

    /// Whether the notification of `seq` is leased to a consumer until after `now`.
    fn busy(&self, seq: u64, now: Timestamp) -> bool {
        self.by_seq
            .get(&seq)
            .is_some_and(|l| l.pins > 0 || l.expires > now)
    }

    /// Leases the notification of `seq` until `expires`; returns its fresh receipt.
    fn lease(&mut self, seq: u64, task: &str, id: &str, expires: Timestamp) -> String {
        self.next_receipt += 1;
        let receipt = format!("lease:{:016x}:{}", self.epoch, self.next_receipt);
        let lease = Lease {
            receipt: receipt.clone(),
            expires,
            task: task.to_owned(),
            id: id.to_owned(),
            pins: 0,
        };
        if let Some(old) = self.by_seq.insert(seq, lease) {
            self.by_receipt.remove(&old.receipt);
        }
        self.by_receipt.insert(receipt.clone(), seq);
        receipt
    }

    /// Holds the lease `receipt` names while its acknowledgement is written: checked current
    /// and unexpired at `now`, and kept from expiring meanwhile (a receive leases only what
    /// is not [`Outbox::busy`]) — so that an acknowledgement does not land after its lease
    /// ran out and the notification went to another consumer. Returns the sequence and the
    /// lease (its receipt, task and notification id, for [`Outbox::unpin`]). Two
    /// acknowledgements of one receipt at once (a client's retry) hold it twice.
    fn pin(&mut self, receipt: &str, now: Timestamp) -> Result<(u64, Lease)> {
        let not_found = || StoreError::NotFound(NotFound::Receipt(receipt.to_owned()));
        let seq = *self.by_receipt.get(receipt).ok_or_else(not_found)?;
        let lease = self
            .by_seq
            .get_mut(&seq)
            .filter(|l| l.receipt == receipt)
            .ok_or_else(not_found)?;
        if lease.pins == 0 && now >= lease.expires {
            return Err(StoreError::LeaseLost("the receipt's lease has expired"));
        }
        lease.pins += 1;
        Ok((seq, lease.clone()))
    }

    /// Lets go of a hold [`Outbox::pin`] took (the acknowledgement failed, or was never run), if
    /// the lease is still the notification's: its expiry stands again once no
    /// acknowledgement holds it.
    fn unpin(&mut self, seq: u64, held: &Lease) {
        if let Some(lease) = self
            .by_seq
            .get_mut(&seq)
            .filter(|l| l.receipt == held.receipt)
        {
            lease.pins = lease.pins.saturating_sub(1);
        }
    }

    /// Drops the route of `seq`, which named another task than the journal's entry does,
    /// and has the next receive read the entry again. (Sequences are read durable, so an
    /// entry does not change under a route: a defence, which covers a sequence still routed,
    /// not one read past without a route.)
    fn reroute(&mut self, seq: u64) {
        self.forget(seq);
        self.scanned = self.scanned.min(seq.saturating_sub(1));
    }

    /// Lets the routes go of the notifications acknowledged elsewhere whose acknowledgement
    /// `journal` (the durable view) confirms: no longer queued there.
    fn confirm_acked(&mut self, journal: &dtask_journal::Journal) -> Result<()> {
        while let Some(seq) = self.acked_elsewhere.pop() {
            if journal.queued(seq)?.is_none() {
                self.forget(seq);
            }
        }
        Ok(())
    }

    /// Drops the notification of `seq`: acknowledged (here or elsewhere), or never one.
    fn forget(&mut self, seq: u64) {
        if let Some(lease) = self.by_seq.remove(&seq) {
            self.by_receipt.remove(&lease.receipt);
        }
        let Some(route) = self.routes.remove(&seq) else {
            return;
        };
        if let Some(seqs) = self.sessions.get_mut(&route.session) {
            seqs.remove(&seq);
            if seqs.is_empty() {
                self.sessions.remove(&route.session);
            }
        }
        if let Some(routed) = self.tasks.get_mut(&route.task) {
            routed.routes = routed.routes.saturating_sub(1);
            if routed.routes == 0 {
                self.tasks.remove(&route.task);
            }
        }
    }
}

pub use super::decide::RESERVED_KIND_PREFIXES;

impl TaskStore {
    fn outbox(&self) -> parking_lot::MutexGuard<'_, Outbox> {
        self.inner.outbox.lock()
    }

    /// Queues an application notification from the running `attempt`. The task's version and
    /// snapshot do not change. Replaying an event id with the same kind and data succeeds
    /// without queuing anything, in any later attempt and after acknowledgement.
    ///
    /// A root task's notification goes to the outbox, for its session. A nested task's goes
    /// into its parent's mailbox instead (G3), as an input whose event id is the
    /// notification's id (`dtask.custom:<task>:<event id>:application-event`, both base64url)
    /// and whose kind and data are the notification's: the parent's input and the child's
    /// `parent_notified` record are one atomic append, and an input wakes a parent waiting
    /// for input.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] (checked first), [`StoreError::LeaseLost`],
    /// [`StoreError::NotificationUnavailable`] for a root task without a session or a
    /// nested task still deferred, [`StoreError::NotificationEventIdConflict`]; for a nested
    /// task, [`StoreError::MailboxSealed`] when the parent has ended and
    /// [`StoreError::NotFound`] when it is gone (purged) — nothing written either way.
    pub async fn enqueue_notification(
        &self,
        id: &str,
        attempt: u64,
        request: NotificationRequest,
    ) -> Result<()> {
        decide::validate_notification(id, attempt, &request, self.config())?;
        let slot = self.slot(id)?;
        let mut task = self.lock(&slot).await?;
        let mut request = super::Redecide::new(request);
        loop {
            let now = self.now();
            self.resolve_expiry(&slot, &mut task, now).await?;
            return match decide::notification(&task, attempt, request.take(self)?, now)? {
                Keyed::Repeat { position, request } => {
                    let record = self
                        .journal()
                        .read_stream(id, position)
                        .next()
                        .ok_or_else(|| {
                            StoreError::NotFound(NotFound::NotificationRecord {
                                task: id.to_owned(),
                                position,
                            })
                        })??;
                    let delivery = record.event.delivery();
                    match record.event {
                        Event::NotificationEnqueued { kind, data, .. }
                        | Event::NotificationEnqueuedV2 { kind, data, .. }
                        | Event::ParentNotified { kind, data, .. }
                        | Event::ParentNotifiedV2 { kind, data, .. }
                            if kind == request.kind
                                && data == request.data
                                && delivery == Some(request.delivery) =>
                        {
                            Ok(())
                        }
                        _ => Err(StoreError::NotificationEventIdConflict(request.event_id)),
                    }
                }
                Keyed::New(event) => match self.commit(&slot, &mut task, &[event]).await {
                    // Another node wrote to this stream or the parent's first (see
                    // `Redecide`).
                    Err(e) if request.again(&e) => continue,
                    other => other,
                },
            };
        }
    }

    /// Leases up to `limit` deliverable notifications in insertion order for `lease`; each
    /// gets a fresh receipt. Notifications leased to someone else are skipped.
    ///
    /// # Errors
    /// [`StoreError::Invalid`] for a zero lease, journal errors.
    #[allow(
        clippy::unused_async,
        reason = "async as the store's other calls are: callers await every store call alike"
    )]
    pub async fn receive_notifications(
        &self,
        limit: i64,
        lease: std::time::Duration,
    ) -> Result<Vec<Notification>> {
        self.receive(None, limit, lease)
    }

    /// As [`TaskStore::receive_notifications`], the notifications routed to `session` only
    /// (not in the reference: its outbox has one consumer). Consumers of different sessions
    /// then lease from one outbox without taking each other's notifications.
    ///
    /// # Errors
    /// As [`TaskStore::receive_notifications`].
    #[allow(
        clippy::unused_async,
        reason = "async as the store's other calls are: callers await every store call alike"
    )]
    pub async fn receive_session_notifications(
        &self,
        session: &str,
        limit: i64,
        lease: std::time::Duration,
    ) -> Result<Vec<Notification>> {
        self.receive(Some(session), limit, lease)
    }

    /// Chooses and leases the deliverable notifications (of `session`, when given) under one
    /// lock, so that two receivers never get the same one: the outbox's new entries read into
    /// the routes, then the routes walked in insertion order, each one delivered read from
    /// the journal (one acknowledged elsewhere is dropped).
    fn receive(
        &self,
        session: Option<&str>,
        limit: i64,
        lease: std::time::Duration,
    ) -> Result<Vec<Notification>> {
        if lease.is_zero() {
            return Err(StoreError::invalid("lease duration", "must be positive"));
        }
        let limit = self.config().page(limit);
        let now = self.now();
        let expires = now.plus_millis(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX));
        // What is delivered is shown to a consumer, who acts on it: read durable (on a
        // shared journal, a notification committed but not yet flushed is not handed out).
        let journal = self.durable_journal();
        let mut out = Vec::new();
        let mut outbox = self.outbox();
        outbox.catch_up(journal, |task| self.session_of(task))?;
        outbox.confirm_acked(journal)?;
        let mut after = 0;
        while out.len() < limit {
            let Some(seq) = outbox.next_after(session, after) else {
                break;
            };
            after = seq;
            if outbox.busy(seq, now) {
                continue;
            }
            let Some(item) = journal.queued(seq)? else {
                outbox.forget(seq);
                continue;
            };
            let Some(route) = outbox.routes.get(&seq) else {
                continue;
            };
            if *route.task != *item.task {
                outbox.reroute(seq);
                continue;
            }
            let session_id = route.session.to_string();
            let Some(queued) = item.record.event.queued_notification() else {
                outbox.forget(seq);
                continue;
            };
            let receipt = outbox.lease(seq, &item.task, queued.id, expires);
            out.push(Notification {
                id: queued.id.to_owned(),
                task_id: item.task.clone(),
                session_id,
                version: queued.version,
                kind: queued.kind.to_owned(),
                data: queued.data.to_vec(),
                delivery: queued.delivery,
                created_at: queued.at,
                receipt,
            });
        }
        Ok(out)
    }

    /// How many queued notifications this store holds delivery routes for: read by its
    /// receives, dropped as they are acknowledged — here, or on another node of a shared
    /// journal, at the first receive after this store followed that
    /// ([`TaskStore::refresh`]) or when a receive finds it gone. The memory the outbox's
    /// delivery holds (~200 B a route).
    #[must_use]
    pub fn notifications_routed(&self) -> usize {
        self.outbox().routes.len()
    }

    /// Notes that the notification enqueued at `seq` was acknowledged by a record this
    /// store followed: its route goes at the next receive, once the durable view confirms
    /// the acknowledgement (a followed record may be committed and not yet flushed — lost to
    /// a crash of the database, it would leave the notification queued and unrouted here).
    pub(super) fn followed_ack(&self, seq: u64) {
        let mut outbox = self.outbox();
        if outbox.routes.contains_key(&seq) {
            outbox.acked_elsewhere.push(seq);
        }
    }

    /// The session `task`'s notifications are routed to, from its creation record (empty
    /// when it has none).
    fn session_of(&self, task: &str) -> Result<String> {
        let first = self.journal().read_stream(task, 0).next().transpose()?;
        Ok(first
            .and_then(|record| record.event.spec().map(|spec| spec.session_id.clone()))
            .unwrap_or_default())
    }

    /// Acknowledges a delivered notification: it leaves the outbox for good.
    ///
    /// The lease is held from the check of the receipt until the acknowledgement is written
    /// — or has failed, when it is let go — and the write runs in a task of its own: a
    /// caller that stops waiting (an HTTP client gone) leaves it to land with the lease
    /// still held, so that no receive meanwhile hands the notification to another consumer.
    /// On a shared journal it is decided against what the journal holds: a notification
    /// queued by a record this store has not followed yet has its task folded again first,
    /// and a write refused for another node's record is decided again (see `Redecide`).
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown or superseded receipt, [`StoreError::LeaseLost`]
    /// when the receipt's lease has expired (the notification stays deliverable).
    pub async fn ack_notification(&self, receipt: &str) -> Result<()> {
        let now = self.now();
        let (seq, lease) = self.outbox().pin(receipt, now)?;
        // Held until the acknowledgement is written, whatever its caller does (the write runs
        // in a task of its own, which a dropped caller leaves to finish); put back if it fails.
        let pinned = Pinned {
            store: self.clone(),
            seq,
            lease: Some(lease),
        };
        let acked = tokio::spawn(async move { pinned.ack(now).await });
        match acked.await {
            Ok(outcome) => outcome,
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(_) => Err(StoreError::Journal(dtask_journal::Error::Closed)),
        }
    }
}

/// A lease held by an acknowledgement being written ([`Outbox::pin`]): put back when dropped
/// before the acknowledgement is done.
struct Pinned {
    store: TaskStore,
    seq: u64,
    lease: Option<Lease>,
}

impl Pinned {
    /// Writes the acknowledgement of the held lease's notification, decided at `now`; lets
    /// the lease go once it is written (the notification with it), or when it fails.
    async fn ack(mut self, now: Timestamp) -> Result<()> {
        let store = &self.store;
        let Some(lease) = &self.lease else {
            return Ok(());
        };
        let (task_id, id) = (lease.task.clone(), lease.id.clone());
        let slot = store.slot(&task_id)?;
        let mut task = store.lock(&slot).await?;
        if store.journal().is_shared() && !task.outbox.contains_key(&id) {
            // Another node queued it, and a receive read it off the journal before this
            // store followed the record: fold the task again before answering "not found".
            store.refold(&slot, &mut task)?;
        }
        // The request is the lease's: only the count of decisions is kept.
        let mut decisions = super::Redecide::new(());
        loop {
            decisions.take(store)?;
            if let Decision::Write(events) = decide::ack(&task, &id, self.seq, now)? {
                match store.commit(&slot, &mut task, &events).await {
                    // Another node wrote to the stream first (see `Redecide`).
                    Err(e) if decisions.again(&e) => continue,
                    other => other?,
                }
            }
            break;
        }
        self.lease = None;
        self.store.outbox().forget(self.seq);
        Ok(())
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Some(lease) = &self.lease {
            self.store.outbox().unpin(self.seq, lease);
        }
    }
}

//! The notification outbox: lifecycle notifications written with their transitions,
//! application notifications of running attempts, and delivery with leased receipts.
//!
//! Queued notifications are journal records (`NotificationEnqueued`, or its v2 form for one
//! sent to preempt) indexed in the journal's outbox space; an acknowledgement is a
//! `NotificationAcked` record that removes the index entry in the same batch. Receipt leases
//! are delivery bookkeeping and live in memory only: after a restart every unacknowledged
//! notification is deliverable again (at-least-once delivery).

use super::decide::{self, Decision, Keyed};
use super::error::{NotFound, Result, StoreError};
use super::request::NotificationRequest;
use super::TaskStore;
use dtask_journal::{Delivery, Event, Timestamp};
use std::collections::HashMap;

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
}

/// In-memory receipt leases, keyed by the enqueue record's global sequence.
///
/// Receipts are `lease:<epoch>:<n>`: the epoch is drawn at random when the store opens, so a
/// receipt handed out before a restart can never match (and acknowledge) a different
/// notification delivered after it, when the counter starts again.
#[derive(Debug)]
pub(crate) struct Leases {
    by_seq: HashMap<u64, Lease>,
    by_receipt: HashMap<String, u64>,
    epoch: u64,
    next_receipt: u64,
}

impl Leases {
    /// An empty table with a fresh receipt epoch (random: half of a version-4 UUID).
    pub(crate) fn new() -> Self {
        Self {
            by_seq: HashMap::new(),
            by_receipt: HashMap::new(),
            epoch: uuid::Uuid::new_v4().as_u64_pair().0,
            next_receipt: 0,
        }
    }
}

pub use super::decide::RESERVED_KIND_PREFIXES;

impl TaskStore {
    fn leases(&self) -> parking_lot::MutexGuard<'_, Leases> {
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
        let now = self.now();
        self.resolve_expiry(&slot, &mut task, now).await?;
        match decide::notification(&task, attempt, request, now)? {
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
            Keyed::New(event) => self.commit(&slot, &mut task, &[event]).await,
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
    /// lock, so that two receivers never get the same one. A task's session is read off its
    /// creation (its first record; a task's spec never changes), once a call.
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
        let mut sessions: HashMap<String, String> = HashMap::new();
        let mut out = Vec::new();
        let mut leases = self.leases();
        for item in self.journal().outbox() {
            if out.len() == limit {
                break;
            }
            let item = item?;
            let busy = leases
                .by_seq
                .get(&item.record.seq)
                .is_some_and(|l| l.expires > now);
            if busy {
                continue;
            }
            let Some(queued) = item.record.event.queued_notification() else {
                continue;
            };
            if !sessions.contains_key(&item.task) {
                let routed = self.session_of(&item.task)?;
                sessions.insert(item.task.clone(), routed);
            }
            let session_id = sessions.get(&item.task).cloned().unwrap_or_default();
            if session.is_some_and(|s| s != session_id) {
                continue;
            }
            leases.next_receipt += 1;
            let receipt = format!("lease:{:016x}:{}", leases.epoch, leases.next_receipt);
            let lease = Lease {
                receipt: receipt.clone(),
                expires,
                task: item.task.clone(),
                id: queued.id.to_owned(),
            };
            if let Some(old) = leases.by_seq.insert(item.record.seq, lease) {
                leases.by_receipt.remove(&old.receipt);
            }
            leases.by_receipt.insert(receipt.clone(), item.record.seq);
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
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown or superseded receipt, [`StoreError::LeaseLost`]
    /// when the receipt's lease has expired (the notification stays deliverable).
    pub async fn ack_notification(&self, receipt: &str) -> Result<()> {
        let now = self.now();
        let (seq, lease) = {
            let table = self.leases();
            let seq = *table
                .by_receipt
                .get(receipt)
                .ok_or_else(|| StoreError::NotFound(NotFound::Receipt(receipt.to_owned())))?;
            let lease = table
                .by_seq
                .get(&seq)
                .filter(|l| l.receipt == receipt)
                .cloned()
                .ok_or_else(|| StoreError::NotFound(NotFound::Receipt(receipt.to_owned())))?;
            (seq, lease)
        };
        if now >= lease.expires {
            return Err(StoreError::LeaseLost("the receipt's lease has expired"));
        }
        let slot = self.slot(&lease.task)?;
        let mut task = self.lock(&slot).await?;
        if let Decision::Write(events) = decide::ack(&task, &lease.id, seq, now)? {
            self.commit(&slot, &mut task, &events).await?;
        }
        let mut leases = self.leases();
        leases.by_seq.remove(&seq);
        leases.by_receipt.remove(receipt);
        Ok(())
    }
}

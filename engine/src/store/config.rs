//! Store limits and timing.

use dtask_journal::Timestamp;
use std::time::Duration;

/// Limits and timing of a [`crate::TaskStore`]. Defaults follow the reference store.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreConfig {
    /// How long an attempt's lease lasts after a claim, heartbeat or first cancel request.
    /// Default: 30 s.
    pub lease_duration: Duration,
    /// The largest opaque value (checkpoint, result, resume data, update data, snapshot).
    /// Default: 1 MiB.
    pub max_value_bytes: usize,
    /// The longest error text, cancel reason or transcript error. Default: 4096 bytes.
    pub max_error_bytes: usize,
    /// The longest id (task id, event id). Default: 1024 bytes.
    pub max_id_bytes: usize,
    /// The page size used when a request asks for 0 or less. Default: 100.
    pub default_page: usize,
    /// The largest page; larger requests are clamped. Default: 1000.
    pub max_page: usize,
    /// The largest application-notification data. Default: 256 KiB.
    pub max_notification_bytes: usize,
    /// The longest application-notification kind. Default: 64 bytes.
    pub max_notification_kind_bytes: usize,
    /// How many terminal tasks stay folded in memory. Default: 4096.
    pub terminal_cache: usize,
    /// How long past an attempt's lease deadline this store waits before it writes the lease
    /// down as expired: a margin for the skew between the clocks of nodes that share a
    /// journal. A deadline is written from the clock of the node that claimed or renewed the
    /// lease, and the holder stops at it by its own clock (its heartbeats and outcomes are
    /// refused from then on, `LeaseLost`); with a grace at least as large as the skew between
    /// any two nodes' clocks, no node expires a lease before its holder has stopped. Default:
    /// 0 (one process has one clock); on a shared (PostgreSQL) journal, set it to the skew
    /// your clock synchronisation bounds (docs/postgres.md, "Leases and clocks").
    pub expiry_grace: Duration,
    /// How long a task recovered after a lease expiry waits before its next attempt: the
    /// first recovery waits the first duration, each later one twice the one before, at most
    /// the second — written as the recovered task's not-before time (a delayed run), so a
    /// task whose attempts keep taking their workers down is tried again ever more slowly
    /// instead of at once. Default: `None` (claimable at once, the reference's behaviour).
    pub recovery_backoff: Option<(Duration, Duration)>,
    /// A cap on a running task's whole progress updates, `(over, keep)`: the update that
    /// gives a task more than `over` whole updates (their bytes not trimmed) trims its
    /// progress to the last `keep` ([`crate::TaskStore::trim_progress`]) before its append
    /// returns — so a tool that runs for hours reporting progress keeps a bounded stream's
    /// worth of bytes, every record and the hash chain kept. Agent runs are never trimmed,
    /// nor a task under a hold; a cap whose `keep` is not below `over` does nothing. Default:
    /// `None` (no cap, the reference's behaviour).
    pub progress_cap: Option<(u64, u64)>,
    /// The most progress updates (and update parts) one task may record, trimmed ones
    /// included: a new update past it is refused with [`crate::StoreError::UpdateLimit`]
    /// and nothing is written (a replay of a recorded event id is still answered). Every
    /// update's event id stays in the store's memory while its task runs — the deduplication
    /// is task-wide for the task's life — so the limit bounds what one runaway tool can hold
    /// there. Default: `None` (no limit, the reference's behaviour; its first generation
    /// refused more than 10,000).
    pub max_updates: Option<u64>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(30),
            max_value_bytes: 1 << 20,
            max_error_bytes: 4096,
            max_id_bytes: 1024,
            default_page: 100,
            max_page: 1000,
            max_notification_bytes: 256 << 10,
            max_notification_kind_bytes: 64,
            terminal_cache: 4096,
            expiry_grace: Duration::ZERO,
            recovery_backoff: None,
            progress_cap: None,
            max_updates: None,
        }
    }
}

impl StoreConfig {
    /// Sets [`StoreConfig::lease_duration`].
    #[must_use]
    pub fn with_lease_duration(mut self, lease: Duration) -> Self {
        self.lease_duration = lease;
        self
    }

    /// Sets [`StoreConfig::max_value_bytes`].
    #[must_use]
    pub fn with_max_value_bytes(mut self, bytes: usize) -> Self {
        self.max_value_bytes = bytes;
        self
    }

    /// Sets [`StoreConfig::expiry_grace`].
    #[must_use]
    pub fn with_expiry_grace(mut self, grace: Duration) -> Self {
        self.expiry_grace = grace;
        self
    }

    /// Sets [`StoreConfig::recovery_backoff`]: `first` after the first recovery, doubling,
    /// at most `max`.
    #[must_use]
    pub fn with_recovery_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.recovery_backoff = Some((first, max.max(first)));
        self
    }

    /// Sets [`StoreConfig::progress_cap`]: a running task with more than `over` whole
    /// updates is trimmed to its last `keep` (`keep` below `over`: at most `over - 1`).
    #[must_use]
    pub fn with_progress_cap(mut self, over: u64, keep: u64) -> Self {
        let over = over.max(1);
        self.progress_cap = Some((over, keep.min(over - 1)));
        self
    }

    /// Sets [`StoreConfig::max_updates`].
    #[must_use]
    pub fn with_max_updates(mut self, updates: u64) -> Self {
        self.max_updates = Some(updates);
        self
    }

    /// Sets [`StoreConfig::terminal_cache`].
    #[must_use]
    pub fn with_terminal_cache(mut self, tasks: usize) -> Self {
        self.terminal_cache = tasks;
        self
    }

    /// The page size for a requested `limit`: 0 or less means the default, more than the
    /// maximum is clamped.
    #[must_use]
    pub fn page(&self, limit: i64) -> usize {
        if limit <= 0 {
            self.default_page
        } else {
            usize::try_from(limit)
                .unwrap_or(usize::MAX)
                .min(self.max_page)
        }
    }

    /// The progress cap `(over, keep)`, when it is set (with `keep` below `over`: a cap set
    /// by hand otherwise would trim nothing at every update) and a task in `state` is over it
    /// (and may be trimmed: no agent run, no hold).
    pub(crate) fn capped(&self, state: &dtask_replay::TaskState) -> Option<(u64, u64)> {
        let (over, keep) = self.progress_cap?;
        (keep < over
            && crate::store::retention::whole_updates(state) > over
            && state.hold.is_none()
            && crate::store::progress_trimmable(state))
        .then_some((over, keep))
    }

    pub(crate) fn lease_millis(&self) -> u64 {
        u64::try_from(self.lease_duration.as_millis()).unwrap_or(u64::MAX)
    }

    /// How long the recovery after `recoveries` earlier ones waits, with a backoff set:
    /// [`StoreConfig::recovery_backoff`]'s first duration doubled `recoveries` times, at most
    /// its second.
    pub(crate) fn recovery_wait(&self, recoveries: u64) -> Option<u64> {
        let (first, max) = self.recovery_backoff?;
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let doubled = 1u64
            .checked_shl(u32::try_from(recoveries).unwrap_or(u32::MAX))
            .unwrap_or(u64::MAX);
        Some(millis(first).saturating_mul(doubled).min(millis(max)))
    }

    /// The latest deadline of a lease this store writes down as expired at `now`: `now` less
    /// the [`StoreConfig::expiry_grace`].
    pub(crate) fn expired_by(&self, now: Timestamp) -> Timestamp {
        let grace = u64::try_from(self.expiry_grace.as_millis()).unwrap_or(u64::MAX);
        Timestamp(now.0.saturating_sub(grace))
    }
}

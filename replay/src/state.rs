//! The task snapshot: what a task's events add up to.

use dtask_journal::{ExpiryResolution, LeasePolicy, Publication, TaskSpec, Timestamp};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// The result error of a task canceled without a reason.
pub const DEFAULT_CANCEL_REASON: &str = "task was canceled";

/// The result error of a fail-policy task whose lease expired.
pub const LEASE_EXPIRED_ERROR: &str = "execution lease expired and retry is disabled";

/// The result error of a retry-policy task whose lease expired once it had been recovered
/// `recoveries` times, its [`TaskState::max_recoveries`].
#[must_use]
pub fn recovery_limit_error(recoveries: u64) -> String {
    format!(
        "execution lease expired after {recoveries} recover{}, the most the task allows",
        if recoveries == 1 { "y" } else { "ies" }
    )
}

/// A task's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Waiting to be claimed by a worker.
    Pending,
    /// Claimed: an attempt holds the lease.
    Running,
    /// The attempt ended asking for input; `Resume` makes it pending again.
    WaitingInput,
    /// The attempt ended suspended; `ReleaseSuspension` makes it pending again.
    Suspended,
    /// Terminal: completed with result data.
    Completed,
    /// Terminal: failed with an error.
    Failed,
    /// Terminal: canceled.
    Canceled,
}

impl Status {
    /// Every status.
    pub const ALL: [Self; 7] = [
        Self::Pending,
        Self::Running,
        Self::WaitingInput,
        Self::Suspended,
        Self::Completed,
        Self::Failed,
        Self::Canceled,
    ];

    /// Whether the status is final.
    #[must_use]
    pub const fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Canceled)
    }

    /// The `snake_case` name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::WaitingInput => "waiting_input",
            Self::Suspended => "suspended",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
        }
    }

    /// Parses a `snake_case` name.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The snapshot of one task (the reference's task record), derived only by folding its events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskState {
    /// The immutable spec, shared by every snapshot of the task (a snapshot's copy does not
    /// copy it).
    pub spec: Arc<TaskSpec>,
    /// What a lease expiry does.
    pub policy: LeasePolicy,
    /// The current status.
    pub status: Status,
    /// The latest durable executor checkpoint; non-empty once the started marker is committed.
    pub checkpoint: Vec<u8>,
    /// The result data (completed tasks only).
    pub result_data: Vec<u8>,
    /// The result error (failed and canceled tasks).
    pub result_error: String,
    /// The first transcript failure, if any.
    pub output_file_error: String,
    /// Input given to a waiting task, handed to the next attempt.
    pub pending_resume: Option<Vec<u8>>,
    /// The manager-owned context capture.
    pub context_snapshot: Vec<u8>,
    /// The CAS token: the number of lifecycle events.
    pub version: u64,
    /// The number of claims so far (the fencing token).
    pub attempt: u64,
    /// When cancellation was first requested.
    pub cancel_requested_at: Option<Timestamp>,
    /// The first cancel reason.
    pub cancel_reason: String,
    /// Creation time.
    pub created_at: Timestamp,
    /// Time of the last lifecycle event.
    pub updated_at: Timestamp,
    /// When the task became terminal.
    pub done_at: Option<Timestamp>,
    /// The running attempt's lease deadline.
    pub lease_deadline: Option<Timestamp>,
    /// The number of records folded (the stream's next position).
    pub position: u64,
    /// The number of progress updates (and update parts) recorded.
    pub updates: u64,
    /// How many of [`TaskState::updates`] were trimmed: their bytes dropped, their records
    /// kept (`progress_trimmed` counts them). `updates - trimmed` are whole.
    pub trimmed: u64,
    /// When the task becomes visible to its parent or session.
    pub publication: Publication,
    /// The parent task; empty for a root task.
    pub parent_task_id: String,
    /// The root session of the task's tree (empty when none).
    pub root_session_id: String,
    /// The task's mailbox: inputs sent to it and how far they were consumed.
    pub mailbox: Mailbox,
    /// The first failure to put a lifecycle notification into the parent's mailbox.
    pub parent_notification_error: String,
    /// The task's reruns, both ways: `None` for a task that is no rerun and was never rerun
    /// (most tasks; see [`TaskState::rerun_of`], [`TaskState::rerun_as`]).
    pub lineage: Option<Box<Lineage>>,
    /// How many times the task may be recovered after a lease expiry before the next one
    /// fails it; `None` for no limit (the reference's behaviour).
    pub max_recoveries: Option<u64>,
    /// How many times the task was recovered: lease expiries that sent it back to pending.
    pub recoveries: u64,
    /// The earliest time the pending task may be claimed (a delayed run); `None` once an
    /// attempt started, or for a task never delayed.
    pub not_before: Option<Timestamp>,
    /// The reason of the operator's hold that stands on the task (it is not purged while one
    /// does); `None` for none.
    pub hold: Option<Box<str>>,
}

/// How a task is tied to its reruns: the task it reruns, and the tasks it was rerun as
/// (from its `rerun_of` and `rerun_as` records).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Lineage {
    /// The task this one is a rerun of; empty for none.
    pub rerun_of: String,
    /// The tasks this one was rerun as, oldest first.
    pub rerun_as: Vec<String>,
}

/// A task's mailbox (the reference's background mailbox): created with the task, sealed when
/// the task ends. Inputs get sequence numbers 1, 2, 3, … in the order they arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Mailbox {
    /// The ownership generation: 1 from creation, raised when the mailbox is sealed.
    pub generation: u64,
    /// The sequence of the newest input (0 for none).
    pub latest: u64,
    /// The sequence up to which the task's attempts consumed the inputs.
    pub consumed: u64,
}

impl Mailbox {
    /// The mailbox of a new task: generation 1, no input.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            generation: 1,
            latest: 0,
            consumed: 0,
        }
    }

    /// Whether inputs arrived that no attempt has consumed yet.
    #[must_use]
    pub const fn has_unconsumed(&self) -> bool {
        self.latest > self.consumed
    }
}

impl TaskState {
    /// The task id.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.spec.id
    }

    /// Whether the task is terminal.
    #[must_use]
    pub const fn is_terminal(&self) -> bool {
        self.status.is_terminal()
    }

    /// Whether the task's mailbox is sealed (the task is terminal): it takes no new input.
    #[must_use]
    pub const fn mailbox_sealed(&self) -> bool {
        self.status.is_terminal()
    }

    /// The task this one is a rerun of, if it is one.
    #[must_use]
    pub fn rerun_of(&self) -> Option<&str> {
        self.lineage
            .as_deref()
            .map(|l| l.rerun_of.as_str())
            .filter(|id| !id.is_empty())
    }

    /// The tasks this one was rerun as, oldest first (empty when it never was).
    #[must_use]
    pub fn rerun_as(&self) -> &[String] {
        self.lineage.as_deref().map_or(&[], |l| &l.rerun_as)
    }

    /// Whether the task is a nested task (it has a parent).
    #[must_use]
    pub fn is_nested(&self) -> bool {
        !self.parent_task_id.is_empty()
    }

    /// Whether the started marker is durable (a checkpoint exists).
    #[must_use]
    pub fn is_started(&self) -> bool {
        !self.checkpoint.is_empty()
    }

    /// Whether the running attempt's lease has run out at `now`: the task is running and its
    /// deadline is not after `now` (a lease ends *at* its deadline).
    #[must_use]
    pub fn lease_expired_at(&self, now: Timestamp) -> bool {
        self.status == Status::Running && self.lease_deadline.is_some_and(|d| d <= now)
    }

    /// Whether the running attempt's lease is live at `now` (its deadline is after `now`).
    #[must_use]
    pub fn lease_live_at(&self, now: Timestamp) -> bool {
        self.status == Status::Running && self.lease_deadline.is_some_and(|d| d > now)
    }

    // The transition rules that both the live engine (`decide`) and the fold's legality check
    // need. Each is written here once: a recovered task equals the live one only while the
    // two sides agree, so neither side has its own copy.

    /// How an expired lease of this task is resolved: a retry-policy task goes back to
    /// pending while it has recoveries left; a fail-policy task — or a retry-policy one that
    /// used up its [`TaskState::max_recoveries`] — fails, or is canceled when cancellation
    /// was requested.
    #[must_use]
    pub fn expiry_resolution(&self) -> ExpiryResolution {
        let exhausted = self
            .max_recoveries
            .is_some_and(|max| self.recoveries >= max);
        match (self.policy, exhausted, self.cancel_requested_at.is_some()) {
            (LeasePolicy::Retry, false, _) => ExpiryResolution::Retry,
            (_, _, false) => ExpiryResolution::Failed,
            (_, _, true) => ExpiryResolution::Canceled,
        }
    }

    /// The result error of a lease expiry resolved as failed: [`LEASE_EXPIRED_ERROR`] under
    /// the fail policy, [`recovery_limit_error`] once a retry-policy task used up its
    /// recoveries.
    #[must_use]
    pub fn lease_expired_error(&self) -> String {
        match self.policy {
            LeasePolicy::Fail => LEASE_EXPIRED_ERROR.to_owned(),
            LeasePolicy::Retry => recovery_limit_error(self.recoveries),
        }
    }

    /// The not-before time that keeps an attempt from starting at `at`, if the task is
    /// delayed past `at` (the rule the live engine's `Start` and the fold share).
    #[must_use]
    pub fn delayed_past(&self, at: Timestamp) -> Option<Timestamp> {
        self.not_before.filter(|until| *until > at)
    }

    /// Whether a cancel request ends the task at once: no attempt can acknowledge it — the
    /// task is waiting or suspended, or pending and never claimed (or claimed under the fail
    /// policy, whose next claim would not run). A running task's cancel is acknowledged by
    /// its attempt (or resolved when its lease expires).
    #[must_use]
    pub fn cancel_is_direct(&self) -> bool {
        match self.status {
            Status::Pending => self.attempt == 0 || self.policy == LeasePolicy::Fail,
            Status::WaitingInput | Status::Suspended => true,
            _ => false,
        }
    }

    /// The part of the attempt fence that needs no clock (what the fold checks): the task is
    /// running and, when `attempt` is given, it is the running attempt.
    ///
    /// # Errors
    /// [`Fenced::NotRunning`] or [`Fenced::StaleAttempt`].
    pub fn check_attempt(&self, attempt: Option<u64>) -> Result<(), Fenced> {
        if self.status != Status::Running {
            return Err(Fenced::NotRunning);
        }
        match attempt {
            Some(found) if found != self.attempt => Err(Fenced::StaleAttempt {
                current: self.attempt,
                found,
            }),
            _ => Ok(()),
        }
    }

    /// The fence of the active attempt at `now`, which every attempt-scoped write passes
    /// (lifecycle commands of the attempt, progress updates, application notifications): the
    /// task is running, `attempt` (when given) is the running one, its lease is live, and —
    /// unless `allow_cancel` (transcript failures and cancel acknowledgements) — no
    /// cancellation was requested.
    ///
    /// # Errors
    /// The first [`Fenced`] reason, in that order.
    pub fn check_active(
        &self,
        attempt: Option<u64>,
        now: Timestamp,
        allow_cancel: bool,
    ) -> Result<(), Fenced> {
        self.check_attempt(attempt)?;
        if !self.lease_live_at(now) {
            return Err(Fenced::LeaseExpired);
        }
        if !allow_cancel && self.cancel_requested_at.is_some() {
            return Err(Fenced::CancelRequested);
        }
        Ok(())
    }
}

/// Why an attempt-scoped write is fenced off ([`TaskState::check_active`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Fenced {
    /// The task is not running (terminal tasks included).
    #[error("the task is not running")]
    NotRunning,
    /// The write names another attempt than the running one.
    #[error("the attempt is not the current one")]
    StaleAttempt {
        /// The running attempt.
        current: u64,
        /// The attempt the write names.
        found: u64,
    },
    /// The running attempt's lease has run out.
    #[error("the lease has expired")]
    LeaseExpired,
    /// Cancellation was requested: only a cancel acknowledgement (or a transcript failure)
    /// may follow.
    #[error("cancellation was requested")]
    CancelRequested,
}

impl Fenced {
    /// The reason as a static text (what `LeaseLost` errors carry).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NotRunning => "the task is not running",
            Self::StaleAttempt { .. } => "the attempt is not the current one",
            Self::LeaseExpired => "the lease has expired",
            Self::CancelRequested => "cancellation was requested",
        }
    }
}

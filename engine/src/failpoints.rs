//! Fail points at every durability boundary of the engine, for crash-recovery testing
//! (`docs/crash-testing.md`).
//!
//! Compiled in only with the `failpoints` cargo feature; without it every point is an empty
//! statement and [`configure`] returns [`FailPointError::Disabled`]. Each point can be armed
//! to panic, fail with an error, or abort the process ([`FailAction`]), once, after a number
//! of hits. A child process arms its points from the [`ENV`] variable with
//! [`configure_from_env`]; a point that fires says so on standard error (a line starting with
//! [`HIT_PREFIX`]) before acting.
//!
//! | point | where | with `error` |
//! | --- | --- | --- |
//! | [`JOURNAL_BEFORE_WRITE`] | the journal writer formed a batch, before writing it | the batch fails, nothing written |
//! | [`JOURNAL_AFTER_WRITE`] | the batch is durable, before its callers are acknowledged | callers see a failure of a durable write |
//! | [`JOURNAL_SYNC`] | the journal is about to sync the batches it wrote | the sync fails: an embedded journal stops (reopen it), a PostgreSQL one fails the appends it covered |
//! | [`STORE_AFTER_APPEND`] | a command's events are acknowledged, before the in-memory task advances | the command fails; memory is behind the journal |
//! | [`TOOL_START`] | inside the shell tool's start, after the command was spawned, before the started marker | the start fails |
//! | [`BEFORE_COMMIT_START`] | a tool's start returned, before its started marker is committed | the attempt fails |
//! | [`AFTER_COMMIT_START`] | a recoverable tool's started marker is durable; the run goes on | (ignored) |
//! | [`AFTER_UPDATE_PERSISTED`] | an update is durable, before the output materializer runs | the attempt fails |
//! | [`LEASE_EXPIRY`] | an expired lease is being resolved, before its events are written | the resolving call fails |
//! | [`DRAIN`] | the manager is closing: drain controls sent, before waiting for the attempts | close fails |
//! | [`AGENT_AFTER_TURN`] | a durable agent's model answer is journaled, before any of its tool calls | the attempt fails |
//! | [`AGENT_AFTER_TOOL_CREATED`] | a tool call's child task is durable, before it runs | the attempt fails |
//! | [`AGENT_AFTER_TOOL_ENDED`] | a tool call's task ended, before the agent journals its result | the attempt fails |
//! | [`AGENT_AFTER_TOOL_RESULT`] | a tool call's result is journaled in the agent's stream | the attempt fails |
//! | [`AGENT_AFTER_MESSAGE`] | a message sent to a durable agent's run is journaled, its mailbox's cursor not yet moved | the attempt fails |

pub use dtask_journal::failpoints::{
    parse, FailAction, FailPointError, FailPointSpec, ENABLED, ENV, HIT_PREFIX,
};

/// The journal writer is about to write a batch.
pub const JOURNAL_BEFORE_WRITE: &str = dtask_journal::failpoints::BEFORE_WRITE;
/// The journal wrote a batch durably; its callers are not acknowledged yet.
pub const JOURNAL_AFTER_WRITE: &str = dtask_journal::failpoints::AFTER_WRITE;
/// The journal is about to sync the batches it wrote.
pub const JOURNAL_SYNC: &str = dtask_journal::failpoints::SYNC;
/// The store's append was acknowledged; the in-memory task has not advanced yet.
pub const STORE_AFTER_APPEND: &str = "store::after_append";
/// Inside a tool's start: the external side effect began; no started marker yet.
pub const TOOL_START: &str = "managed::tool_start";
/// A tool's start returned; its started marker is not committed yet.
pub const BEFORE_COMMIT_START: &str = "managed::before_commit_start";
/// A recoverable tool's started marker is durable; its run goes on.
pub const AFTER_COMMIT_START: &str = "managed::after_commit_start";
/// An update is durable; the output materializer has not run yet.
pub const AFTER_UPDATE_PERSISTED: &str = "managed::after_update_persisted";
/// An expired lease is being resolved; its events are not written yet.
pub const LEASE_EXPIRY: &str = "store::lease_expiry";
/// The manager is draining: drain controls are sent, the attempts not yet finished.
pub const DRAIN: &str = "runtime::drain";

/// A durable agent's model answer is journaled; none of its tool calls has a task yet.
pub const AGENT_AFTER_TURN: &str = "agent::after_turn";
/// A durable agent's tool call has its child task, durable and not yet run.
pub const AGENT_AFTER_TOOL_CREATED: &str = "agent::after_tool_created";
/// A durable agent's tool call ended; the agent has not journaled its result.
pub const AGENT_AFTER_TOOL_ENDED: &str = "agent::after_tool_ended";
/// A durable agent journaled a tool call's result.
pub const AGENT_AFTER_TOOL_RESULT: &str = "agent::after_tool_result";
/// A durable agent journaled a message sent to its run; the mailbox's cursor has not moved.
pub const AGENT_AFTER_MESSAGE: &str = "agent::after_message";

/// Every fail point, in the order a task meets them.
pub const POINTS: &[&str] = &[
    JOURNAL_BEFORE_WRITE,
    JOURNAL_SYNC,
    JOURNAL_AFTER_WRITE,
    STORE_AFTER_APPEND,
    TOOL_START,
    BEFORE_COMMIT_START,
    AFTER_COMMIT_START,
    AFTER_UPDATE_PERSISTED,
    LEASE_EXPIRY,
    DRAIN,
    AGENT_AFTER_TURN,
    AGENT_AFTER_TOOL_CREATED,
    AGENT_AFTER_TOOL_ENDED,
    AGENT_AFTER_TOOL_RESULT,
    AGENT_AFTER_MESSAGE,
];

/// Arms the fail points of `specs` (process-wide), after checking every name.
///
/// # Errors
/// [`FailPointError::UnknownPoint`] for a name not in [`POINTS`] (nothing armed),
/// [`FailPointError::Disabled`] without the `failpoints` feature.
pub fn configure(specs: &[FailPointSpec]) -> Result<(), FailPointError> {
    if let Some(unknown) = specs.iter().find(|s| !POINTS.contains(&s.name.as_str())) {
        return Err(FailPointError::UnknownPoint(unknown.name.clone()));
    }
    specs.iter().try_for_each(dtask_journal::failpoints::arm)
}

/// Arms the fail points named in the [`ENV`] variable; returns what was armed (nothing when
/// the variable is unset or empty).
///
/// # Errors
/// As for [`parse`] and [`configure`].
pub fn configure_from_env() -> Result<Vec<FailPointSpec>, FailPointError> {
    let config = std::env::var(ENV).unwrap_or_default();
    let specs = parse(&config)?;
    configure(&specs)?;
    Ok(specs)
}

/// Disarms every fail point.
pub fn disarm_all() {
    dtask_journal::failpoints::disarm_all();
}

/// The store error of a fail point that fires with `error`: a storage failure.
#[cfg(feature = "failpoints")]
pub(crate) fn injected(message: String) -> crate::StoreError {
    crate::StoreError::Journal(dtask_journal::Error::storage(message))
}

/// Evaluates a fail point: `point!(NAME)` for a site without an error path (an `error`
/// action is ignored there), `point!(NAME, |message| expr)` to return `expr` from the
/// enclosing function when the point fires with `error`. Nothing without the feature.
#[cfg(feature = "failpoints")]
macro_rules! point {
    ($name:expr) => {
        let _ = ::dtask_journal::failpoints::hit($name);
    };
    ($name:expr, |$message:ident| $on_error:expr) => {
        if let Some($message) = ::dtask_journal::failpoints::hit($name) {
            return $on_error;
        }
    };
}

/// Evaluates a fail point (compiled out: the `failpoints` feature is off).
#[cfg(not(feature = "failpoints"))]
macro_rules! point {
    ($name:expr) => {};
    ($name:expr, |$message:ident| $on_error:expr) => {};
}

pub(crate) use point;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_points_are_refused_before_anything_is_armed() {
        let specs = parse("store::after_append=error;nowhere=abort").unwrap();
        assert_eq!(
            configure(&specs),
            Err(FailPointError::UnknownPoint("nowhere".into()))
        );
    }

    #[test]
    fn every_point_has_a_unique_name() {
        let mut names = POINTS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), POINTS.len());
    }
}

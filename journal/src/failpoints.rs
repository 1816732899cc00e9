//! Fail points: named places at durability boundaries where a test can make the process
//! panic, fail the operation with an error, or end the process on the spot (abort, or SIGKILL).
//!
//! The points are compiled in only with the `failpoints` cargo feature (built on the `fail`
//! crate); without it every point is an empty statement and [`arm`] refuses. The types
//! here (what to do, where, after how many hits) are always available so that a driver built
//! without the feature can still parse and forward a configuration to a child process.
//!
//! A process is told which points to arm through the [`ENV`] variable, a `;`-separated list of
//! `NAME=ACTION[@SKIP]`: `ACTION` is `panic`, `error`, `abort` or `kill`, and the point fires once,
//! after letting `SKIP` hits (default 0) pass. Every firing is reported on standard error as a
//! line starting with [`HIT_PREFIX`], before the action is taken.
//!
//! The journal's points:
//! - [`BEFORE_WRITE`]: the writer formed a batch and is about to write it (error: the batch
//!   fails, nothing is written);
//! - [`AFTER_WRITE`]: the batch is durable, its callers are not yet acknowledged (error: the
//!   callers are told the write failed although it is durable: an ambiguous outcome);
//! - [`SYNC`]: a sync of the written batches is about to start (error: the sync fails, as an
//!   `fsync` that reports an I/O error: an embedded journal stops and must be reopened, see
//!   [`crate::Journal::write_state`]; a PostgreSQL journal fails the appends it covered and goes
//!   on).

use std::fmt;
use std::str::FromStr;

/// The environment variable a process reads its fail-point configuration from.
pub const ENV: &str = "DTASK_FAILPOINTS";

/// How a fired fail point announces itself on standard error.
pub const HIT_PREFIX: &str = "dtask-failpoint: hit";

/// Whether fail points are compiled in (the `failpoints` feature).
pub const ENABLED: bool = cfg!(feature = "failpoints");

/// The journal writer is about to write a batch.
pub const BEFORE_WRITE: &str = "journal::before_write";

/// The journal writer wrote a batch durably and has not acknowledged its callers yet.
pub const AFTER_WRITE: &str = "journal::after_write";

/// The journal writer is about to sync the batches it wrote.
pub const SYNC: &str = "journal::sync";

/// The journal's fail points.
pub const POINTS: &[&str] = &[BEFORE_WRITE, AFTER_WRITE, SYNC];

/// What a fail point does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailAction {
    /// Panics in the thread that reached the point.
    Panic,
    /// Fails the operation at the point with an error (each point documents which).
    Error,
    /// Aborts the process at once (no unwinding, no destructors, no flush): a crash.
    Abort,
    /// Sends the process SIGKILL, as `kill -9` does: the kernel ends it at once.
    Kill,
}

impl FailAction {
    /// The action's name in a configuration.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Panic => "panic",
            Self::Error => "error",
            Self::Abort => "abort",
            Self::Kill => "kill",
        }
    }
}

impl fmt::Display for FailAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FailAction {
    type Err = FailPointError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "panic" => Ok(Self::Panic),
            "error" => Ok(Self::Error),
            "abort" => Ok(Self::Abort),
            "kill" => Ok(Self::Kill),
            other => Err(FailPointError::UnknownAction(other.to_owned())),
        }
    }
}

/// One armed fail point: fire `action` at `name` once, after `skip` hits passed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FailPointSpec {
    /// The point's name.
    pub name: String,
    /// What it does.
    pub action: FailAction,
    /// How many hits pass before it fires.
    pub skip: u64,
}

impl fmt::Display for FailPointSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.action)?;
        if self.skip > 0 {
            write!(f, "@{}", self.skip)?;
        }
        Ok(())
    }
}

impl FromStr for FailPointSpec {
    type Err = FailPointError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, rest) = s
            .split_once('=')
            .ok_or_else(|| FailPointError::Malformed(s.to_owned()))?;
        let name = name.trim();
        if name.is_empty() {
            return Err(FailPointError::Malformed(s.to_owned()));
        }
        let (action, skip) = match rest.split_once('@') {
            Some((action, skip)) => (
                action,
                skip.trim()
                    .parse()
                    .map_err(|_| FailPointError::Malformed(s.to_owned()))?,
            ),
            None => (rest, 0),
        };
        Ok(Self {
            name: name.to_owned(),
            action: action.trim().parse()?,
            skip,
        })
    }
}

/// Parses a configuration: `;`-separated [`FailPointSpec`]s (empty entries are ignored).
///
/// # Errors
/// [`FailPointError::Malformed`] or [`FailPointError::UnknownAction`] for a bad entry.
pub fn parse(config: &str) -> Result<Vec<FailPointSpec>, FailPointError> {
    config
        .split(';')
        .filter(|entry| !entry.trim().is_empty())
        .map(str::parse)
        .collect()
}

/// Errors of fail-point configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FailPointError {
    /// An entry is not `NAME=ACTION[@SKIP]`.
    #[error("malformed fail point {0:?}: expected NAME=ACTION[@SKIP]")]
    Malformed(String),
    /// The action is not `panic`, `error`, `abort` or `kill`.
    #[error("unknown fail action {0:?}: expected panic, error, abort or kill")]
    UnknownAction(String),
    /// No fail point has that name.
    #[error("unknown fail point {0:?}")]
    UnknownPoint(String),
    /// The build has no fail points (the `failpoints` feature is off).
    #[error("this build has no fail points: rebuild with the `failpoints` feature")]
    Disabled,
    /// The `fail` crate refused the configuration.
    #[error("fail point {name:?}: {reason}")]
    Refused {
        /// The point.
        name: String,
        /// Why.
        reason: String,
    },
}

/// Arms one fail point (process-wide). Names are not checked here: the engine's
/// `dtask_engine::failpoints::configure` checks them against every known point.
///
/// # Errors
/// [`FailPointError::Disabled`] without the `failpoints` feature; [`FailPointError::Refused`]
/// when the `fail` crate refuses.
pub fn arm(spec: &FailPointSpec) -> Result<(), FailPointError> {
    imp::arm(spec)
}

/// Disarms every fail point.
pub fn disarm_all() {
    imp::disarm_all();
}

/// Evaluates the fail point `name`: `None` when it does not fire (always, without the
/// feature); the error message when it fires with [`FailAction::Error`]. Panics or aborts
/// when it fires with those actions.
#[doc(hidden)]
#[must_use]
pub fn hit(name: &'static str) -> Option<String> {
    imp::hit(name)
}

#[cfg(feature = "failpoints")]
mod imp {
    use super::{FailAction, FailPointError, FailPointSpec, HIT_PREFIX};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The argument of the `return` task that makes [`hit`] panic instead of failing.
    const PANIC_ARG: &str = "dtask:panic";

    pub(super) fn arm(spec: &FailPointSpec) -> Result<(), FailPointError> {
        let refused = |reason: String| FailPointError::Refused {
            name: spec.name.clone(),
            reason,
        };
        let skip = if spec.skip > 0 {
            format!("{}*off->", spec.skip)
        } else {
            String::new()
        };
        match spec.action {
            FailAction::Abort | FailAction::Kill => {
                let name = spec.name.clone();
                let to_pass = spec.skip;
                let seen = AtomicU64::new(0);
                let kill = spec.action == FailAction::Kill;
                fail::cfg_callback(spec.name.clone(), move || {
                    // Exactly one thread fires: another one reaching the point while the
                    // first ends the process waits for the end instead of reporting a
                    // second hit.
                    let n = seen.fetch_add(1, Ordering::SeqCst);
                    if n == to_pass {
                        if kill {
                            eprintln!("{HIT_PREFIX} {name} (kill)");
                            let _ = rustix::process::kill_process(
                                rustix::process::getpid(),
                                rustix::process::Signal::KILL,
                            );
                        }
                        eprintln!("{HIT_PREFIX} {name} (abort)");
                        std::process::abort();
                    }
                    if n > to_pass {
                        loop {
                            std::thread::park();
                        }
                    }
                })
                .map_err(refused)
            }
            FailAction::Panic => {
                fail::cfg(spec.name.clone(), &format!("{skip}1*return({PANIC_ARG})"))
                    .map_err(refused)
            }
            FailAction::Error => fail::cfg(
                spec.name.clone(),
                &format!(
                    "{skip}1*return(injected failure at fail point {})",
                    spec.name
                ),
            )
            .map_err(refused),
        }
    }

    pub(super) fn disarm_all() {
        for (name, _) in fail::list() {
            fail::remove(name);
        }
    }

    pub(super) fn hit(name: &'static str) -> Option<String> {
        fail::fail_point!(name, |arg: Option<String>| Some(fire(name, arg)));
        None
    }

    fn fire(name: &str, arg: Option<String>) -> String {
        if arg.as_deref() == Some(PANIC_ARG) {
            eprintln!("{HIT_PREFIX} {name} (panic)");
            panic!("injected panic at fail point {name}");
        }
        eprintln!("{HIT_PREFIX} {name} (error)");
        arg.unwrap_or_else(|| format!("injected failure at fail point {name}"))
    }
}

#[cfg(not(feature = "failpoints"))]
mod imp {
    use super::{FailPointError, FailPointSpec};

    pub(super) fn arm(_spec: &FailPointSpec) -> Result<(), FailPointError> {
        Err(FailPointError::Disabled)
    }

    pub(super) fn disarm_all() {}

    #[inline]
    pub(super) fn hit(_name: &'static str) -> Option<String> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_parse_and_print_back() {
        let specs = parse("journal::before_write=abort@3; store::after_append=error;").unwrap();
        assert_eq!(
            specs,
            vec![
                FailPointSpec {
                    name: BEFORE_WRITE.into(),
                    action: FailAction::Abort,
                    skip: 3
                },
                FailPointSpec {
                    name: "store::after_append".into(),
                    action: FailAction::Error,
                    skip: 0
                },
            ]
        );
        assert_eq!(specs[0].to_string(), "journal::before_write=abort@3");
        assert_eq!(specs[1].to_string(), "store::after_append=error");
    }

    #[test]
    fn bad_configurations_are_typed_errors() {
        assert_eq!(
            parse("x=explode"),
            Err(FailPointError::UnknownAction("explode".into()))
        );
        assert!(matches!(parse("x"), Err(FailPointError::Malformed(_))));
        assert!(matches!(
            parse("x=panic@y"),
            Err(FailPointError::Malformed(_))
        ));
        assert!(matches!(parse("=panic"), Err(FailPointError::Malformed(_))));
    }
}

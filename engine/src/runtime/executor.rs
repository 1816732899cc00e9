//! Executors: what runs a task's attempts.

use super::attempt::AttemptContext;
use async_trait::async_trait;
use dtask_journal::{LeasePolicy, TaskSpec};
use dtask_replay::TaskState;
use std::collections::HashMap;
use std::sync::Arc;

/// How one attempt ended, as its executor reports it to the manager, which commits it (the
/// task's [`TaskOutcome`](super::TaskOutcome) is what waiting for the whole task observes).
/// Exactly one variant, so results that mix variants cannot be expressed; results missing a
/// required part (an empty error or checkpoint) are refused at commit with
/// `InvalidExecutionResult`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecutionResult {
    /// The task completed with this result data.
    Completed(Vec<u8>),
    /// [`ExecutionResult::Completed`] only if the task's mailbox holds no input after
    /// `cursor`, which must be its consumed cursor (transition `CompleteIfNoInputs`): with a
    /// newer input the task goes back to pending instead — its checkpoint kept, nothing
    /// completed — and the next attempt reads what came in. For an executor that takes its
    /// inputs as it goes and must not end with one unread (an input is accepted until the
    /// task ends, so one sent while it finishes would otherwise be sealed in unread).
    CompletedIfNoInputs {
        /// The consumed cursor the executor saw (see [`AttemptContext::advance_cursor`]).
        cursor: u64,
        /// The result data.
        data: Vec<u8>,
    },
    /// The task failed with this error (non-empty).
    Failed(String),
    /// The executor stopped after a Stop control (the reason).
    Canceled(String),
    /// The attempt waits for input; the checkpoint (non-empty) carries the request.
    WaitingInput(Vec<u8>),
    /// [`ExecutionResult::WaitingInput`] only if the mailbox holds no input after `cursor`
    /// (transition `WaitInputIfNoInputs`): the cursor — from the consumed one up to the
    /// newest input — is consumed with the wait; with a newer input the task goes back to
    /// pending instead (the checkpoint kept) and the next attempt reads it. A wait that
    /// cannot miss an input sent while the attempt decided to wait.
    WaitingInputIfNoInputs {
        /// How far the executor read the mailbox.
        cursor: u64,
        /// The checkpoint with the input request (non-empty).
        checkpoint: Vec<u8>,
    },
    /// The attempt is suspended with this checkpoint (non-empty).
    Suspended(Vec<u8>),
    /// [`ExecutionResult::Suspended`] only if the mailbox holds no input after `cursor`,
    /// which must be its consumed cursor (transition `SuspendIfNoInputs`); otherwise as
    /// [`ExecutionResult::WaitingInputIfNoInputs`].
    SuspendedIfNoInputs {
        /// The consumed cursor the executor saw.
        cursor: u64,
        /// The checkpoint (non-empty).
        checkpoint: Vec<u8>,
    },
    /// The attempt yields; the task goes back to pending. An empty checkpoint keeps the stored
    /// one; the external operation may keep running and be reattached by the next attempt.
    Yield(Vec<u8>),
    /// [`ExecutionResult::Yield`], the next attempt not before this much time has passed (by
    /// the store's clock): a durable timer — no worker holds the task while it waits, and a
    /// restart does not shorten the wait. For a tool that polls a remote job, say.
    YieldFor(Vec<u8>, std::time::Duration),
}

/// Why an executor could not produce a result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExecutionError {
    /// The execution failed; the task fails with this message (truncated to 4096 bytes).
    #[error("{0}")]
    Failed(String),
    /// A drain found no safe checkpoint: nothing is committed and the lease is left to
    /// expire, so the task is dispatched again from its last durable checkpoint.
    #[error("drain checkpoint unavailable")]
    DrainCheckpointUnavailable,
}

impl ExecutionError {
    /// A failure with `message`.
    pub fn failed(message: impl Into<String>) -> Self {
        Self::Failed(message.into())
    }
}

message_error!(
    /// Why an executor refuses a spec at submit, or a task before an attempt is claimed: a
    /// message, and optionally the error underneath. The message is what the caller sees (inside
    /// [`RuntimeError::InvalidSpec`](super::RuntimeError::InvalidSpec) or
    /// [`RuntimeError::InvalidExecution`](super::RuntimeError::InvalidExecution)).
    ValidationError
);

/// Why an executor cannot be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExecutorRegistryError {
    /// The executor's key is empty.
    #[error("an executor needs a non-empty key")]
    EmptyKey,
    /// Another executor has the key already.
    #[error("executor {key:?} is registered already")]
    Duplicate {
        /// The key.
        key: String,
    },
}

/// Runs attempts of the tasks routed to its key.
#[async_trait]
pub trait Executor: Send + Sync + 'static {
    /// The routing key tasks name in their spec.
    fn key(&self) -> &str;

    /// What a lease expiry does to this executor's tasks (fixed at submit).
    fn lease_policy(&self) -> LeasePolicy;

    /// How many times the task of `spec` may be recovered after losing its worker (a lease
    /// expiry under the retry policy) before the next expiry fails it — the cap that keeps a
    /// task whose attempts kill their process from being retried forever (fixed at submit, in
    /// the task's journal). `None` (the default): no limit.
    fn max_recoveries(&self, spec: &TaskSpec) -> Option<u64> {
        let _ = spec;
        None
    }

    /// Whether a rerun of this executor's task ([`crate::Manager::rerun`]) carries the
    /// original's creation checkpoint. `true` by default: a task created with a checkpoint
    /// starts its first attempt from it. The managed tools answer `false`: their tasks are
    /// created with a checkpoint only by a hand-off (the started marker of the run the
    /// foreground began), and a rerun starts the tool from the beginning.
    fn rerun_keeps_checkpoint(&self) -> bool {
        true
    }

    /// Whether attempts receive [`super::Control::Drain`] when the manager closes.
    fn supports_drain(&self) -> bool {
        false
    }

    /// Checks a spec at submit (side-effect free).
    ///
    /// # Errors
    /// Why the spec is refused.
    fn validate_spec(&self, spec: &TaskSpec) -> Result<(), ValidationError> {
        let _ = spec;
        Ok(())
    }

    /// Checks a task before an attempt is claimed (side-effect free).
    ///
    /// # Errors
    /// Why the task cannot run.
    fn validate_execution(&self, task: &TaskState) -> Result<(), ValidationError> {
        let _ = task;
        Ok(())
    }

    /// Runs one attempt of `task` (a copy of the claimed snapshot).
    ///
    /// # Errors
    /// [`ExecutionError`] when no result could be produced.
    async fn execute(
        &self,
        attempt: AttemptContext,
        task: TaskState,
    ) -> Result<ExecutionResult, ExecutionError>;

    /// Called, with the canceled task and the manager that saw it end, when a cancel has
    /// ended a task of this executor with no attempt left to stop the work its tasks hold
    /// outside attempts: [`Manager::request_cancel`](super::Manager::request_cancel) ended
    /// it at the request, no attempt being there to acknowledge it (a task pending and never
    /// claimed, waiting for input or suspended: docs/semantics.md), or an attempt of this
    /// manager that handed the task on (a yield, a wait for input, a suspension) met the
    /// cancel as it ended, its result replaced by the cancel's acknowledgement. That work —
    /// a managed tool's operation started in a call's foreground or left running for the
    /// next attempt, an agent run's tool calls — no attempt will now stop. Default: nothing.
    async fn canceled_between_attempts(&self, manager: &super::Manager, task: &TaskState) {
        let _ = (manager, task);
    }
}

/// The executors a manager can route to, by key.
#[derive(Clone, Default)]
pub struct ExecutorRegistry {
    executors: HashMap<String, Arc<dyn Executor>>,
}

impl std::fmt::Debug for ExecutorRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.executors.keys()).finish()
    }
}

impl ExecutorRegistry {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `executor` under its key.
    ///
    /// # Errors
    /// [`ExecutorRegistryError::EmptyKey`], or [`ExecutorRegistryError::Duplicate`] when
    /// another executor has the key already.
    pub fn register(&mut self, executor: impl Executor) -> Result<(), ExecutorRegistryError> {
        self.register_arc(Arc::new(executor))
    }

    /// Registers a shared executor under its key.
    ///
    /// # Errors
    /// As [`ExecutorRegistry::register`].
    pub fn register_arc(
        &mut self,
        executor: Arc<dyn Executor>,
    ) -> Result<(), ExecutorRegistryError> {
        let key = executor.key().to_owned();
        if key.is_empty() {
            return Err(ExecutorRegistryError::EmptyKey);
        }
        if self.executors.contains_key(&key) {
            return Err(ExecutorRegistryError::Duplicate { key });
        }
        self.executors.insert(key, executor);
        Ok(())
    }

    /// The executor of `key`.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<Arc<dyn Executor>> {
        self.executors.get(key).cloned()
    }

    /// Every registered key.
    #[must_use]
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<_> = self.executors.keys().cloned().collect();
        keys.sort();
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Keyed(&'static str);

    #[async_trait]
    impl Executor for Keyed {
        fn key(&self) -> &str {
            self.0
        }

        fn lease_policy(&self) -> LeasePolicy {
            LeasePolicy::Retry
        }

        async fn execute(
            &self,
            _attempt: AttemptContext,
            _task: TaskState,
        ) -> Result<ExecutionResult, ExecutionError> {
            Ok(ExecutionResult::Completed(Vec::new()))
        }
    }

    #[test]
    fn a_key_is_registered_once() {
        let mut registry = ExecutorRegistry::new();
        assert_eq!(
            registry.register(Keyed("")),
            Err(ExecutorRegistryError::EmptyKey)
        );
        registry.register(Keyed("job")).unwrap();
        let again = registry.register(Keyed("job"));
        assert_eq!(
            again,
            Err(ExecutorRegistryError::Duplicate { key: "job".into() })
        );
        assert_eq!(
            again.unwrap_err().to_string(),
            "executor \"job\" is registered already"
        );
        assert_eq!(registry.keys(), ["job"]);
    }

    #[test]
    fn a_validation_error_shows_its_message_and_keeps_its_source() {
        let plain = ValidationError::from("no such tool");
        assert_eq!(plain.to_string(), "no such tool");
        assert!(std::error::Error::source(&plain).is_none());
        let io = std::io::Error::other("disk gone");
        let caused = ValidationError::with_source("read the spec: disk gone", io);
        assert_eq!(caused.message(), "read the spec: disk gone");
        assert!(std::error::Error::source(&caused).is_some());
    }
}

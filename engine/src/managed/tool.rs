//! The traits a managed tool implements, and the values that cross them.

use super::codec::InputRequest;
use super::error::{ToolFailure, ToolRunError, UpdateError};
use async_trait::async_trait;
use futures::stream::BoxStream;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The largest update data: 256 KiB.
pub const MAX_UPDATE_DATA_BYTES: usize = 256 << 10;
/// The longest update kind: 128 bytes.
pub const MAX_UPDATE_KIND_BYTES: usize = 128;
/// The longest update event id: 1024 bytes (the store's default id bound, so that an update
/// the foreground accepts is one the background can persist).
pub const MAX_UPDATE_EVENT_ID_BYTES: usize = 1024;
/// The most update metadata entries: 32.
pub const MAX_UPDATE_METADATA_ENTRIES: usize = 32;
/// The longest update metadata key or value: 1024 bytes.
pub const MAX_UPDATE_METADATA_BYTES: usize = 1024;

/// A progress update of a running tool.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Update {
    /// A lifetime-stable idempotency key (at most 1024 bytes); required for recoverable tools,
    /// generated for plain tools when empty.
    pub event_id: String,
    /// A free kind tag (at most 128 bytes).
    pub kind: String,
    /// The update bytes (at most 256 KiB).
    pub data: Vec<u8>,
    /// Key/value metadata (at most 32 entries, keys non-empty, keys and values at most 1 KiB).
    pub metadata: BTreeMap<String, String>,
}

impl Update {
    /// Checks the update's bounds.
    ///
    /// # Errors
    /// The first bound exceeded, as an [`UpdateError`].
    pub fn validate(&self) -> Result<(), UpdateError> {
        if self.data.len() > MAX_UPDATE_DATA_BYTES {
            return Err(UpdateError::DataTooLarge {
                len: self.data.len(),
                max: MAX_UPDATE_DATA_BYTES,
            });
        }
        if self.kind.len() > MAX_UPDATE_KIND_BYTES {
            return Err(UpdateError::KindTooLong {
                len: self.kind.len(),
                max: MAX_UPDATE_KIND_BYTES,
            });
        }
        if self.event_id.len() > MAX_UPDATE_EVENT_ID_BYTES {
            return Err(UpdateError::EventIdTooLong {
                len: self.event_id.len(),
                max: MAX_UPDATE_EVENT_ID_BYTES,
            });
        }
        if self.metadata.len() > MAX_UPDATE_METADATA_ENTRIES {
            return Err(UpdateError::TooManyMetadataEntries {
                entries: self.metadata.len(),
                max: MAX_UPDATE_METADATA_ENTRIES,
            });
        }
        let bad_entry = self.metadata.iter().find(|(k, v)| {
            k.is_empty()
                || k.len() > MAX_UPDATE_METADATA_BYTES
                || v.len() > MAX_UPDATE_METADATA_BYTES
        });
        if let Some((key, _)) = bad_entry {
            let mut end = key.len().min(MAX_UPDATE_METADATA_BYTES);
            while !key.is_char_boundary(end) {
                end -= 1;
            }
            return Err(UpdateError::MetadataEntry {
                key: key[..end].to_owned(),
            });
        }
        Ok(())
    }
}

/// How a tool's [`Run`] ended: what [`Run::wait`] returns. The managed executors turn it into
/// the attempt's [`ExecutionResult`](crate::ExecutionResult), and a foreground call into its
/// [`CallOutcome`](super::CallOutcome).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    /// Completed with result data.
    Completed(Vec<u8>),
    /// Failed with an error (non-empty).
    Failed(String),
    /// Canceled (the reason may be empty).
    Canceled(String),
    /// Waiting for input (resumable tools only).
    WaitingInput {
        /// What is asked.
        request: InputRequest,
        /// A replacement tool checkpoint; empty keeps the current one.
        checkpoint: Vec<u8>,
    },
    /// Not done, and nothing to do before `after` has passed: a remote job still running,
    /// say (recoverable tools only). The task waits on a durable timer, holding no worker;
    /// then its next attempt recovers the tool from `checkpoint` ([`RecoverableTool`]), which
    /// looks again. In the foreground the call goes to the background at once, delayed.
    CheckBackIn {
        /// A replacement tool checkpoint; empty keeps the current one.
        checkpoint: Vec<u8>,
        /// How long to wait (by the store's clock).
        after: std::time::Duration,
    },
}

/// A stream of updates a run emits; the framework owns it. An `Err` item fails the attempt.
pub type UpdateStream = BoxStream<'static, Result<Update, ToolFailure>>;

/// A live external operation.
#[async_trait]
pub trait Run: Send + Sync + 'static {
    /// Waits for the operation's outcome. Cancelling the wait never cancels the operation.
    ///
    /// # Errors
    /// A failure of the operation or of the wait; the attempt fails with it.
    async fn wait(&self) -> Result<RunOutcome, ToolRunError>;

    /// Stops the operation. Must be safe to call repeatedly and concurrently.
    ///
    /// # Errors
    /// Why it could not be stopped.
    async fn stop(&self) -> Result<(), ToolRunError>;

    /// The run's updates, if it emits any. Called at most once per run. After `wait` returns,
    /// the stream must end within [`UPDATE_DRAIN_TIMEOUT`](super::UPDATE_DRAIN_TIMEOUT) (5 s).
    fn updates(&self) -> Option<UpdateStream> {
        None
    }

    /// Hands the run an input that was sent to its task while it runs (the task's mailbox,
    /// in order). `Ok(true)`: the run took it, and the attempt records it as consumed;
    /// `Ok(false)` (the default): the run takes no input while running, and the input stays
    /// in the mailbox. Called for recoverable tools' background runs, one input at a time;
    /// an input may be offered again after a crash before its consumption was recorded, so a
    /// run should recognize a repeated [`RunInput::sequence`].
    ///
    /// # Errors
    /// The attempt fails with it.
    async fn deliver_input(&self, input: &RunInput) -> Result<bool, ToolRunError> {
        let _ = input;
        Ok(false)
    }
}

/// An input sent to a running task, as its run receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunInput {
    /// Its sequence in the task's mailbox (1, 2, 3, …).
    pub sequence: u64,
    /// The sender's idempotency key.
    pub event_id: String,
    /// The input kind.
    pub kind: String,
    /// The input bytes.
    pub data: Vec<u8>,
}

/// What `start` was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartRequest {
    /// The task id (stable for the task's whole life: the idempotency key of `start`).
    pub task_id: String,
    /// The JSON arguments.
    pub arguments: String,
    /// The attempt (0 in the foreground).
    pub attempt: u64,
}

/// What `recover` was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoverRequest {
    /// The task id.
    pub task_id: String,
    /// The JSON arguments.
    pub arguments: String,
    /// The attempt.
    pub attempt: u64,
    /// The latest durable tool checkpoint (an independent copy, possibly empty).
    pub checkpoint: Vec<u8>,
}

/// What `resume` was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeRequest {
    /// The task id.
    pub task_id: String,
    /// The JSON arguments.
    pub arguments: String,
    /// The attempt.
    pub attempt: u64,
    /// The id of the request being answered.
    pub request_id: String,
    /// The answer (may be replayed on a later attempt: resume must be idempotent per
    /// request id and data).
    pub data: Vec<u8>,
    /// The latest durable tool checkpoint.
    pub checkpoint: Vec<u8>,
}

/// What `start` returns.
pub struct StartResult {
    /// The live run.
    pub run: Arc<dyn Run>,
    /// The tool checkpoint to persist with the started marker (plain tools: empty).
    pub checkpoint: Vec<u8>,
}

impl std::fmt::Debug for StartResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StartResult")
            .field("checkpoint_bytes", &self.checkpoint.len())
            .finish_non_exhaustive()
    }
}

/// A tool whose calls run as durable background tasks.
///
/// Capabilities beyond plain start are declared by returning `Some(self)` from the `as_*`
/// methods (recoverable, resumable).
#[async_trait]
pub trait BackgroundTool: Send + Sync + 'static {
    /// Checks arguments; repeatable and side-effect free.
    ///
    /// # Errors
    /// Why the arguments are refused.
    fn validate_arguments(&self, arguments: &str) -> Result<(), ToolFailure>;

    /// Starts the external operation. A recoverable tool's start must be idempotent by task
    /// id: a worker can die after the side effect but before the started marker is durable.
    ///
    /// # Errors
    /// The start failure; the attempt fails.
    async fn start(&self, request: StartRequest) -> Result<StartResult, ToolRunError>;

    /// This tool as a recoverable one, if it is.
    fn as_recoverable(&self) -> Option<&dyn RecoverableTool> {
        None
    }

    /// This tool as a resumable one, if it is.
    fn as_resumable(&self) -> Option<&dyn ResumableTool> {
        None
    }

    /// This tool as one whose live foreground run can be handed to the background, if it is.
    fn as_handoff(&self) -> Option<&dyn ForegroundHandoffTool> {
        None
    }

    /// This tool's input preparer, if it has one.
    fn as_input_preparer(&self) -> Option<&dyn InputPreparer> {
        None
    }
}

/// What `adopt` is given: the live foreground (attempt 0) run of a call whose foreground time
/// ran out, to be owned by the background task from now on.
pub struct AdoptRequest {
    /// The task id the call was given (the background task keeps it).
    pub task_id: String,
    /// The JSON arguments.
    pub arguments: String,
    /// The live run returned by the foreground `start`.
    pub run: Arc<dyn Run>,
    /// The tool checkpoint `start` returned (an independent copy).
    pub tool_checkpoint: Vec<u8>,
}

impl std::fmt::Debug for AdoptRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdoptRequest")
            .field("task_id", &self.task_id)
            .field("checkpoint_bytes", &self.tool_checkpoint.len())
            .finish_non_exhaustive()
    }
}

/// What `adopt` returns: the run the first background attempt observes (it should offer a
/// usable update stream) and the checkpoint persisted with the started marker.
pub struct AdoptResult {
    /// The background-owned run.
    pub run: Arc<dyn Run>,
    /// The tool checkpoint of the started marker.
    pub tool_checkpoint: Vec<u8>,
}

impl std::fmt::Debug for AdoptResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdoptResult")
            .field("checkpoint_bytes", &self.tool_checkpoint.len())
            .finish_non_exhaustive()
    }
}

/// A tool whose live foreground run can be adopted by a background task without repeating
/// its side effects (the hand-off after a foreground timeout).
#[async_trait]
pub trait ForegroundHandoffTool: Send + Sync {
    /// Takes ownership of the live attempt-0 run.
    ///
    /// # Errors
    /// Why the run cannot be adopted; the call then times out instead.
    async fn adopt(&self, request: AdoptRequest) -> Result<AdoptResult, ToolRunError>;
}

/// What an input preparer is asked: the model's arguments and, when the caller answers an
/// earlier [`Prepared::Interrupt`], that interrupt's state and the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareRequest {
    /// The model's JSON arguments (unchanged across re-entries).
    pub arguments: String,
    /// The answer to this preparer's earlier interrupt, if any.
    pub resume: Option<PreparerResume>,
}

/// An answer to an input preparer's interrupt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparerResume {
    /// The state the preparer returned with its interrupt.
    pub state: Vec<u8>,
    /// The caller's answer (JSON bytes).
    pub answer: Vec<u8>,
}

/// What an input preparer decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Prepared {
    /// The final JSON arguments (validated, persisted and given to the tool).
    Arguments(String),
    /// The preparer needs an answer first: the call ends with an interrupt carrying `info`;
    /// nothing is created and nothing starts.
    Interrupt {
        /// What is asked (shown to whoever answers).
        info: serde_json::Value,
        /// The preparer's own state, given back with the answer.
        state: Vec<u8>,
    },
}

/// Completes or rewrites a call's arguments before anything durable happens: called in the
/// caller's call, before a task id is allocated or output reserved. May be re-entered; must
/// be idempotent and must not start the operation. The direct submit API never calls it.
#[async_trait]
pub trait InputPreparer: Send + Sync {
    /// Prepares the arguments.
    ///
    /// # Errors
    /// Why the call cannot go on; returned to the caller as is, and nothing is created.
    async fn prepare_input(&self, request: PrepareRequest) -> Result<Prepared, ToolFailure>;
}

/// A tool whose runs can be reattached after the engine dies.
#[async_trait]
pub trait RecoverableTool: Send + Sync {
    /// Reattaches to the operation started for this task, from its latest checkpoint.
    ///
    /// # Errors
    /// The failure; the attempt fails.
    async fn recover(&self, request: RecoverRequest) -> Result<Arc<dyn Run>, ToolRunError>;
}

/// A recoverable tool that can wait for input and resume with an answer.
#[async_trait]
pub trait ResumableTool: Send + Sync {
    /// Resumes with an answer. Invalid input must be refused with
    /// [`ToolRunError::InputRejected`] before any side effect.
    ///
    /// # Errors
    /// [`ToolRunError::InputRejected`] keeps the task waiting; others fail it.
    async fn resume(&self, request: ResumeRequest) -> Result<Arc<dyn Run>, ToolRunError>;
}

/// Where a tool's transcript goes: a derived, idempotent projection of its updates.
#[async_trait]
pub trait OutputMaterializer: Send + Sync + 'static {
    /// Reserves the output path of a task (becomes the spec's output file).
    ///
    /// # Errors
    /// Why no path could be reserved.
    async fn reserve_output(&self, task_id: &str) -> Result<String, ToolFailure>;

    /// Appends one update's data; must be idempotent by (task id, event id) and apply distinct
    /// events in call order.
    ///
    /// # Errors
    /// Why the append failed (recorded once as the task's transcript failure).
    async fn append_output(
        &self,
        task_id: &str,
        event_id: &str,
        path: &str,
        data: &[u8],
    ) -> Result<(), ToolFailure>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_metadata(entries: impl IntoIterator<Item = (String, String)>) -> Update {
        Update {
            event_id: "e".into(),
            data: b"x".to_vec(),
            metadata: entries.into_iter().collect(),
            ..Update::default()
        }
    }

    #[test]
    fn metadata_bounds_are_typed_errors() {
        let full = (0..MAX_UPDATE_METADATA_ENTRIES).map(|i| (format!("k{i}"), "v".into()));
        assert_eq!(with_metadata(full).validate(), Ok(()));
        let over = (0..=MAX_UPDATE_METADATA_ENTRIES).map(|i| (format!("k{i}"), "v".into()));
        assert_eq!(
            with_metadata(over).validate(),
            Err(UpdateError::TooManyMetadataEntries {
                entries: MAX_UPDATE_METADATA_ENTRIES + 1,
                max: MAX_UPDATE_METADATA_ENTRIES,
            })
        );
        let empty_key = with_metadata([(String::new(), "v".into())]);
        assert_eq!(
            empty_key.validate(),
            Err(UpdateError::MetadataEntry { key: String::new() })
        );
        let long_value = with_metadata([("k".into(), "v".repeat(MAX_UPDATE_METADATA_BYTES + 1))]);
        assert_eq!(
            long_value.validate(),
            Err(UpdateError::MetadataEntry { key: "k".into() })
        );
        let long_key = "é".repeat(MAX_UPDATE_METADATA_BYTES);
        let Err(UpdateError::MetadataEntry { key }) =
            with_metadata([(long_key, "v".into())]).validate()
        else {
            panic!("a long key is refused");
        };
        assert_eq!(key.len(), MAX_UPDATE_METADATA_BYTES, "cut to the bound");
    }
}

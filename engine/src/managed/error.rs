//! The managed-tool layer's errors: [`ManagedError`], what the call and submit APIs return;
//! [`ToolFailure`] and [`ToolRunError`], what a tool reports; and the rules a tool's run or a
//! registration can break ([`UpdateError`], [`RuleViolation`], [`ArgumentsError`],
//! [`ToolRegistryError`], [`EnvelopeError`]).
//!
//! The persisted formats' [`CodecError`] and the interrupt state's [`InterruptStateError`] live
//! beside their formats.

use super::codec::CodecError;
use super::interrupt::{Interrupt, InterruptStateError};
use crate::runtime::RuntimeError;
use std::time::Duration;

message_error!(
    /// Why a tool's own code failed: a message, and optionally the error underneath.
    ///
    /// The message is what the task and the model see (a failed task's error, a failed
    /// `foreground_result`), so it should say what went wrong; the source is kept for callers that
    /// walk [`std::error::Error::source`].
    ///
    /// ```
    /// use dtask_engine::managed::ToolFailure;
    ///
    /// let plain = ToolFailure::new("no such job");
    /// assert_eq!(plain.to_string(), "no such job");
    /// let io = std::io::Error::other("disk full");
    /// let wrapped = ToolFailure::with_source("write the transcript: disk full", io);
    /// assert!(std::error::Error::source(&wrapped).is_some());
    /// ```
    ToolFailure
);

/// An error of a tool operation on a run (start, recover, resume, adopt, wait, stop).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolRunError {
    /// The operation failed.
    #[error(transparent)]
    Failed(#[from] ToolFailure),
    /// `resume` refused the input before any side effect: the task keeps waiting on the same
    /// request.
    #[error("resume input rejected: {0}")]
    InputRejected(String),
}

impl ToolRunError {
    /// A failure with `message`.
    pub fn failed(message: impl Into<String>) -> Self {
        Self::Failed(ToolFailure::new(message))
    }
}

/// Which bound an update breaks. Its text starts with the same words on every path: the
/// failed foreground result, the stream's [`ManagedError::InvalidUpdate`] and the failed
/// background task.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UpdateError {
    /// The data is larger than [`MAX_UPDATE_DATA_BYTES`](super::MAX_UPDATE_DATA_BYTES).
    #[error("update data exceeds configured bounds ({len} bytes, at most {max})")]
    DataTooLarge {
        /// The data's length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// The kind is longer than [`MAX_UPDATE_KIND_BYTES`](super::MAX_UPDATE_KIND_BYTES).
    #[error("update kind exceeds configured bounds ({len} bytes, at most {max})")]
    KindTooLong {
        /// The kind's length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// The event id is longer than
    /// [`MAX_UPDATE_EVENT_ID_BYTES`](super::MAX_UPDATE_EVENT_ID_BYTES).
    #[error("update event id exceeds configured bounds ({len} bytes, at most {max})")]
    EventIdTooLong {
        /// The event id's length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// More than [`MAX_UPDATE_METADATA_ENTRIES`](super::MAX_UPDATE_METADATA_ENTRIES) metadata
    /// entries.
    #[error("update metadata exceeds configured bounds ({entries} entries, at most {max})")]
    TooManyMetadataEntries {
        /// The number of entries.
        entries: usize,
        /// The bound.
        max: usize,
    },
    /// A metadata key is empty, or a key or value is longer than
    /// [`MAX_UPDATE_METADATA_BYTES`](super::MAX_UPDATE_METADATA_BYTES).
    #[error("update metadata entry exceeds configured bounds (key {key:?})")]
    MetadataEntry {
        /// The offending key (cut to the bound).
        key: String,
    },
}

/// A rule of the managed layer that a tool's run broke: its outcome, or its update stream
/// (an update over a bound is an [`UpdateError`] instead). A background attempt fails its task
/// with the text; a foreground call answers with a failed `foreground_result`, a stream ends
/// with [`ManagedError::InvalidOutcome`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuleViolation {
    /// The run failed with an empty error.
    #[error("a failure needs an error")]
    EmptyFailure,
    /// The run waits for input but the tool is not resumable.
    #[error("waiting input requires a resumable tool")]
    NotResumable,
    /// The run asks to be looked at again later but the tool is not recoverable.
    #[error("checking back later requires a recoverable tool")]
    NotRecoverable,
    /// The run's wait for input does not fit a managed checkpoint (a bound is exceeded).
    #[error(transparent)]
    WaitingCheckpoint(CodecError),
    /// The update stream yielded an error.
    #[error("update stream: {0}")]
    UpdateStream(ToolFailure),
    /// A recoverable tool emitted an update without an event id.
    #[error("recoverable update event id is required")]
    MissingEventId,
    /// An event id was emitted again with other bytes.
    #[error("task event id conflict: event {event_id:?} was emitted with other bytes")]
    EventIdConflict {
        /// The event id.
        event_id: String,
    },
    /// The output materializer failed (in the foreground, where nothing records it).
    #[error("materialize output: {0}")]
    Materialize(ToolFailure),
    /// The update stream stayed open longer than
    /// [`UPDATE_DRAIN_TIMEOUT`](super::UPDATE_DRAIN_TIMEOUT) after the run's outcome (the
    /// time spent waiting on it, not keeping its updates).
    #[error("update stream did not close after terminal outcome")]
    UpdateStreamOpen,
}

/// Why a call's arguments are refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArgumentsError {
    /// The arguments are empty.
    #[error("arguments are required")]
    Empty,
    /// The arguments are longer than [`MAX_ARGUMENTS_BYTES`](super::MAX_ARGUMENTS_BYTES).
    #[error("arguments exceed configured bounds")]
    TooLarge {
        /// Their length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// The tool's `validate_arguments` refused them.
    #[error("validate arguments: {0}")]
    Refused(#[source] ToolFailure),
}

/// Why a tool cannot be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolRegistryError {
    /// The tool's name is empty.
    #[error("a managed tool needs a name")]
    EmptyName,
    /// A tool of the same class (plain or recoverable) has the name already.
    #[error("managed tool {name:?} is registered already")]
    Duplicate {
        /// The name.
        name: String,
    },
}

/// Why no envelope record can be built for a task.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// The task waits for input, but its input request cannot be read.
    #[error("invalid response envelope: a waiting result needs an input request")]
    MissingInputRequest {
        /// The task.
        task_id: String,
        /// Why the request cannot be read.
        #[source]
        source: CodecError,
    },
}

/// Errors of the managed-tool layer's direct API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManagedError {
    /// No tool is registered under the name.
    #[error("tool {0:?} is not registered")]
    UnknownTool(String),
    /// The arguments are empty, too large or refused by the tool.
    #[error("invalid arguments: {0}")]
    InvalidArguments(#[source] ArgumentsError),
    /// The output materializer could not reserve a path.
    #[error("reserve output: {source}")]
    ReserveOutput {
        /// The task the path was for.
        task_id: String,
        /// The materializer's error.
        source: ToolFailure,
    },
    /// The output materializer reserved an empty path.
    #[error("reserve output: output materializer returned an empty path")]
    EmptyOutputPath {
        /// The task the path was for.
        task_id: String,
    },
    /// A stored payload or checkpoint does not decode.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// A hand-off policy was configured for a tool that cannot adopt its foreground run.
    #[error(
        "invalid managed tool configuration: tool {tool:?} does not support foreground handoff"
    )]
    HandoffUnsupported {
        /// The tool.
        tool: String,
    },
    /// The task has an adopted run already in this process.
    #[error("invalid managed tool configuration: the task has an adopted run already")]
    AlreadyAdopted {
        /// The task.
        task_id: String,
    },
    /// The task has a live projection already in this process.
    #[error("invalid managed tool configuration: the task has a live projection already")]
    AlreadyProjected {
        /// The task.
        task_id: String,
    },
    /// The input preparer refused the call (its message, as is); nothing was created.
    #[error("{0}")]
    Prepare(#[source] ToolFailure),
    /// The input preparer returned empty arguments; nothing was created.
    #[error("input preparer returned empty arguments")]
    EmptyPreparedArguments,
    /// The input preparer returned arguments longer than
    /// [`MAX_ARGUMENTS_BYTES`](super::MAX_ARGUMENTS_BYTES); nothing was created.
    #[error("prepared arguments exceed configured bounds")]
    PreparedArgumentsTooLarge {
        /// Their length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A plain tool's foreground start returned a checkpoint; the run was stopped and nothing
    /// was persisted. A failing start or resume is not an error but a failed
    /// `foreground_result`.
    #[error("plain tool cannot return a checkpoint")]
    PlainToolCheckpoint {
        /// The id the call was given.
        task_id: String,
    },
    /// The tool refused to adopt its foreground run (the call then times out instead).
    #[error("adopt: {0}")]
    Adopt(#[source] ToolRunError),
    /// The foreground attempt ran out of time and was not handed to the background; the run
    /// was stopped and the task id was never persisted.
    #[error("foreground task {task_id:?} timed out after {timeout:?}")]
    ForegroundTimeout {
        /// The effective foreground timeout.
        timeout: Duration,
        /// The id the call was given.
        task_id: String,
    },
    /// The tool reported an outcome the rules forbid (or, in a stream, an update stream
    /// failure or an event id conflict).
    #[error("invalid outcome: {0}")]
    InvalidOutcome(#[from] RuleViolation),
    /// A foreground stream's update broke a bound (its kind, event id, data or metadata); the
    /// run was stopped.
    #[error(transparent)]
    InvalidUpdate(#[from] UpdateError),
    /// The result renderer failed.
    #[error("render completed result: {0}")]
    Render(#[source] ToolFailure),
    /// The result renderer returned nothing.
    #[error("result renderer returned nil")]
    RenderedNothing,
    /// A resume was given an interrupt state this tool did not produce.
    #[error(transparent)]
    InvalidInterruptState(#[from] InterruptStateError),
    /// The call needs an answer: resume it with the interrupt's state (streams end with this).
    #[error("the call is waiting for input")]
    Interrupted(Box<Interrupt>),
    /// The caller went away (a stream's consumer closed it); the run was stopped.
    #[error("the caller abandoned the call")]
    Abandoned,
    /// No envelope record could be built for the task.
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    /// The runtime refused or failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

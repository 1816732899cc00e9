//! The managed-tool layer: tools whose calls run as durable background tasks, and
//! [`ManagedTool`], the model-facing wrapper that runs a call in the foreground first and hands
//! it to the background when its time runs out. A tool implements [`BackgroundTool`] (and, to
//! survive engine crashes, [`RecoverableTool`]; to wait for input, [`ResumableTool`]);
//! [`ManagedTools`] registers the two executors that run them and submits calls.
//!
//! One background attempt chooses exactly one way to obtain the tool's run: **resume** when
//! the stored checkpoint carries an input request, **recover** when the started marker is
//! durable, else **start** — and for recoverable tools the started marker is committed before
//! the attempt first waits on the run, so a crash after that point recovers instead of
//! starting the side effect again. Updates are persisted as journal update events,
//! deduplicated by event id (a replay after recovery is dropped; different bytes fail the
//! task) and fed to the output materializer in emission order.
//!
//! The persisted formats (the task payload, the managed checkpoint) are in [`codec`].

mod call;
pub mod codec;
pub mod conformance;
mod envelope;
mod error;
mod executor;
mod foreground;
mod handoff;
mod interrupt;
mod launch;
mod live;
mod observe;
mod progress;
mod registry;
mod result;
mod submit;
mod tool;
pub mod tools;

pub use call::{
    AutoBackgroundFn, BackgroundFn, CallOptions, CallOutcome, CandidateInfo, ManagedStream,
    ManagedTool, ManagedToolConfig, TimeoutFn, DEFAULT_FOREGROUND_TIMEOUT,
};
pub use codec::{
    read_input_request, CodecError, InputRequest, MAX_ARGUMENTS_BYTES, MAX_REQUEST_DATA_BYTES,
    MAX_REQUEST_ID_BYTES, MAX_TOOL_CHECKPOINT_BYTES, PLAIN_EXECUTOR_KEY, RECOVERABLE_EXECUTOR_KEY,
};
pub use envelope::{
    CallResult, EnvelopeType, EnvelopeUpdate, InputCounts, ResponseEvent, ResultStatus,
};
pub use error::{
    ArgumentsError, EnvelopeError, ManagedError, RuleViolation, ToolFailure, ToolRegistryError,
    ToolRunError, UpdateError,
};
pub use interrupt::{Interrupt, InterruptStage, InterruptState, InterruptStateError};
pub use observe::UPDATE_DRAIN_TIMEOUT;
pub use progress::{
    ProgressReader, DEFAULT_PROGRESS_EVENTS, MAX_PROGRESS_BYTES, MAX_PROGRESS_EVENT_BYTES,
};
pub use registry::{DescribeFn, Registration, ToolRegistry};
pub use result::{RenderFn, ResultPart, ToolResult};
pub use submit::{ManagedTools, ToolCall};
pub use tool::{
    AdoptRequest, AdoptResult, BackgroundTool, ForegroundHandoffTool, InputPreparer,
    OutputMaterializer, PrepareRequest, Prepared, PreparerResume, RecoverRequest, RecoverableTool,
    ResumableTool, ResumeRequest, Run, RunInput, RunOutcome, StartRequest, StartResult, Update,
    UpdateStream, MAX_UPDATE_DATA_BYTES, MAX_UPDATE_EVENT_ID_BYTES, MAX_UPDATE_KIND_BYTES,
    MAX_UPDATE_METADATA_BYTES, MAX_UPDATE_METADATA_ENTRIES,
};

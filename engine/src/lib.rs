//! # dtask-engine
//!
//! The live side of dtask: the durable [`TaskStore`] (commands → `decide` → one atomic journal
//! append → the shared fold), with leases and fencing, progress updates deduplicated by event
//! id, and the notification outbox; and the runtime on top: the [`Manager`], [`Executor`]s,
//! the per-attempt [`AttemptContext`] and the polling [`Worker`].
//!
//! Every state change goes through the journal first; memory only ever holds what the fold of
//! the durable events says.

mod clock;
pub mod failpoints;
pub mod managed;
mod runtime;
mod store;

/// The tool component layer (tool descriptions, typed function tools, the tools node, the
/// agent loop, the HTTP POST tool), re-exported from `dtask-tool`.
pub use dtask_tool as tool;

/// The attribute that implements [`Executor`] (an `async_trait`), re-exported so users need no
/// extra dependency.
pub use async_trait::async_trait;
pub use clock::{Clock, ManualClock, SystemClock};
pub use runtime::{
    truncate_utf8, AttemptContext, Control, ControlSlot, ExecutionError, ExecutionResult, Executor,
    ExecutorRegistry, ExecutorRegistryError, IdGenerator, Manager, ManagerConfig, Progress,
    RuntimeError, SubmitRequest, TaskOutcome, ValidationError, Worker, WorkerConfig,
    DEFAULT_TIMEOUT_REASON, MAX_ERROR_BYTES,
};
pub use store::{
    Change, Command, CreateRequest, NotFound, Notification, NotificationRequest, Result,
    StoreConfig, StoreError, TaskPage, TaskStore, UpdatePage, UpdateRecord, UpdateRequest,
    RESERVED_KIND_PREFIXES,
};

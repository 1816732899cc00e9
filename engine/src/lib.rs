//! # dtask-engine
//!
//! The live side of dtask: the durable [`TaskStore`] (commands → `decide` → one atomic journal
//! append → the shared fold), with leases and fencing, progress updates deduplicated by event
//! id, and the notification outbox; and the runtime on top: the [`Manager`], [`Executor`]s,
//! the per-attempt [`AttemptContext`] and the polling [`Worker`]. On the runtime sit the
//! managed-tool layer ([`managed`]) and durable agents ([`agent`]).
//!
//! Every state change goes through the journal first; memory only ever holds what the fold of
//! the durable events says.

/// Defines an error that is a message for whoever reads it and, optionally, the error
/// underneath (kept for callers that walk [`std::error::Error::source`]), with `new`,
/// `with_source`, `message` and conversions from strings. The managed layer's `ToolFailure`
/// and the runtime's `ValidationError` are such errors.
macro_rules! message_error {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Debug, thiserror::Error)]
        #[error("{message}")]
        pub struct $name {
            message: String,
            #[source]
            source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
        }

        impl $name {
            /// An error with `message` and no source.
            pub fn new(message: impl Into<String>) -> Self {
                Self {
                    message: message.into(),
                    source: None,
                }
            }

            /// An error with `message`, caused by `source`.
            pub fn with_source(
                message: impl Into<String>,
                source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
            ) -> Self {
                Self {
                    message: message.into(),
                    source: Some(source.into()),
                }
            }

            /// The message.
            #[must_use]
            pub fn message(&self) -> &str {
                &self.message
            }
        }

        impl From<String> for $name {
            fn from(message: String) -> Self {
                Self::new(message)
            }
        }

        impl From<&str> for $name {
            fn from(message: &str) -> Self {
                Self::new(message)
            }
        }
    };
}

pub mod agent;
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
    application_notification_id, application_notification_source, progress_trimmable, trim_due,
    whole_updates, AdvanceCursor, Change, Command, CreateRequest, ExecutionContext, InputPage,
    InputRecord, InputRequest, NotFound, Notification, NotificationRequest, Result, RetentionStep,
    StoreConfig, StoreCounts, StoreError, TaskPage, TaskStore, TrimStep, UpdatePage, UpdateRecord,
    UpdateRequest, MAX_INPUT_KIND_BYTES, MAX_PURGE_TREE, RESERVED_KIND_PREFIXES,
};

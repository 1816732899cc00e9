//! The API's error body and the server's startup errors.
//!
//! Every failure an endpoint reports is an [`ApiError`]: an HTTP status and
//! `{"error": {"code": "...", "message": "..."}}`. A client's mistake (bad JSON, an unknown
//! field, an oversized body, an unknown task, a bad cursor) is a 4xx; only a failure of the
//! journal or the server itself is a 5xx.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use dtask_engine::{RuntimeError, StoreError};
use serde::Serialize;
use utoipa::ToSchema;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A non-loopback listen address without a token: the API would be open to the network.
    #[error(
        "refusing to listen on {0} without a token: a non-loopback address needs --token \
         (or DTASK_TOKEN); every request must then carry `Authorization: Bearer <token>`"
    )]
    TokenRequired(std::net::SocketAddr),
    /// The token is empty or too short.
    #[error("the token must be at least {min} characters long")]
    WeakToken {
        /// The minimum length.
        min: usize,
    },
    /// The journal could not be opened or read.
    #[error(transparent)]
    Journal(#[from] dtask_journal::Error),
    /// The task store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Binding or serving failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The error.
        source: std::io::Error,
    },
}

/// An error answered to a client: the HTTP status and the JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable machine-readable code (`not_found`, `invalid_json`, …).
    pub code: &'static str,
    /// For humans.
    pub message: String,
}

/// The body of every error response.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The code and message of an error response.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable machine-readable code: `bad_request`, `invalid_json`, `unsupported_media_type`,
    /// `payload_too_large`, `invalid_cursor`, `invalid_request`, `out_of_range`, `not_found`,
    /// `conflict`, `read_only`, `unauthorized`, `busy`, `too_many_subscribers`, `unavailable`,
    /// `disk_full`, `journal_error`, `internal`.
    pub code: String,
    /// What went wrong, for humans.
    pub message: String,
}

impl ApiError {
    /// An error with `status`, `code` and `message`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    /// 400 `bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 400 `invalid_cursor`.
    pub fn invalid_cursor(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_cursor", message)
    }

    /// 400 `out_of_range`.
    pub fn out_of_range(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "out_of_range", message)
    }

    /// 410 `purged`: the task's records were deleted by a purge.
    #[must_use]
    pub fn purged(id: &str, records: u64, at: dtask_journal::Timestamp) -> Self {
        Self::new(
            StatusCode::GONE,
            "purged",
            format!(
                "task {id:?} was purged at {} ms since the epoch ({records} records deleted)",
                at.as_millis()
            ),
        )
    }

    /// 404 `not_found` for a task.
    pub fn no_task(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no task {id:?} in the journal"),
        )
    }

    /// 403 `read_only`: a control endpoint on a follower.
    pub fn read_only() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "read_only",
            "this server follows a journal another process writes (--read-only): \
             control endpoints are not available",
        )
    }

    /// 500 `internal`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// The response body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: self.code.to_owned(),
                message: self.message.clone(),
            },
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

impl From<dtask_journal::Error> for ApiError {
    fn from(e: dtask_journal::Error) -> Self {
        match e {
            dtask_journal::Error::InvalidTaskId(id) => Self::bad_request(format!(
                "{id:?} is not a valid task id (empty, or holds a NUL byte)"
            )),
            e if e.is_no_space() => {
                Self::new(StatusCode::INSUFFICIENT_STORAGE, "disk_full", e.to_string())
            }
            e @ (dtask_journal::Error::NotPurgeable { .. }
            | dtask_journal::Error::NotTrimmable { .. }
            | dtask_journal::Error::Conflict { .. }) => {
                Self::new(StatusCode::CONFLICT, "conflict", e.to_string())
            }
            e @ dtask_journal::Error::TooLarge { .. } => Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                e.to_string(),
            ),
            e @ dtask_journal::Error::Stopped(_) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "journal_stopped",
                e.to_string(),
            ),
            e => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "journal_error",
                e.to_string(),
            ),
        }
    }
}

impl From<dtask_engine::agent::AgentError> for ApiError {
    fn from(e: dtask_engine::agent::AgentError) -> Self {
        use dtask_engine::agent::AgentError;
        let message = e.to_string();
        match e {
            AgentError::Store(e) | AgentError::Runtime(dtask_engine::RuntimeError::Store(e)) => {
                e.into()
            }
            AgentError::NotAnAgent { .. } => {
                Self::new(StatusCode::NOT_FOUND, "not_an_agent_run", message)
            }
            AgentError::NotInteractive(_) => {
                Self::new(StatusCode::CONFLICT, "not_interactive", message)
            }
            // The task's payload is not a run this build reads (a task submitted under the
            // agent's key with another payload, or a newer build's): the task's, not the
            // server's, fault.
            AgentError::EmptyConversation
            | AgentError::InvalidMaxSteps { .. }
            | AgentError::UnsupportedVersion(_)
            | AgentError::InvalidPayload(_)
            | AgentError::InvalidEntry { .. }
            | AgentError::Fold(_) => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_agent_run",
                message,
            ),
            _ => Self::new(StatusCode::INTERNAL_SERVER_ERROR, "agent_error", message),
        }
    }
}

impl From<dtask_replay::AuditError> for ApiError {
    fn from(e: dtask_replay::AuditError) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "journal_error",
            e.to_string(),
        )
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let message = e.to_string();
        match e {
            StoreError::Invalid { .. } | StoreError::InvalidExecutionResult(_) => {
                Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
            }
            StoreError::InvalidCursor(_) => Self::invalid_cursor(message),
            StoreError::NotFound(_) => Self::new(StatusCode::NOT_FOUND, "not_found", message),
            StoreError::Purged { .. } => Self::new(StatusCode::GONE, "purged", message),
            StoreError::AlreadyExists(_)
            | StoreError::VersionConflict { .. }
            | StoreError::LeaseLost(_)
            | StoreError::IllegalTransition { .. }
            | StoreError::AlreadyTerminal(_)
            | StoreError::NotDue { .. }
            | StoreError::EventIdConflict(_)
            | StoreError::NotificationUnavailable(_)
            | StoreError::NotificationEventIdConflict(_)
            | StoreError::MailboxSealed(_)
            | StoreError::OwnershipLost { .. }
            | StoreError::CursorConflict { .. }
            | StoreError::InputConflict(_)
            | StoreError::InputsPending(_)
            | StoreError::EventClosed(_)
            | StoreError::PartConflict { .. }
            | StoreError::UpdateLimit { .. } => {
                Self::new(StatusCode::CONFLICT, "conflict", message)
            }
            StoreError::Closed => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
            }
            StoreError::Journal(e) => e.into(),
            _ => Self::new(StatusCode::INTERNAL_SERVER_ERROR, "journal_error", message),
        }
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> Self {
        let message = e.to_string();
        match e {
            RuntimeError::Store(e) => e.into(),
            RuntimeError::ExecutorUnavailable(_)
            | RuntimeError::InvalidSpec(_)
            | RuntimeError::InvalidKind(_) => {
                Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
            }
            RuntimeError::Closed => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
            }
            RuntimeError::AlreadyExecuting(_) | RuntimeError::LeaseLost(_) => {
                Self::new(StatusCode::CONFLICT, "conflict", message)
            }
            _ => Self::internal(message),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        Self::bad_request(rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        Self::bad_request(rejection.body_text())
    }
}

impl From<tokio::task::JoinError> for ApiError {
    fn from(e: tokio::task::JoinError) -> Self {
        Self::internal(format!("a blocking read did not finish: {e}"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use dtask_journal::StorageError;

    /// A full disk is 507 `disk_full` and a stopped journal 503 `journal_stopped` however
    /// they reach the server (from the journal, or through the store or the runtime); any
    /// other storage failure stays a 500.
    #[test]
    fn a_full_disk_is_507_a_stopped_journal_503_and_other_storage_failures_500() {
        let full = || dtask_journal::Error::Storage(StorageError::no_space("No space left"));
        for error in [
            ApiError::from(full()),
            ApiError::from(StoreError::Journal(full())),
            ApiError::from(RuntimeError::Store(StoreError::Journal(full()))),
        ] {
            assert_eq!(
                (error.status, error.code),
                (StatusCode::INSUFFICIENT_STORAGE, "disk_full")
            );
            assert!(error.message.contains("No space left"), "{}", error.message);
        }
        let stopped = || dtask_journal::Error::Stopped("a sync failed: EIO".into());
        for error in [
            ApiError::from(stopped()),
            ApiError::from(StoreError::Journal(stopped())),
            ApiError::from(RuntimeError::Store(StoreError::Journal(stopped()))),
        ] {
            assert_eq!(
                (error.status, error.code),
                (StatusCode::SERVICE_UNAVAILABLE, "journal_stopped")
            );
        }
        let other = ApiError::from(dtask_journal::Error::storage("I/O error"));
        assert_eq!(
            (other.status, other.code),
            (StatusCode::INTERNAL_SERVER_ERROR, "journal_error")
        );
    }
}

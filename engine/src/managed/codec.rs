//! The managed-tool layer's persisted formats: the task payload and the managed checkpoint
//! (the started marker), and [`read_input_request`], which reads what a waiting task asks.
//! Both formats are versioned JSON; the core store treats them as opaque bytes.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use dtask_replay::{Status, TaskState};
use serde::{Deserialize, Serialize};

/// The executor key of plain background tools (lease policy fail, no drain).
pub const PLAIN_EXECUTOR_KEY: &str = "dtask.dev/background-tool";
/// The executor key of recoverable background tools (lease policy retry, drain by yield).
pub const RECOVERABLE_EXECUTOR_KEY: &str = "dtask.dev/recoverable-background-tool";
/// Whether a rerun of a task of `executor_key` carries the original's creation checkpoint:
/// not for the managed tools' keys, whose tasks are created with one only by a hand-off (the
/// started marker of the run the foreground began: a rerun starts the tool afresh). The one
/// rule behind [`crate::Executor::rerun_keeps_checkpoint`] of the managed executors and a
/// server that reruns without a manager.
#[must_use]
pub fn rerun_keeps_checkpoint(executor_key: &str) -> bool {
    executor_key != PLAIN_EXECUTOR_KEY && executor_key != RECOVERABLE_EXECUTOR_KEY
}

/// The task kind of managed-tool tasks.
pub const TASK_KIND: &str = "background_tool";
/// The largest arguments (and prepared arguments): 1 MiB.
pub const MAX_ARGUMENTS_BYTES: usize = 1 << 20;
/// The largest tool checkpoint: 256 KiB.
pub const MAX_TOOL_CHECKPOINT_BYTES: usize = 256 << 10;
/// The longest input-request id: 256 bytes.
pub const MAX_REQUEST_ID_BYTES: usize = 256;
/// The largest input-request data: 256 KiB.
pub const MAX_REQUEST_DATA_BYTES: usize = 256 << 10;

/// Why a payload or checkpoint does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The payload's version is not 1.
    #[error("unsupported executor payload version {0}")]
    UnsupportedPayloadVersion(u32),
    /// The payload is malformed or misses a required field.
    #[error("invalid managed-tool payload: {0}")]
    InvalidPayload(String),
    /// The checkpoint is not a managed-tool checkpoint of version 1 within bounds.
    #[error("incompatible managed-tool checkpoint: {0}")]
    IncompatibleCheckpoint(String),
    /// An input request's id is empty or longer than [`MAX_REQUEST_ID_BYTES`].
    #[error("input request id must be 1 to 256 bytes")]
    RequestIdLength {
        /// The id's length.
        len: usize,
    },
    /// An input request's data is larger than [`MAX_REQUEST_DATA_BYTES`] as JSON.
    #[error("input request data exceeds 256 KiB")]
    RequestDataTooLarge {
        /// The data's length as JSON.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// The task is not a recoverable managed-tool task waiting for input.
    #[error("no input request: task {task_id:?} is {status} under {executor_key:?}")]
    NotWaitingForInput {
        /// The task.
        task_id: String,
        /// Its status.
        status: Status,
        /// Its executor key.
        executor_key: String,
    },
    /// The waiting task's checkpoint carries no input request.
    #[error("no input request: the checkpoint has no request")]
    NoInputRequest,
}

/// The private payload of a managed-tool task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolPayload {
    /// Always 1.
    pub version: u32,
    /// The registered tool's name.
    pub tool_name: String,
    /// The model's tool-call id, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The JSON arguments of the call.
    pub arguments: String,
}

impl ToolPayload {
    /// A version-1 payload.
    #[must_use]
    pub fn new(tool_name: &str, tool_call_id: Option<&str>, arguments: &str) -> Self {
        Self {
            version: 1,
            tool_name: tool_name.to_owned(),
            tool_call_id: tool_call_id.map(str::to_owned),
            arguments: arguments.to_owned(),
        }
    }

    /// The payload's bytes.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes and checks a payload.
    ///
    /// # Errors
    /// [`CodecError::UnsupportedPayloadVersion`] or [`CodecError::InvalidPayload`].
    pub fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        #[derive(Deserialize)]
        struct Version {
            version: u32,
        }
        let v: Version =
            serde_json::from_slice(bytes).map_err(|e| CodecError::InvalidPayload(e.to_string()))?;
        if v.version != 1 {
            return Err(CodecError::UnsupportedPayloadVersion(v.version));
        }
        let payload: Self =
            serde_json::from_slice(bytes).map_err(|e| CodecError::InvalidPayload(e.to_string()))?;
        if payload.tool_name.is_empty() {
            return Err(CodecError::InvalidPayload("tool name is required".into()));
        }
        if payload.arguments.is_empty() {
            return Err(CodecError::InvalidPayload("arguments are required".into()));
        }
        if payload.arguments.len() > MAX_ARGUMENTS_BYTES {
            return Err(CodecError::InvalidPayload(
                "arguments exceed configured bounds".into(),
            ));
        }
        Ok(payload)
    }
}

/// What a waiting task asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputRequest {
    /// The request id (non-empty, at most 256 bytes).
    pub id: String,
    /// What is asked, as JSON (at most 256 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

impl InputRequest {
    /// Checks the request's bounds.
    ///
    /// # Errors
    /// [`CodecError::RequestIdLength`] or [`CodecError::RequestDataTooLarge`].
    pub fn validate(&self) -> Result<(), CodecError> {
        if self.id.is_empty() || self.id.len() > MAX_REQUEST_ID_BYTES {
            return Err(CodecError::RequestIdLength { len: self.id.len() });
        }
        let data_len = self
            .data
            .as_ref()
            .map_or(0, |d| serde_json::to_vec(d).map_or(usize::MAX, |v| v.len()));
        if data_len > MAX_REQUEST_DATA_BYTES {
            return Err(CodecError::RequestDataTooLarge {
                len: data_len,
                max: MAX_REQUEST_DATA_BYTES,
            });
        }
        Ok(())
    }
}

/// The managed checkpoint: the started marker with the tool's checkpoint and, while waiting,
/// the input request. Its presence in a task is the store-level "started" marker.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ManagedCheckpoint {
    /// Whether the tool's external operation was started (always true when encoded).
    pub started: bool,
    /// The tool's own checkpoint (at most 256 KiB).
    pub tool_checkpoint: Vec<u8>,
    /// The pending input request, while waiting for input.
    pub request: Option<InputRequest>,
}

#[derive(Serialize, Deserialize)]
struct Wire {
    version: u32,
    started: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    tool_checkpoint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    request: Option<InputRequest>,
}

impl ManagedCheckpoint {
    /// A started marker carrying `tool_checkpoint`.
    #[must_use]
    pub fn started(tool_checkpoint: Vec<u8>) -> Self {
        Self {
            started: true,
            tool_checkpoint,
            request: None,
        }
    }

    /// The checkpoint of a run that waits for input: the request, and the tool checkpoint the
    /// outcome supplied (`replacement`) or, when it supplied none, the `current` one.
    #[must_use]
    pub fn waiting(request: InputRequest, replacement: Vec<u8>, current: Vec<u8>) -> Self {
        Self {
            started: true,
            tool_checkpoint: if replacement.is_empty() {
                current
            } else {
                replacement
            },
            request: Some(request),
        }
    }

    /// Encodes the checkpoint (always with `started: true`).
    ///
    /// # Errors
    /// [`CodecError::IncompatibleCheckpoint`] when a bound is exceeded.
    pub fn encode(&self) -> Result<Vec<u8>, CodecError> {
        self.check()?;
        let wire = Wire {
            version: 1,
            started: true,
            tool_checkpoint: STANDARD.encode(&self.tool_checkpoint),
            request: self.request.clone(),
        };
        serde_json::to_vec(&wire).map_err(|e| CodecError::IncompatibleCheckpoint(e.to_string()))
    }

    /// Decodes a task checkpoint; an empty one means "never started".
    ///
    /// # Errors
    /// [`CodecError::IncompatibleCheckpoint`] for bad JSON, another version, a bound exceeded,
    /// or `started: false` without a request.
    pub fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        if bytes.is_empty() {
            return Ok(Self::default());
        }
        let bad = |e: &dyn std::fmt::Display| CodecError::IncompatibleCheckpoint(e.to_string());
        let wire: Wire = serde_json::from_slice(bytes).map_err(|e| bad(&e))?;
        if wire.version != 1 {
            return Err(bad(&format!("version {}", wire.version)));
        }
        if !wire.started && wire.request.is_none() {
            return Err(bad(&"not started and no request"));
        }
        let checkpoint = Self {
            started: wire.started,
            tool_checkpoint: STANDARD
                .decode(wire.tool_checkpoint.as_bytes())
                .map_err(|e| bad(&e))?,
            request: wire.request,
        };
        checkpoint.check()?;
        Ok(checkpoint)
    }

    fn check(&self) -> Result<(), CodecError> {
        if self.tool_checkpoint.len() > MAX_TOOL_CHECKPOINT_BYTES {
            return Err(CodecError::IncompatibleCheckpoint(
                "tool checkpoint exceeds 256 KiB".into(),
            ));
        }
        if let Some(request) = &self.request {
            request
                .validate()
                .map_err(|e| CodecError::IncompatibleCheckpoint(e.to_string()))?;
        }
        Ok(())
    }
}

/// What a waiting managed-tool task asks for (an owned copy).
///
/// # Errors
/// [`CodecError::NotWaitingForInput`] unless the task is a recoverable managed-tool task
/// waiting for input, [`CodecError::NoInputRequest`] when its checkpoint has no request, and
/// the checkpoint's decoding errors.
pub fn read_input_request(task: &TaskState) -> Result<InputRequest, CodecError> {
    if task.status != Status::WaitingInput
        || task.spec.executor_key != RECOVERABLE_EXECUTOR_KEY
        || task.spec.kind != TASK_KIND
    {
        return Err(CodecError::NotWaitingForInput {
            task_id: task.spec.id.clone(),
            status: task.status,
            executor_key: task.spec.executor_key.clone(),
        });
    }
    ManagedCheckpoint::decode(&task.checkpoint)?
        .request
        .ok_or(CodecError::NoInputRequest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_round_trip_and_version() {
        let p = ToolPayload::new("shell", Some("call_1"), r#"{"cmd":"ls"}"#);
        assert_eq!(ToolPayload::decode(&p.encode()), Ok(p));
        assert_eq!(
            ToolPayload::decode(br#"{"version":2,"tool_name":"x","arguments":"{}"}"#),
            Err(CodecError::UnsupportedPayloadVersion(2))
        );
        assert!(ToolPayload::decode(br#"{"version":1,"tool_name":"","arguments":"{}"}"#).is_err());
    }

    #[test]
    fn checkpoint_round_trip_and_rejections() {
        let c = ManagedCheckpoint {
            started: true,
            tool_checkpoint: vec![0, 255, 7],
            request: Some(InputRequest {
                id: "approval".into(),
                data: Some(serde_json::json!({"question": "approve?"})),
            }),
        };
        let bytes = c.encode().unwrap();
        assert_eq!(ManagedCheckpoint::decode(&bytes).unwrap(), c);
        assert_eq!(
            ManagedCheckpoint::decode(b"").unwrap(),
            ManagedCheckpoint::default()
        );
        assert!(ManagedCheckpoint::decode(br#"{"version":2,"started":true}"#).is_err());
        assert!(ManagedCheckpoint::decode(br#"{"version":1,"started":false}"#).is_err());
        let big = ManagedCheckpoint::started(vec![0; MAX_TOOL_CHECKPOINT_BYTES + 1]);
        assert!(big.encode().is_err());
    }
}

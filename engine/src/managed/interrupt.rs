//! A model call that waits for an answer: the [`Interrupt`] a call ends with, and the
//! serializable [`InterruptState`] that [`ManagedTool::resume`](super::ManagedTool::resume)
//! takes back.

use super::codec::InputRequest;
use serde::{Deserialize, Serialize};

/// A call waiting for an answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interrupt {
    /// What is asked (the input request's data, or the input preparer's info).
    pub info: serde_json::Value,
    /// What to resume with (serializable: keep it wherever the conversation is kept).
    pub state: InterruptState,
}

/// The state of an interrupted call. Treat it as opaque; [`InterruptState::encode`] and
/// [`InterruptState::decode`] carry it as JSON text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterruptState {
    /// The tool that was called.
    pub tool_name: String,
    /// Where the call stopped.
    pub stage: InterruptStage,
}

/// Where an interrupted call stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "stage", rename_all = "snake_case")]
#[non_exhaustive]
pub enum InterruptStage {
    /// The input preparer asked before anything was created.
    Prepare {
        /// The model's arguments.
        arguments: String,
        /// The preparer's state (base64 in JSON).
        #[serde(with = "base64_bytes")]
        state: Vec<u8>,
    },
    /// The foreground run (attempt 0) waits for input.
    Foreground {
        /// The id the call was given (not persisted).
        task_id: String,
        /// The call's final arguments.
        arguments: String,
        /// The question.
        request: InputRequest,
        /// The tool checkpoint to resume from (base64 in JSON).
        #[serde(with = "base64_bytes")]
        tool_checkpoint: Vec<u8>,
        /// The reserved output path, if any.
        output_file: String,
    },
}

/// Why an interrupt state cannot be resumed by a tool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InterruptStateError {
    /// The text is not an interrupt state (the JSON parser's message).
    #[error("invalid foreground interrupt state: {0}")]
    Malformed(String),
    /// The state was produced by another tool.
    #[error("invalid foreground interrupt state: the state belongs to tool {tool:?}")]
    OtherTool {
        /// The tool the state names.
        tool: String,
    },
    /// A foreground state misses its task id, arguments or request id.
    #[error("invalid foreground interrupt state: task id, arguments and request id are required")]
    Incomplete,
    /// A foreground state was given to a tool that cannot resume.
    #[error("invalid foreground interrupt state: the tool is not resumable")]
    NotResumable,
}

mod base64_bytes {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

impl InterruptState {
    /// The state as JSON text.
    #[must_use]
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A state from JSON text.
    ///
    /// # Errors
    /// [`InterruptStateError::Malformed`] when the text is not a state.
    pub fn decode(text: &str) -> Result<Self, InterruptStateError> {
        serde_json::from_str(text).map_err(|e| InterruptStateError::Malformed(e.to_string()))
    }
}

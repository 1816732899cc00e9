//! The error type of the tool layer.

use std::time::Duration;

use crate::message::{Message, ToolMessage};

/// A boxed, thread-safe error: what tool functions, decoders, encoders and
/// chat models may fail with (`String`, `&str`, any [`std::error::Error`]
/// and `anyhow::Error` all convert into it with `?` or `.into()`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in the tool layer: decoding a tool's
/// arguments, running a tool, dispatching tool calls in a
/// [`ToolsNode`](crate::ToolsNode) and running the agent loop.
///
/// Every variant that concerns one tool carries its name, so a failure can be
/// reported back to the model or to a person without extra context.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The arguments of a call were not valid JSON, or did not match the
    /// tool's parameter type.
    #[error("invalid arguments for tool `{tool}` at `{path}`: {message}")]
    InvalidArguments {
        /// The tool that was called.
        tool: String,
        /// Where in the arguments the problem is, as a serde path
        /// (`.` for the root, `items[2].name` for a nested field).
        path: String,
        /// What is wrong there.
        message: String,
    },
    /// A call named a tool that is not registered (and no unknown-tool
    /// handler was configured).
    #[error("unknown tool `{name}`")]
    UnknownTool {
        /// The name the model asked for.
        name: String,
    },
    /// Two tools with the same name were registered in one
    /// [`ToolsNode`](crate::ToolsNode).
    #[error("tool `{name}` is registered more than once")]
    DuplicateTool {
        /// The duplicated name.
        name: String,
    },
    /// The tool panicked while running; the panic was caught and did not take
    /// the node down.
    #[error("tool `{tool}` panicked: {message}")]
    Panicked {
        /// The tool that panicked.
        tool: String,
        /// The panic payload, if it was a string.
        message: String,
    },
    /// An HTTP tool got a response with a non-success status.
    #[error("tool `{tool}` got HTTP status {status}: {body_excerpt}")]
    Http {
        /// The tool that made the request.
        tool: String,
        /// The HTTP status code.
        status: u16,
        /// The beginning of the response body (at most
        /// [`BODY_EXCERPT_CHARS`](crate::BODY_EXCERPT_CHARS) characters).
        body_excerpt: String,
    },
    /// The call did not finish within its time limit.
    #[error("tool `{tool}` timed out after {timeout:?}")]
    Timeout {
        /// The tool that timed out.
        tool: String,
        /// The limit that was exceeded.
        timeout: Duration,
    },
    /// The tool's output could not be encoded into the string handed back to
    /// the model.
    #[error("could not encode the output of tool `{tool}`: {source}")]
    Output {
        /// The tool whose output failed to encode.
        tool: String,
        /// The encoder's error.
        #[source]
        source: BoxError,
    },
    /// The tool ran and reported a failure of its own.
    #[error("tool `{tool}` failed: {source}")]
    Failed {
        /// The tool that failed.
        tool: String,
        /// The tool's error.
        #[source]
        source: BoxError,
    },
    /// A tool could not be built from its configuration.
    #[error("invalid configuration for tool `{tool}`: {message}")]
    Config {
        /// The tool being configured.
        tool: String,
        /// What is wrong.
        message: String,
    },
    /// The tool needs an answer before it can go on (a stateful interrupt):
    /// nothing was lost. Answer it through the tool's own resume API with
    /// `state` (for managed tools, `ManagedTool::resume`). What a tool returns;
    /// a [`ToolsNode`](crate::ToolsNode) gathers its calls' interrupts into
    /// [`ToolError::CallsInterrupted`].
    #[error("tool `{tool}` is waiting for input: {info}")]
    Interrupted {
        /// The tool that asks.
        tool: String,
        /// What it asks (JSON).
        info: serde_json::Value,
        /// The opaque interrupt state (JSON text) to resume with.
        state: String,
    },
    /// Calls of one turn wait for input (each ended with
    /// [`ToolError::Interrupted`]): what a [`ToolsNode`](crate::ToolsNode) returns then,
    /// under either error policy, and [`Agent::run`](crate::Agent::run) after it. Nothing
    /// was lost: the calls that ended are here, and a resumed run need not run them again.
    #[error("{} tool call(s) waiting for input: {}", .interrupts.len(), describe(.interrupts))]
    CallsInterrupted {
        /// The calls waiting for input, in call order (at least one). Answer each through
        /// its tool's resume API with its `state`.
        interrupts: Vec<InterruptedCall>,
        /// The tool messages of the turn's calls that ended, in call order (under
        /// [`ErrorPolicy::ReturnToModel`](crate::ErrorPolicy::ReturnToModel), failed calls'
        /// `Error: …` messages too). A call in neither list was not run: sequential
        /// execution stops at the first call waiting for input.
        finished: Vec<ToolMessage>,
        /// From [`Agent::run`](crate::Agent::run): the conversation so far, ending with the
        /// assistant message that asked for these calls and then the `finished` tool
        /// messages. With a tool message appended for each of the other calls, it can be
        /// passed to `run` again to continue. Empty from a tools node, which does not see
        /// the conversation.
        transcript: Vec<Message>,
    },
    /// The chat model failed to produce a reply.
    #[error("chat model failed: {source}")]
    Model {
        /// The model's error.
        #[source]
        source: BoxError,
    },
    /// The agent loop used up its step budget while the model still asked
    /// for tool calls.
    #[error("agent stopped after reaching its limit of {limit} steps")]
    StepLimit {
        /// The configured step limit.
        limit: usize,
        /// The conversation so far, ending with the tool messages of the last
        /// step; it can be passed to [`Agent::run`](crate::Agent::run) again
        /// to continue.
        transcript: Vec<Message>,
    },
}

impl ToolError {
    /// A [`ToolError::Failed`] for `tool` from any error-like value.
    pub fn failed(tool: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Failed {
            tool: tool.into(),
            source: source.into(),
        }
    }

    /// A [`ToolError::InvalidArguments`] for `tool`.
    pub fn invalid_arguments(
        tool: impl Into<String>,
        path: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self::InvalidArguments {
            tool: tool.into(),
            path: path.into(),
            message: message.into(),
        }
    }

    /// A [`ToolError::Model`] from any error-like value.
    pub fn model(source: impl Into<BoxError>) -> Self {
        Self::Model {
            source: source.into(),
        }
    }

    /// The name of the tool this error concerns, if it concerns one.
    pub fn tool_name(&self) -> Option<&str> {
        match self {
            Self::InvalidArguments { tool, .. }
            | Self::Panicked { tool, .. }
            | Self::Http { tool, .. }
            | Self::Timeout { tool, .. }
            | Self::Output { tool, .. }
            | Self::Failed { tool, .. }
            | Self::Interrupted { tool, .. }
            | Self::Config { tool, .. } => Some(tool),
            Self::UnknownTool { name } | Self::DuplicateTool { name } => Some(name),
            Self::Model { .. } | Self::StepLimit { .. } | Self::CallsInterrupted { .. } => None,
        }
    }
}

/// One call of a turn that waits for input: the [`ToolError::Interrupted`] it ended with,
/// and the call's id.
#[derive(Debug, Clone, PartialEq)]
pub struct InterruptedCall {
    /// The id of the [`ToolCall`](crate::ToolCall), for the tool message that will answer
    /// it.
    pub call_id: String,
    /// The tool that asks.
    pub tool: String,
    /// What it asks (JSON).
    pub info: serde_json::Value,
    /// The opaque interrupt state (JSON text) to resume with.
    pub state: String,
}

/// The interrupted calls, for an error's message: "`tool` (call id): info", comma-separated.
fn describe(interrupts: &[InterruptedCall]) -> String {
    interrupts
        .iter()
        .map(|i| format!("`{}` (call {}): {}", i.tool, i.call_id, i.info))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Turns a caught panic payload into a message.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_messages_are_extracted() {
        assert_eq!(panic_message(&"static"), "static");
        assert_eq!(panic_message(&String::from("owned")), "owned");
        assert_eq!(panic_message(&42_u32), "non-string panic payload");
    }

    #[test]
    fn tool_name_names_the_tool() {
        assert_eq!(ToolError::failed("a", "x").tool_name(), Some("a"));
        assert_eq!(
            ToolError::UnknownTool { name: "b".into() }.tool_name(),
            Some("b")
        );
        assert_eq!(ToolError::model("down").tool_name(), None);
        assert_eq!(
            ToolError::invalid_arguments("c", "x.y", "bad").to_string(),
            "invalid arguments for tool `c` at `x.y`: bad"
        );
    }

    #[test]
    fn errors_are_thread_safe() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<ToolError>();
    }
}

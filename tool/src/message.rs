//! Chat messages shaped like OpenAI chat completions messages.
//!
//! The types serialize to and from the OpenAI wire format: messages are
//! tagged by `role`, an assistant message carries
//! `tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}]`
//! (with `arguments` a JSON document *in a string*), and a tool message
//! answers one call through its `tool_call_id`. Fields this layer does not
//! use (`refusal`, `annotations`, `name`, ...) are ignored when reading.
//! Message content is plain text; OpenAI's array-of-parts content is not
//! supported.

use serde::{Deserialize, Serialize};

/// One message of a chat conversation.
///
/// ```
/// use dtask_tool::{Message, ToolCall};
/// use serde_json::json;
///
/// let msg: Message = serde_json::from_value(json!({
///     "role": "assistant",
///     "content": null,
///     "tool_calls": [{
///         "id": "call_1",
///         "type": "function",
///         "function": { "name": "add", "arguments": "{\"a\":1,\"b\":2}" }
///     }]
/// })).unwrap();
/// let Message::Assistant(assistant) = &msg else { panic!("not an assistant message") };
/// assert_eq!(assistant.tool_calls, vec![ToolCall::function("call_1", "add", r#"{"a":1,"b":2}"#)]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    /// Instructions for the model (`"role": "system"`).
    System {
        /// The text of the message.
        content: String,
    },
    /// A message from the user (`"role": "user"`).
    User {
        /// The text of the message.
        content: String,
    },
    /// A reply of the model, possibly asking for tool calls
    /// (`"role": "assistant"`).
    Assistant(AssistantMessage),
    /// The result of one tool call (`"role": "tool"`).
    Tool(ToolMessage),
}

impl Message {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::System {
            content: content.into(),
        }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::User {
            content: content.into(),
        }
    }

    /// An assistant message with text and no tool calls.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::Assistant(AssistantMessage::text(content))
    }

    /// A tool message answering the call with id `tool_call_id`.
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self::Tool(ToolMessage::new(tool_call_id, content))
    }

    /// The message's text, if it has any.
    pub fn content(&self) -> Option<&str> {
        match self {
            Self::System { content } | Self::User { content } => Some(content),
            Self::Assistant(m) => m.content.as_deref(),
            Self::Tool(m) => Some(&m.content),
        }
    }

    /// The role as it appears on the wire (`"system"`, `"user"`,
    /// `"assistant"`, `"tool"`).
    pub fn role(&self) -> &'static str {
        match self {
            Self::System { .. } => "system",
            Self::User { .. } => "user",
            Self::Assistant(_) => "assistant",
            Self::Tool(_) => "tool",
        }
    }
}

impl From<AssistantMessage> for Message {
    fn from(m: AssistantMessage) -> Self {
        Self::Assistant(m)
    }
}

impl From<ToolMessage> for Message {
    fn from(m: ToolMessage) -> Self {
        Self::Tool(m)
    }
}

/// A reply of the model: text, tool calls, or both.
///
/// `content` is `null` on the wire when absent (as OpenAI sends it next to
/// tool calls); `tool_calls` is omitted when empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// The text of the reply, if any.
    #[serde(default)]
    pub content: Option<String>,
    /// The tools the model wants called, in order (`null` reads as none).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub tool_calls: Vec<ToolCall>,
}

impl AssistantMessage {
    /// A reply with text only.
    pub fn text(content: impl Into<String>) -> Self {
        Self {
            content: Some(content.into()),
            tool_calls: Vec::new(),
        }
    }

    /// A reply with tool calls only (`content` is `null`).
    pub fn with_tool_calls(tool_calls: Vec<ToolCall>) -> Self {
        Self {
            content: None,
            tool_calls,
        }
    }

    /// Whether the model asked for any tool call.
    pub fn has_tool_calls(&self) -> bool {
        !self.tool_calls.is_empty()
    }
}

/// One tool call requested by the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, echoed by the answering [`ToolMessage`].
    pub id: String,
    /// The kind of call (`"type"` on the wire); always `"function"`.
    #[serde(rename = "type", default)]
    pub kind: ToolCallKind,
    /// Which function to call, and with what.
    pub function: FunctionCall,
}

impl ToolCall {
    /// A function call with id `id` of tool `name` with JSON `arguments`.
    pub fn function(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            kind: ToolCallKind::Function,
            function: FunctionCall {
                name: name.into(),
                arguments: arguments.into(),
            },
        }
    }
}

/// The `type` of a [`ToolCall`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ToolCallKind {
    /// A function call (`"function"`).
    #[default]
    Function,
}

/// The function part of a [`ToolCall`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The name of the tool.
    pub name: String,
    /// The arguments, as a JSON document in a string (as OpenAI sends them).
    pub arguments: String,
}

/// The result of one tool call, handed back to the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolMessage {
    /// The id of the [`ToolCall`] this answers.
    pub tool_call_id: String,
    /// The tool's output (or error text).
    pub content: String,
}

impl ToolMessage {
    /// A tool message answering the call with id `tool_call_id`.
    pub fn new(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            tool_call_id: tool_call_id.into(),
            content: content.into(),
        }
    }
}

/// Reads `null` as the type's default (serde's `default` covers only a missing field): servers
/// send `"tool_calls": null` where others leave the field out.
pub(crate) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

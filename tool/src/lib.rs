//! The tool component layer of dtask: how an LLM agent's tools describe
//! themselves, are called, and are driven in a loop.
//!
//! * A [`Tool`] tells the model its [`ToolInfo`] (name, description and a
//!   JSON Schema of its parameters) and runs with JSON arguments, answering
//!   with text. [`StreamingTool`] answers with a stream of chunks.
//! * [`FunctionTool`] turns a typed async function into a tool, with an
//!   explicit schema ([`FunctionTool::new`]) or one inferred from the input
//!   type with `schemars` ([`FunctionTool::infer`]).
//! * [`Message`] and friends are chat messages in the OpenAI wire format
//!   (assistant `tool_calls`, tool messages with `tool_call_id`).
//! * [`ToolsNode`] runs the tool calls of an assistant message, concurrently
//!   or sequentially, isolating panics and applying an [`ErrorPolicy`].
//! * [`ChatModel`] and [`Agent`] loop model → tools → model up to a step
//!   limit; [`ScriptedModel`] replays fixed replies for tests.
//! * [`HttpPostTool`] POSTs to a URL with configured headers and timeout.
//! * [`OpenAiChatModel`] is a [`ChatModel`] over any OpenAI-compatible chat completions
//!   endpoint (OpenAI, vLLM, llama.cpp's server, Ollama): tools, streaming, retries.
//!
//! All failures are [`ToolError`].
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//!
//! use dtask_tool::{
//!     Agent, AssistantMessage, FunctionTool, Message, ScriptedModel, ToolCall, ToolError,
//!     ToolsNode,
//! };
//! use schemars::JsonSchema;
//! use serde::Deserialize;
//!
//! #[derive(Deserialize, JsonSchema)]
//! struct Add {
//!     /// The first addend.
//!     a: i64,
//!     /// The second addend.
//!     b: i64,
//! }
//!
//! # fn main() -> Result<(), ToolError> {
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let add = FunctionTool::infer("add", "Add two integers", |args: Add| async move {
//!     Ok::<_, std::convert::Infallible>(args.a + args.b)
//! });
//! let tools = ToolsNode::builder().tool(add).build()?;
//!
//! // A model that first asks for a tool call, then answers.
//! let model = ScriptedModel::new([
//!     AssistantMessage::with_tool_calls(vec![ToolCall::function("call_1", "add", r#"{"a":2,"b":3}"#)]),
//!     AssistantMessage::text("2 + 3 = 5"),
//! ]);
//!
//! let agent = Agent::new(Arc::new(model), tools).with_max_steps(4);
//! let run = agent.run(vec![Message::user("What is 2 + 3?")]).await?;
//!
//! assert_eq!(run.messages[2], Message::tool("call_1", "5"));
//! assert_eq!(run.answer.content.as_deref(), Some("2 + 3 = 5"));
//! # Ok(())
//! # })
//! # }
//! ```
//!
//! The guide is `docs/tools.md` in the repository.

mod agent;
mod arguments;
mod error;
mod function;
mod http;
mod info;
mod message;
mod model;
mod node;
mod openai;
mod tool;

pub use agent::{Agent, AgentRun, DEFAULT_MAX_STEPS};
pub use arguments::{decode_arguments, effective_arguments};
pub use error::{BoxError, InterruptedCall, ToolError};
pub use function::{ArgumentDecoder, FunctionTool, OutputEncoder, StreamingFunctionTool};
pub use http::{HttpPostConfig, HttpPostTool, PostRequest, BODY_EXCERPT_CHARS, MAX_REDIRECTS};
pub use info::{parameters_schema, ToolInfo};
pub use message::{AssistantMessage, FunctionCall, Message, ToolCall, ToolCallKind, ToolMessage};
pub use model::{ChatModel, ModelReply, ModelRequest, ScriptedModel, Usage};
pub use node::{ErrorPolicy, Execution, ToolsNode, ToolsNodeBuilder, UnknownToolHandler};
pub use openai::{
    ModelError, OpenAiChatModel, OpenAiConfig, ToolChoice, DEFAULT_BASE_URL,
    MAX_STREAMED_TOOL_CALLS,
};
pub use tool::{CollectedStream, StreamingTool, Tool, ToolOutputStream};

/// The guide in `docs/tools.md`, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/tools.md")]
struct ToolsGuide;

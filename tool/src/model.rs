//! The [`ChatModel`] trait and the [`ScriptedModel`] used in tests and
//! examples.

use std::{
    collections::VecDeque,
    sync::{Mutex, MutexGuard, PoisonError},
};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{
    error::ToolError,
    info::ToolInfo,
    message::{AssistantMessage, Message},
};

/// A chat model that can call tools: given the conversation and the
/// available tools, it answers with an assistant message, which may ask for
/// tool calls.
///
/// The trait is object safe (`Arc<dyn ChatModel>`). [`crate::OpenAiChatModel`] speaks to
/// any OpenAI-compatible endpoint; [`ScriptedModel`] replays fixed replies.
#[async_trait]
pub trait ChatModel: Send + Sync {
    /// Produces the next assistant message for `messages`, with `tools`
    /// available to call.
    ///
    /// # Errors
    ///
    /// [`ToolError::Model`] when the model cannot answer.
    async fn generate(
        &self,
        messages: &[Message],
        tools: &[ToolInfo],
    ) -> Result<AssistantMessage, ToolError>;

    /// Like [`ChatModel::generate`], with the token usage the model reported. The default
    /// calls `generate` and reports no usage; models that know their usage override it.
    ///
    /// # Errors
    ///
    /// As for [`ChatModel::generate`].
    async fn reply(
        &self,
        messages: &[Message],
        tools: &[ToolInfo],
    ) -> Result<ModelReply, ToolError> {
        Ok(ModelReply {
            message: self.generate(messages, tools).await?,
            usage: None,
            finish_reason: None,
        })
    }
}

/// A model's answer and, when the model reported them, what it cost in tokens and why it
/// ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelReply {
    /// The assistant message.
    pub message: AssistantMessage,
    /// The token usage, if reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Why the model stopped, as the server said it (OpenAI's `finish_reason`: `"stop"`,
    /// `"tool_calls"`, `"length"` for an answer cut at the token limit, ...), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

/// Token counts a model reported for one answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the prompt.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Tokens of the answer.
    #[serde(default)]
    pub completion_tokens: u64,
    /// Both.
    #[serde(default)]
    pub total_tokens: u64,
}

impl Usage {
    /// The sum of two usages (saturating: a server's counts are not trusted to fit).
    #[must_use]
    pub fn plus(self, other: Self) -> Self {
        Self {
            prompt_tokens: self.prompt_tokens.saturating_add(other.prompt_tokens),
            completion_tokens: self
                .completion_tokens
                .saturating_add(other.completion_tokens),
            total_tokens: self.total_tokens.saturating_add(other.total_tokens),
        }
    }
}

/// What a [`ScriptedModel`] was asked, recorded for assertions.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    /// The conversation it was given.
    pub messages: Vec<Message>,
    /// The names of the tools it was offered.
    pub tool_names: Vec<String>,
}

/// A [`ChatModel`] that replays a fixed list of assistant messages, one per
/// call, and records every request. Once the script is used up, `generate`
/// fails with [`ToolError::Model`].
///
/// ```
/// use dtask_tool::{AssistantMessage, ChatModel, Message, ScriptedModel};
///
/// let model = ScriptedModel::new([AssistantMessage::text("hi")]);
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let reply = model.generate(&[Message::user("hello")], &[]).await.unwrap();
/// assert_eq!(reply.content.as_deref(), Some("hi"));
/// assert!(model.generate(&[], &[]).await.is_err());
/// # });
/// assert_eq!(model.requests().len(), 2);
/// ```
#[derive(Debug, Default)]
pub struct ScriptedModel {
    replies: Mutex<VecDeque<AssistantMessage>>,
    requests: Mutex<Vec<ModelRequest>>,
}

impl ScriptedModel {
    /// A model that answers with `replies`, in order.
    pub fn new(replies: impl IntoIterator<Item = AssistantMessage>) -> Self {
        Self {
            replies: Mutex::new(replies.into_iter().collect()),
            requests: Mutex::new(Vec::new()),
        }
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<ModelRequest> {
        lock(&self.requests).clone()
    }

    /// How many scripted replies are left.
    pub fn remaining(&self) -> usize {
        lock(&self.replies).len()
    }
}

/// Locks a mutex, ignoring poisoning (the data stays consistent: every
/// critical section is a single push or pop).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[async_trait]
impl ChatModel for ScriptedModel {
    async fn generate(
        &self,
        messages: &[Message],
        tools: &[ToolInfo],
    ) -> Result<AssistantMessage, ToolError> {
        lock(&self.requests).push(ModelRequest {
            messages: messages.to_vec(),
            tool_names: tools.iter().map(|t| t.name.clone()).collect(),
        });
        lock(&self.replies)
            .pop_front()
            .ok_or_else(|| ToolError::model("the scripted model has no replies left"))
    }
}

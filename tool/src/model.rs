//! The [`ChatModel`] trait and the [`ScriptedModel`] used in tests and
//! examples.

use std::{
    collections::VecDeque,
    sync::{Mutex, MutexGuard, PoisonError},
};

use async_trait::async_trait;

use crate::{
    error::ToolError,
    info::ToolInfo,
    message::{AssistantMessage, Message},
};

/// A chat model that can call tools: given the conversation and the
/// available tools, it answers with an assistant message, which may ask for
/// tool calls.
///
/// The trait is object safe (`Arc<dyn ChatModel>`). This crate ships no
/// network-backed model; [`ScriptedModel`] replays fixed replies.
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

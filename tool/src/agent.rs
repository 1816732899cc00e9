//! The bounded agent loop: model → tools → model … until the model stops
//! calling tools or the step limit is reached.

use std::sync::Arc;

use crate::{
    error::ToolError,
    message::{AssistantMessage, Message},
    model::ChatModel,
    node::ToolsNode,
};

/// The default step limit of an [`Agent`].
pub const DEFAULT_MAX_STEPS: usize = 10;

/// Runs a [`ChatModel`] and a [`ToolsNode`] in a loop (the ReAct pattern).
///
/// One *step* is one model call plus, if the reply asks for tool calls,
/// running them with the node and appending the tool messages. The loop
/// ends successfully at the first reply without tool calls. If the
/// `max_steps`-th reply still asks for tools, those tools are run (so the
/// transcript stays well-formed and can be resumed) and the run fails with
/// [`ToolError::StepLimit`], which carries the transcript. The model is
/// therefore called at most `max_steps` times. When calls of a step wait for
/// input, the run ends with [`ToolError::CallsInterrupted`], which carries the
/// transcript too (with the results of the step's calls that ended).
///
/// ```
/// use std::sync::Arc;
/// use dtask_tool::{Agent, AssistantMessage, FunctionTool, Message, ScriptedModel, ToolCall, ToolsNode};
/// use schemars::JsonSchema;
/// use serde::Deserialize;
///
/// #[derive(Deserialize, JsonSchema)]
/// struct Square { x: i64 }
///
/// let square = FunctionTool::infer("square", "Square a number", |a: Square| async move {
///     Ok::<_, std::convert::Infallible>(a.x * a.x)
/// });
/// let model = ScriptedModel::new([
///     AssistantMessage::with_tool_calls(vec![ToolCall::function("c1", "square", r#"{"x":7}"#)]),
///     AssistantMessage::text("7 squared is 49."),
/// ]);
/// let agent = Agent::new(Arc::new(model), ToolsNode::builder().tool(square).build().unwrap());
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let run = agent.run(vec![Message::user("What is 7 squared?")]).await.unwrap();
/// assert_eq!(run.steps, 2);
/// assert_eq!(run.messages[2], Message::tool("c1", "49"));
/// assert_eq!(run.answer.content.as_deref(), Some("7 squared is 49."));
/// # });
/// ```
#[derive(Clone)]
pub struct Agent {
    model: Arc<dyn ChatModel>,
    tools: ToolsNode,
    max_steps: usize,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("tools", &self.tools)
            .field("max_steps", &self.max_steps)
            .finish_non_exhaustive()
    }
}

/// The result of a successful [`Agent::run`].
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRun {
    /// The whole conversation: the input messages, then every assistant and
    /// tool message, ending with the final assistant message.
    pub messages: Vec<Message>,
    /// The final assistant message (the one without tool calls; also the
    /// last entry of `messages`).
    pub answer: AssistantMessage,
    /// How many steps (model calls) the run took.
    pub steps: usize,
}

impl Agent {
    /// An agent with the default step limit ([`DEFAULT_MAX_STEPS`]).
    pub fn new(model: Arc<dyn ChatModel>, tools: ToolsNode) -> Self {
        Self {
            model,
            tools,
            max_steps: DEFAULT_MAX_STEPS,
        }
    }

    /// Sets the step limit (at least 1).
    #[must_use]
    pub fn with_max_steps(mut self, max_steps: usize) -> Self {
        self.max_steps = max_steps.max(1);
        self
    }

    /// The step limit.
    pub fn max_steps(&self) -> usize {
        self.max_steps
    }

    /// The tools node.
    pub fn tools(&self) -> &ToolsNode {
        &self.tools
    }

    /// Runs the loop from `messages` (typically a system and a user message,
    /// or a transcript from [`ToolError::StepLimit`] or
    /// [`ToolError::CallsInterrupted`] to continue).
    ///
    /// # Errors
    ///
    /// [`ToolError::StepLimit`] when the step budget is used up;
    /// [`ToolError::CallsInterrupted`], with the transcript, when calls wait for
    /// input; otherwise the first error of the model or of the tools node.
    pub async fn run(&self, mut messages: Vec<Message>) -> Result<AgentRun, ToolError> {
        for step in 1..=self.max_steps {
            let reply = self.model.generate(&messages, self.tools.infos()).await?;
            let tool_messages = if reply.has_tool_calls() {
                match self.tools.invoke(&reply).await {
                    Ok(answers) => Some(answers),
                    Err(ToolError::CallsInterrupted {
                        interrupts,
                        finished,
                        ..
                    }) => {
                        messages.push(Message::Assistant(reply));
                        messages.extend(finished.iter().cloned().map(Message::Tool));
                        return Err(ToolError::CallsInterrupted {
                            interrupts,
                            finished,
                            transcript: messages,
                        });
                    }
                    Err(e) => return Err(e),
                }
            } else {
                None
            };
            match tool_messages {
                None => {
                    messages.push(Message::Assistant(reply.clone()));
                    return Ok(AgentRun {
                        messages,
                        answer: reply,
                        steps: step,
                    });
                }
                Some(answers) => {
                    messages.push(Message::Assistant(reply));
                    messages.extend(answers.into_iter().map(Message::Tool));
                }
            }
        }
        Err(ToolError::StepLimit {
            limit: self.max_steps,
            transcript: messages,
        })
    }
}

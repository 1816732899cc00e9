//! The [`ToolsNode`]: runs the tool calls of an assistant message.

use std::{
    collections::HashMap, fmt, future::Future, panic::AssertUnwindSafe, sync::Arc, time::Duration,
};

use futures::{
    future::{self, BoxFuture},
    FutureExt,
};

use crate::{
    error::{panic_message, InterruptedCall, ToolError},
    info::ToolInfo,
    message::{AssistantMessage, ToolCall, ToolMessage},
    tool::{CollectedStream, StreamingTool, Tool},
};

/// How a [`ToolsNode`] runs the calls of one message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Execution {
    /// All calls run at the same time, interleaved on the calling task (the
    /// default). Every call runs to its end, even when an earlier one fails.
    #[default]
    Concurrent,
    /// One call after the other, in call order. Under
    /// [`ErrorPolicy::Fail`], the calls after a failing one are not run; under
    /// either policy, the calls after one waiting for input
    /// ([`ToolError::Interrupted`]) are not run.
    Sequential,
}

/// What a [`ToolsNode`] does when one call fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorPolicy {
    /// The node fails with the error of the first failing call, in call
    /// order (the default).
    #[default]
    Fail,
    /// The error text becomes that call's tool message
    /// (`"Error: <error>"`), so the model can see it and correct itself —
    /// except [`ToolError::Interrupted`] (a call waiting for input, whose
    /// state the caller needs to resume it): the node returns
    /// [`ToolError::CallsInterrupted`] then.
    ReturnToModel,
}

/// Handles calls of tools the node does not know: receives the call and
/// answers with the tool message content (or an error, subject to the
/// [`ErrorPolicy`]).
pub type UnknownToolHandler =
    Arc<dyn Fn(ToolCall) -> BoxFuture<'static, Result<String, ToolError>> + Send + Sync>;

/// Runs the tool calls of an assistant message against a set of tools,
/// mapping each call to a tool by name (Eino's `ToolsNode`).
///
/// The returned tool messages are in call order and carry the call ids. Each
/// call is isolated: a panicking tool becomes [`ToolError::Panicked`] for
/// that call, and an optional per-call time limit becomes
/// [`ToolError::Timeout`]. What a failed call does to the node is set by
/// the [`ErrorPolicy`].
///
/// A call of an unregistered tool goes to the unknown-tool handler if one is
/// set; otherwise it is [`ToolError::UnknownTool`]. Under
/// [`ErrorPolicy::Fail`] that is checked before anything runs, so no tool
/// runs when the model asked for one that does not exist.
///
/// A call waiting for input ([`ToolError::Interrupted`]) is not a failure:
/// under either policy, the node returns [`ToolError::CallsInterrupted`] with
/// every interrupted call's state and the tool messages of the calls that
/// ended, so that none of them has to run again.
///
/// ```
/// use dtask_tool::{AssistantMessage, FunctionTool, ToolCall, ToolsNode};
/// use schemars::JsonSchema;
/// use serde::Deserialize;
///
/// #[derive(Deserialize, JsonSchema)]
/// struct Name { name: String }
///
/// let greet = FunctionTool::infer("greet", "Greet someone", |n: Name| async move {
///     Ok::<_, std::convert::Infallible>(format!("Hello, {}!", n.name))
/// });
/// let node = ToolsNode::builder().tool(greet).build().unwrap();
///
/// let reply = AssistantMessage::with_tool_calls(vec![
///     ToolCall::function("call_1", "greet", r#"{"name":"Ada"}"#),
/// ]);
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let messages = node.invoke(&reply).await.unwrap();
/// assert_eq!(messages[0].tool_call_id, "call_1");
/// assert_eq!(messages[0].content, r#""Hello, Ada!""#);
/// # });
/// ```
#[derive(Clone)]
pub struct ToolsNode {
    tools: HashMap<String, Arc<dyn Tool>>,
    infos: Vec<ToolInfo>,
    execution: Execution,
    error_policy: ErrorPolicy,
    unknown_tool: Option<UnknownToolHandler>,
    call_timeout: Option<Duration>,
}

impl fmt::Debug for ToolsNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolsNode")
            .field(
                "tools",
                &self.infos.iter().map(|i| &i.name).collect::<Vec<_>>(),
            )
            .field("execution", &self.execution)
            .field("error_policy", &self.error_policy)
            .field("unknown_tool_handler", &self.unknown_tool.is_some())
            .field("call_timeout", &self.call_timeout)
            .finish()
    }
}

impl ToolsNode {
    /// A builder for a node.
    pub fn builder() -> ToolsNodeBuilder {
        ToolsNodeBuilder::default()
    }

    /// A node with `tools` and the default options (concurrent,
    /// [`ErrorPolicy::Fail`], no unknown-tool handler, no time limit).
    ///
    /// # Errors
    ///
    /// [`ToolError::DuplicateTool`] if two tools share a name.
    pub fn new(tools: impl IntoIterator<Item = Arc<dyn Tool>>) -> Result<Self, ToolError> {
        let mut builder = Self::builder();
        builder.tools.extend(tools);
        builder.build()
    }

    /// The descriptions of the registered tools, in registration order: what
    /// to hand to a [`ChatModel`](crate::ChatModel).
    pub fn infos(&self) -> &[ToolInfo] {
        &self.infos
    }

    /// The registered tool called `name`.
    pub fn tool(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// Runs the tool calls of `message` and returns one tool message per call,
    /// in call order. A message without tool calls gives no tool messages.
    ///
    /// # Errors
    ///
    /// Under [`ErrorPolicy::Fail`], the error of the first failing call in
    /// call order ([`ToolError::UnknownTool`], [`ToolError::InvalidArguments`],
    /// [`ToolError::Panicked`], ...). Otherwise, when calls wait for input,
    /// [`ToolError::CallsInterrupted`] (its `transcript` empty).
    pub async fn invoke(&self, message: &AssistantMessage) -> Result<Vec<ToolMessage>, ToolError> {
        self.invoke_calls(&message.tool_calls).await
    }

    /// Like [`invoke`](Self::invoke), for a list of calls.
    ///
    /// # Errors
    ///
    /// As for [`invoke`](Self::invoke).
    pub async fn invoke_calls(&self, calls: &[ToolCall]) -> Result<Vec<ToolMessage>, ToolError> {
        if self.error_policy == ErrorPolicy::Fail && self.unknown_tool.is_none() {
            if let Some(call) = calls
                .iter()
                .find(|c| !self.tools.contains_key(&c.function.name))
            {
                return Err(ToolError::UnknownTool {
                    name: call.function.name.clone(),
                });
            }
        }
        let stop_at_first_error = self.error_policy == ErrorPolicy::Fail;
        let results = self.run(calls, stop_at_first_error).await;
        let mut finished = Vec::with_capacity(results.len());
        let mut interrupts = Vec::new();
        for (call, result) in calls.iter().zip(results) {
            match result {
                Ok(content) => finished.push(ToolMessage::new(&call.id, content)),
                // A call waiting for input has not failed: its state (to resume it with) would
                // be lost in a text for the model. It ends the node under either policy, with
                // the other calls' results (a resumed run must not run them again).
                Err(ToolError::Interrupted { tool, info, state }) => {
                    interrupts.push(InterruptedCall {
                        call_id: call.id.clone(),
                        tool,
                        info,
                        state,
                    });
                }
                Err(e) if self.error_policy == ErrorPolicy::ReturnToModel => {
                    finished.push(ToolMessage::new(&call.id, format!("Error: {e}")));
                }
                Err(e) => return Err(e),
            }
        }
        if interrupts.is_empty() {
            Ok(finished)
        } else {
            Err(ToolError::CallsInterrupted {
                interrupts,
                finished,
                transcript: Vec::new(),
            })
        }
    }

    /// Runs `calls` and returns each call's raw outcome, in call order,
    /// without applying the [`ErrorPolicy`] (but with the execution mode,
    /// panic isolation, time limit and unknown-tool handling of the node).
    /// Sequentially, the calls after one waiting for input are not run: the
    /// outcomes then end with its [`ToolError::Interrupted`].
    pub async fn run_calls(&self, calls: &[ToolCall]) -> Vec<Result<String, ToolError>> {
        self.run(calls, false).await
    }

    async fn run(
        &self,
        calls: &[ToolCall],
        stop_at_first_error: bool,
    ) -> Vec<Result<String, ToolError>> {
        match self.execution {
            Execution::Concurrent => future::join_all(calls.iter().map(|c| self.run_one(c))).await,
            Execution::Sequential => {
                let mut results = Vec::with_capacity(calls.len());
                for call in calls {
                    let result = self.run_one(call).await;
                    // A call waiting for input stops the calls after it under either policy:
                    // they may depend on the answer.
                    let stop = match &result {
                        Ok(_) => false,
                        Err(ToolError::Interrupted { .. }) => true,
                        Err(_) => stop_at_first_error,
                    };
                    results.push(result);
                    if stop {
                        break;
                    }
                }
                results
            }
        }
    }

    /// Runs one call, isolated from panics and bounded by the time limit.
    fn run_one<'a>(
        &'a self,
        call: &'a ToolCall,
    ) -> impl Future<Output = Result<String, ToolError>> + 'a {
        let name = call.function.name.as_str();
        // Everything, including creating the tool's future, happens inside
        // the guarded future, so even a synchronous panic is caught.
        let work = async move {
            match self.tools.get(name) {
                Some(tool) => (**tool).invoke(&call.function.arguments).await,
                None => match &self.unknown_tool {
                    Some(handler) => handler(call.clone()).await,
                    None => Err(ToolError::UnknownTool {
                        name: name.to_owned(),
                    }),
                },
            }
        };
        let timeout = self.call_timeout;
        async move {
            let guarded = AssertUnwindSafe(work).catch_unwind().map(|r| {
                r.unwrap_or_else(|payload| {
                    Err(ToolError::Panicked {
                        tool: name.to_owned(),
                        message: panic_message(payload.as_ref()),
                    })
                })
            });
            match timeout {
                None => guarded.await,
                Some(limit) => tokio::time::timeout(limit, guarded)
                    .await
                    .unwrap_or_else(|_| {
                        Err(ToolError::Timeout {
                            tool: name.to_owned(),
                            timeout: limit,
                        })
                    }),
            }
        }
    }
}

/// Builds a [`ToolsNode`].
#[derive(Default)]
pub struct ToolsNodeBuilder {
    tools: Vec<Arc<dyn Tool>>,
    execution: Execution,
    error_policy: ErrorPolicy,
    unknown_tool: Option<UnknownToolHandler>,
    call_timeout: Option<Duration>,
}

impl fmt::Debug for ToolsNodeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolsNodeBuilder")
            .field("tools", &self.tools.len())
            .field("execution", &self.execution)
            .field("error_policy", &self.error_policy)
            .field("unknown_tool_handler", &self.unknown_tool.is_some())
            .field("call_timeout", &self.call_timeout)
            .finish()
    }
}

impl ToolsNodeBuilder {
    /// Registers a tool (an `Arc<dyn Tool>` is a tool too).
    #[must_use]
    pub fn tool(mut self, tool: impl Tool + 'static) -> Self {
        self.tools.push(Arc::new(tool));
        self
    }

    /// Registers a streaming tool; its chunks are concatenated into the tool
    /// message (see [`CollectedStream`]).
    #[must_use]
    pub fn streaming_tool(self, tool: impl StreamingTool + 'static) -> Self {
        self.tool(CollectedStream(tool))
    }

    /// Sets the execution mode (default [`Execution::Concurrent`]).
    #[must_use]
    pub fn execution(mut self, execution: Execution) -> Self {
        self.execution = execution;
        self
    }

    /// Shorthand for `execution(Execution::Sequential)`.
    #[must_use]
    pub fn sequential(self) -> Self {
        self.execution(Execution::Sequential)
    }

    /// Sets the error policy (default [`ErrorPolicy::Fail`]).
    #[must_use]
    pub fn error_policy(mut self, policy: ErrorPolicy) -> Self {
        self.error_policy = policy;
        self
    }

    /// Sets a handler for calls of unregistered tools.
    #[must_use]
    pub fn unknown_tool_handler<F, Fut>(mut self, handler: F) -> Self
    where
        F: Fn(ToolCall) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<String, ToolError>> + Send + 'static,
    {
        self.unknown_tool = Some(Arc::new(move |call| handler(call).boxed()));
        self
    }

    /// Bounds every call by `limit`; a call that takes longer is dropped and
    /// becomes [`ToolError::Timeout`]. Needs a Tokio runtime with time
    /// enabled.
    #[must_use]
    pub fn call_timeout(mut self, limit: Duration) -> Self {
        self.call_timeout = Some(limit);
        self
    }

    /// Builds the node.
    ///
    /// # Errors
    ///
    /// [`ToolError::DuplicateTool`] if two tools share a name.
    pub fn build(self) -> Result<ToolsNode, ToolError> {
        let mut tools = HashMap::with_capacity(self.tools.len());
        let mut infos = Vec::with_capacity(self.tools.len());
        for tool in self.tools {
            let info = tool.info();
            if tools.insert(info.name.clone(), tool).is_some() {
                return Err(ToolError::DuplicateTool { name: info.name });
            }
            infos.push(info);
        }
        Ok(ToolsNode {
            tools,
            infos,
            execution: self.execution,
            error_policy: self.error_policy,
            unknown_tool: self.unknown_tool,
            call_timeout: self.call_timeout,
        })
    }
}

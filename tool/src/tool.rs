//! The [`Tool`] and [`StreamingTool`] traits.

use std::sync::Arc;

use async_trait::async_trait;
use futures::{stream::BoxStream, StreamExt};

use crate::{error::ToolError, info::ToolInfo};

/// A tool that a chat model can call: it describes itself with
/// [`info`](Tool::info) and runs with JSON arguments, answering with a string
/// that is handed back to the model (Eino's `InvokableTool`).
///
/// The trait is object safe; tools are usually held as `Arc<dyn Tool>`.
/// Most tools are built from typed async functions with
/// [`FunctionTool`](crate::FunctionTool), but implementing it by hand is
/// simple:
///
/// ```
/// use async_trait::async_trait;
/// use dtask_tool::{decode_arguments, Tool, ToolError, ToolInfo};
/// use serde::Deserialize;
/// use serde_json::json;
///
/// struct Echo;
///
/// #[derive(Deserialize)]
/// struct EchoArgs { text: String }
///
/// #[async_trait]
/// impl Tool for Echo {
///     fn info(&self) -> ToolInfo {
///         ToolInfo::new("echo", "Repeat the text", json!({
///             "type": "object",
///             "properties": { "text": { "type": "string" } },
///             "required": ["text"]
///         }))
///     }
///
///     async fn invoke(&self, arguments: &str) -> Result<String, ToolError> {
///         let args: EchoArgs = decode_arguments("echo", arguments)?;
///         Ok(args.text)
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// assert_eq!(Echo.invoke(r#"{"text":"hi"}"#).await.unwrap(), "hi");
/// # });
/// ```
#[async_trait]
pub trait Tool: Send + Sync {
    /// The tool's name, description and parameter schema.
    fn info(&self) -> ToolInfo;

    /// Runs the tool with `arguments`, a JSON document (normally an object)
    /// produced by the model, and returns the text handed back to it.
    ///
    /// # Errors
    ///
    /// [`ToolError::InvalidArguments`] for bad input, otherwise whatever the
    /// tool fails with (usually [`ToolError::Failed`]).
    async fn invoke(&self, arguments: &str) -> Result<String, ToolError>;
}

/// The output of a [`StreamingTool`]: chunks of text, each of which may fail.
pub type ToolOutputStream = BoxStream<'static, Result<String, ToolError>>;

/// A tool whose output arrives as a stream of chunks (Eino's
/// `StreamableTool`).
///
/// Any streaming tool can be used where a [`Tool`] is expected through
/// [`CollectedStream`], which concatenates the chunks; a
/// [`ToolsNode`](crate::ToolsNode) does that for tools registered with
/// [`ToolsNodeBuilder::streaming_tool`](crate::ToolsNodeBuilder::streaming_tool).
#[async_trait]
pub trait StreamingTool: Send + Sync {
    /// The tool's name, description and parameter schema.
    fn info(&self) -> ToolInfo;

    /// Starts the tool with JSON `arguments` and returns its output stream.
    ///
    /// # Errors
    ///
    /// [`ToolError::InvalidArguments`] for bad input, or any failure that
    /// happens before the first chunk; later failures are items of the
    /// stream.
    async fn invoke_stream(&self, arguments: &str) -> Result<ToolOutputStream, ToolError>;
}

#[async_trait]
impl<T: Tool + ?Sized> Tool for Arc<T> {
    fn info(&self) -> ToolInfo {
        (**self).info()
    }

    async fn invoke(&self, arguments: &str) -> Result<String, ToolError> {
        (**self).invoke(arguments).await
    }
}

#[async_trait]
impl<T: StreamingTool + ?Sized> StreamingTool for Arc<T> {
    fn info(&self) -> ToolInfo {
        (**self).info()
    }

    async fn invoke_stream(&self, arguments: &str) -> Result<ToolOutputStream, ToolError> {
        (**self).invoke_stream(arguments).await
    }
}

/// Adapts a [`StreamingTool`] into a [`Tool`] by running the stream to its
/// end and concatenating the chunks; the first failing chunk fails the call.
#[derive(Debug, Clone)]
pub struct CollectedStream<S>(pub S);

#[async_trait]
impl<S: StreamingTool> Tool for CollectedStream<S> {
    fn info(&self) -> ToolInfo {
        self.0.info()
    }

    async fn invoke(&self, arguments: &str) -> Result<String, ToolError> {
        let mut stream = self.0.invoke_stream(arguments).await?;
        let mut out = String::new();
        while let Some(chunk) = stream.next().await {
            out.push_str(&chunk?);
        }
        Ok(out)
    }
}

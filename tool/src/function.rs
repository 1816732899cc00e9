//! Tools built from typed async functions: [`FunctionTool`] and
//! [`StreamingFunctionTool`].

use std::{fmt, future::Future, panic::AssertUnwindSafe, sync::Arc};

use async_trait::async_trait;
use futures::{
    future::{self, BoxFuture},
    stream::BoxStream,
    FutureExt, Stream, StreamExt,
};
use schemars::JsonSchema;
use serde::{de::DeserializeOwned, Serialize};

use crate::{
    arguments::{decode_json, invalid_from_box},
    error::{panic_message, BoxError, ToolError},
    info::ToolInfo,
    tool::{StreamingTool, Tool, ToolOutputStream},
};

/// A custom argument decoder: turns the JSON arguments of a call into the
/// function's input (Eino's `UnmarshalArguments`).
///
/// Its error becomes [`ToolError::InvalidArguments`]; if it is a
/// `serde_path_to_error::Error<serde_json::Error>` or a
/// [`ToolError::InvalidArguments`], its path is kept, otherwise the path is
/// `.`.
pub type ArgumentDecoder<T> = Arc<dyn Fn(&str) -> Result<T, BoxError> + Send + Sync>;

/// A custom output encoder: turns the function's output into the text handed
/// back to the model (Eino's `MarshalOutput`). Its error becomes
/// [`ToolError::Output`].
pub type OutputEncoder<O> = Arc<dyn Fn(&O) -> Result<String, BoxError> + Send + Sync>;

type BoxedFn<T, O> = Arc<dyn Fn(T) -> BoxFuture<'static, Result<O, BoxError>> + Send + Sync>;
type BoxedStreamFn<T, O> = Arc<dyn Fn(T) -> BoxStream<'static, Result<O, BoxError>> + Send + Sync>;

fn default_decoder<T: DeserializeOwned>() -> ArgumentDecoder<T> {
    Arc::new(|arguments: &str| decode_json::<T>(arguments).map_err(BoxError::from))
}

fn default_encoder<O: Serialize>() -> OutputEncoder<O> {
    Arc::new(|output: &O| serde_json::to_string(output).map_err(BoxError::from))
}

/// Maps a tool function's error: a [`ToolError`] about a tool call passes through
/// unchanged (see [`passes_through`]); anything else becomes [`ToolError::Failed`] naming
/// `tool`.
fn function_error(tool: &str, error: BoxError) -> ToolError {
    match error.downcast::<ToolError>() {
        Ok(e) if passes_through(&e, tool) => *e,
        Ok(e) => ToolError::Failed {
            tool: tool.to_owned(),
            source: e,
        },
        Err(source) => ToolError::Failed {
            tool: tool.to_owned(),
            source,
        },
    }
}

/// Whether a function's [`ToolError`] is the outcome of `tool`'s call, to pass through:
/// bad arguments, a failure, a panic, an HTTP status, a time limit, an encoding or
/// configuration error — naming `tool` — or a call waiting for input (whose state is the
/// asking tool's, whichever it is). The errors of an agent or a tools node the function ran
/// itself — a model's error, a step limit, an unknown or duplicate tool, an interrupted
/// turn, an error of another tool — are not this call's: they would pass for the caller's
/// own (told it sent bad arguments to a tool it never called).
fn passes_through(error: &ToolError, tool: &str) -> bool {
    match error {
        ToolError::Interrupted { .. } => true,
        ToolError::InvalidArguments { .. }
        | ToolError::Panicked { .. }
        | ToolError::Http { .. }
        | ToolError::Timeout { .. }
        | ToolError::Output { .. }
        | ToolError::Failed { .. }
        | ToolError::Config { .. } => error.tool_name() == Some(tool),
        _ => false,
    }
}

fn panicked(tool: &str, payload: &(dyn std::any::Any + Send)) -> ToolError {
    ToolError::Panicked {
        tool: tool.to_owned(),
        message: panic_message(payload),
    }
}

/// A [`Tool`] made from a typed async function `Fn(T) -> Future<Output =
/// Result<O, E>>` (Eino's `NewTool` / `InferTool`).
///
/// A call decodes the JSON arguments into `T` (by default with `serde_json`
/// and [`decode_arguments`](crate::decode_arguments)' error reporting), runs
/// the function, and encodes its `O` output (by default as JSON with
/// `serde_json`, so a `String` output is returned quoted; use
/// [`with_encoder`](Self::with_encoder) to return raw text). A panic anywhere
/// in that becomes [`ToolError::Panicked`]. The function's error becomes
/// [`ToolError::Failed`], unless it already is a [`ToolError`] about a tool call
/// (`InvalidArguments`, `Failed`, `Panicked`, `Http`, `Timeout`, `Output`, `Config`,
/// `Interrupted`), which passes through. The errors of an agent or tools node run inside
/// the function (`Model`, `StepLimit`, `UnknownTool`, `DuplicateTool`, `CallsInterrupted`)
/// become [`ToolError::Failed`] naming this tool, their source the original error.
///
/// ```
/// use dtask_tool::{FunctionTool, Tool};
/// use schemars::JsonSchema;
/// use serde::Deserialize;
///
/// #[derive(Deserialize, JsonSchema)]
/// struct AddArgs {
///     /// The first addend.
///     a: i64,
///     /// The second addend.
///     b: i64,
/// }
///
/// let add = FunctionTool::infer("add", "Add two integers", |args: AddArgs| async move {
///     Ok::<_, std::convert::Infallible>(args.a + args.b)
/// });
/// assert_eq!(add.info().parameters["required"], serde_json::json!(["a", "b"]));
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// assert_eq!(add.invoke(r#"{"a": 2, "b": 3}"#).await.unwrap(), "5");
/// # });
/// ```
pub struct FunctionTool<T, O> {
    info: ToolInfo,
    func: BoxedFn<T, O>,
    decoder: ArgumentDecoder<T>,
    encoder: OutputEncoder<O>,
}

impl<T, O> FunctionTool<T, O>
where
    T: DeserializeOwned + Send + 'static,
    O: Serialize + Send + 'static,
{
    /// A function tool with an explicit [`ToolInfo`] (Eino's `NewTool`).
    ///
    /// The schema in `info` is what the model sees; keeping it in line with
    /// `T` is up to the caller (decoding into `T` still checks every call).
    pub fn new<F, Fut, E>(info: ToolInfo, func: F) -> Self
    where
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let func: BoxedFn<T, O> =
            Arc::new(move |input: T| func(input).map(|r| r.map_err(Into::into)).boxed());
        Self {
            info,
            func,
            decoder: default_decoder::<T>(),
            encoder: default_encoder::<O>(),
        }
    }

    /// A function tool whose parameter schema is inferred from `T` with
    /// [`parameters_schema`](crate::parameters_schema) (Eino's `InferTool`).
    pub fn infer<F, Fut, E>(
        name: impl Into<String>,
        description: impl Into<String>,
        func: F,
    ) -> Self
    where
        T: JsonSchema,
        F: Fn(T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        Self::new(ToolInfo::infer::<T>(name, description), func)
    }
}

impl<T, O> FunctionTool<T, O> {
    /// Replaces the argument decoder (see [`ArgumentDecoder`] for how its
    /// errors are reported). `T` must still implement `Deserialize`, since
    /// the constructors install the default decoder first.
    #[must_use]
    pub fn with_decoder(
        mut self,
        decoder: impl Fn(&str) -> Result<T, BoxError> + Send + Sync + 'static,
    ) -> Self {
        self.decoder = Arc::new(decoder);
        self
    }

    /// Replaces the output encoder.
    #[must_use]
    pub fn with_encoder(
        mut self,
        encoder: impl Fn(&O) -> Result<String, BoxError> + Send + Sync + 'static,
    ) -> Self {
        self.encoder = Arc::new(encoder);
        self
    }

    /// The tool's description (the same as [`Tool::info`], without a clone).
    pub fn tool_info(&self) -> &ToolInfo {
        &self.info
    }
}

impl<T, O> fmt::Debug for FunctionTool<T, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FunctionTool")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<T: Send + 'static, O: Send + 'static> Tool for FunctionTool<T, O> {
    fn info(&self) -> ToolInfo {
        self.info.clone()
    }

    async fn invoke(&self, arguments: &str) -> Result<String, ToolError> {
        let name = self.info.name.as_str();
        let run = async {
            let input = (self.decoder)(arguments).map_err(|e| invalid_from_box(name, e))?;
            let output = (self.func)(input)
                .await
                .map_err(|e| function_error(name, e))?;
            (self.encoder)(&output).map_err(|source| ToolError::Output {
                tool: name.to_owned(),
                source,
            })
        };
        AssertUnwindSafe(run)
            .catch_unwind()
            .await
            .unwrap_or_else(|payload| Err(panicked(name, payload.as_ref())))
    }
}

/// A [`StreamingTool`] made from a typed function that returns a stream:
/// `Fn(T) -> impl Stream<Item = Result<O, E>>`.
///
/// Arguments are decoded as for [`FunctionTool`]; every chunk is encoded with
/// the output encoder (JSON by default, so for text chunks set
/// [`with_encoder`](Self::with_encoder)). A failing chunk becomes
/// [`ToolError::Failed`] (a [`ToolError`] is mapped as for [`FunctionTool`]); a panic
/// while producing the stream, a chunk or a chunk's encoding becomes a final
/// [`ToolError::Panicked`] item: the stream ends after it.
///
/// ```
/// use dtask_tool::{StreamingFunctionTool, StreamingTool};
/// use futures::{stream, StreamExt};
/// use schemars::JsonSchema;
/// use serde::Deserialize;
///
/// #[derive(Deserialize, JsonSchema)]
/// struct Count { to: u32 }
///
/// let counter = StreamingFunctionTool::infer("count", "Count from 1", |args: Count| {
///     stream::iter((1..=args.to).map(Ok::<_, std::convert::Infallible>))
/// })
/// .with_encoder(|n: &u32| Ok(format!("{n} ")));
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let chunks: Vec<_> = counter.invoke_stream(r#"{"to":3}"#).await.unwrap().collect().await;
/// let text: String = chunks.into_iter().map(Result::unwrap).collect();
/// assert_eq!(text, "1 2 3 ");
/// # });
/// ```
pub struct StreamingFunctionTool<T, O> {
    info: ToolInfo,
    func: BoxedStreamFn<T, O>,
    decoder: ArgumentDecoder<T>,
    encoder: OutputEncoder<O>,
}

impl<T, O> StreamingFunctionTool<T, O>
where
    T: DeserializeOwned + Send + 'static,
    O: Serialize + Send + 'static,
{
    /// A streaming function tool with an explicit [`ToolInfo`].
    pub fn new<F, S, E>(info: ToolInfo, func: F) -> Self
    where
        F: Fn(T) -> S + Send + Sync + 'static,
        S: Stream<Item = Result<O, E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let func: BoxedStreamFn<T, O> =
            Arc::new(move |input: T| func(input).map(|r| r.map_err(Into::into)).boxed());
        Self {
            info,
            func,
            decoder: default_decoder::<T>(),
            encoder: default_encoder::<O>(),
        }
    }

    /// A streaming function tool whose parameter schema is inferred from `T`.
    pub fn infer<F, S, E>(name: impl Into<String>, description: impl Into<String>, func: F) -> Self
    where
        T: JsonSchema,
        F: Fn(T) -> S + Send + Sync + 'static,
        S: Stream<Item = Result<O, E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        Self::new(ToolInfo::infer::<T>(name, description), func)
    }
}

impl<T, O> StreamingFunctionTool<T, O> {
    /// Replaces the argument decoder.
    #[must_use]
    pub fn with_decoder(
        mut self,
        decoder: impl Fn(&str) -> Result<T, BoxError> + Send + Sync + 'static,
    ) -> Self {
        self.decoder = Arc::new(decoder);
        self
    }

    /// Replaces the chunk encoder.
    #[must_use]
    pub fn with_encoder(
        mut self,
        encoder: impl Fn(&O) -> Result<String, BoxError> + Send + Sync + 'static,
    ) -> Self {
        self.encoder = Arc::new(encoder);
        self
    }
}

impl<T, O> fmt::Debug for StreamingFunctionTool<T, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamingFunctionTool")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<T: Send + 'static, O: Send + 'static> StreamingTool for StreamingFunctionTool<T, O> {
    fn info(&self) -> ToolInfo {
        self.info.clone()
    }

    async fn invoke_stream(&self, arguments: &str) -> Result<ToolOutputStream, ToolError> {
        let name = self.info.name.clone();
        let start = std::panic::catch_unwind(AssertUnwindSafe(|| {
            (self.decoder)(arguments).map(|input| (self.func)(input))
        }));
        let chunks = match start {
            Ok(Ok(chunks)) => chunks,
            Ok(Err(e)) => return Err(invalid_from_box(&name, e)),
            Err(payload) => return Err(panicked(&name, payload.as_ref())),
        };
        let encoder = Arc::clone(&self.encoder);
        // `catch_unwind` ends the stream after a panic of the function's stream; a panic of
        // the encoder ends it too (`ended`), as its last item.
        let stream = AssertUnwindSafe(chunks)
            .catch_unwind()
            .scan(false, move |ended, item| {
                if *ended {
                    return future::ready(None);
                }
                let item = match item {
                    Ok(Ok(chunk)) => {
                        match std::panic::catch_unwind(AssertUnwindSafe(|| encoder(&chunk))) {
                            Ok(text) => text.map_err(|source| ToolError::Output {
                                tool: name.clone(),
                                source,
                            }),
                            Err(payload) => {
                                *ended = true;
                                Err(panicked(&name, payload.as_ref()))
                            }
                        }
                    }
                    Ok(Err(e)) => Err(function_error(&name, e)),
                    Err(payload) => Err(panicked(&name, payload.as_ref())),
                };
                future::ready(Some(item))
            });
        Ok(stream.boxed())
    }
}

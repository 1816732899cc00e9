//! A [`ChatModel`] over an OpenAI-compatible chat completions endpoint — OpenAI itself, or
//! vLLM, llama.cpp's server, Ollama, which speak the same API.
//!
//! Built on `reqwest` with the crate's own wire types ([`Message`] already is the OpenAI
//! message format), not on a client crate: the messages need no conversion, and nothing else
//! is pulled in. It does function calling (`tools`, `tool_choice`), streaming (server-sent
//! `chat.completion.chunk`s whose tool-call deltas are assembled into whole calls, by index),
//! a per-request timeout, and retries with exponential backoff on 429, 5xx, timeouts, broken
//! connections and cut streams, honouring `Retry-After`. Every failure is a typed
//! [`ModelError`] inside [`ToolError::Model`] (downcast its source to match on it).

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::Value;

use crate::{
    AssistantMessage, ChatModel, Message, ModelReply, ToolCall, ToolError, ToolInfo, Usage,
};

/// The default endpoint base (`OPENAI_BASE_URL` overrides it).
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// How much of an error body a [`ModelError`] keeps.
const MESSAGE_CHARS: usize = 512;

/// Which tool the model must call, if any (`tool_choice`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (the default; sent only when tools are offered).
    #[default]
    Auto,
    /// No tool call.
    None,
    /// At least one tool call.
    Required,
    /// A call of this function.
    Function(String),
}

impl ToolChoice {
    fn to_json(&self) -> Value {
        match self {
            Self::Auto => Value::from("auto"),
            Self::None => Value::from("none"),
            Self::Required => Value::from("required"),
            Self::Function(name) => {
                serde_json::json!({"type": "function", "function": {"name": name}})
            }
        }
    }
}

/// How to reach the model.
///
/// ```
/// use std::time::Duration;
/// use dtask_tool::OpenAiConfig;
///
/// let config = OpenAiConfig::new("http://127.0.0.1:8000/v1", "llama-3.1-8b")
///     .with_timeout(Duration::from_secs(60))
///     .with_streaming(true);
/// assert_eq!(config.model, "llama-3.1-8b");
/// assert!(config.api_key.is_none());
/// ```
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub struct OpenAiConfig {
    /// The endpoint base, e.g. `https://api.openai.com/v1` (`/chat/completions` is appended).
    pub base_url: String,
    /// The bearer token, if the server wants one.
    pub api_key: Option<String>,
    /// The model name.
    pub model: String,
    /// The limit on one request, the whole streamed answer included (default 120 s).
    pub timeout: Duration,
    /// Retries after the first attempt on 429, 5xx, timeouts and broken streams (default 3).
    pub max_retries: u32,
    /// The first backoff, doubled at each retry (default 500 ms).
    pub initial_backoff: Duration,
    /// The longest wait before a retry, `Retry-After` included (default 20 s).
    pub max_backoff: Duration,
    /// Whether to stream the answer (default off).
    pub stream: bool,
    /// `tool_choice`, sent when tools are offered.
    pub tool_choice: ToolChoice,
    /// `temperature`, when set.
    pub temperature: Option<f64>,
}

impl std::fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl OpenAiConfig {
    /// A configuration for `model` at `base_url`, without a key.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            api_key: None,
            model: model.into(),
            timeout: Duration::from_secs(120),
            max_retries: 3,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(20),
            stream: false,
            tool_choice: ToolChoice::Auto,
            temperature: None,
        }
    }

    /// A configuration for `model` from the environment: `OPENAI_BASE_URL` (default
    /// [`DEFAULT_BASE_URL`]) and `OPENAI_API_KEY` (optional: local servers need none).
    pub fn from_env(model: impl Into<String>) -> Self {
        let base = std::env::var("OPENAI_BASE_URL").unwrap_or_else(|_| DEFAULT_BASE_URL.to_owned());
        let mut config = Self::new(base, model);
        config.api_key = std::env::var("OPENAI_API_KEY")
            .ok()
            .filter(|k| !k.is_empty());
        config
    }

    /// Sets [`OpenAiConfig::api_key`].
    #[must_use]
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Sets [`OpenAiConfig::timeout`].
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets [`OpenAiConfig::max_retries`] and the backoff bounds.
    #[must_use]
    pub fn with_retries(mut self, retries: u32, initial: Duration, max: Duration) -> Self {
        self.max_retries = retries;
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }

    /// Sets [`OpenAiConfig::stream`].
    #[must_use]
    pub fn with_streaming(mut self, on: bool) -> Self {
        self.stream = on;
        self
    }

    /// Sets [`OpenAiConfig::tool_choice`].
    #[must_use]
    pub fn with_tool_choice(mut self, choice: ToolChoice) -> Self {
        self.tool_choice = choice;
        self
    }
}

/// Why the model gave no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// 401 or 403: the key is missing, wrong or not allowed (not retried).
    #[error("the model server refused the credentials ({status}): {message}")]
    Auth {
        /// The HTTP status.
        status: u16,
        /// The server's message.
        message: String,
    },
    /// 429 after every retry.
    #[error("rate limited by the model server after {attempts} attempts: {message}")]
    RateLimited {
        /// Attempts made.
        attempts: u32,
        /// The last `Retry-After`, if any.
        retry_after: Option<Duration>,
        /// The server's message.
        message: String,
    },
    /// Another 4xx: the request is wrong (not retried).
    #[error("the model server rejected the request ({status}): {message}")]
    BadRequest {
        /// The HTTP status.
        status: u16,
        /// The server's message.
        message: String,
    },
    /// 5xx after every retry.
    #[error("the model server failed ({status}) after {attempts} attempts: {message}")]
    Server {
        /// The last HTTP status.
        status: u16,
        /// Attempts made.
        attempts: u32,
        /// The server's message.
        message: String,
    },
    /// A timeout, a refused or broken connection, or a stream cut before its end, after every
    /// retry.
    #[error("the model server could not be reached or stopped answering after {attempts} attempts: {message}")]
    Transport {
        /// Attempts made.
        attempts: u32,
        /// What happened.
        message: String,
    },
    /// An answer that is not the protocol's (not retried).
    #[error("a malformed answer from the model server: {0}")]
    Malformed(String),
}

/// A chat model at an OpenAI-compatible endpoint.
///
/// ```no_run
/// use std::sync::Arc;
/// use dtask_tool::{Agent, Message, OpenAiChatModel, OpenAiConfig, ToolsNode};
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let model = OpenAiChatModel::new(OpenAiConfig::from_env("gpt-4o-mini"))?;
/// let agent = Agent::new(Arc::new(model), ToolsNode::builder().build()?);
/// let run = agent.run(vec![Message::user("Say hello.")]).await?;
/// println!("{:?}", run.answer.content);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct OpenAiChatModel {
    config: OpenAiConfig,
    http: reqwest::Client,
}

/// What one attempt ended with.
enum Attempt {
    Answer(AssistantMessage, Option<Usage>),
    /// Worth another try, after at least this long.
    Retry(ModelError, Option<Duration>),
    Fail(ModelError),
}

impl OpenAiChatModel {
    /// A model client for `config`.
    ///
    /// # Errors
    /// [`ToolError::Model`] when the HTTP client cannot be built.
    pub fn new(config: OpenAiConfig) -> Result<Self, ToolError> {
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .build()
            .map_err(ToolError::model)?;
        Ok(Self { config, http })
    }

    /// The configuration.
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// The request body for `messages` and `tools`.
    pub fn request_body(&self, messages: &[Message], tools: &[ToolInfo]) -> Value {
        let mut body = serde_json::json!({
            "model": self.config.model,
            "messages": messages,
        });
        if !tools.is_empty() {
            body["tools"] = tools.iter().map(ToolInfo::to_openai_tool).collect();
            body["tool_choice"] = self.config.tool_choice.to_json();
        }
        if let Some(t) = self.config.temperature {
            body["temperature"] = Value::from(t);
        }
        if self.config.stream {
            body["stream"] = Value::Bool(true);
            body["stream_options"] = serde_json::json!({"include_usage": true});
        }
        body
    }

    /// The next assistant message and the token usage the server reported, retrying as
    /// configured.
    ///
    /// # Errors
    /// The last attempt's [`ModelError`].
    pub async fn generate_with_usage(
        &self,
        messages: &[Message],
        tools: &[ToolInfo],
    ) -> Result<(AssistantMessage, Option<Usage>), ModelError> {
        let body = self.request_body(messages, tools);
        let mut backoff = self.config.initial_backoff;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (error, wait) = match self.attempt(&body).await {
                Attempt::Answer(answer, usage) => return Ok((answer, usage)),
                Attempt::Fail(error) => return Err(error),
                Attempt::Retry(error, wait) => (error, wait),
            };
            if attempt > self.config.max_retries {
                return Err(exhausted(error, attempt));
            }
            let wait = wait.unwrap_or(backoff).min(self.config.max_backoff);
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(self.config.max_backoff);
        }
    }

    async fn attempt(&self, body: &Value) -> Attempt {
        let url = format!(
            "{}/chat/completions",
            self.config.base_url.trim_end_matches('/')
        );
        let mut request = self.http.post(url).json(body);
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => return Attempt::Retry(transport(&e), None),
        };
        let status = response.status();
        if !status.is_success() {
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let message = error_message(&response.text().await.unwrap_or_default());
            let code = status.as_u16();
            return match code {
                401 | 403 => Attempt::Fail(ModelError::Auth {
                    status: code,
                    message,
                }),
                429 => Attempt::Retry(
                    ModelError::RateLimited {
                        attempts: 0,
                        retry_after,
                        message,
                    },
                    retry_after,
                ),
                500..=599 => Attempt::Retry(
                    ModelError::Server {
                        status: code,
                        attempts: 0,
                        message,
                    },
                    retry_after,
                ),
                _ => Attempt::Fail(ModelError::BadRequest {
                    status: code,
                    message,
                }),
            };
        }
        if self.config.stream {
            read_stream(response).await
        } else {
            match response.bytes().await {
                Err(e) => Attempt::Retry(transport(&e), None),
                Ok(bytes) => match parse_completion(&bytes) {
                    Ok((answer, usage)) => Attempt::Answer(answer, usage),
                    Err(e) => Attempt::Fail(e),
                },
            }
        }
    }
}

#[async_trait]
impl ChatModel for OpenAiChatModel {
    async fn generate(
        &self,
        messages: &[Message],
        tools: &[ToolInfo],
    ) -> Result<AssistantMessage, ToolError> {
        self.generate_with_usage(messages, tools)
            .await
            .map(|(answer, _)| answer)
            .map_err(ToolError::model)
    }

    async fn reply(
        &self,
        messages: &[Message],
        tools: &[ToolInfo],
    ) -> Result<ModelReply, ToolError> {
        let (message, usage) = self
            .generate_with_usage(messages, tools)
            .await
            .map_err(ToolError::model)?;
        Ok(ModelReply { message, usage })
    }
}

/// A retried error, with the number of attempts made.
fn exhausted(error: ModelError, attempts: u32) -> ModelError {
    match error {
        ModelError::RateLimited {
            retry_after,
            message,
            ..
        } => ModelError::RateLimited {
            attempts,
            retry_after,
            message,
        },
        ModelError::Server {
            status, message, ..
        } => ModelError::Server {
            status,
            attempts,
            message,
        },
        ModelError::Transport { message, .. } => ModelError::Transport { attempts, message },
        other => other,
    }
}

fn transport(e: &reqwest::Error) -> ModelError {
    ModelError::Transport {
        attempts: 0,
        message: if e.is_timeout() {
            format!("timed out: {e}")
        } else {
            e.to_string()
        },
    }
}

/// The server's error message: `error.message` of an OpenAI error body, else the body.
fn error_message(body: &str) -> String {
    let message = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| body.trim().to_owned());
    message.chars().take(MESSAGE_CHARS).collect()
}

#[derive(Deserialize)]
struct Completion {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    message: AssistantMessage,
}

/// A whole (not streamed) completion.
fn parse_completion(bytes: &[u8]) -> Result<(AssistantMessage, Option<Usage>), ModelError> {
    let completion: Completion = serde_json::from_slice(bytes)
        .map_err(|e| ModelError::Malformed(format!("not a chat completion: {e}")))?;
    let choice = completion
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| ModelError::Malformed("a completion without choices".into()))?;
    Ok((choice.message, completion.usage))
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    delta: Delta,
}

#[derive(Deserialize, Default)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<CallDelta>,
}

#[derive(Deserialize)]
struct CallDelta {
    index: usize,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

/// The answer being assembled from a stream's chunks.
#[derive(Default)]
struct Assembly {
    content: Option<String>,
    calls: Vec<(String, String, String)>,
    usage: Option<Usage>,
    done: bool,
}

impl Assembly {
    /// Applies one `data:` line; `Err` for a line that is not a chunk.
    fn line(&mut self, data: &str) -> Result<(), ModelError> {
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| ModelError::Malformed(format!("not a completion chunk: {e}")))?;
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        for choice in chunk.choices {
            if let Some(text) = choice.delta.content {
                self.content.get_or_insert_with(String::new).push_str(&text);
            }
            for call in choice.delta.tool_calls {
                if call.index >= self.calls.len() {
                    self.calls.resize(call.index + 1, Default::default());
                }
                let slot = &mut self.calls[call.index];
                if let Some(id) = call.id {
                    slot.0 = id;
                }
                if let Some(f) = call.function {
                    if let Some(name) = f.name {
                        slot.1.push_str(&name);
                    }
                    if let Some(args) = f.arguments {
                        slot.2.push_str(&args);
                    }
                }
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<(AssistantMessage, Option<Usage>), ModelError> {
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (i, (id, name, arguments)) in self.calls.into_iter().enumerate() {
            if name.is_empty() {
                return Err(ModelError::Malformed(format!(
                    "streamed tool call {i} has no function name"
                )));
            }
            let id = if id.is_empty() {
                format!("call_{i}")
            } else {
                id
            };
            tool_calls.push(ToolCall::function(id, name, arguments));
        }
        Ok((
            AssistantMessage {
                content: self.content,
                tool_calls,
            },
            self.usage,
        ))
    }
}

/// Reads a streamed answer (server-sent events of chunks, ending with `data: [DONE]`).
async fn read_stream(response: reqwest::Response) -> Attempt {
    let mut body = response.bytes_stream();
    let mut buffer: Vec<u8> = Vec::new();
    let mut assembly = Assembly::default();
    loop {
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            let Ok(line) = std::str::from_utf8(&line) else {
                return Attempt::Fail(ModelError::Malformed("a stream that is not UTF-8".into()));
            };
            if let Some(data) = line.trim_end().strip_prefix("data:") {
                if let Err(e) = assembly.line(data.trim()) {
                    return Attempt::Fail(e);
                }
                if assembly.done {
                    return match assembly.finish() {
                        Ok((answer, usage)) => Attempt::Answer(answer, usage),
                        Err(e) => Attempt::Fail(e),
                    };
                }
            }
        }
        match body.next().await {
            Some(Ok(bytes)) => buffer.extend_from_slice(&bytes),
            Some(Err(e)) => return Attempt::Retry(transport(&e), None),
            None => {
                return Attempt::Retry(
                    ModelError::Transport {
                        attempts: 0,
                        message: "the stream ended before [DONE]".into(),
                    },
                    None,
                )
            }
        }
    }
}

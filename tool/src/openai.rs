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

/// How much of an error response's body is read.
const ERROR_BODY_BYTES: usize = 64 << 10;

/// The most tool calls a streamed answer may assemble.
pub const MAX_STREAMED_TOOL_CALLS: usize = 128;

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
    /// The largest answer read, streamed or not (default 16 MiB): a server that sends more
    /// fails the request ([`ModelError::Malformed`]).
    pub max_response_bytes: usize,
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
            .field("max_response_bytes", &self.max_response_bytes)
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
            max_response_bytes: 16 << 20,
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

    /// Sets [`OpenAiConfig::max_response_bytes`].
    #[must_use]
    pub fn with_max_response_bytes(mut self, max: usize) -> Self {
        self.max_response_bytes = max;
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
    /// An answer that is not the protocol's, or larger than
    /// [`OpenAiConfig::max_response_bytes`] (not retried).
    #[error("a malformed answer from the model server: {0}")]
    Malformed(String),
    /// The client's configuration cannot work (a base URL that is not an http or https URL,
    /// say): nothing was sent, and nothing is retried.
    #[error("the model client is misconfigured: {0}")]
    Config(String),
    /// The server reported an error in the middle of a streamed answer (an `error` event),
    /// after every retry.
    #[error("the model server failed mid-stream after {attempts} attempts: {message}")]
    Stream {
        /// Attempts made.
        attempts: u32,
        /// The server's message.
        message: String,
    },
    /// The answer asked for tool calls and was cut at the token limit
    /// (`finish_reason: "length"`): the arguments of its last call are incomplete, so it is
    /// no answer (not retried: the same request would be cut again). A text answer cut at
    /// the limit is an answer, with its [`ModelReply::finish_reason`].
    #[error("the model's answer was cut at the token limit in the middle of its tool calls")]
    Truncated,
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
    Answer(ModelReply),
    /// Worth another try, after at least this long.
    Retry(ModelError, Option<Duration>),
    Fail(ModelError),
}

impl OpenAiChatModel {
    /// A model client for `config`. Redirects are not followed (a 3xx answer is a
    /// [`ModelError::BadRequest`]): the conversation goes to the configured server only.
    ///
    /// # Errors
    /// [`ToolError::Model`] with [`ModelError::Config`] when the base URL is not an http or
    /// https URL, or the HTTP client cannot be built.
    pub fn new(config: OpenAiConfig) -> Result<Self, ToolError> {
        let misconfigured = |message: String| ToolError::model(ModelError::Config(message));
        match reqwest::Url::parse(&config.base_url) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => {}
            Ok(url) => {
                return Err(misconfigured(format!(
                    "base URL `{}`: the scheme `{}` is not http or https",
                    config.base_url,
                    url.scheme()
                )))
            }
            Err(e) => {
                return Err(misconfigured(format!(
                    "base URL `{}`: {e}",
                    config.base_url
                )))
            }
        }
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| misconfigured(format!("the HTTP client: {e}")))?;
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
    /// The last attempt's [`ModelError`]; [`ModelError::Truncated`] for tool calls cut at
    /// the token limit.
    pub async fn generate_with_usage(
        &self,
        messages: &[Message],
        tools: &[ToolInfo],
    ) -> Result<(AssistantMessage, Option<Usage>), ModelError> {
        self.generate_reply(messages, tools)
            .await
            .map(|reply| (reply.message, reply.usage))
    }

    /// The next reply — message, usage and finish reason — retrying as configured.
    async fn generate_reply(
        &self,
        messages: &[Message],
        tools: &[ToolInfo],
    ) -> Result<ModelReply, ModelError> {
        let body = self.request_body(messages, tools);
        let mut backoff = self.config.initial_backoff;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (error, wait) = match self.attempt(&body).await {
                Attempt::Answer(reply) => return Ok(reply),
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
            Err(e) if e.is_builder() => return Attempt::Fail(ModelError::Config(e.to_string())),
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
            let (body, _) = read_limited(response, ERROR_BODY_BYTES)
                .await
                .unwrap_or_default();
            let message = error_message(&String::from_utf8_lossy(&body));
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
        let limit = self.config.max_response_bytes;
        if self.config.stream {
            read_stream(response, limit).await
        } else {
            match read_limited(response, limit).await {
                Err(e) => Attempt::Retry(transport(&e), None),
                Ok((_, true)) => Attempt::Fail(over_limit(limit)),
                Ok((bytes, false)) => match parse_completion(&bytes) {
                    Ok(reply) => Attempt::Answer(reply),
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
        self.generate_reply(messages, tools)
            .await
            .map_err(ToolError::model)
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
        ModelError::Stream { message, .. } => ModelError::Stream { attempts, message },
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

/// Up to `limit` bytes of `response`'s body, and whether there was more.
async fn read_limited(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = limit.saturating_sub(body.len());
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

fn over_limit(limit: usize) -> ModelError {
    ModelError::Malformed(format!("an answer over the limit of {limit} bytes"))
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
    #[serde(default)]
    finish_reason: Option<String>,
}

/// Whether `text` is one complete JSON document: a streamed call's arguments once whole.
fn is_whole_json(text: &str) -> bool {
    !text.trim().is_empty() && serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

/// The finish reason of an answer cut at the token limit.
const LENGTH: &str = "length";

/// A whole (not streamed) completion.
fn parse_completion(bytes: &[u8]) -> Result<ModelReply, ModelError> {
    let completion: Completion = serde_json::from_slice(bytes)
        .map_err(|e| ModelError::Malformed(format!("not a chat completion: {e}")))?;
    let choice = completion
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| ModelError::Malformed("a completion without choices".into()))?;
    if choice.finish_reason.as_deref() == Some(LENGTH) && choice.message.has_tool_calls() {
        return Err(ModelError::Truncated);
    }
    Ok(ModelReply {
        message: choice.message,
        usage: completion.usage,
        finish_reason: choice.finish_reason,
    })
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default, deserialize_with = "crate::message::null_as_default")]
    choices: Vec<ChunkChoice>,
    #[serde(default)]
    usage: Option<Usage>,
    /// An error event in the stream (vLLM's `{"error": {...}}`, or an `"object": "error"`
    /// chunk with its `message`).
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    object: Option<String>,
    #[serde(default)]
    message: Option<Value>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default, deserialize_with = "crate::message::null_as_default")]
    delta: Delta,
    /// Set on the choice's last chunk.
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default, deserialize_with = "crate::message::null_as_default")]
    tool_calls: Vec<CallDelta>,
}

#[derive(Deserialize)]
struct CallDelta {
    #[serde(default)]
    index: Option<usize>,
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
    /// Each call's id, name and arguments, in the order the calls first appeared.
    calls: Vec<(String, String, String)>,
    /// The call each delta index is assembling now (a server that numbers every call 0 and
    /// tells them apart by id moves an index on to a new call).
    by_index: std::collections::BTreeMap<usize, usize>,
    usage: Option<Usage>,
    /// The last finish reason a chunk gave.
    finish_reason: Option<String>,
    done: bool,
}

/// What a stream's `data:` line said, besides its deltas.
enum LineOutcome {
    /// Go on reading.
    More,
    /// The server reported an error in the stream.
    Error(String),
}

impl Assembly {
    /// Applies one `data:` line; `Err` for a line that is not a chunk.
    fn line(&mut self, data: &str) -> Result<LineOutcome, ModelError> {
        if data == "[DONE]" {
            self.done = true;
            return Ok(LineOutcome::More);
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| ModelError::Malformed(format!("not a completion chunk: {e}")))?;
        if let Some(error) = &chunk.error {
            let message = error["message"]
                .as_str()
                .map_or_else(|| error.to_string(), str::to_owned);
            return Ok(LineOutcome::Error(
                message.chars().take(MESSAGE_CHARS).collect(),
            ));
        }
        if chunk.object.as_deref() == Some("error") {
            let message = chunk.message.as_ref().map_or_else(String::new, |m| {
                m.as_str().map_or_else(|| m.to_string(), str::to_owned)
            });
            return Ok(LineOutcome::Error(
                message.chars().take(MESSAGE_CHARS).collect(),
            ));
        }
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        for choice in chunk.choices {
            if let Some(text) = choice.delta.content {
                self.content.get_or_insert_with(String::new).push_str(&text);
            }
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason);
            }
            for call in choice.delta.tool_calls {
                let (name, arguments) = call
                    .function
                    .map_or((None, None), |f| (f.name, f.arguments));
                let name = name.filter(|name| !name.is_empty());
                let slot = self.slot(call.index, call.id.as_deref(), name.as_deref())?;
                let slot = &mut self.calls[slot];
                // The first id is the call's: a server that sends a new id with every
                // fragment (LM Studio) does not rename the call.
                if slot.0.is_empty() {
                    if let Some(id) = call.id.filter(|id| !id.is_empty()) {
                        slot.0 = id;
                    }
                }
                // A name is set once, and a fragment of it appended; the whole name again
                // (servers that repeat it in every delta) adds nothing.
                if let Some(name) = name {
                    if slot.1.is_empty() {
                        slot.1 = name;
                    } else if slot.1 != name {
                        slot.1.push_str(&name);
                    }
                }
                if let Some(args) = arguments {
                    slot.2.push_str(&args);
                }
            }
        }
        Ok(LineOutcome::More)
    }

    /// The call a delta of `index` (and `id`, if it has one) adds to: the one its index is
    /// assembling — unless there is none yet, or the delta names another id and the call
    /// assembled is whole (its arguments a complete JSON document: servers that send whole
    /// calls, all at index 0) or the delta names another function (`name`): then a new
    /// call. A fragment with another id of a call still incomplete goes on with it (servers
    /// that send a new id with every fragment). A delta without an index adds to the call
    /// of its id, else to the last call, by the same rule.
    fn slot(
        &mut self,
        index: Option<usize>,
        id: Option<&str>,
        name: Option<&str>,
    ) -> Result<usize, ModelError> {
        let id = id.filter(|id| !id.is_empty());
        let current = match index {
            Some(index) => self.by_index.get(&index).copied(),
            None => id
                .and_then(|id| self.calls.iter().position(|c| c.0 == id))
                .or_else(|| self.calls.len().checked_sub(1)),
        };
        if let Some(slot) = current {
            let (old_id, old_name, old_arguments) = &self.calls[slot];
            let other_id = id.is_some_and(|new| !old_id.is_empty() && old_id != new);
            let other_name = name.is_some_and(|new| !old_name.is_empty() && old_name != new);
            if !(other_id && (is_whole_json(old_arguments) || other_name)) {
                return Ok(slot);
            }
        }
        if self.calls.len() == MAX_STREAMED_TOOL_CALLS {
            return Err(ModelError::Malformed(format!(
                "a streamed answer with more than {MAX_STREAMED_TOOL_CALLS} tool calls"
            )));
        }
        self.calls.push(Default::default());
        let slot = self.calls.len() - 1;
        self.by_index.insert(index.unwrap_or(usize::MAX), slot);
        Ok(slot)
    }

    fn finish(self) -> Result<ModelReply, ModelError> {
        if self.finish_reason.as_deref() == Some(LENGTH) && !self.calls.is_empty() {
            return Err(ModelError::Truncated);
        }
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
        Ok(ModelReply {
            message: AssistantMessage {
                content: self.content,
                tool_calls,
            },
            usage: self.usage,
            finish_reason: self.finish_reason,
        })
    }
}

/// Reads a streamed answer (server-sent events of chunks, ending with `data: [DONE]`), at
/// most `limit` bytes of it.
async fn read_stream(response: reqwest::Response, limit: usize) -> Attempt {
    let mut body = response.bytes_stream();
    let mut buffer: Vec<u8> = Vec::new();
    // How far `buffer` is known to hold no line end, and how much was read in all.
    let (mut scanned, mut read) = (0, 0_usize);
    let mut assembly = Assembly::default();
    loop {
        while let Some(found) = buffer[scanned..].iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=scanned + found).collect();
            scanned = 0;
            let Ok(line) = std::str::from_utf8(&line) else {
                return Attempt::Fail(ModelError::Malformed("a stream that is not UTF-8".into()));
            };
            if let Some(data) = line.trim_end().strip_prefix("data:") {
                match assembly.line(data.trim()) {
                    Err(e) => return Attempt::Fail(e),
                    Ok(LineOutcome::Error(message)) => {
                        return Attempt::Retry(
                            ModelError::Stream {
                                attempts: 0,
                                message,
                            },
                            None,
                        )
                    }
                    Ok(LineOutcome::More) => {}
                }
                if assembly.done {
                    return match assembly.finish() {
                        Ok(reply) => Attempt::Answer(reply),
                        Err(e) => Attempt::Fail(e),
                    };
                }
            }
        }
        scanned = buffer.len();
        match body.next().await {
            Some(Ok(bytes)) => {
                read = read.saturating_add(bytes.len());
                if read > limit {
                    return Attempt::Fail(over_limit(limit));
                }
                buffer.extend_from_slice(&bytes);
            }
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

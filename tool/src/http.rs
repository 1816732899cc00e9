//! An HTTP POST tool built on `reqwest` (rustls, no OpenSSL).

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::Url;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{arguments::decode_arguments, error::ToolError, info::ToolInfo, tool::Tool};

/// How many characters of a response body a [`ToolError::Http`] keeps.
pub const BODY_EXCERPT_CHARS: usize = 512;

/// The arguments of an [`HttpPostTool`] call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PostRequest {
    /// The URL to send the POST request to (http or https).
    pub url: String,
    /// The body to send in the POST request.
    pub body: String,
}

/// How many redirects a request follows at most.
pub const MAX_REDIRECTS: usize = 10;

/// The configuration of an [`HttpPostTool`].
///
/// Its `Debug` output names the headers but not their values (they often carry keys).
/// ```
/// use std::time::Duration;
/// use dtask_tool::HttpPostConfig;
///
/// let config = HttpPostConfig::default()
///     .with_header("Content-Type", "application/json; charset=UTF-8")
///     .with_timeout(Duration::from_secs(5))
///     .with_allowed_url_prefix("https://api.example.com/");
/// assert_eq!(config.name, "http_post");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct HttpPostConfig {
    /// The tool name (default `http_post`).
    pub name: String,
    /// The tool description shown to the model.
    pub description: String,
    /// Headers sent with every request.
    pub headers: Vec<(String, String)>,
    /// Time limit for a whole request, body included (default 30 s).
    pub timeout: Duration,
    /// The largest response body accepted (default 1 MiB).
    pub max_response_bytes: usize,
    /// If not empty, only URLs within one of these prefixes may be requested
    /// (and redirected to); others are rejected as invalid arguments without
    /// any network access. Empty (the default) allows any URL.
    ///
    /// A prefix is a URL, compared by its parts, not as text: a URL is within
    /// it when its scheme, host and port are the prefix's and its path is the
    /// prefix's path or below it (`https://api.example.com/v1` allows
    /// `https://api.example.com/v1/chat`, not `…/v10`, nor
    /// `https://api.example.com.evil.net/`, nor
    /// `https://api.example.com@evil.net/`). A prefix with a query or a
    /// fragment is refused at [`HttpPostTool::new`].
    pub allowed_url_prefixes: Vec<String>,
}

impl std::fmt::Debug for HttpPostConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(name, _)| (name.as_str(), "<redacted>"))
            .collect();
        f.debug_struct("HttpPostConfig")
            .field("name", &self.name)
            .field("description", &self.description)
            .field("headers", &headers)
            .field("timeout", &self.timeout)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("allowed_url_prefixes", &self.allowed_url_prefixes)
            .finish()
    }
}

impl Default for HttpPostConfig {
    fn default() -> Self {
        Self {
            name: "http_post".to_owned(),
            description: "Send an HTTP POST request with the given body to a URL and return the response body.".to_owned(),
            headers: Vec::new(),
            timeout: Duration::from_secs(30),
            max_response_bytes: 1024 * 1024,
            allowed_url_prefixes: Vec::new(),
        }
    }
}

impl HttpPostConfig {
    /// Sets the tool name.
    #[must_use]
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the tool description.
    #[must_use]
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// Adds a header sent with every request.
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sets the time limit of a request.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the largest accepted response body.
    #[must_use]
    pub fn with_max_response_bytes(mut self, max: usize) -> Self {
        self.max_response_bytes = max;
        self
    }

    /// Allows URLs starting with `prefix` (once any prefix is set, all other
    /// URLs are rejected).
    #[must_use]
    pub fn with_allowed_url_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.allowed_url_prefixes.push(prefix.into());
        self
    }
}

/// A tool that POSTs a body to a URL and returns the response body as text
/// (the seed's `httprequest/post` tool).
///
/// Its arguments are a [`PostRequest`] (`{"url": ..., "body": ...}`, schema
/// inferred). The configured headers are sent with every request. Results:
///
/// * a 2xx response: its body, as text (not JSON-quoted);
/// * any other status: [`ToolError::Http`] with the status and the first
///   [`BODY_EXCERPT_CHARS`] characters of the body;
/// * the time limit exceeded: [`ToolError::Timeout`];
/// * a URL that cannot be parsed or is not allowed:
///   [`ToolError::InvalidArguments`] at path `url`;
/// * any other transport failure, or a body over the size limit:
///   [`ToolError::Failed`].
///
/// Redirects are followed (at most [`MAX_REDIRECTS`]) only within the first
/// URL's origin (scheme, host, port) and the allowed prefixes: a redirect
/// elsewhere is answered as it came, a [`ToolError::Http`] with its 3xx
/// status — the body and the configured headers never go to another host.
#[derive(Clone)]
pub struct HttpPostTool {
    info: ToolInfo,
    client: reqwest::Client,
    config: HttpPostConfig,
    /// The allowed prefixes, parsed.
    allowed: Arc<Vec<Url>>,
}

impl std::fmt::Debug for HttpPostTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpPostTool")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Whether `url` is within the allowed prefix `prefix` (see
/// [`HttpPostConfig::allowed_url_prefixes`]).
fn within(prefix: &Url, url: &Url) -> bool {
    let path_within = match url.path().strip_prefix(prefix.path()) {
        None => false,
        Some(rest) => prefix.path().ends_with('/') || rest.is_empty() || rest.starts_with('/'),
    };
    same_origin(prefix, url) && path_within
}

fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// Whether `url` may be requested under the allowed prefixes `allowed`.
fn allowed_by(allowed: &[Url], url: &Url) -> bool {
    allowed.is_empty() || allowed.iter().any(|prefix| within(prefix, url))
}

impl HttpPostTool {
    /// Builds the tool and its HTTP client.
    ///
    /// # Errors
    ///
    /// [`ToolError::Config`] for an invalid header name or value, an allowed
    /// prefix that is not a URL (or has a query or a fragment), or if the
    /// HTTP client cannot be built.
    pub fn new(config: HttpPostConfig) -> Result<Self, ToolError> {
        let config_error = |message: String| ToolError::Config {
            tool: config.name.clone(),
            message,
        };
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let header_name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| config_error(format!("invalid header name `{name}`: {e}")))?;
            let mut header_value = HeaderValue::from_str(value)
                .map_err(|e| config_error(format!("invalid value for header `{name}`: {e}")))?;
            header_value.set_sensitive(true);
            headers.append(header_name, header_value);
        }
        let mut allowed = Vec::with_capacity(config.allowed_url_prefixes.len());
        for prefix in &config.allowed_url_prefixes {
            let url = Url::parse(prefix)
                .map_err(|e| config_error(format!("allowed URL prefix `{prefix}`: {e}")))?;
            if url.query().is_some() || url.fragment().is_some() {
                return Err(config_error(format!(
                    "allowed URL prefix `{prefix}`: a prefix has no query or fragment"
                )));
            }
            allowed.push(url);
        }
        let allowed = Arc::new(allowed);
        let policy = {
            let allowed = Arc::clone(&allowed);
            reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() > MAX_REDIRECTS {
                    return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
                }
                let onward = attempt
                    .previous()
                    .first()
                    .is_some_and(|first| same_origin(first, attempt.url()))
                    && allowed_by(&allowed, attempt.url());
                if onward {
                    attempt.follow()
                } else {
                    attempt.stop()
                }
            })
        };
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .timeout(config.timeout)
            .redirect(policy)
            .build()
            .map_err(|e| config_error(format!("cannot build the HTTP client: {e}")))?;
        let info = ToolInfo::infer::<PostRequest>(config.name.clone(), config.description.clone());
        Ok(Self {
            info,
            client,
            config,
            allowed,
        })
    }

    /// The tool's configuration.
    pub fn config(&self) -> &HttpPostConfig {
        &self.config
    }

    /// Sends `request` and returns the response body (what
    /// [`Tool::invoke`] does after decoding the arguments).
    ///
    /// # Errors
    ///
    /// As listed on [`HttpPostTool`].
    pub async fn post(&self, request: PostRequest) -> Result<String, ToolError> {
        let name = &self.config.name;
        let url = Url::parse(&request.url).map_err(|e| {
            ToolError::invalid_arguments(name, "url", format!("`{}`: {e}", request.url))
        })?;
        if !allowed_by(&self.allowed, &url) {
            return Err(ToolError::invalid_arguments(
                name,
                "url",
                format!("URL `{}` is not allowed for this tool", request.url),
            ));
        }
        let mut response = self
            .client
            .post(url)
            .body(request.body)
            .send()
            .await
            .map_err(|e| self.request_error(&e))?;
        let status = response.status();
        let limit = self.config.max_response_bytes;
        let mut body = Vec::new();
        let mut truncated = false;
        while let Some(chunk) = response.chunk().await.map_err(|e| self.request_error(&e))? {
            let room = limit.saturating_sub(body.len());
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        let text = String::from_utf8_lossy(&body).into_owned();
        if !status.is_success() {
            return Err(ToolError::Http {
                tool: name.clone(),
                status: status.as_u16(),
                body_excerpt: text.chars().take(BODY_EXCERPT_CHARS).collect(),
            });
        }
        if truncated {
            return Err(ToolError::failed(
                name,
                format!("the response body is larger than the limit of {limit} bytes"),
            ));
        }
        Ok(text)
    }

    fn request_error(&self, error: &reqwest::Error) -> ToolError {
        let name = &self.config.name;
        if error.is_timeout() {
            ToolError::Timeout {
                tool: name.clone(),
                timeout: self.config.timeout,
            }
        } else if error.is_builder() {
            ToolError::invalid_arguments(name, "url", error_chain(error))
        } else {
            ToolError::failed(name, error_chain(error))
        }
    }
}

/// The error and its sources, joined (reqwest's own message is terse).
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

#[async_trait]
impl Tool for HttpPostTool {
    fn info(&self) -> ToolInfo {
        self.info.clone()
    }

    async fn invoke(&self, arguments: &str) -> Result<String, ToolError> {
        let request: PostRequest = decode_arguments(&self.config.name, arguments)?;
        self.post(request).await
    }
}

//! The bearer token: when the server has one, every request must carry it, as
//! `Authorization: Bearer <token>` or (for the browser, which cannot set headers on page loads
//! and `EventSource`) the `dtask_token` cookie that `GET /?token=<token>` sets.
//!
//! `/healthz` and `/readyz` answer without it (they tell only the names of states).
//!
//! Tokens are compared in constant time over their BLAKE3 digests, so neither the content nor
//! the length of the expected token leaks through timing.

use super::ApiError;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 16;

/// The cookie that carries the token for the web page.
pub const COOKIE: &str = "dtask_token";

/// The expected token, kept as its digest.
#[derive(Debug, Clone)]
pub struct Token {
    digest: [u8; 32],
}

impl Token {
    /// The token `secret`.
    pub fn new(secret: &str) -> Self {
        Self {
            digest: *blake3::hash(secret.as_bytes()).as_bytes(),
        }
    }

    /// Whether `candidate` is the token (constant time).
    pub fn matches(&self, candidate: &str) -> bool {
        let digest = blake3::hash(candidate.as_bytes());
        self.digest.ct_eq(digest.as_bytes()).into()
    }
}

/// The token a request carries: the bearer header, else the cookie.
fn presented(request: &Request) -> Option<String> {
    let headers = request.headers();
    if let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        return value.strip_prefix("Bearer ").map(str::to_owned);
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == COOKIE).then(|| value.to_owned())
        })
}

/// The `token` query parameter of a page load, if any.
fn query_token(request: &Request) -> Option<String> {
    request.uri().query()?.split('&').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        (name == "token").then(|| percent_decode(value))
    })
}

/// Decodes `%XX` escapes (and `+` as a space) of a query value.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..=i + 2]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Middleware: refuses a request without the token (401 `unauthorized`). `GET /?token=…`
/// with the right token sets the cookie and redirects to `/`.
pub async fn require(
    State(token): State<Option<Arc<Token>>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = token else {
        return next.run(request).await;
    };
    if super::health::OPEN_PATHS.contains(&request.uri().path()) {
        // Liveness and readiness tell only the names of states: an orchestrator's probe
        // need not hold the token.
        return next.run(request).await;
    }
    if request.uri().path() == "/" {
        if let Some(given) = query_token(&request) {
            if token.matches(&given) {
                let cookie = format!("{COOKIE}={given}; Path=/; HttpOnly; SameSite=Strict");
                return (
                    StatusCode::SEE_OTHER,
                    [
                        (header::LOCATION, "/".to_owned()),
                        (header::SET_COOKIE, cookie),
                    ],
                )
                    .into_response();
            }
        }
    }
    match presented(&request) {
        Some(given) if token.matches(&given) => next.run(request).await,
        _ => {
            let mut response = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this server needs its token: `Authorization: Bearer <token>` (or open \
                 /?token=<token> in a browser)",
            )
            .into_response();
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            response
        }
    }
}

/// Whether `host` (a `Host` header's value, port included or not) names this machine's
/// loopback: `localhost`, `127.x.x.x` or `[::1]`.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // `[::1]:7700`
        rest.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Middleware: refuses what a browser sends for another site (403 `forbidden_origin`).
///
/// - A request that changes something (any method but `GET`, `HEAD`, `OPTIONS`) whose
///   `Origin` is not the server's own (its host and port those of `Host`; with a token,
///   a request the browser marks `Sec-Fetch-Site: same-origin` is the server's own page
///   whatever `Host` a proxy passed), or that the
///   browser marks as coming from another site (`Sec-Fetch-Site` other than `same-origin`
///   or `none`): a page elsewhere could otherwise post to a server on the user's loopback
///   (an empty body needs no `Content-Type`, so no preflight asks first).
/// - Without a token (the server is then on loopback only), a request whose `Host` is not
///   a loopback name: a page of a name made to resolve to 127.0.0.1 (DNS rebinding) would
///   otherwise be the server's own origin, and read and drive it.
///
/// Clients other than browsers (curl, the CLI, services) send neither header: they are not
/// concerned.
pub async fn same_origin(
    State(token): State<Option<Arc<Token>>>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let host = text(header::HOST).unwrap_or_default();
    let refused =
        |why: String| ApiError::new(StatusCode::FORBIDDEN, "forbidden_origin", why).into_response();
    if token.is_none() && !host.is_empty() && !is_loopback_host(host) {
        return refused(format!(
            "a server without a token answers its loopback names only, not {host:?} (give it \
             a token to serve other names)"
        ));
    }
    let safe = matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::OPTIONS
    );
    if !safe {
        let site = text(header::HeaderName::from_static("sec-fetch-site"));
        // With a token, the browser's own word that the page is the server's suffices: behind
        // a proxy that passes another `Host`, `Origin` (the public name) cannot match it. (A
        // page of a rebinding name is same-origin too, but holds no token: its requests are
        // refused as any.)
        let same_site_said = token.is_some() && site == Some("same-origin");
        if let Some(origin) = text(header::ORIGIN) {
            let own = origin
                .split_once("://")
                .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host));
            if !own && !same_site_said {
                return refused(format!(
                    "a request from {origin:?} may not change anything here (only the \
                     server's own pages may)"
                ));
            }
        }
        if site.is_some_and(|s| s != "same-origin" && s != "none") {
            return refused("a request from another site may not change anything here".into());
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::is_loopback_host;

    #[test]
    fn loopback_names_with_and_without_ports() {
        for host in [
            "localhost",
            "LOCALHOST:7700",
            "127.0.0.1",
            "127.0.0.1:7700",
            "127.9.9.9:1",
            "[::1]",
            "[::1]:7700",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:7700",
            "10.0.0.1:7700",
            "[::2]:7700",
            "localhost.evil.example",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}

//! The web page: one HTML file, a script and a style sheet, embedded in the binary with
//! `include_str!` (no CDN, no build step). See docs/server.md for why.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/style.css");

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `GET /`: the page.
pub async fn index() -> Response {
    let mut response = asset("text/html; charset=utf-8", INDEX);
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; frame-ancestors 'none'",
        ),
    );
    response
}

/// `GET /assets/app.js`.
pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /assets/style.css`.
pub async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

/// `GET /favicon.ico`: none (204), so browsers do not log a 404.
pub async fn favicon() -> axum::http::StatusCode {
    axum::http::StatusCode::NO_CONTENT
}

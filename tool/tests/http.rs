//! The HTTP POST tool against a real server on 127.0.0.1.
#![allow(clippy::unwrap_used)]

use std::{
    net::SocketAddr,
    sync::atomic::{AtomicUsize, Ordering},
    sync::Arc,
    time::Duration,
};

use axum::{http::HeaderMap, http::StatusCode, routing::post, Router};
use dtask_tool::{
    parameters_schema, HttpPostConfig, HttpPostTool, PostRequest, Tool, ToolError,
    BODY_EXCERPT_CHARS,
};
use serde_json::json;

async fn echo(headers: HeaderMap, body: String) -> String {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    json!({
        "user_agent": header("user-agent"),
        "content_type": header("content-type"),
        "body": body,
    })
    .to_string()
}

async fn fail() -> (StatusCode, String) {
    (StatusCode::SERVICE_UNAVAILABLE, "é".repeat(2000))
}

async fn slow() -> &'static str {
    tokio::time::sleep(Duration::from_secs(60)).await;
    "too late"
}

async fn big() -> String {
    "x".repeat(4096)
}

/// Starts the test server on a free loopback port.
async fn serve() -> SocketAddr {
    let app = Router::new()
        .route("/echo", post(echo))
        .route("/fail", post(fail))
        .route("/slow", post(slow))
        .route("/big", post(big));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn arguments(url: &str, body: &str) -> String {
    serde_json::to_string(&json!({ "url": url, "body": body })).unwrap()
}

fn tool(config: HttpPostConfig) -> HttpPostTool {
    HttpPostTool::new(config).unwrap()
}

#[tokio::test]
async fn posts_the_body_with_configured_headers() {
    let addr = serve().await;
    let tool = tool(
        HttpPostConfig::default()
            .with_header("User-Agent", "MyCustomAgent")
            .with_header("Content-Type", "application/json; charset=UTF-8"),
    );
    let info = tool.info();
    assert_eq!(info.name, "http_post");
    assert_eq!(info.parameters, parameters_schema::<PostRequest>());
    assert_eq!(info.parameters["required"], json!(["url", "body"]));

    let out = tool
        .invoke(&arguments(
            &format!("http://{addr}/echo"),
            r#"{"hello":"world"}"#,
        ))
        .await
        .unwrap();
    let echoed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        echoed,
        json!({
            "user_agent": "MyCustomAgent",
            "content_type": "application/json; charset=UTF-8",
            "body": r#"{"hello":"world"}"#,
        })
    );
}

#[tokio::test]
async fn error_status_carries_status_and_body_excerpt() {
    let addr = serve().await;
    let err = tool(HttpPostConfig::default().with_name("poster"))
        .invoke(&arguments(&format!("http://{addr}/fail"), ""))
        .await
        .unwrap_err();
    match err {
        ToolError::Http {
            tool,
            status,
            body_excerpt,
        } => {
            assert_eq!(tool, "poster");
            assert_eq!(status, 503);
            assert_eq!(body_excerpt, "é".repeat(BODY_EXCERPT_CHARS));
        }
        other => panic!("unexpected error: {other:?}"),
    }
}

#[tokio::test]
async fn timeout_is_reported() {
    let addr = serve().await;
    let limit = Duration::from_millis(200);
    let err = tool(HttpPostConfig::default().with_timeout(limit))
        .invoke(&arguments(&format!("http://{addr}/slow"), ""))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ToolError::Timeout { tool, timeout } if tool == "http_post" && *timeout == limit),
        "{err:?}"
    );
}

#[tokio::test]
async fn oversized_response_is_rejected() {
    let addr = serve().await;
    let err = tool(HttpPostConfig::default().with_max_response_bytes(1024))
        .invoke(&arguments(&format!("http://{addr}/big"), ""))
        .await
        .unwrap_err();
    assert!(matches!(&err, ToolError::Failed { .. }), "{err:?}");
    assert!(err.to_string().contains("1024 bytes"), "{err}");
    // Within the limit it is fine.
    let out = tool(HttpPostConfig::default())
        .post(PostRequest {
            url: format!("http://{addr}/big"),
            body: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(out.len(), 4096);
}

#[tokio::test]
async fn bad_arguments_and_urls_are_invalid_arguments() {
    let tool = tool(HttpPostConfig::default());
    let err = tool.invoke(r#"{"url": 5, "body": ""}"#).await.unwrap_err();
    assert!(
        matches!(&err, ToolError::InvalidArguments { tool, path, .. } if tool == "http_post" && path == "url"),
        "{err:?}"
    );
    let err = tool
        .invoke(r#"{"url": "http://127.0.0.1:1/"}"#)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ToolError::InvalidArguments { message, .. } if message.contains("missing field `body`")),
        "{err:?}"
    );
    let err = tool.invoke(&arguments("not a url", "")).await.unwrap_err();
    assert!(
        matches!(&err, ToolError::InvalidArguments { path, .. } if path == "url"),
        "{err:?}"
    );
}

#[tokio::test]
async fn url_allow_list_is_enforced_before_any_request() {
    let addr = serve().await;
    let allowed = format!("http://{addr}/echo");
    let tool = tool(HttpPostConfig::default().with_allowed_url_prefix(allowed.clone()));
    assert!(tool.invoke(&arguments(&allowed, "ok")).await.is_ok());
    let err = tool
        .invoke(&arguments(&format!("http://{addr}/fail"), ""))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ToolError::InvalidArguments { path, message, .. } if path == "url" && message.contains("not allowed")),
        "{err:?}"
    );
}

#[tokio::test]
async fn connection_failure_is_failed() {
    // A port that was just free: nothing listens there.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let err = tool(HttpPostConfig::default())
        .invoke(&arguments(&format!("http://{addr}/"), ""))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ToolError::Failed { tool, .. } if tool == "http_post"),
        "{err:?}"
    );
}

#[test]
fn invalid_header_is_a_config_error() {
    let err =
        HttpPostTool::new(HttpPostConfig::default().with_header("bad header", "v")).unwrap_err();
    assert!(
        matches!(&err, ToolError::Config { tool, message } if tool == "http_post" && message.contains("bad header")),
        "{err:?}"
    );
}

/// A server whose `/away` redirects (307, the POST kept) to `target`, whose `/hop` redirects
/// to its own `/echo`, and which counts the requests it serves.
async fn redirecting(target: String) -> (SocketAddr, Arc<AtomicUsize>) {
    let served = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&served);
    let app = Router::new()
        .route(
            "/away",
            post(move || {
                let target = target.clone();
                async move {
                    (
                        StatusCode::TEMPORARY_REDIRECT,
                        [(axum::http::header::LOCATION, target)],
                    )
                }
            }),
        )
        .route(
            "/hop",
            post(|| async {
                (
                    StatusCode::TEMPORARY_REDIRECT,
                    [(axum::http::header::LOCATION, "/echo")],
                )
            }),
        )
        .route("/echo", post(echo))
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                counter.fetch_add(1, Ordering::SeqCst);
                next.run(request)
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, served)
}

// A redirect to another origin is not followed: the body and the configured headers (a key,
// say) never reach the other host, and the call answers the redirect's status. Within the
// origin a redirect is followed.
#[tokio::test]
async fn redirects_are_followed_only_within_the_origin() {
    let (elsewhere, elsewhere_served) = redirecting(String::new()).await;
    let (addr, _) = redirecting(format!("http://{elsewhere}/echo")).await;
    let tool = tool(HttpPostConfig::default().with_header("X-Api-Key", "secret-key"));
    let err = tool
        .invoke(&arguments(&format!("http://{addr}/away"), "private"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ToolError::Http { status: 307, .. }),
        "{err:?}"
    );
    assert_eq!(elsewhere_served.load(Ordering::SeqCst), 0);
    let out = tool
        .invoke(&arguments(&format!("http://{addr}/hop"), "kept"))
        .await
        .unwrap();
    let echoed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(echoed["body"], "kept");
}

// An allowed prefix is a URL compared by its parts: another host that starts with the same
// text, credentials that make the host another, a longer last segment and a path that climbs
// out are all refused before any request.
#[tokio::test]
async fn allowed_prefixes_compare_urls_by_their_parts() {
    let (addr, served) = redirecting(String::new()).await;
    let tool = tool(HttpPostConfig::default().with_allowed_url_prefix(format!("http://{addr}/ec")));
    for url in [
        format!("http://{addr}/echo"),
        format!("http://{addr}.example/ec"),
        format!("http://{addr}@127.0.0.2:{}/ec", addr.port()),
        format!("http://{addr}/ec/../hop"),
    ] {
        let err = tool.invoke(&arguments(&url, "")).await.unwrap_err();
        assert!(
            matches!(&err, ToolError::InvalidArguments { path, .. } if path == "url"),
            "{url}: {err:?}"
        );
    }
    assert_eq!(served.load(Ordering::SeqCst), 0);
    // Within the prefix (a segment below it): allowed, and the request is made.
    let err = tool
        .invoke(&arguments(&format!("http://{addr}/ec/x"), ""))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ToolError::Http { status: 404, .. }),
        "{err:?}"
    );
    assert_eq!(served.load(Ordering::SeqCst), 1);
    // A redirect out of the allowed prefixes is not followed either.
    let hop = HttpPostTool::new(
        HttpPostConfig::default().with_allowed_url_prefix(format!("http://{addr}/hop")),
    )
    .unwrap();
    let err = hop
        .invoke(&arguments(&format!("http://{addr}/hop"), ""))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ToolError::Http { status: 307, .. }),
        "{err:?}"
    );
}

#[test]
fn header_values_stay_out_of_debug_output_and_bad_prefixes_are_refused() {
    let config = HttpPostConfig::default().with_header("Authorization", "Bearer secret-key");
    let tool = HttpPostTool::new(config.clone()).unwrap();
    for shown in [format!("{config:?}"), format!("{tool:?}")] {
        assert!(!shown.contains("secret-key"), "{shown}");
        assert!(shown.contains("Authorization"), "{shown}");
    }
    for prefix in ["not a url", "https://api.example.com/v1?key=1"] {
        let err = HttpPostTool::new(HttpPostConfig::default().with_allowed_url_prefix(prefix))
            .unwrap_err();
        assert!(
            matches!(&err, ToolError::Config { .. }),
            "{prefix}: {err:?}"
        );
    }
}

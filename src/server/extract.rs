//! Extractors whose rejections are [`ApiError`]s: JSON bodies (`deny_unknown_fields` types;
//! a body over the limit is a 413), query strings and path segments.

use super::ApiError;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use serde::de::DeserializeOwned;

/// A JSON body, required.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

/// A JSON body that may be absent (empty): then `T::default()`.
#[derive(Debug)]
pub struct OptionalJsonBody<T>(pub T);

/// A query string.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

/// Path segments.
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

async fn body_bytes<S: Send + Sync>(
    request: Request,
    state: &S,
) -> Result<(HeaderMap, Bytes), ApiError> {
    let headers = request.headers().clone();
    let bytes = Bytes::from_request(request, state)
        .await
        .map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    rejection.body_text(),
                )
            } else {
                ApiError::bad_request(rejection.body_text())
            }
        })?;
    Ok((headers, bytes))
}

fn parse<T: DeserializeOwned>(headers: &HeaderMap, bytes: &[u8]) -> Result<T, ApiError> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| {
            let v = v.trim();
            v.eq_ignore_ascii_case("application/json")
                || (v.starts_with("application/") && v.ends_with("+json"))
        });
    if !json {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "a JSON body needs `Content-Type: application/json`",
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body: {e}"),
        )
    })
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let (headers, bytes) = body_bytes(request, state).await?;
        if bytes.is_empty() {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                "a JSON body is required",
            ));
        }
        parse(&headers, &bytes).map(Self)
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptionalJsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let (headers, bytes) = body_bytes(request, state).await?;
        if bytes.is_empty() {
            return Ok(Self(T::default()));
        }
        parse(&headers, &bytes).map(Self)
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| Self(v))
            .map_err(ApiError::from)
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        // No id of the API may hold NUL (a task id's keys would be read as another task's).
        if parts.uri.path().to_ascii_lowercase().contains("%00") {
            return Err(ApiError::bad_request("a path segment holds NUL"));
        }
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(v)| Self(v))
            .map_err(ApiError::from)
    }
}

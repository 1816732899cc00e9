//! Opaque page cursors: base64url (no padding) of a small JSON object with a version field.

use super::error::{Result, StoreError};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A task-list cursor: `{v:1, s:status, k:sorted keys, l:last id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ListCursor {
    pub v: u32,
    pub s: String,
    pub k: Vec<String>,
    pub l: String,
}

/// A task-event cursor: `{v:1, t:task, s:snapshot end, p:position, n:newest first}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EventCursor {
    pub v: u32,
    pub t: String,
    pub s: u64,
    pub p: u64,
    pub n: bool,
}

pub(crate) fn encode<T: Serialize>(cursor: &T) -> String {
    // Serializing these plain structs cannot fail.
    let json = serde_json::to_vec(cursor).unwrap_or_default();
    URL_SAFE_NO_PAD.encode(json)
}

pub(crate) fn decode<T: DeserializeOwned>(cursor: &str) -> Result<T> {
    let bytes = URL_SAFE_NO_PAD
        .decode(cursor)
        .map_err(|e| StoreError::InvalidCursor(format!("not base64url: {e}")))?;
    serde_json::from_slice(&bytes).map_err(|e| StoreError::InvalidCursor(format!("malformed: {e}")))
}

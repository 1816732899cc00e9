//! Events and records as JSON values for the commands that print them (`events --json`,
//! `tail --json`), in the export format of `docs/export-format.md`, whose types live in
//! [`dtask_journal::export`].

use super::Result;
use dtask_journal::export::{EventJson, RecordJson};
use dtask_journal::{Event, Record};
use serde_json::Value;

pub use dtask_journal::export::ByteFields as Bytes;

/// How byte fields are written: redacted with `--no-payload`, else base64.
pub fn bytes(no_payload: bool) -> Bytes {
    if no_payload {
        Bytes::Redacted
    } else {
        Bytes::Base64
    }
}

/// The event as its JSON object: `{"type": "<event type>", <every field>}`.
pub fn event_json(event: &Event, bytes: Bytes) -> Result<Value> {
    Ok(serde_json::to_value(EventJson::new(event, bytes))?)
}

/// One record of `task` as its export line.
pub fn record_json(task: &str, record: &Record, bytes: Bytes) -> Result<Value> {
    Ok(serde_json::to_value(RecordJson::new(task, record, bytes))?)
}

//! What a managed tool call hands back to the model: the envelope record as the first text
//! part, and rich parts a result renderer adds to completed results.

use super::envelope::ResponseEvent;
use super::error::ToolFailure;
use dtask_journal::TaskSpec;
use std::sync::Arc;

/// One part of a tool result.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ResultPart {
    /// Text.
    Text(String),
    /// An image.
    Image {
        /// Its MIME type (`image/png`, …).
        mime_type: String,
        /// Its bytes.
        data: Vec<u8>,
    },
    /// A file, by path or URL.
    File {
        /// Where it is.
        uri: String,
        /// Its MIME type.
        mime_type: String,
    },
}

/// A tool result: the envelope record first, then rich parts (completed results only).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    /// The envelope record.
    pub envelope: ResponseEvent,
    /// Rich parts from the result renderer.
    pub parts: Vec<ResultPart>,
}

impl ToolResult {
    /// A result of one record.
    #[must_use]
    pub fn record(envelope: ResponseEvent) -> Self {
        Self {
            envelope,
            parts: Vec::new(),
        }
    }

    /// The record as one line (JSON and a newline): the first, text part of the result.
    #[must_use]
    pub fn text(&self) -> String {
        self.envelope.encode()
    }

    /// All parts, the record's line first.
    #[must_use]
    pub fn into_parts(self) -> Vec<ResultPart> {
        let mut parts = vec![ResultPart::Text(self.envelope.encode())];
        parts.extend(self.parts);
        parts
    }
}

/// Renders a completed result as rich parts, from the task's spec and result bytes. `Ok(None)`
/// is refused ("result renderer returned nil"); an error fails the model call, never the task.
pub type RenderFn =
    Arc<dyn Fn(&TaskSpec, &[u8]) -> Result<Option<Vec<ResultPart>>, ToolFailure> + Send + Sync>;

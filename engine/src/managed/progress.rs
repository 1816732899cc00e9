//! The progress reader: a bounded, model-friendly text of a task's recent updates.

use super::codec::{PLAIN_EXECUTOR_KEY, RECOVERABLE_EXECUTOR_KEY};
use crate::store::{StoreError, TaskStore};

/// The default number of updates read.
pub const DEFAULT_PROGRESS_EVENTS: usize = 20;
/// The most bytes of one update's content.
pub const MAX_PROGRESS_EVENT_BYTES: usize = 4096;
/// The most bytes of the whole text.
pub const MAX_PROGRESS_BYTES: usize = 16 * 1024;
const TRUNCATED_EVENT: &str = "...[truncated]";
const TRUNCATED_TEXT: &str = "\n[recent progress truncated]";
/// What the reader shows of an update whose bytes a trim dropped.
const TRIMMED_TEXT: &str = "(trimmed)";

/// Reads recent progress of managed-tool tasks. Read-only: it never changes task state.
#[derive(Debug, Clone)]
pub struct ProgressReader {
    store: TaskStore,
    limit: usize,
}

fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{TRUNCATED_EVENT}", &text[..end])
}

impl ProgressReader {
    /// A reader of the newest `limit` updates (0 or less means 20; the store caps large values).
    #[must_use]
    pub fn new(store: TaskStore, limit: i64) -> Self {
        let limit = if limit <= 0 {
            DEFAULT_PROGRESS_EVENTS
        } else {
            store.config().page(limit)
        };
        Self { store, limit }
    }

    /// The task's recent progress, oldest to newest under a `Recent progress:` header; empty
    /// for a task without updates or one that is not a managed-tool task.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown task, journal errors.
    pub async fn read(&self, task_id: &str) -> Result<String, StoreError> {
        let task = self.store.get(task_id).await?;
        let key = task.spec.executor_key.as_str();
        if key != PLAIN_EXECUTOR_KEY && key != RECOVERABLE_EXECUTOR_KEY {
            return Ok(String::new());
        }
        let page = self
            .store
            .list_updates(
                task_id,
                None,
                i64::try_from(self.limit).unwrap_or(i64::MAX),
                true,
            )
            .await?;
        if page.updates.is_empty() {
            return Ok(String::new());
        }
        let mut text = String::from("Recent progress:");
        for update in page.updates.iter().rev() {
            let kind = if update.kind.is_empty() {
                "update"
            } else {
                &update.kind
            };
            let content = if update.trimmed {
                // Its bytes were dropped by a trim (`TaskStore::trim_progress`).
                TRIMMED_TEXT.to_owned()
            } else if !update.data.is_empty() {
                cut(
                    &String::from_utf8_lossy(&update.data),
                    MAX_PROGRESS_EVENT_BYTES,
                )
            } else if !update.metadata.is_empty() {
                let map: std::collections::BTreeMap<_, _> =
                    update.metadata.iter().cloned().collect();
                serde_json::to_string(&map).unwrap_or_default()
            } else {
                String::new()
            };
            let line = if content.is_empty() {
                format!("\n[{kind}]")
            } else {
                format!("\n[{kind}] {content}")
            };
            if text.len() + line.len() > MAX_PROGRESS_BYTES {
                text.push_str(TRUNCATED_TEXT);
                break;
            }
            text.push_str(&line);
        }
        Ok(text)
    }
}

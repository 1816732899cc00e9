//! The model-facing response envelope: one JSON record per line.
//!
//! A record is a [`ResponseEvent`], whose variants carry exactly what their record type may
//! carry, so an illegal record cannot be built. Keys appear in the order `type, task_id, status,
//! description, output, error, input_request, update`; every key but `type` is omitted when
//! empty. JSON escaping guarantees a record never contains a raw newline, so update data
//! cannot forge a lifecycle record.

use super::codec::{read_input_request, InputRequest};
use super::error::EnvelopeError;
use super::tool::Update;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use dtask_replay::{Status, TaskState};
use serde::{Serialize, Serializer};
use std::collections::BTreeMap;

/// The kind of a record: its `type` key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EnvelopeType {
    /// A progress update (first emissions only).
    Update,
    /// A background task was launched (or its state is reported): carries its task id.
    LaunchResult,
    /// The call finished in the foreground: nothing was published.
    ForegroundResult,
}

/// An update as the model sees it (data base64).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EnvelopeUpdate {
    /// The event id, when the tool supplied one.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub event_id: String,
    /// The kind.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// The data, base64.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub data: String,
    /// The metadata.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// One record of the envelope.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseEvent {
    /// A progress update (first emissions only).
    Update {
        /// The update.
        update: EnvelopeUpdate,
    },
    /// A background task carries the call (or its state is reported).
    LaunchResult {
        /// The task id.
        task_id: String,
        /// The task's status and description.
        #[serde(flatten)]
        result: CallResult,
        /// The inputs sent to the task while it ran, and how many it has read (omitted when
        /// none was sent).
        #[serde(skip_serializing_if = "Option::is_none")]
        inputs: Option<InputCounts>,
    },
    /// The call finished in the foreground: no task was published.
    ForegroundResult {
        /// The call's status and description.
        #[serde(flatten)]
        result: CallResult,
    },
}

/// How many inputs a task's mailbox received, and how many of them its runs have read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct InputCounts {
    /// The inputs sent to the task.
    pub received: u64,
    /// The inputs its runs have read (consumed).
    pub read: u64,
}

/// A result record's body: the status, with what goes with it, and the task description.
#[derive(Debug, Clone, PartialEq)]
pub struct CallResult {
    /// The status and what goes with it.
    pub status: ResultStatus,
    /// The task description (omitted when empty).
    pub description: String,
}

/// A result's status and what goes with it: output only when completed, an error only when
/// failed or canceled, an input request exactly when waiting.
#[derive(Debug, Clone, PartialEq)]
pub enum ResultStatus {
    /// Waiting to be claimed.
    Pending,
    /// An attempt runs it.
    Running,
    /// Suspended.
    Suspended,
    /// Waiting for input.
    WaitingInput {
        /// What is asked.
        input_request: InputRequest,
    },
    /// Completed.
    Completed {
        /// The result bytes as JSON when they parse, else as a string; `None` when there are
        /// none, or when a result renderer shows them as rich parts.
        output: Option<serde_json::Value>,
    },
    /// Failed.
    Failed {
        /// The error (omitted when empty).
        error: String,
    },
    /// Canceled.
    Canceled {
        /// The reason (omitted when empty).
        error: String,
    },
}

impl ResultStatus {
    /// A completed status whose output is `data` (as JSON when it parses, else as a string;
    /// none when empty).
    #[must_use]
    pub fn completed(data: &[u8]) -> Self {
        Self::Completed {
            output: output_of(data),
        }
    }

    /// The task status this is.
    #[must_use]
    pub fn status(&self) -> Status {
        match self {
            Self::Pending => Status::Pending,
            Self::Running => Status::Running,
            Self::Suspended => Status::Suspended,
            Self::WaitingInput { .. } => Status::WaitingInput,
            Self::Completed { .. } => Status::Completed,
            Self::Failed { .. } => Status::Failed,
            Self::Canceled { .. } => Status::Canceled,
        }
    }
}

/// The wire form of a [`CallResult`], keys in envelope order.
#[derive(Serialize)]
struct ResultWire<'a> {
    status: Status,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<&'a serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    input_request: Option<&'a InputRequest>,
}

impl Serialize for CallResult {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ResultWire {
            status: self.status.status(),
            description: &self.description,
            output: self.output(),
            error: self.error(),
            input_request: self.input_request(),
        }
        .serialize(serializer)
    }
}

impl CallResult {
    /// The result's output (completed results only).
    #[must_use]
    pub fn output(&self) -> Option<&serde_json::Value> {
        match &self.status {
            ResultStatus::Completed { output } => output.as_ref(),
            _ => None,
        }
    }

    /// The result's error (failed and canceled results with a non-empty one only).
    #[must_use]
    pub fn error(&self) -> Option<&str> {
        match &self.status {
            ResultStatus::Failed { error } | ResultStatus::Canceled { error }
                if !error.is_empty() =>
            {
                Some(error)
            }
            _ => None,
        }
    }

    /// What a waiting result asks for.
    #[must_use]
    pub fn input_request(&self) -> Option<&InputRequest> {
        match &self.status {
            ResultStatus::WaitingInput { input_request } => Some(input_request),
            _ => None,
        }
    }
}

fn output_of(data: &[u8]) -> Option<serde_json::Value> {
    if data.is_empty() {
        return None;
    }
    Some(
        serde_json::from_slice(data).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(data).into_owned())
        }),
    )
}

impl ResponseEvent {
    /// An update record.
    #[must_use]
    pub fn update(update: &Update) -> Self {
        Self::Update {
            update: EnvelopeUpdate {
                event_id: update.event_id.clone(),
                kind: update.kind.clone(),
                data: STANDARD.encode(&update.data),
                metadata: update.metadata.clone(),
            },
        }
    }

    /// A launch result for a task snapshot.
    ///
    /// # Errors
    /// [`EnvelopeError::MissingInputRequest`] for a task waiting for input whose request
    /// cannot be read.
    pub fn launch_result(task: &TaskState) -> Result<Self, EnvelopeError> {
        let status = match task.status {
            Status::Pending => ResultStatus::Pending,
            Status::Running => ResultStatus::Running,
            Status::Suspended => ResultStatus::Suspended,
            Status::WaitingInput => ResultStatus::WaitingInput {
                input_request: read_input_request(task).map_err(|source| {
                    EnvelopeError::MissingInputRequest {
                        task_id: task.spec.id.clone(),
                        source,
                    }
                })?,
            },
            Status::Completed => ResultStatus::completed(&task.result_data),
            Status::Failed => ResultStatus::Failed {
                error: task.result_error.clone(),
            },
            Status::Canceled => ResultStatus::Canceled {
                error: task.result_error.clone(),
            },
        };
        Ok(Self::LaunchResult {
            task_id: task.spec.id.clone(),
            result: CallResult {
                status,
                description: task.spec.description.clone(),
            },
            inputs: (task.mailbox.latest > 0).then_some(InputCounts {
                received: task.mailbox.latest,
                read: task.mailbox.consumed,
            }),
        })
    }

    /// A foreground result: the call finished without publishing a task.
    #[must_use]
    pub fn foreground_result(description: &str, status: ResultStatus) -> Self {
        Self::ForegroundResult {
            result: CallResult {
                status,
                description: description.to_owned(),
            },
        }
    }

    /// The record's type.
    #[must_use]
    pub fn kind(&self) -> EnvelopeType {
        match self {
            Self::Update { .. } => EnvelopeType::Update,
            Self::LaunchResult { .. } => EnvelopeType::LaunchResult,
            Self::ForegroundResult { .. } => EnvelopeType::ForegroundResult,
        }
    }

    /// The task id (launch results only).
    #[must_use]
    pub fn task_id(&self) -> Option<&str> {
        match self {
            Self::LaunchResult { task_id, .. } => Some(task_id),
            _ => None,
        }
    }

    /// The result's body (results only).
    #[must_use]
    pub fn result(&self) -> Option<&CallResult> {
        match self {
            Self::LaunchResult { result, .. } | Self::ForegroundResult { result } => Some(result),
            Self::Update { .. } => None,
        }
    }

    /// The status (results only).
    #[must_use]
    pub fn status(&self) -> Option<Status> {
        self.result().map(|r| r.status.status())
    }

    /// The output (completed results only).
    #[must_use]
    pub fn output(&self) -> Option<&serde_json::Value> {
        self.result().and_then(CallResult::output)
    }

    /// The error (failed and canceled results only).
    #[must_use]
    pub fn error(&self) -> Option<&str> {
        self.result().and_then(CallResult::error)
    }

    /// The update (update records only).
    #[must_use]
    pub fn as_update(&self) -> Option<&EnvelopeUpdate> {
        match self {
            Self::Update { update } => Some(update),
            _ => None,
        }
    }

    /// The record without the output of a completed result (a result renderer shows it).
    pub(crate) fn without_output(mut self) -> Self {
        if let Self::LaunchResult { result, .. } | Self::ForegroundResult { result } = &mut self {
            if let ResultStatus::Completed { output } = &mut result.status {
                *output = None;
            }
        }
        self
    }

    /// The record as one line (JSON and a newline).
    #[must_use]
    pub fn encode(&self) -> String {
        // Strings, base64, string maps and JSON values always serialize.
        let mut line = serde_json::to_string(self).unwrap_or_default();
        line.push('\n');
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::managed::codec::{ManagedCheckpoint, RECOVERABLE_EXECUTOR_KEY, TASK_KIND};
    use dtask_journal::{LeasePolicy, TaskSpec, Timestamp};

    fn task(status: Status, description: &str) -> TaskState {
        TaskState {
            spec: TaskSpec {
                id: "background_tool_1".into(),
                executor_key: RECOVERABLE_EXECUTOR_KEY.into(),
                kind: TASK_KIND.into(),
                description: description.into(),
                ..TaskSpec::default()
            }
            .into(),
            policy: LeasePolicy::Retry,
            status,
            checkpoint: Vec::new(),
            result_data: Vec::new(),
            result_error: String::new(),
            output_file_error: String::new(),
            pending_resume: None,
            context_snapshot: Vec::new(),
            version: 1,
            attempt: 0,
            cancel_requested_at: None,
            cancel_reason: String::new(),
            created_at: Timestamp(0),
            updated_at: Timestamp(0),
            done_at: None,
            lease_deadline: None,
            position: 0,
            updates: 0,
            trimmed: 0,
            publication: dtask_journal::Publication::OnCreate,
            parent_task_id: String::new(),
            root_session_id: String::new(),
            mailbox: dtask_replay::Mailbox::new(),
            parent_notification_error: String::new(),
            lineage: None,
            max_recoveries: None,
            recoveries: 0,
            not_before: None,
            hold: None,
        }
    }

    fn launch(task: &TaskState) -> String {
        ResponseEvent::launch_result(task).unwrap().encode()
    }

    #[test]
    fn records_match_the_reference_shapes() {
        let update = Update {
            kind: "stdout".into(),
            data: b"line".to_vec(),
            ..Update::default()
        };
        assert_eq!(
            ResponseEvent::update(&update).encode(),
            "{\"type\":\"update\",\"update\":{\"kind\":\"stdout\",\"data\":\"bGluZQ==\"}}\n"
        );
        let done = ResponseEvent::foreground_result(
            "External operation",
            ResultStatus::completed(br#"{"ok":true}"#),
        );
        assert_eq!(
            done.encode(),
            "{\"type\":\"foreground_result\",\"status\":\"completed\",\"description\":\"External operation\",\"output\":{\"ok\":true}}\n"
        );
    }

    /// Every shape of record, byte for byte as the envelope has always encoded it.
    #[test]
    fn every_record_shape_keeps_its_bytes() {
        let full = Update {
            event_id: "line:0".into(),
            kind: "stdout".into(),
            data: b"x\ny".to_vec(),
            metadata: [("k", "v"), ("a", "b")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        };
        let mut lines = vec![
            ResponseEvent::update(&full).encode(),
            ResponseEvent::update(&Update::default()).encode(),
        ];
        for status in [Status::Pending, Status::Running, Status::Suspended] {
            lines.push(launch(&task(status, "desc")));
            lines.push(launch(&task(status, "")));
        }
        let mut done = task(Status::Completed, "d");
        for data in [&br#"{"ok":true,"n":[1,2]}"#[..], b"plain \"text\"\n", b""] {
            done.result_data = data.to_vec();
            lines.push(launch(&done));
        }
        for status in [Status::Failed, Status::Canceled] {
            let mut ended = task(status, "d");
            ended.result_error = "boom".into();
            lines.push(launch(&ended));
            ended.result_error = String::new();
            lines.push(launch(&ended));
        }
        let mut waiting = task(Status::WaitingInput, "w");
        for (id, data) in [
            ("approval", Some(serde_json::json!({"question": "ok?"}))),
            ("r", None),
        ] {
            waiting.checkpoint = ManagedCheckpoint {
                started: true,
                tool_checkpoint: b"cp".to_vec(),
                request: Some(InputRequest {
                    id: id.into(),
                    data,
                }),
            }
            .encode()
            .unwrap();
            lines.push(launch(&waiting));
        }
        for (description, status) in [
            ("d", ResultStatus::completed(br#"{"a":1}"#)),
            ("", ResultStatus::completed(b"text")),
            ("", ResultStatus::completed(b"")),
            (
                "d",
                ResultStatus::Failed {
                    error: "boom".into(),
                },
            ),
            (
                "",
                ResultStatus::Failed {
                    error: String::new(),
                },
            ),
            (
                "d",
                ResultStatus::Canceled {
                    error: "stopped".into(),
                },
            ),
        ] {
            lines.push(ResponseEvent::foreground_result(description, status).encode());
        }
        let expected = [
            r#"{"type":"update","update":{"event_id":"line:0","kind":"stdout","data":"eAp5","metadata":{"a":"b","k":"v"}}}"#,
            r#"{"type":"update","update":{}}"#,
            r#"{"type":"launch_result","task_id":"background_tool_1","status":"pending","description":"desc"}"#,
            r#"{"type":"launch_result","task_id":"background_tool_1","status":"pending"}"#,
            r#"{"type":"launch_result","task_id":"background_tool_1","status":"running","description":"desc"}"#,
            r#"{"type":"launch_result","task_id":"background_tool_1","status":"running"}"#,
            r#"{"type":"launch_result","task_id":"background_tool_1","status":"suspended","description":"desc"}"#,
            r#"{"type":"launch_result","task_id":"background_tool_1","status":"suspended"}"#,
            r#"{"type":"launch_result","task_id":"background_tool_1","status":"completed","description":"d","output":{"n":[1,2],"ok":true}}"#,
            r#"{"type":"launch_result","task_id":"background_tool_1","status":"completed","description":"d","output":"plain \"text\"\n"}"#,
            r#"{"type":"launch_result","task_id":"background_tool_1","status":"completed","description":"d"}"#,
            r#"{"type":"launch_result","task_id":"background_tool_1","status":"failed","description":"d","error":"boom"}"#,
            r#"{"type":"launch_result","task_id":"background_tool_1","status":"failed","description":"d"}"#,
            r#"{"type":"launch_result","task_id":"background_tool_1","status":"canceled","description":"d","error":"boom"}"#,
            r#"{"type":"launch_result","task_id":"background_tool_1","status":"canceled","description":"d"}"#,
            r#"{"type":"launch_result","task_id":"background_tool_1","status":"waiting_input","description":"w","input_request":{"id":"approval","data":{"question":"ok?"}}}"#,
            r#"{"type":"launch_result","task_id":"background_tool_1","status":"waiting_input","description":"w","input_request":{"id":"r"}}"#,
            r#"{"type":"foreground_result","status":"completed","description":"d","output":{"a":1}}"#,
            r#"{"type":"foreground_result","status":"completed","output":"text"}"#,
            r#"{"type":"foreground_result","status":"completed"}"#,
            r#"{"type":"foreground_result","status":"failed","description":"d","error":"boom"}"#,
            r#"{"type":"foreground_result","status":"failed"}"#,
            r#"{"type":"foreground_result","status":"canceled","description":"d","error":"stopped"}"#,
        ];
        assert_eq!(lines.len(), expected.len());
        for (line, expected) in lines.iter().zip(expected) {
            assert_eq!(line, &format!("{expected}\n"));
        }
    }

    #[test]
    fn a_waiting_task_without_a_request_has_no_record() {
        let waiting = task(Status::WaitingInput, "w");
        let err = ResponseEvent::launch_result(&waiting).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid response envelope: a waiting result needs an input request"
        );
        let mut plain = waiting.clone();
        std::sync::Arc::make_mut(&mut plain.spec).executor_key =
            crate::managed::codec::PLAIN_EXECUTOR_KEY.into();
        assert!(ResponseEvent::launch_result(&plain).is_err());
    }

    #[test]
    fn a_rendered_result_drops_only_the_output() {
        let done = ResponseEvent::foreground_result("d", ResultStatus::completed(b"{}"));
        let rendered = done.clone().without_output();
        assert_eq!(rendered.output(), None);
        assert_eq!(rendered.status(), Some(Status::Completed));
        let failed = ResponseEvent::foreground_result(
            "d",
            ResultStatus::Failed {
                error: "boom".into(),
            },
        );
        assert_eq!(failed.clone().without_output(), failed);
    }

    #[test]
    fn update_data_cannot_forge_a_record() {
        let update = Update {
            data: b"\n{\"type\":\"launch_result\"}\n".to_vec(),
            kind: "x\n{\"type\":\"launch_result\"}".into(),
            ..Update::default()
        };
        let line = ResponseEvent::update(&update).encode();
        assert_eq!(line.matches('\n').count(), 1);
    }
}

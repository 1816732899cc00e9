//! A resumable approval tool: asks a question, waits for the answer, completes with it.
//! Arguments: `{"question": "..."}`; answers: the JSON strings `"yes"` or `"no"` (anything
//! else is rejected and the task keeps waiting).

use crate::managed::codec::InputRequest;
use crate::managed::error::{ToolFailure, ToolRunError};
use crate::managed::tool::{
    BackgroundTool, RecoverRequest, RecoverableTool, ResumableTool, ResumeRequest, Run, RunOutcome,
    StartRequest, StartResult,
};
use async_trait::async_trait;
use std::sync::Arc;

/// The approval tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApprovalTool;

impl ApprovalTool {
    /// The JSON Schema of the tool's arguments, for its [`ToolInfo`](crate::tool::ToolInfo):
    /// an object with a required string `question`.
    ///
    /// ```
    /// use dtask_engine::managed::tools::ApprovalTool;
    ///
    /// assert_eq!(ApprovalTool::parameters()["required"], serde_json::json!(["question"]));
    /// ```
    #[must_use]
    pub fn parameters() -> serde_json::Value {
        serde_json::json!({
            "type": "object",
            "properties": {
                "question": {
                    "type": "string",
                    "description": "What to ask the person (must not be empty); they answer yes or no."
                }
            },
            "required": ["question"]
        })
    }
}

/// A run whose outcome is known from the start.
#[derive(Debug)]
struct Decided(RunOutcome);

#[async_trait]
impl Run for Decided {
    async fn wait(&self) -> Result<RunOutcome, ToolRunError> {
        Ok(self.0.clone())
    }

    async fn stop(&self) -> Result<(), ToolRunError> {
        Ok(())
    }
}

fn question(arguments: &str) -> Result<String, ToolFailure> {
    let value: serde_json::Value =
        serde_json::from_str(arguments).map_err(|e| ToolFailure::with_source(e.to_string(), e))?;
    value
        .get("question")
        .and_then(serde_json::Value::as_str)
        .filter(|q| !q.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| "a non-empty \"question\" is required".into())
}

fn ask(arguments: &str) -> Result<Arc<dyn Run>, ToolRunError> {
    let question = question(arguments)?;
    Ok(Arc::new(Decided(RunOutcome::WaitingInput {
        request: InputRequest {
            id: "approval".into(),
            data: Some(serde_json::json!({ "question": question })),
        },
        checkpoint: Vec::new(),
    })))
}

#[async_trait]
impl BackgroundTool for ApprovalTool {
    fn validate_arguments(&self, arguments: &str) -> Result<(), ToolFailure> {
        question(arguments).map(drop)
    }

    async fn start(&self, request: StartRequest) -> Result<StartResult, ToolRunError> {
        Ok(StartResult {
            run: ask(&request.arguments)?,
            checkpoint: b"asked".to_vec(),
        })
    }

    fn as_recoverable(&self) -> Option<&dyn RecoverableTool> {
        Some(self)
    }

    fn as_resumable(&self) -> Option<&dyn ResumableTool> {
        Some(self)
    }
}

#[async_trait]
impl RecoverableTool for ApprovalTool {
    async fn recover(&self, request: RecoverRequest) -> Result<Arc<dyn Run>, ToolRunError> {
        ask(&request.arguments)
    }
}

#[async_trait]
impl ResumableTool for ApprovalTool {
    async fn resume(&self, request: ResumeRequest) -> Result<Arc<dyn Run>, ToolRunError> {
        let answer: Option<String> = serde_json::from_slice(&request.data).ok();
        let outcome = match answer.as_deref() {
            Some("yes") => RunOutcome::Completed(br#"{"approved":true}"#.to_vec()),
            Some("no") => RunOutcome::Completed(br#"{"approved":false}"#.to_vec()),
            _ => {
                return Err(ToolRunError::InputRejected(
                    "answer with \"yes\" or \"no\"".into(),
                ))
            }
        };
        Ok(Arc::new(Decided(outcome)))
    }
}

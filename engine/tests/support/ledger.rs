//! A recoverable tool with a side-effect ledger: `add {a, b}` appends one line per *start*
//! (its side effect) to a synced file, and answers `a + b`. Recovering a call appends nothing,
//! so the ledger shows how many times each call's side effect ran. `{"hold": true}` keeps a
//! run going until it is stopped.
#![allow(dead_code, clippy::unwrap_used, clippy::missing_panics_doc)]

use dtask_engine::async_trait;
use dtask_engine::managed::{
    BackgroundTool, RecoverRequest, RecoverableTool, Registration, Run, RunOutcome, StartRequest,
    StartResult, ToolFailure, ToolRunError,
};
use dtask_engine::tool::ToolInfo;
use serde::Deserialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::Notify;

#[derive(Deserialize)]
struct Args {
    a: i64,
    b: i64,
    #[serde(default)]
    hold: bool,
    /// Double quotes after the sum in the output (an output that grows once in JSON).
    #[serde(default)]
    quotes: usize,
}

fn args(arguments: &str) -> Result<Args, ToolFailure> {
    serde_json::from_str(arguments).map_err(|e| ToolFailure::new(format!("bad arguments: {e}")))
}

/// The tool, writing to `ledger`.
pub struct LedgerTool {
    pub ledger: PathBuf,
}

impl LedgerTool {
    /// Its registration as `add`.
    pub fn registration(ledger: &Path) -> Registration {
        Registration::new(
            ToolInfo::new(
                "add",
                "Add two integers",
                serde_json::json!({
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"]
                }),
            ),
            LedgerTool {
                ledger: ledger.to_owned(),
            },
        )
    }
}

/// The ledger's lines (one task id per start).
pub fn read_ledger(ledger: &Path) -> Vec<String> {
    std::fs::read_to_string(ledger)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

struct AddRun {
    sum: i64,
    quotes: usize,
    hold: bool,
    stopped: Notify,
}

#[async_trait]
impl Run for AddRun {
    async fn wait(&self) -> Result<RunOutcome, ToolRunError> {
        if self.hold {
            self.stopped.notified().await;
            return Ok(RunOutcome::Canceled("stopped".into()));
        }
        let output = format!("{}{}", self.sum, "\"".repeat(self.quotes));
        Ok(RunOutcome::Completed(output.into_bytes()))
    }

    async fn stop(&self) -> Result<(), ToolRunError> {
        self.stopped.notify_one();
        Ok(())
    }
}

fn run(a: &Args) -> Arc<dyn Run> {
    Arc::new(AddRun {
        sum: a.a + a.b,
        quotes: a.quotes,
        hold: a.hold,
        stopped: Notify::new(),
    })
}

#[async_trait]
impl BackgroundTool for LedgerTool {
    fn validate_arguments(&self, arguments: &str) -> Result<(), ToolFailure> {
        args(arguments).map(drop)
    }

    async fn start(&self, request: StartRequest) -> Result<StartResult, ToolRunError> {
        let a = args(&request.arguments)?;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.ledger)
            .unwrap();
        // One write per line: calls running at once append whole lines (`writeln!` on a file
        // writes the id and the newline in two calls, which interleave).
        file.write_all(format!("{}\n", request.task_id).as_bytes())
            .unwrap();
        file.sync_all().unwrap();
        Ok(StartResult {
            run: run(&a),
            checkpoint: b"started".to_vec(),
        })
    }

    fn as_recoverable(&self) -> Option<&dyn RecoverableTool> {
        Some(self)
    }
}

#[async_trait]
impl RecoverableTool for LedgerTool {
    async fn recover(&self, request: RecoverRequest) -> Result<Arc<dyn Run>, ToolRunError> {
        Ok(run(&args(&request.arguments)?))
    }
}

//! `dtask hold`: places an operator's hold on a task, or lifts it (`--lift`): while a hold
//! stands the task — and the tree it is in — is not purged, by name or by age (see
//! docs/semantics.md, "Purging finished tasks").

use super::{CliError, Global, Out, Result};
use dtask_engine::{StoreConfig, SystemClock, TaskStore};
use dtask_journal::JournalOptions;
use serde_json::json;

/// Arguments of `dtask hold`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The task.
    task: String,
    /// Why (a case number, an investigation); required to place a hold.
    #[arg(long, required_unless_present = "lift", conflicts_with = "lift")]
    reason: Option<String>,
    /// Lift the task's hold instead.
    #[arg(long)]
    lift: bool,
}

/// Runs `dtask hold`.
pub fn run(global: &Global, args: &Args) -> Result<()> {
    let at = global.at()?;
    let journal = at.open_existing_writer(JournalOptions::default())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::io("starting the runtime"))?;
    let state = runtime.block_on(async {
        let store = TaskStore::open(journal, SystemClock, StoreConfig::default())?;
        match &args.reason {
            Some(reason) if !args.lift => store.hold(&args.task, reason).await,
            _ => store.lift_hold(&args.task).await,
        }
    });
    let state = state.map_err(|e| CliError::Usage(e.to_string()))?;
    let mut out = Out::new();
    if global.json {
        out.json(&json!({ "task": args.task, "hold": state.hold.as_deref() }))?;
    } else {
        match &state.hold {
            Some(reason) => out.line(format!("{}: on hold ({reason:?})", args.task))?,
            None => out.line(format!("{}: not on hold", args.task))?,
        }
    }
    out.flush()
}

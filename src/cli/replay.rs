//! `dtask replay <task> --at <position>`: the task as it was after a position (time travel):
//! its state and its timeline up to that record, as `show` prints them.

use super::show::{state_json, state_text, timeline_json, timeline_text, Show, Timeline};
use super::{fmt, require_task, CliError, Global, Out, Result};
use dtask_replay::{load_task_at, ReplayError};
use serde_json::json;

/// Arguments of `dtask replay`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The task id.
    task: String,
    /// The last position folded (0 is the `created` record); default: the last record.
    #[arg(long, value_name = "POSITION")]
    at: Option<u64>,
    /// Show checkpoints, data and payloads themselves, not only their sizes.
    #[arg(long)]
    bytes: bool,
}

/// Runs `dtask replay`.
pub fn run(global: &Global, args: &Args) -> Result<()> {
    let journal = global.open()?;
    let len = require_task(&journal, &args.task)?;
    let last = len.saturating_sub(1);
    let at = args.at.unwrap_or(last);
    if at > last {
        return Err(CliError::Usage(format!(
            "task {:?} has positions 0..={last}; --at {at} is beyond its end",
            args.task
        )));
    }
    let task = match load_task_at(&journal, &args.task, at + 1) {
        Ok(Some(task)) => task,
        Ok(None) => {
            return Err(CliError::Problems(format!(
                "task {:?} has no records",
                args.task
            )))
        }
        Err(ReplayError::Journal(e)) => return Err(e.into()),
        Err(e) => return Err(CliError::Problems(e.to_string())),
    };
    let record = journal
        .read_stream(&args.task, at)
        .next()
        .transpose()?
        .ok_or_else(|| CliError::Problems(format!("no record at position {at}")))?;
    let show = Show { bytes: args.bytes };
    let mut timeline = Timeline::default();
    for item in journal.read_stream(&args.task, 0) {
        let record = item?;
        if record.position > at {
            break;
        }
        timeline.add(&record, show);
    }
    let mut out = Out::new();
    if global.json {
        out.json(&json!({
            "task": args.task,
            "at": {
                "position": at,
                "seq": record.seq,
                "time": record.event.at().0,
                "type": record.event.event_type().as_str(),
            },
            "last_position": last,
            "state": state_json(&task.state, show),
            "timeline": timeline_json(&timeline),
        }))?;
    } else {
        out.line(format!(
            "as of position {at} of {last} (sequence {}, {}, {})\n",
            record.seq,
            fmt::time(record.event.at()),
            record.event.event_type()
        ))?;
        out.text(state_text(&task.state, show))?;
        out.text(timeline_text(&timeline))?;
    }
    out.flush()
}

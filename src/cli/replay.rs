//! `dtask replay <task> --at <position>`: the task as it was after a position (time travel):
//! its state and its timeline up to that record, as `show` prints them.

use super::show::{state_json, state_text, timeline_json, timeline_text, Show, Timeline};
use super::{fmt, require_task, CliError, Global, Out, Result};
use dtask_journal::{EventType, Record, Timestamp};
use dtask_replay::{replay_task, FoldError, Replay, ReplayError, TaskFold};
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
    /// Show the latest N entries of the updates table (0: all), as `show` does: the earlier
    /// ones are counted, not listed, so a task with millions of updates replays in bounded
    /// memory.
    #[arg(long, value_name = "N", default_value_t = 100)]
    updates: usize,
}

/// The task as of a position: the strict fold, and the timeline of the records folded, in
/// one pass over the stream.
struct AsOf<'a> {
    fold: TaskFold<'a>,
    timeline: Timeline,
    show: Show,
    /// The last record's sequence, time and type.
    last_record: Option<(u64, Timestamp, EventType)>,
}

impl Replay for AsOf<'_> {
    type Error = FoldError;

    fn replay(&mut self, record: &Record) -> std::result::Result<(), FoldError> {
        self.timeline.add(record, self.show);
        self.last_record = Some((record.seq, record.event.at(), record.event.event_type()));
        self.fold.replay(record)
    }
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
    let show = Show { bytes: args.bytes };
    let mut view = AsOf {
        fold: TaskFold::new(&args.task),
        timeline: Timeline::keeping_updates(args.updates),
        show,
        last_record: None,
    };
    match replay_task(&journal, &args.task, Some(at + 1), &mut view) {
        Ok(()) => {}
        Err(ReplayError::Journal(e)) => return Err(e.into()),
        Err(ReplayError::Rejected {
            position: 0,
            error: FoldError::Purged { records, at },
            ..
        }) => {
            // Nothing is left to replay; said as `show` says it.
            let mut out = Out::new();
            if global.json {
                out.json(&json!({
                    "task": args.task,
                    "purged": { "records": records, "at": at },
                }))?;
            } else {
                out.line(format!(
                    "task {}: purged at {} ({} deleted; nothing is left to replay)",
                    args.task,
                    fmt::time(Timestamp(at)),
                    fmt::count(records, "record")
                ))?;
            }
            return out.flush();
        }
        Err(e) => return Err(CliError::Problems(e.to_string())),
    }
    let AsOf {
        fold,
        timeline,
        last_record,
        ..
    } = view;
    let task = fold
        .finish()
        .ok_or_else(|| CliError::Problems(format!("task {:?} has no records", args.task)))?;
    let (seq, time, event_type) =
        last_record.ok_or_else(|| CliError::Problems(format!("no record at position {at}")))?;
    let mut out = Out::new();
    if global.json {
        out.json(&json!({
            "task": args.task,
            "at": {
                "position": at,
                "seq": seq,
                "time": time.0,
                "type": event_type.as_str(),
            },
            "last_position": last,
            "state": state_json(&task.state, show),
            "timeline": timeline_json(&timeline),
        }))?;
    } else {
        out.line(format!(
            "as of position {at} of {last} (sequence {}, {}, {})\n",
            seq,
            fmt::time(time),
            event_type
        ))?;
        out.text(state_text(&task.state, show))?;
        out.text(timeline_text(&timeline))?;
    }
    out.flush()
}

//! `dtask events <task>`: a task's raw records.

use super::codec::{self, Bytes};
use super::fmt::{self, Table};
use super::{require_task, CliError, Global, Out, Result};
use dtask_journal::Error as JournalError;
use serde_json::json;

/// Arguments of `dtask events`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The task id.
    task: String,
    /// The first position to list.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// The last position to list (inclusive).
    #[arg(long)]
    to: Option<u64>,
    /// Only the last N records (of the range).
    #[arg(long, value_name = "N")]
    tail: Option<u64>,
}

/// Runs `dtask events`.
pub fn run(global: &Global, args: &Args) -> Result<()> {
    if let Some(to) = args.to.filter(|to| *to < args.from) {
        return Err(CliError::Usage(format!(
            "--from {} is after --to {to}: the range is empty",
            args.from
        )));
    }
    let journal = global.open()?;
    let len = require_task(&journal, &args.task)?;
    if args.from >= len {
        return Err(CliError::Usage(format!(
            "task {:?} has positions 0..={}; --from {} is beyond its end (the range is empty)",
            args.task,
            len.saturating_sub(1),
            args.from
        )));
    }
    let end = args.to.map_or(len, |t| t.saturating_add(1).min(len));
    let from = match args.tail {
        Some(n) => end.saturating_sub(n).max(args.from),
        None => args.from,
    };
    // Each record is written (JSON) or made a row of short cells (text) as it is read:
    // a task of a million records of a kilobyte is not held whole.
    let mut out = Out::new();
    let mut damaged = 0;
    let mut table = Table::new(&["POS", "SEQ", "AT", "TYPE", "CRC", "DIGEST", "DETAIL"]);
    let mut listed = 0_u64;
    if global.json {
        out.text("{\n  \"events\": [")?;
    }
    for item in journal.read_stream(&args.task, from) {
        let row = match item {
            Ok(record) if record.position >= end => break,
            Ok(record) => Ok(record),
            Err(JournalError::Corruption { position, kind, .. }) => {
                damaged += 1;
                if position >= end {
                    continue;
                }
                Err((position, kind.to_string()))
            }
            Err(e) => return Err(e.into()),
        };
        if global.json {
            let value = row_json(&row)?;
            // Indented as a pretty document's array items are.
            let pretty = serde_json::to_string_pretty(&value)?.replace('\n', "\n    ");
            out.text(format!(
                "{}\n    {pretty}",
                if listed == 0 { "" } else { "," }
            ))?;
        } else {
            table.row(row_cells(&row));
        }
        listed += 1;
    }
    if global.json {
        out.text(format!(
            "{}],\n  \"task\": {}\n}}\n",
            if listed == 0 { "" } else { "\n  " },
            serde_json::to_string(&args.task)?
        ))?;
    } else {
        out.text(table.render(0))?;
    }
    out.flush()?;
    if damaged > 0 {
        return Err(CliError::Problems(format!(
            "{} in task {:?}: run `dtask verify`",
            fmt::count(damaged, "damaged record"),
            args.task
        )));
    }
    Ok(())
}

/// A record read, or a damaged one: its position and what is wrong.
type Row = std::result::Result<dtask_journal::Record, (u64, String)>;

/// A row as `--json` lists it.
fn row_json(row: &Row) -> Result<serde_json::Value> {
    Ok(match row {
        Ok(r) => json!({
            "position": r.position,
            "seq": r.seq,
            "at": r.event.at().0,
            "type": r.event.event_type().as_str(),
            "crc": format!("{:08x}", r.crc),
            "digest": r.digest.to_hex(),
            "size": r.size,
            "event": codec::event_json(&r.event, Bytes::Base64)?,
        }),
        Err((position, why)) => json!({ "position": position, "damaged": why }),
    })
}

/// A row as the table lists it.
fn row_cells(row: &Row) -> Vec<String> {
    match row {
        Ok(r) => vec![
            r.position.to_string(),
            r.seq.to_string(),
            fmt::time(r.event.at()),
            r.event.event_type().as_str().to_owned(),
            format!("{:08x}", r.crc),
            fmt::short(&r.digest.to_hex(), 12).to_owned(),
            fmt::summary(&r.event),
        ],
        Err((position, why)) => vec![
            position.to_string(),
            "-".into(),
            "-".into(),
            "DAMAGED".into(),
            "-".into(),
            "-".into(),
            why.clone(),
        ],
    }
}

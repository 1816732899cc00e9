//! `dtask export`: the journal (or some tasks) as JSON lines in global commit order, in the
//! versioned schema of `docs/export-format.md`.

use super::codec::{self, Bytes};
use super::{progress, require_task, CliError, Global, Result};
use dtask_journal::{Journal, Record, FORMAT_VERSION, JOURNAL_FORMAT_VERSION};
use serde_json::{json, Value};
use std::io::Write;
use std::iter::Peekable;
use std::path::PathBuf;

/// The export schema version written in the header (`dtask_export`).
pub const EXPORT_VERSION: u64 = 1;

/// Arguments of `dtask export`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Export only these tasks (repeatable); such an export cannot be imported.
    #[arg(long = "task", value_name = "ID")]
    tasks: Vec<String>,
    /// Replace payloads, checkpoints, data and context snapshots by their length; such an
    /// export cannot be imported.
    #[arg(long)]
    no_payload: bool,
    /// Write to this file instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// One record as an export line.
pub fn record_line(task: &str, record: &Record, bytes: Bytes) -> Value {
    json!({
        "task": task,
        "position": record.position,
        "seq": record.seq,
        "digest": record.digest.to_hex(),
        "crc": format!("{:08x}", record.crc),
        "event": codec::event_to_json(&record.event, bytes),
    })
}

/// Merges task streams by global sequence.
struct Merge<'a> {
    streams: Vec<(String, Peekable<dtask_journal::StreamReader<'a>>)>,
}

impl Iterator for Merge<'_> {
    type Item = Result<(String, Record)>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut best: Option<(usize, u64)> = None;
        for (i, (_, stream)) in self.streams.iter_mut().enumerate() {
            match stream.peek() {
                Some(Err(_)) => {
                    best = Some((i, 0));
                    break;
                }
                Some(Ok(r)) if best.is_none_or(|(_, s)| r.seq < s) => best = Some((i, r.seq)),
                None | Some(Ok(_)) => {}
            }
        }
        let (i, _) = best?;
        let (task, stream) = &mut self.streams[i];
        let task = task.clone();
        stream
            .next()
            .map(|item| item.map(|r| (task, r)).map_err(CliError::from))
    }
}

/// Records with their tasks, in global order.
type Items<'a> = Box<dyn Iterator<Item = Result<(String, Record)>> + 'a>;

/// Writes the export of `journal` to `w`; returns the number of records.
fn write_export(
    journal: &Journal,
    tasks: &[String],
    bytes: Bytes,
    w: &mut dyn Write,
) -> Result<u64> {
    let io = CliError::io("writing the export");
    let (scope, records, mut items): (Value, u64, Items<'_>) = if tasks.is_empty() {
        let last = journal.last_seq()?;
        let items = journal
            .commits(1)
            .map(|c| c.map(|c| (c.task, c.record)).map_err(CliError::from));
        ("journal".into(), last, Box::new(items))
    } else {
        let mut total = 0;
        let mut streams = Vec::new();
        for task in tasks {
            total += require_task(journal, task)?.next_position;
            streams.push((task.clone(), journal.read_stream(task, 0).peekable()));
        }
        (json!(tasks), total, Box::new(Merge { streams }))
    };
    let header = json!({
        "dtask_export": EXPORT_VERSION,
        "journal_format": JOURNAL_FORMAT_VERSION,
        "record_format": FORMAT_VERSION,
        "scope": scope,
        "redacted": bytes == Bytes::Redact,
        "records": records,
    });
    serde_json::to_writer(&mut *w, &header)?;
    w.write_all(b"\n").map_err(io)?;
    let bar = progress(records, "exporting");
    let mut written = 0;
    for item in &mut items {
        let (task, record) = item?;
        serde_json::to_writer(&mut *w, &record_line(&task, &record, bytes))?;
        w.write_all(b"\n")
            .map_err(CliError::io("writing the export"))?;
        written += 1;
        bar.inc(1);
    }
    bar.finish_and_clear();
    w.flush().map_err(CliError::io("writing the export"))?;
    if written != records {
        return Err(CliError::Problems(format!(
            "the journal announced {records} records but {written} were read: run `dtask verify`"
        )));
    }
    Ok(written)
}

/// Runs `dtask export`.
pub fn run(global: &Global, args: &Args) -> Result<()> {
    let journal = global.open()?;
    let bytes = if args.no_payload {
        Bytes::Redact
    } else {
        Bytes::Base64
    };
    let written = if let Some(path) = &args.output {
        let file = std::fs::File::create(path)
            .map_err(CliError::io(format!("creating {}", path.display())))?;
        let mut w = std::io::BufWriter::new(file);
        let n = write_export(&journal, &args.tasks, bytes, &mut w)?;
        let file = w.into_inner().map_err(|e| CliError::Io {
            context: format!("writing {}", path.display()),
            source: e.into_error(),
        })?;
        // Only regular files can be synced (not /dev/null or a pipe).
        let regular = file.metadata().is_ok_and(|m| m.is_file());
        if regular {
            file.sync_all()
                .map_err(CliError::io(format!("syncing {}", path.display())))?;
        }
        n
    } else {
        let mut w = std::io::BufWriter::new(std::io::stdout().lock());
        write_export(&journal, &args.tasks, bytes, &mut w)?
    };
    if let Some(path) = &args.output {
        if global.json {
            println!(
                "{}",
                json!({ "records": written, "output": path.display().to_string() })
            );
        } else {
            eprintln!("exported {written} records to {}", path.display());
        }
    }
    Ok(())
}

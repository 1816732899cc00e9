//! `dtask verify`: the audit of `dtask_replay::audit` over the whole journal (or some tasks).

use super::fmt;
use super::{progress, CliError, Global, Out, Result};
use dtask_replay::audit::{audit_journal, audit_task, AuditReport, Problem};
use serde_json::json;

/// Arguments of `dtask verify`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Audit only these tasks (repeatable); the global index checks (commit density) are
    /// skipped then.
    #[arg(long = "task", value_name = "ID")]
    tasks: Vec<String>,
}

fn print(out: &mut Out, report: &AuditReport, scope: &str) -> Result<()> {
    for p in &report.problems {
        out.line(line(p))?;
    }
    let verdict = if report.is_clean() {
        "clean".to_owned()
    } else {
        fmt::count(report.problems.len() as u64, "problem")
    };
    let purged = if report.purged > 0 {
        format!(
            ", {} purged ({} deleted)",
            report.purged,
            fmt::count(report.purged_records, "record")
        )
    } else {
        String::new()
    };
    let trimmed = if report.trimmed_records > 0 {
        format!(
            ", {} trimmed in {}",
            fmt::count(report.trimmed_records, "progress update"),
            fmt::count(report.trimmed, "task")
        )
    } else {
        String::new()
    };
    out.line(format!(
        "verified {scope}: {}, {} ({}), last sequence {}, {} live, {}{purged}{trimmed}: {verdict}",
        fmt::count(report.tasks, "task"),
        fmt::count(report.records, "record"),
        fmt::size(report.bytes),
        report.last_seq,
        report.live,
        fmt::count(report.outbox, "queued notification")
    ))
}

fn line(p: &Problem) -> String {
    let position = p.position.map_or_else(|| "-".to_owned(), |p| p.to_string());
    format!(
        "PROBLEM task {:?} position {position}: {}: {}",
        p.task, p.kind, p.detail
    )
}

/// Runs `dtask verify`.
pub fn run(global: &Global, args: &Args) -> Result<()> {
    let opened = global.open()?;
    // One view for every pass of the audit: on PostgreSQL a snapshot of the database, which
    // other nodes may be writing (an embedded journal opened read-only does not move).
    let frozen = opened.frozen()?;
    let journal = frozen.journal();
    let started = std::time::Instant::now();
    let report = if args.tasks.is_empty() {
        let bar = progress(journal.last_seq()?, "verifying");
        let report = audit_journal(journal, &mut |p| bar.set_position(p.records))?;
        bar.finish_and_clear();
        report
    } else {
        let mut report = AuditReport {
            last_seq: journal.last_seq()?,
            ..AuditReport::default()
        };
        let mut asked = std::collections::HashSet::new();
        for task in args.tasks.iter().filter(|t| asked.insert(t.as_str())) {
            let t = audit_task(journal, task)?;
            if !t.exists {
                return Err(CliError::Usage(format!("no task {task:?} in the journal")));
            }
            report.tasks += 1;
            report.records += t.records;
            report.bytes += t.bytes;
            report.live += u64::from(!t.terminal);
            if t.purged {
                report.purged += 1;
                // The tombstone says how many records it stands for.
                if let Some(Ok(record)) = journal.read_stream(task, 0).next() {
                    if let dtask_journal::Event::Purged { records, .. } = record.event {
                        report.purged_records += records;
                    }
                }
            }
            if t.trimmed > 0 {
                report.trimmed += 1;
                report.trimmed_records += t.trimmed;
            }
            report.problems.extend(t.problems);
        }
        report
    };
    let elapsed = started.elapsed();
    let mut out = Out::new();
    if global.json {
        let mut value = serde_json::to_value(&report)?;
        value["clean"] = json!(report.is_clean());
        out.json(&value)?;
    } else {
        let scope = if args.tasks.is_empty() {
            "journal"
        } else {
            "tasks"
        };
        print(&mut out, &report, scope)?;
    }
    out.flush()?;
    tracing_elapsed(elapsed);
    if report.is_clean() {
        Ok(())
    } else {
        Err(CliError::Problems(String::new()))
    }
}

/// Reports the audit's duration on standard error when `DTASK_TIMING` is set.
fn tracing_elapsed(elapsed: std::time::Duration) {
    if std::env::var_os("DTASK_TIMING").is_some() {
        eprintln!("verify took {:.3} s", elapsed.as_secs_f64());
    }
}

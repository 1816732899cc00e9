//! `dtask tasks`: list tasks with filters, sorted and paged. Each task's status is folded from
//! its stream.

use super::fmt::{self, Table};
use super::{progress, CliError, Global, Out, Result};
use dtask_journal::Timestamp;
use dtask_replay::{FoldViews, Status};
use serde_json::{json, Value};

/// How tasks are sorted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Sort {
    /// By task id.
    Id,
    /// By creation time, then id.
    Created,
}

/// Arguments of `dtask tasks`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only tasks in this status (`pending`, `running`, `waiting_input`, `suspended`,
    /// `completed`, `failed`, `canceled`); repeatable.
    #[arg(long, value_parser = parse_status)]
    status: Vec<Status>,
    /// Only tasks of this executor key; repeatable.
    #[arg(long)]
    executor: Vec<String>,
    /// Only tasks whose payload is a JSON object with this `tool_name`; repeatable.
    #[arg(long)]
    tool: Vec<String>,
    /// Only tasks created at or after this time (ms since the epoch, YYYY-MM-DD or RFC 3339 UTC).
    #[arg(long, value_parser = fmt::parse_time)]
    since: Option<Timestamp>,
    /// Only tasks created before this time.
    #[arg(long, value_parser = fmt::parse_time)]
    until: Option<Timestamp>,
    /// Sort order.
    #[arg(long, value_enum, default_value_t = Sort::Id)]
    sort: Sort,
    /// At most this many tasks (0: all).
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Start after this task id (in the chosen order): the `next_after` of the previous page.
    #[arg(long, value_name = "ID")]
    after: Option<String>,
}

fn parse_status(text: &str) -> Result<Status, String> {
    Status::parse(text).ok_or_else(|| {
        let names: Vec<_> = Status::ALL.iter().map(|s| s.as_str()).collect();
        format!("unknown status {text:?}: one of {}", names.join(", "))
    })
}

/// One listed task.
struct Row {
    id: String,
    status: Option<Status>,
    executor: String,
    tool: Option<String>,
    attempt: u64,
    version: u64,
    records: u64,
    created: Timestamp,
    updated: Timestamp,
    /// A delayed pending task's earliest claim time.
    not_before: Option<Timestamp>,
    problem: Option<String>,
}

impl Row {
    fn json(&self) -> Value {
        json!({
            "id": self.id,
            "status": self.status.map(Status::as_str),
            "executor": self.executor,
            "tool": self.tool,
            "attempt": self.attempt,
            "version": self.version,
            "records": self.records,
            "created_at": self.created.0,
            "updated_at": self.updated.0,
            "not_before": self.not_before.map(|t| t.0),
            "problem": self.problem,
        })
    }
}

impl Args {
    fn keep(&self, row: &Row) -> bool {
        (self.status.is_empty() || row.status.is_some_and(|s| self.status.contains(&s)))
            && (self.executor.is_empty() || self.executor.contains(&row.executor))
            && (self.tool.is_empty() || row.tool.as_ref().is_some_and(|t| self.tool.contains(t)))
            && self.since.is_none_or(|t| row.created >= t)
            && self.until.is_none_or(|t| row.created < t)
    }
}

/// Runs `dtask tasks`.
#[allow(clippy::too_many_lines, reason = "fold, filter, sort, page, print")]
pub fn run(global: &Global, args: &Args) -> Result<()> {
    let journal = global.open()?;
    let bar = progress(journal.last_seq()?, "folding tasks");
    let mut rows = Vec::new();
    // Sorted by id, the listing starts after `--after`; sorted by creation, every task is
    // folded and the page found after sorting.
    let after = args.after.as_deref().filter(|_| args.sort == Sort::Id);
    for folded in FoldViews::new(&journal, after) {
        let folded = folded?;
        bar.inc(folded.records);
        if folded.purged.is_some() {
            // Purged: its tombstone alone is left (`dtask show` says when).
            continue;
        }
        let id = folded.id().to_owned();
        let problem = folded.has_problems().then(|| folded.problems().join("; "));
        let row = match &folded.task {
            Some(task) => {
                let s = &task.state;
                Row {
                    id,
                    status: Some(s.status),
                    executor: s.spec.executor_key.clone(),
                    tool: fmt::tool_name(&s.spec.payload),
                    attempt: s.attempt,
                    version: s.version,
                    records: folded.records,
                    created: s.created_at,
                    updated: s.updated_at,
                    not_before: s.not_before,
                    problem,
                }
            }
            None => Row {
                id,
                status: None,
                executor: String::new(),
                tool: None,
                attempt: 0,
                version: 0,
                records: folded.records,
                created: Timestamp(0),
                not_before: None,
                updated: Timestamp(0),
                problem,
            },
        };
        if args.keep(&row) {
            rows.push(row);
            // Sorted by id, the page is full with one row past it (which says there is more):
            // nothing after it is folded.
            if args.sort == Sort::Id && args.limit > 0 && rows.len() > args.limit {
                break;
            }
        }
    }
    bar.finish_and_clear();
    if args.sort == Sort::Created {
        rows.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        if let Some(after) = &args.after {
            let at = rows.iter().position(|r| &r.id == after).ok_or_else(|| {
                CliError::Usage(format!("--after {after:?}: no such task listed"))
            })?;
            rows.drain(..=at);
        }
    }
    let more = args.limit > 0 && rows.len() > args.limit;
    if more {
        rows.truncate(args.limit);
    }
    let next_after = if more {
        rows.last().map(|r| r.id.clone())
    } else {
        None
    };
    let mut out = Out::new();
    if global.json {
        let tasks: Vec<Value> = rows.iter().map(Row::json).collect();
        out.json(&json!({ "tasks": tasks, "next_after": next_after }))?;
        return out.flush();
    }
    let mut table = Table::new(&[
        "ID", "STATUS", "EXECUTOR", "TOOL", "ATTEMPT", "VERSION", "RECORDS", "CREATED", "UPDATED",
    ]);
    for r in &rows {
        let mut status = r.status.map_or("?", Status::as_str).to_owned();
        if let Some(until) = r.not_before {
            status = format!("{status} until {}", fmt::time(until));
        }
        if r.problem.is_some() {
            status.push('!');
        }
        table.row(vec![
            r.id.clone(),
            status,
            r.executor.clone(),
            r.tool.clone().unwrap_or_else(|| "-".into()),
            r.attempt.to_string(),
            r.version.to_string(),
            r.records.to_string(),
            fmt::time(r.created),
            fmt::time(r.updated),
        ]);
    }
    out.text(table.render(0))?;
    let flagged = rows.iter().filter(|r| r.problem.is_some()).count();
    if flagged > 0 {
        out.line(format!(
            "{} marked ! {} not fold cleanly: run `dtask verify`",
            fmt::count(flagged as u64, "task"),
            if flagged == 1 { "does" } else { "do" }
        ))?;
    }
    if let Some(next) = next_after {
        out.line(format!("more: --after {next}"))?;
    }
    out.flush()
}

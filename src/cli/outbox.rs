//! `dtask outbox`: the notifications queued and not yet acknowledged, oldest first — what a
//! session's consumer has still to take (`POST /api/notifications/receive`,
//! `TaskStore::receive_notifications`). Read-only: it opens the journal as a reader, beside a
//! process that writes it, and leases nothing.

use super::fmt::{self, Table};
use super::{Global, Out, Result};
use dtask_journal::Journal;
use serde_json::{json, Value};
use std::collections::HashMap;

/// Arguments of `dtask outbox`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only the notifications routed to this session.
    #[arg(long)]
    session: Option<String>,
    /// Only the notifications of this task.
    #[arg(long)]
    task: Option<String>,
    /// Show at most N (0: all); the count covers every one that matches.
    #[arg(long, default_value_t = 100, value_name = "N")]
    limit: usize,
}

/// One queued notification.
struct Entry {
    seq: u64,
    task: String,
    position: u64,
    id: String,
    session: String,
    kind: String,
    delivery: &'static str,
    version: u64,
    data_size: usize,
    queued_at: dtask_journal::Timestamp,
}

impl Entry {
    fn json(&self) -> Value {
        json!({
            "seq": self.seq,
            "task": self.task,
            "position": self.position,
            "id": self.id,
            "session_id": self.session,
            "kind": self.kind,
            "delivery": self.delivery,
            "version": self.version,
            "data_size": self.data_size,
            "queued_at": self.queued_at.as_millis(),
        })
    }
}

/// The session a task's notifications are routed to, read off its creation (cached).
fn session_of<'a>(
    journal: &Journal,
    sessions: &'a mut HashMap<String, String>,
    task: &str,
) -> Result<&'a str> {
    if !sessions.contains_key(task) {
        let session = match journal.read_stream(task, 0).next().transpose()? {
            Some(record) => record
                .event
                .spec()
                .map(|spec| spec.session_id.clone())
                .unwrap_or_default(),
            None => String::new(),
        };
        sessions.insert(task.to_owned(), session);
    }
    Ok(sessions.get(task).map_or("", String::as_str))
}

/// Runs `dtask outbox`.
pub fn run(global: &Global, args: &Args) -> Result<()> {
    let journal = global.at()?.open_reader()?;
    let mut sessions = HashMap::new();
    let (mut shown, mut count) = (Vec::new(), 0u64);
    let mut oldest = None;
    for item in journal.outbox() {
        let item = item?;
        if args.task.as_deref().is_some_and(|t| t != item.task) {
            continue;
        }
        let session = session_of(&journal, &mut sessions, &item.task)?.to_owned();
        if args.session.as_deref().is_some_and(|s| s != session) {
            continue;
        }
        let record = &item.record;
        let Some(queued) = record.event.queued_notification() else {
            // The audit reports an entry that names another record (`dtask verify`).
            continue;
        };
        count += 1;
        let at = queued.at;
        oldest = Some(oldest.map_or(at, |o: dtask_journal::Timestamp| o.min(at)));
        if args.limit == 0 || shown.len() < args.limit {
            shown.push(Entry {
                seq: record.seq,
                task: item.task.clone(),
                position: record.position,
                id: queued.id.to_owned(),
                session,
                kind: queued.kind.to_owned(),
                delivery: queued.delivery.as_str(),
                version: queued.version,
                data_size: queued.data.len(),
                queued_at: at,
            });
        }
    }
    let mut out = Out::new();
    if global.json {
        return out.json(&json!({
            "count": count,
            "oldest_queued_at": oldest.map(dtask_journal::Timestamp::as_millis),
            "notifications": shown.iter().map(Entry::json).collect::<Vec<_>>(),
        }));
    }
    match oldest {
        None => out.line("the outbox is empty: every notification was acknowledged")?,
        Some(at) => out.line(format!(
            "{} waiting, the oldest queued {}",
            fmt::count(count, "notification"),
            fmt::time(at)
        ))?,
    }
    if !shown.is_empty() {
        let mut table = Table::new(&[
            "SEQ",
            "QUEUED_AT",
            "TASK",
            "SESSION",
            "KIND",
            "DELIVERY",
            "DATA",
            "ID",
        ]);
        for q in &shown {
            table.row(vec![
                q.seq.to_string(),
                fmt::time(q.queued_at),
                q.task.clone(),
                q.session.clone(),
                q.kind.clone(),
                q.delivery.to_owned(),
                fmt::size(q.data_size as u64),
                q.id.clone(),
            ]);
        }
        out.text(table.render(2))?;
        if (shown.len() as u64) < count {
            out.line(format!(
                "  … {} more (--limit 0 shows all)",
                count - shown.len() as u64
            ))?;
        }
    }
    out.flush()
}

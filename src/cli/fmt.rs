//! Formatting shared by the subcommands: times, sizes, bytes, tables.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use dtask_journal::{Event, Timestamp};
use std::fmt::Write;

/// The wall clock now, as the journal records time.
pub fn now() -> Timestamp {
    Timestamp(
        u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis()),
        )
        .unwrap_or(u64::MAX),
    )
}

/// A timestamp as RFC 3339 in UTC with milliseconds: `2024-05-01T12:00:00.000Z` (a time past
/// the year 9999, which only a forged record can hold, as milliseconds since the epoch).
pub fn time(at: Timestamp) -> String {
    i64::try_from(at.as_millis())
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(
            || format!("{} ms after the epoch", at.as_millis()),
            |t| t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        )
}

/// An optional timestamp, `-` when absent.
pub fn opt_time(at: Option<Timestamp>) -> String {
    at.map_or_else(|| "-".to_owned(), time)
}

/// Parses a time: milliseconds since the epoch, a date `YYYY-MM-DD` (midnight UTC), or an
/// RFC 3339 time with or without fractional seconds (`2024-05-01T12:00:00Z`,
/// `2024-05-01T12:00:00.250+02:00`). Impossible dates (`2024-02-31`) are refused.
pub fn parse_time(text: &str) -> Result<Timestamp, String> {
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(Timestamp(ms));
    }
    let bad = |why: &dyn std::fmt::Display| {
        format!(
            "bad time {text:?} ({why}): use milliseconds since the epoch, YYYY-MM-DD or RFC 3339 \
             (YYYY-MM-DDTHH:MM:SS[.mmm]Z)"
        )
    };
    let instant = if text.contains(['T', 't', ' ']) {
        text.parse::<jiff::Timestamp>().map_err(|e| bad(&e))?
    } else {
        let date = text.parse::<jiff::civil::Date>().map_err(|e| bad(&e))?;
        date.to_zoned(jiff::tz::TimeZone::UTC)
            .map_err(|e| bad(&e))?
            .timestamp()
    };
    u64::try_from(instant.as_millisecond())
        .map(Timestamp)
        .map_err(|_| bad(&"before 1970"))
}

/// `n` and the noun, plural unless `n` is 1: `1 task`, `2 tasks`, `3 crashes`.
pub fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        return format!("1 {noun}");
    }
    let es = ["s", "sh", "ch", "x"].iter().any(|end| noun.ends_with(end));
    format!("{n} {noun}{}", if es { "es" } else { "s" })
}

/// A byte count for humans: `512 B`, `1.5 KiB`, `3.2 MiB`.
#[allow(clippy::cast_precision_loss, reason = "an approximate size for humans")]
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Bytes for humans: quoted text when printable UTF-8, else `base64:…`.
pub fn bytes(data: &[u8]) -> String {
    match std::str::from_utf8(data) {
        Ok(text) if printable(text) => format!("{text:?}"),
        _ => format!("base64:{}", STANDARD.encode(data)),
    }
}

/// Whether `text` is printable: no control characters other than newlines and tabs.
fn printable(text: &str) -> bool {
    !text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
}

/// A preview of printable UTF-8 `data`: quoted and escaped, cut after `max` characters (then
/// followed by `…`); `None` for empty or binary data.
pub fn preview(data: &[u8], max: usize) -> Option<String> {
    let text = std::str::from_utf8(data).ok().filter(|t| printable(t))?;
    if text.is_empty() {
        return None;
    }
    match text.char_indices().nth(max) {
        Some((cut, _)) => Some(format!("{:?}…", &text[..cut])),
        None => Some(format!("{text:?}")),
    }
}

/// The first `n` hex digits of `hex`.
pub fn short(hex: &str, n: usize) -> &str {
    hex.get(..n).unwrap_or(hex)
}

/// The `tool_name` of a JSON payload `{"tool_name": …}`, if the payload is one.
pub fn tool_name(payload: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(payload).ok()?;
    value.get("tool_name")?.as_str().map(str::to_owned)
}

/// A one-line summary of an event's fields (sizes, not bytes).
#[allow(clippy::too_many_lines, reason = "one arm per event type reads best")]
pub fn summary(event: &Event) -> String {
    let n = |b: &[u8]| format!("{} B", b.len());
    match event {
        Event::Created {
            spec,
            policy,
            checkpoint,
            ..
        } => {
            let mut s = format!(
                "executor={} kind={} policy={} payload={}",
                spec.executor_key,
                spec.kind,
                policy.as_str(),
                n(&spec.payload)
            );
            if !checkpoint.is_empty() {
                let _ = write!(s, " checkpoint={}", n(checkpoint));
            }
            if !spec.session_id.is_empty() {
                let _ = write!(s, " session={}", spec.session_id);
            }
            s
        }
        Event::AttemptStarted {
            attempt,
            lease_deadline,
            ..
        } => format!("attempt={attempt} lease={}", time(*lease_deadline)),
        Event::Heartbeat { lease_deadline, .. } => format!("lease={}", time(*lease_deadline)),
        Event::StartCommitted { checkpoint, .. }
        | Event::WaitingInput { checkpoint, .. }
        | Event::Suspended { checkpoint, .. }
        | Event::Yielded { checkpoint, .. } => format!("checkpoint={}", n(checkpoint)),
        Event::TranscriptFailed { error, .. } | Event::Failed { error, .. } => {
            format!("error={error:?}")
        }
        Event::InputProvided { data, .. } | Event::Completed { data, .. } => {
            format!("data={}", n(data))
        }
        Event::Released {
            context_snapshot, ..
        } => context_snapshot
            .as_ref()
            .map_or_else(String::new, |s| format!("context_snapshot={}", n(s))),
        Event::CancelRequested {
            reason,
            lease_deadline,
            direct,
            ..
        } => {
            let mut s = format!("reason={reason:?} direct={direct}");
            if let Some(d) = lease_deadline {
                let _ = write!(s, " lease={}", time(*d));
            }
            s
        }
        Event::LeaseExpired {
            resolution,
            deadline,
            ..
        } => format!("resolution={resolution:?} deadline={}", time(*deadline)).to_lowercase(),
        Event::Canceled { reason, .. } | Event::Hold { reason, .. } => {
            format!("reason={reason:?}")
        }
        Event::UpdateAppended {
            attempt,
            event_id,
            kind,
            data,
            ..
        }
        | Event::ParentNotified {
            attempt,
            event_id,
            kind,
            data,
            ..
        } => format!(
            "attempt={attempt} event_id={event_id} kind={kind} data={}",
            n(data)
        ),
        Event::ParentNotifiedV2 {
            attempt,
            event_id,
            kind,
            data,
            delivery,
            ..
        } => format!(
            "attempt={attempt} event_id={event_id} kind={kind} delivery={} data={}",
            delivery.as_str(),
            n(data)
        ),
        Event::NotificationEnqueued {
            id, kind, version, ..
        } => format!("id={id} kind={kind} version={version}"),
        Event::NotificationEnqueuedV2 {
            id,
            kind,
            version,
            delivery,
            ..
        } => format!(
            "id={id} kind={kind} version={version} delivery={}",
            delivery.as_str()
        ),
        Event::NotificationAcked {
            id, enqueued_seq, ..
        } => format!("id={id} enqueued_seq={enqueued_seq}"),
        Event::CreatedV2 {
            spec,
            policy,
            checkpoint,
            publication,
            parent_task_id,
            root_session_id,
            ..
        } => {
            let mut s = format!(
                "executor={} kind={} policy={} payload={} publication={}",
                spec.executor_key,
                spec.kind,
                policy.as_str(),
                n(&spec.payload),
                publication.as_str()
            );
            if !checkpoint.is_empty() {
                let _ = write!(s, " checkpoint={}", n(checkpoint));
            }
            if !parent_task_id.is_empty() {
                let _ = write!(s, " parent={parent_task_id}");
            }
            if !root_session_id.is_empty() {
                let _ = write!(s, " root_session={root_session_id}");
            }
            if !spec.session_id.is_empty() {
                let _ = write!(s, " session={}", spec.session_id);
            }
            s
        }
        Event::ChildCreated {
            child_id,
            attempt,
            generation,
            ..
        } => format!("child={child_id} attempt={attempt} generation={generation}"),
        Event::InputSent {
            sequence,
            event_id,
            kind,
            data,
            delivery,
            ..
        } => format!(
            "sequence={sequence} event_id={event_id} kind={kind} delivery={} data={}",
            delivery.as_str(),
            n(data)
        ),
        Event::InputWoke { sequence, .. } => format!("by input {sequence}"),
        Event::CursorAdvanced {
            cursor, attempt, ..
        } => format!("cursor={cursor} attempt={attempt}"),
        Event::InputCommitted {
            cursor, checkpoint, ..
        }
        | Event::InputsPending {
            cursor, checkpoint, ..
        } => format!("cursor={cursor} checkpoint={}", n(checkpoint)),
        Event::Published { .. } => "on_background".to_owned(),
        Event::PartAppended {
            attempt,
            event_id,
            part_id,
            last,
            kind,
            data,
            ..
        } => format!(
            "attempt={attempt} event_id={event_id} part={part_id}{} kind={kind} data={}",
            if *last { " (final)" } else { "" },
            n(data)
        ),
        Event::ParentNotificationFailed { kind, error, .. } => {
            format!("kind={kind} error={error:?}")
        }
        Event::RerunOf { task, .. } | Event::RerunAs { task, .. } => format!("task={task}"),
        Event::RecoveryLimit { max_recoveries, .. } => format!("max_recoveries={max_recoveries}"),
        Event::NotBefore { until, .. } => format!("until={}", time(*until)),
        Event::Purged { records, .. } => format!("records={records}"),
        Event::HoldLifted { .. } => String::new(),
        Event::UpdateTrimmed {
            attempt,
            event_id,
            part_id,
            kind,
            bytes,
            ..
        } => format!(
            "attempt={attempt} event_id={event_id}{} kind={kind} trimmed={}",
            if part_id.is_empty() {
                String::new()
            } else {
                format!(" part={part_id}")
            },
            size(*bytes)
        ),
        Event::ProgressTrimmed { records, bytes, .. } => {
            format!("records={records} saved={}", size(*bytes))
        }
    }
}

/// A plain text table: columns separated by two spaces, the last one not padded.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&str]) -> Self {
        Self {
            rows: vec![headers.iter().map(|h| (*h).to_owned()).collect()],
        }
    }

    /// Adds a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, each line indented by `indent` spaces.
    pub fn render(&self, indent: usize) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = " ".repeat(indent);
            for (c, cell) in row.iter().enumerate() {
                if c + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    let pad = widths[c].saturating_sub(cell.chars().count());
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad + 2));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        assert_eq!(time(Timestamp(0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            time(Timestamp(1_700_000_000_123)),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(
            parse_time("2023-11-14T22:13:20.123Z"),
            Ok(Timestamp(1_700_000_000_123))
        );
        assert_eq!(parse_time("2024-02-29"), Ok(Timestamp(1_709_164_800_000)));
        assert_eq!(
            time(Timestamp(1_709_164_800_000)),
            "2024-02-29T00:00:00.000Z"
        );
        assert_eq!(parse_time("12"), Ok(Timestamp(12)));
        assert!(parse_time("yesterday").is_err());
        assert!(parse_time("2024-13-01").is_err());
        assert!(parse_time("2024-02-31").is_err());
        assert!(parse_time("2023-02-29").is_err());
        assert!(parse_time("2024-02-31T00:00:00Z").is_err());
        assert!(
            parse_time("2024-05-01T12:00:00").is_err(),
            "an offset is required"
        );
        assert_eq!(
            parse_time("2023-11-14T22:13:20Z"),
            Ok(Timestamp(1_700_000_000_000))
        );
        assert_eq!(
            parse_time("2023-11-15T00:13:20.5+02:00"),
            Ok(Timestamp(1_700_000_000_500))
        );
        assert!(parse_time("1969-12-31").is_err());
    }

    #[test]
    fn counts_pluralize() {
        assert_eq!(count(1, "task"), "1 task");
        assert_eq!(count(0, "task"), "0 tasks");
        assert_eq!(count(2, "crash"), "2 crashes");
        assert_eq!(count(1, "side effect"), "1 side effect");
    }

    #[test]
    fn previews_cut_long_text_and_skip_binary() {
        assert_eq!(preview(b"exit 0", 40), Some("\"exit 0\"".into()));
        assert_eq!(
            preview("héllo wörld".as_bytes(), 5),
            Some("\"héllo\"…".into())
        );
        assert_eq!(preview(b"a\nb", 40), Some("\"a\\nb\"".into()));
        assert_eq!(preview(&[0xff, 0x00], 40), None);
        assert_eq!(preview(b"", 40), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(size(12), "12 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(3 << 20), "3.0 MiB");
    }

    #[test]
    fn tables_align() {
        let mut t = Table::new(&["A", "BB"]);
        t.row(vec!["xxx".into(), "y".into()]);
        assert_eq!(t.render(0), "A    BB\nxxx  y\n");
    }
}

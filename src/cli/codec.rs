//! Events as JSON (the event objects of the export format, `docs/export-format.md`), both ways.
//!
//! Every field of every event is written, so that [`event_from_json`] rebuilds the exact event
//! (and so the exact record bytes). Byte fields are standard base64 with padding; with
//! [`Bytes::Redact`] they become `{"redacted_len": N}`, which cannot be read back.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use dtask_journal::{Event, ExpiryResolution, LeasePolicy, TaskSpec, Timestamp};
use serde_json::{Map, Value};

/// How byte fields are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bytes {
    /// Base64.
    Base64,
    /// `{"redacted_len": N}`.
    Redact,
}

fn resolution_str(r: ExpiryResolution) -> &'static str {
    match r {
        ExpiryResolution::Retry => "retry",
        ExpiryResolution::Failed => "failed",
        ExpiryResolution::Canceled => "canceled",
    }
}

/// The event as a JSON object: `{"type": "<event type>", <every field>}`; times are
/// milliseconds since the UNIX epoch. It is what [`write_event_json`] writes, parsed: one
/// encoder of the format serves both the streaming and the value forms.
pub fn event_to_json(event: &Event, b: Bytes) -> Value {
    let mut out = Vec::new();
    write_event_json(&mut out, event, b);
    serde_json::from_slice(&out).unwrap_or(Value::Null)
}

/// Appends `s` as a JSON string, escaped exactly as `serde_json` escapes it.
pub fn push_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        start = i + 1;
        if escape.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(escape);
        }
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Appends `n` in decimal.
pub fn push_u64(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        // `n % 10` is a single digit.
        #[allow(clippy::cast_possible_truncation)]
        let digit = (n % 10) as u8;
        digits[at] = b'0' + digit;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

fn push_bool(out: &mut Vec<u8>, b: bool) {
    out.extend_from_slice(if b { b"true" } else { b"false" });
}

fn push_bytes(out: &mut Vec<u8>, b: Bytes, data: &[u8]) {
    match b {
        Bytes::Base64 => {
            out.push(b'"');
            let at = out.len();
            out.resize(at + base64::encoded_len(data.len(), true).unwrap_or(0), 0);
            let n = STANDARD.encode_slice(data, &mut out[at..]).unwrap_or(0);
            out.truncate(at + n);
            out.push(b'"');
        }
        Bytes::Redact => {
            out.extend_from_slice(b"{\"redacted_len\":");
            push_u64(out, data.len() as u64);
            out.push(b'}');
        }
    }
}

fn push_opt_bytes(out: &mut Vec<u8>, b: Bytes, data: Option<&Vec<u8>>) {
    match data {
        Some(data) => push_bytes(out, b, data),
        None => out.extend_from_slice(b"null"),
    }
}

/// A JSON object written field by field; fields must come in lexicographic order (the order
/// `serde_json` writes a map in).
struct Obj<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Obj<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Self { out, first: true }
    }

    fn key(&mut self, key: &str) -> &mut Vec<u8> {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
        self.out
    }

    fn u64(&mut self, key: &str, n: u64) -> &mut Self {
        push_u64(self.key(key), n);
        self
    }

    fn str(&mut self, key: &str, s: &str) -> &mut Self {
        push_str(self.key(key), s);
        self
    }

    fn bool(&mut self, key: &str, v: bool) -> &mut Self {
        push_bool(self.key(key), v);
        self
    }

    fn bytes(&mut self, key: &str, b: Bytes, data: &[u8]) -> &mut Self {
        push_bytes(self.key(key), b, data);
        self
    }

    fn opt_bytes(&mut self, key: &str, b: Bytes, data: Option<&Vec<u8>>) -> &mut Self {
        push_opt_bytes(self.key(key), b, data);
        self
    }

    fn end(&mut self) {
        self.out.push(b'}');
    }
}

/// Appends the event object of [`event_to_json`] to `out`, byte for byte as `serde_json`
/// writes that value, without building it.
#[allow(clippy::too_many_lines, reason = "one arm per event type reads best")]
pub fn write_event_json(out: &mut Vec<u8>, event: &Event, b: Bytes) {
    let ty = event.event_type().as_str();
    let mut o = Obj::new(out);
    match event {
        Event::Created {
            spec,
            policy,
            checkpoint,
            context_snapshot,
            at,
        } => {
            o.u64("at", at.0)
                .bytes("checkpoint", b, checkpoint)
                .bytes("context_snapshot", b, context_snapshot)
                .str("policy", policy.as_str());
            let mut s = Obj::new(o.key("spec"));
            s.str("description", &spec.description)
                .str("executor_key", &spec.executor_key)
                .str("id", &spec.id)
                .str("kind", &spec.kind)
                .bool("notify_session", spec.notify_session)
                .str("output_file", &spec.output_file)
                .bytes("payload", b, &spec.payload)
                .str("session_id", &spec.session_id)
                .end();
            o.str("type", ty);
        }
        Event::AttemptStarted {
            attempt,
            lease_deadline,
            at,
        } => {
            o.u64("at", at.0)
                .u64("attempt", *attempt)
                .u64("lease_deadline", lease_deadline.0)
                .str("type", ty);
        }
        Event::Heartbeat { lease_deadline, at } => {
            o.u64("at", at.0)
                .u64("lease_deadline", lease_deadline.0)
                .str("type", ty);
        }
        Event::StartCommitted { checkpoint, at }
        | Event::WaitingInput { checkpoint, at }
        | Event::Suspended { checkpoint, at }
        | Event::Yielded { checkpoint, at } => {
            o.u64("at", at.0)
                .bytes("checkpoint", b, checkpoint)
                .str("type", ty);
        }
        Event::TranscriptFailed { error, at } | Event::Failed { error, at } => {
            o.u64("at", at.0).str("error", error).str("type", ty);
        }
        Event::InputProvided {
            data,
            context_snapshot,
            at,
        } => {
            o.u64("at", at.0)
                .opt_bytes("context_snapshot", b, context_snapshot.as_ref())
                .bytes("data", b, data)
                .str("type", ty);
        }
        Event::Released {
            context_snapshot,
            at,
        } => {
            o.u64("at", at.0)
                .opt_bytes("context_snapshot", b, context_snapshot.as_ref())
                .str("type", ty);
        }
        Event::CancelRequested {
            reason,
            lease_deadline,
            direct,
            at,
        } => {
            o.u64("at", at.0).bool("direct", *direct);
            match lease_deadline {
                Some(d) => push_u64(o.key("lease_deadline"), d.0),
                None => o.key("lease_deadline").extend_from_slice(b"null"),
            }
            o.str("reason", reason).str("type", ty);
        }
        Event::LeaseExpired {
            resolution,
            deadline,
            at,
        } => {
            o.u64("at", at.0)
                .u64("deadline", deadline.0)
                .str("resolution", resolution_str(*resolution))
                .str("type", ty);
        }
        Event::Completed { data, at } => {
            o.u64("at", at.0).bytes("data", b, data).str("type", ty);
        }
        Event::Canceled { reason, at } => {
            o.u64("at", at.0).str("reason", reason).str("type", ty);
        }
        Event::UpdateAppended {
            attempt,
            event_id,
            kind,
            data,
            metadata,
            at,
        } => {
            o.u64("at", at.0)
                .u64("attempt", *attempt)
                .bytes("data", b, data)
                .str("event_id", event_id)
                .str("kind", kind);
            let out = o.key("metadata");
            out.push(b'[');
            for (i, (k, v)) in metadata.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.push(b'[');
                push_str(out, k);
                out.push(b',');
                push_str(out, v);
                out.push(b']');
            }
            out.push(b']');
            o.str("type", ty);
        }
        Event::NotificationEnqueued {
            id,
            event_id,
            kind,
            data,
            version,
            at,
        } => {
            o.u64("at", at.0)
                .bytes("data", b, data)
                .str("event_id", event_id)
                .str("id", id)
                .str("kind", kind)
                .str("type", ty)
                .u64("version", *version);
        }
        Event::NotificationAcked {
            id,
            enqueued_seq,
            at,
        } => {
            o.u64("at", at.0)
                .u64("enqueued_seq", *enqueued_seq)
                .str("id", id)
                .str("type", ty);
        }
    }
    o.end();
}

/// Reads fields of one JSON object, counting what was read so that unknown fields are refused.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    what: &'static str,
    read: usize,
}

impl<'a> Fields<'a> {
    fn new(value: &'a Value, what: &'static str) -> Result<Self, String> {
        let map = value
            .as_object()
            .ok_or_else(|| format!("{what}: not a JSON object"))?;
        Ok(Self { map, what, read: 0 })
    }

    fn get(&mut self, name: &str) -> Result<&'a Value, String> {
        self.read += 1;
        self.map
            .get(name)
            .ok_or_else(|| format!("{}: missing field {name:?}", self.what))
    }

    fn bad(&self, name: &str, expected: &str) -> String {
        format!("{}: field {name:?} must be {expected}", self.what)
    }

    fn u64(&mut self, name: &str) -> Result<u64, String> {
        let v = self.get(name)?;
        v.as_u64()
            .ok_or_else(|| self.bad(name, "an unsigned integer"))
    }

    fn at(&mut self, name: &str) -> Result<Timestamp, String> {
        self.u64(name).map(Timestamp)
    }

    fn string(&mut self, name: &str) -> Result<String, String> {
        let v = self.get(name)?;
        v.as_str()
            .map(str::to_owned)
            .ok_or_else(|| self.bad(name, "a string"))
    }

    fn bool(&mut self, name: &str) -> Result<bool, String> {
        let v = self.get(name)?;
        v.as_bool().ok_or_else(|| self.bad(name, "a boolean"))
    }

    fn decode(&self, name: &str, v: &Value) -> Result<Vec<u8>, String> {
        if v.get("redacted_len").is_some() {
            return Err(format!(
                "{}: field {name:?} was redacted (--no-payload): a redacted export cannot be imported",
                self.what
            ));
        }
        let text = v.as_str().ok_or_else(|| self.bad(name, "base64 text"))?;
        STANDARD
            .decode(text)
            .map_err(|e| format!("{}: field {name:?}: bad base64: {e}", self.what))
    }

    fn bytes(&mut self, name: &str) -> Result<Vec<u8>, String> {
        let v = self.get(name)?;
        self.decode(name, v)
    }

    fn opt_bytes(&mut self, name: &str) -> Result<Option<Vec<u8>>, String> {
        match self.get(name)? {
            Value::Null => Ok(None),
            v => self.decode(name, v).map(Some),
        }
    }

    fn opt_at(&mut self, name: &str) -> Result<Option<Timestamp>, String> {
        match self.get(name)? {
            Value::Null => Ok(None),
            v => v
                .as_u64()
                .map(|t| Some(Timestamp(t)))
                .ok_or_else(|| self.bad(name, "an unsigned integer or null")),
        }
    }

    /// Refuses fields that were not read.
    fn done(self, extra: usize) -> Result<(), String> {
        if self.map.len() == self.read + extra {
            Ok(())
        } else {
            Err(format!("{}: unknown fields", self.what))
        }
    }
}

fn spec_from_json(value: &Value) -> Result<TaskSpec, String> {
    let mut f = Fields::new(value, "spec")?;
    let spec = TaskSpec {
        id: f.string("id")?,
        executor_key: f.string("executor_key")?,
        kind: f.string("kind")?,
        payload: f.bytes("payload")?,
        description: f.string("description")?,
        output_file: f.string("output_file")?,
        session_id: f.string("session_id")?,
        notify_session: f.bool("notify_session")?,
    };
    f.done(0)?;
    Ok(spec)
}

fn metadata_from_json(value: &Value) -> Result<Vec<(String, String)>, String> {
    let bad = || "event: field \"metadata\" must be a list of [key, value] strings".to_owned();
    value
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|pair| match pair.as_array().map(Vec::as_slice) {
            Some([Value::String(k), Value::String(v)]) => Ok((k.clone(), v.clone())),
            _ => Err(bad()),
        })
        .collect()
}

/// Rebuilds an event from its JSON object (see [`event_to_json`]).
///
/// # Errors
/// A message naming the missing, unknown or malformed field.
#[allow(clippy::too_many_lines, reason = "one arm per event type reads best")]
pub fn event_from_json(value: &Value) -> Result<Event, String> {
    let mut f = Fields::new(value, "event")?;
    let ty = f.string("type")?;
    let event = match ty.as_str() {
        "created" => {
            let spec = spec_from_json(f.get("spec")?)?;
            let policy = match f.string("policy")?.as_str() {
                "retry" => LeasePolicy::Retry,
                "fail" => LeasePolicy::Fail,
                other => return Err(format!("event: unknown policy {other:?}")),
            };
            Event::Created {
                spec,
                policy,
                checkpoint: f.bytes("checkpoint")?,
                context_snapshot: f.bytes("context_snapshot")?,
                at: f.at("at")?,
            }
        }
        "attempt_started" => Event::AttemptStarted {
            attempt: f.u64("attempt")?,
            lease_deadline: f.at("lease_deadline")?,
            at: f.at("at")?,
        },
        "heartbeat" => Event::Heartbeat {
            lease_deadline: f.at("lease_deadline")?,
            at: f.at("at")?,
        },
        "start_committed" => Event::StartCommitted {
            checkpoint: f.bytes("checkpoint")?,
            at: f.at("at")?,
        },
        "waiting_input" => Event::WaitingInput {
            checkpoint: f.bytes("checkpoint")?,
            at: f.at("at")?,
        },
        "suspended" => Event::Suspended {
            checkpoint: f.bytes("checkpoint")?,
            at: f.at("at")?,
        },
        "yielded" => Event::Yielded {
            checkpoint: f.bytes("checkpoint")?,
            at: f.at("at")?,
        },
        "transcript_failed" => Event::TranscriptFailed {
            error: f.string("error")?,
            at: f.at("at")?,
        },
        "failed" => Event::Failed {
            error: f.string("error")?,
            at: f.at("at")?,
        },
        "input_provided" => Event::InputProvided {
            data: f.bytes("data")?,
            context_snapshot: f.opt_bytes("context_snapshot")?,
            at: f.at("at")?,
        },
        "released" => Event::Released {
            context_snapshot: f.opt_bytes("context_snapshot")?,
            at: f.at("at")?,
        },
        "cancel_requested" => Event::CancelRequested {
            reason: f.string("reason")?,
            lease_deadline: f.opt_at("lease_deadline")?,
            direct: f.bool("direct")?,
            at: f.at("at")?,
        },
        "lease_expired" => Event::LeaseExpired {
            resolution: match f.string("resolution")?.as_str() {
                "retry" => ExpiryResolution::Retry,
                "failed" => ExpiryResolution::Failed,
                "canceled" => ExpiryResolution::Canceled,
                other => return Err(format!("event: unknown resolution {other:?}")),
            },
            deadline: f.at("deadline")?,
            at: f.at("at")?,
        },
        "completed" => Event::Completed {
            data: f.bytes("data")?,
            at: f.at("at")?,
        },
        "canceled" => Event::Canceled {
            reason: f.string("reason")?,
            at: f.at("at")?,
        },
        "update_appended" => Event::UpdateAppended {
            attempt: f.u64("attempt")?,
            event_id: f.string("event_id")?,
            kind: f.string("kind")?,
            data: f.bytes("data")?,
            metadata: metadata_from_json(f.get("metadata")?)?,
            at: f.at("at")?,
        },
        "notification_enqueued" => Event::NotificationEnqueued {
            id: f.string("id")?,
            event_id: f.string("event_id")?,
            kind: f.string("kind")?,
            data: f.bytes("data")?,
            version: f.u64("version")?,
            at: f.at("at")?,
        },
        "notification_acked" => Event::NotificationAcked {
            id: f.string("id")?,
            enqueued_seq: f.u64("enqueued_seq")?,
            at: f.at("at")?,
        },
        other => return Err(format!("event: unknown type {other:?}")),
    };
    f.done(0)?;
    Ok(event)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn samples() -> Vec<Event> {
        let at = Timestamp(7);
        vec![
            Event::Created {
                spec: TaskSpec {
                    id: "t".into(),
                    executor_key: "x".into(),
                    kind: "k".into(),
                    payload: vec![0, 1, 255],
                    description: "d".into(),
                    output_file: "o".into(),
                    session_id: "s".into(),
                    notify_session: true,
                },
                policy: LeasePolicy::Fail,
                checkpoint: vec![9],
                context_snapshot: vec![],
                at,
            },
            Event::AttemptStarted {
                attempt: 1,
                lease_deadline: Timestamp(u64::MAX),
                at,
            },
            Event::InputProvided {
                data: vec![],
                context_snapshot: Some(vec![]),
                at,
            },
            Event::Released {
                context_snapshot: None,
                at,
            },
            Event::CancelRequested {
                reason: "r".into(),
                lease_deadline: None,
                direct: true,
                at,
            },
            Event::LeaseExpired {
                resolution: ExpiryResolution::Canceled,
                deadline: at,
                at,
            },
            Event::UpdateAppended {
                attempt: 2,
                event_id: "e".into(),
                kind: "k".into(),
                data: b"x".to_vec(),
                metadata: vec![("a".into(), "b".into())],
                at,
            },
            Event::NotificationAcked {
                id: "n".into(),
                enqueued_seq: 3,
                at,
            },
        ]
    }

    /// Every variant, with strings that need escaping.
    #[allow(clippy::too_many_lines, reason = "one event per variant reads best")]
    fn every_variant() -> Vec<Event> {
        let at = Timestamp(1_764_000_000_123);
        let odd = "q\"b\\s/\n\r\t\u{8}\u{c}\u{1}\u{1f}\u{7f}é😀 ".to_owned();
        let mut events = samples();
        events.extend([
            Event::Created {
                spec: TaskSpec {
                    id: odd.clone(),
                    executor_key: odd.clone(),
                    kind: String::new(),
                    payload: (0..=255).collect(),
                    description: odd.clone(),
                    output_file: String::new(),
                    session_id: odd.clone(),
                    notify_session: false,
                },
                policy: LeasePolicy::Retry,
                checkpoint: vec![1, 2],
                context_snapshot: vec![3; 100],
                at,
            },
            Event::Heartbeat {
                lease_deadline: Timestamp(0),
                at,
            },
            Event::StartCommitted {
                checkpoint: b"{}".to_vec(),
                at,
            },
            Event::TranscriptFailed {
                error: odd.clone(),
                at,
            },
            Event::WaitingInput {
                checkpoint: vec![1],
                at,
            },
            Event::Suspended {
                checkpoint: vec![1, 2, 3, 4],
                at,
            },
            Event::Yielded {
                checkpoint: vec![],
                at,
            },
            Event::InputProvided {
                data: vec![5; 7],
                context_snapshot: None,
                at,
            },
            Event::Released {
                context_snapshot: Some(vec![8]),
                at,
            },
            Event::CancelRequested {
                reason: odd.clone(),
                lease_deadline: Some(Timestamp(u64::MAX)),
                direct: false,
                at,
            },
            Event::LeaseExpired {
                resolution: ExpiryResolution::Retry,
                deadline: at,
                at,
            },
            Event::LeaseExpired {
                resolution: ExpiryResolution::Failed,
                deadline: at,
                at,
            },
            Event::Completed { data: vec![], at },
            Event::Failed {
                error: "boom".into(),
                at,
            },
            Event::Canceled {
                reason: String::new(),
                at,
            },
            Event::UpdateAppended {
                attempt: u64::MAX,
                event_id: odd.clone(),
                kind: odd.clone(),
                data: vec![],
                metadata: vec![],
                at,
            },
            Event::UpdateAppended {
                attempt: 1,
                event_id: "e".into(),
                kind: "k".into(),
                data: vec![0],
                metadata: vec![(odd.clone(), String::new()), ("x".into(), odd.clone())],
                at,
            },
            Event::NotificationEnqueued {
                id: odd.clone(),
                event_id: String::new(),
                kind: "completed".into(),
                data: vec![9; 3],
                version: 4,
                at,
            },
        ]);
        events
    }

    #[test]
    fn every_variant_is_valid_json_that_imports_back() {
        for event in every_variant() {
            let mut out = Vec::new();
            write_event_json(&mut out, &event, Bytes::Base64);
            let value: Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(event_from_json(&value).unwrap(), event, "{value}");
            let mut redacted = Vec::new();
            write_event_json(&mut redacted, &event, Bytes::Redact);
            let value: Value = serde_json::from_slice(&redacted).unwrap();
            assert_eq!(value["type"], event.event_type().as_str());
        }
        for n in [0, 1, 9, 10, 99, 100, 12_345, u64::MAX] {
            let mut out = Vec::new();
            push_u64(&mut out, n);
            assert_eq!(out, n.to_string().into_bytes());
        }
    }

    #[test]
    fn events_round_trip() {
        for event in samples() {
            let json = event_to_json(&event, Bytes::Base64);
            assert_eq!(event_from_json(&json).unwrap(), event, "{json}");
        }
    }

    #[test]
    fn redacted_and_unknown_fields_are_refused() {
        let redacted = event_to_json(&samples()[0], Bytes::Redact);
        assert!(event_from_json(&redacted).unwrap_err().contains("redacted"));
        let mut extra = event_to_json(&samples()[1], Bytes::Base64);
        extra["surprise"] = json!(1);
        assert!(event_from_json(&extra).unwrap_err().contains("unknown"));
    }
}

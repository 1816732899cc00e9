//! Events as JSON (the event objects of the export format, `docs/export-format.md`), both ways.
//!
//! Every field of every event is written, so that [`event_from_json`] rebuilds the exact event
//! (and so the exact record bytes). Byte fields are standard base64 with padding; with
//! [`Bytes::Redact`] they become `{"redacted_len": N}`, which cannot be read back.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use dtask_journal::{Event, ExpiryResolution, LeasePolicy, TaskSpec, Timestamp};
use serde_json::{json, Map, Value};

/// How byte fields are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bytes {
    /// Base64.
    Base64,
    /// `{"redacted_len": N}`.
    Redact,
}

impl Bytes {
    fn value(self, data: &[u8]) -> Value {
        match self {
            Self::Base64 => Value::String(STANDARD.encode(data)),
            Self::Redact => json!({ "redacted_len": data.len() }),
        }
    }

    fn opt(self, data: Option<&Vec<u8>>) -> Value {
        data.map_or(Value::Null, |d| self.value(d))
    }
}

fn resolution_str(r: ExpiryResolution) -> &'static str {
    match r {
        ExpiryResolution::Retry => "retry",
        ExpiryResolution::Failed => "failed",
        ExpiryResolution::Canceled => "canceled",
    }
}

/// The event as a JSON object: `{"type": "<event type>", <every field>}`; times are
/// milliseconds since the UNIX epoch.
#[allow(clippy::too_many_lines, reason = "one arm per event type reads best")]
pub fn event_to_json(event: &Event, b: Bytes) -> Value {
    let mut fields = match event {
        Event::Created {
            spec,
            policy,
            checkpoint,
            context_snapshot,
            at,
        } => json!({
            "spec": {
                "id": spec.id,
                "executor_key": spec.executor_key,
                "kind": spec.kind,
                "payload": b.value(&spec.payload),
                "description": spec.description,
                "output_file": spec.output_file,
                "session_id": spec.session_id,
                "notify_session": spec.notify_session,
            },
            "policy": policy.as_str(),
            "checkpoint": b.value(checkpoint),
            "context_snapshot": b.value(context_snapshot),
            "at": at.0,
        }),
        Event::AttemptStarted {
            attempt,
            lease_deadline,
            at,
        } => json!({ "attempt": attempt, "lease_deadline": lease_deadline.0, "at": at.0 }),
        Event::Heartbeat { lease_deadline, at } => {
            json!({ "lease_deadline": lease_deadline.0, "at": at.0 })
        }
        Event::StartCommitted { checkpoint, at }
        | Event::WaitingInput { checkpoint, at }
        | Event::Suspended { checkpoint, at }
        | Event::Yielded { checkpoint, at } => {
            json!({ "checkpoint": b.value(checkpoint), "at": at.0 })
        }
        Event::TranscriptFailed { error, at } | Event::Failed { error, at } => {
            json!({ "error": error, "at": at.0 })
        }
        Event::InputProvided {
            data,
            context_snapshot,
            at,
        } => json!({
            "data": b.value(data),
            "context_snapshot": b.opt(context_snapshot.as_ref()),
            "at": at.0,
        }),
        Event::Released {
            context_snapshot,
            at,
        } => json!({ "context_snapshot": b.opt(context_snapshot.as_ref()), "at": at.0 }),
        Event::CancelRequested {
            reason,
            lease_deadline,
            direct,
            at,
        } => json!({
            "reason": reason,
            "lease_deadline": lease_deadline.map(|d| d.0),
            "direct": direct,
            "at": at.0,
        }),
        Event::LeaseExpired {
            resolution,
            deadline,
            at,
        } => json!({
            "resolution": resolution_str(*resolution),
            "deadline": deadline.0,
            "at": at.0,
        }),
        Event::Completed { data, at } => json!({ "data": b.value(data), "at": at.0 }),
        Event::Canceled { reason, at } => json!({ "reason": reason, "at": at.0 }),
        Event::UpdateAppended {
            attempt,
            event_id,
            kind,
            data,
            metadata,
            at,
        } => json!({
            "attempt": attempt,
            "event_id": event_id,
            "kind": kind,
            "data": b.value(data),
            "metadata": metadata.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
            "at": at.0,
        }),
        Event::NotificationEnqueued {
            id,
            event_id,
            kind,
            data,
            version,
            at,
        } => json!({
            "id": id,
            "event_id": event_id,
            "kind": kind,
            "data": b.value(data),
            "version": version,
            "at": at.0,
        }),
        Event::NotificationAcked {
            id,
            enqueued_seq,
            at,
        } => json!({ "id": id, "enqueued_seq": enqueued_seq, "at": at.0 }),
    };
    let mut out = Map::new();
    out.insert("type".into(), event.event_type().as_str().into());
    if let Value::Object(map) = &mut fields {
        out.append(map);
    }
    Value::Object(out)
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

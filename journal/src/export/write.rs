//! Writing: an event and a record as the export's JSON, in the exact bytes `dtask export`
//! writes.

use super::fields::{b16, ByteField, CrcHex, DigestHex};
use super::read::RecordLine;
use super::{ByteFields, ExportError};
use crate::event::{Event, TaskSpec};
use crate::record::{Digest, Record};
use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};
use serde_with::serde_as;

/// An event as the JSON object of the format: `{"type": "<event type>", <every field>}`, keys
/// in lexicographic order, times as milliseconds since the UNIX epoch.
///
/// Every field of every event is written, so that [`RecordLine::read`] rebuilds the exact
/// event (and so the exact record bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventJson<'a> {
    event: &'a Event,
    bytes: ByteFields,
}

impl<'a> EventJson<'a> {
    /// `event`, its byte fields written as `bytes` says.
    #[must_use]
    pub const fn new(event: &'a Event, bytes: ByteFields) -> Self {
        Self { event, bytes }
    }
}

/// A task spec as the format writes it (inside a `created` event), keys in order.
#[derive(Serialize)]
struct SpecJson<'a> {
    description: &'a str,
    executor_key: &'a str,
    id: &'a str,
    kind: &'a str,
    notify_session: bool,
    output_file: &'a str,
    payload: ByteField<'a>,
    session_id: &'a str,
}

impl<'a> SpecJson<'a> {
    fn of(spec: &'a TaskSpec, how: ByteFields) -> Self {
        Self {
            description: &spec.description,
            executor_key: &spec.executor_key,
            id: &spec.id,
            kind: &spec.kind,
            notify_session: spec.notify_session,
            output_file: &spec.output_file,
            payload: ByteField {
                data: &spec.payload,
                how,
            },
            session_id: &spec.session_id,
        }
    }
}

impl<'a> Serialize for EventJson<'a> {
    /// The fields of each event type in lexicographic order, `type` among them: the order
    /// `serde_json` writes an object's keys in, which the export has always used.
    #[allow(clippy::too_many_lines, reason = "one arm per event type reads best")]
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let bytes = |data: &'a [u8]| ByteField {
            data,
            how: self.bytes,
        };
        let ty = self.event.event_type().as_str();
        match self.event {
            Event::Created {
                spec,
                policy,
                checkpoint,
                context_snapshot,
                at,
            } => {
                let mut o = serializer.serialize_struct("created", 6)?;
                o.serialize_field("at", at)?;
                o.serialize_field("checkpoint", &bytes(checkpoint))?;
                o.serialize_field("context_snapshot", &bytes(context_snapshot))?;
                o.serialize_field("policy", policy)?;
                o.serialize_field("spec", &SpecJson::of(spec, self.bytes))?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::AttemptStarted {
                attempt,
                lease_deadline,
                at,
            } => {
                let mut o = serializer.serialize_struct("attempt_started", 4)?;
                o.serialize_field("at", at)?;
                o.serialize_field("attempt", attempt)?;
                o.serialize_field("lease_deadline", lease_deadline)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::Heartbeat { lease_deadline, at } => {
                let mut o = serializer.serialize_struct("heartbeat", 3)?;
                o.serialize_field("at", at)?;
                o.serialize_field("lease_deadline", lease_deadline)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::StartCommitted { checkpoint, at }
            | Event::WaitingInput { checkpoint, at }
            | Event::Suspended { checkpoint, at }
            | Event::Yielded { checkpoint, at } => {
                let mut o = serializer.serialize_struct("checkpoint", 3)?;
                o.serialize_field("at", at)?;
                o.serialize_field("checkpoint", &bytes(checkpoint))?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::TranscriptFailed { error, at } | Event::Failed { error, at } => {
                let mut o = serializer.serialize_struct("error", 3)?;
                o.serialize_field("at", at)?;
                o.serialize_field("error", error)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::InputProvided {
                data,
                context_snapshot,
                at,
            } => {
                let mut o = serializer.serialize_struct("input_provided", 4)?;
                o.serialize_field("at", at)?;
                o.serialize_field("context_snapshot", &context_snapshot.as_deref().map(bytes))?;
                o.serialize_field("data", &bytes(data))?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::Released {
                context_snapshot,
                at,
            } => {
                let mut o = serializer.serialize_struct("released", 3)?;
                o.serialize_field("at", at)?;
                o.serialize_field("context_snapshot", &context_snapshot.as_deref().map(bytes))?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::CancelRequested {
                reason,
                lease_deadline,
                direct,
                at,
            } => {
                let mut o = serializer.serialize_struct("cancel_requested", 5)?;
                o.serialize_field("at", at)?;
                o.serialize_field("direct", direct)?;
                o.serialize_field("lease_deadline", lease_deadline)?;
                o.serialize_field("reason", reason)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::LeaseExpired {
                resolution,
                deadline,
                at,
            } => {
                let mut o = serializer.serialize_struct("lease_expired", 4)?;
                o.serialize_field("at", at)?;
                o.serialize_field("deadline", deadline)?;
                o.serialize_field("resolution", resolution)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::Completed { data, at } => {
                let mut o = serializer.serialize_struct("completed", 3)?;
                o.serialize_field("at", at)?;
                o.serialize_field("data", &bytes(data))?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::Canceled { reason, at } => {
                let mut o = serializer.serialize_struct("canceled", 3)?;
                o.serialize_field("at", at)?;
                o.serialize_field("reason", reason)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::UpdateAppended {
                attempt,
                event_id,
                kind,
                data,
                metadata,
                at,
            } => {
                let mut o = serializer.serialize_struct("update_appended", 7)?;
                o.serialize_field("at", at)?;
                o.serialize_field("attempt", attempt)?;
                o.serialize_field("data", &bytes(data))?;
                o.serialize_field("event_id", event_id)?;
                o.serialize_field("kind", kind)?;
                o.serialize_field("metadata", metadata)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::NotificationEnqueued {
                id,
                event_id,
                kind,
                data,
                version,
                at,
            } => {
                let mut o = serializer.serialize_struct("notification_enqueued", 7)?;
                o.serialize_field("at", at)?;
                o.serialize_field("data", &bytes(data))?;
                o.serialize_field("event_id", event_id)?;
                o.serialize_field("id", id)?;
                o.serialize_field("kind", kind)?;
                o.serialize_field("type", ty)?;
                o.serialize_field("version", version)?;
                o.end()
            }
            Event::NotificationAcked {
                id,
                enqueued_seq,
                at,
            } => {
                let mut o = serializer.serialize_struct("notification_acked", 4)?;
                o.serialize_field("at", at)?;
                o.serialize_field("enqueued_seq", enqueued_seq)?;
                o.serialize_field("id", id)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::CreatedV2 {
                spec,
                policy,
                checkpoint,
                context_snapshot,
                publication,
                parent_task_id,
                root_session_id,
                at,
            } => {
                let mut o = serializer.serialize_struct("created_v2", 9)?;
                o.serialize_field("at", at)?;
                o.serialize_field("checkpoint", &bytes(checkpoint))?;
                o.serialize_field("context_snapshot", &bytes(context_snapshot))?;
                o.serialize_field("parent_task_id", parent_task_id)?;
                o.serialize_field("policy", policy)?;
                o.serialize_field("publication", publication)?;
                o.serialize_field("root_session_id", root_session_id)?;
                o.serialize_field("spec", &SpecJson::of(spec, self.bytes))?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::ChildCreated {
                child_id,
                attempt,
                generation,
                at,
            } => {
                let mut o = serializer.serialize_struct("child_created", 5)?;
                o.serialize_field("at", at)?;
                o.serialize_field("attempt", attempt)?;
                o.serialize_field("child_id", child_id)?;
                o.serialize_field("generation", generation)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::InputSent {
                sequence,
                event_id,
                kind,
                data,
                delivery,
                at,
            } => {
                let mut o = serializer.serialize_struct("input_sent", 7)?;
                o.serialize_field("at", at)?;
                o.serialize_field("data", &bytes(data))?;
                o.serialize_field("delivery", delivery)?;
                o.serialize_field("event_id", event_id)?;
                o.serialize_field("kind", kind)?;
                o.serialize_field("sequence", sequence)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::InputWoke { sequence, at } => {
                let mut o = serializer.serialize_struct("input_woke", 3)?;
                o.serialize_field("at", at)?;
                o.serialize_field("sequence", sequence)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::CursorAdvanced {
                cursor,
                attempt,
                at,
            } => {
                let mut o = serializer.serialize_struct("cursor_advanced", 4)?;
                o.serialize_field("at", at)?;
                o.serialize_field("attempt", attempt)?;
                o.serialize_field("cursor", cursor)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::InputCommitted {
                cursor,
                checkpoint,
                at,
            }
            | Event::InputsPending {
                cursor,
                checkpoint,
                at,
            } => {
                let mut o = serializer.serialize_struct("input_committed", 4)?;
                o.serialize_field("at", at)?;
                o.serialize_field("checkpoint", &bytes(checkpoint))?;
                o.serialize_field("cursor", cursor)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::Published { at } => {
                let mut o = serializer.serialize_struct("published", 2)?;
                o.serialize_field("at", at)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::PartAppended {
                attempt,
                event_id,
                part_id,
                last,
                kind,
                data,
                metadata,
                at,
            } => {
                let mut o = serializer.serialize_struct("part_appended", 9)?;
                o.serialize_field("at", at)?;
                o.serialize_field("attempt", attempt)?;
                o.serialize_field("data", &bytes(data))?;
                o.serialize_field("event_id", event_id)?;
                o.serialize_field("kind", kind)?;
                o.serialize_field("last", last)?;
                o.serialize_field("metadata", metadata)?;
                o.serialize_field("part_id", part_id)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::ParentNotificationFailed { kind, error, at } => {
                let mut o = serializer.serialize_struct("parent_notification_failed", 4)?;
                o.serialize_field("at", at)?;
                o.serialize_field("error", error)?;
                o.serialize_field("kind", kind)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::RerunOf { task, at } | Event::RerunAs { task, at } => {
                let mut o = serializer.serialize_struct("rerun", 3)?;
                o.serialize_field("at", at)?;
                o.serialize_field("task", task)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::NotBefore { until, at } => {
                let mut o = serializer.serialize_struct("not_before", 3)?;
                o.serialize_field("at", at)?;
                o.serialize_field("type", ty)?;
                o.serialize_field("until", until)?;
                o.end()
            }
            Event::Purged {
                records,
                sequences,
                last_digest,
                at,
            } => {
                let mut o = serializer.serialize_struct("purged", 5)?;
                o.serialize_field("at", at)?;
                o.serialize_field("last_digest", &Digest(*last_digest).to_hex())?;
                o.serialize_field("records", records)?;
                o.serialize_field("sequences", sequences)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::Hold { reason, at } => {
                let mut o = serializer.serialize_struct("hold", 3)?;
                o.serialize_field("at", at)?;
                o.serialize_field("reason", reason)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::HoldLifted { at } => {
                let mut o = serializer.serialize_struct("hold_lifted", 2)?;
                o.serialize_field("at", at)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::UpdateTrimmed {
                attempt,
                event_id,
                part_id,
                last,
                kind,
                bytes,
                at,
            } => {
                let mut o = serializer.serialize_struct("update_trimmed", 8)?;
                o.serialize_field("at", at)?;
                o.serialize_field("attempt", attempt)?;
                o.serialize_field("bytes", bytes)?;
                o.serialize_field("event_id", event_id)?;
                o.serialize_field("kind", kind)?;
                o.serialize_field("last", last)?;
                o.serialize_field("part_id", part_id)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::ProgressTrimmed {
                records,
                bytes,
                digest_before,
                at,
            } => {
                let mut o = serializer.serialize_struct("progress_trimmed", 5)?;
                o.serialize_field("at", at)?;
                o.serialize_field("bytes", bytes)?;
                o.serialize_field("digest_before", &Digest(*digest_before).to_hex())?;
                o.serialize_field("records", records)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::ParentNotified {
                attempt,
                event_id,
                kind,
                data,
                at,
            } => {
                let mut o = serializer.serialize_struct("parent_notified", 6)?;
                o.serialize_field("at", at)?;
                o.serialize_field("attempt", attempt)?;
                o.serialize_field("data", &bytes(data))?;
                o.serialize_field("event_id", event_id)?;
                o.serialize_field("kind", kind)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::NotificationEnqueuedV2 {
                id,
                event_id,
                kind,
                data,
                delivery,
                version,
                at,
            } => {
                let mut o = serializer.serialize_struct("notification_enqueued_v2", 8)?;
                o.serialize_field("at", at)?;
                o.serialize_field("data", &bytes(data))?;
                o.serialize_field("delivery", delivery)?;
                o.serialize_field("event_id", event_id)?;
                o.serialize_field("id", id)?;
                o.serialize_field("kind", kind)?;
                o.serialize_field("type", ty)?;
                o.serialize_field("version", version)?;
                o.end()
            }
            Event::ParentNotifiedV2 {
                attempt,
                event_id,
                kind,
                data,
                delivery,
                at,
            } => {
                let mut o = serializer.serialize_struct("parent_notified_v2", 7)?;
                o.serialize_field("at", at)?;
                o.serialize_field("attempt", attempt)?;
                o.serialize_field("data", &bytes(data))?;
                o.serialize_field("delivery", delivery)?;
                o.serialize_field("event_id", event_id)?;
                o.serialize_field("kind", kind)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
            Event::RecoveryLimit { max_recoveries, at } => {
                let mut o = serializer.serialize_struct("recovery_limit", 3)?;
                o.serialize_field("at", at)?;
                o.serialize_field("max_recoveries", max_recoveries)?;
                o.serialize_field("type", ty)?;
                o.end()
            }
        }
    }
}

///
/// ```text
/// {"crc":"…","digest":"…","event":{…},"position":N,"seq":N,"task":"…"}
/// ```
#[serde_as]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RecordJson<'a> {
    #[serde_as(as = "CrcHex")]
    crc: u32,
    #[serde_as(as = "DigestHex")]
    digest: Digest,
    event: EventJson<'a>,
    position: u64,
    seq: u64,
    task: &'a str,
}

impl<'a> RecordJson<'a> {
    /// The line of `record`, a record of `task`'s stream.
    #[must_use]
    pub const fn new(task: &'a str, record: &'a Record, bytes: ByteFields) -> Self {
        Self {
            crc: record.crc,
            digest: record.digest,
            event: EventJson::new(&record.event, bytes),
            position: record.position,
            seq: record.seq,
            task,
        }
    }

    /// The line of a record read back (with base64 byte fields).
    #[must_use]
    pub const fn of_line(line: &'a RecordLine) -> Self {
        Self {
            crc: line.crc,
            digest: line.digest,
            event: EventJson::new(&line.event, ByteFields::Base64),
            position: line.position,
            seq: line.seq,
            task: line.task.as_str(),
        }
    }

    /// Appends the line (with its `\n`) to `out`: the bytes `serde_json` writes for this
    /// value, then `\n`.
    ///
    /// The line's own keys and hex digits are written as they are, without the escape scan
    /// `serde_json` gives every string (with the digest's hex, ~6 % of an export's CPU); the
    /// event and the task id go through `serde_json`. A test holds the two ways together.
    ///
    /// # Errors
    /// [`ExportError::Write`] if serialization fails (it does not for a record).
    pub fn write_line(&self, out: &mut Vec<u8>) -> Result<(), ExportError> {
        let mut number = itoa::Buffer::new();
        out.extend_from_slice(b"{\"crc\":\"");
        for byte in self.crc.to_be_bytes() {
            out.extend_from_slice(&b16(byte));
        }
        out.extend_from_slice(b"\",\"digest\":\"");
        for byte in self.digest.0 {
            out.extend_from_slice(&b16(byte));
        }
        out.extend_from_slice(b"\",\"event\":");
        serde_json::to_writer(&mut *out, &self.event).map_err(ExportError::Write)?;
        out.extend_from_slice(b",\"position\":");
        out.extend_from_slice(number.format(self.position).as_bytes());
        out.extend_from_slice(b",\"seq\":");
        out.extend_from_slice(number.format(self.seq).as_bytes());
        out.extend_from_slice(b",\"task\":");
        serde_json::to_writer(&mut *out, self.task).map_err(ExportError::Write)?;
        out.extend_from_slice(b"}\n");
        Ok(())
    }
}

//! Reading: a record line back into its record's place, identity and event — the quick way
//! (one pass, the event's variant guessed from the line's text) where it can, the careful
//! way (which names what is wrong) where it cannot.

use super::fields::{CrcHex, DigestHex, StrictBase64};
use super::write::RecordJson;
use super::{parse, ExportError};
use crate::event::{
    Delivery, Event, EventType, ExpiryResolution, LeasePolicy, Publication, TaskSpec, Timestamp,
};
use crate::record::Digest;
use serde::de::{self, IntoDeserializer as _, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use serde_with::{serde_as, Same};
use std::fmt;
use std::sync::Arc;

/// How an event is read: its fields, every one required (`null` for an absent optional
/// value), none unknown. The `type` names the variant.
#[serde_as]
#[derive(Deserialize)]
#[serde(remote = "Event", rename_all = "snake_case", deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "only the remote derive reads this mirror of `Event`"
)]
enum EventDef {
    Created {
        #[serde(deserialize_with = "shared_spec")]
        spec: Arc<TaskSpec>,
        policy: LeasePolicy,
        #[serde_as(as = "StrictBase64")]
        checkpoint: Vec<u8>,
        #[serde_as(as = "StrictBase64")]
        context_snapshot: Vec<u8>,
        at: Timestamp,
    },
    AttemptStarted {
        attempt: u64,
        lease_deadline: Timestamp,
        at: Timestamp,
    },
    Heartbeat {
        lease_deadline: Timestamp,
        at: Timestamp,
    },
    StartCommitted {
        #[serde_as(as = "StrictBase64")]
        checkpoint: Vec<u8>,
        at: Timestamp,
    },
    TranscriptFailed {
        error: String,
        at: Timestamp,
    },
    WaitingInput {
        #[serde_as(as = "StrictBase64")]
        checkpoint: Vec<u8>,
        at: Timestamp,
    },
    Suspended {
        #[serde_as(as = "StrictBase64")]
        checkpoint: Vec<u8>,
        at: Timestamp,
    },
    Yielded {
        #[serde_as(as = "StrictBase64")]
        checkpoint: Vec<u8>,
        at: Timestamp,
    },
    InputProvided {
        #[serde_as(as = "StrictBase64")]
        data: Vec<u8>,
        #[serde_as(as = "Option<StrictBase64>", no_default)]
        context_snapshot: Option<Vec<u8>>,
        at: Timestamp,
    },
    Released {
        #[serde_as(as = "Option<StrictBase64>", no_default)]
        context_snapshot: Option<Vec<u8>>,
        at: Timestamp,
    },
    CancelRequested {
        reason: String,
        #[serde_as(as = "Option<Same>", no_default)]
        lease_deadline: Option<Timestamp>,
        direct: bool,
        at: Timestamp,
    },
    LeaseExpired {
        resolution: ExpiryResolution,
        deadline: Timestamp,
        at: Timestamp,
    },
    Completed {
        #[serde_as(as = "StrictBase64")]
        data: Vec<u8>,
        at: Timestamp,
    },
    Failed {
        error: String,
        at: Timestamp,
    },
    Canceled {
        reason: String,
        at: Timestamp,
    },
    UpdateAppended {
        attempt: u64,
        event_id: String,
        kind: String,
        #[serde_as(as = "StrictBase64")]
        data: Vec<u8>,
        metadata: Vec<(String, String)>,
        at: Timestamp,
    },
    NotificationEnqueued {
        id: String,
        event_id: String,
        kind: String,
        #[serde_as(as = "StrictBase64")]
        data: Vec<u8>,
        version: u64,
        at: Timestamp,
    },
    NotificationAcked {
        id: String,
        enqueued_seq: u64,
        at: Timestamp,
    },
    CreatedV2 {
        #[serde(deserialize_with = "shared_spec")]
        spec: Arc<TaskSpec>,
        policy: LeasePolicy,
        #[serde_as(as = "StrictBase64")]
        checkpoint: Vec<u8>,
        #[serde_as(as = "StrictBase64")]
        context_snapshot: Vec<u8>,
        publication: Publication,
        parent_task_id: String,
        root_session_id: String,
        at: Timestamp,
    },
    ChildCreated {
        child_id: String,
        attempt: u64,
        generation: u64,
        at: Timestamp,
    },
    InputSent {
        sequence: u64,
        event_id: String,
        kind: String,
        #[serde_as(as = "StrictBase64")]
        data: Vec<u8>,
        delivery: Delivery,
        at: Timestamp,
    },
    InputWoke {
        sequence: u64,
        at: Timestamp,
    },
    CursorAdvanced {
        cursor: u64,
        attempt: u64,
        at: Timestamp,
    },
    InputCommitted {
        cursor: u64,
        #[serde_as(as = "StrictBase64")]
        checkpoint: Vec<u8>,
        at: Timestamp,
    },
    InputsPending {
        cursor: u64,
        #[serde_as(as = "StrictBase64")]
        checkpoint: Vec<u8>,
        at: Timestamp,
    },
    Published {
        at: Timestamp,
    },
    PartAppended {
        attempt: u64,
        event_id: String,
        part_id: String,
        last: bool,
        kind: String,
        #[serde_as(as = "StrictBase64")]
        data: Vec<u8>,
        metadata: Vec<(String, String)>,
        at: Timestamp,
    },
    ParentNotificationFailed {
        kind: String,
        error: String,
        at: Timestamp,
    },
    RerunOf {
        task: String,
        at: Timestamp,
    },
    RerunAs {
        task: String,
        at: Timestamp,
    },
    RecoveryLimit {
        max_recoveries: u64,
        at: Timestamp,
    },
    NotBefore {
        until: Timestamp,
        at: Timestamp,
    },
    Purged {
        records: u64,
        sequences: [u64; 2],
        #[serde_as(as = "DigestHex")]
        last_digest: [u8; 32],
        at: Timestamp,
    },
    Hold {
        reason: String,
        at: Timestamp,
    },
    HoldLifted {
        at: Timestamp,
    },
    UpdateTrimmed {
        attempt: u64,
        event_id: String,
        part_id: String,
        last: bool,
        kind: String,
        bytes: u64,
        at: Timestamp,
    },
    ProgressTrimmed {
        records: u64,
        bytes: u64,
        #[serde_as(as = "DigestHex")]
        digest_before: [u8; 32],
        at: Timestamp,
    },
    ParentNotified {
        attempt: u64,
        event_id: String,
        kind: String,
        #[serde_as(as = "StrictBase64")]
        data: Vec<u8>,
        at: Timestamp,
    },
    NotificationEnqueuedV2 {
        id: String,
        event_id: String,
        kind: String,
        #[serde_as(as = "StrictBase64")]
        data: Vec<u8>,
        delivery: Delivery,
        version: u64,
        at: Timestamp,
    },
    ParentNotifiedV2 {
        attempt: u64,
        event_id: String,
        kind: String,
        #[serde_as(as = "StrictBase64")]
        data: Vec<u8>,
        delivery: Delivery,
        at: Timestamp,
    },
}

/// How a task spec is read: every field, none unknown.
#[serde_as]
#[derive(Deserialize)]
#[serde(remote = "TaskSpec", deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "only the remote derive reads this mirror of `TaskSpec`"
)]
struct SpecDef {
    id: String,
    executor_key: String,
    kind: String,
    #[serde_as(as = "StrictBase64")]
    payload: Vec<u8>,
    description: String,
    output_file: String,
    session_id: String,
    notify_session: bool,
}

/// Reads a creation event's spec ([`SpecDef`]) into its shared allocation.
fn shared_spec<'de, D: Deserializer<'de>>(decoder: D) -> Result<Arc<TaskSpec>, D::Error> {
    SpecDef::deserialize(decoder).map(Arc::new)
}

/// [`EventDef`] as a type of its own, for the path-tracking reader.
#[derive(Deserialize)]
#[serde(transparent)]
struct ReadEvent(#[serde(with = "EventDef")] Event);

/// Reads an event from its JSON object: the `type` picks the variant, which is read from the
/// other fields.
fn event_from_fields(mut fields: Map<String, Value>) -> Result<Event, ExportError> {
    let invalid = |message: String| ExportError::Invalid {
        path: "event".into(),
        message,
    };
    let ty = match fields.remove("type") {
        Some(Value::String(ty)) => ty,
        Some(other) => {
            return Err(invalid(format!(
                "field `type` must be a string, not {other}"
            )))
        }
        None => return Err(invalid("missing field `type`".into())),
    };
    let tagged = Value::Object(Map::from_iter([(ty, Value::Object(fields))]));
    serde_path_to_error::deserialize(tagged)
        .map(|ReadEvent(event)| event)
        .map_err(|e| ExportError::from_tracked("event", e))
}

/// A record line of an export, read: the record's place and identity, and the event that
/// rebuilds it.
///
/// Unknown fields of the line itself are ignored; unknown fields of its event are refused.
/// It serializes as [`RecordJson::of_line`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordLine {
    /// The task id.
    pub task: String,
    /// The record's position in the task's stream (0-based).
    pub position: u64,
    /// The global commit sequence (1-based).
    pub seq: u64,
    /// The record's chain digest.
    pub digest: Digest,
    /// The record's CRC-32.
    pub crc: u32,
    /// The event.
    pub event: Event,
}

/// A record line before its event is read.
#[serde_as]
#[derive(Deserialize)]
pub(super) struct RawLine {
    #[serde_as(as = "CrcHex")]
    crc: u32,
    #[serde_as(as = "DigestHex")]
    digest: Digest,
    event: Map<String, Value>,
    position: u64,
    seq: u64,
    task: String,
}

impl RawLine {
    pub(super) fn into_line(self) -> Result<RecordLine, ExportError> {
        Ok(RecordLine {
            task: self.task,
            position: self.position,
            seq: self.seq,
            digest: self.digest,
            crc: self.crc,
            event: event_from_fields(self.event)?,
        })
    }
}

impl RecordLine {
    /// Reads one record line (without its `\n`).
    ///
    /// # Errors
    /// [`ExportError::NotJson`], or [`ExportError::Invalid`] naming the field that is
    /// missing, unknown (in the event) or malformed, or a byte field that was redacted.
    pub fn read(line: &str) -> Result<Self, ExportError> {
        // A line read on the quick way is one the careful way reads alike; any other goes
        // the careful way, which names what is wrong.
        if let Some(read) = QuickLine::read(line) {
            return Ok(read);
        }
        parse::<RawLine>(line)?.into_line()
    }

    /// The line, if [`RecordLine::read`] reads it the quick way (its event read in the same
    /// pass as the line); `None` for a line it reads the careful way. For tests that hold
    /// the export's writer to lines the quick way reads.
    #[doc(hidden)]
    #[must_use]
    pub fn read_quickly(line: &str) -> Option<Self> {
        QuickLine::read(line)
    }
}

/// A record line read the quick way: its event read in the same pass as the line, straight
/// into the variant the line's text seems to name ([`guess_event_type`]), which the reading
/// checks — where [`RawLine`] reads the event into a map of JSON values first (to take out
/// its `type`) and then again into the event, tracking the path for its errors. Any failure,
/// a wrong guess among them, gives way to [`RawLine`].
#[serde_as]
#[derive(Deserialize)]
pub(super) struct QuickLine {
    #[serde_as(as = "CrcHex")]
    crc: u32,
    #[serde_as(as = "DigestHex")]
    digest: Digest,
    #[serde(deserialize_with = "guessed_event")]
    event: Event,
    position: u64,
    seq: u64,
    task: String,
}

thread_local! {
    /// The variant [`QuickLine::read`] reads its line's event as (a derived reader takes no
    /// state of its own).
    static GUESSED_TYPE: std::cell::Cell<&'static str> = const { std::cell::Cell::new("") };
}

/// Reads an event as the variant [`GUESSED_TYPE`] names, checking its `type`.
fn guessed_event<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Event, D::Error> {
    EventDef::deserialize(Tagged {
        ty: GUESSED_TYPE.with(std::cell::Cell::get),
        fields: deserializer,
    })
}

/// The `type` of a record line's event as the export writes the line: the event is followed
/// by `,"position":`, and its keys come in order, its nested objects (`spec`, `metadata`)
/// before its `type`, so the last `"type":"` before that is the event's. A guess, which
/// spares reading the event once to find its `type` before reading it as that variant: the
/// reading checks it against the one `type` it meets ([`SkipType`]).
pub(super) fn guess_event_type(line: &str) -> Option<&'static str> {
    // Both are near the end: a step back at a time costs less than a string search's set-up.
    let last = |text: &[u8], what: &[u8]| text.windows(what.len()).rposition(|at| at == what);
    let bytes = line.as_bytes();
    let event = bytes.get(..last(bytes, b"},\"position\":")?)?;
    let name = event.get(last(event, b"\"type\":\"")? + 8..)?;
    let name = name.get(..name.iter().position(|&b| b == b'"')?)?;
    let name: Result<EventType, de::value::Error> =
        EventType::deserialize(std::str::from_utf8(name).ok()?.into_deserializer());
    name.ok().map(EventType::as_str)
}

impl QuickLine {
    /// The line, if it reads the quick way.
    pub(super) fn read(line: &str) -> Option<RecordLine> {
        let ty = guess_event_type(line)?;
        GUESSED_TYPE.with(|guessed| guessed.set(ty));
        let quick: QuickLine = serde_json::from_str(line).ok()?;
        Some(RecordLine {
            task: quick.task,
            position: quick.position,
            seq: quick.seq,
            digest: quick.digest,
            crc: quick.crc,
            event: quick.event,
        })
    }
}

/// An event object as the externally tagged enum [`EventDef`] reads: the variant `ty`, with
/// the object's fields (read from `fields`) other than its `type`, which must be `ty`.
struct Tagged<'t, D> {
    ty: &'t str,
    fields: D,
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Tagged<'_, D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_enum(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

impl<'t, 'de, D: Deserializer<'de>> de::EnumAccess<'de> for Tagged<'t, D> {
    type Error = D::Error;
    type Variant = Tagged<'t, D>;

    fn variant_seed<V: de::DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Self::Variant), Self::Error> {
        let variant = seed.deserialize(de::value::StrDeserializer::new(self.ty))?;
        Ok((variant, self))
    }
}

impl<'de, D: Deserializer<'de>> de::VariantAccess<'de> for Tagged<'_, D> {
    type Error = D::Error;

    fn unit_variant(self) -> Result<(), Self::Error> {
        Err(de::Error::custom("every event has fields"))
    }

    fn newtype_variant_seed<T: de::DeserializeSeed<'de>>(
        self,
        _seed: T,
    ) -> Result<T::Value, Self::Error> {
        Err(de::Error::custom("every event has named fields"))
    }

    fn tuple_variant<V: Visitor<'de>>(
        self,
        _len: usize,
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("every event has named fields"))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        // As a map: an event written as an array is not read the quick way.
        self.fields.deserialize_map(WithoutType {
            visitor,
            ty: self.ty,
        })
    }
}

/// A visitor of a struct's fields that is never shown the key `type` (which must be `ty`).
struct WithoutType<'t, V> {
    visitor: V,
    ty: &'t str,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for WithoutType<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.visitor.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_map(SkipType {
            map,
            ty: self.ty,
            seen: false,
        })
    }
}

/// A map whose key `type` (and its value) is skipped — once, and only if its value is `ty`:
/// a map without it, with it twice or with another value fails.
struct SkipType<'t, A> {
    map: A,
    ty: &'t str,
    seen: bool,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for SkipType<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        while let Some(key) = self.map.next_key::<&'de str>()? {
            if key == "type" {
                let ty = self.map.next_value::<&'de str>()?;
                if self.seen || ty != self.ty {
                    return Err(de::Error::custom("not the one `type` expected"));
                }
                self.seen = true;
                continue;
            }
            return seed
                .deserialize(de::value::BorrowedStrDeserializer::new(key))
                .map(Some);
        }
        if self.seen {
            Ok(None)
        } else {
            Err(de::Error::missing_field("type"))
        }
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

impl Serialize for RecordLine {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        RecordJson::of_line(self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RecordLine {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        RawLine::deserialize(deserializer)?
            .into_line()
            .map_err(de::Error::custom)
    }
}

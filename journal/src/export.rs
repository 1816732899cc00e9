//! The export format (`docs/export-format.md`, version [`VERSION`]) as serde types, both ways:
//! JSON lines — a [`Header`], then one line per record — that rebuild a journal bit-exact.
//!
//! - Writing: [`Header`] and [`RecordJson`] (a record of a journal, borrowed) serialize to the
//!   exact bytes `dtask export` writes: keys in lexicographic order, compact, as `serde_json`
//!   writes them. Byte fields are standard base64 with padding, or `{"redacted_len": N}` with
//!   [`ByteFields::Redacted`].
//! - Reading: [`Header::read`] and [`RecordLine::read`] refuse what the format does not allow
//!   (an unknown version, a missing, unknown or malformed event field, a redacted byte field)
//!   with an [`ExportError`] that names the field.
//!
//! ```
//! use dtask_journal::export::{ByteFields, Header, RecordJson, RecordLine, Scope};
//! use dtask_journal::{Digest, Event, Record, Timestamp};
//!
//! # fn main() -> Result<(), dtask_journal::export::ExportError> {
//! let record = Record {
//!     position: 0,
//!     seq: 1,
//!     event: Event::Completed { data: b"ok".to_vec(), at: Timestamp(5) },
//!     digest: Digest([0xa5; 32]),
//!     crc: 0x0012_abcd,
//!     size: 60,
//! };
//! let header = Header::new(2, Scope::Journal, 1, ByteFields::Base64);
//! let mut export = Vec::new();
//! header.write_line(&mut export)?;
//! RecordJson::new("job-1", &record, ByteFields::Base64).write_line(&mut export)?;
//!
//! let text = String::from_utf8(export).expect("JSON is UTF-8");
//! let mut lines = text.lines();
//! assert_eq!(Header::read(lines.next().unwrap_or_default())?, header);
//! let line = lines.next().unwrap_or_default();
//! assert!(line.starts_with(r#"{"crc":"0012abcd","digest":"a5a5"#));
//! assert!(line.ends_with(r#""event":{"at":5,"data":"b2s=","type":"completed"},"position":0,"seq":1,"task":"job-1"}"#));
//! let read = RecordLine::read(line)?;
//! assert_eq!((read.task.as_str(), read.seq, read.crc), ("job-1", 1, 0x0012_abcd));
//! assert_eq!(read.event, record.event);
//! # Ok(()) }
//! ```

use crate::event::{
    Delivery, Event, EventType, ExpiryResolution, LeasePolicy, Publication, TaskSpec, Timestamp,
};
use crate::record::{Digest, Record, RecordFormat, RECORD_FORMAT_VERSION};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::de::{self, IgnoredAny, IntoDeserializer as _, MapAccess, SeqAccess, Visitor};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use serde_with::{serde_as, DeserializeAs, Same, SerializeAs};
use std::fmt::{self, Write as _};
use std::sync::Arc;

/// The export schema version this build writes: the header's `dtask_export`.
///
/// It changes when a field is removed, renamed or changes meaning, or when event types are
/// added (version 2: the event schema v2's mailbox, nested-task, publication and part
/// events). A reader of version 2 reads version 1 exports too ([`OLDEST_VERSION`]): their
/// events are a subset.
pub const VERSION: u64 = 2;

/// The oldest export version this build reads.
pub const OLDEST_VERSION: u64 = 1;

/// Why an export line could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The line is not JSON (or holds more than one JSON value).
    #[error("not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// The JSON does not fit the format: a field is missing, unknown (in an event), of the
    /// wrong type, or holds a value the format does not allow — a redacted byte field among
    /// them, which cannot be read back.
    #[error("{}", located(.path, .message))]
    Invalid {
        /// Where: `event.spec.payload`, `seq`; empty for the line itself.
        path: String,
        /// What is wrong there.
        message: String,
    },
    /// The first line names no export version (`dtask_export`): it is no export.
    #[error("the first line has no \"dtask_export\" version")]
    NoVersion,
    /// An export version this build does not read.
    #[error("export version {found}; this build reads version {VERSION}")]
    Version {
        /// The version of the export.
        found: u64,
    },
    /// Writing a line failed.
    #[error("writing the export: {0}")]
    Write(#[source] serde_json::Error),
}

fn located(path: &str, message: &str) -> String {
    if path.is_empty() {
        message.to_owned()
    } else {
        format!("{path}: {message}")
    }
}

impl ExportError {
    /// The error of a path-tracked deserialization, its path under `prefix`.
    fn from_tracked(prefix: &str, e: serde_path_to_error::Error<serde_json::Error>) -> Self {
        let mut path = prefix.to_owned();
        for segment in e.path() {
            match segment {
                serde_path_to_error::Segment::Seq { index } => {
                    let _ = write!(path, "[{index}]");
                }
                serde_path_to_error::Segment::Map { key } => {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(key);
                }
                // The variant of an event is its `type`, not a level of the line.
                _ => {}
            }
        }
        let inner = e.into_inner();
        if matches!(
            inner.classify(),
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof
        ) {
            return Self::NotJson(inner);
        }
        Self::Invalid {
            path,
            message: inner.to_string(),
        }
    }
}

/// Parses one line as `T`, naming the path of what does not fit.
fn parse<'a, T: Deserialize<'a>>(line: &'a str) -> Result<T, ExportError> {
    let mut de = serde_json::Deserializer::from_str(line);
    let value =
        serde_path_to_error::deserialize(&mut de).map_err(|e| ExportError::from_tracked("", e))?;
    de.end().map_err(ExportError::NotJson)?;
    Ok(value)
}

/// Writes `value` as one compact JSON line (with its `\n`).
fn write_json_line(out: &mut Vec<u8>, value: &impl Serialize) -> Result<(), ExportError> {
    serde_json::to_writer(&mut *out, value).map_err(ExportError::Write)?;
    out.push(b'\n');
    Ok(())
}

/// How byte fields (payloads, checkpoints, data, context snapshots) are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ByteFields {
    /// Standard base64 with padding: the export can be imported.
    #[default]
    Base64,
    /// `{"redacted_len": N}`, the length only (`dtask export --no-payload`): such an export
    /// cannot be read back.
    Redacted,
}

/// Which records an export holds: the header's `scope`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// `"journal"`: every record of the journal; only such an export can be imported.
    Journal,
    /// The tasks exported (`dtask export --task ID`), as a list of task ids.
    Tasks(Vec<String>),
}

impl Serialize for Scope {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Journal => serializer.serialize_str("journal"),
            Self::Tasks(tasks) => tasks.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Scope {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ScopeVisitor;

        impl<'de> Visitor<'de> for ScopeVisitor {
            type Value = Scope;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"journal\" or a list of task ids")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Scope, E> {
                if text == "journal" {
                    Ok(Scope::Journal)
                } else {
                    Err(E::invalid_value(de::Unexpected::Str(text), &self))
                }
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scope, A::Error> {
                let mut tasks = Vec::new();
                while let Some(task) = seq.next_element()? {
                    tasks.push(task);
                }
                Ok(Scope::Tasks(tasks))
            }
        }

        deserializer.deserialize_any(ScopeVisitor)
    }
}

/// The first line of an export.
///
/// Unknown header fields are ignored (a field added to the header does not change the
/// version); the CLI's import refuses more than the format does (a redacted or `--task`
/// export, an unknown journal format).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Header {
    /// The export schema version, [`VERSION`].
    pub dtask_export: u64,
    /// The journal format version of the source journal (its `meta` space).
    pub journal_format: u64,
    /// The record framing version the digests and CRCs belong to (the source journal's
    /// [`RecordFormat`]: 1 for BLAKE3 chain digests, 2 for SHA-256).
    pub record_format: u64,
    /// How many record lines follow.
    pub records: u64,
    /// Whether byte fields were written as [`ByteFields::Redacted`].
    pub redacted: bool,
    /// Which records the export holds.
    pub scope: Scope,
}

impl Header {
    /// The header of an export of this build's version, of records in the newest framing
    /// ([`RECORD_FORMAT_VERSION`]; [`Header::with_record_format`] names another).
    #[must_use]
    pub fn new(journal_format: u64, scope: Scope, records: u64, bytes: ByteFields) -> Self {
        Self {
            dtask_export: VERSION,
            journal_format,
            record_format: u64::from(RECORD_FORMAT_VERSION),
            records,
            redacted: bytes == ByteFields::Redacted,
            scope,
        }
    }

    /// The header with the records' framing set to `format` (the source journal's:
    /// [`crate::Journal::record_format`]).
    #[must_use]
    pub fn with_record_format(mut self, format: RecordFormat) -> Self {
        self.record_format = u64::from(format.version());
        self
    }

    /// Reads the first line of an export (without its `\n`).
    ///
    /// # Errors
    /// [`ExportError::NotJson`]; [`ExportError::NoVersion`] when the line names no
    /// `dtask_export` version and [`ExportError::Version`] for one this build does not read
    /// (both before any other field is looked at); [`ExportError::Invalid`] for a missing or
    /// malformed field.
    pub fn read(line: &str) -> Result<Self, ExportError> {
        let value: Value = serde_json::from_str(line).map_err(ExportError::NotJson)?;
        match value.get("dtask_export").and_then(Value::as_u64) {
            None => Err(ExportError::NoVersion),
            Some(OLDEST_VERSION..=VERSION) => serde_path_to_error::deserialize(value)
                .map_err(|e| ExportError::from_tracked("", e)),
            Some(found) => Err(ExportError::Version { found }),
        }
    }

    /// Appends the header line (with its `\n`) to `out`.
    ///
    /// # Errors
    /// [`ExportError::Write`] if serialization fails (it does not for a header).
    pub fn write_line(&self, out: &mut Vec<u8>) -> Result<(), ExportError> {
        write_json_line(out, self)
    }
}

/// A CRC-32 as 8 lower-case hex digits (`0012abcd`), as the format writes it; reading takes
/// nothing else.
struct CrcHex;

impl SerializeAs<u32> for CrcHex {
    fn serialize_as<S: Serializer>(crc: &u32, serializer: S) -> Result<S::Ok, S::Error> {
        // On the stack and in one piece: `collect_str` would escape the formatter's output
        // fragment by fragment, once per record.
        let mut hex = [0u8; 8];
        for (pair, byte) in hex.chunks_exact_mut(2).zip(crc.to_be_bytes()) {
            pair.copy_from_slice(&b16(byte));
        }
        serializer.serialize_str(std::str::from_utf8(&hex).map_err(serde::ser::Error::custom)?)
    }
}

/// The two lower-case hex digits of `b`.
fn b16(b: u8) -> [u8; 2] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0xf)]]
}

impl<'de> DeserializeAs<'de, u32> for CrcHex {
    fn deserialize_as<D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
        read_str(deserializer, "8 lower-case hex digits", |text| {
            let mut crc = [0u8; 4];
            lower_hex(text, &mut crc).then(|| u32::from_be_bytes(crc))
        })
    }
}

/// Reads a string with `read` (`None`: a value that is not `expecting`), in place where the
/// input allows it: no copy of the string is made.
fn read_str<'de, D: Deserializer<'de>, T>(
    deserializer: D,
    expecting: &'static str,
    read: fn(&str) -> Option<T>,
) -> Result<T, D::Error> {
    /// The visitor of [`read_str`].
    struct ReadStr<T> {
        expecting: &'static str,
        read: fn(&str) -> Option<T>,
    }
    impl<T> Visitor<'_> for ReadStr<T> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.expecting)
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
            (self.read)(text).ok_or_else(|| E::invalid_value(de::Unexpected::Str(text), &self))
        }
    }
    deserializer.deserialize_str(ReadStr { expecting, read })
}

/// A chain digest as 64 lower-case hex digits ([`Digest::to_hex`]); reading takes nothing else.
struct DigestHex;

impl SerializeAs<Digest> for DigestHex {
    fn serialize_as<S: Serializer>(digest: &Digest, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(digest.as_hash().to_hex().as_str())
    }
}

impl<'de> DeserializeAs<'de, Digest> for DigestHex {
    fn deserialize_as<D: Deserializer<'de>>(deserializer: D) -> Result<Digest, D::Error> {
        read_str(deserializer, "64 lower-case hex digits", |text| {
            let mut digest = Digest::default();
            lower_hex(text, &mut digest.0).then_some(digest)
        })
    }
}

/// Each byte's value as a lower-case hex digit, or `NOT_HEX`.
const LOWER_HEX: [u8; 256] = {
    let mut table = [NOT_HEX; 256];
    let mut digit = 0;
    while digit < 16 {
        let at = if digit < 10 {
            b'0' + digit
        } else {
            b'a' + digit - 10
        };
        table[at as usize] = digit;
        digit += 1;
    }
    table
};

/// What [`LOWER_HEX`] gives a byte that is not a lower-case hex digit (a digit's value has no
/// bit of it).
const NOT_HEX: u8 = 0xf0;

/// Reads `text`, exactly two lower-case hex digits a byte, into `out`; false (and `out`
/// unspecified) for any other text. A table lookup a digit and no branch on its value: the
/// digest and CRC of every line of an import go through it.
fn lower_hex(text: &str, out: &mut [u8]) -> bool {
    if text.len() != 2 * out.len() {
        return false;
    }
    let mut seen = 0;
    for (byte, pair) in out.iter_mut().zip(text.as_bytes().chunks_exact(2)) {
        let [high, low] = pair else {
            return false;
        };
        let (high, low) = (LOWER_HEX[usize::from(*high)], LOWER_HEX[usize::from(*low)]);
        seen |= high | low;
        *byte = (high << 4) | low;
    }
    seen & NOT_HEX == 0
}

thread_local! {
    /// The base64 text of the byte field being written.
    static BASE64_BUFFER: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// A byte field to write: base64, or its length only.
#[derive(Clone, Copy)]
struct ByteField<'a> {
    data: &'a [u8],
    how: ByteFields,
}

/// What a redacted byte field holds.
#[derive(Serialize)]
struct Redaction {
    redacted_len: u64,
}

impl Serialize for ByteField<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.how {
            // Encoded into a buffer kept per thread: an export writes millions of byte
            // fields, and would otherwise allocate a `String` for each.
            ByteFields::Base64 => BASE64_BUFFER.with_borrow_mut(|text| {
                text.clear();
                STANDARD.encode_string(self.data, text);
                serializer.serialize_str(text)
            }),
            ByteFields::Redacted => Redaction {
                redacted_len: self.data.len() as u64,
            }
            .serialize(serializer),
        }
    }
}

/// Reads a byte field: standard base64 with canonical padding. A redaction
/// (`{"redacted_len": N}`) is refused: its bytes are gone.
struct StrictBase64;

impl<'de> DeserializeAs<'de, Vec<u8>> for StrictBase64 {
    fn deserialize_as<D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        deserializer.deserialize_any(StrictBase64)
    }
}

impl<'de> Visitor<'de> for StrictBase64 {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("base64 text")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Vec<u8>, E> {
        STANDARD
            .decode(text)
            .map_err(|e| E::custom(format_args!("bad base64: {e}")))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<u8>, A::Error> {
        while let Some(key) = map.next_key::<std::borrow::Cow<'_, str>>()? {
            if key == "redacted_len" {
                return Err(de::Error::custom(
                    "the field was redacted (--no-payload): a redacted export cannot be read back",
                ));
            }
            map.next_value::<IgnoredAny>()?;
        }
        Err(de::Error::invalid_type(de::Unexpected::Map, &self))
    }
}

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
        }
    }
}

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

/// A record of a journal as an export line: what `dtask export` writes for it.
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
struct RawLine {
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
    fn into_line(self) -> Result<RecordLine, ExportError> {
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
struct QuickLine {
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
fn guess_event_type(line: &str) -> Option<&'static str> {
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
    fn read(line: &str) -> Option<RecordLine> {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn line(event: Event) -> String {
        let record = Record {
            position: 1,
            seq: 2,
            event,
            digest: Digest([7; 32]),
            crc: 9,
            size: 0,
        };
        let mut out = Vec::new();
        RecordJson::new("t", &record, ByteFields::Base64)
            .write_line(&mut out)
            .unwrap();
        String::from_utf8(out).unwrap().trim_end().to_owned()
    }

    fn edited(line: &str, edit: impl FnOnce(&mut Map<String, Value>)) -> String {
        let mut value: Value = serde_json::from_str(line).unwrap();
        edit(value["event"].as_object_mut().unwrap());
        value.to_string()
    }

    fn error(line: &str) -> String {
        RecordLine::read(line).unwrap_err().to_string()
    }

    /// The table-driven hex reader takes exactly what the plain reading takes: every byte
    /// value in each place of a two-byte field, a wrong length, upper case.
    #[test]
    fn hex_fields_read_lower_case_digits_and_nothing_else() {
        let plain = |text: &str| {
            (text.len() == 4 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
                .then(|| u16::from_str_radix(text, 16).unwrap().to_be_bytes())
        };
        for at in 0..4 {
            for b in 0..=255u8 {
                let mut text = *b"0a9f";
                text[at] = b;
                let Ok(text) = std::str::from_utf8(&text) else {
                    continue;
                };
                let mut out = [0u8; 2];
                let read = lower_hex(text, &mut out).then_some(out);
                assert_eq!(read, plain(text), "{text:?}");
            }
        }
        let mut out = [0u8; 2];
        for text in ["", "0a9", "0a9f0", "0A9F", "é9f"] {
            assert!(!lower_hex(text, &mut out), "{text:?}");
        }
        let digest = Digest(std::array::from_fn(|i| u8::try_from(i * 37 % 256).unwrap()));
        let mut read = Digest::default();
        assert!(lower_hex(&digest.to_hex(), &mut read.0));
        assert_eq!(read, digest);
    }

    fn cancel() -> Event {
        Event::CancelRequested {
            reason: "r".into(),
            lease_deadline: None,
            direct: true,
            at: Timestamp(3),
        }
    }

    /// A line read the careful way ([`RawLine`]).
    fn careful(line: &str) -> Result<RecordLine, ExportError> {
        parse::<RawLine>(line)?.into_line()
    }

    #[test]
    fn a_line_the_quick_way_reads_is_read_as_the_careful_way_reads_it() {
        let created = Event::Created {
            spec: TaskSpec {
                id: "t\u{e9}\"\\/".into(),
                executor_key: "shell".into(),
                payload: b"{\"type\":\"x\"}".to_vec(),
                description: "a \"type\": \"completed\" inside".into(),
                ..TaskSpec::default()
            }
            .into(),
            policy: LeasePolicy::Retry,
            checkpoint: vec![0, 1, 2],
            context_snapshot: vec![],
            at: Timestamp(1),
        };
        let update = Event::UpdateAppended {
            attempt: 2,
            event_id: "e\n1".into(),
            kind: "progress".into(),
            data: b"step".to_vec(),
            metadata: vec![("type".into(), "meta".into())],
            at: Timestamp(5),
        };
        for event in [cancel(), created, update] {
            let text = line(event.clone());
            let quick = QuickLine::read(&text).expect("read the quick way");
            assert_eq!(quick, careful(&text).unwrap());
            assert_eq!(quick.event, event);
        }
        // What the quick way does not read goes the careful way, which reads it or names
        // what is wrong: a key written with an escape, a field twice (the map keeps the
        // last), a `type` that is not a string, an event that is not an object.
        let text = line(cancel());
        let escaped = text.replace("\"reason\"", "\"\\u0072eason\"");
        assert!(QuickLine::read(&escaped).is_none());
        assert_eq!(RecordLine::read(&escaped).unwrap().event, cancel());
        let twice = text.replace("\"reason\":\"r\"", "\"reason\":\"q\",\"reason\":\"r\"");
        assert_ne!(twice, text);
        assert!(QuickLine::read(&twice).is_none());
        assert_eq!(RecordLine::read(&twice).unwrap().event, cancel());
        let typed = edited(&text, |e| {
            e.insert("type".into(), 7.into());
        });
        assert!(QuickLine::read(&typed).is_none());
        assert!(
            error(&typed).contains("`type` must be a string"),
            "{}",
            error(&typed)
        );
        let mut value: Value = serde_json::from_str(&text).unwrap();
        value["event"] = serde_json::json!(["cancel_requested"]);
        assert!(QuickLine::read(&value.to_string()).is_none());
        assert!(RecordLine::read(&value.to_string()).is_err());
        // The event's last `"type":"` is a guess the reading checks: a `type` first is read
        // the quick way all the same; a `type` twice, none, or a guess led astray by a
        // nested object after the event's own `type` go the careful way.
        let own = ",\"type\":\"cancel_requested\"}";
        assert!(text.contains(own), "{text}");
        let first = text
            .replace(own, "}")
            .replace("\"event\":{", "\"event\":{\"type\":\"cancel_requested\",");
        assert_eq!(QuickLine::read(&first).unwrap(), careful(&text).unwrap());
        let two = text.replace("\"event\":{", "\"event\":{\"type\":\"completed\",");
        assert_eq!(guess_event_type(&two), Some("cancel_requested"));
        assert!(QuickLine::read(&two).is_none());
        assert_eq!(RecordLine::read(&two).unwrap().event, cancel());
        let untyped = text.replace(own, "}");
        assert_eq!(guess_event_type(&untyped), None);
        assert!(RecordLine::read(&untyped).is_err());
        let astray = text.replace(
            own,
            ",\"type\":\"cancel_requested\",\"zz\":{\"type\":\"completed\"}}",
        );
        assert_eq!(guess_event_type(&astray), Some("completed"));
        assert!(QuickLine::read(&astray).is_none());
        assert!(
            error(&astray).contains("unknown field `zz`"),
            "{}",
            error(&astray)
        );
    }

    #[test]
    fn every_event_field_is_required_and_no_other_is_taken() {
        let text = line(cancel());
        assert_eq!(RecordLine::read(&text).unwrap().event, cancel());
        let missing = edited(&text, |e| {
            e.remove("lease_deadline");
        });
        assert_eq!(error(&missing), "event: missing field `lease_deadline`");
        let extra = edited(&text, |e| {
            e.insert("surprise".into(), 1.into());
        });
        assert!(
            error(&extra).starts_with("event.surprise: unknown field `surprise`"),
            "{}",
            error(&extra)
        );
        let wrong = edited(&text, |e| {
            e.insert("at".into(), "soon".into());
        });
        assert!(
            error(&wrong).starts_with("event.at: invalid type"),
            "{}",
            error(&wrong)
        );
        let untyped = edited(&text, |e| {
            e.remove("type");
        });
        assert_eq!(error(&untyped), "event: missing field `type`");
        let unknown = edited(&text, |e| {
            e.insert("type".into(), "exploded".into());
        });
        assert!(
            error(&unknown).starts_with("event: unknown variant `exploded`"),
            "{}",
            error(&unknown)
        );
        // Fields of the line itself: required, typed; unknown ones are ignored.
        let mut value: Value = serde_json::from_str(&text).unwrap();
        value["later"] = true.into();
        assert_eq!(
            RecordLine::read(&value.to_string()).unwrap().event,
            cancel()
        );
        value["seq"] = "two".into();
        assert!(
            error(&value.to_string()).starts_with("seq: invalid type"),
            "{}",
            error(&value.to_string())
        );
        assert!(error("{").starts_with("not JSON"), "{}", error("{"));
        assert!(error(&format!("{text} 1")).starts_with("not JSON"));
    }

    #[test]
    fn byte_fields_are_strict_base64_and_redactions_are_refused() {
        let created = Event::Created {
            spec: TaskSpec {
                id: "t".into(),
                payload: b"ok".to_vec(),
                ..TaskSpec::default()
            }
            .into(),
            policy: LeasePolicy::Fail,
            checkpoint: vec![1],
            context_snapshot: vec![],
            at: Timestamp(1),
        };
        let text = line(created.clone());
        assert_eq!(RecordLine::read(&text).unwrap().event, created);
        let unpadded = text.replace("\"b2s=\"", "\"b2s\"");
        assert!(
            error(&unpadded).starts_with("event.spec.payload: bad base64"),
            "{}",
            error(&unpadded)
        );
        let record = Record {
            position: 0,
            seq: 1,
            event: created,
            digest: Digest::GENESIS,
            crc: 0,
            size: 0,
        };
        let mut redacted = Vec::new();
        RecordJson::new("t", &record, ByteFields::Redacted)
            .write_line(&mut redacted)
            .unwrap();
        let redacted = String::from_utf8(redacted).unwrap();
        assert!(
            redacted.contains(r#""payload":{"redacted_len":2}"#),
            "{redacted}"
        );
        let message = error(redacted.trim_end());
        assert!(message.contains("redacted (--no-payload)"), "{message}");
        let spec_extra = text.replace("\"id\":\"t\"", "\"id\":\"t\",\"zzz\":0");
        assert!(
            error(&spec_extra).starts_with("event.spec.zzz: unknown field `zzz`"),
            "{}",
            error(&spec_extra)
        );
    }

    #[test]
    fn digests_and_crcs_are_canonical_hex() {
        let text = line(cancel());
        let read = RecordLine::read(&text).unwrap();
        assert_eq!((read.digest, read.crc), (Digest([7; 32]), 9));
        assert!(text.starts_with(&format!(
            r#"{{"crc":"00000009","digest":"{}""#,
            "07".repeat(32)
        )));
        for (from, to) in [
            ("00000009", "0000009"),
            ("00000009", "0000000A"),
            ("0707", "07+7"),
        ] {
            let bad = text.replacen(from, to, 1);
            assert!(RecordLine::read(&bad).is_err(), "{bad}");
        }
        let upper = text.replacen(&"07".repeat(32), &"0A".repeat(32), 1);
        assert!(
            error(&upper).starts_with("digest: invalid value"),
            "{}",
            error(&upper)
        );
    }

    #[test]
    fn headers_check_the_version_first() {
        let header = Header::new(2, Scope::Tasks(vec!["a".into()]), 3, ByteFields::Redacted);
        let mut out = Vec::new();
        header.write_line(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "{\"dtask_export\":2,\"journal_format\":2,\"record_format\":2,\"records\":3,\"redacted\":true,\"scope\":[\"a\"]}\n"
        );
        assert_eq!(Header::read(text.trim_end()).unwrap(), header);
        let older = header.clone().with_record_format(RecordFormat::BLAKE3);
        assert_eq!(older.record_format, 1);
        // A version 1 header (before the G3 events) reads too.
        let v1 = text.replace("\"dtask_export\":2", "\"dtask_export\":1");
        assert_eq!(Header::read(v1.trim_end()).unwrap().dtask_export, 1);
        assert!(matches!(
            Header::read(r#"{"dtask_export":3,"anything":"else"}"#),
            Err(ExportError::Version { found: 3 })
        ));
        assert!(matches!(Header::read("[]"), Err(ExportError::NoVersion)));
        assert!(matches!(Header::read("{"), Err(ExportError::NotJson(_))));
        let unknown_scope = text.replace("[\"a\"]", "\"everything\"");
        assert!(Header::read(unknown_scope.trim_end())
            .unwrap_err()
            .to_string()
            .starts_with("scope: invalid value"),);
        let later = text.replace("{\"dtask_export\"", "{\"added_later\":0,\"dtask_export\"");
        assert_eq!(Header::read(later.trim_end()).unwrap(), header);
    }
}

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

mod fields;
mod read;
mod write;

pub use read::RecordLine;
pub use write::{EventJson, RecordJson};

use crate::record::{RecordFormat, RECORD_FORMAT_VERSION};
use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::fmt::{self, Write as _};

/// The export schema version this build writes: the header's `dtask_export`.
///
/// It changes when a field is removed, renamed or changes meaning, or when event types are
/// added (version 2: the event schema v2's mailbox, nested-task, publication and part
/// events; version 3: schema v3's `rerun_of`, `rerun_as`, `recovery_limit` and
/// `not_before`; version 4: schema v4's `purged`, `hold` and `hold_lifted`; version 5:
/// schema v5's `update_trimmed` and `progress_trimmed`; version 6: schema v6's
/// `parent_notified`; version 7: schema v7's `notification_enqueued_v2` and
/// `parent_notified_v2`). A reader of version 7 reads versions 1 to 6 too
/// ([`OLDEST_VERSION`]): their events are a subset.
pub const VERSION: u64 = 7;

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::fields::lower_hex;
    use super::read::{guess_event_type, QuickLine, RawLine};
    use super::*;
    use crate::event::{Event, LeasePolicy, TaskSpec, Timestamp};
    use crate::record::{Digest, Record};
    use serde_json::Map;

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
            "{\"dtask_export\":7,\"journal_format\":2,\"record_format\":2,\"records\":3,\"redacted\":true,\"scope\":[\"a\"]}\n"
        );
        assert_eq!(Header::read(text.trim_end()).unwrap(), header);
        let older = header.clone().with_record_format(RecordFormat::BLAKE3);
        assert_eq!(older.record_format, 1);
        // Version 1 to 6 headers (before the G3 events, the rerun lineage, the purge
        // tombstone, the trimmed progress, the notifications to a parent, the preemptive
        // notifications) read too.
        for older in [1, 2, 3, 4, 5, 6] {
            let old = text.replace("\"dtask_export\":7", &format!("\"dtask_export\":{older}"));
            assert_eq!(Header::read(old.trim_end()).unwrap().dtask_export, older);
        }
        assert!(matches!(
            Header::read(r#"{"dtask_export":8,"anything":"else"}"#),
            Err(ExportError::Version { found: 8 })
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

//! Record framing: how one [`Event`] is stored as the value of an event key.
//!
//! # Byte layout (record format versions 1 and 2)
//!
//! ```text
//! offset   size  field
//! 0        1     record format version (1 or 2; see [`RecordFormat`])
//! 1        8     position of the record in its task stream (u64, big-endian)
//! 9        8     global commit sequence (u64, big-endian)
//! 17       4     payload length N (u32, little-endian)
//! 21       N     payload: the Event, bincode 2 (serde, standard config: varints, little-endian)
//! 21+N     32    chain digest: H(previous digest ‖ len(task id) as u32 LE ‖ task id ‖ bytes[0 .. 21+N])
//! 53+N     4     CRC-32 (IEEE, crc32fast) of bytes [0 .. 53+N], little-endian
//! ```
//!
//! H is BLAKE3 in record format 1 and SHA-256 in record format 2: the two differ in nothing
//! else. A journal writes every record in the format it was created with (its `meta` space
//! names it; see [`RecordFormat`]); a reader takes each record's from its first byte.
//!
//! The first record of a stream chains from [`Digest::GENESIS`] (32 zero bytes). The CRC catches
//! a damaged record on its own; the chain digest commits to the task id, the position and every
//! earlier record, so an edited (even with a recomputed CRC), deleted, reordered, swapped or
//! transplanted record is detected. The position is also stored in the clear so that a record
//! found at the wrong key is reported as misplaced. A deleted tail leaves no gap in the chain;
//! the `commits` index (see [`crate::keys`]) still names those records, which is how an audit
//! finds them.

use crate::error::CorruptionKind;
use crate::event::Event;
use sha2::Digest as _;
use std::fmt;

/// The newest version of a record's framing (the byte in front of every record), which the
/// journals this build creates write ([`RecordFormat::NEWEST`]). Not the journal's layout
/// version: that is [`crate::JOURNAL_FORMAT_VERSION`].
pub const RECORD_FORMAT_VERSION: u8 = RecordFormat::NEWEST.version();

/// The oldest record framing this build reads ([`RecordFormat::BLAKE3`]).
pub const OLDEST_RECORD_FORMAT_VERSION: u8 = RecordFormat::BLAKE3.version();

/// A record framing: the version byte in front of a record, and so the hash its chain digest
/// is made with. The two framings differ in nothing else.
///
/// A journal is created with one ([`crate::JournalOptions::with_record_format`], by default
/// [`RecordFormat::NEWEST`]), names it in its `meta` space and writes all its records so, for
/// as long as it lives: a journal of an older build keeps BLAKE3 when it is upgraded, so that
/// its chains, and exports of it, stay what they were.
///
/// ```
/// use dtask_journal::record::RecordFormat;
/// assert_eq!(RecordFormat::from_version(2), Some(RecordFormat::SHA256));
/// assert_eq!(RecordFormat::NEWEST.hash_name(), "SHA-256");
/// assert_eq!(RecordFormat::from_version(3), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordFormat(u8);

impl RecordFormat {
    /// Version 1: the chain digest is BLAKE3. Every journal created before journal format 5.
    pub const BLAKE3: Self = Self(1);
    /// Version 2: the chain digest is SHA-256, which a CPU with SHA extensions (x86-64's SHA-NI,
    /// `ARMv8`'s SHA2) computes for a record's few hundred bytes in about half the time BLAKE3
    /// takes: BLAKE3's speed is in hashing many blocks at once, and a record is a few.
    pub const SHA256: Self = Self(2);
    /// The framing of the journals this build creates.
    pub const NEWEST: Self = Self::SHA256;

    /// The framing of version `version`, if this build reads it.
    #[must_use]
    pub const fn from_version(version: u8) -> Option<Self> {
        match version {
            1 => Some(Self::BLAKE3),
            2 => Some(Self::SHA256),
            _ => None,
        }
    }

    /// The version byte.
    #[must_use]
    pub const fn version(self) -> u8 {
        self.0
    }

    /// The name of the chain digest's hash, for messages.
    #[must_use]
    pub const fn hash_name(self) -> &'static str {
        match self.0 {
            1 => "BLAKE3",
            _ => "SHA-256",
        }
    }

    /// The hash of `bytes` in this framing.
    fn hash(self, bytes: &[u8]) -> Digest {
        if self == Self::BLAKE3 {
            Digest(*blake3::hash(bytes).as_bytes())
        } else {
            Digest(sha2::Sha256::digest(bytes).into())
        }
    }

    /// The hash of the concatenation of `parts` in this framing.
    fn hash_parts(self, parts: [&[u8]; 4]) -> Digest {
        if self == Self::BLAKE3 {
            let mut hasher = blake3::Hasher::new();
            for part in parts {
                hasher.update(part);
            }
            Digest(*hasher.finalize().as_bytes())
        } else {
            let mut hasher = sha2::Sha256::new();
            for part in parts {
                hasher.update(part);
            }
            Digest(hasher.finalize().into())
        }
    }
}

impl Default for RecordFormat {
    /// [`RecordFormat::NEWEST`].
    fn default() -> Self {
        Self::NEWEST
    }
}

impl fmt::Display for RecordFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.0, self.hash_name())
    }
}

/// Bytes before the payload.
pub const HEADER_LEN: usize = 21;
/// Bytes after the payload (digest and CRC).
pub const TRAILER_LEN: usize = 36;
const DIGEST_LEN: usize = 32;

/// The global sequence a framed record carries (bytes 9..17), without checking the rest.
#[must_use]
pub fn seq_of(bytes: &[u8]) -> Option<u64> {
    let seq: [u8; 8] = bytes.get(9..17)?.try_into().ok()?;
    Some(u64::from_be_bytes(seq))
}

/// A 32-byte chain digest (BLAKE3 or SHA-256, by the record's [`RecordFormat`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Digest(pub [u8; DIGEST_LEN]);

impl Digest {
    /// The digest a stream's first record chains from.
    pub const GENESIS: Self = Self([0; DIGEST_LEN]);

    /// The digest as 64 lower-case hex digits.
    #[must_use]
    pub fn to_hex(&self) -> String {
        self.as_hash().to_hex().to_string()
    }

    /// Parses 64 hex digits (either case).
    #[must_use]
    pub fn from_hex(hex: &str) -> Option<Self> {
        blake3::Hash::from_hex(hex)
            .ok()
            .map(|hash| Self(*hash.as_bytes()))
    }

    /// The digest as blake3's hash value, whose `to_hex` formats on the stack (whatever hash
    /// made the 32 bytes).
    pub(crate) fn as_hash(&self) -> blake3::Hash {
        blake3::Hash::from_bytes(self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.as_hash().to_hex())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_hash().to_hex())
    }
}

/// The largest payload a record may hold; decoding claims no more memory than this, whatever
/// the bytes say.
pub const MAX_PAYLOAD_BYTES: usize = 64 << 20;

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard()
}

fn bincode_decode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_PAYLOAD_BYTES>()
}

/// Encodes an event's payload (the bincode part of a record).
///
/// # Errors
/// Returns the encoder's message if serialization fails (it does not for well-formed events).
pub fn encode_payload(event: &Event) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    encode_behind(event, 0, 0, &mut out)?;
    Ok(out)
}

/// Encodes `event` into `out` (cleared) behind `front` zero bytes, with room for `back` more
/// after it: its size is counted first, so the buffer is allocated once, to fit.
fn encode_behind(
    event: &Event,
    front: usize,
    back: usize,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let mut size = bincode::enc::write::SizeWriter::default();
    bincode::serde::encode_into_writer(event, &mut size, bincode_config())
        .map_err(|e| e.to_string())?;
    out.clear();
    out.reserve_exact(front + size.bytes_written + back);
    out.resize(front, 0);
    bincode::serde::encode_into_writer(event, VecWriter(out), bincode_config())
        .map_err(|e| e.to_string())
}

/// A bincode writer appending to a vector.
struct VecWriter<'a>(&'a mut Vec<u8>);

impl bincode::enc::write::Writer for VecWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
}

/// An event's payload, encoded behind room for its record's header and with room for the
/// trailer after it, so that [`Unframed::frame`] makes the record in place: one allocation
/// per record, on the caller's thread, and no copy of the payload on the writer's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unframed(Vec<u8>);

impl Unframed {
    /// Encodes `event`.
    ///
    /// # Errors
    /// Returns the encoder's message if serialization fails (it does not for well-formed
    /// events).
    pub fn encode(event: &Event) -> Result<Self, String> {
        let mut out = Vec::new();
        encode_behind(event, HEADER_LEN, TRAILER_LEN, &mut out)?;
        Ok(Self(out))
    }

    /// An already encoded payload (copied).
    #[must_use]
    pub fn from_payload(payload: &[u8]) -> Self {
        let mut out = Vec::with_capacity(HEADER_LEN + payload.len() + TRAILER_LEN);
        out.resize(HEADER_LEN, 0);
        out.extend_from_slice(payload);
        Self(out)
    }

    /// The encoded payload.
    #[must_use]
    pub fn payload(&self) -> &[u8] {
        self.0.get(HEADER_LEN..).unwrap_or_default()
    }

    /// Frames the payload as the record at `position` of `task`'s stream, with global
    /// sequence `seq`, chained on `prev`, in [`RecordFormat::NEWEST`]; returns the record and
    /// its chain digest.
    ///
    /// # Errors
    /// Returns the payload length if it does not fit the 32-bit length field.
    pub fn frame(
        self,
        task: &str,
        position: u64,
        seq: u64,
        prev: &Digest,
    ) -> Result<(Vec<u8>, Digest), usize> {
        self.frame_as(RecordFormat::NEWEST, task, position, seq, prev)
    }

    /// [`Unframed::frame`] in the framing `format`.
    ///
    /// # Errors
    /// As for [`Unframed::frame`].
    pub fn frame_as(
        self,
        format: RecordFormat,
        task: &str,
        position: u64,
        seq: u64,
        prev: &Digest,
    ) -> Result<(Vec<u8>, Digest), usize> {
        let mut out = self.0;
        let payload_len = out.len().saturating_sub(HEADER_LEN);
        let len = u32::try_from(payload_len).map_err(|_| payload_len)?;
        let mut header = [0u8; HEADER_LEN];
        header[0] = format.version();
        header[1..9].copy_from_slice(&position.to_be_bytes());
        header[9..17].copy_from_slice(&seq.to_be_bytes());
        header[17..].copy_from_slice(&len.to_le_bytes());
        // Every constructor leaves the header's room in front of the payload.
        out[..HEADER_LEN].copy_from_slice(&header);
        let digest = chain_digest(format, prev, task, &out);
        out.extend_from_slice(&digest.0);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok((out, digest))
    }
}

/// Decodes an event payload; trailing bytes are an error.
///
/// # Errors
/// Returns [`CorruptionKind::Decode`] when the bytes are not a v1 event.
pub fn decode_payload(bytes: &[u8]) -> Result<Event, CorruptionKind> {
    let (event, read): (Event, usize) =
        bincode::serde::decode_from_slice(bytes, bincode_decode_config())
            .map_err(|e| CorruptionKind::Decode(e.to_string()))?;
    all_read(read, bytes)?;
    Ok(event)
}

/// Refuses trailing bytes after a decoded event.
fn all_read(read: usize, bytes: &[u8]) -> Result<(), CorruptionKind> {
    if read == bytes.len() {
        return Ok(());
    }
    Err(CorruptionKind::Decode(format!(
        "{} trailing bytes after the event",
        bytes.len().saturating_sub(read)
    )))
}

/// [`decode_payload`] for the state fold: an `UpdateAppended` event comes without its `kind`,
/// `data` and `metadata` (left empty). They are checked exactly as [`decode_payload`] checks
/// them — the same bytes are accepted and refused — but not copied: the fold keeps only an
/// update's attempt and event id, and copying the rest was ~7 % of recovery's instructions.
/// Every other event decodes in full.
///
/// # Errors
/// Returns [`CorruptionKind::Decode`] when the bytes are not a v1 event.
pub fn decode_payload_lean(bytes: &[u8]) -> Result<Event, CorruptionKind> {
    decode_payload_lean_reusing(bytes, &mut String::new())
}

/// [`decode_payload_lean`] with an update's event id written into `spare` (cleared first)
/// and moved into the event: a fold that hands each update's id back (see
/// [`crate::Records::recycle`]) decodes its updates without allocating.
pub(crate) fn decode_payload_lean_reusing(
    bytes: &[u8],
    spare: &mut String,
) -> Result<Event, CorruptionKind> {
    match bincode::decode_from_slice::<u32, _>(bytes, bincode_decode_config()) {
        Ok((UPDATE_APPENDED_TAG, read)) => decode_lean_update(bytes, read, spare),
        _ => decode_payload(bytes),
    }
}

/// The variant index of `Event::UpdateAppended`, which bincode writes first (a test holds
/// this against the encoder).
const UPDATE_APPENDED_TAG: u32 = 15;

fn decode_lean_update(
    bytes: &[u8],
    tag_len: usize,
    spare: &mut String,
) -> Result<Event, CorruptionKind> {
    let fields = bytes.get(tag_len..).unwrap_or_default();
    let (update, read): (lean::Update<'_>, usize) =
        bincode::serde::borrow_decode_from_slice(fields, bincode_decode_config())
            .map_err(|e| CorruptionKind::Decode(e.to_string()))?;
    all_read(read, fields)?;
    let mut event_id = std::mem::take(spare);
    event_id.clear();
    event_id.push_str(update.event_id);
    Ok(Event::UpdateAppended {
        attempt: update.attempt,
        event_id,
        kind: String::new(),
        data: Vec::new(),
        metadata: Vec::new(),
        at: update.at,
    })
}

/// The fields of `Event::UpdateAppended`, in order, borrowed from the record.
mod lean {
    use crate::event::Timestamp;
    use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};
    use std::fmt;
    use std::marker::PhantomData;

    #[derive(serde::Deserialize)]
    pub(super) struct Update<'a> {
        pub attempt: u64,
        #[serde(borrow)]
        pub event_id: &'a str,
        #[serde(borrow)]
        #[allow(dead_code, reason = "checked, not kept")]
        pub kind: &'a str,
        #[serde(borrow)]
        #[allow(dead_code, reason = "checked, not kept")]
        pub data: &'a [u8],
        #[allow(dead_code, reason = "checked, not kept")]
        pub metadata: Skipped<(&'a str, &'a str)>,
        pub at: Timestamp,
    }

    /// A sequence whose elements are decoded (so checked) and dropped.
    pub(super) struct Skipped<T>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Deserialize<'de> for Skipped<T> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_seq(SkipVisitor(PhantomData))
        }
    }

    struct SkipVisitor<T>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for SkipVisitor<T> {
        type Value = Skipped<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a sequence")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skipped<T>, A::Error> {
            while seq.next_element::<T>()?.is_some() {}
            Ok(Skipped(PhantomData))
        }
    }
}

/// The chain digest: the hash of `format` over `prev ‖ task length (u32 LE) ‖ task ‖ framed`.
fn chain_digest(format: RecordFormat, prev: &Digest, task: &str, framed: &[u8]) -> Digest {
    // With BLAKE3, inputs that fit (most records) are hashed in one call from a stack buffer:
    // that spares the incremental hasher's set-up and buffering, a third of the cost of
    // hashing a short record. The smaller buffer spares most records the zeroing of the
    // larger one. SHA-256's incremental hasher buffers only what does not fill a block, so it
    // hashes the parts where they are. The digest is the same either way.
    if format == RecordFormat::BLAKE3 {
        let len = prev.0.len() + 4 + task.len() + framed.len();
        if len <= 256 {
            return one_shot_digest::<256>(format, prev, task, framed);
        }
        if len <= 1024 {
            return one_shot_digest::<1024>(format, prev, task, framed);
        }
    }
    format.hash_parts([
        &prev.0,
        &task_len(task).to_le_bytes(),
        task.as_bytes(),
        framed,
    ])
}

/// The task length as the chain digest covers it.
fn task_len(task: &str) -> u32 {
    u32::try_from(task.len()).unwrap_or(u32::MAX)
}

/// [`chain_digest`] of an input that fits `N` bytes, hashed in one call from a stack buffer.
fn one_shot_digest<const N: usize>(
    format: RecordFormat,
    prev: &Digest,
    task: &str,
    framed: &[u8],
) -> Digest {
    let len = prev.0.len() + 4 + task.len() + framed.len();
    let mut buf = [0u8; N];
    let (head, rest) = buf.split_at_mut(prev.0.len());
    head.copy_from_slice(&prev.0);
    let (len_bytes, rest) = rest.split_at_mut(4);
    len_bytes.copy_from_slice(&task_len(task).to_le_bytes());
    let (task_bytes, rest) = rest.split_at_mut(task.len());
    task_bytes.copy_from_slice(task.as_bytes());
    rest[..framed.len()].copy_from_slice(framed);
    format.hash(&buf[..len])
}

/// Frames an encoded payload as a record in [`RecordFormat::NEWEST`] and returns it with its
/// chain digest.
///
/// # Errors
/// Returns the payload length if it does not fit the 32-bit length field.
pub fn frame(
    task: &str,
    position: u64,
    seq: u64,
    payload: &[u8],
    prev: &Digest,
) -> Result<(Vec<u8>, Digest), usize> {
    frame_as(RecordFormat::NEWEST, task, position, seq, payload, prev)
}

/// [`frame`] in the framing `format`.
///
/// # Errors
/// As for [`frame`].
pub fn frame_as(
    format: RecordFormat,
    task: &str,
    position: u64,
    seq: u64,
    payload: &[u8],
    prev: &Digest,
) -> Result<(Vec<u8>, Digest), usize> {
    Unframed::from_payload(payload).frame_as(format, task, position, seq, prev)
}

/// The framing fields of a record whose CRC has been verified; the payload is not decoded yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The position stored in the record.
    pub position: u64,
    /// The global commit sequence stored in the record.
    pub seq: u64,
    /// The bincode payload.
    pub payload: &'a [u8],
    /// The stored chain digest.
    pub digest: Digest,
    /// The stored CRC-32.
    pub crc: u32,
    /// The record's framing (its first byte).
    pub format: RecordFormat,
    /// The bytes the chain digest covers (header and payload).
    covered: &'a [u8],
}

impl Frame<'_> {
    /// Decodes the payload into the [`Record`] of this frame.
    ///
    /// # Errors
    /// [`CorruptionKind::Decode`] when the payload is not a v1 event.
    pub fn into_record(self) -> Result<Record, CorruptionKind> {
        let event = decode_payload(self.payload)?;
        Ok(self.with_event(event))
    }

    /// [`Frame::into_record`] with the payload decoded by [`decode_payload_lean`].
    ///
    /// # Errors
    /// As for [`Frame::into_record`].
    pub fn into_lean_record(self) -> Result<Record, CorruptionKind> {
        self.into_lean_record_reusing(&mut String::new())
    }

    /// [`Frame::into_lean_record`] with an update's event id decoded into `spare` (see
    /// [`decode_payload_lean_reusing`]).
    pub(crate) fn into_lean_record_reusing(
        self,
        spare: &mut String,
    ) -> Result<Record, CorruptionKind> {
        let event = decode_payload_lean_reusing(self.payload, spare)?;
        Ok(self.with_event(event))
    }

    /// The record of this frame, its payload decoded as `event`.
    fn with_event(self, event: Event) -> Record {
        Record {
            position: self.position,
            seq: self.seq,
            event,
            digest: self.digest,
            crc: self.crc,
            size: HEADER_LEN + self.payload.len() + TRAILER_LEN,
        }
    }

    /// Checks that this record chains from `prev` for `task`.
    #[must_use]
    pub fn chains_from(&self, prev: &Digest, task: &str) -> bool {
        chain_digest(self.format, prev, task, self.covered) == self.digest
    }
}

fn array<const N: usize>(bytes: &[u8], at: usize) -> Option<[u8; N]> {
    bytes.get(at..at + N)?.try_into().ok()
}

/// Parses a record's framing and verifies its CRC. Never panics, whatever the bytes.
///
/// # Errors
/// [`CorruptionKind::Truncated`] when the record is shorter than its framing says,
/// [`CorruptionKind::Checksum`] when the CRC does not match,
/// [`CorruptionKind::UnknownVersion`] for a format version this build cannot read.
pub fn parse(bytes: &[u8]) -> Result<Frame<'_>, CorruptionKind> {
    let truncated = || CorruptionKind::Truncated { len: bytes.len() };
    if bytes.len() < HEADER_LEN + TRAILER_LEN {
        return Err(truncated());
    }
    let payload_len = u32::from_le_bytes(array(bytes, 17).ok_or_else(truncated)?) as usize;
    let expected = HEADER_LEN + payload_len + TRAILER_LEN;
    if bytes.len() != expected {
        // A stored CRC over the actual bytes tells damage apart from truncation only when
        // the length matches; otherwise report what the framing says.
        return Err(if bytes.len() < expected {
            truncated()
        } else {
            CorruptionKind::Checksum {
                stored: 0,
                computed: crc32fast::hash(bytes),
            }
        });
    }
    let crc_at = expected - 4;
    let stored = u32::from_le_bytes(array(bytes, crc_at).ok_or_else(truncated)?);
    let covered_by_crc = bytes.get(..crc_at).ok_or_else(truncated)?;
    let computed = crc32fast::hash(covered_by_crc);
    if stored != computed {
        return Err(CorruptionKind::Checksum { stored, computed });
    }
    let version = bytes.first().copied().ok_or_else(truncated)?;
    let format =
        RecordFormat::from_version(version).ok_or(CorruptionKind::UnknownVersion(version))?;
    let digest_at = crc_at - DIGEST_LEN;
    Ok(Frame {
        position: crate::keys::checked_position(u64::from_be_bytes(
            array(bytes, 1).ok_or_else(truncated)?,
        ))?,
        seq: crate::keys::checked_seq(u64::from_be_bytes(array(bytes, 9).ok_or_else(truncated)?))?,
        payload: bytes.get(HEADER_LEN..digest_at).ok_or_else(truncated)?,
        digest: Digest(array(bytes, digest_at).ok_or_else(truncated)?),
        crc: stored,
        format,
        covered: bytes.get(..digest_at).ok_or_else(truncated)?,
    })
}

/// A decoded record of a task stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Position in the task stream (0-based).
    pub position: u64,
    /// Global commit sequence (1-based, journal-wide).
    pub seq: u64,
    /// The event.
    pub event: Event,
    /// The record's chain digest.
    pub digest: Digest,
    /// The record's CRC-32.
    pub crc: u32,
    /// The record's size on disk in bytes.
    pub size: usize,
}

/// Decodes a record found at `position` of `task`'s stream, checking CRC, position and chain.
///
/// # Errors
/// The [`CorruptionKind`] of the first check that fails.
pub fn decode(
    task: &str,
    position: u64,
    prev: &Digest,
    bytes: &[u8],
) -> Result<Record, CorruptionKind> {
    let frame = parse(bytes)?;
    if frame.position != position {
        return Err(CorruptionKind::Misplaced {
            found: frame.position,
        });
    }
    if !frame.chains_from(prev, task) {
        return Err(CorruptionKind::Chain);
    }
    frame.into_record()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Timestamp;

    fn sample() -> Event {
        Event::Heartbeat {
            lease_deadline: Timestamp(30_000),
            at: Timestamp(1),
        }
    }

    #[test]
    fn frame_then_decode() {
        let payload = encode_payload(&sample()).unwrap();
        let (bytes, digest) = frame("t", 3, 9, &payload, &Digest::GENESIS).unwrap();
        assert_eq!(bytes.len(), HEADER_LEN + payload.len() + TRAILER_LEN);
        let rec = decode("t", 3, &Digest::GENESIS, &bytes).unwrap();
        assert_eq!(rec.event, sample());
        assert_eq!(rec.seq, 9);
        assert_eq!(rec.digest, digest);
        assert_eq!(
            decode("u", 3, &Digest::GENESIS, &bytes),
            Err(CorruptionKind::Chain)
        );
        assert_eq!(
            decode("t", 4, &Digest::GENESIS, &bytes),
            Err(CorruptionKind::Misplaced { found: 3 })
        );
    }

    proptest::proptest! {
        /// The one-shot digests of short inputs equal the incremental ones of the reference
        /// hashers, on both sides of each one-shot size, in both framings.
        #[test]
        fn one_shot_and_incremental_digests_agree(
            prev in proptest::array::uniform32(proptest::prelude::any::<u8>()),
            task in "[a-z0-9-]{0,64}",
            framed in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1200),
        ) {
            let prev = Digest(prev);
            let len = u32::try_from(task.len()).unwrap().to_le_bytes();
            let mut blake = blake3::Hasher::new();
            let mut sha = sha2::Sha256::new();
            for part in [&prev.0[..], &len, task.as_bytes(), &framed] {
                blake.update(part);
                sha.update(part);
            }
            proptest::prop_assert_eq!(
                chain_digest(RecordFormat::BLAKE3, &prev, &task, &framed),
                Digest(*blake.finalize().as_bytes())
            );
            proptest::prop_assert_eq!(
                chain_digest(RecordFormat::SHA256, &prev, &task, &framed),
                Digest(sha.finalize().into())
            );
        }
    }

    #[test]
    fn each_framing_is_read_by_its_own_hash() {
        let payload = encode_payload(&sample()).unwrap();
        let (old, old_digest) =
            frame_as(RecordFormat::BLAKE3, "t", 0, 1, &payload, &Digest::GENESIS).unwrap();
        let (new, new_digest) = frame("t", 0, 1, &payload, &Digest::GENESIS).unwrap();
        assert_eq!((old[0], new[0]), (1, 2));
        assert_ne!(old_digest, new_digest);
        assert_eq!(old.len(), new.len(), "the framings differ in the hash only");
        for (bytes, digest) in [(&old, old_digest), (&new, new_digest)] {
            let rec = decode("t", 0, &Digest::GENESIS, bytes).unwrap();
            assert_eq!((rec.digest, rec.event.clone()), (digest, sample()));
        }
        // A record whose version byte is changed (and its CRC made again) no longer chains:
        // the digest is checked with the hash its byte names.
        let mut swapped = old.clone();
        swapped[0] = 2;
        let crc_at = swapped.len() - 4;
        let crc = crc32fast::hash(&swapped[..crc_at]);
        swapped[crc_at..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            decode("t", 0, &Digest::GENESIS, &swapped),
            Err(CorruptionKind::Chain)
        );
        swapped[0] = 3;
        let crc = crc32fast::hash(&swapped[..crc_at]);
        swapped[crc_at..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            decode("t", 0, &Digest::GENESIS, &swapped),
            Err(CorruptionKind::UnknownVersion(3))
        );
    }

    #[test]
    fn update_appended_tag_is_the_encoders() {
        let update = Event::UpdateAppended {
            attempt: 1,
            event_id: "e".into(),
            kind: String::new(),
            data: vec![],
            metadata: vec![],
            at: Timestamp(1),
        };
        let payload = encode_payload(&update).unwrap();
        let (tag, _): (u32, usize) =
            bincode::decode_from_slice(&payload, bincode_decode_config()).unwrap();
        assert_eq!(tag, UPDATE_APPENDED_TAG);
    }

    #[test]
    fn digest_hex_round_trip() {
        let d = Digest([0xab; 32]);
        assert_eq!(Digest::from_hex(&d.to_hex()), Some(d));
        assert_eq!(Digest::from_hex("zz"), None);
        let mut counting = [0u8; 32];
        for (i, b) in counting.iter_mut().enumerate() {
            *b = u8::try_from(i * 8).unwrap();
        }
        let hex = "0008101820283038404850586068707880889098a0a8b0b8c0c8d0d8e0e8f0f8";
        assert_eq!(Digest(counting).to_hex(), hex);
        assert_eq!(Digest(counting).to_string(), hex);
        assert_eq!(format!("{:?}", Digest(counting)), format!("Digest({hex})"));
        assert_eq!(
            Digest::from_hex(&hex.to_uppercase()),
            Some(Digest(counting))
        );
        assert_eq!(Digest::from_hex(&hex.replacen("00", "+0", 1)), None);
        assert_eq!(Digest::from_hex(&hex[2..]), None);
    }
}

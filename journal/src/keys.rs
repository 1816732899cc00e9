//! Every key layout of the journal, in one place.
//!
//! The journal is a RocksDB database with one column family per [`Space`]. Integers in keys are
//! big-endian so that byte order equals numeric order; task ids are raw UTF-8 followed by a NUL
//! separator (task ids may not contain NUL), so byte order equals (task id, position) order and a
//! task's records form one contiguous range.
//!
//! | space     | key                                   | value                                        |
//! |-----------|---------------------------------------|----------------------------------------------|
//! | `events`  | task id ‖ 0x00 ‖ position (u64 BE)    | a framed record ([`crate::record`])          |
//! | `finished`| as `events` (format 4, RocksDB)       | as `events`: streams kept apart (below)      |
//! | `commits` | global sequence (u64 BE)              | the event key of the record committed then   |
//! | `live`    | task id                               | empty: the task has no terminal event yet    |
//! | `outbox`  | global sequence of the enqueue (u64 BE)| the event key of the `NotificationEnqueued` (or V2) |
//! | `meta`    | ASCII name (`format_version`)         | u32 BE                                       |
//!
//! `commits`, `live` and `outbox` are indexes written in the same atomic batch as the records
//! they describe.
//!
//! **Format 4 on, RocksDB:** the `events` space is kept in two column families. A stream
//! without a terminal record lies in `events`. With finished streams kept apart
//! ([`crate::JournalOptions::keep_finished_apart`], the default), finished streams are moved
//! to [`FINISHED_EVENTS`] ([`crate::backend::BatchOp::Retire`]): one written whole in one
//! batch as it is written, one finished by a later append when the journal idles or closes
//! — so that recovery, which reads the live streams, does not step over finished ones; a
//! record written after the terminal one goes where its stream lies. Same keys, same values; every read of the `events` space sees both column families
//! as one (`merge.rs`). A stream lies wholly in one of them after every batch (one left
//! in `events` — of formats 1–3, or finished with the option off — moves whole when it is next
//! written to with the option on). A task's head is read off its last record ([`crate::Head`]). A name, once
//! used, is never reused for another layout: format 1 had a `heads` space
//! ([`LEGACY_HEADS`]), dropped when a format-1 journal is opened for writing.

use crate::error::CorruptionKind;

/// A column family of the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Space {
    /// Task records by (task, position).
    Events,
    /// Global commit order: sequence → event key.
    Commits,
    /// Tasks without a terminal event.
    Live,
    /// Queued, unacknowledged notifications in insertion order.
    Outbox,
    /// Journal metadata (format version).
    Meta,
}

impl Space {
    /// Every space, in creation order.
    pub const ALL: [Self; 5] = [
        Self::Events,
        Self::Commits,
        Self::Live,
        Self::Outbox,
        Self::Meta,
    ];

    /// The column family name.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Events => "events",
            Self::Commits => "commits",
            Self::Live => "live",
            Self::Outbox => "outbox",
            Self::Meta => "meta",
        }
    }
}

/// The column family of format 1's task heads (task id → head), which format 2 derives from
/// the last record instead. Never reused.
pub const LEGACY_HEADS: &str = "heads";

/// The column family of the `events` space that holds the streams with a terminal record
/// (format 4 on, RocksDB only; see the module docs). Not a [`Space`]: a storage detail of the
/// one logical space.
pub const FINISHED_EVENTS: &str = "finished";

/// Every column family of a RocksDB journal of this format: one per [`Space`], and
/// [`FINISHED_EVENTS`] (RocksDB opens a database only with all of them named).
pub const COLUMN_FAMILIES: [&str; 6] = [
    Space::Events.name(),
    Space::Commits.name(),
    Space::Live.name(),
    Space::Outbox.name(),
    Space::Meta.name(),
    FINISHED_EVENTS,
];

/// The separator between a task id and a position in an event key.
pub const TASK_SEPARATOR: u8 = 0;

/// How many bytes an event key's position takes (a u64, big-endian).
pub const POSITION_BYTES: usize = std::mem::size_of::<u64>();

/// How many bytes follow the task id in an event key: the separator and the position.
pub const EVENT_KEY_SUFFIX: usize = 1 + POSITION_BYTES;

/// The `meta` key holding the format version.
pub const META_FORMAT_VERSION: &[u8] = b"format_version";

/// The `meta` key holding the tail marker (format 3 on; see [`crate::Tail`]).
pub const META_TAIL: &[u8] = b"tail";

/// The `meta` key naming the journal's record framing (format 5 on: one byte, a
/// [`crate::RecordFormat`] version; a journal without it writes format 1).
pub const META_RECORD_FORMAT: &[u8] = b"record_format";

/// Every key the `meta` space may hold; the audit reports any other.
pub const META_KEYS: [&[u8]; 3] = [META_FORMAT_VERSION, META_TAIL, META_RECORD_FORMAT];

/// The largest position or global sequence a journal holds (2^62). No journal comes near it
/// (at a million records a second it takes 146,000 years); a larger number read from disk is
/// damage, refused where it is parsed so that no allocation is sized and no addition is made
/// with it.
pub const MAX_SEQUENCE: u64 = 1 << 62;

/// The largest position of a record in its stream; see [`MAX_SEQUENCE`].
pub const MAX_POSITION: u64 = MAX_SEQUENCE;

/// Checks that `position`, read from disk, is within [`MAX_POSITION`].
///
/// # Errors
/// [`CorruptionKind::OutOfRange`] when it is not.
pub fn checked_position(position: u64) -> Result<u64, CorruptionKind> {
    if position <= MAX_POSITION {
        Ok(position)
    } else {
        Err(CorruptionKind::OutOfRange {
            what: "position",
            value: position,
        })
    }
}

/// Checks that `seq`, read from disk, is a global sequence: from 1 to [`MAX_SEQUENCE`].
///
/// # Errors
/// [`CorruptionKind::OutOfRange`] when it is not.
pub fn checked_seq(seq: u64) -> Result<u64, CorruptionKind> {
    if (1..=MAX_SEQUENCE).contains(&seq) {
        Ok(seq)
    } else {
        Err(CorruptionKind::OutOfRange {
            what: "sequence",
            value: seq,
        })
    }
}

/// The key of record `position` of `task`'s stream.
#[must_use]
pub fn event_key(task: &str, position: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(task.len() + EVENT_KEY_SUFFIX);
    key.extend_from_slice(task.as_bytes());
    key.push(TASK_SEPARATOR);
    key.extend_from_slice(&position.to_be_bytes());
    key
}

/// [`event_key`] as the key or value of a batch's op, or the key of a point lookup (a new
/// task's first record, looked up by its creator and by the writer): held in place, with no
/// allocation, for a task id of up to 55 bytes ([`crate::backend::OP_INLINE_BYTES`]; the
/// writer makes two a record). The layout is written out here as in [`event_key`] (and
/// pinned equal to it by `tests::a_batch_op_key_is_the_key_it_stands_for`): built through one
/// helper generic over the buffer, it took 210–282 instructions a call on the writer's path
/// against 159 (callgrind).
pub(crate) fn event_op_key(task: &str, position: u64) -> crate::backend::OpBytes {
    let mut key = crate::backend::OpBytes::with_capacity(task.len() + EVENT_KEY_SUFFIX);
    key.extend_from_slice(task.as_bytes());
    key.push(TASK_SEPARATOR);
    key.extend_from_slice(&position.to_be_bytes());
    key
}

/// [`event_key`] into `key`, replacing what it held (a loop over many tasks reuses one
/// buffer).
pub fn event_key_into(task: &str, position: u64, key: &mut Vec<u8>) {
    key.clear();
    key.extend_from_slice(task.as_bytes());
    key.push(TASK_SEPARATOR);
    key.extend_from_slice(&position.to_be_bytes());
}

/// The first key after every event key of `task` (task id ‖ 0x01: the separator is the
/// smallest byte, so its successor never carries) into `key`, replacing what it held.
pub fn task_end_into(task: &str, key: &mut Vec<u8>) {
    key.clear();
    key.extend_from_slice(task.as_bytes());
    key.push(TASK_SEPARATOR + 1);
}

/// The common prefix of every event key of `task` (task id ‖ 0x00).
#[must_use]
pub fn task_prefix(task: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(task.len() + 1);
    key.extend_from_slice(task.as_bytes());
    key.push(TASK_SEPARATOR);
    key
}

/// Splits an event key into task id and position.
///
/// # Errors
/// [`CorruptionKind::Key`] when the key does not follow the layout.
pub fn parse_event_key(key: &[u8]) -> Result<(&str, u64), CorruptionKind> {
    let split = key
        .len()
        .checked_sub(EVENT_KEY_SUFFIX)
        .ok_or_else(|| CorruptionKind::Key(format!("event key too short ({} bytes)", key.len())))?;
    let (task, rest) = key.split_at(split);
    let (sep, pos) = rest.split_at(1);
    if sep != [TASK_SEPARATOR] {
        return Err(CorruptionKind::Key(
            "event key lacks the task separator".into(),
        ));
    }
    let task = std::str::from_utf8(task)
        .map_err(|_| CorruptionKind::Key("task id is not UTF-8".into()))?;
    if task.as_bytes().contains(&TASK_SEPARATOR) {
        return Err(CorruptionKind::Key("task id contains NUL".into()));
    }
    let pos: [u8; 8] = pos
        .try_into()
        .map_err(|_| CorruptionKind::Key("bad position".into()))?;
    Ok((task, checked_position(u64::from_be_bytes(pos))?))
}

/// The position of an `events` key known to lie in `task`'s key range (as every key of a scan
/// of that range does): the key must be exactly the task's prefix and 8 bytes. Cheaper than
/// [`parse_event_key`] (no UTF-8 check of the task id, which the range already fixes).
///
/// # Errors
/// [`CorruptionKind::Key`] when the key is not `task`'s prefix and a position.
pub fn position_in(task: &str, key: &[u8]) -> Result<u64, CorruptionKind> {
    let prefix = task.len() + 1;
    match (
        key.get(..task.len()),
        key.get(task.len()),
        key.get(prefix..),
    ) {
        (Some(id), Some(&TASK_SEPARATOR), Some(pos)) if id == task.as_bytes() => pos
            .try_into()
            .map(u64::from_be_bytes)
            .map_err(|_| CorruptionKind::Key(format!("bad position ({} bytes)", pos.len())))
            .and_then(checked_position),
        _ => Err(CorruptionKind::Key(format!(
            "not an event key of task {task:?}"
        ))),
    }
}

/// The key of `task` in the `live` space.
#[must_use]
pub fn task_key(task: &str) -> Vec<u8> {
    task.as_bytes().to_vec()
}

/// [`task_key`] as the key of a batch's op (held in place for a task id of up to
/// [`crate::backend::OP_INLINE_BYTES`] bytes).
pub(crate) fn task_op_key(task: &str) -> crate::backend::OpBytes {
    crate::backend::OpBytes::from_slice(task.as_bytes())
}

/// Parses a `live` key.
///
/// # Errors
/// [`CorruptionKind::Key`] when the key is not a task id (UTF-8, non-empty, no NUL).
pub fn parse_task_key(key: &[u8]) -> Result<&str, CorruptionKind> {
    let task =
        std::str::from_utf8(key).map_err(|_| CorruptionKind::Key("task id is not UTF-8".into()))?;
    if is_valid_task_id(task) {
        Ok(task)
    } else {
        Err(CorruptionKind::Key(format!("{task:?} is not a task id")))
    }
}

/// The key of a global sequence number in the `commits` and `outbox` spaces.
#[must_use]
pub const fn seq_key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// Parses a `commits` / `outbox` key.
///
/// # Errors
/// [`CorruptionKind::Key`] when the key is not 8 bytes, [`CorruptionKind::OutOfRange`] when
/// it is not a global sequence (0, or above [`MAX_SEQUENCE`]).
pub fn parse_seq_key(key: &[u8]) -> Result<u64, CorruptionKind> {
    let bytes: [u8; 8] = key
        .try_into()
        .map_err(|_| CorruptionKind::Key(format!("sequence key of {} bytes", key.len())))?;
    checked_seq(u64::from_be_bytes(bytes))
}

/// Checks that `task` can be used in keys: non-empty and without NUL.
#[must_use]
pub fn is_valid_task_id(task: &str) -> bool {
    !task.is_empty() && !task.as_bytes().contains(&TASK_SEPARATOR)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn task_id() -> impl Strategy<Value = String> {
        "[^\u{0}]{1,12}"
    }

    proptest! {
        #[test]
        fn event_key_order_is_logical_order(a in task_id(), pa in any::<u64>(), b in task_id(), pb in any::<u64>()) {
            let logical = (a.as_str(), pa).cmp(&(b.as_str(), pb));
            prop_assert_eq!(event_key(&a, pa).cmp(&event_key(&b, pb)), logical);
        }

        #[test]
        fn event_key_round_trips(a in task_id(), p in 0..=MAX_POSITION) {
            let key = event_key(&a, p);
            prop_assert_eq!(parse_event_key(&key).unwrap(), (a.as_str(), p));
            prop_assert!(key.starts_with(&task_prefix(&a)));
            prop_assert_eq!(position_in(&a, &key).unwrap(), p);
        }

        #[test]
        fn a_task_end_bounds_exactly_its_event_keys(a in task_id(), pa in any::<u64>(), b in task_id(), pb in any::<u64>()) {
            let (mut end, mut key) = (vec![9], vec![9]);
            task_end_into(&a, &mut end);
            prop_assert_eq!(Some(end.clone()), crate::backend::prefix_end(&task_prefix(&a)));
            event_key_into(&a, pa, &mut key);
            prop_assert_eq!(&key, &event_key(&a, pa));
            prop_assert!(key < end);
            // Another task's keys lie wholly before or wholly after `a`'s range.
            let other = event_key(&b, pb);
            if a != b {
                prop_assert!(other < event_key(&a, 0) || other >= end);
            }
        }

        #[test]
        fn position_in_agrees_with_the_full_parse(task in task_id(), bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            // On any bytes: either both name the same position of `task`, or the fast parse
            // refuses a key that is not `task`'s.
            match (position_in(&task, &bytes), parse_event_key(&bytes)) {
                (Ok(p), Ok((t, q))) => prop_assert_eq!((t, q), (task.as_str(), p)),
                (Ok(_), Err(_)) => prop_assert!(false, "fast parse accepted a malformed key"),
                (Err(_), Ok((t, _))) => prop_assert_ne!(t, task.as_str()),
                (Err(_), Err(_)) => {}
            }
        }

        #[test]
        fn seq_key_order_is_numeric_order(a in any::<u64>(), b in any::<u64>()) {
            prop_assert_eq!(seq_key(a).cmp(&seq_key(b)), a.cmp(&b));
            // Only global sequences parse back; anything else is damage.
            match parse_seq_key(&seq_key(a)) {
                Ok(parsed) => prop_assert!(parsed == a && (1..=MAX_SEQUENCE).contains(&a)),
                Err(kind) => {
                    let out_of_range = matches!(kind, CorruptionKind::OutOfRange { .. });
                    prop_assert!(out_of_range && !(1..=MAX_SEQUENCE).contains(&a));
                }
            }
        }

        #[test]
        fn a_batch_op_key_is_the_key_it_stands_for(a in "[^\u{0}]{1,80}", p in any::<u64>()) {
            // Held in place or not, the bytes are the layout's.
            let key = event_op_key(&a, p);
            prop_assert_eq!(key.to_vec(), event_key(&a, p));
            prop_assert_eq!(key.spilled(), key.len() > crate::backend::OP_INLINE_BYTES);
            prop_assert_eq!(task_op_key(&a).to_vec(), task_key(&a));
        }

        #[test]
        fn parsing_random_keys_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = parse_event_key(&bytes);
            let _ = parse_seq_key(&bytes);
            let _ = parse_task_key(&bytes);
        }
    }

    #[test]
    fn a_task_prefix_does_not_cover_a_longer_task() {
        // "a" and "a\u{1}" must be distinct ranges.
        assert!(!event_key("ab", 0).starts_with(&task_prefix("a")));
        assert!(event_key("a", u64::MAX) < event_key("ab", 0));
    }

    #[test]
    fn numbers_beyond_the_bounds_do_not_parse() {
        assert!(parse_seq_key(&seq_key(0)).is_err());
        assert!(parse_seq_key(&seq_key(MAX_SEQUENCE + 1)).is_err());
        assert!(parse_seq_key(&seq_key(u64::MAX)).is_err());
        assert_eq!(parse_seq_key(&seq_key(MAX_SEQUENCE)), Ok(MAX_SEQUENCE));
        assert!(parse_event_key(&event_key("t", MAX_POSITION + 1)).is_err());
        assert!(position_in("t", &event_key("t", u64::MAX)).is_err());
        assert_eq!(
            position_in("t", &event_key("t", MAX_POSITION)),
            Ok(MAX_POSITION)
        );
    }

    #[test]
    fn the_engines_generated_ids_make_event_keys_held_in_place() {
        // `kind_` and 32 hex digits (a UUID v7's simple form), for kinds of up to 22 bytes.
        let hex = "0193a5f2c4e87b3d9a1f6e2c8b4d7a90";
        for kind in ["task", "shell", "a-kind-of-22-bytes-xyz"] {
            let id = format!("{kind}_{hex}");
            assert!(!event_op_key(&id, u64::MAX).spilled(), "{id}");
        }
        assert!(event_op_key(&format!("a-kind-of-23-bytes-xyzw_{hex}"), 0).spilled());
    }

    #[test]
    fn task_id_validity() {
        assert!(is_valid_task_id("task_1"));
        assert!(!is_valid_task_id(""));
        assert!(!is_valid_task_id("a\0b"));
    }
}

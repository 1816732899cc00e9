//! The journal's keys ([`crate::keys`]) as rows of the PostgreSQL tables, and back.
//!
//! Every space keeps the order of its keys as the order of a table's primary key, so a range
//! of keys is a range of rows:
//!
//! | space | table | key ↔ row |
//! |---|---|---|
//! | `events` | `dtask_records` | task id ‖ 0x00 ‖ position (BE) ↔ (`task` collated "C", `position`) |
//! | `commits` | `dtask_records` (by `seq`) | sequence (BE) ↔ `seq`; the value is the event key |
//! | `outbox` | `dtask_outbox` | sequence (BE) ↔ `seq`; the value is the event key |
//! | `live` | `dtask_live` | task id ↔ `task` |
//! | `meta` | `dtask_meta` | name ↔ `name` (bytea) |
//!
//! Byte order of an event key is (task id, position) order because task ids hold no NUL and
//! the "C" collation compares bytes. A seek may name any bytes, not only a stored key (the
//! readers seek to a prefix's end to skip a task): [`lower`] and [`upper`] turn any bytes
//! into the bound on rows that the same comparison on keys would give.

use super::write::Params;
use crate::error::{Error, Result};
use crate::keys::{self, Space};
use tokio_postgres::types::Type;

/// A value of a table's key columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Val {
    /// (task, position) of `dtask_records`.
    TaskPos(String, i64),
    /// A global sequence.
    Seq(i64),
    /// A task id of `dtask_live`.
    Task(String),
    /// A name of `dtask_meta`.
    Name(Vec<u8>),
}

/// A bound on rows: the key columns compared with `val`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bound {
    pub val: Val,
    /// Whether a row equal to `val` is within the bound.
    pub inclusive: bool,
}

impl Bound {
    fn ge(val: Val) -> Self {
        Self {
            val,
            inclusive: true,
        }
    }
}

/// The table, the key columns, and the columns read, of a space.
pub(crate) struct Shape {
    pub table: &'static str,
    pub key: &'static str,
    pub select: &'static str,
}

pub(crate) const fn shape(space: Space) -> Shape {
    match space {
        Space::Events => Shape {
            table: "dtask_records",
            key: "(task, position)",
            select: "task, position, record",
        },
        Space::Commits => Shape {
            table: "dtask_records",
            key: "seq",
            select: "seq, task, position",
        },
        Space::Outbox => Shape {
            table: "dtask_outbox",
            key: "seq",
            select: "seq, task, position",
        },
        Space::Live => Shape {
            table: "dtask_live",
            key: "task",
            select: "task",
        },
        Space::Meta => Shape {
            table: "dtask_meta",
            key: "name",
            select: "name, value",
        },
    }
}

fn utf8(bytes: &[u8]) -> Result<String> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| Error::storage("a key of this journal is not UTF-8 before its separator"))
}

/// The first 8 bytes of `bytes` (padded with zeros) as a non-negative integer.
fn be(bytes: &[u8]) -> i64 {
    let mut buf = [0u8; 8];
    let n = bytes.len().min(8);
    buf[..n].copy_from_slice(&bytes[..n]);
    i64::try_from(u64::from_be_bytes(buf)).unwrap_or(i64::MAX)
}

/// Rows whose key is at or after `key` (bytes compared as the keys are).
///
/// # Errors
/// [`Error::Storage`] when a task id part is not UTF-8.
pub(crate) fn lower(space: Space, key: &[u8]) -> Result<Bound> {
    Ok(match space {
        Space::Events => match key.iter().position(|b| *b == keys::TASK_SEPARATOR) {
            // Bytes without a separator come before every key of that task.
            None => Bound::ge(Val::TaskPos(utf8(key)?, 0)),
            Some(i) => {
                let rest = &key[i + 1..];
                let position = be(rest);
                // Longer than a position: after the key of that position.
                let position = if rest.len() > 8 {
                    position.saturating_add(1)
                } else {
                    position
                };
                Bound::ge(Val::TaskPos(utf8(&key[..i])?, position))
            }
        },
        Space::Commits | Space::Outbox => {
            let seq = be(key);
            Bound::ge(Val::Seq(if key.len() > 8 {
                seq.saturating_add(1)
            } else {
                seq
            }))
        }
        Space::Live => {
            // Task ids hold no NUL: bytes ending in NULs come right after the id before them.
            let trimmed = key.len() - key.iter().rev().take_while(|b| **b == 0).count();
            Bound {
                val: Val::Task(utf8(&key[..trimmed])?),
                inclusive: trimmed == key.len(),
            }
        }
        Space::Meta => Bound::ge(Val::Name(key.to_vec())),
    })
}

/// Rows whose key is before `key` (exclusive).
///
/// # Errors
/// As for [`lower`].
pub(crate) fn upper(space: Space, key: &[u8]) -> Result<Bound> {
    // Rows before `key` are the rows not at or after it.
    let at_or_after = lower(space, key)?;
    Ok(Bound {
        inclusive: !at_or_after.inclusive,
        val: at_or_after.val,
    })
}

/// Rows after `key` (the key of a row read).
///
/// # Errors
/// As for [`lower`].
pub(crate) fn after(space: Space, key: &[u8]) -> Result<Bound> {
    let mut next = key.to_vec();
    next.push(0);
    lower(space, &next)
}

/// The parameters of a bound, and its SQL comparison (`$n` numbered from `first`).
pub(crate) fn compare(
    shape: &Shape,
    bound: &Bound,
    lower: bool,
    first: usize,
    params: &mut Params,
) -> String {
    let op = match (lower, bound.inclusive) {
        (true, true) => ">=",
        (true, false) => ">",
        (false, true) => "<=",
        (false, false) => "<",
    };
    match &bound.val {
        Val::TaskPos(task, position) => {
            params.push((Box::new(task.clone()), Type::TEXT));
            params.push((Box::new(*position), Type::INT8));
            format!("{} {op} (${first}, ${})", shape.key, first + 1)
        }
        Val::Seq(seq) => {
            params.push((Box::new(*seq), Type::INT8));
            format!("{} {op} ${first}", shape.key)
        }
        Val::Task(task) => {
            params.push((Box::new(task.clone()), Type::TEXT));
            format!("{} {op} ${first}", shape.key)
        }
        Val::Name(name) => {
            params.push((Box::new(name.clone()), Type::BYTEA));
            format!("{} {op} ${first}", shape.key)
        }
    }
}

/// An event key's (task, position).
///
/// # Errors
/// [`Error::Storage`] for bytes that are not an event key.
pub(crate) fn event_row(key: &[u8]) -> Result<(String, i64)> {
    let (task, position) = keys::parse_event_key(key)
        .map_err(|kind| Error::storage(format!("not an event key: {kind}")))?;
    let position = i64::try_from(position)
        .map_err(|_| Error::storage("a position beyond the database's range"))?;
    Ok((task.to_owned(), position))
}

/// A sequence key's sequence.
///
/// # Errors
/// [`Error::Storage`] for bytes that are not a sequence key.
pub(crate) fn seq_row(key: &[u8]) -> Result<i64> {
    let bytes: [u8; 8] = key
        .try_into()
        .map_err(|_| Error::storage("not a sequence key"))?;
    i64::try_from(u64::from_be_bytes(bytes))
        .map_err(|_| Error::storage("a sequence beyond the database's range"))
}

/// The event key of a row's (task, position).
pub(crate) fn event_key(task: &str, position: i64) -> Vec<u8> {
    keys::event_key(task, u64::try_from(position).unwrap_or_default())
}

/// The key of a sequence.
pub(crate) fn seq_key(seq: i64) -> Vec<u8> {
    keys::seq_key(u64::try_from(seq).unwrap_or_default()).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(key: &[u8]) -> Bound {
        lower(Space::Events, key).unwrap()
    }

    #[test]
    fn event_bounds_follow_key_order() {
        // A task prefix: every record of the task.
        assert_eq!(events(b"a\0"), Bound::ge(Val::TaskPos("a".into(), 0)));
        // A prefix's end (task ‖ 0x01): after every record of the task.
        assert_eq!(
            events(b"a\x01"),
            Bound::ge(Val::TaskPos("a\u{1}".into(), 0))
        );
        let key = keys::event_key("a", 7);
        assert_eq!(events(&key), Bound::ge(Val::TaskPos("a".into(), 7)));
        assert_eq!(
            after(Space::Events, &key).unwrap(),
            Bound::ge(Val::TaskPos("a".into(), 8))
        );
        assert_eq!(
            upper(Space::Events, &key).unwrap(),
            Bound {
                val: Val::TaskPos("a".into(), 7),
                inclusive: false
            }
        );
        // A partial position pads with zeros.
        assert_eq!(
            events(b"a\0\x01"),
            Bound::ge(Val::TaskPos("a".into(), 1 << 56))
        );
    }

    #[test]
    fn sequence_and_live_bounds() {
        let seq = keys::seq_key(5);
        assert_eq!(lower(Space::Commits, &seq).unwrap(), Bound::ge(Val::Seq(5)));
        assert_eq!(after(Space::Commits, &seq).unwrap(), Bound::ge(Val::Seq(6)));
        assert_eq!(
            after(Space::Live, b"t1").unwrap(),
            Bound {
                val: Val::Task("t1".into()),
                inclusive: false
            }
        );
        assert_eq!(
            lower(Space::Live, b"").unwrap(),
            Bound::ge(Val::Task(String::new()))
        );
    }
}

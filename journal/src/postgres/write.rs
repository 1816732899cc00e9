//! A batch of the journal's ops as one call of `dtask_write_batch` (schema version 4,
//! migration `0004_write_batch.sql`): the rows table by table as arrays, written in one
//! statement — one reply from the server, whatever the batch touches.

use super::conn::Session;
use super::rows;
use crate::backend::{BatchOp, OpBytes};
use crate::error::{Error, Result};
use crate::keys::Space;
use std::collections::BTreeMap;
use tokio_postgres::types::{ToSql, Type};

/// The parameters of a statement, with their types: a statement sent whole needs no prepare's
/// round trip, and one prepared once is prepared with them.
pub(crate) type Params = Vec<(Box<dyn ToSql + Sync + Send>, Type)>;

/// The types of `params`, to prepare a statement with.
pub(crate) fn types(params: &Params) -> Vec<Type> {
    params.iter().map(|(_, t)| t.clone()).collect()
}

/// The values of `params`, as a prepared statement takes them.
pub(crate) fn values(params: &Params) -> Vec<&(dyn ToSql + Sync)> {
    params
        .iter()
        .map(|(p, _)| p.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

/// What a batch leaves behind, table by table: for each key only the batch's last op counts
/// (a notification enqueued and acknowledged in one batch leaves only its deletion, of a row
/// that never was).
#[derive(Default)]
struct Rows {
    records: (Vec<String>, Vec<i64>, Vec<i64>, Vec<Vec<u8>>),
    dropped_records: (Vec<String>, Vec<i64>),
    live: Vec<String>,
    dead: Vec<String>,
    outbox: (Vec<i64>, Vec<String>, Vec<i64>),
    acked: Vec<i64>,
    meta: (Vec<Vec<u8>>, Vec<Vec<u8>>),
    meta_dropped: Vec<Vec<u8>>,
}

fn task(key: &[u8]) -> Result<String> {
    String::from_utf8(key.to_vec()).map_err(|_| Error::storage("a task id that is not UTF-8"))
}

impl Rows {
    /// The rows `ops` leave behind.
    fn of(ops: Vec<BatchOp>) -> Result<Self> {
        let mut last: Last = BTreeMap::new();
        let mut rows = Rows::default();
        for op in ops {
            let (space, key, value) = match op {
                BatchOp::Put { space, key, value } => (space, key, Some(value)),
                BatchOp::Delete { space, key } => (space, key, None),
                // Its rows are read by index: a finished stream stays where it is.
                BatchOp::Retire { .. } => continue,
                // One table: the purged records' rows go (their `seq` with them: the commit
                // index is that column), deleted before the batch's rows are inserted — the
                // tombstone's among them, in the first record's place.
                BatchOp::Purge { task, below, .. } => {
                    let below = i64::try_from(below.min(crate::keys::MAX_POSITION))
                        .map_err(|_| Error::storage("a purge beyond the positions"))?;
                    for position in 0..below {
                        rows.dropped_records.0.push(task.clone());
                        rows.dropped_records.1.push(position);
                    }
                    continue;
                }
                // A record framed again in its place: its row goes before the batch's rows are
                // inserted, the new one among them (same position, same `seq`).
                BatchOp::Replace { key, value } => {
                    let (task, position) = rows::event_row(&key)?;
                    rows.dropped_records.0.push(task);
                    rows.dropped_records.1.push(position);
                    (Space::Events, key, Some(value))
                }
            };
            let tag = Space::ALL.iter().position(|s| *s == space).unwrap_or(0);
            last.insert((tag, key.into_vec()), value.map(OpBytes::into_vec));
        }
        for ((tag, key), value) in last {
            rows.add(Space::ALL[tag], key, value)?;
        }
        Ok(rows)
    }

    /// Adds the last op of `key` in `space`: its value, or its deletion (`None`).
    fn add(&mut self, space: Space, key: Vec<u8>, value: Option<Vec<u8>>) -> Result<()> {
        match (space, value) {
            (Space::Events, Some(record)) => {
                let (task, position) = rows::event_row(&key)?;
                let seq = crate::record::seq_of(&record)
                    .and_then(|seq| i64::try_from(seq).ok())
                    .ok_or_else(|| Error::storage("a record without a sequence in range"))?;
                self.records.0.push(task);
                self.records.1.push(position);
                self.records.2.push(seq);
                self.records.3.push(record);
            }
            (Space::Events, None) => {
                let (task, position) = rows::event_row(&key)?;
                self.dropped_records.0.push(task);
                self.dropped_records.1.push(position);
            }
            // The commit index is the records' `seq` column: written with them.
            (Space::Commits, _) => {}
            (Space::Live, Some(_)) => self.live.push(task(&key)?),
            (Space::Live, None) => self.dead.push(task(&key)?),
            (Space::Outbox, Some(value)) => {
                let (task, position) = rows::event_row(&value)?;
                self.outbox.0.push(rows::seq_row(&key)?);
                self.outbox.1.push(task);
                self.outbox.2.push(position);
            }
            (Space::Outbox, None) => self.acked.push(rows::seq_row(&key)?),
            (Space::Meta, Some(value)) => {
                self.meta.0.push(key);
                self.meta.1.push(value);
            }
            (Space::Meta, None) => self.meta_dropped.push(key),
        }
        Ok(())
    }
}

/// The arguments of `dtask_write_batch` that write a batch's ops: the tail `expected` (`None`:
/// no check, for a writer that read the tail with the lock held, or a write outside the
/// writer's batches), whether the commit waits for the flush, the rows table by table, and
/// the `NOTIFY`'s payload, if any.
///
/// # Errors
/// [`Error::Storage`] for an op whose key or value does not fit its table.
pub(crate) fn batch_call(
    ops: Vec<BatchOp>,
    expected: Option<Vec<u8>>,
    flush: Flush,
    notice: Option<String>,
) -> Result<Params> {
    let rows = Rows::of(ops)?;
    let (r, d, o, m) = (rows.records, rows.dropped_records, rows.outbox, rows.meta);
    Ok(vec![
        (Box::new(expected), Type::BYTEA),
        (Box::new(flush == Flush::AtCommit), Type::BOOL),
        (Box::new(r.0), Type::TEXT_ARRAY),
        (Box::new(r.1), Type::INT8_ARRAY),
        (Box::new(r.2), Type::INT8_ARRAY),
        (Box::new(r.3), Type::BYTEA_ARRAY),
        (Box::new(d.0), Type::TEXT_ARRAY),
        (Box::new(d.1), Type::INT8_ARRAY),
        (Box::new(rows.live), Type::TEXT_ARRAY),
        (Box::new(rows.dead), Type::TEXT_ARRAY),
        (Box::new(o.0), Type::INT8_ARRAY),
        (Box::new(o.1), Type::TEXT_ARRAY),
        (Box::new(o.2), Type::INT8_ARRAY),
        (Box::new(rows.acked), Type::INT8_ARRAY),
        (Box::new(m.0), Type::BYTEA_ARRAY),
        (Box::new(m.1), Type::BYTEA_ARRAY),
        (Box::new(rows.meta_dropped), Type::BYTEA_ARRAY),
        (Box::new(notice), Type::TEXT),
    ])
}

/// The call of `dtask_write_batch`, with the arguments [`batch_call`] makes.
const WRITE_BATCH: &str = "SELECT dtask_write_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, \
                           $11, $12, $13, $14, $15, $16, $17, $18)";

/// The last value (or deletion) of each (space, key) of a batch.
type Last = BTreeMap<(usize, Vec<u8>), Option<Vec<u8>>>;

/// The writer lock's statement: the journal's advisory lock (schema version 3, migration
/// `0003_advisory_writer_lock.sql`), held until the transaction ends.
pub(crate) const WRITER_LOCK: &str = "SELECT dtask_lock_writer()";

/// The statement that makes the transaction's commit wait for the write-ahead log's flush,
/// on a session whose commits do not. A macro, so that `concat!` builds it into the message
/// of a transaction's other statements.
macro_rules! flush_at_commit {
    () => {
        "SET LOCAL synchronous_commit TO on"
    };
}
pub(crate) use flush_at_commit;

/// Whether a commit waits for the database's flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flush {
    /// As the session does: the readers' sessions wait (with [`crate::Durability::Sync`]),
    /// the writer's does not — its batches are made durable by a later [`flush`].
    AsTheSession,
    /// Waits, whatever the session does: a batch of the writer's with no record for a later
    /// [`flush`] to find again.
    AtCommit,
}

/// Calls `dtask_write_batch` with `params` (see [`batch_call`]): prepared once per
/// connection, then one message and one reply a batch. Outside a transaction the call is one
/// of its own (the lock, the writes, the commit); inside one, it writes and holds the lock.
pub(crate) async fn call(
    client: &Session,
    params: &Params,
) -> std::result::Result<(), tokio_postgres::Error> {
    let statement = prepared(client, params).await?;
    send(client, &statement, params).await
}

/// `dtask_write_batch`'s call prepared on `client` for `params`' types (once per connection:
/// no round trip after the first).
async fn prepared(
    client: &Session,
    params: &Params,
) -> std::result::Result<tokio_postgres::Statement, tokio_postgres::Error> {
    client.statement(WRITE_BATCH, &types(params)).await
}

/// Sends the prepared call with `params` when first polled.
async fn send(
    client: &Session,
    statement: &tokio_postgres::Statement,
    params: &Params,
) -> std::result::Result<(), tokio_postgres::Error> {
    client.execute(statement, &values(params)).await.map(|_| ())
}

/// Writes a batch in the transaction open on `client` (which holds the writer lock) and
/// commits; rolls back if the write fails. The call and the commit are pipelined: one round
/// trip.
pub(crate) async fn write_and_commit(
    client: &Session,
    params: Params,
) -> std::result::Result<(), tokio_postgres::Error> {
    let run = async {
        // Prepared before anything is sent, so that the call goes out when first polled and
        // the commit behind it.
        let statement = prepared(client, &params).await?;
        let (written, committed) = futures_util::future::join(
            send(client, &statement, &params),
            client.batch_execute("COMMIT"),
        )
        .await;
        written?;
        committed
    };
    match run.await {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = client.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

/// The SQLSTATE of `dtask_expect_tail`'s failure: another writer committed.
const MOVED: &str = "DT001";

/// The whole of a batch in one round trip, outside any transaction: the call of
/// `dtask_write_batch` with `params` made with the tail expected (see [`batch_call`]) is its
/// own transaction — the writer lock, the check that the tail is still the one expected, the
/// writes, the commit. `Ok(false)` (rolled back, nothing written) when the check fails or a
/// record of the batch exists already.
pub(crate) async fn write_expecting(
    client: &Session,
    params: Params,
) -> std::result::Result<bool, tokio_postgres::Error> {
    match call(client, &params).await {
        Ok(()) => Ok(true),
        Err(e) => {
            // The call's transaction ended with it: nothing to roll back.
            let moved = e.as_db_error().is_some_and(|db| {
                db.code().code() == MOVED
                    || (db.code() == &tokio_postgres::error::SqlState::UNIQUE_VIOLATION
                        && db.table() == Some("dtask_records"))
            });
            if moved {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

/// Makes durable every commit the server acknowledged before this call, and then announces
/// sequence `payload` to other processes — if the server process answering is `backend`
/// (the one the session began with, which began before the commit: the server has not
/// restarted since, so the commit is there to flush, whatever another node did to its
/// record since — a trim frames it again, a purge deletes it), or else if `record` (`task`,
/// `position` and the bytes of the last record a session that does not wait for the flush
/// committed) is still there as committed. `Ok(false)` when the record is gone or differs:
/// the server lost what it had not flushed (it crashed and restarted), or another node
/// trimmed or purged it since; nothing is announced.
///
/// Two statements in one round trip, each a transaction of its own, on a session that waits
/// for the flush (the syncer's, with [`crate::Durability::Sync`]). The first writes a
/// transactional message to the write-ahead log (`pg_logical_emit_message`, which any user
/// may call), when it finds the record or looks for none: a transaction that wrote to the log
/// waits at its commit for the log's flush up to its commit record — which covers every commit
/// the server had written before, among them the record's. (A transaction id alone is not
/// enough: a commit that wrote nothing else to the log does not wait for the flush, whatever
/// `synchronous_commit` says.) The second sends the `NOTIFY`, once the first has committed:
/// apart, because a transaction that notifies holds the database's notification lock until it
/// ends, and the syncs of all processes would then wait for each other's flushes instead of
/// sharing them.
pub(crate) async fn flush(
    client: &Session,
    record: (&str, i64, &[u8]),
    backend: Option<i32>,
    payload: &str,
) -> std::result::Result<bool, tokio_postgres::Error> {
    if let Some(pid) = backend {
        // Found when the server process is the one the session began with: no restart
        // since. (Through a pooler it may be another, and then the record is looked for.)
        let find = client
            .statement(
                "SELECT pg_logical_emit_message(true, 'dtask', '') WHERE pg_backend_pid() = $1",
                &[Type::INT4],
            )
            .await?;
        let announce = client
            .statement(
                "SELECT pg_notify($1, $2) WHERE pg_backend_pid() = $3",
                &[Type::TEXT, Type::TEXT, Type::INT4],
            )
            .await?;
        let (found, _) = futures_util::future::join(
            client.execute(&find, &[&pid]),
            client.execute(&announce, &[&super::listen::CHANNEL, &payload, &pid]),
        )
        .await;
        if found? == 1 {
            return Ok(true);
        }
    }
    let (task, position, bytes) = record;
    let find = client
        .statement(
            "SELECT pg_logical_emit_message(true, 'dtask', '') FROM dtask_records \
             WHERE task = $1 AND position = $2 AND record = $3",
            &[Type::TEXT, Type::INT8, Type::BYTEA],
        )
        .await?;
    let announce = client
        .statement(
            "SELECT pg_notify($1, $2) FROM dtask_records \
             WHERE task = $3 AND position = $4 AND record = $5",
            &[Type::TEXT, Type::TEXT, Type::TEXT, Type::INT8, Type::BYTEA],
        )
        .await?;
    // Sent together when first polled, in this order.
    let (found, _) = futures_util::future::join(
        client.execute(&find, &[&task, &position, &bytes]),
        client.execute(
            &announce,
            &[&super::listen::CHANNEL, &payload, &task, &position, &bytes],
        ),
    )
    .await;
    Ok(found? == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys;

    fn put(space: Space, key: Vec<u8>, value: Vec<u8>) -> BatchOp {
        BatchOp::Put {
            space,
            key: key.into(),
            value: value.into(),
        }
    }

    fn delete(space: Space, key: Vec<u8>) -> BatchOp {
        BatchOp::Delete {
            space,
            key: key.into(),
        }
    }

    /// The migration that creates `dtask_write_batch`.
    const MIGRATION: &str = include_str!("../../migrations/postgres/0004_write_batch.sql");

    /// The SQL type of each parameter of `dtask_write_batch`, as its migration declares them.
    fn declared() -> Vec<String> {
        let start = MIGRATION
            .find("CREATE FUNCTION dtask_write_batch(")
            .unwrap();
        let list = &MIGRATION[start..];
        let list = &list[list.find('(').unwrap() + 1..list.find(") RETURNS").unwrap()];
        list.split(',')
            .map(|param| param.split_whitespace().nth(1).unwrap().to_owned())
            .collect()
    }

    #[test]
    fn the_call_passes_every_parameter_the_function_declares_with_its_type() {
        let params = batch_call(Vec::new(), None, Flush::AsTheSession, None).unwrap();
        let declared = declared();
        assert_eq!(declared.len(), 18);
        assert_eq!(params.len(), declared.len());
        assert_eq!(WRITE_BATCH.matches('$').count(), declared.len());
        // The notice goes where the listeners listen.
        assert!(MIGRATION.contains(&format!(
            "pg_notify('{}', notice)",
            super::super::listen::CHANNEL
        )));
        for (i, ((_, ty), sql)) in params.iter().zip(&declared).enumerate() {
            let expected = match sql.as_str() {
                "bytea" => Type::BYTEA,
                "boolean" => Type::BOOL,
                "text" => Type::TEXT,
                "text[]" => Type::TEXT_ARRAY,
                "int8[]" => Type::INT8_ARRAY,
                "bytea[]" => Type::BYTEA_ARRAY,
                other => panic!("parameter {} of an unexpected type {other}", i + 1),
            };
            assert_eq!(ty, &expected, "parameter {}", i + 1);
        }
    }

    #[test]
    fn each_key_of_a_batch_leaves_its_last_op_in_its_table() {
        let record = crate::record::frame("t", 0, 7, b"x", &crate::record::Digest::default())
            .unwrap()
            .0;
        let ops = vec![
            put(Space::Events, keys::event_key("t", 0), record.clone()),
            delete(Space::Events, keys::event_key("u", 3)),
            put(Space::Live, keys::task_key("t"), Vec::new()),
            delete(Space::Live, keys::task_key("u")),
            // Enqueued and acknowledged in one batch: only the deletion is left.
            put(
                Space::Outbox,
                keys::seq_key(1).to_vec(),
                keys::event_key("t", 0),
            ),
            delete(Space::Outbox, keys::seq_key(1).to_vec()),
            delete(Space::Outbox, keys::seq_key(2).to_vec()),
            put(Space::Meta, keys::META_TAIL.to_vec(), vec![1]),
            put(Space::Meta, keys::META_TAIL.to_vec(), vec![2]),
            delete(Space::Meta, b"old".to_vec()),
        ];
        let rows = Rows::of(ops).unwrap();
        assert_eq!(rows.records.0, ["t"]);
        assert_eq!(rows.records.1, [0]);
        assert_eq!(rows.records.2, [7]);
        assert_eq!(rows.records.3, [record]);
        assert_eq!(rows.dropped_records, (vec!["u".to_owned()], vec![3]));
        assert_eq!(rows.live, ["t"]);
        assert_eq!(rows.dead, ["u"]);
        assert!(rows.outbox.0.is_empty());
        assert_eq!(rows.acked, [1, 2]);
        assert_eq!(rows.meta, (vec![keys::META_TAIL.to_vec()], vec![vec![2]]));
        assert_eq!(rows.meta_dropped, [b"old".to_vec()]);
    }
}

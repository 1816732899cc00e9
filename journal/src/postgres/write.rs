//! A batch of the journal's ops as the SQL statements that write it, in one transaction.

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

/// How a statement is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Prepared once per connection and bound for each batch: its plan does not depend on
    /// how large a table has grown (an insert, an upsert, a function's call).
    Cached,
    /// Sent whole and unnamed, planned anew for each batch: it finds rows by a parameter
    /// array, and a plan cached while a table was small would scan it whole once it has grown
    /// (until the table's next `ANALYZE`).
    EachTime,
}

/// A statement, its parameters and how it is sent.
pub(crate) struct Statement {
    /// Its text.
    pub sql: &'static str,
    /// Its parameters.
    pub params: Params,
    /// Prepared once, or planned each time.
    pub plan: Plan,
}

/// `params` as `tokio-postgres` takes typed parameters.
pub(crate) fn typed(params: &Params) -> Vec<(&(dyn ToSql + Sync), Type)> {
    params
        .iter()
        .map(|(p, t)| (p.as_ref() as &(dyn ToSql + Sync), t.clone()))
        .collect()
}

/// A statement ready to be sent: nothing of it needs a round trip of its own any more.
enum Ready<'a> {
    /// Prepared on the connection, with its parameters' values.
    Bound(tokio_postgres::Statement, Vec<&'a (dyn ToSql + Sync)>),
    /// Sent whole (parse, bind, execute), with its typed parameters.
    Whole(&'static str, Vec<(&'a (dyn ToSql + Sync), Type)>),
}

/// Each of `statements` made ready on `session`, in order: those of [`Plan::Cached`]
/// prepared (once per connection). Awaited before any statement of a pipeline is sent (see
/// [`Session::statement`]).
async fn ready<'a>(
    session: &Session,
    statements: &'a [Statement],
) -> std::result::Result<Vec<Ready<'a>>, tokio_postgres::Error> {
    let mut ready = Vec::with_capacity(statements.len());
    for statement in statements {
        ready.push(match statement.plan {
            Plan::Cached => {
                let types: Vec<Type> = statement.params.iter().map(|(_, t)| t.clone()).collect();
                let prepared = session.statement(statement.sql, &types).await?;
                let values = statement
                    .params
                    .iter()
                    .map(|(p, _)| p.as_ref() as &(dyn ToSql + Sync))
                    .collect();
                Ready::Bound(prepared, values)
            }
            Plan::EachTime => Ready::Whole(statement.sql, typed(&statement.params)),
        });
    }
    Ok(ready)
}

/// Sends `ready` on `session` when first polled; its rows' count.
fn execute<'a>(
    session: &'a Session,
    ready: &'a Ready<'a>,
) -> impl std::future::Future<Output = std::result::Result<u64, tokio_postgres::Error>> + 'a {
    use futures_util::future::Either;
    match ready {
        Ready::Bound(statement, values) => Either::Left(session.execute(statement, values)),
        Ready::Whole(sql, typed) => Either::Right(session.execute_typed(sql, typed)),
    }
}

/// What a batch leaves behind, table by table: for each key only the batch's last op counts
/// (a notification enqueued and acknowledged in one batch leaves nothing).
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

    fn into_statements(self) -> Vec<Statement> {
        let mut out: Vec<Statement> = Vec::new();
        let mut push = |sql: &'static str, params: Params, plan: Plan, any: bool| {
            if any {
                out.push(Statement { sql, params, plan });
            }
        };
        let (r, d) = (self.records, self.dropped_records);
        push(
            "DELETE FROM dtask_records WHERE (task, position) IN \
             (SELECT * FROM unnest($1::text[], $2::int8[]))",
            vec![
                (Box::new(d.0.clone()), Type::TEXT_ARRAY),
                (Box::new(d.1), Type::INT8_ARRAY),
            ],
            Plan::EachTime,
            !d.0.is_empty(),
        );
        let any = !r.0.is_empty();
        push(
            "INSERT INTO dtask_records (task, position, seq, record) \
             SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[], $4::bytea[])",
            vec![
                (Box::new(r.0), Type::TEXT_ARRAY),
                (Box::new(r.1), Type::INT8_ARRAY),
                (Box::new(r.2), Type::INT8_ARRAY),
                (Box::new(r.3), Type::BYTEA_ARRAY),
            ],
            Plan::Cached,
            any,
        );
        let any = !self.live.is_empty();
        push(
            "INSERT INTO dtask_live (task) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING",
            vec![(Box::new(self.live), Type::TEXT_ARRAY)],
            Plan::Cached,
            any,
        );
        let any = !self.dead.is_empty();
        push(
            "DELETE FROM dtask_live WHERE task = ANY($1::text[])",
            vec![(Box::new(self.dead), Type::TEXT_ARRAY)],
            Plan::EachTime,
            any,
        );
        let o = self.outbox;
        let any = !o.0.is_empty();
        push(
            "INSERT INTO dtask_outbox (seq, task, position) \
             SELECT * FROM unnest($1::int8[], $2::text[], $3::int8[]) \
             ON CONFLICT (seq) DO UPDATE SET task = excluded.task, position = excluded.position",
            vec![
                (Box::new(o.0), Type::INT8_ARRAY),
                (Box::new(o.1), Type::TEXT_ARRAY),
                (Box::new(o.2), Type::INT8_ARRAY),
            ],
            Plan::Cached,
            any,
        );
        let any = !self.acked.is_empty();
        push(
            "DELETE FROM dtask_outbox WHERE seq = ANY($1::int8[])",
            vec![(Box::new(self.acked), Type::INT8_ARRAY)],
            Plan::EachTime,
            any,
        );
        let m = self.meta;
        let any = !m.0.is_empty();
        push(
            "INSERT INTO dtask_meta (name, value) SELECT * FROM unnest($1::bytea[], $2::bytea[]) \
             ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            vec![
                (Box::new(m.0), Type::BYTEA_ARRAY),
                (Box::new(m.1), Type::BYTEA_ARRAY),
            ],
            Plan::Cached,
            any,
        );
        let any = !self.meta_dropped.is_empty();
        push(
            "DELETE FROM dtask_meta WHERE name = ANY($1::bytea[])",
            vec![(Box::new(self.meta_dropped), Type::BYTEA_ARRAY)],
            Plan::EachTime,
            any,
        );
        out
    }
}

/// The statements that write a batch's ops.
///
/// # Errors
/// [`Error::Storage`] for an op whose key or value does not fit its table.
pub(crate) fn statements(ops: Vec<BatchOp>) -> Result<Vec<Statement>> {
    let mut last: Last = BTreeMap::new();
    for op in ops {
        let (space, key, value) = match op {
            BatchOp::Put { space, key, value } => (space, key, Some(value)),
            BatchOp::Delete { space, key } => (space, key, None),
            // Its rows are read by index: a finished stream stays where it is.
            BatchOp::Retire { .. } => continue,
        };
        let tag = Space::ALL.iter().position(|s| *s == space).unwrap_or(0);
        last.insert((tag, key.into_vec()), value.map(OpBytes::into_vec));
    }
    let mut rows = Rows::default();
    for ((tag, key), value) in last {
        rows.add(Space::ALL[tag], key, value)?;
    }
    Ok(rows.into_statements())
}

/// The last value (or deletion) of each (space, key) of a batch.
type Last = BTreeMap<(usize, Vec<u8>), Option<Vec<u8>>>;

/// The writer lock's statement: the journal's advisory lock (schema version 3, migration
/// `0003_advisory_writer_lock.sql`), held until the transaction ends. A macro, so that
/// `concat!` builds the statements that begin a batch with it into one message (sent as
/// three, they cost a lone append ~7 % at one caller).
macro_rules! writer_lock {
    () => {
        "SELECT dtask_lock_writer()"
    };
}

/// The statement that makes the transaction's commit wait for the write-ahead log's flush,
/// on a session whose commits do not ([`Flush::AtCommit`]). A macro, as `writer_lock!`.
macro_rules! flush_at_commit {
    () => {
        "SET LOCAL synchronous_commit TO on"
    };
}
pub(crate) use flush_at_commit;

/// The writer lock (see `writer_lock!`).
pub(crate) const WRITER_LOCK: &str = writer_lock!();

/// See `flush_at_commit!`.
const FLUSH_AT_COMMIT: &str = flush_at_commit!();

/// Begins a transaction and takes the writer lock.
pub(crate) const BEGIN_LOCKED: &str = concat!("BEGIN; ", writer_lock!());

/// Begins a transaction whose commit waits for the flush, and takes the writer lock.
const BEGIN_LOCKED_FLUSHING: &str = concat!("BEGIN; ", flush_at_commit!(), "; ", writer_lock!());

/// Sends [`FLUSH_AT_COMMIT`] when first polled if `flush` asks for it (a transaction must be
/// open): poll it with the transaction's other statements, in order, to keep one round trip.
async fn set_flush(
    client: &Session,
    flush: Flush,
) -> std::result::Result<(), tokio_postgres::Error> {
    match flush {
        Flush::AtCommit => client.batch_execute(FLUSH_AT_COMMIT).await,
        Flush::AsTheSession => Ok(()),
    }
}

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

/// Runs `statements` in the transaction open on `client` and commits; rolls back if any
/// fails. The statements and the commit are pipelined: one round trip for the batch.
pub(crate) async fn write_and_commit(
    client: &Session,
    statements: Vec<Statement>,
    flush: Flush,
) -> std::result::Result<(), tokio_postgres::Error> {
    let run = async {
        // Made ready first; then each statement is sent when first polled, in order, and
        // the commit after them: one round trip, and the commit cannot overtake them.
        let ready = ready(client, &statements).await?;
        let pending = ready.iter().map(|ready| execute(client, ready));
        let (set, written, committed) = futures_util::future::join3(
            set_flush(client, flush),
            futures_util::future::try_join_all(pending),
            client.batch_execute("COMMIT"),
        )
        .await;
        set?;
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

/// The whole of a batch in one round trip: begin, the writer lock, the check that the tail is
/// still `expected`, `statements`, commit. `Ok(false)` (rolled back, nothing written) when the
/// check fails or a record of the batch exists already.
pub(crate) async fn write_expecting(
    client: &Session,
    expected: Vec<u8>,
    statements: Vec<Statement>,
    flush: Flush,
) -> std::result::Result<bool, tokio_postgres::Error> {
    // Prepared before anything is sent (once per connection: no round trip after).
    let check = client
        .statement("SELECT dtask_expect_tail($1)", &[Type::BYTEA])
        .await?;
    let ready = ready(client, &statements).await?;
    // Sent in this order when first polled, together: one round trip.
    let opening = client.batch_execute(match flush {
        Flush::AsTheSession => BEGIN_LOCKED,
        Flush::AtCommit => BEGIN_LOCKED_FLUSHING,
    });
    let check_params: [&(dyn ToSql + Sync); 1] = [&expected];
    let check = client.execute(&check, &check_params);
    let writes = futures_util::future::join_all(ready.iter().map(|ready| execute(client, ready)));
    let commit = client.batch_execute("COMMIT");
    let (begun, checked, written, committed) =
        futures_util::future::join4(opening, check, writes, commit).await;
    let first_error = begun
        .err()
        .or(checked.err())
        .or_else(|| written.into_iter().find_map(std::result::Result::err));
    match first_error {
        None => committed.map(|()| true),
        Some(e) => {
            // The transaction is over (its COMMIT became a rollback), or, if the error came
            // before it was sent, this ends it.
            let _ = client.batch_execute("ROLLBACK").await;
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

/// Makes durable every commit the server acknowledged before this call, if the record
/// `task`@`position` is still there as `record` (the last one a session that does not wait
/// for the flush committed), and then announces sequence `payload` to other processes.
/// `Ok(false)` when the record is gone or differs: the server lost what it had not flushed
/// (it crashed and restarted), and nothing is announced.
///
/// Two statements in one round trip, each a transaction of its own, on a session that waits
/// for the flush (the syncer's, with [`crate::Durability::Sync`]). The first, when it finds
/// the record, writes a transactional message to the write-ahead log
/// (`pg_logical_emit_message`, which any user may call): a transaction that wrote to the log
/// waits at its commit for the log's flush up to its commit record — which covers every commit
/// the server had written before, among them the record's, which this transaction saw. (A
/// transaction id alone is not enough: a commit that wrote nothing else to the log does not
/// wait for the flush, whatever `synchronous_commit` says.) The second sends the `NOTIFY`,
/// once the first has committed: apart, because a transaction that notifies holds the
/// database's notification lock until it ends, and the syncs of all processes would then
/// wait for each other's flushes instead of sharing them.
pub(crate) async fn flush(
    client: &Session,
    task: &str,
    position: i64,
    record: &[u8],
    payload: &str,
) -> std::result::Result<bool, tokio_postgres::Error> {
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
    let found: [&(dyn ToSql + Sync); 3] = [&task, &position, &record];
    let announced: [&(dyn ToSql + Sync); 5] =
        [&super::listen::CHANNEL, &payload, &task, &position, &record];
    // Sent together when first polled, in this order.
    let (found, _) = futures_util::future::join(
        client.execute(&find, &found),
        client.execute(&announce, &announced),
    )
    .await;
    Ok(found? == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys;

    #[test]
    fn statements_that_find_rows_are_planned_each_time_and_the_others_prepared() {
        let put = |space, key: Vec<u8>, value: Vec<u8>| BatchOp::Put {
            space,
            key: key.into(),
            value: value.into(),
        };
        let delete = |space, key: Vec<u8>| BatchOp::Delete {
            space,
            key: key.into(),
        };
        let record = crate::record::frame("t", 0, 1, b"x", &crate::record::Digest::default())
            .unwrap()
            .0;
        let ops = vec![
            put(Space::Events, keys::event_key("t", 0), record),
            delete(Space::Events, keys::event_key("u", 3)),
            put(Space::Live, keys::task_key("t"), Vec::new()),
            delete(Space::Live, keys::task_key("u")),
            put(
                Space::Outbox,
                keys::seq_key(1).to_vec(),
                keys::event_key("t", 0),
            ),
            delete(Space::Outbox, keys::seq_key(2).to_vec()),
            put(Space::Meta, keys::META_TAIL.to_vec(), vec![1]),
            delete(Space::Meta, b"old".to_vec()),
        ];
        let statements = statements(ops).unwrap();
        assert_eq!(statements.len(), 8);
        for statement in &statements {
            let finds_rows = statement.sql.starts_with("DELETE");
            let expected = if finds_rows {
                Plan::EachTime
            } else {
                Plan::Cached
            };
            assert_eq!(statement.plan, expected, "{}", statement.sql);
        }
    }
}

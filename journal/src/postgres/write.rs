//! A batch of the journal's ops as the SQL statements that write it, in one transaction.

use super::conn::Session;
use super::rows;
use crate::backend::{BatchOp, OpBytes};
use crate::error::{Error, Result};
use crate::keys::Space;
use std::collections::BTreeMap;
use tokio_postgres::types::{ToSql, Type};

/// The parameters of a statement, with their types (so that a statement needs no round trip
/// to be prepared).
pub(crate) type Params = Vec<(Box<dyn ToSql + Sync + Send>, Type)>;

/// A statement and its parameters.
pub(crate) type Statement = (&'static str, Params);

/// `params` as `tokio-postgres` takes typed parameters.
pub(crate) fn typed(params: &Params) -> Vec<(&(dyn ToSql + Sync), Type)> {
    params
        .iter()
        .map(|(p, t)| (p.as_ref() as &(dyn ToSql + Sync), t.clone()))
        .collect()
}

/// `params` as a prepared statement takes them (its types are the statement's).
fn values(params: &Params) -> Vec<&(dyn ToSql + Sync)> {
    params
        .iter()
        .map(|(p, _)| p.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

/// Each of `statements` prepared on `session` (once per connection), in order.
async fn prepare_all(
    session: &Session,
    statements: &[Statement],
) -> std::result::Result<Vec<tokio_postgres::Statement>, tokio_postgres::Error> {
    let mut prepared = Vec::with_capacity(statements.len());
    for (sql, params) in statements {
        let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
        prepared.push(session.statement(sql, &types).await?);
    }
    Ok(prepared)
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
        let mut push = |sql: &'static str, params: Params, any: bool| {
            if any {
                out.push((sql, params));
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
            any,
        );
        let any = !self.live.is_empty();
        push(
            "INSERT INTO dtask_live (task) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING",
            vec![(Box::new(self.live), Type::TEXT_ARRAY)],
            any,
        );
        let any = !self.dead.is_empty();
        push(
            "DELETE FROM dtask_live WHERE task = ANY($1::text[])",
            vec![(Box::new(self.dead), Type::TEXT_ARRAY)],
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
            any,
        );
        let any = !self.acked.is_empty();
        push(
            "DELETE FROM dtask_outbox WHERE seq = ANY($1::int8[])",
            vec![(Box::new(self.acked), Type::INT8_ARRAY)],
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
            any,
        );
        let any = !self.meta_dropped.is_empty();
        push(
            "DELETE FROM dtask_meta WHERE name = ANY($1::bytea[])",
            vec![(Box::new(self.meta_dropped), Type::BYTEA_ARRAY)],
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

/// Runs `statements` in the transaction open on `client` and commits; rolls back if any
/// fails. The statements and the commit are pipelined: one round trip for the batch.
pub(crate) async fn write_and_commit(
    client: &Session,
    statements: Vec<Statement>,
) -> std::result::Result<(), tokio_postgres::Error> {
    let run = async {
        // Prepared first; then each statement is sent (bind, execute) when first polled, in
        // order, and the commit after them: one round trip, and the commit cannot overtake
        // them.
        let prepared = prepare_all(client, &statements).await?;
        let values: Vec<_> = statements
            .iter()
            .map(|(_, params)| values(params))
            .collect();
        let pending = prepared
            .iter()
            .zip(&values)
            .map(|(statement, params)| client.execute(statement, params));
        let (written, committed) = futures_util::future::join(
            futures_util::future::try_join_all(pending),
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

/// The whole of a batch in one round trip: begin, the writer lock, the check that the tail is
/// still `expected`, `statements`, commit. `Ok(false)` (rolled back, nothing written) when the
/// check fails or a record of the batch exists already.
pub(crate) async fn write_expecting(
    client: &Session,
    expected: Vec<u8>,
    statements: Vec<Statement>,
) -> std::result::Result<bool, tokio_postgres::Error> {
    // Prepared before anything is sent (once per connection: no round trip after).
    let check = client
        .statement("SELECT dtask_expect_tail($1)", &[Type::BYTEA])
        .await?;
    let prepared = prepare_all(client, &statements).await?;
    let values: Vec<_> = statements
        .iter()
        .map(|(_, params)| values(params))
        .collect();
    // Sent in this order when first polled, together: one round trip.
    let opening =
        client.batch_execute("BEGIN; SELECT id FROM dtask_writer WHERE id = 1 FOR UPDATE");
    let check_params: [&(dyn ToSql + Sync); 1] = [&expected];
    let check = client.execute(&check, &check_params);
    let writes = futures_util::future::join_all(
        prepared
            .iter()
            .zip(&values)
            .map(|(statement, params)| client.execute(statement, params)),
    );
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

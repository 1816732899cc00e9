//! Operations on a journal's schema as a whole, for tools: an import builds a journal in a
//! staging schema and, once it is complete and audited, puts it in place in one transaction.

use super::conn::{quote_ident, Conn, Target};
use super::PgLocation;
use crate::error::{Error, Result};

/// `location` with the schema `schema` instead of its own.
#[must_use]
pub fn with_schema(location: &PgLocation, schema: &str) -> PgLocation {
    PgLocation {
        schema: schema.to_owned(),
        ..location.clone()
    }
}

/// What keeps an import out of schema `target`, as seen by `client` (in its transaction,
/// the journal's records table locked against writers when it has one): `None` when the
/// schema does not exist or holds only an empty dtask journal — the only schema an import
/// may replace — or why not. Every object of a dtask journal is named `dtask_…` (a table's
/// array type `_dtask_…`): any other table, view, sequence, function or type is another
/// application's, which a replacement would destroy.
async fn occupant(
    client: &tokio_postgres::Client,
    target: &str,
    lock: bool,
) -> std::result::Result<Option<String>, tokio_postgres::Error> {
    let foreign: i64 = client
        .query_one(
            "WITH ns AS (SELECT oid FROM pg_namespace WHERE nspname = $1) SELECT \
               (SELECT count(*) FROM pg_class WHERE relnamespace IN (SELECT oid FROM ns) \
                  AND relname NOT LIKE 'dtask\\_%') \
             + (SELECT count(*) FROM pg_proc WHERE pronamespace IN (SELECT oid FROM ns) \
                  AND proname NOT LIKE 'dtask\\_%') \
             + (SELECT count(*) FROM pg_type WHERE typnamespace IN (SELECT oid FROM ns) \
                  AND typname NOT LIKE 'dtask\\_%' AND typname NOT LIKE '\\_dtask\\_%')",
            &[&target],
        )
        .await?
        .get(0);
    if foreign > 0 {
        return Ok(Some(format!(
            "schema {target} holds {foreign} objects that are not a dtask journal's: import \
             into a new schema (or an empty journal's)"
        )));
    }
    // The catalog, not `information_schema` (which shows only what the role may use).
    let journal = client
        .query_opt(
            "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = 'dtask_records'",
            &[&target],
        )
        .await?
        .is_some();
    if !journal {
        return Ok(None);
    }
    let table = format!("{}.dtask_records", quote_ident(target));
    if lock {
        // No writer commits a record between this count and the replacement.
        client
            .batch_execute(&format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
            .await?;
    }
    let records: i64 = client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await?
        .get(0);
    Ok((records > 0)
        .then(|| format!("schema {target} already holds a journal of {records} records")))
}

/// Why an import may not go into `location`'s schema, if it may not: the schema holds
/// something other than an empty dtask journal (see [`promote`], which checks again).
///
/// # Errors
/// [`Error::Storage`] when the database fails.
pub fn check_target(location: &PgLocation) -> Result<Option<String>> {
    let conn = Conn::open(Target::admin(location), "admin")?;
    let target = location.schema.clone();
    conn.call(move |client| Box::pin(async move { occupant(&client, &target, false).await }))
}

/// Moves the journal of schema `staging` to `location`'s schema, atomically: the target
/// schema must not exist, or hold only an empty dtask journal (it is then replaced). A
/// schema holding anything else — another application's tables, a journal with records —
/// is left as it was.
///
/// # Errors
/// [`Error::InvalidLocation`] when the target holds something else; [`Error::Storage`] when
/// the database fails (nothing moved then).
pub fn promote(location: &PgLocation, staging: &str) -> Result<()> {
    let conn = Conn::open(Target::admin(location), "admin")?;
    let target = location.schema.clone();
    let staging = staging.to_owned();
    let refused = conn.call(move |client| {
        Box::pin(async move {
            let run = async {
                client.batch_execute("BEGIN").await?;
                if let Some(why) = occupant(&client, &target, true).await? {
                    client.batch_execute("ROLLBACK").await?;
                    return Ok(Some(why));
                }
                // The empty journal's own objects are dropped one by one, then the schema
                // without CASCADE: anything another session put there since the check
                // makes the drop fail and the whole transaction roll back, untouched.
                let t = quote_ident(&target);
                let mut tables = Vec::new();
                for row in client
                    .query(
                        "SELECT c.relname FROM pg_class c \
                         JOIN pg_namespace n ON n.oid = c.relnamespace \
                         WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')",
                        &[&target],
                    )
                    .await?
                {
                    let table: String = row.get(0);
                    tables.push(format!("{t}.{}", quote_ident(&table)));
                }
                // In one statement: the tables may refer to each other.
                let mut drops = if tables.is_empty() {
                    String::new()
                } else {
                    format!("DROP TABLE {};", tables.join(", "))
                };
                for row in client
                    .query(
                        "SELECT p.oid::regprocedure::text FROM pg_proc p \
                         JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1",
                        &[&target],
                    )
                    .await?
                {
                    let function: String = row.get(0);
                    drops.push_str("DROP FUNCTION ");
                    drops.push_str(&function);
                    drops.push(';');
                }
                client
                    .batch_execute(&format!(
                        "{drops} DROP SCHEMA IF EXISTS {t}; ALTER SCHEMA {s} RENAME TO {t}; COMMIT",
                        s = quote_ident(&staging),
                    ))
                    .await?;
                Ok(None)
            };
            match run.await {
                Ok(refused) => Ok(refused),
                Err(e) => {
                    let _ = client.batch_execute("ROLLBACK").await;
                    Err(e)
                }
            }
        })
    })?;
    match refused {
        Some(why) => Err(Error::InvalidLocation(why)),
        None => Ok(()),
    }
}

/// Drops schema `schema` and everything in it (a failed import's staging schema).
///
/// # Errors
/// [`Error::Storage`] when the database fails.
pub fn drop_schema(location: &PgLocation, schema: &str) -> Result<()> {
    let conn = Conn::open(Target::admin(location), "admin")?;
    let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", quote_ident(schema));
    conn.call(move |client| Box::pin(async move { client.batch_execute(&sql).await }))
}

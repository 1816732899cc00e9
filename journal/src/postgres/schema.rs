//! The journal's tables in PostgreSQL: versioned migration files in the repository
//! (`journal/migrations/postgres/`), applied in order by the first open that finds them
//! missing, under a lock so that several nodes starting at once apply each one once.
//! A database whose schema is newer than this build knows is refused with both versions named.

use super::conn::{quote_ident, Conn};
use crate::error::{Error, Result};
use std::fmt::Write as _;

/// The migrations, in order: the schema version after migration `i` is `i + 1`.
const MIGRATIONS: &[(&str, &str)] = &[
    (
        "0001_journal.sql",
        include_str!("../../migrations/postgres/0001_journal.sql"),
    ),
    (
        "0002_expect_tail.sql",
        include_str!("../../migrations/postgres/0002_expect_tail.sql"),
    ),
    (
        "0003_advisory_writer_lock.sql",
        include_str!("../../migrations/postgres/0003_advisory_writer_lock.sql"),
    ),
    (
        "0004_write_batch.sql",
        include_str!("../../migrations/postgres/0004_write_batch.sql"),
    ),
];

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: u32 = 4;

/// Creates the schema and applies every migration it lacks; returns the schema's version.
///
/// # Errors
/// [`Error::UnsupportedSchema`] when the database's schema is newer than [`SCHEMA_VERSION`];
/// [`Error::Storage`] when a statement fails.
pub(crate) fn migrate(
    conn: &Conn,
    schema: &str,
    read_only: bool,
    seed: Vec<(Vec<u8>, Vec<u8>)>,
) -> Result<u32> {
    let found = version(conn, schema)?;
    if let Some(found) = found {
        if found > SCHEMA_VERSION {
            return Err(Error::UnsupportedSchema {
                found,
                supported: SCHEMA_VERSION,
            });
        }
        if found == SCHEMA_VERSION || read_only {
            return Ok(found);
        }
    } else if read_only {
        return Err(Error::NotAJournal(format!(
            "no dtask journal in schema {schema} of this database"
        )));
    }
    let schema = schema.to_owned();
    conn.call(move |client| {
        Box::pin(async move {
            let run = async {
                let q = quote_ident(&schema);
                // One transaction, under a lock of this schema's name: a node that waited
                // finds the work done.
                client
                    .batch_execute(&format!(
                        "BEGIN; SELECT pg_advisory_xact_lock(hashtext({lit}));
                         CREATE SCHEMA IF NOT EXISTS {q};
                         CREATE TABLE IF NOT EXISTS {q}.dtask_schema (version integer NOT NULL);",
                        lit = literal(&format!("dtask:{schema}")),
                    ))
                    .await?;
                let row = client
                    .query_one(&format!("SELECT max(version) FROM {q}.dtask_schema"), &[])
                    .await?;
                let done = u32::try_from(row.get::<_, Option<i32>>(0).unwrap_or(0)).unwrap_or(0);
                let mut script = format!("SET LOCAL search_path TO {q};");
                for (version, (_, sql)) in (1u32..).zip(MIGRATIONS) {
                    if version > done {
                        script.push_str(sql);
                        let _ = writeln!(
                            script,
                            "\nINSERT INTO dtask_schema (version) VALUES ({version});"
                        );
                    }
                }
                client.batch_execute(&script).await?;
                // The journal's format stamp and empty tail, with the tables: a second node
                // never finds the tables without them.
                for (name, value) in &seed {
                    client
                        .execute(
                            &format!(
                                "INSERT INTO {q}.dtask_meta (name, value) VALUES ($1, $2) \
                                 ON CONFLICT (name) DO NOTHING"
                            ),
                            &[name, value],
                        )
                        .await?;
                }
                client.batch_execute("COMMIT").await?;
                Ok(done.max(SCHEMA_VERSION))
            };
            match run.await {
                Ok(version) => Ok(version),
                Err(e) => {
                    let _ = client.batch_execute("ROLLBACK").await;
                    Err(e)
                }
            }
        })
    })
}

/// The schema's version, `None` when it has none (no journal there yet).
fn version(conn: &Conn, schema: &str) -> Result<Option<u32>> {
    let schema = schema.to_owned();
    let found = conn.call(move |client| {
        Box::pin(async move {
            let exists = client
                .query_opt(
                    "SELECT 1 FROM information_schema.tables \
                     WHERE table_schema = $1 AND table_name = 'dtask_schema'",
                    &[&schema],
                )
                .await?
                .is_some();
            if !exists {
                return Ok(None);
            }
            let row = client
                .query_one(
                    &format!(
                        "SELECT max(version) FROM {}.dtask_schema",
                        quote_ident(&schema)
                    ),
                    &[],
                )
                .await?;
            Ok(row.get::<_, Option<i32>>(0))
        })
    })?;
    Ok(found.map(|v| u32::try_from(v).unwrap_or(0)))
}

/// `text` as a SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

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

/// Moves the journal of schema `staging` to `location`'s schema, atomically: the target
/// schema must not exist or hold no record (it is then replaced).
///
/// # Errors
/// [`Error::InvalidLocation`] when the target holds records; [`Error::Storage`] when the
/// database fails (nothing moved then).
pub fn promote(location: &PgLocation, staging: &str) -> Result<()> {
    let conn = Conn::open(Target::admin(location), "admin")?;
    let target = location.schema.clone();
    let staging = staging.to_owned();
    let held = conn.call(move |client| {
        Box::pin(async move {
            let run = async {
                client.batch_execute("BEGIN").await?;
                let exists = client
                    .query_opt(
                        "SELECT 1 FROM information_schema.tables \
                         WHERE table_schema = $1 AND table_name = 'dtask_records'",
                        &[&target],
                    )
                    .await?
                    .is_some();
                if exists {
                    let row = client
                        .query_one(
                            &format!(
                                "SELECT count(*) FROM {}.dtask_records",
                                quote_ident(&target)
                            ),
                            &[],
                        )
                        .await?;
                    let records: i64 = row.get(0);
                    if records > 0 {
                        client.batch_execute("ROLLBACK").await?;
                        return Ok(records);
                    }
                }
                client
                    .batch_execute(&format!(
                        "DROP SCHEMA IF EXISTS {t} CASCADE; ALTER SCHEMA {s} RENAME TO {t}; COMMIT",
                        t = quote_ident(&target),
                        s = quote_ident(&staging),
                    ))
                    .await?;
                Ok(0)
            };
            match run.await {
                Ok(held) => Ok(held),
                Err(e) => {
                    let _ = client.batch_execute("ROLLBACK").await;
                    Err(e)
                }
            }
        })
    })?;
    if held > 0 {
        return Err(Error::InvalidLocation(format!(
            "schema {} already holds a journal of {held} records",
            location.schema
        )));
    }
    Ok(())
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

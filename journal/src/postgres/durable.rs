//! Reads that return only durable rows.
//!
//! The writers' commits return before the database's flush, and their syncs make them durable
//! afterwards (`write::flush`), so a row another session reads may, for a moment, be only in
//! the server's memory: a crash of the database would take it back. A reader that shows what
//! it reads to the outside — a read-only open: `dtask serve --read-only`, `tail`, `export`,
//! an audit — must never show such a row. So each of its reads is followed, in the same
//! round trip, by a look at the write-ahead log ([`FLUSHED`]: is all of it that is written
//! flushed?), and when it is not, by a transaction whose commit waits for the flush
//! ([`FLUSH`]) before the rows are returned.
//!
//! Why that covers every row the read saw: a commit becomes visible to other sessions only
//! after its commit record is in the log, so the log's insert position, read after the read's
//! snapshot was taken, is past every commit the read saw; and a transaction that wrote to the
//! log waits at its commit for the flush up to its own commit record, which comes later still.
//! On a hot standby the look says yes at once: a standby is sent only what its primary has
//! flushed.
//!
//! The cost is one more statement in the read's round trip, and a flush only when the log
//! holds commits not yet flushed (on a busy database, most reads): the read then waits about
//! as long as one sync of a writer. The engine's own reads (a writable open) do not do this:
//! whatever a node writes because of a row it read is committed after that row and is made
//! durable by the same flush that makes its own write durable, and its acknowledgements wait
//! for that flush.

use tokio_postgres::{Client, Error};

/// Whether the write-ahead log is flushed as far as it is written: one row, one boolean.
/// (`CASE` rather than `OR`: the log's positions cannot be read on a standby at all.)
pub(crate) const FLUSHED: &str = "SELECT CASE WHEN pg_is_in_recovery() THEN true \
     ELSE pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn() END";

/// A transaction whose commit waits for the log's flush up to its commit record: it writes a
/// transactional message to the log (`pg_logical_emit_message`, which any user may call; a
/// transaction that wrote nothing to the log would not wait, whatever `synchronous_commit`
/// says).
pub(crate) const FLUSH: &str = concat!(
    "BEGIN; ",
    super::write::flush_at_commit!(),
    "; SELECT pg_logical_emit_message(true, 'dtask', ''); COMMIT"
);

/// Runs `read` (a statement sent whole when first polled: `query_typed`, or a prepared
/// statement's `query`) and returns its result once every row it can have seen is durable.
///
/// # Errors
/// The server's error for the read, the look at the log, or the flush.
pub(crate) async fn read<T>(
    client: &Client,
    read: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    // Sent in this order when first polled, together: one round trip.
    let (value, flushed) = futures_util::future::join(read, client.query_typed(FLUSHED, &[])).await;
    let value = value?;
    let flushed = flushed?
        .first()
        .is_some_and(|row| row.try_get::<_, bool>(0).unwrap_or(false));
    if !flushed {
        client.batch_execute(FLUSH).await?;
    }
    Ok(value)
}

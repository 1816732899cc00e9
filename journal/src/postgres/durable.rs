//! Reads that return only durable rows.
//!
//! The writers' commits return before the database's flush, and their syncs make them durable
//! afterwards (`write::flush`), so a row another session reads may, for a moment, be only in
//! the server's memory: a crash of the database would take it back. A reader that shows what
//! it reads to the outside — a read-only open: `dtask serve --read-only`, `tail`, `export`,
//! an audit — must never show such a row.
//!
//! Such a reader keeps the last sequence it knows durable. A read whose rows all have a
//! sequence at or below it is returned as it is: sequences are committed in order, and the
//! write-ahead log is flushed in order. Any other read (a newer row, or a page of a space
//! without sequences, where an absent row may be a deletion not yet flushed) is followed by
//! [`last_seq`]: the last sequence committed, read together with a look at the log
//! ([`FLUSHED`]: is all of it that is written flushed?) and, when the look says no, a
//! transaction whose commit waits for the flush ([`FLUSH`]). That sequence is then durable,
//! and so is every row the read saw: a commit becomes visible to other sessions only after
//! its commit record is in the log, so the log's insert position, read after the read's
//! snapshot was taken, is past every commit the read saw, and a transaction that wrote to
//! the log waits at its commit for the flush up to its own commit record, later still. On a
//! hot standby the look says yes at once: a standby is sent only what its primary flushed.
//!
//! So on an idle or caught-up database a reader pays one round trip when it first meets
//! rows newer than it knows, and no flush; on a busy one the reads that reach the newest
//! rows (a follower's tail, a running task's stream) wait for a flush, about as long as one
//! sync of a writer. The listener's once-a-second read of the last sequence (`listen`) is
//! [`last_seq`] too.
//!
//! The engine's own reads (a writable open) do none of this: whatever a node writes because
//! of a row it read is committed after that row and made durable by the same flush as its own
//! write, and its acknowledgements wait for that flush.

use tokio_postgres::{Client, Error};

/// Whether the write-ahead log is flushed as far as it is written: one row, one boolean.
/// (`CASE` rather than `OR`: the log's positions cannot be read on a standby at all.)
const FLUSHED: &str = "SELECT CASE WHEN pg_is_in_recovery() THEN true \
     ELSE pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn() END";

/// A transaction whose commit waits for the log's flush up to its commit record: it writes a
/// transactional message to the log (`pg_logical_emit_message`, which any user may call; a
/// transaction that wrote nothing to the log would not wait, whatever `synchronous_commit`
/// says).
const FLUSH: &str = concat!(
    "BEGIN; ",
    super::write::flush_at_commit!(),
    "; SELECT pg_logical_emit_message(true, 'dtask', ''); COMMIT"
);

/// The last sequence committed, once it is durable: read by `sql` (one row, one `bigint`:
/// `coalesce(max(seq), 0)` of the journal's records) with the look at the log ([`FLUSHED`])
/// in the same round trip, and flushed ([`FLUSH`]) when the look says so — which covers every
/// commit made before this call.
///
/// # Errors
/// The server's error.
pub(crate) async fn last_seq(client: &Client, sql: &str) -> Result<u64, Error> {
    // The read, then the look (after the read's snapshot): sent together when first polled,
    // in this order, both whole (`query_typed`).
    let (row, flushed) = futures_util::future::join(
        client.query_typed(sql, &[]),
        client.query_typed(FLUSHED, &[]),
    )
    .await;
    let seq = row?
        .first()
        .and_then(|row| row.try_get::<_, i64>(0).ok())
        .and_then(|seq| u64::try_from(seq).ok())
        .unwrap_or(0);
    let flushed = flushed?
        .first()
        .is_some_and(|row| row.try_get::<_, bool>(0).unwrap_or(false));
    if !flushed {
        client.batch_execute(FLUSH).await?;
    }
    Ok(seq)
}

-- Schema version 3: the writer lock is a transaction-scoped advisory lock.
--
-- Until now every batch of every node took the one row of `dtask_writer` (`SELECT … FOR
-- UPDATE`), which writes a lock record to the write-ahead log and dirties the row's page. An
-- advisory lock is held in the server's memory only, until the transaction that took it ends
-- (commit or rollback, also when its connection drops). Its key is this schema's: a tag of
-- dtask's own ('dtas') in the high 32 bits, the schema's oid in the low ones, written into the
-- function when it is created — every node calls the same function and takes the same lock,
-- and journals in other schemas of the database take others. (The migrations' own lock is
-- taken with a 32-bit key: the two never meet.)
DO $$
BEGIN
    EXECUTE format(
        'CREATE FUNCTION dtask_lock_writer() RETURNS void LANGUAGE sql AS %L',
        format(
            'SELECT pg_advisory_xact_lock(%s)',
            (1685348723::bigint << 32)
                | (SELECT oid FROM pg_namespace WHERE nspname = current_schema())::bigint
        )
    );
END
$$;

-- The fence. A node of an earlier version still running would go on taking the row lock,
-- which no longer excludes the upgraded nodes: without the table its batches fail (undefined
-- table, an append's storage error) until it is restarted with this version — and an open of
-- the earlier version refuses the newer schema. Dropping the table waits for such a node's
-- batch in flight, if any, to end.
DROP TABLE dtask_writer;

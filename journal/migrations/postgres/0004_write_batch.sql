-- Schema version 4: a writer's one-round-trip batch as one call.
--
-- A writer that committed the last batch it knows of sent its next batch as a pipeline of
-- statements: `BEGIN` and the lock, the tail's check, one statement a table, `COMMIT`. Each
-- statement of the extended protocol ends with its own Sync, at which the server flushes its
-- replies: a batch cost the writer's server process five to eight sends on the socket and the
-- client as many wake-ups, on the one process that every batch goes through in turn. This
-- function does the same work in one statement: one reply. Called outside a transaction, the
-- call is its own (its commit at the call's end), or an error and nothing written; the
-- careful way calls it in the transaction that read the tail with the lock held, and commits.
--
-- The arguments are the tail expected (null: no check, for a writer that read the tail with
-- the lock held in the transaction the call is part of), whether the commit waits for the
-- flush of the write-ahead log (on a session that does not), the batch's rows, table by
-- table, as arrays (empty for a table the batch does not touch), and the payload of a notice
-- on `dtask_commits` sent at the commit (null: none). The lock comes before the check, and the check reads the tail with a snapshot
-- taken after the lock (each statement of a volatile function takes its own): a writer that
-- committed meanwhile fails the check (SQLSTATE DT001). The deletions by arrays are planned
-- for each call, as the pipelined statements were: a plan cached while a table was small
-- would scan it whole once it has grown.
CREATE FUNCTION dtask_write_batch(
    expected_tail bytea,
    sync_at_commit boolean,
    record_tasks text[],
    record_positions int8[],
    record_seqs int8[],
    record_bytes bytea[],
    dropped_tasks text[],
    dropped_positions int8[],
    live_tasks text[],
    dead_tasks text[],
    outbox_seqs int8[],
    outbox_tasks text[],
    outbox_positions int8[],
    acked_seqs int8[],
    meta_names bytea[],
    meta_values bytea[],
    dropped_names bytea[],
    notice text
) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF sync_at_commit THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    PERFORM dtask_lock_writer();
    IF expected_tail IS NOT NULL THEN
        PERFORM dtask_expect_tail(expected_tail);
    END IF;
    IF cardinality(dropped_tasks) > 0 THEN
        EXECUTE 'DELETE FROM dtask_records WHERE (task, position) IN '
                '(SELECT * FROM unnest($1::text[], $2::int8[]))'
            USING dropped_tasks, dropped_positions;
    END IF;
    IF cardinality(record_tasks) > 0 THEN
        INSERT INTO dtask_records (task, position, seq, record)
        SELECT * FROM unnest(record_tasks, record_positions, record_seqs, record_bytes);
    END IF;
    IF cardinality(live_tasks) > 0 THEN
        INSERT INTO dtask_live (task) SELECT unnest(live_tasks) ON CONFLICT DO NOTHING;
    END IF;
    IF cardinality(dead_tasks) > 0 THEN
        EXECUTE 'DELETE FROM dtask_live WHERE task = ANY($1::text[])' USING dead_tasks;
    END IF;
    IF cardinality(outbox_seqs) > 0 THEN
        INSERT INTO dtask_outbox (seq, task, position)
        SELECT * FROM unnest(outbox_seqs, outbox_tasks, outbox_positions)
        ON CONFLICT (seq) DO UPDATE SET task = excluded.task, position = excluded.position;
    END IF;
    IF cardinality(acked_seqs) > 0 THEN
        EXECUTE 'DELETE FROM dtask_outbox WHERE seq = ANY($1::int8[])' USING acked_seqs;
    END IF;
    IF cardinality(meta_names) > 0 THEN
        INSERT INTO dtask_meta (name, value) SELECT * FROM unnest(meta_names, meta_values)
        ON CONFLICT (name) DO UPDATE SET value = excluded.value;
    END IF;
    IF cardinality(dropped_names) > 0 THEN
        EXECUTE 'DELETE FROM dtask_meta WHERE name = ANY($1::bytea[])' USING dropped_names;
    END IF;
    IF notice IS NOT NULL THEN
        PERFORM pg_notify('dtask_commits', notice);
    END IF;
END
$$;

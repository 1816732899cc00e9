-- Schema version 2: the check of a writer's one-round-trip batch.
--
-- A writer that committed the last batch it knows of sends its next batch in one round trip:
-- lock, this check, the writes, the commit. The check fails (SQLSTATE DT001) when another
-- writer committed in between — the stored tail marker is no longer the one this writer
-- wrote — and the batch is then rolled back and written again the careful way (lock, read
-- the tail, read the heads, write).
CREATE FUNCTION dtask_expect_tail(expected bytea) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT value FROM dtask_meta WHERE name = '\x7461696c'::bytea) IS DISTINCT FROM expected THEN
        RAISE EXCEPTION 'dtask: another writer committed since this one''s last batch'
            USING ERRCODE = 'DT001';
    END IF;
END
$$;

-- dtask journal on PostgreSQL, schema version 1.
--
-- The same records as the embedded journal, byte for byte: `record` is the framed record
-- (format version, position, global sequence, bincode payload, BLAKE3 chain digest, CRC-32),
-- verified on every read exactly as on RocksDB. The other columns are indexes of it.

-- Every task's records, by (task, position): the key that decides an append's expected
-- position. `seq` is the global commit sequence, dense and in commit order (see dtask_writer).
CREATE TABLE dtask_records (
    task     text COLLATE "C" NOT NULL,
    position bigint NOT NULL CHECK (position >= 0),
    seq      bigint NOT NULL CHECK (seq >= 1),
    record   bytea NOT NULL,
    PRIMARY KEY (task, position)
);
CREATE UNIQUE INDEX dtask_records_seq ON dtask_records (seq);

-- Tasks without a terminal record.
CREATE TABLE dtask_live (
    task text COLLATE "C" PRIMARY KEY
);

-- Queued, unacknowledged notifications, by the sequence of their `notification_enqueued`.
CREATE TABLE dtask_outbox (
    seq      bigint PRIMARY KEY,
    task     text COLLATE "C" NOT NULL,
    position bigint NOT NULL
);

-- The journal's metadata: its format version and its tail marker (the last sequence and a
-- summary of the live tasks), rewritten by every append transaction.
CREATE TABLE dtask_meta (
    name  bytea PRIMARY KEY,
    value bytea NOT NULL
);

-- The row every append transaction locks first (`SELECT … FOR UPDATE`), held until it commits:
-- the writers of every node take turns, each sees the tail the last one committed, and the
-- sequences it hands out follow the last one's. One row, always there.
CREATE TABLE dtask_writer (
    id integer PRIMARY KEY CHECK (id = 1)
);
INSERT INTO dtask_writer (id) VALUES (1);

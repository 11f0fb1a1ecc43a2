-- Every stored event carries an id derived from its content (the topic and the event as
-- decoded), so an event is stored once however often it is read: again after a crash or a
-- rebalance, after the topic was recreated (offsets start again at 0), or re-sent by an
-- at-least-once producer (new offsets, same content). The writer looks up the ids of a
-- batch's resources and time span before inserting and leaves out those already stored.
-- ingest_positions (0002) is kept for post-mortems; it no longer decides what is stored.

ALTER TABLE {db}.resource_usage ADD COLUMN IF NOT EXISTS event_id UInt64 DEFAULT 0;
ALTER TABLE {db}.gpu_metrics ADD COLUMN IF NOT EXISTS event_id UInt64 DEFAULT 0;
ALTER TABLE {db}.run_events ADD COLUMN IF NOT EXISTS event_id UInt64 DEFAULT 0;

-- A row the writer inserts when an insert failed, to tell a store that cannot be written
-- (disk full, read-only, server down: retry, never drop) from a message the store refuses
-- (isolate it, dead-letter it, go on). One row per writer, replaced.
CREATE TABLE IF NOT EXISTS {db}.write_probe (
    writer String,
    at DateTime64(3, 'UTC')
) ENGINE = ReplacingMergeTree(at)
ORDER BY writer;

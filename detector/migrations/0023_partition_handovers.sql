-- Input partitions being handed over between workers (detector/store/handovers.py, streams/handover.py):
-- a worker marks the partitions it gives up when its revocation begins (releasing = 1) and again
-- once its last write has landed and its Slack queue is dropped (releasing = 0). The partitions'
-- next holder waits, before it reads them, for every mark of another holder still releasing.
-- Kafka's join barrier promises this (no member is assigned anything before every member has
-- rejoined, its revocation done); the embedded broker forms the group when its leader rejoins,
-- so a slower revocation overlapped the next holder: events stored twice, an opening posted twice.
-- `at` is the store's clock, so that every worker reads the marks' ages on one clock; `seq` orders
-- one holder's marks (two within a millisecond of the store's clock).
CREATE TABLE IF NOT EXISTS {db}.partition_handovers (
    partition UInt32,
    holder String,
    releasing UInt8,
    seq UInt64,
    at DateTime64(3, 'UTC') DEFAULT now64(3)
) ENGINE = ReplacingMergeTree(seq)
ORDER BY (partition, holder)
TTL toDateTime(at) + INTERVAL 1 DAY;

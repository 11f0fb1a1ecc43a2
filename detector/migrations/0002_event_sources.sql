-- Where each stored event came from (topic, partition, offset of its Kafka message), and
-- per table and topic-partition the highest offset stored. A worker that reads messages
-- again (after a crash, a retry or a rebalance) skips those at or below it, so a batch
-- written twice does not count twice. Events not read from Kafka have src_topic ''.

ALTER TABLE {db}.resource_usage ADD COLUMN IF NOT EXISTS src_topic LowCardinality(String) DEFAULT '';
ALTER TABLE {db}.resource_usage ADD COLUMN IF NOT EXISTS src_partition UInt16 DEFAULT 0;
ALTER TABLE {db}.resource_usage ADD COLUMN IF NOT EXISTS src_offset UInt64 DEFAULT 0;
ALTER TABLE {db}.gpu_metrics ADD COLUMN IF NOT EXISTS src_topic LowCardinality(String) DEFAULT '';
ALTER TABLE {db}.gpu_metrics ADD COLUMN IF NOT EXISTS src_partition UInt16 DEFAULT 0;
ALTER TABLE {db}.gpu_metrics ADD COLUMN IF NOT EXISTS src_offset UInt64 DEFAULT 0;
ALTER TABLE {db}.run_events ADD COLUMN IF NOT EXISTS src_topic LowCardinality(String) DEFAULT '';
ALTER TABLE {db}.run_events ADD COLUMN IF NOT EXISTS src_partition UInt16 DEFAULT 0;
ALTER TABLE {db}.run_events ADD COLUMN IF NOT EXISTS src_offset UInt64 DEFAULT 0;

-- What a usage interval cost: cost_usd when the exporter sent it, else the price list's
-- rate for the interval while running (filled by the worker), and its egress priced by
-- destination, so rollups need no price list.
ALTER TABLE {db}.resource_usage ADD COLUMN IF NOT EXISTS usd Float64 DEFAULT 0 AFTER cost_usd;
ALTER TABLE {db}.resource_usage ADD COLUMN IF NOT EXISTS egress_usd Float64 DEFAULT 0 AFTER usd;

CREATE TABLE IF NOT EXISTS {db}.ingest_positions (
    table LowCardinality(String),
    topic LowCardinality(String),
    partition UInt16,
    offset SimpleAggregateFunction(max, UInt64)
) ENGINE = AggregatingMergeTree
ORDER BY (table, topic, partition);

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.ingest_positions_usage TO {db}.ingest_positions AS
SELECT 'resource_usage' AS table, src_topic AS topic, src_partition AS partition, max(src_offset) AS offset
FROM {db}.resource_usage WHERE src_topic != '' GROUP BY src_topic, src_partition;

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.ingest_positions_gpu TO {db}.ingest_positions AS
SELECT 'gpu_metrics' AS table, src_topic AS topic, src_partition AS partition, max(src_offset) AS offset
FROM {db}.gpu_metrics WHERE src_topic != '' GROUP BY src_topic, src_partition;

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.ingest_positions_runs TO {db}.ingest_positions AS
SELECT 'run_events' AS table, src_topic AS topic, src_partition AS partition, max(src_offset) AS offset
FROM {db}.run_events WHERE src_topic != '' GROUP BY src_topic, src_partition;

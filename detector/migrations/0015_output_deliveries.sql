-- Deliveries to outputs besides Slack (webhook, Alertmanager, email: detector/outputs,
-- docs/outputs.md), one row per (alert, output, change, state). state: 'enabled' (alert_id
-- '': the output was first configured at `at`; a restart recovers only alert changes
-- stored since), 'sending' (begun: written before the request leaves), 'sent', 'refused'
-- (the receiver said no for good) or 'unknown' (a send cut off by a kill, to a receiver
-- that does not dedupe: not sent again). (alert_id, output, change) is the idempotency key.
CREATE TABLE IF NOT EXISTS {db}.output_deliveries (
    alert_id String,
    output LowCardinality(String),
    change LowCardinality(String),
    state LowCardinality(String),
    detail String,
    at DateTime64(3, 'UTC') DEFAULT now64(3)
) ENGINE = ReplacingMergeTree(at)
ORDER BY (output, alert_id, change, state);

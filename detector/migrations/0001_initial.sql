-- The schema as first released: events, alerts and their changes, detector state,
-- button clicks, digests, deliveries. Every statement is idempotent (IF NOT EXISTS).

CREATE DATABASE IF NOT EXISTS {db};

CREATE TABLE IF NOT EXISTS {db}.resource_usage (
    ts DateTime64(3, 'UTC'),
    resource_id String,
    resource_type LowCardinality(String),
    provider LowCardinality(String),
    account LowCardinality(String),
    region LowCardinality(String),
    instance_type LowCardinality(String),
    pricing LowCardinality(String),
    state LowCardinality(String),
    interval_s Float32,
    cost_usd Nullable(Float64),
    egress_bytes Nullable(UInt64),
    dest_region LowCardinality(String),
    storage_bytes Nullable(UInt64),
    capacity_bytes Nullable(UInt64),
    vector_count Nullable(UInt64),
    requests Nullable(UInt64),
    tags Map(LowCardinality(String), String),
    extra String CODEC(ZSTD(3))
) ENGINE = MergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (resource_id, ts);

CREATE TABLE IF NOT EXISTS {db}.gpu_metrics (
    ts DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    resource_id String,
    gpu_index UInt8,
    gpu_uuid String,
    model LowCardinality(String),
    util_pct Float32,
    mem_used_mib Float32,
    mem_total_mib Float32,
    power_w Float32,
    sm_active Nullable(Float32),
    extra String CODEC(ZSTD(3))
) ENGINE = MergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (resource_id, gpu_index, ts);

CREATE TABLE IF NOT EXISTS {db}.run_events (
    ts DateTime64(3, 'UTC'),
    run_id String,
    status LowCardinality(String),
    resource_ids Array(String),
    gpu_count UInt16,
    project LowCardinality(String),
    tags Map(LowCardinality(String), String),
    error String,
    extra String CODEC(ZSTD(3))
) ENGINE = MergeTree
PARTITION BY toYYYYMM(ts)
ORDER BY (run_id, ts);

-- One row per state change; ReplacingMergeTree keeps the latest per alert (query with
-- FINAL), and the history stays readable in alert_changes.
CREATE TABLE IF NOT EXISTS {db}.alerts (
    alert_id String,
    type LowCardinality(String),
    rule LowCardinality(String),
    resource_id String,
    status LowCardinality(String),
    severity LowCardinality(String),
    episode_start DateTime64(3, 'UTC'),
    fired_at DateTime64(3, 'UTC'),
    updated_at DateTime64(3, 'UTC'),
    resolved_at Nullable(DateTime64(3, 'UTC')),
    waste_usd Float64,
    usd_per_hour Float64,
    resource_type LowCardinality(String),
    account LowCardinality(String),
    region LowCardinality(String),
    instance_type LowCardinality(String),
    tags Map(LowCardinality(String), String),
    details String,
    version UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY alert_id;

-- Columns added after the first release: idempotent, forward-only.
ALTER TABLE {db}.alerts ADD COLUMN IF NOT EXISTS silenced String DEFAULT '' AFTER details;

ALTER TABLE {db}.alerts ADD COLUMN IF NOT EXISTS channel String DEFAULT '' AFTER silenced;

CREATE TABLE IF NOT EXISTS {db}.alert_changes (
    alert_id String,
    change LowCardinality(String),
    at DateTime64(3, 'UTC'),
    waste_usd Float64,
    recorded_at DateTime64(3, 'UTC') DEFAULT now64(3)
) ENGINE = MergeTree
ORDER BY (alert_id, at);

-- Per-key detector state (engine snapshots), written with each batch's events so a
-- worker that takes over a partition resumes open episodes. Latest version wins.
CREATE TABLE IF NOT EXISTS {db}.detector_state (
    key String,
    partition UInt16,
    snapshot String,
    deleted UInt8,
    version UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY key;

-- Clicks on an incident's buttons: who did what, when (a snooze also until when).
CREATE TABLE IF NOT EXISTS {db}.alert_actions (
    alert_id String,
    action LowCardinality(String),
    user_id String,
    user_name String,
    channel String,
    message_ts String,
    at DateTime64(3, 'UTC'),
    until Nullable(DateTime64(3, 'UTC'))
) ENGINE = MergeTree
ORDER BY (alert_id, at);

-- Rule tuning: per rule, how people answered its alerts. A high share marked "expected"
-- says the rule flags what its owners consider normal.
CREATE VIEW IF NOT EXISTS {db}.rule_feedback AS
    SELECT a.rule AS rule, a.type AS type, count() AS alerts,
           countIf(x.acknowledged = 1) AS acknowledged, countIf(x.snoozed = 1) AS snoozed,
           countIf(x.expected = 1) AS expected, round(countIf(x.expected = 1) / count(), 3) AS expected_share
    FROM (SELECT alert_id, rule, type FROM {db}.alerts FINAL WHERE silenced = '') AS a
    LEFT JOIN (SELECT alert_id, max(action = 'acknowledged') AS acknowledged, max(action = 'snoozed') AS snoozed,
                      max(action = 'expected') AS expected
               FROM {db}.alert_actions GROUP BY alert_id) AS x ON a.alert_id = x.alert_id
    GROUP BY a.rule, a.type;

-- Daily digests sent, so a restart sends none twice.
CREATE TABLE IF NOT EXISTS {db}.digests (
    day DateTime('UTC'),
    channel String,
    message_ts String,
    sent_at DateTime64(3, 'UTC') DEFAULT now64(3)
) ENGINE = ReplacingMergeTree
ORDER BY (day, channel);

-- Spend nobody can be charged for, per account: what the untagged detector found.
CREATE VIEW IF NOT EXISTS {db}.unattributed_spend AS
    SELECT account, count() AS resources, countIf(status = 'firing') AS still_untagged,
           round(sum(waste_usd), 2) AS usd, round(sumIf(usd_per_hour, status = 'firing'), 4) AS usd_per_hour_now
    FROM {db}.alerts FINAL WHERE type = 'untagged' GROUP BY account;

-- Slack messages made per alert (opening, resolution), so a restart posts none twice.
CREATE TABLE IF NOT EXISTS {db}.alert_deliveries (
    alert_id String,
    kind LowCardinality(String),
    channel String,
    message_ts String,
    delivered_at DateTime64(3, 'UTC') DEFAULT now64(3)
) ENGINE = ReplacingMergeTree
ORDER BY (alert_id, kind);

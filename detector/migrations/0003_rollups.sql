-- Rollups kept by materialized views as events arrive, for post-mortems that answer in
-- seconds over months: hourly cost, running time and egress per resource (with its team,
-- project, owner and account: the tags team, project and owner), hourly GPU telemetry per host, and each alert's dollars per day.
-- Raw events may expire (the worker's event TTL); these do not.

CREATE TABLE IF NOT EXISTS {db}.usage_hourly (
    hour DateTime('UTC'),
    resource_id String,
    dest_region LowCardinality(String),
    resource_type SimpleAggregateFunction(anyLast, String),
    account SimpleAggregateFunction(anyLast, String),
    region SimpleAggregateFunction(anyLast, String),
    instance_type SimpleAggregateFunction(anyLast, String),
    team SimpleAggregateFunction(anyLast, String),
    project SimpleAggregateFunction(anyLast, String),
    owner SimpleAggregateFunction(anyLast, String),
    usd SimpleAggregateFunction(sum, Float64),
    running_s SimpleAggregateFunction(sum, Float64),
    egress_bytes SimpleAggregateFunction(sum, UInt64),
    egress_usd SimpleAggregateFunction(sum, Float64),
    events SimpleAggregateFunction(sum, UInt64)
) ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(hour)
ORDER BY (hour, resource_id, dest_region);

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.usage_hourly_mv TO {db}.usage_hourly AS
SELECT toStartOfHour(ts) AS hour, resource_id, dest_region,
       anyLast(toString(resource_type)) AS resource_type, anyLast(toString(account)) AS account,
       anyLast(toString(region)) AS region, anyLast(toString(instance_type)) AS instance_type,
       anyLast(tags['team']) AS team, anyLast(tags['project']) AS project, anyLast(tags['owner']) AS owner,
       sum(usd) AS usd, sumIf(toFloat64(interval_s), state = 'running') AS running_s,
       sum(ifNull(egress_bytes, 0)) AS egress_bytes, sum(egress_usd) AS egress_usd, count() AS events
FROM {db}.resource_usage
GROUP BY hour, resource_id, dest_region;

-- GPU telemetry per host and hour. A sample under 5 % utilisation counts as idle (the
-- idle-gpu rule's default bar).
CREATE TABLE IF NOT EXISTS {db}.gpu_hourly (
    hour DateTime('UTC'),
    resource_id String,
    gpus SimpleAggregateFunction(max, UInt16),
    samples SimpleAggregateFunction(sum, UInt64),
    idle_samples SimpleAggregateFunction(sum, UInt64),
    util_sum SimpleAggregateFunction(sum, Float64),
    power_w_sum SimpleAggregateFunction(sum, Float64)
) ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(hour)
ORDER BY (hour, resource_id);

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.gpu_hourly_mv TO {db}.gpu_hourly AS
SELECT toStartOfHour(ts) AS hour, resource_id, toUInt16(max(gpu_index) + 1) AS gpus, count() AS samples,
       countIf(util_pct < 5) AS idle_samples, sum(toFloat64(util_pct)) AS util_sum,
       sum(toFloat64(power_w)) AS power_w_sum
FROM {db}.gpu_metrics
GROUP BY hour, resource_id;

-- Per resource and hour: dollars, GPU-hours (GPUs seen x hours running) and idle
-- GPU-hours (the GPU-hours times the share of idle samples), egress.
CREATE VIEW IF NOT EXISTS {db}.cost_hourly AS
SELECT u.hour AS hour, u.resource_id AS resource_id, u.resource_type AS resource_type, u.account AS account,
       u.region AS region, u.instance_type AS instance_type, u.team AS team, u.project AS project,
       u.owner AS owner, u.usd AS usd, u.running_s / 3600 AS running_hours, u.egress_bytes AS egress_bytes, u.egress_usd AS egress_usd,
       g.gpus * u.running_s / 3600 AS gpu_hours,
       if(g.samples > 0, g.gpus * u.running_s / 3600 * g.idle_samples / g.samples, 0) AS idle_gpu_hours
FROM (SELECT hour, resource_id, anyLast(resource_type) AS resource_type, anyLast(account) AS account,
             anyLast(region) AS region, anyLast(instance_type) AS instance_type, anyLast(team) AS team,
             anyLast(project) AS project, anyLast(owner) AS owner, sum(usd) AS usd, sum(running_s) AS running_s,
             sum(egress_bytes) AS egress_bytes, sum(egress_usd) AS egress_usd
      FROM {db}.usage_hourly GROUP BY hour, resource_id) AS u
LEFT JOIN (SELECT hour, resource_id, max(gpus) AS gpus, sum(samples) AS samples, sum(idle_samples) AS idle_samples
           FROM {db}.gpu_hourly GROUP BY hour, resource_id) AS g
ON u.hour = g.hour AND u.resource_id = g.resource_id;

-- Alert changes carry what reports group them by.
ALTER TABLE {db}.alert_changes ADD COLUMN IF NOT EXISTS type LowCardinality(String) DEFAULT '';
ALTER TABLE {db}.alert_changes ADD COLUMN IF NOT EXISTS rule LowCardinality(String) DEFAULT '';
ALTER TABLE {db}.alert_changes ADD COLUMN IF NOT EXISTS resource_id String DEFAULT '';
ALTER TABLE {db}.alert_changes ADD COLUMN IF NOT EXISTS team String DEFAULT '';
ALTER TABLE {db}.alert_changes ADD COLUMN IF NOT EXISTS silenced String DEFAULT '';

-- Each alert's dollars by the end of each day it changed (dollars only grow).
CREATE TABLE IF NOT EXISTS {db}.waste_daily (
    day Date,
    alert_id String,
    type SimpleAggregateFunction(anyLast, String),
    rule SimpleAggregateFunction(anyLast, String),
    resource_id SimpleAggregateFunction(anyLast, String),
    team SimpleAggregateFunction(anyLast, String),
    silenced SimpleAggregateFunction(anyLast, String),
    waste_usd SimpleAggregateFunction(max, Float64)
) ENGINE = AggregatingMergeTree
ORDER BY (day, alert_id);

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.waste_daily_mv TO {db}.waste_daily AS
SELECT toDate(at) AS day, alert_id, anyLast(toString(type)) AS type, anyLast(toString(rule)) AS rule,
       anyLast(resource_id) AS resource_id, anyLast(team) AS team, anyLast(silenced) AS silenced,
       max(waste_usd) AS waste_usd
FROM {db}.alert_changes
GROUP BY day, alert_id;

-- Dollars per alert and day: the growth of its dollars within the day, so an episode
-- that spans midnight is split between the days it burned.
CREATE VIEW IF NOT EXISTS {db}.waste_by_day AS
SELECT day, alert_id, type, rule, resource_id, team, silenced,
       waste_usd - lagInFrame(waste_usd, 1, 0) OVER (PARTITION BY alert_id ORDER BY day
                                                     ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS usd
FROM (SELECT day, alert_id, anyLast(type) AS type, anyLast(rule) AS rule, anyLast(resource_id) AS resource_id,
             anyLast(team) AS team, anyLast(silenced) AS silenced, max(waste_usd) AS waste_usd
      FROM {db}.waste_daily GROUP BY day, alert_id);

-- Every state change of every alert and who made it: the detector's (fired, updated,
-- resolved) and people's (acknowledged, snoozed, expected, from Slack's buttons).
CREATE VIEW IF NOT EXISTS {db}.alert_history AS
SELECT alert_id, change, at, waste_usd, 'burnwatch' AS actor, '' AS actor_id FROM {db}.alert_changes
UNION ALL
SELECT alert_id, toString(action) AS change, at, CAST(NULL, 'Nullable(Float64)') AS waste_usd,
       user_name AS actor, user_id AS actor_id
FROM {db}.alert_actions;

-- Actions on incidents (issue 17, docs/actions.md): every step of every action, appended,
-- never updated. One action is one incident (alert_id) and one kind (stop_instance...):
-- action_key = alert_id || ':' || kind is its idempotency key, and its state is its latest
-- step. step: proposed | dry_run | not_applicable | approved | declined | refused | cancelled
-- | begun | succeeded | failed | gave_up | announced. decided_by: a Slack user id, 'auto',
-- 'dry_run', 'resolved', 'snoozed' or 'worker'. A 'begun' row is written before the API is
-- called, so a worker killed mid-call finds it on restart and checks before calling again.
CREATE TABLE IF NOT EXISTS {db}.remediation_actions (
    action_key String,
    alert_id String,
    kind LowCardinality(String),
    mode LowCardinality(String),
    step LowCardinality(String),
    decided_by String,
    rule String,
    resource_id String,
    team String,
    api String,
    request String,
    endpoint String,
    result String,
    usd_per_hour Float64,
    attempt UInt16,
    due_at Nullable(DateTime64(3, 'UTC')),
    event_time Nullable(DateTime64(3, 'UTC')),
    at DateTime64(3, 'UTC'),
    seq UInt64
) ENGINE = MergeTree
ORDER BY (action_key, at, seq);

-- The rules each worker detects with, recorded at its start and at each reload: a worker that finds an
-- open alert of a rule it does not load resolves it only if the newest rule set loaded anywhere lacks it
-- too (a rule removed), not when a worker loaded a newer one with it (a worker of an older release in a
-- rolling update that adds the rule): detector/orphaned_alerts.py.
CREATE TABLE IF NOT EXISTS {db}.rule_sets (
    loaded_at DateTime64(3, 'UTC'),
    names Array(String),
    types Array(String),
    worker String
) ENGINE = MergeTree
ORDER BY loaded_at;

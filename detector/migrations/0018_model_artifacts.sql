-- The anomaly model's artifacts as every worker of a group scores with them (docs/model.md):
-- the worker that holds partition 0 retrains and publishes each group's artifact here, and
-- every worker takes each group's artifact trained on the latest events, so one worker trains
-- (not all of them, each over the whole store) and all score alike. trained_to: the event time
-- the training ended, which decides (merges keep a group's latest, never by a publisher's
-- clock); version: when it was published (ns, wall clock: tells a new publication); skops: the
-- artifact file's bytes, base64.
CREATE TABLE IF NOT EXISTS {db}.model_artifacts (
    model_group String,
    trained_to DateTime64(3, 'UTC'),
    version UInt64,
    skops String CODEC(ZSTD(3))
) ENGINE = ReplacingMergeTree(trained_to)
ORDER BY model_group;

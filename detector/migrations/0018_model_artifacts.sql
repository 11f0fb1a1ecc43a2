-- The anomaly model's artifacts as every worker of a group scores with them (docs/model.md):
-- the worker that holds partition 0 retrains and publishes each group's artifact here, and
-- every worker takes the newest, so one worker trains (not all of them, each over the whole
-- store) and all score alike. One row per group and training; skops is the artifact file's
-- bytes (base64), trained_to the event time its training ended, version when it was published.
CREATE TABLE IF NOT EXISTS {db}.model_artifacts (
    model_group String,
    version UInt64,
    trained_to Float64,
    skops String CODEC(ZSTD(3))
) ENGINE = ReplacingMergeTree(version)
ORDER BY model_group;

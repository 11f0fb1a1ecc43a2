-- How far each worker has stored each input partition it holds (detector/store/progress.py): the
-- partition's time (its latest stored message's earliest event, as the aligner counts a source's
-- time) and whether it was caught up with its log. A worker that looks up a run's hosts in the
-- store releases run events only up to what the other workers' partitions are stored through
-- (docs/architecture.md, Several workers). The row of the newest group generation wins, then the
-- newest version (a write's wall-clock ns) within it: a holder of an older generation cannot win by
-- its clock, and its caught_up says nothing of the generation now.
CREATE TABLE IF NOT EXISTS {db}.partition_progress (
    topic LowCardinality(String),
    partition UInt32,
    stored_through DateTime64(3, 'UTC'),
    caught_up UInt8,
    generation Int64,
    version UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY (topic, partition);

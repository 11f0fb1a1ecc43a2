-- Alert dollars re-priced from the bill (issue 15): a bill arrives hours to a day after the
-- events, so an incident's dollars are first what its events said, then (`burnwatch ingest
-- focus` calls detector/billing/reprice.py) what the bill charged the resource over the
-- same hours. claimed_usd: the events' dollars of the resource over the episode (cost_hourly,
-- usd + egress); billed_usd: the bill's EffectiveCost over it (each charge prorated by its
-- overlap); billed_waste_usd = waste_usd x billed / claimed. A later bill (a restatement)
-- writes a newer row, which replaces the figure.
CREATE TABLE IF NOT EXISTS {db}.alert_billing (
    alert_id String,
    resource_id String,
    episode_start DateTime64(3, 'UTC'),
    episode_end DateTime64(3, 'UTC'),
    claimed_usd Float64,
    billed_usd Float64,
    waste_usd Float64,
    billed_waste_usd Float64,
    repriced_at DateTime64(3, 'UTC'),
    ingest_id String
) ENGINE = ReplacingMergeTree(repriced_at)
ORDER BY alert_id;

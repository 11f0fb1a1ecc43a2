-- One record per alert change. Before, a change was two inserts (`alerts`, then
-- `alert_changes`) and a kill between them left the alert manager (which reads `alerts`)
-- and the outbox (which read `alert_changes`) disagreeing: an opening never posted. Now
-- the worker writes only `alerts`, each row saying which change it records, and
-- `alert_changes` (history, waste_daily, reports) is kept from it by a materialized
-- view. The alert manager's memory and the outbox's recovery read `alerts` alone.
ALTER TABLE {db}.alerts ADD COLUMN IF NOT EXISTS change LowCardinality(String) DEFAULT '' AFTER status;

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.alert_changes_mv TO {db}.alert_changes AS
SELECT alert_id, change, updated_at AS at, waste_usd, type, rule, resource_id, tags['team'] AS team, silenced
FROM {db}.alerts WHERE change != '';

-- The hourly rollup reads a resource's team, project and owner tags in any case: `Team`, `TEAM` or a Cost
-- and Usage Report's `user:Team` where no `team` is written (the key itself first, then the first non-empty
-- key that folds to it, as detection completes an event's tags: detector/tag_names.py). 0003's view read
-- `tags['team']` alone, so a fleet tagging as AWS's examples do was all "untagged" in `burnwatch query
-- untagged`, `idle-gpus` and `egress` and in reconcile's teams, while its alerts named the team. Rollups
-- written before keep what they read; the events stored within the event TTL can be rolled up again by hand.
ALTER TABLE {db}.usage_hourly_mv MODIFY QUERY
SELECT toStartOfHour(ts) AS hour, resource_id, dest_region,
       anyLast(toString(resource_type)) AS resource_type, anyLast(toString(account)) AS account,
       anyLast(toString(region)) AS region, anyLast(toString(instance_type)) AS instance_type,
       anyLast(if(tags['team'] != '', tags['team'], arrayFirst(v -> v != '', mapValues(mapFilter((k, v) -> lowerUTF8(k) IN ('team', 'user:team'), tags))))) AS team,
       anyLast(if(tags['project'] != '', tags['project'], arrayFirst(v -> v != '', mapValues(mapFilter((k, v) -> lowerUTF8(k) IN ('project', 'user:project'), tags))))) AS project,
       anyLast(if(tags['owner'] != '', tags['owner'], arrayFirst(v -> v != '', mapValues(mapFilter((k, v) -> lowerUTF8(k) IN ('owner', 'user:owner'), tags))))) AS owner,
       sum(usd) AS usd, sumIf(toFloat64(interval_s), state = 'running') AS running_s,
       sum(ifNull(egress_bytes, 0)) AS egress_bytes, sum(egress_usd) AS egress_usd, count() AS events
FROM {db}.resource_usage
GROUP BY hour, resource_id, dest_region;

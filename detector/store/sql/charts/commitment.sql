-- An unused commitment's chart: per UTC day, what of the commitment was used and what was paid for unused
-- (burnwatch ingest focus --publish-usage: cost_usd is the unused cost, metrics commitment_used_usd the used).
-- Parameters: db (Identifier), rid (String: the commitment), lo and hi (Int64: epoch milliseconds, inclusive).
SELECT toStartOfDay(ts, 'UTC') AS t, sum(usd) AS unused_usd, sum(metrics['commitment_used_usd']) AS used_usd
FROM {db:Identifier}.resource_usage
WHERE resource_id = {rid:String}
  AND ts BETWEEN fromUnixTimestamp64Milli({lo:Int64}, 'UTC') AND fromUnixTimestamp64Milli({hi:Int64}, 'UTC')
GROUP BY t
ORDER BY t

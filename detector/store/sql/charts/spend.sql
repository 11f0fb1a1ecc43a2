-- The spend of some resources per time step (untagged spend, a failed run's hosts): what each running interval
-- cost as stored (the usd column: cost_usd, else the price list).
-- Parameters: db (Identifier), rids (Array(String): the resources), lo and hi (Int64: epoch milliseconds,
-- inclusive), step (UInt32: seconds).
SELECT toStartOfInterval(ts, toIntervalSecond({step:UInt32}), 'UTC') AS t, sum(usd) AS usd
FROM {db:Identifier}.resource_usage
WHERE resource_id IN {rids:Array(String)} AND state = 'running'
  AND ts BETWEEN fromUnixTimestamp64Milli({lo:Int64}, 'UTC') AND fromUnixTimestamp64Milli({hi:Int64}, 'UTC')
GROUP BY t
ORDER BY t

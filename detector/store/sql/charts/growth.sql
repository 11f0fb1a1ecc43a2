-- A storage incident's chart: a resource's size against its capacity per time step over a window.
-- Parameters: db (Identifier), rid (String: the resource), lo and hi (Int64: epoch milliseconds, inclusive),
-- step (UInt32: seconds).
SELECT toStartOfInterval(ts, toIntervalSecond({step:UInt32}), 'UTC') AS t,
       argMax(storage_bytes, ts) AS size_bytes, argMax(capacity_bytes, ts) AS capacity
FROM {db:Identifier}.resource_usage
WHERE resource_id = {rid:String} AND storage_bytes IS NOT NULL
  AND ts BETWEEN fromUnixTimestamp64Milli({lo:Int64}, 'UTC') AND fromUnixTimestamp64Milli({hi:Int64}, 'UTC')
GROUP BY t
ORDER BY t

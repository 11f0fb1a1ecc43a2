-- An egress incident's chart: a resource's egress rate per time step over a window, to one destination.
-- Parameters: db (Identifier), rid (String: the resource), lo and hi (Int64: epoch milliseconds, inclusive),
-- step (UInt32: seconds), dest (String: the destination region; '' = every destination).
SELECT toStartOfInterval(ts, toIntervalSecond({step:UInt32}), 'UTC') AS t,
       sum(egress_bytes) / 1e9 * 3600 / greatest(sum(interval_s), 1) AS gb_per_hour
FROM {db:Identifier}.resource_usage
WHERE resource_id = {rid:String} AND egress_bytes IS NOT NULL
  AND ({dest:String} = '' OR dest_region = {dest:String})
  AND ts BETWEEN fromUnixTimestamp64Milli({lo:Int64}, 'UTC') AND fromUnixTimestamp64Milli({hi:Int64}, 'UTC')
GROUP BY t
ORDER BY t

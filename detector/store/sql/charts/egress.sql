-- An egress incident's chart: a resource's egress per usage interval over a window.
-- Parameters: db (Identifier), rid (String: the resource), lo and hi (Int64: epoch milliseconds, inclusive).
SELECT ts, egress_bytes, interval_s FROM {db:Identifier}.resource_usage
WHERE resource_id = {rid:String} AND egress_bytes IS NOT NULL
  AND ts BETWEEN fromUnixTimestamp64Milli({lo:Int64}, 'UTC') AND fromUnixTimestamp64Milli({hi:Int64}, 'UTC')
ORDER BY ts

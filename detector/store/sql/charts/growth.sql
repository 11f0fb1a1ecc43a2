-- A storage incident's chart: a resource's size against its capacity over a window.
-- Parameters: db (Identifier), rid (String: the resource), lo and hi (Int64: epoch milliseconds, inclusive).
SELECT ts, storage_bytes, capacity_bytes FROM {db:Identifier}.resource_usage
WHERE resource_id = {rid:String} AND storage_bytes IS NOT NULL
  AND ts BETWEEN fromUnixTimestamp64Milli({lo:Int64}, 'UTC') AND fromUnixTimestamp64Milli({hi:Int64}, 'UTC')
ORDER BY ts

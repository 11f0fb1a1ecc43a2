-- An incident's GPU chart: utilisation per GPU of a host over a window.
-- Parameters: db (Identifier), rid (String: the host), lo and hi (Int64: epoch milliseconds, inclusive).
SELECT gpu_index, ts, util_pct, sm_active FROM {db:Identifier}.gpu_metrics
WHERE resource_id = {rid:String}
  AND ts BETWEEN fromUnixTimestamp64Milli({lo:Int64}, 'UTC') AND fromUnixTimestamp64Milli({hi:Int64}, 'UTC')
ORDER BY gpu_index, ts

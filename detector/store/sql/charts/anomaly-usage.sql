-- An anomaly's chart: the model's usage features of a resource per time step (detector/model/features.py).
-- Parameters: db (Identifier), rid (String: the resource), lo and hi (Int64: epoch milliseconds, inclusive),
-- step (UInt32: seconds).
SELECT toStartOfInterval(ts, toIntervalSecond({step:UInt32}), 'UTC') AS t,
       sum(usd) * 3600 / greatest(sum(interval_s), 1) AS cost_usd_per_hour,
       sum(ifNull(egress_bytes, 0)) / 1e9 * 3600 / greatest(sum(interval_s), 1) AS egress_gb_per_hour,
       sumIf(requests, requests IS NOT NULL) / greatest(sumIf(interval_s, requests IS NOT NULL), 1) AS requests_per_s,
       (argMaxIf(storage_bytes, ts, storage_bytes IS NOT NULL) - argMinIf(storage_bytes, ts, storage_bytes IS NOT NULL))
           / 1e9 AS storage_delta_gb
FROM {db:Identifier}.resource_usage
WHERE resource_id = {rid:String}
  AND ts BETWEEN fromUnixTimestamp64Milli({lo:Int64}, 'UTC') AND fromUnixTimestamp64Milli({hi:Int64}, 'UTC')
GROUP BY t
ORDER BY t

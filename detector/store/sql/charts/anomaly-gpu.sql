-- An anomaly's chart: the model's GPU features of a host per time step (detector/model/features.py).
-- Parameters: db (Identifier), rid (String: the host), lo and hi (Int64: epoch milliseconds, inclusive),
-- step (UInt32: seconds).
SELECT toStartOfInterval(ts, toIntervalSecond({step:UInt32}), 'UTC') AS t,
       avg(util_pct) AS gpu_util_mean, quantile(0.95)(util_pct) AS gpu_util_p95,
       avgIf(mem_used_mib / mem_total_mib, mem_total_mib > 0) AS gpu_mem_frac,
       avg(power_w) AS power_w_per_gpu, avg(power_w) / (avg(util_pct) + 5) AS power_per_util
FROM {db:Identifier}.gpu_metrics
WHERE resource_id = {rid:String}
  AND ts BETWEEN fromUnixTimestamp64Milli({lo:Int64}, 'UTC') AND fromUnixTimestamp64Milli({hi:Int64}, 'UTC')
GROUP BY t
ORDER BY t

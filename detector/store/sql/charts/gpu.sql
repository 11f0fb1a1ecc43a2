-- An incident's GPU chart: each GPU of a host per time step over a window.
-- activity_pct: the highest of util_pct and the activity ratios x 100, averaged over the step (what the idle
-- rules read: any busy signal counts); work_pct: the highest of SM, tensor and DRAM activity x 100 (what says
-- work runs, for stuck_gpu), NULL when no sample of the step carries one.
-- Parameters: db (Identifier), rid (String: the host), lo and hi (Int64: epoch milliseconds, inclusive),
-- step (UInt32: seconds).
SELECT gpu_index, toStartOfInterval(ts, toIntervalSecond({step:UInt32}), 'UTC') AS t,
       avg(greatest(util_pct, 100 * ifNull(gr_engine_active, 0), 100 * ifNull(sm_active, 0),
                    100 * ifNull(tensor_active, 0), 100 * ifNull(dram_active, 0))) AS activity_pct,
       avg(util_pct) AS util_mean,
       avg(if(sm_active IS NULL AND tensor_active IS NULL AND dram_active IS NULL, NULL,
              100 * greatest(ifNull(sm_active, 0), ifNull(tensor_active, 0), ifNull(dram_active, 0)))) AS work_pct
FROM {db:Identifier}.gpu_metrics
WHERE resource_id = {rid:String}
  AND ts BETWEEN fromUnixTimestamp64Milli({lo:Int64}, 'UTC') AND fromUnixTimestamp64Milli({hi:Int64}, 'UTC')
GROUP BY gpu_index, t
ORDER BY gpu_index, t

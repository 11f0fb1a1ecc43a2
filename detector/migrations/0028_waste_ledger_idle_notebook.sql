-- idle_notebook (a notebook without GPUs billed while Jupyter sees no activity) joins the ledger, after
-- idle_gpu, as waste of the "nothing ran" kind: its hours are never idle_gpu's (a notebook with GPUs is
-- idle_gpu's alone), and an idle notebook that is also untagged counts once, here. Every rank after it moves
-- one down (waste is ranks 1-14, 'could save' from 15; what could be saved is capped by ranks 1-11's claims, the
-- waste rules before telemetry_stale). Otherwise 0026's view.

DROP VIEW IF EXISTS {db}.waste_ledger;

CREATE VIEW IF NOT EXISTS {db}.waste_ledger AS
WITH
    ['idle_gpu', 'idle_notebook', 'partly_idle_gpu', 'unallocated_gpu', 'stuck_gpu', 'data_starved_training', 'failed_run_spend',
     'plateaued_run', 'egress_runaway', 'unused_commitment', 'inference_scale_to_zero', 'telemetry_stale', 'anomaly',
     'untagged', 'spot_eligible', 'inference_overprovisioned', 'inference_unbatched', 'build_or_call'] AS precedence,
    alerted AS (
        SELECT alert_id, type, rule, tags['team'] AS team, account, indexOf(precedence, type) AS rank,
               toUnixTimestamp64Milli(episode_start) / 1000 AS start0,
               toUnixTimestamp64Milli(episode_start) AS start_ms, JSONExtractString(details, 'run_id') AS run_id,
               if(type IN ('failed_run_spend', 'spot_eligible', 'plateaued_run'),
                  JSONExtract(details, 'resource_ids', 'Array(String)'),
                  [resource_id]) AS hosts,
               JSONExtractBool(details, 'crash_loop') AS crash_loop, details, waste_usd AS final_usd
        FROM {db}.alerts FINAL
        WHERE silenced = '' AND has(precedence, type) AND NOT withdrawn
    ),
    claims AS (
        -- An alert's dollars by its changes: what each change added to its highest yet, over the time since
        -- the one before, up to what its latest change says (a stop read late takes back minutes an update
        -- had counted; a figure priced anew may dip): in all, what it finally says.
        SELECT if(run_id != '' AND type = 'failed_run_spend', 'run:' || run_id, alert_id) AS claim,
               alert_id, type, rule, team, account, rank, hosts,
               if(row_number() OVER w = 1, start0, greatest(start0, lagInFrame(at_s) OVER w)) AS start_s,
               greatest(start_s, at_s) AS stop_s,
               least(max(waste) OVER w, final_usd) - least(max(waste) OVER before, final_usd) AS usd
        FROM (SELECT a.alert_id AS alert_id, a.type AS type, a.rule AS rule, a.team AS team, a.account AS account,
                     a.rank AS rank, a.start0 AS start0, a.run_id AS run_id, a.hosts AS hosts, a.final_usd AS final_usd,
                     toUnixTimestamp64Milli(c.at) / 1000 AS at_s, c.waste_usd AS waste
              FROM {db}.alert_changes AS c INNER JOIN alerted AS a ON c.alert_id = a.alert_id
              WHERE NOT a.crash_loop)
        WINDOW w AS (PARTITION BY alert_id ORDER BY at_s, waste ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW),
               before AS (PARTITION BY alert_id ORDER BY at_s, waste ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
        UNION ALL
        -- A crash loop's runs, each over its own lifetime on its own hosts, unless alerted alone: that
        -- run id started then (a run id is used again by a retried Job, a nightly job's fixed name).
        SELECT 'run:' || JSONExtractString(run, 'run_id') AS claim, alert_id, type, rule, team, account, rank,
               JSONExtract(run, 'resource_ids', 'Array(String)') AS hosts, JSONExtractFloat(run, 'end') AS stop_s,
               if(JSONExtractFloat(run, 'start') > 0, least(JSONExtractFloat(run, 'start'), stop_s), stop_s) AS start_s, JSONExtractFloat(run, 'usd') AS usd
        FROM alerted
        ARRAY JOIN JSONExtractArrayRaw(details, 'runs') AS run
        WHERE crash_loop AND (JSONExtractString(run, 'run_id'),
                              if(JSONExtractFloat(run, 'start') > 0, toInt64(round(JSONExtractFloat(run, 'start') * 1000)), 0))
              NOT IN (SELECT run_id, arrayJoin([start_ms, 0]) FROM alerted WHERE type = 'failed_run_spend' AND NOT crash_loop)
    ),
    claim_hours AS (
        SELECT claim, alert_id, type, rule, team, account, rank, host AS resource_id, toDateTime(h, 'UTC') AS hour,
               usd / length(hosts) * if(stop_s > start_s,
                                        (least(stop_s, toFloat64(h + 3600)) - greatest(start_s, toFloat64(h))) / (stop_s - start_s),
                                        1) AS claimed_usd
        FROM claims
        ARRAY JOIN hosts AS host
        ARRAY JOIN range(toUInt32(intDiv(toInt64(start_s), 3600) * 3600),
                         greatest(toUInt32(ceil(stop_s)), toUInt32(intDiv(toInt64(start_s), 3600) * 3600 + 1)),
                         3600) AS h
        WHERE usd > 0
    ),
    bills AS (
        SELECT resource_id, hour, sum(usd) + sum(egress_usd) AS bill_usd
        FROM {db}.usage_hourly GROUP BY resource_id, hour
    )
SELECT hour, resource_id, alert_id, type, rule, if(rank <= 14, 'waste', 'could_save') AS kind, rank, team, account,
       claimed_usd, bill_usd,
       if(rank <= 14,
          greatest(0, least(claimed_usd, bill_usd - (sum(claimed_usd) OVER w - claimed_usd))),
          greatest(0, least(claimed_usd, bill_usd - least(bill_usd, sumIf(claimed_usd, rank <= 11) OVER hour_w)
                                         - (sumIf(claimed_usd, rank > 14) OVER w - claimed_usd)))) AS usd
FROM (SELECT c.*, b.bill_usd AS bill_usd FROM claim_hours AS c
      LEFT JOIN bills AS b ON c.resource_id = b.resource_id AND c.hour = b.hour)
WINDOW w AS (PARTITION BY resource_id, hour ORDER BY rank, claim ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW),
       hour_w AS (PARTITION BY resource_id, hour);

-- Failed-run spend by project and error.
-- Parameters: db (the database: Identifier), since and until (DateTime('UTC')), team (String, '' = every team).
SELECT project, error, count() AS failures, round(sum(waste_usd), 2) AS usd,
       round(sum(gpu_hours), 1) AS gpu_hours, groupArray(3)(run_id) AS example_runs
FROM (SELECT JSONExtractString(details, 'project') AS project,
             if(JSONExtractString(details, 'error') = '', '(none reported)', JSONExtractString(details, 'error')) AS error,
             JSONExtractString(details, 'run_id') AS run_id, JSONExtractFloat(details, 'gpu_hours') AS gpu_hours,
             waste_usd, tags['team'] AS team
      FROM {db:Identifier}.alerts FINAL
      WHERE type = 'failed_run_spend' AND NOT JSONExtractBool(details, 'crash_loop') AND silenced = ''
        AND fired_at >= {since:DateTime('UTC')} AND fired_at < {until:DateTime('UTC')})
WHERE ({team:String} = '' OR team = {team:String})
GROUP BY project, error
ORDER BY usd DESC

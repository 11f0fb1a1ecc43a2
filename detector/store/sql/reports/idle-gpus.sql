-- Idle GPU-hours by resource and owner.
-- Parameters: db (the database: Identifier), since and until (DateTime('UTC')), team (String, '' = every team).
SELECT resource_id, team, owner, instance_type, round(idle, 2) AS idle_gpu_hours, round(total, 2) AS gpu_hours,
       round(100 * idle / nullIf(total, 0), 1) AS idle_pct, round(idle_dollars, 2) AS idle_usd
FROM (SELECT resource_id, team, owner, instance_type, sum(idle_gpu_hours) AS idle, sum(gpu_hours) AS total,
             sum(if(gpu_hours > 0, usd * idle_gpu_hours / gpu_hours, 0)) AS idle_dollars
      FROM {db:Identifier}.cost_hourly
      WHERE hour >= {since:DateTime('UTC')} AND hour < {until:DateTime('UTC')} AND ({team:String} = '' OR team = {team:String})
      GROUP BY resource_id, team, owner, instance_type)
WHERE idle > 0
ORDER BY idle DESC
LIMIT 20

-- Untagged spend by account (no team tag).
-- Parameters: db (the database: Identifier), since and until (DateTime('UTC')), team (String, '' = every team).
SELECT account, resources, round(dollars, 2) AS usd,
       round(dollars / greatest(dateDiff('hour', {since:DateTime('UTC')}, {until:DateTime('UTC')}), 1), 4) AS usd_per_hour,
       top_resource
FROM (SELECT account, uniqExact(resource_id) AS resources, sum(usd) AS dollars, argMax(resource_id, usd) AS top_resource
      FROM {db:Identifier}.cost_hourly
      WHERE hour >= {since:DateTime('UTC')} AND hour < {until:DateTime('UTC')} AND team = ''
      GROUP BY account)
ORDER BY usd DESC

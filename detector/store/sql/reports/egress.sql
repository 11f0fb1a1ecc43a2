-- Egress by destination.
-- Parameters: db (the database: Identifier), since and until (DateTime('UTC')), team (String, '' = every team).
SELECT region AS source_region, if(dest_region = '', 'internet', dest_region) AS destination,
       round(sum(egress_bytes) / 1e9, 1) AS gb, round(sum(egress_usd), 2) AS usd,
       uniqExact(resource_id) AS resources, argMax(resource_id, egress_bytes) AS top_resource
FROM (SELECT resource_id, dest_region, anyLast(region) AS region, anyLast(team) AS team,
             sum(egress_bytes) AS egress_bytes, sum(egress_usd) AS egress_usd
      FROM {db:Identifier}.usage_hourly
      WHERE hour >= {since:DateTime('UTC')} AND hour < {until:DateTime('UTC')}
      GROUP BY resource_id, dest_region)
WHERE egress_bytes > 0 AND ({team:String} = '' OR team = {team:String})
GROUP BY source_region, destination
ORDER BY usd DESC

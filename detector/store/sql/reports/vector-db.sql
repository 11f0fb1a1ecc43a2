-- Vector-DB fill and forecast (none where no growth alert is firing: join_use_nulls, not a growth of 0).
-- Parameters: db (the database: Identifier), since and until (DateTime('UTC')), team (String, '' = every team).
SELECT resource_id, team, round(size_gb, 1) AS size_gb, round(capacity_gb, 1) AS capacity_gb,
       round(100 * size_gb / nullIf(capacity_gb, 0), 1) AS fill_pct, f.forecast_full AS forecast_full,
       f.growth_gb_per_day AS growth_gb_per_day, f.next_tier AS next_tier
FROM (SELECT resource_id, argMax(if(tags['team'] != '', tags['team'], arrayFirst(v -> v != '', mapValues(mapFilter((k, v) -> lowerUTF8(k) IN ('team', 'user:team'), tags)))), ts) AS team, argMax(storage_bytes, ts) / 1e9 AS size_gb,
             argMax(capacity_bytes, ts) / 1e9 AS capacity_gb
      FROM {db:Identifier}.resource_usage
      WHERE resource_type = 'vector_db' AND ts >= {since:DateTime('UTC')} AND ts < {until:DateTime('UTC')}
      GROUP BY resource_id) AS s
LEFT JOIN (SELECT resource_id, argMax(JSONExtractString(details, 'forecast_full'), updated_at) AS forecast_full,
                  argMax(JSONExtractFloat(details, 'growth_gb_per_day'), updated_at) AS growth_gb_per_day,
                  argMax(JSONExtractString(details, 'next_tier', 'name'), updated_at) AS next_tier
           FROM {db:Identifier}.alerts FINAL WHERE type = 'vector_db_growth' AND status = 'firing'
           GROUP BY resource_id) AS f ON s.resource_id = f.resource_id
WHERE ({team:String} = '' OR team = {team:String})
ORDER BY fill_pct DESC
SETTINGS join_use_nulls = 1

-- Unused commitment dollars per commitment and day.
-- Parameters: db (the database: Identifier), since and until (DateTime('UTC')), team (String, '' = every team).
SELECT day, commitment_id, commitment_type, commitment_name, account, region, round(sum(used), 2) AS used_usd,
       round(sum(unused), 2) AS unused_usd, round(100 * sum(unused) / nullIf(sum(used) + sum(unused), 0), 1) AS unused_pct
FROM (SELECT toDate(ts) AS day, resource_id AS commitment_id, anyLast(account) AS account, anyLast(region) AS region,
             anyLast(JSONExtractString(extra, 'commitment_type')) AS commitment_type,
             anyLast(JSONExtractString(extra, 'commitment_name')) AS commitment_name, anyLast(if(tags['team'] != '', tags['team'], arrayFirst(v -> v != '', mapValues(mapFilter((k, v) -> lowerUTF8(k) IN ('team', 'user:team'), tags))))) AS team,
             anyLast(metrics['commitment_used_usd']) AS used, anyLast(usd) AS unused
      FROM {db:Identifier}.resource_usage
      WHERE resource_type = 'commitment' AND ts >= {since:DateTime('UTC')} AND ts < {until:DateTime('UTC')}
      GROUP BY day, resource_id, ts)
WHERE ({team:String} = '' OR team = {team:String})
GROUP BY day, commitment_id, commitment_type, commitment_name, account, region
ORDER BY day, unused_usd DESC

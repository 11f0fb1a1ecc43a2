-- Waste (and what could be saved) by type and team per day.
-- Parameters: db (the database: Identifier), since and until (DateTime('UTC')), team (String, '' = every team).
SELECT toDate(hour) AS day, kind, type, team, round(sum(dollars), 2) AS usd, uniqExact(alert_id) AS incidents
FROM (SELECT hour, kind, type, if(team = '', '(untagged)', team) AS team, alert_id, usd AS dollars
      FROM {db:Identifier}.waste_ledger)
WHERE hour >= {since:DateTime('UTC')} AND hour < {until:DateTime('UTC')} AND dollars > 0 AND ({team:String} = '' OR team = {team:String})
GROUP BY day, kind, type, team
ORDER BY day, kind DESC, usd DESC

-- Alert precision by rule (acknowledged vs marked expected), of the alerts that stood (not withdrawn).
-- Parameters: db (the database: Identifier), since and until (DateTime('UTC')), team (String, '' = every team).
SELECT rule, type, alerts, acks AS acknowledged, marked_expected AS expected, alerts - answered AS unanswered,
       if(answered = 0, NULL, round(acks_only / answered, 3)) AS precision
FROM (SELECT rule, type, count() AS alerts, countIf(is_ack) AS acks, countIf(is_expected) AS marked_expected,
             countIf(is_ack OR is_expected) AS answered, countIf(is_ack AND NOT is_expected) AS acks_only
      FROM (SELECT a.rule AS rule, a.type AS type, a.team AS team, x.acknowledged = 1 AS is_ack,
                   x.expected = 1 AS is_expected
            FROM (SELECT alert_id, rule, type, tags['team'] AS team FROM {db:Identifier}.alerts FINAL
                  WHERE silenced = '' AND NOT withdrawn
                    AND fired_at >= {since:DateTime('UTC')}
                    AND fired_at < {until:DateTime('UTC')}) AS a
            LEFT JOIN (SELECT alert_id, max(action = 'acknowledged') AS acknowledged, max(action = 'expected') AS expected
                       FROM {db:Identifier}.alert_actions GROUP BY alert_id) AS x ON a.alert_id = x.alert_id)
      WHERE ({team:String} = '' OR team = {team:String})
      GROUP BY rule, type)
ORDER BY alerts DESC

-- Incidents with time to acknowledge and resolve (those that stood: a withdrawn fire never did).
-- Time to acknowledge counts from the Slack post; an opening that made none (its record a marker:
-- refused, not Slack's, snoozed, withdrawn: detector/delivery.py) has none, nor one acknowledged before
-- its post (on the incidents page while Slack refused it, posted once the app was invited).
-- Parameters: db (the database: Identifier), since and until (DateTime('UTC')), team (String, '' = every team).
SELECT a.alert_id AS alert_id, a.type AS type, a.resource_id AS resource_id, a.team AS team, a.status AS status,
       a.fired_at AS fired_at, round(a.waste_usd, 2) AS usd,
       if(x.acked_at IS NULL OR d.posted_at IS NULL OR x.acked_at < d.posted_at, NULL,
          round(dateDiff('second', d.posted_at, x.acked_at) / 60, 1)) AS minutes_to_ack,
       x.acked_by AS acked_by,
       if(a.resolved_at IS NULL, NULL, round(dateDiff('second', a.fired_at, a.resolved_at) / 3600, 2)) AS hours_to_resolve
FROM (SELECT alert_id, type, resource_id, tags['team'] AS team, status, fired_at, resolved_at, waste_usd
      FROM {db:Identifier}.alerts FINAL
      WHERE silenced = '' AND NOT withdrawn AND fired_at >= {since:DateTime('UTC')} AND fired_at < {until:DateTime('UTC')}) AS a
LEFT JOIN (SELECT alert_id, min(at) AS acked_at, argMin(user_name, at) AS acked_by
           FROM {db:Identifier}.alert_actions WHERE action = 'acknowledged' GROUP BY alert_id) AS x ON a.alert_id = x.alert_id
LEFT JOIN (SELECT alert_id, min(delivered_at) AS posted_at FROM {db:Identifier}.alert_deliveries
           WHERE kind = 'fired' AND NOT (channel = '' AND message_ts IN ('refused', 'unrouted', 'snoozed', 'withdrawn'))
           GROUP BY alert_id) AS d ON a.alert_id = d.alert_id
WHERE ({team:String} = '' OR a.team = {team:String})
ORDER BY a.fired_at
SETTINGS join_use_nulls = 1

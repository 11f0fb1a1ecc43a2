-- The daily digest: per alert posted and ledger kind, its dollars in the waste ledger on one UTC day.
-- An incident re-priced from the bill (alert_billing) carries billed_ratio (billed / claimed
-- dollars over its episode); NULL when not re-priced.
-- An incident an action fixed (remediation_actions, step 'succeeded', saving something: one found
-- already stopped, usd_per_hour 0, was fixed by someone else) carries the action's kind and
-- who decided it (fixed_kind, fixed_by; '' when none).
-- Parameters: db (the database), day (Date).
SELECT a.alert_id AS alert_id, a.type AS type, a.resource_id AS resource_id, a.channel AS channel,
       a.tags['team'] AS team, a.status AS status, a.usd_per_hour AS usd_per_hour,
       a.resolved_at AS resolved_at, a.details AS details, w.kind AS kind, w.usd AS usd,
       if(r.alert_id = '', NULL, r.billed_usd / r.claimed_usd) AS billed_ratio,
       f.kind AS fixed_kind, f.decided_by AS fixed_by
FROM (SELECT alert_id, kind, sum(usd) AS usd FROM {db:Identifier}.waste_ledger
      WHERE toDate(hour) = {day:Date} GROUP BY alert_id, kind HAVING usd > 0) AS w
INNER JOIN (SELECT * FROM {db:Identifier}.alerts FINAL) AS a ON a.alert_id = w.alert_id
LEFT JOIN (SELECT alert_id, billed_usd, claimed_usd FROM {db:Identifier}.alert_billing FINAL) AS r
    ON r.alert_id = w.alert_id
LEFT JOIN (SELECT alert_id, argMax(kind, at) AS kind, argMax(decided_by, at) AS decided_by
           FROM {db:Identifier}.remediation_actions WHERE step = 'succeeded' AND usd_per_hour > 0
           GROUP BY alert_id) AS f
    ON f.alert_id = w.alert_id
WHERE a.silenced = ''

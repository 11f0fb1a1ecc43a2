-- The digest's trend: per channel, UTC day and alert type, the waste ledger's wasted dollars
-- (kind 'waste') of the alerts posted (not silenced), over the days from `first` to `day`.
-- day: the UTC day's midnight (DateTime). Parameters: db (the database), first and day (Date).
SELECT a.channel AS channel, toStartOfDay(w.hour) AS day, a.type AS type, sum(w.usd) AS usd
FROM {db:Identifier}.waste_ledger AS w
INNER JOIN (SELECT alert_id, type, channel FROM {db:Identifier}.alerts FINAL WHERE silenced = '') AS a
    ON a.alert_id = w.alert_id
WHERE w.kind = 'waste' AND toDate(w.hour) BETWEEN {first:Date} AND {day:Date}
GROUP BY channel, day, type
HAVING usd > 0
ORDER BY channel, day, type

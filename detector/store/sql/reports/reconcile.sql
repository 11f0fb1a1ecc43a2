-- burnwatch's dollars against the bill, per team and resource-day: what the events claimed
-- (cost_usd, else the price list; egress included), what alerts counted as waste, what the
-- FOCUS bill says (EffectiveCost, from `burnwatch ingest focus`), the difference, and why
-- where the data says (docs/billing.md). Resources the bill has without a resource id
-- (account credits, taxes) are not here: they belong to no resource.
-- Parameters: db (the database: Identifier), since and until (DateTime('UTC')), team (String, '' = every team).
SELECT day, team, resource_id, round(claimed, 2) AS claimed_usd, round(alerted, 2) AS alert_usd,
       round(billed, 2) AS billed_usd, round(claimed - billed, 2) AS difference_usd,
       multiIf(billed_rows = 0, 'not billed (yet): the bill lags by hours to a day',
               claimed_hours = 0, 'no telemetry: billed, but no events reached burnwatch',
               abs(claimed - billed) <= 0.01 * greatest(abs(billed), 0.01), 'agrees (within 1 %)',
               abs(claimed - egress - billed) <= 0.01 * greatest(abs(billed), 0.01),
                   'agrees without egress: the bill has no network charges for it',
               credits != 0, 'credits on the bill',
               list_cost > 0 AND abs(claimed - list_cost) <= 0.01 * list_cost,
                   'list vs effective price (discount or commitment)',
               list_cost > 0 AND abs(claimed - egress - list_cost) <= 0.01 * list_cost,
                   'list vs effective price, and the bill has no network charges for it',
               claimed_hours < billed_hours * 0.99, 'telemetry missing for part of the billed hours',
               '') AS why
FROM (
    SELECT day, resource_id,
           if(c.team != '', c.team, if(b.team != '', b.team, '(untagged)')) AS team,
           ifNull(c.usd, 0) AS claimed, ifNull(c.egress, 0) AS egress, ifNull(c.hours, 0) AS claimed_hours, ifNull(a.usd, 0) AS alerted,
           ifNull(b.usd, 0) AS billed, ifNull(b.rows, 0) AS billed_rows, ifNull(b.hours, 0) AS billed_hours,
           ifNull(b.credits, 0) AS credits, ifNull(b.list_usd, 0) AS list_cost
    FROM (SELECT toDate(hour) AS day, resource_id, anyLast(team) AS team, sum(usd) + sum(egress_usd) AS usd,
                 sum(egress_usd) AS egress, sum(running_hours) AS hours
          FROM {db:Identifier}.cost_hourly
          WHERE hour >= {since:DateTime('UTC')} AND hour < {until:DateTime('UTC')}
          GROUP BY day, resource_id) AS c
    FULL OUTER JOIN
         (SELECT toDate(charge_period_start) AS day, resource_id,
                 anyLast(if(tags['team'] != '', tags['team'], arrayFirst(v -> v != '', mapValues(mapFilter((k, v) -> lowerUTF8(k) IN ('team', 'user:team'), tags))))) AS team,
                 toFloat64(sum(effective_cost)) AS usd, count() AS rows,
                 toFloat64(sumIf(consumed_quantity, consumed_unit IN ('Hours', 'Hrs', 'Hour'))) AS hours,
                 toFloat64(sumIf(effective_cost, charge_category = 'Credit')) AS credits,
                 toFloat64(sum(ifNull(list_cost, 0))) AS list_usd
          FROM {db:Identifier}.billing
          WHERE charge_period_start >= {since:DateTime('UTC')} AND charge_period_start < {until:DateTime('UTC')}
                AND resource_id != ''
          GROUP BY day, resource_id) AS b USING (day, resource_id)
    LEFT JOIN
         (SELECT toDate(hour) AS day, resource_id, sum(usd) AS usd
          FROM {db:Identifier}.waste_ledger
          WHERE hour >= {since:DateTime('UTC')} AND hour < {until:DateTime('UTC')} AND kind = 'waste'
          GROUP BY day, resource_id) AS a USING (day, resource_id))
WHERE {team:String} = '' OR team = {team:String}
ORDER BY day, team, abs(claimed - billed) DESC, resource_id

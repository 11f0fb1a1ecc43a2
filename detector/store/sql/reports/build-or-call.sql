-- Build or call: each resource serving or calling a model (the tag model_tag names: the rule's, 'model') with its cost and traffic
-- over the period; `burnwatch query build-or-call` adds the other way's cost from rules/pricing.yaml
-- (detector/llm_costs.py: the API's token price, or self-hosting sized for the busiest hour).
-- Reads the raw usage (hourly or finer intervals), so it covers what the event TTL keeps. The requests of
-- intervals that reported no token counts are summed apart: those are priced at the rule's tokens per request.
-- Parameters: db (the database: Identifier), since and until (DateTime('UTC')), team (String, '' = every team),
-- model_tag (String: the build_or_call rule's, 'model' by default).
SELECT resource_id, resource_type, model, team,
       round(sum(h_running_s) / 3600, 2) AS hours, round(sum(h_usd), 2) AS usd, sum(h_requests) AS requests,
       sum(h_input) AS input_tokens, sum(h_output) AS output_tokens, max(h_measured) AS measured_tokens,
       sum(h_unmeasured_in) AS unmeasured_in_requests, sum(h_unmeasured_out) AS unmeasured_out_requests,
       max(h_requests) AS peak_requests_per_h, max(h_output) AS peak_output_per_h,
       max(h_unmeasured_out) AS peak_unmeasured_requests_per_h
FROM (SELECT resource_id, toStartOfHour(ts) AS hour,
             anyLast(toString(resource_type)) AS resource_type, anyLast(tags[{model_tag:String}]) AS model,
             anyLast(if(tags['team'] != '', tags['team'], arrayFirst(v -> v != '', mapValues(mapFilter((k, v) -> lowerUTF8(k) IN ('team', 'user:team'), tags))))) AS team, sum(toFloat64(interval_s)) AS h_running_s, sum(usd) AS h_usd,
             sum(ifNull(requests, 0)) AS h_requests, sum(greatest(0, metrics['input_tokens'])) AS h_input,
             sum(greatest(0, metrics['output_tokens'])) AS h_output, max(mapContains(metrics, 'output_tokens')) AS h_measured,
             sumIf(ifNull(requests, 0), NOT mapContains(metrics, 'input_tokens')) AS h_unmeasured_in,
             sumIf(ifNull(requests, 0), NOT mapContains(metrics, 'output_tokens')) AS h_unmeasured_out
      FROM {db:Identifier}.resource_usage
      WHERE ts >= {since:DateTime('UTC')} AND ts < {until:DateTime('UTC')} AND tags[{model_tag:String}] != ''
        AND state = 'running'
      GROUP BY resource_id, hour)
WHERE {team:String} = '' OR team = {team:String}
GROUP BY resource_id, resource_type, model, team
ORDER BY usd DESC

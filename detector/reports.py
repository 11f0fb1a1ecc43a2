"""Named post-mortem reports: one parameterised query each over the rollups and alerts.

``burnwatch query REPORT [--since 7d] [--team T] [--format table|csv|json]`` runs one.
The period ends at the newest event time in the store, rounded up to a whole hour (so a
replayed or simulated fleet reports like a live one, and every hourly rollup of the period
counts) and starts ``--since`` before it. Parameters are bound by
ClickHouse (``{since:DateTime('UTC')}``), never pasted into the SQL: the same text runs
in ``clickhouse-client --param_since=... --param_until=... --param_team=...`` after
``USE burnwatch``; docs/postmortem.md shows each one. ``{db}`` is the only thing
substituted, with the configured database name.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

__all__ = ["REPORTS", "Report", "format_rows", "newest_event_time", "period", "run_report"]


@dataclass(frozen=True)
class Report:
    name: str
    title: str
    sql: str
    """``{db}`` for the database; bound: ``since``, ``until`` (DateTime UTC), ``team`` ('' = all)."""

    def query(self, db: str) -> str:
        return self.sql.replace("{db}", db)


_TEAM = "({team:String} = '' OR team = {team:String})"

REPORTS: dict[str, Report] = {r.name: r for r in [
    Report("waste", "Waste (and what could be saved) by type and team per day", f"""
SELECT toDate(hour) AS day, kind, type, team, round(sum(dollars), 2) AS usd, uniqExact(alert_id) AS incidents
FROM (SELECT hour, kind, type, if(team = '', '(untagged)', team) AS team, alert_id, usd AS dollars
      FROM {{db}}.waste_ledger)
WHERE hour >= {{since:DateTime('UTC')}} AND hour < {{until:DateTime('UTC')}} AND dollars > 0 AND {_TEAM}
GROUP BY day, kind, type, team
ORDER BY day, kind DESC, usd DESC"""),
    Report("idle-gpus", "Idle GPU-hours by resource and owner", f"""
SELECT resource_id, team, owner, instance_type, round(idle, 2) AS idle_gpu_hours, round(total, 2) AS gpu_hours,
       round(100 * idle / nullIf(total, 0), 1) AS idle_pct, round(idle_dollars, 2) AS idle_usd
FROM (SELECT resource_id, team, owner, instance_type, sum(idle_gpu_hours) AS idle, sum(gpu_hours) AS total,
             sum(if(gpu_hours > 0, usd * idle_gpu_hours / gpu_hours, 0)) AS idle_dollars
      FROM {{db}}.cost_hourly
      WHERE hour >= {{since:DateTime('UTC')}} AND hour < {{until:DateTime('UTC')}} AND {_TEAM}
      GROUP BY resource_id, team, owner, instance_type)
WHERE idle > 0
ORDER BY idle DESC
LIMIT 20"""),
    Report("failed-runs", "Failed-run spend by project and error", f"""
SELECT project, error, count() AS failures, round(sum(waste_usd), 2) AS usd,
       round(sum(gpu_hours), 1) AS gpu_hours, groupArray(3)(run_id) AS example_runs
FROM (SELECT JSONExtractString(details, 'project') AS project,
             if(JSONExtractString(details, 'error') = '', '(none reported)', JSONExtractString(details, 'error')) AS error,
             JSONExtractString(details, 'run_id') AS run_id, JSONExtractFloat(details, 'gpu_hours') AS gpu_hours,
             waste_usd, tags['team'] AS team
      FROM {{db}}.alerts FINAL
      WHERE type = 'failed_run_spend' AND NOT JSONExtractBool(details, 'crash_loop') AND silenced = ''
        AND fired_at >= {{since:DateTime('UTC')}} AND fired_at < {{until:DateTime('UTC')}})
WHERE {_TEAM}
GROUP BY project, error
ORDER BY usd DESC"""),
    Report("untagged", "Untagged spend by account (no team tag)", """
SELECT account, resources, round(dollars, 2) AS usd,
       round(dollars / greatest(dateDiff('hour', {since:DateTime('UTC')}, {until:DateTime('UTC')}), 1), 4) AS usd_per_hour,
       top_resource
FROM (SELECT account, uniqExact(resource_id) AS resources, sum(usd) AS dollars, argMax(resource_id, usd) AS top_resource
      FROM {db}.cost_hourly
      WHERE hour >= {since:DateTime('UTC')} AND hour < {until:DateTime('UTC')} AND team = ''
      GROUP BY account)
ORDER BY usd DESC"""),
    Report("egress", "Egress by destination", f"""
SELECT region AS source_region, if(dest_region = '', 'internet', dest_region) AS destination,
       round(sum(egress_bytes) / 1e9, 1) AS gb, round(sum(egress_usd), 2) AS usd,
       uniqExact(resource_id) AS resources, argMax(resource_id, egress_bytes) AS top_resource
FROM (SELECT resource_id, dest_region, anyLast(region) AS region, anyLast(team) AS team,
             sum(egress_bytes) AS egress_bytes, sum(egress_usd) AS egress_usd
      FROM {{db}}.usage_hourly
      WHERE hour >= {{since:DateTime('UTC')}} AND hour < {{until:DateTime('UTC')}}
      GROUP BY resource_id, dest_region)
WHERE egress_bytes > 0 AND {_TEAM}
GROUP BY source_region, destination
ORDER BY usd DESC"""),
    Report("vector-db", "Vector-DB fill and forecast", f"""
SELECT resource_id, team, round(size_gb, 1) AS size_gb, round(capacity_gb, 1) AS capacity_gb,
       round(100 * size_gb / nullIf(capacity_gb, 0), 1) AS fill_pct, f.forecast_full AS forecast_full,
       f.growth_gb_per_day AS growth_gb_per_day, f.next_tier AS next_tier
FROM (SELECT resource_id, argMax(tags['team'], ts) AS team, argMax(storage_bytes, ts) / 1e9 AS size_gb,
             argMax(capacity_bytes, ts) / 1e9 AS capacity_gb
      FROM {{db}}.resource_usage
      WHERE resource_type = 'vector_db' AND ts >= {{since:DateTime('UTC')}} AND ts < {{until:DateTime('UTC')}}
      GROUP BY resource_id) AS s
LEFT JOIN (SELECT resource_id, argMax(JSONExtractString(details, 'forecast_full'), updated_at) AS forecast_full,
                  argMax(JSONExtractFloat(details, 'growth_gb_per_day'), updated_at) AS growth_gb_per_day,
                  argMax(JSONExtractString(details, 'next_tier', 'name'), updated_at) AS next_tier
           FROM {{db}}.alerts FINAL WHERE type = 'vector_db_growth' AND status = 'firing'
           GROUP BY resource_id) AS f ON s.resource_id = f.resource_id
WHERE {_TEAM}
ORDER BY fill_pct DESC"""),
    Report("incidents", "Incidents with time to acknowledge and resolve", """
SELECT a.alert_id AS alert_id, a.type AS type, a.resource_id AS resource_id, a.team AS team, a.status AS status,
       a.fired_at AS fired_at, round(a.waste_usd, 2) AS usd,
       if(x.acked_at IS NULL OR d.posted_at IS NULL, NULL,
          round(dateDiff('second', d.posted_at, x.acked_at) / 60, 1)) AS minutes_to_ack,
       x.acked_by AS acked_by,
       if(a.resolved_at IS NULL, NULL, round(dateDiff('second', a.fired_at, a.resolved_at) / 3600, 2)) AS hours_to_resolve
FROM (SELECT alert_id, type, resource_id, tags['team'] AS team, status, fired_at, resolved_at, waste_usd
      FROM {db}.alerts FINAL
      WHERE silenced = '' AND fired_at >= {since:DateTime('UTC')} AND fired_at < {until:DateTime('UTC')}) AS a
LEFT JOIN (SELECT alert_id, min(at) AS acked_at, argMin(user_name, at) AS acked_by
           FROM {db}.alert_actions WHERE action = 'acknowledged' GROUP BY alert_id) AS x ON a.alert_id = x.alert_id
LEFT JOIN (SELECT alert_id, min(delivered_at) AS posted_at FROM {db}.alert_deliveries
           WHERE kind = 'fired' GROUP BY alert_id) AS d ON a.alert_id = d.alert_id
WHERE ({team:String} = '' OR a.team = {team:String})
ORDER BY a.fired_at
SETTINGS join_use_nulls = 1"""),
    Report("precision", "Alert precision by rule (acknowledged vs marked expected)", f"""
SELECT rule, type, alerts, acks AS acknowledged, marked_expected AS expected, alerts - answered AS unanswered,
       if(answered = 0, NULL, round(acks_only / answered, 3)) AS precision
FROM (SELECT rule, type, count() AS alerts, countIf(is_ack) AS acks, countIf(is_expected) AS marked_expected,
             countIf(is_ack OR is_expected) AS answered, countIf(is_ack AND NOT is_expected) AS acks_only
      FROM (SELECT a.rule AS rule, a.type AS type, a.team AS team, x.acknowledged = 1 AS is_ack,
                   x.expected = 1 AS is_expected
            FROM (SELECT alert_id, rule, type, tags['team'] AS team FROM {{db}}.alerts FINAL
                  WHERE silenced = '' AND fired_at >= {{since:DateTime('UTC')}}
                    AND fired_at < {{until:DateTime('UTC')}}) AS a
            LEFT JOIN (SELECT alert_id, max(action = 'acknowledged') AS acknowledged, max(action = 'expected') AS expected
                       FROM {{db}}.alert_actions GROUP BY alert_id) AS x ON a.alert_id = x.alert_id)
      WHERE {_TEAM}
      GROUP BY rule, type)
ORDER BY alerts DESC"""),
]}  # fmt: skip


def newest_event_time(store: Any) -> float | None:
    """The newest event time the store knows (the end of its newest hourly rollup, or its
    newest alert change), in epoch seconds; None when it holds neither."""
    (row,) = store.query(
        f"SELECT (SELECT count() FROM {store.db}.usage_hourly) AS hours, "
        f"(SELECT toUnixTimestamp(max(hour)) + 3600 FROM {store.db}.usage_hourly) AS rollups_end, "
        f"(SELECT count() FROM {store.db}.alerts) AS changes, "
        f"(SELECT toUnixTimestamp64Milli(max(updated_at)) FROM {store.db}.alerts) AS alerts_end_ms"
    )
    ends = ([float(row["rollups_end"])] if row["hours"] else []) + ([row["alerts_end_ms"] / 1000] if row["changes"] else [])
    return max(ends) if ends else None


def period(store: Any, since_s: float) -> tuple[datetime, datetime]:
    """[since, until): until is the newest event time in the store rounded up to a whole
    hour (a time on the hour stays), since is ``since_s`` before it. Whole hours, because
    the reports read hourly rollups: a period ending a second past the hour would start a
    second past the hour too, and leave out its first rollup (``--since 1d`` read 23 hours)."""
    newest = newest_event_time(store) or 0.0
    until = math.ceil(newest / 3600) * 3600
    return (datetime.fromtimestamp(until - since_s, tz=timezone.utc),
            datetime.fromtimestamp(until, tz=timezone.utc))  # fmt: skip


def run_report(store: Any, name: str, since_s: float, team: str = "") -> list[dict[str, Any]]:
    """Rows of the report ``name`` over the ``since_s`` seconds before the newest event time."""
    report = REPORTS[name]
    since, until = period(store, since_s)
    return store.query(report.query(store.db), {"since": since, "until": until, "team": team})


def format_rows(rows: list[dict[str, Any]], fmt: str) -> str:
    """``table`` (aligned columns), ``csv`` (with a header) or ``json`` (one object per line)."""
    if fmt == "json":
        return "".join(json.dumps(row, default=str) + "\n" for row in rows)
    if fmt == "csv":
        out = io.StringIO()
        if rows:
            writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
        return out.getvalue()
    if not rows:
        return "(no rows)\n"
    cols = list(rows[0])
    cells = [["" if r[c] is None else str(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines) + "\n"

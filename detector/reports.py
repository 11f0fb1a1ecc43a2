"""Named post-mortem reports: one parameterised query each over the rollups and alerts, in
``detector/store/sql/reports/NAME.sql``.

``burnwatch query REPORT [--since 7d] [--team T] [--format table|csv|json]`` runs one.
The period ends at the newest event time in the store, rounded up to a whole hour (so a
replayed or simulated fleet reports like a live one, and every hourly rollup of the period
counts) and starts ``--since`` before it. Parameters are bound by ClickHouse
(``{since:DateTime('UTC')}``), never pasted into the SQL, and so is the database
(``{db:Identifier}``): the very file runs in ``clickhouse-client --param_db=burnwatch
--param_since=... --param_until=... --param_team=... --queries-file``; docs/postmortem.md
shows each one.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from detector.store.connection import named_sql
from detector.tag_names import stored_tag
from detector.units import csv_cell, printable

if TYPE_CHECKING:
    from detector.store.connection import Connection

__all__ = ["REPORTS", "Report", "format_rows", "known_teams", "newest_event_time", "period", "run_report"]


@dataclass(frozen=True)
class Report:
    name: str
    title: str
    finish: Callable[[list[dict[str, Any]], Any], list[dict[str, Any]]] | None = None
    """What the rows need from the rule set (prices, a rule's params) that SQL cannot know;
    called with the rows and the rule set (None: the defaults)."""
    bind: Callable[[Any], dict[str, Any]] | None = None
    """Parameters of its own, from the rule set (None: the defaults), bound like the others."""

    @property
    def sql(self) -> str:
        """The text of ``detector/store/sql/reports/NAME.sql``. Bound: ``db`` (Identifier),
        ``since``, ``until`` (DateTime UTC), ``team`` ('' = all)."""
        return named_sql(f"reports/{self.name}")

    @property
    def body(self) -> str:
        """The query without its header comments (what docs/postmortem.md shows)."""
        return "\n".join(line for line in self.sql.splitlines() if not line.startswith("--")).strip()


REPORTS: dict[str, Report] = {r.name: r for r in [
    Report("waste", "Waste (and what could be saved) by type and team per day"),
    Report("idle-gpus", "Idle GPU-hours by resource and owner"),
    Report("failed-runs", "Failed-run spend by project and error"),
    Report("untagged", "Untagged spend by account (no team tag)"),
    Report("egress", "Egress by destination"),
    Report("vector-db", "Vector-DB fill and forecast"),
    Report("incidents", "Incidents with time to acknowledge and resolve"),
    Report("precision", "Alert precision by rule (acknowledged vs marked expected)"),
    Report("reconcile", "Dollars claimed and alerted against the FOCUS bill, per team and resource-day"),
    Report("commitments", "Unused commitment dollars per commitment and day"),
    Report("build-or-call", "Models served or called: cost per 1,000 requests each way, and the crossover",
           finish=lambda rows, ruleset: _build_or_call(rows, ruleset),
           bind=lambda ruleset: {"model_tag": _build_or_call_params(ruleset).model_tag}),
]}

BUILD_OR_CALL_COLUMNS = (
    "resource_id", "model", "direction", "team", "hours", "requests", "usd", "usd_per_1k_requests",
    "alternative_usd", "alternative_usd_per_1k_requests", "crossover_requests_per_h", "self_host_instances",
    "token_source", "verdict",
)  # fmt: skip


def _build_or_call_params(ruleset: Any) -> Any:
    """The rule set's ``build_or_call`` rule's params (the defaults without one)."""
    from detector.detectors.build_or_call import BuildOrCallParams

    rules = ruleset.rules if ruleset is not None else ()
    return next((r.detector.params for r in rules if r.detector.type == "build_or_call"), BuildOrCallParams())


def _build_or_call(rows: list[dict[str, Any]], ruleset: Any) -> list[dict[str, Any]]:
    """The other way's cost of each row, from the rule set's prices and its ``build_or_call``
    rule's assumptions (tokens per request, API resource types, margin; the defaults without one)."""
    from detector.llm_costs import compare
    from detector.pricing import Pricing

    pricing = ruleset.pricing if ruleset is not None else Pricing()
    params = _build_or_call_params(ruleset)
    assumed = (params.input_tokens_per_request, params.output_tokens_per_request)
    compared = [compare(row, pricing, params.api_resource_types, assumed, params.min_saving) for row in rows]
    return [{c: row.get(c) for c in BUILD_OR_CALL_COLUMNS} for row in compared]



def newest_event_time(store: Connection) -> float | None:
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


def period(store: Connection, since_s: float) -> tuple[datetime, datetime]:
    """[since, until): until is the newest event time in the store rounded up to a whole
    hour (a time on the hour stays), since is ``since_s`` before it. Whole hours, because
    the reports read hourly rollups: a period ending a second past the hour would start a
    second past the hour too, and leave out its first rollup (``--since 1d`` read 23 hours). So the start
    is on the hour too: a ``since_s`` of part of an hour reaches back to the hour that holds it
    (``--since 90m`` is 2 hours; starting at 22:30 had left the 22:00 rollup out, and ``--since 30m``
    read nothing). A period reaching back past 1970, where no event is (``--since 36500d``), starts there."""
    newest = newest_event_time(store) or 0.0
    until = math.ceil(newest / 3600) * 3600
    since = math.floor((until - since_s) / 3600) * 3600
    return (datetime.fromtimestamp(max(since, 0), tz=timezone.utc),
            datetime.fromtimestamp(until, tz=timezone.utc))  # fmt: skip


def run_report(store: Connection, name: str, since_s: float, team: str = "", ruleset: Any = None) -> list[dict[str, Any]]:
    """Rows of the report ``name`` over the ``since_s`` seconds before the newest event time
    (finished with ``ruleset``'s prices and rules where the report needs them)."""
    since, until = period(store, since_s)
    report = REPORTS[name]
    own = report.bind(ruleset) if report.bind is not None else {}
    rows = store.named(f"reports/{report.name}", {**own, "since": since, "until": until, "team": team})
    return report.finish(rows, ruleset) if report.finish is not None else rows


def _json_value(value: Any) -> Any:
    """A value JSON can carry: a float that is not finite (``0/0``, ``1/0`` in a query) is null, not
    Python's ``NaN`` / ``Infinity``, which JSON parsers other than Python's (jq) refuse."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):  # a ClickHouse Array or Tuple
        return [_json_value(v) for v in value]
    if isinstance(value, dict):  # a Map
        return {k: _json_value(v) for k, v in value.items()}
    return value


_BILL_TEAM = stored_tag("team")
"""The team a bill's charge is of, as the reconcile report reads it (``team``, ``Team``, ``user:Team``)."""


def known_teams(store: Connection, team: str, most: int = 12) -> tuple[bool, list[str]]:
    """Whether ``team`` is a team the store knows (a ``team`` tag of its usage, its alerts or its bill,
    as the reports read them; ``(untagged)`` always is), and, when it is not, up to ``most`` of the teams
    it knows: what a report that found no row for ``--team`` says, so a typo (``Research`` for
    ``research``) does not read as a team that wasted nothing. A known team is found at its first row,
    the rollups, then the alerts, then the bill: the store's whole history is read only for a team none
    names. The bill is read from its charges of ingests on record, not through the ``billing`` view,
    which sorts every charge ever ingested to keep each one's latest version (a team tag an ingest since
    replaced still counts as known)."""
    db = store.db
    bill = f"{db}.billing_charges WHERE ingest_id IN (SELECT ingest_id FROM {db}.billing_ingests)"
    if team == "(untagged)":
        return True, []
    for source in (f"{db}.usage_hourly WHERE team = {{team:String}}",
                   f"{db}.alerts WHERE tags['team'] = {{team:String}}",
                   f"{bill} AND {_BILL_TEAM} = {{team:String}}"):  # fmt: skip
        if store.query(f"SELECT 1 AS found FROM {source} LIMIT 1", {"team": team}):
            return True, []
    rows = store.query(
        f"SELECT team FROM (SELECT DISTINCT team FROM {db}.usage_hourly "
        f"UNION DISTINCT SELECT DISTINCT tags['team'] AS team FROM {db}.alerts "
        f"UNION DISTINCT SELECT DISTINCT {_BILL_TEAM} AS team FROM {bill}) WHERE team != '' ORDER BY team"
    )  # fmt: skip
    teams = [r["team"] for r in rows]
    return team in teams, teams[:most] + (["..."] if len(teams) > most else [])


def format_rows(rows: list[dict[str, Any]], fmt: str) -> str:
    """``table`` (aligned columns), ``csv`` (with a header; text a spreadsheet would run as a formula
    gets a leading ``'``: :func:`csv_cell`) or ``json`` (one object per line)."""
    return "".join(format_blocks(list(rows[0]) if rows else [], [[list(r.values()) for r in rows]], fmt))


def format_blocks(names: Sequence[str], blocks: Iterable[Sequence[Sequence[Any]]], fmt: str) -> Iterator[str]:
    """:func:`format_rows`' text a block of rows at a time, for output written as the rows come (``burnwatch
    sql``: ``| head`` ends the query). A table's columns are as wide as its first block needs."""
    names = list(names)
    widths: list[int] | None = None
    for block in blocks:
        if not block:
            continue
        if fmt == "json":
            yield "".join(json.dumps({n: _json_value(v) for n, v in zip(names, row, strict=True)}, default=str,
                                     allow_nan=False) + "\n" for row in block)  # fmt: skip
            continue
        if fmt == "csv":
            out = io.StringIO()
            writer = csv.writer(out, lineterminator="\n")
            if widths is None:
                writer.writerow([csv_cell(n) for n in names])
                widths = []
            writer.writerows(["" if v is None else csv_cell(v) if isinstance(v, str) else v for v in row] for row in block)
            yield out.getvalue()
            continue
        cells = [["" if v is None else printable(v) for v in row] for row in block]
        lines = []
        if widths is None:
            widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(names)]
            lines.append("  ".join(c.ljust(w) for c, w in zip(names, widths, strict=True)))
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
        yield "\n".join(lines) + "\n"
    if widths is None and fmt == "table":
        yield "(no rows)\n"

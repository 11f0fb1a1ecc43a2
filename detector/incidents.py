"""Incidents without Slack: each alert episode with its dollars, burn rate, owner and state,
read from the store.

One query and one shape for ``burnwatch incidents`` and the worker's ``/api/incidents`` and
``/incidents`` (:mod:`detector.incidents_page`), so the terminal, a script and the page
agree. An incident is an alert's latest row (``alerts FINAL``) that was posted: alerts held
back (silenced, joined to another incident, realert) are left out, as in the reports. Its
state comes from the alert and the clicks on its buttons (``alert_actions``):
``resolved`` once the detector closed it, else ``snoozed`` while a snooze runs (wall time),
else ``acknowledged`` after someone clicked Acknowledge, else ``firing``.

Open incidents come first, highest dollars per hour first, those whose money is sunk (a failed
run that has ended: ``DetectorBase.burning``) after them, most dollars first; then resolved
ones, the most recently resolved first. Sunk ones show no dollars per hour and are not in the
open ones' sum. Filters come from people (a command line, a query string) and are
checked here once (:meth:`IncidentFilter.from_query`); every value reaches ClickHouse as a
bound parameter.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from detector import units
from detector.units import epoch, format_duration, printable, rfc3339

if TYPE_CHECKING:
    from detector.store.connection import Connection

__all__ = [
    "DEFAULT_LIMIT", "MAX_LIMIT", "MAX_OFFSET", "STATES", "Incident", "IncidentFilter", "IncidentList", "InvalidFilter",
    "format_table", "list_incidents", "money", "slack_permalink", "summary",
]  # fmt: skip

State = Literal["firing", "acknowledged", "snoozed", "resolved"]
STATES: tuple[State, ...] = ("firing", "acknowledged", "snoozed", "resolved")
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
"""The most incidents one answer holds: a page or a terminal with more is not read."""
MAX_OFFSET = 1_000_000
"""The most incidents a page may start past (``offset``): the rest of a long list is read page by page."""
MAX_TEAM = 128
_TRUE, _FALSE = {"", "1", "true", "yes", "on"}, {"0", "false", "no", "off"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_SLACK_CHANNEL = re.compile(r"[A-Z0-9]{2,40}")
_SLACK_TS = re.compile(r"(\d{9,12})\.(\d{6})")


class InvalidFilter(ValueError):
    """A filter that cannot be applied (an unknown parameter, a limit that is not a number):
    the message names the parameter and says what it takes."""


def _shown(value: str, limit: int = 40) -> str:
    """A person's input quoted back in an error, bounded and without control characters."""
    text = value if len(value) <= limit else value[:limit] + "…"
    return repr(_CONTROL.sub("?", text))


@dataclass(frozen=True)
class IncidentFilter:
    """Which incidents: ``open_only`` (not resolved), ``team`` (the ``team`` tag; None: all)
    and at most ``limit`` of them (1 to :data:`MAX_LIMIT`), after the first ``offset`` in the list's order:
    a fleet with more than :data:`MAX_LIMIT` incidents is read page by page, not cut off at the first."""

    open_only: bool = False
    team: str | None = None
    limit: int = DEFAULT_LIMIT
    offset: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_LIMIT:
            raise InvalidFilter(f"limit: {self.limit} is not between 1 and {MAX_LIMIT}")
        if not 0 <= self.offset <= MAX_OFFSET:
            raise InvalidFilter(f"offset: {self.offset} is not between 0 and {MAX_OFFSET}")
        if self.team is not None:
            if len(self.team) > MAX_TEAM:
                raise InvalidFilter(f"team: longer than {MAX_TEAM} characters")
            if _CONTROL.search(self.team):
                raise InvalidFilter("team: control characters are not allowed")

    @classmethod
    def from_query(cls, query: Mapping[str, Sequence[str]], *, allowed: Sequence[str] = ("open", "team", "limit", "offset"),
                   open_only: bool = False) -> IncidentFilter:  # fmt: skip
        """The filter a query string asks for (``query``: each name with all its values, as
        ``urllib.parse.parse_qs`` or aiohttp's ``MultiDict.getall`` give them). ``allowed``:
        the names this caller takes; any other, or one given twice, is :class:`InvalidFilter`.
        ``open_only``: the default when ``open`` is absent. An empty ``team`` means all teams
        (what an emptied form field sends)."""
        unknown = sorted(name for name in query if name not in allowed)
        if unknown:
            raise InvalidFilter(f"unknown parameter {_shown(unknown[0])}; this takes {', '.join(allowed)}")
        values: dict[str, str] = {}
        for name, given in query.items():
            if len(given) != 1:
                raise InvalidFilter(f"{name}: give it once (it was given {len(given)} times)")
            values[name] = given[0]
        if "open" in values:
            flag = values["open"].strip().lower()
            if flag not in _TRUE | _FALSE:
                raise InvalidFilter(f"open: {_shown(values['open'])} is not one of 1, true, 0, false")
            open_only = flag in _TRUE
        limit = DEFAULT_LIMIT
        if "limit" in values:
            text = values["limit"].strip()
            if not text.isascii() or not text.isdigit() or len(text) > 6:
                raise InvalidFilter(f"limit: {_shown(values['limit'])} is not a whole number from 1 to {MAX_LIMIT}")
            limit = int(text)
        offset = 0
        if "offset" in values:
            text = values["offset"].strip()
            if not text.isascii() or not text.isdigit() or len(text) > 7:
                raise InvalidFilter(f"offset: {_shown(values['offset'])} is not a whole number from 0 to {MAX_OFFSET}")
            offset = int(text)
        return cls(open_only=open_only, team=values.get("team") or None, limit=limit, offset=offset)

    def to_json(self) -> dict[str, Any]:
        return {"open": self.open_only, "team": self.team, "limit": self.limit, "offset": self.offset}

    @property
    def next_offset(self) -> int:
        """Where the page after this one starts."""
        return self.offset + self.limit


@dataclass(frozen=True)
class Incident:
    """One incident as the list shows it. Times are epoch seconds: ``episode_start``,
    ``fired_at``, ``updated_at`` and ``resolved_at`` are event time (what the detector saw),
    ``acknowledged_at`` and ``snoozed_until`` wall time (when people clicked)."""

    alert_id: str
    state: State
    type: str
    rule: str
    severity: str
    resource_id: str
    resource_type: str
    account: str
    region: str
    instance_type: str
    usd: float
    """Dollars so far: what the episode has cost (resolved: what it cost in all)."""
    usd_per_hour: float
    """The burn rate the detector measured at its latest update (a sunk one: while it ran)."""
    episode_start: float
    fired_at: float
    updated_at: float
    resolved_at: float | None
    tags: dict[str, str] = field(default_factory=dict)
    acknowledged_by: str | None = None
    acknowledged_at: float | None = None
    snoozed_until: float | None = None
    snoozed_by: str | None = None
    marked_expected: bool = False
    slack_channel: str | None = None
    slack_ts: str | None = None
    slack_post: str = "pending"
    """What became of its opening's Slack post: ``posted``, ``pending`` (not yet, or no Slack), ``refused`` (Slack
    refused it for good), ``not_routed`` (routing sends it elsewhere, or it closed before Slack was set up),
    ``snoozed``, ``withdrawn`` (taken back before it was posted)."""
    burning: bool = True
    """Whether its ``usd_per_hour`` is still being spent while it is open (False: the money
    is sunk, a failed run that has ended)."""
    withdrawn: bool = False
    """Resolved by taking its fire back: the resource had stopped before the rule's threshold, the stop
    read late (:attr:`detector.alerts.Alert.withdrawn`); it never stood and counts no dollars."""

    @property
    def team(self) -> str:
        return self.tags.get("team", "")

    @property
    def owner(self) -> str:
        return self.tags.get("owner", "")

    @property
    def open(self) -> bool:
        return self.state != "resolved"

    @property
    def burning_now(self) -> bool:
        """Open and still spending its dollars per hour: what the open sum counts."""
        return self.open and self.burning

    @property
    def rate(self) -> str:
        """Its dollars per hour as the list shows them: burning, ``sunk`` (what it cost has ended, a failed
        run), or ``-`` (resolved, or a forecast such as a database filling up, whose dollars are none wasted)."""
        if self.burning_now:
            return money(self.usd_per_hour)
        from detector.detectors import REGISTRY

        forecast = (kind := REGISTRY.get(self.type)) is not None and kind.dollars == ""
        return "sunk" if self.open and not forecast else "-"

    @property
    def age_s(self) -> float:
        """How long the waste has lasted, in event time: from the episode's start to its
        resolution, or to its latest update while it is open (as the Slack message counts it)."""
        end = self.resolved_at if self.resolved_at is not None else self.updated_at
        return max(0.0, end - self.episode_start)

    def to_json(self, slack_workspace_url: str | None = None) -> dict[str, Any]:
        """The incident's JSON object: its fields are documented in docs/incidents.md and
        stay stable (new ones may be added; none is renamed or removed)."""

        def t(x: float | None) -> str | None:
            return rfc3339(x) if x is not None else None

        return {
            "alert_id": self.alert_id, "state": self.state, "type": self.type, "rule": self.rule,
            "severity": self.severity, "resource_id": self.resource_id, "resource_type": self.resource_type,
            "team": self.team, "owner": self.owner, "account": self.account, "region": self.region,
            "instance_type": self.instance_type, "usd": round(self.usd, 2), "usd_per_hour": round(self.usd_per_hour, 4),
            "age_s": round(self.age_s), "episode_start": t(self.episode_start), "fired_at": t(self.fired_at),
            "updated_at": t(self.updated_at), "resolved_at": t(self.resolved_at),
            "acknowledged_by": self.acknowledged_by, "acknowledged_at": t(self.acknowledged_at),
            "snoozed_until": t(self.snoozed_until), "snoozed_by": self.snoozed_by,
            "marked_expected": self.marked_expected, "slack_channel": self.slack_channel, "slack_ts": self.slack_ts,
            "slack_post": self.slack_post, "slack_url": slack_permalink(slack_workspace_url, self.slack_channel, self.slack_ts),
            "tags": dict(self.tags), "burning": self.burning, "withdrawn": self.withdrawn,
        }  # fmt: skip


@dataclass(frozen=True)
class IncidentList:
    """One answer: the incidents shown, how many match the filter in all (``total``), and, of
    those, how many are open and their dollars per hour together."""

    incidents: list[Incident]
    total: int
    open_total: int
    open_usd_per_hour: float
    """Of the open ones that still burn (not those whose money is sunk), each resource once: the fastest
    of its incidents (:data:`_COUNT`)."""
    filter: IncidentFilter
    as_of: float
    """The wall time the states were judged at (a snooze runs until a wall time)."""

    def to_json(self, slack_workspace_url: str | None = None) -> dict[str, Any]:
        return {
            "as_of": rfc3339(self.as_of),
            "filter": self.filter.to_json(),
            "total": self.total,
            "shown": len(self.incidents),
            "open_total": self.open_total,
            "open_usd_per_hour": round(self.open_usd_per_hour, 2),
            "incidents": [i.to_json(slack_workspace_url) for i in self.incidents],
        }


def slack_permalink(workspace_url: str | None, channel: str | None, ts: str | None) -> str | None:
    """The link to an incident's Slack message, ``https://WORKSPACE.slack.com/archives/C…/p…``
    (Slack's permalink form), when the workspace's address is configured and the post was
    recorded with a channel id and a message ts; None otherwise (a webhook post has neither)."""
    if not workspace_url or not workspace_url.startswith(("https://", "http://")) or not channel or not ts:
        return None
    found = _SLACK_TS.fullmatch(ts)
    if not _SLACK_CHANNEL.fullmatch(channel) or not found:
        return None
    return f"{workspace_url.rstrip('/')}/archives/{quote(channel)}/p{found.group(1)}{found.group(2)}"


_WHERE = "silenced = '' AND ({open_only:Bool} = false OR status != 'resolved') AND ({team:String} = '' OR tags['team'] = {team:String})"  # noqa: E501

_ORDER = ("status = 'resolved', if(status = 'resolved' OR burning = 0, 0, usd_per_hour) DESC, "
          "if(status = 'resolved', resolved_at, NULL) DESC, waste_usd DESC, alert_id")
"""Open first, highest $/h first, sunk ones (no $/h now) after them by dollars; then the latest
resolved. The limit applies before the joins (which keep no order), so the outer query sorts
the page again: its names are the selected aliases, which are the alert's columns
(``waste_usd`` only ``a`` has; ``burning`` is computed in ``a``)."""
_ROWS = f"""
SELECT a.alert_id AS alert_id, a.type AS type, a.rule AS rule, a.severity AS severity, a.resource_id AS resource_id,
       a.resource_type AS resource_type, a.account AS account, a.region AS region, a.instance_type AS instance_type,
       a.status AS status, a.waste_usd AS usd, a.usd_per_hour AS usd_per_hour, a.episode_start AS episode_start,
       a.fired_at AS fired_at, a.updated_at AS updated_at, a.resolved_at AS resolved_at, a.tags AS tags,
       x.acked_at AS acked_at, x.acked_by AS acked_by, x.snoozed_until AS snoozed_until, x.snoozed_by AS snoozed_by,
       x.expected AS expected, d.channel AS slack_channel, d.message_ts AS slack_ts, a.burning AS burning,
       a.withdrawn AS withdrawn
FROM (SELECT alert_id, type, rule, severity, resource_id, resource_type, account, region, instance_type, status,
             waste_usd, usd_per_hour, episode_start, fired_at, updated_at, resolved_at, tags, {{burning}} AS burning,
             withdrawn
      FROM {{db:Identifier}}.alerts FINAL WHERE {_WHERE}
      ORDER BY {_ORDER} LIMIT {{limit:UInt32}} OFFSET {{offset:UInt32}}) AS a
LEFT JOIN (SELECT alert_id, minIfOrNull(at, action = 'acknowledged') AS acked_at,
                  argMinIf(if(user_name != '', user_name, user_id), at, action = 'acknowledged') AS acked_by,
                  maxIfOrNull(until, action = 'snoozed') AS snoozed_until,
                  argMaxIf(if(user_name != '', user_name, user_id), until, action = 'snoozed') AS snoozed_by,
                  max(action = 'expected') AS expected
           FROM {{db:Identifier}}.alert_actions GROUP BY alert_id) AS x ON a.alert_id = x.alert_id
LEFT JOIN (SELECT alert_id, argMax(channel, delivered_at) AS channel, argMax(message_ts, delivered_at) AS message_ts
           FROM {{db:Identifier}}.alert_deliveries WHERE kind = 'fired' GROUP BY alert_id) AS d ON a.alert_id = d.alert_id
ORDER BY {_ORDER}
SETTINGS join_use_nulls = 1
"""
_COUNT = f"""
SELECT sum(n) AS total, sum(open_n) AS open_total, sum(rate) AS open_usd_per_hour
FROM (SELECT resource_id, count() AS n, countIf(status != 'resolved') AS open_n,
             maxIf(usd_per_hour, status != 'resolved' AND {{burning}} = 1) AS rate
      FROM {{db:Identifier}}.alerts FINAL WHERE {_WHERE} GROUP BY resource_id)
"""
"""The totals. The open dollars per hour count each resource once, at the fastest of its open incidents
still burning, as the daily digest does: an untagged host's idle GPUs and its untagged spend burn the
same dollars (summed, the host counted twice)."""


@cache
def _queries() -> tuple[str, str]:
    """:data:`_ROWS` and :data:`_COUNT` with ``{burning}``: 1 where an alert's $/h is still being
    spent while open, on ``type`` and ``details``. Made on first use: it asks every detector
    class, which a command that only builds its parser (``burnwatch backtest``) should not import."""
    from detector.alerts import burning_sql

    burning = burning_sql()
    return _ROWS.replace("{burning}", burning), _COUNT.replace("{burning}", burning)


def _wall(value: datetime | None) -> float | None:
    return epoch(value) if value is not None else None


def _incident(row: dict[str, Any], now: float) -> Incident:
    snoozed_until = _wall(row["snoozed_until"])
    acked_at = _wall(row["acked_at"])
    state: State
    if row["status"] == "resolved":
        state = "resolved"
    elif snoozed_until is not None and snoozed_until > now:
        state = "snoozed"
    elif acked_at is not None:
        state = "acknowledged"
    else:
        state = "firing"
    return Incident(
        alert_id=row["alert_id"], state=state, type=row["type"], rule=row["rule"], severity=row["severity"],
        resource_id=row["resource_id"], resource_type=row["resource_type"], account=row["account"],
        region=row["region"], instance_type=row["instance_type"], usd=float(row["usd"]),
        usd_per_hour=float(row["usd_per_hour"]), episode_start=epoch(row["episode_start"]),
        fired_at=epoch(row["fired_at"]), updated_at=epoch(row["updated_at"]), resolved_at=_wall(row["resolved_at"]),
        tags=dict(row["tags"]), acknowledged_by=row["acked_by"] if acked_at is not None else None,
        acknowledged_at=acked_at, snoozed_until=snoozed_until,
        snoozed_by=row["snoozed_by"] if snoozed_until is not None else None, marked_expected=bool(row["expected"]),
        **_slack_post(row["slack_channel"], row["slack_ts"]), burning=bool(row["burning"]),
        withdrawn=bool(row["withdrawn"]),
    )  # fmt: skip


_NOT_POSTED = {"refused": "refused", "unrouted": "not_routed", "snoozed": "snoozed", "withdrawn": "withdrawn"}
"""The delivery records of an opening that made no post (``detector.delivery``'s markers: no channel, a word as
its ts) → its ``slack_post``."""


def _slack_post(channel: str | None, ts: str | None) -> dict[str, Any]:
    """An opening's delivery record as the incident's Slack fields: a marker is no channel and no ts (a client
    building a link from ``slack_ts: "refused"`` linked to nothing), and says what became of the post."""
    if channel is None and ts is None:
        return {"slack_post": "pending"}
    if not channel and ts in _NOT_POSTED:
        return {"slack_post": _NOT_POSTED[ts]}
    return {"slack_channel": channel or None, "slack_ts": ts or None, "slack_post": "posted"}


def list_incidents(conn: Connection, flt: IncidentFilter, now: float) -> IncidentList:
    """The incidents ``flt`` asks for, their states judged at wall time ``now``. Two small
    queries made under the connection's lock together, so a worker's web thread may call this
    while its pipeline writes: no write of this process lands between the rows and the totals
    (which would show 3 rows under "showing all 2", or "3 of 4" with nothing more to show)."""
    params = {"db": conn.db, "open_only": flt.open_only, "team": flt.team or "", "limit": flt.limit, "offset": flt.offset}
    rows_sql, count_sql = _queries()
    with conn.lock:
        found, totals = conn.client.query(rows_sql, parameters=params), conn.client.query(count_sql, parameters=params)
    rows = [dict(zip(found.column_names, row, strict=True)) for row in found.result_rows]
    counts = dict(zip(totals.column_names, totals.result_rows[0], strict=True))
    return IncidentList(
        incidents=[_incident(r, now) for r in rows], total=int(counts["total"]), open_total=int(counts["open_total"]),
        open_usd_per_hour=float(counts["open_usd_per_hour"] or 0.0), filter=flt, as_of=now,
    )  # fmt: skip


def money(usd: float) -> str:
    """To the cent, as Slack's message says it (:func:`detector.units.money`): 'under $0.01' for a figure above zero
    that rounds to no cent, never '$0.00' beside a Slack message saying it burns; '-$5.00' for a credit."""
    return units.money(usd, exact=True)


_TABLE = (
    ("STATE", lambda i: i.state, 0),
    ("$/H", lambda i: i.rate, 0),
    ("$ SO FAR", lambda i: money(i.usd), 0),
    ("AGE", lambda i: format_duration(i.age_s), 0),
    ("TEAM", lambda i: i.team or "-", 20),
    ("OWNER", lambda i: i.owner or "-", 20),
    ("TYPE", lambda i: i.type, 24),
    ("RESOURCE", lambda i: i.resource_id, 40),
    ("ID", lambda i: i.alert_id, 0),
)
_RIGHT = {"$/H", "$ SO FAR", "AGE"}


def format_table(listed: IncidentList) -> str:
    """Aligned columns for a terminal; long values cut, control characters shown escaped.
    Empty: one line saying there is nothing (``no open incidents``)."""
    if not listed.incidents:
        what = "open incidents" if listed.filter.open_only else "incidents"
        team = f" for team {printable(listed.filter.team, 60)}" if listed.filter.team else ""
        return f"no {what}{team}\n"
    cells = [[printable(cell(i), width) for _, cell, width in _TABLE] for i in listed.incidents]
    heads = [head for head, _, _ in _TABLE]
    widths = [max(len(h), *(len(row[n]) for row in cells)) for n, h in enumerate(heads)]

    def line(values: list[str]) -> str:
        out = [v.rjust(w) if h in _RIGHT else v.ljust(w) for v, w, h in zip(values, widths, heads, strict=True)]
        return "  ".join(out).rstrip()

    return "\n".join([line(heads), *(line(row) for row in cells)]) + "\n"


def summary(listed: IncidentList) -> str:
    """One line: how many are shown of how many, and the open ones' dollars per hour (of those
    still burning)."""
    noun = "incident" if listed.total == 1 else "incidents"
    what = f"open {noun}" if listed.filter.open_only else noun
    team = f" of team {printable(listed.filter.team, 60)}" if listed.filter.team else ""
    first = listed.filter.offset
    if first and listed.incidents:
        shown = f"showing {first + 1}-{first + len(listed.incidents)} of {listed.total} {what}{team}"
    elif len(listed.incidents) < listed.total:
        shown = f"showing {len(listed.incidents)} of {listed.total} {what}{team}"
    else:
        shown = f"{listed.total} {what}{team}"
    shown_open = [i for i in listed.incidents if i.open]
    spent = len(shown_open) == listed.open_total and all(i.rate == "sunk" for i in shown_open)  # not a forecast's "-"
    burning = (f"burning {money(listed.open_usd_per_hour)}/h" if listed.open_usd_per_hour > 0
               else "none burning now" + (" (their dollars are spent)" if spent else "") if listed.open_total
               else "none burning")  # fmt: skip
    return f"{shown}, {burning}" if listed.filter.open_only else f"{shown}; {listed.open_total} open, {burning}"

"""The worker's read-only page of open incidents (``/incidents``), rendered on the server.

Everything an incident carries came from an event (resource ids, tags, rule names) and
may be markup or script: every value is escaped here, links are built only from the
configured Slack address and ids that match Slack's forms, and the page is served with a
Content-Security-Policy that allows no script at all and only this page's own style
(:data:`HEADERS`), so a value that slipped through escaping still could not run.

A table of hundreds of rows stays readable: the list is capped (``limit``, default 100)
with a line saying how many of how many are shown. Columns are declared once
(:data:`COLUMNS`); each row carries its incident's id (``data-alert-id``) for a later
column of actions.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from html import escape
from urllib.parse import urlencode

from detector.incidents import MAX_LIMIT, Incident, IncidentList, money, printable, slack_permalink
from detector.units import format_duration, rfc3339

__all__ = ["COLUMNS", "HEADERS", "render_error", "render_page"]

_STYLE = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5rem; color: #1f2328; }
h1 { font-size: 1.4rem; margin: 0 0 .3rem; }
.summary, .cap, .asof { margin: .3rem 0; color: #444; }
.cap { font-weight: 600; }
form { margin: .6rem 0; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .3rem .6rem; border-bottom: 1px solid #d8dee4; vertical-align: top; }
th { background: #f6f8fa; position: sticky; top: 0; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.resource { font-family: ui-monospace, monospace; word-break: break-all; max-width: 28rem; }
tr.firing td.state { color: #b42318; font-weight: 600; }
tr.acknowledged td.state { color: #9a6700; }
tr.snoozed td.state { color: #57606a; }
.empty { font-size: 1.1rem; padding: 2rem 0; color: #1a7f37; }
"""
_STYLE_HASH = base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()

HEADERS = {
    "Content-Security-Policy": f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; form-action 'self'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}  # fmt: skip
"""Sent with the page and its errors: no script runs, whatever a value holds."""

Cell = Callable[[Incident, "str | None"], str]
"""An incident (and the Slack workspace's address) → the cell's HTML, escaped."""


def _text(value: object) -> str:
    """Escaped for HTML text and attributes; control characters shown (``\\x1b``), not passed on."""
    return escape(printable(value), quote=True)


def _slack(incident: Incident, workspace_url: str | None) -> str:
    url = slack_permalink(workspace_url, incident.slack_channel, incident.slack_ts)
    return f'<a href="{_text(url)}" rel="noopener noreferrer">Slack</a>' if url else ""


COLUMNS: tuple[tuple[str, str, Cell], ...] = (
    ("$/h", "num", lambda i, _: _text(money(i.usd_per_hour)) if i.burning_now else "sunk" if i.open else "-"),
    ("$ so far", "num", lambda i, _: _text(money(i.usd))),
    ("State", "state", lambda i, _: _text(i.state)),
    ("Age", "num", lambda i, _: _text(format_duration(i.age_s))),
    ("Owner", "owner", lambda i, _: _text(i.owner or "-")),
    ("Team", "team", lambda i, _: _text(i.team or "-")),
    ("Resource", "resource", lambda i, _: _text(i.resource_id)),
    ("Type", "type", lambda i, _: _text(i.type)),
    ("Slack", "slack", _slack),
)
"""(header, CSS class, cell) per column, in order. A column of actions is one more entry."""


def _row(incident: Incident, workspace_url: str | None) -> str:
    cells = "".join(f'<td class="{css}">{cell(incident, workspace_url)}</td>' for _, css, cell in COLUMNS)
    return f'<tr class="{_text(incident.state)}" data-alert-id="{_text(incident.alert_id)}">{cells}</tr>'


def _page(title: str, body: str) -> str:
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_text(title)}</title><style>{_STYLE}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def render_page(listed: IncidentList, workspace_url: str | None = None) -> str:
    """The page of ``listed`` (open incidents, highest dollars per hour first)."""
    flt = listed.filter
    team = f" of team {_text(flt.team)}" if flt.team else ""
    parts = [f"<h1>Open incidents{team}</h1>"]
    parts.append(f'<p class="summary">{listed.open_total} open, burning {_text(money(listed.open_usd_per_hour))}/h '
                 "(dollars per hour at each incident's latest update; those marked sunk, "
                 "a failed run that has ended, are spent and not counted)</p>")  # fmt: skip
    parts.append(
        '<form method="get" action=""><label>Team <input name="team" maxlength="128" '
        f'value="{_text(flt.team or "")}"></label> <button type="submit">Show</button></form>'
    )
    if not listed.incidents:
        parts.append(f'<p class="empty">No open incidents{team}.</p>')
    else:
        shown, total = len(listed.incidents), listed.total
        if shown < total:
            more = ""
            if flt.limit < MAX_LIMIT:
                query = urlencode({**({"team": flt.team} if flt.team else {}), "limit": MAX_LIMIT})
                more = f' <a href="?{_text(query)}">show up to {MAX_LIMIT}</a>'
            parts.append(f'<p class="cap">Showing {shown} of {total} open incidents, highest $/h first.{more}</p>')
        else:
            parts.append(f'<p class="cap">Showing all {total} open incidents, highest $/h first.</p>')
        head = "".join(f'<th class="{css}" scope="col">{_text(name)}</th>' for name, css, _ in COLUMNS)
        rows = "\n".join(_row(i, workspace_url) for i in listed.incidents)
        parts.append(f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{rows}\n</tbody>\n</table>")
    parts.append(f'<p class="asof">As of {_text(rfc3339(listed.as_of))}; ages and dollars are event time, '
                 "as of each incident's latest update. JSON: <code>/api/incidents</code>.</p>")  # fmt: skip
    return _page("burnwatch: open incidents", "\n".join(parts))


def render_error(status: int, message: str) -> str:
    """A page for a refused request (a bad query string), the message escaped."""
    return _page(f"burnwatch: {status}", f"<h1>{status}</h1>\n<p>{_text(message)}</p>")

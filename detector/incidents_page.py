"""The worker's read-only page of open incidents (``/incidents``), rendered on the server.

Everything an incident carries came from an event (resource ids, tags, rule names) and
may be markup or script: every value is escaped here, links are built only from the
configured Slack address and ids that match Slack's forms, and the page is served with a
Content-Security-Policy that allows no script at all and only this page's own style
(:data:`HEADERS`), so a value that slipped through escaping still could not run.

A table of hundreds of rows stays readable: the list is capped (``limit``, default 100)
with a line saying how many of how many are shown. Columns are declared once
(:data:`COLUMNS`); each row carries its incident's id (``data-alert-id``). When any incident
shown has an action (docs/actions.md), an Action column says its state, read from the audit;
for a person the proxy named (:mod:`detector.incidents_actions`), an action awaiting a
decision gets Approve / Decline (Object, Snooze 24h on an automatic one) as plain forms.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from html import escape
from urllib.parse import urlencode

from detector.incidents import MAX_LIMIT, Incident, IncidentList, money, slack_permalink
from detector.remediation.messages import describe_call
from detector.remediation.policy import Action
from detector.units import format_duration, printable, rfc3339

__all__ = ["COLUMNS", "HEADERS", "action_cell", "render_error", "render_page"]

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
td.action { max-width: 30rem; }
td.action code { word-break: break-all; }
form.decide { margin: .3rem 0 0; display: flex; gap: .4rem; }
.who { color: #444; }
"""
_STYLE_HASH = base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()

HEADERS = {
    "Content-Security-Policy": f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; form-action 'self'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}  # fmt: skip
"""Sent with the page and its errors: no script runs, whatever a value holds; links to
other sites carry no referrer, and the page's own form posts carry its ``Origin``."""

Cell = Callable[[Incident, "str | None"], str]
"""An incident (and the Slack workspace's address) → the cell's HTML, escaped."""


def _text(value: object) -> str:
    """Escaped for HTML text and attributes; control characters shown (``\\x1b``), not passed on."""
    return escape(printable(value), quote=True)


def _slack(incident: Incident, workspace_url: str | None) -> str:
    url = slack_permalink(workspace_url, incident.slack_channel, incident.slack_ts)
    if url:
        return f'<a href="{_text(url)}" rel="noopener noreferrer">Slack</a>'
    return "refused" if incident.slack_post == "refused" else ""  # the worker's /healthz says which channel


COLUMNS: tuple[tuple[str, str, Cell], ...] = (
    ("$/h", "num", lambda i, _: _text(i.rate)),
    ("$ so far", "num", lambda i, _: _text(money(i.usd))),
    ("State", "state", lambda i, _: _text("withdrawn" if i.withdrawn else i.state)),
    ("Age", "num", lambda i, _: _text(format_duration(i.age_s))),
    ("Owner", "owner", lambda i, _: _text(i.owner or "-")),
    ("Team", "team", lambda i, _: _text(i.team or "-")),
    ("Resource", "resource", lambda i, _: _text(i.resource_id)),
    ("Type", "type", lambda i, _: _text(i.type)),
    ("Slack", "slack", _slack),
)
"""(header, CSS class, cell) per column, in order. A column of actions is one more entry."""


_VERBS = {"stop_instance": "stop", "cull_notebook": "cull the notebook", "scale_to_zero": "scale to zero"}


def _state(action: Action, now: float) -> str:
    """The action's state in a line, escaped; the call as ``code``."""
    call = f"<code>{_text(describe_call(action))}</code>"
    verb = _text(_VERBS.get(action.kind, action.kind))
    by = f' <span class="who">by {_text(action.decided_by)}</span>' if action.decided_by else ""
    state = action.state
    if state == "dry_run":
        return f"Dry run: would {verb}, calling {call}; nothing is called"
    if state == "not_applicable":
        return f"Cannot {verb}: {_text(action.result)}"
    if state == "proposed" and action.mode == "approve":
        return f"Awaiting approval: {verb}, calling {call}"
    if state == "proposed":
        due = action.due_at or now
        return (f"Will {verb} at {_text(rfc3339(due))} (in {_text(format_duration(max(0.0, due - now)))}) "
                f"unless snoozed or declined, calling {call}")  # fmt: skip
    if state in ("approved", "begun"):
        return f"Approved{by}: calling {call}"
    if state == "retry" and action.stop_asked_by:
        return (f"Declined by {_text(action.stop_asked_by)} after attempt {action.attempts} failed "
                f"({_text(action.result)}): tried no more once that attempt is looked up")  # fmt: skip
    if state == "retry":
        return f"Approved{by}: attempt {action.attempts} failed ({_text(action.result)}); trying again unless declined"
    if state == "succeeded":
        return f"Done{by}: {call}: {_text(action.result)}"
    if state in ("failed", "gave_up", "interrupted"):
        return f"Failed ({_text(state)}): {call}: {_text(action.result)}; act by hand"
    if state == "declined":
        return f"Declined{by}: will not {verb}"
    if state == "cancelled":
        return f"Not acting ({_text(action.decided_by)}): will not {verb}"
    return _text(state)


def _buttons(action: Action, token: str) -> str:
    if not (action.awaits_decision or action.stoppable):
        return ""
    choices = [("approve", "Approve"), ("decline", "Decline")]
    if action.stoppable:  # approved, and waiting to be tried again: a Decline stops the retries
        choices = [("decline", "Decline")]
    elif action.mode == "auto_unless_objected":
        choices = [("approve", "Approve now"), ("decline", "Object"), ("snooze", "Snooze 24h")]
    buttons = "".join(f'<button type="submit" name="decision" value="{value}">{label}</button>' for value, label in choices)
    return ('<form class="decide" method="post" action="incidents">'
            f'<input type="hidden" name="token" value="{_text(token)}">'
            f'<input type="hidden" name="alert_id" value="{_text(action.alert_id)}">{buttons}</form>')  # fmt: skip


def action_cell(actions: list[Action], now: float, token: str | None = None) -> str:
    """An incident's actions: each one's state, and its buttons when ``token`` (a person is
    named, and may post) and it awaits a decision. One form per incident: a decision applies
    to every action on it that awaits one, as a Slack click does."""
    if not actions:
        return "-"
    lines = [f'<div class="state-{_text(a.state)}" data-action="{_text(a.key)}">{_state(a, now)}</div>' for a in actions]
    waiting = [a for a in actions if a.awaits_decision or a.stoppable]
    if token is not None and waiting:
        lines.append(_buttons(waiting[0], token))
    return "".join(lines)


def _row(incident: Incident, workspace_url: str | None, actions: dict[str, list[Action]] | None = None,
         token: str | None = None, now: float = 0.0) -> str:  # fmt: skip
    cells = "".join(f'<td class="{css}">{cell(incident, workspace_url)}</td>' for _, css, cell in COLUMNS)
    if actions is not None:
        cells += f'<td class="action">{action_cell(actions.get(incident.alert_id, []), now, token)}</td>'
    return f'<tr class="{_text(incident.state)}" data-alert-id="{_text(incident.alert_id)}">{cells}</tr>'


def _page(title: str, body: str) -> str:
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_text(title)}</title><style>{_STYLE}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def render_page(listed: IncidentList, workspace_url: str | None = None,
                actions: dict[str, list[Action]] | None = None, *, user: str | None = None,
                token: str | None = None) -> str:  # fmt: skip
    """The page of ``listed`` (open incidents, highest dollars per hour first). ``actions``:
    each incident's actions (an Action column when any has one); ``user``: who the proxy
    says is reading; ``token``: their form token (None: no buttons, the page is read-only)."""
    flt = listed.filter
    team = f" of team {_text(flt.team)}" if flt.team else ""
    parts = [f"<h1>Open incidents{team}</h1>"]
    if user is not None:
        can = "may decide actions here" if token is not None else "reads only: actions are decided in Slack"
        parts.append(f'<p class="user">Signed in as <b>{_text(user)}</b>; {can}.</p>')
    parts.append(f'<p class="summary">{listed.open_total} open, burning {_text(money(listed.open_usd_per_hour))}/h '
                 "(dollars per hour at each incident's latest update; those marked sunk, "
                 "a failed run that has ended, are spent and not counted)</p>")  # fmt: skip
    parts.append(
        '<form method="get" action=""><label>Team <input name="team" maxlength="128" '
        f'value="{_text(flt.team or "")}"></label> <button type="submit">Show</button></form>'
    )
    if not listed.incidents and listed.total and flt.offset:
        back = urlencode({**({"team": flt.team} if flt.team else {}), "limit": flt.limit})
        parts.append(f'<p class="empty">No open incidents{team} past the first {listed.total}: '
                     f'<a href="?{_text(back)}">the first page</a>.</p>')  # fmt: skip
    elif not listed.incidents:
        parts.append(f'<p class="empty">No open incidents{team}.</p>')
    else:
        shown, total = len(listed.incidents), listed.total
        if shown < total:
            team_q = {"team": flt.team} if flt.team else {}
            links = []
            if flt.offset:
                back = urlencode({**team_q, "limit": flt.limit, **({"offset": max(0, flt.offset - flt.limit)}
                                                                    if flt.offset > flt.limit else {})})  # fmt: skip
                links.append(f'<a href="?{_text(back)}">previous {flt.limit}</a>')
            if flt.offset + shown < total:
                ahead = urlencode({**team_q, "limit": flt.limit, "offset": flt.next_offset})
                links.append(f'<a href="?{_text(ahead)}">next {min(flt.limit, total - flt.offset - shown)}</a>')
            if flt.limit < MAX_LIMIT and not flt.offset:
                query = urlencode({**team_q, "limit": MAX_LIMIT})
                links.append(f'<a href="?{_text(query)}">show up to {MAX_LIMIT}</a>')
            which = f"{flt.offset + 1}–{flt.offset + shown}" if flt.offset else f"{shown}"
            more = (" " + " · ".join(links)) if links else ""
            parts.append(f'<p class="cap">Showing {which} of {total} open incidents, highest $/h first.{more}</p>')
        else:
            parts.append(f'<p class="cap">Showing all {total} open incidents, highest $/h first.</p>')
        shown_actions = actions if actions and any(actions.get(i.alert_id) for i in listed.incidents) else None
        head = "".join(f'<th class="{css}" scope="col">{_text(name)}</th>' for name, css, _ in COLUMNS)
        if shown_actions is not None:
            head += '<th class="action" scope="col">Action</th>'
        rows = "\n".join(_row(i, workspace_url, shown_actions, token, listed.as_of) for i in listed.incidents)
        parts.append(f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{rows}\n</tbody>\n</table>")
    parts.append(f'<p class="asof">As of {_text(rfc3339(listed.as_of))}; ages and dollars are event time, '
                 "as of each incident's latest update. JSON: <code>/api/incidents</code>.</p>")  # fmt: skip
    return _page("burnwatch: open incidents", "\n".join(parts))


def render_error(status: int, message: str, *, back: bool = False) -> str:
    """A page for a refused request (a bad query string, a refused decision), the message
    escaped; ``back``: with a link to the page."""
    link = '\n<p><a href="incidents">Back to the incidents</a></p>' if back else ""
    return _page(f"burnwatch: {status}", f'<h1>{status}</h1>\n<p class="message">{_text(message)}</p>{link}')

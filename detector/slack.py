"""Slack: Block Kit rendering and the slack-sdk notifier (bot token or incoming webhook).

With a bot token the opening is a ``chat.postMessage`` and the resolution a
reply in its thread (plus an edit of the parent, so the channel view shows it
closed). A webhook cannot thread, so the resolution is its own message.
``base_url`` / the webhook URL are injectable, which is how the tests point
slack-sdk at a local server.

Anything that came from events (ids, tags, names, run errors, details) is put in a
message through :func:`escape` or :func:`code`, so a tag such as ``<!channel>`` or
``<https://evil.example|click here>`` reads as text and pings or links nobody; every
mrkdwn text is sent ``verbatim`` so Slack does not turn ``@here`` or ``#channel`` in
it into mentions either. Our own mentions (``routing.yaml`` ``users``) and links
(``routing.yaml`` ``links``, their fields URL-encoded) are the only markup.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import msgspec
import structlog
from slack_sdk import WebClient, WebhookClient
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)

from detector import orphaned_alerts
from detector.actions import BUTTONS, GROUP_BLOCK
from detector.alerts import Alert, link_fields
from detector.blockkit import MAX_FIELD_TEXT, MAX_HEADER_TEXT, MAX_NOTIFICATION_TEXT, MAX_TEXT, clip, clip_lines, fit
from detector.detectors.episode import SILENT
from detector.pricing import HOURS_PER_MONTH
from detector.rules import Routing
from detector.units import epoch, format_duration, money, rfc3339

if TYPE_CHECKING:  # detector.digest imports this module
    from detector.digest import Digest

__all__ = ["MAX_GROUP", "SlackError", "SlackNotifier", "block_objects", "code", "escape", "group_text", "notification_text",
           "render_blocks", "render_group", "render_resolution"]

log = structlog.get_logger("burnwatch.slack")

_EMOJI = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}
_DURATION = {"idle_gpu": "Idle for", "partly_idle_gpu": "Idle for", "unallocated_gpu": "Unallocated for"}
"""What an alert's duration field is called, where "Duration" says less."""
_MAX_COMMANDS = 5
MAX_FIELD = MAX_FIELD_TEXT
"""Slack's limit on a section field's text."""
_FIELD_SHOWN = 400
"""What a field shows of a value from events (a half-width column: a 10 kB tag is noise there,
and twenty such fields would pass Slack's limit on a message's total)."""
_ID_SHOWN = 80
"""What a header, a list line or a notification shows of a resource id."""
_BREAKS = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]+")
_BIDI = re.compile(r"[\u202a-\u202e\u2066-\u2069]")
"""Bidi embeddings, overrides and isolates: one in an id would turn the rest of its line
around, so "$412 so far" after it could read as something else."""
_USER_ID = re.compile(r"[UW][A-Z0-9]{2,}")
MAX_GROUP = 100
"""The most openings one group message holds: each one's id ("alert `0123456789abcdef`", 27 characters
with its separator) fits its last line, so a message whose answer was lost (a timeout, a kill) is found in
the channel member by member (:meth:`SlackNotifier.find_openings`). A bigger group is several messages."""


def escape(value: object, limit: int = 0) -> str:
    """Text from events made inert in a Slack message (mrkdwn or plain text): ``& < >``
    become entities, as Slack asks, so nothing in it can mention, link or format a
    channel; line breaks become spaces, so one value cannot fake a field of its own, and bidi
    controls go, so one value cannot reverse the text after it (the dollars).
    With ``limit``, at most that many characters (:func:`detector.blockkit.clip`: cut after
    escaping, never in an entity; a 10 kB value is cut before it is escaped, too)."""
    text = str(value)
    if limit and len(text) > limit:
        text = text[: limit + 1]  # still longer than limit once escaped: clip says it was cut
    text = _BIDI.sub("", _BREAKS.sub(" ", text)).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return clip(text, limit) if limit else text


def code(value: object, limit: int = 0) -> str:
    """An event value as inline code (ids): escaped, and its backticks replaced (Slack has no
    escape for them), so it cannot close our code span and format what follows; with ``limit``,
    cut to that many characters ("…" inside the span)."""
    return "`" + escape(value, max(1, limit - 2) if limit else 0).replace("`", "\u02cb") + "`"


def _whose(alert: Alert) -> str:
    team = alert.tags.get("team")
    return f"team {escape(team, 40)}" if team else "no team tag"


def notification_text(alert: Alert) -> str:
    """What a phone's notification shows for an alert, complete on its own: what, whose and how
    much ("Idle GPUs on gpu-host-7 (team nlp): $412 so far, $32/h"). Escaped; short."""
    what = f"{alert.title} on {escape(alert.resource_id, _ID_SHOWN)} ({_whose(alert)})"
    if alert.withdrawn:
        text = f"Withdrawn: {what}: it had stopped after {format_duration(alert.duration_s)}, short of the threshold"
    elif alert.corrected:
        was = alert.corrects if alert.change == "corrected" else None  # (a resolution said nothing else before)
        money_part = f": {money(alert.waste_usd)} {alert.dollars} in total" if alert.dollars else ""
        text = (f"Corrected: {what}: it had stopped at {rfc3339(alert.resolved_at or alert.updated_at)}, read late"
                + money_part + (f" (not {money(was[1])})" if money_part and was is not None else ""))  # fmt: skip
    elif alert.status == "resolved":
        money_part = f": {money(alert.waste_usd)} {alert.dollars} in total" if alert.dollars else ""
        text = f"Resolved: {what} after {format_duration(alert.duration_s)}{money_part}"
    elif not alert.dollars:  # a forecast: its first fact is the "how much" ("full by 2026-11-20")
        facts = "; ".join(f"{k.lower()} {v}" for k, v in alert.facts[:2]).replace("`", "")
        text = f"{what}: {escape(facts, MAX_NOTIFICATION_TEXT)}" if facts else what
    elif alert.burning:  # "$412 so far", or what the dollars are when not plain waste ("spent untagged")
        so_far = "so far" if alert.dollars == "wasted" else f"{alert.dollars} so far"
        text = f"{what}: {money(alert.waste_usd)} {so_far}, {money(alert.usd_per_hour)}/h"
    else:
        text = f"{what}: {money(alert.waste_usd)} {alert.dollars}, ended"
    return clip(text, MAX_NOTIFICATION_TEXT)


def block_objects(node: Any) -> Iterator[dict[str, Any]]:
    """Every object (dict) in a Block Kit tree, depth first: blocks, elements, text objects."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from block_objects(value)
    elif isinstance(node, list):
        for item in node:
            yield from block_objects(item)


def _verbatim(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mark every mrkdwn text ``verbatim``: Slack then parses only explicit markup (``<@U1>``,
    ``<url|name>``), not bare ``@channel``, ``#channel`` or URLs that came from events."""
    for obj in block_objects(blocks):
        if obj.get("type") == "mrkdwn":
            obj["verbatim"] = True
    return blocks


_CREDENTIALS_REFUSED = frozenset({"invalid_auth", "not_authed", "token_revoked", "token_expired", "account_inactive",
                                  "invalid_token", "no_service"})  # fmt: skip
"""Slack's answers that the token or the webhook is wrong (revoked, rotated, deleted): no message can go
until it is fixed, so each waits in the outbox, retried, as the other outputs' 401s; refused for good, every
alert sent until the fix was lost. (``invalid_token`` and ``no_service`` are an incoming webhook's.)"""


_CHANNEL_REFUSED = {
    "not_in_channel": "invite the burnwatch app to it (/invite @burnwatch), or route to another in routing.yaml",
    "channel_not_found": "check its name in routing.yaml (a private channel needs the app invited first)",
    "is_archived": "unarchive it, or route to another in routing.yaml",
}
"""Slack's answers that the channel a routing rule names cannot take the bot's messages, and what fixes each: the
message goes to SLACK_CHANNEL with a note instead (the commonest first-day mistake is a team's channel the app was
never invited to; each of its alerts was refused for good, logged, and posted nowhere)."""


_WEBHOOK_REFUSED = {
    "channel_is_archived": "unarchive its channel, or make the webhook for another (SLACK_WEBHOOK_URL)",
    "channel_not_found": "the webhook's channel is gone: make one for another (SLACK_WEBHOOK_URL)",
    "action_prohibited": "an admin restricted posting to its channel: ask them, or use another (SLACK_WEBHOOK_URL)",
    "posting_to_general_channel_denied": "only admins may post to its channel: use another (SLACK_WEBHOOK_URL)",
}
"""An incoming webhook's answers that its channel takes no message (Slack's "Handling errors" for webhooks), and what
fixes each: as :data:`_CHANNEL_REFUSED` for a bot, said on ``/healthz`` until a post is taken."""


def _error_of(exc: BaseException) -> str | None:
    """Slack's ``error`` in slack-sdk's exception, if it carries an answer."""
    response = getattr(exc, "response", None)
    try:
        error = response.get("error") if response is not None else None
    except Exception:  # noqa: BLE001 - an answer that is not JSON
        return None
    return error if isinstance(error, str) else None


def _credentials_refused(exc: BaseException) -> bool:
    """Whether slack-sdk's error is Slack refusing the token (:data:`_CREDENTIALS_REFUSED`)."""
    return _error_of(exc) in _CREDENTIALS_REFUSED


def _retryable(exc: BaseException) -> bool:
    """Whether trying again can help after slack-sdk's own retries: no answer, 429, a 5xx, or the
    token refused (waited out until it is fixed). Any other refusal (``message_not_found``: the
    message was deleted in Slack, ``channel_not_found``, ``is_archived``) is Slack's for good."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return status is None or status == 429 or status >= 500 or _credentials_refused(exc)


class SlackError(RuntimeError):
    """Slack refused or could not be reached; ``retryable`` says whether trying again can help,
    ``maybe_posted`` that the request timed out after it was sent (Slack may have taken it),
    ``throttled`` the channel whose post Slack answered 429 (None: not that), ``retry_after_s`` when to try it again."""

    def __init__(self, message: str, retryable: bool, maybe_posted: bool = False, throttled: str | None = None,
                 retry_after_s: float = 0.0) -> None:  # fmt: skip
        super().__init__(message)
        self.retryable = retryable
        self.maybe_posted = maybe_posted
        self.throttled = throttled
        self.retry_after_s = retry_after_s


MAX_RETRY_AFTER_S = 300.0
"""The longest Retry-After taken as it is: a channel told to wait longer is tried again then (an answer of days
would hold its alerts back for good)."""


def _retry_after(exc: BaseException) -> float:
    """Seconds a 429 asks to wait (its Retry-After header; 1 when absent or not a number), at most
    :data:`MAX_RETRY_AFTER_S`."""
    return _retry_after_in(getattr(getattr(exc, "response", None), "headers", None) or {})


def _retry_after_in(headers: Any) -> float:
    """:func:`_retry_after` of a response's headers (slack-sdk's: a list of values a name, or one)."""
    try:
        value = next((v for k, v in headers.items() if str(k).lower() == "retry-after"), None)
        wait = float(value[0] if isinstance(value, list) else value) if value is not None else 1.0
    except (TypeError, ValueError):
        wait = 1.0
    return 1.0 if math.isnan(wait) else min(max(wait, 1.0), MAX_RETRY_AFTER_S)  # ("inf": longer than days)


def _owner(alert: Alert, routing: Routing) -> str:
    owner = alert.tags.get(routing.owner_tag, "")
    user = routing.users.get(owner) if owner else None
    return f"<@{user}>" if user else escape(owner, 200) if owner else "_unknown_"


def _links(alert: Alert, routing: Routing) -> list[dict[str, Any]]:
    """The configured links (console, dashboards, a ClickHouse query), filled in for this alert."""
    quoted = {k: quote(v, safe="") for k, v in link_fields(alert, routing.owner_tag).items()}
    links = [f"<{escape(link.url.format_map(quoted))}|{escape(link.name, 80).replace('|', '/')}>" for link in routing.links
             if not link.types or alert.type in link.types]  # fmt: skip
    if not links:
        return []
    text = clip_lines(links, MAX_TEXT, lambda n: f"{n} more links", sep=" · ")
    return [{"type": "context", "elements": [{"type": "mrkdwn", "text": text}]}]


def _fields(alert: Alert, routing: Routing) -> list[dict[str, str]]:
    tags = alert.tags
    fields = [
        ("Resource", code(alert.resource_id, _FIELD_SHOWN)
         + (f" ({escape(alert.resource_type, 60)})" if alert.resource_type else "")),
        ("Team", escape(tags["team"], _FIELD_SHOWN) if tags.get("team") else ":warning: untagged"),
        ("Owner", _owner(alert, routing)),
        ("Project", escape(tags["project"], _FIELD_SHOWN) if tags.get("project") else "_none_"),
        (_DURATION.get(alert.type, "Duration"), format_duration(alert.duration_s)),
    ]
    if alert.withdrawn:
        fields.append(("Counted", "nothing: withdrawn"))  # it never met the rule: no dollars, no burn rate
    elif alert.dollars:
        fields += [
            (f"{alert.dollars.capitalize()} so far", f"*{money(alert.waste_usd, exact=True)}*"),
            ("Burn rate", f"{money(alert.usd_per_hour, exact=True)}/h "
                          f"({money(alert.usd_per_hour * HOURS_PER_MONTH)}/month if left)")
            if alert.burning else
            ("Burn rate", f"{money(alert.usd_per_hour, exact=True)}/h while it ran (spent: it has ended)"),
        ]  # fmt: skip
    fields.append(("Account / region", f"{escape(alert.account or '?', 180)} / {escape(alert.region or '?', 180)}"))
    if alert.instance_type:
        fields.append(("Instance", escape(alert.instance_type, _FIELD_SHOWN)))
    return [_field(name, value) for name, value in fields[:10]]


def _field(name: str, value: str) -> dict[str, str]:
    """A section field, within Slack's 2,000 characters (a longer one fails the whole message with
    ``invalid_blocks``: five pods with long names, a tag value of 4,096 characters), and shorter
    still (:data:`_FIELD_SHOWN`), cut where it leaves no half entity or link."""
    return {"type": "mrkdwn", "text": clip(f"*{name}*\n{value}", _FIELD_SHOWN)}


def _facts_of(alert: Alert) -> list[tuple[str, str]]:
    """The alert's facts, computed from details whose texts hold no backtick: a fact puts a
    run id in a code span, which a backtick in the id would close."""

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("`", "\u02cb")
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        return value

    return msgspec.structs.replace(alert, details=clean(alert.details)).facts


def _facts(alert: Alert) -> list[dict[str, Any]]:
    """What this type of problem adds (GPUs, destination, forecast date...), as its own section.
    A fact mixes our formatting with event values (run ids, errors, regions); it holds no
    markup of ours that ``escape`` would break, so it is escaped whole."""
    facts = _facts_of(alert)[:10]
    if not facts:
        return []
    return [{"type": "section", "fields": [_field(escape(k, 100), escape(v, _FIELD_SHOWN)) for k, v in facts]}]


def _buttons(alert: Alert) -> dict[str, Any]:
    return {
        "type": "actions",
        "block_id": f"burnwatch:{alert.alert_id}",
        "elements": [
            {"type": "button", "text": {"type": "plain_text", "text": label}, "action_id": action_id,
             "value": alert.alert_id, **({"style": "primary"} if action_id == "burnwatch_ack" else {})}
            for label, action_id in BUTTONS
        ],
    }  # fmt: skip


_DONE = {"acknowledged": ":ballot_box_with_check: Acknowledged", "snoozed": ":zzz: Snoozed",
         "expected": ":information_source: Marked as expected", "approved": ":white_check_mark: Action approved",
         "declined": ":no_entry_sign: Action declined"}  # fmt: skip


def _action_lines(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Who clicked what, when: one context line."""
    if not actions:
        return []
    parts = []
    for a in actions:
        user_id = str(a.get("user_id") or "")
        who = f"<@{user_id}>" if _USER_ID.fullmatch(user_id) else escape(a.get("user_name") or "someone", 80)
        until = f" until {rfc3339(epoch(a['until']))}" if a.get("until") else ""
        parts.append(f"{_DONE.get(a['action'], escape(a['action'], 40))} by {who} at {rfc3339(epoch(a['at']))}{until}")
    return [{"type": "context", "elements": [{"type": "mrkdwn", "text": clip_lines(
        parts, MAX_TEXT, lambda n: f"{n} more (`burnwatch sql` on `alert_actions`)", sep=" · ")}]}]


def render_blocks(
    alert: Alert, actions: list[dict[str, Any]] | None = None, routing: Routing | None = None
) -> list[dict[str, Any]]:
    """The incident's parent message: with buttons while it is open, and what people did about it.
    ``routing`` (``rules/routing.yaml``) supplies owner mentions and links."""
    routing = routing or Routing()
    resource = escape(alert.resource_id, 60)
    if alert.withdrawn:
        header = f":leftwards_arrow_with_hook: Withdrawn: {alert.title} on {resource}"
    elif alert.corrected:
        header = f":white_check_mark: Resolved (corrected): {alert.title} on {resource}"
    elif alert.status == "resolved":
        header = f":white_check_mark: Resolved: {alert.title} on {resource}"
    else:
        rate = money(alert.usd_per_hour, exact=True)
        header = f"{_EMOJI.get(alert.severity, '')} {alert.title} on {resource}"
        if alert.dollars or alert.usd_per_hour:  # a risk with no dollars (spot without redundancy) says none
            header += f": {rate}/h"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": clip(header, MAX_HEADER_TEXT), "emoji": True}},
        {"type": "section", "fields": _fields(alert, routing)},
        *_facts(alert),
    ]
    if alert.status == "resolved":
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _resolution_text(alert)}})
    elif alert.suggestion:
        text = f"*Next step:* {alert.suggestion}" + "".join(f"\n{code(c)}" for c in _commands(alert))
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": clip(text, MAX_TEXT)}})
    blocks += _links(alert, routing)
    if alert.status != "resolved":
        blocks.append(_buttons(alert))
    blocks += _action_lines(actions or [])
    blocks.append(
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": f"rule {code(alert.rule, 200)} · alert {code(alert.alert_id)} · "
                    f"since {rfc3339(alert.episode_start)} · fired {rfc3339(alert.fired_at)} (event time)",
                }
            ],
        }
    )
    return fit(blocks)


def _commands(alert: Alert) -> list[str]:
    """The commands that stop what holds an alert's GPUs (its pods' ``command``), each once, at most
    :data:`_MAX_COMMANDS`. They are built only from valid Kubernetes names
    (:mod:`detector.detectors.pods`), and still put in a message through :func:`code`."""
    pods = alert.details.get("pods")
    found: list[str] = []
    for pod in pods if isinstance(pods, list) else []:
        command = pod.get("command") if isinstance(pod, dict) else None
        if isinstance(command, str) and command and command not in found:
            found.append(command)
    return found[:_MAX_COMMANDS]


_WITHDRAWN_MARK = "*Withdrawn*"
"""What a withdrawal's reply says, and a resolution's does not (:meth:`SlackNotifier.find_posted`)."""
_CORRECTED_MARK = "*Corrected*"
"""What a correction's reply says, and a resolution's does not (:meth:`SlackNotifier.find_posted`)."""


def _resolution_text(alert: Alert) -> str:
    if alert.withdrawn:
        return (f":leftwards_arrow_with_hook: {_WITHDRAWN_MARK} at {rfc3339(alert.resolved_at or alert.updated_at)}: the "
                f"resource had stopped after {format_duration(alert.duration_s)}, short of this rule's threshold "
                "(its stop was read after the samples that seemed to complete it). Nothing is counted"
                + (", and the dollars its resolution said are taken back." if alert.change == "withdrawn" else "."))  # fmt: skip
    reason = escape(alert.details.get("reason", ""), 200).replace("_", " ")
    if alert.corrected:
        was = alert.corrects if alert.change == "corrected" else None  # (a resolution said nothing else before)
        return (f":pencil2: {_CORRECTED_MARK}: the resource had stopped at {rfc3339(alert.resolved_at or alert.updated_at)}"
                + (f" ({reason})" if reason else "")
                + f", read after a later sample that seemed to resolve it: it ended after {format_duration(alert.duration_s)}"
                + (f": *{money(alert.waste_usd, exact=True)} {alert.dollars}* in total" if alert.dollars else "")
                + (f", not the {money(was[1], exact=True)} its resolution at {rfc3339(was[0])} said."
                   if alert.dollars and was is not None else "."))  # fmt: skip
    if alert.details.get("reason") == SILENT:
        silent = alert.details.get("silent_s")
        since = f" in the {format_duration(float(silent))} since" if isinstance(silent, (int, float)) else " since"
        reason = f"its last event; none{since}: the resource is gone, or nothing reports it any more"
    elif alert.details.get("closed_by") == orphaned_alerts.CLOSED_BY:
        reason += ": its rule is no longer loaded; the figures are the last it recorded"
    return (
        f":white_check_mark: *Resolved* at {rfc3339(alert.resolved_at or alert.updated_at)}"
        + (f" ({reason})" if reason else "")
        + f" after {format_duration(alert.duration_s)}"
        + (f": *{money(alert.waste_usd, exact=True)} {alert.dollars}* in total." if alert.dollars else ".")
    )


def _group_words(alert: Alert) -> str:
    by, value = alert.group or ("team", "")
    if by == "account":
        return f"resources in {escape(value, 80) if value else 'an unknown account'}"
    return f"resources of {escape(by, 40)} {escape(value, 80)}" if value else f"resources without a {escape(by, 40)} tag"


def group_text(alerts: list[Alert]) -> str:
    """A group message's notification text: what, whose and how much, on its own
    ("Untagged spend: 50 resources of team nlp: $1,234 so far, $320/h")."""
    head = alerts[0]
    rate = sum(a.usd_per_hour for a in alerts if a.burning)
    spent = sum(a.waste_usd for a in alerts)
    words = _group_words(head)
    if not head.dollars:
        text = f"{head.title}: {len(alerts)} {words}"
    elif any(a.burning for a in alerts):
        text = f"{head.title}: {len(alerts)} {words}: {money(spent)} so far, {money(rate)}/h"
    else:
        text = f"{head.title}: {len(alerts)} {words}: {money(spent)} {head.dollars}, ended"
    return clip(text, MAX_NOTIFICATION_TEXT)


_GROUP_LABELS = {"burnwatch_ack": "Acknowledge all", "burnwatch_snooze": "Snooze all 24h",
                 "burnwatch_expected": "Mark all as expected"}  # fmt: skip


def _group_buttons(head: Alert) -> dict[str, Any]:
    """A group's buttons: each click is taken for every alert the message opened."""
    return {
        "type": "actions",
        "block_id": f"{GROUP_BLOCK}{head.alert_id}",
        "elements": [
            {"type": "button", "text": {"type": "plain_text", "text": _GROUP_LABELS[action_id]},
             "action_id": action_id, "value": head.alert_id,
             **({"style": "primary"} if action_id == "burnwatch_ack" else {})}
            for _, action_id in BUTTONS
        ],
    }  # fmt: skip


def render_group(alerts: list[Alert], actions: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One message listing several openings of one type (untagged resources of one account):
    the costliest first, as many as fit, then how many more and where to see them all; buttons
    for them all while any is open, and what people did about them (``actions``)."""
    head = alerts[0]
    rate = sum(a.usd_per_hour for a in alerts if a.burning)
    spent = sum(a.waste_usd for a in alerts)
    sunk = not any(a.burning for a in alerts)
    header = (f"{_EMOJI.get(head.severity, '')} {head.title}: {len(alerts)} {_group_words(head)}"
              + ("" if not head.dollars else f": {money(spent, exact=True)} spent" if sunk
                 else f": {money(rate, exact=True)}/h"))  # fmt: skip
    lines = []
    for a in sorted(alerts, key=lambda a: -a.usd_per_hour):
        facts = escape("; ".join(f"{k.lower()} {v}" for k, v in _facts_of(a)), 300)
        commands = _commands(a)
        # A forecast or a risk (no dollars gone): its facts say how much, not "so far".
        dollars = (f": {money(a.usd_per_hour, exact=True)}/h{'' if a.burning else ' while it ran'}, "
                   f"{money(a.waste_usd, exact=True)} {a.dollars}") if a.dollars else ""
        line = (f"• {code(a.resource_id, _ID_SHOWN)} ({escape(a.resource_type or '?', 40)}, "
                f"{escape(a.region or '?', 40)}){dollars}" + (f"; {facts}" if facts else "")
                + "".join(f"; run {code(c, 200)}" for c in commands[:2]))  # fmt: skip
        lines.append(clip(line, 400))
    noun = "resources" if len(alerts) != 1 else "resource"
    listed = clip_lines(lines, MAX_TEXT, lambda n: f"+{n} more {noun}: `burnwatch incidents` or the /incidents page "
                        "lists them all")  # fmt: skip
    ids = clip_lines([f"alert {code(a.alert_id, 80)}" for a in alerts], MAX_TEXT - 220, lambda n: f"{n} more", sep=" · ")
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": clip(header, MAX_HEADER_TEXT), "emoji": True}},
        *([{"type": "section", "text": {"type": "mrkdwn", "text": (
            f"*{money(spent, exact=True)}* {head.dollars} in total"
            + (", spent: they have ended." if sunk else
            f", *{money(rate, exact=True)}/h* ({money(rate * HOURS_PER_MONTH)}/month if left)."))}}]
          if head.dollars else []),  # a forecast's or a risk's how much is in each line's facts
        {"type": "section", "text": {"type": "mrkdwn", "text": listed}},
    ]  # fmt: skip
    if head.suggestion:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": clip(f"*Next step:* {head.suggestion}",
                                                                                   MAX_TEXT)}})  # fmt: skip
    if any(a.status == "firing" and not a.withdrawn for a in alerts):
        blocks.append(_group_buttons(head))
    blocks.extend(_action_lines(actions or []))
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"rule {code(head.rule, 200)} · {ids}"}]})
    return fit(blocks)


def render_resolution(alert: Alert) -> list[dict[str, Any]]:
    """The reply in the incident's thread when it resolves (naming the resource: a group's
    thread holds the resolutions of several)."""
    return fit([
        {"type": "section", "text": {"type": "mrkdwn", "text": _resolution_text(alert)}},
        {"type": "context",
         "elements": [{"type": "mrkdwn", "text": f"{code(alert.resource_id, 400)} · alert {code(alert.alert_id)}"}]},
    ])  # fmt: skip


def _raise_if_throttled(channel: str, exc: BaseException) -> None:
    """A 429 to a post in ``channel``: :class:`SlackError` saying so, with the wait Slack asked for."""
    if getattr(getattr(exc, "response", None), "status_code", None) == 429:
        wait = _retry_after(exc)
        raise SlackError(f"Slack throttled posts to {channel} for {wait:.0f}s (429)", retryable=True, throttled=channel,
                         retry_after_s=wait) from exc  # fmt: skip


def _not_paced(channel: str, exc: BaseException) -> None:
    """A post the outbox does not pace: its 429 (after slack-sdk's retries) is a retryable failure like any other."""


MAX_IN_CALL_WAIT_S = 30.0
"""The longest Retry-After a call waits out in itself (an edit, a look-up, a digest, a webhook's post): one asking
more fails the call, retryable, and the delivery task's backoff takes it from there."""


class _BoundedRateLimitRetry(RateLimitErrorRetryHandler):
    """slack-sdk's retry after a 429, waiting what Retry-After says (a fraction read as one, not refused) only up to
    :data:`MAX_IN_CALL_WAIT_S`: slack-sdk's own sleeps whatever it is told, a day included, on the delivery thread
    every channel's alerts wait on, and fails the call on ``2.5``."""

    def _can_retry(self, *, state: Any, request: Any, response: Any = None, error: Any = None) -> bool:
        return (response is not None and response.status_code == 429
                and _retry_after_in(response.headers) <= MAX_IN_CALL_WAIT_S)  # fmt: skip

    def prepare_for_next_attempt(self, *, state: Any, request: Any, response: Any = None, error: Any = None) -> None:
        if response is None:
            raise error
        state.next_attempt_requested = True
        time.sleep(_retry_after_in(response.headers) + random.random())  # (slack-sdk's jitter)
        state.increment_current_attempt()


def _retry_handlers(rate_limited: bool = True) -> list:
    """slack-sdk's retries: a 5xx and a lost connection twice, and a 429 twice after its Retry-After (up to
    :data:`MAX_IN_CALL_WAIT_S`) unless ``rate_limited`` is False (the alerts' posts: the outbox paces a throttled
    channel and posts the others' meanwhile, where waiting in the call would hold up every channel)."""
    return [
        *([_BoundedRateLimitRetry(max_retry_count=2)] if rate_limited else []),
        ServerErrorRetryHandler(max_retry_count=2),
        ConnectionErrorRetryHandler(max_retry_count=2),
    ]


class SlackNotifier:
    """Posts alert openings and resolutions through slack-sdk."""

    def __init__(
        self,
        *,
        token: str | None = None,
        channel: str | None = None,
        webhook_url: str | None = None,
        base_url: str | None = None,
        timeout: int = 10,
    ) -> None:
        if token:
            if not channel:
                raise ValueError("a Slack bot token needs a channel (SLACK_CHANNEL)")
            self._web: WebClient | None = WebClient(
                token=token, timeout=timeout, retry_handlers=_retry_handlers(), base_url=base_url or WebClient.BASE_URL
            )
            self._posts: WebClient | None = WebClient(
                token=token, timeout=timeout, retry_handlers=_retry_handlers(rate_limited=False),
                base_url=base_url or WebClient.BASE_URL,
            )
            """The alerts' posts (:meth:`_send`): a 429 is the outbox's to pace, per channel."""
            self._hook: WebhookClient | None = None
        elif webhook_url:
            self._web = self._posts = None
            self._hook = WebhookClient(webhook_url, timeout=timeout, retry_handlers=_retry_handlers())
        else:
            raise ValueError("Slack needs a bot token and channel, or a webhook URL")
        self.channel = channel or "webhook"
        self.routing = Routing()
        """Owner mentions and links; the worker replaces it when the rules reload."""
        self.refusing: dict[str, str] = {}
        """Channels whose last post Slack refused for good → its answer and the fix (``/healthz``, a gauge): a
        routed channel's alerts go to ``channel`` meanwhile, with a note; ``channel``'s own are posted nowhere.
        A channel leaves it at its next post Slack takes."""
        self.default_took_post = False
        """Whether ``channel`` (or the webhook) has taken a post since it last refused one for good: the outbox then
        posts again the openings it recorded refused (:meth:`detector.delivery.Outbox.deliver_pending`)."""

    @property
    def threads(self) -> bool:
        return self._web is not None

    def post(self, alert: Alert, thread: tuple[str, str] | None = None, edit_parent: bool = True,
             actions: list[dict[str, Any]] | None = None) -> tuple[str, str]:  # fmt: skip
        """Deliver one alert change; return (channel, message ts) ('' ts for a webhook).
        A resolution replies in ``thread`` and, unless ``edit_parent`` is False (a group's
        message lists others still open), edits the parent to show it resolved (keeping
        what people did about it: ``actions``)."""
        blocks = render_blocks(alert, actions, self.routing)
        return self._send(alert.channel, notification_text(alert), blocks, alert=alert, thread=thread,
                          edit_parent=edit_parent, paced=True)  # fmt: skip

    def find_posted(self, alert_id: str, channel: str, limit: int = 200, thread_ts: str | None = None,
                    withdrawal: bool = False, correction: bool = False) -> tuple[str, str] | None:  # fmt: skip
        """(channel, ts) of a message already in ``channel`` that opens ``alert_id`` (with
        ``thread_ts``: a reply in that thread that names it; ``withdrawal``: one that withdraws it,
        ``correction``: one that corrects it, not its resolution), if any: after a timeout or a
        worker's death, Slack may have posted what we never heard back about. None when it is not
        there or cannot be looked up (then the caller posts: at least once beats never)."""
        if thread_ts is None and not withdrawal and not correction:
            return self.find_openings([alert_id], channel, limit).get(alert_id)
        history = self._history(channel, thread_ts, limit)
        if history is None:
            return None
        needle = f"alert `{alert_id}`"
        mark = _WITHDRAWN_MARK if withdrawal else _CORRECTED_MARK if correction else ""
        messages: list[dict[str, Any]] = history.get("messages", [])
        for message in messages:
            blocks = json.dumps(message.get("blocks", []))
            if message.get("ts") != thread_ts and needle in blocks and mark in blocks:
                return str(history.get("channel") or channel), str(message["ts"])
        return None

    def find_openings(self, alert_ids: list[str], channel: str, limit: int = 200) -> dict[str, tuple[str, str]]:
        """Alert id → (channel, ts) of the message in ``channel`` that opens it, for those of ``alert_ids``
        there, from one read of the channel's history: a group's members in doubt after a timeout are
        looked for together (one ``conversations.history`` each was a burst Slack rate-limits, read as
        "not there", and posted again). Empty when it cannot be read."""
        history = self._history(channel, None, limit)
        if history is None:
            return {}
        found: dict[str, tuple[str, str]] = {}
        for message in history.get("messages", []):
            blocks = json.dumps(message.get("blocks", []))
            for alert_id in alert_ids:
                if alert_id not in found and f"alert `{alert_id}`" in blocks:
                    found[alert_id] = (str(history.get("channel") or channel), str(message["ts"]))
        return found

    def _history(self, channel: str, thread_ts: str | None, limit: int) -> Any:
        """The channel's latest messages (with ``thread_ts``: that thread's replies), or None
        when there is no Web API client or Slack does not answer (logged)."""
        if self._web is None:
            return None
        try:
            if thread_ts is None:
                return self._web.conversations_history(channel=channel, limit=limit)
            return self._web.conversations_replies(channel=channel, ts=thread_ts, limit=limit)
        except Exception as exc:
            log.warning("slack_history_unavailable", channel=channel, error=str(exc))
            return None

    def find_action(self, channel: str, thread_ts: str, key: str, limit: int = 1000) -> tuple[str, str] | None:
        """(channel, ts) of an action's message already in the incident's thread (its footer
        names ``key``), if any: a worker killed after posting it and before recording it must
        not post it again. None when absent or unreadable (then the caller posts)."""
        replies = self._history(channel, thread_ts, limit)
        if replies is None:
            return None
        footer = f"action {code(key)} "
        messages: list[dict[str, Any]] = replies.get("messages", [])
        for message in messages:
            texts = (o.get("text") for o in block_objects(message.get("blocks", [])))
            if message.get("ts") != thread_ts and any(isinstance(t, str) and t.startswith(footer) for t in texts):
                return str(replies.get("channel") or channel), str(message["ts"])
        return None

    def post_digest(self, digest: Digest, blocks: list[dict[str, Any]], png: bytes | None) -> tuple[str, str]:
        """Post a daily digest (and its chart of the last days in its thread); return (channel, ts)."""
        from detector.digest import digest_text

        channel, ts = self._send(digest.channel, digest_text(digest), blocks)
        if png is not None and self._web is not None and ts:
            self._web.files_upload_v2(channel=channel, thread_ts=ts, file=png, filename=f"digest-{digest.date}.png",
                                      title=f"Cost waste by day and type, the last days to {digest.date}")  # fmt: skip
        return channel, ts

    def upload_chart(self, alert: Alert, png: bytes, channel: str, thread_ts: str) -> None:
        """Attach a chart in the incident's thread (``files_upload_v2``; bot token only)."""
        if self._web is None:
            return
        from detector.charts import chart_title

        self._web.files_upload_v2(channel=channel, thread_ts=thread_ts, file=png, filename=f"{alert.alert_id}.png",
                                  title=escape(chart_title(alert)))  # fmt: skip

    def edit(self, alert: Alert, thread: tuple[str, str], actions: list[dict[str, Any]] | None = None) -> None:
        """Rewrite an incident's message with the alert's latest figures (bot token only)."""
        self.show_actions(alert, actions or [], *thread)

    def show_actions(self, alert: Alert, actions: list[dict[str, Any]], channel: str, ts: str) -> None:
        """Edit the incident's message to show who acknowledged, snoozed or marked it."""
        if self._web is None:
            return  # a webhook message cannot be edited
        try:
            blocks = render_blocks(alert, actions, self.routing)
            self._web.chat_update(channel=channel, ts=ts, text=notification_text(alert), blocks=_verbatim(blocks))
        except Exception as exc:
            raise SlackError(f"Slack update failed: {exc}", retryable=_retryable(exc)) from exc

    def show_group_actions(self, alerts: list[Alert], actions: list[dict[str, Any]], channel: str, ts: str) -> None:
        """Edit a group's message to show who acknowledged, snoozed or marked its alerts (a webhook's message
        cannot be edited: :meth:`update_action` does nothing then)."""
        self.update_action(channel, ts, group_text(alerts), render_group(alerts, actions))

    def post_action(self, channel: str, text: str, blocks: list[dict[str, Any]],
                    thread_ts: str = "") -> tuple[str, str]:  # fmt: skip
        """Post an action's message (:mod:`detector.remediation.messages`; ``text`` escaped by
        the caller) in the incident's thread, or in ``channel`` when it has none; (channel, ts)."""
        if self._web is None or not thread_ts:
            return self._send(channel, text, blocks)
        try:
            response = self._web.chat_postMessage(channel=channel, thread_ts=thread_ts, text=text, blocks=_verbatim(blocks))
        except Exception as exc:
            raise SlackError(f"Slack post failed: {exc}", retryable=_retryable(exc)) from exc
        return str(response["channel"]), str(response["ts"])

    def update_action(self, channel: str, ts: str, text: str, blocks: list[dict[str, Any]]) -> None:
        """Rewrite an action's message (its decision, its result; bot token only)."""
        if self._web is None or not ts:
            return
        try:
            self._web.chat_update(channel=channel, ts=ts, text=text, blocks=_verbatim(blocks))
        except Exception as exc:
            raise SlackError(f"Slack update failed: {exc}", retryable=_retryable(exc)) from exc

    def group_members(self, group_id: str) -> set[str]:
        """User ids in a Slack user group (``usergroups.users.list``, scope ``usergroups:read``):
        whether a click comes from an approver named by group. Raises if it cannot be read."""
        if self._web is None:
            raise SlackError("a webhook cannot read user groups: name approvers by user id", retryable=False)
        answer = self._web.usergroups_users_list(usergroup=group_id)
        users: list[Any] = answer.get("users", [])
        return {str(u) for u in users}

    def routed_to(self, channels: Collection[str]) -> None:
        """The rules reloaded, and routing names only ``channels`` now: a channel in :attr:`refusing` it names no
        longer leaves it (the fix for a misspelt channel is often routing's, and no post goes there again to clear
        it); SLACK_CHANNEL stays, and a channel still named stays until it takes a post."""
        for channel in list(self.refusing):  # (a copy: the delivery thread may change it meanwhile)
            if channel != self.channel and channel not in channels:
                self.refusing.pop(channel, None)

    def _refused_by(self, channel: str, exc: BaseException) -> str | None:
        """Slack's answer if it is that ``channel`` cannot take the bot's messages (then noted in :attr:`refusing`)."""
        refused = _error_of(exc)
        if refused not in _CHANNEL_REFUSED:
            return None
        self._refuses(channel, refused, _CHANNEL_REFUSED[refused])
        return refused

    def _refuses(self, channel: str, answer: str, fix: str) -> None:
        """``channel`` refused a post for good: said (:attr:`refusing`) until it takes one."""
        self.refusing[channel] = f"{answer}: {fix}"
        if channel == self.channel:
            self.default_took_post = False

    def _took(self, channel: str) -> None:
        """``channel`` took a post: it refuses no more."""
        self.refusing.pop(channel, None)
        if channel == self.channel:
            self.default_took_post = True

    def destination(self, alert: Alert, thread: tuple[str, str] | None = None) -> str:
        """The channel a change of ``alert`` is posted to (``thread``: its opening's, where a resolution replies):
        its routed channel, or ``channel`` while that one refuses the app (:meth:`_send`'s fallback)."""
        if self._web is None:
            return self.channel
        if alert.closes and thread is not None:
            return thread[0]
        routed = alert.channel or self.channel
        return self.channel if routed in self.refusing else routed

    def post_group(self, alerts: list[Alert]) -> tuple[str, str]:
        """One message for several openings of one type and group (untagged resources of one account)."""
        head = alerts[0]
        return self._send(head.channel, group_text(alerts), render_group(alerts), paced=True)

    def _send(self, channel: str, text: str, blocks: list[dict[str, Any]], alert: Alert | None = None,
              thread: tuple[str, str] | None = None, edit_parent: bool = True,
              paced: bool = False) -> tuple[str, str]:  # fmt: skip
        """Every message leaves through here (``text`` already escaped by the caller). ``paced``: an alert's post, a
        429 raised at once for the outbox to pace its channel (:func:`_raise_if_throttled`); the others (a digest, an
        action's message) wait out a 429 in slack-sdk's retry, as edits do: nothing paces them."""
        blocks = _verbatim(blocks)
        try:
            if self._web is None:
                assert self._hook is not None
                # No buttons: a webhook does not say its message's ts, so no click could be matched to its alerts.
                answer = self._hook.send(text=text, blocks=[b for b in blocks if b.get("type") != "actions"])
                if answer.status_code != 200:
                    if (said := answer.body.strip()) in _WEBHOOK_REFUSED:
                        self._refuses(self.channel, said, _WEBHOOK_REFUSED[said])
                    raise SlackError(
                        f"webhook answered {answer.status_code}: {answer.body}",
                        retryable=answer.status_code == 429 or answer.status_code >= 500
                        or answer.body.strip() in _CREDENTIALS_REFUSED,
                    )
                self._took(self.channel)
                return self.channel, ""
            posts = self._posts if paced else self._web
            assert posts is not None
            throttled = _raise_if_throttled if paced else _not_paced
            if alert is not None and alert.closes and thread is not None:
                channel, parent_ts = thread
                try:
                    posts.chat_postMessage(
                        channel=channel, thread_ts=parent_ts, text=text, blocks=_verbatim(render_resolution(alert))
                    )
                except Exception as exc:
                    throttled(channel, exc)
                    raise
                if edit_parent:  # the reply is the delivery: a failed edit must not send it again
                    try:
                        self._web.chat_update(channel=channel, ts=parent_ts, text=text, blocks=blocks)
                    except Exception as exc:  # noqa: BLE001 - slack-sdk's errors, timeouts...
                        log.warning("slack_parent_edit_failed", alert_id=alert.alert_id, error=str(exc)[:500])
                return channel, parent_ts
            channel = channel or self.channel
            try:
                response = posts.chat_postMessage(channel=channel, text=text, blocks=blocks)
            except Exception as exc:  # noqa: BLE001 - a routed channel that refuses: the default one instead
                throttled(channel, exc)
                refused = self._refused_by(channel, exc)
                if refused is None or channel == self.channel:
                    raise
                log.warning("slack_channel_refused", channel=channel, error=refused, posted_to=self.channel,
                            fix=_CHANNEL_REFUSED[refused])  # fmt: skip
                note = {"type": "context", "elements": [{"type": "mrkdwn", "text": clip(
                    f":warning: Meant for {escape(channel, 200)}, which Slack refused ({refused}): "
                    f"{_CHANNEL_REFUSED[refused]}. Posted here meanwhile.", MAX_TEXT)}]}  # fmt: skip
                at = 1 if blocks and blocks[0].get("type") == "header" else 0  # under the headline
                try:
                    response = posts.chat_postMessage(channel=self.channel, text=text,
                                                      blocks=_verbatim(fit([*blocks[:at], note, *blocks[at:]])))  # fmt: skip
                except Exception as fallback:
                    throttled(self.channel, fallback)
                    self._refused_by(self.channel, fallback)
                    raise
                self._took(self.channel)
            else:
                self._took(channel)
            return str(response["channel"]), str(response["ts"])
        except SlackError:
            raise
        except Exception as exc:  # slack-sdk raises SlackApiError, URLError, timeouts...
            status = getattr(getattr(exc, "response", None), "status_code", None)
            if _credentials_refused(exc):
                raise SlackError(f"Slack refused the token ({exc.response.get('error')}): every post waits, kept, until "  # type: ignore[attr-defined]
                                 "SLACK_BOT_TOKEN is a valid one (then restart the worker)", retryable=True) from exc  # fmt: skip
            retryable = status is None or status == 429 or status >= 500
            timed_out = isinstance(exc, TimeoutError) or "timed out" in str(exc)
            raise SlackError(f"Slack delivery failed: {exc}", retryable=retryable, maybe_posted=timed_out) from exc

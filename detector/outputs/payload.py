"""An alert as plain fields, for every output that is not Slack: the webhook's JSON body, the
Alertmanager annotations, the email. Values from events are capped in length here (a tag
of megabytes stays a few kilobytes); each output escapes them for its own format."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from detector.alerts import Alert, link_fields
from detector.rules import Routing
from detector.units import rfc3339

__all__ = ["MAX_TAGS", "MAX_VALUE", "alert_fields", "cap", "link_values", "links"]

MAX_VALUE = 1024
"""Characters kept of one value from an event (a tag, an id, a detail)."""
MAX_TAGS = 50
"""Tags carried per alert (in key order)."""


def cap(value: object, limit: int = MAX_VALUE) -> str:
    """``value`` as text of at most ``limit`` characters (an ellipsis marks a cut)."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def link_values(alert: Alert, routing: Routing) -> dict[str, str]:
    """The link template fields (``rules/routing.yaml`` ``links``), URL-quoted."""
    return {k: quote(cap(v), safe="") for k, v in link_fields(alert, routing.owner_tag).items()}


def links(alert: Alert, routing: Routing) -> list[dict[str, str]]:
    """The configured links that apply to this alert, filled in."""
    quoted = link_values(alert, routing)
    return [{"name": link.name, "url": link.url.format_map(quoted)} for link in routing.links
            if not link.types or alert.type in link.types]  # fmt: skip


def _corrects(alert: Alert) -> dict[str, Any] | None:
    """What the resolution a correction replaces said (its time and dollars); None for any other change."""
    was = alert.corrects
    if was is None:
        return None
    return {"resolved_at": rfc3339(was[0]), "dollars_so_far": round(was[1], 2)}


def alert_fields(alert: Alert, routing: Routing) -> dict[str, Any]:
    """What a person or a program needs to act on one alert change."""
    tags = dict(sorted(alert.tags.items())[:MAX_TAGS])
    return {
        "id": alert.alert_id,
        "change": alert.change,
        "status": alert.status,
        "type": alert.type,
        "title": alert.title,
        "rule": alert.rule,
        "severity": alert.severity,
        "resource": {
            "id": cap(alert.resource_id), "type": cap(alert.resource_type), "account": cap(alert.account),
            "region": cap(alert.region), "instance_type": cap(alert.instance_type),
        },  # fmt: skip
        "team": cap(alert.tags.get(routing.by_tag, "")),
        "owner": cap(alert.tags.get(routing.owner_tag, "")),
        "tags": {cap(k, 128): cap(v) for k, v in tags.items()},
        "dollars_so_far": round(alert.waste_usd, 2),
        "dollars_are": alert.dollars,
        "usd_per_hour": round(alert.usd_per_hour, 4),
        "episode_start": rfc3339(alert.episode_start),
        "fired_at": rfc3339(alert.fired_at),
        "resolved_at": rfc3339(alert.resolved_at) if alert.resolved_at is not None else None,
        "withdrawn": alert.withdrawn,
        "corrected": alert.corrected,
        "corrects": _corrects(alert),
        "summary": cap(alert.summary(), 4 * MAX_VALUE),
        "suggestion": cap(alert.suggestion, 4 * MAX_VALUE),
        "facts": [[cap(k, 128), cap(v)] for k, v in alert.facts[:20]],
        "links": links(alert, routing),
    }

"""Prometheus Alertmanager: ``POST {url}/api/v2/alerts``, so teams route burnwatch through the
Alertmanager they run (PagerDuty, Opsgenie, email, Teams...).

Alertmanager identifies an alert by its labels, so posting one twice is harmless (it
merges them): this output dedupes, and a send a kill cut off is sent again. Like
Prometheus, the outbox posts every firing alert again each ``resend_s`` with ``endsAt`` =
now + ``ends_after_s`` (default 4 × ``resend_s``): Alertmanager keeps it open while burnwatch
keeps saying so, and resolves it by itself if the worker holding it stops for longer
(``resolve_timeout`` never applies, since ``endsAt`` is always set). The resolution is one
post with ``endsAt`` = now. Labels: ``alertname`` (``Burnwatch`` + the type in CamelCase),
``severity``, ``team``, ``resource_id``, ``rule``, ``type``, ``account``, ``region``,
``burnwatch_alert_id`` (empty ones left out, as Prometheus does); annotations: ``summary``,
``dollars``, ``usd_per_hour``, ``suggestion``, ``owner``, ``episode_start``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from detector.alerts import Alert
from detector.outputs.base import secret
from detector.outputs.config import STRAY_PERCENT, AlertmanagerSpec
from detector.outputs.http import post
from detector.outputs.payload import cap, link_values, links
from detector.rules import Routing
from detector.units import rfc3339

__all__ = ["AlertmanagerOutput", "alertname", "takes_uri"]

MAX_LABEL = 256
"""Characters kept of a label value from an event (labels are Alertmanager's index)."""


def alertname(alert_type: str) -> str:
    """``idle_gpu`` → ``BurnwatchIdleGpu``."""
    return "Burnwatch" + "".join(part.capitalize() for part in alert_type.split("_") if part.isalnum())


_HOST = re.compile(r"[A-Za-z0-9\-_.~!$&'()*+,;=\[\]<>\"\x80-\U0010ffff]*")


def takes_uri(url: str) -> bool:
    """Whether Alertmanager takes ``url`` as a ``generatorURL`` (Go's ``url.Parse``, checked
    against Alertmanager 0.25; where unsure, no): no control character, a host of the
    characters Go allows (no ``%``, space or brace: a quoted value there), a numeric port,
    no ``%`` that starts no escape in the path or fragment (the query is not checked)."""
    if re.search(r"[\x00-\x1f\x7f]", url):
        return False
    parts = urlsplit(url)
    authority = parts.netloc.rpartition("@")[2]
    if authority.startswith("["):  # an IPv6 literal: [::1]:9093
        _, _, port = authority.partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = authority.partition(":")
        if not _HOST.fullmatch(host):
            return False
    if port and not (port.isascii() and port.isdigit()):
        return False
    return not STRAY_PERCENT.search(parts.path + parts.fragment)


class AlertmanagerOutput:
    dedupes = True

    def __init__(self, name: str, spec: AlertmanagerSpec, routing: Callable[[], Routing]) -> None:
        self.name = name
        self.spec = spec
        self.resend_s = spec.resend_s
        self.ends_after_s = spec.ends_after_s or 4 * spec.resend_s
        self._routing = routing
        self._clock = time.time
        self.url = spec.url.rstrip("/") + "/api/v2/alerts"

    def alert(self, alert: Alert, now: float) -> dict[str, Any]:
        """The ``postableAlert`` of Alertmanager's OpenAPI spec for one alert's current state."""
        routing = self._routing()
        labels = {
            "alertname": alertname(alert.type), "severity": alert.severity,
            "team": alert.tags.get(routing.by_tag, ""), "resource_id": alert.resource_id, "rule": alert.rule,
            "type": alert.type, "account": alert.account, "region": alert.region, "burnwatch_alert_id": alert.alert_id,
        }  # fmt: skip
        annotations = {
            "summary": cap(alert.summary(), 4096), "dollars": f"{alert.waste_usd:.2f}",
            "usd_per_hour": f"{alert.usd_per_hour:.4f}", "suggestion": cap(alert.suggestion, 4096),
            "owner": alert.tags.get(routing.owner_tag, ""), "episode_start": rfc3339(alert.episode_start),
        }  # fmt: skip
        starts = min(alert.fired_at, now)
        ends = now if alert.closes else now + self.ends_after_s
        body: dict[str, Any] = {
            "labels": {k: cap(v, MAX_LABEL) for k, v in labels.items() if v},
            "annotations": {k: cap(v, 4096) for k, v in annotations.items() if v},
            "startsAt": rfc3339(starts),
            "endsAt": rfc3339(max(ends, starts)),
        }
        generator = self._generator_url(alert, routing)
        if generator:
            body["generatorURL"] = generator
        return body

    def _generator_url(self, alert: Alert, routing: Routing) -> str:
        """Left out where Alertmanager would refuse it: it answers 422 to the whole post, so one
        alert's odd ``region`` in a link's host name lost that alert, and every re-send of all."""
        if self.spec.generator_url:
            try:
                url = self.spec.generator_url.format_map(link_values(alert, routing))
            except (KeyError, ValueError, IndexError):
                return ""
        else:
            found = links(alert, routing)
            url = found[0]["url"] if found else ""
        return url if takes_uri(url) else ""

    def send(self, alert: Alert) -> str:
        return self._post([alert])

    def refresh(self, alerts: list[Alert]) -> None:
        for start in range(0, len(alerts), 500):
            self._post(alerts[start : start + 500])

    def _post(self, alerts: list[Alert]) -> str:
        now = self._clock()
        body = json.dumps([self.alert(a, now) for a in alerts], ensure_ascii=True).encode()
        headers = {"Content-Type": "application/json"}
        token = secret(self.spec.bearer_token_env, "Alertmanager's bearer token", header=True)
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        status = post(f"Alertmanager {self.name}", self.url, body, headers, self.spec.timeout_s)
        return f"HTTP {status}"

"""From findings to alerts: ids, lifecycle, and what a person reads.

Detection and notification stay apart: detectors emit findings, the
:class:`AlertManager` turns them into alert records (one per episode, with a
deterministic id), and only :mod:`detector.delivery` talks to Slack.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import msgspec

from detector.detectors import REGISTRY, Finding
from detector.rules import RuleSet
from detector.units import format_duration, rfc3339

__all__ = ["Alert", "AlertManager", "alert_id", "from_finding"]

def alert_id(rule: str, resource_id: str, episode_start: float) -> str:
    """Same rule, resource and episode start → same id, on every replay and every worker."""
    digest = hashlib.blake2b(f"{rule}\x1f{resource_id}\x1f{episode_start:.3f}".encode(), digest_size=8)
    return digest.hexdigest()


class Alert(msgspec.Struct, kw_only=True):
    """One episode of one problem on one resource, as stored and as shown."""

    alert_id: str
    type: str
    rule: str
    resource_id: str
    status: Literal["firing", "resolved"]
    change: Literal["fired", "updated", "resolved"]
    """What this record says happened: people hear of openings and resolutions, not cost updates."""
    severity: str
    episode_start: float
    fired_at: float
    updated_at: float
    resolved_at: float | None = None
    waste_usd: float = 0.0
    usd_per_hour: float = 0.0
    resource_type: str = ""
    account: str = ""
    region: str = ""
    instance_type: str = ""
    tags: dict[str, str] = {}
    details: dict[str, Any] = {}
    silenced: str = ""
    """The reason of the silence that covers it: recorded, not posted."""
    channel: str = ""
    """Where it is posted ('' = the notifier's default channel)."""
    key: str = ""
    """The engine key whose state made it (not stored)."""
    partition: int = -1
    """The input partition of that key: the worker holding it delivers the alert (-1: unknown,
    delivered by the holder of partition 0)."""

    @property
    def title(self) -> str:
        cls = REGISTRY.get(self.type)
        return cls.title if cls is not None else self.type.replace("_", " ").capitalize()

    @property
    def suggestion(self) -> str:
        cls = REGISTRY.get(self.type)
        return cls.suggestion if cls is not None else ""

    @property
    def dollars(self) -> str:
        """What the dollars are, in words ('' when the alert is a forecast, not money gone)."""
        cls = REGISTRY.get(self.type)
        return cls.dollars if cls is not None else "wasted"

    @property
    def facts(self) -> list[tuple[str, str]]:
        cls = REGISTRY.get(self.type)
        return cls.facts(self.details) if cls is not None else []

    @property
    def group(self) -> tuple[str, str] | None:
        """(what, value) openings of this type are grouped by, e.g. ("team", "nlp"); None: never."""
        cls = REGISTRY.get(self.type)
        by = cls.group_by if cls is not None else None
        if by is None:
            return None
        return by, (self.account if by == "account" else self.tags.get(by, ""))

    @property
    def duration_s(self) -> float:
        end = self.resolved_at if self.resolved_at is not None else self.updated_at
        return max(0.0, end - self.episode_start)

    def summary(self) -> str:
        """One line for logs, the console and Slack's notification text."""
        who = self.tags.get("team") or "no team tag"
        facts = "; ".join(f"{k}: {v}" for k, v in self.facts[:2]).replace("`", "")
        if self.status == "resolved":
            reason = str(self.details.get("reason", "")).replace("_", " ")
            money = f": ${self.waste_usd:,.2f} {self.dollars}" if self.dollars else ""
            return (
                f"RESOLVED {self.title} on {self.resource_id} ({who}) after {format_duration(self.duration_s)}"
                + money + (f" ({reason})" if reason else "")
            )
        money = f": ${self.waste_usd:,.2f} so far, ${self.usd_per_hour:,.2f}/h" if self.dollars else f" ({facts})"
        since = format_duration(self.duration_s)
        return f"{self.severity.upper()} {self.title} on {self.resource_id} ({who}) for {since}" + money

    def to_json(self) -> dict[str, Any]:
        """The record ``backtest --json`` prints: times in RFC 3339 event time."""
        return {
            "alert_id": self.alert_id,
            "type": self.type,
            "rule": self.rule,
            "resource_id": self.resource_id,
            "status": self.status,
            "severity": self.severity,
            "episode_start": rfc3339(self.episode_start),
            "fired_at": rfc3339(self.fired_at),
            "resolved_at": rfc3339(self.resolved_at) if self.resolved_at is not None else None,
            "waste_usd": round(self.waste_usd, 2),
            "usd_per_hour": round(self.usd_per_hour, 4),
            "resource_type": self.resource_type,
            "account": self.account,
            "region": self.region,
            "instance_type": self.instance_type,
            "tags": self.tags,
            "details": self.details,
            "silenced": self.silenced or None,
            "channel": self.channel or None,
        }


def from_finding(finding: Finding) -> Alert:
    res = finding.resource
    resolved = finding.action == "resolve"
    return Alert(
        alert_id=alert_id(finding.rule, finding.resource_id, finding.episode_start),
        type=finding.type,
        rule=finding.rule,
        resource_id=finding.resource_id,
        status="resolved" if resolved else "firing",
        change={"fire": "fired", "update": "updated", "resolve": "resolved"}[finding.action],  # type: ignore[arg-type]
        severity=finding.severity,
        episode_start=finding.episode_start,
        fired_at=finding.fired_at,
        updated_at=finding.at,
        resolved_at=finding.at if resolved else None,
        waste_usd=finding.waste_usd,
        usd_per_hour=finding.usd_per_hour,
        resource_type=res.resource_type if res else "",
        account=res.account if res else "",
        region=res.region if res else "",
        instance_type=res.instance_type if res else "",
        tags=dict(res.tags) if res else {},
        details=dict(finding.details),
        key=finding.key or finding.resource_id,
    )


class AlertManager:
    """Turns findings into alert state changes, once each.

    It remembers which alert ids fired and resolved, seeded from the store after a
    restart, so a finding re-derived from re-read input does not open or close its
    alert twice. Memory is bounded: ids whose episode started more than
    ``horizon_s`` of event time before the newest one are forgotten (input that old
    is not re-read).
    """

    def __init__(
        self,
        known: Mapping[str, tuple[float, bool]] | None = None,
        horizon_s: float = 7 * 86_400.0,
        ruleset: RuleSet | None = None,
        realert: tuple[Mapping[tuple[str, str], float], Mapping[str, str]] | None = None,
        open_incidents: Mapping[str, str] | None = None,
    ) -> None:
        self._seen: dict[str, tuple[float, bool]] = dict(known or {})
        """alert id → (episode start, resolved)."""
        last, quiet = realert or ({}, {})
        self._last_posted: dict[tuple[str, str], float] = dict(last)
        """(rule, resource) → fire time of its latest posted alert, for ``realert``."""
        self._quiet: dict[str, str] = dict(quiet)
        """Alert id → why its opening was held back (realert, or joined to another incident):
        its later changes are held back too."""
        self._open: dict[str, str] = dict(open_incidents or {})
        """Resource → a rule incident open on it, which an anomaly on the resource joins."""
        self.ruleset = ruleset
        """For its silences; replaced on hot reload."""
        self._horizon_s = horizon_s
        self._newest = max((start for start, _ in self._seen.values()), default=0.0)
        self._prune_at = len(self._seen) + 10_000

    def handle(self, findings: Iterable[Finding]) -> list[Alert]:
        """Return the alert records to store, in order."""
        out = []
        seen = self._seen
        ruleset = self.ruleset
        silence_for = ruleset.silence_for if ruleset is not None and ruleset.silences else None
        for finding in findings:
            alert = from_finding(finding)
            if ruleset is not None:
                alert.channel = ruleset.channel_for(alert.rule, alert.tags, alert.severity)
            if silence_for is not None and finding.resource is not None:
                # Judged at the episode's fire time, so its opening and closing are silenced alike.
                alert.silenced = silence_for(finding.rule, finding.type, finding.resource, finding.fired_at) or ""
            known = seen.get(alert.alert_id)
            if finding.action == "fire":
                if known is not None:
                    continue
                seen[alert.alert_id] = (alert.episode_start, False)
                if alert.type == "anomaly" and alert.resource_id in self._open and not alert.silenced:
                    joined = self._open[alert.resource_id]
                    alert.silenced = self._quiet[alert.alert_id] = f"joined incident {joined}: a rule's incident is open here"
                    alert.details = {**alert.details, "joined_alert_id": joined}
                elif _is_behaviour(alert.type):
                    self._open[alert.resource_id] = alert.alert_id
                if not alert.silenced and ruleset is not None:
                    self._apply_realert(alert, ruleset.realert_for(alert.rule))
            elif finding.action == "resolve":
                if known is not None and known[1]:
                    continue
                seen[alert.alert_id] = (alert.episode_start, True)
                if self._open.get(alert.resource_id) == alert.alert_id:
                    del self._open[alert.resource_id]
            if not alert.silenced and alert.alert_id in self._quiet:
                alert.silenced = self._quiet[alert.alert_id]
            self._newest = max(self._newest, alert.episode_start)
            out.append(alert)
        if len(seen) > self._prune_at:
            horizon = self._newest - self._horizon_s
            self._seen = {k: v for k, v in seen.items() if v[0] >= horizon}
            self._quiet = {k: v for k, v in self._quiet.items() if k in self._seen}
            self._last_posted = {k: t for k, t in self._last_posted.items() if t >= horizon}
            self._prune_at = len(self._seen) + 10_000
        return out

    def _apply_realert(self, alert: Alert, realert_s: float) -> None:
        key = (alert.rule, alert.resource_id)
        last = self._last_posted.get(key)
        if realert_s and last is not None and alert.fired_at - last < realert_s:
            alert.silenced = self._quiet[alert.alert_id] = _held_reason(alert.rule)
            alert.details = {**alert.details, "realert_after": rfc3339(last + realert_s)}
        else:
            self._last_posted[key] = alert.fired_at


def _is_behaviour(rule_type: str) -> bool:
    cls = REGISTRY.get(rule_type)
    return cls is not None and cls.behaviour and rule_type != "anomaly"


def _held_reason(rule: str) -> str:
    return f"realert: rule {rule} alerted on this resource within its realert interval"

"""From findings to alerts: ids, lifecycle, and what a person reads.

Detection and notification stay apart: detectors emit findings, the
:class:`AlertManager` turns them into alert records (one per episode, with a
deterministic id), and only :mod:`detector.delivery` talks to Slack.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, Literal

import msgspec

from detector.detectors import REGISTRY, Finding
from detector.detectors.episode import CORRECTED, WITHDRAWN
from detector.rules import RuleSet
from detector.suppression.hold import Hold
from detector.suppression.memory import HORIZON_S, AlertMemory
from detector.suppression.stages import Dedup, Inhibit, Realert, Route, Silencing
from detector.tag_names import TagNames
from detector.units import format_duration, money, rfc3339

__all__ = ["Alert", "AlertManager", "AlertMemory", "alert_id", "burning", "burning_sql", "from_finding", "link_fields"]

Change = Literal["fired", "updated", "resolved", "withdrawn", "corrected"]
"""What a change of an alert did; ``withdrawn``: an alert already resolved was taken back (a stop read
after the sample that resolved it, dated before the one that fired it: it never stood). A fire taken
back while open is ``resolved``, :attr:`Alert.withdrawn` saying so. ``corrected``: an alert already
resolved ended earlier, with fewer dollars (a stop read after the sample that resolved it, dated
within a gap in the samples before: :attr:`Alert.corrected`)."""
_CHANGES: dict[str, Change] = {"fire": "fired", "update": "updated", "resolve": "resolved"}
"""A finding's action, said of the alert it changes."""


def burning(type_: str, details: dict[str, Any]) -> bool:
    """Whether an open alert of ``type_`` with ``details`` still spends its dollars per hour
    (its detector's ``burning``; an unknown type: True, as before)."""
    cls = REGISTRY.get(type_)
    how = cls.burning if cls is not None else True
    return bool(details.get(how)) if isinstance(how, str) else how


def burning_sql() -> str:
    """The same decision as a ClickHouse expression on ``alerts`` (``type``, ``details``), for
    sums over the store: ``1`` when every type burns."""
    cases = []
    for type_, cls in sorted(REGISTRY.items()):
        how = cls.burning
        if how is True:
            continue
        assert type_.isidentifier() and (how is False or how.isidentifier()), (type_, how)
        cases += [f"type = '{type_}'", "0" if how is False else f"JSONExtractBool(details, '{how}')"]
    return f"multiIf({', '.join(cases)}, 1)" if cases else "1"



def alert_id(rule: str, resource_id: str, episode_start: float) -> str:
    """Same rule, resource and episode start → same id, on every replay and every worker."""
    digest = hashlib.blake2b(f"{rule}\x1f{resource_id}\x1f{episode_start:.3f}".encode(), digest_size=8)
    return digest.hexdigest()


def link_fields(alert: Alert, owner_tag: str) -> dict[str, str]:
    """The fields a link template (``rules/routing.yaml`` ``links``, :data:`detector.rules.LINK_FIELDS`)
    is filled from, unquoted: Slack's links and the other outputs' use the same."""
    return {
        "resource_id": alert.resource_id, "region": alert.region, "account": alert.account, "type": alert.type,
        "rule": alert.rule, "alert_id": alert.alert_id, "instance_type": alert.instance_type,
        "team": alert.tags.get("team", ""), "owner": alert.tags.get(owner_tag, ""),
        "project": alert.tags.get("project", ""), "episode_start": rfc3339(alert.episode_start),
        "fired_at": rfc3339(alert.fired_at),
    }  # fmt: skip


class Alert(msgspec.Struct, kw_only=True):
    """One episode of one problem on one resource, as stored and as shown."""

    alert_id: str
    type: str
    rule: str
    resource_id: str
    status: Literal["firing", "resolved"]
    change: Change
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
    held: Hold | None = None
    """Why it is recorded and not posted (which stage, on whose account); None: posted."""
    silenced: str = ""
    """The hold's reason, for people ('' = posted): stored in ``alerts.silenced``."""
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
        """The next step, in our words (a pod's alert: what kind of command; the commands are in details)."""
        cls = REGISTRY.get(self.type)
        return cls.suggest(self.details) if cls is not None else ""

    @property
    def dollars(self) -> str:
        """What the dollars are, in words ('' when the alert is a forecast, not money gone)."""
        cls = REGISTRY.get(self.type)
        return cls.dollars if cls is not None else "wasted"

    @property
    def withdrawn(self) -> bool:
        """Resolved by taking its fire back (:data:`~detector.detectors.episode.WITHDRAWN`): the resource
        had stopped before the threshold was met, read late. It never stood and counts no dollars."""
        return self.status == "resolved" and self.details.get("reason") == WITHDRAWN

    @property
    def corrected(self) -> bool:
        """Resolved by a resolution that corrects the one made before (:data:`~detector.detectors.episode.CORRECTED`):
        a stop read late, dated within a gap in the samples before that resolution, ended the episode
        there, with the dollars it says; the ones it replaces are :attr:`corrects`."""
        return self.status == "resolved" and self.details.get(CORRECTED) is True

    @property
    def corrects(self) -> tuple[float, float] | None:
        """(resolved at, dollars) of the resolution a correction replaces, as its details say; None when
        it is no correction (or they are missing)."""
        if not self.corrected:
            return None
        try:
            return float(self.details["was_resolved_at"]), float(self.details["was_usd"])
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def closes(self) -> bool:
        """Whether this change closes the alert: its resolution, or the withdrawal or correction after one
        (told in the opening's thread, an output's alert ended, with the figures it says)."""
        return self.change in ("resolved", "withdrawn", "corrected")

    @property
    def told(self) -> tuple[Change, ...]:
        """The changes a message of this record tells: its own, and where a resolution says withdrawn or
        corrected (the alert taken back or corrected by then), the withdrawal or correction after a
        resolution too, which is not told again."""
        if self.change == "resolved" and self.withdrawn:
            return ("resolved", "withdrawn")
        if self.change == "resolved" and self.corrected:
            return ("resolved", "corrected")
        return (self.change,)

    @property
    def burning(self) -> bool:
        """Whether, while open, its ``usd_per_hour`` is still being spent (False: the money
        is sunk, e.g. a failed run that has ended); see ``DetectorBase.burning``."""
        return burning(self.type, self.details)

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
        if self.withdrawn:
            return (f"WITHDRAWN {self.title} on {self.resource_id} ({who}): it had stopped after "
                    f"{format_duration(self.duration_s)}, short of the rule's threshold (the stop read late); "
                    "nothing counted")  # fmt: skip
        if self.corrected:
            was = self.corrects if self.change == "corrected" else None  # (a resolution said nothing else before)
            spent = f": {money(self.waste_usd, exact=True)} {self.dollars}" if self.dollars else ""
            return (f"CORRECTED {self.title} on {self.resource_id} ({who}): it had stopped at "
                    f"{rfc3339(self.resolved_at or self.updated_at)}, read late; ended after "
                    f"{format_duration(self.duration_s)}" + spent
                    + (f" (not {money(was[1], exact=True)})" if spent and was is not None else ""))  # fmt: skip
        if self.status == "resolved":
            reason = str(self.details.get("reason", "")).replace("_", " ")
            spent = f": {money(self.waste_usd, exact=True)} {self.dollars}" if self.dollars else ""
            return (
                f"RESOLVED {self.title} on {self.resource_id} ({who}) after {format_duration(self.duration_s)}"
                + spent + (f" ({reason})" if reason else "")
            )
        spent = (f": {money(self.waste_usd, exact=True)} so far, {money(self.usd_per_hour, exact=True)}/h" if self.dollars
                 else f" ({facts})")  # fmt: skip
        since = format_duration(self.duration_s)
        return f"{self.severity.upper()} {self.title} on {self.resource_id} ({who}) for {since}" + spent

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
            "held": self.held.to_json() if self.held is not None else None,
            "channel": self.channel or None,
        }


def from_finding(finding: Finding, names: TagNames | None = None) -> Alert:
    """The alert change a finding makes; ``names``: its tags gain the spelling of the keys the rules name (a run's
    tags are its events' own, as written, where a resource's are completed by the engine)."""
    res = finding.resource
    resolved = finding.action == "resolve"
    return Alert(
        alert_id=alert_id(finding.rule, finding.resource_id, finding.episode_start),
        type=finding.type,
        rule=finding.rule,
        resource_id=finding.resource_id,
        status="resolved" if resolved else "firing",
        change=_CHANGES[finding.action],
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
        tags=(names.complete(res.tags) if names is not None else dict(res.tags)) if res else {},
        details=dict(finding.details),
        key=finding.key or finding.resource_id,
    )


class AlertManager:
    """Turns findings into alert state changes, once each, through the stages of
    :mod:`detector.suppression`: dedup → route → inhibit → silence → realert.

    What the stages remember is an :class:`AlertMemory` (``AlertMemory.load(store.memory)`` after a
    restart). Memory is bounded: alerts whose episode started more than ``horizon_s`` of event
    time before the newest one are forgotten (input that old is not re-read), checked each
    time ``prune_every`` more alerts are remembered.
    """

    def __init__(
        self,
        memory: AlertMemory | None = None,
        ruleset: RuleSet | None = None,
        *,
        horizon_s: float = HORIZON_S,
        prune_every: int = 10_000,
    ) -> None:
        memory = memory or AlertMemory()
        self._dedup = Dedup(memory.seen)
        self._inhibit = Inhibit(memory.open_incidents)
        self._realert = Realert(memory.last_posted)
        self._held: dict[str, Hold] = dict(memory.held)
        """Alert id → why its opening was held back: its later changes are held back too."""
        self.ruleset = ruleset
        """For routing, silences and realert intervals; replaced on hot reload."""
        self._horizon_s = horizon_s
        self._prune_every = prune_every
        self._newest = max((start for start, _ in memory.seen.values()), default=0.0)
        self._prune_at = len(memory.seen) + prune_every

    def handle(self, findings: Iterable[Finding]) -> list[Alert]:
        """Return the alert records to store, in order; held-back ones carry their :class:`Hold`."""
        names = self.ruleset.tag_names if self.ruleset is not None else None
        return self.take(from_finding(finding, names) for finding in findings)

    def take(self, changes: Iterable[Alert]) -> list[Alert]:
        """:meth:`handle` for alert changes made otherwise than from a finding (:mod:`detector.orphaned_alerts`):
        each is changed in place (its route, its hold), those let through returned in order."""
        out = []
        ruleset = self.ruleset
        silences = ruleset.silences if ruleset is not None else ()
        for alert in changes:
            first_sight = alert.alert_id not in self._dedup.seen
            if not self._dedup.admit(alert):
                continue
            if ruleset is not None:
                Route.apply(alert, ruleset)
            hold: Hold | None
            if alert.change == "fired":
                realert_s = ruleset.realert_for(alert.rule) if ruleset is not None else 0.0
                hold = (self._inhibit.hold(alert) or Silencing.hold(alert, silences)
                        or self._realert.hold(alert, realert_s))  # fmt: skip
                if hold is not None:
                    self._held[alert.alert_id] = hold
            else:
                if alert.closes:
                    self._inhibit.resolved(alert)
                    if alert.withdrawn:
                        self._realert.withdrawn(alert)
                hold = self._held.get(alert.alert_id)
                if hold is None and first_sight:  # its opening came before this manager's memory
                    hold = Silencing.hold(alert, silences)
            if hold is not None:
                alert.held, alert.silenced = hold, hold.reason
            self._newest = max(self._newest, alert.episode_start)
            out.append(alert)
        if len(self._dedup.seen) > self._prune_at:
            self._prune()
        return out

    def _prune(self) -> None:
        horizon = self._newest - self._horizon_s
        self._dedup.prune(horizon)
        self._held = {k: v for k, v in self._held.items() if k in self._dedup.seen}
        self._realert.prune(horizon)
        self._prune_at = len(self._dedup.seen) + self._prune_every

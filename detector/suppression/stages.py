"""The alert manager's stages, each one small unit with its own state (see the package's
docstring for the order and why). A stage that holds an opening back returns a
:class:`Hold`; the stages after it do not see that opening."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import IntEnum
from typing import TYPE_CHECKING

from detector.detectors import REGISTRY
from detector.detectors.base import ResourceInfo
from detector.suppression.hold import Hold
from detector.suppression.silence import Silence
from detector.units import rfc3339

if TYPE_CHECKING:
    from detector.alerts import Alert
    from detector.rules import RuleSet

__all__ = ["Dedup", "Inhibit", "Realert", "Route", "Silencing", "Stage"]


class Stage(IntEnum):
    """How far an alert has gone, as :class:`Dedup` remembers it (0 and 1 read as the resolved flag
    that memory held before)."""

    OPEN = 0
    RESOLVED = 1
    WITHDRAWN = 2
    """Resolved by taking its fire back (:attr:`~detector.alerts.Alert.withdrawn`): nothing follows."""
    CORRECTED = 3
    """Resolved, then corrected (:attr:`~detector.alerts.Alert.corrected`): nothing follows."""


class Dedup:
    """Lets each opening and each resolution through once, and no update after the resolution:
    input re-read after a restart or a rebalance re-derives the same findings, with the same
    alert ids. A worker killed between recording a batch's alert changes and saving the state
    that reflects them detects the batch again from the state before it; an update of an alert
    it resolved, let through, would be recorded after the resolution and read as firing.

    One change may follow a resolution, once: its withdrawal, where a stop read after the sample
    that resolved the episode was dated before the one that fired it (live, the usage topic read
    behind): it goes on as change ``withdrawn``; or its correction, where that stop was dated after
    the fire, within a gap in the samples before the resolution: it goes on as change ``corrected``.
    A correction of an alert never seen corrects nothing; one whose resolution was never let through
    is that resolution, with the corrected figures."""

    def __init__(self, seen: Mapping[str, tuple[float, int]] | None = None) -> None:
        self.seen: dict[str, tuple[float, int]] = dict(seen or {})
        """Alert id → (episode start, :class:`Stage`)."""

    def admit(self, alert: Alert) -> bool:
        known = self.seen.get(alert.alert_id)
        if alert.change == "fired":
            if known is not None:
                return False
            self.seen[alert.alert_id] = (alert.episode_start, Stage.OPEN)
        elif known is None and alert.corrected:
            return False  # no resolution known to correct (forgotten past the horizon, or never made)
        elif known is not None and known[1]:  # resolved: an episode's id never opens again
            if known[1] != Stage.RESOLVED or alert.change != "resolved" or not (alert.withdrawn or alert.corrected):
                return False
            alert.change = "withdrawn" if alert.withdrawn else "corrected"  # taken back, or corrected, after it
            self.seen[alert.alert_id] = (alert.episode_start, Stage.WITHDRAWN if alert.withdrawn else Stage.CORRECTED)
        elif alert.change == "resolved":
            stage = Stage.WITHDRAWN if alert.withdrawn else Stage.CORRECTED if alert.corrected else Stage.RESOLVED
            self.seen[alert.alert_id] = (alert.episode_start, stage)
        return True

    def prune(self, horizon: float) -> None:
        """Forget episodes that started before ``horizon`` (event time) and have closed: input that old is not
        re-read. An open one is kept however long it lasts (an idle GPU forgotten for weeks): forgotten, its
        resolution was taken for a first sight (its opening's hold not known, a withdrawal after it lost) and
        a re-read of its opening let through again. Open episodes are bounded by the live resources: one
        whose resource vanished is resolved past the state TTL (``went_silent``)."""
        self.seen = {k: v for k, v in self.seen.items() if v[0] >= horizon or v[1] == Stage.OPEN}


class Route:
    """Picks the Slack channel from the rule's route and ``routing.yaml``."""

    @staticmethod
    def apply(alert: Alert, ruleset: RuleSet) -> None:
        alert.channel = ruleset.channel_for(alert.rule, alert.tags, alert.severity)


class Inhibit:
    """An anomaly that opens on a resource where a rule's incident is open joins that incident
    instead of paging: the rule's alert already says what is wrong. (Alertmanager's
    inhibition, with rule incidents as the source and anomalies as the target.)"""

    def __init__(self, open_incidents: Mapping[str, str] | None = None) -> None:
        self.open: dict[str, str] = dict(open_incidents or {})
        """Resource → the rule incident open on it."""

    def hold(self, alert: Alert) -> Hold | None:
        """Judge an opening; remember a rule incident's opening."""
        if alert.type == "anomaly":
            joined = self.open.get(alert.resource_id)
            if joined is None:
                return None
            alert.details = {**alert.details, "joined_alert_id": joined}
            return Hold(kind="inhibited", by=joined, reason=f"joined incident {joined}: a rule's incident is open here")
        if _is_behaviour(alert.type):
            self.open[alert.resource_id] = alert.alert_id
        return None

    def resolved(self, alert: Alert) -> None:
        if self.open.get(alert.resource_id) == alert.alert_id:
            del self.open[alert.resource_id]


class Silencing:
    """Holds back an opening that a silence covers at its event time (its ``fired_at``)."""

    @staticmethod
    def hold(alert: Alert, silences: Sequence[Silence]) -> Hold | None:
        if not silences:
            return None
        resource = ResourceInfo(
            resource_id=alert.resource_id, resource_type=alert.resource_type, account=alert.account,
            region=alert.region, instance_type=alert.instance_type, tags=alert.tags,
        )  # fmt: skip
        for silence in silences:
            if silence.covers(at=alert.fired_at, rule=alert.rule, rule_type=alert.type, resource=resource,
                              alert_id=alert.alert_id):  # fmt: skip
                return Hold(kind="silenced", by=silence.id, reason=silence.reason)
        return None


class Realert:
    """Holds back an opening of a rule on a resource less than the rule's ``realert`` interval
    (event time) after the last one posted."""

    def __init__(self, last_posted: Mapping[tuple[str, str], float] | None = None) -> None:
        self.last_posted: dict[tuple[str, str], float] = dict(last_posted or {})
        """(rule, resource) → fire time of its latest posted opening."""

    def hold(self, alert: Alert, realert_s: float) -> Hold | None:
        """Judge an opening that every earlier stage let through: it is posted unless held here."""
        key = (alert.rule, alert.resource_id)
        last = self.last_posted.get(key)
        if realert_s and last is not None and alert.fired_at - last < realert_s:
            alert.details = {**alert.details, "realert_after": rfc3339(last + realert_s)}
            return Hold(kind="realert", by=alert.rule,
                        reason=f"realert: rule {alert.rule} alerted on this resource within its realert interval")  # fmt: skip
        self.last_posted[key] = alert.fired_at
        return None

    def withdrawn(self, alert: Alert) -> None:
        """An opening taken back (:attr:`~detector.alerts.Alert.withdrawn`) never stood: it holds back
        no later opening, as in event-time order, where it never fired."""
        key = (alert.rule, alert.resource_id)
        if self.last_posted.get(key) == alert.fired_at:
            del self.last_posted[key]

    def prune(self, horizon: float) -> None:
        self.last_posted = {k: t for k, t in self.last_posted.items() if t >= horizon}


def inhibiting_types() -> list[str]:
    """The rule types whose open incident holds back an anomaly on its resource."""
    return [t for t in REGISTRY if _is_behaviour(t)]


def _is_behaviour(rule_type: str) -> bool:
    cls = REGISTRY.get(rule_type)
    return cls is not None and cls.behaviour and rule_type != "anomaly"

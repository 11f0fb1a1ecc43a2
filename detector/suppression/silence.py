"""A silence: matchers and a window [starts, ends) in which what they match is not posted.

Silences from the rule files (``burnwatch silence add`` or by hand) and snoozes from
Slack's button are the same thing, as Alertmanager's silences are: a snooze is a
silence whose one matcher is an alert id. Rule-file silences are judged at the
opening's event time, so a replay is silenced exactly as the live stream was and a
silence added now does not reach back over history; snoozes are judged by the outbox on
the wall clock, as a person clicked them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from detector.detectors.base import ResourceInfo

__all__ = ["Silence", "SilenceInvalid", "snooze"]


class SilenceInvalid(ValueError):
    """A silence that would hold back more than its author could have meant."""


@dataclass(frozen=True)
class Silence:
    starts: float
    ends: float
    reason: str
    id: str = ""
    matches: Callable[[ResourceInfo], bool] | None = None
    """Resource selectors (the rule files' ``match``); None: none given."""
    rules: frozenset[str] = frozenset()
    types: frozenset[str] = frozenset()
    alert_ids: frozenset[str] = field(default_factory=frozenset)
    """A snooze's incident."""

    def __post_init__(self) -> None:
        if self.matches is None and not (self.rules or self.types or self.alert_ids):
            raise SilenceInvalid(
                "a silence needs at least one matcher (match, types, rules; --match, --type, --rule on the "
                "command line): one without would hold back every alert"
            )
        if self.ends < self.starts:
            raise SilenceInvalid("a silence cannot end before it starts")

    def active_at(self, at: float) -> bool:
        """In force at ``at``: ``starts`` counts, ``ends`` does not."""
        return self.starts <= at < self.ends

    def covers(self, *, at: float, rule: str, rule_type: str, resource: ResourceInfo, alert_id: str = "") -> bool:
        """Whether it holds back an alert of this rule on this resource that opened at ``at``."""
        return (
            self.active_at(at)
            and (not self.rules or rule in self.rules)
            and (not self.types or rule_type in self.types)
            and (not self.alert_ids or alert_id in self.alert_ids)
            and (self.matches is None or self.matches(resource))
        )


def snooze(alert_id: str, starts: float, ends: float, by: str = "") -> Silence:
    """Slack's *Snooze* button on one incident, from the click (wall time) to ``ends``."""
    return Silence(
        starts=starts, ends=ends, reason=f"snoozed in Slack by {by or 'someone'}", id=f"snooze:{alert_id}",
        alert_ids=frozenset({alert_id}),
    )  # fmt: skip

"""Open alerts whose rule is no longer loaded, resolved from the alert side.

A rule removed from ``rules.yaml`` (or given another type under its name) leaves its open incidents
with nothing to close them. The engine resolves the ones it can see with exact figures: a hot reload
resolves the episodes open in the keys it holds (``rule_removed``, :meth:`~detector.engine.Engine.set_ruleset`).
It cannot see the rest: a key evicted, or loaded at an assignment and not heard from since, has its
state read later with the rules it comes back to, which drop the removed rule's state unread; and a
rule removed while the worker was down (a ConfigMap rolled out with the pods) is never removed by a
reload at all. Those incidents would stay "firing" in Slack and on the incidents page for ever, and
the alert manager, which keeps open incidents however old, would remember each of them for ever.

So after each assignment and each reload, the worker reads the alerts still open in the store for the
input partitions it holds, and resolves each whose rule it does not load, nor the newest rule set any
worker loaded (:func:`known_rules`: not a worker of an older release in a rolling update), with the
figures it last recorded: resolved at its last change's event time, with the dollars counted to then
(``reason: rule_removed``, ``closed_by: alert_manager``); the states of their keys that the worker does not
hold are saved again under the rules in force, without the removed rule's open episode, which a rule put
back would otherwise resume under the resolved id (:meth:`~detector.engine.Engine.rewrite`). The same
alert resolved by the engine in the same batch is let through once, by the alert manager's dedup,
whichever comes first (the engine's come first: :meth:`streams.pipeline.Pipeline.process`). A worker of
an older release restarted in the middle of a rolling update records the newest rule set: it resolves
the new rule's incidents on its partitions, as a rollback would.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from detector.alerts import Alert
from detector.rules import RuleSet

__all__ = ["CLOSED_BY", "known_rules", "loaded_rules", "resolutions", "state_keys"]

CLOSED_BY = "alert_manager"
"""``details.closed_by`` of a resolution made here: its figures are the alert's last recorded ones,
not the engine's exact ones."""


def loaded_rules(ruleset: RuleSet) -> dict[str, str]:
    """Rule name → type of every rule ``ruleset`` detects with: an open alert of another name, or of
    this name and another type, has no state left to close it."""
    return {rule.detector.name: rule.detector.type for rule in ruleset.rules}


def known_rules(loaded: Mapping[str, str], newest: Mapping[str, str] | None) -> set[tuple[str, str]]:
    """The rules an alert may be of without being orphaned: those this worker ``loaded``, and those of the
    ``newest`` rule set any worker loaded (the store's ``rule_sets``). A rule this worker lacks and the newest
    set has is not removed: this worker is of an older release, beside newer ones in a rolling update that
    adds it, and its alerts are theirs to go on with. Where this worker's set is the newest, its own alone.
    (Name, type) pairs: a rule of one name may be of another type in each."""
    return set(loaded.items()) | set((newest or {}).items())


def state_keys(alert: Alert) -> set[str]:
    """The engine keys whose saved state may hold the episode of this open alert (as the store recorded it: without
    its key). A resource's alert: the resource. A run-event rule's (a run's or a project's alert) is made on the state
    of the run's project, or of the run when it has none: the project and the run its details name, and the project
    its resource id names (``project/NAME``). A key named here that is not the alert's is only saved again."""
    keys = {alert.key or alert.resource_id}
    if alert.resource_type in ("run", "project"):
        details = alert.details
        keys.update(v for v in (details.get("project"), details.get("run_id")) if isinstance(v, str) and v)
        if alert.resource_type == "project" and alert.resource_id.startswith("project/"):
            keys.add(alert.resource_id.removeprefix("project/"))
    return keys


def resolutions(open_alerts: Iterable[Alert], reason: str) -> list[Alert]:
    """The resolution of each of these open alerts (as the store last recorded them) with the figures it
    last recorded, for the alert manager to take (:meth:`~detector.alerts.AlertManager.take`): under the
    id it was stored with, its hold and route left to the alert manager to decide again."""
    return [msgspec.structs.replace(
                alert, status="resolved", change="resolved", resolved_at=alert.updated_at, held=None, silenced="",
                details={**alert.details, "reason": reason, "closed_by": CLOSED_BY}, key=alert.key or alert.resource_id)
            for alert in open_alerts]  # fmt: skip

"""``spot_without_redundancy``: a user-facing endpoint on spot capacity that one preemption takes down.

Example rule::

    - name: spot-without-redundancy
      type: spot_without_redundancy
      match: {resource_type: inference_endpoint}
      params:
        min_replicas: 2     # fewer ready replicas than this...
        min_zones: 2        # ...or spread over fewer zones than this, all on spot
        for: 15m            # for this long (a rollout or a replacement after a preemption passes)
      severity: info

Not waste but a risk the cost playbooks warn about: spot and preemptible capacity is
reclaimed with two minutes' notice (AWS) or thirty seconds (GCP, Azure), often many
instances of one type in one zone at once, so an endpoint with one replica, or all of
them in one zone, goes dark until capacity returns. The dollars are 0; the alert gives
what each fix costs an hour: the on-demand premium of its replicas, or one more spot
replica in another zone (``rules/pricing.yaml``).

What it reads from the endpoint's usage events (``docs/events.md``): it is on spot when
``pricing`` is ``spot`` or a capacity-type label says so (``karpenter.sh/capacity-type:
spot``, ``eks.amazonaws.com/capacityType: SPOT``, ``cloud.google.com/gke-spot: "true"``,
``kubernetes.azure.com/scalesetpriority: spot``); ``metrics.replicas`` (ready replicas;
absent: 1, an endpoint on one machine), ``metrics.zones`` (distinct
``topology.kubernetes.io/zone`` of the ready replicas' nodes; absent: one replica is in one
zone, several are judged on their count alone, since nothing says they share a zone),
``metrics.spot_replicas`` (those on spot; absent: all of them).
An endpoint that keeps at least one replica on on-demand capacity is not at risk.

Why these defaults: two replicas in two zones is the least that survives one preemption or
one zone's capacity reclaim (AWS's and Google's spot guidance: diversify across zones and
instance types); 15 minutes lets a rolling update or a replaced replica come back.
"""

from __future__ import annotations

import builtins
from functools import partial
from typing import Any, ClassVar

from pydantic import Field

from detector.detectors.base import Context, DetectorBase, Finding, Params, ResourceInfo, make_finding
from detector.detectors.episode import Episode, advance, end
from detector.events import Event, UsageEvent
from detector.units import Duration, figure

__all__ = ["SPOT_LABELS", "SpotWithoutRedundancy", "SpotWithoutRedundancyParams", "SpotWithoutRedundancyState"]

SPOT_LABELS = {
    "karpenter.sh/capacity-type": "spot",
    "eks.amazonaws.com/capacitytype": "spot",
    "cloud.google.com/gke-spot": "true",
    "cloud.google.com/gke-preemptible": "true",
    "kubernetes.azure.com/scalesetpriority": "spot",
}
"""Capacity-type node labels (keys lower-cased) and the value that means spot, per cloud."""
MAX_COUNT = 1_000_000.0


class SpotWithoutRedundancyParams(Params):
    min_replicas: int = Field(default=2, ge=1, le=1000)
    min_zones: int = Field(default=2, ge=1, le=100)
    for_: Duration = Field(default=15 * 60.0, alias="for", ge=0)
    update_every: Duration = Field(default=86_400.0, gt=0)


class SpotWithoutRedundancyState(Episode, kw_only=True):
    start: float | None = None
    """When the endpoint was first seen at risk, for the current stretch."""
    usage_last: float = 0.0
    last_t: float = 0.0
    replicas: int = 0
    zones: int = 0
    spot_replicas: int = 0


class SpotWithoutRedundancy(DetectorBase):
    type: ClassVar[str] = "spot_without_redundancy"
    title: ClassVar[str] = "User-facing endpoint on spot without redundancy"
    Params: ClassVar[builtins.type[SpotWithoutRedundancyParams]] = SpotWithoutRedundancyParams
    State: ClassVar[builtins.type[SpotWithoutRedundancyState]] = SpotWithoutRedundancyState
    consumes: ClassVar[tuple[builtins.type, ...]] = (UsageEvent,)
    suggestion: ClassVar[str] = (
        "Run at least two replicas in different zones (a topologySpreadConstraint on "
        "topology.kubernetes.io/zone, or a second zone in the node pool), or keep one replica on "
        "on-demand capacity so a preemption does not take the endpoint down."
    )
    dollars: ClassVar[str] = ""
    burning: ClassVar[bool | str] = False
    lazy: ClassVar[bool] = True
    """An endpoint never at risk (on demand, or spot with redundancy: most of them) holds no state
    for this rule: what it would hold is the time of its latest interval, which is the key's."""

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        return [
            ("Replicas", f"{details.get('replicas')} in {details.get('zones') or 'unreported'} zone(s), all on spot "
                         f"(the rule wants at least {details.get('min_replicas')} in {details.get('min_zones')} zones)"),
            ("Fix costs", f"one more spot replica ${figure(details.get('extra_replica_usd_per_hour', 0), ',.3f')}/h, or "
                          f"on-demand ${figure(details.get('on_demand_premium_usd_per_hour', 0), ',.3f')}/h more"),
        ]  # fmt: skip

    def starts(self, ctx: Context, event: Event) -> bool:
        """A running interval at risk, newer than every interval of the endpoint before it: any other
        would leave a state kept from the endpoint's first interval with nothing open and nothing
        counted (an older interval is ``late`` to the key, as it would be to that state)."""
        if type(event) is not UsageEvent or ctx.late or event.state != "running":
            return False
        replicas, zones, spot = _counts(event)
        return self._at_risk(replicas, zones, spot)

    def _at_risk(self, replicas: int, zones: int, spot: int) -> bool:
        """Every replica on spot, and too few of them or in too few zones."""
        p = self.params
        return spot > 0 and spot == replicas and (replicas < p.min_replicas or 0 < zones < p.min_zones)

    def step(self, state: SpotWithoutRedundancyState, ctx: Context, event: Event, t: float) -> list[Finding]:
        st, res = state, ctx.resource
        if type(event) is not UsageEvent or t <= st.usage_last:
            return []
        st.usage_last, st.last_t = t, t
        if event.state != "running":
            st.start = None
            return end(st, partial(self._finding, "resolve", st, res, t, reason=f"instance_{event.state}"))
        replicas, zones, spot = _counts(event)
        if not self._at_risk(replicas, zones, spot):
            st.start = None
            reason = "no_ready_replicas" if not replicas else "on_demand" if spot < replicas else "redundant"
            return end(st, partial(self._finding, "resolve", st, res, t, reason=reason))
        st.replicas, st.zones, st.spot_replicas = replicas, zones, spot
        if st.start is None:
            st.start = t
        action = advance(st, t, start=st.start, held_s=t - st.start, need_s=self.params.for_,
                         every_s=self.params.update_every)  # fmt: skip
        return [self._finding(action, st, res, t)] if action else []

    def open_episode(self, state: SpotWithoutRedundancyState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._finding("update", state, resource, state.last_t)

    def _finding(self, action: str, st: SpotWithoutRedundancyState, res: ResourceInfo, at: float,
                 **extra: object) -> Finding:  # fmt: skip
        assert st.since is not None and st.fired_at is not None
        spot = self.pricing.hourly(res.instance_type, "spot") if res.instance_type else None
        on_demand = self.pricing.hourly(res.instance_type, "on_demand") if res.instance_type else None
        if spot is None and res.usd_per_hour is not None and st.replicas:
            spot = res.usd_per_hour / st.replicas  # not listed: what one replica is billed
        premium = (on_demand - spot) * st.spot_replicas if on_demand is not None and spot is not None else None
        details = {
            "replicas": st.replicas,
            "zones": st.zones,
            "spot_replicas": st.spot_replicas,
            "min_replicas": self.params.min_replicas,
            "min_zones": self.params.min_zones,
            "extra_replica_usd_per_hour": round(spot, 4) if spot is not None else None,
            "on_demand_premium_usd_per_hour": round(premium, 4) if premium is not None else None,
            "episode_s": round(at - st.since, 3),
            **extra,
        }
        return make_finding(self, action, res, episode_start=st.since, fired_at=st.fired_at, at=at, usd=0.0,
                            details=details, usd_per_hour=0.0)  # fmt: skip


def _count(value: float | None, default: int) -> int:
    """A reported count (replicas, zones): a whole number in range, else ``default``."""
    if value is None or not 0 <= value <= MAX_COUNT:
        return default
    return int(value)


def _counts(event: UsageEvent) -> tuple[int, int, int]:
    """The interval's replicas, zones and replicas on spot, as reported or implied."""
    metrics = event.metrics
    replicas = _count(metrics.get("replicas"), 1)
    # Zones not reported: one replica is in one zone; several may be spread, so only their count is judged.
    zones = min(_count(metrics.get("zones"), 1 if replicas == 1 else 0), replicas)
    on_spot = event.pricing == "spot" or _spot_label(event.tags)
    spot = min(_count(metrics.get("spot_replicas"), replicas if on_spot else 0), replicas)
    return replicas, zones, spot


def _spot_label(tags: dict[str, str]) -> bool:
    for key, value in tags.items():
        want = SPOT_LABELS.get(key.lower())
        if want is not None and value.strip().lower() == want:
            return True
    return False

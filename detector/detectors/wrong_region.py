"""``wrong_region``: a long-running GPU workload in a region where its instance type costs
materially less elsewhere, after the egress of moving its data.

Example rule::

    - name: wrong-region
      type: wrong_region
      match: {resource_type: [gpu_instance, notebook, inference_endpoint]}
      params:
        min_running: 7d              # running this long without a stop: it will keep running
        min_saving: 10%              # the cheapest listed region is at least this much cheaper
        data_gb: 1000                # data to move when the resource reports no storage_bytes
        min_net_monthly_usd: 100     # a month's saving less the move is worth a migration
        pinned_tags: [data_residency]  # a resource with one of these tags stays where it is
      severity: info

Why these defaults: a move costs engineering time and a re-validation, so only workloads
that keep running pay it back: a week without a stop is what the cloud's rightsizing tools
(AWS Compute Optimizer, GCP's recommender) treat as steady. AWS lists the same GPU
instance 8-12 % dearer in Europe and 35-45 % dearer in Tokyo than in us-east-1; 10 % is
the smallest gap worth a migration. The data to move is what the resource reports
(``storage_bytes``: its volumes), else ``data_gb`` (a dataset and checkpoints of a TB);
it crosses regions once at the price list's ``egress_per_gb.inter_region``. The prices
compared are both from ``rules/pricing.yaml``'s regional list (``regions``), so a
negotiated rate does not make a region look cheap; only on-demand capacity is judged
(spot and reservations are bought per region). Data residency is the common reason a
workload must stay: a resource tagged with one of ``pinned_tags`` is never judged.

The dollars are a month's saving net of the one-off move (``HOURS_PER_MONTH`` of the
hourly gap, less the egress), and the details give the break-even: how many hours of
running in the cheaper region repay the move.
"""

from __future__ import annotations

import builtins
from functools import partial
from typing import Any, ClassVar

from pydantic import Field

from detector.detectors.base import Context, DetectorBase, Finding, Params, ResourceInfo, intern, make_finding
from detector.detectors.episode import Episode, end, fire
from detector.events import Event, UsageEvent
from detector.pricing import HOURS_PER_MONTH
from detector.units import Duration, Money, Percent, figure

__all__ = ["WrongRegion", "WrongRegionParams", "WrongRegionState"]

HOUR_S = 3600.0
MAX_GAP_S = 6 * HOUR_S
"""A usage silence longer than this (beyond the interval) starts the running time again."""


class WrongRegionParams(Params):
    min_running: Duration = Field(default=7 * 86_400.0, gt=0)
    min_saving: Percent = 10.0
    data_gb: float = Field(default=1000.0, ge=0)
    min_net_monthly_usd: Money = 100.0
    pinned_tags: list[str] = ["data_residency"]
    regions: list[str] = []
    """Regions a workload may move to; empty: every listed one."""


class WrongRegionState(Episode, kw_only=True):
    running_since: float | None = None
    last_t: float = 0.0
    region: str = ""
    instance_type: str = ""
    storage_bytes: float | None = None
    judged_at: float = 0.0
    """When the move was last weighed: at most hourly, or when the reported storage changes."""
    advice: dict[str, Any] | None = None
    """The open episode's figures (None while none is open: no empty dict per resource)."""
    resolved_at: float = 0.0
    """When an episode last resolved with the resource still running here (the move stopped
    paying): the next one, in the same running spell, starts when it pays again, not at
    ``running_since`` (the same start would be the same alert id, whose every change after
    its resolution the alert manager drops as a replay)."""

    def clear(self) -> None:
        super().clear()
        self.advice = None


class WrongRegion(DetectorBase):
    type: ClassVar[str] = "wrong_region"
    title: ClassVar[str] = "GPU workload in a dear region"
    Params: ClassVar[builtins.type[WrongRegionParams]] = WrongRegionParams
    State: ClassVar[builtins.type[WrongRegionState]] = WrongRegionState
    consumes: ClassVar[tuple[builtins.type, ...]] = (UsageEvent,)
    suggestion: ClassVar[str] = (
        "Plan a move of this workload (and its data) to the suggested region, after checking data "
        "residency, latency to its users and GPU capacity there; copy the data once, then switch."
    )
    dollars: ClassVar[str] = ""
    """A saving to come (a month's, net of the move), not money gone: the first fact says it."""

    @staticmethod
    def facts(details: dict[str, Any]) -> list[tuple[str, str]]:
        return [
            ("Net saving", f"${figure(details.get('net_monthly_usd'), ',.0f')} a month after moving "
                           f"(${figure(details.get('monthly_saving_usd'), ',.0f')} a month less "
                           f"${figure(details.get('move_usd'), ',.0f')} once)"),
            ("Move", f"{details.get('region')} → {details.get('suggested_region')} "
                     f"(${figure(details.get('usd_per_hour'), ',.3f')}/h → "
                     f"${figure(details.get('suggested_usd_per_hour'), ',.3f')}/h on-demand list prices "
                     f"as of {details.get('prices_as_of') or '?'}: check them before acting)"),
            ("Data", f"{figure(details.get('data_gb'), ',.0f')} GB ({details.get('data_source')}), "
                     f"${figure(details.get('move_usd'), ',.2f')} to move once"),
            ("Break-even", f"{figure(details.get('break_even_h'), ',.1f')} h of running after the move"),
        ]  # fmt: skip

    def step(self, state: WrongRegionState, ctx: Context, event: Event, t: float) -> list[Finding]:
        if type(event) is not UsageEvent:
            return []
        st, res = state, ctx.resource
        if t <= st.last_t:
            return []  # a duplicate or a late interval: the running time is already counted
        gap = t - st.last_t > event.interval_s + MAX_GAP_S
        st.last_t = t
        # An interval without a region or type (an exporter that dropped the label) keeps the last known.
        region, itype = event.region or st.region, event.instance_type or st.instance_type
        moved = (region, itype) != (st.region, st.instance_type)
        if moved:  # interned: a million resources share a few regions and types
            st.region, st.instance_type = intern(region), intern(itype)
        stored = st.storage_bytes
        if event.storage_bytes is not None:
            st.storage_bytes = float(event.storage_bytes)
        if event.state != "running" or moved or gap:
            reason = f"instance_{event.state}" if event.state != "running" else ("moved" if moved else "no_usage")
            st.running_since = None if event.state != "running" else t
            return end(st, partial(self._finding, "resolve", st, res, t, reason=reason))
        if st.running_since is None:
            st.running_since = t  # an interval's ts is its start
        if t + event.interval_s - st.running_since < self.params.min_running:
            return []
        if st.judged_at and t - st.judged_at < HOUR_S and st.storage_bytes == stored:
            return []  # weighed within the hour, on the same data: nothing new to say
        st.judged_at = t
        advice = self._advice(st, res)
        if advice is None:
            found = end(st, partial(self._finding, "resolve", st, res, t, reason="no_cheaper_region"))
            if found:
                st.resolved_at = t
            return found
        st.advice = advice
        if st.fired_at is None:
            since = st.running_since if st.running_since > st.resolved_at else t  # (a new episode: its own id)
            return [self._finding(fire(st, since=since, fired_at=t, at=t), st, res, t)]
        st.last_report = t
        return [self._finding("update", st, res, t)]

    def open_episode(self, state: WrongRegionState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._finding("update", state, resource, state.last_t)

    def _advice(self, st: WrongRegionState, res: ResourceInfo) -> dict[str, Any] | None:
        """The cheaper region and the move's figures, or None when the move does not pay."""
        p = self.params
        if res.pricing not in ("", "on_demand") or any(tag in res.tags for tag in p.pinned_tags):
            return None
        listed = self.pricing.instances.get(st.instance_type)
        if listed is not None and not listed.gpus:
            return None  # a CPU instance: not this rule's
        regional = self.pricing.regions
        here = regional.hourly(st.instance_type, st.region)
        best = regional.cheapest(st.instance_type, p.regions or None)
        if here is None or best is None or best[0] == st.region:
            return None
        there_region, there = best
        saving_h = here - there
        if saving_h < here * p.min_saving / 100.0:
            return None
        if st.storage_bytes is not None:
            data_gb, source = st.storage_bytes / 1e9, "storage the resource reports"
        else:
            data_gb, source = p.data_gb, "assumed (data_gb)"
        per_gb = self.pricing.egress_per_gb.inter_region
        move_usd = data_gb * per_gb
        net = saving_h * HOURS_PER_MONTH - move_usd
        if net < p.min_net_monthly_usd:
            return None
        return {
            "region": st.region, "suggested_region": there_region,
            "usd_per_hour": here, "suggested_usd_per_hour": there,
            "saving_usd_per_hour": round(saving_h, 4), "saving_pct": round(100.0 * saving_h / here, 1),
            "monthly_saving_usd": round(saving_h * HOURS_PER_MONTH, 2),
            "data_gb": round(data_gb, 1), "data_source": source, "egress_usd_per_gb": per_gb,
            "move_usd": round(move_usd, 2), "net_monthly_usd": round(net, 2),
            "break_even_h": round(move_usd / saving_h, 1),
            "prices_as_of": str(regional.as_of or ""), "prices_source": regional.source,
        }  # fmt: skip

    def _finding(self, action: str, st: WrongRegionState, res: ResourceInfo, at: float, **extra: object) -> Finding:
        assert st.since is not None and st.fired_at is not None
        advice = st.advice or {}
        details = {**advice, "running_h": round((at - st.since) / HOUR_S, 1), **extra}
        return make_finding(self, action, res, episode_start=st.since, fired_at=st.fired_at, at=at,
                            usd=advice.get("net_monthly_usd", 0.0),
                            usd_per_hour=advice.get("saving_usd_per_hour", 0.0), details=details)  # fmt: skip

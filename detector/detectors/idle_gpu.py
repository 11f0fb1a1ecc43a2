"""``idle_gpu``: a billed GPU host or notebook whose GPUs all sit idle for a sustained time.

Example rule::

    - name: idle-gpu
      type: idle_gpu
      match: {resource_type: [gpu_instance, notebook]}
      params:
        util_below: 5%      # a GPU is busy at or above this util_pct (or sm_active)
        for: 30m            # idle this long, in event time, before alerting
        stale_after: 5m     # a telemetry gap longer than this is not idle time
      severity: warning

Why these defaults: dstack stops runs under a minimum utilisation over 30 m
windows and SageMaker Debugger's LowGPUUtilization flags p5 under 10 %; 5 % for
30 minutes catches a host nobody is using while leaving the few-minute dips
between epochs and evaluations alone. dcgm-exporter is usually scraped every
30 s, so 5 minutes without a sample means the telemetry is missing, and missing
telemetry is never read as idle.

Busy wins: one sample at or above the threshold from any GPU of the host (by
``util_pct`` or by ``sm_active``) ends the episode, so one busy GPU among eight
is not idle. Dollars accrue only over time that samples cover, at the host's
price from its latest usage event; time seen before the price is known is
priced once it is, so the order in which the usage and metrics topics arrive
does not change the figure.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec
from pydantic import Field

from detector.detectors.base import Finding, Params, ResourceInfo, make_finding
from detector.events import Event, GpuMetric, UsageEvent
from detector.units import Duration, Percent

__all__ = ["IdleGpu", "IdleGpuParams", "IdleGpuState"]


class IdleGpuParams(Params):
    util_below: Percent = 5.0
    for_: Duration = Field(default=1800.0, alias="for", gt=0)
    stale_after: Duration = Field(default=300.0, gt=0)
    update_every: Duration = Field(default=900.0, gt=0)
    """How often an open episode reports its growing dollars (event time)."""


class IdleGpuState(msgspec.Struct, kw_only=True):
    gpus: list[int] = []
    model: str = ""
    last_busy: float = 0.0
    covered_until: float = 0.0
    """Time of the newest sample seen: idle time is only counted up to here."""
    idle_since: float | None = None
    idle_s: float = 0.0
    waste_usd: float = 0.0
    unpriced_s: float = 0.0
    """Idle seconds seen before the host's price was known."""
    fired_at: float | None = None
    last_report: float = 0.0


class IdleGpu:
    type: ClassVar[str] = "idle_gpu"
    Params: ClassVar[type[IdleGpuParams]] = IdleGpuParams
    State: ClassVar[type[IdleGpuState]] = IdleGpuState
    consumes: ClassVar[tuple[type, ...]] = (GpuMetric, UsageEvent)
    suggestion: ClassVar[str] = (
        "Stop the instance (or scale the node group down) if no job is queued for it; "
        "for notebooks, turn on idle shutdown."
    )

    def __init__(self, name: str, severity: str, params: IdleGpuParams) -> None:
        self.name = name
        self.severity = severity
        self.params = params

    def new_state(self) -> IdleGpuState:
        return IdleGpuState()

    def step(self, state: IdleGpuState, resource: ResourceInfo, event: Event, t: float) -> list[Finding]:
        if type(event) is GpuMetric:
            return self._on_sample(state, resource, event, t)
        if type(event) is UsageEvent:
            return self._on_usage(state, resource, event, t)
        return []

    # -- events -------------------------------------------------------------

    def _on_sample(self, st: IdleGpuState, res: ResourceInfo, ev: GpuMetric, t: float) -> list[Finding]:
        if ev.gpu_index not in st.gpus:
            st.gpus.append(ev.gpu_index)
        if ev.model:
            st.model = ev.model
        threshold = self.params.util_below
        busy = ev.util_pct >= threshold or (ev.sm_active is not None and ev.sm_active * 100 >= threshold)
        if busy:
            found: list[Finding] = []
            if t > st.last_busy:
                st.last_busy = t
            if st.idle_since is not None and t >= st.idle_since:
                if st.fired_at is not None:
                    self._accrue(st, res, t)
                    found.append(self._finding("resolve", st, res, t, reason="gpu_busy"))
                self._reset(st)
            if t > st.covered_until:
                st.covered_until = t
            return found
        if t <= st.last_busy:
            return []  # a late idle reading from before the latest busy one
        if st.idle_since is None:
            st.idle_since = t
            st.covered_until = max(st.covered_until, t)
        elif t > st.covered_until:
            if t - st.covered_until > self.params.stale_after and st.fired_at is None:
                st.idle_since = t  # telemetry gap: the count starts again
                st.idle_s = st.waste_usd = st.unpriced_s = 0.0
                st.covered_until = t
            else:
                self._accrue(st, res, t)
        return self._maybe_fire_or_report(st, res, t)

    def _on_usage(self, st: IdleGpuState, res: ResourceInfo, ev: UsageEvent, t: float) -> list[Finding]:
        if st.idle_since is None:
            return []
        if not res.billed:
            found: list[Finding] = []
            if st.fired_at is not None:
                self._accrue(st, res, t)
                found.append(self._finding("resolve", st, res, max(t, st.idle_since), reason=f"instance_{res.state}"))
            self._reset(st)
            return found
        if st.unpriced_s and res.usd_per_hour is not None:
            st.waste_usd += st.unpriced_s * res.usd_per_hour / 3600.0
            st.unpriced_s = 0.0
        return self._maybe_fire_or_report(st, res, st.covered_until)

    # -- helpers ------------------------------------------------------------

    def _accrue(self, st: IdleGpuState, res: ResourceInfo, t: float) -> None:
        """Count idle time from the last covered instant to ``t`` unless the gap is telemetry loss."""
        gap = t - st.covered_until
        if gap <= 0:
            return
        if gap <= self.params.stale_after:
            st.idle_s += gap
            if res.usd_per_hour is None:
                st.unpriced_s += gap
            else:
                st.waste_usd += gap * res.usd_per_hour / 3600.0
        st.covered_until = t

    def _maybe_fire_or_report(self, st: IdleGpuState, res: ResourceInfo, t: float) -> list[Finding]:
        if st.idle_since is None or not res.billed:
            return []
        if st.fired_at is None:
            if st.covered_until - st.idle_since < self.params.for_:
                return []
            st.fired_at = st.idle_since + self.params.for_
            st.last_report = st.covered_until
            return [self._finding("fire", st, res, st.fired_at)]
        if st.covered_until - st.last_report >= self.params.update_every:
            st.last_report = st.covered_until
            return [self._finding("update", st, res, st.covered_until)]
        return []

    def _reset(self, st: IdleGpuState) -> None:
        st.idle_since = st.fired_at = None
        st.idle_s = st.waste_usd = st.unpriced_s = 0.0
        st.last_report = 0.0

    def _finding(self, action: str, st: IdleGpuState, res: ResourceInfo, at: float, **extra: object) -> Finding:
        assert st.idle_since is not None and st.fired_at is not None
        details = {
            "gpu_count": len(st.gpus),
            "gpu_model": st.model,
            "idle_s": round(max(at, st.covered_until) - st.idle_since, 3),
            "util_below_pct": self.params.util_below,
            **extra,
        }
        return make_finding(self, action, res, episode_start=st.idle_since, fired_at=st.fired_at, at=at,
                            usd=st.waste_usd, details=details)  # fmt: skip

    def open_episode(self, state: IdleGpuState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._finding("update", state, resource, state.covered_until)

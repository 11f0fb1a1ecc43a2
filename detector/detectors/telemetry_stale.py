"""``telemetry_stale``: a billed GPU host whose GPU metrics stopped arriving.

Example rule::

    - name: gpu-telemetry-stale
      type: telemetry_stale
      match: {resource_type: [gpu_instance, notebook]}
      params:
        after: 10m       # no GPU sample for this long while the host is billed
      severity: info

A data-quality finding, neither idle nor busy: while a host's exporter is down,
burnwatch cannot tell whether its GPUs are used, and ``idle_gpu`` and ``stuck_gpu``
stay silent by design. dcgm-exporter is usually scraped every 30 s; ten minutes
without a sample is an exporter or scrape failure, not jitter. It fires only for
hosts that have sent GPU metrics before (a CPU instance has none to miss), only while
usage says the host runs, and resolves when samples return or the host stops. The
dollars are the spend while blind.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec
from pydantic import Field

from detector.detectors.base import DetectorBase, Finding, Params, ResourceInfo, make_finding
from detector.events import Event, GpuMetric, UsageEvent
from detector.units import Duration

__all__ = ["TelemetryStale", "TelemetryStaleParams", "TelemetryStaleState"]


class TelemetryStaleParams(Params):
    after: Duration = Field(default=600.0, gt=0)
    update_every: Duration = Field(default=900.0, gt=0)


class TelemetryStaleState(msgspec.Struct, kw_only=True):
    last_sample: float | None = None
    blind_usd: float = 0.0
    last_usage: float = 0.0
    fired_at: float | None = None
    last_report: float = 0.0

    @property
    def behaviour_active(self) -> bool:
        return self.fired_at is not None


class TelemetryStale(DetectorBase):
    type: ClassVar[str] = "telemetry_stale"
    title: ClassVar[str] = "GPU telemetry missing"
    Params: ClassVar[type[TelemetryStaleParams]] = TelemetryStaleParams
    State: ClassVar[type[TelemetryStaleState]] = TelemetryStaleState
    consumes: ClassVar[tuple[type, ...]] = (GpuMetric, UsageEvent)
    suggestion: ClassVar[str] = (
        "Check the host's dcgm-exporter (and its scrape job): until its metrics return, idle "
        "and stuck GPUs on it cannot be detected."
    )

    dollars: ClassVar[str] = "spent while blind"
    behaviour: ClassVar[bool] = True

    def step(self, state: TelemetryStaleState, resource: ResourceInfo, event: Event, t: float) -> list[Finding]:
        st = state
        if type(event) is GpuMetric:
            if st.last_sample is not None and t <= st.last_sample:
                return []
            found = []
            if st.fired_at is not None:
                found.append(self._finding("resolve", st, resource, t, reason="telemetry_back"))
            self._reset(st)
            st.last_sample = t
            return found
        if type(event) is not UsageEvent or st.last_sample is None or t <= st.last_usage or t <= st.last_sample:
            return []  # no GPU host yet, a re-read interval, or one from before the latest sample
        st.last_usage = t
        if not resource.billed:
            found = []
            if st.fired_at is not None:
                found.append(self._finding("resolve", st, resource, t, reason=f"instance_{resource.state}"))
            self._reset(st)
            st.last_sample = None  # a stopped host sends nothing: start afresh when it runs again
            return found
        # Spend since the last sample (the engine's price of the interval, as stored), counted
        # once the gap is long enough.
        st.blind_usd += resource.interval_usd
        if t - st.last_sample < self.params.after:
            return []
        if st.fired_at is None:
            st.fired_at = st.last_sample + self.params.after
            st.last_report = t
            return [self._finding("fire", st, resource, st.fired_at)]
        if t - st.last_report >= self.params.update_every:
            st.last_report = t
            return [self._finding("update", st, resource, t)]
        return []

    def _reset(self, st: TelemetryStaleState) -> None:
        st.fired_at = None
        st.blind_usd = 0.0
        st.last_report = 0.0

    def _finding(self, action: str, st: TelemetryStaleState, res: ResourceInfo, at: float, **extra: object) -> Finding:
        assert st.last_sample is not None and st.fired_at is not None
        details = {"last_sample_s_ago": round(at - st.last_sample, 3), **extra}
        return make_finding(self, action, res, episode_start=st.last_sample, fired_at=st.fired_at, at=at,
                            usd=st.blind_usd, details=details)  # fmt: skip

    def open_episode(self, state: TelemetryStaleState, resource: ResourceInfo) -> Finding | None:
        if state.fired_at is None:
            return None
        return self._finding("update", state, resource, state.last_usage)

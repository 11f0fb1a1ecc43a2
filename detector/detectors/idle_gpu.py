"""``idle_gpu``: a billed GPU host or notebook whose GPUs all sit idle for a sustained time.

Example rule::

    - name: idle-gpu
      type: idle_gpu
      match: {resource_type: [gpu_instance, notebook]}
      params:
        util_below: 5%      # a GPU is busy at or above this util_pct (or any activity ratio × 100)
        for: 30m            # idle this long, in event time, before alerting
        stale_after: 5m     # a telemetry gap longer than this is not idle time
      severity: warning

Why these defaults: dstack stops runs under a minimum utilisation over 30 m
windows and SageMaker Debugger's LowGPUUtilization flags p5 under 10 %; 5 % for
30 minutes catches a host nobody is using while leaving the few-minute dips
between epochs and evaluations alone. dcgm-exporter is usually scraped every
30 s, so 5 minutes without a sample means the telemetry is missing, and missing
telemetry is never read as idle.

Busy wins: one sample at or above the threshold from any GPU of the host ends the
episode, so one busy GPU among eight is not idle (``partly_idle_gpu`` prices the
seven). A sample is busy by ``util_pct`` or by any activity ratio it carries
(``gr_engine_active``, ``sm_active``, ``tensor_active``, ``dram_active``) × 100: see
:mod:`detector.detectors.activity` for why every one of them counts. Under MIG a GPU
sends a sample per instance, and any busy instance makes the host busy.

Dollars accrue only over time that samples cover, at the host's
price from its latest usage event; time seen before the price is known is
priced once it is, so the order in which the usage and metrics topics arrive
does not change the figure.
"""

from __future__ import annotations

import builtins
from typing import Any, ClassVar

from detector.detectors.gpu_episode import GpuEpisode, GpuEpisodeParams, GpuEpisodeState
from detector.detectors.scrape import Scrape
from detector.units import Percent

__all__ = ["IdleGpu", "IdleGpuParams"]


class IdleGpuParams(GpuEpisodeParams):
    util_below: Percent = 5.0
    """A GPU is busy at or above this ``util_pct`` (or any activity ratio × 100)."""


class IdleGpu(GpuEpisode):
    type: ClassVar[str] = "idle_gpu"
    title: ClassVar[str] = "Idle GPUs"
    Params: ClassVar[builtins.type[IdleGpuParams]] = IdleGpuParams
    suggestion: ClassVar[str] = (
        "Stop the instance (or scale the node group down) if no job is queued for it; "
        "for notebooks, turn on idle shutdown."
    )
    break_reason: ClassVar[str] = "gpu_busy"
    pod_commands: ClassVar[bool] = True
    pod_suggestion: ClassVar[str] = (
        "Kubernetes pods hold these GPUs and leave them idle: if nobody needs them, stop what holds them "
        "(below). Stopping the instance would only make the node group replace it; once its pods are gone "
        "the cluster autoscaler removes the node."
    )
    empty_suggestion: ClassVar[str] = (
        "No pod requested any of these GPUs: they are unallocated, not held and idle. Let the cluster "
        "autoscaler remove the node (check scale-down is not disabled on it), or shrink the node pool."
    )

    @classmethod
    def suggest(cls, details: dict[str, Any]) -> str:
        if details.get("pods"):
            return cls.pod_suggestion
        if details.get("gpus_unallocated") and details.get("gpus_unallocated") == details.get("gpu_count"):
            return cls.empty_suggestion
        return cls.suggestion

    def first_break(self, st: GpuEpisodeState, scrape: Scrape) -> int:
        busy = scrape.busy(self.params.util_below)  # (what partly_idle_gpu and unallocated_gpu ask too)
        return busy.index(True) if True in busy else len(busy)

    def describe(self, st: GpuEpisodeState) -> dict[str, Any]:
        return {"util_below_pct": self.params.util_below}

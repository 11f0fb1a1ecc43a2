"""``stuck_gpu``: GPUs that report busy while nothing runs on them, as in a hung collective.

Example rule::

    - name: stuck-gpu
      type: stuck_gpu
      match: {resource_type: [gpu_instance, notebook]}
      params:
        util_above: 90%          # DCGM_FI_DEV_GPU_UTIL says busy...
        sm_below: 5%             # ...while DCGM_FI_PROF_SM_ACTIVE says the SMs do nothing
        power_below: 35%         # without sm_active: power under this share of the GPU's peak
        for: 20m
      severity: critical

Why: ``util_pct`` (``DCGM_FI_DEV_GPU_UTIL``) is the share of time a kernel was
resident, and a job hung in an NCCL collective keeps one resident forever, so it reads
100 % while the SMs and the power draw say nothing runs. PyTorch's NCCL watchdog
aborts a hung collective after 10 minutes by default, and many jobs raise it: 20
minutes of a host looking busy-but-dead is past any healthy stall. When ``sm_active``
is not exported, power relative to the most the same GPU has drawn stands in for it.
Every GPU of the host must look stuck (a hung job hangs all its ranks); one sample
that looks alive, or idle, ends the episode.
"""

from __future__ import annotations

import builtins
from typing import Any, ClassVar

from pydantic import Field

from detector.detectors.gpu_episode import GpuEpisode, GpuEpisodeParams, GpuEpisodeState
from detector.events import GpuMetric
from detector.units import Duration, Percent

__all__ = ["StuckGpu", "StuckGpuParams"]


class StuckGpuParams(GpuEpisodeParams):
    for_: Duration = Field(default=1200.0, alias="for", gt=0)
    util_above: Percent = 90.0
    sm_below: Percent = 5.0
    power_below: Percent = 35.0


class StuckGpu(GpuEpisode):
    type: ClassVar[str] = "stuck_gpu"
    title: ClassVar[str] = "Stuck GPUs (busy, nothing running)"
    Params: ClassVar[builtins.type[StuckGpuParams]] = StuckGpuParams
    suggestion: ClassVar[str] = (
        "The job looks hung (often in an NCCL collective): check its logs and stack traces "
        "(py-spy dump), then kill and restart it from its last checkpoint."
    )
    break_reason: ClassVar[str] = "gpu_active"

    def breaks(self, st: GpuEpisodeState, ev: GpuMetric) -> bool:
        p = self.params
        peak = st.peak_power_w.get(ev.gpu_index, 0.0)
        if ev.power_w > peak:
            st.peak_power_w[ev.gpu_index] = ev.power_w
        if ev.util_pct < p.util_above:
            return True
        if ev.sm_active is not None:
            return ev.sm_active * 100 >= p.sm_below
        return peak <= 0 or ev.power_w >= peak * p.power_below / 100

    def describe(self, st: GpuEpisodeState) -> dict[str, Any]:
        return {"util_above_pct": self.params.util_above}

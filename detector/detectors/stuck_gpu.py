"""``stuck_gpu``: GPUs that report busy while nothing runs on them, as in a hung collective.

Example rule::

    - name: stuck-gpu
      type: stuck_gpu
      match: {resource_type: [gpu_instance, notebook]}
      params:
        util_above: 90%          # DCGM_FI_DEV_GPU_UTIL (or GR_ENGINE_ACTIVE) says a kernel is resident...
        sm_below: 5%             # ...while DCGM_FI_PROF_SM_ACTIVE says the SMs do nothing
        tensor_below: 5%         # without sm_active: tensor pipes at or above this prove work...
        dram_below: 2%           # ...and DRAM activity under this says nothing moves
        power_below: 35%         # with neither: power under this share of the GPU's peak
        for: 20m
      severity: critical

Why: ``util_pct`` (``DCGM_FI_DEV_GPU_UTIL``) is the share of time a kernel was
resident, and a job hung in an NCCL collective keeps one resident forever, so it reads
100 % while the SMs and the power draw say nothing runs. ``GR_ENGINE_ACTIVE`` is the
same measure from the profiler (and the one there is under MIG): it reads ~1 for a hung
kernel too, so it says "resident", never "working". PyTorch's NCCL watchdog aborts a
hung collective after 10 minutes by default, and many jobs raise it: 20 minutes of a
host looking busy-but-dead is past any healthy stall.

What says "nothing runs", in order of preference (:mod:`detector.detectors.activity`):
``sm_active`` under 5 % (a collective spins on a few SMs of 100+); else, as in a stock
dcgm-exporter install that does not export ``SM_ACTIVE``, tensor activity under 5 % and
``dram_active`` under 2 %: every training or inference step streams weights and
activations through HBM, which keeps the memory interface busy a double-digit share of
the time even for compute-bound matrix multiplies, while a kernel polling a flag reads
it from L2 and leaves DRAM at ~0; else power under 35 % of the most the same GPU has
drawn (a hung kernel draws little more than idle). Every GPU of the host must look
stuck (a hung job hangs all its ranks); one sample that looks alive, or idle, ends the
episode.
"""

from __future__ import annotations

import builtins
from typing import Any, ClassVar

from pydantic import Field

from detector.detectors.activity import resident, stuck_evidence
from detector.detectors.gpu_episode import GpuEpisode, GpuEpisodeParams, GpuEpisodeState
from detector.events import GpuMetric
from detector.units import Duration, Percent

__all__ = ["StuckGpu", "StuckGpuParams"]


class StuckGpuParams(GpuEpisodeParams):
    for_: Duration = Field(default=1200.0, alias="for", gt=0)
    util_above: Percent = 90.0
    sm_below: Percent = 5.0
    tensor_below: Percent = 5.0
    dram_below: Percent = 2.0
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
        if resident(ev) < p.util_above:
            return True
        stuck = stuck_evidence(ev, sm_below=p.sm_below, tensor_below=p.tensor_below, dram_below=p.dram_below)
        if stuck is not None:
            return not stuck
        return peak <= 0 or ev.power_w >= peak * p.power_below / 100

    def describe(self, st: GpuEpisodeState) -> dict[str, Any]:
        return {"util_above_pct": self.params.util_above}

"""``stuck_gpu``: GPUs that report busy while nothing runs on them, as in a hung collective.

Example rule::

    - name: stuck-gpu
      type: stuck_gpu
      match: {resource_type: [gpu_instance, notebook]}
      params:
        util_above: 90%          # DCGM_FI_DEV_GPU_UTIL (or GR_ENGINE_ACTIVE) says a kernel is resident...
        tensor_below: 5%         # ...tensor pipes at or above this prove work...
        dram_below: 2%           # ...DRAM activity under this says nothing moves...
        sm_working: 60%          # ...unless SM_ACTIVE says most SMs compute (out of cache)
        sm_below: 5%             # no DRAM reading: SM_ACTIVE under this says the SMs do nothing
        power_below: 35%         # with none of them: power under this share of the GPU's peak
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
tensor activity at or above 5 % says work; else ``dram_active`` (in dcgm-exporter's
default counters) under 2 %, unless ``sm_active`` is exported and at or above 60 %: every
training or inference step streams weights and activations through HBM (a bf16 matmul
on an H200 keeps it 17 % busy, a copy 87 %), while a hung collective polls its flags
from L2 and leaves DRAM at 0.0004 %, as idle; a collective holds one SM per channel (32
polling blocks read 24 % of an H200's SMs), real compute nearly all of them (95 %).
Without DRAM, ``sm_active`` under 5 %; with neither, power under 35 % of the most the
same GPU has drawn (a hung kernel draws little more than idle). Every GPU of the host must look
stuck (a hung job hangs all its ranks); one sample that looks alive, or idle, ends the
episode.
"""

from __future__ import annotations

import builtins
from operator import attrgetter, gt
from typing import Any, ClassVar

from pydantic import Field

from detector.detectors.activity import stuck_evidence
from detector.detectors.gpu_episode import GpuEpisode, GpuEpisodeParams, GpuEpisodeState
from detector.detectors.scrape import FIRST, Scrape
from detector.events import GpuMetric
from detector.floats import grow, per_gpu
from detector.units import Duration, Percent

__all__ = ["StuckGpu", "StuckGpuParams"]

_power = attrgetter("power_w")


class StuckGpuParams(GpuEpisodeParams):
    for_: Duration = Field(default=1200.0, alias="for", gt=0)
    util_above: Percent = 90.0
    tensor_below: Percent = 5.0
    dram_below: Percent = 2.0
    sm_working: Percent = 60.0
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

    def first_break(self, st: GpuEpisodeState, scrape: Scrape) -> int:
        """Each sample judged against the most power its GPU drew before it (then kept, with its own);
        how long a kernel was resident is the scrape's (:meth:`~detector.detectors.scrape.Scrape.resident`,
        which ``data_starved_training`` reads too). Every sample's power is kept; the judging stops at
        the first that breaks.

        On GPUs ``0 .. n-1`` in order, each once, whose peaks are kept already (the usual scrape), a
        sample's peak before it is its GPU's before the scrape, and most scrapes draw no more power
        than each GPU has before (seen in C): then no peak moves and none is copied."""
        peaks = st.peak_power_w
        if peaks is None:
            peaks = st.peak_power_w = per_gpu()
        samples, shares = scrape.samples, scrape.resident()
        n = len(samples)
        util_above = self.params.util_above
        if n < len(FIRST) and scrape.gpus is FIRST[n] and len(peaks) >= n:
            before = peaks
            if any(map(gt, map(_power, samples), peaks)):  # a GPU draws more than ever before
                before = peaks[:n]
                for gpu, ev in enumerate(samples):
                    if ev.power_w > peaks[gpu]:
                        peaks[gpu] = ev.power_w
            for i, share in enumerate(shares):
                if share < util_above or self._works(samples[i], before[i]):
                    return i
            return n
        first = n
        for i, (ev, share) in enumerate(zip(samples, shares, strict=True)):
            gpu = ev.gpu_index
            if gpu >= len(peaks):
                grow(peaks, gpu)
            peak = peaks[gpu]
            if ev.power_w > peak:
                peaks[gpu] = ev.power_w
            if first == n and (share < util_above or self._works(ev, peak)):
                first = i
        return first

    def _works(self, ev: GpuMetric, peak: float) -> bool:
        """Whether a sample with a kernel resident shows work (or no sign of a hang), its GPU's peak
        power before it being ``peak``."""
        p = self.params
        stuck = stuck_evidence(ev, tensor_below=p.tensor_below, dram_below=p.dram_below, sm_working=p.sm_working,
                               sm_below=p.sm_below)  # fmt: skip
        return not stuck if stuck is not None else peak <= 0 or ev.power_w >= peak * p.power_below / 100

    def describe(self, st: GpuEpisodeState) -> dict[str, Any]:
        return {"util_above_pct": self.params.util_above}

"""``partly_idle_gpu``: some GPUs of a billed host sit idle while others work.

Example rule::

    - name: partly-idle-gpu
      type: partly_idle_gpu
      match: {resource_type: [gpu_instance, notebook]}
      params:
        util_below: 5%      # as idle_gpu: a GPU is busy at or above this (util_pct or any activity ratio)
        for: 30m            # a GPU idle this long counts (and a whole-host idle spell this long is idle_gpu's)
        min_gpus: 1         # alert with at least this many GPUs idle at once
        stale_after: 5m     # a gap in GPU telemetry longer than this is not idle time
      severity: warning

One busy GPU clears a host for ``idle_gpu``; a host of eight with a single-GPU job
running wastes seven eighths of its price. This rule is the per-GPU view: one episode
per host listing its idle GPUs ("6 of 8 GPUs on i-0abc idle"), priced as their share of
the host. Its defaults are ``idle_gpu``'s, for the same reasons (dstack's 30-minute
windows; 5 % leaves the dips between epochs alone), and because the two must split a
host's hours exactly: a spell with every GPU idle for ``for`` is ``idle_gpu``'s, every
other idle GPU-second this rule's, so no hour is alerted (or priced) twice.

GPUs that a pod holds, and GPUs whose holder is unknown (no Kubernetes, ``allocated``
absent), count here. GPUs that no pod requested (``allocated: false``) are
``unallocated_gpu``'s: they need a smaller node, not a word with a pod's owner. With pod
labels the alert names the pods holding the idle GPUs, their owners (who the alert is
routed to) and the command that stops each (:mod:`detector.detectors.pods`).
Everything else (per-GPU and MIG tracking, resolution, gaps, re-read input, pricing) is
:mod:`detector.detectors.gpu_share`.
"""

from __future__ import annotations

import builtins
from typing import Any, ClassVar

from detector.detectors.gpu_share import HELD, UNKNOWN, GpuShare, GpuShareParams

__all__ = ["PartlyIdleGpu", "PartlyIdleGpuParams"]


class PartlyIdleGpuParams(GpuShareParams):
    pass


class PartlyIdleGpu(GpuShare):
    type: ClassVar[str] = "partly_idle_gpu"
    title: ClassVar[str] = "Part of a host's GPUs idle"
    Params: ClassVar[builtins.type[PartlyIdleGpuParams]] = PartlyIdleGpuParams
    suggestion: ClassVar[str] = (
        "Run the idle GPUs' share of work here, or move the busy job to an instance with fewer GPUs "
        "and stop this one."
    )
    pod_suggestion: ClassVar[str] = (
        "Pods hold GPUs that do nothing: if nobody needs them, stop what holds them (below), or give the "
        "pod fewer GPUs; the freed GPUs can then go to other work or the node to a smaller one."
    )

    codes: ClassVar[frozenset[int]] = frozenset({HELD, UNKNOWN})

    @classmethod
    def suggest(cls, details: dict[str, Any]) -> str:
        return cls.pod_suggestion if details.get("pods") else cls.suggestion

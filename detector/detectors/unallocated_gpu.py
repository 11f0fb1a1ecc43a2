"""``unallocated_gpu``: GPUs of a billed Kubernetes node that no pod requested.

Example rule::

    - name: unallocated-gpu
      type: unallocated_gpu
      match: {resource_type: [gpu_instance, notebook]}
      params:
        for: 30m            # no pod has held the GPU for this long
        util_below: 5%      # and it is idle (a GPU used outside Kubernetes' accounting is not counted)
        stale_after: 5m
      severity: warning

A GPU nobody requested is a different waste from a GPU a pod holds and leaves idle: no
owner can be asked to stop anything. The node is larger than what was scheduled on it:
shrink the node pool, use an instance type with fewer GPUs, or let the cluster
autoscaler remove the node. The samples say it: ``allocated: false``, which the bridge
derives from kube-state-metrics (``kube_pod_container_resource_requests`` for
``nvidia.com/gpu`` against ``kube_node_status_allocatable``) or from dcgm-exporter's pod
labels. ``allocated`` absent (unknown, or not a Kubernetes node) never counts.

Why 30 minutes: cluster-autoscaler removes a node that stays unneeded for
``scale-down-unneeded-time`` (10 minutes by default), waits
``scale-down-delay-after-add`` (10 minutes) after adding one, and gives pods up to
``max-graceful-termination-sec`` (10 minutes) to leave: a node that a working autoscaler
is about to remove, or that was just added for pods still being scheduled, is gone or
used within 30 minutes. GPUs freed between the jobs of a queue are taken again in
seconds to minutes. A GPU still unrequested after 30 minutes is one the autoscaler will
not remove (the node is more than half requested, its pods cannot move, scale-down is
disabled, or there is no autoscaler): the waste is real and somebody must act.

Only idle unrequested GPUs count (a process using a GPU outside Kubernetes' accounting
is not waste), and never in a whole-node idle spell that is ``idle_gpu``'s: a node where
every GPU is idle for ``for`` is ``idle_gpu``'s, whose alert says when no pod requested
any of them, so no hour is priced twice. Everything else (per-GPU and MIG tracking, gaps, re-read input,
pricing as the GPUs' share of the host) is :mod:`detector.detectors.gpu_share`.
"""

from __future__ import annotations

import builtins
from typing import ClassVar

from detector.detectors.gpu_share import FREE, GpuShare, GpuShareParams

__all__ = ["UnallocatedGpu", "UnallocatedGpuParams"]


class UnallocatedGpuParams(GpuShareParams):
    pass


class UnallocatedGpu(GpuShare):
    type: ClassVar[str] = "unallocated_gpu"
    title: ClassVar[str] = "GPUs no pod requested"
    Params: ClassVar[builtins.type[UnallocatedGpuParams]] = UnallocatedGpuParams
    suggestion: ClassVar[str] = (
        "These GPUs are unallocated: no pod requested them (they are not held and idle). Shrink the node "
        "pool, use an instance type with fewer GPUs, or let the cluster autoscaler remove the node "
        "(check scale-down is not disabled on it and its pods can move)."
    )
    noun: ClassVar[str] = "unallocated"

    codes: ClassVar[frozenset[int]] = frozenset({FREE})
    lazy: ClassVar[bool] = True
    """Off Kubernetes no sample says who holds a GPU: the host holds no state for this rule."""

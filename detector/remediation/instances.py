"""``stop_instance``: stop a VM in whichever cloud runs it (EC2, Compute Engine, Azure).

One executor for the action kind, so a rule says ``stop_instance`` without naming a cloud.
The cloud is read from the alert, in this order:

1. an explicit provider, the ``provider`` detail (``aws``, ``gcp``, ``azure``, or FOCUS's
   ``ProviderName``: ``AWS``, ``Google Cloud``, ``Microsoft``/``Microsoft Azure``);
2. the resource id's form: an ARM id (``/subscriptions/...``) is Azure's; a Compute Engine
   resource name, selfLink or ``gce://`` provider id is GCE's; ``i-`` and 8 or 17 hex digits
   (or an ``instance_id`` tag or detail of that form) is EC2's.

A bare name (``gpu-node-1``) with no provider says no cloud: it is not applicable, with the
reason, rather than guessed. A cloud whose executor is not configured (its SDK not installed,
or the lead's wiring passing None) is not applicable either, named in the reason.

``execute`` and ``observe`` go to the executor whose API the planned call names, so a call
read back from the audit table reaches the cloud it was planned for, or none.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from detector.remediation.base import ActionKind, Call, Executor, NotApplicable, Outcome, Target
from detector.remediation.workloads import shown

__all__ = ["NOT_INSTANCES", "Cloud", "StopInstances", "cloud_of"]

Cloud = Literal["ec2", "gce", "azure"]
NOT_INSTANCES = frozenset({"notebook", "pod", "inference_endpoint", "storage_bucket", "vector_db", "commitment",
                           "run", "project", "deployment", "network"})  # fmt: skip
"""Resource types that are not VMs: stopping "the instance" of a bucket or a run means nothing."""
_EC2_ID = re.compile(r"i-(?:[0-9a-f]{8}|[0-9a-f]{17})")
_PROVIDERS: dict[str, Cloud] = {
    "aws": "ec2", "amazon": "ec2", "amazon web services": "ec2", "ec2": "ec2",
    "gcp": "gce", "google": "gce", "google cloud": "gce", "google cloud platform": "gce", "gce": "gce",
    "azure": "azure", "microsoft": "azure", "microsoft azure": "azure",
}  # fmt: skip
_NAMES: dict[Cloud, str] = {"ec2": "EC2", "gce": "Compute Engine", "azure": "Azure"}
_API_PREFIXES: dict[Cloud, tuple[str, ...]] = {
    "ec2": ("ec2.",), "gce": ("compute.instances.",), "azure": ("Microsoft.Compute/virtualMachines/",),
}  # fmt: skip


def cloud_of(target: Target) -> Cloud:
    """Which cloud runs ``target``, or :class:`NotApplicable` saying why it cannot be told."""
    from detector.remediation.azure import looks_like_azure
    from detector.remediation.gce import looks_like_gce

    provider = target.details.get("provider")
    if isinstance(provider, str) and provider.strip():
        cloud = _PROVIDERS.get(provider.strip().lower())
        if cloud is None:
            raise NotApplicable(f"stop_instance acts on EC2, Compute Engine and Azure VMs, not on {shown(provider)}'s")
        return cloud
    rid = target.resource_id
    if looks_like_azure(rid):
        return "azure"
    if looks_like_gce(rid):
        return "gce"
    ids = (rid, target.details.get("instance_id"), target.tags.get("instance_id"))
    if any(isinstance(i, str) and _EC2_ID.fullmatch(i) for i in ids):
        return "ec2"
    raise NotApplicable(f"cannot tell which cloud runs {shown(rid)}: not an EC2 instance id, a Compute Engine "
                        "resource name or an Azure resource id, and the alert names no provider")  # fmt: skip


class StopInstances:
    """Dispatches ``stop_instance`` to the EC2, GCE or Azure executor (None: that cloud is not configured)."""

    kind: ClassVar[ActionKind] = "stop_instance"

    def __init__(self, ec2: Executor | None = None, gce: Executor | None = None, azure: Executor | None = None) -> None:
        self.executors: dict[Cloud, Executor | None] = {"ec2": ec2, "gce": gce, "azure": azure}

    def plan(self, target: Target) -> Call:
        if target.resource_type in NOT_INSTANCES:
            raise NotApplicable(f"{shown(target.resource_id)} is a {target.resource_type}, not a VM")
        cloud = cloud_of(target)
        executor = self.executors[cloud]
        if executor is None:
            configured = [_NAMES[c] for c, ex in self.executors.items() if ex is not None]
            also = f" (configured: {', '.join(configured)})" if configured else " (no cloud is configured)"
            raise NotApplicable(f"{shown(target.resource_id)} is a {_NAMES[cloud]} instance, and stopping "
                                f"{_NAMES[cloud]} instances is not configured in this worker{also}")  # fmt: skip
        return executor.plan(target)

    def _for(self, call: Call) -> Executor | None:
        for cloud, prefixes in _API_PREFIXES.items():
            if call.api.startswith(prefixes):
                return self.executors[cloud]
        return None

    def execute(self, call: Call) -> Outcome:
        executor = self._for(call)
        if executor is None:
            return Outcome(ok=False, detail=f"refused: no executor configured for {shown(call.api)}")
        return executor.execute(call)

    def observe(self, call: Call) -> Outcome | None:
        """The owning executor's ``observe`` (None where it has none, or none is configured)."""
        observe: Any = getattr(self._for(call), "observe", None)
        return observe(call) if observe is not None else None

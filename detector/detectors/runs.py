"""What run detectors share: following a project's runs, and a run's share of its hosts.

Run events are keyed by project, so a detector's state holds that project's open
runs. The hosts a run uses are other keys: the step's context looks them up
(``ctx.lookup``: what their own usage events said, price, instance type, pricing model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import msgspec

from detector.detectors.base import ResourceInfo
from detector.events import RunEvent
from detector.pricing import Pricing

__all__ = ["Fleet", "RunState", "RunHosts", "emptied", "follow", "hosts_of", "refresh"]

Fleet = Callable[[str], "ResourceInfo | None"]
V = TypeVar("V")


def emptied(runs: dict[str, V]) -> dict[str, V]:
    """``runs`` after a run left it, or a new empty dict once none is left: a dict keeps the table
    it grew to when its keys are deleted (464 bytes for a project that had eight runs open at once)."""
    return runs if runs else {}


class RunState(msgspec.Struct, kw_only=True, gc=False):
    start: float
    project: str = ""
    resource_ids: list[str] = []
    gpu_count: int = 0
    tags: dict[str, str] = {}


def follow(runs: dict[str, RunState], ev: RunEvent, t: float) -> RunState:
    """The run's state, created at its first event and refreshed from each later one."""
    run = runs.get(ev.run_id)
    if run is None:
        run = runs[ev.run_id] = RunState(start=t)
    refresh(run, ev)
    return run


def refresh(run: RunState, ev: RunEvent) -> None:
    """What a run event says of its run (project, hosts, GPUs, tags) replaces what it said before."""
    if ev.project:
        run.project = ev.project
    if ev.resource_ids:
        run.resource_ids = list(ev.resource_ids)
    if ev.gpu_count:
        run.gpu_count = ev.gpu_count
    if ev.tags:
        run.tags = dict(ev.tags)


class RunHosts(msgspec.Struct, kw_only=True, frozen=True):
    hosts: list[ResourceInfo]
    """The run's hosts with a known price."""
    share: float
    """The run's part of them: ``gpu_count`` over the hosts' GPUs, 1 when unknown."""
    gpus: int
    """GPUs the run holds (``gpu_count``, else the hosts' GPUs)."""

    @property
    def first(self) -> ResourceInfo:
        return self.hosts[0] if self.hosts else ResourceInfo()

    @property
    def usd_per_hour(self) -> float:
        """The run's share of its priced hosts' price per hour."""
        return sum(h.usd_per_hour or 0.0 for h in self.hosts) * self.share


def hosts_of(run: RunState, fleet: Fleet | None, pricing: Pricing) -> RunHosts:
    found = [fleet(rid) for rid in run.resource_ids] if fleet is not None else []
    hosts = [h for h in found if h is not None and h.usd_per_hour is not None]
    host_gpus = 0
    for host in hosts:
        price = pricing.instances.get(host.instance_type)
        host_gpus += price.gpus if price is not None else 0
    share = min(1.0, run.gpu_count / host_gpus) if run.gpu_count and host_gpus else 1.0
    return RunHosts(hosts=hosts, share=share, gpus=run.gpu_count or host_gpus)

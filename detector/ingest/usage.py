"""``resource-usage`` for the GPU hosts the bridge knows, so that a deployment with
only the bridge still has the "billed" state the GPU detectors price waste from.

Each event says the host ran ``running`` since the previous one (``ts`` is the start
of the interval, ``interval_s`` its length); the first sight of a host (in this process, or
after a gap) only starts its clock. So the bridge bills the time it saw a host between two
of its scrapes and nothing else: a restart or a ``--once`` check beside the running bridge
bills nothing twice (it may leave one interval unbilled: alert dollars err low, never above
the bill). The events carry no ``cost_usd``: the worker
prices it from ``rules/pricing.yaml``'s list price of its ``instance_type``. Turn it
off (``usage: false``) where a cloud usage exporter already reports these instances,
or their spend is counted twice.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec

from detector.events import UsageEvent
from detector.ingest.dcgm import event_time
from detector.ingest.hosts import Host

__all__ = ["UsageClock"]

MAX_GAP_INTERVALS = 5
"""A gap longer than this many scrape intervals since a host's previous event (the bridge
was down, the host left and came back) is not billed as running: the clock starts again."""
FORGET_S = 3600.0
"""A resource without an event for this long (and 5 intervals) is forgotten: its next event starts
a new interval, as it would after that gap anyway. Nodes come and go (autoscaling, spot): without
this the map grows with every instance the fleet ever ran."""


class UsageClock:
    """Intervals per resource: each event covers the time since that resource's previous one."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._swept = 0.0
        self.skipped: Counter[str] = Counter()
        """Events refused, per reason (the bridge reports them with the scrape)."""

    def event(self, host: Host, t: float) -> dict[str, Any] | None:
        """The usage event of ``host`` up to ``t``; None without an instance type (it
        could not be priced) or when ``t`` is not after the previous event's end."""
        instance_type = host.instance_type
        if not instance_type:
            return None
        previous = self._last.get(host.resource_id)
        if previous is not None and t <= previous:
            return None
        if previous is None or t - previous > MAX_GAP_INTERVALS * self.interval_s:
            # The clock starts: only time seen between two scrapes of this process is billed, so a
            # restart, a `--once` check beside the running bridge, or a gap never bills time twice.
            self._last[host.resource_id] = t
            self._sweep(t)
            return None
        interval = t - previous
        static, node = host.static, host.node
        event: dict[str, Any] = {
            "ts": event_time(t - interval),
            "resource_id": host.resource_id,
            "resource_type": "gpu_instance",
            "instance_type": instance_type,
            "state": "running",
            "interval_s": round(interval, 3),
        }
        provider = (static.provider if static else "") or (node.provider if node else "")
        region = (static.region if static else "") or (node.region if node else "")
        pricing = static.pricing if static and static.pricing != "on_demand" else (node.pricing if node else "on_demand")
        for key, value in (("provider", provider), ("region", region), ("account", static.account if static else "")):
            if value:
                event[key] = value
        if pricing != "on_demand":
            event["pricing"] = pricing
        tags = {**(node.tags if node else {}), **(static.tags if static else {})}
        if tags:
            event["tags"] = tags
        try:  # a node label kube-state-metrics passed on (a 2,000-character instance type) must not dead-letter
            msgspec.convert(event, UsageEvent)
        except msgspec.ValidationError as exc:
            self.skipped[f"usage event breaks the resource-usage contract: {exc}"] += 1
            return None
        self._last[host.resource_id] = t
        self._sweep(t)
        return event

    def _sweep(self, t: float) -> None:
        """Forget the resources not seen for :data:`FORGET_S` (at most once per that time: O(1) per event)."""
        keep = max(FORGET_S, MAX_GAP_INTERVALS * self.interval_s)
        if t - self._swept < keep:
            return
        self._swept = t
        self._last = {key: last for key, last in self._last.items() if last >= t - keep}

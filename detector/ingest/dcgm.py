"""dcgm-exporter samples -> ``gpu-metrics`` events, one list per host.

The field names are dcgm-exporter's own (``DCGM_FI_*``), the labels as it renders
them (``/work/shared/reference/dcgm-exporter/NOTES.md``, docs/ingest.md):
``gpu``, ``UUID`` (``uuid`` with the old namespace), ``modelName``, ``Hostname``
(released versions) or ``hostname`` (newer), ``GPU_I_PROFILE``/``GPU_I_ID`` under
MIG, and in Kubernetes mode ``pod``/``namespace``/``container`` (older
``pod_name``/``pod_namespace``/``container_name``; ``exported_*`` after Prometheus).

A mapper is stateful for two reasons: average power from the energy counter needs
the previous reading, and a sample whose timestamp is not newer than the last one
published for that GPU (a ``/federate`` answer repeating Prometheus' last scrape)
is not published twice.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from detector.events import GpuMetric
from detector.ingest.hosts import Host, StaticHost, resolve_host
from detector.ingest.kube import KubeState
from detector.ingest.labels import label
from detector.ingest.prometheus import MAX_BEHIND_S, Sample, instance_host, plausible_time
from detector.units import rfc3339

__all__ = ["DcgmMapper", "HostBatch", "event_time"]

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
POWER = "DCGM_FI_DEV_POWER_USAGE"
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
"""A counter in mJ since boot: average power between two scrapes when POWER_USAGE is absent."""
FB = {"DCGM_FI_DEV_FB_USED": "used", "DCGM_FI_DEV_FB_FREE": "free", "DCGM_FI_DEV_FB_RESERVED": "reserved"}
RATIOS = {
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gr_engine_active",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active",
}
FIELDS = frozenset({GPU_UTIL, POWER, ENERGY, *FB, *RATIOS})
SLACK = 0.01
"""A ratio up to 1 % beyond 0..1 (rounding in the exporter) is clamped; further out it is refused."""
STATE_TTL_S = MAX_BEHIND_S
"""A GPU not seen for this long is forgotten (its energy reading and last time): memory stays bounded. No longer
than a sample's timestamp may lag the scrape, or a sample older than it would be published again each scrape."""


def event_time(t: float) -> str:
    """Epoch seconds as the contract's RFC 3339, to the millisecond (DateTime64(3))."""
    return rfc3339(round(t, 3))


@dataclass
class HostBatch:
    """One host's GPUs from one scrape: one ``gpu-metrics`` message."""

    host: Host
    events: list[dict[str, Any]]
    t: float
    """The latest event time among them."""


@dataclass
class _Unit:
    """The samples of one GPU (or MIG instance) of one host, gathered from one scrape."""

    host: str
    index: int
    mig_instance: str
    labels: dict[str, str]
    values: dict[str, Sample] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, int, str]:
        return self.host, self.index, self.mig_instance


class DcgmMapper:
    """Maps the DCGM samples of successive scrapes of one target; ``skipped`` counts
    what was left out and why (a reason per sample or GPU)."""

    def __init__(self) -> None:
        self.skipped: Counter[str] = Counter()
        self._energy: dict[tuple[str, int, str], tuple[float, float]] = {}
        self._last: dict[tuple[str, int, str], float] = {}

    def map(self, samples: Iterable[Sample], *, t: float, instance: str, kube: KubeState | None = None,
            hosts: Mapping[str, StaticHost] | None = None, kubernetes: bool = False) -> list[HostBatch]:  # fmt: skip
        """The events of one scrape taken at ``t`` (epoch seconds) from ``instance`` (the
        target's address, the host when a sample names none), grouped per host.

        ``kube``: the latest kube-state-metrics state, or None when there is none (fresh
        enough); ``kubernetes``: the target's GPUs are Kubernetes nodes' even when ``kube``
        does not list them (allocation, docs/ingest.md)."""
        units = self._gather(samples, instance)
        by_host: dict[str, list[_Unit]] = {}
        for unit in units.values():
            by_host.setdefault(unit.host, []).append(unit)
        # Through Prometheus, an exporter whose GPUs' pods come as exported_pod has its own pod as
        # `pod` on every series: on the others (no exported_pod) that one names no GPU's pod.
        relabelled = {u.labels.get("instance") for u in units.values() if "exported_pod" in u.labels}
        batches = []
        for name, host_units in by_host.items():
            host = resolve_host(name, kube, hosts or {})
            events = [e for e in (self._event(u, host, t, kube, relabelled) for u in self._gpus(host_units))
                      if e is not None]  # fmt: skip
            if not events:
                continue
            self._allocate(events, host, kube, kubernetes)
            batches.append(HostBatch(host, [e for e, _ in events], max(te for _, te in events)))
        self._forget(t)
        return batches

    def _gather(self, samples: Iterable[Sample], instance: str) -> dict[tuple[str, int, str], _Unit]:
        units: dict[tuple[str, int, str], _Unit] = {}
        for s in samples:
            if s.name not in FIELDS:
                continue
            labels = s.labels
            host = label(labels, "Hostname", "hostname") or instance_host(label(labels, "instance") or instance)
            gpu = labels.get("gpu", "")  # the exporter writes the index in decimal digits: "1_0" is no GPU 10
            index = int(gpu) if 0 < len(gpu) <= 3 and gpu.isascii() and gpu.isdigit() else -1
            if not 0 <= index <= 255:
                self.skipped["gpu label missing or not 0-255"] += 1
                continue
            key = (host, index, labels.get("GPU_I_ID", ""))
            unit = units.get(key)
            if unit is None:
                unit = units[key] = _Unit(host, index, key[2], labels)
            if s.name in unit.values:  # a GPU shared by time-sliced pods: a series per pod, the first kept
                if s.name == GPU_UTIL:
                    self.skipped["more than one series of a GPU (time-sliced pods?): the first kept"] += 1
                continue
            if s.name == GPU_UTIL:
                unit.labels = labels  # the pod labels of the GPU's utilisation are the ones published
            unit.values[s.name] = s
        return units

    def _gpus(self, units: list[_Unit]) -> list[_Unit]:
        """The GPUs and MIG instances to publish: under MIG, the whole GPU's own samples
        (power, energy) are no unit of their own."""
        mig = {u.index for u in units if u.mig_instance}
        out = []
        for u in units:
            if not u.mig_instance and u.index in mig:
                self.skipped["MIG parent GPU (its instances are published)"] += 1
                continue
            out.append(u)
        return out

    def _event(self, unit: _Unit, host: Host, t: float, kube: KubeState | None,
               relabelled: set[str | None]) -> tuple[dict[str, Any], float] | None:  # fmt: skip
        util_sample = unit.values.get(GPU_UTIL)
        ratios = {fld: self._ratio(unit.values[name], fld) for name, fld in RATIOS.items() if name in unit.values}
        if util_sample is not None:
            util = self._bounded(util_sample.value, 100.0, "util_pct")
        elif unit.mig_instance and ratios.get("gr_engine_active") is not None:
            # GPU_UTIL is not supported under MIG; GR_ENGINE_ACTIVE is its profiling form
            util = ratios["gr_engine_active"] * 100.0  # type: ignore[operator]  # checked just above
        else:
            self.skipped["no DCGM_FI_DEV_GPU_UTIL (util_pct is required)"] += 1
            return None
        if util is None:
            return None
        first = util_sample or next(iter(unit.values.values()))
        te = first.timestamp if first.timestamp is not None else t
        if not plausible_time(te, t):
            self.skipped["sample timestamp not finite, over an hour behind or ahead of the scrape"] += 1
            return None
        last = self._last.get(unit.key)
        if last is not None and te <= last:
            self.skipped["not newer than the last sample published"] += 1
            return None
        labels = unit.labels
        event: dict[str, Any] = {"ts": event_time(te), "resource_id": host.resource_id, "gpu_index": unit.index,
                                 "util_pct": util}  # fmt: skip
        if uuid := labels.get("UUID") or labels.get("uuid"):
            event["gpu_uuid"] = uuid
        if model := labels.get("modelName"):
            event["model"] = model
        fb = {role: unit.values[name].value for name, role in FB.items() if name in unit.values}
        if "used" in fb and all(math.isfinite(v) and v >= 0 for v in fb.values()):
            event["mem_used_mib"] = fb["used"]
            if "free" in fb:
                event["mem_total_mib"] = sum(fb.values())
        elif fb:
            self.skipped["framebuffer not finite, negative or without FB_USED"] += 1
        power = self._power(unit, te)
        if power is not None:
            event["power_w"] = power
        event.update({fld: v for fld, v in ratios.items() if v is not None})
        if unit.mig_instance:
            event["mig_instance"] = unit.mig_instance
            if profile := labels.get("GPU_I_PROFILE"):
                event["mig_profile"] = profile
        if host.resource_id != host.name:
            event["hostname"] = host.name
        tags = dict(host.static.tags) if host.static else {}
        pod, namespace = self._pod(labels, kube, relabelled)
        if pod:
            event["namespace"], event["pod"] = namespace, pod
            if container := label(labels, "container", "container_name"):
                event["container"] = container
            if kube is not None:
                if workload := kube.workloads.get((namespace, pod)):
                    event["workload"] = workload
                tags.update(kube.tags(namespace, pod))
        if tags:
            event["tags"] = tags
        try:  # one absurd value or label (power 1e300, a 2,000-character pod) must not dead-letter the host
            msgspec.convert(event, GpuMetric)
        except msgspec.ValidationError as exc:
            self.skipped[f"breaks the gpu-metrics contract: {exc}"] += 1
            return None
        self._last[unit.key] = te
        return event, te

    def _pod(self, labels: dict[str, str], kube: KubeState | None, relabelled: set[str | None]) -> tuple[str, str]:
        """(pod, namespace) holding the GPU, or empty: a ``pod`` label that is the scraped
        exporter's own (see :meth:`map`), or that names a pod kube-state-metrics knows and
        which requests no GPU (dcgm-exporter names only pods the device plugin gave a GPU)."""
        if "exported_pod" not in labels and labels.get("instance") in relabelled:
            return "", ""
        pod = label(labels, "pod", "pod_name")
        namespace = label(labels, "namespace", "pod_namespace")
        if pod and kube is not None and (namespace, pod) in kube.pods and (namespace, pod) not in kube.gpu_pods:
            self.skipped["pod label names a pod that requests no GPU (the exporter's own?)"] += 1
            return "", ""
        return pod, namespace

    def _bounded(self, value: float, top: float, name: str) -> float | None:
        """``value`` within 0..top, clamped within the slack; None (counted) beyond it."""
        if not math.isfinite(value) or not -SLACK * top <= value <= (1 + SLACK) * top:
            self.skipped[f"{name} outside 0-{top:g}"] += 1
            return None
        return min(max(value, 0.0), top)

    def _ratio(self, sample: Sample, name: str) -> float | None:
        return self._bounded(sample.value, 1.0, name)

    def _power(self, unit: _Unit, te: float) -> float | None:
        """POWER_USAGE; else the average over the interval since the energy counter's
        previous reading (none at the first reading, or when the counter went down: a
        reset, as Prometheus' rate() treats it)."""
        power = unit.values.get(POWER)
        if power is not None:
            if math.isfinite(power.value) and power.value >= 0:
                return power.value
            self.skipped["power_w not a number or negative (the energy counter stands in)"] += 1
        energy = unit.values.get(ENERGY)
        if energy is None or not math.isfinite(energy.value):
            return None
        at = energy.timestamp if energy.timestamp is not None else te
        previous = self._energy.get(unit.key)
        self._energy[unit.key] = (at, energy.value)
        if previous is None or at <= previous[0]:
            return None
        if energy.value < previous[1]:
            self.skipped["energy counter reset (no power for that interval)"] += 1
            return None
        return (energy.value - previous[1]) / 1000.0 / (at - previous[0])

    def _allocate(self, events: list[tuple[dict[str, Any], float]], host: Host, kube: KubeState | None,
                  kubernetes: bool) -> None:  # fmt: skip
        """``allocated`` per GPU: a pod label says True. On a node kube-state-metrics knows,
        an unlabelled GPU is False when the node's pods request no GPU, or no more than the
        labelled ones; otherwise (dcgm-exporter not in Kubernetes mode, or behind) it stays
        unknown: which GPUs are held is never guessed. A host of a target marked
        ``kubernetes`` that kube-state-metrics does not list counts as a node whose pods request
        nothing, unless kube-state-metrics lists nodes at all: then its label names no node (a
        FQDN against a short name?), and its allocation stays unknown, counted."""
        labelled = sum(1 for e, _ in events if e.get("pod"))
        for e, _ in events:
            if e.get("pod"):
                e["allocated"] = True
        if kube is None or (host.node is None and not kubernetes):
            return
        if host.node is None and kube.lists_nodes:
            self.skipped["host label names no node kube-state-metrics lists: allocation unknown"] += 1
            return
        requested = host.node.gpus_requested if host.node is not None else 0.0
        if requested == 0 or labelled >= requested:
            for e, _ in events:
                e.setdefault("allocated", False)

    def _forget(self, t: float) -> None:
        horizon = t - STATE_TTL_S
        for key in [k for k, last in self._last.items() if last < horizon]:
            del self._last[key]
        for key in [k for k, (at, _) in self._energy.items() if at < horizon]:
            del self._energy[key]

"""One scrape as the GPU rules read it: a host's GPU samples at one time, with what several
rules would each work out from them, worked out once.

Six rules see every scrape of every GPU host (``idle_gpu``, ``stuck_gpu``, ``partly_idle_gpu``,
``unallocated_gpu``, ``data_starved_training``, ``telemetry_stale``). Each used to loop over the
samples asking the same questions of each: is it busy at 5 %, which GPU is it, does it name a
pod. The engine makes one :class:`Scrape` per scrape and hands it to every rule's
``step_scrape``: the questions asked of every sample are answered here, in C where the answer
is a plain attribute (``map`` over the samples), and a rule reads the samples themselves only
for what is its own. A rule may then see in O(1) that a scrape is the usual one (the same GPUs,
model and no Kubernetes fields as before) and skip its per-sample bookkeeping.

On Kubernetes the samples also say who holds each GPU (dcgm-exporter's pod labels, the bridge's
``allocated``). The pod a sample names (:func:`~detector.detectors.pods.pod_of`), its unit's key
and the holders by unit are worked out here once, on the first rule's asking, and shared: four
rules keep them, and in the usual Kubernetes scrape (every unit held as its latest sample said)
each sees so by comparing its own with the scrape's, in C, and keeps nothing sample by sample.
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import attrgetter, is_not
from typing import cast

from detector.detectors.activity import busy_flags, resident_shares
from detector.detectors.pods import Pod, pod_of
from detector.events import GpuMetric

__all__ = ["FIRST", "KEYS", "UNIT_KEYS", "Scrape"]

FIRST = tuple(tuple(range(n)) for n in range(257))
"""``FIRST[n]`` is GPUs ``0 .. n-1``, the GPUs of most hosts in the order they report (an index
is at most 255): one tuple of each, shared by every scrape and state that has it."""

KEYS = tuple(str(i) for i in range(256))
"""A whole GPU's unit key by index (``"3"``; a MIG instance's is ``"3/1"``), made once."""
UNIT_KEYS = tuple(KEYS[:n] for n in range(257))
"""``UNIT_KEYS[n]``: the keys of whole GPUs ``0 .. n-1``, the units of most hosts in order."""

_gpu_index = attrgetter("gpu_index")
_model = attrgetter("model")
_pod = attrgetter("pod")
_mig = attrgetter("mig_instance")
_allocated = attrgetter("allocated")
_off_kubernetes = attrgetter("allocated", "pod", "mig_instance")
_PLAIN = (None, "", "")
"""A sample's ``allocated``, ``pod`` and ``mig_instance`` on a host off Kubernetes without MIG
(:attr:`Scrape.plain`): a scrape whose every sample has them is plain in one pass over it."""


class Scrape:
    """The samples of one host at one time (one or more, in the order they came), and what the
    GPU rules ask of each of them. Made by the engine per scrape, read by the rules during their
    ``step_scrape`` calls, never kept."""

    __slots__ = ("samples", "gpus", "model", "holders_unknown", "pods_named", "mig", "plain", "_busy", "_resident",
                 "_units", "_pods", "_allocations", "_by_unit")  # fmt: skip

    def __init__(self, samples: list[GpuMetric]) -> None:
        self.samples = samples
        n = len(samples)
        gpus = tuple(map(_gpu_index, samples))
        first = FIRST[n] if n < len(FIRST) else None
        self.gpus: tuple[int, ...] = first if gpus == first else gpus
        """The samples' GPU indexes in order (:data:`FIRST` ``[n]`` itself when they are ``0 .. n-1``)."""
        models = list(map(_model, samples))  # all equal to the first, counted in C: no set of them built
        self.model: str | None = models[0] if n and models.count(models[0]) == n else None
        """The model every sample names ("" when none does); None when they differ."""
        if n and list(map(_off_kubernetes, samples)).count(_PLAIN) == n:  # the usual host: one pass, not three
            holders_unknown, pods_named, mig = True, False, False
        else:
            holders_unknown = set(map(_allocated, samples)) == {None}
            pods_named, mig = any(map(_pod, samples)), any(map(_mig, samples))
        self.holders_unknown = holders_unknown
        """No sample says whether a pod holds its GPU (``allocated``: off Kubernetes, or the bridge could not tell)."""
        self.pods_named = pods_named
        """Some sample names a pod (dcgm-exporter's Kubernetes mode)."""
        self.mig = mig
        """Some sample is a MIG instance's."""
        self.plain = holders_unknown and not pods_named and not mig
        """Nor does any name a pod or a MIG instance: a host off Kubernetes without MIG, the usual host."""
        self._busy: dict[float, tuple[bool, ...]] = {}
        self._resident: tuple[float, ...] | None = None
        self._units: tuple[str, ...] | None
        self._pods: tuple[Pod | None, ...] | None
        self._allocations: tuple[bool | None, ...] | None
        self._units = self._pods = self._allocations = None  # (worked out on the first asking)
        self._by_unit: tuple[dict[str, Pod], dict[str, bool]] | None | bool = False

    def busy(self, threshold_pct: float) -> tuple[bool, ...]:
        """Per sample, whether it shows work at this threshold (:func:`detector.detectors.activity.busy`);
        worked out once per threshold (the rules that ask share theirs, 5 % by default)."""
        flags = self._busy.get(threshold_pct)
        if flags is None:
            flags = self._busy[threshold_pct] = busy_flags(self.samples, threshold_pct)
        return flags

    def resident(self) -> tuple[float, ...]:
        """Per sample, the share of time (percent) a kernel was resident
        (:func:`detector.detectors.activity.resident`)."""
        shares = self._resident
        if shares is None:
            shares = self._resident = resident_shares(self.samples)
        return shares

    def distinct_gpus(self) -> tuple[int, ...]:
        """The samples' GPU indexes in the order first seen, each once (a MIG GPU's instances make one)."""
        distinct = tuple(dict.fromkeys(self.gpus))
        n = len(distinct)
        return FIRST[n] if n < len(FIRST) and distinct == FIRST[n] else distinct

    def units(self) -> tuple[str, ...]:
        """Per sample, its unit's key: its GPU's index (:data:`KEYS`), ``"3/1"`` for MIG instance 1 of GPU 3
        (:data:`UNIT_KEYS` ``[n]`` itself for whole GPUs ``0 .. n-1``)."""
        units = self._units
        if units is None:
            gpus = self.gpus
            if self.mig:
                units = tuple([f"{ev.gpu_index}/{ev.mig_instance}" if ev.mig_instance else KEYS[ev.gpu_index]
                               for ev in self.samples])  # fmt: skip
            elif gpus is FIRST[len(gpus)]:
                units = UNIT_KEYS[len(gpus)]
            else:
                units = tuple(map(KEYS.__getitem__, gpus))
            self._units = units
        return units

    def pods(self) -> tuple[Pod | None, ...]:
        """Per sample, the pod it names (:func:`~detector.detectors.pods.pod_of`), or None."""
        pods = self._pods
        if pods is None:
            pods = self._pods = tuple(map(pod_of, self.samples)) if self.pods_named else (None,) * len(self.samples)
        return pods

    def allocations(self) -> tuple[bool | None, ...]:
        """Per sample, whether a pod holds its unit (``allocated``: None where it does not say)."""
        allocations = self._allocations
        if allocations is None:
            allocations = self._allocations = tuple(map(_allocated, self.samples))
        return allocations

    def by_unit(self) -> tuple[dict[str, Pod], dict[str, bool]] | None:
        """The pods named and the allocations said, by unit (the samples that name none left out), as a
        state that keeps each unit's latest holder holds them after this scrape; None when a unit has
        two samples in it (the order would matter: such a scrape is read sample by sample)."""
        found = self._by_unit
        if found is False:
            units = self.units()
            if len(set(units)) != len(units):
                found = None
            else:
                pods, allocations = self.pods(), self.allocations()
                said = map(is_not, allocations, repeat(None))
                named, told = compress(zip(units, pods, strict=True), pods), compress(zip(units, allocations, strict=True), said)
                found = cast("tuple[dict[str, Pod], dict[str, bool]]", (dict(named), dict(told)))  # (None left out)
            self._by_unit = found
        return found  # type: ignore[return-value]

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
"""

from __future__ import annotations

from operator import attrgetter

from detector.detectors.activity import busy, resident
from detector.events import GpuMetric

__all__ = ["FIRST", "Scrape"]

FIRST = tuple(tuple(range(n)) for n in range(257))
"""``FIRST[n]`` is GPUs ``0 .. n-1``, the GPUs of most hosts in the order they report (an index
is at most 255): one tuple of each, shared by every scrape and state that has it."""

_gpu_index = attrgetter("gpu_index")
_model = attrgetter("model")
_pod = attrgetter("pod")
_mig = attrgetter("mig_instance")
_allocated = attrgetter("allocated")


class Scrape:
    """The samples of one host at one time (one or more, in the order they came), and what the
    GPU rules ask of each of them. Made by the engine per scrape, read by the rules during their
    ``step_scrape`` calls, never kept."""

    __slots__ = ("samples", "gpus", "model", "holders_unknown", "plain", "_busy", "_resident")

    def __init__(self, samples: list[GpuMetric]) -> None:
        self.samples = samples
        gpus = tuple(map(_gpu_index, samples))
        first = FIRST[len(gpus)] if len(gpus) < len(FIRST) else None
        self.gpus: tuple[int, ...] = first if gpus == first else gpus
        """The samples' GPU indexes in order (:data:`FIRST` ``[n]`` itself when they are ``0 .. n-1``)."""
        models = set(map(_model, samples))
        self.model: str | None = models.pop() if len(models) == 1 else None
        """The model every sample names ("" when none does); None when they differ."""
        self.holders_unknown = set(map(_allocated, samples)) == {None}
        """No sample says whether a pod holds its GPU (``allocated``: off Kubernetes, or the bridge could not tell)."""
        self.plain = self.holders_unknown and not any(map(_pod, samples)) and not any(map(_mig, samples))
        """Nor does any name a pod or a MIG instance: a host off Kubernetes without MIG, the usual host."""
        self._busy: dict[float, tuple[bool, ...]] = {}
        self._resident: tuple[float, ...] | None = None

    def busy(self, threshold_pct: float) -> tuple[bool, ...]:
        """Per sample, whether it shows work at this threshold (:func:`detector.detectors.activity.busy`);
        worked out once per threshold (the rules that ask share theirs, 5 % by default)."""
        flags = self._busy.get(threshold_pct)
        if flags is None:
            flags = self._busy[threshold_pct] = tuple([busy(ev, threshold_pct) for ev in self.samples])
        return flags

    def resident(self) -> tuple[float, ...]:
        """Per sample, the share of time (percent) a kernel was resident
        (:func:`detector.detectors.activity.resident`)."""
        shares = self._resident
        if shares is None:
            shares = self._resident = tuple([resident(ev) for ev in self.samples])
        return shares

"""Several workers: hold run events until the hosts another worker holds are stored through their time.

A run event is keyed by project and its hosts by resource, so with several workers a run's hosts
may be held by another one, and the run detectors then look them up in the store as of the run
event's time (:class:`~streams.app.HostDirectory`). Catching up a backlog, that worker may not have
stored those usage rows yet: the run is unpriced, or priced as its host was earlier, where
``backtest`` (and one worker) decide on the host as it was. So each worker records, with each
batch's write (after its events), how far each ``resource-usage`` partition it holds is stored
(:class:`~detector.store.progress.PartitionProgress`): the partition's time as the aligner counts a
source's (its latest message's earliest event) and whether it is caught up. A worker that does not
hold every usage partition releases nothing later than what the others have stored through, less
the aligner's lateness (what a partition's time promises of the events before it, as for the
watermark): :meth:`GroupProgress.cap`. What is later waits in the aligner, in order, as behind a
slow partition, while fetching and storing go on, so a worker's own stored time passes what it holds
and two workers cannot wait on each other. The cap bounds the whole release, not run events alone:
the engine sees events in the order backtest does.

A worker holding every usage partition (one worker alone) records and reads nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

import structlog

from detector.align import EventTimeAligner
from detector.events import TOPIC_RESOURCE_USAGE, TOPIC_RUN_EVENTS, TOPICS
from detector.store.progress import PartitionProgress

__all__ = ["GroupProgress"]

log = structlog.get_logger("burnwatch.worker")

TP = tuple[str, int]
Row = tuple[int, float, bool]
_INF = float("inf")


def _generation(generation: int | None) -> int:
    """The group generation as recorded: -1 where none is known (a pipeline outside a group)."""
    return -1 if generation is None else generation


class GroupProgress:
    """What this worker records of its usage partitions, and how far the others' let it release."""

    def __init__(self, progress: PartitionProgress, partition_count: Callable[[str], int], lateness_s: float) -> None:
        self.repository = progress
        self.partition_count = partition_count
        """A topic's partition count, as the group's metadata has it when partitions are assigned (not
        ``BURNWATCH_PARTITIONS``, which only says how many to make: topics made otherwise keep theirs, and
        a worker holding all of fewer partitions must not wait for ones that do not exist)."""
        self.lateness_s = lateness_s
        self.held: list[int] = []
        """Usage partitions this worker holds, when it records them (it does not hold every input partition)."""
        self.others: list[int] = []
        """Usage partitions held elsewhere, when this worker reads them (it holds run events)."""
        self.recorded: dict[int, tuple[float, bool]] = {}
        """What the last write recorded (or queued) per usage partition held: unchanged is not written again."""
        self.cap = _INF
        """What this worker may release up to, as last read (inf: nothing read, or nothing holds it)."""
        self._read_at = -_INF
        self._capped_since: float | None = None
        self._logged = -_INF
        self.unrecorded: list[int] = []
        """Usage partitions held elsewhere of which the last read found no progress recorded in this group
        generation: a holder that has stored nothing since the rebalance, or one of a release that records none
        (before 2026-12-04: a rolling upgrade, where a row a new worker left in an earlier generation stays)."""

    def assign(self, assigned: Collection[TP] | None) -> None:
        """The partitions this worker now holds (None: every one). Nothing is recorded yet for them."""
        self.recorded.clear()
        self.cap, self._read_at, self._capped_since = -_INF, -_INF, None
        counts = {topic: self.partition_count(topic) for topic in TOPICS}
        everything = {(topic, p) for topic in TOPICS for p in range(counts[topic])}
        if assigned is None or everything <= set(assigned):
            self.held, self.others, self.cap = [], [], _INF
            return
        self.held = sorted(p for topic, p in assigned if topic == TOPIC_RESOURCE_USAGE)
        runs = any(topic == TOPIC_RUN_EVENTS for topic, _ in assigned)
        self.others = sorted(set(range(counts[TOPIC_RESOURCE_USAGE])) - set(self.held)) if runs else []
        if not self.others:
            self.cap = _INF

    def to_record(self, aligner: EventTimeAligner) -> list[Row]:
        """The usage partitions held whose progress changed since the last record, marked recorded:
        the caller writes them after the events they cover (the writer thread keeps that order)."""
        rows: list[Row] = []
        for p in self.held:
            now = aligner.progress((TOPIC_RESOURCE_USAGE, p))
            if self.recorded.get(p) != now:
                self.recorded[p] = now
                rows.append((p, now[0], now[1]))
        return rows

    def record(self, rows: list[Row], version: int, generation: int | None) -> None:
        """Write rows :meth:`to_record` gave (in the writer thread, after the events they cover), as a
        holder of the group's ``generation``."""
        self.repository.record(TOPIC_RESOURCE_USAGE, rows, version, _generation(generation))

    def wanted(self, watermark: float) -> bool:
        """Whether to read the others' progress before a release: only where partitions are held
        elsewhere, and there when the last cap holds the watermark back, or said that nothing holds
        it (every other partition caught up) a second ago or more: a partition caught up falls
        behind again when its next messages come (a worker restarting into a backlog)."""
        if not self.others:
            return False
        if self.cap == _INF:
            return time.monotonic() - self._read_at >= 1.0
        return watermark > self.cap

    def read(self, generation: int | None) -> float:
        """The others' progress (a query: call it off the event loop): the cap. A partition is caught up
        only as a holder of this ``generation`` said: one of an earlier generation (before a restart or
        a rebalance) said nothing of a backlog since, though what it stored stays stored."""
        found = self.repository.read(TOPIC_RESOURCE_USAGE)
        now = _generation(generation)
        self.unrecorded = [p for p in self.others if p not in found or found[p][2] != now]
        cap = _INF
        for p in self.others:
            through, done, said_in = found.get(p, (-_INF, False, now))
            if not (done and said_in == now):
                cap = min(cap, through - self.lateness_s)
        return cap

    def held_s(self) -> float:
        """Seconds the others' progress has held this worker's release back, as last read (0: it does
        not): what ``/healthz`` shows as ``held_by_other_workers_s``."""
        return 0.0 if self._capped_since is None else time.monotonic() - self._capped_since

    def update(self, cap: float, watermark: float) -> None:
        """Take a cap read; say so (once in 30 s) when one holds the release back for long."""
        now = time.monotonic()
        self.cap, self._read_at = cap, now
        if cap >= watermark:
            self._capped_since = None
            return
        if self._capped_since is None:
            self._capped_since = now
        elif now - self._capped_since >= 30.0 and now - self._logged >= 30.0:
            self._logged = now
            note = ("usage partitions other workers hold are not stored this far; a dead worker holds this until "
                    "the group reassigns its partitions")
            if self.unrecorded:  # a worker from before partition progress (0020) beside this one: it records none
                note += ("; unrecorded_since_rebalance: their holder has recorded no progress since the group last "
                         "rebalanced, a worker stuck before its first write or one of a release before 2026-12-04 "
                         "(a rolling upgrade), which records none: this worker releases nothing until that one "
                         "leaves the group")
            log.warning("release_held_by_other_workers", held_s=round(now - self._capped_since),
                        stored_through=cap + self.lateness_s, watermark=watermark, partitions=self.others,
                        unrecorded_since_rebalance=self.unrecorded, note=note)  # fmt: skip

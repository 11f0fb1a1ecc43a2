"""Events buffered as columns for one insert per table, and their content ids.

A chdb insert costs ~5 ms per call, so one insert per event would cap the whole worker at
~200 events/s: events are buffered and inserted in large columnar batches.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgspec

from detector.events import ADDED_FIELDS, Event, GpuMetric, RunEvent, UsageEvent
from detector.pricing import Pricer, Pricing

__all__ = ["GPU_COLS", "KIND", "RUN_COLS", "SOURCE_COLS", "USAGE_COLS", "EventBatch", "Source", "event_ids"]

_json = msgspec.json.Encoder()

USAGE_COLS = [
    "ts", "resource_id", "resource_type", "provider", "account", "region", "instance_type", "pricing",
    "state", "interval_s", "cost_usd", "egress_bytes", "dest_region", "storage_bytes", "capacity_bytes",
    "vector_count", "requests", "tags", "extra", "metrics",
]  # fmt: skip
GPU_COLS = [
    "ts", "resource_id", "gpu_index", "gpu_uuid", "model", "util_pct", "mem_used_mib", "mem_total_mib",
    "power_w", "sm_active", "gr_engine_active", "tensor_active", "dram_active", "mig_profile", "mig_instance",
    "hostname", "namespace", "pod", "container", "workload", "allocated", "tags", "extra",
]  # fmt: skip
RUN_COLS = ["ts", "run_id", "status", "resource_ids", "gpu_count", "project", "tags", "error", "extra"]
SOURCE_COLS = ["event_id", "src_topic", "src_partition", "src_offset"]
KIND: dict[type, tuple[bytes, str]] = {GpuMetric: (b"gpu", "gpu_metrics"), UsageEvent: (b"usage", "resource_usage"),
                                       RunEvent: (b"run", "run_events")}  # fmt: skip
"""Event type → (the id's personalisation, its table)."""

Source = tuple[str, int, int]
"""(topic, partition, offset) of the Kafka message events came in."""
_NO_SOURCE: Source = ("", 0, 0)


def _extra(event: Event) -> str:
    return _json.encode(event.extra).decode()


class EventBatch:
    """Events buffered per table, with the Kafka message each came from, turned into columns
    at insert time.

    Building columns with one comprehension per column costs a fraction of
    appending each event's values one by one (and a chunk of events at a time, half again).
    """

    def __init__(self) -> None:
        self.usage: list[UsageEvent] = []
        self.gpu: list[GpuMetric] = []
        self.runs: list[RunEvent] = []
        self._runs: dict[type, list[tuple[Source, int]]] = {UsageEvent: [], GpuMetric: [], RunEvent: []}
        """Per type: (source, number of events) in the order added (a message's events are one run)."""
        self._lists: dict[type, list[Any]] = {UsageEvent: self.usage, GpuMetric: self.gpu, RunEvent: self.runs}

    def __len__(self) -> int:
        return len(self.usage) + len(self.gpu) + len(self.runs)

    def extend(self, events: Sequence[Event], source: Source = _NO_SOURCE) -> None:
        """Add events; ``source``: (topic, partition, offset) of the message they came in. A
        message holds events of one type (its topic's), kept as one run, not per event."""
        if len(events) == 1:  # the message of one event many exporters send
            kind = type(events[0])
            self._lists[kind].append(events[0])
            self._runs[kind].append((source, 1))
            return
        if not events:
            return
        kinds = set(map(type, events))
        if len(kinds) == 1:
            kind = kinds.pop()
            self._lists[kind].extend(events)
            self._runs[kind].append((source, len(events)))
            return
        for event in events:  # mixed types (built by hand, not decoded from one message)
            kind = type(event)
            self._lists[kind].append(event)
            self._runs[kind].append((source, 1))

    def tables(self, pricing: Pricing | Pricer | None = None) -> Iterator[tuple[str, list[str], list[list[Any]]]]:
        """(table, column names, columns) for each table with rows; the last four columns are
        the event id (from its content) and the source topic, partition and offset.
        ``pricing`` prices usage intervals (the ``usd`` and ``egress_usd`` columns) with the
        same :class:`~detector.pricing.Pricer` the engine hands the detectors."""
        pricer = pricing if isinstance(pricing, Pricer) else Pricer(pricing)
        if self.gpu:
            yield (
                "gpu_metrics",
                [*GPU_COLS, *SOURCE_COLS],
                [*_in_chunks(self.gpu, _gpu_columns), *_source_columns(self._runs[GpuMetric])],
            )
        if self.usage:
            yield "resource_usage", [*USAGE_COLS, "usd", "egress_usd", *SOURCE_COLS], [
                *_in_chunks(self.usage, lambda ev: _usage_columns(ev, pricer)), *_source_columns(self._runs[UsageEvent])
            ]  # fmt: skip
        if self.runs:
            yield (
                "run_events",
                [*RUN_COLS, *SOURCE_COLS],
                [*_in_chunks(self.runs, _run_columns), *_source_columns(self._runs[RunEvent])],
            )


_CHUNK = 1024
"""Events turned into columns at a time. Each column is one pass over the events: over a
chunk they stay in the CPU's cache from one column to the next, over a whole batch (tens of
megabytes of events) every pass misses it on every event, which costs twice the time."""


def _in_chunks(events: list[Any], columns: Callable[[list[Any]], list[list[Any]]]) -> list[list[Any]]:
    """``columns(events)``, built chunk by chunk (:data:`_CHUNK`) and joined."""
    cols = columns(events[:_CHUNK])
    for start in range(_CHUNK, len(events), _CHUNK):
        for col, part in zip(cols, columns(events[start : start + _CHUNK]), strict=True):
            col += part
    return cols


def _gpu_columns(gpu: list[GpuMetric]) -> list[list[Any]]:
    """:data:`GPU_COLS` and the event ids."""
    return [
        [round(e.ts.timestamp() * 1000) for e in gpu], [e.resource_id for e in gpu], [e.gpu_index for e in gpu],
        [e.gpu_uuid for e in gpu], [e.model for e in gpu], [e.util_pct for e in gpu],
        [e.mem_used_mib for e in gpu], [e.mem_total_mib for e in gpu], [e.power_w for e in gpu],
        [e.sm_active for e in gpu], [e.gr_engine_active for e in gpu], [e.tensor_active for e in gpu],
        [e.dram_active for e in gpu], [e.mig_profile for e in gpu], [e.mig_instance for e in gpu],
        [e.hostname for e in gpu], [e.namespace for e in gpu], [e.pod for e in gpu], [e.container for e in gpu],
        [e.workload for e in gpu], [e.allocated for e in gpu], [e.tags for e in gpu],
        [_extra(e) if e.extra else "" for e in gpu], event_ids(b"gpu", gpu),
    ]  # fmt: skip


def _usage_columns(ev: list[UsageEvent], pricer: Pricer) -> list[list[Any]]:
    """:data:`USAGE_COLS`, ``usd`` and ``egress_usd``, and the event ids."""
    priced = [pricer.cost(e) for e in ev]
    return [
        [round(e.ts.timestamp() * 1000) for e in ev], [e.resource_id for e in ev], [e.resource_type for e in ev],
        [e.provider for e in ev], [e.account for e in ev], [e.region for e in ev],
        [e.instance_type for e in ev], [e.pricing for e in ev], [e.state for e in ev],
        [e.interval_s for e in ev], [e.cost_usd for e in ev], [e.egress_bytes for e in ev],
        [e.dest_region for e in ev], [e.storage_bytes for e in ev], [e.capacity_bytes for e in ev],
        [e.vector_count for e in ev], [e.requests for e in ev], [e.tags for e in ev],
        [_extra(e) if e.extra else "" for e in ev], [e.metrics for e in ev],
        [p.usd for p in priced], [p.egress_usd for p in priced], event_ids(b"usage", ev),
    ]  # fmt: skip


def _run_columns(runs: list[RunEvent]) -> list[list[Any]]:
    """:data:`RUN_COLS` and the event ids."""
    return [
        [round(e.ts.timestamp() * 1000) for e in runs], [e.run_id for e in runs], [e.status for e in runs],
        [e.resource_ids for e in runs], [e.gpu_count for e in runs], [e.project for e in runs],
        [e.tags for e in runs], [e.error for e in runs], [_run_extra(e) for e in runs],
        event_ids(b"run", runs),
    ]  # fmt: skip


def _run_extra(e: RunEvent) -> str:
    """A run event's ``extra`` column, holding its ``metrics`` and ``step`` too (added to the contract
    after the table: no column of their own; :mod:`detector.store.history` reads them back)."""
    if not e.metrics and e.step is None:
        return _extra(e) if e.extra else ""
    added: dict[str, Any] = {"metrics": e.metrics} if e.metrics else {}
    if e.step is not None:
        added["step"] = e.step
    return _json.encode({**e.extra, **added}).decode()


def _added_suffix(cls: type, first_added: str) -> bytes:
    """How an event of ``cls`` encodes its fields from ``first_added`` on, all at their defaults."""
    fields = msgspec.structs.fields(cls)
    tail = fields[[f.name for f in fields].index(first_added) :]
    parts = []
    for f in tail:
        default = f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
        parts.append(b"," + _json.encode(f.encode_name) + b":" + _json.encode(default))
    return b"".join(parts) + b"}"


_ADDED_SUFFIXES = {cls: _added_suffix(cls, first) for cls, first in ADDED_FIELDS.items()}


def event_ids(kind: bytes, events: Sequence[Event]) -> list[int]:
    """A 64-bit id per event from its content (every field, ``extra`` included): the same
    event read twice, re-sent by its producer, or read again from a recreated topic has the
    same id, so the store keeps it once. Optional fields added to the contract since ids were
    released (:data:`~detector.events.ADDED_FIELDS`) are left out while at their defaults, so
    an event that carries none of them has the id it had before they existed."""
    encode, from_bytes = _json.encode, int.from_bytes
    fresh = _hasher(kind).copy  # a copy of a keyed hasher costs a third less than making one
    suffix = _ADDED_SUFFIXES.get(type(events[0])) if events else None
    ids: list[int] = []
    if suffix is None:
        for e in events:
            h = fresh()
            h.update(encode(e))
            ids.append(from_bytes(h.digest(), "little"))
        return ids
    cut = len(suffix)
    for e in events:
        encoded = encode(e)
        if encoded.endswith(suffix):
            encoded = encoded[:-cut] + b"}"
        h = fresh()
        h.update(encoded)
        ids.append(from_bytes(h.digest(), "little"))
    return ids


@functools.cache
def _hasher(kind: bytes) -> Any:
    """The empty BLAKE2b of an event id (8 bytes, personalised by the event's kind), to copy."""
    return hashlib.blake2b(digest_size=8, person=kind)


def _source_columns(runs: list[tuple[Source, int]]) -> list[list[Any]]:
    topics: list[str] = []
    partitions: list[int] = []
    offsets: list[int] = []
    for (topic, partition, offset), n in runs:
        topics += [topic] * n
        partitions += [partition] * n
        offsets += [offset] * n
    return [topics, partitions, offsets]

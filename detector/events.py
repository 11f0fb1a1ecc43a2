"""The event contract of the three input topics, and its decoder.

Producers send one event object or a JSON array of them per message. Decoding
is typed (msgspec), which is an order of magnitude faster than building
``faust.Record`` objects, and it is strict about what detection relies on
(types, RFC 3339 timestamps with a zone) while keeping fields it does not know
in ``extra`` so nothing a producer sent is lost on the way to ClickHouse.

Every bound here is the column's range in ClickHouse (or tighter), so whatever the
decoder accepts can be stored: a message that could not be would otherwise fail
the insert of the whole batch. Plausibility (an absurd price, interval or egress)
is a separate, configurable check: :mod:`detector.limits`.
"""

from __future__ import annotations

import difflib
import math
import re
import time
from collections.abc import Callable
from datetime import datetime, timezone
from operator import attrgetter
from typing import Annotated, Any, Literal, Union

import msgspec
import structlog

from detector.limits import Limits
from detector.units import format_duration, printable

__all__ = [
    "DAY_S",
    "Event",
    "EventDecoder",
    "GpuMetric",
    "InvalidMessage",
    "RunEvent",
    "TOPIC_GPU_METRICS",
    "TOPIC_RESOURCE_USAGE",
    "TOPIC_RUN_EVENTS",
    "TOPICS",
    "TS_MAX",
    "TS_MIN",
    "UsageEvent",
]

TOPIC_RESOURCE_USAGE = "resource-usage"
TOPIC_GPU_METRICS = "gpu-metrics"
TOPIC_RUN_EVENTS = "run-events"
TOPICS = (TOPIC_RESOURCE_USAGE, TOPIC_GPU_METRICS, TOPIC_RUN_EVENTS)
DAY_S = 86_400.0

# Column ranges (detector/migrations). msgspec cannot bound an int beyond int64, so the
# UInt64 columns take up to 2^63 - 1 (9.2 EB, 9.2e18 requests): ample, and storable.
UINT8_MAX = 2**8 - 1
UINT16_MAX = 2**16 - 1
INT64_MAX = 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38
FLOAT64_MAX = 1.7976931348623157e308
TS_MIN = datetime(1970, 1, 1, tzinfo=timezone.utc)
TS_MAX = datetime(2200, 1, 1, tzinfo=timezone.utc)
"""ClickHouse documents DateTime64 from 1900 to 2299; before the epoch or after 2200 is a producer's error."""
MIN_INTERVAL_S = 0.001
"""The timestamps' resolution (DateTime64(3)); also keeps rates per second finite."""

# Lengths in characters: far above any real value, low enough that one field cannot
# carry megabytes (cloud tags: keys <= 128-512, values <= 256, at most 50 per resource).
MAX_ID = 1024
"""Ids and names: resource_id, run_id, account, region, instance_type, model, ..."""
MAX_TAG_VALUE = 4096
MAX_TAGS = 1024
MAX_RESOURCE_IDS = 65_536
MAX_ERROR = 65_536
"""A run's error text: room for a stack trace."""
MAX_METRICS = 256
"""Generic metrics per usage event: room for every gauge a host exports, not for a dump."""
MAX_EXTRA_DEPTH = 32
"""Nesting of unknown fields' values; a deeper one is refused, not stored."""

Timestamp = Annotated[datetime, msgspec.Meta(tz=True)]
Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID)]
Name = Annotated[str, msgspec.Meta(max_length=MAX_ID)]
Tags = Annotated[
    dict[Name, Annotated[str, msgspec.Meta(max_length=MAX_TAG_VALUE)]], msgspec.Meta(max_length=MAX_TAGS)
]
Float32 = Annotated[float, msgspec.Meta(ge=0, le=FLOAT32_MAX)]
Float64 = Annotated[float, msgspec.Meta(ge=0, le=FLOAT64_MAX)]
UInt8 = Annotated[int, msgspec.Meta(ge=0, le=UINT8_MAX)]
UInt16 = Annotated[int, msgspec.Meta(ge=0, le=UINT16_MAX)]
UInt64 = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
Ratio = Annotated[float, msgspec.Meta(ge=0, le=1)]
Metrics = Annotated[
    dict[Id, Annotated[float, msgspec.Meta(ge=-FLOAT64_MAX, le=FLOAT64_MAX)]], msgspec.Meta(max_length=MAX_METRICS)
]
"""Named numeric gauges: finite (the bounds refuse 1e309) and signed, as a Float64 column stores them."""


class _Base(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, gc=False):
    ts: Timestamp
    extra: dict[str, Any] = {}
    """Fields the contract does not name, kept verbatim for storage."""

    @property
    def t(self) -> float:
        """Event time as epoch seconds. Hot paths compute it once per event and pass it along."""
        return self.ts.timestamp()


class UsageEvent(_Base, kw_only=True):
    """One billing/usage interval of one cloud resource."""

    resource_id: Id
    resource_type: Id
    provider: Name = ""
    account: Name = ""
    region: Name = ""
    instance_type: Name = ""
    pricing: Literal["on_demand", "spot", "reserved"] = "on_demand"
    state: Literal["running", "stopped", "terminated"] = "running"
    interval_s: Annotated[float, msgspec.Meta(ge=MIN_INTERVAL_S, le=FLOAT32_MAX)] = 60.0
    cost_usd: Float64 | None = None
    egress_bytes: UInt64 | None = None
    dest_region: Name = ""
    storage_bytes: UInt64 | None = None
    capacity_bytes: UInt64 | None = None
    vector_count: UInt64 | None = None
    requests: UInt64 | None = None
    tags: Tags = {}
    # Fields added after the first release go last (ADDED_FIELDS): ids of events without them are unchanged.
    metrics: Metrics = {}
    """Any other numeric series the resource reports (CPU utilisation, ingress, latency, request
    rate), by name: what a model can learn from beyond cost and egress (issue 14)."""

    @property
    def key(self) -> str:
        return self.resource_id


class GpuMetric(_Base, kw_only=True):
    """One DCGM-exporter-like sample of one GPU of a host."""

    resource_id: Id
    gpu_index: UInt8
    gpu_uuid: Name = ""
    model: Name = ""
    util_pct: Annotated[float, msgspec.Meta(ge=0, le=100)]
    mem_used_mib: Float32 = 0.0
    mem_total_mib: Float32 = 0.0
    power_w: Float32 = 0.0
    sm_active: Ratio | None = None
    """``DCGM_FI_PROF_SM_ACTIVE``: off in dcgm-exporter's default counters."""
    # Fields added after the first release go last: an event's id hashes its encoding without
    # the trailing ones at their defaults (ADDED_FIELDS), so adding them changed no stored id.
    gr_engine_active: Ratio | None = None
    """``DCGM_FI_PROF_GR_ENGINE_ACTIVE``: on by default; the profiling form of ``util_pct``."""
    tensor_active: Ratio | None = None
    """``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``: on by default."""
    dram_active: Ratio | None = None
    """``DCGM_FI_PROF_DRAM_ACTIVE``: on by default; real work almost always moves memory."""
    mig_profile: Name = ""
    """``GPU_I_PROFILE`` of a MIG instance (``1g.10gb``); empty for a whole GPU."""
    mig_instance: Name = ""
    """``GPU_I_ID`` of a MIG instance; a MIG GPU reports one sample per instance."""
    hostname: Name = ""
    """The exporter's host label, when ``resource_id`` was mapped from it (a node to its instance)."""
    namespace: Name = ""
    pod: Name = ""
    container: Name = ""
    """The Kubernetes pod holding this GPU (dcgm-exporter's Kubernetes mode)."""
    workload: Name = ""
    """``Kind/name`` of the pod's controller (``Deployment/web``, ``Job/train``, ``StatefulSet/nb``),
    from kube-state-metrics' ``kube_pod_owner``: what to scale or delete to stop it."""
    allocated: bool | None = None
    """Whether a Kubernetes pod holds this GPU; ``None``: unknown, or not a Kubernetes node."""
    tags: Tags = {}
    """Ownership labels of the pod and its namespace (``team``, ``owner``, ``project``, ...)."""

    @property
    def key(self) -> str:
        return self.resource_id

    @property
    def unit(self) -> tuple[int, str]:
        """The GPU this sample is of: its index, and its MIG instance when it is one."""
        return self.gpu_index, self.mig_instance


class RunEvent(_Base, kw_only=True):
    """A lifecycle change of a training or batch run."""

    run_id: Id
    status: Literal["started", "running", "succeeded", "failed", "killed"]
    resource_ids: Annotated[list[Name], msgspec.Meta(max_length=MAX_RESOURCE_IDS)] = []
    gpu_count: UInt16 = 0
    project: Name = ""
    tags: Tags = {}
    error: Annotated[str, msgspec.Meta(max_length=MAX_ERROR)] = ""
    # Fields added after the first release go last (ADDED_FIELDS): ids of events without them are unchanged.
    metrics: Metrics = {}
    """The run's latest metrics by name (``val_loss``, ``eval_accuracy``), as MLflow's
    ``log_metric`` and W&B's ``wandb.log`` record them: what ``plateaued_run`` watches."""
    step: UInt64 | None = None
    """The training step (MLflow's metric ``step``, W&B's ``_step``) the metrics were logged at:
    a report repeated at the same step is not a new evaluation."""

    @property
    def key(self) -> str:
        """The project: a project's runs (and its crash-loop state) live on one partition."""
        return self.project or self.run_id


Event = Union[UsageEvent, GpuMetric, RunEvent]
ADDED_FIELDS: dict[type, str] = {GpuMetric: "gr_engine_active", UsageEvent: "metrics", RunEvent: "metrics"}
"""Per event type, the first of the optional fields added (at the end) after event ids were
released: :func:`detector.store.batch.event_ids` hashes an event without the trailing run of
them at their defaults, so an event that carries none of them keeps the id it had before."""
_RUN_FIELDS = msgspec.structs.fields(RunEvent)
RUN_ADDED: dict[str, Any] = {
    f.name: f.type for f in _RUN_FIELDS[[f.name for f in _RUN_FIELDS].index(ADDED_FIELDS[RunEvent]) :]
}
"""Run event fields added after its table (name → type): stored in its ``extra`` column, and
kept there verbatim when the contract cannot type them (:func:`typed_run_fields`)."""


def typed_run_fields(fields: dict[str, Any], extra: dict[str, Any]) -> None:
    """Move each of :data:`RUN_ADDED` in ``extra`` that the contract can type into ``fields``;
    one it cannot (a diverged run's ``"val_loss": null``, a label ``"step": "epoch-3"``) stays
    in ``extra`` verbatim, as before they were fields: the event is not refused for it (a failed
    run's status is what ``failed_run_spend`` needs) and it counts as no evaluation."""
    for name, ftype in RUN_ADDED.items():
        if name in extra:
            try:
                fields[name] = msgspec.convert(extra[name], ftype)
            except msgspec.ValidationError:
                continue
            del extra[name]


_TYPES: dict[str, type[_Base]] = {
    TOPIC_RESOURCE_USAGE: UsageEvent,
    TOPIC_GPU_METRICS: GpuMetric,
    TOPIC_RUN_EVENTS: RunEvent,
}


_ts = attrgetter("ts")
_extra = attrgetter("extra")


class InvalidMessage(ValueError):
    """A message that cannot become events; ``reason`` says why, for the dead-letter topic."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_log = structlog.get_logger("burnwatch.events")
_MAX_UNKNOWN = 1000
"""Unknown fields an :class:`EventDecoder` looks at for a misspelling: hostile producers may send endless new names."""
_MAX_MISSPELLED = 64
"""Longer names are no misspelling of a contract field (the longest has 16 characters): neither looked at nor kept.
A hostile producer's 900 kB field names cost 80 ms a message in the look (difflib) and, 1,000 kept, 1 GB."""


class EventDecoder:
    """Decodes message values of the three topics into typed events.

    The fast path decodes straight into structs and refuses unknown fields;
    only a message that fails it takes the slow path, which separates unknown
    fields into ``extra`` and produces a precise reason when the message is bad.

    :meth:`decode` is total: whatever the bytes, it returns events or raises
    :class:`InvalidMessage`, so one hostile message goes to the dead-letter topic
    and never stops the partition.
    """

    def __init__(
        self,
        *,
        max_future_s: float = DAY_S,
        clock: Callable[[], float] = time.time,
        limits: Limits | None = None,
    ) -> None:
        self._fast = {
            topic: msgspec.json.Decoder(Union[list[cls], cls])  # type: ignore[valid-type]  # a type made at run time
            for topic, cls in _TYPES.items()
        }
        self._fields = {
            topic: frozenset(cls.__struct_fields__) - {"extra"} for topic, cls in _TYPES.items()
        }
        self._max_future_s = max_future_s
        self._clock = clock
        self.limits = limits or Limits()
        self._max_interval = self.limits.max_interval
        self._max_usd_per_s = self.limits.max_usd_per_hour / 3600.0
        self._max_egress_per_s = self.limits.max_egress_bytes_per_s
        self._bound, self._bound_at = TS_MIN, -math.inf
        """The latest timestamp accepted as of the clock reading ``_bound_at`` (see :meth:`_decode`)."""
        self._unknown: dict[tuple[str, str], str | None] = {}
        """(topic, field) of unknown fields seen → the contract's field it likely misspells (None: none)."""

    def _say_misspelled(self, topic: str, extra: dict[str, Any]) -> None:
        """Say once (a process, a topic, a field) that an unknown field likely misspells one of the contract's:
        it is kept in ``extra``, as every unknown field is, and the event is read without it (``costUSD`` for
        ``cost_usd``: the interval priced from the price list, or at $0, with nothing said). Bounded: past
        ``_MAX_UNKNOWN`` fields seen, no more are looked at."""
        unknown = self._unknown
        if len(unknown) >= _MAX_UNKNOWN:  # the usual message past the bound: no look at each field
            return
        for name in extra:
            if len(name) > _MAX_MISSPELLED or (topic, name) in unknown:  # a long name is no misspelling, and not kept
                continue
            if len(unknown) >= _MAX_UNKNOWN:
                return
            meant = unknown[(topic, name)] = _misspelling_of(name, self._fields[topic])
            if meant is not None:
                _log.warning("event_field_unknown", topic=topic, field=printable(name, 80), did_you_mean=meant,
                             note="kept in extra, as every unknown field is; the event is read without it: "
                                  "check the exporter's field name (docs/events.md)")  # fmt: skip

    def decode(self, topic: str, value: bytes | None) -> list[Event]:
        """Return the events in one message value, or raise :class:`InvalidMessage`."""
        try:
            return self._decode(topic, value)
        except InvalidMessage:
            raise
        except RecursionError:
            raise InvalidMessage("JSON nested too deeply to decode (about 1,000 levels or more)") from None
        except UnicodeDecodeError as exc:
            raise InvalidMessage(f"not valid UTF-8: {exc.reason} at byte {exc.start}") from None
        except Exception as exc:  # a bug of ours or msgspec's: still this message's problem only
            raise InvalidMessage(f"undecodable message: {type(exc).__name__}: {exc}") from None

    def _decode(self, topic: str, value: bytes | None) -> list[Event]:
        decoder = self._fast.get(topic)
        if decoder is None:
            raise InvalidMessage(f"unknown topic {topic!r}; expected one of {', '.join(TOPICS)}")
        if value is None:
            raise InvalidMessage("no value (a tombstone): expected an event or an array of events")
        lenient = False
        try:
            decoded = decoder.decode(value)
        except msgspec.ValidationError as exc:
            decoded = self._decode_lenient(topic, value, exc)
            lenient = True
        except msgspec.DecodeError as exc:
            raise InvalidMessage(f"not JSON: {exc}") from None
        batch = isinstance(decoded, list)
        events = decoded if batch else [decoded]
        if not events:
            raise InvalidMessage("empty batch: the array holds no events")
        now = self._clock()
        usage = topic == TOPIC_RESOURCE_USAGE
        if not usage and now >= self._bound_at:
            # The usual message: every timestamp within a bound computed at an earlier clock reading
            # (so no later than the bound now) and no unknown fields, checked per message in C.
            # Anything else takes the loop below, which finds the first problem and says where.
            if len(events) == 1:
                if TS_MIN <= events[0].ts <= self._bound and not events[0].extra:
                    return events
            elif (TS_MIN <= min(map(_ts, events)) and max(map(_ts, events)) <= self._bound
                  and not any(map(_extra, events))):  # fmt: skip
                return events
        latest = min(datetime.fromtimestamp(now + self._max_future_s, tz=timezone.utc), TS_MAX)
        self._bound, self._bound_at = latest, now
        for i, event in enumerate(events):
            if event.ts > latest or event.ts < TS_MIN:
                raise InvalidMessage(self._ts_reason(event.ts, latest, f"$[{i}].ts" if batch else "$.ts"))
            if usage and not self._plausible(event):
                self._refuse_implausible(event, f"$[{i}]" if batch else "$")
            if event.extra and (deep := _too_deep(event.extra)) is not None:
                where = (f"$[{i}]" if batch else "$") + ("" if lenient else ".extra")
                raise InvalidMessage(f"nested deeper than {MAX_EXTRA_DEPTH} levels - at `{where}.{deep}`")
        return events

    def _ts_reason(self, ts: datetime, latest: datetime, where: str) -> str:
        if ts < TS_MIN:
            return f"timestamp {ts.isoformat()} is before {TS_MIN:%Y-%m-%dT%H:%M:%SZ} - at `{where}`"
        if latest == TS_MAX:
            return f"timestamp {ts.isoformat()} is after {TS_MAX:%Y-%m-%dT%H:%M:%SZ} - at `{where}`"
        return f"timestamp {ts.isoformat()} is more than {self._max_future_s / 3600:g}h in the future - at `{where}`"

    def _plausible(self, event: UsageEvent) -> bool:
        """Within the bounds of :class:`~detector.limits.Limits` (what can be stored may still be absurd)."""
        interval = event.interval_s
        cost, egress = event.cost_usd, event.egress_bytes
        return (
            interval <= self._max_interval
            and (cost is None or cost <= self._max_usd_per_s * interval)
            and (not egress or egress <= self._max_egress_per_s * interval)
        )

    def _refuse_implausible(self, event: UsageEvent, where: str) -> None:
        """Say which bound the event is beyond: the field, its value, the bound and where to change it."""
        interval = event.interval_s
        limits = self.limits
        if interval > limits.max_interval:
            raise InvalidMessage(
                f"interval_s {interval:g} ({format_duration(interval)}) is longer than the plausible "
                f"{format_duration(limits.max_interval)} (max_interval in limits.yaml, raise it there if real) "
                f"- at `{where}.interval_s`"
            )
        cost = event.cost_usd
        if cost is not None and cost > self._max_usd_per_s * interval:
            per_hour = cost / interval * 3600.0
            rate = f"${per_hour:,.2f}/h" if per_hour < 1e12 else f"${per_hour:.3g}/h"
            rate = rate if per_hour < math.inf else "beyond any $/h"
            raise InvalidMessage(
                f"cost_usd {cost:g} over interval_s {interval:g} is {rate}, above the plausible "
                f"${limits.max_usd_per_hour:,.2f}/h per resource (max_usd_per_hour in limits.yaml, raise it "
                f"there if real) - at `{where}.cost_usd`"
            )
        egress = event.egress_bytes
        if egress and egress > self._max_egress_per_s * interval:
            gbit = egress * 8 / 1e9 / interval
            raise InvalidMessage(
                f"egress_bytes {egress} over interval_s {interval:g} is {gbit:,.1f} Gbit/s, above the plausible "
                f"{limits.max_egress_gbit_per_s:g} Gbit/s (max_egress_gbit_per_s in limits.yaml, raise it there "
                f"if real) - at `{where}.egress_bytes`"
            )

    def _decode_lenient(self, topic: str, value: bytes, fast_error: msgspec.ValidationError) -> Any:
        try:
            raw = msgspec.json.decode(value)
        except msgspec.DecodeError as exc:
            # Valid JSON the generic decoder cannot hold (a number beyond float64 or int64):
            # the typed decoder's error names the field when it is one of the contract's.
            fast = str(fast_error)
            if "unknown field" not in fast:
                raise InvalidMessage(fast) from None
            raise InvalidMessage(f"not JSON: {exc}") from None
        cls, known = _TYPES[topic], self._fields[topic]
        items = raw if isinstance(raw, list) else [raw]
        out = []
        for i, item in enumerate(items):
            where = f"$[{i}]" if isinstance(raw, list) else "$"
            if not isinstance(item, dict):
                raise InvalidMessage(f"expected an event object, got {type(item).__name__} - at `{where}`")
            fields = {k: v for k, v in item.items() if k in known}
            extra = {k: v for k, v in item.items() if k not in known}
            if extra:
                fields["extra"] = extra
                self._say_misspelled(topic, extra)
            try:
                out.append(self._convert(cls, fields))
            except msgspec.ValidationError as exc:
                message = str(exc).replace("`$", f"`{where}", 1)
                if "- at" not in message and "required field" in message:
                    message = f"{message} - at `{where}`"
                raise InvalidMessage(message) from None
        return out if isinstance(raw, list) else out[0]


    @staticmethod
    def _convert(cls: type, fields: dict[str, Any]) -> Any:
        """``fields`` as an event of ``cls``; a run event's ``metrics`` or ``step`` the contract
        cannot hold stays in ``extra`` (:func:`typed_run_fields`)."""
        try:
            return msgspec.convert(fields, cls)
        except msgspec.ValidationError:
            if cls is not RunEvent or not any(name in fields for name in RUN_ADDED):
                raise
        extra = {**fields.get("extra", {}), **{name: fields.pop(name) for name in RUN_ADDED if name in fields}}
        typed_run_fields(fields, extra)
        if extra:
            fields["extra"] = extra
        return msgspec.convert(fields, cls)


def _misspelling_of(name: str, known: frozenset[str]) -> str | None:
    """The contract's field that ``name`` likely misspells (``costUSD``, ``cost-usd``, ``cost_ud``: ``cost_usd``),
    or None: the same letters and digits whatever the case and separators, or one close to them."""
    folded = {_fold(field): field for field in known}
    wanted = _fold(name)
    if wanted in folded:
        return folded[wanted]
    close = difflib.get_close_matches(wanted, list(folded), n=1, cutoff=0.85)
    return folded[close[0]] if close else None


def _fold(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


def _too_deep(extra: dict[str, Any]) -> str | None:
    """The first unknown field nested deeper than :data:`MAX_EXTRA_DEPTH`, if any (walked
    iteratively: recursion would itself overflow the stack on the values it refuses)."""
    for key, value in extra.items():
        if not isinstance(value, (dict, list)):
            continue
        stack = [(value, 1)]
        while stack:
            item, depth = stack.pop()
            children = item.values() if isinstance(item, dict) else item
            if children and depth > MAX_EXTRA_DEPTH:
                return key
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return None

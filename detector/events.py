"""The event contract of the three input topics, and its decoder.

Producers send one event object or a JSON array of them per message. Decoding
is typed (msgspec), which is an order of magnitude faster than building
``faust.Record`` objects, and it is strict about what detection relies on
(types, RFC 3339 timestamps with a zone) while keeping fields it does not know
in ``extra`` so nothing a producer sent is lost on the way to ClickHouse.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, Union

import msgspec

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
    "UsageEvent",
]

TOPIC_RESOURCE_USAGE = "resource-usage"
TOPIC_GPU_METRICS = "gpu-metrics"
TOPIC_RUN_EVENTS = "run-events"
TOPICS = (TOPIC_RESOURCE_USAGE, TOPIC_GPU_METRICS, TOPIC_RUN_EVENTS)
DAY_S = 86_400.0

Timestamp = Annotated[datetime, msgspec.Meta(tz=True)]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Count = Annotated[int, msgspec.Meta(ge=0)]


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

    resource_id: NonEmpty
    resource_type: NonEmpty
    provider: str = ""
    account: str = ""
    region: str = ""
    instance_type: str = ""
    pricing: Literal["on_demand", "spot", "reserved"] = "on_demand"
    state: Literal["running", "stopped", "terminated"] = "running"
    interval_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    cost_usd: NonNegative | None = None
    egress_bytes: Count | None = None
    dest_region: str = ""
    storage_bytes: Count | None = None
    capacity_bytes: Count | None = None
    vector_count: Count | None = None
    requests: Count | None = None
    tags: dict[str, str] = {}

    @property
    def key(self) -> str:
        return self.resource_id


class GpuMetric(_Base, kw_only=True):
    """One DCGM-exporter-like sample of one GPU of a host."""

    resource_id: NonEmpty
    gpu_index: Count
    gpu_uuid: str = ""
    model: str = ""
    util_pct: Annotated[float, msgspec.Meta(ge=0, le=100)]
    mem_used_mib: NonNegative = 0.0
    mem_total_mib: NonNegative = 0.0
    power_w: NonNegative = 0.0
    sm_active: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None

    @property
    def key(self) -> str:
        return self.resource_id


class RunEvent(_Base, kw_only=True):
    """A lifecycle change of a training or batch run."""

    run_id: NonEmpty
    status: Literal["started", "running", "succeeded", "failed", "killed"]
    resource_ids: list[str] = []
    gpu_count: Count = 0
    project: str = ""
    tags: dict[str, str] = {}
    error: str = ""

    @property
    def key(self) -> str:
        """The project: a project's runs (and its crash-loop state) live on one partition."""
        return self.project or self.run_id


Event = Union[UsageEvent, GpuMetric, RunEvent]
_TYPES: dict[str, type[_Base]] = {
    TOPIC_RESOURCE_USAGE: UsageEvent,
    TOPIC_GPU_METRICS: GpuMetric,
    TOPIC_RUN_EVENTS: RunEvent,
}


class InvalidMessage(ValueError):
    """A message that cannot become events; ``reason`` says why, for the dead-letter topic."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EventDecoder:
    """Decodes message values of the three topics into typed events.

    The fast path decodes straight into structs and refuses unknown fields;
    only a message that fails it takes the slow path, which separates unknown
    fields into ``extra`` and produces a precise reason when the message is bad.
    """

    def __init__(
        self,
        *,
        max_future_s: float = DAY_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._fast = {
            topic: msgspec.json.Decoder(Union[list[cls], cls])  # type: ignore[valid-type]
            for topic, cls in _TYPES.items()
        }
        self._fields = {
            topic: frozenset(cls.__struct_fields__) - {"extra"} for topic, cls in _TYPES.items()
        }
        self._max_future_s = max_future_s
        self._clock = clock

    def decode(self, topic: str, value: bytes) -> list[Event]:
        """Return the events in one message value, or raise :class:`InvalidMessage`."""
        decoder = self._fast.get(topic)
        if decoder is None:
            raise InvalidMessage(f"unknown topic {topic!r}; expected one of {', '.join(TOPICS)}")
        try:
            decoded = decoder.decode(value)
        except (msgspec.ValidationError, msgspec.DecodeError):
            decoded = self._decode_lenient(topic, value)
        events = decoded if isinstance(decoded, list) else [decoded]
        if not events:
            raise InvalidMessage("empty batch: the array holds no events")
        latest = datetime.fromtimestamp(self._clock() + self._max_future_s, tz=timezone.utc)
        for i, event in enumerate(events):
            if event.ts > latest:
                where = f"$[{i}].ts" if isinstance(decoded, list) else "$.ts"
                raise InvalidMessage(
                    f"timestamp {event.ts.isoformat()} is more than "
                    f"{self._max_future_s / 3600:g}h in the future - at `{where}`"
                )
        return events

    def _decode_lenient(self, topic: str, value: bytes) -> Any:
        try:
            raw = msgspec.json.decode(value)
        except msgspec.DecodeError as exc:
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
            try:
                out.append(msgspec.convert(fields, cls))
            except msgspec.ValidationError as exc:
                message = str(exc).replace("`$", f"`{where}", 1)
                if "- at" not in message and "required field" in message:
                    message = f"{message} - at `{where}`"
                raise InvalidMessage(message) from None
        return out if isinstance(raw, list) else out[0]

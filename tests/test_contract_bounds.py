"""The contract's bounds and the ClickHouse columns agree: whatever the decoder accepts is
stored, and whatever lies just outside a bound is refused with the field named.

Values are generated from the contract itself (msgspec's constraints, read back with
``msgspec.inspect``) and from :class:`~detector.limits.Limits`, never from numbers
copied here, so a bound changed in one place and not the other fails this test.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec
import msgspec.inspect as mi
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detector.events import (
    _TYPES,
    DAY_S,
    MAX_EXTRA_DEPTH,
    RUN_ADDED,
    TOPIC_RESOURCE_USAGE,
    TS_MAX,
    TS_MIN,
    EventDecoder,
    InvalidMessage,
    RunEvent,
)
from detector.limits import Limits
from detector.store import EventBatch
from detector.units import epoch

NOW = TS_MAX.timestamp() - DAY_S
"""The decoder's clock: a day before TS_MAX, so the latest accepted time is TS_MAX itself."""
UNBOUNDED = Limits.none()
"""Plausibility off: only the contract (what can be stored) decides."""
INFO = {topic: {f.name: f for f in mi.type_info(cls).fields} for topic, cls in _TYPES.items()}
TEXT = st.characters(codec="utf-8")  # any code point UTF-8 can carry (not lone surrogates)
SLOW = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.large_base_example])  # fmt: skip


def _optional(t: Any) -> Any:
    """The constrained type inside ``X | None``."""
    if isinstance(t, mi.UnionType):
        return next(u for u in t.types if not isinstance(u, mi.NoneType))
    return t


def _strings(t: mi.StrType) -> st.SearchStrategy[str]:
    lo, hi = t.min_length or 0, t.max_length
    short = st.text(TEXT, min_size=lo, max_size=min(hi, 8) if hi is not None else 8)
    if hi is None:
        return short
    return st.one_of(short, TEXT.map(lambda c: c * hi))  # at the bound, also in 4-byte characters


def _json_values(depth: int) -> st.SearchStrategy[Any]:
    """Any JSON value nested at most ``depth`` deep (unknown fields, kept in ``extra``)."""
    leaves = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                       st.floats(allow_nan=False, allow_infinity=False), st.text(TEXT, max_size=8))  # fmt: skip

    def nested(levels: int) -> Any:
        def wrap(v: Any) -> Any:
            for _ in range(levels):
                v = [v]
            return v

        return leaves.map(wrap)

    small = st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                          st.dictionaries(st.text(TEXT, max_size=4), inner, max_size=3)),
                         max_leaves=6)  # fmt: skip
    return st.one_of(small, nested(depth))  # the deepest nesting allowed, exactly


def strategy(t: Any) -> st.SearchStrategy[Any]:
    """Values of a contract type, from its own constraints (bounds included)."""
    if isinstance(t, mi.UnionType):
        return st.one_of(*(strategy(u) for u in t.types))
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.IntType):
        lo = t.ge if t.ge is not None else t.gt + 1
        return st.integers(lo, t.le)
    if isinstance(t, mi.FloatType):
        lo = t.ge if t.ge is not None else t.gt
        return st.floats(lo, t.le, exclude_min=t.ge is None, allow_nan=False, allow_infinity=False)
    if isinstance(t, mi.StrType):
        return _strings(t)
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.DateTimeType):
        zones = st.sampled_from([timezone.utc, timezone(timedelta(hours=14)), timezone(timedelta(hours=-12))])
        inner = st.datetimes(TS_MIN.replace(tzinfo=None) + timedelta(days=1), TS_MAX.replace(tzinfo=None) - timedelta(days=1),
                             timezones=zones)  # fmt: skip
        return st.one_of(inner, st.sampled_from([TS_MIN, TS_MAX]))
    if isinstance(t, mi.ListType):
        return st.lists(strategy(t.item_type), min_size=t.min_length or 0, max_size=min(t.max_length, 4))
    if isinstance(t, mi.DictType) and isinstance(t.value_type, mi.AnyType):
        return st.just({})  # extra: generated as unknown fields below
    if isinstance(t, mi.DictType):
        return st.dictionaries(strategy(t.key_type), strategy(t.value_type), max_size=min(t.max_length, 4))
    raise AssertionError(f"no strategy for {t}: extend this test with the new type")


def encode(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


@st.composite
def messages(draw: Any, topic: str, limits: Limits) -> list[dict[str, Any]]:
    """One message: 1-3 events of ``topic``, every field drawn from the contract."""
    events = []
    for _ in range(draw(st.integers(1, 3))):
        event = {}
        for name, field in INFO[topic].items():
            if name == "extra" or (not field.required and draw(st.booleans())):
                continue
            event[name] = encode(draw(strategy(field.type)))
        for key in draw(st.lists(st.text(TEXT, max_size=6).filter(lambda k: k not in INFO[topic]), max_size=2)):
            event[key] = draw(_json_values(MAX_EXTRA_DEPTH))
        if topic == TOPIC_RESOURCE_USAGE:
            _within_limits(draw, event, limits)
        events.append(event)
    return events


def _within_limits(draw: Any, event: dict[str, Any], limits: Limits) -> None:
    """Keep a usage event inside the plausibility bounds (drawn up to them, exactly)."""
    interval = event.get("interval_s", 60.0)
    if interval > limits.max_interval:
        interval = event["interval_s"] = draw(st.floats(INFO[TOPIC_RESOURCE_USAGE]["interval_s"].type.ge, limits.max_interval))
    if event.get("cost_usd") is not None and limits.max_usd_per_hour < math.inf:
        event["cost_usd"] = draw(st.floats(0, limits.max_usd_per_hour / 3600 * interval))
    if event.get("egress_bytes") is not None and limits.max_egress_gbit_per_s < math.inf:
        event["egress_bytes"] = draw(st.integers(0, int(limits.max_egress_bytes_per_s * interval)))


TABLES = {"resource-usage": "resource_usage", "gpu-metrics": "gpu_metrics", "run-events": "run_events"}


def _as_stored(name: str, value: Any, column_type: str) -> Any:
    """An event's field as its column holds it: milliseconds, float32, JSON text for extra."""
    if name == "ts":
        return round(value.timestamp() * 1000)
    if name == "extra":
        return value or None
    if value is not None and "Float32" in column_type:
        return float(np.float32(value))
    return value


def _read_back(name: str, value: Any) -> Any:
    if name == "ts":
        return round(epoch(value) * 1000)
    if name == "extra":
        return msgspec.json.decode(value) if value else None
    return dict(value) if isinstance(value, dict) else value


@pytest.mark.parametrize("limits", [UNBOUNDED, Limits()], ids=["contract", "default-limits"])
@pytest.mark.parametrize("topic", list(_TYPES))
@SLOW
@given(data=st.data())
def test_whatever_the_decoder_accepts_is_stored_as_sent(store, topic, limits, data):
    decoder = EventDecoder(clock=lambda: NOW, limits=limits)
    message = data.draw(messages(topic, limits))
    events = decoder.decode(topic, msgspec.json.encode(message))
    assert len(events) == len(message)
    table = f"{store.db}.{TABLES[topic]}"
    store.client.command(f"TRUNCATE TABLE {table}")
    batch = EventBatch()
    batch.extend(events)
    events = list({msgspec.json.encode(e): e for e in events}.values())  # an event drawn twice is stored once
    assert store.events.insert(batch) == len(events)
    types = {r["name"]: r["type"] for r in store.query(f"DESCRIBE TABLE {table}")}
    names = [n for n in INFO[topic] if n in types]  # a run's metrics and step: no column, kept in extra
    rows = store.query(f"SELECT {', '.join(names)} FROM {table}")
    stored = sorted(repr([_read_back(n, row[n]) for n in names]) for row in rows)
    sent = sorted(repr([_as_stored(n, _sent(e, n), types[n]) for n in names]) for e in events)
    assert stored == sent


def _sent(event: Any, name: str) -> Any:
    """The field as sent; a run event's ``extra`` with the fields added after its table
    (``metrics`` when not empty, ``step`` when given), which that column holds for them."""
    value = getattr(event, name)
    if name != "extra" or not isinstance(event, RunEvent):
        return value
    added = {"metrics": event.metrics} if event.metrics else {}
    if event.step is not None:
        added["step"] = event.step
    return {**value, **added}


# -- just outside each bound --------------------------------------------------------------

VALID = {
    "resource-usage": {"ts": "2026-11-02T00:00:00Z", "resource_id": "h1", "resource_type": "gpu_instance"},
    "gpu-metrics": {"ts": "2026-11-02T00:00:00Z", "resource_id": "h1", "gpu_index": 0, "util_pct": 3.5},
    "run-events": {"ts": "2026-11-02T00:00:00Z", "run_id": "r1", "status": "failed"},
}


def _outside(t: Any) -> list[tuple[str, Any]]:
    """(which bound, a value just outside it) for every bound of a contract type."""
    t = _optional(t)
    out: list[tuple[str, Any]] = []
    if isinstance(t, mi.IntType):
        out += [("ge", t.ge - 1)] if t.ge is not None else []
        out += [("le", t.le + 1)] if t.le is not None else []
    elif isinstance(t, mi.FloatType):
        below = math.nextafter(t.ge, -math.inf) if t.ge is not None else None
        out += [("ge", below if below > -math.inf else msgspec.Raw(b"-1e309"))] if t.ge is not None else []
        out += [("gt", t.gt)] if t.gt is not None else []
        above = math.nextafter(t.le, math.inf) if t.le is not None else None
        out += [("le", above if above < math.inf else msgspec.Raw(b"1e309"))] if t.le is not None else []
    elif isinstance(t, mi.StrType):
        out += [("min_length", "")] if t.min_length else []
        out += [("max_length", "x" * (t.max_length + 1))] if t.max_length is not None else []
    elif isinstance(t, mi.LiteralType):
        out += [("literal", "not-" + t.values[0])]
    elif isinstance(t, mi.BoolType):
        out += [("type", "yes")]  # JSON true/false only, never a string or a number
    elif isinstance(t, mi.ListType):
        out += [("max_length", [""] * (t.max_length + 1))]
        out += [(f"item {bound}", [value]) for bound, value in _outside(t.item_type)]
    elif isinstance(t, mi.DictType) and not isinstance(t.value_type, mi.AnyType):
        inside = "" if isinstance(t.value_type, mi.StrType) else 0.0  # only the length is out of bounds
        out += [("max_length", {str(i): inside for i in range(t.max_length + 1)})]
        out += [(f"key {bound}", {value: ""}) for bound, value in _outside(t.key_type) if value]
        out += [(f"value {bound}", {"k": value}) for bound, value in _outside(t.value_type)]
    return out


OUTSIDE = [
    pytest.param(topic, name, value, id=f"{topic}.{name}:{bound}")
    for topic, fields in INFO.items()
    for name, field in fields.items()
    for bound, value in _outside(field.type)
]


def test_every_field_is_bounded():
    """A field without a bound could carry what its column cannot hold (ts and extra are
    bounded by the decoder itself, tested below)."""
    probed = {(topic, name) for topic, name, _ in (p.values for p in OUTSIDE)}
    fields = {(topic, name) for topic, names in INFO.items() for name in names if name not in ("ts", "extra")}
    assert fields - probed == set()


@pytest.mark.parametrize("topic, name, value", OUTSIDE)
def test_just_outside_a_bound_is_refused_with_the_field_named(topic, name, value):
    """Refused, naming the field; except a run's ``metrics`` and ``step`` (added after its table)
    when JSON can hold the value: kept verbatim in ``extra`` with the event accepted, so a
    diverged run's status is not lost (a number beyond float64 is still refused)."""
    decoder = EventDecoder(clock=lambda: NOW, limits=UNBOUNDED)
    message = msgspec.json.encode([{**VALID[topic], name: value}])
    if topic == "run-events" and name in RUN_ADDED and not (isinstance(value, dict) and _beyond_float64(value)):
        (event,) = decoder.decode(topic, message)
        (plain,) = decoder.decode(topic, msgspec.json.encode([VALID[topic]]))
        assert event.extra == {name: value} and getattr(event, name) == getattr(plain, name)  # the field at its default
        return
    with pytest.raises(InvalidMessage) as info:
        decoder.decode(topic, message)
    assert f"`$[0].{name}" in info.value.reason


@pytest.mark.parametrize("ts", [TS_MIN - timedelta(milliseconds=1), TS_MAX + timedelta(milliseconds=1)],
                         ids=["before-TS_MIN", "after-TS_MAX"])  # fmt: skip
def test_timestamps_outside_the_storable_range_are_refused(ts):
    decoder = EventDecoder(clock=lambda: TS_MAX.timestamp() + 100 * DAY_S)  # the future check out of the way
    for edge in (TS_MIN, TS_MAX):
        assert decoder.decode("run-events", json.dumps({**VALID["run-events"], "ts": edge.isoformat()}).encode())
    with pytest.raises(InvalidMessage, match=r"- at `\$.ts`"):
        decoder.decode("run-events", json.dumps({**VALID["run-events"], "ts": ts.isoformat()}).encode())


def _beyond_float64(metrics: dict[str, Any]) -> bool:
    """A number no JSON decoder here can hold (``1e309``): refused, not kept."""
    return any(isinstance(v, msgspec.Raw) for v in metrics.values())


# -- plausibility: each limit, at and just beyond it --------------------------------------

LIMIT_FIELDS = {
    "max_usd_per_hour": ("cost_usd", lambda lim, interval: lim.max_usd_per_hour / 3600 * interval),
    "max_interval": ("interval_s", lambda lim, interval: lim.max_interval),
    "max_egress_gbit_per_s": ("egress_bytes", lambda lim, interval: lim.max_egress_bytes_per_s * interval),
}
"""Each limit → the field it bounds and the largest value it allows for an interval."""


def test_every_limit_is_probed():
    assert set(LIMIT_FIELDS) == set(Limits.model_fields)


@pytest.mark.parametrize("limit", sorted(LIMIT_FIELDS))
@pytest.mark.parametrize("interval", [60.0, 3600.0])
def test_a_value_beyond_a_limit_is_refused_naming_field_value_and_limit(limit, interval):
    limits = Limits()
    field, bound = LIMIT_FIELDS[limit]
    at_bound = bound(limits, interval)
    decoder = EventDecoder(clock=lambda: NOW, limits=limits)
    base = {**VALID["resource-usage"], "interval_s": interval}
    cast = int if field == "egress_bytes" else float
    inside = {**base, field: cast(at_bound * (1 - 1e-9))}
    assert decoder.decode("resource-usage", json.dumps(inside).encode())
    beyond = {**base, field: cast(at_bound * (1 + 1e-9)) + (1 if cast is int else 0)}
    with pytest.raises(InvalidMessage) as info:
        decoder.decode("resource-usage", json.dumps(beyond).encode())
    reason = info.value.reason
    assert reason.endswith(f"- at `$.{field}`") and limit in reason and "limits.yaml" in reason
    assert f"{field} {beyond[field]:g}" in reason or f"{field} {beyond[field]}" in reason


# -- and detected: no accepted event stops the engine ---------------------------------------

RESOURCE_TYPES = ["gpu_instance", "notebook", "storage_bucket", "vector_db", "inference_endpoint", "cpu_instance"]


@pytest.mark.parametrize("limits", [UNBOUNDED, Limits()], ids=["contract", "default-limits"])
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_whatever_the_decoder_accepts_is_detected(ruleset, limits, data):
    """Events from the contract's bounds, on two resources over three days so that the
    detectors see sequences, go through every shipped rule without an exception."""
    from detector.alerts import AlertManager
    from detector.engine import Engine

    decoder = EventDecoder(clock=lambda: NOW, limits=limits)
    engine, manager = Engine(ruleset), AlertManager(ruleset=ruleset)
    start = datetime(2026, 11, 2, tzinfo=timezone.utc)
    for _ in range(data.draw(st.integers(1, 12))):
        topic = data.draw(st.sampled_from(list(_TYPES)))
        message = data.draw(messages(topic, limits))
        for event in message:
            for key in ("resource_id", "run_id", "project"):
                if key in event:
                    event[key] = data.draw(st.sampled_from(["h1", "h2"]))
            if "resource_type" in event:
                event["resource_type"] = data.draw(st.sampled_from(RESOURCE_TYPES))
            if topic == "run-events":
                event["resource_ids"] = ["h1", "h2"]
            event["ts"] = (start + timedelta(seconds=data.draw(st.integers(0, 3 * 86400)))).isoformat()
        events = decoder.decode(topic, msgspec.json.encode(message))
        for alert in manager.handle(engine.process(events)):
            assert alert.to_json()
    engine.open_episodes()


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_generic_metric_is_finite(value):
    """JSON cannot carry these (msgspec refuses 1e309), but an event built in-process can: the bounds
    of ``metrics`` refuse them, naming the field, as ClickHouse's Float64 would store them silently."""
    fields = {**VALID[TOPIC_RESOURCE_USAGE], "metrics": {"cpu": value}}
    with pytest.raises(msgspec.ValidationError, match=r"at `\$\.metrics"):
        msgspec.convert(fields, _TYPES[TOPIC_RESOURCE_USAGE])

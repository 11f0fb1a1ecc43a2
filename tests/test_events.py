"""The event contract: what is accepted, what is kept, and what the dead-letter reason says."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detector.events import EventDecoder, GpuMetric, InvalidMessage, RunEvent, UsageEvent

NOW = 1_800_000_000.0  # a fixed "now" (2027-01-15) so the future-timestamp check is deterministic
decoder = EventDecoder(clock=lambda: NOW)

GPU = {"ts": "2026-11-02T00:00:00Z", "resource_id": "h1", "gpu_index": 0, "util_pct": 3.5, "power_w": 61.0}
USAGE = {"ts": "2026-11-02T00:00:00+00:00", "resource_id": "h1", "resource_type": "gpu_instance", "cost_usd": 0.5,
         "tags": {"team": "nlp"}}  # fmt: skip
RUN = {"ts": "2026-11-02T00:00:00Z", "run_id": "r1", "status": "failed", "resource_ids": ["h1"], "error": "OOM"}


def test_single_event_and_batch():
    (one,) = decoder.decode("gpu-metrics", json.dumps(GPU).encode())
    assert isinstance(one, GpuMetric) and one.util_pct == 3.5 and one.t == 1_793_577_600.0
    batch = decoder.decode("gpu-metrics", json.dumps([GPU, {**GPU, "gpu_index": 1}]).encode())
    assert [e.gpu_index for e in batch] == [0, 1]
    assert isinstance(decoder.decode("resource-usage", json.dumps(USAGE).encode())[0], UsageEvent)
    assert isinstance(decoder.decode("run-events", json.dumps(RUN).encode())[0], RunEvent)


def test_unknown_fields_are_kept_not_rejected():
    (event,) = decoder.decode("resource-usage", json.dumps({**USAGE, "sku": "X1", "labels": {"a": 1}}).encode())
    assert event.extra == {"sku": "X1", "labels": {"a": 1}}
    assert event.cost_usd == 0.5


@pytest.mark.parametrize(
    "topic, value, reason",
    [
        ("gpu-metrics", b"{not json", "not JSON"),
        ("gpu-metrics", json.dumps({k: v for k, v in GPU.items() if k != "resource_id"}).encode(),
         "missing required field `resource_id`"),
        ("gpu-metrics", json.dumps([GPU, {**GPU, "util_pct": "high"}]).encode(), "`$[1].util_pct`"),
        ("gpu-metrics", json.dumps({**GPU, "util_pct": 140}).encode(), "`$.util_pct`"),
        ("gpu-metrics", json.dumps({**GPU, "ts": "2026-11-02 00:00"}).encode(), "`$.ts`"),
        ("gpu-metrics", json.dumps({**GPU, "ts": "2026-11-02T00:00:00"}).encode(), "timezone"),
        ("gpu-metrics", json.dumps({**GPU, "ts": "2027-01-17T00:00:00Z"}).encode(), "in the future"),
        ("resource-usage", json.dumps({**USAGE, "state": "paused"}).encode(), "`$.state`"),
        ("run-events", json.dumps([]).encode(), "empty batch"),
        ("run-events", b"[42]", "expected an event object"),
        ("billing", json.dumps(USAGE).encode(), "unknown topic"),
    ],
    ids=["not-json", "missing-field", "wrong-type-in-batch", "out-of-range", "not-rfc3339", "no-zone",
         "future", "bad-enum", "empty-batch", "not-object", "unknown-topic"],  # fmt: skip
)
def test_bad_messages_name_the_problem(topic, value, reason):
    with pytest.raises(InvalidMessage) as info:
        decoder.decode(topic, value)
    assert any(r in info.value.reason for r in reason.split("|")), info.value.reason


# -- hostile input: refused with the field named, never an exception of another type ------

DEEP = b"[" * 5000 + b"]" * 5000


def _raw(fields: dict, **raw: bytes) -> bytes:
    """A JSON object with some values as raw JSON text (numbers json.dumps cannot write)."""
    body = json.dumps(fields)[:-1]
    return (body + "".join(f', "{k}": {v.decode()}' for k, v in raw.items()) + "}").encode()


POISON = [
    ("gpu-metrics", json.dumps([{**GPU, "gpu_index": 300}]).encode(), "Expected `int` <= 255 - at `$[0].gpu_index`"),
    ("run-events", json.dumps({**RUN, "gpu_count": 70000}).encode(), "Expected `int` <= 65535 - at `$.gpu_count`"),
    ("resource-usage", json.dumps({**USAGE, "interval_s": 1e308}).encode(), "- at `$.interval_s`"),
    ("resource-usage", json.dumps({**USAGE, "egress_bytes": 2**64}).encode(), "- at `$.egress_bytes`"),
    ("resource-usage", json.dumps({**USAGE, "egress_bytes": 2**64 - 1}).encode(), "- at `$.egress_bytes`"),
    ("gpu-metrics", json.dumps({**GPU, "power_w": 1e39}).encode(), "- at `$.power_w`"),  # beyond Float32
    ("gpu-metrics", _raw(GPU, mem_used_mib=b"1e999"), "Number out of range - at `$.mem_used_mib`"),
    ("resource-usage", _raw(USAGE, cost_usd=b"1e999"), "Number out of range - at `$.cost_usd`"),
    ("resource-usage", json.dumps({**USAGE, "cost_usd": 1e6, "interval_s": 60}).encode(),
     "cost_usd 1e+06 over interval_s 60 is $60,000,000.00/h, above the plausible $2,000.00/h per resource "
     "(max_usd_per_hour in limits.yaml"),
    ("resource-usage", json.dumps({**USAGE, "cost_usd": 1e308}).encode(), "max_usd_per_hour"),
    ("resource-usage", json.dumps({**USAGE, "interval_s": 1e9}).encode(), "(max_interval in limits.yaml"),
    ("resource-usage", json.dumps({**USAGE, "egress_bytes": 2**62, "interval_s": 60}).encode(),
     "above the plausible 400 Gbit/s (max_egress_gbit_per_s in limits.yaml"),
    ("gpu-metrics", json.dumps(GPU).replace('"h1"', '"h\\u00e9"').encode().replace(b"\\u00e9", b"\xc3"),
     "not valid UTF-8"),
    ("gpu-metrics", json.dumps({**GPU, "model": "A100"}).encode().replace(b"A100", b"A\xff\xfe0"), "not valid UTF-8"),
    # Python 3.11 and 3.12 stop at their recursion limit; 3.13's is higher, so the decoder gets
    # further and names what it found there. Either way the message is refused with a reason.
    ("gpu-metrics", DEEP, "nested too deeply|expected an event object, got list - at `$[0]`"),
    ("gpu-metrics", _raw(GPU, labels=DEEP), "nested too deeply|nested deeper than 32 levels - at `$.labels`"),
    ("gpu-metrics", _raw(GPU, labels=b"[" * 40 + b"]" * 40), "nested deeper than 32 levels - at `$.labels`"),
    ("gpu-metrics", _raw(GPU, extra=b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}"), "- at `$.extra.a`"),
    ("gpu-metrics", json.dumps({**GPU, "resource_id": "h" * 2000}).encode(), "<= 1024 - at `$.resource_id`"),
    ("resource-usage", json.dumps({**USAGE, "tags": {str(i): "" for i in range(1025)}}).encode(), "- at `$.tags`"),
    ("run-events", json.dumps({**RUN, "error": "x" * 70_000}).encode(), "- at `$.error`"),
    ("run-events", json.dumps({**RUN, "ts": "1969-12-31T23:59:59Z"}).encode(), "is before 1970-01-01T00:00:00Z - at `$.ts`"),
    ("run-events", None, "no value"),
]


@pytest.mark.parametrize("topic, value, reason", POISON, ids=[
    "gpu_index-300", "gpu_count-70000", "interval-1e308", "egress-2^64", "egress-2^64-1", "float32-overflow",
    "float64-overflow", "cost-1e999", "cost-1e6-per-minute", "cost-1e308", "interval-1e9", "egress-400G+",
    "truncated-utf8", "invalid-utf8", "deep-5000", "deep-5000-in-unknown-field", "deep-40-in-unknown-field",
    "deep-40-in-extra", "long-id", "too-many-tags", "long-error", "before-1970", "tombstone"])  # fmt: skip
def test_poison_is_refused_with_its_field(topic, value, reason):
    with pytest.raises(InvalidMessage) as info:
        decoder.decode(topic, value)
    assert any(r in info.value.reason for r in reason.split("|")), info.value.reason


def _json(max_leaves: int = 8) -> st.SearchStrategy:
    leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6),
                       st.sampled_from(["2026-11-02T00:00:00Z", "running", "failed", "spot"]))  # fmt: skip
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                             max_size=3),
                        max_leaves=max_leaves)  # fmt: skip


def _total(topic: str, value: bytes) -> None:
    try:
        events = decoder.decode(topic, value)
    except InvalidMessage as exc:
        assert exc.reason
    else:
        assert events and all(type(e).__name__ in ("UsageEvent", "GpuMetric", "RunEvent") for e in events)


@settings(max_examples=300, deadline=None)
@given(topic=st.sampled_from(["gpu-metrics", "resource-usage", "run-events"]), value=st.binary(max_size=200))
def test_any_bytes_decode_or_are_refused(topic, value):
    _total(topic, value)


@settings(max_examples=300, deadline=None)
@given(topic=st.sampled_from(["gpu-metrics", "resource-usage", "run-events"]), data=st.data())
def test_any_field_values_decode_or_are_refused(topic, data):
    base = {"gpu-metrics": GPU, "resource-usage": USAGE, "run-events": RUN}[topic]
    names = sorted(set(base) | {"interval_s", "cost_usd", "egress_bytes", "tags", "gpu_count", "extra", "x"})
    changed = data.draw(st.dictionaries(st.sampled_from(names), _json(), max_size=4))
    message = {**base, **changed}
    as_batch = data.draw(st.booleans())
    _total(topic, json.dumps([message] if as_batch else message, allow_nan=True).encode())


@pytest.mark.parametrize("topic, event", [("gpu-metrics", GPU), ("run-events", RUN)])
def test_the_future_bound_follows_the_clock_back_and_names_the_event(topic, event):
    """The usual message is checked against a bound kept from an earlier clock reading; a clock
    set back (NTP) lowers the bound at once, and a refused event in a batch is named by its index."""
    now = [NOW]
    clocked = EventDecoder(clock=lambda: now[0])
    assert clocked.decode(topic, json.dumps({**event, "ts": "2027-01-15T12:00:00Z"}).encode())  # within a day
    now[0] = NOW - 2 * 86_400.0  # the clock goes back two days: a day ahead is now 2027-01-14
    with pytest.raises(InvalidMessage, match=r"in the future - at `\$\.ts`"):
        clocked.decode(topic, json.dumps({**event, "ts": "2027-01-15T06:00:00Z"}).encode())
    late = [event, {**event, "ts": "2027-01-15T06:00:00Z"}]
    with pytest.raises(InvalidMessage, match=r"in the future - at `\$\[1\]\.ts`"):
        clocked.decode(topic, json.dumps(late).encode())
    with pytest.raises(InvalidMessage, match=r"before 1970-01-01T00:00:00Z - at `\$\[1\]\.ts`"):
        clocked.decode(topic, json.dumps([event, {**event, "ts": "1969-12-31T00:00:00Z"}]).encode())
    assert clocked.decode(topic, json.dumps([event, event]).encode())


def test_an_unknown_field_that_misspells_one_of_the_contracts_is_said_once():
    """``costUSD`` where the contract says ``cost_usd``: kept in ``extra`` as every unknown field is (the contract),
    and the event read without it, priced from the price list (or at $0) with nothing said: a first day's
    exporter written by hand. The decoder says so once per topic and field, naming the field it likely meant;
    a field of its own name (``rack``) is kept and says nothing."""
    from structlog.testing import capture_logs

    decoder = EventDecoder()
    usage = {"ts": "2026-11-02T00:00:00Z", "resource_id": "h1", "resource_type": "gpu_instance", "interval_s": 60}
    with capture_logs() as logs:
        for _ in range(3):
            (event,) = decoder.decode("resource-usage", json.dumps({**usage, "costUSD": 5, "rack": "r7"}).encode())
        decoder.decode("resource-usage", json.dumps({**usage, "cost-usd": 5, "Instance_Typ": "p4d"}).encode())
    assert event.cost_usd is None and event.extra == {"costUSD": 5, "rack": "r7"}
    said = [(e["field"], e["did_you_mean"]) for e in logs if e["event"] == "event_field_unknown"]
    assert said == [("costUSD", "cost_usd"), ("cost-usd", "cost_usd"), ("Instance_Typ", "instance_type")]


def test_a_hostile_producers_long_field_names_are_neither_looked_at_nor_kept():
    """A field name longer than any misspelling of the contract's (a hostile producer's 900 kB names, a new one a
    message) was folded and matched by difflib (80 ms a message against 1.5 ms) and kept, 1,000 of them: a
    gigabyte for the life of the decoder. A field name with control characters is said escaped."""
    from structlog.testing import capture_logs

    decoder = EventDecoder()
    usage = {"ts": "2026-11-02T00:00:00Z", "resource_id": "h1", "resource_type": "gpu_instance", "interval_s": 60}
    with capture_logs() as logs:
        for i in range(3):
            decoder.decode("resource-usage", json.dumps({**usage, f"cost_usd{i}" + "-" * 100_000: 5}).encode())
        decoder.decode("resource-usage", json.dumps({**usage, "cost_usd\x1b[2J": 5}).encode())
    assert all(len(name) < 100 for _, name in decoder._unknown)
    said = [(e["field"], e["did_you_mean"]) for e in logs if e["event"] == "event_field_unknown"]
    assert said == [("cost_usd\\x1b[2J", "cost_usd")]
